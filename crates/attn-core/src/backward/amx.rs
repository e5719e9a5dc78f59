//! The AMX build of the backward pass's five block products, in f32 through three bf16
//! products each ("bf16x3"): every f32 `x` splits into `hi = bf16(x)` and `lo = bf16(x − hi)`
//! (both rounded to nearest even), and `a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi`. The three
//! products are one GEMM of triple depth, `A' = [A_hi | A_hi | A_lo]` against
//! `B' = [B_hi; B_lo; B_hi]`, on `TDPBF16PS` tiles (bf16 products are exact in f32 and summed
//! in f32).
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
//! Layouts: an `A'` is row-major bf16 bits, `[m, 3k]`. A `B'` is in the VNNI tile layout
//! `TDPBF16PS` reads: tile `(kc, ng)` (depth rows `32·kc..` of the `3k`, columns `16·ng..`) is
//! 512 values at `(ng·k_chunks + kc)·512`, and in it `B'[32·kc + 2p + e][16·ng + j]` sits at
//! `32p + 2j + e`.

use std::arch::x86_64::*;

use half::bf16;

use crate::amx::{Tiles, block_2x2};

/// Depth of one tile product: 16 pairs of bf16.
const TK: usize = 32;
/// bf16 values in one B tile.
const TILE: usize = 512;

/// Splits 16 f32 lanes (finite) into `hi` and `lo` bf16 bits, each in the low half of its
/// 32-bit lane.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn split(x: __m512) -> (__m512i, __m512i) {
    let hi = round_bf16(_mm512_castps_si512(x));
    let hi_f = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(hi));
    let lo = round_bf16(_mm512_castps_si512(_mm512_sub_ps(x, hi_f)));
    (hi, lo)
}

/// f32 bits rounded to the nearest bf16 (ties to even), in the low half of each lane.
#[target_feature(enable = "avx512f")]
#[inline]
fn round_bf16(bits: __m512i) -> __m512i {
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
    _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, bias))
}

/// Writes `A' = [A_hi | A_hi | A_lo]` (`[m, 3k]`) for the row-major `A` `[m, k]` in `src`
/// (rows `ld` apart).
///
/// # Safety
/// AVX-512F must be available.
///
/// # Panics
/// Unless `k` is a multiple of 16 and the slices hold the rows.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_a(src: &[f32], (m, k, ld): (usize, usize, usize), dst: &mut [u16]) {
    assert!(k.is_multiple_of(16) && k <= ld && dst.len() >= m * 3 * k);
    assert!(m == 0 || src.len() >= (m - 1) * ld + k);
    for r in 0..m {
        let row = &src[r * ld..][..k];
        let out = &mut dst[r * 3 * k..][..3 * k];
        for c in (0..k).step_by(16) {
            // SAFETY: `c + 16 ≤ k`: the 16 values read and the 3 × 16 written lie inside
            // `row` and `out`.
            unsafe {
                let (hi, lo) = split(_mm512_loadu_ps(row.as_ptr().add(c)));
                let (hi, lo) = (_mm512_cvtepi32_epi16(hi), _mm512_cvtepi32_epi16(lo));
                let o = out.as_mut_ptr();
                _mm256_storeu_si256(o.add(c).cast(), hi);
                _mm256_storeu_si256(o.add(k + c).cast(), hi);
                _mm256_storeu_si256(o.add(2 * k + c).cast(), lo);
            }
        }
    }
}

/// Writes `B' = [B_hi; B_lo; B_hi]` in the VNNI tile layout for the row-major `B` `[k, n]` in
/// `src` (rows `ld` apart).
///
/// # Safety
/// AVX-512F must be available.
///
/// # Panics
/// Unless `k` is a multiple of 32, `n` of 16, and the slices hold the rows.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn pack_b(src: &[f32], (k, n, ld): (usize, usize, usize), dst: &mut [u16]) {
    assert!(k.is_multiple_of(TK) && n.is_multiple_of(16) && n <= ld);
    assert!(dst.len() >= 3 * k * n && (k == 0 || src.len() >= (k - 1) * ld + n));
    let k_chunks = 3 * k / TK;
    for p in 0..k / 2 {
        let (r0, r1) = (&src[2 * p * ld..][..n], &src[(2 * p + 1) * ld..][..n]);
        for ng in 0..n / 16 {
            // SAFETY: `16·ng + 16 ≤ n`: the loads lie inside `r0` and `r1`; every store is
            // one 32-value row of a tile inside the `3k·n` values of `dst` (checked above).
            unsafe {
                let (hi0, lo0) = split(_mm512_loadu_ps(r0.as_ptr().add(16 * ng)));
                let (hi1, lo1) = split(_mm512_loadu_ps(r1.as_ptr().add(16 * ng)));
                let hi = _mm512_or_si512(hi0, _mm512_slli_epi32::<16>(hi1));
                let lo = _mm512_or_si512(lo0, _mm512_slli_epi32::<16>(lo1));
                for (s, v) in [hi, lo, hi].into_iter().enumerate() {
                    let kk = s * k + 2 * p;
                    let at = (ng * k_chunks + kk / TK) * TILE + (kk % TK / 2) * TK;
                    _mm512_storeu_si512(dst.as_mut_ptr().add(at).cast(), v);
                }
            }
        }
    }
}

/// `e^x` for 16 lanes: relative error ≤ 5e-7 + |x|·1e-7; results below 2^-125 (and `−∞`)
/// give 0. `e^x = 2^t`, `t = x·log₂e = n + f`, `|f| ≤ ½`: `2^f` from Cephes' `exp2f`
/// polynomial (<https://netlib.org/cephes/>, `exp2f.c`), `2^n` by `vscalefps` (the forward
/// pass's `fused/avx512.rs` computes it the same way).
#[target_feature(enable = "avx512f")]
#[inline]
fn exp(x: __m512) -> __m512 {
    let t = _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E));
    // Flushed by a mask, not left to underflow: subnormal results take a microcode assist.
    let normal = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(t, _mm512_set1_ps(-125.0));
    let t = _mm512_max_ps(_mm512_set1_ps(-125.0), t);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm512_sub_ps(t, n);
    let mut p = _mm512_set1_ps(1.535_336_2e-4);
    for c in [
        1.339_887_4e-3,
        9.618_437e-3,
        5.550_332_5e-2,
        2.402_264_8e-1,
        6.931_472e-1,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_maskz_mov_ps(normal, _mm512_scalef_ps(p, n))
}

/// The fast lane of a whole block fused with the packing: from `Sᵀ` and `dPᵀ` (`[keys, rows]`
/// each), `P = e^(S − lse)` and `dS = P ∘ (dP − delta)` (per query: `lse`, `delta` `[rows]`)
/// go straight into `A'` of `Pᵀ` (`p_a`), `A'` of `dSᵀ` (`ds_a`) and `B'` of `dSᵀ` (`ds_b`), as
/// [`pack_a`] and [`pack_b`] would write them.
///
/// # Safety
/// AVX-512F must be available.
///
/// # Panics
/// Unless `keys` is a multiple of 32, `rows` of 16, and the slices hold what the shapes say.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn probs_and_grads_packed(
    (s, dp): (&[f32], &[f32]),
    (keys, rows): (usize, usize),
    (lse, delta): (&[f32], &[f32]),
    (p_a, ds_a, ds_b): (&mut [u16], &mut [u16], &mut [u16]),
) {
    let n = keys * rows;
    assert!(keys.is_multiple_of(TK) && rows.is_multiple_of(16));
    assert!(s.len() >= n && dp.len() >= n && lse.len() >= rows && delta.len() >= rows);
    assert!(p_a.len() >= 3 * n && ds_a.len() >= 3 * n && ds_b.len() >= 3 * n);
    let k_chunks = 3 * keys / TK;
    // Stores `A'`'s hi, hi, lo of 16 values at column `c` of row `r`.
    let store_a = |dst: &mut [u16], r: usize, c: usize, (hi, lo): (__m512i, __m512i)| {
        let o = dst[r * 3 * rows..][..3 * rows].as_mut_ptr();
        // SAFETY: `c + 16 ≤ rows`: the three 16-value stores lie inside row `r`.
        unsafe {
            let (hi, lo) = (_mm512_cvtepi32_epi16(hi), _mm512_cvtepi32_epi16(lo));
            _mm256_storeu_si256(o.add(c).cast(), hi);
            _mm256_storeu_si256(o.add(rows + c).cast(), hi);
            _mm256_storeu_si256(o.add(2 * rows + c).cast(), lo);
        }
    };
    for pair in 0..keys / 2 {
        let (r0, r1) = (2 * pair, 2 * pair + 1);
        for ng in 0..rows / 16 {
            let c = 16 * ng;
            // SAFETY: `c + 16 ≤ rows` and `r1 < keys`: every load lies inside the tiles and
            // `lse`/`delta`; the `B'` stores are 32-value tile rows inside `3·keys·rows`.
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
                store_a(p_a, r0, c, split(p0));
                store_a(p_a, r1, c, split(p1));
                let (d0, d1) = (split(ds0), split(ds1));
                store_a(ds_a, r0, c, d0);
                store_a(ds_a, r1, c, d1);
                let hi = _mm512_or_si512(d0.0, _mm512_slli_epi32::<16>(d1.0));
                let lo = _mm512_or_si512(d0.1, _mm512_slli_epi32::<16>(d1.1));
                for (seg, v) in [hi, lo, hi].into_iter().enumerate() {
                    let kk = seg * keys + 2 * pair;
                    let at = (ng * k_chunks + kk / TK) * TILE + (kk % TK / 2) * TK;
                    _mm512_storeu_si512(ds_b.as_mut_ptr().add(at).cast(), v);
                }
            }
        }
    }
}

/// `C (+)= A'·B'` for `A'` `[m, 3k]` (from [`pack_a`], `m` a multiple of 32) and `B'`
/// (from [`pack_b`], `n` a multiple of 32): `C` is row-major `[m, n]`, rows `ldc` apart.
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
    let (k3, k_chunks) = (3 * k, 3 * k / TK);
    assert!(m.is_multiple_of(32) && n.is_multiple_of(32) && k.is_multiple_of(TK) && k > 0);
    assert!(a.len() >= m * k3 && b.len() >= k3 * n && n <= ldc);
    assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    for nb in 0..n / 32 {
        let b0 = b[2 * nb * k_chunks * TILE..].as_ptr();
        let b1 = b[(2 * nb + 1) * k_chunks * TILE..].as_ptr();
        for mb in 0..m / 32 {
            // SAFETY: a live `Tiles` guard (all tiles 16 rows × 64 bytes); the 32 rows of `A'`
            // (`3k` values each), the `k_chunks` tiles of both column groups of `B'` and the
            // 32 × 32 block of `C` lie inside the slices (checked above).
            unsafe {
                block_2x2(
                    k_chunks,
                    a[mb * 32 * k3..].as_ptr().cast::<bf16>(),
                    k3 * 2,
                    b0.cast::<bf16>(),
                    b1.cast::<bf16>(),
                    TILE * 2,
                    c[mb * 32 * ldc + nb * 32..].as_mut_ptr(),
                    ldc * 4,
                    accumulate,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused fast lane writes what the unfused one (P and dS in f32, then [`pack_a`] and
    /// [`pack_b`]) writes, up to the two `exp` implementations (each within 5e-7 relative).
    #[test]
    fn the_fused_lane_packs_like_the_packers() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let (keys, rows) = (64, 48);
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
        let mut want = [vec![0u16; 3 * n], vec![0u16; 3 * n], vec![0u16; 3 * n]];
        let mut got = want.clone();
        let [wp, wa, wb] = &mut want;
        let [gp, ga, gb] = &mut got;
        // SAFETY: AVX-512F is available (checked above).
        unsafe {
            pack_a(&p, (keys, rows, rows), wp);
            pack_a(&ds, (keys, rows, rows), wa);
            pack_b(&ds, (keys, rows, rows), wb);
            probs_and_grads_packed((&s, &dp), (keys, rows), (&lse, &delta), (gp, ga, gb));
        }
        let value = |bits: u16| f32::from_bits(u32::from(bits) << 16);
        for (which, (w, g)) in want.iter().zip(&got).enumerate() {
            // Compare hi + lo of each value: the third segment holds lo in `A'`, hi in `B'`.
            for (i, (&wv, &gv)) in w.iter().zip(g).enumerate() {
                let (a, b) = (value(wv), value(gv));
                assert!(
                    (a - b).abs() <= 2e-6 * a.abs().max(1e-3) + 2f32.powi(-20),
                    "output {which}, value {i}: {a} against {b}"
                );
            }
        }
    }

    /// `C += A·B` through the packers and the tiles against f64 sums, within the bf16x3 bound
    /// of the module docs (`3·2⁻¹⁶·Σ|a·b|`, plus f32 rounding of the sums).
    #[test]
    fn bf16x3_gemm_matches_f64() {
        let Some(tiles) = Tiles::configure() else {
            // No AMX on this CPU: the backward pass never takes this path here.
            assert!(!crate::amx::available());
            return;
        };
        let (m, n, k) = (64, 96, 64);
        let value =
            |i: usize| ((i * 7919 % 113) as f32 - 56.0) / 37.0 * 1.001f32.powi(i as i32 % 50);
        let a: Vec<f32> = (0..m * k).map(value).collect();
        let b: Vec<f32> = (0..k * n).map(|i| value(i + 17)).collect();
        let c0: Vec<f32> = (0..m * n).map(|i| value(i + 3)).collect();
        let (mut ap, mut bp) = (vec![0u16; m * 3 * k], vec![0u16; 3 * k * n]);
        // SAFETY: `available()` (a guard exists) implies AVX-512F.
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
