//! Packed variable-length batches, as FlashAttention's varlen API takes them
//! (`flash_attn_varlen_func`, <https://github.com/Dao-AILab/flash-attention/blob/v2.6.3/flash_attn/flash_attn_interface.py>):
//! the sequences of a batch are concatenated token by token, and `cu_seqlens` (cumulative
//! sequence lengths, `batch + 1` offsets starting at 0) say where each one starts. No token is
//! padding, so no work is spent on padding: sequence `b` is exactly one attention call on its
//! own `cu[b]..cu[b + 1]` tokens, through [`crate::sdpa`] and [`crate::sdpa_backward`].
//!
//! Options apply to every sequence on its own (causal alignment and windows use that sequence's
//! lengths). Dropout in sequence `b` keeps weight `(h, i, j)` exactly when a padded batch call
//! with the same seed keeps `(b, h, i, j)` ([`crate::Dropout::keep`]). Masks and key padding are
//! refused: their shapes assume a padded batch, which is what packing replaces.

use std::ops::Range;

use rayon::prelude::*;

use crate::backward::check_saved_lse;
use crate::shape::{AttnOutput, check_finite, check_len};
use crate::{
    AttnError, AttnInput, AttnOptions, AttnShape, Dropout, Grads, WeightsRequest, sdpa,
    sdpa_backward,
};

/// The widths of a packed batch: one vocabulary with [`AttnShape`], without batch and lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedDims {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (`n_heads` a multiple of it).
    pub n_kv_heads: usize,
    /// Length of a query and a key vector.
    pub head_dim: usize,
    /// Length of a value vector.
    pub value_dim: usize,
}

/// Borrowed inputs of a packed batch, checked by [`PackedInput::new`].
///
/// # Shapes
/// - `q`: `[total_q, n_heads, head_dim]`
/// - `k`: `[total_kv, n_kv_heads, head_dim]`
/// - `v`: `[total_kv, n_kv_heads, value_dim]`
/// - `cu_seqlens_q`: `[batch + 1]`, from 0 to `total_q`; `cu_seqlens_kv`: `[batch + 1]`, from 0
///   to `total_kv`.
#[derive(Debug, Clone, Copy)]
pub struct PackedInput<'a> {
    /// `[total_q, n_heads, head_dim]`
    pub q: &'a [f32],
    /// `[total_kv, n_kv_heads, head_dim]`
    pub k: &'a [f32],
    /// `[total_kv, n_kv_heads, value_dim]`
    pub v: &'a [f32],
    /// Where each sequence's queries start, then `total_q`: `[batch + 1]`.
    pub cu_seqlens_q: &'a [usize],
    /// Where each sequence's keys start, then `total_kv`: `[batch + 1]`.
    pub cu_seqlens_kv: &'a [usize],
    /// The widths.
    pub dims: PackedDims,
}

/// The result of a packed attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedOutput {
    /// `[total_q, n_heads, value_dim]`
    pub out: Vec<f32>,
    /// `[n_heads, total_q]` (FlashAttention's varlen layout); −∞ for a query that sees no key.
    pub lse: Vec<f32>,
}

/// Checks that `cu` is a valid offsets list: at least one entry, starting at 0, never
/// decreasing.
fn check_offsets(option: &'static str, cu: &[usize]) -> Result<(), AttnError> {
    let invalid = |reason: String| AttnError::InvalidOption { option, reason };
    match cu.first() {
        None => Err(invalid(
            "needs batch + 1 offsets (at least the leading 0), got none".into(),
        )),
        Some(&first) if first != 0 => Err(invalid(format!("must start at 0, got {first}"))),
        _ => match cu.windows(2).position(|w| w[1] < w[0]) {
            Some(at) => Err(invalid(format!(
                "offsets must not decrease: entry {} is {}, entry {} is {}",
                at,
                cu[at],
                at + 1,
                cu[at + 1]
            ))),
            None => Ok(()),
        },
    }
}

impl<'a> PackedInput<'a> {
    /// Checks the offsets (as many for queries as for keys, starting at 0, never decreasing)
    /// and every slice's length against the totals they give.
    pub fn new(
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
        cu_seqlens_q: &'a [usize],
        cu_seqlens_kv: &'a [usize],
        dims: PackedDims,
    ) -> Result<Self, AttnError> {
        let input = PackedInput {
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_kv,
            dims,
        };
        input.check()?;
        Ok(input)
    }

    /// The checks of [`PackedInput::new`], which every packed call runs again: the fields are
    /// public, so an input built without `new` may disagree with itself (an empty offsets list
    /// made `batch()` wrap and the call loop for ever).
    fn check(&self) -> Result<(), AttnError> {
        let PackedInput {
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_kv,
            dims,
        } = *self;
        check_offsets("cu_seqlens_q", cu_seqlens_q)?;
        check_offsets("cu_seqlens_kv", cu_seqlens_kv)?;
        if cu_seqlens_q.len() != cu_seqlens_kv.len() {
            return Err(AttnError::InvalidOption {
                option: "cu_seqlens_kv",
                reason: format!(
                    "has {} offsets ({} sequences) but cu_seqlens_q has {} ({} sequences)",
                    cu_seqlens_kv.len(),
                    cu_seqlens_kv.len() - 1,
                    cu_seqlens_q.len(),
                    cu_seqlens_q.len() - 1
                ),
            });
        }
        self.shape_of(0).validate()?;
        let (total_q, total_kv) = self.totals();
        // The per-row state of every sequence together: the limit the padded call has.
        let totals = AttnShape {
            seq_q: total_q,
            seq_kv: total_kv,
            ..self.shape_of(0)
        };
        totals.validate_sizes()?;
        // With head_dim 0, the scores the sequences declare: each sees only its own keys, so
        // the totals' `total_q × total_kv` would count pairs no call computes.
        if dims.head_dim == 0 {
            let scores = (0..self.batch())
                .map(|b| {
                    let (q, kv) = self.ranges(b);
                    (dims.n_heads as u128) * (q.len() as u128) * (kv.len() as u128)
                })
                .fold(0u128, u128::saturating_add);
            crate::shape::check_empty_head_scores(&totals.score_dims(), scores)?;
        }
        check_len("q", &[total_q, dims.n_heads, dims.head_dim], q.len())?;
        check_len("k", &[total_kv, dims.n_kv_heads, dims.head_dim], k.len())?;
        check_len("v", &[total_kv, dims.n_kv_heads, dims.value_dim], v.len())
    }

    /// How many sequences the batch holds.
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len() - 1
    }

    /// `(total_q, total_kv)`: the last offsets.
    pub fn totals(&self) -> (usize, usize) {
        (
            *self.cu_seqlens_q.last().unwrap_or(&0),
            *self.cu_seqlens_kv.last().unwrap_or(&0),
        )
    }

    /// The query and key/value token ranges of sequence `b`.
    fn ranges(&self, b: usize) -> (Range<usize>, Range<usize>) {
        (
            self.cu_seqlens_q[b]..self.cu_seqlens_q[b + 1],
            self.cu_seqlens_kv[b]..self.cu_seqlens_kv[b + 1],
        )
    }

    /// The shape of sequence `b` run alone (batch 1); the longest lengths when `b` is past the
    /// last sequence.
    fn shape_of(&self, b: usize) -> AttnShape {
        let len = |cu: &[usize], b: usize| cu.get(b + 1).map_or(0, |&end| end - cu[b]);
        let (seq_q, seq_kv) = if b < self.batch() {
            (len(self.cu_seqlens_q, b), len(self.cu_seqlens_kv, b))
        } else {
            let longest = |cu: &[usize]| (0..cu.len() - 1).map(|b| len(cu, b)).max();
            (
                longest(self.cu_seqlens_q).unwrap_or(0),
                longest(self.cu_seqlens_kv).unwrap_or(0),
            )
        };
        AttnShape {
            batch: 1,
            n_heads: self.dims.n_heads,
            n_kv_heads: self.dims.n_kv_heads,
            seq_q,
            seq_kv,
            head_dim: self.dims.head_dim,
            value_dim: self.dims.value_dim,
        }
    }

    /// Sequence `b` alone: q, k and v as `[1, heads, seq, width]` tensors.
    fn gather(&self, b: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let PackedDims {
            n_heads,
            n_kv_heads,
            head_dim,
            value_dim,
        } = self.dims;
        let (rq, rkv) = self.ranges(b);
        (
            to_heads(
                &self.q[rq.start * n_heads * head_dim..][..rq.len() * n_heads * head_dim],
                n_heads,
                head_dim,
            ),
            to_heads(
                &self.k[rkv.start * n_kv_heads * head_dim..][..rkv.len() * n_kv_heads * head_dim],
                n_kv_heads,
                head_dim,
            ),
            to_heads(
                &self.v[rkv.start * n_kv_heads * value_dim..][..rkv.len() * n_kv_heads * value_dim],
                n_kv_heads,
                value_dim,
            ),
        )
    }
}

/// `[seq, heads, width]` → `[heads, seq, width]`.
fn to_heads(x: &[f32], heads: usize, width: usize) -> Vec<f32> {
    let seq = x.len().checked_div(heads * width).unwrap_or(0);
    let mut y = vec![0.0; x.len()];
    for t in 0..seq {
        for h in 0..heads {
            y[(h * seq + t) * width..][..width]
                .copy_from_slice(&x[(t * heads + h) * width..][..width]);
        }
    }
    y
}

/// `[heads, seq, width]` → `[seq, heads, width]`, written into `dst`.
fn to_tokens(x: &[f32], heads: usize, width: usize, dst: &mut [f32]) {
    let seq = x.len().checked_div(heads * width).unwrap_or(0);
    for t in 0..seq {
        for h in 0..heads {
            dst[(t * heads + h) * width..][..width]
                .copy_from_slice(&x[(h * seq + t) * width..][..width]);
        }
    }
}

/// The options for sequence `b` run alone: dropout reseeded so that index `(0, h, i, j)` under
/// the new seed draws what `(b, h, i, j)` draws under the old one (the first SplitMix64 step
/// of [`Dropout::keep`] mixes `seed ^ b`).
fn options_for(options: &AttnOptions, b: usize) -> AttnOptions {
    let mut opt = options.clone();
    if let Some(d) = options.dropout {
        opt.dropout = Some(Dropout {
            p: d.p,
            seed: d.seed ^ b as u64,
        });
    }
    opt
}

/// An error of sequence `b`'s own call, as the packed call's: a score overflow names the
/// sequence as its batch (its own call has batch 0) and the row within it; a gradient
/// overflow, whose index is into the sequence's `[heads, seq, width]` gradient, the packed
/// `[tokens, heads, width]` one.
fn in_sequence(err: AttnError, b: usize, input: &PackedInput<'_>) -> AttnError {
    match err {
        AttnError::ScoreOverflow { head, row, .. } => AttnError::ScoreOverflow {
            batch: b,
            head,
            row,
        },
        AttnError::GradientOverflow { tensor, index } => {
            let dims = input.dims;
            let (rq, rkv) = input.ranges(b);
            let (heads, width, range) = match tensor {
                "dq" => (dims.n_heads, dims.head_dim, rq),
                "dk" => (dims.n_kv_heads, dims.head_dim, rkv),
                _ => (dims.n_kv_heads, dims.value_dim, rkv),
            };
            let (h, t) = (index / width / range.len(), index / width % range.len());
            AttnError::GradientOverflow {
                tensor,
                index: ((range.start + t) * heads + h) * width + index % width,
            }
        }
        other => other,
    }
}

/// Refuses what a packed batch cannot take, and checks the rest against the longest sequence.
/// NaN and ∞ are looked for here, in the packed tensors: each sequence's own call would name an
/// index into its gathered copy (a NaN at `q[4]` was reported at `q[0]`).
fn check_options(input: &PackedInput<'_>, options: &AttnOptions) -> Result<(), AttnError> {
    input.check()?;
    check_finite("q", input.q)?;
    check_finite("k", input.k)?;
    check_finite("v", input.v)?;
    let refuse = |option: &'static str, what: &str| {
        Err(AttnError::InvalidOption {
            option,
            reason: format!(
                "{what} assumes a padded batch; a packed batch has no padding (run the padded \
                 batch through sdpa instead)"
            ),
        })
    };
    if options.bool_mask.is_some() {
        return refuse("bool_mask", "a mask tensor");
    }
    if options.float_mask.is_some() {
        return refuse("float_mask", "a mask tensor");
    }
    if options.key_padding.is_some() {
        return refuse("key_padding", "key padding");
    }
    if options.weights != WeightsRequest::None {
        return Err(AttnError::InvalidOption {
            option: "weights",
            reason: "a packed call returns no weights; run a sequence alone through sdpa for them"
                .into(),
        });
    }
    options.validate(&input.shape_of(input.batch()))
}

/// Attention over a packed batch: every sequence on its own, the results packed again.
///
/// # Shapes
/// - `input`: see [`PackedInput`]
/// - output `out`: `[total_q, n_heads, value_dim]`, `lse`: `[n_heads, total_q]`
///
/// # Errors
/// A mask, key padding or a weights request in `options`, and whatever
/// [`AttnOptions::validate`] rejects.
pub fn sdpa_varlen(
    input: &PackedInput<'_>,
    options: &AttnOptions,
) -> Result<PackedOutput, AttnError> {
    check_options(input, options)?;
    let PackedDims {
        n_heads, value_dim, ..
    } = input.dims;
    let (total_q, _) = input.totals();
    let results = (0..input.batch())
        .into_par_iter()
        .map(|b| {
            let (q, k, v) = input.gather(b);
            // Checked finite in packed form (`check_options`).
            let one = AttnInput::allowing_non_finite(&q, &k, &v, input.shape_of(b))?;
            sdpa(&one, &options_for(options, b)).map_err(|e| in_sequence(e, b, input))
        })
        .collect::<Result<Vec<_>, AttnError>>()?;
    let mut out = vec![0.0; total_q * n_heads * value_dim];
    let mut lse = vec![f32::NEG_INFINITY; n_heads * total_q];
    for (b, r) in results.iter().enumerate() {
        let (rq, _) = input.ranges(b);
        let width = n_heads * value_dim;
        to_tokens(
            &r.out,
            n_heads,
            value_dim,
            &mut out[rq.start * width..][..rq.len() * width],
        );
        for h in 0..n_heads {
            lse[h * total_q + rq.start..][..rq.len()]
                .copy_from_slice(&r.lse[h * rq.len()..][..rq.len()]);
        }
    }
    Ok(PackedOutput { out, lse })
}

/// Gradients of `sum(out · dout)` over a packed batch, sequence by sequence.
///
/// # Shapes
/// - `input`: see [`PackedInput`]
/// - `fwd`: what [`sdpa_varlen`] returned for `input` and `options`
/// - `dout`: `[total_q, n_heads, value_dim]`
/// - returns `dq`, `dk`, `dv` shaped like `input.q`, `input.k`, `input.v`.
///
/// # Errors
/// As [`sdpa_varlen`], saved results or a `dout` of the wrong length, and gradients that
/// overflow f32 ([`AttnError::GradientOverflow`], its index into the packed
/// `[tokens, heads, width]` gradient).
pub fn sdpa_varlen_backward(
    input: &PackedInput<'_>,
    options: &AttnOptions,
    fwd: &PackedOutput,
    dout: &[f32],
) -> Result<Grads, AttnError> {
    check_options(input, options)?;
    let PackedDims {
        n_heads,
        n_kv_heads,
        head_dim,
        value_dim,
    } = input.dims;
    let (total_q, total_kv) = input.totals();
    check_len("out", &[total_q, n_heads, value_dim], fwd.out.len())?;
    check_len("lse", &[n_heads, total_q], fwd.lse.len())?;
    check_len("dout", &[total_q, n_heads, value_dim], dout.len())?;
    check_finite("dout", dout)?;
    check_finite("out", &fwd.out)?;
    check_saved_lse(&fwd.lse)?;
    let width = n_heads * value_dim;
    let results = (0..input.batch())
        .into_par_iter()
        .map(|b| {
            let (q, k, v) = input.gather(b);
            let (rq, _) = input.ranges(b);
            let tokens = |x: &[f32]| {
                to_heads(
                    &x[rq.start * width..][..rq.len() * width],
                    n_heads,
                    value_dim,
                )
            };
            let lse: Vec<f32> = (0..n_heads)
                .flat_map(|h| {
                    fwd.lse[h * total_q + rq.start..][..rq.len()]
                        .iter()
                        .copied()
                })
                .collect();
            let forward = AttnOutput {
                out: tokens(&fwd.out),
                lse,
                weights: None,
            };
            sdpa_backward(
                &AttnInput::allowing_non_finite(&q, &k, &v, input.shape_of(b))?,
                &options_for(options, b),
                &forward,
                &tokens(dout),
            )
            .map_err(|e| in_sequence(e, b, input))
        })
        .collect::<Result<Vec<_>, AttnError>>()?;
    let mut g = Grads {
        dq: vec![0.0; total_q * n_heads * head_dim],
        dk: vec![0.0; total_kv * n_kv_heads * head_dim],
        dv: vec![0.0; total_kv * n_kv_heads * value_dim],
        dmask: None,
    };
    for (b, r) in results.iter().enumerate() {
        let (rq, rkv) = input.ranges(b);
        let put = |x: &[f32], heads: usize, w: usize, dst: &mut [f32], range: &Range<usize>| {
            to_tokens(
                x,
                heads,
                w,
                &mut dst[range.start * heads * w..][..range.len() * heads * w],
            );
        };
        put(&r.dq, n_heads, head_dim, &mut g.dq, &rq);
        put(&r.dk, n_kv_heads, head_dim, &mut g.dk, &rkv);
        put(&r.dv, n_kv_heads, value_dim, &mut g.dv, &rkv);
    }
    Ok(g)
}
