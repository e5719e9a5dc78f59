//! The AMX path of the fused kernel for bf16 inputs ([`Isa::Amx`]): both GEMMs of the online
//! softmax on AMX tiles ([`crate::amx`]), the softmax itself in f32 on AVX-512, as
//! FlashAttention-2 (Dao 2023, <https://arxiv.org/abs/2307.08691>) does on tensor cores and
//! PyTorch's CPU flash attention does through oneDNN.
//!
//! Per key/value head, keys are packed once as the B operand of `S = Q·Kᵀ` and values as the
//! B operand of `O += P·V` (VNNI pairs, [`PackedB`]). Then, for each block of query rows and
//! each block of keys:
//! 1. `S = Q·Kᵀ` on tiles, times the scale in f32. Products of bf16 values are exact in f32 and
//!    the sums are f32 sums, as on the other paths (only their order differs);
//! 2. every rule of the reference and the online-softmax step in f32: rows with no rule beyond
//!    a positive scale, causal and window take a fused two-pass step over their visible keys
//!    (`softmax_step_plain`), the others (and rows with a NaN or ±∞ score) the step shared with
//!    the other paths (`Plan::softmax_step`);
//! 3. `P` rounded to bf16 (nearest even, `VCVTNEPS2BF16`) and `acc += P·V` on tiles.
//!
//! Only step 3 rounds beyond f32: each weight by at most 2^-9 relative, while the row's sum
//! keeps the f32 weights, so an output element is off by at most `2^-9 · max |v|` of its row's
//! visible values (plus f32 rounding). The log-sum-exp, and the weights (recomputed from the
//! saved max and sum on the AVX-512 path), are as exact as on [`Isa::Avx512`].
//!
//! A head whose values hold NaN or ∞ takes the AVX-512 path instead: the tile product would
//! turn a hidden key's `0 · NaN` into NaN in rows that never see it. f32 inputs always do.

use half::bf16;

use super::{BlockOut, Isa, Plan, Src};
use crate::amx::{self, BLOCK, PackedB, Tiles};
use crate::mask::key_range;

/// Keys per score tile: 32 rows × 256 keys of f32 scores (32 KiB) and their bf16 weights
/// (16 KiB) fit the L1 cache; longer blocks also mean fewer loads and stores of the
/// accumulator tiles per `P·V` product.
const AMX_BLOCK_KV: usize = 256;

/// Query rows computed together against each key block: 32 keeps their scores in the L1
/// cache (measured at L = 2048, d = 64: 96 rows against 128-key blocks took 20% longer).
const GROUP: usize = BLOCK;

/// One key/value head packed for the tiles, with the queries it is read against.
pub(super) struct AmxHead<'a> {
    /// All queries of the call, `[batch, n_heads, seq_q, head_dim]`.
    q: &'a [bf16],
    /// `Kᵀ`, the B of `Q·Kᵀ`: `[head_dim, seq_kv]`.
    k: PackedB,
    /// `V`, the B of `P·V`: `[seq_kv, value_dim]`.
    v: PackedB,
}

/// Per-task buffers, reused across the blocks of a task; rows are padded to whole 32-row tile
/// blocks, `head_dim` and `value_dim` to 32 columns (with zeros).
#[derive(Default)]
pub(super) struct AmxScratch {
    /// Query rows, `[rows, head_dim]`.
    q: Vec<bf16>,
    /// Scores, then f32 weights, `[rows, AMX_BLOCK_KV]`.
    scores: Vec<f32>,
    /// Weights rounded to bf16, `[rows, AMX_BLOCK_KV]`.
    p: Vec<bf16>,
    /// The unnormalised output, `[rows, value_dim]`.
    acc: Vec<f32>,
}

impl<'a> Plan<'a> {
    /// Packs key/value head `(b, kvh)` for the tiles, or `None` when it takes another path:
    /// an ISA other than [`Isa::Amx`], f32 inputs, or values that are not all finite.
    pub(super) fn pack_head_amx(&self, b: usize, kvh: usize) -> Option<AmxHead<'a>> {
        let Src::Bf16 { q, k, v } = self.src else {
            return None;
        };
        if self.isa != Isa::Amx {
            return None;
        }
        let (s_n, d, dv) = (self.sh.seq_kv, self.sh.head_dim, self.sh.value_dim);
        let head = (b * self.sh.n_kv_heads + kvh) * s_n;
        let (k, v) = (&k[head * d..][..s_n * d], &v[head * dv..][..s_n * dv]);
        if !v.iter().all(|x| x.is_finite()) {
            return None;
        }
        Some(AmxHead {
            q,
            k: PackedB::from_transposed(k, s_n, d),
            v: PackedB::from_rows(v, s_n, dv),
        })
    }

    /// Query rows `i0..i0 + dst.lse.len()` of head `(b, h)` on the tiles, 32 rows at a time
    /// (so a group's scores and weights stay in the L1 cache).
    pub(super) fn forward_block_amx(
        &self,
        (b, h, i0): (usize, usize, usize),
        head: &AmxHead<'_>,
        dst: BlockOut<'_>,
        s: &mut AmxScratch,
    ) {
        let BlockOut { out, lse, stats } = dst;
        let (d, dv) = (self.sh.head_dim, self.sh.value_dim);
        let tiles = Tiles::configure().expect("Isa::Amx is only available with AMX");
        let q_head = (b * self.sh.n_heads + h) * self.sh.seq_q + i0;
        for (g, ((out, lse), stats)) in out
            .chunks_mut(GROUP * dv)
            .zip(lse.chunks_mut(GROUP))
            .zip(stats.chunks_mut(GROUP))
            .enumerate()
        {
            let g0 = g * GROUP;
            let q = &head.q[(q_head + g0) * d..][..lse.len() * d];
            let dst = BlockOut { out, lse, stats };
            self.forward_group_amx((b, h, i0 + g0), q, head, dst, &tiles, s);
        }
    }

    /// At most 32 query rows `i0..` (`q`, `[rows, head_dim]`) of head `(b, h)`.
    fn forward_group_amx(
        &self,
        (b, h, i0): (usize, usize, usize),
        q: &[bf16],
        head: &AmxHead<'_>,
        dst: BlockOut<'_>,
        tiles: &Tiles,
        s: &mut AmxScratch,
    ) {
        let BlockOut { out, lse, stats } = dst;
        let (n, d, dv, s_n) = (
            lse.len(),
            self.sh.head_dim,
            self.sh.value_dim,
            self.sh.seq_kv,
        );
        let (rows, d_pad, dv_pad) = (
            n.next_multiple_of(BLOCK),
            d.next_multiple_of(BLOCK),
            dv.next_multiple_of(BLOCK),
        );
        let AmxScratch {
            q: q_pad,
            scores,
            p,
            acc,
        } = s;
        q_pad.clear();
        q_pad.resize(rows * d_pad, bf16::ZERO);
        for (dst, src) in q_pad.chunks_exact_mut(d_pad).zip(q.chunks_exact(d)) {
            dst[..d].copy_from_slice(src);
        }
        scores.resize(GROUP * AMX_BLOCK_KV, 0.0);
        // Rows past `n` are 0 in `p`; each row's columns past its block's keys are set to 0
        // with the row, up to the 32 the product reads.
        p.resize(GROUP * AMX_BLOCK_KV, bf16::ZERO);
        p[n * AMX_BLOCK_KV..].fill(bf16::ZERO);
        acc.clear();
        acc.resize(rows * dv_pad, 0.0);
        let range = |i| key_range(self.opt.causal, self.opt.window, self.offset, i, s_n);
        // Visible ranges only move right as `i` grows: the group sees the union of its rows'.
        let ((lo, _), (_, hi)) = (range(i0), range(i0 + n - 1));
        // Without extra rules or dropout, each row's visible keys (a range, from the causal and
        // window rules) take the fused step.
        let plain = !self.extras && self.opt.dropout.is_none() && self.scale > 0.0;
        let mut m = [f32::NEG_INFINITY; GROUP];
        let mut sum = [0.0f32; GROUP];
        // Key blocks cover exactly `lo..hi` from the tile boundary below `lo`: on causal and
        // window masks the group's first and last blocks are no longer than needed.
        let mut j0 = lo / BLOCK * BLOCK;
        while j0 < hi {
            let keys = (hi - j0).min(AMX_BLOCK_KV);
            let k = head.k.view((0, d), (j0, keys));
            let tile = &mut scores[..rows * AMX_BLOCK_KV];
            amx::gemm_blocks(tiles, q_pad, d_pad, k, tile, AMX_BLOCK_KV, false);
            for r in 0..n {
                let row = &mut scores[r * AMX_BLOCK_KV..][..keys];
                let p = &mut p[r * AMX_BLOCK_KV..][..keys.next_multiple_of(BLOCK)];
                p[keys..].fill(bf16::ZERO);
                let step = plain.then(|| {
                    let (vis_lo, vis_hi) = range(i0 + r);
                    let a = vis_lo.clamp(j0, j0 + keys) - j0;
                    let b = (vis_hi.clamp(j0, j0 + keys) - j0).max(a);
                    p[..a].fill(bf16::ZERO);
                    p[b..keys].fill(bf16::ZERO);
                    match a < b {
                        true => {
                            let state = (&mut m[r], &mut sum[r]);
                            softmax_step_plain(&row[a..b], self.scale, state, &mut p[a..b])
                        }
                        // Nothing visible here: weights 0, the row's state unchanged.
                        false => Some(None),
                    }
                });
                let alpha = step.flatten().unwrap_or_else(|| {
                    self.isa.scale(row, self.scale);
                    let state = (&mut m[r], &mut sum[r]);
                    let alpha = self.softmax_step((b, h, i0 + r), j0, row, state);
                    round_to_bf16(row, &mut p[..keys]);
                    alpha
                });
                if let Some(alpha) = alpha {
                    self.isa.scale(&mut acc[r * dv_pad..][..dv], alpha);
                }
            }
            let v = head.v.view((j0, keys), (0, dv));
            let p = &p[..rows * AMX_BLOCK_KV];
            amx::gemm_blocks(tiles, p, AMX_BLOCK_KV, v, acc, dv_pad, true);
            j0 += keys;
        }
        let keep_scale = self.opt.dropout.map_or(1.0, |d| d.scale());
        for (r, out_row) in out.chunks_exact_mut(dv).enumerate() {
            if sum[r] == 0.0 {
                lse[r] = f32::NEG_INFINITY;
            } else {
                out_row.copy_from_slice(&acc[r * dv_pad..][..dv]);
                self.isa.scale(out_row, keep_scale / sum[r]);
                lse[r] = m[r] + sum[r].ln();
            }
            stats[r] = [m[r], sum[r]];
        }
    }
}

/// The online-softmax step of `Plan::softmax_step` for a row with no rule beyond a positive
/// scale, fused into two passes: the raw scores' max, then `P = e^(scale·s − m')` with its sum,
/// stored as bf16 in `p`. `None` (nothing changed) when a score is NaN or ±∞: those rows take
/// the general step.
fn softmax_step_plain(
    row: &[f32],
    scale: f32,
    state: (&mut f32, &mut f32),
    p: &mut [bf16],
) -> Option<Option<f32>> {
    assert_eq!(row.len(), p.len());
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: this runs only on the AMX path, whose ISA check includes AVX-512F,
        // AVX512_BF16, AVX512BW and AVX512VL; the lengths agree (checked above).
        unsafe { softmax_step_plain_avx512(row, scale, state, p) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (row, scale, state, p);
        None
    }
}

/// # Safety
/// AVX-512F, AVX512_BF16, AVX512BW and AVX512VL must be available; `p.len() == row.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn softmax_step_plain_avx512(
    row: &[f32],
    scale: f32,
    (m, sum): (&mut f32, &mut f32),
    p: &mut [bf16],
) -> Option<Option<f32>> {
    use std::arch::x86_64::*;
    let n = row.len();
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut max = ninf;
    for i in (0..n).step_by(16) {
        // SAFETY: the lanes of the mask lie inside `row`.
        let v = unsafe { _mm512_mask_loadu_ps(ninf, lane_mask(i, n), row.as_ptr().add(i)) };
        max = _mm512_max_ps(max, v);
    }
    // A NaN may be lost by `vmaxps`; it shows in the sum below, before anything is changed.
    let raw_max = _mm512_reduce_max_ps(max);
    if !raw_max.is_finite() {
        return None;
    }
    // `scale > 0`: the max of the scaled scores is the scaled max, rounding included.
    let m_new = m.max(scale * raw_max);
    // e^(scale·s − m') = 2^t with t = s·(scale·log₂e) − m'·log₂e, one fused multiply-add.
    let log2e = std::f32::consts::LOG2_E;
    let (c, mc) = (_mm512_set1_ps(scale * log2e), _mm512_set1_ps(m_new * log2e));
    let mut block_sum = _mm512_setzero_ps();
    for i in (0..n).step_by(16) {
        let mask = lane_mask(i, n);
        // SAFETY: the lanes of `mask` lie inside `row` and `p`.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, row.as_ptr().add(i));
            let e = exp2(_mm512_fmsub_ps(v, c, mc));
            block_sum = _mm512_mask_add_ps(block_sum, mask, block_sum, e);
            let e: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(e));
            _mm256_mask_storeu_epi16(p.as_mut_ptr().add(i).cast(), mask, e);
        }
    }
    let block_sum = _mm512_reduce_add_ps(block_sum);
    if block_sum.is_nan() {
        return None;
    }
    let alpha = if m_new == *m {
        *sum += block_sum;
        None
    } else {
        let alpha = (*m - m_new).exp();
        *sum = *sum * alpha + block_sum;
        *m = m_new;
        Some(alpha)
    };
    Some(alpha)
}

/// The lane mask of the 16 values at `i` of an `n`-value row.
#[cfg(target_arch = "x86_64")]
fn lane_mask(i: usize, n: usize) -> std::arch::x86_64::__mmask16 {
    ((1u32 << (n - i).min(16)) - 1) as u16
}

/// `2^t` for 16 lanes and `t ≤ 0` (up to rounding), with Cephes' `exp2f` polynomial as in the
/// AVX-512 kernels' `exp` (`avx512.rs`, private there): relative error ≤ 2e-7 for
/// `t ≥ −125`. Below, the result is 2^-125 (not 0): these rows have no hidden keys, and a
/// weight of 2^-125 ≈ 2e-38 is 0 to every tolerance while staying clear of subnormals,
/// which cost a microcode assist each.
///
/// # Safety
/// AVX-512F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp2(t: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    const P: [f32; 6] = [
        1.535_336_2e-4,
        1.339_887_4e-3,
        9.618_437e-3,
        5.550_332_5e-2,
        2.402_264_8e-1,
        6.931_472e-1,
    ];
    let t = _mm512_max_ps(_mm512_set1_ps(-125.0), t);
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
    let f = _mm512_sub_ps(t, n);
    let mut p = _mm512_set1_ps(P[0]);
    for &c in &P[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    // 2^f = 1 + f·P(f)
    let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_scalef_ps(p, n)
}

/// `dst = src` rounded to bf16, nearest even.
#[cfg(target_arch = "x86_64")]
fn round_to_bf16(src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len());
    // SAFETY: this runs only on the AMX path, whose ISA check includes AVX512_BF16, AVX512BW
    // and AVX512VL; the lengths agree (checked above).
    unsafe { round_to_bf16_avx512(src, dst) }
}

/// `dst = src` rounded to bf16, nearest even.
#[cfg(not(target_arch = "x86_64"))]
fn round_to_bf16(src: &[f32], dst: &mut [bf16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = bf16::from_f32(x);
    }
}

/// # Safety
/// AVX-512F, AVX512_BF16, AVX512BW and AVX512VL must be available; `dst.len() == src.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn round_to_bf16_avx512(src: &[f32], dst: &mut [bf16]) {
    use std::arch::x86_64::*;
    let n = src.len();
    for i in (0..n).step_by(16) {
        let mask = ((1u32 << (n - i).min(16)) - 1) as __mmask16;
        // SAFETY: the lanes of `mask` lie inside both slices.
        unsafe {
            let x = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(i));
            let y: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), mask, y);
        }
    }
}
