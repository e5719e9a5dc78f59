//! The 32 × 32 blocks of [`crate::cpu::amx::gemm_blocks`] on CPUs with AVX512_BF16 but no AMX
//! (AMD's Zen 4 and Zen 5): `C (+)= A·B` in `VDPBF16PS` dot products, reading the operands in
//! the layouts the tiles read, so that a head packed once for the tiles runs here as it is.
//!
//! One `VDPBF16PS` adds, in each of its 16 f32 lanes, the two products of a lane's bf16 pair:
//! 32 multiply-adds, twice an f32 FMA's. B's VNNI layout ([`crate::cpu::amx::PackedB`]) holds, per
//! depth pair and 16 columns, exactly one such vector; A's rows hold their pairs next to each
//! other, so a pair is one 32-bit broadcast. Intel's definition (*SDM* vol. 2, `VDPBF16PS`)
//! reads bf16 subnormals as zero and flushes subnormal results, rounding to nearest even, as
//! `TDPBF16PS` does: products of bf16 values are exact in f32, the sums are f32 sums.

use half::bf16;

/// Proof that this CPU has what [`super::isa::Isa::Avx512Bf16`] needs (AVX-512F, AVX512_BF16,
/// AVX512BW, which `avx512bf16` implies for the compiler, and AVX512VL): only
/// [`Bf16Dot::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bf16Dot(());

impl Bf16Dot {
    /// `Some` where the CPU has what [`super::isa::Isa::Avx512Bf16`] needs.
    pub(crate) fn detect() -> Option<Bf16Dot> {
        super::isa::Isa::Avx512Bf16
            .is_available()
            .then_some(Bf16Dot(()))
    }
}

/// Rows of C per register block: 8 rows of 32 columns are 16 accumulators, which a depth pair
/// feeds with two loads of B and eight broadcasts of A.
#[cfg(target_arch = "x86_64")]
const ROWS: usize = 8;

/// One 32 × 32 block `C (+)= A·B` over `k_chunks` depth chunks of 32, with the arguments of
/// `amx::block_2x2`: `a` at A's first row (rows `lda` bytes apart, `32·k_chunks` bf16 each),
/// `b0`/`b1` at the first VNNI tile of C's left/right 16 columns (16 depth pairs of 64
/// bytes), the next depth chunk's `ldb` bytes further, `c` at C's first row (rows `ldc` bytes
/// apart, 32 f32 each).
///
/// # Safety
/// `k_chunks ≥ 1`; every address above readable (writable for `c`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block_2x2(
    _: Bf16Dot,
    k_chunks: usize,
    a: *const bf16,
    lda: usize,
    (b0, b1): (*const bf16, *const bf16),
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): the caller guarantees the memory; AVX-512F and AVX512_BF16 are
    // available (a `Bf16Dot` exists). The `__m512bh` transmutes reinterpret 512 bits.
    unsafe {
        for r0 in (0..32).step_by(ROWS) {
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            if accumulate {
                for (r, acc) in acc.iter_mut().enumerate() {
                    let row = c.byte_add((r0 + r) * ldc);
                    *acc = [_mm512_loadu_ps(row), _mm512_loadu_ps(row.add(16))];
                }
            }
            let a = a.byte_add(r0 * lda);
            for ch in 0..k_chunks {
                let (b0, b1, a) = (b0.byte_add(ch * ldb), b1.byte_add(ch * ldb), a.add(32 * ch));
                for p in 0..16 {
                    let x0: __m512bh =
                        std::mem::transmute(_mm512_loadu_si512(b0.add(32 * p).cast()));
                    let x1: __m512bh =
                        std::mem::transmute(_mm512_loadu_si512(b1.add(32 * p).cast()));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pair = a
                            .byte_add(r * lda)
                            .add(2 * p)
                            .cast::<i32>()
                            .read_unaligned();
                        let y: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                        acc[0] = _mm512_dpbf16_ps(acc[0], x0, y);
                        acc[1] = _mm512_dpbf16_ps(acc[1], x1, y);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let row = c.byte_add((r0 + r) * ldc);
                _mm512_storeu_ps(row, acc[0]);
                _mm512_storeu_ps(row.add(16), acc[1]);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block_2x2(
    _: Bf16Dot,
    _: usize,
    _: *const bf16,
    _: usize,
    _: (*const bf16, *const bf16),
    _: usize,
    _: *mut f32,
    _: usize,
    _: bool,
) {
    unreachable!("AVX512_BF16 is never available off x86-64")
}
