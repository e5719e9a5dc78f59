//! The AMX path of the fused kernel for bf16 inputs ([`Isa::Amx`]): both GEMMs of the online
//! softmax on AMX tiles ([`crate::amx`]), the softmax itself in f32 on AVX-512, as
//! FlashAttention-2 (Dao 2023, <https://arxiv.org/abs/2307.08691>) does on tensor cores and
//! PyTorch's CPU flash attention does through oneDNN.
//!
//! Per key/value head, keys are packed once as the B operand of `S = Q·Kᵀ` and values as the
//! B operand of `O += P·V` (VNNI pairs, [`PackedB`]). Then, for each block of query rows and
//! each block of keys:
//! 1. `S = Q·Kᵀ` on tiles, times the scale in f32. Products of bf16 values are exact in f32 and
//!    the sums are f32 sums, as on the other paths (only their order differs). The next key
//!    block's `S` is computed a column block at a time between the rows of step 2, so the
//!    tiles work while the vector units run the exponentials;
//! 2. every rule of the reference and the online-softmax step in f32: rows with no rule beyond
//!    a positive scale, causal and window take a fused two-pass step over their visible keys
//!    (`row_max` for all the group's rows, then `softmax_step_plain` for each: no row waits
//!    on its own max), the others (and rows with a NaN or ±∞ score) the step shared with the
//!    other paths (`Plan::softmax_step`);
//! 3. `P` rounded to bf16 (nearest even, `VCVTNE2PS2BF16`) and `acc += P·V` on tiles.
//!
//! Two things round beyond f32. The fused step's `e^x` is a degree-4 polynomial (relative
//! error ε ≤ 3e-6, see `exp2`: the weights end up in bf16, with 8 significant bits), and
//! step 3 rounds each weight by at most 2^-8 relative (half a unit in the last of bf16's 8
//! significant bits: 1 + 2^-8 rounds to 1) while the row's sum keeps the f32 weights. So a
//! weight over the row's sum is off by at most `2ε` relative before the rounding, and an
//! output element by at most `(2^-8 + 2ε) · max |v|` of its row's visible values (plus f32
//! rounding). The log-sum-exp moves by at most `ε` (plus the f32 rounding of every path);
//! the weights, recomputed from the saved max and sum on the AVX-512 path, by the same
//! relative `ε`.
//!
//! The buffers the tiles read and write start on 64-byte lines ([`AmxScratch`]).
//!
//! A head whose values hold NaN or ∞ takes the AVX-512 path instead: the tile product would
//! turn a hidden key's `0 · NaN` into NaN in rows that never see it. f32 inputs always do.

use half::bf16;

use super::{BlockOut, Isa, Plan, Src};
use crate::aligned::Aligned;
use crate::amx::{self, BLOCK, PackedB, Tiles};
use crate::mask::key_range;
use crate::shape::FiniteBits;

/// Keys per score tile (32 rows × 256 keys of f32 scores, 32 KiB; their bf16 weights, 16 KiB):
/// longer blocks mean fewer loads and stores of the accumulator tiles per `P·V` product.
/// Measured at L = 2048, d = 64 with two score tiles (1 thread, kernel only): 128 keys took
/// 15% longer, 512 the same.
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
///
/// Each starts on a cache line ([`Aligned`]): tile rows are 64 bytes, and one that starts off
/// a line touches two per load and store. Measured here on 1 KiB tiles in the L1 cache:
/// `TILELOADD` 6.7 cycles aligned, 44 off by 16 bytes; `TILESTORED` 13 and 26; the 2 × 2
/// block of `Q·Kᵀ` at `head_dim = 64` 160 and 500.
#[derive(Default)]
pub(super) struct AmxScratch {
    /// Query rows, `[rows, head_dim]`.
    q: Aligned<bf16>,
    /// Scores, then f32 weights: two tiles of `[rows, AMX_BLOCK_KV]`, the current key block's
    /// and the next one's.
    scores: Aligned<f32>,
    /// Weights rounded to bf16, `[rows, AMX_BLOCK_KV]`.
    p: Aligned<bf16>,
    /// The unnormalised output, `[rows, value_dim]`.
    acc: Aligned<f32>,
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
        if !bf16::all_finite(v) {
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
        let q_pad = s.q.get(rows * d_pad);
        let (q_rows, pad_rows) = q_pad.split_at_mut(n * d_pad);
        pad_rows.fill(bf16::ZERO);
        for (dst, src) in q_rows.chunks_exact_mut(d_pad).zip(q.chunks_exact(d)) {
            dst[..d].copy_from_slice(src);
            dst[d..].fill(bf16::ZERO);
        }
        let q_pad = &*q_pad;
        // Two score tiles: the next key block's scores are computed on the tiles while the
        // vector units run the current one's exponentials.
        let scores = s.scores.get(2 * GROUP * AMX_BLOCK_KV);
        let (mut cur, mut next) = scores.split_at_mut(GROUP * AMX_BLOCK_KV);
        // Rows past `n` are 0 in `p`; each row's columns past its block's keys are set to 0
        // with the row, up to the 32 the product reads.
        let p = s.p.get(GROUP * AMX_BLOCK_KV);
        p[n * AMX_BLOCK_KV..].fill(bf16::ZERO);
        // Not zeroed: the first key block's product overwrites it (rescaling it before then
        // changes nothing that stays), and a row with no key block has sum 0 and never reads it.
        let acc = s.acc.get(rows * dv_pad);
        let range = |i| key_range(self.opt.causal, self.opt.window, self.offset, i, s_n);
        // Visible ranges only move right as `i` grows: the group sees the union of its rows'.
        let ((lo, _), (_, hi)) = (range(i0), range(i0 + n - 1));
        // Without extra rules or dropout, each row's visible keys (a range, from the causal and
        // window rules) take the fused step.
        let plain = !self.extras && self.opt.dropout.is_none() && self.scale > 0.0;
        let mut m = [f32::NEG_INFINITY; GROUP];
        let mut sum = [0.0f32; GROUP];
        // `S = Q·Kᵀ` for column block `c` (32 keys) of the key block `(j0, keys)` into `tile`.
        let score_cols = |c: usize, (j0, keys): (usize, usize), tile: &mut [f32]| {
            let k = head
                .k
                .view((0, d), (j0 + c * BLOCK, (keys - c * BLOCK).min(BLOCK)));
            let tile = &mut tile[c * BLOCK..rows * AMX_BLOCK_KV];
            amx::gemm_blocks(tiles, q_pad, d_pad, k, tile, AMX_BLOCK_KV, false);
        };
        // Key blocks cover exactly `lo..hi` from the tile boundary below `lo`: on causal and
        // window masks the group's first and last blocks are no longer than needed. Only the
        // last block is shorter than `AMX_BLOCK_KV`, so each block starts on a tile.
        // The key block at `j0`: `(j0, keys)`, no key past `hi` (none from `hi` on).
        let block_at = |j0: usize| (j0, (hi.max(j0) - j0).min(AMX_BLOCK_KV));
        let first_block = lo / BLOCK * BLOCK;
        let mut j0 = first_block;
        for c in 0..block_at(j0).1.div_ceil(BLOCK) {
            score_cols(c, block_at(j0), cur);
        }
        while j0 < hi {
            let keys = block_at(j0).1;
            let following = block_at(j0 + keys);
            let calls = following.1.div_ceil(BLOCK);
            let mut issued = 0;
            // The fused step's first pass for every row before its second pass for any: a
            // row's exponentials then never wait on its own max.
            let mut visible = [(0, 0); GROUP];
            let mut raw_max = [f32::NAN; GROUP];
            if plain {
                for r in 0..n {
                    let (vis_lo, vis_hi) = range(i0 + r);
                    let a = vis_lo.clamp(j0, j0 + keys) - j0;
                    let b = (vis_hi.clamp(j0, j0 + keys) - j0).max(a);
                    visible[r] = (a, b);
                    raw_max[r] = row_max(&cur[r * AMX_BLOCK_KV..][a..b]);
                }
            }
            for r in 0..n {
                // The next block's column blocks, one every `n / calls` rows.
                if issued < calls && r * calls >= issued * n {
                    score_cols(issued, following, next);
                    issued += 1;
                }
                let row = &mut cur[r * AMX_BLOCK_KV..][..keys];
                let p = &mut p[r * AMX_BLOCK_KV..][..keys.next_multiple_of(BLOCK)];
                p[keys..].fill(bf16::ZERO);
                let step = plain.then(|| {
                    let (a, b) = visible[r];
                    p[..a].fill(bf16::ZERO);
                    p[b..keys].fill(bf16::ZERO);
                    match a < b {
                        true => {
                            let state = (&mut m[r], &mut sum[r]);
                            let p = &mut p[a..b];
                            softmax_step_plain(&row[a..b], raw_max[r], self.scale, state, p)
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
            for c in issued..calls {
                score_cols(c, following, next);
            }
            let v = head.v.view((j0, keys), (0, dv));
            let p = &p[..rows * AMX_BLOCK_KV];
            amx::gemm_blocks(tiles, p, AMX_BLOCK_KV, v, acc, dv_pad, j0 != first_block);
            std::mem::swap(&mut cur, &mut next);
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

/// The first pass of the fused step: the largest value of `row` (`−∞` when empty). A NaN may
/// be lost, or returned; the second pass finds it either way.
fn row_max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: this runs only on the AMX path, whose ISA check includes AVX-512F.
        unsafe { row_max_avx512(row) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = row;
        f32::NAN
    }
}

/// # Safety
/// AVX-512F must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn row_max_avx512(row: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = row.len();
    let whole = n / 32 * 32;
    let (lo, hi) = tail_masks(n - whole);
    let row = row.as_ptr();
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    // SAFETY: whole 32-value chunks lie inside `row`, the tail's lanes are masked to what is
    // left of it.
    let (mut max0, mut max1) = unsafe {
        (
            _mm512_mask_loadu_ps(ninf, lo, row.add(whole)),
            _mm512_mask_loadu_ps(ninf, hi, row.add(whole + 16)),
        )
    };
    for i in (0..whole).step_by(32) {
        unsafe {
            max0 = _mm512_max_ps(max0, _mm512_loadu_ps(row.add(i)));
            max1 = _mm512_max_ps(max1, _mm512_loadu_ps(row.add(i + 16)));
        }
    }
    _mm512_reduce_max_ps(_mm512_max_ps(max0, max1))
}

/// The lane masks of the two 16-lane halves of a tail of `tail < 32` values.
#[cfg(target_arch = "x86_64")]
fn tail_masks(tail: usize) -> (u16, u16) {
    let tail = tail as u32;
    (
        ((1u32 << tail.min(16)) - 1) as u16,
        ((1u32 << tail.saturating_sub(16)) - 1) as u16,
    )
}

/// The online-softmax step of `Plan::softmax_step` for a row with no rule beyond a positive
/// scale, fused into two passes: the raw scores' max ([`row_max`], `raw_max` here), then
/// `P = e^(scale·s − m')` with its sum, stored as bf16 in `p`. `None` (nothing changed) when
/// a score is NaN or ±∞, or where the CPU lacks AVX512DQ (for `VREDUCEPS`): those rows take
/// the general step.
fn softmax_step_plain(
    row: &[f32],
    raw_max: f32,
    scale: f32,
    state: (&mut f32, &mut f32),
    p: &mut [bf16],
) -> Option<Option<f32>> {
    assert_eq!(row.len(), p.len());
    #[cfg(target_arch = "x86_64")]
    {
        if !std::arch::is_x86_feature_detected!("avx512dq") {
            return None;
        }
        // SAFETY: this runs only on the AMX path, whose ISA check includes AVX-512F,
        // AVX512_BF16, AVX512BW and AVX512VL, and AVX512DQ is checked above; the lengths agree
        // (checked above).
        unsafe { softmax_step_plain_avx512(row, raw_max, scale, state, p) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (row, raw_max, scale, state, p);
        None
    }
}

/// # Safety
/// AVX-512F, AVX512DQ, AVX512_BF16, AVX512BW and AVX512VL must be available;
/// `p.len() == row.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bf16,avx512bw,avx512vl")]
unsafe fn softmax_step_plain_avx512(
    row: &[f32],
    raw_max: f32,
    scale: f32,
    (m, sum): (&mut f32, &mut f32),
    p: &mut [bf16],
) -> Option<Option<f32>> {
    use std::arch::x86_64::*;
    let n = row.len();
    // Whole 32-value chunks, then a masked tail of up to 32 in two 16-lane halves.
    let whole = n / 32 * 32;
    let tail = n - whole;
    let (lo, hi) = tail_masks(tail);
    let (row, p) = (row.as_ptr(), p.as_mut_ptr());
    // A NaN or ±∞ in the max takes the general step; a NaN lost by `vmaxps` shows in the
    // sum below, before anything is changed.
    if !raw_max.is_finite() {
        return None;
    }
    // `scale > 0`: the max of the scaled scores is the scaled max, rounding included.
    let m_new = m.max(scale * raw_max);
    // e^(scale·s − m') = 2^t with t = s·(scale·log₂e) − m'·log₂e, one fused multiply-add.
    let log2e = std::f32::consts::LOG2_E;
    let (c, mc) = (_mm512_set1_ps(scale * log2e), _mm512_set1_ps(m_new * log2e));
    let (mut sum0, mut sum1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    // SAFETY (both blocks): whole 32-value chunks lie inside `row` and `p`, the tail's lanes
    // are masked to what is left of them.
    for i in (0..whole).step_by(32) {
        unsafe {
            let e0 = exp2(_mm512_fmsub_ps(_mm512_loadu_ps(row.add(i)), c, mc));
            let e1 = exp2(_mm512_fmsub_ps(_mm512_loadu_ps(row.add(i + 16)), c, mc));
            sum0 = _mm512_add_ps(sum0, e0);
            sum1 = _mm512_add_ps(sum1, e1);
            // Values 0..16 from `e0`, 16..32 from `e1`.
            let w: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(e1, e0));
            _mm512_storeu_si512(p.add(i).cast(), w);
        }
    }
    if tail > 0 {
        unsafe {
            let e0 = exp2(_mm512_fmsub_ps(
                _mm512_maskz_loadu_ps(lo, row.add(whole)),
                c,
                mc,
            ));
            let e1 = exp2(_mm512_fmsub_ps(
                _mm512_maskz_loadu_ps(hi, row.add(whole + 16)),
                c,
                mc,
            ));
            sum0 = _mm512_mask_add_ps(sum0, lo, sum0, e0);
            sum1 = _mm512_mask_add_ps(sum1, hi, sum1, e1);
            let w: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(e1, e0));
            let mask = u32::from(lo) | u32::from(hi) << 16;
            _mm512_mask_storeu_epi16(p.add(whole).cast(), mask, w);
        }
    }
    let block_sum = _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
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

/// `2^t` for 16 lanes and `t ≤ 0` (up to rounding), relative error ≤ 3e-6 for
/// `t ≥ −125`: `t = n + f` with `n = ⌊t⌋` and `f ∈ [0, 1)` (`VREDUCEPS`), `2^f` by a degree-4
/// polynomial, times `2^n` (`VSCALEFPS`, which takes `⌊t⌋` itself). The weights end up in
/// bf16 (8 significant bits), so they need no more; the row's sum, and so the log-sum-exp,
/// moves by at most the same relative error (3e-6 in the log-sum-exp).
///
/// Below −125 the result is 2^-125 (not 0): these rows have no hidden keys, and a weight of
/// 2^-125 ≈ 2e-38 is 0 to every tolerance while staying clear of subnormals, which cost a
/// microcode assist each.
///
/// # Safety
/// AVX-512F and AVX512DQ must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq")]
#[inline]
unsafe fn exp2(t: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // 2^f ≈ 1 + f·(c₁ + f·(c₂ + f·(c₃ + f·c₄))), minimax in relative error on [0, 1) with
    // the constant fixed at 1 (Remez exchange): 2.90e-6, 2.95e-6 with the f32 coefficients
    // and f32 fused multiply-adds (checked on a grid of 10⁶ points).
    const C: [f32; 4] = [1.342_668_4e-2, 5.224_247_3e-2, 2.412_802e-1, 6.930_448_4e-1];
    let t = _mm512_max_ps(_mm512_set1_ps(-125.0), t);
    // imm8 = 0x09: keep 0 fraction bits, round down, no precision exception.
    let f = _mm512_reduce_ps::<0x09>(t);
    let mut p = _mm512_set1_ps(C[0]);
    for &c in &C[1..] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    let p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    _mm512_scalef_ps(p, t)
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Whether this CPU runs the fused step (the AMX path's features and AVX512DQ); where it
    /// does not, asserts that the step declines (`None`), so rows take the general step.
    fn fused_step_runs() -> bool {
        let runs = Isa::Amx.is_available() && std::arch::is_x86_feature_detected!("avx512dq");
        if !runs {
            let (mut m, mut sum) = (0.0, 0.0);
            let mut p = [bf16::ZERO; 3];
            let row = [1.0, 2.0, 3.0];
            let state = (&mut m, &mut sum);
            let step = softmax_step_plain(&row, row_max(&row), 1.0, state, &mut p);
            assert_eq!(step, None);
        }
        runs
    }

    #[test]
    fn exp2_is_within_its_bound() {
        if !fused_step_runs() {
            return;
        }
        // Every 2^-12 from −125 to 0 (512 001 values, 16 per call), against f64.
        let ts: Vec<f32> = (0..=125 * 4096).map(|i| -(i as f32) / 4096.0).collect();
        let mut worst = 0.0f64;
        for chunk in ts.chunks(16) {
            let mut t = [0.0f32; 16];
            t[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0.0f32; 16];
            // SAFETY: the features are checked above.
            unsafe {
                use std::arch::x86_64::*;
                _mm512_storeu_ps(got.as_mut_ptr(), exp2(_mm512_loadu_ps(t.as_ptr())));
            }
            for (&t, &g) in chunk.iter().zip(&got) {
                let want = 2f64.powf(f64::from(t));
                worst = worst.max((f64::from(g) / want - 1.0).abs());
            }
        }
        assert!(worst <= 3e-6, "worst relative error {worst:e}");
        // Below −125 the result stays at 2^-125, clear of the subnormals.
        let mut got = [0.0f32; 16];
        // SAFETY: as above.
        unsafe {
            use std::arch::x86_64::*;
            _mm512_storeu_ps(got.as_mut_ptr(), exp2(_mm512_set1_ps(-1e4)));
        }
        assert!(got.iter().all(|&g| g == 2f32.powi(-125)), "{got:?}");
    }

    #[test]
    fn fused_step_matches_f64() {
        if !fused_step_runs() {
            return;
        }
        // Lengths around the 32-value chunks and the 16-lane halves of the tail.
        for n in [1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 77, 256] {
            let row: Vec<f32> = (0..n)
                .map(|j| ((j * 37 % 101) as f32 - 50.0) * 0.173)
                .collect();
            let scale = 0.7f32;
            // A running state from an earlier block: max 1.5 (below this block's), sum 2.
            let (mut m, mut sum) = (1.5f32, 2.0f32);
            let mut p = vec![bf16::from_f32(-7.0); n];
            let raw_max = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            assert_eq!(row_max(&row), raw_max, "n = {n}");
            let step = softmax_step_plain(&row, raw_max, scale, (&mut m, &mut sum), &mut p);
            let want_m = 1.5f32.max(scale * raw_max);
            assert_eq!(m, want_m, "n = {n}");
            let e: Vec<f64> = row
                .iter()
                .map(|&s| (f64::from(scale) * f64::from(s) - f64::from(want_m)).exp())
                .collect();
            let alpha = (1.5 - f64::from(want_m)).exp();
            let want_sum = 2.0 * alpha + e.iter().sum::<f64>();
            // The exp's 3e-6, plus the f32 rounding of t = s·(scale·log₂e) − m'·log₂e: both
            // products rounded (2^-24 of values under 13) and the fused multiply-add (2^-20
            // for |t| < 32), under 2e-6 absolute, 1.4e-6 relative after 2^t. The sum adds
            // f32 rounding: each term goes through at most n/32 + 1 lane additions, 5 of the
            // reduction and 1 into the running sum, plus alpha's own rounding: (n + 8)·2^-24.
            let exp_tol = 3e-6 + 1.4e-6;
            let sum_tol = exp_tol + (n + 8) as f64 * 2f64.powi(-24);
            let got_sum = f64::from(sum);
            assert!(
                (got_sum / want_sum - 1.0).abs() <= sum_tol,
                "n = {n}: sum {got_sum} vs {want_sum}"
            );
            match step {
                // The max moved: the accumulator's factor, e^(m − m') in f32.
                Some(Some(a)) => assert!((f64::from(a) / alpha - 1.0).abs() <= 1e-6),
                // The max stayed (this block's scores are all below 1.5).
                Some(None) => assert_eq!(want_m, 1.5, "n = {n}"),
                None => panic!("n = {n}: the fused step declined finite scores"),
            }
            // Each weight: the exp's error, then bf16's nearest-even rounding (2^-8).
            let p_tol = 2f64.powi(-8) * (1.0 + exp_tol) + exp_tol;
            for (j, (&got, &want)) in p.iter().zip(&e).enumerate() {
                let err = (f64::from(got.to_f32()) / want - 1.0).abs();
                assert!(err <= p_tol, "n = {n}, j = {j}: {got} vs {want}");
            }
        }
    }
}
