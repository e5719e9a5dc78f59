//! AVX2 + FMA kernels of the fused path, for x86-64 CPUs without AVX-512 (AMD Zen 1–3, most
//! Intel client cores): the contracts of `avx512.rs`, 8 lanes wide. A register-blocked f32
//! GEMM (6 rows × 16 columns of `C` in 12 registers, 2 loads and 6 broadcasts per 12 FMAs; the
//! backward pass's GEMM is the same kernel reading `A` by its own strides), the two products of
//! a decoding step, and the row operations of the online softmax with a vectorised `exp`.
//!
//! Every function here is an `unsafe fn` with `#[target_feature]`: callers must have checked
//! the CPU (see [`super::Isa`]). Matrices are row-major slices with explicit row strides; the
//! last partial 8-lane group of a row is read and written with `vmaskmovps` (or through a copy,
//! for bf16), so no kernel reads or writes past the columns it was given.

use std::arch::x86_64::*;

use super::element::{Element, load8_f32, prefix_mask};
use super::exp::{CEPHES_EXP2, LOG2_E_HI, LOG2_E_LO};
use super::gemm::{Lhs, MR};

/// 8-lane vectors of `C` per register tile row: 6 × 2 accumulators, 2 loads of `B` and a
/// broadcast of `A` take 15 of the 16 registers.
const NV: usize = 2;

/// Stores the first `lanes` lanes of `x` at `p` (`lanes ≤ 8`). A masked store
/// (`vmaskmovps`) is slow on AMD's cores, so only a partial group takes one.
///
/// # Safety
/// AVX2 must be available; `lanes` values writable at `p`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store8(p: *mut f32, lanes: usize, x: __m256) {
    // SAFETY: as the caller guarantees; masked-off lanes are not written.
    unsafe {
        match lanes {
            8 => _mm256_storeu_ps(p, x),
            0 => {}
            _ => _mm256_maskstore_ps(p, prefix_mask(lanes), x),
        }
    }
}

/// Where one register tile reads and writes: `R` rows of `A` (element `(r, p)` at
/// `a + r·a_row + p·a_step`), `k` rows of `B` (`ldb` apart) and `R` rows of `C` (`ldc` apart),
/// the tile's columns `lanes` (per vector) wide.
struct Tile<T> {
    k: usize,
    a: *const f32,
    a_row: usize,
    a_step: usize,
    b: *const T,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    lanes: [usize; NV],
    accumulate: bool,
}

/// One `R × 16` tile of `C (+)= A · B`, `B` in f32 or bf16 (widened as it is read); with
/// `CHECK`, the magnitudes' bits of the values of `B` it reads are folded into `largest` (lane
/// by lane: NaN's pass ∞'s).
///
/// # Safety
/// AVX2 and FMA must be available, and `t` must describe memory inside live slices, the
/// columns of `lanes` included.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<T: Element, const R: usize, const FULL: bool, const CHECK: bool>(
    t: &Tile<T>,
    largest: &mut __m256i,
) {
    let lanes = if FULL { [8; NV] } else { t.lanes };
    // SAFETY (whole body): the caller guarantees the bounds; masked-off lanes are never
    // touched, and their addresses are formed with `wrapping_add`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); NV]; R];
        if t.accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = load8_f32(t.c.wrapping_add(r * t.ldc + v * 8), lanes[v]);
                }
            }
        }
        let (mut ap, mut bp) = (t.a, t.b);
        for _ in 0..t.k {
            let bv: [__m256; NV] =
                std::array::from_fn(|v| T::load8(bp.wrapping_add(v * 8), lanes[v]));
            bp = bp.wrapping_add(t.ldb);
            if CHECK {
                let magnitude = _mm256_set1_epi32(0x7fff_ffff);
                for &x in &bv {
                    let bits = _mm256_and_si256(_mm256_castps_si256(x), magnitude);
                    *largest = _mm256_max_epu32(*largest, bits);
                }
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(r * t.a_row));
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = _mm256_fmadd_ps(av, bx, *x);
                }
            }
            ap = ap.wrapping_add(t.a_step);
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                store8(t.c.wrapping_add(r * t.ldc + v * 8), lanes[v], x);
            }
        }
    }
}

/// [`tile`] for `rows` in `1..=MR`.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile_rows<T: Element, const FULL: bool, const CHECK: bool>(
    rows: usize,
    t: &Tile<T>,
    largest: &mut __m256i,
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        match rows {
            6 => tile::<T, 6, FULL, CHECK>(t, largest),
            5 => tile::<T, 5, FULL, CHECK>(t, largest),
            4 => tile::<T, 4, FULL, CHECK>(t, largest),
            3 => tile::<T, 3, FULL, CHECK>(t, largest),
            2 => tile::<T, 2, FULL, CHECK>(t, largest),
            _ => tile::<T, 1, FULL, CHECK>(t, largest),
        }
    }
}

/// `C[m × n] (+)= A[m × k] · B[k × n]`, `A` laid out as `lhs` says, `B` in f32 or bf16; with
/// `CHECK`, returns the largest magnitude's bits of every value of `B`, read with the first
/// rows.
///
/// # Safety
/// AVX2 and FMA must be available; `a`, `b` and `c` must hold the elements the layouts and
/// strides describe.
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_strided<T: Element, const CHECK: bool>(
    (m, n, k): (usize, usize, usize),
    (a, lhs): (*const f32, Lhs),
    (b, ldb): (*const T, usize),
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
) -> __m256i {
    let mut largest = _mm256_setzero_si256();
    for col in (0..n).step_by(8 * NV) {
        let lanes: [usize; NV] = std::array::from_fn(|v| n.saturating_sub(col + v * 8).min(8));
        let full = lanes == [8; NV];
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR);
            // Element `(r, p)` of the tile's rows at `r · a_row + p · a_step`.
            let (a, a_row, a_step) = match lhs {
                Lhs::Rows(lda) => (a.wrapping_add(row * lda), lda, 1),
                Lhs::Panels => (a.wrapping_add(row * k), 1, rows),
            };
            let t = Tile {
                k,
                a,
                a_row,
                a_step,
                b: b.wrapping_add(col),
                ldb,
                c: c.wrapping_add(row * ldc + col),
                ldc,
                lanes,
                accumulate,
            };
            // SAFETY: AVX2 and FMA are available (caller); the tile lies inside the caller's
            // slices. The values are checked once, with the first rows.
            unsafe {
                match (full, CHECK && row == 0) {
                    (true, true) => tile_rows::<T, true, true>(rows, &t, &mut largest),
                    (true, false) => tile_rows::<T, true, false>(rows, &t, &mut largest),
                    (false, true) => tile_rows::<T, false, true>(rows, &t, &mut largest),
                    (false, false) => tile_rows::<T, false, false>(rows, &t, &mut largest),
                }
            }
            row += rows;
        }
    }
    largest
}

/// `C[m × n] (+)= A[m × k] · B[k × n]` in f32, `A` laid out as `lhs` says (row-major, or in
/// panels as the backward pass packs it), `B` and `C` row-major with strides `ldb`, `ldc`.
///
/// # Safety
/// AVX2 and FMA must be available. The slices must hold the elements the layouts and strides
/// describe.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn gemm_lhs(
    mnk: (usize, usize, usize),
    (a, lhs): (&[f32], Lhs),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let (a, b, c) = ((a.as_ptr(), lhs), (b.as_ptr(), ldb), (c.as_mut_ptr(), ldc));
    // SAFETY: as the caller guarantees.
    unsafe { gemm_strided::<f32, false>(mnk, a, b, c, accumulate) };
}

/// `C[m × n] (+)= A[m × k] · B[k × n]` in f32, `B` in f32 or bf16 (row-major, strides
/// `lda`, `ldb`, `ldc`).
///
/// # Safety
/// AVX2 and FMA must be available. The slices must hold the rows the strides describe
/// (checked with `debug_assert!`).
#[target_feature(enable = "avx2,fma")]
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
    unsafe { gemm_rows::<T, false>(mnk, (a, lda), (b, ldb), (c, ldc), accumulate) };
}

/// [`gemm_f32`] with `accumulate`, returning whether every value of `B` is below
/// `2^bound_exp` in magnitude (NaN never), checked as `B` is read with the first rows of `A`
/// (so `m ≥ 1`).
///
/// # Safety
/// As [`gemm_f32`].
#[target_feature(enable = "avx2,fma")]
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
    let largest = unsafe { gemm_rows::<T, true>(mnk, (a, lda), (b, ldb), (c, ldc), true) };
    let mut lanes = [0u32; 8];
    // SAFETY: `lanes` holds 8 values.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), largest) };
    lanes.into_iter().max().unwrap_or(0) < ((127 + bound_exp) as u32) << 23
}

/// [`gemm_strided`] on row-major slices.
///
/// # Safety
/// As [`gemm_f32`].
#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_rows<T: Element, const CHECK: bool>(
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) -> __m256i {
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    debug_assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (a, b, c) = (
        (a.as_ptr(), Lhs::Rows(lda)),
        (b.as_ptr(), ldb),
        (c.as_mut_ptr(), ldc),
    );
    // SAFETY: as the caller guarantees.
    unsafe { gemm_strided::<T, CHECK>((m, n, k), a, b, c, accumulate) }
}

/// `C[m × n] = A[m × k] · B[n × k]ᵀ` in f32, `B` in f32 or bf16 (row-major, strides `lda`,
/// `ldb`, `ldc`): for a few rows of `A` against rows of `B` read as they are (a decoding
/// step's scores against its keys). Each value of `C` sums its products in 8 lanes, and 8
/// values' lanes are summed at once ([`sum_lanes`]).
///
/// # Safety
/// AVX2 and FMA must be available. The slices must hold the rows the strides describe
/// (checked with `debug_assert!`).
#[target_feature(enable = "avx2,fma")]
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
    let (chunks, tail) = (k / 8, k % 8);
    let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    for col in (0..n).step_by(8) {
        let cols = (n - col).min(8);
        // Past the last row of `B`, the lanes repeat it: their sums are not stored.
        let rows: [*const T; 8] =
            std::array::from_fn(|t| b.wrapping_add((col + t.min(cols - 1)) * ldb));
        for r in 0..m {
            let a = a.wrapping_add(r * lda);
            let mut acc = [_mm256_setzero_ps(); 8];
            // SAFETY (all three blocks): AVX2 and FMA are available (caller); the loads lie
            // inside row `r` of `A` and the rows of `B` (the caller's bounds), the tail's to
            // the `k % 8` values left, and the store inside row `r` of `C`.
            for ch in 0..chunks {
                unsafe {
                    let x = _mm256_loadu_ps(a.add(8 * ch));
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        *acc = _mm256_fmadd_ps(x, T::load8(row.add(8 * ch), 8), *acc);
                    }
                }
            }
            if tail != 0 {
                unsafe {
                    let x = load8_f32(a.add(8 * chunks), tail);
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        *acc = _mm256_fmadd_ps(x, T::load8(row.add(8 * chunks), tail), *acc);
                    }
                }
            }
            unsafe { store8(c.add(r * ldc + col), cols, sum_lanes(acc)) };
        }
    }
}

/// The sums of the lanes of 8 vectors: lane `t` of the result is the sum of `x[t]`'s lanes, in
/// a tree (pairs within 128-bit lanes, then across them).
#[target_feature(enable = "avx2")]
#[inline]
fn sum_lanes(x: [__m256; 8]) -> __m256 {
    // Within each 128-bit lane: `u[i]` holds the lane's sums of `x[4i..4i + 4]` in order.
    let u: [__m256; 2] = std::array::from_fn(|i| {
        let x = &x[4 * i..];
        _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]))
    });
    // Across the 128-bit lanes: the low halves plus the high halves.
    _mm256_add_ps(
        _mm256_permute2f128_ps::<0x20>(u[0], u[1]),
        _mm256_permute2f128_ps::<0x31>(u[0], u[1]),
    )
}

/// `e^x` for 8 lanes: `avx512::exp`'s algorithm (Cephes' `exp2f` polynomial, `x·log₂e`
/// in two pieces), relative error ≤ 2.5e-7 for `x ≤ 5.5`; results below 2^-125 (and `−∞`)
/// give 0, NaN gives NaN, and past 2^127 the result is `+∞` (AVX-512's gives NaN for `+∞`;
/// the softmax never passes it more than 5.5). `2^n` is built in the exponent
/// bits (there is no `vscalefps` here).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn exp(x: __m256) -> __m256 {
    // As on AVX-512, results below 2^-125 are flushed by a mask, and NaN passes the clamps:
    // `vmaxps` and `vminps` return their second operand when one is NaN.
    let t = _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E));
    let normal = _mm256_cmp_ps::<_CMP_NLT_UQ>(t, _mm256_set1_ps(-125.0));
    let x = _mm256_max_ps(_mm256_set1_ps(-125.0 * std::f32::consts::LN_2), x);
    let t = _mm256_max_ps(
        _mm256_set1_ps(-125.0),
        _mm256_min_ps(_mm256_set1_ps(127.0), t),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm256_fmadd_ps(
        x,
        _mm256_set1_ps(LOG2_E_HI),
        _mm256_sub_ps(_mm256_setzero_ps(), n),
    );
    let f = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2_E_LO), f);
    let mut p = _mm256_set1_ps(CEPHES_EXP2[0]);
    for &c in &CEPHES_EXP2[1..] {
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
    }
    // 2^f = 1 + f·P(f); 2^n for n in −125..=127 from its exponent bits.
    let p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0));
    let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased));
    _mm256_and_ps(normal, _mm256_mul_ps(p, pow2))
}

/// `x *= a`.
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn scale(x: &mut [f32], a: f32) {
    let av = _mm256_set1_ps(a);
    let n = x.len();
    let p = x.as_mut_ptr();
    for i in (0..n).step_by(8) {
        let lanes = (n - i).min(8);
        // SAFETY: the `lanes` values at `i` lie inside `x`.
        unsafe {
            store8(
                p.add(i),
                lanes,
                _mm256_mul_ps(load8_f32(p.add(i), lanes), av),
            )
        };
    }
}

/// The largest value of `x` (`−∞` when empty; NaN when `x` holds one), in four vectors at once
/// (`vmaxps` and the NaN test each wait on the last).
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn max(x: &[f32]) -> f32 {
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let (mut acc, mut nan) = ([ninf; 4], [_mm256_setzero_ps(); 4]);
    let n = x.len();
    let unrolled = n - n % 32;
    for i in (0..unrolled).step_by(32) {
        for (u, (acc, nan)) in acc.iter_mut().zip(&mut nan).enumerate() {
            // SAFETY: the 32 values at `i` lie inside `x`.
            let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(i + 8 * u)) };
            *nan = _mm256_or_ps(*nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            *acc = _mm256_max_ps(*acc, v);
        }
    }
    for i in (unrolled..n).step_by(8) {
        let lanes = (n - i).min(8);
        // SAFETY: the `lanes` values at `i` lie inside `x`.
        let v = unsafe { load8_f32(x.as_ptr().add(i), lanes) };
        let v = _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(prefix_mask(lanes)));
        nan[0] = _mm256_or_ps(nan[0], _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        acc[0] = _mm256_max_ps(acc[0], v);
    }
    let nan = _mm256_or_ps(_mm256_or_ps(nan[0], nan[1]), _mm256_or_ps(nan[2], nan[3]));
    if _mm256_movemask_ps(nan) != 0 {
        return f32::NAN;
    }
    let acc = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
    let mut lanes = [0.0f32; 8];
    // SAFETY: `lanes` holds 8 values.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes.into_iter().fold(f32::NEG_INFINITY, f32::max)
}

/// `x = e^(x − m)`, returning the sum of the new values.
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    // SAFETY: as the caller guarantees.
    unsafe { exp_rows::<false>(x, 1.0, m) }
}

/// `x = e^(scale·x − m)`, returning the sum of the new values: [`scale`] and [`exp_sub_sum`]
/// in one pass, `scale·x` rounded as a product of its own as they round it.
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_scaled_sum(x: &mut [f32], scale: f32, m: f32) -> f32 {
    // SAFETY: as the caller guarantees.
    unsafe { exp_rows::<true>(x, scale, m) }
}

/// Vectors of [`exp_rows`]' main loop taken at once: one `exp` is a chain of about twenty
/// dependent instructions, and four side by side keep both FMA pipes busy.
const EXP_UNROLL: usize = 4;

/// `x = e^(x·scale − m)` (without `SCALED`, `e^(x − m)`), returning the sum of the new values,
/// added in order one vector at a time, whatever the unrolling.
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_rows<const SCALED: bool>(x: &mut [f32], scale: f32, m: f32) -> f32 {
    let (c, mv) = (_mm256_set1_ps(scale), _mm256_set1_ps(m));
    let arg = |v: __m256| match SCALED {
        true => _mm256_sub_ps(_mm256_mul_ps(v, c), mv),
        false => _mm256_sub_ps(v, mv),
    };
    let mut sum = _mm256_setzero_ps();
    let n = x.len();
    let p = x.as_mut_ptr();
    let unrolled = n - n % (8 * EXP_UNROLL);
    for i in (0..unrolled).step_by(8 * EXP_UNROLL) {
        // SAFETY: the `8 · EXP_UNROLL` values at `i` lie inside `x`.
        unsafe {
            let e: [__m256; EXP_UNROLL] =
                std::array::from_fn(|u| exp(arg(_mm256_loadu_ps(p.add(i + 8 * u)))));
            for (u, &e) in e.iter().enumerate() {
                _mm256_storeu_ps(p.add(i + 8 * u), e);
                sum = _mm256_add_ps(sum, e);
            }
        }
    }
    for i in (unrolled..n).step_by(8) {
        let lanes = (n - i).min(8);
        // SAFETY: the `lanes` values at `i` lie inside `x`.
        unsafe {
            let e = exp(arg(load8_f32(p.add(i), lanes)));
            store8(p.add(i), lanes, e);
            let e = match lanes {
                8 => e,
                _ => _mm256_and_ps(_mm256_castsi256_ps(prefix_mask(lanes)), e),
            };
            sum = _mm256_add_ps(sum, e);
        }
    }
    let halves = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps::<1>(sum));
    let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
    _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass `e^(scale·x − m)` rounds as the scale's pass and then `exp_sub_sum` do, its
    /// sum too, on every length up to past two unrolled steps.
    #[test]
    fn exp_scaled_sum_is_the_two_passes() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            crate::cpu::not_on_this_cpu("AVX2");
            return;
        }
        let (c, m) = (48f32.sqrt().recip(), 1.7f32);
        for n in 0..=70 {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 37) % 101) as f32 * 0.37 - 9.1)
                .collect();
            let (mut one, mut two) = (x.clone(), x);
            // SAFETY: AVX2 and FMA are available (checked above).
            let (sum_one, sum_two) = unsafe {
                let sum_one = exp_scaled_sum(&mut one, c, m);
                scale(&mut two, c);
                (sum_one, exp_sub_sum(&mut two, m))
            };
            assert_eq!(bits(&one), bits(&two), "{n} values");
            assert_eq!(sum_one.to_bits(), sum_two.to_bits(), "{n} values' sum");
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn exp_is_within_its_bound() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            crate::cpu::not_on_this_cpu("AVX2");
            return;
        }
        // Every 2^-10 from −86 (above 2^-125) to 5.5, the largest `x` the softmax gives it.
        let xs: Vec<f32> = (-86 * 1024..=11 * 512).map(|i| i as f32 / 1024.0).collect();
        let run = |x: [f32; 8]| {
            let mut got = [0.0f32; 8];
            // SAFETY: AVX2 and FMA are available (checked above); both arrays hold 8 values.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp(_mm256_loadu_ps(x.as_ptr()))) };
            got
        };
        for chunk in xs.chunks(8) {
            let mut x = [0.0f32; 8];
            x[..chunk.len()].copy_from_slice(chunk);
            for (&x, &g) in chunk.iter().zip(&run(x)) {
                let want = f64::from(x).exp();
                let err = (f64::from(g) / want - 1.0).abs();
                assert!(err <= 2.5e-7, "e^{x}: {g} against {want}, error {err:e}");
            }
        }
        let edges = [
            f32::NEG_INFINITY,
            -87.0,
            f32::NAN,
            89.0,
            f32::INFINITY,
            0.0,
            1.0,
            -1.0,
        ];
        let got = run(edges);
        assert_eq!(&got[..2], [0.0, 0.0], "below 2^-125: 0");
        assert!(got[2].is_nan(), "NaN stays NaN");
        assert_eq!(
            &got[3..6],
            [f32::INFINITY, f32::INFINITY, 1.0],
            "past 2^127: ∞"
        );
    }
}
