//! The kernels of the backward pass: `C (+)= A·B` on row-major blocks (with `A` row-major or
//! packed in panels of [`MR`] rows), and the elementwise steps. Each has a portable build, an
//! AVX2 one and an AVX-512 one (the forward pass's GEMMs, `cpu/avx2.rs` and `cpu/avx512.rs`),
//! picked per call by the call's [`Isa`].

use crate::cpu::exp::exp_approx;
use crate::cpu::{Isa, gemm};

/// Rows of `C` per register tile of the AVX-512 and AVX2 GEMMs, and rows per panel of a [`Panels`].
pub(super) use crate::cpu::gemm::MR;

/// An `A` operand packed for the GEMM: rows in panels of [`MR`] (the last may hold fewer),
/// each panel `[cols, panel rows]`, so one column of a panel is contiguous. Panel `r0 / MR`
/// starts at `r0 · cols`.
#[derive(Clone, Copy)]
pub(super) struct Panels<'a> {
    pub(super) data: &'a [f32],
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl<'a> Panels<'a> {
    /// Views `data`, filled by [`pack_panels`], as a packed `rows × cols` operand.
    ///
    /// # Panics
    /// When `data` is shorter than `rows · cols`.
    pub(super) fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert!(data.len() >= rows * cols, "panels out of bounds");
        Panels { data, rows, cols }
    }
}

/// Packs the `rows × cols` matrix whose element `(r, p)` is `at(r, p)` into `dst` as
/// [`Panels`].
pub(super) fn pack_panels(
    (rows, cols): (usize, usize),
    at: impl Fn(usize, usize) -> f32,
    dst: &mut [f32],
) {
    for r0 in (0..rows).step_by(MR) {
        let n = (rows - r0).min(MR);
        let panel = &mut dst[r0 * cols..][..n * cols];
        for (p, col) in panel.chunks_exact_mut(n).enumerate() {
            for (r, x) in col.iter_mut().enumerate() {
                *x = at(r0 + r, p);
            }
        }
    }
}

/// The `A` of a GEMM: row-major, or packed in panels.
#[derive(Clone, Copy)]
pub(super) enum Lhs<'a> {
    Rows(Mat<'a>),
    Panels(Panels<'a>),
}

impl Lhs<'_> {
    fn shape(&self) -> (usize, usize) {
        match self {
            Lhs::Rows(m) => (m.rows, m.cols),
            Lhs::Panels(p) => (p.rows, p.cols),
        }
    }
}

/// A row-major `rows × cols` matrix inside `data`, rows `ld` apart.
#[derive(Clone, Copy)]
pub(super) struct Mat<'a> {
    pub(super) data: &'a [f32],
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) ld: usize,
}

/// The mutable twin of [`Mat`].
pub(super) struct MatMut<'a> {
    pub(super) data: &'a mut [f32],
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) ld: usize,
}

/// Whether `len` values hold `rows` rows of `cols` values `ld` apart.
fn fits(len: usize, rows: usize, cols: usize, ld: usize) -> bool {
    cols <= ld && (rows == 0 || (rows - 1) * ld + cols <= len)
}

impl<'a> Mat<'a> {
    /// Views `data` as `rows × cols` at row stride `ld`.
    ///
    /// # Panics
    /// When `data` is too short or `cols > ld` (a bug in the caller, not bad input).
    pub(super) fn new(data: &'a [f32], rows: usize, cols: usize, ld: usize) -> Self {
        assert!(
            fits(data.len(), rows, cols, ld),
            "matrix view out of bounds"
        );
        Mat {
            data,
            rows,
            cols,
            ld,
        }
    }

    /// A packed `rows × cols` view (`ld = cols`).
    pub(super) fn packed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols)
    }
}

impl<'a> MatMut<'a> {
    /// A packed `rows × cols` view (`ld = cols`).
    ///
    /// # Panics
    /// When `data` is shorter than `rows · cols` (a bug in the caller, not bad input).
    pub(super) fn packed(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        assert!(
            fits(data.len(), rows, cols, cols),
            "matrix view out of bounds"
        );
        MatMut {
            data,
            rows,
            cols,
            ld: cols,
        }
    }
}

/// `C (+)= A · B` on the GEMM of `isa`, which the caller made sure this CPU runs
/// (`Isa::require`).
///
/// # Shapes
/// `a`: `[m, k]`, `b`: `[k, n]`, `c`: `[m, n]`.
///
/// # Panics
/// When the shapes disagree (a bug in the caller).
pub(super) fn gemm(isa: Isa, c: MatMut<'_>, a: Lhs<'_>, b: Mat<'_>, accumulate: bool) {
    let (m, k) = a.shape();
    assert!(
        m == c.rows && b.cols == c.cols && k == b.rows,
        "gemm shapes disagree"
    );
    let a = match a {
        Lhs::Rows(a) => (a.data, gemm::Lhs::Rows(a.ld)),
        Lhs::Panels(a) => (a.data, gemm::Lhs::Panels),
    };
    isa.gemm_lhs(
        (m, c.cols, k),
        a,
        (b.data, b.ld),
        (c.data, c.ld),
        accumulate,
    );
}

/// One row of the transposed tiles (one key against a run of queries): `s ← P = e^(s − lse)`
/// and `dp ← dS = P ∘ (dp − delta)`, on the vectors of `isa` (which this CPU runs).
///
/// # Shapes
/// All four slices: `[queries]`.
pub(super) fn probs_and_grads(isa: Isa, s: &mut [f32], dp: &mut [f32], lse: &[f32], delta: &[f32]) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller made sure this CPU runs `isa`, and with it AVX-512F.
        isa if isa.avx512() => unsafe { probs_and_grads_avx512(s, dp, lse, delta) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller made sure this CPU runs AVX2 and FMA.
        Isa::Avx2 => unsafe { probs_and_grads_avx2(s, dp, lse, delta) },
        _ => probs_and_grads_body(s, dp, lse, delta),
    }
}

/// [`probs_and_grads_body`] vectorised 16 lanes wide.
///
/// # Safety
/// AVX-512F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn probs_and_grads_avx512(s: &mut [f32], dp: &mut [f32], lse: &[f32], delta: &[f32]) {
    probs_and_grads_body(s, dp, lse, delta);
}

/// [`probs_and_grads_body`] vectorised 8 lanes wide.
///
/// # Safety
/// AVX2 and FMA must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn probs_and_grads_avx2(s: &mut [f32], dp: &mut [f32], lse: &[f32], delta: &[f32]) {
    probs_and_grads_body(s, dp, lse, delta);
}

/// The body of [`probs_and_grads`], written so the compiler vectorises it (the
/// AVX-512 build compiles the same body with the feature on).
#[inline(always)]
pub(super) fn probs_and_grads_body(s: &mut [f32], dp: &mut [f32], lse: &[f32], delta: &[f32]) {
    let n = s.len();
    let (dp, lse, delta) = (&mut dp[..n], &lse[..n], &delta[..n]);
    for c in 0..n {
        let p = exp_approx(s[c] - lse[c]);
        s[c] = p;
        dp[c] = p * (dp[c] - delta[c]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both builds of the GEMM against f64 sums, on shapes that leave partial row and column
    /// tiles, with strides wider than the rows, replacing and accumulating.
    #[test]
    fn gemm_builds_match_f64() {
        let builds = crate::cpu::available_isas();
        for (m, n, k) in [
            (1, 1, 1),
            (7, 70, 5),
            (64, 64, 64),
            (13, 129, 33),
            (6, 16, 0),
        ] {
            let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
            let value = |i: usize| ((i * 7919 % 113) as f32 - 56.0) / 37.0;
            let a: Vec<f32> = (0..m * lda).map(value).collect();
            let b: Vec<f32> = (0..k * ldb).map(|i| value(i + 11)).collect();
            let c0: Vec<f32> = (0..m * ldc).map(|i| value(i + 5)).collect();
            let mut panels = vec![0.0; m * k];
            pack_panels((m, k), |r, p| a[r * lda + p], &mut panels);
            let lhs = [
                Lhs::Rows(Mat::new(&a, m, k, lda)),
                Lhs::Panels(Panels::new(&panels, m, k)),
            ];
            let runs = builds.iter().flat_map(|&b| lhs.map(|l| (b, l)));
            for (accumulate, (isa, lhs)) in runs.flat_map(|r| [(false, r), (true, r)]) {
                let mut c = c0.clone();
                let cm = MatMut {
                    data: &mut c,
                    rows: m,
                    cols: n,
                    ld: ldc,
                };
                gemm(isa, cm, lhs, Mat::new(&b, k, n, ldb), accumulate);
                for r in 0..m {
                    for col in 0..ldc {
                        let got = c[r * ldc + col];
                        if col >= n {
                            assert_eq!(got, c0[r * ldc + col], "{isa:?} wrote past the row");
                            continue;
                        }
                        let mut want = if accumulate {
                            f64::from(c0[r * ldc + col])
                        } else {
                            0.0
                        };
                        for p in 0..k {
                            want += f64::from(a[r * lda + p]) * f64::from(b[p * ldb + col]);
                        }
                        // k products of magnitude < 2.3, each rounded once: < k·2.3·6e-8.
                        let tol = 1e-6 * (k as f64 + 1.0);
                        assert!(
                            (f64::from(got) - want).abs() <= tol,
                            "{isa:?} {m}×{n}×{k} at ({r}, {col}): got {got}, want {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn probs_and_grads_builds_agree() {
        // 37 lanes: two full 16-lane groups and a tail; lse +∞ stands for a row that saw nothing.
        let s0: Vec<f32> = (0..37).map(|i| -(i as f32) * 0.3).collect();
        let dp0: Vec<f32> = (0..37).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut lse: Vec<f32> = (0..37).map(|i| i as f32 * 0.01).collect();
        lse[5] = f32::INFINITY;
        let delta: Vec<f32> = (0..37).map(|i| (i as f32).cos()).collect();
        let run = |isa: Isa| {
            let (mut s, mut dp) = (s0.clone(), dp0.clone());
            probs_and_grads(isa, &mut s, &mut dp, &lse, &delta);
            (s, dp)
        };
        let (p, ds) = run(Isa::Portable);
        for c in 0..37 {
            let want = f64::from(s0[c] - lse[c]).exp();
            assert!((f64::from(p[c]) - want).abs() <= 1e-6 * want, "P at {c}");
            let want_ds = f64::from(p[c]) * f64::from(dp0[c] - delta[c]);
            assert!((f64::from(ds[c]) - want_ds).abs() <= 1e-6, "dS at {c}");
        }
        assert_eq!((p[5], ds[5]), (0.0, 0.0), "lse +∞ gives P = 0");
        for isa in crate::cpu::available_isas() {
            assert_eq!(
                run(isa),
                (p.clone(), ds.clone()),
                "same arithmetic in every build"
            );
        }
    }
}
