//! f32 matrix products on AMX tiles, whose products take bf16 operands: every f32 `x` splits
//! into `P` bf16 parts, `x₀ = bf16(x)`, `x₁ = bf16(x − x₀)`, `x₂ = bf16(x − x₀ − x₁)` (nearest
//! even, `VCVTNEPS2BF16`), and `a·b` becomes a sum of part products, each a `TDPBF16PS` tile
//! product (products of bf16 values are exact in f32, and summed in f32).
//!
//! bf16 holds 8 significant bits, so each part takes the next 8 bits of `x`: `|x − x₀| ≤ 2⁻⁸|x|`,
//! `|x − x₀ − x₁| ≤ 2⁻¹⁶|x|`, `|x − x₀ − x₁ − x₂| ≤ 2⁻²⁴|x|` (each subtraction is exact). Two
//! schemes, the same as oneDNN's and oneMKL's f32 emulations:
//! - `P = 2` ("bf16x3", the backward pass): `a₀b₀ + a₀b₁ + a₁b₀`, within `3·2⁻¹⁶|ab|`
//!   (≈ 4.6e-5): what each factor's split misses, and the dropped `a₁b₁`.
//! - `P = 3` ("bf16x6", the f32 forward pass): `a₀b₀ + a₀b₁ + a₁b₀ + a₀b₂ + a₁b₁ + a₂b₀`, within
//!   `5·2⁻²⁴|ab|` (≈ 3e-7, a few f32 roundings): what each split misses (`2⁻²⁴` each) and the
//!   dropped `a₁b₂`, `a₂b₁` (`2⁻²⁴` each) and `a₂b₂`.
//!
//! `TDPBF16PS` and `VCVTNEPS2BF16` flush subnormals (below ~1e-38) to zero: parts of values
//! under ~1e-31 lose bits, an absolute error below 1e-38 per value.
//!
//! Layouts keep each 32-deep chunk's parts side by side, so a kernel reaches all of them from
//! one pointer:
//! - an "A" operand `[m, k]` is row-major bf16 bits, `[m, P·k̂]` (`k̂` is `k` padded with zeros to
//!   a multiple of 32): row `r`'s values `32c..32c + 32` have part `q` at `r·P·k̂ + 32(P·c + q)`;
//! - a "B" operand `[k, n]` is in the VNNI tile layout `TDPBF16PS` reads, padded with zeros to
//!   `k̂` rows and a multiple of 32 columns: for 16 columns `16·g..` and depth chunk `c`, part
//!   `q`'s tile is 512 values at `(P·(g·k̂/32 + c) + q)·512`; in a tile, `B[32c + 2p + e][16g + j]`
//!   sits at `32p + 2j + e`.

use std::arch::x86_64::*;

use super::amx::{Tiles, chunk_loop, finish_2x2, start_2x2};
use super::avx512::transpose_16x16;

/// Depth of one tile product: 16 pairs of bf16.
pub(crate) const TK: usize = 32;
/// bf16 values in one B tile.
pub(crate) const TILE: usize = 512;

/// 16 bf16 bits as the f32 values they stand for.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen(bits: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
}

/// Splits 16 f32 lanes (finite) into `P` parts, 16 bf16 bits each (module docs).
///
/// # Safety
/// The CPU must have what [`super::isa::Isa::Amx`] needs (AVX-512F, BW, VL and BF16).
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[inline]
pub(crate) unsafe fn split<const P: usize>(x: __m512) -> [__m256i; P] {
    let mut parts = [_mm256_setzero_si256(); P];
    let mut rest = x;
    for (q, part) in parts.iter_mut().enumerate() {
        // SAFETY: 16 bf16 are 16 u16 bits, and every bit pattern is valid for both.
        *part = unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(rest)) };
        if q + 1 < P {
            // SAFETY: AVX-512F is available (caller).
            rest = _mm512_sub_ps(rest, unsafe { widen(*part) });
        }
    }
    parts
}

/// Where part 0 of `A[r][x]` goes in the A layout of a `[m, k̂]` operand (module docs); part `q`
/// goes `32q` values further.
pub(crate) fn a_at<const P: usize>(r: usize, x: usize, k_pad: usize) -> usize {
    r * P * k_pad + P * TK * (x / TK) + x % TK
}

/// Where part 0's tile row of depth pair `p` (`B` rows `2p`, `2p + 1`) and 16-column group `g`
/// goes in the B layout of a `[k̂, n]` operand (module docs); part `q`'s row goes `512q` values
/// further.
pub(crate) fn b_at<const P: usize>(p: usize, g: usize, k_pad: usize) -> usize {
    P * (g * (k_pad / TK) + p / 16) * TILE + (p % 16) * TK
}

/// Stores the parts of 16 split values at `at`, `at + 32`, … (the A layout).
///
/// # Safety
/// As [`split`]; `dst` holds `at + 32(P − 1) + 16` values.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[inline]
pub(crate) unsafe fn store_a<const P: usize>(dst: &mut [u16], at: usize, parts: [__m256i; P]) {
    debug_assert!(dst.len() >= at + TK * (P - 1) + 16);
    for (q, part) in parts.into_iter().enumerate() {
        // SAFETY: each 16-value store lies inside `dst` (caller).
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(at + q * TK).cast(), part) };
    }
}

/// Stores the split rows `2p` (`r0`) and `2p + 1` (`r1`) of 16 columns as VNNI pairs at `at`,
/// `at + 512`, … (the B layout).
///
/// # Safety
/// As [`split`]; `dst` holds `at + 512(P − 1) + 32` values.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[inline]
pub(crate) unsafe fn store_b<const P: usize>(
    dst: &mut [u16],
    at: usize,
    r0: [__m256i; P],
    r1: [__m256i; P],
) {
    debug_assert!(dst.len() >= at + TILE * (P - 1) + TK);
    for (q, (a, b)) in r0.into_iter().zip(r1).enumerate() {
        let b = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b));
        let pairs = _mm512_or_si512(_mm512_cvtepu16_epi32(a), b);
        // SAFETY: the 32-value store lies inside `dst` (caller).
        unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(at + q * TILE).cast(), pairs) };
    }
}

/// The lane mask of the 16 values at `x` of an `n`-value row (none past its end).
fn lanes(x: usize, n: usize) -> __mmask16 {
    ((1u32 << n.saturating_sub(x).min(16)) - 1) as __mmask16
}

/// Writes the A layout (module docs) of the row-major `A` `[m, k]` in `src` (rows `ld`
/// apart), padded with zeros to `k.next_multiple_of(32)`.
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless the slices hold the rows.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_a<const P: usize>(
    src: &[f32],
    (m, k, ld): (usize, usize, usize),
    dst: &mut [u16],
) {
    let k_pad = k.next_multiple_of(TK);
    assert!(k <= ld && dst.len() >= m * P * k_pad);
    assert!(m == 0 || src.len() >= (m - 1) * ld + k);
    for r in 0..m {
        let row = &src[r * ld..][..k];
        for x in (0..k_pad).step_by(16) {
            // SAFETY: the lanes read lie inside `row` (the mask stops at `k`), the stores inside
            // row `r` of `dst` (checked above).
            unsafe {
                let v = _mm512_maskz_loadu_ps(lanes(x, k), row.as_ptr().wrapping_add(x));
                store_a(dst, a_at::<P>(r, x, k_pad), split::<P>(v));
            }
        }
    }
}

/// Writes the B layout (module docs) of the row-major `B` `[k, n]` in `src` (rows `ld`
/// apart), padded with zeros to `k.next_multiple_of(32)` rows and `n.next_multiple_of(32)`
/// columns.
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless the slices hold the rows.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_b<const P: usize>(
    src: &[f32],
    (k, n, ld): (usize, usize, usize),
    dst: &mut [u16],
) {
    // SAFETY: as this function's.
    unsafe { pack_b_paired::<P>(src, (k, n, ld), dst, |p| (2 * p, 2 * p + 1)) }
}

/// [`pack_b`] with each depth chunk's rows paired by halves: the tile row of depth pair `p`
/// of chunk `c` holds rows `32c + p` and `32c + p + 16` where the B layout holds `32c + 2p`
/// and `32c + 2p + 1`. Its product is that of an A whose chunks hold their values in the
/// order `0, 16, 1, 17, …`: the fused kernel's f32 weights, stored that way because two
/// vectors of parts interleave with a shift and a blend, where the plain order takes a slower
/// conversion.
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless the slices hold the rows.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_b_halves<const P: usize>(
    src: &[f32],
    (k, n, ld): (usize, usize, usize),
    dst: &mut [u16],
) {
    let rows = |p: usize| (p / 16 * TK + p % 16, p / 16 * TK + p % 16 + 16);
    // SAFETY: as this function's.
    unsafe { pack_b_paired::<P>(src, (k, n, ld), dst, rows) }
}

/// [`pack_b`] with the rows of depth pair `p` (global, `0..k̂/2`) taken from `rows(p)`, both
/// in the pair's chunk.
///
/// # Safety
/// As [`split`].
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn pack_b_paired<const P: usize>(
    src: &[f32],
    (k, n, ld): (usize, usize, usize),
    dst: &mut [u16],
    rows: impl Fn(usize) -> (usize, usize),
) {
    let (k_pad, n_pad) = (k.next_multiple_of(TK), n.next_multiple_of(2 * 16));
    assert!(n <= ld && dst.len() >= P * k_pad * n_pad);
    assert!(k == 0 || src.len() >= (k - 1) * ld + n);
    let load = |row: usize, col: usize| {
        if row >= k {
            return _mm512_setzero_ps();
        }
        // SAFETY: the lanes read lie inside row `row` of `src` (the mask stops at `n`; checked
        // above).
        unsafe { _mm512_maskz_loadu_ps(lanes(col, n), src.as_ptr().wrapping_add(row * ld + col)) }
    };
    for p in 0..k_pad / 2 {
        for g in 0..n_pad / 16 {
            // SAFETY: the stores are tile rows inside the `P·k̂·n̂` values of `dst` (checked
            // above).
            unsafe {
                let (r0, r1) = rows(p);
                let (r0, r1) = (load(r0, 16 * g), load(r1, 16 * g));
                store_b(dst, b_at::<P>(p, g, k_pad), split::<P>(r0), split::<P>(r1));
            }
        }
    }
}

/// Writes the B layout (module docs) of `Xᵀ` `[k, n]`, for the row-major `X` `[n, k]` in `src`
/// (rows `ld` apart), padded as [`pack_b`] pads it: what `pack_b` writes for the transposed
/// matrix, in one pass. A tile row holds one depth pair of 16 columns, which is one dword of
/// each of 16 rows of `X` in the A layout: each tile is a 16 × 16 dword transpose of 16 split
/// rows.
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless the slices hold the rows.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(crate) unsafe fn pack_bt<const P: usize>(
    src: &[f32],
    (n, k, ld): (usize, usize, usize),
    dst: &mut [u16],
) {
    let (k_pad, n_pad) = (k.next_multiple_of(TK), n.next_multiple_of(2 * 16));
    assert!(k <= ld && dst.len() >= P * k_pad * n_pad);
    assert!(n == 0 || src.len() >= (n - 1) * ld + k);
    for g in 0..n_pad / 16 {
        for c in 0..k_pad / TK {
            let mut rows = [[_mm512_setzero_si512(); 16]; P];
            for j in 0..16.min(n.saturating_sub(16 * g)) {
                let row = src[(16 * g + j) * ld..].as_ptr();
                // SAFETY: the lanes read lie inside the row (the mask stops at `k`; checked
                // above); the CPU has what `split` needs (caller).
                let half = |x: usize| unsafe {
                    split::<P>(_mm512_maskz_loadu_ps(lanes(x, k), row.wrapping_add(x)))
                };
                let (lo, hi) = (half(TK * c), half(TK * c + 16));
                for q in 0..P {
                    rows[q][j] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[q]), hi[q]);
                }
            }
            for (q, rows) in rows.into_iter().enumerate() {
                let at = b_at::<P>(16 * c, g, k_pad) + q * TILE;
                for (p, row) in transpose_16x16(rows).into_iter().enumerate() {
                    // SAFETY: tile row `p` of the tile at `at`, inside the `P·k̂·n̂` values of
                    // `dst` (checked above).
                    unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(at + TK * p).cast(), row) };
                }
            }
        }
    }
}

/// `C (+)= A·B` through the part products of `P` parts (module docs): `A` `[m, 32·chunks]` in
/// the A layout (rows `lda` values apart, from the product's first depth chunk), `B`
/// `[32·chunks, n]` in the B layout (16-column groups `ldg` values apart, from the product's
/// first group and depth chunk), `C` row-major f32 `[m, n]` (rows `ldc` apart); `m` and `n`
/// multiples of 32.
///
/// # Panics
/// When the sizes disagree with the slices, or `P` is not 2 or 3.
pub(crate) fn gemm<const P: usize>(
    _tiles: &Tiles,
    (c, ldc): (&mut [f32], usize),
    (a, lda): (&[u16], usize),
    (b, ldg): (&[u16], usize),
    (m, n, chunks): (usize, usize, usize),
    accumulate: bool,
) {
    let kernel = match P {
        2 => block_2x2_x3,
        3 => block_2x2_x6,
        _ => panic!("bf16x::gemm has kernels for 2 and 3 parts, not {P}"),
    };
    let depth = P * TK * chunks;
    assert!(m.is_multiple_of(32) && n.is_multiple_of(32) && chunks > 0);
    assert!(lda >= depth && ldg >= P * TILE * chunks && n <= ldc);
    assert!(m == 0 || (a.len() >= (m - 1) * lda + depth && c.len() >= (m - 1) * ldc + n));
    assert!(n == 0 || b.len() >= (n / 16 - 1) * ldg + P * TILE * chunks);
    for nb in 0..n / 32 {
        let (b0, b1) = (b[2 * nb * ldg..].as_ptr(), b[(2 * nb + 1) * ldg..].as_ptr());
        for mb in 0..m / 32 {
            // SAFETY: a live `Tiles` guard (all tiles 16 rows × 64 bytes); the 32 rows of `A`,
            // the `P·chunks` tiles of both column groups of `B` and the 32 × 32 block of `C`
            // lie inside the slices (checked above).
            unsafe {
                let c = c[mb * 32 * ldc + nb * 32..].as_mut_ptr();
                start_2x2(c, ldc * 4, accumulate);
                kernel(chunks, a[mb * 32 * lda..].as_ptr(), lda * 2, b0, b1);
                finish_2x2(c, ldc * 4);
            }
        }
    }
}

/// Adds the bf16x3 product (`P = 2`) of a 32-row strip of `A` (`a`, rows `lda` bytes apart)
/// and two 16-column groups of `B` (`b0`, `b1`) over `chunks` depth chunks to the C tiles 0–3
/// (A in tiles 4–5, B in 6–7). Per chunk, the products run in the order `a₁b₀`, `a₀b₀`,
/// `a₀b₁`, each pair of them sharing one operand's tiles: 8 tile loads per 12 products.
///
/// # Safety
/// A live [`Tiles`] guard with tiles 0–3 started ([`start_2x2`]); `chunks ≥ 1`; the strip and
/// both groups' `2·chunks` tiles readable.
unsafe fn block_2x2_x3(chunks: usize, a: *const u16, lda: usize, b0: *const u16, b1: *const u16) {
    // SAFETY: the caller guarantees the tiles, the chunk count and the memory.
    unsafe {
        chunk_loop!(
            chunks,
            a,
            lda,
            (b0, b1),
            (128usize, 2048usize),
            "tileloadd tmm4, [{a0} + {lda}*1 + 64]",
            "tileloadd tmm6, [{b0} + {s64}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1 + 64]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "tileloadd tmm4, [{a0} + {lda}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "tileloadd tmm6, [{b0} + {s64}*1 + 1024]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1 + 1024]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
        );
    }
}

/// [`block_2x2_x3`] for the bf16x6 product (`P = 3`). Per chunk, the products run in the
/// order `a₀b₀`, `a₀b₁`, `a₁b₁`, `a₁b₀`, `a₂b₀`, `a₀b₂`, each after the one operand whose tiles
/// change: 16 tile loads per 24 products.
///
/// # Safety
/// As [`block_2x2_x3`], with both groups' `3·chunks` tiles readable.
unsafe fn block_2x2_x6(chunks: usize, a: *const u16, lda: usize, b0: *const u16, b1: *const u16) {
    // SAFETY: the caller guarantees the tiles, the chunk count and the memory.
    unsafe {
        chunk_loop!(
            chunks,
            a,
            lda,
            (b0, b1),
            (192usize, 3072usize),
            // a₀b₀
            "tileloadd tmm4, [{a0} + {lda}*1]",
            "tileloadd tmm6, [{b0} + {s64}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // a₀b₁
            "tileloadd tmm6, [{b0} + {s64}*1 + 1024]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1 + 1024]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // a₁b₁
            "tileloadd tmm4, [{a0} + {lda}*1 + 64]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1 + 64]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // a₁b₀
            "tileloadd tmm6, [{b0} + {s64}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // a₂b₀
            "tileloadd tmm4, [{a0} + {lda}*1 + 128]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1 + 128]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // a₀b₂
            "tileloadd tmm4, [{a0} + {lda}*1]",
            "tileloadd tmm6, [{b0} + {s64}*1 + 2048]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1 + 2048]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The value of bf16 bits.
    fn value(bits: u16) -> f32 {
        f32::from_bits(u32::from(bits) << 16)
    }

    /// The sum of the parts of every value of an A layout `[m, k]`, row-major.
    pub(crate) fn unpack_a<const P: usize>(buf: &[u16], (m, k): (usize, usize)) -> Vec<f32> {
        let k_pad = k.next_multiple_of(TK);
        let at = |i: usize| a_at::<P>(i / k, i % k, k_pad);
        (0..m * k)
            .map(|i| (0..P).map(|q| value(buf[at(i) + q * TK])).sum())
            .collect()
    }

    /// The sum of the parts of every value of a B layout `[k, n]`, row-major.
    pub(crate) fn unpack_b<const P: usize>(buf: &[u16], (k, n): (usize, usize)) -> Vec<f32> {
        let k_pad = k.next_multiple_of(TK);
        let at = |i: usize| {
            let (row, col) = (i / n, i % n);
            b_at::<P>(row / 2, col / 16, k_pad) + 2 * (col % 16) + row % 2
        };
        (0..k * n)
            .map(|i| (0..P).map(|q| value(buf[at(i) + q * TILE])).sum())
            .collect()
    }

    /// Values over a wide range of magnitudes and both signs.
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let i = i + seed;
                ((i * 7919 % 1013) as f32 - 506.0) / 3.7 * 1.01f32.powi(i as i32 % 90)
            })
            .collect()
    }

    /// Both layouts hold every value to within what the split misses (module docs), and their
    /// padding is zero.
    fn layouts_hold_every_value<const P: usize>() {
        let tol = 2f32.powi(-8 * P as i32);
        // Whole chunks, and a depth and width that need padding.
        for (m, k) in [(64, 96), (33, 45)] {
            let x = values(m * k, 0);
            let k_pad = k.next_multiple_of(TK);
            let (a_len, b_len) = (m * P * k_pad, P * m.next_multiple_of(TK) * k_pad);
            let (mut a, mut b) = (vec![u16::MAX; a_len], vec![u16::MAX; b_len]);
            // SAFETY: what `split` needs is available (the callers check).
            unsafe {
                pack_a::<P>(&x, (m, k, k), &mut a);
                pack_b::<P>(&x, (m, k, k), &mut b);
            }
            for (name, got) in [
                ("A", unpack_a::<P>(&a, (m, k))),
                ("B", unpack_b::<P>(&b, (m, k))),
            ] {
                for (i, (&want, &got)) in x.iter().zip(&got).enumerate() {
                    assert!(
                        (want - got).abs() <= tol * want.abs(),
                        "{P} parts, {name} layout, value {i}: {got} for {want}"
                    );
                }
            }
            // Every value of the packed A is a part or padding: sum of all parts = sum of all
            // values means the padding holds zeros.
            let parts: f64 = a.iter().map(|&bits| f64::from(value(bits))).sum();
            let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
            assert!(
                (parts - want).abs() <= 1e-3 * want.abs().max(1.0),
                "A padding"
            );
            let parts: f64 = b.iter().map(|&bits| f64::from(value(bits))).sum();
            assert!(
                (parts - want).abs() <= 1e-3 * want.abs().max(1.0),
                "B padding"
            );
        }
    }

    /// `pack_bt` writes exactly what `pack_b` writes for the transposed matrix, padding
    /// included, on shapes with whole and partial column groups and depth chunks.
    fn transposed_pack_matches<const P: usize>() {
        for (n, k) in [(64, 64), (33, 45), (1, 7), (100, 128), (17, 80)] {
            let x = values(n * k, 5);
            let xt: Vec<f32> = (0..k * n).map(|i| x[i % n * k + i / n]).collect();
            let len = P * k.next_multiple_of(TK) * n.next_multiple_of(32);
            let (mut want, mut got) = (vec![u16::MAX; len], vec![0x5555; len]);
            // SAFETY: what `split` needs is available (the callers check).
            unsafe {
                pack_b::<P>(&xt, (k, n, n), &mut want);
                pack_bt::<P>(&x, (n, k, k), &mut got);
            }
            assert!(want == got, "{P} parts, X [{n}, {k}]");
        }
    }

    /// `pack_b_halves` writes exactly what `pack_b` writes for the matrix whose rows `2p`,
    /// `2p + 1` of each 32-row chunk are its rows `p`, `p + 16`, padding included.
    fn halves_pack_matches<const P: usize>() {
        for (k, n) in [(64, 32), (45, 33), (7, 1), (80, 17)] {
            let x = values(k * n, 9);
            let k_pad = k.next_multiple_of(TK);
            let paired: Vec<f32> = (0..k_pad * n)
                .map(|i| {
                    let (row, col) = (i / n, i % n);
                    let from = row / TK * TK + row % TK / 2 + 16 * (row % 2);
                    if from < k { x[from * n + col] } else { 0.0 }
                })
                .collect();
            let len = P * k_pad * n.next_multiple_of(32);
            let (mut want, mut got) = (vec![u16::MAX; len], vec![0x5555; len]);
            // SAFETY: what `split` needs is available (the callers check).
            unsafe {
                pack_b::<P>(&paired, (k_pad, n, n), &mut want);
                pack_b_halves::<P>(&x, (k, n, n), &mut got);
            }
            assert!(want == got, "{P} parts, X [{k}, {n}]");
        }
    }

    #[test]
    fn the_layouts_hold_every_value() {
        // `split` needs AVX512_BF16 (and AVX-512F, BW, VL), as the dot products' ISA does.
        if !crate::cpu::Isa::Avx512Bf16.is_available() {
            crate::cpu::not_on_this_cpu("the packers of bf16 parts");
            return;
        }
        layouts_hold_every_value::<2>();
        layouts_hold_every_value::<3>();
        transposed_pack_matches::<2>();
        transposed_pack_matches::<3>();
        halves_pack_matches::<3>();
    }

    /// `C (+)= A·B` through the packers and the tiles against f64 sums, within the bound of
    /// the module docs (`bound·Σ|a·b|`, plus f32 rounding of the sums), on a shape whose depth
    /// and width need padding, reading B from its second column block and second depth chunk.
    ///
    /// The worst case of f32 summation hides the difference between 2 and 3 parts, so the
    /// largest error relative to `Σ|a·b|` must also stay under `typical` (measured here: 2.7e-6
    /// with 2 parts, 7e-8 with 3).
    fn gemm_matches_f64<const P: usize>(tiles: &Tiles, bound: f64, typical: f64) {
        let (m, n, k) = (64, 100, 80);
        let (b_cols, b_depth) = (n + 32, k + 32);
        let a = values(m * k, 1);
        let b = values(b_depth * b_cols, 17);
        let c0 = values(m * n, 3);
        let (k_pad, n_pad) = (k.next_multiple_of(TK), b_cols.next_multiple_of(32));
        let mut ap = vec![0u16; m * P * k_pad];
        let mut bp = vec![0u16; P * b_depth.next_multiple_of(TK) * n_pad];
        // SAFETY: what `Isa::Amx` needs is available (checked by the caller).
        unsafe {
            pack_a::<P>(&a, (m, k, k), &mut ap);
            pack_b::<P>(&b, (b_depth, b_cols, b_cols), &mut bp);
        }
        let ldg = P * b_depth.next_multiple_of(TK) / TK * TILE;
        // Column block 1 (groups 2..), depth chunk 1: B rows 32.., columns 32...
        let b_view = &bp[2 * ldg + P * TILE..];
        let n_pad = n.next_multiple_of(32);
        let mut worst = 0.0f64;
        for accumulate in [false, true] {
            let mut c = vec![0.0f32; m * n_pad];
            for (row, c0) in c.chunks_exact_mut(n_pad).zip(c0.chunks_exact(n)) {
                row[..n].copy_from_slice(c0);
            }
            let chunks = k_pad / TK;
            let dims = (m, n_pad, chunks);
            gemm::<P>(
                tiles,
                (&mut c, n_pad),
                (&ap, P * k_pad),
                (b_view, ldg),
                dims,
                accumulate,
            );
            for r in 0..m {
                for col in 0..n {
                    let (mut want, mut size) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let bv = b[(p + 32) * b_cols + col + 32];
                        let ab = f64::from(a[r * k + p]) * f64::from(bv);
                        want += ab;
                        size += ab.abs();
                    }
                    if accumulate {
                        want += f64::from(c0[r * n + col]);
                    }
                    let got = f64::from(c[r * n_pad + col]);
                    worst = worst.max((got - want).abs() / size);
                    let tol = bound * size + (k + 1) as f64 * 2f64.powi(-24) * (size + want.abs());
                    assert!(
                        (got - want).abs() <= tol,
                        "{P} parts, ({r}, {col}) accumulate {accumulate}: got {got}, want {want}"
                    );
                }
            }
        }
        assert!(
            worst <= typical,
            "{P} parts: error up to {worst:e} of Σ|a·b|"
        );
    }

    #[test]
    fn gemms_match_f64() {
        let amx = crate::cpu::Isa::Amx.is_available();
        let Some(tiles) = Tiles::configure().filter(|_| amx) else {
            crate::cpu::not_on_this_cpu("AMX");
            return;
        };
        gemm_matches_f64::<2>(&tiles, 3.0 * 2f64.powi(-16), 1e-5);
        gemm_matches_f64::<3>(&tiles, 5.0 * 2f64.powi(-24), 2f64.powi(-21));
    }
}
