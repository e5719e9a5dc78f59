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

use std::collections::HashMap;

use crate::shape::check_len;
use crate::{AttnError, AttnInput, AttnOptions, AttnShape, Weights, sdpa};

/// The sizes of a multi-head attention module (PyTorch's constructor arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MhaConfig {
    /// Width of the query and of the output, `E`.
    pub embed_dim: usize,
    pub num_heads: usize,
    /// Width of the key input (PyTorch's `kdim`, `E` by default).
    pub kdim: usize,
    /// Width of the value input (PyTorch's `vdim`, `E` by default).
    pub vdim: usize,
}

impl MhaConfig {
    /// `embed_dim` split over `num_heads`, with `kdim = vdim = embed_dim`. Fails when
    /// `embed_dim % num_heads != 0` (or either is 0).
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
        if num_heads == 0 || embed_dim == 0 || embed_dim % num_heads != 0 {
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

    /// Width of one head: `embed_dim / num_heads`.
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
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
            check_len(name, &[out_dim], b.len())?;
        }
        Ok(Linear {
            in_dim,
            out_dim,
            weight,
            bias,
        })
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

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
    pub query: &'a [f32],
    pub key: &'a [f32],
    pub value: &'a [f32],
    pub batch: usize,
    pub seq_q: usize,
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
        check_len("query", &[b, l, c.embed_dim], input.query.len())?;
        check_len("key", &[b, s, c.kdim], input.key.len())?;
        check_len("value", &[b, s, c.vdim], input.value.len())?;

        let (h, hd) = (c.num_heads, c.head_dim());
        // [b, seq, E] → [b, h, seq, hd]
        let q = split_heads(&self.q_proj.forward(input.query), b, l, h, hd);
        let k = split_heads(&self.k_proj.forward(input.key), b, s, h, hd);
        let v = split_heads(&self.v_proj.forward(input.value), b, s, h, hd);
        let shape = AttnShape::new(b, h, l, s, hd);
        let attn = sdpa(&AttnInput::new(&q, &k, &v, shape)?, options)?;
        // [b, h, l, hd] → [b, l, E], then the output projection.
        let merged = merge_heads(&attn.out, b, l, h, hd);
        Ok(MhaOutput {
            out: self.out_proj.forward(&merged),
            weights: attn.weights,
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
