//! The fused attention kernel: blocks of queries against blocks of keys with an online softmax
//! (FlashAttention, Dao et al. 2022, <https://arxiv.org/abs/2205.14135>, Algorithm 1, forward),
//! so the `seq_q × seq_kv` score matrix is never materialised.
//!
//! For a block of `BLOCK_Q` query rows, each block of `BLOCK_KV` keys gives a score tile
//! `S = Q·Kᵀ` (`[rows, keys]`), which gets every rule of [`crate::options`] in the reference's
//! order (scale, softcap, ALiBi, float mask, visibility as `−∞`). Each row keeps its running max
//! `m`, running sum `l` and an accumulator `acc`:
//! `m' = max(m, max S)`, `P = e^(S − m')`, `l' = l·e^(m − m') + ΣP`, `acc' = acc·e^(m − m') + P·V`;
//! at the end `out = acc / l` and `lse = m + ln l` (a row that saw nothing: `out = 0`, `lse = −∞`).
//! (On AMX `m` may stay up to 5.5 below `max S` and move only past that, `amx::lazy_step`:
//! any offset gives the same `out` and `lse`.)
//! `acc` sums unnormalised weights over every key, so a key/value head whose values could
//! overflow that sum is divided by a power of two first, and its output multiplied back
//! (`ValueScale`).
//! Causal and window rules bound the key blocks a query block visits, so hidden blocks cost
//! nothing; the blocks on the boundary are masked in place.
//!
//! Extra memory: per task, its query rows and one score tile, `O(BLOCK_Q · (head_dim +
//! BLOCK_KV))`; per key/value head in flight, its keys transposed for the GEMM (and bf16 values
//! widened), or, on AMX, keys and values in bf16 parts (both when its query heads take
//! different paths), `O(seq_kv · (head_dim + value_dim))`.
//! On AMX each thread keeps its tile buffers (a few hundred KiB) and its last f32 head's parts
//! (up to 2 MiB) for the next call. Weights, when asked for, are recomputed
//! afterwards from each row's saved offset `m` (its max, or on AMX up to 5.5 below it) and sum
//! `l` (`lse = m + ln l`) as `e^(score − m)/l`, only for the rows asked.
//!
//! Work is split over `batch × n_kv_heads`, then each group's query heads × query blocks, on
//! rayon's global pool: a key/value head is packed once for its whole group (grouped-query and
//! multi-query attention).
//!
//! On [`Isa::Amx`], both GEMMs run on AMX tiles in 32-row groups, a key chunk at a time for all
//! the groups of a query block (`amx.rs`): bf16 inputs with the weights rounded to bf16 for `P·V`,
//! f32 inputs in three bf16 parts per value (f32 accuracy); heads that cannot (values holding
//! NaN or ∞, f32 heads with fewer than 32 query rows or scores past the tiles' bound) run the
//! AVX-512 kernels. On [`Isa::Avx512Bf16`] (AVX512_BF16 without AMX) bf16 inputs take the same
//! path with `VDPBF16PS` dot products in place of the tiles, on the same packed operands
//! (`crate::cpu::bf16dot`); f32 inputs run the AVX-512 kernels.
//!
//! A call with a few query rows per head (`FEW_ROWS`: a decoding step) reads each key and
//! value once, so what the other calls do first costs more than the attention itself there:
//! transposing or splitting a whole head's keys, and a pass over its values for their scale.
//! Its scores are taken against the keys as the inputs hold them (`Q·Kᵀ` with `K` row-major,
//! bf16 widened as it is read), on the vector kernels whatever the ISA; and when the call has
//! at least one key/value head per thread, each key/value head takes one pass for all its
//! query heads' rows (`Plan::forward_streamed`), checking its values block by block as it
//! multiplies them (and those of blocks no row visits, as the other passes check every value
//! of a head). `docs/benchmarks.md` has what this gained.

mod amx;
mod plan;

pub(crate) use amx::F32_SCORE_BOUND;
use amx::{AmxHead, with_amx_scratch};
use plan::{BlockOut, Plan, Src, ValueScale, advance, pow2};

use std::mem::MaybeUninit;
use std::sync::OnceLock;

use half::bf16;
use rayon::prelude::*;

use crate::cpu::aligned::{Aligned, zeroed};
use crate::cpu::{Element, FiniteBits, Isa, portable, prefetch_page_starts};
use crate::error::AttnError;
use crate::input::sealed::Sealed;
use crate::input::{AttnElement, AttnInput};
use crate::mask::key_range;
use crate::options::{AttnOptions, WeightsRequest, check_overflow};
use crate::reference::{self, sdpa_reference};
use crate::shape::{AttnOutput, AttnShape, Weights, check_finite};

/// Query rows per task.
const BLOCK_Q: usize = 96;
/// Keys per score tile.
const BLOCK_KV: usize = 128;
/// Query rows from which values not on a cache line are copied onto one for `P·V`.
const ALIGNED_V_MIN_ROWS: usize = 32;
/// How far a row's recomputed weights may sum from 1 before the row is recomputed with its own
/// max and sum (`Plan::weight_rows`).
const WEIGHTS_SUM_TOL: f32 = 1e-4;

/// Scaled dot-product attention: the fast path, on f32 or bf16 inputs.
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - output `out`: `[batch, n_heads, seq_q, value_dim]`, `lse`: `[batch, n_heads, seq_q]`,
///   weights as [`WeightsRequest`] says.
///
/// The fused kernel on the best instruction set of this CPU (or [`AttnOptions::isa`]), in
/// O((seq_q + seq_kv) · head_dim) memory, weights recomputed from the saved log-sum-exp only
/// when asked for.
///
/// bf16 inputs accumulate in f32. On [`Isa::Amx`] both products run on AMX tiles, and on
/// [`Isa::Avx512Bf16`] in AVX512_BF16 dot products, and the weights are rounded to bf16 before
/// `P·V`, so `out` is within about `2^-8 · max |v|` of the f32 call on the widened inputs, `lse`
/// within 3e-6 and the weights within 3e-6 relative (the bounds and their derivation are in
/// `fused/amx.rs`); on the other ISAs, and for calls of at most 6 query rows per head on every
/// ISA, inputs are widened to f32 (exactly) as they are read and the result equals the f32
/// call on the widened inputs up to f32 rounding of the sums.
///
/// # Errors
/// Whatever [`AttnOptions::validate`] rejects (an [`AttnOptions::isa`] this CPU lacks
/// included).
pub fn sdpa<T: AttnElement>(
    input: &AttnInput<'_, T>,
    options: &AttnOptions,
) -> Result<AttnOutput, AttnError> {
    T::sdpa(input, options)
}

impl Sealed for f32 {
    fn check_finite(tensor: &'static str, data: &[f32]) -> Result<(), AttnError> {
        check_finite(tensor, data)
    }

    fn sdpa(input: &AttnInput<'_>, options: &AttnOptions) -> Result<AttnOutput, AttnError> {
        let src = Src::F32 {
            q: input.q,
            k: input.k,
            v: input.v,
        };
        run(src, input.shape, options, || sdpa_reference(input, options))
    }

    fn sdpa_reference(
        input: &AttnInput<'_>,
        options: &AttnOptions,
    ) -> Result<AttnOutput, AttnError> {
        reference::sdpa_f32(input, options)
    }
}

impl Sealed for bf16 {
    fn check_finite(tensor: &'static str, data: &[bf16]) -> Result<(), AttnError> {
        check_finite(tensor, data)
    }

    fn sdpa(input: &AttnInput<'_, bf16>, options: &AttnOptions) -> Result<AttnOutput, AttnError> {
        let src = Src::Bf16 {
            q: input.q,
            k: input.k,
            v: input.v,
        };
        run(src, input.shape, options, || sdpa_reference(input, options))
    }

    /// The twin on the inputs widened to f32 (exactly).
    fn sdpa_reference(
        input: &AttnInput<'_, bf16>,
        options: &AttnOptions,
    ) -> Result<AttnOutput, AttnError> {
        input
            .shape
            .check_lens(input.q.len(), input.k.len(), input.v.len())?;
        let widen = |x: &[bf16]| x.iter().map(|v| v.to_f32()).collect::<Vec<f32>>();
        let (q, k, v) = (widen(input.q), widen(input.k), widen(input.v));
        reference::sdpa_f32(
            &AttnInput::allowing_non_finite(&q, &k, &v, input.shape)?,
            options,
        )
    }
}

/// Validates, then runs the fused kernels; degenerate shapes (`head_dim` or `value_dim` 0),
/// where there is nothing to fuse, go to `degenerate`.
fn run(
    src: Src<'_>,
    shape: AttnShape,
    options: &AttnOptions,
    degenerate: impl FnOnce() -> Result<AttnOutput, AttnError>,
) -> Result<AttnOutput, AttnError> {
    // The input's fields are public: one built without its constructor may disagree with its
    // shape.
    let (q, k, v) = match src {
        Src::F32 { q, k, v } => (q.len(), k.len(), v.len()),
        Src::Bf16 { q, k, v } => (q.len(), k.len(), v.len()),
    };
    shape.check_lens(q, k, v)?;
    options.validate(&shape)?;
    let isa = options.chosen_isa();
    if shape.head_dim == 0 || shape.value_dim == 0 {
        return degenerate();
    }
    let plan = Plan {
        isa,
        src,
        sh: shape,
        opt: options,
        scale: options.scale_for(&shape),
        offset: options.offset(shape.seq_q, shape.seq_kv),
        extras: options.softcap.is_some()
            || options.alibi.is_some()
            || options.float_mask.is_some()
            || options.bool_mask.is_some()
            || options.key_padding.is_some(),
    };
    let forward = plan.forward();
    match src {
        Src::F32 { q, k, v } => check_overflow(&forward.lse, &shape, options, [q, k, v])?,
        Src::Bf16 { q, k, v } => check_overflow(&forward.lse, &shape, options, [q, k, v])?,
    }
    let weights = match forward.row_weights {
        Some(data) => {
            let WeightsRequest::Rows(rows) = &options.weights else {
                unreachable!("the forward pass computes rows' weights only when asked")
            };
            Some(Weights::rows(&shape, rows.clone(), data))
        }
        None => plan.weights(&forward.stats),
    };
    Ok(AttnOutput {
        out: forward.out,
        lse: forward.lse,
        weights,
    })
}

/// What the forward pass returns: `out` `[batch, n_heads, seq_q, value_dim]`, `lse`
/// `[batch, n_heads, seq_q]`, each row's final offset and sum (`[m, l]`, same order as `lse`)
/// for the weights, and the weights of the rows asked for when there are few of them
/// (`[batch, n_heads, rows, seq_kv]`).
struct Forward {
    out: Vec<f32>,
    lse: Vec<f32>,
    stats: Vec<[f32; 2]>,
    row_weights: Option<Vec<f32>>,
}

/// Per-task buffers, reused across the blocks of a task.
#[derive(Default)]
struct Scratch {
    /// Query rows as f32, `[rows, head_dim]`.
    q: Vec<f32>,
    /// Scores, then probabilities: `[rows, keys]` (the `C`, then the `A`, of the GEMMs).
    tile: Aligned,
    /// A block of rows' weights before they are added to the average of the heads.
    weights: Vec<f32>,
}

/// `out += P·V` (`P` `[rows, keys]`, `V` `[keys, value_dim]`, `out` `[rows, value_dim]`),
/// skipping zero weights, for values that hold NaN or ∞: the GEMM would turn a hidden key's
/// `0 · NaN` into NaN in rows that never see it. Same order and rounding as the GEMM of `isa`
/// (fused multiply-add on AVX2 and AVX-512, multiply then add in the portable kernel), so rows that do
/// not see a non-finite value match a clean run bit for bit.
fn accumulate_skipping_zeros(
    isa: Isa,
    (keys, value_dim): (usize, usize),
    p: &[f32],
    v: &[f32],
    out: &mut [f32],
) {
    for (p_row, out_row) in p.chunks_exact(keys).zip(out.chunks_exact_mut(value_dim)) {
        for (&w, v_row) in p_row.iter().zip(v.chunks_exact(value_dim)) {
            if w == 0.0 {
                continue;
            }
            for (o, &x) in out_row.iter_mut().zip(v_row) {
                *o = match isa {
                    Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 | Isa::Amx => w.mul_add(x, *o),
                    Isa::Portable => *o + w * x,
                };
            }
        }
    }
}

/// A key/value head as the query heads of its group find it: its values' scale, whether the
/// tiles can take it ([`Plan::amx_key_norm`]), and its operands, packed by the first query head
/// that needs them for the tiles (`amx`), for the vector kernels (`vector`), or for the
/// weights of a few rows after the tiles (`keys`, unless `vector` holds them). The others
/// wait for it, so what packs them must not run rayon work: a waiting thread could be the one
/// to steal it.
struct KvHead<'a> {
    values: ValueScale,
    key_norm: Option<f32>,
    amx: OnceLock<Option<AmxHead<'a>>>,
    vector: OnceLock<Head<'a>>,
    keys: OnceLock<Keys>,
}

/// One key/value head, packed once for all the query blocks that read it.
struct Head<'a> {
    k: HeadKeys<'a>,
    /// Values as f32 (divided by `2^scale.shift`), `[seq_kv, value_dim]`.
    v: Values<'a>,
    scale: ValueScale,
}

/// A head's keys as its scores read them.
enum HeadKeys<'a> {
    /// Transposed block by block, the `B` of `Q·Kᵀ`.
    Packed(Keys),
    /// As the inputs hold them, `[seq_kv, head_dim]`, for a few query rows
    /// ([`Plan::few_rows`]).
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

/// A head's values as the `B` of `P·V`: borrowed from f32 inputs (that start on a cache line,
/// when many rows read them), copied onto one otherwise (divided by their scale, or widened
/// from bf16).
enum Values<'a> {
    Borrowed(&'a [f32]),
    Copied(Aligned),
}

impl Values<'_> {
    /// Values `j0..j0 + keys`, `[keys, value_dim]`.
    fn block(&self, (j0, keys): (usize, usize), value_dim: usize) -> &[f32] {
        let end = (j0 + keys) * value_dim;
        let v = match self {
            Values::Borrowed(v) => &v[..end],
            Values::Copied(v) => v.view(end),
        };
        &v[j0 * value_dim..]
    }
}

/// A head's keys transposed block by block, the `B` of `Q·Kᵀ`: block `jb` (keys
/// `jb·BLOCK_KV..`, `keys` of them) is `[head_dim, keys]` at `jb·BLOCK_KV·head_dim`.
struct Keys(Aligned);

impl Keys {
    /// Keys `j0..j0 + keys` of the packed `Kᵀ`, `[head_dim, keys]`.
    fn block(&self, (jb, keys): (usize, usize), head_dim: usize) -> &[f32] {
        &self.0.view((jb * BLOCK_KV + keys) * head_dim)[jb * BLOCK_KV * head_dim..]
    }
}

impl<'a> Plan<'a> {
    /// Copies query rows `rows` of head `(b, h)` into `s.q`, as f32.
    fn pack_q(&self, b: usize, h: usize, rows: &[usize], s: &mut Scratch) {
        let d = self.sh.head_dim;
        let head = (b * self.sh.n_heads + h) * self.sh.seq_q;
        s.q.clear();
        for &i in rows {
            let at = (head + i) * d;
            match self.src {
                Src::F32 { q, .. } => s.q.extend_from_slice(&q[at..][..d]),
                Src::Bf16 { q, .. } => s.q.extend(q[at..][..d].iter().map(|&x| x.to_f32())),
            }
        }
    }

    /// Packs the keys of key/value head `(b, kvh)` for [`Self::scores`]; bf16 inputs are
    /// widened to f32 here (exactly), once per head.
    fn pack_keys(&self, b: usize, kvh: usize) -> Keys {
        let (s_n, d) = (self.sh.seq_kv, self.sh.head_dim);
        let head = (b * self.sh.n_kv_heads + kvh) * s_n;
        let mut packed = Aligned::default();
        let k_t = packed.get(s_n * d);
        match self.src {
            Src::F32 { k, .. } => {
                let k = &k[head * d..][..s_n * d];
                self.isa.transpose_blocks(k, (d, BLOCK_KV), k_t)
            }
            Src::Bf16 { k, .. } => {
                let k = &k[head * d..][..s_n * d];
                portable::transpose_blocks(k, (d, BLOCK_KV), k_t, bf16::to_f32)
            }
        }
        Keys(packed)
    }

    /// The scale of key/value head `(b, kvh)`'s values.
    fn value_scale(&self, b: usize, kvh: usize) -> ValueScale {
        let (s_n, dv) = (self.sh.seq_kv, self.sh.value_dim);
        let head = (b * self.sh.n_kv_heads + kvh) * s_n * dv..;
        match self.src {
            Src::F32 { v, .. } => ValueScale::of(&v[head][..s_n * dv], s_n, |x| x),
            Src::Bf16 { v, .. } => ValueScale::of(&v[head][..s_n * dv], s_n, bf16::from_f32),
        }
    }

    /// Packs key/value head `(b, kvh)`, its values' scale `scale`, for [`Self::forward_block`];
    /// bf16 inputs are widened to f32 here (exactly), once per head.
    fn pack_head(&self, b: usize, kvh: usize, scale: ValueScale) -> Head<'a> {
        let (s_n, d, dv) = (self.sh.seq_kv, self.sh.head_dim, self.sh.value_dim);
        let head = (b * self.sh.n_kv_heads + kvh) * s_n;
        let mut copied = Aligned::default();
        let down = scale.down();
        let v = match self.src {
            Src::F32 { v, .. } => {
                let v = &v[head * dv..][..s_n * dv];
                // A copy pays off only when many query rows read the values again: a decoding
                // step's single row reads them once.
                let aligned = v.as_ptr().align_offset(64) == 0;
                if scale.shift == 0 && (aligned || self.sh.seq_q < ALIGNED_V_MIN_ROWS) {
                    Values::Borrowed(v)
                } else {
                    for (x, &y) in copied.get(s_n * dv).iter_mut().zip(v) {
                        *x = y * down;
                    }
                    Values::Copied(copied)
                }
            }
            Src::Bf16 { v, .. } => {
                let widened = copied.get(s_n * dv);
                for (x, y) in widened.iter_mut().zip(&v[head * dv..][..s_n * dv]) {
                    *x = y.to_f32() * down;
                }
                Values::Copied(copied)
            }
        };
        let k = match self.src {
            _ if !self.few_rows() => HeadKeys::Packed(self.pack_keys(b, kvh)),
            Src::F32 { k, .. } => HeadKeys::F32(&k[head * d..][..s_n * d]),
            Src::Bf16 { k, .. } => HeadKeys::Bf16(&k[head * d..][..s_n * d]),
        };
        Head { k, v, scale }
    }

    /// Scores `scale·(q·k)` of the packed query rows against key block `jb` (`keys` keys) of
    /// `head`, into `s.tile` as `[rows, keys]`. The scale comes after the product, as in the
    /// reference and on the tiles: `(scale·q)·k` would save this pass, but overflows where
    /// `scale·q` does (a scale of 1e30 on queries of 1e10) and loses bits where it underflows.
    fn scores(&self, k: &Keys, rows: usize, keys: (usize, usize), s: &mut Scratch) {
        self.raw_scores(k, rows, keys, s);
        if self.scale != 1.0 {
            self.isa.scale(s.tile.get(rows * keys.1), self.scale);
        }
    }

    /// [`Self::scores`] before the scale, `q·k`, which [`Self::block_steps`] takes.
    fn raw_scores(&self, k: &Keys, rows: usize, (jb, keys): (usize, usize), s: &mut Scratch) {
        let d = self.sh.head_dim;
        let kt = k.block((jb, keys), d);
        let tile = s.tile.get(rows * keys);
        self.isa
            .gemm_f32((rows, keys, d), &s.q, d, kt, keys, tile, keys, false);
    }

    /// [`Self::raw_scores`] of the query rows `q` (`[rows, head_dim]`) against a key block as
    /// the inputs hold it, `k` (`[keys, head_dim]`, [`Self::few_rows`]), into `tile`.
    fn raw_scores_against_rows<T: Element>(
        &self,
        q: &[f32],
        k: &[T],
        (rows, keys): (usize, usize),
        tile: &mut [f32],
    ) {
        let d = self.sh.head_dim;
        self.isa.gemm_abt((rows, keys, d), q, d, k, d, tile, keys);
    }

    /// The forward pass ([`Forward`]).
    fn forward(&self) -> Forward {
        let sh = self.sh;
        let heads = sh.batch * sh.n_heads;
        let (l, dv) = (sh.seq_q, sh.value_dim);
        // Written block by block by the tasks that compute the blocks (the AMX path), or zeroed
        // by them (`zeroed`) just before they accumulate into it, in parallel rather than all at
        // once by this thread beforehand.
        let mut out: Vec<f32> = Vec::with_capacity(heads * l * dv);
        let mut lse = vec![f32::NEG_INFINITY; heads * l];
        let mut stats = vec![[f32::NEG_INFINITY, 0.0]; heads * l];
        // A few rows' weights are computed head by head right after the head, while its keys
        // are still in the caches.
        let rows = match &self.opt.weights {
            WeightsRequest::Rows(rows) if rows.len() <= BLOCK_Q => Some(&rows[..]),
            _ => None,
        };
        // Nothing to compute (and no zero-sized chunks for the tasks below).
        if l == 0 || heads == 0 {
            let row_weights = rows.map(|_| Vec::new());
            return Forward {
                out,
                lse,
                stats,
                row_weights,
            };
        }
        // One task per key/value head: the query heads of its group share what it packs (for
        // the tiles, and for the vector kernels when some query head does not take the tiles).
        let group = sh.group_size();
        // A few query rows per head (a decoding step) read each key and value once: a pass of
        // their own per key/value head, when there are enough of them for the threads.
        let streams = self.few_rows() && sh.batch * sh.n_kv_heads >= rayon::current_num_threads();
        let per_group: Vec<Vec<Vec<f32>>> = out.spare_capacity_mut()[..heads * l * dv]
            .par_chunks_mut(group * l * dv)
            .zip(lse.par_chunks_mut(group * l))
            .zip(stats.par_chunks_mut(group * l))
            .enumerate()
            .map(|(bkv, ((out, lse), stats))| {
                let (b, kvh) = (bkv / sh.n_kv_heads, bkv % sh.n_kv_heads);
                if streams {
                    let dst = BlockOut {
                        out: &mut *out,
                        lse: &mut *lse,
                        stats: &mut *stats,
                    };
                    if self.forward_streamed((b, kvh), dst, &mut Scratch::default()) {
                        let Some(rows) = rows else {
                            return Vec::new();
                        };
                        let keys = self.pack_keys(b, kvh);
                        let heads = stats.chunks_exact(l).enumerate();
                        return heads
                            .map(|(g, stats)| {
                                self.few_rows_weights((b, kvh * group + g), &keys, rows, stats)
                            })
                            .collect();
                    }
                }
                let values = self.value_scale(b, kvh);
                let kv = KvHead {
                    values,
                    key_norm: self.amx_key_norm(b, kvh, values),
                    amx: OnceLock::new(),
                    vector: OnceLock::new(),
                    keys: OnceLock::new(),
                };
                out.par_chunks_mut(l * dv)
                    .zip(lse.par_chunks_mut(l))
                    .zip(stats.par_chunks_mut(l))
                    .enumerate()
                    .map(|(g, ((out, lse), stats))| {
                        let dst = BlockOut { out, lse, stats };
                        self.forward_head((b, kvh * group + g), &kv, dst, rows)
                    })
                    .collect()
            })
            .collect();
        // SAFETY: the blocks cover all `heads·l·dv` values, and each block's task wrote each of
        // its values (`forward_block_amx`, or `zeroed`).
        unsafe { out.set_len(heads * l * dv) };
        let row_weights =
            rows.map(|_| per_group.into_iter().flatten().collect::<Vec<_>>().concat());
        Forward {
            out,
            lse,
            stats,
            row_weights,
        }
    }

    /// Query head `(b, h)` (its blocks in parallel) into `dst`, reading its key/value head
    /// `kv`: on the tiles when they take it, else on the vector kernels. Returns the weights of
    /// `rows` (empty when none are asked for).
    fn forward_head(
        &self,
        (b, h): (usize, usize),
        kv: &KvHead<'a>,
        dst: BlockOut<'_, MaybeUninit<f32>>,
        rows: Option<&[usize]>,
    ) -> Vec<f32> {
        let sh = self.sh;
        let (kvh, dv) = (sh.kv_head(h), sh.value_dim);
        let BlockOut { out, lse, stats } = dst;
        let amx = kv
            .key_norm
            .filter(|&norm| self.amx_takes(b, h, norm))
            .and_then(|_| {
                let pack = || self.pack_head_amx(b, kvh, kv.values);
                kv.amx.get_or_init(pack).as_ref()
            });
        let dims = (sh.head_dim, dv, sh.seq_kv);
        let block = amx.map_or(BLOCK_Q, |head| head.block_rows(dims, BLOCK_Q));
        let up = kv.values.up();
        let blocks = out
            .par_chunks_mut(block * dv)
            .zip(lse.par_chunks_mut(block))
            .zip(stats.par_chunks_mut(block))
            .enumerate();
        let keys = if let Some(head) = amx {
            blocks.for_each(|(qb, ((out, lse), stats))| {
                let dst = BlockOut { out, lse, stats };
                let rows = (b, h, qb * block);
                with_amx_scratch(|s| self.forward_block_amx(rows, (head, up), dst, s));
            });
            rows.map(|_| match kv.vector.get().map(|vector| &vector.k) {
                Some(HeadKeys::Packed(k)) => k,
                _ => kv.keys.get_or_init(|| self.pack_keys(b, kvh)),
            })
        } else {
            let head = kv.vector.get_or_init(|| self.pack_head(b, kvh, kv.values));
            blocks.for_each_init(Scratch::default, |s, (qb, ((out, lse), stats))| {
                let dst = BlockOut {
                    out: zeroed(out),
                    lse,
                    stats,
                };
                self.forward_block((b, h, qb * BLOCK_Q), head, dst, s);
            });
            rows.map(|_| match &head.k {
                HeadKeys::Packed(k) => k,
                _ => kv.keys.get_or_init(|| self.pack_keys(b, kvh)),
            })
        };
        let (Some(rows), Some(keys)) = (rows, keys) else {
            return Vec::new();
        };
        self.few_rows_weights((b, h), keys, rows, stats)
    }

    /// The weights of `rows` of query head `(b, h)` (`[rows, seq_kv]`), from its keys and its
    /// rows' final `[max, sum]` (`stats`), right after its forward pass.
    fn few_rows_weights(
        &self,
        (b, h): (usize, usize),
        keys: &Keys,
        rows: &[usize],
        stats: &[[f32; 2]],
    ) -> Vec<f32> {
        let mut data = vec![0.0f32; rows.len() * self.sh.seq_kv];
        let s = &mut Scratch::default();
        self.weight_rows((b, h), keys, rows, stats, &mut data, None, s);
        data
    }

    /// Query rows `i0..i0 + dst.lse.len()` of head `(b, h)`: `dst.out` (zeroed) serves as the
    /// accumulator.
    fn forward_block(
        &self,
        (b, h, i0): (usize, usize, usize),
        head: &Head<'_>,
        dst: BlockOut<'_>,
        s: &mut Scratch,
    ) {
        let BlockOut { out, lse, stats } = dst;
        let (n, d, dv, s_n) = (
            lse.len(),
            self.sh.head_dim,
            self.sh.value_dim,
            self.sh.seq_kv,
        );
        let rows: Vec<usize> = (i0..i0 + n).collect();
        self.pack_q(b, h, &rows, s);
        // Visible ranges only move right as `i` grows: the block sees the union of its rows'.
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
            let at = j0 * d..(j0 + keys) * d;
            match head.k {
                HeadKeys::Packed(ref k) => self.raw_scores(k, n, (jb, keys), s),
                HeadKeys::F32(k) => {
                    self.raw_scores_against_rows(&s.q, &k[at], (n, keys), s.tile.get(n * keys))
                }
                HeadKeys::Bf16(k) => {
                    self.raw_scores_against_rows(&s.q, &k[at], (n, keys), s.tile.get(n * keys))
                }
            }
            let tile = s.tile.get(n * keys);
            let rows = (b, |r| (h, i0 + r));
            self.block_steps(rows, (j0, keys), tile, (&mut m, &mut sum), out);
            let v = head.v.block((j0, keys), dv);
            if head.scale.finite {
                self.isa
                    .gemm_f32((n, dv, keys), tile, keys, v, dv, out, dv, true);
            } else {
                accumulate_skipping_zeros(self.isa, (keys, dv), tile, v, out);
            }
        }
        // `2^shift` is exact: multiplying by it here rounds as the unscaled values would.
        let factor = self.opt.dropout.map_or(1.0, |d| d.scale()) * head.scale.up();
        self.finish_rows((&m, &sum), factor, BlockOut { out, lse, stats });
    }

    /// The online softmax's step for each row of `tile` (`[rows, keys]`, their products `q·k`
    /// against keys `j0..`, before the scale; row `r` is query `at(r)`, `(head, row)`, of batch
    /// `b`), its running max and sum in `state` and its accumulator row of `out` rescaled when
    /// its max moved: [`Self::plain_step`] where it takes the row, else the scale and
    /// [`Self::softmax_step`].
    fn block_steps(
        &self,
        (b, at): (usize, impl Fn(usize) -> (usize, usize)),
        (j0, keys): (usize, usize),
        tile: &mut [f32],
        (m, sum): (&mut [f32], &mut [f32]),
        out: &mut [f32],
    ) {
        let dv = self.sh.value_dim;
        let plain = self.plain();
        for (r, row) in tile.chunks_exact_mut(keys).enumerate() {
            let (h, i) = at(r);
            let state = (&mut m[r], &mut sum[r]);
            let step = match plain {
                true => self.plain_step(i, j0, row, state),
                false => None,
            };
            let alpha = step.unwrap_or_else(|| {
                if self.scale != 1.0 {
                    self.isa.scale(row, self.scale);
                }
                self.softmax_step((b, h, i), j0, row, (&mut m[r], &mut sum[r]))
            });
            if let Some(alpha) = alpha {
                self.isa.scale(&mut out[r * dv..][..dv], alpha);
            }
        }
    }

    /// The online softmax's step for query `i` over keys `j0..` of a [`Self::plain`] call, from
    /// the products `q·k` in `row`: the max of the row's visible products times the scale is
    /// that of its scores (rounding is monotonic), and one pass takes `P = e^(scale·s − m')`
    /// with the scale, rounded as the general step rounds it ([`Isa::exp_scaled_sum`]); the
    /// keys outside the range weigh 0. Returns what [`Self::softmax_step`] does, or `None`,
    /// leaving `row` as it was, when a visible score is not finite or the row's max is NaN:
    /// the general step takes those.
    fn plain_step(
        &self,
        i: usize,
        j0: usize,
        row: &mut [f32],
        (m, sum): (&mut f32, &mut f32),
    ) -> Option<Option<f32>> {
        if m.is_nan() {
            return None;
        }
        let (causal, window) = (self.opt.causal, self.opt.window);
        let (lo, hi) = key_range(causal, window, self.offset, i, self.sh.seq_kv);
        let end = j0 + row.len();
        let a = lo.clamp(j0, end) - j0;
        let b = (hi.clamp(j0, end) - j0).max(a);
        if a == b {
            // Nothing visible here: weights 0, the row's state unchanged.
            row.fill(0.0);
            return Some(None);
        }
        let top = self.scale * self.isa.max(&row[a..b]);
        if !top.is_finite() {
            return None;
        }
        let m_new = m.max(top);
        let block_sum = self.isa.exp_scaled_sum(&mut row[a..b], self.scale, m_new);
        row[..a].fill(0.0);
        row[b..].fill(0.0);
        Some(advance((m, sum), m_new, block_sum).flatten())
    }

    /// The end of a block of query rows: each row of `dst.out` divided by its sum (`state`) and
    /// multiplied by `factor`, its log-sum-exp and final `[max, sum]`; a row that saw nothing
    /// gets 0 and −∞.
    fn finish_rows(&self, (m, sum): (&[f32], &[f32]), factor: f32, dst: BlockOut<'_>) {
        let BlockOut { out, lse, stats } = dst;
        for (r, out_row) in out.chunks_exact_mut(self.sh.value_dim).enumerate() {
            if sum[r] == 0.0 {
                out_row.fill(0.0);
                lse[r] = f32::NEG_INFINITY;
            } else {
                self.isa.scale(out_row, factor / sum[r]);
                lse[r] = m[r] + sum[r].ln();
            }
            stats[r] = [m[r], sum[r]];
        }
    }

    /// All the query rows of key/value head `(b, kvh)`'s query heads as one block (`dst`: the
    /// heads' rows one after another, as the inputs and outputs hold them), for a few rows per
    /// head ([`Self::few_rows`]): each key and value block is read from the inputs as they
    /// hold it (bf16 widened as it is read), so the keys and values are read from memory once
    /// each, where [`Self::value_scale`] takes a pass over the values first. Here the values
    /// are checked as they are multiplied (those of key blocks no row visits, first): at the
    /// first block with a value that is not finite or large enough to need [`ValueScale`]'s
    /// shift this returns `false`, and the other passes take the head (writing all of `dst`
    /// again). Otherwise the result is theirs, bit for bit: the same scores, steps and
    /// products, row by row.
    fn forward_streamed(
        &self,
        (b, kvh): (usize, usize),
        dst: BlockOut<'_, MaybeUninit<f32>>,
        s: &mut Scratch,
    ) -> bool {
        match self.src {
            Src::F32 { k, v, .. } => self.stream((b, kvh), (k, v), |x| x, dst, s),
            Src::Bf16 { k, v, .. } => self.stream((b, kvh), (k, v), bf16::from_f32, dst, s),
        }
    }

    /// [`Self::forward_streamed`] on the inputs' keys and values `k`, `v` (their type from f32
    /// by `from_f32`, as [`ValueScale::of`] takes it).
    fn stream<T: Element + FiniteBits>(
        &self,
        (b, kvh): (usize, usize),
        (k, v): (&[T], &[T]),
        from_f32: fn(f32) -> T,
        dst: BlockOut<'_, MaybeUninit<f32>>,
        s: &mut Scratch,
    ) -> bool {
        let sh = self.sh;
        let (l, d, dv, s_n) = (sh.seq_q, sh.head_dim, sh.value_dim, sh.seq_kv);
        let (h0, n) = (kvh * sh.group_size(), dst.lse.len());
        // The group's query heads are consecutive: their rows follow each other in `q`.
        self.pack_q(b, h0, &(0..n).collect::<Vec<_>>(), s);
        let (lo, _) = key_range(self.opt.causal, self.opt.window, self.offset, 0, s_n);
        let (_, hi) = key_range(self.opt.causal, self.opt.window, self.offset, l - 1, s_n);
        let head = (b * sh.n_kv_heads + kvh) * s_n;
        let (k, v) = (&k[head * d..][..s_n * d], &v[head * dv..][..s_n * dv]);
        // The values of the key blocks no row visits count towards the other passes' scale.
        let limit = ValueScale::limit(s_n);
        let bound = from_f32(pow2(limit));
        let (first, end) = (lo / BLOCK_KV * BLOCK_KV, hi.div_ceil(BLOCK_KV) * BLOCK_KV);
        let (before, after) = (&v[..first * dv], &v[end.clamp(first, s_n) * dv..]);
        if !T::all_below(before, bound) || !T::all_below(after, bound) {
            return false;
        }
        let BlockOut { out, lse, stats } = dst;
        let out = zeroed(out);
        let mut m = vec![f32::NEG_INFINITY; n];
        let mut sum = vec![0.0f32; n];
        for jb in lo / BLOCK_KV..hi.div_ceil(BLOCK_KV) {
            let j0 = jb * BLOCK_KV;
            let keys = (s_n - j0).min(BLOCK_KV);
            let next = (j0 + keys, (s_n - j0 - keys).min(BLOCK_KV));
            prefetch_page_starts(&k[next.0 * d..][..next.1 * d]);
            prefetch_page_starts(&v[next.0 * dv..][..next.1 * dv]);
            let tile = s.tile.get(n * keys);
            self.raw_scores_against_rows(&s.q, &k[j0 * d..][..keys * d], (n, keys), tile);
            let rows = (b, |r| (h0 + r / l, r % l));
            self.block_steps(rows, (j0, keys), tile, (&mut m, &mut sum), out);
            let v = &v[j0 * dv..][..keys * dv];
            if !self
                .isa
                .gemm_checked((n, dv, keys), tile, keys, v, dv, out, dv, limit)
            {
                return false;
            }
        }
        let factor = self.opt.dropout.map_or(1.0, |d| d.scale());
        self.finish_rows((&m, &sum), factor, BlockOut { out, lse, stats });
        true
    }

    /// The weights asked for, recomputed from each row's final offset and sum (`stats`).
    fn weights(&self, stats: &[[f32; 2]]) -> Option<Weights> {
        let sh = self.sh;
        let (l, s_n) = (sh.seq_q, sh.seq_kv);
        let (heads, group) = (sh.batch * sh.n_heads, sh.group_size());
        // Chunk sizes must not be 0; with no keys or no queries every weights tensor is empty.
        let row_len = s_n.max(1);
        let block_rows = |qb: usize, dst: &[f32]| -> Vec<usize> {
            (qb * BLOCK_Q..).take(dst.len() / row_len).collect()
        };
        match &self.opt.weights {
            WeightsRequest::None => None,
            WeightsRequest::All => {
                let mut all = vec![0.0f32; heads * l * s_n];
                self.for_each_head(&mut all, l * row_len, stats, |bh, k, stats, all| {
                    all.par_chunks_mut(BLOCK_Q * row_len)
                        .enumerate()
                        .for_each_init(Scratch::default, |s, (qb, dst)| {
                            let rows = block_rows(qb, dst);
                            self.weight_rows(bh, k, &rows, stats, dst, None, s);
                        });
                });
                Some(Weights::all(&sh, all))
            }
            WeightsRequest::Rows(rows) => {
                let mut data = vec![0.0f32; heads * rows.len() * s_n];
                self.for_each_head(
                    &mut data,
                    rows.len() * row_len,
                    stats,
                    |bh, k, stats, data| {
                        data.par_chunks_mut(BLOCK_Q * row_len)
                            .zip(rows.par_chunks(BLOCK_Q))
                            .for_each_init(Scratch::default, |s, (dst, rows)| {
                                self.weight_rows(bh, k, rows, stats, dst, None, s);
                            });
                    },
                );
                Some(Weights::rows(&sh, rows.clone(), data))
            }
            WeightsRequest::HeadAverage => {
                let mut avg = vec![0.0f32; sh.batch * l * s_n];
                let share = Some(1.0 / sh.n_heads as f32);
                for (b, avg) in avg.chunks_mut((l * row_len).max(1)).enumerate() {
                    for kvh in 0..sh.n_kv_heads {
                        let k = self.pack_keys(b, kvh);
                        for h in kvh * group..(kvh + 1) * group {
                            let stats = &stats[(b * sh.n_heads + h) * l..][..l];
                            avg.par_chunks_mut(BLOCK_Q * row_len)
                                .enumerate()
                                .for_each_init(Scratch::default, |s, (qb, dst)| {
                                    let rows = block_rows(qb, dst);
                                    self.weight_rows((b, h), &k, &rows, stats, dst, share, s);
                                });
                        }
                    }
                }
                Some(Weights::head_average(&sh, avg))
            }
        }
    }

    /// Runs `f((b, h), keys, stats, dst)` for every query head in parallel: `dst` is its
    /// `per_head` values of `data` (`[batch, n_heads, …]`), `stats` its rows' `[max, sum]`, and
    /// `keys` its key/value head's, transposed once for all the query heads of the group.
    fn for_each_head(
        &self,
        data: &mut [f32],
        per_head: usize,
        stats: &[[f32; 2]],
        f: impl Fn((usize, usize), &Keys, &[[f32; 2]], &mut [f32]) + Sync,
    ) {
        let (sh, l) = (self.sh, self.sh.seq_q);
        let group = sh.group_size();
        // Chunk sizes must not be 0; an empty `data` has no head to run.
        data.par_chunks_mut((group * per_head).max(1))
            .enumerate()
            .for_each(|(bkv, data)| {
                let (b, kvh) = (bkv / sh.n_kv_heads, bkv % sh.n_kv_heads);
                let k = self.pack_keys(b, kvh);
                let heads = data.par_chunks_mut(per_head.max(1)).enumerate();
                heads.for_each(|(g, dst)| {
                    let stats = &stats[(bkv * group + g) * l..][..l];
                    f((b, kvh * group + g), &k, stats, dst);
                });
            });
    }

    /// Weights `e^(score − m) / sum` of query rows `rows` of head `(b, h)` into `dst`
    /// (`[rows, seq_kv]`): written, or added times `share` when averaging heads. The row's
    /// offset `m` and sum rather than `lse = m + ln sum`: near ±3e38 `ln sum` is below an ulp
    /// of `m`, and `e^(score − lse)` would lose the ties' shares.
    ///
    /// The scores here come from the FMA kernels on transposed keys; a row computed on the tiles,
    /// or against the keys as the inputs hold them ([`Self::few_rows`]), summed its scores in
    /// another order. Where the scores are so large that the two orders' roundings move a
    /// weight (bf16 inputs with scores near 1e9, whose ulp is 64), the saved offset and sum no
    /// longer fit these scores, and the weights would not sum to 1: such rows (their sum off by
    /// more than [`WEIGHTS_SUM_TOL`]) are recomputed with their own max and sum.
    #[allow(clippy::too_many_arguments)]
    fn weight_rows(
        &self,
        (b, h): (usize, usize),
        k: &Keys,
        rows: &[usize],
        stats: &[[f32; 2]],
        dst: &mut [f32],
        share: Option<f32>,
        s: &mut Scratch,
    ) {
        let s_n = self.sh.seq_kv;
        if s_n == 0 {
            // No keys, no weights.
            return;
        }
        // Averaged heads are added to `dst` only once the row is right.
        let mut staged = std::mem::take(&mut s.weights);
        let out: &mut [f32] = match share {
            None => dst,
            Some(_) => {
                staged.clear();
                staged.resize(rows.len() * s_n, 0.0);
                &mut staged
            }
        };
        let mut totals = vec![0.0f32; rows.len()];
        self.pack_q(b, h, rows, s);
        for jb in 0..s_n.div_ceil(BLOCK_KV) {
            let j0 = jb * BLOCK_KV;
            let keys = (s_n - j0).min(BLOCK_KV);
            self.scores(k, rows.len(), (jb, keys), s);
            for (((row, &i), out), total) in (s.tile.get(rows.len() * keys))
                .chunks_exact_mut(keys)
                .zip(rows)
                .zip(out.chunks_exact_mut(s_n))
                .zip(&mut totals)
            {
                let [max, sum] = stats[i];
                if sum == 0.0 {
                    // A row that sees nothing weighs 0 everywhere (already 0 in `out`).
                    continue;
                }
                if !max.is_finite() {
                    // A NaN or ∞ score (inputs that opted out of the finiteness check) makes
                    // the row's sum NaN: as in the reference, its weights are NaN at the keys
                    // it sees and 0 at the hidden ones, which the rules turn to −∞.
                    row.fill(f32::NAN);
                    self.finish_scores((b, h, i), j0, row);
                    for x in row.iter_mut().filter(|x| **x == f32::NEG_INFINITY) {
                        *x = 0.0;
                    }
                    out[j0..][..keys].copy_from_slice(row);
                    continue;
                }
                self.finish_scores((b, h, i), j0, row);
                *total += self.isa.exp_sub_sum(row, max);
                self.isa.scale(row, 1.0 / sum);
                out[j0..][..keys].copy_from_slice(row);
            }
        }
        for ((&i, out), total) in rows.iter().zip(out.chunks_exact_mut(s_n)).zip(totals) {
            let sum = stats[i][1];
            // A NaN total (an ∞ weight) is off too.
            let fits = (total / sum - 1.0).abs() <= WEIGHTS_SUM_TOL;
            if sum.is_finite() && sum > 0.0 && !fits {
                self.own_weights((b, h, i), k, out, s);
            }
        }
        if let Some(share) = share {
            for (d, &w) in dst.iter_mut().zip(staged.iter()) {
                *d += share * w;
            }
        }
        s.weights = staged;
    }

    /// Query `i`'s weights over its own scores here: their max, then `e^(score − max)` and
    /// their sum, into `out` (`[seq_kv]`) divided by it ([`Self::weight_rows`]).
    fn own_weights(
        &self,
        (b, h, i): (usize, usize, usize),
        k: &Keys,
        out: &mut [f32],
        s: &mut Scratch,
    ) {
        let s_n = self.sh.seq_kv;
        self.pack_q(b, h, &[i], s);
        let blocks =
            || (0..s_n.div_ceil(BLOCK_KV)).map(|jb| (jb, (s_n - jb * BLOCK_KV).min(BLOCK_KV)));
        let mut max = f32::NEG_INFINITY;
        for (jb, keys) in blocks() {
            self.scores(k, 1, (jb, keys), s);
            let row = s.tile.get(keys);
            self.finish_scores((b, h, i), jb * BLOCK_KV, row);
            max = max.max(self.isa.max(row));
        }
        let mut sum = 0.0f32;
        for (jb, keys) in blocks() {
            self.scores(k, 1, (jb, keys), s);
            let row = s.tile.get(keys);
            self.finish_scores((b, h, i), jb * BLOCK_KV, row);
            sum += self.isa.exp_sub_sum(row, max);
            out[jb * BLOCK_KV..][..keys].copy_from_slice(row);
        }
        self.isa.scale(out, 1.0 / sum);
    }
}
