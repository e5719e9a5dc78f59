//! AVX-512 kernels of the fused path: a register-blocked f32 GEMM, the two products of a
//! decoding step (`A·Bᵀ` against keys as the inputs hold them, and a GEMM that checks the
//! values it reads), and the row operations of the online softmax with a vectorised `exp`.
//!
//! bf16 inputs are widened to f32 and take the same GEMM here. On an Intel Xeon with
//! AVX512_BF16 `VDPBF16PS` is slower than `VFMADD231PS` (there AMX takes bf16 inputs); on
//! AMD's Zen 5 it is faster, and [`super::Isa::Avx512Bf16`] takes them in dot products
//! (`crate::cpu::bf16dot`).
//!
//! Every function here is an `unsafe fn` with `#[target_feature]`: callers must have checked
//! the CPU (see [`super::Isa`]). Matrices are row-major slices with explicit row strides; the
//! last 16-lane group of a row is handled with masked loads and stores, so no kernel reads or
//! writes past the columns it was given.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.

use std::arch::x86_64::*;

use half::bf16;

use super::element::Element;
use super::exp::{CEPHES_EXP2, EXP2_DEGREE_5, LOG2_E_HI, LOG2_E_LO};
use super::gemm::Lhs;

/// The lane mask of the 16 values from `at` of an `n`-value row: those before `n`.
#[inline]
pub(crate) fn lanes(at: usize, n: usize) -> __mmask16 {
    ((1u32 << n.saturating_sub(at).min(16)) - 1) as __mmask16
}

/// The lane masks of the `V` vectors covering columns `col..col + 16·V` of an `n`-column row.
fn tile_masks<const V: usize>(col: usize, n: usize) -> [__mmask16; V] {
    std::array::from_fn(|v| lanes(col + v * 16, n))
}

/// f32 register tile: 6 rows ([`super::gemm::MR`]) × 4 vectors (64 columns), 24 accumulators, 4 loads and 6
/// broadcasts per 24 FMAs.
const MR_F32: usize = super::gemm::MR;
const NV_F32: usize = 4;

/// One `R × 16·V` tile of `C (+)= A · B` in f32, `B` in f32 or bf16 (widened as it is read);
/// with `CHECK`, the magnitudes' bits of the values of `B` it reads are folded into `largest`
/// (lane by lane: NaN's pass ∞'s). `A` is `R` rows `lda` apart, or with `PANEL` one panel of
/// `R` rows (`[k, R]`: element `(r, p)` at `p·R + r`, [`Lhs::Panels`]).
///
/// # Safety
/// AVX-512F must be available; `a` holds `R` rows of `k` values at stride `lda` (or the panel),
/// `b` holds `k` rows at stride `ldb` with the masked columns in bounds, and `c` holds `R` rows
/// at stride `ldc`.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_f32<
    T: Element,
    const R: usize,
    const V: usize,
    const FULL: bool,
    const CHECK: bool,
    const PANEL: bool,
>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const T,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    masks: [__mmask16; V],
    accumulate: bool,
    largest: &mut __m512i,
) {
    // SAFETY (whole body): the caller guarantees the bounds above; masked-off lanes are never
    // touched, and their addresses are formed with `wrapping_add`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(masks[v], c.wrapping_add(r * ldc + v * 16));
                }
            }
        }
        for p in 0..k {
            let bp = b.wrapping_add(p * ldb);
            let bv: [__m512; V] = std::array::from_fn(|v| {
                let mask = if FULL { 0xffff } else { masks[v] };
                T::load16(bp.wrapping_add(v * 16), mask)
            });
            if CHECK {
                let magnitude = _mm512_set1_epi32(0x7fff_ffff);
                for &x in &bv {
                    let bits = _mm512_and_si512(_mm512_castps_si512(x), magnitude);
                    *largest = _mm512_max_epu32(*largest, bits);
                }
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(if PANEL { p * R + r } else { r * lda + p }));
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, bx, *x);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(c.wrapping_add(r * ldc + v * 16), masks[v], x);
            }
        }
    }
}

/// `C[m × n] (+)= A[m × k] · B[k × n]` in f32, `B` in f32 or bf16 (row-major, strides
/// `lda`, `ldb`, `ldc`).
///
/// # Safety
/// AVX-512F must be available. The slices must hold the rows the strides describe (checked
/// with `debug_assert!`).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_f32<T: Element>(
    mnk: (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let (m, n, k) = mnk;
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    debug_assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (a, b, c) = (
        (a.as_ptr(), Lhs::Rows(lda)),
        (b.as_ptr(), ldb),
        (c.as_mut_ptr(), ldc),
    );
    // SAFETY: as the caller guarantees.
    unsafe { gemm_tiles::<T, false>(mnk, a, b, c, accumulate) };
}

/// `C[m × n] (+)= A[m × k] · B[k × n]` in f32, `A` laid out as `lhs` says (row-major, or in
/// panels as the backward pass packs it), `B` and `C` row-major with strides `ldb`, `ldc`.
///
/// # Safety
/// AVX-512F must be available. The slices must hold the elements the layouts and strides
/// describe.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm_lhs(
    mnk: (usize, usize, usize),
    (a, lhs): (&[f32], Lhs),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let (a, b, c) = ((a.as_ptr(), lhs), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc));
    // SAFETY: as the caller guarantees.
    unsafe { gemm_tiles::<f32, false>(mnk, a, b, c, accumulate) };
}

/// [`gemm_f32`] with `accumulate`, returning whether every value of `B` is below
/// `2^bound_exp` in magnitude (NaN never): checked as `B` is read with the first rows of `A`
/// (so `m ≥ 1`), each value of `C` summed as [`gemm_f32`] sums it. For a decoding step's `P·V`,
/// its values read once.
///
/// # Safety
/// As [`gemm_f32`].
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_checked<T: Element>(
    mnk: (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    bound_exp: i32,
) -> bool {
    let (m, n, k) = mnk;
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    debug_assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (a, b, c) = (
        (a.as_ptr(), Lhs::Rows(lda)),
        (b.as_ptr(), ldb),
        (c.as_mut_ptr(), ldc),
    );
    // SAFETY: as the caller guarantees.
    let largest = unsafe { gemm_tiles::<T, true>(mnk, a, b, c, true) };
    _mm512_reduce_max_epu32(largest) < ((127 + bound_exp) as u32) << 23
}

/// The tiles of [`gemm_f32`] and [`gemm_strided`]; with `CHECK`, those of the first rows fold
/// the magnitudes' bits of every value of `B` into the returned vector ([`tile_f32`]).
///
/// # Safety
/// As [`gemm_strided`].
#[target_feature(enable = "avx512f")]
unsafe fn gemm_tiles<T: Element, const CHECK: bool>(
    (m, n, k): (usize, usize, usize),
    (a, lhs): (*const f32, Lhs),
    (b, ldb): (*const T, usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
) -> __m512i {
    let mut largest = _mm512_setzero_si512();
    for col in (0..n).step_by(16 * NV_F32) {
        let masks = tile_masks::<NV_F32>(col, n);
        let full = masks == [0xffff; NV_F32];
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR_F32);
            // SAFETY: AVX-512F is available (caller); the tile lies inside the operands.
            unsafe {
                // A panel starts at `row · k`, as row `row` does at `row · lda`.
                let (a, lda, panel) = match lhs {
                    Lhs::Rows(lda) => (a.add(row * lda), lda, false),
                    Lhs::Panels => (a.add(row * k), 0, true),
                };
                let (b, c) = (b.add(col), c.add(row * ldc + col));
                let tile = (k, (a, lda), (b, ldb), (c, ldc), masks, accumulate);
                let largest = &mut largest;
                // The values are checked once, with the first rows (row-major `A` only).
                debug_assert!(!(CHECK && panel));
                match (full, CHECK && row == 0, panel) {
                    (true, true, _) => tile_rows::<T, true, true, false>(rows, tile, largest),
                    (true, false, false) => tile_rows::<T, true, false, false>(rows, tile, largest),
                    (false, true, _) => tile_rows::<T, false, true, false>(rows, tile, largest),
                    (false, false, false) => {
                        tile_rows::<T, false, false, false>(rows, tile, largest)
                    }
                    (true, false, true) => tile_rows::<T, true, false, true>(rows, tile, largest),
                    (false, false, true) => tile_rows::<T, false, false, true>(rows, tile, largest),
                }
            }
            row += rows;
        }
    }
    largest
}

/// [`tile_f32`] for `rows` in `1..=MR_F32`.
///
/// # Safety
/// As [`tile_f32`].
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::type_complexity)]
unsafe fn tile_rows<T: Element, const FULL: bool, const CHECK: bool, const PANEL: bool>(
    rows: usize,
    (k, (a, lda), (b, ldb), (c, ldc), masks, accumulate): (
        usize,
        (*const f32, usize),
        (*const T, usize),
        (*mut f32, usize),
        [__mmask16; NV_F32],
        bool,
    ),
    largest: &mut __m512i,
) {
    let args = (k, a, lda, b, ldb, c, ldc, masks, accumulate);
    // SAFETY: as the caller guarantees.
    unsafe {
        match rows {
            6 => call_tile::<T, 6, FULL, CHECK, PANEL>(args, largest),
            5 => call_tile::<T, 5, FULL, CHECK, PANEL>(args, largest),
            4 => call_tile::<T, 4, FULL, CHECK, PANEL>(args, largest),
            3 => call_tile::<T, 3, FULL, CHECK, PANEL>(args, largest),
            2 => call_tile::<T, 2, FULL, CHECK, PANEL>(args, largest),
            _ => call_tile::<T, 1, FULL, CHECK, PANEL>(args, largest),
        }
    }
}

/// [`tile_f32`] of `R` rows, its arguments in a tuple.
///
/// # Safety
/// As [`tile_f32`].
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::type_complexity)]
unsafe fn call_tile<
    T: Element,
    const R: usize,
    const FULL: bool,
    const CHECK: bool,
    const PANEL: bool,
>(
    (k, a, lda, b, ldb, c, ldc, masks, accumulate): (
        usize,
        *const f32,
        usize,
        *const T,
        usize,
        *mut f32,
        usize,
        [__mmask16; NV_F32],
        bool,
    ),
    largest: &mut __m512i,
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        tile_f32::<T, R, NV_F32, FULL, CHECK, PANEL>(
            k, a, lda, b, ldb, c, ldc, masks, accumulate, largest,
        )
    }
}

/// `C[m × n] = A[m × k] · B[n × k]ᵀ` in f32, `B` in f32 or bf16 (row-major, strides `lda`,
/// `ldb`, `ldc`): for a few rows of `A` against rows of `B` read as they are (a decoding
/// step's scores against its keys, which [`gemm_f32`] would need transposed first). Each value
/// of `C` sums its products in 16 lanes, and 16 values' lanes are summed at once
/// ([`sum_lanes`]).
///
/// # Safety
/// AVX-512F must be available. The slices must hold the rows the strides describe (checked
/// with `debug_assert!`).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_abt<T: Element>(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    debug_assert!(n == 0 || b.len() >= (n - 1) * ldb + k);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (chunks, tail) = (k / 16, ((1u32 << (k % 16)) - 1) as __mmask16);
    let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    for col in (0..n).step_by(16) {
        let cols = (n - col).min(16);
        // Past the last row of `B`, the lanes repeat it: their sums are not stored.
        let rows: [*const T; 16] =
            std::array::from_fn(|t| b.wrapping_add((col + t.min(cols - 1)) * ldb));
        for r in 0..m {
            let a = a.wrapping_add(r * lda);
            let mut acc = [_mm512_setzero_ps(); 16];
            // SAFETY (both blocks): AVX-512F is available (caller); the loads lie inside row
            // `r` of `A` and the rows of `B` (the caller's bounds), the tail's to the `k % 16`
            // values left.
            for ch in 0..chunks {
                unsafe {
                    let x = _mm512_loadu_ps(a.add(16 * ch));
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        *acc = _mm512_fmadd_ps(x, T::load16(row.add(16 * ch), 0xffff), *acc);
                    }
                }
            }
            if tail != 0 {
                unsafe {
                    let x = _mm512_maskz_loadu_ps(tail, a.add(16 * chunks));
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        let y = T::load16(row.add(16 * chunks), tail);
                        *acc = _mm512_fmadd_ps(x, y, *acc);
                    }
                }
            }
            let mask = ((1u32 << cols) - 1) as __mmask16;
            // SAFETY: the `cols` values from `col` lie inside row `r` of `C` (caller).
            unsafe { _mm512_mask_storeu_ps(c.add(r * ldc + col), mask, sum_lanes(acc)) };
        }
    }
}

/// The sums of the lanes of 16 vectors: lane `t` of the result is the sum of `x[t]`'s lanes,
/// in a tree (pairs within 128-bit lanes, then across them).
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn sum_lanes(x: [__m512; 16]) -> __m512 {
    // Within each 128-bit lane: `s[i]` holds the pair sums of `x[2i]` and `x[2i + 1]`
    // interleaved, then `u[i]` the lane's sums of `x[4i..4i + 4]` in order.
    let s: [__m512; 8] = std::array::from_fn(|i| {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b))
    });
    let u: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (_mm512_castps_pd(s[2 * i]), _mm512_castps_pd(s[2 * i + 1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    });
    // Across the 128-bit lanes: lanes 0 and 2 of two vectors plus lanes 1 and 3, twice.
    let across = |a: __m512, b: __m512| {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        )
    };
    across(across(u[0], u[1]), across(u[2], u[3]))
}

/// `e^x` for 16 lanes and the `x ≤ 5.5` the softmax feeds it (the weights of rows whose saved
/// max is the AMX path's running one, up to 5.5 below the row's largest score, are up to
/// `e^5.5`): relative error ≤ 2.5e-7 (measured every 2^-10 from −86 to 5.5; with `x·log₂e`
/// rounded as one product it was up to 5e-7 + |x|·1e-7, 9e-6 at −86); results below 2^-125
/// (and `−∞`) give 0, NaN gives NaN.
///
/// `e^x = 2^t` with `t = x·log₂e = n + f`, `n` an integer, `|f| ≤ ½`: `2^f` from Cephes'
/// `exp2f` polynomial (<https://netlib.org/cephes/>, `exp2f.c`: peak relative error 1.7e-7 on
/// `[−½, ½]`), `2^n` by `vscalefps`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn exp(x: __m512) -> __m512 {
    // Results below 2^-125 are flushed to 0 by a mask rather than left to underflow: subnormal
    // results take a slow microcode assist on Intel cores, and masked scores (−∞) are common
    // on causal diagonals. The clamp keeps −∞ out of the arithmetic.
    // NaN passes through: the mask keeps it (unordered is "not less than") and `vmaxps`
    // returns its second operand when one is NaN.
    let t = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E));
    let normal = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(t, _mm512_set1_ps(-125.0));
    // x itself is clamped too, as `f` below reads it: 2^-125 = e^(−125·ln 2).
    let x = _mm512_max_ps(_mm512_set1_ps(-125.0 * std::f32::consts::LN_2), x);
    let t = _mm512_max_ps(_mm512_set1_ps(-125.0), t);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    // f = x·log₂e − n with log₂e in two pieces (Cody and Waite): the rounding of `t` would
    // move f by up to |x|·6e-8.
    let f = _mm512_fmadd_ps(
        x,
        _mm512_set1_ps(LOG2_E_HI),
        _mm512_sub_ps(_mm512_setzero_ps(), n),
    );
    let f = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2_E_LO), f);
    let mut p = _mm512_set1_ps(CEPHES_EXP2[0]);
    for &c in &CEPHES_EXP2[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    // 2^f = 1 + f·P(f)
    let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n))
}

/// `x *= a`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scale(x: &mut [f32], a: f32) {
    let av = _mm512_set1_ps(a);
    let n = x.len();
    let p = x.as_mut_ptr();
    for i in (0..n).step_by(16) {
        let m = lanes(i, n);
        // SAFETY: lanes of `m` lie inside `x`.
        unsafe {
            let v = _mm512_maskz_loadu_ps(m, p.add(i));
            _mm512_mask_storeu_ps(p.add(i), m, _mm512_mul_ps(v, av));
        }
    }
}

/// The largest value of `x` (`−∞` when empty; NaN when `x` holds one).
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn max(x: &[f32]) -> f32 {
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut acc = ninf;
    let mut nan: __mmask16 = 0;
    let n = x.len();
    for i in (0..n).step_by(16) {
        let m = lanes(i, n);
        // SAFETY: lanes of `m` lie inside `x`.
        let v = unsafe { _mm512_mask_loadu_ps(ninf, m, x.as_ptr().add(i)) };
        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
        acc = _mm512_max_ps(acc, v);
    }
    if nan != 0 {
        return f32::NAN;
    }
    _mm512_reduce_max_ps(acc)
}

/// `x = e^(x − m)`, returning the sum of the new values.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let mv = _mm512_set1_ps(m);
    let mut sum = _mm512_setzero_ps();
    let n = x.len();
    let p = x.as_mut_ptr();
    for i in (0..n).step_by(16) {
        let k = lanes(i, n);
        // SAFETY: lanes of `k` lie inside `x`; AVX-512F is available.
        unsafe {
            let e = exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p.add(i)), mv));
            _mm512_mask_storeu_ps(p.add(i), k, e);
            sum = _mm512_mask_add_ps(sum, k, sum, e);
        }
    }
    _mm512_reduce_add_ps(sum)
}

/// `x = e^(scale·x − m)`, returning the sum of the new values: the fused step of rows with no
/// rule beyond a positive scale (`Plan::plain_step`), which takes the scale here rather than in
/// a pass of its own. `scale·x` is rounded before `m` is taken from it, as the other steps
/// round it: `m`, the rounded `scale·max x`, is then exactly the largest, where with one
/// rounding of `scale·x − m` the largest exponent is what the product's rounding lost (up to
/// 512 for scores near 1e10, and `e^512` overflows). `e^` is `2^` of the degree-5 polynomial
/// ([`exp2`], relative error ≤ 2e-7), results below 2^-125 (and `−∞`) 0, NaN NaN.
///
/// # Safety
/// AVX-512F and AVX512DQ must be available.
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn exp_scaled_sum(x: &mut [f32], scale: f32, m: f32) -> f32 {
    let (c, mc) = (_mm512_set1_ps(scale), _mm512_set1_ps(m));
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let mut sum = _mm512_setzero_ps();
    let n = x.len();
    let p = x.as_mut_ptr();
    for i in (0..n).step_by(16) {
        let k = lanes(i, n);
        // SAFETY: lanes of `k` lie inside `x`; AVX-512F and AVX512DQ are available.
        unsafe {
            let s = _mm512_maskz_loadu_ps(k, p.add(i));
            let t = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s, c), mc), log2e);
            let e = exp2::<true, 5>(t, EXP2_DEGREE_5);
            _mm512_mask_storeu_ps(p.add(i), k, e);
            sum = _mm512_mask_add_ps(sum, k, sum, e);
        }
    }
    _mm512_reduce_add_ps(sum)
}

/// `2^t` for 16 lanes and `t ≤ 8` (`MAX_HEADROOM·log₂e` is 7.9; a block's pass that is redone
/// may overflow to ∞) with the polynomial `c` (`EXP2_DEGREE_4`: relative error ≤ 3e-6,
/// `EXP2_DEGREE_5`: ≤ 2e-7, from [`super::exp`], both checked for `−125 ≤ t ≤ 8` in the tests): `t = n + f` with
/// `n = ⌊t⌋` and `f ∈ [0, 1)` (`VREDUCEPS`), `2^f` by the polynomial, times `2^n`
/// (`VSCALEFPS`, which takes `⌊t⌋` itself). The row's sum, and so the
/// log-sum-exp, moves by at most the same relative error.
///
/// Below −125 the result is 2^-125 (not 0): rows with no hidden keys take it, as a weight of
/// 2^-125 ≈ 2e-38 is 0 to every tolerance while staying clear of subnormals, which cost a
/// microcode assist each. With `HIDDEN` (rows whose masks hide keys inside their range: −∞)
/// it is 0, at one compare more.
///
/// # Safety
/// AVX-512F and AVX512DQ must be available.
#[target_feature(enable = "avx512f,avx512dq")]
#[inline]
pub(crate) unsafe fn exp2<const HIDDEN: bool, const N: usize>(t: __m512, c: [f32; N]) -> __m512 {
    let floor = _mm512_set1_ps(-125.0);
    // Lanes that stay: all, or with `HIDDEN` those not below −125 (NaN stays, to be found).
    let keep = match HIDDEN {
        true => _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(t, floor),
        false => !0,
    };
    let t = _mm512_max_ps(floor, t);
    // imm8 = 0x09: keep 0 fraction bits, round down, no precision exception.
    let f = _mm512_reduce_ps::<0x09>(t);
    let mut p = _mm512_set1_ps(c[0]);
    for &c in &c[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_maskz_scalef_ps(keep, p, t)
}

/// The largest value of `row` (`−∞` when empty). A NaN may be lost, or returned.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn row_max(row: &[f32]) -> f32 {
    let n = row.len();
    let whole = n / 32 * 32;
    let (lo, hi) = (lanes(whole, n), lanes(whole + 16, n));
    let row = row.as_ptr();
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    // SAFETY: whole 32-value chunks lie inside `row`, the tail's lanes are masked to what is
    // left of it.
    let (mut max0, mut max1) = unsafe {
        (
            _mm512_mask_loadu_ps(ninf, lo, row.add(whole)),
            _mm512_mask_loadu_ps(ninf, hi, row.add(whole + 16)),
        )
    };
    for i in (0..whole).step_by(32) {
        unsafe {
            max0 = _mm512_max_ps(max0, _mm512_loadu_ps(row.add(i)));
            max1 = _mm512_max_ps(max1, _mm512_loadu_ps(row.add(i + 16)));
        }
    }
    _mm512_reduce_max_ps(_mm512_max_ps(max0, max1))
}

/// The largest sum of squares of the rows of `x` (`[rows, width]`, at least one); NaN or ∞ when
/// `x` holds NaN or ∞.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn max_square_sum(x: &[f32], width: usize) -> f32 {
    let mut max = 0.0f32;
    let tail = lanes(0, width % 16);
    for row in x.chunks_exact(width) {
        let mut sq = _mm512_setzero_ps();
        let mut chunks = row.chunks_exact(16);
        for chunk in &mut chunks {
            // SAFETY: 16 values of `row`.
            let v = unsafe { _mm512_loadu_ps(chunk.as_ptr()) };
            sq = _mm512_fmadd_ps(v, v, sq);
        }
        // SAFETY: the lanes of `tail` lie inside the remainder.
        let v = unsafe { _mm512_maskz_loadu_ps(tail, chunks.remainder().as_ptr()) };
        let sq = _mm512_reduce_add_ps(_mm512_fmadd_ps(v, v, sq));
        // `f32::max` would drop a NaN.
        if sq.is_nan() {
            return sq;
        }
        max = max.max(sq);
    }
    max
}

/// `dst = src` rounded to bf16, nearest even.
///
/// # Safety
/// AVX-512F, AVX512_BF16, AVX512BW and AVX512VL must be available; `dst.len() == src.len()`.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(crate) unsafe fn round_to_bf16(src: &[f32], dst: &mut [bf16]) {
    let n = src.len();
    for i in (0..n).step_by(16) {
        let mask = lanes(i, n);
        // SAFETY: the lanes of `mask` lie inside both slices.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
            let y: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), mask, y);
        }
    }
}

/// Transposes 16 rows of 16 dwords: lane `j` of row `p` of the result is lane `p` of row `j`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn transpose_16x16(r: [__m512i; 16]) -> [__m512i; 16] {
    // Pairs, then quads of rows: within each 128-bit lane `L`, `u[4i + k]` holds column
    // `4L + k` of rows `4i..4i + 4`.
    let t: [__m512i; 16] = std::array::from_fn(|x| {
        let (a, b) = (r[x / 2 * 2], r[x / 2 * 2 + 1]);
        if x % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let u: [__m512i; 16] = std::array::from_fn(|x| {
        let (i, k) = (x / 4, x % 4);
        let (a, b) = (t[4 * i + k / 2], t[4 * i + k / 2 + 2]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // Then a 4 × 4 transpose of the 128-bit lanes of `u[k]`, `u[4 + k]`, `u[8 + k]`, `u[12 + k]`.
    let mut out = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        let (a, b, c, d) = (u[k], u[4 + k], u[8 + k], u[12 + k]);
        let (ab_lo, ab_hi) = (
            _mm512_shuffle_i32x4::<0x44>(a, b),
            _mm512_shuffle_i32x4::<0xee>(a, b),
        );
        let (cd_lo, cd_hi) = (
            _mm512_shuffle_i32x4::<0x44>(c, d),
            _mm512_shuffle_i32x4::<0xee>(c, d),
        );
        out[k] = _mm512_shuffle_i32x4::<0x88>(ab_lo, cd_lo);
        out[4 + k] = _mm512_shuffle_i32x4::<0xdd>(ab_lo, cd_lo);
        out[8 + k] = _mm512_shuffle_i32x4::<0x88>(ab_hi, cd_hi);
        out[12 + k] = _mm512_shuffle_i32x4::<0xdd>(ab_hi, cd_hi);
    }
    out
}

/// [`super::portable::transpose_blocks`] for f32 values, 16 × 16 tiles at a time.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_blocks(
    src: &[f32],
    (width, block): (usize, usize),
    dst: &mut [f32],
) {
    for (src, dst) in src.chunks(block * width).zip(dst.chunks_mut(block * width)) {
        let keys = src.len() / width;
        let (whole_keys, whole_cols) = (keys / 16 * 16, width / 16 * 16);
        for j in (0..whole_keys).step_by(16) {
            for p in (0..whole_cols).step_by(16) {
                let rows: [__m512i; 16] = std::array::from_fn(|r| {
                    let row = &src[(j + r) * width + p..][..16];
                    // SAFETY: 16 values of `row`.
                    _mm512_castps_si512(unsafe { _mm512_loadu_ps(row.as_ptr()) })
                });
                for (c, col) in transpose_16x16(rows).into_iter().enumerate() {
                    let dst = &mut dst[(p + c) * keys + j..][..16];
                    // SAFETY: 16 values of `dst`.
                    unsafe { _mm512_storeu_si512(dst.as_mut_ptr().cast(), col) };
                }
            }
        }
        // The columns past the whole tiles, then the keys past them.
        for j in 0..keys {
            let cols = if j < whole_keys { whole_cols } else { 0 };
            for p in cols..width {
                dst[p * keys + j] = src[j * width + p];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::exp::EXP2_DEGREE_4;

    #[test]
    fn exp2_is_within_its_bound() {
        if !std::arch::is_x86_feature_detected!("avx512dq") {
            crate::cpu::not_on_this_cpu("AVX512DQ");
            return;
        }
        /// The worst relative error of `2^t` by the polynomial `c` on every 2^-12 from −125
        /// to 8 (544 769 values, 16 per call), against f64, the same with `HIDDEN`; and that
        /// below −125 the result stays at 2^-125, clear of the subnormals, or with `HIDDEN` is
        /// 0 (−∞ too), while NaN stays NaN.
        fn worst<const N: usize>(c: [f32; N]) -> f64 {
            let ts: Vec<f32> = (-8 * 4096..=125 * 4096)
                .map(|i| -(i as f32) / 4096.0)
                .collect();
            let mut worst = 0.0f64;
            for chunk in ts.chunks(16) {
                let mut t = [0.0f32; 16];
                t[..chunk.len()].copy_from_slice(chunk);
                let (mut got, mut hidden) = ([0.0f32; 16], [0.0f32; 16]);
                // SAFETY: the features are checked by the caller.
                unsafe {
                    use std::arch::x86_64::*;
                    let t = _mm512_loadu_ps(t.as_ptr());
                    _mm512_storeu_ps(got.as_mut_ptr(), exp2::<false, N>(t, c));
                    _mm512_storeu_ps(hidden.as_mut_ptr(), exp2::<true, N>(t, c));
                }
                assert_eq!(got, hidden);
                for (&t, &g) in chunk.iter().zip(&got) {
                    let want = 2f64.powf(f64::from(t));
                    worst = worst.max((f64::from(g) / want - 1.0).abs());
                }
            }
            let (mut got, mut hidden) = ([0.0f32; 16], [0.0f32; 16]);
            let t = [-1e4, f32::NEG_INFINITY, -125.5, f32::NAN].repeat(4);
            // SAFETY: as above.
            unsafe {
                use std::arch::x86_64::*;
                let t = _mm512_loadu_ps(t.as_ptr());
                _mm512_storeu_ps(got.as_mut_ptr(), exp2::<false, N>(t, c));
                _mm512_storeu_ps(hidden.as_mut_ptr(), exp2::<true, N>(t, c));
            }
            for ((&t, &g), &h) in t.iter().zip(&got).zip(&hidden) {
                match t.is_nan() {
                    true => assert!(g.is_nan() && h.is_nan(), "{t}: {g}, {h}"),
                    false => assert!(g == 2f32.powi(-125) && h == 0.0, "{t}: {g}, {h}"),
                }
            }
            worst
        }
        let (four, five) = (worst(EXP2_DEGREE_4), worst(EXP2_DEGREE_5));
        assert!(four <= 3e-6, "degree 4: worst relative error {four:e}");
        assert!(five <= 2e-7, "degree 5: worst relative error {five:e}");
    }

    #[test]
    fn exp_is_within_its_bound() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            crate::cpu::not_on_this_cpu("AVX-512");
            return;
        }
        // Every 2^-10 from −86 (above 2^-125) to 5.5, the largest `x` the softmax gives it.
        let xs: Vec<f32> = (-86 * 1024..=11 * 512).map(|i| i as f32 / 1024.0).collect();
        for chunk in xs.chunks(16) {
            let mut x = [0.0f32; 16];
            x[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0.0f32; 16];
            // SAFETY: AVX-512F is available (checked above); both arrays hold 16 values.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp(_mm512_loadu_ps(x.as_ptr()))) };
            for (&x, &g) in chunk.iter().zip(&got) {
                let want = f64::from(x).exp();
                let err = (f64::from(g) / want - 1.0).abs();
                let bound = 2.5e-7;
                assert!(err <= bound, "e^{x}: {g} against {want}, error {err:e}");
            }
        }
    }
}
