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
//! 2. every rule of the reference and the online-softmax step in f32, shared with the other
//!    paths (`Plan::softmax_step`);
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

use super::{BLOCK_KV, BlockOut, Isa, Plan, Src};
use crate::amx::{self, BLOCK, PackedB, Tiles};
use crate::mask::key_range;

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
    /// Scores, then f32 weights, `[rows, BLOCK_KV]`.
    scores: Vec<f32>,
    /// Weights rounded to bf16, `[rows, BLOCK_KV]`.
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
            k: PackedB::pack_with(d, s_n, false, |kk, j| k[j * d + kk]),
            v: PackedB::pack_with(s_n, dv, true, |j, c| v[j * dv + c]),
        })
    }

    /// Query rows `i0..i0 + dst.lse.len()` of head `(b, h)` on the tiles.
    pub(super) fn forward_block_amx(
        &self,
        (b, h, i0): (usize, usize, usize),
        head: &AmxHead<'_>,
        dst: BlockOut<'_>,
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
        let q_head = (b * self.sh.n_heads + h) * self.sh.seq_q + i0;
        s.q.clear();
        s.q.resize(rows * d_pad, bf16::ZERO);
        for (dst, src) in
            s.q.chunks_exact_mut(d_pad)
                .zip(head.q[q_head * d..][..n * d].chunks_exact(d))
        {
            dst[..d].copy_from_slice(src);
        }
        s.scores.resize(rows * BLOCK_KV, 0.0);
        // Rows past `n` stay 0 in `p`, as do the columns past a block's keys.
        s.p.clear();
        s.p.resize(rows * BLOCK_KV, bf16::ZERO);
        s.acc.clear();
        s.acc.resize(rows * dv_pad, 0.0);
        let tiles = Tiles::configure().expect("Isa::Amx is only available with AMX");
        let (lo, _) = key_range(self.opt.causal, self.opt.window, self.offset, i0, s_n);
        let (_, hi) = key_range(
            self.opt.causal,
            self.opt.window,
            self.offset,
            i0 + n - 1,
            s_n,
        );
        let mut m = vec![f32::NEG_INFINITY; n];
        let mut sum = vec![0.0f32; n];
        for jb in lo / BLOCK_KV..hi.div_ceil(BLOCK_KV) {
            let j0 = jb * BLOCK_KV;
            let keys = (s_n - j0).min(BLOCK_KV);
            let k = head.k.view((0, d), (j0, keys));
            amx::gemm_blocks(&tiles, &s.q, d_pad, k, &mut s.scores, BLOCK_KV, false);
            for r in 0..n {
                let row = &mut s.scores[r * BLOCK_KV..][..keys];
                self.isa.scale(row, self.scale);
                let state = (&mut m[r], &mut sum[r]);
                if let Some(alpha) = self.softmax_step((b, h, i0 + r), j0, row, state) {
                    self.isa.scale(&mut s.acc[r * dv_pad..][..dv], alpha);
                }
                let p = &mut s.p[r * BLOCK_KV..][..keys.next_multiple_of(BLOCK)];
                round_to_bf16(row, &mut p[..keys]);
                p[keys..].fill(bf16::ZERO);
            }
            let v = head.v.view((j0, keys), (0, dv));
            amx::gemm_blocks(&tiles, &s.p, BLOCK_KV, v, &mut s.acc, dv_pad, true);
        }
        let keep_scale = self.opt.dropout.map_or(1.0, |d| d.scale());
        for (r, out_row) in out.chunks_exact_mut(dv).enumerate() {
            if sum[r] == 0.0 {
                lse[r] = f32::NEG_INFINITY;
            } else {
                out_row.copy_from_slice(&s.acc[r * dv_pad..][..dv]);
                self.isa.scale(out_row, keep_scale / sum[r]);
                lse[r] = m[r] + sum[r].ln();
            }
            stats[r] = [m[r], sum[r]];
        }
    }
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
