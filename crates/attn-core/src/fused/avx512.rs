//! AVX-512 kernels of the fused path: a register-blocked GEMM (f32, and bf16 pairs through
//! `VDPBF16PS`), and the row operations of the online softmax with a vectorised `exp`.
//!
//! Every function here is an `unsafe fn` with `#[target_feature]`: callers must have checked
//! the CPU (see [`super::isa`]). Matrices are row-major slices with explicit row strides; the
//! last 16-lane group of a row is handled with masked loads and stores, so no kernel reads or
//! writes past the columns it was given.
//!
//! The AVX-512 intrinsics are stable since Rust 1.89, above the workspace's declared 1.85 (which
//! the crate's let-chains already exceed): raising the workspace `rust-version` to 1.89 is left to its owner.
#![allow(clippy::incompatible_msrv)]

use std::arch::x86_64::*;

/// Rows of one register tile.
const MR: usize = 8;
/// 16-lane vectors across one register tile (32 columns): 8 × 2 accumulators + 2 loads.
const NV: usize = 2;
const NR: usize = NV * 16;

/// Calls `$tile::<R>` for the `R = $rows` in `1..=MR`, with the argument tuple spread out.
macro_rules! dispatch_rows {
    ($rows:expr, $tile:ident, $args:expr) => {{
        let (k, a, lda, b, ldb, c, ldc, masks, acc) = $args;
        match $rows {
            8 => $tile::<8>(k, a, lda, b, ldb, c, ldc, masks, acc),
            7 => $tile::<7>(k, a, lda, b, ldb, c, ldc, masks, acc),
            6 => $tile::<6>(k, a, lda, b, ldb, c, ldc, masks, acc),
            5 => $tile::<5>(k, a, lda, b, ldb, c, ldc, masks, acc),
            4 => $tile::<4>(k, a, lda, b, ldb, c, ldc, masks, acc),
            3 => $tile::<3>(k, a, lda, b, ldb, c, ldc, masks, acc),
            2 => $tile::<2>(k, a, lda, b, ldb, c, ldc, masks, acc),
            _ => $tile::<1>(k, a, lda, b, ldb, c, ldc, masks, acc),
        }
    }};
}

/// The lane masks of the `NV` vectors covering columns `col..col + NR` of an `n`-column row.
fn tile_masks(col: usize, n: usize) -> [__mmask16; NV] {
    std::array::from_fn(|v| {
        let start = col + v * 16;
        let lanes = n.saturating_sub(start).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    })
}

/// One `R × NR` tile of `C (+)= A · B` for f32.
///
/// # Safety
/// AVX-512F must be available; `a` holds `R` rows of `k` values at stride `lda`, `b` holds `k`
/// rows at stride `ldb` with the masked columns in bounds, and `c` holds `R` rows at stride `ldc`.
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_f32<const R: usize>(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    masks: [__mmask16; NV],
    accumulate: bool,
) {
    // SAFETY (whole body): the caller guarantees the bounds above; masked-off lanes are never
    // touched, and their addresses are formed with `wrapping_add`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(masks[v], c.wrapping_add(r * ldc + v * 16));
                }
            }
        }
        for p in 0..k {
            let bp = b.wrapping_add(p * ldb);
            let bv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], bp.wrapping_add(v * 16)));
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

/// `C[m × n] (+)= A[m × k] · B[k × n]` in f32 (row-major, strides `lda`, `ldb`, `ldc`).
///
/// # Safety
/// AVX-512F must be available. The slices must hold the rows the strides describe (checked
/// with `debug_assert!`).
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    debug_assert!(k == 0 || b.len() >= (k - 1) * ldb + n);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    for col in (0..n).step_by(NR) {
        let masks = tile_masks(col, n);
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR);
            // SAFETY: AVX-512F is available (caller); the tile lies inside the checked slices.
            unsafe {
                let (a, b, c) = (a.add(row * lda), b.add(col), c.add(row * ldc + col));
                let args = (k, a, lda, b, ldb, c, ldc, masks, accumulate);
                dispatch_rows!(rows, tile_f32, args);
            }
            row += rows;
        }
    }
}

/// One `R × NR` tile of `C = A · B` where `A` and `B` hold bf16 pairs packed into `u32`
/// (`A`: `R` rows of `k2` pairs; `B`: `k2` rows of pairs, one per column), accumulated in f32.
///
/// # Safety
/// AVX-512F and AVX512_BF16 must be available; bounds as for [`tile_f32`].
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_bf16<const R: usize>(
    k2: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    masks: [__mmask16; NV],
    _accumulate: bool,
) {
    // SAFETY (whole body): as in `tile_f32`.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for p in 0..k2 {
            let bp = b.wrapping_add(p * ldb);
            let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                let x = _mm512_maskz_loadu_epi32(masks[v], bp.wrapping_add(v * 16).cast());
                std::mem::transmute::<__m512i, __m512bh>(x)
            });
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_epi32(*a.add(r * lda + p) as i32);
                let av = std::mem::transmute::<__m512i, __m512bh>(av);
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = _mm512_dpbf16_ps(*x, av, bx);
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

/// `C[m × n] = A[m × k2] · B[k2 × n]` over bf16 pairs (see [`tile_bf16`]), f32 result.
///
/// # Safety
/// AVX-512F and AVX512_BF16 must be available; the slices must hold the rows the strides
/// describe (checked with `debug_assert!`).
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm_bf16(
    (m, n, k2): (usize, usize, usize),
    a: &[u32],
    lda: usize,
    b: &[u32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    debug_assert!(m == 0 || a.len() >= (m - 1) * lda + k2);
    debug_assert!(k2 == 0 || b.len() >= (k2 - 1) * ldb + n);
    debug_assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    for col in (0..n).step_by(NR) {
        let masks = tile_masks(col, n);
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR);
            // SAFETY: the features are available (caller); the tile lies inside the slices.
            unsafe {
                let (a, b, c) = (a.add(row * lda), b.add(col), c.add(row * ldc + col));
                let args = (k2, a, lda, b, ldb, c, ldc, masks, false);
                dispatch_rows!(rows, tile_bf16, args);
            }
            row += rows;
        }
    }
}

/// `e^x` for 16 lanes, relative error ≈ 1e-7 for the `x ≤ 0` the softmax feeds it; `−∞` gives 0.
///
/// `e^x = 2^t` with `t = x·log₂e = n + f`, `n` an integer, `|f| ≤ ½`; `2^f` from its degree-7
/// Taylor series in `f·ln 2` (truncation error ≤ (½ ln 2)⁸/8! ≈ 5e-9), `2^n` by `vscalefps`.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp(x: __m512) -> __m512 {
    // Below 2^-200 every f32 is 0; the clamp also turns −∞ into a plain 0 result.
    let t = _mm512_max_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        _mm512_set1_ps(-200.0),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(std::f32::consts::LN_2));
    // Σ f^i / i!, i = 0..=7, by Horner.
    const INV_FACT: [f32; 8] = [
        1.0,
        1.0,
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5040.0,
    ];
    let mut p = _mm512_set1_ps(INV_FACT[7]);
    for &c in INV_FACT[..7].iter().rev() {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, n)
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

/// The largest value of `x` (`−∞` when empty).
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn max(x: &[f32]) -> f32 {
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut acc = ninf;
    let n = x.len();
    for i in (0..n).step_by(16) {
        let m = lane_mask(i, n);
        // SAFETY: lanes of `m` lie inside `x`.
        let v = unsafe { _mm512_mask_loadu_ps(ninf, m, x.as_ptr().add(i)) };
        acc = _mm512_max_ps(acc, v);
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
