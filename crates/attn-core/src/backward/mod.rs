//! The backward pass of scaled dot-product attention: gradients of `sum(out · dout)` with
//! respect to `q`, `k` and `v`, for every option the forward pass supports.
//!
//! [`sdpa_backward`] is the fast path, FlashAttention-2's backward (Dao 2023,
//! <https://arxiv.org/abs/2307.08691>, Algorithm 2): the `seq_q × seq_kv` matrices are never
//! materialised. For one block of keys and one block of queries it recomputes the scores `S`
//! from `q`, `k` and the saved log-sum-exp, so `P = e^(S − lse)` needs no second softmax; with
//! `D = rowsum(dout ∘ out)` (one value per query row) and the dropout factors `Z` (`0` or
//! `1/(1 − p)`, replayed from [`crate::Dropout::keep`]):
//! - `dV += (P ∘ Z)ᵀ · dO`
//! - `dP = (dO · Vᵀ) ∘ Z`
//! - `dS = P ∘ (dP − D)`, times `1 − tanh²(s/c)` under a softcap `c` (the chain rule through
//!   `c · tanh(s/c)`)
//! - `dK += scale · dSᵀ · Q`, `dQ += scale · dS · K`.
//!
//! ALiBi slopes and float masks are additive constants, so they change `P` but add no term;
//! hidden keys have `P = 0` and get no gradient. Under grouped-query attention `dK` and `dV`
//! sum over the query heads that share a key/value head.
//!
//! Every tile is computed transposed, keys down and queries across (`Sᵀ = K · Qᵀ`,
//! `dPᵀ = V · dOᵀ`), so that all five products are plain row-major `C += A · B` with
//! contiguous rows: `dV += Pᵀ · dO`, `dK += dSᵀ · Q` and `dQᵀ += Kᵀ · dSᵀ`, with `Qᵀ`, `dOᵀ`,
//! `Kᵀ` packed once per head and `dQᵀ` accumulated per head and transposed once at the end.
//! The per-query `lse` and `D` then run along the vector lanes. Blocks without a softcap or
//! dropout take the fast lane (two GEMMs, one fused `exp` pass, three GEMMs), after the rules:
//! key padding and masks that every query shares on the transposed scores themselves
//! (`Plan::key_rules`), a causal or window edge, ALiBi and masks with a row per query on a
//! transposed copy with the forward pass's row rules (`Plan::mask_block`). Under a softcap or
//! dropout blocks take the general lane, which adds those. (Masked blocks take the fast lane
//! because in the general lane a float mask cost masked calls most of their lead over PyTorch.)
//!
//! Work is split over `batch × n_kv_heads`: a task owns its head's `dK`, `dV` and the `dQ` of
//! the query heads that read it, and writes them in place, so nothing is shared between
//! threads. When that gives rayon too few tasks, each head is split further into interleaved
//! chunks of key blocks, each chunk with its own sums, added up at the end. The GEMMs and the
//! elementwise pass have an AVX-512 build (`avx512.rs`) and a portable one (`kernels.rs`).
//! With [`Isa::Amx`] (what [`Isa::best`] picks where the CPU has it), whole 64 × 64 blocks with
//! `head_dim` and `value_dim` multiples of 32 run their five products on AMX tiles (`amx.rs`:
//! `S`, `dP` and `dV` in bf16x6 as the forward pass, within a few f32 roundings; `dK` and `dQ`
//! on queries and keys centred on their means, `Plan::add_centres`, in bf16x3 or, where
//! `|scale|·‖q‖` or `|scale|·‖k‖` would magnify its rounding, bf16x6: `Norms::narrow_grads`),
//! when the call's scores are bounded as the forward pass's tiles need
//! (`Norms::scores_bounded`).
//!
//! [`sdpa_backward_reference`] is the plain twin (`reference.rs`): one query row at a time,
//! its own softmax, no saved state. Calls of extreme magnitudes (a scale past `2^±60`, a row
//! of `q`, `k`, `v` or `dout` of norm past `2^30`), where the fast path's order of operations
//! would overflow before the reference's, run its loop instead (`Norms::moderate`), and so do
//! the rows of a log-sum-exp too large to recompute `P` from (past 128, `LSE_BOUND`).

#[cfg(target_arch = "x86_64")]
mod amx;
mod grads;
mod kernels;
mod mask_grad;
mod reference;

pub use grads::Grads;
pub(crate) use grads::check_saved_lse;
use grads::{LSE_BOUND, row_deltas, validate};
pub use reference::sdpa_backward_reference;

use std::borrow::Cow;
use std::cell::Cell;

use rayon::prelude::*;

use crate::cpu::aligned::{Aligned, zeros_written};
#[cfg(target_arch = "x86_64")]
use crate::cpu::bf16x;
use crate::cpu::{Isa, max_keeping_nan};
use crate::error::AttnError;
use crate::fused::F32_SCORE_BOUND;
use crate::input::AttnInput;
use crate::mask::key_range;
use crate::options::AttnOptions;
use crate::shape::{AttnOutput, AttnShape};
#[cfg(target_arch = "x86_64")]
use amx::{PARTS, PARTS_X3};
use kernels::{Lhs, Mat, MatMut, Panels, gemm, pack_panels, probs_and_grads};

/// Runs `$body` with the const `$p` set to `$parts`, the bf16 parts of `dK`'s and `dQ`'s
/// products (`Plan::grad_parts`: [`PARTS_X3`] or [`PARTS`]), which the tile functions take as
/// a const parameter.
#[cfg(target_arch = "x86_64")]
macro_rules! with_grad_parts {
    ($parts:expr, $p:ident => $body:expr) => {
        match $parts {
            PARTS_X3 => {
                const $p: usize = PARTS_X3;
                $body
            }
            _ => {
                const $p: usize = PARTS;
                $body
            }
        }
    };
}

/// Keys per block: the rows of the transposed tiles.
const BLOCK_KV: usize = 64;
/// Queries per block: the columns of the transposed tiles.
const BLOCK_Q: usize = 64;
/// Query blocks per group: a group's packed queries (five `[BLOCK_Q, head_dim]` arrays per
/// block, 640 KB at head_dim 64) stay in L2 while every key block meets them.
const Q_GROUP: usize = 8;
/// Tasks per rayon thread that the split over key blocks aims for.
const TASKS_PER_THREAD: usize = 4;

/// The rows whose finite lse is past [`LSE_BOUND`] (−∞ is a row that saw no key).
fn untrusted_rows(lse: &[f32]) -> Vec<usize> {
    (0..lse.len())
        .filter(|&r| lse[r].is_finite() && lse[r].abs() > LSE_BOUND)
        .collect()
}

/// The most bytes the split's tasks may hold together: each holds its head's whole `dq`, `dk`
/// and `dv` until they are added up, and buffers for the whole head while it runs, so 64
/// threads on one head of 8192 keys (8 MiB of gradients) peaked at 2.6 GB without it.
const SPLIT_BYTES: usize = 256 << 20;

/// Chunks of key blocks per head (`heads` of `task_bytes` each, see [`SPLIT_BYTES`];
/// `key_blocks` blocks): enough for [`TASKS_PER_THREAD`] tasks per thread, as long as they fit
/// in [`SPLIT_BYTES`]; 1 (each head's task writes straight into the results) otherwise.
fn split_chunks(heads: usize, key_blocks: usize, threads: usize, task_bytes: usize) -> usize {
    let wanted = (TASKS_PER_THREAD * threads).div_ceil(heads);
    let affordable = SPLIT_BYTES / heads.saturating_mul(task_bytes).max(1);
    wanted.min(affordable).clamp(1, key_blocks.max(1))
}

/// The largest row norm of `q`, `k`, `v` and `dout` ([`max_norm`], rows in parallel); NaN
/// where one holds NaN.
struct Norms {
    q: f32,
    k: f32,
    v: f32,
    dout: f32,
}

impl Norms {
    fn of(isa: Isa, input: &AttnInput<'_>, dout: &[f32]) -> Norms {
        let sh = input.shape;
        let norm = |x: &[f32], width: usize| {
            if width == 0 {
                return 0.0;
            }
            x.par_chunks(width * 1024)
                .map(|rows| isa.max_norm(rows, width))
                .reduce(|| 0.0, max_keeping_nan)
        };
        Norms {
            q: norm(input.q, sh.head_dim),
            k: norm(input.k, sh.head_dim),
            v: norm(input.v, sh.value_dim),
            dout: norm(dout, sh.value_dim),
        }
    }

    /// Whether the call's magnitudes leave the fast path's order of operations as exact as
    /// the reference's: a scale within `2^±60` and every row of `q`, `k`, `v` and `dout` of
    /// norm at most `2^30`. The fast path multiplies `q` by the scale before `K·Qᵀ` and `dQ` by
    /// it after `dS·K`, where the reference scales each score and each `dS`: at a scale of 1e30
    /// on queries of 1e10 its `scale·q` overflowed (NaN gradients for finite ones), at 1e-37
    /// on keys of 1.5e37 its unscaled `dS·K` did. Within these bounds no partial result of
    /// either order comes near f32's range (`|dS·K| ≤ 2·2^60·2^30·2^31`); past them the
    /// reference's own loop runs.
    fn moderate(&self, scale: f32) -> bool {
        const SCALE: f32 = (1u64 << 60) as f32;
        const NORM: f32 = (1u64 << 30) as f32;
        let scale = scale.abs();
        (scale == 0.0 || (1.0 / SCALE..=SCALE).contains(&scale))
            && [self.q, self.k, self.v, self.dout]
                .iter()
                .all(|&n| n <= NORM)
    }

    /// Whether every score `scale·q·k` of the call is bounded by [`F32_SCORE_BOUND`] (by
    /// Cauchy–Schwarz, `|scale|·max ‖q‖·max ‖k‖`), as the AMX lane needs: the exponential turns
    /// a score's rounding into a relative error of `P` that grows with the scores. When the
    /// scores were bf16x3 products, `dq` on 64 × 64 blocks whose keys share a large component
    /// was off by 1.5e-4 of its largest value at a bound of 12, 6e-4 at 22 and 0.1 at 659; in
    /// bf16x6, with `dK` and `dQ` centred, 2.5e-5 at 31.9
    /// (`scores_near_the_tile_bound_keep_the_amx_lane_exact`). Heads past the bound take the
    /// FMA kernels.
    fn scores_bounded(&self, scale: f32) -> bool {
        // NaN and ∞ fail it.
        scale.abs() * self.q * self.k <= F32_SCORE_BOUND
    }

    /// Whether `dK` and `dQ` may take bf16x3 on the tiles ([`PARTS_X3`]): `dQ = scale·dS·K`
    /// and `dK = dSᵀ·(scale·Q)` carry its `3·2⁻¹⁶` of each term times `|scale|·‖k‖` or
    /// `|scale|·‖q‖`, about 1 for rows of unit-variance values at the default scale `1/√d`.
    /// Up to [`NARROW_GRAD_BOUND`] `dq` stays within 5.6e-5 of float64 on queries near 0 (where
    /// every term of the sum cancels); at 16 it was 1.3e-4 and at 80 (scale 10; 64 causal queries, 128
    /// keys) 4.5e-4, where
    /// PyTorch's own fused backward gives 9.1e-5 and bf16x6 1.6e-4. bf16x6 is slower, so only
    /// the scales that need it take it.
    fn narrow_grads(&self, scale: f32) -> bool {
        scale.abs() * self.q.max(self.k) <= NARROW_GRAD_BOUND
    }
}

/// The largest `|scale|·max(‖q‖, ‖k‖)` at which `dK` and `dQ` take bf16x3 ([`Norms::narrow_grads`]).
const NARROW_GRAD_BOUND: f32 = 8.0;

/// Gradients of `sum(out · dout)` with respect to `q`, `k` and `v`, and with
/// [`AttnOptions::float_mask_grad`] the float mask: the fast path.
///
/// `forward` is what [`crate::sdpa`] (or [`crate::sdpa_reference`]) returned for the same
/// `input` and `options` (its `out` and `lse`; `options.weights` is ignored). The float mask
/// comes after the scale, softcap and ALiBi, so what query `i`'s score of key `j` adds to it is
/// the softmax backward's `dS_ij = P_ij·(Z_ij·dP_ij − D_i)` (`Z` the dropout factor,
/// `dP = dout·Vᵀ`, `D = rowsum(dout ∘ out)`); keys another rule hides, or the mask's own −∞,
/// add 0.
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - `forward.out`, `dout`: `[batch, n_heads, seq_q, value_dim]`; `forward.lse`:
///   `[batch, n_heads, seq_q]`
/// - returns `dq`, `dk`, `dv` shaped like `q`, `k`, `v`, and `dmask` like the float mask.
///
/// # Errors
/// Whatever [`AttnOptions::validate`] rejects, a tensor of the wrong length, a non-finite
/// `dout` or `out`, a NaN or `+∞` in `lse`, and gradients that overflow f32 from finite
/// inputs ([`AttnError::GradientOverflow`]).
///
/// ```
/// use attn_core::{AttnInput, AttnOptions, AttnShape, FloatMask, sdpa, sdpa_backward};
///
/// // A learned bias per head and (query, key) pair, shared by the batch, as T5's relative
/// // positions are: [heads, seq_q, seq_kv] broadcast over the batch of 2.
/// let shape = AttnShape::new(2, 4, 5, 5, 8);
/// let x: Vec<f32> = (0..2 * 4 * 5 * 8).map(|i| (i as f32 * 0.37).sin()).collect();
/// let bias: Vec<f32> = (0..4 * 5 * 5).map(|i| (i as f32 * 0.11).cos()).collect();
/// let options = AttnOptions {
///     float_mask: Some(FloatMask::from_vec(bias, &[4, 5, 5])?),
///     float_mask_grad: true,
///     ..AttnOptions::default()
/// };
/// let input = AttnInput::new(&x, &x, &x, shape)?;
/// let fwd = sdpa(&input, &options)?;
/// let dout = vec![1.0; fwd.out.len()];
/// let grads = sdpa_backward(&input, &options, &fwd, &dout)?;
/// assert_eq!(grads.dq.len(), x.len());
/// assert_eq!(grads.dmask.map(|d| d.len()), Some(4 * 5 * 5));
/// # Ok::<(), attn_core::AttnError>(())
/// ```
pub fn sdpa_backward(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    forward: &AttnOutput,
    dout: &[f32],
) -> Result<Grads, AttnError> {
    let (out, lse) = (&forward.out[..], &forward.lse[..]);
    let isa = options.chosen_isa();
    let mut grads = qkv_grads(isa, input, options, (out, lse), dout)?;
    if options.float_mask_grad {
        grads.dmask = Some(mask_grad::dmask(isa, input, options, (out, lse), dout)?);
    }
    Ok(grads)
}

/// The fast path's `dq`, `dk` and `dv` on the kernels of `isa`.
fn qkv_grads(
    isa: Isa,
    input: &AttnInput<'_>,
    options: &AttnOptions,
    (out, lse): (&[f32], &[f32]),
    dout: &[f32],
) -> Result<Grads, AttnError> {
    validate(input, options, Some((out, lse)), dout)?;
    let sh = input.shape;
    let (scale, norms) = (options.scale_for(&sh), Norms::of(isa, input, dout));
    if !norms.moderate(scale) {
        return reference::qkv_grads(input, options, dout);
    }
    // Rows whose lse cannot hold their sum take the reference's row loop; the fast path sees
    // them as rows that saw no key (lse −∞: P = 0, so they add nothing there).
    let far = untrusted_rows(lse);
    let lse_fast: Cow<'_, [f32]> = if far.is_empty() {
        Cow::Borrowed(lse)
    } else {
        let mut lse = lse.to_vec();
        far.iter().for_each(|&r| lse[r] = f32::NEG_INFINITY);
        Cow::Owned(lse)
    };
    let lse = &lse_fast[..];
    let dv = sh.value_dim;
    let delta = row_deltas(dout, out, dv, lse.len());
    let plan = Plan {
        sh,
        opt: options,
        offset: options.offset(sh.seq_q, sh.seq_kv),
        extras: options.alibi.is_some()
            || options.float_mask.is_some()
            || options.bool_mask.is_some()
            || options.key_padding.is_some(),
        by_key: options.alibi.is_none()
            && (options.float_mask.as_ref()).is_none_or(|m| m.dims()[2] == 1)
            && (options.bool_mask.as_ref()).is_none_or(|m| m.dims()[2] == 1),
        isa,
        amx: cfg!(target_arch = "x86_64")
            && isa == Isa::Amx
            && sh.head_dim.is_multiple_of(32)
            && sh.value_dim.is_multiple_of(32)
            && sh.head_dim > 0
            && sh.value_dim > 0
            && norms.scores_bounded(scale),
        grad_parts: if norms.narrow_grads(scale) {
            PARTS_X3
        } else {
            PARTS
        },
        scale,
        q: input.q,
        k: input.k,
        v: input.v,
        dout,
        lse,
        delta: &delta,
    };

    let mut grads = Grads {
        dq: zeros_written(input.q.len()),
        dk: zeros_written(input.k.len()),
        dv: zeros_written(input.v.len()),
        dmask: None,
    };
    let heads = sh.batch * sh.n_kv_heads;
    let key_blocks = sh.seq_kv.div_ceil(BLOCK_KV);
    if heads == 0 || key_blocks == 0 || sh.seq_q == 0 {
        return Ok(grads);
    }
    // A head's buffers (`Scratch`) hold about six `[seq, head_dim + value_dim]` arrays.
    let retain = (sh.seq_q + sh.seq_kv) * (sh.head_dim + dv) <= RETAINED_SCRATCH;
    // Every (b, kv head) owns a contiguous run of query heads, [group, seq_q, head_dim], and
    // its own key/value rows, [seq_kv, head_dim] and [seq_kv, value_dim].
    let lens = (
        sh.group_size() * sh.seq_q * sh.head_dim,
        sh.seq_kv * sh.head_dim,
        sh.seq_kv * dv,
    );
    // A task's own sums, and its buffers (`Scratch`: about six `[seq, head_dim + value_dim]`
    // arrays, `retain` above).
    let task_bytes =
        4 * (lens.0 + lens.1 + lens.2 + 6 * (sh.seq_q + sh.seq_kv) * (sh.head_dim + dv));
    let chunks = split_chunks(heads, key_blocks, rayon::current_num_threads(), task_bytes);
    if chunks == 1 && lens.0 > 0 && lens.1 > 0 && lens.2 > 0 {
        // One task per head, writing straight into the results.
        (grads.dq.par_chunks_mut(lens.0))
            .zip(grads.dk.par_chunks_mut(lens.1))
            .zip(grads.dv.par_chunks_mut(lens.2))
            .enumerate()
            .for_each(|(bkv, ((dq, dk), dv))| {
                with_scratch(retain, |s| plan.task(bkv, (0, 1), (dq, dk, dv), s))
            });
    } else {
        // Several tasks per head, each with its own sums, added up afterwards.
        let parts: Vec<Grads> = (0..heads * chunks)
            .into_par_iter()
            .map(|t| {
                let mut g = Grads {
                    dq: zeros_written(lens.0),
                    dk: zeros_written(lens.1),
                    dv: zeros_written(lens.2),
                    dmask: None,
                };
                with_scratch(retain, |s| {
                    let grads = (&mut g.dq[..], &mut g.dk[..], &mut g.dv[..]);
                    plan.task(t / chunks, (t % chunks, chunks), grads, s)
                });
                g
            })
            .collect();
        for (t, part) in parts.iter().enumerate() {
            let bkv = t / chunks;
            for (dst, src, len) in [
                (&mut grads.dq, &part.dq, lens.0),
                (&mut grads.dk, &part.dk, lens.1),
                (&mut grads.dv, &part.dv, lens.2),
            ] {
                let dst = &mut dst[bkv * len..][..len];
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
        }
    }
    reference::add_rows(input, options, dout, far, (&mut grads, None));
    grads.refuse_overflow(input)
}

/// Everything a task reads.
struct Plan<'a> {
    sh: AttnShape,
    opt: &'a AttnOptions,
    offset: isize,
    /// Whether ALiBi, a float mask, a boolean mask or key padding applies.
    extras: bool,
    /// Whether those rules are the same for every query (key padding, masks of one row for all
    /// queries, no ALiBi): whole blocks then keep the fast lane ([`Plan::key_rules`]).
    by_key: bool,
    isa: Isa,
    /// Whether whole blocks take the AMX products (`amx.rs`).
    amx: bool,
    /// The bf16 parts of the AMX products of `dK` and `dQ` (`PARTS_X3` or `PARTS`).
    grad_parts: usize,
    scale: f32,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    dout: &'a [f32],
    lse: &'a [f32],
    /// `rowsum(dout ∘ out)`, `[batch, n_heads, seq_q]`.
    delta: &'a [f32],
}

/// `(seq_q + seq_kv) · (head_dim + value_dim)` up to which each thread keeps its [`Scratch`]
/// between calls (about 24 MiB of buffers at the limit).
const RETAINED_SCRATCH: usize = 1 << 20;

thread_local! {
    /// This thread's buffers from its last call, when that call was small enough to keep them.
    static SCRATCH: Cell<Scratch> = Cell::new(Scratch::default());
}

/// Runs `f` on this thread's [`Scratch`], which it keeps afterwards when `retain` holds.
///
/// Fresh buffers in every task cost a page fault per 4 KiB, which add up over a call's many
/// tasks. A task that runs inside another (rayon steals work while a task waits) finds the
/// cell empty and starts from fresh buffers.
fn with_scratch<R>(retain: bool, f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut scratch = SCRATCH.take();
    let result = f(&mut scratch);
    if retain {
        SCRATCH.set(scratch);
    }
    result
}

/// A thread's buffers, reused by the tasks it runs.
#[derive(Default)]
struct Scratch {
    qh: QueryHead,
    kh: KeyHead,
    t: Tiles,
    #[cfg(target_arch = "x86_64")]
    bf: AmxOperands,
}

/// The operands of the AMX products, each value split in [`PARTS`] bf16 parts (`bf16x.rs`: the
/// A layout row-major, the B layout in tiles), for whole blocks only.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
struct AmxOperands {
    /// The A layout of `K` and `V`, `[seq_kv, 3·head_dim]` and `[seq_kv, 3·value_dim]`.
    k: Aligned<u16>,
    v: Aligned<u16>,
    /// The A layout of each key block's `Kᵀ`, `[head_dim, 3·BLOCK_KV]` at `j0·3·head_dim`.
    kt: Aligned<u16>,
    /// The B layout of each query block's `(scale·Q)ᵀ`, `doutᵀ`, `dout` and `scale·Q`, at
    /// `i0·3·width`.
    qt: Aligned<u16>,
    dot: Aligned<u16>,
    dout: Aligned<u16>,
    q: Aligned<u16>,
    /// This block's A layout of `(P∘Z)ᵀ` and of `dSᵀ`, and B layout of `dSᵀ`.
    p: Aligned<u16>,
    ds_a: Aligned<u16>,
    ds_b: Aligned<u16>,
    /// A key block's `Kᵀ` in f32, `[head_dim, BLOCK_KV]`.
    kt_f32: Aligned,
    /// The mean key of the task's key/value head and the mean `scale·q` of its current query
    /// head: the tiles take `Kᵀ` (for `dQ`) and `scale·Q` (for `dK`) centred on them, and
    /// [`Plan::add_centres`] adds back what that took out.
    c_k: Vec<f32>,
    c_q: Vec<f32>,
    /// `scale·Q − c_q` of the current query head, `[seq_q, head_dim]`.
    q_centred: Vec<f32>,
    /// The current query head's `Σ_j dS_ij` for each query `i` and `Σ_i dS_ij` for each key
    /// `j`, over the blocks on the tiles.
    ds_rows: Vec<f32>,
    ds_keys: Vec<f32>,
}

/// The mean of the rows of `x` (`[n, width]`) into `mean`: 0 when there are none.
fn mean_row(x: &[f32], width: usize, mean: &mut Vec<f32>) {
    mean.clear();
    mean.resize(width, 0.0);
    let n = x.len().checked_div(width).unwrap_or(0);
    for row in x.chunks_exact(width) {
        mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v);
    }
    mean.iter_mut().for_each(|m| *m /= n.max(1) as f32);
}

/// One query head packed for a task; blocks are laid out one after the other, block `ib`
/// (queries `ib·BLOCK_Q..`, `rows` of them) at `ib·BLOCK_Q·width`.
#[derive(Default)]
struct QueryHead {
    /// `scale · q`, `[seq_q, head_dim]`.
    q: Aligned,
    /// `dout`, `[seq_q, value_dim]`.
    dout: Aligned,
    /// `(scale · q)ᵀ` by blocks, `[head_dim, rows]` each.
    qt: Aligned,
    /// `doutᵀ` by blocks, `[value_dim, rows]` each.
    dot: Aligned,
    /// The unscaled `dQᵀ` being summed, by blocks, `[head_dim, rows]` each.
    dqt: Aligned,
    /// The saved `lse`, `[seq_q]`, with `−∞` (a row that saw no key) as `+∞`, so that
    /// `e^(s − lse)` is 0 for every key without a branch.
    lse: Vec<f32>,
}

/// One key/value head packed for a task, by key blocks: block `jb` (keys `jb·BLOCK_KV..`,
/// `keys` of them) at `jb·BLOCK_KV·width`, as [`Panels`] for the GEMMs' `A`.
#[derive(Default)]
struct KeyHead {
    /// `K`, `[keys, head_dim]` each.
    k: Aligned,
    /// `V`, `[keys, value_dim]` each.
    v: Aligned,
    /// `Kᵀ`, `[head_dim, keys]` each.
    kt: Aligned,
    /// The unscaled `dK` being summed, `[seq_kv, head_dim]`.
    dk: Aligned,
    /// The `dV` being summed, `[seq_kv, value_dim]`.
    dv: Aligned,
}

/// Per-task tiles, `[keys, queries]` each, reused across blocks.
#[derive(Default)]
struct Tiles {
    /// `Sᵀ`, then `Pᵀ`.
    p: Aligned,
    /// `dPᵀ`, then `dSᵀ`.
    ds: Aligned,
    /// `(P ∘ Z)ᵀ` under dropout.
    pz: Aligned,
    /// The dropout factors `Zᵀ`.
    z: Vec<f32>,
    /// `1 − tanh²(s/c)` under a softcap.
    dcap: Vec<f32>,
    /// `S` (not transposed), for the row rules ([`Plan::mask_block`]).
    rows: Vec<f32>,
}

/// How much of a block the causal and window rules leave visible.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visible {
    None,
    Part,
    All,
}

/// One query block against one key block of head `(b, h)`.
struct Block {
    b: usize,
    h: usize,
    i0: usize,
    rows: usize,
    j0: usize,
    keys: usize,
    /// Whether the block needs the row rules on a transposed copy (`Plan::mask_block`), or,
    /// under a softcap or dropout, the general lane.
    general: bool,
}

/// Transposes `src` (`[rows, cols]`) into `dst` (`[cols, rows]`).
fn transpose(src: &[f32], (rows, cols): (usize, usize), dst: &mut [f32]) {
    debug_assert!(src.len() >= rows * cols && dst.len() >= rows * cols);
    for (r, row) in src.chunks_exact(cols).take(rows).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            dst[c * rows + r] = x;
        }
    }
}

impl Plan<'_> {
    /// Task `chunk` of `chunks` for batch × key/value head `bkv`: key blocks
    /// `chunk, chunk + chunks, …` (interleaved, so causal work spreads evenly). Adds the `dQ`
    /// of the group's query heads to `dq` (`[group, seq_q, head_dim]`) and the `dK` and `dV` of
    /// its key blocks to `dk` (`[seq_kv, head_dim]`) and `dv` (`[seq_kv, value_dim]`).
    fn task(
        &self,
        bkv: usize,
        (chunk, chunks): (usize, usize),
        (dq, dk, dv): (&mut [f32], &mut [f32], &mut [f32]),
        scratch: &mut Scratch,
    ) {
        let sh = self.sh;
        let (d, l_n) = (sh.head_dim, sh.seq_q);
        let group = sh.group_size();
        let b = bkv / sh.n_kv_heads;
        let key_blocks: Vec<usize> = (chunk..sh.seq_kv.div_ceil(BLOCK_KV))
            .step_by(chunks)
            .collect();
        // The tile registers are configured for this thread while the guard lives.
        let tiles = if self.amx {
            crate::cpu::amx::Tiles::configure()
        } else {
            None
        };
        let tiles = tiles.as_ref();
        self.pack_key_head(bkv, &key_blocks, tiles.is_some(), &mut scratch.kh);
        #[cfg(target_arch = "x86_64")]
        if tiles.is_some() {
            self.pack_key_head_amx(bkv, &key_blocks, &mut scratch.bf);
        }
        for g in 0..group {
            let h = (bkv % sh.n_kv_heads) * group + g;
            self.pack_query_head(b, h, &mut scratch.qh);
            #[cfg(target_arch = "x86_64")]
            if tiles.is_some() {
                self.pack_query_head_amx(&scratch.qh, &mut scratch.bf);
            }
            // A group of query blocks stays in L2 while the key blocks stream past it.
            for g0 in (0..l_n).step_by(BLOCK_Q * Q_GROUP) {
                for &jb in &key_blocks {
                    for i0 in (g0..l_n.min(g0 + BLOCK_Q * Q_GROUP)).step_by(BLOCK_Q) {
                        self.block((b, h), (i0, jb), tiles, scratch);
                    }
                }
            }
            #[cfg(target_arch = "x86_64")]
            if tiles.is_some() {
                self.add_centres(
                    &scratch.bf,
                    &mut dq[g * l_n * d..][..l_n * d],
                    &mut scratch.kh,
                );
            }
            // dQ = scale · (dQᵀ)ᵀ, block by block
            let dqt = scratch.qh.dqt.view(l_n * d);
            for i0 in (0..l_n).step_by(BLOCK_Q) {
                let rows = (l_n - i0).min(BLOCK_Q);
                let dqt = &dqt[i0 * d..][..d * rows];
                let dq = &mut dq[(g * l_n + i0) * d..][..rows * d];
                for (x, dqt_row) in dqt.chunks_exact(rows).enumerate() {
                    for (c, &g) in dqt_row.iter().enumerate() {
                        dq[c * d + x] += self.scale * g;
                    }
                }
            }
        }
        let (dv_n, s_n) = (sh.value_dim, sh.seq_kv);
        let kh = &scratch.kh;
        let (kh_dk, kh_dv) = (kh.dk.view(s_n * d), kh.dv.view(s_n * dv_n));
        for &jb in &key_blocks {
            let (j0, keys) = (jb * BLOCK_KV, (s_n - jb * BLOCK_KV).min(BLOCK_KV));
            for (dst, src, width) in [(&mut *dk, kh_dk, d), (&mut *dv, kh_dv, dv_n)] {
                let at = j0 * width..(j0 + keys) * width;
                for (x, &y) in dst[at.clone()].iter_mut().zip(&src[at]) {
                    *x += y;
                }
            }
        }
    }

    /// Adds back to one query head's `dq` (`[seq_q, head_dim]`) and to the key head's `dK`
    /// sums what centring took out of the tiles' products: `dQ_i = scale·Σ_j dS_ij k_j` was
    /// computed on `k_j − c_k`, `dK_j = Σ_i dS_ij (scale·q_i)` on `scale·q_i − c_q`. Centred,
    /// the products' rounding falls on what the keys or queries do not share: on keys and
    /// queries sharing one direction, whose sums mostly cancel, bf16x3 products (`3·2⁻¹⁶` of
    /// each term) had put `dq` and `dk` up to 1.9e-4 off.
    #[cfg(target_arch = "x86_64")]
    fn add_centres(&self, bf: &AmxOperands, dq: &mut [f32], kh: &mut KeyHead) {
        let (d, s_n) = (self.sh.head_dim, self.sh.seq_kv);
        for (dq, &sum) in dq.chunks_exact_mut(d).zip(&bf.ds_rows) {
            let sum = self.scale * sum;
            dq.iter_mut().zip(&bf.c_k).for_each(|(x, &c)| *x += c * sum);
        }
        let dk = kh.dk.get(s_n * d);
        for (dk, &sum) in dk.chunks_exact_mut(d).zip(&bf.ds_keys) {
            dk.iter_mut().zip(&bf.c_q).for_each(|(x, &c)| *x += c * sum);
        }
    }

    /// The A layout of the whole key blocks among `blocks` of key/value head `bkv` (`K`, `V`,
    /// `Kᵀ`), for the AMX products.
    #[cfg(target_arch = "x86_64")]
    fn pack_key_head_amx(&self, bkv: usize, blocks: &[usize], bf: &mut AmxOperands) {
        let (d, dv, s_n) = (self.sh.head_dim, self.sh.value_dim, self.sh.seq_kv);
        let k_head = &self.k[bkv * s_n * d..][..s_n * d];
        let v_head = &self.v[bkv * s_n * dv..][..s_n * dv];
        bf.k.get(PARTS * s_n * d);
        bf.v.get(PARTS * s_n * dv);
        bf.kt.get(PARTS * s_n * d);
        mean_row(k_head, d, &mut bf.c_k);
        let kt_f32 = bf.kt_f32.get(d * BLOCK_KV);
        for &jb in blocks {
            let j0 = jb * BLOCK_KV;
            if s_n - j0 < BLOCK_KV {
                continue;
            }
            let k_blk = &k_head[j0 * d..][..BLOCK_KV * d];
            transpose(k_blk, (BLOCK_KV, d), kt_f32);
            for (row, &c) in kt_f32.chunks_exact_mut(BLOCK_KV).zip(&bf.c_k) {
                row.iter_mut().for_each(|x| *x -= c);
            }
            // SAFETY: `plan.amx` is only set with `Isa::Amx`, which has what `bf16x.rs` needs.
            unsafe {
                let k_at = &mut bf.k.all_mut()[PARTS * j0 * d..];
                bf16x::pack_a::<PARTS>(k_blk, (BLOCK_KV, d, d), k_at);
                let v_blk = &v_head[j0 * dv..][..BLOCK_KV * dv];
                let v_at = &mut bf.v.all_mut()[PARTS * j0 * dv..];
                bf16x::pack_a::<PARTS>(v_blk, (BLOCK_KV, dv, dv), v_at);
                let kt = (d, BLOCK_KV, BLOCK_KV);
                let kt_at = &mut bf.kt.all_mut()[self.grad_parts * j0 * d..];
                with_grad_parts!(self.grad_parts, G => bf16x::pack_a::<G>(kt_f32, kt, kt_at));
            }
        }
    }

    /// The B layout of the whole query blocks of the packed query head `qh`, for the AMX products.
    #[cfg(target_arch = "x86_64")]
    fn pack_query_head_amx(&self, qh: &QueryHead, bf: &mut AmxOperands) {
        let (d, dv, l_n) = (self.sh.head_dim, self.sh.value_dim, self.sh.seq_q);
        let (q, dout) = (qh.q.view(l_n * d), qh.dout.view(l_n * dv));
        let (qt, dot) = (qh.qt.view(l_n * d), qh.dot.view(l_n * dv));
        bf.qt.get(PARTS * l_n * d);
        bf.dot.get(PARTS * l_n * dv);
        bf.q.get(PARTS * l_n * d);
        bf.dout.get(PARTS * l_n * dv);
        mean_row(q, d, &mut bf.c_q);
        bf.q_centred.clear();
        for row in q.chunks_exact(d) {
            bf.q_centred
                .extend(row.iter().zip(&bf.c_q).map(|(&x, &c)| x - c));
        }
        bf.ds_rows.clear();
        bf.ds_rows.resize(l_n, 0.0);
        bf.ds_keys.clear();
        bf.ds_keys.resize(self.sh.seq_kv, 0.0);
        for i0 in (0..l_n).step_by(BLOCK_Q) {
            if l_n - i0 < BLOCK_Q {
                continue;
            }
            let w = BLOCK_Q;
            // Each block is `[width, w]` or `[w, width]`, at `i0·width` (`parts·i0·width`
            // packed).
            for (src, (k, n), width, dst) in
                [(qt, (d, w), d, &mut bf.qt), (dot, (dv, w), dv, &mut bf.dot)]
            {
                let at = PARTS * i0 * width;
                let (src, dst) = (&src[i0 * width..], &mut dst.all_mut()[at..]);
                // SAFETY: `plan.amx` is only set with `Isa::Amx`, which has what `bf16x.rs` needs.
                unsafe { bf16x::pack_b::<PARTS>(src, (k, n, n), dst) };
            }
            let g = self.grad_parts;
            let (src, dst) = (&bf.q_centred[i0 * d..], &mut bf.q.all_mut()[g * i0 * d..]);
            // SAFETY: as above.
            unsafe { with_grad_parts!(g, G => bf16x::pack_b::<G>(src, (w, d, d), dst)) };
            let at = PARTS * i0 * dv;
            let (src, dst) = (&dout[i0 * dv..], &mut bf.dout.all_mut()[at..]);
            // SAFETY: as above.
            unsafe { bf16x::pack_b::<PARTS>(src, (w, dv, dv), dst) };
        }
    }

    /// Packs key/value head `bkv` into `kh` (see [`KeyHead`]) for the task that owns key
    /// blocks `blocks`, and zeroes its sums. With `amx`, whole key blocks meet only whole query
    /// blocks when `seq_q` is a multiple of `BLOCK_Q`: then they need no FMA panels.
    fn pack_key_head(&self, bkv: usize, blocks: &[usize], amx: bool, kh: &mut KeyHead) {
        let (d, dv, s_n) = (self.sh.head_dim, self.sh.value_dim, self.sh.seq_kv);
        let k_head = &self.k[bkv * s_n * d..][..s_n * d];
        let v_head = &self.v[bkv * s_n * dv..][..s_n * dv];
        let (k, v, kt) = (kh.k.get(s_n * d), kh.v.get(s_n * dv), kh.kt.get(s_n * d));
        for &jb in blocks {
            let (j0, keys) = (jb * BLOCK_KV, (s_n - jb * BLOCK_KV).min(BLOCK_KV));
            if amx && keys == BLOCK_KV && self.sh.seq_q.is_multiple_of(BLOCK_Q) {
                continue;
            }
            let (k_blk, v_blk) = (&k_head[j0 * d..], &v_head[j0 * dv..]);
            pack_panels((keys, d), |r, x| k_blk[r * d + x], &mut k[j0 * d..]);
            pack_panels((keys, dv), |r, x| v_blk[r * dv + x], &mut v[j0 * dv..]);
            pack_panels((d, keys), |x, r| k_blk[r * d + x], &mut kt[j0 * d..]);
        }
        kh.dk.get(s_n * d).fill(0.0);
        kh.dv.get(s_n * dv).fill(0.0);
    }

    /// Packs query head `(b, h)` into `qh` (see [`QueryHead`]) and zeroes its `dQᵀ`.
    fn pack_query_head(&self, b: usize, h: usize, qh: &mut QueryHead) {
        let sh = self.sh;
        let (d, dv, l_n) = (sh.head_dim, sh.value_dim, sh.seq_q);
        let row0 = (b * sh.n_heads + h) * l_n;
        let q = qh.q.get(l_n * d);
        for (x, &y) in q.iter_mut().zip(&self.q[row0 * d..][..l_n * d]) {
            *x = y * self.scale;
        }
        self.isa
            .transpose_blocks(q, (d, BLOCK_Q), qh.qt.get(l_n * d));
        let dout = qh.dout.get(l_n * dv);
        dout.copy_from_slice(&self.dout[row0 * dv..][..l_n * dv]);
        self.isa
            .transpose_blocks(dout, (dv, BLOCK_Q), qh.dot.get(l_n * dv));
        qh.dqt.get(l_n * d).fill(0.0);
        qh.lse.clear();
        qh.lse.extend(self.lse[row0..][..l_n].iter().map(|&x| {
            if x == f32::NEG_INFINITY {
                f32::INFINITY
            } else {
                x
            }
        }));
    }

    /// How much of keys `j0..j0 + keys` queries `i0..i0 + rows` may see under the causal and
    /// window rules (whose visible ranges only move right as the query grows).
    fn visible(&self, i0: usize, rows: usize, j0: usize, keys: usize) -> Visible {
        let (causal, window, s_n) = (self.opt.causal, self.opt.window, self.sh.seq_kv);
        let first = key_range(causal, window, self.offset, i0, s_n);
        let last = key_range(causal, window, self.offset, i0 + rows - 1, s_n);
        let (lo, hi) = (first.0, last.1);
        if !(lo < hi && lo < j0 + keys && hi > j0) {
            Visible::None
        } else if last.0 <= j0 && first.1 >= j0 + keys {
            Visible::All
        } else {
            Visible::Part
        }
    }

    /// Query block `i0..` of head `(b, h)` against key block `jb`: adds to the key block's
    /// `dK` and `dV` sums and to the query block's unscaled `dQᵀ` in `scratch`, through the AMX
    /// products for a whole block when `tiles` is there.
    fn block(
        &self,
        (b, h): (usize, usize),
        (i0, jb): (usize, usize),
        tiles: Option<&crate::cpu::amx::Tiles>,
        scratch: &mut Scratch,
    ) {
        let sh = self.sh;
        let (rows, j0) = ((sh.seq_q - i0).min(BLOCK_Q), jb * BLOCK_KV);
        let keys = (sh.seq_kv - j0).min(BLOCK_KV);
        let visible = self.visible(i0, rows, j0, keys);
        // A block of keys the padding hides whole adds nothing (its weights are 0).
        let padded = (self.opt.key_padding.as_ref())
            .is_some_and(|kp| kp.row(b)[j0..j0 + keys].iter().all(|&real| !real));
        if visible == Visible::None || padded {
            return;
        }
        let blk = Block {
            b,
            h,
            i0,
            rows,
            j0,
            keys,
            general: visible == Visible::Part
                || (self.extras && !self.by_key)
                || self.opt.softcap.is_some()
                || self.opt.dropout.is_some(),
        };
        let tiles = tiles.filter(|_| rows == BLOCK_Q && keys == BLOCK_KV);
        self.block_products(&blk, tiles, scratch);
        let packed = self.block_lanes(&blk, tiles, scratch);
        self.block_grads(&blk, (tiles, packed), scratch);
    }

    /// A block's first two products into `scratch.t`: `Sᵀ = K · (scale·Q)ᵀ` and
    /// `dPᵀ = V · dOᵀ`, on the tiles when there are some.
    fn block_products(
        &self,
        blk: &Block,
        tiles: Option<&crate::cpu::amx::Tiles>,
        scratch: &mut Scratch,
    ) {
        let Block {
            i0, rows, j0, keys, ..
        } = *blk;
        let (d, dv, l_n, s_n) = (
            self.sh.head_dim,
            self.sh.value_dim,
            self.sh.seq_q,
            self.sh.seq_kv,
        );
        let n = rows * keys;
        let Scratch { qh, kh, t, .. } = scratch;
        match tiles {
            #[cfg(target_arch = "x86_64")]
            Some(tiles) => {
                let bf = &scratch.bf;
                let (p, ds) = ((t.p.get(n), rows), (t.ds.get(n), rows));
                let (kk, qt) = (
                    &bf.k.all()[PARTS * j0 * d..],
                    &bf.qt.all()[PARTS * i0 * d..],
                );
                amx::gemm::<PARTS>(tiles, p, kk, qt, (keys, rows, d), false);
                let (vv, dot) = (
                    &bf.v.all()[PARTS * j0 * dv..],
                    &bf.dot.all()[PARTS * i0 * dv..],
                );
                amx::gemm::<PARTS>(tiles, ds, vv, dot, (keys, rows, dv), false);
            }
            _ => {
                let k_blk = Lhs::Panels(Panels::new(&kh.k.view(s_n * d)[j0 * d..], keys, d));
                let v_blk = Lhs::Panels(Panels::new(&kh.v.view(s_n * dv)[j0 * dv..], keys, dv));
                let qt = Mat::packed(&qh.qt.view(l_n * d)[i0 * d..], d, rows);
                let isa = self.isa;
                gemm(
                    isa,
                    MatMut::packed(t.p.get(n), keys, rows),
                    k_blk,
                    qt,
                    false,
                );
                let dot = Mat::packed(&qh.dot.view(l_n * dv)[i0 * dv..], dv, rows);
                gemm(
                    isa,
                    MatMut::packed(t.ds.get(n), keys, rows),
                    v_blk,
                    dot,
                    false,
                );
            }
        }
    }

    /// The rules and the elementwise steps of a block, from its `Sᵀ` and `dPᵀ` to `P` (times
    /// the dropout factors) and `dS`; returns whether the AMX fast lane wrote them straight
    /// into the tiles' layouts (`scratch.bf`) instead of `scratch.t`.
    fn block_lanes(
        &self,
        blk: &Block,
        tiles: Option<&crate::cpu::amx::Tiles>,
        scratch: &mut Scratch,
    ) -> bool {
        let Block {
            b,
            h,
            i0,
            rows,
            j0,
            keys,
            general,
        } = *blk;
        let n = rows * keys;
        let row0 = (b * self.sh.n_heads + h) * self.sh.seq_q + i0;
        let Scratch { qh, t, .. } = scratch;
        let lse = &qh.lse[i0..][..rows];
        let delta = &self.delta[row0..][..rows];
        // The rules: on the transposed scores when every query shares them, else a row per
        // query (`mask_block`). Without a softcap or dropout the block then keeps the fast lane.
        let plain = self.opt.softcap.is_none() && self.opt.dropout.is_none();
        if self.extras && !general {
            self.key_rules((b, h), j0, (keys, rows), t.p.get(n));
        } else if general && plain {
            self.mask_block(blk, t);
        }
        if !plain {
            self.general_lane(blk, lse, delta, t);
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        if tiles.is_some() {
            let bf = &mut scratch.bf;
            let products = (t.p.view(n), t.ds.view(n));
            let packed = (
                bf.p.get(PARTS * n),
                bf.ds_a.get(PARTS * n),
                bf.ds_b.get(PARTS * n),
            );
            let sums = (&mut bf.ds_rows[i0..][..rows], &mut bf.ds_keys[j0..][..keys]);
            let shape = (keys, rows);
            // SAFETY: `plan.amx` is only set with `Isa::Amx`, which has what `bf16x.rs` needs.
            unsafe {
                with_grad_parts!(self.grad_parts, G => {
                    amx::probs_and_grads_packed::<G>(products, shape, (lse, delta), packed, sums)
                })
            };
            return true;
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = tiles;
        let (p, ds) = (t.p.get(n), t.ds.get(n));
        for (p, ds) in p.chunks_exact_mut(rows).zip(ds.chunks_exact_mut(rows)) {
            probs_and_grads(self.isa, p, ds, lse, delta);
        }
        false
    }

    /// A block's last three products, added to the sums in `scratch`: `dV += (P∘Z)ᵀ · dO`,
    /// `dK += dSᵀ · (scale·Q)`, `dQᵀ += Kᵀ · dSᵀ`; on the tiles when there are some, from the
    /// layouts the fast lane wrote when `packed`, else packing `scratch.t`'s first.
    fn block_grads(
        &self,
        blk: &Block,
        (tiles, packed): (Option<&crate::cpu::amx::Tiles>, bool),
        scratch: &mut Scratch,
    ) {
        let Block {
            i0, rows, j0, keys, ..
        } = *blk;
        let (d, dv, l_n, s_n) = (
            self.sh.head_dim,
            self.sh.value_dim,
            self.sh.seq_q,
            self.sh.seq_kv,
        );
        let n = rows * keys;
        let Scratch { qh, kh, t, .. } = scratch;
        let p = match self.opt.dropout.is_some() {
            true => t.pz.view(n),
            false => t.p.view(n),
        };
        let ds = t.ds.view(n);
        let dv_acc = &mut kh.dv.get(s_n * dv)[j0 * dv..][..keys * dv];
        let dk_acc = &mut kh.dk.get(s_n * d)[j0 * d..][..keys * d];
        let dqt = &mut qh.dqt.get(l_n * d)[i0 * d..][..d * rows];
        match tiles {
            #[cfg(target_arch = "x86_64")]
            Some(tiles) => {
                let bf = &mut scratch.bf;
                if !packed {
                    let row_sums = &mut bf.ds_rows[i0..][..rows];
                    let key_sums = &mut bf.ds_keys[j0..][..keys];
                    for (ds_row, key_sum) in ds.chunks_exact(rows).zip(key_sums) {
                        *key_sum += ds_row.iter().sum::<f32>();
                        row_sums.iter_mut().zip(ds_row).for_each(|(s, &x)| *s += x);
                    }
                    let tile = (keys, rows, rows);
                    // SAFETY: `plan.amx` is only set with `Isa::Amx`, which has what `bf16x.rs` needs.
                    unsafe {
                        bf16x::pack_a::<PARTS>(p, tile, bf.p.get(PARTS * n));
                        let (ds_a, ds_b) = (bf.ds_a.get(PARTS * n), bf.ds_b.get(PARTS * n));
                        with_grad_parts!(self.grad_parts, G => {
                            bf16x::pack_a::<G>(ds, tile, ds_a);
                            bf16x::pack_b::<G>(ds, tile, ds_b);
                        });
                    }
                }
                // dV += (P∘Z)ᵀ · dO;  dK += dSᵀ · (scale·Q − c_q);  dQᵀ += (K − c_k)ᵀ · dSᵀ
                // (`add_centres` adds the centres' share once the query head is done)
                let (p, dout) = (bf.p.all(), &bf.dout.all()[PARTS * i0 * dv..]);
                amx::gemm::<PARTS>(tiles, (dv_acc, dv), p, dout, (keys, dv, rows), true);
                let g = self.grad_parts;
                let (q, kt) = (&bf.q.all()[g * i0 * d..], &bf.kt.all()[g * j0 * d..]);
                let (dk, dq) = ((dk_acc, d), (dqt, rows));
                let (ds_a, ds_b) = (bf.ds_a.all(), bf.ds_b.all());
                with_grad_parts!(g, G => {
                    amx::gemm::<G>(tiles, dk, ds_a, q, (keys, d, rows), true);
                    amx::gemm::<G>(tiles, dq, kt, ds_b, (d, rows, keys), true);
                });
            }
            _ => {
                let _ = packed;
                let isa = self.isa;
                let ds = Mat::packed(ds, keys, rows);
                // dV += (P∘Z)ᵀ · dO
                let dout = Mat::packed(&qh.dout.view(l_n * dv)[i0 * dv..], rows, dv);
                let p = Lhs::Rows(Mat::packed(p, keys, rows));
                gemm(isa, MatMut::packed(dv_acc, keys, dv), p, dout, true);
                // dK += dSᵀ · (scale·Q)
                let q = Mat::packed(&qh.q.view(l_n * d)[i0 * d..], rows, d);
                gemm(isa, MatMut::packed(dk_acc, keys, d), Lhs::Rows(ds), q, true);
                // dQᵀ += Kᵀ · dSᵀ (the scale comes when it is transposed back)
                let kt_blk = Lhs::Panels(Panels::new(&kh.kt.view(s_n * d)[j0 * d..], d, keys));
                gemm(isa, MatMut::packed(dqt, d, rows), kt_blk, ds, true);
            }
        }
    }

    /// Every step between the raw scores and `dS` for a block under a softcap or dropout, which
    /// the fast lane cannot take: softcap, the row rules ([`Plan::mask_block`]), dropout.
    fn general_lane(&self, blk: &Block, lse: &[f32], delta: &[f32], t: &mut Tiles) {
        let Block {
            b,
            h,
            i0,
            rows,
            j0,
            keys,
            ..
        } = *blk;
        let n = rows * keys;
        if let Some(c) = self.opt.softcap {
            t.dcap.resize(n, 0.0);
            softcap(t.p.get(n), &mut t.dcap, c);
        }
        self.mask_block(blk, t);
        let (p, ds) = (t.p.get(n), t.ds.get(n));
        if let Some(drop) = self.opt.dropout {
            t.z.resize(n, 0.0);
            let kept = drop.scale();
            for (r, z_row) in t.z.chunks_exact_mut(rows).enumerate() {
                for (i, z) in (i0..).zip(z_row.iter_mut()) {
                    *z = if drop.keep(b, h, i, j0 + r) {
                        kept
                    } else {
                        0.0
                    };
                }
            }
            // dP ∘ Z
            ds.iter_mut().zip(&t.z).for_each(|(g, &z)| *g *= z);
        }
        for (p, ds) in p.chunks_exact_mut(rows).zip(ds.chunks_exact_mut(rows)) {
            probs_and_grads(self.isa, p, ds, lse, delta);
        }
        if self.opt.softcap.is_some() {
            ds.iter_mut().zip(&t.dcap).for_each(|(g, &c)| *g *= c);
        }
        if self.opt.dropout.is_some() {
            for ((pz, &p), &z) in t.pz.get(n).iter_mut().zip(&*p).zip(&t.z) {
                *pz = p * z;
            }
        }
    }

    /// Every rule on a block's transposed scores (`t.p`, `[keys, rows]`), a query's row at a
    /// time ([`Plan::mask_row`]) between two transposes.
    fn mask_block(&self, blk: &Block, t: &mut Tiles) {
        let Block {
            b,
            h,
            i0,
            rows,
            j0,
            keys,
            ..
        } = *blk;
        let n = rows * keys;
        let p = t.p.get(n);
        t.rows.resize(n, 0.0);
        transpose(p, (keys, rows), &mut t.rows);
        for (r, row) in t.rows.chunks_exact_mut(keys).enumerate() {
            self.mask_row((b, h, i0 + r), j0, row);
        }
        transpose(&t.rows, (rows, keys), p);
    }

    /// The rules that are the same for every query ([`Plan::by_key`]) on a whole block's
    /// transposed scores `st` (`[keys, rows]`, from key `j0`): each key's row takes its mask's
    /// value, or −∞ where a mask or the padding hides the key, in the reference's order.
    fn key_rules(
        &self,
        (b, h): (usize, usize),
        j0: usize,
        (keys, rows): (usize, usize),
        st: &mut [f32],
    ) {
        let opt = self.opt;
        for (j, row) in (j0..j0 + keys).zip(st.chunks_exact_mut(rows)) {
            let hidden = (opt.key_padding.as_ref()).is_some_and(|kp| !kp.is_real(b, j))
                || (opt.bool_mask.as_ref()).is_some_and(|m| !m.at(b, h, 0, j));
            if hidden {
                row.fill(f32::NEG_INFINITY);
            } else if let Some(mask) = &opt.float_mask {
                let x = mask.at(b, h, 0, j);
                row.iter_mut().for_each(|s| *s += x);
            }
        }
    }

    /// Steps 3–5 of the forward pass on the (soft-capped) scores of query `i` against keys
    /// `j0..`: ALiBi, float mask, and every visibility rule; hidden keys become `−∞`.
    fn mask_row(&self, (b, h, i): (usize, usize, usize), j0: usize, row: &mut [f32]) {
        let opt = self.opt;
        if self.extras {
            opt.apply_extras(self.isa, (b, h, i), self.offset, j0, row);
        }
        let (lo, hi) = key_range(opt.causal, opt.window, self.offset, i, self.sh.seq_kv);
        let end = j0 + row.len();
        let (lo, hi) = (lo.clamp(j0, end) - j0, hi.clamp(j0, end) - j0);
        row[..lo].fill(f32::NEG_INFINITY);
        row[hi.max(lo)..].fill(f32::NEG_INFINITY);
    }
}

/// Soft-caps raw scores in place, `s ← c·tanh(s/c)`, keeping the derivative `1 − tanh²(s/c)`.
fn softcap(s: &mut [f32], dcap: &mut [f32], c: f32) {
    for (x, g) in s.iter_mut().zip(dcap.iter_mut()) {
        let t = (*x / c).tanh();
        *x = c * t;
        *g = 1.0 - t * t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split aims for four tasks per thread, but its tasks' sums stay within
    /// [`SPLIT_BYTES`] together.
    #[test]
    fn only_rows_of_an_lse_past_the_bound_leave_the_fast_path() {
        let lse = [0.5, -3e38, 100.0, f32::NEG_INFINITY, 130.0, -1e4, -128.0];
        assert_eq!(untrusted_rows(&lse), [1, 4, 5]);
    }

    #[test]
    fn the_split_keeps_its_sums_within_bounds() {
        // Small heads: as many chunks as the threads want, up to the key blocks.
        assert_eq!(split_chunks(1, 32, 2, 1 << 20), 8);
        assert_eq!(split_chunks(8, 32, 2, 1 << 20), 1);
        assert_eq!(split_chunks(1, 4, 64, 1 << 20), 4);
        // One head of 64 queries and 8192 keys at head_dim 128 on 64 threads (8.4 MB of
        // gradients, 51 MB of buffers): 4 chunks, not 128.
        let head = 4 * (64 * 128 + 2 * 8192 * 128 + 6 * (64 + 8192) * 256);
        let chunks = split_chunks(1, 128, 64, head);
        assert!(chunks > 1 && chunks * head <= SPLIT_BYTES, "{chunks}");
        // A head too large for two sums takes a single task.
        assert_eq!(split_chunks(1, 2048, 64, SPLIT_BYTES), 1);
    }
}
