//! The element types the kernels read (f32, and bf16 widened exactly as it is read), and the
//! loads of a row's last partial group of lanes, per instruction set, and the check of their
//! magnitudes by bits.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::bf16;

use super::isa::Features;

/// An element type of the inputs, read as f32 (bf16 widened exactly).
pub(crate) trait Element: Copy + Into<f32> {
    /// The values from `p` of the lanes of `mask` (a prefix mask), as f32, the others 0.
    ///
    /// # Safety
    /// AVX-512F must be available; the values of `mask`'s lanes readable from `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self, mask: u16) -> std::arch::x86_64::__m512;

    /// The first `lanes` values from `p` (`lanes ≤ 8`), as f32, the others 0.
    ///
    /// # Safety
    /// AVX2 must be available; `lanes` values readable from `p`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self, lanes: usize) -> std::arch::x86_64::__m256;
}

impl Element for f32 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const f32, mask: u16) -> std::arch::x86_64::__m512 {
        // SAFETY: as the caller guarantees; masked-off lanes are not read.
        unsafe { std::arch::x86_64::_mm512_maskz_loadu_ps(mask, p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32, lanes: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: as the caller guarantees.
        unsafe { load8_f32(p, lanes) }
    }
}

impl Element for bf16 {
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const bf16, mask: u16) -> std::arch::x86_64::__m512 {
        // SAFETY: as the caller guarantees.
        unsafe { load16_bf16(p, mask) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const bf16, lanes: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: as the caller guarantees.
        unsafe { load8_bf16(p, lanes) }
    }
}

#[cfg(target_arch = "x86_64")]
/// The lane mask of the first `lanes` of 8 lanes (`lanes ≤ 8`), as `vmaskmovps` reads it.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn prefix_mask(lanes: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(lanes as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

#[cfg(target_arch = "x86_64")]
/// The first `lanes` f32 values from `p` (`lanes ≤ 8`), the others 0: a masked load
/// (`vmaskmovps`) for a partial group, none for an empty one (AMD leaves a fault at a
/// masked-off lane to the implementation).
///
/// # Safety
/// AVX2 must be available; `lanes` values readable from `p`.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn load8_f32(p: *const f32, lanes: usize) -> __m256 {
    // SAFETY: as the caller guarantees; masked-off lanes are not read.
    unsafe {
        match lanes {
            8 => _mm256_loadu_ps(p),
            0 => _mm256_setzero_ps(),
            _ => _mm256_maskload_ps(p, prefix_mask(lanes)),
        }
    }
}

#[cfg(target_arch = "x86_64")]
/// The first `lanes` bf16 values from `p` (`lanes ≤ 8`) widened to f32 (exactly), the others 0
/// (none read when `lanes` is 0).
///
/// # Safety
/// AVX2 must be available; `lanes` values readable from `p`.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn load8_bf16(p: *const bf16, lanes: usize) -> __m256 {
    let bits = match lanes {
        // SAFETY: 8 values readable (caller).
        8 => unsafe { _mm_loadu_si128(p.cast()) },
        // There is no masked 16-bit load: the rest of a row goes through a copy.
        _ => {
            let mut rest = [bf16::ZERO; 8];
            // SAFETY: `lanes` values readable (caller), and `rest` holds 8.
            unsafe {
                std::ptr::copy_nonoverlapping(p, rest.as_mut_ptr(), lanes);
                _mm_loadu_si128(rest.as_ptr().cast())
            }
        }
    };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
}

#[cfg(target_arch = "x86_64")]
/// The values from `p` of the lanes of `mask` (the first few: a prefix mask), the others 0;
/// bf16 values widened to f32 (exactly).
///
/// # Safety
/// AVX-512F must be available; the values of `mask`'s lanes readable from `p`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn load16_bf16(p: *const bf16, mask: __mmask16) -> __m512 {
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

/// A float type whose values can be told finite from their bits.
pub(crate) trait FiniteBits: Copy {
    /// Positive infinity.
    const INFINITY: Self;

    /// Whether every value of `data` is below `bound` (positive) in magnitude, NaN never: the
    /// largest magnitude (the bits without the sign) is below `bound`'s, a max over integers
    /// that vectorises in the caller's instruction set (`#[inline(always)]`).
    fn all_below_in(data: &[Self], bound: Self) -> bool;

    /// [`FiniteBits::all_below_in`], 512 bits at a time where the CPU has AVX512BW (a check of
    /// bits, the same on every ISA).
    fn all_below(data: &[Self], bound: Self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if Features::get().avx512bw {
            // SAFETY: AVX-512F and AVX512BW are available (checked just above).
            return unsafe { all_below_avx512(data, bound) };
        }
        Self::all_below_in(data, bound)
    }

    /// Whether every value of `data` is finite, 512 bits at a time where the CPU has AVX512BW.
    fn all_finite(data: &[Self]) -> bool {
        Self::all_below(data, Self::INFINITY)
    }
}

/// # Safety
/// AVX-512F and AVX512BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn all_below_avx512<T: FiniteBits>(data: &[T], bound: T) -> bool {
    T::all_below_in(data, bound)
}

impl FiniteBits for f32 {
    const INFINITY: f32 = f32::INFINITY;

    #[inline(always)]
    fn all_below_in(data: &[f32], bound: f32) -> bool {
        let magnitude = data.iter().map(|x| x.to_bits() & 0x7fff_ffff).max();
        magnitude.unwrap_or(0) < bound.to_bits()
    }
}

impl FiniteBits for bf16 {
    const INFINITY: bf16 = bf16::INFINITY;

    #[inline(always)]
    fn all_below_in(data: &[bf16], bound: bf16) -> bool {
        // Without the sign the bits fit an i16, whose max vectorises on every x86-64 (SSE2).
        let magnitude = data.iter().map(|x| (x.to_bits() & 0x7fff) as i16).max();
        magnitude.unwrap_or(0) < bound.to_bits() as i16
    }
}
