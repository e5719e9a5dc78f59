//! `config.json` of a Hugging Face checkpoint, read into one architecture-neutral description.
//!
//! Field names and defaults mirror transformers' `BertConfig`, `RobertaConfig`,
//! `DistilBertConfig` and `GPT2Config`
//! (<https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/models/bert/configuration_bert.py>,
//! `.../models/roberta/configuration_roberta.py`, `.../models/distilbert/configuration_distilbert.py`,
//! `.../models/gpt2/configuration_gpt2.py`). Every dimension is checked here, once, so that the
//! model code can index without further checks.

use std::borrow::Cow;
use std::path::Path;

use serde::Deserialize;

use crate::ModelError;

/// The `model_type`s this crate runs.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "gpt2",
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
];

/// Which architecture a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// BERT-family encoder: post-LayerNorm, bidirectional attention.
    Bert,
    /// GPT-2 decoder: pre-LayerNorm, causal attention, a language-model head (tied to the word
    /// embeddings unless `tie_word_embeddings` is false).
    Gpt2,
    /// Llama-style decoder (Llama, Mistral, Qwen2, Qwen3, Gemma 2): pre-RMSNorm, rotary positions,
    /// grouped-query attention, a gated SiLU feed-forward, a language-model head.
    Llama,
}

/// Which member of a [`ModelKind`] a checkpoint is: the encoders share their layers and differ
/// in their tensor names and embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// BERT: positions from 0, token type embeddings of each token's segment.
    Bert,
    /// RoBERTa, XLM-RoBERTa and CamemBERT (fairseq's numbering): a token other than the pad
    /// token takes position `pad_token_id + 1 +` the non-pad tokens before it, a pad token
    /// `pad_token_id`; every token takes token type 0, as transformers does when it is given
    /// no `token_type_ids`, which their tokenizers do not return.
    Roberta,
    /// DistilBERT: BERT's layers under other names, positions from 0, no token types.
    DistilBert,
    /// GPT-2.
    Gpt2,
    /// Llama, Mistral, Qwen2 and Qwen3: one block, differing in their biases, windows, ties and
    /// Qwen3's query and key norms.
    Llama,
}

impl Family {
    /// The architecture the family's members share.
    pub fn kind(self) -> ModelKind {
        match self {
            Family::Bert | Family::Roberta | Family::DistilBert => ModelKind::Bert,
            Family::Gpt2 => ModelKind::Gpt2,
            Family::Llama => ModelKind::Llama,
        }
    }
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x · Φ(x)` with the exact normal CDF (`erf`): BERT's `"gelu"`.
    GeluErf,
    /// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: GPT-2's `"gelu_new"`.
    GeluTanh,
    /// `max(x, 0)`.
    Relu,
    /// `x · sigmoid(x)`, gating the up projection (`silu(x·W_gate) ⊙ x·W_up`): Llama's.
    Silu,
}

impl Activation {
    /// The activation `name`, read from the config field `field`.
    pub(crate) fn parse(name: &str, field: &'static str) -> Result<Activation, ModelError> {
        match name {
            "gelu" => Ok(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Ok(Activation::GeluTanh),
            "relu" => Ok(Activation::Relu),
            other => Err(ModelError::InvalidConfig {
                field,
                reason: format!(
                    "{other:?} is not supported (gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu; \
                     silu for Llama-style decoders)"
                ),
            }),
        }
    }
}

/// The `config.json` names of the fields that differ between BERT and GPT-2, for errors.
struct FieldNames {
    hidden_size: &'static str,
    n_layers: &'static str,
    n_heads: &'static str,
    intermediate_size: &'static str,
    max_positions: &'static str,
    layer_norm_eps: &'static str,
    activation: &'static str,
}

const BERT_FIELDS: FieldNames = FieldNames {
    hidden_size: "hidden_size",
    n_layers: "num_hidden_layers",
    n_heads: "num_attention_heads",
    intermediate_size: "intermediate_size",
    max_positions: "max_position_embeddings",
    layer_norm_eps: "layer_norm_eps",
    activation: "hidden_act",
};

const DISTILBERT_FIELDS: FieldNames = FieldNames {
    hidden_size: "dim",
    n_layers: "n_layers",
    n_heads: "n_heads",
    intermediate_size: "hidden_dim",
    max_positions: "max_position_embeddings",
    layer_norm_eps: "layer_norm_eps",
    activation: "activation",
};

const LLAMA_FIELDS: FieldNames = FieldNames {
    hidden_size: "hidden_size",
    n_layers: "num_hidden_layers",
    n_heads: "num_attention_heads",
    intermediate_size: "intermediate_size",
    max_positions: "max_position_embeddings",
    layer_norm_eps: "rms_norm_eps",
    activation: "hidden_act",
};

const GPT2_FIELDS: FieldNames = FieldNames {
    hidden_size: "n_embd",
    n_layers: "n_layer",
    n_heads: "n_head",
    intermediate_size: "n_inner",
    max_positions: "n_positions",
    layer_norm_eps: "layer_norm_epsilon",
    activation: "activation_function",
};

/// A token id, or a list of them of which the first counts (`eos_token_id: [50256]`).
#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "eos_token_id to be a token id (a whole number from 0) or a list of them"
)]
enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    fn first(&self) -> Option<u32> {
        match self {
            TokenIds::One(id) => Some(*id),
            TokenIds::Many(ids) => ids.first().copied(),
        }
    }
}

/// The dimensions and constants of a checkpoint, whatever its architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `config.json`'s `model_type` (`"xlm-roberta"`).
    pub model_type: String,
    /// The architecture family the forward pass follows.
    pub family: Family,
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Attention heads per block.
    pub n_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Rows of the position embedding table (RoBERTa's first `pad_token_id + 1` are never
    /// read by a text: [`ModelConfig::max_tokens`]).
    pub max_positions: usize,
    /// Number of token types (segments); 0 for DistilBERT and GPT-2, which have none.
    pub type_vocab_size: usize,
    /// The LayerNorms' epsilon.
    pub layer_norm_eps: f32,
    /// The feed-forward layer's activation.
    pub activation: Activation,
    /// The id a padded position holds.
    pub pad_token_id: u32,
    /// Each position sees only itself and the positions before it: GPT-2, and BERT built with
    /// `is_decoder` (transformers then masks its self-attention causally).
    pub causal: bool,
    /// GPT-2's language-model head is the word embedding matrix (`tie_word_embeddings`, true by
    /// default); when false the checkpoint holds its own `lm_head.weight`.
    pub tied_lm_head: bool,
    /// What a Llama-style decoder adds ([`Family::Llama`]); `None` for the other families.
    pub decoder: Option<DecoderConfig>,
}

/// The parts of a Llama-style decoder the other families lack.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    /// Key/value heads, each shared by `n_heads / n_kv_heads` query heads.
    pub n_kv_heads: usize,
    /// Each head's width, `head_dim` (`hidden_size / n_heads` unless the config says; Qwen3's
    /// query heads together are wider than the hidden state).
    pub head_dim: usize,
    /// Qwen3's RMSNorm of each head's query and key before the rotation.
    pub qk_norm: bool,
    /// The rotary embedding's inverse frequencies, `[head_dim / 2]`, scaled as `rope_scaling`
    /// says.
    pub inv_freq: Vec<f32>,
    /// Each layer's window (Mistral's every layer, Gemma 2's every other): a query sees itself
    /// and the `window − 1` keys before it.
    pub windows: Vec<Option<usize>>,
    /// The scale of q·k when it is not `1/√head_dim` (Gemma 2's `query_pre_attn_scalar^-½`).
    pub scale: Option<f32>,
    /// Gemma 2's attention logit softcapping: `c · tanh(score / c)`.
    pub softcap: Option<f32>,
    /// Gemma 2's final logit softcapping.
    pub final_softcap: Option<f32>,
    /// Gemma 2's embeddings times `√hidden_size` (rounded to f32, as transformers does).
    pub embed_scale: Option<f32>,
    /// Gemma 2's norms of each sublayer's output, before the residual adds it.
    pub post_norms: bool,
    /// Gemma's RMSNorm weights are offsets from 1 (`x̂ · (1 + w)`).
    pub norm_offset: f32,
    /// Biases on the query, key and value projections (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the attention output projection (Llama's `attention_bias`).
    pub out_bias: bool,
    /// Biases on the feed-forward projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
}

#[derive(Deserialize)]
struct TypeOnly {
    model_type: Option<String>,
}

#[derive(Deserialize)]
struct BertJson {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    intermediate_size: usize,
    #[serde(default = "bert_act")]
    hidden_act: String,
    max_position_embeddings: usize,
    #[serde(default = "two")]
    type_vocab_size: usize,
    #[serde(default = "bert_eps")]
    layer_norm_eps: f64,
    #[serde(default)]
    pad_token_id: Option<u32>,
    #[serde(default)]
    position_embedding_type: Option<String>,
    #[serde(default)]
    is_decoder: bool,
    #[serde(default)]
    add_cross_attention: bool,
}

/// `DistilBertConfig`'s fields, with its defaults, under their own names or the aliases of its
/// `attribute_map` (a field and its alias set together are settled first, by
/// [`without_aliases`]).
#[derive(Deserialize)]
struct DistilBertJson {
    #[serde(default = "distilbert_vocab")]
    vocab_size: usize,
    #[serde(default = "distilbert_dim", alias = "hidden_size")]
    dim: usize,
    #[serde(default = "distilbert_layers", alias = "num_hidden_layers")]
    n_layers: usize,
    #[serde(default = "distilbert_heads", alias = "num_attention_heads")]
    n_heads: usize,
    #[serde(default = "distilbert_hidden_dim")]
    hidden_dim: usize,
    #[serde(default = "bert_act")]
    activation: String,
    #[serde(default = "distilbert_positions")]
    max_position_embeddings: usize,
    #[serde(default)]
    pad_token_id: Option<u32>,
}

/// `GPT2Config`'s fields, under their own names or the aliases of its `attribute_map` (both at
/// once are settled first, by [`without_aliases`]).
#[derive(Deserialize)]
struct Gpt2Json {
    vocab_size: usize,
    #[serde(alias = "max_position_embeddings")]
    n_positions: usize,
    #[serde(alias = "hidden_size")]
    n_embd: usize,
    #[serde(alias = "num_hidden_layers")]
    n_layer: usize,
    #[serde(alias = "num_attention_heads")]
    n_head: usize,
    #[serde(default)]
    n_inner: Option<usize>,
    #[serde(default = "gpt2_act")]
    activation_function: String,
    #[serde(default = "gpt2_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "yes")]
    scale_attn_weights: bool,
    #[serde(default)]
    scale_attn_by_inverse_layer_idx: bool,
    #[serde(default)]
    add_cross_attention: bool,
    #[serde(default)]
    eos_token_id: Option<TokenIds>,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
}

/// `LlamaConfig`, `MistralConfig`, `Qwen2Config` and `Qwen3Config`'s fields, with their
/// defaults (Qwen3's `head_dim` defaults to 128, the others' to `hidden_size / heads`).
#[derive(Deserialize)]
struct LlamaJson {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    #[serde(default)]
    num_key_value_heads: Option<usize>,
    #[serde(default)]
    head_dim: Option<usize>,
    #[serde(default = "silu")]
    hidden_act: String,
    #[serde(default)]
    hidden_activation: Option<String>,
    max_position_embeddings: usize,
    #[serde(default = "llama_eps")]
    rms_norm_eps: f64,
    #[serde(default = "rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    rope_scaling: Option<RopeScaling>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    use_sliding_window: Option<bool>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    query_pre_attn_scalar: Option<f64>,
    #[serde(default)]
    attn_logit_softcapping: Option<f64>,
    #[serde(default)]
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    partial_rotary_factor: Option<f64>,
    #[serde(default)]
    pad_token_id: Option<u32>,
    #[serde(default)]
    eos_token_id: Option<TokenIds>,
}

/// `rope_scaling`: `rope_type` (or the older `type`) and its parameters.
#[derive(Deserialize)]
struct RopeScaling {
    #[serde(default, alias = "type")]
    rope_type: Option<String>,
    #[serde(default)]
    factor: Option<f64>,
    #[serde(default)]
    low_freq_factor: Option<f64>,
    #[serde(default)]
    high_freq_factor: Option<f64>,
    #[serde(default)]
    original_max_position_embeddings: Option<f64>,
}

impl DecoderConfig {
    /// Layer `layer`'s window, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.windows.get(layer).copied().flatten()
    }
}

/// transformers' `_compute_default_rope_parameters` and, for `rope_scaling`, `linear` and
/// `llama3` (`modeling_rope_utils.py`): `1 / θ^(2i/d)`, in f64 then rounded.
fn inv_freq(theta: f64, d: usize, scaling: Option<&RopeScaling>) -> Result<Vec<f32>, ModelError> {
    if !(theta.is_finite() && theta > 1.0) {
        return Err(unsupported(
            "rope_theta",
            format!("{theta} must be a finite number above 1"),
        ));
    }
    // transformers rounds the base frequencies to f32 before scaling them.
    let base: Vec<f64> = (0..d / 2)
        .map(|i| f64::from((1.0 / theta.powf((2 * i) as f64 / d as f64)) as f32))
        .collect();
    let Some(s) = scaling else {
        return Ok(base.iter().map(|&f| f as f32).collect());
    };
    let param = |name: &'static str, value: Option<f64>| {
        value
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| unsupported("rope_scaling", format!("{name} must be a number above 0")))
    };
    let kind = s.rope_type.as_deref().unwrap_or("default");
    let freqs: Vec<f64> = match kind {
        "default" => base,
        "linear" => {
            let factor = param("factor", s.factor)?;
            base.iter().map(|f| f / factor).collect()
        }
        "llama3" => {
            let factor = param("factor", s.factor)?;
            let low = param("low_freq_factor", s.low_freq_factor)?;
            let high = param("high_freq_factor", s.high_freq_factor)?;
            let old = param(
                "original_max_position_embeddings",
                s.original_max_position_embeddings,
            )?;
            if high <= low {
                return Err(unsupported(
                    "rope_scaling",
                    format!("high_freq_factor {high} must be above low_freq_factor {low}"),
                ));
            }
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let scaled = if wavelen > low_wavelen { f / factor } else { f };
                    let medium = (high_wavelen..=low_wavelen).contains(&wavelen);
                    if medium {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                })
                .collect()
        }
        other => {
            return Err(unsupported(
                "rope_scaling",
                format!("rope_type {other:?} is not supported (default, linear, llama3)"),
            ));
        }
    };
    Ok(freqs.iter().map(|&f| f as f32).collect())
}

fn silu() -> String {
    "silu".into()
}
fn llama_eps() -> f64 {
    1e-6
}
fn rope_theta() -> f64 {
    10_000.0
}

fn bert_act() -> String {
    "gelu".into()
}
fn gpt2_act() -> String {
    "gelu_new".into()
}
fn two() -> usize {
    2
}
fn distilbert_vocab() -> usize {
    30522
}
fn distilbert_dim() -> usize {
    768
}
fn distilbert_layers() -> usize {
    6
}
fn distilbert_heads() -> usize {
    12
}
fn distilbert_hidden_dim() -> usize {
    3072
}
fn distilbert_positions() -> usize {
    512
}
fn bert_eps() -> f64 {
    1e-12
}
fn gpt2_eps() -> f64 {
    1e-5
}
fn yes() -> bool {
    true
}

/// The most bytes a JSON file of a model directory may hold (the largest tokenizers are tens
/// of MiB).
pub(crate) const MAX_JSON_BYTES: u64 = 256 << 20;

/// Whether anything is at `path`, a broken or looping symbolic link included (`Path::exists`
/// follows links, so an optional file behind a broken one read as absent).
pub(crate) fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Checks that `path` (after symlinks) is a regular file before anything opens it: opening a
/// named pipe blocks for ever, and a device such as `/dev/zero` reads without end. Returns its
/// length.
pub(crate) fn regular_file(path: &Path, what: &'static str) -> Result<u64, ModelError> {
    let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, what, e))?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let kind = if meta.is_dir() {
        "a directory"
    } else {
        "a pipe, socket or device"
    };
    let err = std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("{kind}, not a regular file"),
    );
    Err(ModelError::io(path, what, err))
}

/// Reads a whole text file of at most [`MAX_JSON_BYTES`], naming `what` it is if it is missing.
pub(crate) fn read_text(path: &Path, what: &'static str) -> Result<String, ModelError> {
    let len = regular_file(path, what)?;
    if len > MAX_JSON_BYTES {
        let err = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{len} bytes, more than the {MAX_JSON_BYTES} a model's JSON file may hold"),
        );
        return Err(ModelError::io(path, what, err));
    }
    std::fs::read_to_string(path).map_err(|e| ModelError::io(path, what, e))
}

/// The LayerNorm epsilon as the f32 the norms add: finite and above 0 once rounded.
fn layer_norm_eps(eps: f64, field: &'static str) -> Result<f32, ModelError> {
    let rounded = eps as f32;
    if !(rounded.is_finite() && rounded > 0.0) {
        return Err(unsupported(
            field,
            format!("must be finite and above 0 in f32, got {eps:e}"),
        ));
    }
    Ok(rounded)
}

/// `DistilBertConfig`'s and `GPT2Config`'s `attribute_map`: a field and its alias.
const DISTILBERT_ALIASES: [(&str, &str); 3] = [
    ("dim", "hidden_size"),
    ("n_layers", "num_hidden_layers"),
    ("n_heads", "num_attention_heads"),
];
const GPT2_ALIASES: [(&str, &str); 4] = [
    ("n_positions", "max_position_embeddings"),
    ("n_embd", "hidden_size"),
    ("n_layer", "num_hidden_layers"),
    ("n_head", "num_attention_heads"),
];

/// The config's text with each alias that repeats its field's value dropped, as transformers
/// reads both to one value; a field and its alias of different values are refused (which one
/// counts would be a guess). Text with no such pair is returned as it is, so that the parser's
/// line and column point into the file; so is text that is not a JSON object, for the parser
/// to name.
fn without_aliases<'t>(
    text: &'t str,
    aliases: &[(&'static str, &str)],
) -> Result<Cow<'t, str>, ModelError> {
    let Ok(serde_json::Value::Object(mut config)) = serde_json::from_str(text) else {
        return Ok(Cow::Borrowed(text));
    };
    let mut repeated = false;
    for &(field, alias) in aliases {
        if let (Some(own), Some(other)) = (config.get(field), config.get(alias)) {
            if own != other {
                return Err(unsupported(
                    field,
                    format!("set twice, as {field} ({own}) and as its alias {alias} ({other})"),
                ));
            }
            config.remove(alias);
            repeated = true;
        }
    }
    Ok(match repeated {
        true => Cow::Owned(serde_json::Value::Object(config).to_string()),
        false => Cow::Borrowed(text),
    })
}

fn unsupported(field: &'static str, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ModelError> {
        Self::read_file(path).map(|(config, _)| config)
    }

    /// [`ModelConfig::from_file`], and the file's text for the other readers of its fields
    /// (the task head's).
    pub(crate) fn read_file(path: &Path) -> Result<(ModelConfig, String), ModelError> {
        let text = read_text(path, "the model's config.json")?;
        let config = Self::from_json(&text).map_err(|e| match e {
            ModelError::BadJson { reason, .. } => ModelError::BadJson {
                path: path.to_path_buf(),
                reason,
            },
            other => other,
        })?;
        Ok((config, text))
    }

    /// Parses and validates the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<ModelConfig, ModelError> {
        let bad = |e: serde_json::Error| ModelError::BadJson {
            path: "config.json".into(),
            reason: e.to_string(),
        };
        let ty: TypeOnly = serde_json::from_str(text).map_err(bad)?;
        let Some(model_type) = ty.model_type else {
            return Err(unsupported(
                "model_type",
                format!(
                    "missing: config.json must name its architecture ({})",
                    SUPPORTED_MODEL_TYPES.join(", ")
                ),
            ));
        };
        let config = match model_type.as_str() {
            "bert" | "roberta" | "xlm-roberta" | "camembert" => {
                let c: BertJson = serde_json::from_str(text).map_err(bad)?;
                if let Some(p) = c.position_embedding_type.as_deref()
                    && p != "absolute"
                {
                    return Err(unsupported(
                        "position_embedding_type",
                        format!("{p:?} is not supported (only \"absolute\")"),
                    ));
                }
                if c.add_cross_attention {
                    return Err(unsupported(
                        "add_cross_attention",
                        "cross-attention is not supported",
                    ));
                }
                let (family, default_pad) = match model_type.as_str() {
                    "bert" => (Family::Bert, 0),
                    _ => (Family::Roberta, 1),
                };
                ModelConfig {
                    model_type,
                    family,
                    vocab_size: c.vocab_size,
                    hidden_size: c.hidden_size,
                    n_layers: c.num_hidden_layers,
                    n_heads: c.num_attention_heads,
                    intermediate_size: c.intermediate_size,
                    max_positions: c.max_position_embeddings,
                    type_vocab_size: c.type_vocab_size,
                    layer_norm_eps: layer_norm_eps(c.layer_norm_eps, BERT_FIELDS.layer_norm_eps)?,
                    activation: Activation::parse(&c.hidden_act, BERT_FIELDS.activation)?,
                    pad_token_id: c.pad_token_id.unwrap_or(default_pad),
                    causal: c.is_decoder,
                    tied_lm_head: true,
                    decoder: None,
                }
            }
            "distilbert" => {
                let text = without_aliases(text, &DISTILBERT_ALIASES)?;
                let c: DistilBertJson = serde_json::from_str(&text).map_err(bad)?;
                ModelConfig {
                    model_type,
                    family: Family::DistilBert,
                    vocab_size: c.vocab_size,
                    hidden_size: c.dim,
                    n_layers: c.n_layers,
                    n_heads: c.n_heads,
                    intermediate_size: c.hidden_dim,
                    max_positions: c.max_position_embeddings,
                    type_vocab_size: 0,
                    // transformers' DistilBERT layers fix their LayerNorms' epsilon.
                    layer_norm_eps: 1e-12,
                    activation: Activation::parse(&c.activation, DISTILBERT_FIELDS.activation)?,
                    pad_token_id: c.pad_token_id.unwrap_or(0),
                    causal: false,
                    tied_lm_head: true,
                    decoder: None,
                }
            }
            "gpt2" => {
                let text = without_aliases(text, &GPT2_ALIASES)?;
                let c: Gpt2Json = serde_json::from_str(&text).map_err(bad)?;
                if !c.scale_attn_weights {
                    return Err(unsupported(
                        "scale_attn_weights",
                        "false is not supported (only the standard 1/sqrt(head_dim) scaling)",
                    ));
                }
                if c.scale_attn_by_inverse_layer_idx {
                    return Err(unsupported(
                        "scale_attn_by_inverse_layer_idx",
                        "true is not supported (only the standard 1/sqrt(head_dim) scaling)",
                    ));
                }
                if c.add_cross_attention {
                    return Err(unsupported(
                        "add_cross_attention",
                        "cross-attention is not supported",
                    ));
                }
                ModelConfig {
                    model_type,
                    family: Family::Gpt2,
                    vocab_size: c.vocab_size,
                    hidden_size: c.n_embd,
                    n_layers: c.n_layer,
                    n_heads: c.n_head,
                    intermediate_size: match c.n_inner {
                        Some(n) => n,
                        None => c.n_embd.checked_mul(4).ok_or_else(|| {
                            unsupported("n_embd", format!("{} is too large", c.n_embd))
                        })?,
                    },
                    max_positions: c.n_positions,
                    type_vocab_size: 0,
                    layer_norm_eps: layer_norm_eps(
                        c.layer_norm_epsilon,
                        GPT2_FIELDS.layer_norm_eps,
                    )?,
                    activation: Activation::parse(&c.activation_function, GPT2_FIELDS.activation)?,
                    pad_token_id: c.eos_token_id.and_then(|ids| ids.first()).unwrap_or(0),
                    causal: true,
                    tied_lm_head: c.tie_word_embeddings,
                    decoder: None,
                }
            }
            "llama" | "mistral" | "qwen2" | "qwen3" | "gemma2" => {
                let c: LlamaJson = serde_json::from_str(text).map_err(bad)?;
                if c.partial_rotary_factor.is_some_and(|f| f != 1.0) {
                    return Err(unsupported(
                        "partial_rotary_factor",
                        "only 1 (rotary embeddings over the whole head) is supported",
                    ));
                }
                if c.num_attention_heads == 0
                    || (c.head_dim.is_none()
                        && model_type != "qwen3"
                        && !c.hidden_size.is_multiple_of(c.num_attention_heads))
                {
                    return Err(unsupported(
                        "num_attention_heads",
                        format!(
                            "{} does not divide hidden_size {} (and no head_dim is given)",
                            c.num_attention_heads, c.hidden_size
                        ),
                    ));
                }
                let qwen3 = model_type == "qwen3";
                let gemma2 = model_type == "gemma2";
                let d = match c.head_dim {
                    Some(d) => d,
                    None if gemma2 => 256,
                    None if qwen3 => 128,
                    None => c.hidden_size / c.num_attention_heads,
                };
                if d == 0 || !d.is_multiple_of(2) {
                    return Err(unsupported(
                        "head_dim",
                        format!("{d}: rotary embeddings need an even head size of at least 2"),
                    ));
                }
                let n_kv_heads = c.num_key_value_heads.unwrap_or(c.num_attention_heads);
                if n_kv_heads == 0 || !c.num_attention_heads.is_multiple_of(n_kv_heads) {
                    return Err(unsupported(
                        "num_key_value_heads",
                        format!(
                            "{n_kv_heads} does not divide num_attention_heads {}",
                            c.num_attention_heads
                        ),
                    ));
                }
                // Gemma 2 gates with its hidden_activation (tanh GELU), the others with silu.
                let activation = match gemma2 {
                    true => {
                        let name = c
                            .hidden_activation
                            .as_deref()
                            .unwrap_or("gelu_pytorch_tanh");
                        match Activation::parse(name, "hidden_activation")? {
                            Activation::GeluTanh => Activation::GeluTanh,
                            _ => {
                                return Err(unsupported(
                                    "hidden_activation",
                                    format!("{name:?} is not supported (gelu_pytorch_tanh)"),
                                ));
                            }
                        }
                    }
                    false if c.hidden_act == "silu" => Activation::Silu,
                    false => {
                        return Err(unsupported(
                            "hidden_act",
                            format!("{:?} is not supported (silu)", c.hidden_act),
                        ));
                    }
                };
                // Qwen2 and Qwen3 window only with use_sliding_window (and then only some
                // layers); Mistral's window applies to every layer, Gemma 2's to the layers
                // layer_types names sliding (by default the even ones).
                let sliding_window = match model_type.as_str() {
                    "mistral" => c.sliding_window,
                    "gemma2" => Some(c.sliding_window.unwrap_or(4096)),
                    "qwen2" | "qwen3" if c.use_sliding_window == Some(true) => {
                        return Err(unsupported(
                            "use_sliding_window",
                            "Qwen's per-layer sliding windows are not supported",
                        ));
                    }
                    _ => None,
                };
                if sliding_window == Some(0) {
                    return Err(unsupported("sliding_window", "must be at least 1"));
                }
                let windows = match (gemma2, &c.layer_types) {
                    (_, Some(types)) if types.len() != c.num_hidden_layers => {
                        return Err(unsupported(
                            "layer_types",
                            format!("{} entries for {} layers", types.len(), c.num_hidden_layers),
                        ));
                    }
                    (true, Some(types)) => types
                        .iter()
                        .map(|t| match t.as_str() {
                            "sliding_attention" => Ok(sliding_window),
                            "full_attention" => Ok(None),
                            other => Err(unsupported(
                                "layer_types",
                                format!("{other:?} (sliding_attention, full_attention)"),
                            )),
                        })
                        .collect::<Result<_, _>>()?,
                    (true, None) => (0..c.num_hidden_layers)
                        .map(|l| sliding_window.filter(|_| l % 2 == 0))
                        .collect(),
                    (false, _) => vec![sliding_window; c.num_hidden_layers],
                };
                let cap = |field: &'static str, value: Option<f64>| match value {
                    Some(v) if !(v.is_finite() && v > 0.0) => {
                        Err(unsupported(field, format!("{v} must be a number above 0")))
                    }
                    v => Ok(v.map(|v| v as f32)),
                };
                let scale = match gemma2 {
                    true => {
                        let q = c.query_pre_attn_scalar.unwrap_or(256.0);
                        cap("query_pre_attn_scalar", Some(q))?;
                        Some(q.powf(-0.5) as f32)
                    }
                    false => None,
                };
                let qwen2 = model_type == "qwen2";
                ModelConfig {
                    family: Family::Llama,
                    vocab_size: c.vocab_size,
                    hidden_size: c.hidden_size,
                    n_layers: c.num_hidden_layers,
                    n_heads: c.num_attention_heads,
                    intermediate_size: c.intermediate_size,
                    max_positions: c.max_position_embeddings,
                    type_vocab_size: 0,
                    layer_norm_eps: layer_norm_eps(c.rms_norm_eps, LLAMA_FIELDS.layer_norm_eps)?,
                    activation,
                    pad_token_id: c
                        .pad_token_id
                        .or_else(|| c.eos_token_id.and_then(|ids| ids.first()))
                        .unwrap_or(0),
                    causal: true,
                    // Gemma 2's head is its embeddings unless the config says not.
                    tied_lm_head: c.tie_word_embeddings.unwrap_or(gemma2),
                    decoder: Some(DecoderConfig {
                        n_kv_heads,
                        head_dim: d,
                        qk_norm: qwen3,
                        inv_freq: inv_freq(c.rope_theta, d, c.rope_scaling.as_ref())?,
                        windows,
                        scale,
                        softcap: match gemma2 {
                            true => cap(
                                "attn_logit_softcapping",
                                c.attn_logit_softcapping.or(Some(50.0)),
                            )?,
                            false => None,
                        },
                        final_softcap: match gemma2 {
                            true => cap(
                                "final_logit_softcapping",
                                c.final_logit_softcapping.or(Some(30.0)),
                            )?,
                            false => None,
                        },
                        embed_scale: gemma2.then(|| (c.hidden_size as f32).sqrt()),
                        post_norms: gemma2,
                        norm_offset: if gemma2 { 1.0 } else { 0.0 },
                        qkv_bias: qwen2 || c.attention_bias,
                        out_bias: !qwen2 && c.attention_bias,
                        mlp_bias: !qwen2 && c.mlp_bias,
                    }),
                    model_type,
                }
            }
            _ => {
                return Err(ModelError::UnsupportedModelType {
                    model_type,
                    supported: SUPPORTED_MODEL_TYPES,
                });
            }
        };
        config.validate(match config.family {
            Family::Bert | Family::Roberta => &BERT_FIELDS,
            Family::DistilBert => &DISTILBERT_FIELDS,
            Family::Gpt2 => &GPT2_FIELDS,
            Family::Llama => &LLAMA_FIELDS,
        })?;
        Ok(config)
    }

    /// The most tokens one text may hold: a position for each ([`Family::Roberta`] numbers
    /// a text's tokens from `pad_token_id + 1`).
    pub fn max_tokens(&self) -> usize {
        match self.family {
            Family::Roberta => self
                .max_positions
                .saturating_sub(self.pad_token_id as usize + 1),
            Family::Bert | Family::DistilBert | Family::Gpt2 | Family::Llama => self.max_positions,
        }
    }

    /// The position embedding row of each of the `n` tokens of one text whose ids begin with
    /// `ids` (pad tokens after them): `0..n`, or RoBERTa's numbering ([`Family::Roberta`]).
    pub fn positions(&self, ids: &[u32], n: usize) -> Vec<usize> {
        match self.family {
            Family::Roberta => {
                let pad = self.pad_token_id;
                let mut last = pad as usize;
                (0..n)
                    .map(|t| match ids.get(t) {
                        Some(&id) if id != pad => {
                            last += 1;
                            last
                        }
                        _ => pad as usize,
                    })
                    .collect()
            }
            Family::Bert | Family::DistilBert | Family::Gpt2 | Family::Llama => (0..n).collect(),
        }
    }

    /// The architecture ([`Family::kind`]).
    pub fn kind(&self) -> ModelKind {
        self.family.kind()
    }

    /// Size of one head: `hidden_size / n_heads`, or a decoder's `head_dim`.
    pub fn head_dim(&self) -> usize {
        match &self.decoder {
            Some(dec) => dec.head_dim,
            None => self.hidden_size / self.n_heads,
        }
    }

    /// Width of the query heads side by side (the hidden size but for Qwen3's wider heads).
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim()
    }

    /// Whether the backward pass and the contributions (norm, ALTI) run on this family: the
    /// BERT family and GPT-2, not yet the Llama-style decoders.
    pub fn has_attributions(&self) -> bool {
        self.kind() != ModelKind::Llama
    }

    /// Key/value heads: the query heads' count but for grouped-query attention.
    pub fn n_kv_heads(&self) -> usize {
        self.decoder.as_ref().map_or(self.n_heads, |d| d.n_kv_heads)
    }

    /// Width of the fused query | key | value projection's output.
    pub fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv_heads()) * self.head_dim()
    }

    /// Width of the feed-forward layer's first output: gate | up for a decoder's gated one.
    pub fn ff_width(&self) -> usize {
        match self.decoder {
            Some(_) => 2 * self.intermediate_size,
            None => self.intermediate_size,
        }
    }

    fn validate(&self, names: &FieldNames) -> Result<(), ModelError> {
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            (names.hidden_size, self.hidden_size),
            (names.n_layers, self.n_layers),
            (names.n_heads, self.n_heads),
            (names.intermediate_size, self.intermediate_size),
            (names.max_positions, self.max_positions),
        ] {
            if value == 0 {
                return Err(unsupported(field, "must be at least 1"));
            }
        }
        if matches!(self.family, Family::Bert | Family::Roberta) && self.type_vocab_size == 0 {
            return Err(unsupported("type_vocab_size", "must be at least 1"));
        }
        // The encoders' word embeddings take it as their padding index, which transformers
        // refuses past the vocabulary ("Padding_idx must be within num_embeddings").
        if self.kind() == ModelKind::Bert && self.pad_token_id as usize >= self.vocab_size {
            return Err(unsupported(
                "pad_token_id",
                format!(
                    "{} is past the vocabulary of {} tokens",
                    self.pad_token_id, self.vocab_size
                ),
            ));
        }
        if self.max_tokens() == 0 {
            return Err(unsupported(
                names.max_positions,
                format!(
                    "{} leaves no position for a token: RoBERTa's positions start after \
                     pad_token_id {}",
                    self.max_positions, self.pad_token_id
                ),
            ));
        }
        if self.decoder.is_none() && !self.hidden_size.is_multiple_of(self.n_heads) {
            return Err(unsupported(
                names.hidden_size,
                format!(
                    "{} is not a multiple of the {} heads",
                    self.hidden_size, self.n_heads
                ),
            ));
        }
        // Every weight matrix must be addressable: the largest is vocab × hidden or
        // hidden × intermediate, and positions × hidden; 2^40 values is far beyond any checkpoint.
        let limit = 1usize << 40;
        for (field, a, b) in [
            ("vocab_size", self.vocab_size, self.hidden_size),
            (
                names.intermediate_size,
                self.intermediate_size,
                self.hidden_size,
            ),
            (names.max_positions, self.max_positions, self.hidden_size),
        ] {
            if a.checked_mul(b).is_none_or(|n| n > limit) {
                let hidden = names.hidden_size;
                return Err(unsupported(
                    field,
                    format!("{a} × {hidden} {b} values is too large"),
                ));
            }
        }
        Ok(())
    }
}
