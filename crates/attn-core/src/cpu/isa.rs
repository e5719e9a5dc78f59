//! Which instruction sets this CPU runs: the only place the crate asks the CPU (and, for AMX,
//! the OS) what it has.

use std::sync::OnceLock;

use crate::error::AttnError;

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
    /// with AVX512_BF16, DQ, BW and VL but no AMX, such as AMD's Zen 4 and Zen 5, where one
    /// `VDPBF16PS` does twice the multiply-adds of an f32 FMA). f32 inputs run as on
    /// [`Isa::Avx512`].
    Avx512Bf16,
    /// The AVX-512 kernels, with AMX tiles for the two GEMMs (see `amx.rs`): bf16 inputs as
    /// they are, f32 inputs in three bf16 parts per value, for heads of at least 32 query rows
    /// whose scores stay within the tiles' bound; other heads run as on [`Isa::Avx512`].
    Amx,
}

/// What this CPU (and, for AMX, the OS) lets the process run, read once: the only place the
/// crate asks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Features {
    /// AVX2 and FMA.
    pub(crate) avx2: bool,
    /// AVX-512F.
    pub(crate) avx512: bool,
    /// AVX512DQ.
    pub(crate) avx512dq: bool,
    /// AVX512BW.
    pub(crate) avx512bw: bool,
    /// AVX-512F, DQ, BW, VL and AVX512_BF16: the dot products' ISA, and the bf16 conversions and
    /// splits of the AMX path.
    pub(crate) avx512_bf16: bool,
    /// AMX-TILE and AMX-BF16 with the tile state granted by the OS, besides `avx512_bf16`.
    pub(crate) amx: bool,
    /// An AMD CPU (CPUID leaf 0's vendor, `AuthenticAMD`).
    pub(crate) amd: bool,
}

impl Features {
    /// This CPU's, detected on the first call.
    pub(crate) fn get() -> Features {
        static FEATURES: OnceLock<Features> = OnceLock::new();
        *FEATURES.get_or_init(Features::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> Features {
        use std::arch::is_x86_feature_detected as has;
        let avx512 = has!("avx512f");
        let (dq, bw, vl) = (has!("avx512dq"), has!("avx512bw"), has!("avx512vl"));
        let avx512_bf16 = avx512 && dq && bw && vl && has!("avx512bf16");
        let id = std::arch::x86_64::__cpuid(0);
        Features {
            avx2: has!("avx2") && has!("fma"),
            avx512,
            avx512dq: avx512 && dq,
            avx512bw: avx512 && bw,
            avx512_bf16,
            amx: avx512_bf16 && amx_available(),
            amd: [id.ebx, id.edx, id.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163],
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> Features {
        Features::default()
    }
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
    /// twice an FMA's multiply-adds a cycle, and [`Isa::Avx512`] on others (Intel's without
    /// usable AMX, where `VDPBF16PS` is slower than the f32 FMA); every available one can still
    /// be asked for.
    pub fn best() -> Isa {
        let f = Features::get();
        if f.amx {
            Isa::Amx
        } else if f.avx512_bf16 && f.amd {
            Isa::Avx512Bf16
        } else if f.avx512 {
            Isa::Avx512
        } else if f.avx2 {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// Whether `self` runs the AVX-512 kernels (with or without the bf16 products): a CPU that
    /// runs `self` then has AVX-512F, for other crates' loops compiled for it.
    pub fn avx512(self) -> bool {
        matches!(self, Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx)
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
        let f = Features::get();
        match self {
            Isa::Portable => true,
            Isa::Avx2 => f.avx2,
            Isa::Avx512 => f.avx512,
            Isa::Avx512Bf16 => f.avx512_bf16,
            Isa::Amx => f.amx,
        }
    }
}

/// Whether this CPU has AMX-TILE and AMX-BF16 and the OS lets this process use them (checked,
/// and permission asked, once per process: [`Features`] asks).
pub(crate) fn amx_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| has_amx_bf16() && request_permission())
}

/// CPUID leaf 7, sub-leaf 0: EDX bit 24 is AMX-TILE, bit 22 AMX-BF16.
#[cfg(target_arch = "x86_64")]
fn has_amx_bf16() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // Leaf 7 is read only when leaf 0 says it exists.
    __cpuid(0).eax >= 7 && {
        let edx = __cpuid_count(7, 0).edx;
        edx & (1 << 24) != 0 && edx & (1 << 22) != 0
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn has_amx_bf16() -> bool {
    false
}

/// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// which holds for the whole process once granted.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes which CPU state the kernel saves
    // for this process; it reads and writes no memory of ours.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_permission() -> bool {
    false
}
