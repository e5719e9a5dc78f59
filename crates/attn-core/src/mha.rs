//! Multi-head attention as PyTorch's `torch.nn.MultiheadAttention` computes it (batch first):
//! project the query, key and value, split the embedding into heads, run [`crate::sdpa`] on every
//! head, concatenate the heads and apply the output projection.
//!
//! Mirrors `multi_head_attention_forward` in PyTorch's `torch/nn/functional.py`
//! (<https://github.com/pytorch/pytorch/blob/v2.5.0/torch/nn/functional.py>), and loads its
//! state dict: `in_proj_weight` `[3E, E]` packed as `[W_q; W_k; W_v]`, or `q_proj_weight`,
//! `k_proj_weight`, `v_proj_weight` when `kdim`/`vdim` differ from `E`; `in_proj_bias` `[3E]`;
//! `out_proj.weight` `[E, E]`, `out_proj.bias` `[E]`. Every projection is `y = x·Wᵀ + b`.
//!
//! Masks are this crate's types ([`crate::BoolMask`]: `true` = may attend; [`crate::KeyPadding`]:
//! `true` = a real key), given through [`AttnOptions`] — the opposite of PyTorch's MHA
//! convention, where `True` means "ignore".
//!
//! [`MultiheadAttention::backward`] gives the gradients of `sum(out · dout)` with respect to the
//! inputs and to every parameter: back through the output projection, [`crate::sdpa_backward`]
//! per head, then the three input projections (for `y = x·Wᵀ + b`: `dW = dyᵀ·x`,
//! `db = Σ_rows dy`, `dx = dy·W`).

use std::collections::HashMap;

use crate::shape::{check_finite, check_len};
use crate::{
    AttnError, AttnInput, AttnOptions, AttnShape, Dropout, Weights, WeightsRequest, sdpa,
    sdpa_backward,
};

/// The sizes of a multi-head attention module (PyTorch's constructor arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MhaConfig {
    /// Width of the query and of the output, `E`.
    pub embed_dim: usize,
    /// Heads, `H`: each gets `E / H` of the width.
    pub num_heads: usize,
    /// Width of the key input (PyTorch's `kdim`, `E` by default).
    pub kdim: usize,
    /// Width of the value input (PyTorch's `vdim`, `E` by default).
    pub vdim: usize,
}

impl MhaConfig {
    /// `embed_dim` split over `num_heads`, with `kdim = vdim = embed_dim`. Fails when
    /// `embed_dim % num_heads != 0`, or either is 0.
    pub fn new(embed_dim: usize, num_heads: usize) -> Result<Self, AttnError> {
        Self::with_kv_dims(embed_dim, num_heads, embed_dim, embed_dim)
    }

    /// Like [`MhaConfig::new`], with key and value inputs of their own widths.
    pub fn with_kv_dims(
        embed_dim: usize,
        num_heads: usize,
        kdim: usize,
        vdim: usize,
    ) -> Result<Self, AttnError> {
        for (option, dim) in [("embed_dim", embed_dim), ("num_heads", num_heads)] {
            if dim == 0 {
                return Err(AttnError::InvalidOption {
                    option,
                    reason: "must be at least 1".to_string(),
                });
            }
        }
        if !embed_dim.is_multiple_of(num_heads) {
            return Err(AttnError::EmbedNotDivisible {
                embed_dim,
                num_heads,
            });
        }
        for (option, dim) in [("kdim", kdim), ("vdim", vdim)] {
            if dim == 0 {
                return Err(AttnError::InvalidOption {
                    option,
                    reason: "must be at least 1".to_string(),
                });
            }
        }
        // The packed projection [3E, max(E, kdim, vdim)] must be countable.
        let widest = embed_dim.max(kdim).max(vdim);
        if crate::shape::checked_numel(&[3, embed_dim, widest]).is_none() {
            return Err(AttnError::TooLarge {
                what: "the three input projections",
                shape: vec![3, embed_dim, widest],
                bytes: u128::MAX,
            });
        }
        Ok(MhaConfig {
            embed_dim,
            num_heads,
            kdim,
            vdim,
        })
    }

    /// Width of one head: `embed_dim / num_heads` (0 for a config of no heads, which only a
    /// struct literal can make and no module accepts).
    pub fn head_dim(&self) -> usize {
        self.embed_dim.checked_div(self.num_heads).unwrap_or(0)
    }

    /// The checks of [`MhaConfig::with_kv_dims`] again: the fields are public, so a config
    /// built without it may have no heads (a division by 0 in `forward`) or a `kdim` of 0.
    fn checked(self) -> Result<Self, AttnError> {
        Self::with_kv_dims(self.embed_dim, self.num_heads, self.kdim, self.vdim)
    }
}

/// A dense layer `y = x·Wᵀ + b`, PyTorch's `nn.Linear` layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    in_dim: usize,
    out_dim: usize,
    /// `[out_dim, in_dim]`, row-major.
    weight: Vec<f32>,
    /// `[out_dim]`
    bias: Option<Vec<f32>>,
}

impl Linear {
    /// # Shapes
    /// - `weight`: `[out_dim, in_dim]`
    /// - `bias`: `[out_dim]`
    ///
    /// `name` names the weight in errors.
    pub fn new(
        name: &'static str,
        weight: Vec<f32>,
        out_dim: usize,
        in_dim: usize,
        bias: Option<Vec<f32>>,
    ) -> Result<Self, AttnError> {
        check_len(name, &[out_dim, in_dim], weight.len())?;
        if let Some(b) = &bias {
            check_len(bias_name(name), &[out_dim], b.len())?;
        }
        Ok(Linear {
            in_dim,
            out_dim,
            weight,
            bias,
        })
    }

    /// Input width (the weight's columns).
    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    /// Output width (the weight's rows).
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// # Shapes
    /// - `x`: `[rows, in_dim]` (checked by the caller)
    /// - returns `[rows, out_dim]`
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        debug_assert_eq!(x.len() % self.in_dim.max(1), 0);
        let rows = x.len().checked_div(self.in_dim).unwrap_or(0);
        let mut y = Vec::with_capacity(rows * self.out_dim);
        for r in 0..rows {
            let x_row = &x[r * self.in_dim..][..self.in_dim];
            for o in 0..self.out_dim {
                let w_row = &self.weight[o * self.in_dim..][..self.in_dim];
                let dot: f32 = x_row.iter().zip(w_row).map(|(a, b)| a * b).sum();
                y.push(dot + self.bias.as_ref().map_or(0.0, |b| b[o]));
            }
        }
        y
    }

    /// Gradients of a loss through `y = x·Wᵀ + b`, given `dy` at the output: the parameters'
    /// gradients and `dx`.
    ///
    /// # Shapes
    /// - `x`: `[rows, in_dim]`, `dy`: `[rows, out_dim]` (checked by the caller)
    /// - returns weight `[out_dim, in_dim]`, bias `[out_dim]` and `dx` `[rows, in_dim]`.
    fn backward(&self, x: &[f32], dy: &[f32]) -> (LinearGrads, Vec<f32>) {
        let (n_in, n_out) = (self.in_dim, self.out_dim);
        let rows = x.len().checked_div(n_in).unwrap_or(0);
        debug_assert_eq!(dy.len(), rows * n_out);
        let mut weight = vec![0.0f32; n_out * n_in];
        let mut dx = vec![0.0f32; rows * n_in];
        for r in 0..rows {
            let (x_row, dy_row) = (&x[r * n_in..][..n_in], &dy[r * n_out..][..n_out]);
            let dx_row = &mut dx[r * n_in..][..n_in];
            for (o, &g) in dy_row.iter().enumerate() {
                let w_row = &self.weight[o * n_in..][..n_in];
                // dW[o, :] += dy[r, o]·x[r, :];  dx[r, :] += dy[r, o]·W[o, :]
                for ((dw, &xv), (d, &w)) in (weight[o * n_in..][..n_in].iter_mut().zip(x_row))
                    .zip(dx_row.iter_mut().zip(w_row))
                {
                    *dw += g * xv;
                    *d += g * w;
                }
            }
        }
        let bias = self.bias.as_ref().map(|_| {
            let mut db = vec![0.0f32; n_out];
            for dy_row in dy.chunks_exact(n_out.max(1)) {
                db.iter_mut().zip(dy_row).for_each(|(b, &g)| *b += g);
            }
            db
        });
        (LinearGrads { weight, bias }, dx)
    }
}

/// Gradients of one [`Linear`] layer's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearGrads {
    /// `[out_dim, in_dim]`
    pub weight: Vec<f32>,
    /// `[out_dim]`; `None` when the layer has no bias.
    pub bias: Option<Vec<f32>>,
}

/// Gradients of `sum(out · dout)` for one multi-head attention call: with respect to its three
/// inputs and to every parameter. For self-attention (query = key = value = `x`) the gradient
/// of `x` is `query + key + value`.
#[derive(Debug, Clone, PartialEq)]
pub struct MhaGrads {
    /// `[batch, seq_q, embed_dim]`
    pub query: Vec<f32>,
    /// `[batch, seq_kv, kdim]`
    pub key: Vec<f32>,
    /// `[batch, seq_kv, vdim]`
    pub value: Vec<f32>,
    /// `[embed_dim, embed_dim]` and `[embed_dim]`
    pub q_proj: LinearGrads,
    /// `[embed_dim, kdim]` and `[embed_dim]`
    pub k_proj: LinearGrads,
    /// `[embed_dim, vdim]` and `[embed_dim]`
    pub v_proj: LinearGrads,
    /// `[embed_dim, embed_dim]` and `[embed_dim]`
    pub out_proj: LinearGrads,
}

/// A state dict: tensor name → (dims, row-major f32 values), with PyTorch's names.
pub type StateDict = HashMap<String, (Vec<usize>, Vec<f32>)>;

const KNOWN_TENSORS: &str = "in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, \
                             in_proj_bias, out_proj.weight, out_proj.bias";

/// Multi-head attention with input and output projections (`torch.nn.MultiheadAttention`).
#[derive(Debug, Clone, PartialEq)]
pub struct MultiheadAttention {
    config: MhaConfig,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    out_proj: Linear,
}

/// The inputs of one multi-head attention call, batch first.
///
/// # Shapes
/// - `query`: `[batch, seq_q, embed_dim]`
/// - `key`: `[batch, seq_kv, kdim]`
/// - `value`: `[batch, seq_kv, vdim]`
#[derive(Debug, Clone, Copy)]
pub struct MhaInput<'a> {
    /// `[batch, seq_q, embed_dim]`
    pub query: &'a [f32],
    /// `[batch, seq_kv, kdim]`
    pub key: &'a [f32],
    /// `[batch, seq_kv, vdim]`
    pub value: &'a [f32],
    /// Independent sequences.
    pub batch: usize,
    /// Queries per sequence.
    pub seq_q: usize,
    /// Keys and values per sequence.
    pub seq_kv: usize,
}

impl<'a> MhaInput<'a> {
    /// Self-attention: query, key and value are all `x`.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, embed_dim]`
    pub fn self_attention(x: &'a [f32], batch: usize, seq: usize) -> Self {
        MhaInput {
            query: x,
            key: x,
            value: x,
            batch,
            seq_q: seq,
            seq_kv: seq,
        }
    }
}

/// The result of a multi-head attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct MhaOutput {
    /// `[batch, seq_q, embed_dim]`, after the output projection.
    pub out: Vec<f32>,
    /// The attention weights as [`AttnOptions::weights`] asked: per head
    /// (`All`: `[batch, num_heads, seq_q, seq_kv]`) or averaged over heads
    /// (`HeadAverage`: `[batch, seq_q, seq_kv]`, PyTorch's `average_attn_weights=True`).
    pub weights: Option<Weights>,
}

/// Checks the call's three inputs against `config`, and that they are finite: a NaN in
/// `query` would otherwise be reported in the projected queries' layout, as `q`.
fn check_inputs(c: &MhaConfig, input: &MhaInput<'_>) -> Result<(), AttnError> {
    let (b, l, s) = (input.batch, input.seq_q, input.seq_kv);
    check_len("query", &[b, l, c.embed_dim], input.query.len())?;
    check_len("key", &[b, s, c.kdim], input.key.len())?;
    check_len("value", &[b, s, c.vdim], input.value.len())?;
    check_finite("query", input.query)?;
    check_finite("key", input.key)?;
    check_finite("value", input.value)
}

impl MultiheadAttention {
    /// Builds the module from its four projections, checking each against `config`:
    /// `q_proj` `E → E`, `k_proj` `kdim → E`, `v_proj` `vdim → E`, `out_proj` `E → E`.
    pub fn new(
        config: MhaConfig,
        q_proj: Linear,
        k_proj: Linear,
        v_proj: Linear,
        out_proj: Linear,
    ) -> Result<Self, AttnError> {
        let config = config.checked()?;
        let e = config.embed_dim;
        for (name, proj, in_dim) in [
            ("q_proj_weight", &q_proj, e),
            ("k_proj_weight", &k_proj, config.kdim),
            ("v_proj_weight", &v_proj, config.vdim),
            ("out_proj.weight", &out_proj, e),
        ] {
            if proj.out_dim != e || proj.in_dim != in_dim {
                return Err(AttnError::ShapeMismatch {
                    tensor: name,
                    expected: vec![e, in_dim],
                    got: vec![proj.out_dim, proj.in_dim],
                });
            }
        }
        // A NaN or ∞ parameter would make every output NaN or ∞ without a word.
        for (name, data) in [
            ("q_proj_weight", Some(&q_proj.weight)),
            ("q_proj bias", q_proj.bias.as_ref()),
            ("k_proj_weight", Some(&k_proj.weight)),
            ("k_proj bias", k_proj.bias.as_ref()),
            ("v_proj_weight", Some(&v_proj.weight)),
            ("v_proj bias", v_proj.bias.as_ref()),
            ("out_proj.weight", Some(&out_proj.weight)),
            ("out_proj.bias", out_proj.bias.as_ref()),
        ] {
            check_finite(name, data.map_or(&[][..], |d| d))?;
        }
        Ok(MultiheadAttention {
            config,
            q_proj,
            k_proj,
            v_proj,
            out_proj,
        })
    }

    /// Loads a PyTorch `nn.MultiheadAttention` state dict (names without a prefix). Either the
    /// packed `in_proj_weight` `[3E, E]` (only when `kdim = vdim = E`) or the three separate
    /// `q/k/v_proj_weight`; the biases are optional. Any other tensor is an error, as PyTorch's
    /// strict loading does (`bias_k`/`bias_v` of `add_bias_kv` are not supported).
    pub fn from_state_dict(config: MhaConfig, state: &StateDict) -> Result<Self, AttnError> {
        let config = config.checked()?;
        if let Some(name) = state.keys().find(|name| {
            !KNOWN_TENSORS
                .split(", ")
                .any(|known| known == name.as_str())
        }) {
            return Err(AttnError::UnexpectedTensor {
                name: name.clone(),
                known: KNOWN_TENSORS,
            });
        }
        let e = config.embed_dim;
        let take = |name: &'static str, dims: &[usize]| -> Result<Option<Vec<f32>>, AttnError> {
            let Some((got_dims, data)) = state.get(name) else {
                return Ok(None);
            };
            if got_dims.as_slice() != dims {
                return Err(AttnError::ShapeMismatch {
                    tensor: name,
                    expected: dims.to_vec(),
                    got: got_dims.clone(),
                });
            }
            check_len(name, dims, data.len())?;
            check_finite(name, data)?;
            Ok(Some(data.clone()))
        };
        let in_bias = take("in_proj_bias", &[3 * e])?;
        let bias_part = |i: usize| in_bias.as_ref().map(|b| b[i * e..(i + 1) * e].to_vec());
        let (q_w, k_w, v_w) = if state.contains_key("in_proj_weight") {
            if let Some(name) = ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
                .into_iter()
                .find(|n| state.contains_key(*n))
            {
                return Err(AttnError::UnexpectedTensor {
                    name: format!("{name} (besides the packed in_proj_weight)"),
                    known: KNOWN_TENSORS,
                });
            }
            if config.kdim != e || config.vdim != e {
                return Err(AttnError::InvalidOption {
                    option: "in_proj_weight",
                    reason: format!(
                        "a packed projection needs kdim = vdim = embed_dim ({e}), got kdim {} \
                         and vdim {}; give q/k/v_proj_weight instead",
                        config.kdim, config.vdim
                    ),
                });
            }
            let packed = take("in_proj_weight", &[3 * e, e])?.ok_or(AttnError::MissingTensor {
                name: "in_proj_weight",
            })?;
            let part = |i: usize| packed[i * e * e..(i + 1) * e * e].to_vec();
            (part(0), part(1), part(2))
        } else {
            let need = |name: &'static str, in_dim: usize| {
                take(name, &[e, in_dim])?.ok_or(AttnError::MissingTensor { name })
            };
            (
                need("q_proj_weight", e)?,
                need("k_proj_weight", config.kdim)?,
                need("v_proj_weight", config.vdim)?,
            )
        };
        let out_w = take("out_proj.weight", &[e, e])?.ok_or(AttnError::MissingTensor {
            name: "out_proj.weight",
        })?;
        let out_b = take("out_proj.bias", &[e])?;
        Self::new(
            config,
            Linear::new("q_proj_weight", q_w, e, e, bias_part(0))?,
            Linear::new("k_proj_weight", k_w, e, config.kdim, bias_part(1))?,
            Linear::new("v_proj_weight", v_w, e, config.vdim, bias_part(2))?,
            Linear::new("out_proj.weight", out_w, e, e, out_b)?,
        )
    }

    /// The module's sizes.
    pub fn config(&self) -> &MhaConfig {
        &self.config
    }

    /// Multi-head attention through the fast [`crate::sdpa`]. `options` apply per head over
    /// `[batch, num_heads, seq_q, seq_kv]` scores: masks, key padding, causal, dropout, and which
    /// weights to return (`All` = per head, `HeadAverage` = PyTorch's averaged weights).
    ///
    /// # Shapes
    /// - `input.query`: `[batch, seq_q, embed_dim]`
    /// - `input.key`: `[batch, seq_kv, kdim]`
    /// - `input.value`: `[batch, seq_kv, vdim]`
    /// - output `out`: `[batch, seq_q, embed_dim]`; weights as [`MhaOutput::weights`] says.
    pub fn forward(
        &self,
        input: &MhaInput<'_>,
        options: &AttnOptions,
    ) -> Result<MhaOutput, AttnError> {
        let c = &self.config;
        let (b, l, s) = (input.batch, input.seq_q, input.seq_kv);
        check_inputs(c, input)?;

        let (h, hd) = (c.num_heads, c.head_dim());
        // [b, seq, E] → [b, h, seq, hd]
        let q = split_heads(&self.q_proj.forward(input.query), b, l, h, hd);
        let k = split_heads(&self.k_proj.forward(input.key), b, s, h, hd);
        let v = split_heads(&self.v_proj.forward(input.value), b, s, h, hd);
        let shape = AttnShape::new(b, h, l, s, hd);
        let input = AttnInput::new(&q, &k, &v, shape)?;
        // PyTorch's module returns the weights after dropout, averaged over heads after it: ask
        // for every head's weights, drop them, then average.
        let attn = match (options.dropout, &options.weights) {
            (Some(_), WeightsRequest::HeadAverage) => {
                let per_head = AttnOptions {
                    weights: WeightsRequest::All,
                    ..options.clone()
                };
                sdpa(&input, &per_head)?
            }
            _ => sdpa(&input, options)?,
        };
        let weights = match options.dropout {
            Some(d) => attn
                .weights
                .map(|w| dropped(w, d, &shape, &options.weights)),
            None => attn.weights,
        };
        // [b, h, l, hd] → [b, l, E], then the output projection.
        let merged = merge_heads(&attn.out, b, l, h, hd);
        Ok(MhaOutput {
            out: self.out_proj.forward(&merged),
            weights,
        })
    }
}

impl MultiheadAttention {
    /// Gradients of `sum(out · dout)` with respect to the inputs and every parameter, for the
    /// call [`MultiheadAttention::forward`] makes with the same `input` and `options` (its
    /// dropout mask is replayed; `options.weights` is ignored). The forward pass is recomputed.
    ///
    /// # Shapes
    /// - `input`: as [`MultiheadAttention::forward`]
    /// - `dout`: `[batch, seq_q, embed_dim]`
    /// - returns [`MhaGrads`], each gradient shaped like what it differentiates.
    ///
    /// # Errors
    /// What [`MultiheadAttention::forward`] rejects, and a `dout` of the wrong length or with a
    /// non-finite value.
    pub fn backward(
        &self,
        input: &MhaInput<'_>,
        options: &AttnOptions,
        dout: &[f32],
    ) -> Result<MhaGrads, AttnError> {
        let c = &self.config;
        let (b, l, s) = (input.batch, input.seq_q, input.seq_kv);
        check_inputs(c, input)?;
        check_len("dout", &[b, l, c.embed_dim], dout.len())?;
        check_finite("dout", dout)?;
        let options = AttnOptions {
            weights: WeightsRequest::None,
            ..options.clone()
        };

        let (h, hd) = (c.num_heads, c.head_dim());
        let q = split_heads(&self.q_proj.forward(input.query), b, l, h, hd);
        let k = split_heads(&self.k_proj.forward(input.key), b, s, h, hd);
        let v = split_heads(&self.v_proj.forward(input.value), b, s, h, hd);
        let attn_input = AttnInput::new(&q, &k, &v, AttnShape::new(b, h, l, s, hd))?;
        let attn = sdpa(&attn_input, &options)?;
        let merged = merge_heads(&attn.out, b, l, h, hd);

        // Back through out = merged·W_outᵀ + b_out, then attention, then the projections.
        let (out_proj, d_merged) = self.out_proj.backward(&merged, dout);
        let d_attn = split_heads(&d_merged, b, l, h, hd);
        let g = sdpa_backward(&attn_input, &options, &attn, &d_attn)?;
        let (q_proj, query) = self
            .q_proj
            .backward(input.query, &merge_heads(&g.dq, b, l, h, hd));
        let (k_proj, key) = self
            .k_proj
            .backward(input.key, &merge_heads(&g.dk, b, s, h, hd));
        let (v_proj, value) = self
            .v_proj
            .backward(input.value, &merge_heads(&g.dv, b, s, h, hd));
        Ok(MhaGrads {
            query,
            key,
            value,
            q_proj,
            k_proj,
            v_proj,
            out_proj,
        })
    }
}

/// `[batch, seq, n_heads · head_dim]` → `[batch, n_heads, seq, head_dim]`.
fn split_heads(x: &[f32], batch: usize, seq: usize, n_heads: usize, head_dim: usize) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for b in 0..batch {
        for t in 0..seq {
            for h in 0..n_heads {
                let src = ((b * seq + t) * n_heads + h) * head_dim;
                let dst = ((b * n_heads + h) * seq + t) * head_dim;
                y[dst..dst + head_dim].copy_from_slice(&x[src..src + head_dim]);
            }
        }
    }
    y
}

/// `[batch, n_heads, seq, head_dim]` → `[batch, seq, n_heads · head_dim]`.
/// The name of the bias that goes with the weight `name`, for errors.
fn bias_name(name: &'static str) -> &'static str {
    match name {
        "out_proj.weight" => "out_proj.bias",
        "q_proj_weight" | "k_proj_weight" | "v_proj_weight" => "in_proj_bias",
        other => other,
    }
}

/// The weights `w` of a call on `shape` after dropout `d`, as `asked` (all heads' weights
/// when the heads are to be averaged).
fn dropped(w: Weights, d: Dropout, shape: &AttnShape, asked: &WeightsRequest) -> Weights {
    let (b, h, l, s) = (shape.batch, shape.n_heads, shape.seq_q, shape.seq_kv);
    match w {
        Weights::All { dims, mut data } => {
            for (n, w) in data.iter_mut().enumerate() {
                let ((b, h, i), j) = (shape.query_row(n / s), n % s);
                *w = d.apply(*w, b, h, i, j);
            }
            match asked {
                WeightsRequest::HeadAverage => {
                    let per_batch = l * s;
                    let mut mean = vec![0.0f32; b * per_batch];
                    for (n, &w) in data.iter().enumerate() {
                        let (batch, at) = (n / (h * per_batch), n % per_batch);
                        mean[batch * per_batch + at] += w;
                    }
                    mean.iter_mut().for_each(|m| *m /= h as f32);
                    Weights::head_average(shape, mean)
                }
                _ => Weights::All { dims, data },
            }
        }
        Weights::Rows {
            rows,
            dims,
            mut data,
        } => {
            let n_rows = rows.len();
            for (n, w) in data.iter_mut().enumerate() {
                let (row, j) = (n / s, n % s);
                let i = rows[row % n_rows];
                *w = d.apply(*w, row / (h * n_rows), row / n_rows % h, i, j);
            }
            Weights::Rows { rows, dims, data }
        }
        average => average,
    }
}

fn merge_heads(x: &[f32], batch: usize, seq: usize, n_heads: usize, head_dim: usize) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for b in 0..batch {
        for h in 0..n_heads {
            for t in 0..seq {
                let src = ((b * n_heads + h) * seq + t) * head_dim;
                let dst = ((b * seq + t) * n_heads + h) * head_dim;
                y[dst..dst + head_dim].copy_from_slice(&x[src..src + head_dim]);
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_split_and_merge_back() {
        // [1, 2, 2·3] → [1, 2, 2, 3]: head 1 of token 0 is x[3..6].
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let split = split_heads(&x, 1, 2, 2, 3);
        assert_eq!(&split[6..9], &[3.0, 4.0, 5.0]);
        assert_eq!(merge_heads(&split, 1, 2, 2, 3), x);
    }

    #[test]
    fn linear_is_x_times_w_transposed_plus_b() {
        // W = [[1, 2], [3, 4], [5, 6]] (3 out, 2 in), b = [1, 0, -1], x = [1, 1]
        // → [1+2+1, 3+4+0, 5+6-1] = [4, 7, 10].
        let lin = Linear::new(
            "w",
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            3,
            2,
            Some(vec![1.0, 0.0, -1.0]),
        )
        .unwrap();
        assert_eq!(lin.forward(&[1.0, 1.0]), vec![4.0, 7.0, 10.0]);
    }
}
