//! The AMX lane of the backward pass: its five block products in f32 through [`crate::cpu::bf16x`],
//! `Sᵀ = K·Qᵀ`, `dPᵀ = V·dOᵀ` and `dV += Pᵀ·dO` in "bf16x6" ([`PARTS`]: three parts per
//! value, as the forward pass's f32 products), `dK += dSᵀ·Q` and `dQᵀ += Kᵀ·dSᵀ` in "bf16x3"
//! ([`PARTS_X3`]: `hi` and `lo`, three tile products each, within `3·2⁻¹⁶|ab| ≈ 4.6e-5·|ab|`
//! per product) or, where the scale would magnify that (`Norms::narrow_grads`), bf16x6, on
//! keys and queries centred on their means (`Plan::add_centres` adds the means' share back);
//! and the fast lane that writes `P` and `dS` straight into those layouts, summing `dS` for
//! that.
//!
//! Only whole 64 × 64 blocks with `head_dim` and `value_dim` multiples of 32 come here (the
//! tiles' 32-deep, 32-wide granules); the rest take the FMA kernels.

use std::arch::x86_64::*;

use crate::cpu::amx::Tiles;
use crate::cpu::avx512::exp;
use crate::cpu::bf16x::{self, TILE, TK, a_at, b_at, split, store_a, store_b};

/// Parts per value in `dK`'s and `dQ`'s products when the scale allows it: `hi` and `lo`
/// (bf16x3).
pub(super) const PARTS_X3: usize = 2;

/// Parts per value in the products of `S`, `dP` and `dV`, and of `dK` and `dQ` at large scales
/// (bf16x6, as the forward pass's f32 products), within a few f32 roundings. `P = e^(S − lse)`
/// takes a score's error whole as a relative error of `P`, and bf16x3's `3·2⁻¹⁶` of `Σ|q·k|` is
/// up to 1.5e-3 at scores of 32: `dq` came out 9e-4 off on keys sharing one direction, and
/// 1.2e-4 on a plain 128 × 64 call scaled to scores near 32, where PyTorch's own backward is
/// within 1e-5. `dP` feeds `dS` the same way, and `dV`'s sum over many query rows mostly
/// cancels in sign: with all five in bf16x3, `dv` was 1e-4 off on 300 queries against 129 keys
/// (7.7e-6 now, as the FMA kernels).
pub(super) const PARTS: usize = 3;

/// `C (+)= A·B` in bf16x3 (`P = 2`) or bf16x6 (`P = 3`) for `A` `[m, k]` in the A layout (`m`
/// a multiple of 32) and `B` `[k, n]` in the B layout (`n` a multiple of 32), `k` a multiple
/// of 32: `C` is row-major f32 `[m, n]`, rows `ldc` apart.
///
/// # Panics
/// When the sizes disagree with the slices.
pub(super) fn gemm<const P: usize>(
    tiles: &Tiles,
    c: (&mut [f32], usize),
    a: &[u16],
    b: &[u16],
    (m, n, k): (usize, usize, usize),
    accumulate: bool,
) {
    assert!(k.is_multiple_of(TK));
    let (chunks, ldg) = (k / TK, P * k / TK * TILE);
    let (a, b) = ((a, P * k), (b, ldg));
    bf16x::gemm::<P>(tiles, c, a, b, (m, n, chunks), accumulate);
}

/// The fast lane of a whole block fused with the packing: from `Sᵀ` and `dPᵀ` (`[keys, rows]`
/// each), `P = e^(S − lse)` and `dS = P ∘ (dP − delta)` (per query: `lse`, `delta` `[rows]`)
/// go straight into the A layout of `Pᵀ` (`p_a`) and of `dSᵀ` (`ds_a`), and the B layout of
/// `dSᵀ` (`ds_b`), as [`bf16x::pack_a`] and [`bf16x::pack_b`] would write them; `dS`'s sums
/// over the keys are added to `row_sums` (`[rows]`) and over the queries to `key_sums`
/// (`[keys]`), in f32.
///
/// # Safety
/// As [`bf16x::split`].
///
/// # Panics
/// Unless `keys` and `rows` are multiples of 32, and the slices hold what the shapes say.
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(super) unsafe fn probs_and_grads_packed<const G: usize>(
    (s, dp): (&[f32], &[f32]),
    (keys, rows): (usize, usize),
    (lse, delta): (&[f32], &[f32]),
    (p_a, ds_a, ds_b): (&mut [u16], &mut [u16], &mut [u16]),
    (row_sums, key_sums): (&mut [f32], &mut [f32]),
) {
    let n = keys * rows;
    assert!(keys.is_multiple_of(TK) && rows.is_multiple_of(TK));
    assert!(s.len() >= n && dp.len() >= n && lse.len() >= rows && delta.len() >= rows);
    assert!(row_sums.len() >= rows && key_sums.len() >= keys);
    assert!(p_a.len() >= PARTS * n && ds_a.len() >= G * n && ds_b.len() >= G * n);
    for pair in 0..keys / 2 {
        let (r0, r1) = (2 * pair, 2 * pair + 1);
        let (mut key0, mut key1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for ng in 0..rows / 16 {
            let c = 16 * ng;
            // SAFETY: `c + 16 ≤ rows` and `r1 < keys`: every load lies inside the tiles and
            // `lse`/`delta`, every store inside the `PARTS·n` (`p_a`) or `G·n`
            // (`ds_a`, `ds_b`) values asserted above, and `row_sums[c..c + 16]`.
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
                key0 = _mm512_add_ps(key0, ds0);
                key1 = _mm512_add_ps(key1, ds1);
                let sums = row_sums.as_mut_ptr().add(c);
                let pair_sum = _mm512_add_ps(ds0, ds1);
                _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_loadu_ps(sums), pair_sum));
                store_a(p_a, a_at::<PARTS>(r0, c, rows), split::<PARTS>(p0));
                store_a(p_a, a_at::<PARTS>(r1, c, rows), split::<PARTS>(p1));
                let (d0, d1) = (split::<G>(ds0), split::<G>(ds1));
                store_a(ds_a, a_at::<G>(r0, c, rows), d0);
                store_a(ds_a, a_at::<G>(r1, c, rows), d1);
                store_b(ds_b, b_at::<G>(pair, ng, keys), d0, d1);
            }
        }
        key_sums[r0] += _mm512_reduce_add_ps(key0);
        key_sums[r1] += _mm512_reduce_add_ps(key1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::bf16x::tests::{unpack_a, unpack_b};
    use crate::cpu::bf16x::{pack_a, pack_b};

    /// The fused fast lane writes what the unfused one (P and dS in f32, then [`pack_a`] and
    /// [`pack_b`]) writes, up to the two `exp` implementations (each within 5e-7 relative):
    /// compared as the sums of their parts, each within `2⁻¹⁶` relative of its f32 value (`P`'s
    /// three parts within `2⁻²⁴`).
    #[test]
    fn the_fused_lane_packs_like_the_packers() {
        // `split` needs AVX512_BF16 (and AVX-512F, BW, VL), as the dot products' ISA does.
        if !crate::cpu::Isa::Avx512Bf16.is_available() {
            crate::cpu::not_on_this_cpu("the packing of the AMX backward lane");
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
        let mut want = [
            vec![0u16; PARTS * n],
            vec![0u16; PARTS_X3 * n],
            vec![0u16; PARTS_X3 * n],
        ];
        let mut got = want.clone();
        // Sums already holding something: the lane adds to them.
        let (mut row_sums, mut key_sums) = (vec![1.0f32; rows], vec![-1.0f32; keys]);
        let [wp, wa, wb] = &mut want;
        let [gp, ga, gb] = &mut got;
        // SAFETY: what `split` needs is available (checked above).
        unsafe {
            pack_a::<PARTS>(&p, (keys, rows, rows), wp);
            pack_a::<PARTS_X3>(&ds, (keys, rows, rows), wa);
            pack_b::<PARTS_X3>(&ds, (keys, rows, rows), wb);
            probs_and_grads_packed::<PARTS_X3>(
                (&s, &dp),
                (keys, rows),
                (&lse, &delta),
                (gp, ga, gb),
                (&mut row_sums, &mut key_sums),
            );
        }
        let shape = (keys, rows);
        let [wp, wa, wb] = &want;
        let [gp, ga, gb] = &got;
        let pairs = [
            (unpack_a::<PARTS>(wp, shape), unpack_a::<PARTS>(gp, shape)),
            (
                unpack_a::<PARTS_X3>(wa, shape),
                unpack_a::<PARTS_X3>(ga, shape),
            ),
            (
                unpack_b::<PARTS_X3>(wb, shape),
                unpack_b::<PARTS_X3>(gb, shape),
            ),
        ];
        for (which, (w, g)) in pairs.iter().enumerate() {
            for (i, (&a, &b)) in w.iter().zip(g).enumerate() {
                assert!(
                    (a - b).abs() <= (2e-6 + 2.0 * 2f32.powi(-16)) * a.abs().max(1e-3),
                    "output {which}, value {i}: {a} against {b}"
                );
            }
        }
        // dS (`[keys, rows]`) summed over the keys for each query, and over the queries for
        // each key, in f64.
        for (c, &got) in row_sums.iter().enumerate() {
            let want = 1.0 + (0..keys).map(|r| f64::from(ds[r * rows + c])).sum::<f64>();
            assert!(
                (f64::from(got) - want).abs() <= 1e-5,
                "query {c}: {got} against {want}"
            );
        }
        for (r, &got) in key_sums.iter().enumerate() {
            let want = -1.0
                + ds[r * rows..][..rows]
                    .iter()
                    .map(|&x| f64::from(x))
                    .sum::<f64>();
            assert!(
                (f64::from(got) - want).abs() <= 1e-5,
                "key {r}: {got} against {want}"
            );
        }
    }
}
