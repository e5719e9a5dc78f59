//! Attention as a soft database lookup (the notes' Paris/London/Tokyo example): a query is
//! matched against every key by cosine similarity, the scores are divided by a temperature, and a
//! softmax turns them into the weights with which the values are mixed.

use crate::VizError;

/// all-MiniLM-L6-v2 was trained with a contrastive loss whose scale is 20 (sentence-transformers'
/// `MultipleNegativesRankingLoss`), i.e. the temperature its cosine scores were made for.
pub const DEFAULT_TEMPERATURE: f32 = 0.05;

/// The smallest temperature taken: f32's smallest normal number. Below it `cosine / T` can
/// overflow to infinity, and two infinite scores make the softmax `inf - inf = NaN`. Nothing is
/// lost by refusing: already at 1e-3 a key whose cosine is 0.1 below the best weighs e^-100 of
/// the best one's weight.
pub const MIN_TEMPERATURE: f32 = f32::MIN_POSITIVE;

/// Scores and weights of one lookup, one entry per key.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Lookup {
    /// Cosine similarity of the query and each key, in `-1..=1`.
    pub cosine: Vec<f32>,
    /// `cosine / temperature`.
    pub scaled: Vec<f32>,
    /// `softmax(scaled)`: sums to 1.
    pub weights: Vec<f32>,
}

/// Matches `query` against `keys`.
///
/// # Shapes
/// `query: [dim]`, `keys: n × [dim]` → `n` scores and weights.
pub fn soft_lookup<K: AsRef<[f32]>>(
    query: &[f32],
    keys: &[K],
    temperature: f32,
) -> Result<Lookup, VizError> {
    if keys.is_empty() {
        return Err(VizError::NoEntries);
    }
    if !(temperature.is_finite() && temperature >= MIN_TEMPERATURE) {
        return Err(VizError::BadTemperature { temperature });
    }
    let mut cosine = Vec::with_capacity(keys.len());
    for (index, key) in keys.iter().enumerate() {
        let key = key.as_ref();
        if key.len() != query.len() {
            return Err(VizError::EmbeddingSize {
                index,
                expected: query.len(),
                got: key.len(),
            });
        }
        let c = cosine_similarity(query, key).ok_or_else(|| VizError::ZeroEmbedding {
            what: if norm(query) > 0.0 {
                format!("key {index}")
            } else {
                "the query".to_string()
            },
        })?;
        cosine.push(c);
    }
    let scaled: Vec<f32> = cosine.iter().map(|c| c / temperature).collect();
    let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = scaled.iter().map(|s| f64::from(s - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    let weights = exps.iter().map(|e| (e / sum) as f32).collect();
    Ok(Lookup {
        cosine,
        scaled,
        weights,
    })
}

fn norm(a: &[f32]) -> f64 {
    a.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

/// `a·b / (|a|·|b|)`, or `None` when either vector is 0 (or not finite).
fn cosine_similarity(a: &[f32], b: &[f32]) -> Option<f32> {
    let (mut dot, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += f64::from(x) * f64::from(y);
        aa += f64::from(x) * f64::from(x);
        bb += f64::from(y) * f64::from(y);
    }
    let norm = (aa * bb).sqrt();
    (norm > 0.0 && norm.is_finite()).then(|| (dot / norm) as f32)
}
