//! The AMX build of the backward pass's five block products, in f32 through three bf16
//! products each ("bf16x3"): every f32 `x` splits into `hi = bf16(x)` and `lo = bf16(x − hi)`
//! (both rounded to nearest even), and `a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi`, each a
//! `TDPBF16PS` tile product (bf16 products are exact in f32 and summed in f32).
//!
//! Error of one product: `|x − hi| ≤ 2⁻⁸|x|` and `|x − hi − lo| ≤ 2⁻⁸|x − hi| ≤ 2⁻¹⁶|x|`, so
//! the split misses at most `2⁻¹⁶` of each factor and the dropped `a_lo·b_lo` at most
//! `2⁻¹⁶|ab|`: `|a·b − bf16x3(a, b)| ≤ 3·2⁻¹⁶|ab| ≈ 4.6e-5·|ab|`, far below what the 1e-4 checks of
//! the gradients allow for sums whose terms mostly cancel in sign. The same scheme and bound as
//! oneDNN's "bf16x3" f32 emulation.
//!
//! Only whole 64 × 64 blocks with `head_dim` and `value_dim` multiples of 32 come here (the
//! tiles' 32-deep, 32-wide granules); the rest take the FMA kernels. `TDPBF16PS` flushes bf16
//! subnormals (below ~1e-38) to zero, far under these tolerances too.
//!
//! Layouts keep each 32-deep chunk's `hi` and `lo` side by side, so that the kernel reaches
//! both from one pointer ([`block_2x2_x3`]):
//! - an "A" operand `[m, k]` is row-major bf16 bits, `[m, 2k]`: row `r`'s values `32c..32c + 32`
//!   have their `hi` at `r·2k + 64c` and their `lo` 32 values further;
//! - a "B" operand `[k, n]` is in the VNNI tile layout `TDPBF16PS` reads: for 16 columns
//!   `16·ng..` and depth chunk `c`, the `hi` tile is 512 values at `(2·(ng·chunks + c))·512` and the
//!   `lo` tile follows it; in a tile, `B[32c + 2p + e][16·ng + j]` sits at `32p + 2j + e`.

use std::arch::x86_64::*;

use crate::amx::{Tiles, finish_2x2, start_2x2};
use crate::fused::avx512::exp;

/// Depth of one tile product: 16 pairs of bf16.
const TK: usize = 32;
/// bf16 values in one B tile.
const TILE: usize = 512;

/// Splits 16 f32 lanes (finite) into `hi` and `lo`, 16 bf16 bits each, by `VCVTNEPS2BF16`
/// (nearest even; subnormals, below ~1e-38, become 0).
///
/// # Safety
/// The CPU must have what [`crate::fused::Isa::Amx`] needs (AVX-512F, BW, VL and BF16).
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[inline]
unsafe fn split(x: __m512) -> (__m256i, __m256i) {
    // SAFETY: 16 bf16 are 16 u16 bits, and every bit pattern is valid for both.
    let bits = |v: __m256bh| unsafe { std::mem::transmute::<__m256bh, __m256i>(v) };
    let hi = bits(_mm512_cvtneps_pbh(x));
    let hi_f = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)));
    (hi, bits(_mm512_cvtneps_pbh(_mm512_sub_ps(x, hi_f))))
}

/// Where the `hi` bf16 of `A[r][x]` goes in the A layout of a `[m, k]` operand (module docs);
/// its `lo` goes 32 values further.
fn a_at(r: usize, x: usize, k: usize) -> usize {
    r * 2 * k + 64 * (x / TK) + x % TK
}

/// Where the `hi` tile row of depth pair `p` (`B` rows `2p`, `2p + 1`) and 16-column group
/// `ng` goes in the B layout of a `[k, n]` operand (module docs); its `lo` row goes one tile
/// (512 values) further.
fn b_at(p: usize, ng: usize, k: usize) -> usize {
    (2 * (ng * (k / TK) + p / 16)) * TILE + (p % 16) * TK
}

/// Stores the `hi` and `lo` of 16 split values at `at` and `at + 32` (the A layout).
///
/// # Safety
/// As [`split`]; `dst` holds `at + 48` values.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[inline]
unsafe fn store_a(dst: &mut [u16], at: usize, (hi, lo): (__m256i, __m256i)) {
    debug_assert!(dst.len() >= at + TK + 16);
    // SAFETY: the two 16-value stores lie inside `dst` (caller).
    unsafe {
        let o = dst.as_mut_ptr().add(at);
        _mm256_storeu_si256(o.cast(), hi);
        _mm256_storeu_si256(o.add(TK).cast(), lo);
    }
}

/// Stores the split rows `2p` (`r0`) and `2p + 1` (`r1`) of 16 columns as VNNI pairs at `at`
/// (`hi`) and `at + 512` (`lo`) (the B layout).
///
/// # Safety
/// As [`split`]; `dst` holds `at + 512 + 32` values.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
#[inline]
unsafe fn store_b(dst: &mut [u16], at: usize, r0: (__m256i, __m256i), r1: (__m256i, __m256i)) {
    debug_assert!(dst.len() >= at + TILE + TK);
    let pairs = |a: __m256i, b: __m256i| {
        let b = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b));
        _mm512_or_si512(_mm512_cvtepu16_epi32(a), b)
    };
    // SAFETY: the two 32-value stores lie inside `dst` (caller).
    unsafe {
        let o = dst.as_mut_ptr().add(at);
        _mm512_storeu_si512(o.cast(), pairs(r0.0, r1.0));
        _mm512_storeu_si512(o.add(TILE).cast(), pairs(r0.1, r1.1));
    }
}

/// Writes the A layout (module docs) of the row-major `A` `[m, k]` in `src` (rows `ld`
/// apart).
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless `k` is a multiple of 32 and the slices hold the rows.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(super) unsafe fn pack_a(src: &[f32], (m, k, ld): (usize, usize, usize), dst: &mut [u16]) {
    assert!(k.is_multiple_of(TK) && k <= ld && dst.len() >= m * 2 * k);
    assert!(m == 0 || src.len() >= (m - 1) * ld + k);
    for r in 0..m {
        let row = &src[r * ld..][..k];
        for x in (0..k).step_by(16) {
            // SAFETY: `x + 16 ≤ k`: the 16 values read lie inside `row`, the stores inside
            // row `r` of `dst` (checked above).
            unsafe {
                let halves = split(_mm512_loadu_ps(row.as_ptr().add(x)));
                store_a(dst, a_at(r, x, k), halves);
            }
        }
    }
}

/// Writes the B layout (module docs) of the row-major `B` `[k, n]` in `src` (rows `ld`
/// apart).
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless `k` is a multiple of 32, `n` of 16, and the slices hold the rows.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(super) unsafe fn pack_b(src: &[f32], (k, n, ld): (usize, usize, usize), dst: &mut [u16]) {
    assert!(k.is_multiple_of(TK) && n.is_multiple_of(16) && n <= ld);
    assert!(dst.len() >= 2 * k * n && (k == 0 || src.len() >= (k - 1) * ld + n));
    for p in 0..k / 2 {
        let (r0, r1) = (&src[2 * p * ld..][..n], &src[(2 * p + 1) * ld..][..n]);
        for ng in 0..n / 16 {
            // SAFETY: `16·ng + 16 ≤ n`: the loads lie inside `r0` and `r1`; the stores are
            // tile rows inside the `2k·n` values of `dst` (checked above).
            unsafe {
                let s0 = split(_mm512_loadu_ps(r0.as_ptr().add(16 * ng)));
                let s1 = split(_mm512_loadu_ps(r1.as_ptr().add(16 * ng)));
                store_b(dst, b_at(p, ng, k), s0, s1);
            }
        }
    }
}

/// The fast lane of a whole block fused with the packing: from `Sᵀ` and `dPᵀ` (`[keys, rows]`
/// each), `P = e^(S − lse)` and `dS = P ∘ (dP − delta)` (per query: `lse`, `delta` `[rows]`)
/// go straight into the A layout of `Pᵀ` (`p_a`) and of `dSᵀ` (`ds_a`), and the B layout of
/// `dSᵀ` (`ds_b`), as [`pack_a`] and [`pack_b`] would write them.
///
/// # Safety
/// As [`split`].
///
/// # Panics
/// Unless `keys` and `rows` are multiples of 32, and the slices hold what the shapes say.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(super) unsafe fn probs_and_grads_packed(
    (s, dp): (&[f32], &[f32]),
    (keys, rows): (usize, usize),
    (lse, delta): (&[f32], &[f32]),
    (p_a, ds_a, ds_b): (&mut [u16], &mut [u16], &mut [u16]),
) {
    let n = keys * rows;
    assert!(keys.is_multiple_of(TK) && rows.is_multiple_of(TK));
    assert!(s.len() >= n && dp.len() >= n && lse.len() >= rows && delta.len() >= rows);
    assert!(p_a.len() >= 2 * n && ds_a.len() >= 2 * n && ds_b.len() >= 2 * n);
    for pair in 0..keys / 2 {
        let (r0, r1) = (2 * pair, 2 * pair + 1);
        for ng in 0..rows / 16 {
            let c = 16 * ng;
            // SAFETY: `c + 16 ≤ rows` and `r1 < keys`: every load lies inside the tiles and
            // `lse`/`delta`, every store inside the `2·keys·rows` values of its buffer.
            unsafe {
                let lse_v = _mm512_loadu_ps(lse.as_ptr().add(c));
                let delta_v = _mm512_loadu_ps(delta.as_ptr().add(c));
                let grads = |r: usize| {
                    let sv = _mm512_loadu_ps(s.as_ptr().add(r * rows + c));
                    let dpv = _mm512_loadu_ps(dp.as_ptr().add(r * rows + c));
                    let p = exp(_mm512_sub_ps(sv, lse_v));
                    (p, _mm512_mul_ps(p, _mm512_sub_ps(dpv, delta_v)))
                };
                let ((p0, ds0), (p1, ds1)) = (grads(r0), grads(r1));
                store_a(p_a, a_at(r0, c, rows), split(p0));
                store_a(p_a, a_at(r1, c, rows), split(p1));
                let (d0, d1) = (split(ds0), split(ds1));
                store_a(ds_a, a_at(r0, c, rows), d0);
                store_a(ds_a, a_at(r1, c, rows), d1);
                store_b(ds_b, b_at(pair, ng, keys), d0, d1);
            }
        }
    }
}

/// `C (+)= A·B` in bf16x3 for `A` `[m, k]` in the A layout (from [`pack_a`], `m` a multiple
/// of 32) and `B` `[k, n]` in the B layout (from [`pack_b`], `n` a multiple of 32): `C` is
/// row-major f32 `[m, n]`, rows `ldc` apart.
///
/// # Panics
/// When the sizes disagree with the slices.
pub(super) fn gemm(
    _tiles: &Tiles,
    c: (&mut [f32], usize),
    a: &[u16],
    b: &[u16],
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    let (c, ldc) = c;
    let chunks = k / TK;
    assert!(m.is_multiple_of(32) && n.is_multiple_of(32) && k.is_multiple_of(TK) && k > 0);
    assert!(a.len() >= m * 2 * k && b.len() >= 2 * k * n && n <= ldc);
    assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    for nb in 0..n / 32 {
        let b0 = b[2 * nb * 2 * chunks * TILE..].as_ptr();
        let b1 = b[(2 * nb + 1) * 2 * chunks * TILE..].as_ptr();
        for mb in 0..m / 32 {
            // SAFETY: a live `Tiles` guard (all tiles 16 rows × 64 bytes); the 32 rows of `A`
            // (`2k` values each), the `2·chunks` tiles of both column groups of `B` and the
            // 32 × 32 block of `C` lie inside the slices (checked above).
            unsafe {
                let c = c[mb * 32 * ldc + nb * 32..].as_mut_ptr();
                start_2x2(c, ldc * 4, accumulate);
                block_2x2_x3(chunks, a[mb * 32 * 2 * k..].as_ptr(), k * 4, b0, b1);
                finish_2x2(c, ldc * 4);
            }
        }
    }
}

/// Adds the bf16x3 product of a 32-row strip of `A` (`a`, rows `lda` bytes apart, in the A
/// layout) and two 16-column groups of `B` (`b0`, `b1`, in the B layout) over `chunks` depth
/// chunks to the C tiles 0–3 (A in tiles 4–5, B in 6–7). Per chunk, the products run in the
/// order `lo·hi`, `hi·hi`, `hi·lo`, each pair of them sharing one operand's tiles: 8 tile loads
/// per 12 products.
///
/// # Safety
/// A live [`Tiles`] guard with tiles 0–3 started ([`start_2x2`]); `chunks ≥ 1`; the strip and
/// both groups' `2·chunks` tiles readable.
unsafe fn block_2x2_x3(chunks: usize, a: *const u16, lda: usize, b0: *const u16, b1: *const u16) {
    // SAFETY: the caller guarantees the tiles, the chunk count and the memory.
    unsafe {
        std::arch::asm!(
            "2:",
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
            "add {a0}, 128",
            "add {a1}, 128",
            "add {b0}, 2048",
            "add {b1}, 2048",
            "dec {n}",
            "jnz 2b",
            a0 = inout(reg) a => _,
            a1 = inout(reg) a.byte_add(16 * lda) => _,
            b0 = inout(reg) b0 => _,
            b1 = inout(reg) b1 => _,
            n = inout(reg) chunks => _,
            lda = in(reg) lda,
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of bf16 bits.
    fn value(bits: u16) -> f32 {
        f32::from_bits(u32::from(bits) << 16)
    }

    /// `hi + lo` of every value of an A layout `[m, k]`, row-major.
    fn unpack_a(buf: &[u16], (m, k): (usize, usize)) -> Vec<f32> {
        let at = |i: usize| a_at(i / k, i % k, k);
        (0..m * k)
            .map(|i| value(buf[at(i)]) + value(buf[at(i) + TK]))
            .collect()
    }

    /// `hi + lo` of every value of a B layout `[k, n]`, row-major.
    fn unpack_b(buf: &[u16], (k, n): (usize, usize)) -> Vec<f32> {
        let at = |i: usize| {
            let (row, col) = (i / n, i % n);
            b_at(row / 2, col / 16, k) + 2 * (col % 16) + row % 2
        };
        (0..k * n)
            .map(|i| value(buf[at(i)]) + value(buf[at(i) + TILE]))
            .collect()
    }

    /// Both layouts hold every value to within the split's `2⁻¹⁶` relative (module docs).
    #[test]
    fn the_layouts_hold_hi_and_lo_of_every_value() {
        if !crate::fused::Isa::Amx.is_available() {
            // `split` needs AVX512_BF16, which every CPU with AMX has.
            return;
        }
        let (m, k) = (64, 96);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 3.7 * 1.01f32.powi(i as i32 % 90))
            .collect();
        let (mut a, mut b) = (vec![0u16; 2 * m * k], vec![0u16; 2 * m * k]);
        // SAFETY: what `Isa::Amx` needs is available (checked above).
        unsafe {
            pack_a(&x, (m, k, k), &mut a);
            pack_b(&x, (m, k, k), &mut b);
        }
        for (name, got) in [("A", unpack_a(&a, (m, k))), ("B", unpack_b(&b, (m, k)))] {
            for (i, (&want, &got)) in x.iter().zip(&got).enumerate() {
                assert!(
                    (want - got).abs() <= 2f32.powi(-16) * want.abs(),
                    "{name} layout, value {i}: {got} for {want}"
                );
            }
        }
    }

    /// The fused fast lane writes what the unfused one (P and dS in f32, then [`pack_a`] and
    /// [`pack_b`]) writes, up to the two `exp` implementations (each within 5e-7 relative):
    /// compared as `hi + lo`, each within `2⁻¹⁶` relative of its f32 value.
    #[test]
    fn the_fused_lane_packs_like_the_packers() {
        if !crate::fused::Isa::Amx.is_available() {
            // `split` needs AVX512_BF16, which every CPU with AMX has.
            return;
        }
        let (keys, rows) = (64, 96);
        let n = keys * rows;
        let s: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 80.0) / 9.0)
            .collect();
        let dp: Vec<f32> = (0..n)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0)
            .collect();
        let mut lse: Vec<f32> = (0..rows).map(|i| i as f32 * 0.05).collect();
        lse[3] = f32::INFINITY; // a row that saw no key: P = 0
        let delta: Vec<f32> = (0..rows).map(|i| (i as f32).sin()).collect();
        let (mut p, mut ds) = (s.clone(), dp.clone());
        for (p, ds) in p.chunks_exact_mut(rows).zip(ds.chunks_exact_mut(rows)) {
            super::super::kernels::probs_and_grads_body(p, ds, &lse, &delta);
        }
        let mut want = [vec![0u16; 2 * n], vec![0u16; 2 * n], vec![0u16; 2 * n]];
        let mut got = want.clone();
        let [wp, wa, wb] = &mut want;
        let [gp, ga, gb] = &mut got;
        // SAFETY: what `Isa::Amx` needs is available (checked above).
        unsafe {
            pack_a(&p, (keys, rows, rows), wp);
            pack_a(&ds, (keys, rows, rows), wa);
            pack_b(&ds, (keys, rows, rows), wb);
            probs_and_grads_packed((&s, &dp), (keys, rows), (&lse, &delta), (gp, ga, gb));
        }
        let shape = (keys, rows);
        let [wp, wa, wb] = &want;
        let [gp, ga, gb] = &got;
        let pairs = [
            (unpack_a(wp, shape), unpack_a(gp, shape)),
            (unpack_a(wa, shape), unpack_a(ga, shape)),
            (unpack_b(wb, shape), unpack_b(gb, shape)),
        ];
        for (which, (w, g)) in pairs.iter().enumerate() {
            for (i, (&a, &b)) in w.iter().zip(g).enumerate() {
                assert!(
                    (a - b).abs() <= (2e-6 + 2.0 * 2f32.powi(-16)) * a.abs().max(1e-3),
                    "output {which}, value {i}: {a} against {b}"
                );
            }
        }
    }

    /// `C += A·B` through the packers and the tiles against f64 sums, within the bf16x3 bound
    /// of the module docs (`3·2⁻¹⁶·Σ|a·b|`, plus f32 rounding of the sums).
    #[test]
    fn bf16x3_gemm_matches_f64() {
        let amx = crate::fused::Isa::Amx.is_available();
        let Some(tiles) = Tiles::configure().filter(|_| amx) else {
            // No AMX (or no AVX512_BF16) on this CPU: the backward pass never takes this path.
            return;
        };
        let (m, n, k) = (64, 96, 64);
        let value =
            |i: usize| ((i * 7919 % 113) as f32 - 56.0) / 37.0 * 1.001f32.powi(i as i32 % 50);
        let a: Vec<f32> = (0..m * k).map(value).collect();
        let b: Vec<f32> = (0..k * n).map(|i| value(i + 17)).collect();
        let c0: Vec<f32> = (0..m * n).map(|i| value(i + 3)).collect();
        let (mut ap, mut bp) = (vec![0u16; m * 2 * k], vec![0u16; 2 * k * n]);
        // SAFETY: what `Isa::Amx` needs is available (checked above).
        unsafe {
            pack_a(&a, (m, k, k), &mut ap);
            pack_b(&b, (k, n, n), &mut bp);
        }
        for accumulate in [false, true] {
            let mut c = c0.clone();
            gemm(&tiles, (&mut c, n), &ap, &bp, (m, n, k), accumulate);
            for r in 0..m {
                for col in 0..n {
                    let (mut want, mut size) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let ab = f64::from(a[r * k + p]) * f64::from(b[p * n + col]);
                        want += ab;
                        size += ab.abs();
                    }
                    if accumulate {
                        want += f64::from(c0[r * n + col]);
                    }
                    let got = f64::from(c[r * n + col]);
                    let tol = 3.0 * 2f64.powi(-16) * size + 1e-6 * (size + want.abs());
                    assert!(
                        (got - want).abs() <= tol,
                        "({r}, {col}) accumulate {accumulate}: got {got}, want {want}"
                    );
                }
            }
        }
    }
}
