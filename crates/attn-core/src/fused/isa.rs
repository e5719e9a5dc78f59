//! Which kernels run: detected once per process from the CPU, or chosen by the caller (tests
//! force [`Isa::Portable`] to check the fallback on a machine that has AVX-512).

use std::sync::OnceLock;

use super::{Element, avx2_or_portable, avx512_or_portable, portable};
use crate::AttnError;

/// An instruction set the fused kernels are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Isa {
    /// Plain Rust: runs on every CPU.
    Portable,
    /// AVX2 and FMA register-blocked kernels, 8 lanes wide (x86-64 CPUs without AVX-512).
    Avx2,
    /// AVX-512F register-blocked kernels.
    Avx512,
    /// The AVX-512 kernels, with AVX512_BF16 dot products (`VDPBF16PS`) for both GEMMs of bf16
    /// inputs, in the AMX path's layouts and steps, the weights rounded to bf16 as there (CPUs
    /// with AVX512_BF16 but no AMX, such as AMD's Zen 4 and Zen 5, where one `VDPBF16PS` does
    /// twice the multiply-adds of an f32 FMA). f32 inputs run as on [`Isa::Avx512`].
    Avx512Bf16,
    /// The AVX-512 kernels, with AMX tiles for the two GEMMs (see `amx.rs`): bf16 inputs as
    /// they are, f32 inputs in three bf16 parts per value, for heads of at least 32 query rows
    /// whose scores stay within the tiles' bound; other heads run as on [`Isa::Avx512`].
    Amx,
}

/// Whether the CPU has what [`Isa::Avx512Bf16`] and AMX then need, and AMX-BF16, and the OS
/// lets this process use the tiles; detected once.
fn has_amx() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| has_avx512_bf16() && crate::amx::available())
}

/// Whether the CPU has AVX-512F, AVX512_BF16 (the dot products, and to round weights to
/// bf16), AVX512BW and AVX512VL; detected once.
fn has_avx512_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            has_avx512()
                && std::arch::is_x86_feature_detected!("avx512bf16")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the CPU has AVX2 and FMA, detected once.
fn has_avx2() -> bool {
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the CPU is AMD's (CPUID leaf 0's vendor, `AuthenticAMD`), read once.
fn is_amd() -> bool {
    static AMD: OnceLock<bool> = OnceLock::new();
    *AMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let id = std::arch::x86_64::__cpuid(0);
            [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163]
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the CPU has AVX512DQ, detected once.
#[cfg(target_arch = "x86_64")]
fn has_avx512dq() -> bool {
    static DQ: OnceLock<bool> = OnceLock::new();
    *DQ.get_or_init(|| std::arch::is_x86_feature_detected!("avx512dq"))
}

/// Whether the CPU has AVX-512F, detected once.
fn has_avx512() -> bool {
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

impl Isa {
    /// Every instruction set, slowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Bf16,
        Isa::Amx,
    ];

    /// The fastest instruction set this CPU supports (detected once, then cached). Where it has
    /// AVX512_BF16 but no AMX, that is [`Isa::Avx512Bf16`] on AMD's CPUs, whose `VDPBF16PS` does
    /// twice an FMA's multiply-adds a cycle (a Zen 5 core: 452–469 GFLOP/s against 244–250),
    /// and [`Isa::Avx512`] on others (Intel's without usable AMX: on a Xeon `VDPBF16PS`
    /// measured 120 against the FMA's 222); every available one can still be asked for.
    pub fn best() -> Isa {
        if has_amx() {
            Isa::Amx
        } else if has_avx512_bf16() && is_amd() {
            Isa::Avx512Bf16
        } else if has_avx512() {
            Isa::Avx512
        } else if has_avx2() {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// `Ok` when this CPU can run the kernels of `self`; else the error every call that takes
    /// an `Isa` gives.
    pub(crate) fn require(self) -> Result<(), AttnError> {
        match self.is_available() {
            true => Ok(()),
            false => Err(AttnError::InvalidOption {
                option: "isa",
                reason: format!("{self:?} kernels need CPU features this machine lacks"),
            }),
        }
    }

    /// Whether this CPU can run the kernels of `self`.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 => has_avx2(),
            Isa::Avx512 => has_avx512(),
            Isa::Avx512Bf16 => has_avx512_bf16(),
            Isa::Amx => has_amx(),
        }
    }

    /// `C[m × n] (+)= A[m × k] · B[k × n]` in f32 (row-major, strides `lda`, `ldb`, `ldc`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm_f32(
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
        let (m, n, k) = mnk;
        assert!(n <= ldc && n <= ldb && k <= lda, "gemm strides too small");
        assert!(m == 0 || a.len() >= (m - 1) * lda + k, "gemm: A too short");
        assert!(k == 0 || b.len() >= (k - 1) * ldb + n, "gemm: B too short");
        assert!(m == 0 || c.len() >= (m - 1) * ldc + n, "gemm: C too short");
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
        let (m, n, k) = mnk;
        assert!(n <= ldc && k <= ldb && k <= lda, "gemm strides too small");
        assert!(m == 0 || a.len() >= (m - 1) * lda + k, "gemm: A too short");
        assert!(n == 0 || b.len() >= (n - 1) * ldb + k, "gemm: B too short");
        assert!(m == 0 || c.len() >= (m - 1) * ldc + n, "gemm: C too short");
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
    pub(super) fn gemm_checked<T: Element>(
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
        assert!(n <= ldc && n <= ldb && k <= lda, "gemm strides too small");
        assert!(m == 0 || a.len() >= (m - 1) * lda + k, "gemm: A too short");
        assert!(k == 0 || b.len() >= (k - 1) * ldb + n, "gemm: B too short");
        assert!(m == 0 || c.len() >= (m - 1) * ldc + n, "gemm: C too short");
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
    pub(super) fn scale(self, x: &mut [f32], a: f32) {
        match self {
            // SAFETY: see `gemm_f32`.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe { avx512_or_portable::scale(x, a) },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::scale(x, a) },
            Isa::Portable => portable::scale(x, a),
        }
    }

    /// The largest value of `x` (`−∞` when empty; NaN when `x` holds one).
    pub(super) fn max(self, x: &[f32]) -> f32 {
        match self {
            // SAFETY: see `gemm_f32`.
            Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => unsafe { avx512_or_portable::max(x) },
            // SAFETY: see `gemm_f32`.
            Isa::Avx2 => unsafe { avx2_or_portable::max(x) },
            Isa::Portable => portable::max(x),
        }
    }

    /// `x = e^(scale·x − m)`, returning the sum of the new values: on AVX-512 with AVX512DQ in
    /// one pass ([`avx512::exp_scaled_sum`]); elsewhere `x` times `scale`, then
    /// [`Isa::exp_sub_sum`]. `scale·x` is rounded as a product of its own either way.
    ///
    /// [`avx512::exp_scaled_sum`]: super::avx512::exp_scaled_sum
    pub(super) fn exp_scaled_sum(self, x: &mut [f32], scale: f32, m: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if matches!(self, Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx) && has_avx512dq() {
            // SAFETY: AVX-512F (these ISAs are only run where available) and AVX512DQ
            // (checked just above).
            return unsafe { super::avx512::exp_scaled_sum(x, scale, m) };
        }
        self.scale(x, scale);
        self.exp_sub_sum(x, m)
    }

    /// `x = e^(x − m)`, returning the sum of the new values.
    pub(super) fn exp_sub_sum(self, x: &mut [f32], m: f32) -> f32 {
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

/// The most workers [`set_global_threads`] starts: more than the cores of any machine this
/// runs on. Ten thousand took minutes to start (a 2-core virtual machine).
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

#[cfg(test)]
mod tests {
    use super::Isa;

    /// The row kernels of every ISA this CPU runs against f64, tails included.
    #[test]
    fn row_kernels_match_f64() {
        for isa in crate::available_isas() {
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
    }
}
