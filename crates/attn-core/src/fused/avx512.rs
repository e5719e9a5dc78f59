//! AVX-512 kernels of the fused path: a register-blocked f32 GEMM, the two products of a
//! decoding step (`A·Bᵀ` against keys as the inputs hold them, and a GEMM that checks the
//! values it reads), and the row operations of the online softmax with a vectorised `exp`.
//!
//! bf16 inputs are widened to f32 and take the same GEMM here. On an Intel Xeon with
//! AVX512_BF16 `VDPBF16PS` measured 120 GFLOP/s per core against 222 for `VFMADD231PS` (there
//! AMX takes bf16 inputs); on AMD's Zen 5 it measured 469 against 250, and
//! [`super::Isa::Avx512Bf16`] takes them in dot products (`crate::bf16dot`).
//!
//! Every function here is an `unsafe fn` with `#[target_feature]`: callers must have checked
//! the CPU (see [`super::isa`]). Matrices are row-major slices with explicit row strides; the
//! last 16-lane group of a row is handled with masked loads and stores, so no kernel reads or
//! writes past the columns it was given.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89, the workspace's `rust-version`.

use std::arch::x86_64::*;

use half::bf16;

use super::Element;

/// f32 register tile: 6 rows × 4 vectors (64 columns), 24 accumulators, 4 loads and 6
/// broadcasts per 24 FMAs.
const MR_F32: usize = 6;
const NV_F32: usize = 4;

/// The lane masks of the `V` vectors covering columns `col..col + 16·V` of an `n`-column row.
fn tile_masks<const V: usize>(col: usize, n: usize) -> [__mmask16; V] {
    std::array::from_fn(|v| {
        let start = col + v * 16;
        let lanes = n.saturating_sub(start).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    })
}

/// One `R × 16·V` tile of `C (+)= A · B` in f32, `B` in f32 or bf16 (widened as it is read);
/// with `CHECK`, the magnitudes' bits of the values of `B` it reads are folded into `largest`
/// (lane by lane: NaN's pass ∞'s).
///
/// # Safety
/// AVX-512F must be available; `a` holds `R` rows of `k` values at stride `lda`, `b` holds `k`
/// rows at stride `ldb` with the masked columns in bounds, and `c` holds `R` rows at stride `ldc`.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_f32<
    T: Element,
    const R: usize,
    const V: usize,
    const FULL: bool,
    const CHECK: bool,
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
                let av = _mm512_set1_ps(*a.add(r * lda + p));
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
    // SAFETY: as the caller guarantees.
    unsafe { gemm_tiles::<T, false>(mnk, (a, lda), (b, ldb), (c, ldc), accumulate) };
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
    // SAFETY: as the caller guarantees.
    let largest = unsafe { gemm_tiles::<T, true>(mnk, (a, lda), (b, ldb), (c, ldc), true) };
    _mm512_reduce_max_epu32(largest) < ((127 + bound_exp) as u32) << 23
}

/// The tiles of [`gemm_f32`]; with `CHECK`, those of the first rows fold the magnitudes' bits
/// of every value of `B` into the returned vector ([`tile_f32`]).
///
/// # Safety
/// As [`gemm_f32`].
#[target_feature(enable = "avx512f")]
unsafe fn gemm_tiles<T: Element, const CHECK: bool>(
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) -> __m512i {
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    debug_assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    let mut largest = _mm512_setzero_si512();
    for col in (0..n).step_by(16 * NV_F32) {
        let masks = tile_masks::<NV_F32>(col, n);
        let full = masks == [0xffff; NV_F32];
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR_F32);
            // SAFETY: AVX-512F is available (caller); the tile lies inside the checked slices.
            unsafe {
                let (a, b, c) = (a.add(row * lda), b.add(col), c.add(row * ldc + col));
                let tile = (k, (a, lda), (b, ldb), (c, ldc), masks, accumulate);
                // The values are checked once, with the first rows.
                match (full, CHECK && row == 0) {
                    (true, true) => tile_rows::<T, true, true>(rows, tile, &mut largest),
                    (true, false) => tile_rows::<T, true, false>(rows, tile, &mut largest),
                    (false, true) => tile_rows::<T, false, true>(rows, tile, &mut largest),
                    (false, false) => tile_rows::<T, false, false>(rows, tile, &mut largest),
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
unsafe fn tile_rows<T: Element, const FULL: bool, const CHECK: bool>(
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
            6 => call_tile::<T, 6, FULL, CHECK>(args, largest),
            5 => call_tile::<T, 5, FULL, CHECK>(args, largest),
            4 => call_tile::<T, 4, FULL, CHECK>(args, largest),
            3 => call_tile::<T, 3, FULL, CHECK>(args, largest),
            2 => call_tile::<T, 2, FULL, CHECK>(args, largest),
            _ => call_tile::<T, 1, FULL, CHECK>(args, largest),
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
unsafe fn call_tile<T: Element, const R: usize, const FULL: bool, const CHECK: bool>(
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
        tile_f32::<T, R, NV_F32, FULL, CHECK>(k, a, lda, b, ldb, c, ldc, masks, accumulate, largest)
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

/// The values from `p` of the lanes of `mask` (the first few: a prefix mask), the others 0;
/// bf16 values widened to f32 (exactly).
///
/// # Safety
/// AVX-512F must be available; the values of `mask`'s lanes readable from `p`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn load16_bf16(p: *const bf16, mask: __mmask16) -> __m512 {
    let bits = match mask {
        // SAFETY: 16 values readable (caller).
        0xffff => unsafe { _mm256_loadu_si256(p.cast()) },
        0 => _mm256_setzero_si256(),
        // A masked 16-bit load needs AVX512BW: the rest of a row goes through a copy.
        _ => {
            let mut rest = [bf16::ZERO; 16];
            // SAFETY: the values of `mask`'s lanes readable (caller), and `rest` holds 16.
            unsafe {
                std::ptr::copy_nonoverlapping(p, rest.as_mut_ptr(), mask.count_ones() as usize);
                _mm256_loadu_si256(rest.as_ptr().cast())
            }
        }
    };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
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

/// `log₂e` as the nearest f32 and what that misses.
pub(super) const LOG2_E_HI: f32 = std::f32::consts::LOG2_E;
pub(super) const LOG2_E_LO: f32 =
    (std::f64::consts::LOG2_E - std::f32::consts::LOG2_E as f64) as f32;

/// Cephes' `exp2f` polynomial, highest power first: `2^f ≈ 1 + f·P(f)` on `[−½, ½]`.
pub(super) const EXP2_P: [f32; 6] = [
    1.535_336_2e-4,
    1.339_887_4e-3,
    9.618_437e-3,
    5.550_332_5e-2,
    2.402_264_8e-1,
    6.931_472e-1,
];

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
    // results take a microcode assist (~100 cycles) on Intel cores, and masked scores (−∞) are
    // common on causal diagonals. The clamp keeps −∞ out of the arithmetic.
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
    let mut p = _mm512_set1_ps(EXP2_P[0]);
    for &c in &EXP2_P[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    // 2^f = 1 + f·P(f)
    let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n))
}

/// The lane mask of the 16 values at `i` of an `n`-value row.
fn lane_mask(i: usize, n: usize) -> __mmask16 {
    let lanes = (n - i).min(16);
    ((1u32 << lanes) - 1) as __mmask16
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
        let m = lane_mask(i, n);
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
        let m = lane_mask(i, n);
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
        let k = lane_mask(i, n);
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
/// (`super::amx::exp2`, relative error ≤ 2e-7), results below 2^-125 (and `−∞`) 0, NaN NaN.
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
        let k = lane_mask(i, n);
        // SAFETY: lanes of `k` lie inside `x`; AVX-512F and AVX512DQ are available.
        unsafe {
            let s = _mm512_maskz_loadu_ps(k, p.add(i));
            let t = _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s, c), mc), log2e);
            let e = super::amx::exp2::<true, 5>(t, super::amx::EXP2_DEGREE_5);
            _mm512_mask_storeu_ps(p.add(i), k, e);
            sum = _mm512_mask_add_ps(sum, k, sum, e);
        }
    }
    _mm512_reduce_add_ps(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_its_bound() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            crate::not_on_this_cpu("AVX-512");
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
