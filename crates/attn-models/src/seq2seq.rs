//! Encoder-decoder models: BART (`BartForConditionalGeneration`,
//! <https://github.com/huggingface/transformers/blob/v4.57.0/src/transformers/models/bart/modeling_bart.py>)
//! and Marian (`MarianMTModel`, `.../models/marian/modeling_marian.py`, the Helsinki-NLP
//! opus-mt models, with their SentencePiece tokenizer: [`crate::MarianTokenizer`]), and T5
//! (`T5ForConditionalGeneration`, v1.0, v1.1 and FLAN-T5), with its three kinds of attention: the encoder's over the source, the decoder's causal one
//! over what it has read, and the decoder's cross-attention from each of its tokens to the
//! source's.
//!
//! BART's blocks are post-norm (the LayerNorm after each residual, as BERT's): the encoder's
//! are BERT's, the decoder's add a cross-attention sublayer between the self-attention and the
//! feed-forward. Embeddings are the shared token matrix (scaled by √d_model with
//! `scale_embedding`) plus positions: BART's learned ones read at `position + 2`, then its
//! `layernorm_embedding`; Marian's sinusoidal ones (sines in the first half of each vector,
//! cosines in the second), no norm. The head is the decoder's token matrix (or `lm_head`) plus
//! `final_logits_bias`.

use std::path::Path;

use attn_core::{AttnInput, AttnOptions, AttnShape, Causal, FloatMask, WeightsRequest};

use crate::block::{Buffers, Multiply};
use crate::checkpoint::{Checkpoint, F32Data, WeightData};
use crate::model::{merge_heads, parallelism, split_heads};
use crate::ops::{
    Epilogue, Gemm, GemmKernel, LayerNorm, Linear, Weight, WeightLayout, gemm_bt, residual_bias_add,
};
use crate::spm::MarianTokenizer;
use crate::tokenize::{Encoding, TextTokenizer};
use crate::weights::Layer;
use crate::{Activation, ModelError, ModelKind};

mod t5;

pub use t5::{T5Settings, relative_position_bucket};

/// The `model_type`s this module runs.
pub const SEQ2SEQ_MODEL_TYPES: &[&str] = &["bart", "mbart", "marian", "t5"];

/// Whether `dir/config.json` names an encoder-decoder model this module runs.
pub fn is_seq2seq(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("model_type")?.as_str().map(str::to_string))
        .is_some_and(|t| SEQ2SEQ_MODEL_TYPES.contains(&t.as_str()))
}

#[derive(serde::Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: usize,
    d_model: usize,
    encoder_layers: usize,
    decoder_layers: usize,
    encoder_attention_heads: usize,
    decoder_attention_heads: usize,
    encoder_ffn_dim: usize,
    decoder_ffn_dim: usize,
    max_position_embeddings: usize,
    #[serde(default)]
    scale_embedding: bool,
    #[serde(default = "gelu")]
    activation_function: String,
    #[serde(default = "one")]
    pad_token_id: u32,
    #[serde(default = "two")]
    eos_token_id: u32,
    #[serde(default = "two")]
    decoder_start_token_id: u32,
    #[serde(default)]
    forced_bos_token_id: Option<u32>,
    #[serde(default)]
    forced_eos_token_id: Option<u32>,
}

fn gelu() -> String {
    "gelu".into()
}
fn one() -> u32 {
    1
}
fn two() -> u32 {
    2
}

/// What generation honours, from `generation_config.json` where the directory has one, else
/// from `config.json`.
#[derive(Debug, Clone, PartialEq, Default, serde::Deserialize)]
pub struct GenerationSettings {
    /// The token the decoder reads first.
    pub decoder_start_token_id: Option<u32>,
    /// The token forced as the first one generated.
    pub forced_bos_token_id: Option<u32>,
    /// The token forced as the last one, at `max_length`.
    pub forced_eos_token_id: Option<u32>,
    /// The most tokens the decoder's sequence holds, its start token included.
    pub max_length: Option<usize>,
    /// Token sequences never generated; those of one token are masked at every step.
    #[serde(default)]
    pub bad_words_ids: Vec<Vec<u32>>,
    /// The beams the checkpoint asks for (greedy decoding is one).
    pub num_beams: Option<usize>,
    /// Beam search divides a finished beam's log-probability by its length to this power
    /// (default 1).
    pub length_penalty: Option<f32>,
    /// Beam search's stopping rule: `true` (once `num_beams` beams finished), `false` (once
    /// no running beam can beat the finished ones, by transformers' heuristic) or `"never"`.
    pub early_stopping: Option<serde_json::Value>,
}

/// Beam search's stopping rule ([`GenerationSettings::early_stopping`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EarlyStopping {
    Yes,
    Heuristic,
    Never,
}

/// An encoder-decoder model's shape and special tokens.
#[derive(Debug, Clone)]
pub struct Seq2SeqConfig {
    /// `config.json`'s `model_type`.
    pub model_type: String,
    /// Tokens of the shared vocabulary.
    pub vocab_size: usize,
    /// Width of both stacks.
    pub d_model: usize,
    /// Encoder blocks.
    pub encoder_layers: usize,
    /// Decoder blocks.
    pub decoder_layers: usize,
    /// Heads of each encoder attention.
    pub encoder_heads: usize,
    /// Heads of each decoder attention, self and cross.
    pub decoder_heads: usize,
    /// Most tokens either side reads (`max_position_embeddings`).
    pub max_positions: usize,
    /// The feed-forward's activation.
    pub activation: Activation,
    /// `√d_model` with `scale_embedding`, else 1.
    pub embed_scale: f32,
    /// The padding token.
    pub pad_token_id: u32,
    /// The end-of-sequence token, where generation stops.
    pub eos_token_id: u32,
    /// What generation honours.
    pub generation: GenerationSettings,
    /// T5's relative positions, norms, feed-forward and head.
    pub t5: Option<T5Settings>,
}

impl Seq2SeqConfig {
    fn read(dir: &Path) -> Result<Seq2SeqConfig, ModelError> {
        let path = dir.join("config.json");
        let text = crate::config::read_text(&path, "the model's config.json")?;
        let bad = |reason: String| ModelError::BadJson {
            path: path.clone(),
            reason,
        };
        let model_type = serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| bad(e.to_string()))?
            .get("model_type")
            .and_then(|t| t.as_str().map(str::to_string));
        let mut config = match model_type.as_deref() {
            Some("t5") => t5::read_config(&text).map_err(|e| bad(e.to_string()))??,
            _ => Self::read_bart(&text).map_err(|e| bad(e.to_string()))??,
        };
        let gen_path = dir.join("generation_config.json");
        if crate::config::present(&gen_path) {
            let text = crate::config::read_text(&gen_path, "generation_config.json")?;
            let file: GenerationSettings =
                serde_json::from_str(&text).map_err(|e| ModelError::BadJson {
                    path: gen_path.clone(),
                    reason: e.to_string(),
                })?;
            let g = &config.generation;
            config.generation = GenerationSettings {
                decoder_start_token_id: file.decoder_start_token_id.or(g.decoder_start_token_id),
                forced_bos_token_id: file.forced_bos_token_id.or(g.forced_bos_token_id),
                forced_eos_token_id: file.forced_eos_token_id.or(g.forced_eos_token_id),
                ..file
            };
        }
        Ok(config)
    }

    /// Width of each encoder head: `d_model / heads`, T5's own `d_kv`.
    pub fn encoder_head_dim(&self) -> usize {
        self.t5
            .map_or(self.d_model / self.encoder_heads, |t| t.d_kv)
    }

    /// Width of each decoder head, self and cross.
    pub fn decoder_head_dim(&self) -> usize {
        self.t5
            .map_or(self.d_model / self.decoder_heads, |t| t.d_kv)
    }

    /// BART's, mBART's and Marian's config.json; the JSON's error, else the config's.
    fn read_bart(text: &str) -> serde_json::Result<Result<Seq2SeqConfig, ModelError>> {
        let raw: RawConfig = serde_json::from_str(text)?;
        Ok(Self::from_bart(raw))
    }

    fn from_bart(raw: RawConfig) -> Result<Seq2SeqConfig, ModelError> {
        if !SEQ2SEQ_MODEL_TYPES.contains(&raw.model_type.as_str()) {
            return Err(ModelError::UnsupportedModelType {
                model_type: raw.model_type,
                supported: SEQ2SEQ_MODEL_TYPES,
            });
        }
        for (field, heads) in [
            ("encoder_attention_heads", raw.encoder_attention_heads),
            ("decoder_attention_heads", raw.decoder_attention_heads),
        ] {
            if heads == 0 || !raw.d_model.is_multiple_of(heads) {
                return Err(ModelError::InvalidConfig {
                    field,
                    reason: format!("{heads} heads do not divide d_model {}", raw.d_model),
                });
            }
        }
        let sizes = [
            ("vocab_size", raw.vocab_size),
            ("encoder_layers", raw.encoder_layers),
            ("decoder_layers", raw.decoder_layers),
            ("max_position_embeddings", raw.max_position_embeddings),
            ("encoder_ffn_dim", raw.encoder_ffn_dim),
            ("decoder_ffn_dim", raw.decoder_ffn_dim),
        ];
        if let Some((field, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            return Err(ModelError::InvalidConfig {
                field,
                reason: "must be at least 1".into(),
            });
        }
        let generation = GenerationSettings {
            decoder_start_token_id: Some(raw.decoder_start_token_id),
            forced_bos_token_id: raw.forced_bos_token_id,
            forced_eos_token_id: raw.forced_eos_token_id,
            ..GenerationSettings::default()
        };
        Ok(Seq2SeqConfig {
            model_type: raw.model_type,
            vocab_size: raw.vocab_size,
            d_model: raw.d_model,
            encoder_layers: raw.encoder_layers,
            decoder_layers: raw.decoder_layers,
            encoder_heads: raw.encoder_attention_heads,
            decoder_heads: raw.decoder_attention_heads,
            max_positions: raw.max_position_embeddings,
            activation: match raw.activation_function.as_str() {
                "swish" | "silu" => Activation::Silu,
                other => Activation::parse(other, "activation_function")?,
            },
            embed_scale: match raw.scale_embedding {
                true => (raw.d_model as f32).sqrt(),
                false => 1.0,
            },
            pad_token_id: raw.pad_token_id,
            eos_token_id: raw.eos_token_id,
            generation,
            t5: None,
        })
    }
}

/// What the decoder's pass gives.
pub struct Decoded {
    /// `[decoder_layers, heads, T, T]` (causal)
    pub self_attentions: Vec<f32>,
    /// `[decoder_layers, heads, T, S]`
    pub cross_attentions: Vec<f32>,
    /// `[T, vocab]`
    pub logits: Vec<f32>,
}

/// A decoder block's cross-attention: queries from the decoder, keys and values from the
/// encoder's output.
struct CrossAttention {
    q: Linear,
    /// Keys and values side by side: `[S, 2·d_model]`.
    kv: Linear,
    out: Linear,
    norm: LayerNorm,
    /// mBART's and T5's norm before the sublayer; BART's and Marian's after the residual.
    pre_norm: bool,
    /// The scores' factor: `None` for `1/√head_dim`, T5's 1.
    scale: Option<f32>,
}

impl CrossAttention {
    /// The keys and values of the encoder's output `encoded` (`[S, d_model]`), each `[heads,
    /// S, head_dim]`.
    fn keys_values(
        &self,
        encoded: &[f32],
        (heads, dh): (usize, usize),
        multiply: &Multiply<'_>,
    ) -> (Vec<f32>, Vec<f32>) {
        let s = encoded.len() / self.kv.n_in.max(1);
        let mut kv = vec![0.0f32; s * 2 * heads * dh];
        multiply(&self.kv, encoded, &mut kv, Epilogue::Bias);
        let (mut no_q, mut k, mut v) =
            (Vec::new(), vec![0.0; kv.len() / 2], vec![0.0; kv.len() / 2]);
        // A zero-width query part: the keys and values alone.
        split_heads(&kv, 1, s, (0, heads), dh, [&mut no_q, &mut k, &mut v]);
        (k, v)
    }

    /// The sublayer on decoder rows `hidden` (`[T, d_model]`, in place: attention to the
    /// encoder's keys and values `kv`, output projection, residual, norm); returns the weights
    /// `[heads, T, S]`. `buf` is `(context, sublayer)`, `[T, heads·head_dim]` and `[T,
    /// d_model]`.
    fn apply(
        &self,
        hidden: &mut [f32],
        (k, v): (&[f32], &[f32]),
        (heads, dh): (usize, usize),
        (context, sublayer): (&mut [f32], &mut [f32]),
        multiply: &Multiply<'_>,
        layer: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let (d, inner) = (self.q.n_in, heads * dh);
        let (t, s) = (hidden.len() / d, k.len() / inner);
        let mut q = vec![0.0f32; t * inner];
        match self.pre_norm {
            true => {
                let mut normed = vec![0.0f32; t * d];
                self.norm.apply_into(hidden, &mut normed);
                multiply(&self.q, &normed, &mut q, Epilogue::Bias);
            }
            false => multiply(&self.q, hidden, &mut q, Epilogue::Bias),
        }
        let (mut qh, mut no_k, mut no_v) = (vec![0.0; t * inner], Vec::new(), Vec::new());
        split_heads(&q, 1, t, (heads, 0), dh, [&mut qh, &mut no_k, &mut no_v]);
        let shape = AttnShape::new(1, heads, t, s, dh);
        let options = AttnOptions {
            scale: self.scale,
            ..AttnOptions::default()
        };
        let (out, weights) = attention(&qh, k, v, shape, options, layer)?;
        merge_heads(&out, 1, t, heads, dh, context);
        multiply(&self.out, context, sublayer, Epilogue::None);
        match self.pre_norm {
            true => residual_bias_add(hidden, sublayer, &self.out.bias),
            false => self
                .norm
                .residual_bias_apply(hidden, sublayer, &self.out.bias),
        }
        Ok(weights)
    }
}

/// The decoder's state between the tokens it reads one at a time ([`Seq2Seq::decoder_cache`]):
/// each layer's keys and values of the tokens read, per head, and of the encoder's output.
#[derive(Clone)]
pub struct DecoderCache<'m> {
    model: &'m Seq2Seq,
    /// Per layer: the cross-attention's keys and values, `[heads, S, head_dim]` each; shared
    /// by the clones of a beam search.
    cross: std::sync::Arc<Vec<(Vec<f32>, Vec<f32>)>>,
    /// Per layer, per head: `[len, head_dim]`.
    keys: Vec<Vec<Vec<f32>>>,
    values: Vec<Vec<Vec<f32>>>,
    len: usize,
}

impl DecoderCache<'_> {
    /// Reads token `id` after those read so far: the next token's logits (`[vocab]`), as the
    /// full pass gives them for this row.
    pub fn feed(&mut self, id: u32) -> Result<Vec<f32>, ModelError> {
        let mut logits = feed_all(std::slice::from_mut(self), &[id])?;
        Ok(logits.remove(0))
    }
}

/// Each of `caches` (of one model, each having read as many tokens: a beam search's beams)
/// reads its token of `ids`, their rows multiplied together (the weights streamed once for
/// all): each one's next-token logits (`[vocab]`).
fn feed_all(caches: &mut [DecoderCache<'_>], ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
    let Some(first) = caches.first() else {
        return Ok(Vec::new());
    };
    let (model, len) = (first.model, first.len);
    let c = &model.config;
    let (d, heads, rows) = (c.d_model, c.decoder_heads, caches.len());
    let dh = c.decoder_head_dim();
    let inner = heads * dh;
    if ids.len() != rows
        || caches
            .iter()
            .any(|k| k.len != len || !std::ptr::eq(k.model, model))
    {
        return Err(ModelError::InvalidInput {
            what: "decoder caches",
            reason: format!(
                "{rows} caches of one model and one length need {rows} tokens; got {}",
                ids.len()
            ),
        });
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
        return Err(ModelError::TokenOutOfVocab {
            id,
            vocab_size: c.vocab_size,
        });
    }
    if len >= c.max_positions {
        return Err(ModelError::CacheFull {
            needed: len + 1,
            capacity: c.max_positions,
            n_positions: c.max_positions,
        });
    }
    let mut hidden: Vec<f32> = (ids.iter())
        .flat_map(|&id| model.embed(&[id], &model.parts.decoder_embed, len))
        .collect();
    // T5's bias of the new row (position `len`) over the keys `0..=len`, `[heads, len + 1]`.
    let bias = (model.parts.relative.as_ref()).map(|(_, decoder)| decoder.bias(len, 1, len + 1));
    let ffn = model
        .parts
        .decoder
        .first()
        .map_or(0, |(l, _)| l.ff_in.n_out);
    let mut buf = Scratch::new(rows, (d, inner), ffn);
    // The encoder's keys and values are the same for every row.
    let cross = first_cross(caches);
    for (l, (k, v)) in cross.iter().enumerate() {
        // Each row's keys and values join its cache; its query sees them all.
        let attend = |qkv: &[f32], context: &mut [f32]| {
            for (r, cache) in caches.iter_mut().enumerate() {
                let row = &qkv[r * 3 * inner..][..3 * inner];
                for h in 0..heads {
                    cache.keys[l][h].extend_from_slice(&row[inner + h * dh..][..dh]);
                    cache.values[l][h].extend_from_slice(&row[2 * inner + h * dh..][..dh]);
                    let (k, v) = (&cache.keys[l][h], &cache.values[l][h]);
                    let shape = AttnShape::new(1, 1, 1, len + 1, dh);
                    let float_mask = match &bias {
                        Some(bias) => Some(head_row(bias, h, len + 1, l)?),
                        None => None,
                    };
                    let options = AttnOptions {
                        scale: model.parts.scale,
                        float_mask,
                        ..AttnOptions::default()
                    };
                    let (out, _) = attention(&row[h * dh..][..dh], k, v, shape, options, l)?;
                    context[r * inner + h * dh..][..dh].copy_from_slice(&out);
                }
            }
            Ok(())
        };
        model.decoder_block(l, &mut hidden, &mut buf, (k, v), attend)?;
    }
    if let Some((_, norm)) = &model.parts.final_norms {
        norm.apply(&mut hidden);
    }
    check_finite(&hidden, "the decoder's output")?;
    caches.iter_mut().for_each(|k| k.len += 1);
    let logits = model.logits(&hidden);
    Ok(logits
        .chunks_exact(c.vocab_size)
        .map(<[f32]>::to_vec)
        .collect())
}

/// Head `h`'s row of `bias` (`[heads, 1, cols]`: one query's) as a float mask `[1, cols]`.
fn head_row(bias: &[f32], h: usize, cols: usize, layer: usize) -> Result<FloatMask, ModelError> {
    FloatMask::from_vec(bias[h * cols..][..cols].to_vec(), &[1, cols]).map_err(|error| {
        ModelError::Attention {
            layer: Some(layer),
            error,
        }
    })
}

/// The cross-attention keys and values the caches share.
fn first_cross(caches: &[DecoderCache<'_>]) -> std::sync::Arc<Vec<(Vec<f32>, Vec<f32>)>> {
    std::sync::Arc::clone(&caches[0].cross)
}

/// `x` as log-probabilities, in place: `x − max − ln Σ exp(x − max)`, as torch's log_softmax.
fn log_softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = x.iter().map(|&v| (v - max).exp()).sum();
    let shift = max + sum.ln();
    x.iter_mut().for_each(|v| *v -= shift);
}

/// One side's embeddings.
struct Embeddings {
    /// `[vocab, d_model]`
    tokens: F32Data,
    /// `[offset + max_positions, d_model]`, position `p` at row `offset + p`; T5 has none
    /// (its positions are the attention's relative bias).
    positions: Option<Vec<f32>>,
    offset: usize,
    /// BART's `layernorm_embedding`.
    norm: Option<LayerNorm>,
}

/// An encoder-decoder checkpoint ready to run.
pub struct Seq2Seq {
    name: String,
    config: Seq2SeqConfig,
    tokenizer: Seq2SeqTokenizer,
    parts: Parts,
}

/// Every attention of a teacher-forced pass, and the logits.
#[derive(Debug, Clone, PartialEq)]
pub struct Seq2SeqOutput {
    /// `[encoder_layers, heads, S, S]`
    pub encoder_attentions: Vec<f32>,
    /// `[decoder_layers, heads, T, T]` (causal)
    pub decoder_attentions: Vec<f32>,
    /// `[decoder_layers, heads, T, S]`: decoder row t over the source tokens.
    pub cross_attentions: Vec<f32>,
    /// `[T, vocab]`: row t predicts the token after decoder token t.
    pub logits: Vec<f32>,
}

fn torch_linear(
    ckpt: &Checkpoint,
    names: &[&str],
    n_in: usize,
    n_out: usize,
) -> Result<Linear, ModelError> {
    let mut parts = Vec::new();
    let mut bias = Vec::new();
    for name in names {
        parts.push(Weight {
            data: WeightData::F32(ckpt.f32_data(&format!("{name}.weight"), &[n_out, n_in])?),
            layout: WeightLayout::OutIn,
            n_out,
        });
        bias.extend(ckpt.f32(&format!("{name}.bias"), &[n_out])?);
    }
    Ok(Linear::from_parts(parts, bias, n_in))
}

fn layer_norm(ckpt: &Checkpoint, name: &str, n: usize) -> Result<LayerNorm, ModelError> {
    Ok(LayerNorm {
        gamma: ckpt.f32(&format!("{name}.weight"), &[n])?,
        beta: ckpt.f32(&format!("{name}.bias"), &[n])?,
        eps: 1e-5,
        rms: false,
    })
}

/// A BART block's self-attention and feed-forward, as a post-norm [`Layer`].
fn block(ckpt: &Checkpoint, p: &str, d: usize, ffn: usize) -> Result<Layer, ModelError> {
    let attn = format!("{p}self_attn.");
    Ok(Layer {
        qkv: torch_linear(
            ckpt,
            &[
                &format!("{attn}q_proj"),
                &format!("{attn}k_proj"),
                &format!("{attn}v_proj"),
            ],
            d,
            d,
        )?,
        attn_out: torch_linear(ckpt, &[&format!("{attn}out_proj")], d, d)?,
        norm_attn: layer_norm(ckpt, &format!("{p}self_attn_layer_norm"), d)?,
        ff_in: torch_linear(ckpt, &[&format!("{p}fc1")], d, ffn)?,
        ff_out: torch_linear(ckpt, &[&format!("{p}fc2")], ffn, d)?,
        norm_ff: layer_norm(ckpt, &format!("{p}final_layer_norm"), d)?,
        qk_norm: None,
        post_norms: None,
    })
}

impl Seq2Seq {
    /// Loads `dir` (config.json, model.safetensors, and tokenizer.json, or Marian's
    /// source.spm, target.spm and vocab.json).
    pub fn load(dir: &Path) -> Result<Seq2Seq, ModelError> {
        let config = Seq2SeqConfig::read(dir)?;
        let marian = config.model_type == "marian";
        crate::model::check_convertible(dir, "AutoModelForSeq2SeqLM", !marian)?;
        let tokenizer = match marian {
            true => Seq2SeqTokenizer::Marian(Box::new(MarianTokenizer::from_dir(dir)?)),
            false => Seq2SeqTokenizer::Hf(Box::new(TextTokenizer::from_dir(
                dir,
                config.max_positions,
            )?)),
        };
        let (file, max_id) = match &tokenizer {
            Seq2SeqTokenizer::Marian(t) => ("vocab.json", t.max_id()),
            Seq2SeqTokenizer::Hf(t) => ("tokenizer.json", t.max_id()),
        };
        if let Some(max_id) = max_id.filter(|&m| m as usize >= config.vocab_size) {
            return Err(ModelError::VocabPastEmbedding {
                file,
                max_id,
                rows: config.vocab_size,
            });
        }
        let ckpt = Checkpoint::open_dir(dir)?;
        let parts = match config.t5 {
            Some(t5) => t5::load(&ckpt, &config, t5)?,
            None => load_bart(&ckpt, &config)?,
        };
        Ok(Seq2Seq {
            name: dir
                .file_name()
                .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into()),
            config,
            tokenizer,
            parts,
        })
    }

    /// The model's name (its directory's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The model's shape and special tokens.
    pub fn config(&self) -> &Seq2SeqConfig {
        &self.config
    }

    /// Generation's settings in place of the checkpoint's.
    pub fn set_generation(&mut self, settings: GenerationSettings) {
        self.config.generation = settings;
    }

    /// The source's tokens, with the tokenizer's special tokens; past the model's positions an
    /// error, or with `truncate` cut to fit.
    pub fn source_encoding(&self, text: &str, truncate: bool) -> Result<Encoding, ModelError> {
        match &self.tokenizer {
            Seq2SeqTokenizer::Hf(t) => name_side(t.encode(text, None, truncate), "source"),
            Seq2SeqTokenizer::Marian(t) => self.fit(t.encode(text, false)?, "source", truncate),
        }
    }

    /// The target's tokens (Marian's own target SentencePiece model), with the special tokens;
    /// past the model's positions an error, or with `truncate` cut to fit.
    pub fn target_encoding(&self, text: &str, truncate: bool) -> Result<Encoding, ModelError> {
        match &self.tokenizer {
            Seq2SeqTokenizer::Hf(t) => name_side(t.encode(text, None, truncate), "target"),
            Seq2SeqTokenizer::Marian(t) => self.fit(t.encode(text, true)?, "target", truncate),
        }
    }

    /// The source's ids, with the tokenizer's special tokens.
    pub fn encode_source(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        Ok(self.source_encoding(text, false)?.ids)
    }

    /// The vocabulary's string for `id`.
    pub fn token(&self, id: u32) -> Option<String> {
        match &self.tokenizer {
            Seq2SeqTokenizer::Hf(t) => t.token(id),
            Seq2SeqTokenizer::Marian(t) => t.token(id),
        }
    }

    /// Whether `id` is one of the tokenizer's special tokens.
    pub fn is_special(&self, id: u32) -> bool {
        match &self.tokenizer {
            Seq2SeqTokenizer::Hf(t) => t.is_special(id),
            Seq2SeqTokenizer::Marian(t) => t.is_special(id),
        }
    }

    /// What the decoder reads to be taught `target` (its labels, the target's ids with the
    /// tokenizer's special tokens, shifted right behind the decoder start token, as
    /// transformers' `shift_tokens_right`), and those labels: decoder row t predicts label t.
    pub fn teacher_forcing(&self, target: &str) -> Result<(Vec<u32>, Vec<u32>), ModelError> {
        let labels = self.target_encoding(target, false)?.ids;
        Ok((self.shift_right(&labels), labels))
    }

    /// What the decoder reads to be taught `labels`: the decoder start token, then the labels
    /// but the last (transformers' `shift_tokens_right`).
    pub fn shift_right(&self, labels: &[u32]) -> Vec<u32> {
        let mut decoder = vec![self.start_token()];
        decoder.extend_from_slice(&labels[..labels.len().saturating_sub(1)]);
        decoder
    }

    /// Marian's `enc`, the `which` side's tokens (`"source"`, `"target"`), if it fits the
    /// model's positions; past them an error, or with `truncate` its first tokens and its
    /// closing special token (`</s>`), as transformers' `truncation=True` cuts it.
    fn fit(
        &self,
        mut enc: Encoding,
        which: &'static str,
        truncate: bool,
    ) -> Result<Encoding, ModelError> {
        let max = self.config.max_positions;
        if enc.len() <= max {
            return Ok(enc);
        }
        if !truncate {
            return Err(ModelError::SideTooLong {
                which,
                tokens: enc.len(),
                max,
            });
        }
        fn cut<T>(v: &mut Vec<T>, max: usize, closing: bool) {
            if closing {
                let last = v.len() - 1;
                v.swap(max - 1, last);
            }
            v.truncate(max);
        }
        let closing = enc.special.last() == Some(&true);
        cut(&mut enc.ids, max, closing);
        cut(&mut enc.tokens, max, closing);
        cut(&mut enc.spans, max, closing);
        cut(&mut enc.segments, max, closing);
        cut(&mut enc.special, max, closing);
        Ok(enc)
    }

    fn start_token(&self) -> u32 {
        (self.config.generation.decoder_start_token_id).unwrap_or(self.config.eos_token_id)
    }

    fn check_ids(&self, ids: &[u32], what: &'static str) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::EmptyText { which: what });
        }
        if ids.len() > self.config.max_positions {
            return Err(ModelError::TooLong {
                tokens: ids.len(),
                max: self.config.max_positions,
                embedding: false,
                text: None,
            });
        }
        match ids
            .iter()
            .find(|&&id| id as usize >= self.config.vocab_size)
        {
            Some(&id) => Err(ModelError::TokenOutOfVocab {
                id,
                vocab_size: self.config.vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Token embeddings, scaled, plus positions, then the side's embedding LayerNorm.
    fn embed(&self, ids: &[u32], side: &Embeddings, first: usize) -> Vec<f32> {
        let d = self.config.d_model;
        let mut x = vec![0.0f32; ids.len() * d];
        for (t, (&id, row)) in ids.iter().zip(x.chunks_exact_mut(d)).enumerate() {
            let word = &side.tokens[id as usize * d..][..d];
            row.iter_mut()
                .zip(word)
                .for_each(|(x, &w)| *x = w * self.config.embed_scale);
            if let Some(positions) = &side.positions {
                let position = &positions[(side.offset + first + t) * d..][..d];
                row.iter_mut().zip(position).for_each(|(x, &p)| *x += p);
            }
        }
        if let Some(norm) = &side.norm {
            norm.apply(&mut x);
        }
        x
    }

    /// The self-attention of `rows` tokens of the encoder or the `decoder` (causal): T5's
    /// unscaled scores plus its relative position bias, else the defaults.
    fn self_options(&self, decoder: bool, rows: usize) -> Result<AttnOptions, ModelError> {
        let float_mask = match &self.parts.relative {
            Some((encoder, dec)) => {
                let bias = if decoder { dec } else { encoder }.bias(0, rows, rows);
                let dims = [1, bias.len() / (rows * rows).max(1), rows, rows];
                Some(
                    FloatMask::from_vec(bias, &dims)
                        .map_err(|error| ModelError::Attention { layer: None, error })?,
                )
            }
            None => None,
        };
        Ok(AttnOptions {
            scale: self.parts.scale,
            float_mask,
            causal: decoder.then_some(Causal::TopLeft),
            ..AttnOptions::default()
        })
    }

    /// The encoder over `source` (ids): its output `[S, d_model]` and its attentions `[L, H,
    /// S, S]`.
    pub fn encode(&self, source: &[u32]) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        self.check_ids(source, "source")?;
        let c = &self.config;
        let (s, d, heads, dh) = (
            source.len(),
            c.d_model,
            c.encoder_heads,
            c.encoder_head_dim(),
        );
        let mut hidden = self.embed(source, &self.parts.encoder_embed, 0);
        let mut attentions = Vec::with_capacity(c.encoder_layers * heads * s * s);
        let multiply: &Multiply<'_> = &multiply;
        let ffn = self.parts.encoder.first().map_or(0, |l| l.ff_in.n_out);
        let mut buf = Scratch::new(s, (d, heads * dh), ffn);
        let options = self.self_options(false, s)?;
        for (l, layer) in self.parts.encoder.iter().enumerate() {
            let attend = |qkv: &[f32], context: &mut [f32]| {
                let w = self_attention(qkv, (s, heads, dh), &options, context, l)?;
                attentions.extend(w);
                Ok(())
            };
            let kind = (self.parts.kind, c.activation);
            layer.forward(kind, &mut hidden, buf.buffers(), &multiply, attend)?;
        }
        if let Some((norm, _)) = &self.parts.final_norms {
            norm.apply(&mut hidden);
        }
        check_finite(&hidden, "the encoder's output")?;
        Ok((hidden, attentions))
    }

    /// The decoder reading `decoder_ids` against the encoder's `encoded` (`[S, d_model]`):
    /// its attentions and the logits.
    pub fn decode(&self, encoded: &[f32], decoder_ids: &[u32]) -> Result<Decoded, ModelError> {
        self.check_ids(decoder_ids, "decoder input")?;
        let c = &self.config;
        let (t, d, heads) = (decoder_ids.len(), c.d_model, c.decoder_heads);
        let s = encoded.len() / d;
        let dh = c.decoder_head_dim();
        let mut hidden = self.embed(decoder_ids, &self.parts.decoder_embed, 0);
        let mut self_attn = Vec::with_capacity(c.decoder_layers * heads * t * t);
        let mut cross_attn = Vec::with_capacity(c.decoder_layers * heads * t * s);
        let multiply: &Multiply<'_> = &multiply;
        let ffn = self.parts.decoder.first().map_or(0, |(l, _)| l.ff_in.n_out);
        let mut buf = Scratch::new(t, (d, heads * dh), ffn);
        let options = self.self_options(true, t)?;
        for (l, (_, cross)) in self.parts.decoder.iter().enumerate() {
            let (kh, vh) = cross.keys_values(encoded, (heads, dh), multiply);
            let attend = |qkv: &[f32], context: &mut [f32]| {
                self_attn.extend(self_attention(qkv, (t, heads, dh), &options, context, l)?);
                Ok(())
            };
            cross_attn.extend(self.decoder_block(l, &mut hidden, &mut buf, (&kh, &vh), attend)?);
        }
        if let Some((_, norm)) = &self.parts.final_norms {
            norm.apply(&mut hidden);
        }
        check_finite(&hidden, "the decoder's output")?;
        let logits = self.logits(&hidden);
        Ok(Decoded {
            self_attentions: self_attn,
            cross_attentions: cross_attn,
            logits,
        })
    }

    /// Decoder block `l` on the rows `hidden`, in place: the self-attention, which `attend`
    /// runs from the projected `qkv` into the merged `context`, then the cross-attention to the
    /// encoder's keys and values `kv`, then the feed-forward; returns the cross-attention's
    /// weights `[heads, rows, S]`.
    fn decoder_block(
        &self,
        l: usize,
        hidden: &mut [f32],
        buf: &mut Scratch,
        kv: (&[f32], &[f32]),
        attend: impl FnOnce(&[f32], &mut [f32]) -> Result<(), ModelError>,
    ) -> Result<Vec<f32>, ModelError> {
        let (layer, cross) = &self.parts.decoder[l];
        let c = &self.config;
        let multiply: &Multiply<'_> = &multiply;
        let Scratch {
            normed,
            qkv,
            context,
            sublayer,
            intermediate,
        } = buf;
        layer.project(self.parts.kind, hidden, normed, qkv, multiply);
        attend(qkv, context)?;
        layer.attention_residual(self.parts.kind, hidden, context, sublayer, multiply);
        let dims = (c.decoder_heads, c.decoder_head_dim());
        let weights = cross.apply(hidden, kv, dims, (context, sublayer), multiply, l)?;
        let kind = (self.parts.kind, c.activation);
        layer.feed_forward(kind, hidden, (normed, sublayer, intermediate), multiply);
        Ok(weights)
    }

    /// The head's logits of decoder rows `hidden` (`[rows, d_model]` → `[rows, vocab]`).
    fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let (d, v) = (self.config.d_model, self.config.vocab_size);
        let rows = hidden.len() / d;
        let scaled: Vec<f32>;
        let hidden = match self.parts.head_scale {
            1.0 => hidden,
            f => {
                scaled = hidden.iter().map(|x| x * f).collect();
                &scaled
            }
        };
        let mut logits = vec![0.0f32; rows * v];
        match rows <= STREAMED_ROWS {
            true => crate::kv_cache::dot_rows_multi(&self.parts.head, d, hidden, &mut logits),
            false => gemm_bt(
                hidden,
                rows,
                d,
                &self.parts.head,
                v,
                &mut logits,
                parallelism(),
            ),
        }
        for row in logits.chunks_exact_mut(v) {
            (row.iter_mut().zip(&self.parts.final_logits_bias)).for_each(|(x, b)| *x += b);
        }
        logits
    }

    /// The decoder's state for generating one token at a time against the encoder's output
    /// `encoded` (`[S, d_model]`): each layer's cross-attention keys and values, computed once.
    pub fn decoder_cache(&self, encoded: &[f32]) -> DecoderCache<'_> {
        let c = &self.config;
        let (heads, dh) = (c.decoder_heads, c.decoder_head_dim());
        let multiply: &Multiply<'_> = &multiply;
        DecoderCache {
            model: self,
            cross: std::sync::Arc::new(
                (self.parts.decoder.iter())
                    .map(|(_, cross)| cross.keys_values(encoded, (heads, dh), multiply))
                    .collect(),
            ),
            keys: vec![vec![Vec::new(); heads]; c.decoder_layers],
            values: vec![vec![Vec::new(); heads]; c.decoder_layers],
            len: 0,
        }
    }

    /// The teacher-forced pass: the encoder over `source`, the decoder over `decoder_ids`.
    pub fn forward(
        &self,
        source: &[u32],
        decoder_ids: &[u32],
    ) -> Result<Seq2SeqOutput, ModelError> {
        let (encoded, encoder_attentions) = self.encode(source)?;
        let decoded = self.decode(&encoded, decoder_ids)?;
        Ok(Seq2SeqOutput {
            encoder_attentions,
            decoder_attentions: decoded.self_attentions,
            cross_attentions: decoded.cross_attentions,
            logits: decoded.logits,
        })
    }

    /// Greedy decoding of at most `max_new_tokens` tokens after the decoder start token,
    /// honouring the generation settings (forced first and last token, one-token bad words,
    /// `max_length`) and stopping after the end-of-sequence token; the ids generated, the
    /// start token excluded.
    pub fn greedy(&self, source: &[u32], max_new_tokens: usize) -> Result<Vec<u32>, ModelError> {
        let (encoded, _) = self.encode(source)?;
        self.greedy_encoded(&encoded, max_new_tokens)
    }

    /// [`Seq2Seq::greedy`] against the encoder's output `encoded` (`[S, d_model]`).
    fn greedy_encoded(
        &self,
        encoded: &[f32],
        max_new_tokens: usize,
    ) -> Result<Vec<u32>, ModelError> {
        let eos = self.config.eos_token_id;
        let max_length = self.max_length(max_new_tokens);
        let mut ids = vec![self.start_token()];
        let mut cache = self.decoder_cache(encoded);
        while ids.len() < max_length {
            let mut last = cache.feed(ids[ids.len() - 1])?;
            self.process(&mut last, ids.len(), max_length);
            let next = crate::generate::greedy(&last);
            ids.push(next);
            if next == eos {
                break;
            }
        }
        Ok(ids[1..].to_vec())
    }

    /// transformers' beam search (generation/utils.py `_beam_search`, 4.57) of `num_beams` beams
    /// after the decoder start token, the processors of [`Seq2Seq::greedy`] on each step's
    /// log-probabilities: each step keeps the `2·num_beams` best continuations, the best
    /// `num_beams` that do not end (in `</s>` or at `max_length`) run on, and those among the
    /// first `num_beams` that end join the finished ones, scored by their log-probability over
    /// their length to the power `length_penalty`; the best finished beam's ids, the start token
    /// excluded.
    pub fn beam_search(
        &self,
        source: &[u32],
        max_new_tokens: usize,
        num_beams: usize,
    ) -> Result<Vec<u32>, ModelError> {
        let (encoded, _) = self.encode(source)?;
        self.beam_search_encoded(&encoded, max_new_tokens, num_beams)
    }

    /// [`Seq2Seq::beam_search`] against the encoder's output `encoded` (`[S, d_model]`), for a
    /// caller that keeps the encoder's attentions too.
    pub fn beam_search_encoded(
        &self,
        encoded: &[f32],
        max_new_tokens: usize,
        num_beams: usize,
    ) -> Result<Vec<u32>, ModelError> {
        if num_beams <= 1 {
            return self.greedy_encoded(encoded, max_new_tokens);
        }
        let g = &self.config.generation;
        let (eos, vocab) = (self.config.eos_token_id, self.config.vocab_size);
        let max_length = self.max_length(max_new_tokens);
        let penalty = g.length_penalty.unwrap_or(1.0);
        let stopping = match &g.early_stopping {
            Some(serde_json::Value::Bool(true)) => EarlyStopping::Yes,
            Some(serde_json::Value::String(s)) if s == "never" => EarlyStopping::Never,
            _ => EarlyStopping::Heuristic,
        };
        let keep = 2 * num_beams;
        let cache = self.decoder_cache(encoded);
        // Running beams: ids (start token first), score, cache; only the first counts at first.
        let mut seqs = vec![vec![self.start_token()]; num_beams];
        let mut scores: Vec<f32> = (0..num_beams)
            .map(|b| if b == 0 { 0.0 } else { -1e9 })
            .collect();
        let mut caches = vec![cache; num_beams];
        let mut finished: Vec<(Vec<u32>, f32, bool)> = vec![(Vec::new(), -1e9, false); num_beams];
        let mut improvable = true;
        let mut cur_len = 1;
        loop {
            // Every running beam's continuations, scored.
            let last: Vec<u32> = seqs.iter().map(|ids| ids[ids.len() - 1]).collect();
            let mut candidates: Vec<(f32, usize, u32)> = Vec::with_capacity(num_beams * vocab);
            for (b, mut logits) in feed_all(&mut caches, &last)?.into_iter().enumerate() {
                log_softmax(&mut logits);
                self.process(&mut logits, cur_len, max_length);
                let score = scores[b];
                candidates.extend(
                    logits
                        .iter()
                        .enumerate()
                        .map(|(t, &x)| (x + score, b, t as u32)),
                );
            }
            // The `keep` best, best first (ties: the lower index first, as torch.topk gives).
            let order = |a: &(f32, usize, u32), b: &(f32, usize, u32)| {
                b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2)))
            };
            if candidates.len() > keep {
                candidates.select_nth_unstable_by(keep - 1, order);
                candidates.truncate(keep);
            }
            candidates.sort_by(order);
            let ends = |&(_, _, t): &(f32, usize, u32)| t == eos || cur_len + 1 >= max_length;
            let hits: Vec<bool> = candidates.iter().map(ends).collect();
            // Those that end among the first num_beams join the finished ones.
            let all_finished = finished.iter().all(|f| f.2);
            let full = all_finished && stopping == EarlyStopping::Yes;
            let mut merged = finished.clone();
            for (k, (&(score, b, t), &hit)) in candidates.iter().zip(&hits).enumerate() {
                let mut score = score / (cur_len as f32).powf(penalty);
                let done = hit && k < num_beams;
                if full || !improvable || !done {
                    score += -1e9;
                }
                let mut ids = seqs[b].clone();
                ids.push(t);
                merged.push((ids, score, done));
            }
            merged.sort_by(|a, b| b.1.total_cmp(&a.1));
            merged.truncate(num_beams);
            finished = merged;
            // The best num_beams that do not end run on.
            let mut next: Vec<(f32, usize, u32)> = (candidates.iter().zip(&hits))
                .map(|(&(score, b, t), &hit)| (if hit { score - 1e9 } else { score }, b, t))
                .collect();
            next.sort_by(|a, b| b.0.total_cmp(&a.0));
            next.truncate(num_beams);
            let parents: Vec<(Vec<u32>, DecoderCache<'_>)> = (next.iter())
                .map(|&(_, b, t)| {
                    let mut ids = seqs[b].clone();
                    ids.push(t);
                    (ids, caches[b].clone())
                })
                .collect();
            scores = next.iter().map(|&(score, _, _)| score).collect();
            (seqs, caches) = parents.into_iter().unzip();
            cur_len += 1;
            let best_len = match stopping {
                EarlyStopping::Never if penalty > 0.0 => max_length - 1,
                _ => cur_len - 1,
            };
            let best_possible = scores[0] / (best_len as f32).powf(penalty);
            let worst = (finished.iter().map(|f| f.1)).fold(f32::INFINITY, f32::min);
            improvable &= finished.iter().any(|f| !f.2 || best_possible > worst);
            let open = !(finished.iter().all(|f| f.2) && stopping == EarlyStopping::Yes);
            if !(improvable && open && !hits.iter().all(|&h| h)) {
                break;
            }
        }
        Ok(finished[0].0[1..].to_vec())
    }

    /// transformers' max_length for `max_new_tokens` new tokens: it counts the start token, and
    /// the checkpoint's and the positions' limits cap it.
    fn max_length(&self, max_new_tokens: usize) -> usize {
        (1 + max_new_tokens)
            .min(self.config.generation.max_length.unwrap_or(usize::MAX))
            .min(self.config.max_positions)
    }

    /// The logits processors generation honours, on the scores of the next token after
    /// `cur_len` tokens: one-token bad words masked, the forced first and last tokens.
    fn process(&self, scores: &mut [f32], cur_len: usize, max_length: usize) {
        let g = &self.config.generation;
        for bad in g.bad_words_ids.iter().filter(|b| b.len() == 1) {
            if let Some(x) = scores.get_mut(bad[0] as usize) {
                *x = f32::NEG_INFINITY;
            }
        }
        let forced = match cur_len {
            1 => g.forced_bos_token_id,
            n if n + 1 == max_length => g.forced_eos_token_id,
            _ => None,
        };
        if let Some(id) = forced.filter(|&id| (id as usize) < scores.len()) {
            scores.fill(f32::NEG_INFINITY);
            scores[id as usize] = 0.0;
        }
    }

    /// The text of target `ids` without special tokens.
    pub fn decode_text(&self, ids: &[u32]) -> Result<String, ModelError> {
        let kept: Vec<u32> = (ids.iter().copied())
            .filter(|&id| !self.is_special(id))
            .collect();
        match &self.tokenizer {
            Seq2SeqTokenizer::Hf(t) => t.decode(&kept),
            Seq2SeqTokenizer::Marian(t) => Ok(t.decode(&kept)),
        }
    }
}

/// The tensors of a family's checkpoint, read and checked.
struct Parts {
    /// `[vocab, d_model]`: the head (the decoder's token embeddings unless untied).
    head: F32Data,
    /// `[vocab]`
    final_logits_bias: Vec<f32>,
    encoder_embed: Embeddings,
    decoder_embed: Embeddings,
    encoder: Vec<Layer>,
    decoder: Vec<(Layer, CrossAttention)>,
    /// BART's and Marian's blocks are post-norm ([`ModelKind::Bert`]), mBART's pre-norm
    /// ([`ModelKind::Gpt2`], with a last LayerNorm after each stack), T5's pre-norm with RMSNorms
    /// (v1.0's as [`ModelKind::Gpt2`]'s, v1.1's gated as [`ModelKind::Llama`]'s).
    kind: ModelKind,
    /// mBART's `encoder.layer_norm` and `decoder.layer_norm`, T5's `final_layer_norm`s.
    final_norms: Option<(LayerNorm, LayerNorm)>,
    /// T5's relative position biases: the encoder's and the decoder's self-attention's.
    relative: Option<(t5::RelativeBias, t5::RelativeBias)>,
    /// The self-attention scores' factor: `None` for `1/√head_dim`, T5's 1.
    scale: Option<f32>,
    /// What the decoder's output is multiplied by before the head: T5's tied `d_model^-0.5`.
    head_scale: f32,
}

/// BART's, mBART's and Marian's tensors.
fn load_bart(ckpt: &Checkpoint, config: &Seq2SeqConfig) -> Result<Parts, ModelError> {
    let marian = config.model_type == "marian";
    let mbart = config.model_type == "mbart";
    let (d, v) = (config.d_model, config.vocab_size);
    let first = |names: &[&str]| -> Result<F32Data, ModelError> {
        let name =
            (names.iter())
                .find(|n| ckpt.contains(n))
                .ok_or_else(|| ModelError::MissingTensor {
                    tensor: names[0].to_string(),
                })?;
        ckpt.f32_data(name, &[v, d])
    };
    let final_logits_bias = match ckpt.contains("final_logits_bias") {
        true => ckpt.f32("final_logits_bias", &[1, v])?,
        false => vec![0.0; v],
    };
    let max = config.max_positions;
    let embed = |side: &str| -> Result<Embeddings, ModelError> {
        let tokens = first(&[
            "model.shared.weight",
            &format!("model.{side}.embed_tokens.weight"),
        ])?;
        let positions = format!("model.{side}.embed_positions.weight");
        Ok(match marian {
            true => Embeddings {
                tokens,
                positions: Some(match ckpt.contains(&positions) {
                    true => ckpt.f32(&positions, &[max, d])?,
                    false => sinusoidal(max, d),
                }),
                offset: 0,
                norm: None,
            },
            false => Embeddings {
                tokens,
                positions: Some(ckpt.f32(&positions, &[max + 2, d])?),
                offset: 2,
                norm: Some(layer_norm(
                    ckpt,
                    &format!("model.{side}.layernorm_embedding"),
                    d,
                )?),
            },
        })
    };
    let encoder = (0..config.encoder_layers)
        .map(|l| {
            let ffn = ckpt
                .info(&format!("model.encoder.layers.{l}.fc1.weight"))
                .map_or(0, |i| i.shape[0]);
            block(ckpt, &format!("model.encoder.layers.{l}."), d, ffn)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let decoder = (0..config.decoder_layers)
        .map(|l| {
            let p = format!("model.decoder.layers.{l}.");
            let ffn = ckpt
                .info(&format!("{p}fc1.weight"))
                .map_or(0, |i| i.shape[0]);
            let cross = format!("{p}encoder_attn.");
            Ok((
                block(ckpt, &p, d, ffn)?,
                CrossAttention {
                    q: torch_linear(ckpt, &[&format!("{cross}q_proj")], d, d)?,
                    kv: torch_linear(
                        ckpt,
                        &[&format!("{cross}k_proj"), &format!("{cross}v_proj")],
                        d,
                        d,
                    )?,
                    out: torch_linear(ckpt, &[&format!("{cross}out_proj")], d, d)?,
                    norm: layer_norm(ckpt, &format!("{p}encoder_attn_layer_norm"), d)?,
                    pre_norm: mbart,
                    scale: None,
                },
            ))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let (encoder_embed, decoder_embed) = (embed("encoder")?, embed("decoder")?);
    let final_norms = match mbart {
        true => Some((
            layer_norm(ckpt, "model.encoder.layer_norm", d)?,
            layer_norm(ckpt, "model.decoder.layer_norm", d)?,
        )),
        false => None,
    };
    let head = match ckpt.contains("lm_head.weight") {
        true => ckpt.f32_data("lm_head.weight", &[v, d])?,
        false => decoder_embed.tokens.clone(),
    };
    Ok(Parts {
        head,
        final_logits_bias,
        encoder_embed,
        decoder_embed,
        encoder,
        decoder,
        kind: match mbart {
            true => ModelKind::Gpt2,
            false => ModelKind::Bert,
        },
        final_norms,
        relative: None,
        scale: None,
        head_scale: 1.0,
    })
}

/// An encoder-decoder model's tokenizer: a `tokenizer.json` (BART), or Marian's SentencePiece
/// models with their vocab.json.
enum Seq2SeqTokenizer {
    Hf(Box<TextTokenizer>),
    Marian(Box<MarianTokenizer>),
}

/// Marian's sinusoidal positions (`MarianSinusoidalPositionalEmbedding`): for position `p`
/// and `j` of `d`, the angle `p / 10000^(2·⌊j/2⌋/d)`, the sines of the even `j` in the first
/// half of the vector and the cosines of the odd in the second, in f64 then rounded.
///
/// # Shapes
/// - returns `[n, d]`
fn sinusoidal(n: usize, d: usize) -> Vec<f32> {
    let half = d.div_ceil(2);
    let mut out = vec![0.0f32; n * d];
    for (p, row) in out.chunks_exact_mut(d.max(1)).enumerate() {
        let angle = |j: usize| p as f64 / 10000f64.powf((2 * (j / 2)) as f64 / d as f64);
        for (i, j) in (0..d).step_by(2).enumerate() {
            row[i] = angle(j).sin() as f32;
        }
        for (i, j) in (1..d).step_by(2).enumerate() {
            row[half + i] = angle(j).cos() as f32;
        }
    }
    out
}

/// A pass's buffers for `rows` rows.
struct Scratch {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    sublayer: Vec<f32>,
    intermediate: Vec<f32>,
}

impl Scratch {
    /// For `rows` rows of width `d` whose attention is `inner` wide (heads × head_dim).
    fn new(rows: usize, (d, inner): (usize, usize), ffn: usize) -> Scratch {
        Scratch {
            normed: vec![0.0; rows * d],
            qkv: vec![0.0; rows * 3 * inner],
            context: vec![0.0; rows * inner],
            sublayer: vec![0.0; rows * d],
            intermediate: vec![0.0; rows * ffn],
        }
    }

    fn buffers(&mut self) -> Buffers<'_> {
        Buffers {
            normed: &mut self.normed,
            qkv: &mut self.qkv,
            context: &mut self.context,
            sublayer: &mut self.sublayer,
            intermediate: &mut self.intermediate,
        }
    }
}

/// A tokenizer's "the text is too long" said of the `which` side.
fn name_side(
    enc: Result<Encoding, ModelError>,
    which: &'static str,
) -> Result<Encoding, ModelError> {
    enc.map_err(|e| match e {
        ModelError::TooLong { tokens, max, .. } => ModelError::SideTooLong { which, tokens, max },
        e => e,
    })
}

fn gemm() -> Gemm {
    Gemm {
        par: parallelism(),
        kernel: GemmKernel::Auto,
    }
}

/// Rows up to which a product streams each weight row past the inputs (a decoding step, a
/// beam search's beams) instead of a GEMM, which packs the whole weight first: 66% of a
/// 4-beam Marian-base translation went to that packing.
const STREAMED_ROWS: usize = 8;

/// `y = epilogue(x·W)`: streamed for a few rows, else a GEMM.
fn multiply(layer: &Linear, x: &[f32], y: &mut [f32], epilogue: Epilogue) {
    let rows = x.len() / layer.n_in.max(1);
    if rows <= STREAMED_ROWS {
        crate::kv_cache::matvec_rows(layer, x, y);
        epilogue.apply(y, &layer.bias, 0..layer.n_out);
    } else {
        layer.forward(x, y, epilogue, gemm());
    }
}

/// Self-attention over the fused `qkv` of `rows` tokens, the heads merged into `context`;
/// returns the weights `[heads, rows, rows]`.
fn self_attention(
    qkv: &[f32],
    (rows, heads, dh): (usize, usize, usize),
    options: &AttnOptions,
    context: &mut [f32],
    layer: usize,
) -> Result<Vec<f32>, ModelError> {
    let n = rows * heads * dh;
    let (mut q, mut k, mut v) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    split_heads(qkv, 1, rows, (heads, heads), dh, [&mut q, &mut k, &mut v]);
    let shape = AttnShape::new(1, heads, rows, rows, dh);
    let (out, weights) = attention(&q, &k, &v, shape, options.clone(), layer)?;
    merge_heads(&out, 1, rows, heads, dh, context);
    Ok(weights)
}

/// attn-core's attention under `options` with every weight returned: `(output, weights)`.
fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    options: AttnOptions,
    layer: usize,
) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let input =
        AttnInput::allowing_non_finite(q, k, v, shape).map_err(|error| ModelError::Attention {
            layer: Some(layer),
            error,
        })?;
    let options = AttnOptions {
        weights: WeightsRequest::All,
        ..options
    };
    let out = attn_core::sdpa(&input, &options).map_err(|error| ModelError::Attention {
        layer: Some(layer),
        error,
    })?;
    let weights = out.weights.map(|w| w.data().to_vec()).unwrap_or_default();
    Ok((out.out, weights))
}

fn check_finite(x: &[f32], what: &'static str) -> Result<(), ModelError> {
    match x.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(at) => Err(ModelError::InvalidInput {
            what,
            reason: format!(
                "value {} at {at} is not finite (the weights make it so)",
                x[at]
            ),
        }),
    }
}
