//! T5 (`T5ForConditionalGeneration`,
//! <https://github.com/huggingface/transformers/blob/v4.57.0/src/transformers/models/t5/modeling_t5.py>):
//! v1.0 (a ReLU feed-forward, the head tied to the embeddings) and v1.1 / FLAN-T5 (a gated-GELU
//! feed-forward, an untied head).
//!
//! Its blocks are pre-norm with RMSNorms (`T5LayerNorm`: no mean taken away, no bias), and no
//! linear layer has a bias. Positions are not embedded: the first layer of each stack learns a
//! bias per head for each bucket of key position minus query position, and every layer of that
//! stack adds the same bias to its scores, which are not scaled (`q·k`, the `1/√d` folded into
//! the queries' initialisation). The cross-attention has no bias. The head width `d_kv` need not
//! be `d_model / heads` (FLAN-T5-small: 6 heads of 64 in a `d_model` of 512). A tied head reads
//! the decoder's output scaled by `d_model^-0.5`.

use crate::checkpoint::{Checkpoint, WeightData};
use crate::ops::{LayerNorm, Linear, Weight, WeightLayout};
use crate::seq2seq::{CrossAttention, Embeddings, GenerationSettings, Parts, Seq2SeqConfig};
use crate::weights::Layer;
use crate::{Activation, ModelError, ModelKind};

/// What T5 adds to an encoder-decoder model's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct T5Settings {
    /// Width of each head (`d_kv`).
    pub d_kv: usize,
    /// Width of the feed-forward (`d_ff`).
    pub d_ff: usize,
    /// Relative position buckets (`relative_attention_num_buckets`).
    pub buckets: usize,
    /// The distance from which positions share the last bucket
    /// (`relative_attention_max_distance`).
    pub max_distance: usize,
    /// The RMSNorms' epsilon (`layer_norm_epsilon`).
    pub eps: f32,
    /// v1.1's gated feed-forward (`act(wi_0·x) ⊙ wi_1·x`), else v1.0's `act(wi·x)`.
    pub gated: bool,
    /// The head is the shared embedding matrix (`tie_word_embeddings`).
    pub tied: bool,
}

#[derive(serde::Deserialize)]
struct RawConfig {
    vocab_size: usize,
    d_model: usize,
    d_kv: usize,
    d_ff: usize,
    num_layers: usize,
    num_decoder_layers: Option<usize>,
    num_heads: usize,
    #[serde(default = "buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "max_distance")]
    relative_attention_max_distance: usize,
    #[serde(default = "eps")]
    layer_norm_epsilon: f32,
    #[serde(default = "relu")]
    feed_forward_proj: String,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
    #[serde(default)]
    pad_token_id: u32,
    #[serde(default = "one")]
    eos_token_id: u32,
    #[serde(default)]
    decoder_start_token_id: u32,
    /// Older checkpoints' training length; T5 itself has no limit, its tokenizer says 512.
    #[serde(default = "positions")]
    n_positions: usize,
}

fn buckets() -> usize {
    32
}
fn max_distance() -> usize {
    128
}
fn eps() -> f32 {
    1e-6
}
fn relu() -> String {
    "relu".into()
}
fn yes() -> bool {
    true
}
fn one() -> u32 {
    1
}
fn positions() -> usize {
    512
}

/// T5's config.json; the JSON's error, else the config's.
pub(super) fn read_config(text: &str) -> serde_json::Result<Result<Seq2SeqConfig, ModelError>> {
    let raw: RawConfig = serde_json::from_str(text)?;
    Ok(config(raw))
}

fn config(raw: RawConfig) -> Result<Seq2SeqConfig, ModelError> {
    let decoder_layers = raw.num_decoder_layers.unwrap_or(raw.num_layers);
    let sizes = [
        ("vocab_size", raw.vocab_size),
        ("d_model", raw.d_model),
        ("d_kv", raw.d_kv),
        ("d_ff", raw.d_ff),
        ("num_layers", raw.num_layers),
        ("num_decoder_layers", decoder_layers),
        ("num_heads", raw.num_heads),
        ("n_positions", raw.n_positions),
    ];
    if let Some((field, _)) = sizes.iter().find(|(_, n)| *n == 0) {
        return Err(ModelError::InvalidConfig {
            field,
            reason: "must be at least 1".into(),
        });
    }
    // The encoder's buckets are halved (keys before and after), and half of those are exact.
    if raw.relative_attention_num_buckets < 4 {
        return Err(ModelError::InvalidConfig {
            field: "relative_attention_num_buckets",
            reason: format!(
                "{}: T5's buckets need at least 4 (half for each direction, half of those exact)",
                raw.relative_attention_num_buckets
            ),
        });
    }
    if raw.relative_attention_max_distance <= raw.relative_attention_num_buckets / 2 {
        return Err(ModelError::InvalidConfig {
            field: "relative_attention_max_distance",
            reason: format!(
                "{} must pass the exact buckets' distances (half of relative_attention_num_buckets {})",
                raw.relative_attention_max_distance, raw.relative_attention_num_buckets
            ),
        });
    }
    let (gated, activation) = feed_forward(&raw.feed_forward_proj)?;
    Ok(Seq2SeqConfig {
        model_type: "t5".into(),
        vocab_size: raw.vocab_size,
        d_model: raw.d_model,
        encoder_layers: raw.num_layers,
        decoder_layers,
        encoder_heads: raw.num_heads,
        decoder_heads: raw.num_heads,
        max_positions: raw.n_positions,
        activation,
        embed_scale: 1.0,
        pad_token_id: raw.pad_token_id,
        eos_token_id: raw.eos_token_id,
        generation: GenerationSettings {
            decoder_start_token_id: Some(raw.decoder_start_token_id),
            ..GenerationSettings::default()
        },
        t5: Some(T5Settings {
            d_kv: raw.d_kv,
            d_ff: raw.d_ff,
            buckets: raw.relative_attention_num_buckets,
            max_distance: raw.relative_attention_max_distance,
            eps: raw.layer_norm_epsilon,
            gated,
            tied: raw.tie_word_embeddings,
        }),
    })
}

/// `feed_forward_proj` as `T5Config` reads it: `ACT` or `gated-ACT`, `gated-gelu` being
/// `gelu_new`'s.
fn feed_forward(proj: &str) -> Result<(bool, Activation), ModelError> {
    let (gated, act) = match proj.split_once('-') {
        Some(("gated", act)) => (true, act),
        None => (false, proj),
        Some(_) => {
            return Err(ModelError::InvalidConfig {
                field: "feed_forward_proj",
                reason: format!("{proj:?}: expected ACT or gated-ACT, such as relu or gated-gelu"),
            });
        }
    };
    let activation = match (gated, act) {
        (true, "gelu") => Activation::GeluTanh,
        (_, "silu" | "swish") => Activation::Silu,
        (_, act) => Activation::parse(act, "feed_forward_proj")?,
    };
    Ok((gated, activation))
}

/// One stack's relative position bias (transformers' `compute_bias`).
pub(crate) struct RelativeBias {
    /// `[buckets, heads]`
    table: Vec<f32>,
    heads: usize,
    buckets: usize,
    max_distance: usize,
    /// The encoder's: keys after a query have buckets of their own.
    bidirectional: bool,
}

/// T5's bucket of key position minus query position `relative` (transformers'
/// `_relative_position_bucket`) among `buckets`, split between the keys before and after the
/// query when `bidirectional` (the encoder's): in each direction the first half one per
/// distance, the rest logarithmic up to `max_distance`, beyond which all share the last;
/// computed in f32 as torch computes it. `buckets` is at least 4 and `max_distance` more than
/// half of it (the config's checks).
pub fn relative_position_bucket(
    relative: i64,
    bidirectional: bool,
    buckets: usize,
    max_distance: usize,
) -> usize {
    let (mut n, mut bucket) = (buckets, 0);
    let distance = match bidirectional {
        true => {
            n /= 2;
            if relative > 0 {
                bucket += n;
            }
            relative.unsigned_abs()
        }
        false => (-relative).max(0).unsigned_abs(),
    } as usize;
    let exact = n / 2;
    if distance < exact {
        return bucket + distance;
    }
    let span = ((max_distance as f64) / (exact as f64)).ln() as f32;
    let log = ((distance as f32) / exact as f32).ln() / span * (n - exact) as f32;
    bucket + (exact + log as usize).min(n - 1)
}

impl RelativeBias {
    fn bucket(&self, relative: i64) -> usize {
        relative_position_bucket(
            relative,
            self.bidirectional,
            self.buckets,
            self.max_distance,
        )
    }

    /// `[heads, rows, cols]`: the bias of queries at positions `first..first + rows` over the
    /// keys at `0..cols`.
    pub(crate) fn bias(&self, first: usize, rows: usize, cols: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; self.heads * rows * cols];
        for i in 0..rows {
            for j in 0..cols {
                let b = self.bucket(j as i64 - (first + i) as i64);
                let values = &self.table[b * self.heads..][..self.heads];
                for (h, &v) in values.iter().enumerate() {
                    out[(h * rows + i) * cols + j] = v;
                }
            }
        }
        out
    }
}

/// `nn.Linear`s without bias, side by side along the output, each `[n_out, n_in]`.
fn linear(
    ckpt: &Checkpoint,
    names: &[String],
    n_in: usize,
    n_out: usize,
) -> Result<Linear, ModelError> {
    let parts = (names.iter())
        .map(|name| {
            Ok(Weight {
                data: WeightData::F32(ckpt.f32_data(&format!("{name}.weight"), &[n_out, n_in])?),
                layout: WeightLayout::OutIn,
                n_out,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Linear::from_parts(
        parts,
        vec![0.0; names.len() * n_out],
        n_in,
    ))
}

fn rms_norm(ckpt: &Checkpoint, name: &str, d: usize, eps: f32) -> Result<LayerNorm, ModelError> {
    Ok(LayerNorm {
        gamma: ckpt.f32(&format!("{name}.weight"), &[d])?,
        beta: Vec::new(),
        eps,
        rms: true,
    })
}

/// Block `l` of a stack (`"encoder"` or `"decoder"`) but the decoder's cross-attention: its
/// self-attention (sublayer 0) and its feed-forward (sublayer `ff`) as a pre-norm [`Layer`].
fn block(
    ckpt: &Checkpoint,
    (stack, l, ff): (&str, usize, usize),
    c: &Seq2SeqConfig,
    t5: T5Settings,
) -> Result<Layer, ModelError> {
    let (d, inner) = (c.d_model, c.decoder_heads * t5.d_kv);
    let p = format!("{stack}.block.{l}.layer.");
    let attn = format!("{p}0.SelfAttention.");
    let qkv: Vec<String> = ["q", "k", "v"]
        .iter()
        .map(|x| format!("{attn}{x}"))
        .collect();
    let ff = format!("{p}{ff}.");
    let ff_in: Vec<String> = match t5.gated {
        true => vec![
            format!("{ff}DenseReluDense.wi_0"),
            format!("{ff}DenseReluDense.wi_1"),
        ],
        false => vec![format!("{ff}DenseReluDense.wi")],
    };
    Ok(Layer {
        qkv: linear(ckpt, &qkv, d, inner)?,
        attn_out: linear(ckpt, &[format!("{attn}o")], inner, d)?,
        norm_attn: rms_norm(ckpt, &format!("{p}0.layer_norm"), d, t5.eps)?,
        ff_in: linear(ckpt, &ff_in, d, t5.d_ff)?,
        ff_out: linear(ckpt, &[format!("{ff}DenseReluDense.wo")], t5.d_ff, d)?,
        norm_ff: rms_norm(ckpt, &format!("{ff}layer_norm"), d, t5.eps)?,
        qk_norm: None,
        post_norms: None,
    })
}

/// Decoder block `l`'s cross-attention (sublayer 1).
fn cross_attention(
    ckpt: &Checkpoint,
    l: usize,
    c: &Seq2SeqConfig,
    t5: T5Settings,
) -> Result<CrossAttention, ModelError> {
    let (d, inner) = (c.d_model, c.decoder_heads * t5.d_kv);
    let p = format!("decoder.block.{l}.layer.1.");
    let name = |x: &str| format!("{p}EncDecAttention.{x}");
    Ok(CrossAttention {
        q: linear(ckpt, &[name("q")], d, inner)?,
        kv: linear(ckpt, &[name("k"), name("v")], d, inner)?,
        out: linear(ckpt, &[name("o")], inner, d)?,
        norm: rms_norm(ckpt, &format!("{p}layer_norm"), d, t5.eps)?,
        pre_norm: true,
        scale: Some(1.0),
    })
}

/// T5's tensors.
pub(super) fn load(
    ckpt: &Checkpoint,
    c: &Seq2SeqConfig,
    t5: T5Settings,
) -> Result<Parts, ModelError> {
    let (d, v, heads) = (c.d_model, c.vocab_size, c.decoder_heads);
    let shared = ckpt.f32_data("shared.weight", &[v, d])?;
    let side = || Embeddings {
        tokens: shared.clone(),
        positions: None,
        offset: 0,
        norm: None,
    };
    let relative = |stack: &str, bidirectional| -> Result<RelativeBias, ModelError> {
        let name = format!("{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
        Ok(RelativeBias {
            table: ckpt.f32(&name, &[t5.buckets, heads])?,
            heads,
            buckets: t5.buckets,
            max_distance: t5.max_distance,
            bidirectional,
        })
    };
    let encoder = (0..c.encoder_layers)
        .map(|l| block(ckpt, ("encoder", l, 1), c, t5))
        .collect::<Result<Vec<_>, ModelError>>()?;
    let decoder = (0..c.decoder_layers)
        .map(|l| {
            let layer = block(ckpt, ("decoder", l, 2), c, t5)?;
            Ok((layer, cross_attention(ckpt, l, c, t5)?))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let head = match t5.tied {
        true => shared.clone(),
        false => ckpt.f32_data("lm_head.weight", &[v, d])?,
    };
    Ok(Parts {
        head,
        final_logits_bias: vec![0.0; v],
        encoder_embed: side(),
        decoder_embed: side(),
        encoder,
        decoder,
        kind: match t5.gated {
            true => ModelKind::Llama,
            false => ModelKind::Gpt2,
        },
        final_norms: Some((
            rms_norm(ckpt, "encoder.final_layer_norm", d, t5.eps)?,
            rms_norm(ckpt, "decoder.final_layer_norm", d, t5.eps)?,
        )),
        relative: Some((relative("encoder", true)?, relative("decoder", false)?)),
        scale: Some(1.0),
        head_scale: match t5.tied {
            true => (d as f32).powf(-0.5),
            false => 1.0,
        },
    })
}
