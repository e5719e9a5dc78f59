//! Incremental GPT-2 decoding: a per-layer key/value cache that grows as tokens are fed, so
//! each new token costs one row per layer instead of a pass over the whole sequence.
//!
//! New tokens attend to every cached token and to each other with a bottom-right aligned
//! causal mask ([`Causal::BottomRight`]): the last query sees every key, as in transformers'
//! `GPT2Attention` with `layer_past`
//! (<https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/models/gpt2/modeling_gpt2.py>).
//! The numbers are those of the full masked pass ([`Model::forward`]) up to floating-point
//! summation order.

use attn_core::{AttnInput, AttnOptions, AttnShape, Causal, WeightsRequest};

use crate::model::{merge_heads, parallelism, split_heads};
use crate::ops::{bias_activation, gemm_bt, residual_bias_add};
use crate::{Model, ModelError, ModelKind};

/// Keys and values of every layer of one model for the tokens fed so far.
#[derive(Debug, Clone)]
pub struct KvCache<'m> {
    model: &'m Model,
    len: usize,
    /// Per layer: `[heads, len, head_dim]`.
    keys: Vec<Vec<f32>>,
    /// Per layer: `[heads, len, head_dim]`.
    values: Vec<Vec<f32>>,
}

/// What one [`KvCache::feed`] call returns for the tokens it fed.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// `[new, vocab]`: the next-token logits after each fed token.
    pub logits: Vec<f32>,
    /// `[new, cache_len]`: the last layer's attention of each fed token, averaged over the
    /// heads (`cache_len` counts the fed tokens too). Present when asked for.
    pub last_layer_attention: Option<Vec<f32>>,
}

impl<'m> KvCache<'m> {
    /// An empty cache for `model`, which must be a GPT-2-family model.
    pub fn new(model: &'m Model) -> Result<KvCache<'m>, ModelError> {
        let c = model.config();
        if c.kind != ModelKind::Gpt2 {
            return Err(ModelError::InvalidConfig {
                field: "model_type",
                reason: format!(
                    "{} is a BERT model; generating text needs a GPT-2-family model",
                    model.name()
                ),
            });
        }
        Ok(KvCache {
            model,
            len: 0,
            keys: vec![Vec::new(); c.n_layers],
            values: vec![Vec::new(); c.n_layers],
        })
    }

    /// How many tokens the cache holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs `ids` through the model after the cached tokens (at positions
    /// `len..len + ids.len()`) and appends their keys and values. Feeding the prompt at once and
    /// then one token at a time gives the logits of the full pass over the whole sequence.
    /// `attention` asks for the last layer's head-averaged attention of the fed tokens.
    ///
    /// Errors: no ids, an id outside the vocabulary, or more cached tokens than the model's
    /// `n_positions` ([`ModelError::TooLong`]); the cache is unchanged on error.
    ///
    /// # Shapes
    /// - `ids`: `[new]`; see [`Step`]
    pub fn feed(&mut self, ids: &[u32], attention: bool) -> Result<Step, ModelError> {
        let model = self.model;
        let c = model.config();
        let (h, n_heads, d) = (c.hidden_size, c.n_heads, c.head_dim());
        if ids.is_empty() {
            return Err(ModelError::EmptyText {
                which: "token list",
            });
        }
        let (past, new) = (self.len, ids.len());
        let total = past + new;
        if total > c.max_positions {
            return Err(ModelError::TooLong {
                tokens: total,
                max: c.max_positions,
            });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfVocab {
                id,
                vocab_size: c.vocab_size,
            });
        }

        let weights = model.weights();
        let par = parallelism();
        let mut hidden = vec![0.0f32; new * h];
        for (t, (&id, row)) in ids.iter().zip(hidden.chunks_exact_mut(h)).enumerate() {
            let word = &weights.word_embeddings[id as usize * h..][..h];
            let pos = &weights.position[(past + t) * h..][..h];
            row.iter_mut()
                .zip(word)
                .zip(pos)
                .for_each(|((v, w), p)| *v = w + p);
        }
        let mut normed = vec![0.0f32; new * h];
        let mut qkv = vec![0.0f32; new * 3 * h];
        let (mut q, mut k, mut v) = (
            vec![0.0f32; new * h],
            vec![0.0; new * h],
            vec![0.0; new * h],
        );
        let mut context = vec![0.0f32; new * h];
        let mut sublayer = vec![0.0f32; new * h];
        let mut intermediate = vec![0.0f32; new * c.intermediate_size];
        let shape = AttnShape::new(1, n_heads, new, total, d);
        let n_layers = weights.layers.len();
        let mut keys = Vec::with_capacity(n_layers);
        let mut values = Vec::with_capacity(n_layers);
        let mut last_layer_attention = None;

        for (l, layer) in weights.layers.iter().enumerate() {
            layer.norm_attn.apply_into(&hidden, &mut normed);
            layer.qkv.matmul(&normed, &mut qkv, par);
            bias_activation(&mut qkv, &layer.qkv.bias, None);
            split_heads(&qkv, 1, new, n_heads, d, [&mut q, &mut k, &mut v]);
            let layer_keys = append_rows(&self.keys[l], &k, n_heads, past, new, d);
            let layer_values = append_rows(&self.values[l], &v, n_heads, past, new, d);
            let want_weights = attention && l + 1 == n_layers;
            let options = AttnOptions {
                causal: Some(Causal::BottomRight),
                weights: if want_weights {
                    WeightsRequest::HeadAverage
                } else {
                    WeightsRequest::None
                },
                ..AttnOptions::default()
            };
            let input = AttnInput::new(&q, &layer_keys, &layer_values, shape)?;
            let out = attn_core::sdpa(&input, &options)?;
            if want_weights {
                last_layer_attention = out.weights.map(|w| w.data().to_vec());
            }
            keys.push(layer_keys);
            values.push(layer_values);
            merge_heads(&out.out, 1, new, n_heads, d, &mut context);
            layer.attn_out.matmul(&context, &mut sublayer, par);
            residual_bias_add(&mut hidden, &sublayer, &layer.attn_out.bias);

            layer.norm_ff.apply_into(&hidden, &mut normed);
            layer
                .ff_in
                .matmul_activation(&normed, &mut intermediate, c.activation, par);
            layer.ff_out.matmul(&intermediate, &mut sublayer, par);
            residual_bias_add(&mut hidden, &sublayer, &layer.ff_out.bias);
        }
        if let Some(norm) = &weights.final_norm {
            norm.apply(&mut hidden);
        }
        // The language-model head is the word embedding matrix (tied): logits = h·wteᵀ.
        let mut logits = vec![0.0f32; new * c.vocab_size];
        let wte = &weights.word_embeddings;
        gemm_bt(&hidden, new, h, wte, c.vocab_size, &mut logits, par);

        self.keys = keys;
        self.values = values;
        self.len = total;
        Ok(Step {
            logits,
            last_layer_attention,
        })
    }
}

/// `cached` (`[heads, past, d]`) followed by `fresh` (`[heads, new, d]`), head by head:
/// `[heads, past + new, d]`.
fn append_rows(
    cached: &[f32],
    fresh: &[f32],
    n_heads: usize,
    past: usize,
    new: usize,
    d: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(n_heads * (past + new) * d);
    for head in 0..n_heads {
        out.extend_from_slice(&cached[head * past * d..][..past * d]);
        out.extend_from_slice(&fresh[head * new * d..][..new * d]);
    }
    out
}
