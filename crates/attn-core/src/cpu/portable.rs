//! The portable kernels of the fused path: plain Rust, for any CPU. Same contracts as the
//! AVX2 and AVX-512 kernels in `avx2.rs` and `avx512.rs`; the compiler vectorises the inner
//! loops for the baseline ISA.

use super::element::Element;
use super::gemm::{Lhs, MR};

/// `C[m × n] (+)= A[m × k] · B[k × n]`, `B` in f32 or bf16 (row-major, strides `lda`, `ldb`,
/// `ldc`).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_f32<T: Element>(
    mnk: (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    gemm_lhs(mnk, (a, Lhs::Rows(lda)), (b, ldb), (c, ldc), accumulate);
}

/// `C[m × n] (+)= A[m × k] · B[k × n]`, `A` laid out as `lhs` says (row-major, or in panels as
/// the backward pass packs it), `B` in f32 or bf16, `B` and `C` row-major with strides `ldb`,
/// `ldc`; one row of `C` at a time.
pub(super) fn gemm_lhs<T: Element>(
    (m, n, k): (usize, usize, usize),
    (a, lhs): (&[f32], Lhs),
    (b, ldb): (&[T], usize),
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    for r in 0..m {
        let c_row = &mut c[r * ldc..][..n];
        if !accumulate {
            c_row.fill(0.0);
        }
        for p in 0..k {
            let x = match lhs {
                Lhs::Rows(lda) => a[r * lda + p],
                Lhs::Panels => {
                    let r0 = r - r % MR;
                    a[r0 * k + p * (m - r0).min(MR) + r % MR]
                }
            };
            for (cv, &bv) in c_row.iter_mut().zip(&b[p * ldb..][..n]) {
                *cv += x * bv.into();
            }
        }
    }
}

/// `C[m × n] = A[m × k] · B[n × k]ᵀ`, `B` in f32 or bf16 (row-major, strides `lda`, `ldb`,
/// `ldc`).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_abt<T: Element>(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    for r in 0..m {
        let a_row = &a[r * lda..][..k];
        for (j, cv) in c[r * ldc..][..n].iter_mut().enumerate() {
            *cv = (a_row.iter().zip(&b[j * ldb..][..k]))
                .map(|(&x, &y)| x * y.into())
                .sum();
        }
    }
}

/// `C[m × n] += A[m × k] · B[k × n]`, `B` in f32 or bf16, as [`gemm_f32`] sums it; returns
/// whether every value of `B` is below `2^bound_exp` in magnitude (NaN never).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_checked<T: Element>(
    (m, n, k): (usize, usize, usize),
    a: &[f32],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    bound_exp: i32,
) -> bool {
    gemm_f32((m, n, k), a, lda, b, ldb, c, ldc, true);
    let bound = 2f32.powi(bound_exp);
    (0..k).all(|p| b[p * ldb..][..n].iter().all(|&x| x.into().abs() < bound))
}

/// `x *= a`.
pub(super) fn scale(x: &mut [f32], a: f32) {
    x.iter_mut().for_each(|v| *v *= a);
}

/// The largest value of `x` (`−∞` when empty; NaN when `x` holds one).
pub(super) fn max(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, max_keeping_nan)
}

/// `x = e^(x − m)`, returning the sum of the new values.
pub(super) fn exp_sub_sum(x: &mut [f32], m: f32) -> f32 {
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    sum
}

/// Transposes `src` (`[rows, width]`) block by block into `dst`: rows `jb·block..` become block
/// `jb`, `[width, n]` (`n` rows in the block), at `jb·block·width`.
pub(crate) fn transpose_blocks<T: Copy>(
    src: &[T],
    (width, block): (usize, usize),
    dst: &mut [f32],
    widen: impl Fn(T) -> f32,
) {
    for (src, dst) in src.chunks(block * width).zip(dst.chunks_mut(block * width)) {
        let keys = src.len() / width;
        for (j, row) in src.chunks_exact(width).enumerate() {
            for (p, &x) in row.iter().enumerate() {
                dst[p * keys + j] = widen(x);
            }
        }
    }
}

/// The larger of `a` and `b`, NaN when either is: `f32::max` skips a NaN, which would let a NaN
/// score pass for a hidden one.
pub(crate) fn max_keeping_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}
