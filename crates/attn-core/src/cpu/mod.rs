//! The CPU layer: the primitives every algorithm of the crate runs on, and the one place
//! that asks the CPU what it has. Nothing here knows about attention.
//!
//! [`Isa`] names an instruction set, [`Isa::best`] the fastest this CPU runs (detected once,
//! [`Features`]); each algorithm takes its call's `Isa` and calls the primitives through it, so
//! a caller that forces [`Isa::Portable`] runs no vector code. One file per instruction set:
//! `portable.rs` (plain Rust), `avx2.rs`, `avx512.rs` (GEMM microkernels, the row operations of
//! the softmax, their exponentials), `amx.rs` (tiles, the VNNI packing, the 32 × 32 bf16 block
//! products), `bf16dot.rs` (the same blocks in `VDPBF16PS` dot products), `bf16x.rs` (f32
//! products from bf16 parts on the tiles), `amx_linear.rs` (linear layers' f32 weights as
//! bf16 parts on the tiles, for `attn-models`); `exp.rs` holds the exponentials' coefficient tables,
//! `aligned.rs` the cache-line-aligned buffers.

pub(crate) mod aligned;
pub(crate) mod amx;
mod amx_linear;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod bf16dot;
#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16x;
mod element;
pub(crate) mod exp;
pub(crate) mod gemm;
mod isa;
pub(crate) mod portable;

pub use amx_linear::Bf16x3Weight;
pub(crate) use element::{Element, FiniteBits};
pub(crate) use isa::Features;
pub use isa::Isa;
pub(crate) use portable::max_keeping_nan;

#[cfg(target_arch = "x86_64")]
use avx2 as avx2_or_portable;
#[cfg(target_arch = "x86_64")]
use avx512 as avx512_or_portable;
#[cfg(not(target_arch = "x86_64"))]
use portable as avx2_or_portable;
#[cfg(not(target_arch = "x86_64"))]
use portable as avx512_or_portable;

use crate::error::AttnError;

/// Panics unless the slices hold the rows their strides describe for `C[m × n] = A[m × k] · B`,
/// `B` being `rows × cols` (`k × n`, or `n × k` when transposed).
#[inline]
fn assert_fits(
    (m, n, k): (usize, usize, usize),
    (a_len, lda): (usize, usize),
    (b_len, ldb, (rows, cols)): (usize, usize, (usize, usize)),
    (c_len, ldc): (usize, usize),
) {
    assert!(
        n <= ldc && cols <= ldb && k <= lda,
        "gemm strides too small"
    );
    assert!(m == 0 || a_len >= (m - 1) * lda + k, "gemm: A too short");
    assert!(
        rows == 0 || b_len >= (rows - 1) * ldb + cols,
        "gemm: B too short"
    );
    assert!(m == 0 || c_len >= (m - 1) * ldc + n, "gemm: C too short");
}

impl Isa {
    /// `C[m × n] (+)= A[m × k] · B[k × n]` in f32 (row-major, strides `lda`, `ldb`, `ldc`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_f32(
        self,
        mnk: (usize, usize, usize),
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        // The AVX-512 kernel indexes with raw pointers: these checks (three compares per GEMM
        // call) keep this safe function sound whatever its caller passes.
        let (_, n, k) = mnk;
        assert_fits(mnk, (a.len(), lda), (b.len(), ldb, (k, n)), (c.len(), ldc));
        match self {
            // SAFETY: an `Isa::Avx512`, `Isa::Avx512Bf16` or `Isa::Amx` (the last two imply
            // AVX-512F) only reaches the kernels after `is_available` said yes; the slices hold
            // what the strides describe (checked above).
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe {
                avx512_or_portable::gemm_f32(mnk, a, lda, b, ldb, c, ldc, accumulate)
            },
            // SAFETY: as for AVX-512, with AVX2 and FMA.
            Isa::Avx2 => unsafe {
                avx2_or_portable::gemm_f32(mnk, a, lda, b, ldb, c, ldc, accumulate)
            },
            Isa::Portable => portable::gemm_f32(mnk, a, lda, b, ldb, c, ldc, accumulate),
        }
    }

    /// `C[m × n] (+)= A[m × k] · B[k × n]` in f32: `A` row-major or in panels of
    /// [`gemm::MR`] rows ([`gemm::Lhs`]), `B` and `C` row-major with strides `ldb`, `ldc`.
    pub(crate) fn gemm_lhs(
        self,
        mnk: (usize, usize, usize),
        (a, lhs): (&[f32], gemm::Lhs),
        (b, ldb): (&[f32], usize),
        (c, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) {
        // As in `gemm_f32`: the AVX-512 kernel indexes with raw pointers. Panels of `m` rows
        // hold `m · k` values, as rows `k` apart do.
        let (_, n, k) = mnk;
        let lda = match lhs {
            gemm::Lhs::Rows(lda) => lda,
            gemm::Lhs::Panels => k,
        };
        assert_fits(mnk, (a.len(), lda), (b.len(), ldb, (k, n)), (c.len(), ldc));
        let (a, b, c) = ((a, lhs), (b, ldb), (c, ldc));
        match self {
            // SAFETY: see `gemm_f32`; the slices hold what the layouts describe (checked
            // above).
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe {
                avx512_or_portable::gemm_lhs(mnk, a, b, c, accumulate)
            },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::gemm_lhs(mnk, a, b, c, accumulate) },
            Isa::Portable => portable::gemm_lhs(mnk, a, b, c, accumulate),
        }
    }

    /// `C[m × n] = A[m × k] · B[n × k]ᵀ` in f32, `B` in f32 or bf16 (row-major, strides `lda`,
    /// `ldb`, `ldc`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_abt<T: Element>(
        self,
        mnk: (usize, usize, usize),
        a: &[f32],
        lda: usize,
        b: &[T],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
    ) {
        // As in `gemm_f32`: the AVX-512 kernel indexes with raw pointers.
        let (_, n, k) = mnk;
        assert_fits(mnk, (a.len(), lda), (b.len(), ldb, (n, k)), (c.len(), ldc));
        match self {
            // SAFETY: see `gemm_f32`; the slices hold what the strides describe (checked
            // above).
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe {
                avx512_or_portable::gemm_abt(mnk, a, lda, b, ldb, c, ldc)
            },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::gemm_abt(mnk, a, lda, b, ldb, c, ldc) },
            Isa::Portable => portable::gemm_abt(mnk, a, lda, b, ldb, c, ldc),
        }
    }

    /// `C[m × n] += A[m × k] · B[k × n]` in f32, `B` in f32 or bf16 (row-major, strides
    /// `lda`, `ldb`, `ldc`), each value of `C` as [`Isa::gemm_f32`] gives it; returns whether
    /// every value of `B` is below `2^bound_exp` in magnitude (NaN never). `m ≥ 1`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_checked<T: Element>(
        self,
        mnk: (usize, usize, usize),
        a: &[f32],
        lda: usize,
        b: &[T],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        bound_exp: i32,
    ) -> bool {
        // As in `gemm_f32`: the AVX-512 kernel indexes with raw pointers.
        let (m, n, k) = mnk;
        assert_fits(mnk, (a.len(), lda), (b.len(), ldb, (k, n)), (c.len(), ldc));
        assert!(
            (-126..=127).contains(&bound_exp),
            "gemm: bound past f32's exponents"
        );
        // The AVX-512 kernel checks `B` as the first rows of `A` meet it.
        assert!(m > 0, "gemm_checked: no rows of A, so B is not read");
        match self {
            // SAFETY: see `gemm_f32`; the slices hold what the strides describe (checked
            // above).
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe {
                avx512_or_portable::gemm_checked(mnk, a, lda, b, ldb, c, ldc, bound_exp)
            },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe {
                avx2_or_portable::gemm_checked(mnk, a, lda, b, ldb, c, ldc, bound_exp)
            },
            Isa::Portable => portable::gemm_checked(mnk, a, lda, b, ldb, c, ldc, bound_exp),
        }
    }

    /// `x *= a`.
    pub(crate) fn scale(self, x: &mut [f32], a: f32) {
        match self {
            // SAFETY: see `gemm_f32`.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe { avx512_or_portable::scale(x, a) },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::scale(x, a) },
            Isa::Portable => portable::scale(x, a),
        }
    }

    /// The largest value of `x` (`−∞` when empty; NaN when `x` holds one).
    pub(crate) fn max(self, x: &[f32]) -> f32 {
        match self {
            // SAFETY: see `gemm_f32`.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe { avx512_or_portable::max(x) },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::max(x) },
            Isa::Portable => portable::max(x),
        }
    }

    /// `x = e^(scale·x − m)`, returning the sum of the new values: on AVX-512 with AVX512DQ and
    /// on AVX2 in one pass (`avx512::exp_scaled_sum`, `avx2::exp_scaled_sum`); elsewhere `x`
    /// times `scale`, then [`Isa::exp_sub_sum`]. `scale·x` is rounded as a product of its own
    /// either way.
    pub(crate) fn exp_scaled_sum(self, x: &mut [f32], scale: f32, m: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.avx512() && Features::get().avx512dq {
            // SAFETY: AVX-512F (these ISAs are only run where available) and AVX512DQ
            // (checked just above).
            return unsafe { avx512::exp_scaled_sum(x, scale, m) };
        }
        #[cfg(target_arch = "x86_64")]
        if self == Isa::Avx2 {
            // SAFETY: see `gemm_f32`.
            return unsafe { avx2::exp_scaled_sum(x, scale, m) };
        }
        self.scale(x, scale);
        self.exp_sub_sum(x, m)
    }

    /// `x = e^(x − m)`, returning the sum of the new values.
    pub(crate) fn exp_sub_sum(self, x: &mut [f32], m: f32) -> f32 {
        match self {
            // SAFETY: see `gemm_f32`.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe {
                avx512_or_portable::exp_sub_sum(x, m)
            },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::exp_sub_sum(x, m) },
            Isa::Portable => portable::exp_sub_sum(x, m),
        }
    }
}

impl Isa {
    /// The largest Euclidean norm of the rows of `x` (`[rows, width]`), rounded up past what the
    /// squares lose to underflow; 0 without rows, NaN or ∞ when `x` holds NaN or ∞.
    ///
    /// The squares of values under 2^-75 underflow: each loses up to 2^-149 of its row's sum, so
    /// `width · 2^-149` is added to the largest sum. Without it a head of keys of 1e-30 had norm 0
    /// and passed every bound, whatever the scale (1e30 made its scores 1e10 on the tiles).
    pub(crate) fn max_norm(self, x: &[f32], width: usize) -> f32 {
        if x.is_empty() {
            return 0.0;
        }
        let lost = width as f32 * f32::from_bits(1);
        (self.max_square_sum(x, width) + lost).sqrt()
    }

    /// The largest sum of squares of the rows of `x` (`[rows, width]`, at least one); NaN or ∞ when
    /// `x` holds NaN or ∞.
    fn max_square_sum(self, x: &[f32], width: usize) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self.avx512() {
            // SAFETY: an AVX-512 ISA only runs where available.
            return unsafe { avx512::max_square_sum(x, width) };
        }
        let mut max = 0.0f32;
        for row in x.chunks_exact(width) {
            let sq: f32 = row.iter().map(|v| v * v).sum();
            // `f32::max` would drop a NaN.
            if sq.is_nan() {
                return sq;
            }
            max = max.max(sq);
        }
        max
    }

    /// Transposes `src` (`[rows, width]`) block by block into `dst`: rows `jb·block..` become
    /// block `jb`, `[width, n]` (`n` rows in the block), at `jb·block·width`; 16 × 16 tiles at a
    /// time on AVX-512.
    pub(crate) fn transpose_blocks(
        self,
        src: &[f32],
        (width, block): (usize, usize),
        dst: &mut [f32],
    ) {
        if width == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx512() {
            // SAFETY: an AVX-512 ISA only runs where available.
            return unsafe { avx512::transpose_blocks(src, (width, block), dst) };
        }
        portable::transpose_blocks(src, (width, block), dst, |x| x);
    }
}

/// Asks for the first four 64-byte lines of each 4 KiB page that starts inside `x` to be
/// brought into the caches (a decoding step's next key block). The hardware
/// prefetchers follow a stream only within a page, and a decoding step reads each key and
/// value once, so without this it waits at each page it enters. Two lines per page hide most
/// of that wait, four a little more.
pub(crate) fn prefetch_page_starts<T>(x: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let p = x.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(x);
        for page in (p.align_offset(4096)..bytes).step_by(4096) {
            for line in (page..bytes.min(page + 256)).step_by(64) {
                // SAFETY: `line` lies inside `x`; a prefetch reads nothing the program sees.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.add(line)) };
            }
        }
    }
}

/// Asks for the values `at..at + len` of `data` (those inside it) to be brought into the L2
/// cache: a mask row's next key block, which the row's next step reads once every row of its
/// query block has taken this one. A float mask [L, S] is read once per head (16 MiB at
/// L = S = 2048), in pieces of rows 4·S bytes apart, which the hardware prefetchers do not
/// follow.
pub(crate) fn prefetch_l2<T>(data: &[T], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        let end = at.saturating_add(len).min(data.len());
        for i in (at..end).step_by((64 / size_of::<T>()).max(1)) {
            // SAFETY: `i < data.len()`; a prefetch reads nothing the program sees.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(data.as_ptr().add(i).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, at, len);
}

/// The most workers [`set_global_threads`] starts: more than the cores of any machine this
/// runs on, and few enough to start quickly.
pub const MAX_THREADS: usize = 1024;

/// Sizes rayon's global pool, which the fused kernels run on, to `threads` workers. Call it once,
/// before any attention call; asking again for the size the pool already has is fine.
///
/// # Errors
/// `threads` is 0 or more than [`MAX_THREADS`], or the pool already runs with another size.
pub fn set_global_threads(threads: usize) -> Result<(), AttnError> {
    let invalid = |reason: String| AttnError::InvalidOption {
        option: "threads",
        reason,
    };
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(invalid(format!(
            "must be between 1 and {MAX_THREADS}, not {threads} (this machine has {} cores)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )));
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(e) => Err(invalid(format!(
            "cannot size the thread pool to {threads}: {e} (it has {})",
            rayon::current_num_threads()
        ))),
    }
}

/// Says on the process's standard error, which the test harness does not capture, that the
/// running test leaves `what` unchecked because this CPU cannot run it.
#[cfg(test)]
pub(crate) fn not_on_this_cpu(what: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = writeln!(
        std::io::stderr(),
        "note: {test}: {what} not checked, this CPU lacks it"
    );
}

/// Every instruction set this CPU runs; the others are named as not checked
/// ([`not_on_this_cpu`]).
#[cfg(test)]
pub(crate) fn available_isas() -> Vec<Isa> {
    let (run, lacking): (Vec<Isa>, Vec<Isa>) =
        Isa::ALL.into_iter().partition(|isa| isa.is_available());
    if !lacking.is_empty() {
        not_on_this_cpu(&format!("{lacking:?}"));
    }
    run
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    use crate::cpu::available_isas as isas;

    /// Magnitudes below the bound pass, at it or above do not, NaN never, in vector bodies and
    /// tails.
    #[test]
    fn all_below_compares_magnitudes() {
        for n in [1, 15, 16, 17, 1000] {
            let mut x: Vec<f32> = (0..n).map(|i| (i % 7) as f32 - 3.0).collect();
            assert!(f32::all_below(&x, 3.5) && f32::all_below_in(&x, 3.5));
            assert!(!f32::all_below(&x, 3.0) && !f32::all_below_in(&x, 3.0));
            x[n - 1] = -1e30;
            assert!(!f32::all_below(&x, 1e30) && f32::all_below(&x, 2e30));
            x[n / 2] = f32::NAN;
            assert!(!f32::all_below(&x, f32::MAX) && !f32::all_below_in(&x, f32::MAX));
        }
    }

    /// The row kernels of every ISA this CPU runs against f64, tails included.
    #[test]
    fn row_kernels_match_f64() {
        for isa in available_isas() {
            row_kernels_of(isa);
        }
    }

    fn row_kernels_of(isa: Isa) {
        // 0, −0.01, …, −90 (past the 2^-125 flush at x ≈ −86.64), then −∞; 9002 values, so the
        // last 8- or 16-lane group is partial.
        let mut x: Vec<f32> = (0..=9000).map(|i| -(i as f32) * 0.01).collect();
        x.push(f32::NEG_INFINITY);
        let max = isa.max(&x);
        assert_eq!(max, 0.0);
        let mut e = x.clone();
        let sum = isa.exp_sub_sum(&mut e, 0.0);
        let mut want_sum = 0.0f64;
        for (&xi, &ei) in x.iter().zip(&e) {
            let want = f64::from(xi).exp();
            if xi * std::f32::consts::LOG2_E < -125.0 {
                // The vector kernels flush these to 0; the portable one's `exp` (libm's) does
                // not, within a few ulps of the subnormal result.
                match isa {
                    Isa::Portable => {
                        assert!((f64::from(ei) - want).abs() < 1e-44, "{isa:?} e^{xi}")
                    }
                    _ => assert_eq!(ei, 0.0, "{isa:?}: e^{xi} is below 2^-125: flushed to 0"),
                }
                continue;
            }
            want_sum += want;
            // Bound: polynomial and roundings (5e-7) plus the rounding of x·log2(e) in f32.
            let tol = 5e-7 + f64::from(xi).abs() * 1e-7;
            let rel = (f64::from(ei) - want).abs() / want;
            assert!(
                rel <= tol,
                "{isa:?} e^{xi}: got {ei}, want {want}, relative error {rel:e}"
            );
        }
        assert!((f64::from(sum) - want_sum).abs() / want_sum < 1e-5);
        // With a scale: `e^(scale·x − m)` on the doubled values (0 down to −180, then −∞) at
        // scale ½ and m = −1 (so the largest is e^1), against f64 on the same rounded product.
        let mut e = x.iter().map(|&xi| 2.0 * xi).collect::<Vec<f32>>();
        let sum = isa.exp_scaled_sum(&mut e, 0.5, -1.0);
        let mut want_sum = 0.0f64;
        for (&xi, &ei) in x.iter().zip(&e) {
            let t = f64::from(0.5 * (2.0 * xi)) + 1.0;
            let want = t.exp();
            if t * std::f64::consts::LOG2_E < -125.0 {
                match isa {
                    Isa::Portable => assert!(f64::from(ei) < 1e-37, "{isa:?} e^{t}"),
                    _ => assert_eq!(ei, 0.0, "{isa:?}: e^{t} is below 2^-125: flushed to 0"),
                }
                continue;
            }
            want_sum += want;
            let tol = 5e-7 + t.abs() * 1e-7;
            let rel = (f64::from(ei) - want).abs() / want;
            assert!(
                rel <= tol,
                "{isa:?} e^{t} with the scale: got {ei}, want {want}, error {rel:e}"
            );
        }
        assert!((f64::from(sum) - want_sum).abs() / want_sum < 1e-5);
        // An inexact scale on products near 1e-20 (scores near 1e10, whose ulp is 1024): the
        // max taken from the rounded `scale·max x` weighs exactly 1, the others at most 1.
        let x: Vec<f32> = (0..37).map(|i| 1e-20 * (1.0 + i as f32 * 1e-4)).collect();
        let top = 1e30 * x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut e = x.clone();
        isa.exp_scaled_sum(&mut e, 1e30, top);
        assert_eq!(e[36], 1.0, "{isa:?}: the largest score's weight");
        assert!(e.iter().all(|&w| w <= 1.0), "{isa:?}: {e:?}");
        let mut y = vec![2.0f32; 37];
        isa.scale(&mut y, 0.25);
        assert!(y.iter().all(|&v| v == 0.5));
        assert_eq!(isa.max(&[]), f32::NEG_INFINITY);
        // The largest value, and a NaN, at each place a wide loop's lanes or its tail hold.
        for len in [7, 8, 31, 32, 33, 70, 101] {
            for at in 0..len {
                let mut x: Vec<f32> = (0..len).map(|i| -(i as f32)).collect();
                x[at] = 3.5;
                assert_eq!(isa.max(&x), 3.5, "{isa:?}: largest at {at} of {len}");
                x[at] = f32::NAN;
                assert!(isa.max(&x).is_nan(), "{isa:?}: NaN at {at} of {len}");
            }
        }
    }

    /// `n` values in [−1, 1) from `seed`.
    fn values(seed: u32, n: usize) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (x >> 8) as f32 / (1 << 23) as f32 - 1.0
            })
            .collect()
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|x| x.to_bits()).collect()
    }

    /// `C (+)= A·B` within f32 rounding of f64 sums, on every ISA, on shapes that leave
    /// partial row tiles and column groups, with strides past the rows, replacing and
    /// accumulating, nothing written past `n` columns.
    #[test]
    fn gemm_matches_f64_sums() {
        for isa in isas() {
            for (m, n, k) in [
                (1, 1, 1),
                (7, 17, 5),
                (13, 33, 64),
                (96, 128, 64),
                (25, 70, 129),
                (6, 16, 0),
            ] {
                let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
                let (a, b, c0) = (values(6, m * lda), values(7, k * ldb), values(8, m * ldc));
                for accumulate in [false, true] {
                    let mut c = c0.clone();
                    isa.gemm_f32((m, n, k), &a, lda, &b, ldb, &mut c, ldc, accumulate);
                    for r in 0..m {
                        for j in n..ldc {
                            let (got, was) = (c[r * ldc + j], c0[r * ldc + j]);
                            assert_eq!(got, was, "{isa:?} ({m}, {n}, {k}): wrote past row {r}");
                        }
                        for j in 0..n {
                            let start = if accumulate {
                                f64::from(c0[r * ldc + j])
                            } else {
                                0.0
                            };
                            let products = (0..k)
                                .map(|p| f64::from(a[r * lda + p]) * f64::from(b[p * ldb + j]));
                            let (want, size) = products
                                .fold((start, start.abs()), |(s, z), x| (s + x, z + x.abs()));
                            let got = c[r * ldc + j];
                            assert!(
                                (f64::from(got) - want).abs() <= 1e-6 * size,
                                "{isa:?} ({m}, {n}, {k}) [{r}][{j}]: {got} against {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// `A·Bᵀ` against `B`'s rows as they are: within f32 rounding of f64 dot products, on
    /// every ISA, with strides past the rows and nothing written past `n` columns; bf16 `B`
    /// gives what its values widened to f32 give, bit for bit.
    #[test]
    fn abt_gemm_matches_f64_dot_products() {
        for isa in isas() {
            for (m, n, k) in [
                (1, 1, 1),
                (1, 16, 64),
                (3, 17, 40),
                (8, 33, 80),
                (2, 128, 128),
                (5, 7, 8),
                (1, 40, 17),
                (2, 9, 13),
                (3, 20, 23),
                (2, 0, 5),
                (0, 4, 5),
            ] {
                let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
                let (a, b) = (values(1, m * lda), values(2, n * ldb));
                let mut c = vec![f32::NAN; m * ldc];
                isa.gemm_abt((m, n, k), &a, lda, &b, ldb, &mut c, ldc);
                for r in 0..m {
                    for j in n..ldc {
                        assert!(
                            c[r * ldc + j].is_nan(),
                            "{isa:?} ({m}, {n}, {k}): wrote past row {r}"
                        );
                    }
                    for j in 0..n {
                        let products =
                            (0..k).map(|p| f64::from(a[r * lda + p]) * f64::from(b[j * ldb + p]));
                        let (want, size) =
                            products.fold((0.0, 0.0), |(s, z), x| (s + x, z + x.abs()));
                        let got = c[r * ldc + j];
                        let err = (f64::from(got) - want).abs();
                        assert!(
                            err <= 1e-6 * size,
                            "{isa:?} ({m}, {n}, {k}) [{r}][{j}]: {got} against {want}"
                        );
                    }
                }
                let b16: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
                let wide: Vec<f32> = b16.iter().map(|x| x.to_f32()).collect();
                let (mut got, mut want) = (vec![0.0; m * ldc], vec![0.0; m * ldc]);
                isa.gemm_abt((m, n, k), &a, lda, &b16, ldb, &mut got, ldc);
                isa.gemm_abt((m, n, k), &a, lda, &wide, ldb, &mut want, ldc);
                assert_eq!(bits(&got), bits(&want), "{isa:?} ({m}, {n}, {k}): bf16");
            }
        }
    }

    /// The checked GEMM adds to `C` what the GEMM adds, bit for bit (f32 `B`, and bf16 `B`
    /// against its values widened), on every ISA, and says whether every value of `B` is
    /// below the bound: one value at it, past it, ∞ or NaN, anywhere in `B` (also with more
    /// rows of `A` than one tile takes), says no; one just below it, yes.
    #[test]
    fn checked_gemm_is_the_gemm_and_checks_every_value() {
        for isa in isas() {
            for (m, n, k) in [
                (1, 64, 128),
                (3, 24, 7),
                (6, 80, 33),
                (9, 128, 1),
                (4, 8, 200),
                (5, 21, 9),
                (2, 13, 3),
            ] {
                let (lda, ldb, ldc) = (k + 1, n + 5, n + 3);
                let (a, b, c) = (values(3, m * lda), values(4, k * ldb), values(5, m * ldc));
                let checked = |b: &[f32]| {
                    let mut got = c.clone();
                    let below = isa.gemm_checked((m, n, k), &a, lda, b, ldb, &mut got, ldc, 1);
                    (below, got)
                };
                let mut want = c.clone();
                isa.gemm_f32((m, n, k), &a, lda, &b, ldb, &mut want, ldc, true);
                let (below, got) = checked(&b);
                assert!(below, "{isa:?} ({m}, {n}, {k}): values under 1 are below 2");
                assert_eq!(bits(&got), bits(&want), "{isa:?} ({m}, {n}, {k})");
                let b16: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
                let wide: Vec<f32> = b16.iter().map(|x| x.to_f32()).collect();
                let (mut got, mut want) = (c.clone(), c.clone());
                assert!(isa.gemm_checked((m, n, k), &a, lda, &b16, ldb, &mut got, ldc, 1));
                isa.gemm_f32((m, n, k), &a, lda, &wide, ldb, &mut want, ldc, true);
                assert_eq!(bits(&got), bits(&want), "{isa:?} ({m}, {n}, {k}): bf16");
                let at = [0, (k - 1) * ldb + n - 1, (k / 2) * ldb + n / 2];
                for (value, ok) in [
                    (2.0, false),
                    (-3.0, false),
                    (f32::INFINITY, false),
                    (f32::NAN, false),
                    (1.999, true),
                ] {
                    for &at in &at {
                        let mut b = b.clone();
                        b[at] = value;
                        assert_eq!(
                            checked(&b).0,
                            ok,
                            "{isa:?} ({m}, {n}, {k}): {value} at {at}"
                        );
                    }
                }
            }
        }
    }

    /// The tiled f32 transpose writes what the scalar one writes, on shapes with whole and
    /// partial tiles and blocks of 128 rows.
    #[test]
    fn f32_transpose_matches_the_scalar_one() {
        let isas = available_isas();
        for (keys, width) in [(1000, 64), (300, 80), (17, 40), (129, 8), (16, 16), (5, 3)] {
            let src: Vec<f32> = (0..keys * width).map(|i| i as f32).collect();
            let (mut want, mut got) = (vec![-1.0; keys * width], vec![-2.0; keys * width]);
            portable::transpose_blocks(&src, (width, 128), &mut want, |x| x);
            for &isa in &isas {
                got.fill(-2.0);
                isa.transpose_blocks(&src, (width, 128), &mut got);
                assert!(want == got, "{isa:?}: {keys} keys of {width}");
            }
        }
    }

    #[test]
    fn max_norm_finds_the_longest_row_and_keeps_nan() {
        for isa in available_isas() {
            max_norm_of(isa);
        }
    }

    fn max_norm_of(isa: Isa) {
        // Rows of 20 values (a 16-lane chunk and a tail); the longest is row 1.
        let mut x = vec![0.0f32; 3 * 20];
        x[3] = 3.0;
        x[20 + 17] = -12.0;
        x[20 + 2] = 5.0;
        x[40 + 19] = 1.0;
        assert_eq!(isa.max_norm(&x, 20), 13.0);
        assert_eq!(isa.max_norm(&[], 20), 0.0);
        // Rows whose squares underflow: still at least their norm.
        for tiny in [1e-20f32, 1e-30, 1e-38, 1e-45] {
            let y = vec![tiny; 3 * 20];
            let norm = (20.0 * f64::from(tiny).powi(2)).sqrt();
            assert!(f64::from(isa.max_norm(&y, 20)) >= norm, "{tiny}");
        }
        // 37 rows, the longest in each place: first, last, and on either side of rows 16 and 32.
        for width in [20, 64] {
            let rows = 37;
            let x: Vec<f32> = (0..rows * width)
                .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 97.0)
                .collect();
            for longest in [0, 7, 15, 16, 31, 32, 36] {
                let mut y = x.clone();
                y[longest * width + width / 2] = 90.0;
                let want = y
                    .chunks_exact(width)
                    .map(|row| {
                        row.iter()
                            .map(|&v| f64::from(v).powi(2))
                            .sum::<f64>()
                            .sqrt()
                    })
                    .fold(0.0, f64::max);
                let got = f64::from(isa.max_norm(&y, width));
                assert!(
                    (got - want).abs() <= 1e-6 * want,
                    "width {width}, longest row {longest}: {got} for {want}"
                );
                // A NaN or ∞ anywhere, including rows no longer than the others.
                for row in [longest, (longest + 9) % rows] {
                    let at = row * width + width - 1;
                    y[at] = f32::NAN;
                    assert!(isa.max_norm(&y, width).is_nan(), "NaN in row {row}");
                    y[at] = f32::INFINITY;
                    assert_eq!(isa.max_norm(&y, width), f32::INFINITY, "∞ in row {row}");
                    y[at] = x[at];
                }
            }
        }
        // In the first row, the longest and the last: a later finite row must not hide it.
        for at in [0, 5, 25, 45] {
            let mut y = x.clone();
            y[at] = f32::NAN;
            assert!(isa.max_norm(&y, 20).is_nan(), "NaN at {at}");
            y[at] = f32::INFINITY;
            assert_eq!(isa.max_norm(&y, 20), f32::INFINITY, "∞ at {at}");
        }
    }
}
