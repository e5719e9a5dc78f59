//! The AMX path of the fused kernel ([`Isa::Amx`]): both GEMMs of the online softmax on AMX
//! tiles ([`crate::cpu::amx`]), the softmax itself in f32 on AVX-512, as FlashAttention-2 (Dao 2023,
//! <https://arxiv.org/abs/2307.08691>) does on tensor cores and PyTorch's CPU flash attention
//! does through oneDNN. On [`Isa::Avx512Bf16`] bf16 inputs take this path with AVX512_BF16 dot
//! products in place of the tiles ([`Products::Dot`], `crate::cpu::bf16dot`), reading the same
//! packed operands: every step and bound below holds for them as for the tiles.
//!
//! bf16 inputs multiply as they are. f32 inputs multiply in three bf16 parts each ("bf16x6",
//! [`crate::cpu::bf16x`]): six tile products per product, within `5·2⁻²⁴|ab|` (a few f32
//! roundings), faster than the FMA kernels; heads whose scores could be large enough for that
//! to move a weight by more than 2e-5 take the FMA kernels ([`F32_SCORE_BOUND`]).
//!
//! Each key/value head is packed once for all the query blocks of its query heads, keys as the
//! B operand of `S = Q·Kᵀ` and values as the B operand of `O += P·V` (VNNI pairs, [`PackedB`],
//! or the B layout of [`crate::cpu::bf16x`], in the halves order of the f32 weights,
//! [`bf16x::pack_b_halves`]). Then, for each block of
//! query rows, key chunk by key chunk (about 1.5 MiB of packed keys and values, which stay in
//! the L2 cache while every group of 32 rows of the block reads them), and for each group and
//! each block of keys in the chunk:
//! 1. `S = Q·Kᵀ` on tiles, times the scale in f32. Products of bf16 values (bf16 inputs, or the
//!    parts of f32 ones) are exact in f32 and the sums are f32 sums. The next key block's `S` is
//!    computed a column block at a time between the rows of step 2, so the tiles work while
//!    the vector units run the exponentials. That helps bf16 inputs; f32 ones, whose column
//!    blocks take six times the tile products, gain nothing from it, as there the products
//!    and the vector work do not overlap;
//! 2. every rule of the reference and the online-softmax step in f32: rows take a fused step
//!    over their visible keys (with masks, softcap or ALiBi, on scores those rules finished
//!    first, a hidden key's −∞ weighing 0); rows under dropout, or with a NaN or ±∞ score,
//!    take the step shared with the other paths (`Plan::softmax_step`). The fused step takes
//!    a row's first key block in two passes (`row_max` for all the group's rows, then
//!    `softmax_step_plain`, or `softmax_step_parts` for f32 inputs, for each: no row waits on
//!    its own max), and its later blocks in one,
//!    offset by the row's running max, which moves only when a block's scores pass it by more
//!    than a headroom ([`lazy_step`]), so most later blocks read their scores once, not
//!    twice;
//! 3. `P` rounded to bf16 (nearest even, `VCVTNE2PS2BF16`), or split in three parts for f32
//!    inputs, and `acc += P·V` on tiles.
//!
//! For bf16 inputs, two things round beyond f32. The fused step's `e^x` is a degree-4
//! polynomial (relative error ε ≤ 3e-6, see `exp2`: the weights end up in bf16, with 8
//! significant bits), and step 3 rounds each weight by at most 2^-8 relative (half a unit in
//! the last of bf16's 8 significant bits: 1 + 2^-8 rounds to 1) while the row's sum keeps the
//! f32 weights. So a weight over the row's sum is off by at most `2ε` relative before the
//! rounding, and an output element by at most `(2^-8 + 2ε) · max |v|` of its row's visible
//! values (plus f32 rounding). The log-sum-exp moves by at most `ε` (plus the f32 rounding of
//! every path); the weights, recomputed from the saved offset and sum on the AVX-512 path, by the
//! same relative `ε`. For f32 inputs the fused step takes a degree-5 polynomial (2e-7) on
//! `scale·s − m` formed with one rounding, and nothing rounds to bf16: the weights split
//! exactly into three parts ([`store_parts`]).
//!
//! The buffers the tiles read and write start on 64-byte lines ([`AmxScratch`]).
//!
//! A head whose values hold NaN or ∞ takes the AVX-512 path instead: the tile product would
//! turn a hidden key's `0 · NaN` into NaN in rows that never see it. So does an f32 head whose
//! scores could exceed [`F32_SCORE_BOUND`], or with fewer than [`AMX_F32_MIN_ROWS`] query rows.

use std::cell::Cell;
use std::mem::MaybeUninit;

use half::bf16;

use super::plan::{BlockOut, Plan, Src, ValueScale, advance};
use crate::cpu::Isa;
use crate::cpu::aligned::Aligned;
use crate::cpu::amx::{self, BLOCK, PackedB, Products, Tiles};
use crate::mask::key_range;

#[cfg(target_arch = "x86_64")]
use crate::cpu::avx512;
#[cfg(target_arch = "x86_64")]
use crate::cpu::bf16x::{self, TILE, TK};
#[cfg(target_arch = "x86_64")]
use crate::cpu::exp::{EXP2_DEGREE_4, EXP2_DEGREE_5};

/// Keys per score tile (32 rows × 256 keys of f32 scores, 32 KiB; their bf16 weights, 16 KiB):
/// longer blocks mean fewer loads and stores of the accumulator tiles per `P·V` product, and
/// 256 keys take that as far as it goes (shorter blocks are slower, longer ones no faster).
const AMX_BLOCK_KV: usize = 256;

/// Query rows computed together against each key block: 32 keep their scores in the L1
/// cache; larger groups are slower, even though each key and value tile they read from the L2
/// cache then serves more rows.
const GROUP: usize = BLOCK;

/// Bytes of packed keys and values a query block reads in one pass over its groups (a key
/// chunk): 1.5 MiB stays in a 2 MiB L2 cache next to a group's scores, so every group of the
/// block reads the chunk from there rather than from memory.
const KV_CHUNK_BYTES: usize = 3 << 19;

/// Query rows from which f32 heads take the tiles: splitting every key and value in three
/// costs about as much as a few query rows' attention, so a decoding step (one row) does not.
const AMX_F32_MIN_ROWS: usize = 32;

/// Parts per f32 value ([`crate::cpu::bf16x`]).
const PARTS: usize = 3;

/// The largest score bound (`|scale|·max‖q‖·max‖k‖`) of an f32 head on the tiles. The split
/// moves a score by at most `5·2⁻²⁴·|scale|·Σ|q_i·k_i|`, by Cauchy–Schwarz at most the bound
/// times `5·2⁻²⁴` (9.5e-6 at 32), and a weight `e^(s − m)/Σ` by at most twice that relative
/// (its own score one way, the others the other way): 1.9e-5 in the worst case, less than f32
/// summation of the same scores can do in its own worst case (`(d − 1)·2⁻²⁴` times the bound,
/// 1.2e-4 at `head_dim` 64); measured, 1e-7. Heads with larger scores (say near 1e4, where f32
/// rounding alone moves a weight by up to 5e-4) take the AVX-512 path.
pub(crate) const F32_SCORE_BOUND: f32 = 32.0;

/// The largest `‖q‖·‖k‖` of f32 heads on the tiles, and more than their values reach (they are
/// scaled under it, `ValueScale`): below it no part, product or sum can overflow.
const F32_MAGNITUDE_BOUND: f32 = (1u128 << 100) as f32;

/// One key/value head packed for the tiles, with the queries it is read against.
pub(super) enum AmxHead<'a> {
    Bf16 {
        /// All queries of the call, `[batch, n_heads, seq_q, head_dim]`.
        q: &'a [bf16],
        /// `Kᵀ`, the B of `Q·Kᵀ`: `[head_dim, seq_kv]`.
        k: PackedB,
        /// `V`, the B of `P·V`: `[seq_kv, value_dim]`.
        v: PackedB,
    },
    /// Operands in three bf16 parts, in the layouts of [`crate::cpu::bf16x`].
    F32 {
        /// All queries of the call, `[batch, n_heads, seq_q, head_dim]`.
        q: &'a [f32],
        /// `Kᵀ` `[head_dim, seq_kv]` in the B layout.
        k: Aligned<u16>,
        /// `V` `[seq_kv, value_dim]` in the B layout, its rows in the halves order of the
        /// weights ([`bf16x::pack_b_halves`]).
        v: Aligned<u16>,
    },
}

/// A thread's buffers, reused across the blocks, tasks and calls it runs ([`with_amx_scratch`]);
/// rows are padded to whole 32-row tile blocks, `head_dim` and `value_dim` to 32 columns (with
/// zeros).
///
/// Each starts on a cache line ([`Aligned`]): tile rows are 64 bytes, and one that starts off
/// a line touches two per load and store, which makes every `TILELOADD` and `TILESTORED` of
/// it much slower.
#[derive(Default)]
pub(super) struct AmxScratch {
    /// Query rows, `[rows, head_dim]`.
    q: Aligned<bf16>,
    /// f32 query rows in the A layout of three parts, `[rows, 3·head_dim]`.
    q3: Aligned<u16>,
    /// Scores, then f32 weights: two tiles of `[rows, AMX_BLOCK_KV]`, the current key block's
    /// and the next one's.
    scores: Aligned<f32>,
    /// Weights rounded to bf16, `[rows, AMX_BLOCK_KV]`.
    p: Aligned<bf16>,
    /// Weights in the A layout of three parts, `[rows, 3·AMX_BLOCK_KV]`, each 32 keys in the
    /// halves order of [`store_parts`].
    p3: Aligned<u16>,
    /// The unnormalised output of a query block (every group's), `[rows, value_dim]`.
    acc: Aligned<f32>,
}

thread_local! {
    /// This thread's [`AmxScratch`], kept between tasks and calls (a few hundred KiB).
    static SCRATCH: Cell<AmxScratch> = Cell::new(AmxScratch::default());
    /// The buffers of this thread's last f32 head ([`AmxHead::F32`]'s keys and values), kept
    /// when no larger than [`RETAINED_HEAD_BUFFER`].
    static HEAD_BUFFERS: Cell<[Aligned<u16>; 2]> = Cell::new(Default::default());
}

/// Bytes up to which a thread keeps an f32 head's packed keys or values for the next head:
/// 1 MiB holds `seq_kv · head_dim` up to 170 Ki values (2048 keys at 64, 1024 at 128), so a
/// thread holds at most 2 MiB of them between calls. Fresh buffers cost a zero fill and a page
/// fault per 4 KiB, which short heads feel most; longer heads amortise them.
const RETAINED_HEAD_BUFFER: usize = 1 << 20;

/// Runs `f` on this thread's [`AmxScratch`]. A task that runs inside another (rayon steals
/// work while a task waits) finds the cell empty and starts from fresh buffers.
pub(super) fn with_amx_scratch<R>(f: impl FnOnce(&mut AmxScratch) -> R) -> R {
    let mut scratch = SCRATCH.take();
    let result = f(&mut scratch);
    SCRATCH.set(scratch);
    result
}

/// Query rows per task when a head's keys take more than one chunk: a block reads each chunk
/// from memory once, so longer blocks read them less often.
const CHUNKED_BLOCK_Q: usize = 256;

impl AmxHead<'_> {
    /// Query rows per task for this head (`head_dim`, `value_dim`, `seq_kv`):
    /// [`CHUNKED_BLOCK_Q`] when its keys take more than one chunk, else `rows` (more, smaller
    /// tasks balance the threads better).
    pub(super) fn block_rows(&self, (d, dv, s_n): (usize, usize, usize), rows: usize) -> usize {
        if s_n > chunk_keys(self.parts(), (d, dv)) {
            CHUNKED_BLOCK_Q
        } else {
            rows
        }
    }

    /// bf16 parts per value.
    fn parts(&self) -> usize {
        match self {
            AmxHead::Bf16 { .. } => 1,
            AmxHead::F32 { .. } => PARTS,
        }
    }
}

impl Drop for AmxHead<'_> {
    /// Hands an f32 head's buffers back to this thread when they are small enough to keep.
    fn drop(&mut self) {
        if let AmxHead::F32 { k, v, .. } = self {
            let small = |b: &Aligned<u16>| b.all().len() * 2 <= RETAINED_HEAD_BUFFER;
            if small(k) && small(v) {
                HEAD_BUFFERS.set([std::mem::take(k), std::mem::take(v)]);
            }
        }
    }
}

impl<'a> Plan<'a> {
    /// Whether key/value head `(b, kvh)`, its values' scale `values`, can go on the tiles:
    /// `None` when it takes another path (an ISA other than [`Isa::Amx`], or than
    /// [`Isa::Avx512Bf16`] for bf16 inputs, values that are not
    /// all finite, a few query rows ([`Plan::few_rows`]), f32 inputs with fewer than
    /// [`AMX_F32_MIN_ROWS`] query rows, f32 keys whose
    /// largest norm is not finite: NaN, ∞, or past f32's range), else that norm, which
    /// [`Self::amx_takes`] checks each query head against (0 for bf16 inputs, which need no
    /// bound).
    pub(super) fn amx_key_norm(&self, b: usize, kvh: usize, values: ValueScale) -> Option<f32> {
        let bf16 = matches!(self.src, Src::Bf16 { .. });
        let products = self.isa == Isa::Amx || (bf16 && self.isa == Isa::Avx512Bf16);
        if !products || !values.finite || self.few_rows() {
            return None;
        }
        let (s_n, d) = (self.sh.seq_kv, self.sh.head_dim);
        let head = (b * self.sh.n_kv_heads + kvh) * s_n;
        match self.src {
            Src::Bf16 { .. } => Some(0.0),
            Src::F32 { k, .. } => {
                if self.sh.seq_q < AMX_F32_MIN_ROWS {
                    return None;
                }
                let norm = self.isa.max_norm(&k[head * d..][..s_n * d], d);
                norm.is_finite().then_some(norm)
            }
        }
    }

    /// Whether query head `(b, h)` goes on the tiles, its key/value head having passed
    /// [`Self::amx_key_norm`] with `key_norm`: for f32 inputs, its scores must be bounded by
    /// [`F32_SCORE_BOUND`] and `‖q‖·‖k‖` by [`F32_MAGNITUDE_BOUND`].
    pub(super) fn amx_takes(&self, b: usize, h: usize, key_norm: f32) -> bool {
        match self.src {
            Src::Bf16 { .. } => true,
            Src::F32 { q, .. } => {
                let (l_n, d) = (self.sh.seq_q, self.sh.head_dim);
                let q_head = &q[(b * self.sh.n_heads + h) * l_n * d..][..l_n * d];
                // NaN and ∞ give a NaN or ∞ norm, which fails both bounds.
                let qk = self.isa.max_norm(q_head, d) * key_norm;
                qk < F32_MAGNITUDE_BOUND && self.scale.abs() * qk <= F32_SCORE_BOUND
            }
        }
    }

    /// Packs key/value head `(b, kvh)`, which [`Self::amx_key_norm`] accepted, for the tiles,
    /// its values divided by `2^values.shift` (in a copy first, when they need it); `None`
    /// where this build has no tiles.
    pub(super) fn pack_head_amx(
        &self,
        b: usize,
        kvh: usize,
        values: ValueScale,
    ) -> Option<AmxHead<'a>> {
        let (s_n, d, dv) = (self.sh.seq_kv, self.sh.head_dim, self.sh.value_dim);
        let head = (b * self.sh.n_kv_heads + kvh) * s_n;
        match self.src {
            Src::Bf16 { q, k, v } => {
                let v = values.apply(&v[head * dv..][..s_n * dv], |x, down| {
                    bf16::from_f32(x.to_f32() * down)
                });
                Some(AmxHead::Bf16 {
                    q,
                    k: PackedB::from_transposed(&k[head * d..][..s_n * d], (s_n, d), self.isa),
                    v: PackedB::from_rows(&v, (s_n, dv), self.isa),
                })
            }
            Src::F32 { q, k, v } => {
                let v = values.apply(&v[head * dv..][..s_n * dv], |x, down| x * down);
                let (k, v) = pack_f32_head(&k[head * d..][..s_n * d], &v, (s_n, d, dv))?;
                Some(AmxHead::F32 { q, k, v })
            }
        }
    }

    /// Query rows `i0..i0 + dst.lse.len()` of head `(b, h)` on the tiles, 32 rows at a time
    /// (so a group's scores and weights stay in the L1 cache), one key chunk
    /// ([`KV_CHUNK_BYTES`]) at a time for all the groups (so the chunk stays in the L2 cache).
    /// Writes every value of `dst.out`, multiplied by `up` (`2^shift` of the head's values).
    pub(super) fn forward_block_amx(
        &self,
        (b, h, i0): (usize, usize, usize),
        (head, up): (&AmxHead<'_>, f32),
        dst: BlockOut<'_, MaybeUninit<f32>>,
        s: &mut AmxScratch,
    ) {
        let BlockOut { out, lse, stats } = dst;
        let (n, d, dv, s_n) = (
            lse.len(),
            self.sh.head_dim,
            self.sh.value_dim,
            self.sh.seq_kv,
        );
        let products = Products::for_isa(self.isa)
            .expect("the tiles' ISAs are only available with what they run");
        let AmxScratch {
            q: q_bf16,
            q3,
            scores,
            p,
            p3,
            acc,
        } = s;
        let dv_pad = dv.next_multiple_of(BLOCK);
        let acc = acc.get(n.next_multiple_of(GROUP) * dv_pad);
        let mut groups: Vec<GroupState> = (0..n.div_ceil(GROUP))
            .map(|g| GroupState::new(g * GROUP, (n - g * GROUP).min(GROUP)))
            .collect();
        let chunk = chunk_keys(head.parts(), (d, dv));
        for c0 in (0..s_n).step_by(chunk) {
            for state in &mut groups {
                let acc = &mut acc[state.r0 * dv_pad..][..GROUP * dv_pad];
                let buffers = (&mut *q_bf16, &mut *q3, &mut *scores, &mut *p, &mut *p3);
                self.forward_group_amx(
                    (b, h, i0),
                    head,
                    c0..(c0 + chunk).min(s_n),
                    state,
                    acc,
                    (&products, buffers),
                );
            }
        }
        // `up` is exact: multiplying by it here rounds as the unscaled values would.
        let factor = self.opt.dropout.map_or(1.0, |d| d.scale()) * up;
        for state in &groups {
            for r in 0..state.n {
                let (row, (m, sum)) = (state.r0 + r, (state.m[r], state.sum[r]));
                let out_row = &mut out[row * dv..][..dv];
                if sum == 0.0 {
                    out_row.fill(MaybeUninit::new(0.0));
                    lse[row] = f32::NEG_INFINITY;
                } else {
                    let factor = factor / sum;
                    for (o, &a) in out_row.iter_mut().zip(&acc[row * dv_pad..][..dv]) {
                        o.write(a * factor);
                    }
                    lse[row] = m + sum.ln();
                }
                stats[row] = [m, sum];
            }
        }
    }

    /// The keys of `keys` for one group of query rows (`state`, rows `i0 + state.r0..` of head
    /// `(b, h)`), carrying its running max and sum in `state` and its unnormalised output in
    /// `acc` (`[32, value_dim]`, padded) from chunk to chunk. Packs the rows only when the
    /// group sees some of the keys.
    fn forward_group_amx(
        &self,
        (b, h, i0): (usize, usize, usize),
        head: &AmxHead<'_>,
        keys: std::ops::Range<usize>,
        state: &mut GroupState,
        acc: &mut [f32],
        (products, (q_bf16, q3, scores, p, p3)): (&Products, GroupBuffers<'_>),
    ) {
        let (n, d, dv) = (state.n, self.sh.head_dim, self.sh.value_dim);
        let i0 = i0 + state.r0;
        let dv_pad = dv.next_multiple_of(BLOCK);
        let range = |i| {
            let (lo, hi) = key_range(
                self.opt.causal,
                self.opt.window,
                self.offset,
                i,
                self.sh.seq_kv,
            );
            (lo.max(keys.start), hi.min(keys.end))
        };
        // Visible ranges only move right as `i` grows: the group sees the union of its rows'.
        let ((lo, _), (_, hi)) = (range(i0), range(i0 + n - 1));
        if lo >= hi {
            return;
        }
        let q0 = (b * self.sh.n_heads + h) * self.sh.seq_q + i0;
        let group = GroupOperands::pack(head, q0 * d..(q0 + n) * d, (n, d), (q_bf16, q3));
        let mut weights = WeightsTile::new(&group, n, (p, p3));
        // Two score tiles: the next key block's scores are computed on the tiles while the
        // vector units run the current one's exponentials (module docs: bf16 inputs gain from
        // it, f32 ones do not lose).
        let scores = scores.get(2 * GROUP * AMX_BLOCK_KV);
        let (mut cur, mut next) = scores.split_at_mut(GROUP * AMX_BLOCK_KV);
        // Without extra rules or dropout, each row's visible keys (a range, from the causal and
        // window rules) take the fused step. With extra rules (masks, softcap, ALiBi) but no
        // dropout they take it too, on scores the rules finished first (`Plan::finish_scores`:
        // scaled, the extras applied): its scale is then 1, and a hidden key's −∞ weighs 0.
        let plain = self.plain();
        let finished = self.extras && self.opt.dropout.is_none();
        let (fused, step_scale) = (plain || finished, if finished { 1.0 } else { self.scale });
        let GroupState {
            m, sum, started, ..
        } = state;
        // `S = Q·Kᵀ` for column block `c` (32 keys) of the key block from `j0` into `tile`.
        let score_cols = |c: usize, j0: usize, tile: &mut [f32]| {
            let tile = &mut tile[c * BLOCK..GROUP * AMX_BLOCK_KV];
            group.scores(products, j0 + c * BLOCK, tile);
        };
        // Key blocks cover exactly `lo..hi` from the tile boundary below `lo`: on causal and
        // window masks the group's first and last blocks are no longer than needed. Only the
        // last block is shorter than `AMX_BLOCK_KV`, so each block starts on a tile (chunks
        // start on multiples of `AMX_BLOCK_KV`).
        // The key block at `j0`: `(j0, keys)`, no key past `hi` (none from `hi` on).
        let block_at = |j0: usize| (j0, (hi.max(j0) - j0).min(AMX_BLOCK_KV));
        let mut j0 = lo / BLOCK * BLOCK;
        for c in 0..block_at(j0).1.div_ceil(BLOCK) {
            score_cols(c, j0, cur);
        }
        while j0 < hi {
            let keys = block_at(j0).1;
            let following = block_at(j0 + keys);
            let calls = following.1.div_ceil(BLOCK);
            let mut issued = 0;
            // The max pass of every row that needs one (its first key block) before the
            // exponentials of any: a row's exponentials then never wait on its own max.
            let mut visible = [(0, 0); GROUP];
            let mut raw_max = [None; GROUP];
            if fused {
                for r in 0..n {
                    if finished {
                        let row = &mut cur[r * AMX_BLOCK_KV..][..keys];
                        self.isa.scale(row, self.scale);
                        self.finish_scores((b, h, i0 + r), j0, row);
                    }
                    let (vis_lo, vis_hi) = range(i0 + r);
                    let a = vis_lo.clamp(j0, j0 + keys) - j0;
                    let b = (vis_hi.clamp(j0, j0 + keys) - j0).max(a);
                    visible[r] = (a, b);
                    // A row with a running max takes it as its offset ([`lazy_step`]).
                    if m[r] == f32::NEG_INFINITY {
                        raw_max[r] = Some(row_max(&cur[r * AMX_BLOCK_KV..][a..b]));
                    }
                }
            }
            for r in 0..n {
                // The next block's column blocks, one every `n / calls` rows.
                if issued < calls && r * calls >= issued * n {
                    score_cols(issued, following.0, next);
                    issued += 1;
                }
                let row = &mut cur[r * AMX_BLOCK_KV..][..keys.next_multiple_of(BLOCK)];
                let mut p = weights.row(r, keys);
                let step = fused.then(|| {
                    let state = (&mut m[r], &mut sum[r]);
                    let how = (raw_max[r], step_scale, finished);
                    p.fused_step(row, visible[r], how, state)
                });
                let alpha = step.flatten().unwrap_or_else(|| {
                    let scores = &mut row[..keys];
                    let state = (&mut m[r], &mut sum[r]);
                    let alpha = if finished {
                        self.softmax_step_finished((b, h, i0 + r), j0, scores, state)
                    } else {
                        self.isa.scale(scores, self.scale);
                        self.softmax_step((b, h, i0 + r), j0, scores, state)
                    };
                    p.set(row);
                    alpha
                });
                // Before the group's first product the accumulator holds nothing to rescale.
                if let Some(alpha) = alpha.filter(|_| *started) {
                    self.isa.scale(&mut acc[r * dv_pad..][..dv], alpha);
                }
            }
            for c in issued..calls {
                score_cols(c, following.0, next);
            }
            group.add_pv(products, &weights, (j0, keys), (acc, dv_pad), *started);
            *started = true;
            std::mem::swap(&mut cur, &mut next);
            j0 += keys;
        }
    }
}

/// The scratch a group's pass reuses ([`AmxScratch`]): its query rows (bf16, or f32 in three
/// parts), score tiles, bf16 weights, weights in three parts.
type GroupBuffers<'s> = (
    &'s mut Aligned<bf16>,
    &'s mut Aligned<u16>,
    &'s mut Aligned<f32>,
    &'s mut Aligned<bf16>,
    &'s mut Aligned<u16>,
);

/// Keys per chunk ([`KV_CHUNK_BYTES`]) for keys and values in `parts` bf16 parts: a whole
/// number of key blocks, at least one.
fn chunk_keys(parts: usize, (d, dv): (usize, usize)) -> usize {
    let per_key = parts * 2 * (d.next_multiple_of(BLOCK) + dv.next_multiple_of(BLOCK));
    (KV_CHUNK_BYTES / per_key / AMX_BLOCK_KV).max(1) * AMX_BLOCK_KV
}

/// One group's online-softmax state from key chunk to key chunk.
struct GroupState {
    /// The group's first row in its query block, and its rows (at most 32).
    r0: usize,
    n: usize,
    /// Each row's running max and sum.
    m: [f32; GROUP],
    sum: [f32; GROUP],
    /// Whether the accumulator holds a product yet: it is not zeroed, the first key block's
    /// product overwrites it, and a row with no key block has sum 0 and never reads it.
    started: bool,
}

impl GroupState {
    fn new(r0: usize, n: usize) -> GroupState {
        GroupState {
            r0,
            n,
            m: [f32::NEG_INFINITY; GROUP],
            sum: [0.0; GROUP],
            started: false,
        }
    }
}

/// A group's query rows, packed for the tiles, and the head they multiply.
enum GroupOperands<'g> {
    Bf16 {
        /// `[rows, head_dim]`, padded with zeros to whole tiles.
        q: &'g [bf16],
        k: &'g PackedB,
        v: &'g PackedB,
        head_dim: usize,
        value_dim: usize,
    },
    #[cfg(target_arch = "x86_64")]
    F32 {
        /// `[rows, head_dim]` in the A layout of three parts, rows past the group's zero.
        q: &'g [u16],
        k: &'g [u16],
        v: &'g [u16],
        /// `head_dim` and `seq_kv` padded to whole tiles.
        d_pad: usize,
        s_pad: usize,
    },
}

impl<'g> GroupOperands<'g> {
    /// Packs the `n` query rows at `q` (a range of the call's queries) of `head` into `q_bf16`
    /// or `q3`, padded with zero rows to a whole tile block.
    fn pack(
        head: &'g AmxHead<'_>,
        q: std::ops::Range<usize>,
        (n, d): (usize, usize),
        (q_bf16, q3): (&'g mut Aligned<bf16>, &'g mut Aligned<u16>),
    ) -> GroupOperands<'g> {
        let (rows, d_pad) = (n.next_multiple_of(BLOCK), d.next_multiple_of(BLOCK));
        match head {
            AmxHead::Bf16 { q: all, k, v } => {
                let q_pad = q_bf16.get(rows * d_pad);
                let (q_rows, pad_rows) = q_pad.split_at_mut(n * d_pad);
                pad_rows.fill(bf16::ZERO);
                for (dst, src) in q_rows.chunks_exact_mut(d_pad).zip(all[q].chunks_exact(d)) {
                    dst[..d].copy_from_slice(src);
                    dst[d..].fill(bf16::ZERO);
                }
                GroupOperands::Bf16 {
                    q: q_pad,
                    k,
                    v,
                    head_dim: d,
                    value_dim: v.n(),
                }
            }
            #[cfg(target_arch = "x86_64")]
            AmxHead::F32 { q: all, k, v } => {
                let q_a = q3.get(rows * PARTS * d_pad);
                let (q_rows, pad_rows) = q_a.split_at_mut(n * PARTS * d_pad);
                pad_rows.fill(0);
                // SAFETY: `Isa::Amx` (the only ISA that makes an `AmxHead::F32`) has what
                // `bf16x` needs.
                unsafe { bf16x::pack_a::<PARTS>(&all[q], (n, d, d), q_rows) };
                GroupOperands::F32 {
                    q: q_a,
                    k: k.all(),
                    v: v.all(),
                    d_pad,
                    s_pad: k.all().len() / (PARTS * d_pad),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            AmxHead::F32 { .. } => unreachable!("f32 heads take the tiles only on x86-64"),
        }
    }

    /// Raw scores `q·k` of the group's rows against the 32 keys from `j0` (a multiple of 32;
    /// keys past the last are zeros) into the first 32 columns of `tile` (rows
    /// `AMX_BLOCK_KV` apart).
    fn scores(&self, products: &Products, j0: usize, tile: &mut [f32]) {
        match self {
            GroupOperands::Bf16 { q, k, head_dim, .. } => {
                let d_pad = head_dim.next_multiple_of(BLOCK);
                let k = k.view((0, *head_dim), (j0, (k.n() - j0).min(BLOCK)));
                amx::gemm_blocks(products, q, d_pad, k, tile, AMX_BLOCK_KV, false);
            }
            #[cfg(target_arch = "x86_64")]
            GroupOperands::F32 { q, k, d_pad, .. } => {
                let (chunks, rows) = (d_pad / TK, q.len() / (PARTS * d_pad));
                let ldg = PARTS * chunks * TILE;
                let (a, b) = ((*q, PARTS * d_pad), (&k[j0 / 16 * ldg..], ldg));
                let c = (tile, AMX_BLOCK_KV);
                let dims = (rows, BLOCK, chunks);
                bf16x::gemm::<PARTS>(f32_tiles(products), c, a, b, dims, false);
            }
        }
    }

    /// `acc (+)= P·V` for the key block `(j0, keys)` (`acc` `[rows, value_dim]`, rows `ldc`
    /// apart, padded to whole tiles).
    fn add_pv(
        &self,
        products: &Products,
        weights: &WeightsTile<'_>,
        (j0, keys): (usize, usize),
        (acc, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) {
        match (self, weights) {
            (GroupOperands::Bf16 { v, value_dim, .. }, WeightsTile::Bf16(p)) => {
                let v = v.view((j0, keys), (0, *value_dim));
                amx::gemm_blocks(products, p, AMX_BLOCK_KV, v, acc, ldc, accumulate);
            }
            #[cfg(target_arch = "x86_64")]
            (GroupOperands::F32 { v, s_pad, .. }, WeightsTile::F32(parts)) => {
                let ldg = PARTS * s_pad / TK * TILE;
                let rows = parts.len() / (PARTS * AMX_BLOCK_KV);
                let a = (&parts[..], PARTS * AMX_BLOCK_KV);
                let b = (&v[j0 / TK * PARTS * TILE..], ldg);
                let dims = (rows, ldc, keys.div_ceil(TK));
                bf16x::gemm::<PARTS>(f32_tiles(products), (acc, ldc), a, b, dims, accumulate);
            }
            #[cfg(target_arch = "x86_64")]
            _ => unreachable!("a group's weights take its operands' form"),
        }
    }
}

/// The tiles of an f32 head's products: only [`Isa::Amx`] packs f32 heads ([`AmxHead::F32`]).
#[cfg(target_arch = "x86_64")]
fn f32_tiles(products: &Products) -> &Tiles {
    products
        .tiles()
        .expect("f32 heads take the tiles only on Isa::Amx")
}

/// A group's weights for `P·V`: bf16, `[32, AMX_BLOCK_KV]`, or three parts in the A layout,
/// `[32, 3·AMX_BLOCK_KV]` (split exactly, each 32 keys in the halves order, see
/// [`store_parts`]). Rows past the group's are zero.
enum WeightsTile<'g> {
    Bf16(&'g mut [bf16]),
    #[cfg(target_arch = "x86_64")]
    F32(&'g mut [u16]),
}

impl<'g> WeightsTile<'g> {
    /// The weights of a group of `n` rows multiplied by `group`.
    fn new(
        group: &GroupOperands<'_>,
        n: usize,
        (p, p3): (&'g mut Aligned<bf16>, &'g mut Aligned<u16>),
    ) -> WeightsTile<'g> {
        match group {
            GroupOperands::Bf16 { .. } => {
                let p = p.get(GROUP * AMX_BLOCK_KV);
                p[n * AMX_BLOCK_KV..].fill(bf16::ZERO);
                WeightsTile::Bf16(p)
            }
            #[cfg(target_arch = "x86_64")]
            GroupOperands::F32 { .. } => {
                let parts = p3.get(GROUP * PARTS * AMX_BLOCK_KV);
                parts[n * PARTS * AMX_BLOCK_KV..].fill(0);
                WeightsTile::F32(parts)
            }
        }
    }

    /// Row `r`'s weights for a block of `keys` keys; those past `keys`, up to a whole tile,
    /// are 0.
    fn row(&mut self, r: usize, keys: usize) -> WeightsRow<'_> {
        let keys_pad = keys.next_multiple_of(BLOCK);
        match self {
            WeightsTile::Bf16(p) => {
                let p = &mut p[r * AMX_BLOCK_KV..][..keys_pad];
                p[keys..].fill(bf16::ZERO);
                WeightsRow::Bf16(p, keys)
            }
            #[cfg(target_arch = "x86_64")]
            WeightsTile::F32(parts) => {
                let parts = &mut parts[r * PARTS * AMX_BLOCK_KV..][..PARTS * keys_pad];
                WeightsRow::F32(parts, keys)
            }
        }
    }
}

/// One row of a [`WeightsTile`], for a block of `keys` keys.
enum WeightsRow<'r> {
    Bf16(&'r mut [bf16], usize),
    #[cfg(target_arch = "x86_64")]
    F32(&'r mut [u16], usize),
}

impl WeightsRow<'_> {
    /// The fused step (`softmax_step_plain`) over keys `a..b` of the block's raw scores `row`
    /// (`raw_max` their max, when the row has no running max yet), with weights 0 at the
    /// other keys; `hidden` when masks may have hidden keys inside `a..b` (their −∞ gives 0).
    fn fused_step(
        &mut self,
        row: &[f32],
        (a, b): (usize, usize),
        (raw_max, scale, hidden): (Option<f32>, f32, bool),
        state: (&mut f32, &mut f32),
    ) -> Option<Option<f32>> {
        match self {
            WeightsRow::Bf16(p, keys) => {
                p[..a].fill(bf16::ZERO);
                p[b.max(a)..*keys].fill(bf16::ZERO);
                if a < b {
                    let scale = (scale, hidden);
                    softmax_step_plain(&row[a..b], raw_max, scale, state, &mut p[a..b])
                } else {
                    // Nothing visible here: weights 0, the row's state unchanged.
                    Some(None)
                }
            }
            #[cfg(target_arch = "x86_64")]
            WeightsRow::F32(parts, _) => {
                softmax_step_parts(row, (a, b), raw_max, (scale, hidden), state, parts)
            }
        }
    }

    /// The f32 weights of all the block's keys, from the general step, in `row`, which reaches
    /// up to a whole tile (zeroed here past the keys).
    fn set(&mut self, row: &mut [f32]) {
        match self {
            WeightsRow::Bf16(p, keys) => {
                let (row, p) = (&row[..*keys], &mut p[..*keys]);
                // SAFETY: the bf16 products' ISAs have AVX-512F, BW, VL and AVX512_BF16; the
                // lengths agree.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    avx512::round_to_bf16(row, p)
                };
                #[cfg(not(target_arch = "x86_64"))]
                p.iter_mut()
                    .zip(row)
                    .for_each(|(p, &x)| *p = bf16::from_f32(x));
            }
            #[cfg(target_arch = "x86_64")]
            WeightsRow::F32(parts, keys) => {
                row[*keys..].fill(0.0);
                split_weights(row, parts);
            }
        }
    }
}

/// Keys `[seq_kv, head_dim]` and values `[seq_kv, value_dim]` of one head as `Kᵀ` and `V` in
/// the B layout of three parts (`V`'s rows in the weights' halves order,
/// [`bf16x::pack_b_halves`]); `None` off x86-64 (where [`Isa::Amx`] never is).
fn pack_f32_head(
    k: &[f32],
    v: &[f32],
    (s_n, d, dv): (usize, usize, usize),
) -> Option<(Aligned<u16>, Aligned<u16>)> {
    #[cfg(target_arch = "x86_64")]
    {
        let (s_pad, d_pad, dv_pad) = (
            s_n.next_multiple_of(BLOCK),
            d.next_multiple_of(TK),
            dv.next_multiple_of(BLOCK),
        );
        let [mut k_b, mut v_b] = HEAD_BUFFERS.take();
        // SAFETY: `Isa::Amx` (the only caller's ISA) has what `bf16x` needs.
        unsafe { bf16x::pack_bt::<PARTS>(k, (s_n, d, d), k_b.get(PARTS * d_pad * s_pad)) };
        // The weights' order within each 32-key chunk (`store_parts`).
        let v_buf = v_b.get(PARTS * s_pad * dv_pad);
        // SAFETY: as above.
        unsafe { bf16x::pack_b_halves::<PARTS>(v, (s_n, dv, dv), v_buf) };
        Some((k_b, v_b))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (k, v, s_n, d, dv);
        None
    }
}

/// The first pass of the fused step: the largest value of `row` (`−∞` when empty). A NaN may
/// be lost, or returned; the second pass finds it either way.
fn row_max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: this runs only on the bf16 products' ISAs, which have AVX-512F.
        unsafe { avx512::row_max(row) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = row;
        f32::NAN
    }
}

/// The largest `scale·s − m` a block's scores may reach over their row's running max `m` and
/// keep it ([`lazy_step`]): weights up to `e^5.5 ≈ 245` in the unnormalised sums, whose values
/// are scaled so that `seq_kv` such weights cannot overflow them (`ValueScale`).
const MAX_HEADROOM: f32 = 5.5;

/// The end of a fused step with the exponentials `pass(m')`, which writes a block's weights
/// `e^(scale·s − m')` and returns their sum and the raw scores' max: with the max of the raw
/// scores (`raw_max`) taken first, the row's max moves to include it, as in
/// `Plan::softmax_step`. Without it (`None`: the row has a running max `m`) the exponentials
/// take `m` as their offset, in a single pass that finds the max too; only when the block's
/// scores reach past `m` by more than [`MAX_HEADROOM`] does a second pass take the new max
/// (FlashAttention-4's conditional rescaling). So the row's max stays behind its scores by at
/// most that headroom, and the accumulator is rescaled only when it moves. `None` (nothing
/// changed) when a score is NaN or ±∞, or the row met a NaN score before (its max is NaN, and
/// must stay so): those rows take the general step.
fn lazy_step(
    raw_max: Option<f32>,
    scale: f32,
    state: (&mut f32, &mut f32),
    mut pass: impl FnMut(f32) -> (f32, f32),
) -> Option<Option<f32>> {
    let m = *state.0;
    if m.is_nan() {
        return None;
    }
    let (m_new, block_sum) = match raw_max {
        Some(raw) => {
            if !raw.is_finite() {
                return None;
            }
            // `scale > 0`: the max of the scaled scores is the scaled max, rounding included.
            let m_new = m.max(scale * raw);
            (m_new, pass(m_new).0)
        }
        None => {
            let (block_sum, raw) = pass(m);
            if !raw.is_finite() {
                return None;
            }
            if scale * raw - m <= MAX_HEADROOM {
                (m, block_sum)
            } else {
                let m_new = m.max(scale * raw);
                (m_new, pass(m_new).0)
            }
        }
    };
    advance(state, m_new, block_sum)
}

/// The online-softmax step of `Plan::softmax_step` for a row with no rule beyond a positive
/// scale ([`lazy_step`], `raw_max` from [`row_max`]): `P = e^(scale·s − m')` with its sum,
/// stored as bf16 in `p`. `None` (nothing changed) when a score is NaN or ±∞, or where the CPU
/// lacks AVX512DQ (for `VREDUCEPS`): those rows take the general step.
fn softmax_step_plain(
    row: &[f32],
    raw_max: Option<f32>,
    (scale, hidden): (f32, bool),
    state: (&mut f32, &mut f32),
    p: &mut [bf16],
) -> Option<Option<f32>> {
    assert_eq!(row.len(), p.len());
    #[cfg(target_arch = "x86_64")]
    {
        lazy_step(raw_max, scale, state, |m| {
            // SAFETY: this runs only on the bf16 products' ISAs, which have AVX-512F, DQ, BW,
            // VL and AVX512_BF16; the lengths agree (checked above).
            unsafe {
                match hidden {
                    true => exps_plain_avx512::<true>(row, scale, m, p),
                    false => exps_plain_avx512::<false>(row, scale, m, p),
                }
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (row, raw_max, scale, hidden, state, p);
        None
    }
}

/// The pass of [`softmax_step_plain`] with the offset `m`: `p = e^(scale·s − m)` as bf16;
/// returns their sum and the max of `row`. A NaN may be lost by the max (`vmaxps`), not by
/// the sum.
///
/// # Safety
/// AVX-512F, AVX512DQ, AVX512_BF16, AVX512BW and AVX512VL must be available;
/// `p.len() == row.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bf16,avx512bw,avx512vl")]
unsafe fn exps_plain_avx512<const HIDDEN: bool>(
    row: &[f32],
    scale: f32,
    m: f32,
    p: &mut [bf16],
) -> (f32, f32) {
    use std::arch::x86_64::*;
    let n = row.len();
    // Whole 32-value chunks, then a masked tail of up to 32 in two 16-lane halves.
    let whole = n / 32 * 32;
    let tail = n - whole;
    let (lo, hi) = (avx512::lanes(whole, n), avx512::lanes(whole + 16, n));
    let (row, p) = (row.as_ptr(), p.as_mut_ptr());
    // e^(scale·s − m) = 2^t with t = (scale·s − m)·log₂e: `scale·s` rounded first, as `m` is
    // the rounded `scale·max s`, so the largest score's exponent is exactly 0 whatever the
    // scores' size. (With one rounding of `scale·s − m` it was what the product's rounding
    // lost, up to ±512 for scores near 1e10: the largest weight could be 2^-125, not 1. Folding
    // log₂e into both terms rounds each by 2⁻²⁴ of its own size: scores near 1e9 moved t past
    // f32's range.)
    let (c, mc) = (_mm512_set1_ps(scale), _mm512_set1_ps(m));
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let (mut sum0, mut sum1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let (mut max0, mut max1) = (ninf, ninf);
    // SAFETY (both blocks): whole 32-value chunks lie inside `row` and `p`, the tail's lanes
    // are masked to what is left of them.
    for i in (0..whole).step_by(32) {
        unsafe {
            let (s0, s1) = (
                _mm512_loadu_ps(row.add(i)),
                _mm512_loadu_ps(row.add(i + 16)),
            );
            max0 = _mm512_max_ps(max0, s0);
            max1 = _mm512_max_ps(max1, s1);
            let e0 = avx512::exp2::<HIDDEN, 4>(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s0, c), mc), log2e),
                EXP2_DEGREE_4,
            );
            let e1 = avx512::exp2::<HIDDEN, 4>(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s1, c), mc), log2e),
                EXP2_DEGREE_4,
            );
            sum0 = _mm512_add_ps(sum0, e0);
            sum1 = _mm512_add_ps(sum1, e1);
            // Values 0..16 from `e0`, 16..32 from `e1`.
            let w: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(e1, e0));
            _mm512_storeu_si512(p.add(i).cast(), w);
        }
    }
    if tail > 0 {
        unsafe {
            let s0 = _mm512_mask_loadu_ps(ninf, lo, row.add(whole));
            let s1 = _mm512_mask_loadu_ps(ninf, hi, row.add(whole + 16));
            max0 = _mm512_max_ps(max0, s0);
            max1 = _mm512_max_ps(max1, s1);
            let e0 = avx512::exp2::<HIDDEN, 4>(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s0, c), mc), log2e),
                EXP2_DEGREE_4,
            );
            let e1 = avx512::exp2::<HIDDEN, 4>(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps(s1, c), mc), log2e),
                EXP2_DEGREE_4,
            );
            sum0 = _mm512_mask_add_ps(sum0, lo, sum0, e0);
            sum1 = _mm512_mask_add_ps(sum1, hi, sum1, e1);
            let w: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(e1, e0));
            let mask = u32::from(lo) | u32::from(hi) << 16;
            _mm512_mask_storeu_epi16(p.add(whole).cast(), mask, w);
        }
    }
    (
        _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1)),
        _mm512_reduce_max_ps(_mm512_max_ps(max0, max1)),
    )
}

/// The fused step for f32 inputs ([`lazy_step`], `raw_max` from [`row_max`] over keys
/// `a..b`): over keys `a..b` of the block's raw scores `row` (a whole number of 32-key chunks),
/// `P = e^(scale·s − m')` (`scale·s − m'` formed with one rounding, then [`exp2`] of degree 5),
/// stored as three parts in the row's A layout `parts`, in the halves order of
/// [`store_parts`]; the other keys' weights are 0. `None` (nothing changed) as for
/// [`softmax_step_plain`].
#[cfg(target_arch = "x86_64")]
fn softmax_step_parts(
    row: &[f32],
    (a, b): (usize, usize),
    raw_max: Option<f32>,
    (scale, hidden): (f32, bool),
    state: (&mut f32, &mut f32),
    parts: &mut [u16],
) -> Option<Option<f32>> {
    assert!(a <= b && b <= row.len() && row.len().is_multiple_of(32));
    assert_eq!(parts.len(), PARTS * row.len());
    if a == b {
        // Nothing visible here: weights 0, the row's state unchanged.
        parts.fill(0);
        return Some(None);
    }
    let (first, last) = (a / 32 * 32, b.next_multiple_of(32));
    parts[..PARTS * first].fill(0);
    parts[PARTS * last..].fill(0);
    lazy_step(raw_max, scale, state, |m| {
        // SAFETY: this runs only on the bf16 products' ISAs, which have AVX-512F, DQ, BW, VL
        // and AVX512_BF16; the lengths agree (checked above).
        unsafe {
            match hidden {
                true => exps_parts_avx512::<true>(row, (a, b), scale, m, parts),
                false => exps_parts_avx512::<false>(row, (a, b), scale, m, parts),
            }
        }
    })
}

/// The pass of [`softmax_step_parts`] with the offset `m` over the chunks that hold keys
/// `a..b` (`a < b`): their weights `e^(scale·s − m)` (0 at the other keys) in three parts;
/// returns their sum and the max of `row[a..b]`. A NaN may be lost by the max, not by the sum.
///
/// # Safety
/// AVX-512F, AVX512DQ, AVX512_BF16, AVX512BW and AVX512VL must be available; the lengths as
/// [`softmax_step_parts`] checks them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bf16,avx512bw,avx512vl")]
unsafe fn exps_parts_avx512<const HIDDEN: bool>(
    row: &[f32],
    (a, b): (usize, usize),
    scale: f32,
    m: f32,
    parts: &mut [u16],
) -> (f32, f32) {
    use std::arch::x86_64::*;
    let (c, mc) = (_mm512_set1_ps(scale), _mm512_set1_ps(m));
    let log2e = _mm512_set1_ps(std::f32::consts::LOG2_E);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let (mut sum0, mut sum1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut max0, mut max1) = (ninf, ninf);
    // The weights of the 16 keys from `at` (those of `mask`; 0 elsewhere), and those keys'
    // scores (−∞ elsewhere).
    let weights = |at: usize, mask: __mmask16| {
        // SAFETY: the keys of `mask` lie inside `row` (the caller's checks); AVX-512F and
        // AVX512DQ are available.
        unsafe {
            let s = _mm512_mask_loadu_ps(ninf, mask, row.as_ptr().add(at));
            let t = _mm512_mul_ps(_mm512_fmsub_ps(s, c, mc), log2e);
            (
                _mm512_maskz_mov_ps(mask, avx512::exp2::<HIDDEN, 5>(t, EXP2_DEGREE_5)),
                s,
            )
        }
    };
    // The visible lanes of the 16 keys from `j`.
    let lanes = |j: usize| {
        let (from, to) = (a.clamp(j, j + 16) - j, b.clamp(j, j + 16) - j);
        (((1u32 << to) - 1) & !((1u32 << from) - 1)) as __mmask16
    };
    for j in (a / 32 * 32..b.next_multiple_of(32)).step_by(32) {
        // Only the first and last chunks have hidden keys: the others skip the masks' scalar
        // arithmetic, which would take the vector ports' turns.
        let (lo, hi) = if a <= j && j + 32 <= b {
            (!0, !0)
        } else {
            (lanes(j), lanes(j + 16))
        };
        let ((e0, s0), (e1, s1)) = (weights(j, lo), weights(j + 16, hi));
        max0 = _mm512_max_ps(max0, s0);
        max1 = _mm512_max_ps(max1, s1);
        sum0 = _mm512_add_ps(sum0, e0);
        sum1 = _mm512_add_ps(sum1, e1);
        // SAFETY: the three parts of the 32 keys from `j` lie inside `parts` (the caller's
        // checks).
        unsafe { store_parts(e0, e1, parts.as_mut_ptr().add(PARTS * j)) };
    }
    (
        _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1)),
        _mm512_reduce_max_ps(_mm512_max_ps(max0, max1)),
    )
}

/// `row` (f32 weights, a whole number of 32-key chunks) as three parts in its A layout `parts`,
/// in the halves order of [`store_parts`].
#[cfg(target_arch = "x86_64")]
fn split_weights(row: &[f32], parts: &mut [u16]) {
    assert!(row.len().is_multiple_of(32) && parts.len() == PARTS * row.len());
    // SAFETY: this runs only on the AMX path, whose ISA check includes AVX-512F, AVX512_BF16,
    // AVX512BW and AVX512VL; the lengths agree (checked above).
    unsafe { split_weights_avx512(row, parts) }
}

/// # Safety
/// AVX-512F, AVX512_BF16, AVX512BW and AVX512VL must be available; `row.len()` a multiple of
/// 32 and `parts.len() == 3·row.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
unsafe fn split_weights_avx512(row: &[f32], parts: &mut [u16]) {
    use std::arch::x86_64::*;
    for j in (0..row.len()).step_by(32) {
        // SAFETY: the 32 values from `j` lie inside `row`, their parts inside `parts`
        // (the caller's checks).
        unsafe {
            let x = row.as_ptr().add(j);
            let (x0, x1) = (_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16)));
            store_parts(x0, x1, parts.as_mut_ptr().add(PARTS * j));
        }
    }
}

/// Stores 32 weights (`x0`: values 0..16, `x1`: 16..32) as three bf16 parts each at `dst`, one
/// 32-value chunk of the A layout (part `q` at `32q`) in the halves order `0, 16, 1, 17, …`,
/// which the values' layout matches ([`bf16x::pack_b_halves`]): a shift and a blend per part,
/// where the plain order takes a conversion (`VCVTNE2PS2BF16`) per part, which slows the whole
/// fused step.
///
/// The split is by truncation: part 0 is `x` with its low 16 bits cleared, part 1 the same of
/// `x − part 0`, and part 2 `x − part 0 − part 1`, which has at most 8 significant bits (its
/// low 16 bits are zero). So the parts sum to `x` exactly (each subtraction is
/// exact), unlike the nearest-even split of [`crate::cpu::bf16x`]; parts 1 and 2 are below
/// `2⁻⁷|x|` and `2⁻¹⁴|x|`, so the products `bf16x::gemm` drops (`p₁v₂ ≤ 2⁻²³`,
/// `p₂v₁ ≤ 2⁻²²`) and the values' own split (`2⁻²⁴`) move `P·V` by at most 4.2e-7 of
/// `Σ p·|v|`.
///
/// # Safety
/// AVX-512F and AVX512BW must be available; `dst` holds 96 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn store_parts(x0: std::arch::x86_64::__m512, x1: std::arch::x86_64::__m512, dst: *mut u16) {
    use std::arch::x86_64::*;
    let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    let truncate = |x: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), high));
    let (p0, q0) = (truncate(x0), truncate(x1));
    let (r0, s0) = (_mm512_sub_ps(x0, p0), _mm512_sub_ps(x1, q0));
    let (p1, q1) = (truncate(r0), truncate(s0));
    let (p2, q2) = (_mm512_sub_ps(r0, p1), _mm512_sub_ps(s0, q1));
    // Only the high halves are stored: those of `x` and `x − part 0` are parts 0 and 1, and
    // part 2's low half is zero. Lane `2i` takes the high half of `x0`'s lane `i`, lane
    // `2i + 1` that of `x1`'s.
    for (q, (lo, hi)) in [(x0, x1), (r0, s0), (p2, q2)].into_iter().enumerate() {
        let lo = _mm512_srli_epi32::<16>(_mm512_castps_si512(lo));
        let bits = _mm512_mask_mov_epi16(_mm512_castps_si512(hi), 0x5555_5555, lo);
        // SAFETY: the store lies inside `dst` (caller).
        unsafe { _mm512_storeu_si512(dst.add(32 * q).cast(), bits) };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Whether this CPU runs the fused steps (what the tiles' ISA and the dot products' both
    /// have); the tests of their kernels check nothing on other
    /// CPUs, which never run them.
    fn fused_step_runs() -> bool {
        Isa::Avx512Bf16.is_available()
    }

    /// The value of bf16 bits.
    fn value(bits: u16) -> f64 {
        f64::from(f32::from_bits(u32::from(bits) << 16))
    }

    /// The weights of a row of the A layout of three parts (`[keys]`), as the sums of their
    /// parts.
    fn unsplit(parts: &[u16]) -> Vec<f64> {
        (0..parts.len() / PARTS)
            .map(|j| {
                // Keys `i` and `i + 16` of a chunk sit side by side (`store_parts`).
                let at = PARTS * 32 * (j / 32) + 2 * (j % 16) + j % 32 / 16;
                (0..PARTS).map(|q| value(parts[at + 32 * q])).sum()
            })
            .collect()
    }

    #[test]
    fn weights_split_exactly_into_three_parts() {
        if !fused_step_runs() {
            crate::cpu::not_on_this_cpu("the fused steps of the bf16 products");
            return;
        }
        // Weights from 1 down to 2^-38, with full, short and arbitrary mantissas.
        let row: Vec<f32> = (0..96)
            .map(|j| match j % 4 {
                0 => 1.0,
                1 => 1.0 - (j as f32) * 2f32.powi(-24),
                2 => (j as f32 * 0.731).sin().abs() * 2f32.powi(-(j % 40)),
                _ => f32::from_bits(0x3f00_0000 | (j as u32 * 0x2_4925)),
            })
            .collect();
        let mut parts = vec![u16::MAX; PARTS * row.len()];
        split_weights(&row, &mut parts);
        for (j, (&x, got)) in row.iter().zip(unsplit(&parts)).enumerate() {
            assert_eq!(got, f64::from(x), "weight {j}: {x} splits to {got}");
        }
    }

    #[test]
    fn fused_parts_step_matches_f64() {
        if !fused_step_runs() {
            crate::cpu::not_on_this_cpu("the fused steps of the bf16 products");
            return;
        }
        // Visible ranges inside one chunk, across chunks, at the ends, and empty; a running
        // max the block's scores pass by less than the headroom (1.5) and by more (−8), with
        // the block's max or without it (`lazy_step`).
        let cases = [
            (32, (0, 32)),
            (64, (5, 40)),
            (96, (33, 34)),
            (256, (0, 200)),
            (64, (7, 7)),
        ];
        for ((n, (a, b)), (m0, lazy)) in cases.into_iter().flat_map(|case| {
            [(1.5, false), (1.5, true), (-8.0, true)].map(|running| (case, running))
        }) {
            let row: Vec<f32> = (0..n)
                .map(|j| ((j * 37 % 101) as f32 - 50.0) * 0.173)
                .collect();
            let scale = 0.7f32;
            let (mut m, mut sum) = (m0, 2.0f32);
            let mut parts = vec![u16::MAX; PARTS * n];
            let raw = row[a..b].iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
            let state = (&mut m, &mut sum);
            let raw_max = (!lazy).then_some(raw);
            let step = softmax_step_parts(&row, (a, b), raw_max, (scale, false), state, &mut parts);
            let got = unsplit(&parts);
            let name = format!("n = {n}, {a}..{b}, m = {m0}, lazy {lazy}");
            if a == b {
                assert_eq!(step, Some(None), "nothing visible: the state stays");
                assert_eq!((m, sum), (m0, 2.0));
                assert!(got.iter().all(|&w| w == 0.0));
                continue;
            }
            let want_m = if lazy && scale * raw - m0 <= MAX_HEADROOM {
                m0
            } else {
                m0.max(scale * raw)
            };
            assert_eq!(m, want_m, "{name}");
            let e: Vec<f64> = row
                .iter()
                .map(|&s| (f64::from(scale) * f64::from(s) - f64::from(want_m)).exp())
                .collect();
            // The polynomial's 2e-7, plus the f32 rounding of x = scale·s − m' (once: 2^-24 of
            // |x| < 13 here, 7.7e-7 relative after e^x) and of t = x·log₂e (2^-24 of |t| < 19,
            // times ln 2: 7.9e-7).
            let exp_tol = 2e-7 + 7.7e-7 + 7.9e-7;
            for (j, (&w, &want)) in got.iter().zip(&e).enumerate() {
                match (a..b).contains(&j) {
                    true => assert!((w / want - 1.0).abs() <= exp_tol, "{name}, j = {j}"),
                    false => assert_eq!(w, 0.0, "{name}, j = {j}: hidden"),
                }
            }
            let alpha = (f64::from(m0) - f64::from(want_m)).exp();
            let want_sum = 2.0 * alpha + e[a..b].iter().sum::<f64>();
            let sum_tol = exp_tol + (b - a + 8) as f64 * 2f64.powi(-24);
            assert!(
                (f64::from(sum) / want_sum - 1.0).abs() <= sum_tol,
                "{name}: sum"
            );
            match step {
                Some(Some(x)) => assert!((f64::from(x) / alpha - 1.0).abs() <= 1e-6),
                Some(None) => assert_eq!(want_m, m0, "{name}"),
                None => panic!("{name}: the fused step declined finite scores"),
            }
        }
    }

    #[test]
    fn fused_step_matches_f64() {
        if !fused_step_runs() {
            crate::cpu::not_on_this_cpu("the fused steps of the bf16 products");
            return;
        }
        // Lengths around the 32-value chunks and the 16-lane halves of the tail; a running
        // state from an earlier block, sum 2 and a max the block's scores pass by less than
        // the headroom (1.5) or by more (−8), with the block's max or without it
        // (`lazy_step`).
        let lengths = [1, 15, 16, 17, 31, 32, 33, 48, 63, 64, 77, 256];
        for (n, (m0, lazy)) in lengths
            .into_iter()
            .flat_map(|n| [(1.5, false), (1.5, true), (-8.0, true)].map(|running| (n, running)))
        {
            let row: Vec<f32> = (0..n)
                .map(|j| ((j * 37 % 101) as f32 - 50.0) * 0.173)
                .collect();
            let scale = 0.7f32;
            let (mut m, mut sum) = (m0, 2.0f32);
            let mut p = vec![bf16::from_f32(-7.0); n];
            let raw = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
            assert_eq!(row_max(&row), raw, "n = {n}");
            let raw_max = (!lazy).then_some(raw);
            let step =
                softmax_step_plain(&row, raw_max, (scale, false), (&mut m, &mut sum), &mut p);
            let name = format!("n = {n}, m = {m0}, lazy {lazy}");
            let want_m = if lazy && scale * raw - m0 <= MAX_HEADROOM {
                m0
            } else {
                m0.max(scale * raw)
            };
            assert_eq!(m, want_m, "{name}");
            let e: Vec<f64> = row
                .iter()
                .map(|&s| (f64::from(scale) * f64::from(s) - f64::from(want_m)).exp())
                .collect();
            let alpha = (f64::from(m0) - f64::from(want_m)).exp();
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
                "{name}: sum {got_sum} vs {want_sum}"
            );
            match step {
                // The max moved: the accumulator's factor, e^(m − m') in f32.
                Some(Some(a)) => assert!((f64::from(a) / alpha - 1.0).abs() <= 1e-6),
                // The max stayed (this block's scores are all below it, or within the
                // headroom).
                Some(None) => assert_eq!(want_m, m0, "{name}"),
                None => panic!("{name}: the fused step declined finite scores"),
            }
            // Each weight: the exp's error, then bf16's nearest-even rounding (2^-8).
            let p_tol = 2f64.powi(-8) * (1.0 + exp_tol) + exp_tol;
            for (j, (&got, &want)) in p.iter().zip(&e).enumerate() {
                let err = (f64::from(got.to_f32()) / want - 1.0).abs();
                assert!(err <= p_tol, "{name}, j = {j}: {got} vs {want}");
            }
        }
    }
}
