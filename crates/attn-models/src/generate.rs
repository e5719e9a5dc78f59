//! Text generation with a GPT-2-family model: the prompt is fed once into a [`KvCache`], then
//! each new token is chosen from the last logits (greedy, or sampled with a temperature and an
//! optional top-k cut) and fed back. Optionally keeps, for each generated token, the last
//! layer's head-averaged attention of the position that produced it.

use tokenizers::Tokenizer;

use crate::kv_cache::KvCache;
use crate::{Encoding, Model, ModelError};

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (the lowest id on a tie).
    Greedy,
    /// A draw from `softmax(logits / temperature)`, restricted to the `top_k` most likely
    /// tokens when set; `seed` makes the draws reproducible.
    Sample {
        temperature: f32,
        top_k: Option<usize>,
        seed: u64,
    },
}

/// One generation request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenerateOptions {
    /// Exactly this many tokens are generated (the end-of-text token does not stop it).
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Keep each generated token's attention ([`Generation::attention`]).
    pub attention: bool,
}

/// A prompt and its continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
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
/// Errors: a BERT model, bad sampling options (temperature ≤ 0 or not finite, `top_k == 0`),
/// an empty prompt, or a prompt plus continuation that does not fit the model's positions.
pub fn generate(
    model: &Model,
    prompt: &str,
    options: &GenerateOptions,
) -> Result<Generation, ModelError> {
    let mut cache = KvCache::new(model)?;
    if let Sampling::Sample {
        temperature, top_k, ..
    } = options.sampling
    {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(ModelError::InvalidConfig {
                field: "temperature",
                reason: format!("must be a number above 0, got {temperature}"),
            });
        }
        if top_k == Some(0) {
            return Err(ModelError::InvalidConfig {
                field: "top_k",
                reason: "must be at least 1".into(),
            });
        }
    }
    let enc = model.encode(prompt, None)?;
    // The last generated token is never fed back, so the cache needs prompt + n − 1 positions.
    let needed = enc.len() + options.max_new_tokens.saturating_sub(1);
    if needed > model.max_positions() {
        return Err(ModelError::TooLong {
            tokens: needed,
            max: model.max_positions(),
        });
    }
    let tokenizer = load_decoder(model)?;
    let vocab = model.config().vocab_size;
    let mut rng = match options.sampling {
        Sampling::Sample { seed, .. } => SplitMix64(seed),
        Sampling::Greedy => SplitMix64(0),
    };
    let mut ids = Vec::with_capacity(options.max_new_tokens);
    let mut attention = options.attention.then(Vec::new);
    let mut feed = enc.ids.clone();
    while ids.len() < options.max_new_tokens {
        let step = cache.feed(model, &feed, options.attention)?;
        let last = step.logits.len() / vocab - 1;
        let logits = &step.logits[last * vocab..][..vocab];
        let next = choose(logits, &options.sampling, &mut rng);
        if let (Some(all), Some(w)) = (&mut attention, &step.last_layer_attention) {
            let row = w.len() / feed.len();
            all.push(w[last * row..][..row].to_vec());
        }
        ids.push(next);
        feed = vec![next];
    }
    let decode = |ids: &[u32]| {
        tokenizer
            .decode(ids, false)
            .map_err(|e| ModelError::Tokenizer {
                reason: e.to_string(),
            })
    };
    let pieces = ids
        .iter()
        .map(|&id| decode(&[id]))
        .collect::<Result<Vec<_>, _>>()?;
    let text = decode(&ids)?;
    Ok(Generation {
        prompt: enc,
        ids,
        pieces,
        text,
        attention,
    })
}

/// The model's `tokenizer.json`, for turning generated ids back into text.
fn load_decoder(model: &Model) -> Result<Tokenizer, ModelError> {
    let path = model.dir().join("tokenizer.json");
    Tokenizer::from_file(&path).map_err(|e| ModelError::Tokenizer {
        reason: format!("{}: {e}", path.display()),
    })
}

/// The next token from one row of logits.
///
/// # Shapes
/// - `logits`: `[vocab]`
fn choose(logits: &[f32], sampling: &Sampling, rng: &mut SplitMix64) -> u32 {
    let argmax = |xs: &[f32]| {
        let mut best = 0;
        for (i, &x) in xs.iter().enumerate() {
            if x > xs[best] {
                best = i;
            }
        }
        best as u32
    };
    let Sampling::Sample {
        temperature, top_k, ..
    } = *sampling
    else {
        return argmax(logits);
    };
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    order.truncate(top_k.unwrap_or(logits.len()).min(logits.len()));
    let top = logits[order[0]];
    let probs: Vec<f64> = order
        .iter()
        .map(|&i| (f64::from(logits[i] - top) / f64::from(temperature)).exp())
        .collect();
    let total: f64 = probs.iter().sum();
    let mut target = rng.next_f64() * total;
    for (&i, &p) in order.iter().zip(&probs) {
        if target < p {
            return i as u32;
        }
        target -= p;
    }
    order[order.len() - 1] as u32
}

/// SplitMix64 (Steele, Lea & Flood 2014): a tiny generator whose sequence for a seed is fixed
/// by its definition, so a seed gives the same text on every build and platform.
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
