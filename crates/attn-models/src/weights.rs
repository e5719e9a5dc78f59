//! The tensors of a BERT-family or GPT-2 checkpoint, read once from the mapped safetensors
//! file, checked against the config, and packed for the GEMMs.
//!
//! Tensor names follow transformers' `BertModel`, `RobertaModel`, `DistilBertModel` and
//! `GPT2Model` state dicts
//! (<https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/models/bert/modeling_bert.py>,
//! `.../models/roberta/modeling_roberta.py`, `.../models/distilbert/modeling_distilbert.py`,
//! `.../models/gpt2/modeling_gpt2.py`), with or without the `bert.` / `roberta.` /
//! `distilbert.` / `transformer.` prefix that task heads add.

use crate::checkpoint::{Checkpoint, WeightData};
use crate::ops::{LayerNorm, Linear, Weight, WeightLayout};
use crate::{Family, ModelConfig, ModelError};

/// One transformer block. For the encoders the norms come after each sublayer (post-norm:
/// BERT's attention output LayerNorm and output LayerNorm, DistilBERT's `sa_layer_norm` and
/// `output_layer_norm`); for GPT-2 before (pre-norm: `ln_1`, `ln_2`).
pub struct Layer {
    /// Query, key and value projections side by side: output `[rows, 3·hidden]`.
    pub qkv: Linear,
    /// The attention output projection.
    pub attn_out: Linear,
    /// The LayerNorm around the attention sublayer.
    pub norm_attn: LayerNorm,
    /// The feed-forward layer's first projection (to `intermediate_size`).
    pub ff_in: Linear,
    /// The feed-forward layer's second projection (back to `hidden`).
    pub ff_out: Linear,
    /// The LayerNorm around the feed-forward sublayer.
    pub norm_ff: LayerNorm,
    /// Qwen3's RMSNorms of each query head and key head (`[head_dim]` each).
    pub qk_norm: Option<(LayerNorm, LayerNorm)>,
    /// Gemma 2's RMSNorms of the attention's and the feed-forward's output.
    pub post_norms: Option<(LayerNorm, LayerNorm)>,
}

/// Every tensor the forward pass reads. Large ones stay in the map (only the pages a run
/// touches are ever read).
pub struct Weights {
    /// `[vocab, hidden]`; GPT-2's language-model head too, unless `lm_head` holds its own.
    /// In its stored dtype for the Llama-style decoders, else f32.
    pub word_embeddings: WeightData,
    /// GPT-2's untied language-model head `lm_head.weight` (`[vocab, hidden]`), read when
    /// `tie_word_embeddings` is false.
    pub lm_head: Option<WeightData>,
    /// `[max_positions, hidden]`
    pub position: Vec<f32>,
    /// `[type_vocab_size, hidden]`; empty for DistilBERT and GPT-2.
    pub token_type: Vec<f32>,
    /// The encoders' embedding LayerNorm.
    pub embed_norm: Option<LayerNorm>,
    /// The transformer blocks, from the input up.
    pub layers: Vec<Layer>,
    /// GPT-2's `ln_f`.
    pub final_norm: Option<LayerNorm>,
}

impl Weights {
    /// Packs every layer's linear weights for AMX tiles at once, spread over the thread pool.
    /// Without this the threads of a batch each pack every weight on its first use, at the
    /// same time, the work of all but one lost (about 40 ms of a cold `classify --file` of 256
    /// texts of a MiniLM-sized model).
    pub fn prepare_tiles(&self) {
        use rayon::prelude::*;
        self.layers
            .par_iter()
            .flat_map_iter(|l| [&l.qkv, &l.attn_out, &l.ff_in, &l.ff_out])
            .for_each(Linear::prepare_tiles);
    }
}

fn prefix_of(
    ckpt: &Checkpoint,
    prefixes: &[&'static str],
    probe: &str,
) -> Result<&'static str, ModelError> {
    prefixes
        .iter()
        .copied()
        .find(|p| ckpt.contains(&format!("{p}{probe}")))
        .ok_or_else(|| ModelError::MissingTensor {
            tensor: probe.to_string(),
        })
}

fn norm(ckpt: &Checkpoint, name: &str, n: usize, eps: f32) -> Result<LayerNorm, ModelError> {
    Ok(LayerNorm {
        gamma: ckpt.f32(&format!("{name}.weight"), &[n])?,
        beta: ckpt.f32(&format!("{name}.bias"), &[n])?,
        eps,
        rms: false,
    })
}

/// A PyTorch `nn.Linear` (`weight` `[n_out, n_in]`).
fn torch_linear(
    ckpt: &Checkpoint,
    name: &str,
    n_in: usize,
    n_out: usize,
) -> Result<Linear, ModelError> {
    Ok(Linear::new(
        WeightData::F32(ckpt.f32_data(&format!("{name}.weight"), &[n_out, n_in])?),
        WeightLayout::OutIn,
        ckpt.f32(&format!("{name}.bias"), &[n_out])?,
        n_in,
        n_out,
    ))
}

/// The query, key and value `nn.Linear`s (`hidden` to `hidden`) named `{prefix}{part}`,
/// writing side by side into one `[rows, 3·hidden]` output like GPT-2's fused `c_attn`; the
/// weights stay in the map.
fn torch_qkv(
    ckpt: &Checkpoint,
    c: &ModelConfig,
    prefix: &str,
    parts: [&str; 3],
    h: usize,
) -> Result<Linear, ModelError> {
    torch_parts(ckpt, c, prefix, &parts.map(|part| (part, h)), h, true)
}

/// The untied language-model head `lm_head.weight` (`[vocab, hidden]`) when
/// `tie_word_embeddings` is false; a task head's own tensor, never under the model's prefix.
fn untied_lm_head(ckpt: &Checkpoint, c: &ModelConfig) -> Result<Option<WeightData>, ModelError> {
    match c.tied_lm_head {
        true => Ok(None),
        false => matrix(ckpt, "lm_head.weight", &[c.vocab_size, c.hidden_size], c).map(Some),
    }
}

/// A weight matrix as `c`'s family keeps it: in its stored dtype for the Llama-style decoders
/// (their checkpoints are BF16, and their views need no gradients), else widened to f32, which
/// the gradients and contributions read as it is.
fn matrix(
    ckpt: &Checkpoint,
    name: &str,
    shape: &[usize],
    c: &ModelConfig,
) -> Result<WeightData, ModelError> {
    match c.family {
        Family::Llama => ckpt.weight(name, shape),
        _ => ckpt.f32_data(name, shape).map(WeightData::F32),
    }
}

/// A GPT-2 `Conv1D` (`weight` `[n_in, n_out]`).
fn conv1d(ckpt: &Checkpoint, name: &str, n_in: usize, n_out: usize) -> Result<Linear, ModelError> {
    Ok(Linear::new(
        WeightData::F32(ckpt.f32_data(&format!("{name}.weight"), &[n_in, n_out])?),
        WeightLayout::InOut,
        ckpt.f32(&format!("{name}.bias"), &[n_out])?,
        n_in,
        n_out,
    ))
}

impl Weights {
    /// Reads every tensor the config calls for, checking each one's shape.
    pub fn load(ckpt: &Checkpoint, config: &ModelConfig) -> Result<Weights, ModelError> {
        match config.family {
            Family::Bert => load_encoder(ckpt, config, &BERT),
            Family::Roberta => load_encoder(ckpt, config, &ROBERTA),
            Family::DistilBert => load_encoder(ckpt, config, &DISTILBERT),
            Family::Gpt2 => load_gpt2(ckpt, config),
            Family::Llama => load_llama(ckpt, config),
        }
    }

    /// The language-model head's `[vocab, hidden]` matrix: logits = h·headᵀ.
    pub fn lm_head(&self) -> &WeightData {
        self.lm_head.as_ref().unwrap_or(&self.word_embeddings)
    }
}

/// Where an encoder family keeps its tensors: transformers' state dict names below each
/// layer's `{layers}.{l}.`, and the prefix task heads add.
struct EncoderNames {
    task_prefix: &'static str,
    layers: &'static str,
    /// The query, key and value `nn.Linear`s.
    qkv: [&'static str; 3],
    attn_out: &'static str,
    norm_attn: &'static str,
    ff_in: &'static str,
    ff_out: &'static str,
    norm_ff: &'static str,
    /// Whether the checkpoint has token type embeddings.
    token_types: bool,
}

const BERT: EncoderNames = EncoderNames {
    task_prefix: "bert.",
    layers: "encoder.layer",
    qkv: [
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
    ],
    attn_out: "attention.output.dense",
    norm_attn: "attention.output.LayerNorm",
    ff_in: "intermediate.dense",
    ff_out: "output.dense",
    norm_ff: "output.LayerNorm",
    token_types: true,
};

/// RoBERTa's tensors are BERT's.
const ROBERTA: EncoderNames = EncoderNames {
    task_prefix: "roberta.",
    ..BERT
};

const DISTILBERT: EncoderNames = EncoderNames {
    task_prefix: "distilbert.",
    layers: "transformer.layer",
    qkv: ["attention.q_lin", "attention.k_lin", "attention.v_lin"],
    attn_out: "attention.out_lin",
    norm_attn: "sa_layer_norm",
    ff_in: "ffn.lin1",
    ff_out: "ffn.lin2",
    norm_ff: "output_layer_norm",
    token_types: false,
};

fn load_encoder(
    ckpt: &Checkpoint,
    c: &ModelConfig,
    names: &EncoderNames,
) -> Result<Weights, ModelError> {
    let p = prefix_of(
        ckpt,
        &["", names.task_prefix],
        "embeddings.word_embeddings.weight",
    )?;
    let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
    let word_embeddings = ckpt.f32_data(
        &format!("{p}embeddings.word_embeddings.weight"),
        &[c.vocab_size, h],
    )?;
    let layers = (0..c.n_layers)
        .map(|l| {
            let lp = format!("{p}{}.{l}.", names.layers);
            no_layer_missing(ckpt, &lp, (l, c.n_layers))?;
            Ok(Layer {
                qkv: torch_qkv(ckpt, c, &lp, names.qkv, h)?,
                attn_out: torch_linear(ckpt, &format!("{lp}{}", names.attn_out), h, h)?,
                norm_attn: norm(ckpt, &format!("{lp}{}", names.norm_attn), h, eps)?,
                ff_in: torch_linear(ckpt, &format!("{lp}{}", names.ff_in), h, i)?,
                ff_out: torch_linear(ckpt, &format!("{lp}{}", names.ff_out), i, h)?,
                norm_ff: norm(ckpt, &format!("{lp}{}", names.norm_ff), h, eps)?,
                qk_norm: None,
                post_norms: None,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let next = format!(
        "{p}{}.{}.{}.weight",
        names.layers, c.n_layers, names.norm_ff
    );
    no_layer_past(ckpt, next, c.n_layers)?;
    Ok(Weights {
        word_embeddings: WeightData::F32(word_embeddings),
        position: ckpt.f32(
            &format!("{p}embeddings.position_embeddings.weight"),
            &[c.max_positions, h],
        )?,
        token_type: match names.token_types {
            true => ckpt.f32(
                &format!("{p}embeddings.token_type_embeddings.weight"),
                &[c.type_vocab_size, h],
            )?,
            false => Vec::new(),
        },
        lm_head: None,
        embed_norm: Some(norm(ckpt, &format!("{p}embeddings.LayerNorm"), h, eps)?),
        layers,
        final_norm: None,
    })
}

/// [`ModelError::MissingLayers`] when no tensor of layer `l` (names starting `prefix`) is in
/// the checkpoint: its first missing tensor alone would not say that the config asks for more
/// layers than there are.
fn no_layer_missing(
    ckpt: &Checkpoint,
    prefix: &str,
    (l, n_layers): (usize, usize),
) -> Result<(), ModelError> {
    match ckpt.has_prefix(prefix) {
        true => Ok(()),
        false => Err(ModelError::MissingLayers {
            n_layers,
            layer: l,
            prefix: prefix.to_string(),
        }),
    }
}

/// [`ModelError::ExtraLayers`] when the checkpoint holds `tensor`, of the layer after the
/// config's last.
fn no_layer_past(ckpt: &Checkpoint, tensor: String, n_layers: usize) -> Result<(), ModelError> {
    match ckpt.contains(&tensor) {
        true => Err(ModelError::ExtraLayers { tensor, n_layers }),
        false => Ok(()),
    }
}

fn load_gpt2(ckpt: &Checkpoint, c: &ModelConfig) -> Result<Weights, ModelError> {
    let p = prefix_of(ckpt, &["", "transformer."], "wte.weight")?;
    let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps);
    let word_embeddings =
        WeightData::F32(ckpt.f32_data(&format!("{p}wte.weight"), &[c.vocab_size, h])?);
    let layers = (0..c.n_layers)
        .map(|l| {
            let lp = format!("{p}h.{l}.");
            no_layer_missing(ckpt, &lp, (l, c.n_layers))?;
            Ok(Layer {
                qkv: conv1d(ckpt, &format!("{lp}attn.c_attn"), h, 3 * h)?,
                attn_out: conv1d(ckpt, &format!("{lp}attn.c_proj"), h, h)?,
                norm_attn: norm(ckpt, &format!("{lp}ln_1"), h, eps)?,
                ff_in: conv1d(ckpt, &format!("{lp}mlp.c_fc"), h, i)?,
                ff_out: conv1d(ckpt, &format!("{lp}mlp.c_proj"), i, h)?,
                norm_ff: norm(ckpt, &format!("{lp}ln_2"), h, eps)?,
                qk_norm: None,
                post_norms: None,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    no_layer_past(ckpt, format!("{p}h.{}.ln_2.weight", c.n_layers), c.n_layers)?;
    Ok(Weights {
        word_embeddings,
        position: ckpt.f32(&format!("{p}wpe.weight"), &[c.max_positions, h])?,
        token_type: Vec::new(),
        lm_head: untied_lm_head(ckpt, c)?,
        embed_norm: None,
        layers,
        final_norm: Some(norm(ckpt, &format!("{p}ln_f"), h, eps)?),
    })
}

/// `nn.Linear`s named `{prefix}{part}` (`weight` `[n_out, n_in]` each, a `bias` when `bias`,
/// else zeros), writing side by side into one output: Llama's q | k | v and gate | up.
fn torch_parts(
    ckpt: &Checkpoint,
    c: &ModelConfig,
    prefix: &str,
    parts: &[(&str, usize)],
    n_in: usize,
    bias: bool,
) -> Result<Linear, ModelError> {
    let mut weights = Vec::with_capacity(parts.len());
    let mut biases = Vec::new();
    for &(part, n_out) in parts {
        weights.push(Weight {
            data: matrix(ckpt, &format!("{prefix}{part}.weight"), &[n_out, n_in], c)?,
            layout: WeightLayout::OutIn,
            n_out,
        });
        match bias {
            true => biases.extend(ckpt.f32(&format!("{prefix}{part}.bias"), &[n_out])?),
            false => biases.extend(std::iter::repeat_n(0.0, n_out)),
        }
    }
    Ok(Linear::from_parts(weights, biases, n_in))
}

/// An RMSNorm whose weight is `offset +` the stored one (Gemma stores `w` of `1 + w`).
fn rms_norm(
    ckpt: &Checkpoint,
    name: &str,
    n: usize,
    (eps, offset): (f32, f32),
) -> Result<LayerNorm, ModelError> {
    let mut gamma = ckpt.f32(&format!("{name}.weight"), &[n])?;
    if offset != 0.0 {
        gamma.iter_mut().for_each(|g| *g += offset);
    }
    Ok(LayerNorm {
        gamma,
        beta: Vec::new(),
        eps,
        rms: true,
    })
}

/// transformers' `LlamaForCausalLM`, `MistralForCausalLM` and `Qwen2ForCausalLM` state dicts
/// (`model.` before the decoder's tensors; none in a bare `LlamaModel`'s).
fn load_llama(ckpt: &Checkpoint, c: &ModelConfig) -> Result<Weights, ModelError> {
    let dec = c
        .decoder
        .as_ref()
        .ok_or_else(|| ModelError::InvalidConfig {
            field: "model_type",
            reason: "a Llama-style decoder without its decoder settings".into(),
        })?;
    let p = prefix_of(ckpt, &["model.", ""], "embed_tokens.weight")?;
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let eps = (c.layer_norm_eps, dec.norm_offset);
    let (q, kv) = (c.q_width(), dec.n_kv_heads * c.head_dim());
    let word_embeddings = matrix(
        ckpt,
        &format!("{p}embed_tokens.weight"),
        &[c.vocab_size, h],
        c,
    )?;
    let layers = (0..c.n_layers)
        .map(|l| {
            let lp = format!("{p}layers.{l}.");
            no_layer_missing(ckpt, &lp, (l, c.n_layers))?;
            let attn = format!("{lp}self_attn.");
            let mlp = format!("{lp}mlp.");
            Ok(Layer {
                qkv: torch_parts(
                    ckpt,
                    c,
                    &attn,
                    &[("q_proj", q), ("k_proj", kv), ("v_proj", kv)],
                    h,
                    dec.qkv_bias,
                )?,
                attn_out: torch_parts(ckpt, c, &attn, &[("o_proj", h)], q, dec.out_bias)?,
                norm_attn: rms_norm(ckpt, &format!("{lp}input_layernorm"), h, eps)?,
                ff_in: torch_parts(
                    ckpt,
                    c,
                    &mlp,
                    &[("gate_proj", i), ("up_proj", i)],
                    h,
                    dec.mlp_bias,
                )?,
                ff_out: torch_parts(ckpt, c, &mlp, &[("down_proj", h)], i, dec.mlp_bias)?,
                // Gemma 2's post_attention_layernorm norms the attention's output; Llama's
                // is the norm before the feed-forward.
                norm_ff: match dec.post_norms {
                    true => rms_norm(ckpt, &format!("{lp}pre_feedforward_layernorm"), h, eps)?,
                    false => rms_norm(ckpt, &format!("{lp}post_attention_layernorm"), h, eps)?,
                },
                qk_norm: match dec.qk_norm {
                    true => Some((
                        rms_norm(ckpt, &format!("{attn}q_norm"), c.head_dim(), eps)?,
                        rms_norm(ckpt, &format!("{attn}k_norm"), c.head_dim(), eps)?,
                    )),
                    false => None,
                },
                post_norms: match dec.post_norms {
                    true => Some((
                        rms_norm(ckpt, &format!("{lp}post_attention_layernorm"), h, eps)?,
                        rms_norm(ckpt, &format!("{lp}post_feedforward_layernorm"), h, eps)?,
                    )),
                    false => None,
                },
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    no_layer_past(
        ckpt,
        format!("{p}layers.{}.input_layernorm.weight", c.n_layers),
        c.n_layers,
    )?;
    Ok(Weights {
        word_embeddings,
        position: Vec::new(),
        token_type: Vec::new(),
        lm_head: untied_lm_head(ckpt, c)?,
        embed_norm: None,
        layers,
        final_norm: Some(rms_norm(ckpt, &format!("{p}norm"), h, eps)?),
    })
}
