//! Text generation with a decoder (GPT-2 or a Llama-style one): the prompt is fed once
//! into a [`KvCache`], then each new token is chosen from the last logits (greedy, or sampled
//! with a temperature and an optional top-k cut, as transformers' `TemperatureLogitsWarper` and
//! `TopKLogitsWarper` in <https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/generation/logits_process.py>)
//! and fed back. Optionally keeps, for each generated token, the last layer's head-averaged
//! attention of the position that produced it.

use std::num::NonZeroUsize;

use crate::kv_cache::{KvCache, check_decoder};
use crate::{Encoding, Model, ModelError};

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (the lowest id on a tie).
    Greedy,
    /// A draw from `softmax(logits / temperature)`, restricted to the `top_k` most likely
    /// tokens when set; `seed` makes the draws reproducible.
    Sample {
        /// Divides the logits: below 1 sharper, above 1 flatter.
        temperature: Temperature,
        /// Draw only among this many most likely tokens; `None` draws among all.
        top_k: Option<NonZeroUsize>,
        /// The draws' seed: the same seed gives the same text.
        seed: u64,
    },
}

/// A sampling temperature: a finite number above 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Temperature(f32);

impl Temperature {
    /// The model's own distribution.
    pub const ONE: Temperature = Temperature(1.0);

    /// `None` unless `t` is finite and above 0.
    pub fn new(t: f32) -> Option<Temperature> {
        (t.is_finite() && t > 0.0).then_some(Temperature(t))
    }

    /// The value, above 0.
    pub fn get(self) -> f32 {
        self.0
    }
}

/// One generation request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    /// Exactly this many tokens are generated (the end-of-text token does not stop it).
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Keep each generated token's attention ([`Generation::attention`]).
    pub attention: bool,
}

/// A prompt and its continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The prompt as the tokenizer encoded it.
    pub prompt: Encoding,
    /// The generated token ids, in order.
    pub ids: Vec<u32>,
    /// Each generated token's text, as the tokenizer decodes it alone.
    pub pieces: Vec<String>,
    /// The continuation decoded as a whole.
    pub text: String,
    /// Per generated token `i`: the last layer's attention (averaged over the heads) of the
    /// position whose logits chose it, over the prompt and the `i` tokens generated before:
    /// `[prompt_len + i]`. Present when asked for.
    pub attention: Option<Vec<Vec<f32>>>,
}

/// Generates `options.max_new_tokens` tokens after `prompt`.
///
/// Errors: a model that is not a decoder ([`ModelError::NotADecoder`]), an empty prompt, or a
/// prompt plus continuation that does not fit the model's positions ([`ModelError::CacheFull`]).
pub fn generate(
    model: &Model,
    prompt: &str,
    options: &GenerateOptions,
) -> Result<Generation, ModelError> {
    check_decoder(model)?;
    let enc = model.encode(prompt, None)?;
    // The last generated token is never fed back, so the cache needs prompt + n − 1 positions.
    let needed = enc
        .len()
        .saturating_add(options.max_new_tokens.saturating_sub(1));
    let mut cache = KvCache::with_capacity(model, needed)?;
    let vocab = model.config().vocab_size;
    // Only ids the tokenizer can write are chosen: an embedding table padded past the
    // vocabulary, or a vocabulary with gaps, has rows no text comes from.
    let unwritable: Vec<usize> = (0..vocab)
        .filter(|&id| u32::try_from(id).map_or(true, |id| model.token(id).is_none()))
        .collect();
    if unwritable.len() == vocab {
        return Err(ModelError::Tokenizer {
            reason: format!("it has no token for any of the model's {vocab} ids"),
        });
    }
    let mut rng = match options.sampling {
        Sampling::Sample { seed, .. } => SplitMix64(seed),
        Sampling::Greedy => SplitMix64(0),
    };
    let mut ids = Vec::with_capacity(options.max_new_tokens);
    let mut attention = options.attention.then(Vec::new);
    let mut feed = enc.ids.clone();
    while ids.len() < options.max_new_tokens {
        let step = cache.feed_last(&feed, options.attention)?;
        let logits = &step.logits[..vocab];
        let next = if unwritable.is_empty() {
            choose(logits, &options.sampling, &mut rng)
        } else {
            let mut writable = logits.to_vec();
            unwritable
                .iter()
                .for_each(|&id| writable[id] = f32::NEG_INFINITY);
            choose(&writable, &options.sampling, &mut rng)
        };
        if let (Some(all), Some(w)) = (&mut attention, &step.last_layer_attention) {
            let row = w.len() / feed.len();
            all.push(w[(feed.len() - 1) * row..][..row].to_vec());
        }
        ids.push(next);
        feed = vec![next];
    }
    let pieces = ids
        .iter()
        .map(|&id| model.decode(&[id]))
        .collect::<Result<Vec<_>, _>>()?;
    let text = model.decode(&ids)?;
    Ok(Generation {
        prompt: enc,
        ids,
        pieces,
        text,
        attention,
    })
}

/// The most likely token of one row of logits (the lowest id on a tie): greedy decoding.
///
/// # Shapes
/// - `logits`: `[vocab]`
pub fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The next token from one row of logits.
///
/// # Shapes
/// - `logits`: `[vocab]`
fn choose(logits: &[f32], sampling: &Sampling, rng: &mut SplitMix64) -> u32 {
    let Sampling::Sample {
        temperature, top_k, ..
    } = *sampling
    else {
        return greedy(logits);
    };
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k.map_or(logits.len(), NonZeroUsize::get));
    let top = logits[order[0]];
    let probs: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i] - top) / f64::from(temperature.get())).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    let mut target = rng.next_f64() * total;
    for (&i, &p) in order.iter().zip(&probs) {
        if target < p {
            return i as u32;
        }
        target -= p;
    }
    // Rounding left some of the total: the last token that can be drawn at all (a masked
    // token's weight is 0; the top token's is 1).
    let last = order.iter().zip(&probs).rev().find(|(_, p)| **p > 0.0);
    last.map_or(order[0], |(&i, _)| i) as u32
}

/// SplitMix64 (Steele, Lea & Flood 2014): a tiny generator whose sequence for a seed is fixed
/// by its definition, so a seed gives the same draws on every build and platform (the text can
/// still differ where the logits themselves do: another thread count sums them in another
/// order, which can tip a near tie).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
