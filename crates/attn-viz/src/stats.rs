//! Per-head statistics, after Clark et al., "What Does BERT Look At?" (2019,
//! <https://arxiv.org/abs/1906.04341>): how spread out a head's attention is, how much of it goes
//! to `[CLS]` and `[SEP]`, to the previous, next or same token, and how far it reaches.
//!
//! Every figure is a mean over query tokens, on raw tokens (special tokens included).
//! `[CLS]` is a special token at position 0 (BERT's `[CLS]`, RoBERTa's `<s>`); `[SEP]` is every
//! other special token. A model without special tokens (GPT-2) gets 0 for both.

use crate::{AttentionMaps, Token, VizError};

/// Statistics of one head. Shares are in `0..=1`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeadStats {
    pub layer: usize,
    pub head: usize,
    /// Entropy of a query's weights in nats, `-Σ w·ln w`, mean over queries.
    pub entropy: f32,
    /// Weight on `[CLS]`.
    pub cls: f32,
    /// Weight on `[SEP]` (every special token but a leading one).
    pub sep: f32,
    /// Weight on the previous token (queries 1..T).
    pub previous: f32,
    /// Weight on the next token (queries 0..T-1).
    pub next: f32,
    /// Weight on the query token itself.
    pub same: f32,
    /// `Σ_j w_ij·|i − j|`, in tokens.
    pub distance: f32,
}

/// Statistics of every head, layer by layer.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `n_layers · n_heads` entries.
pub fn head_stats(maps: &AttentionMaps) -> Result<Vec<HeadStats>, VizError> {
    maps.validate()?;
    let t = maps.seq_len();
    let cls: Vec<bool> = maps
        .tokens
        .iter()
        .enumerate()
        .map(|(i, tok)| tok.special && i == 0)
        .collect();
    let sep: Vec<bool> = maps
        .tokens
        .iter()
        .enumerate()
        .map(|(i, tok)| tok.special && i != 0)
        .collect();
    let mut all = Vec::with_capacity(maps.n_layers * maps.n_heads);
    for layer in 0..maps.n_layers {
        for head in 0..maps.n_heads {
            let a = maps.head(layer, head)?;
            let mut s = Sums::default();
            for (i, row) in a.chunks_exact(t).enumerate() {
                for (j, &w) in row.iter().enumerate() {
                    if w > 0.0 {
                        s.entropy -= f64::from(w) * f64::from(w).ln();
                    }
                    s.distance += f64::from(w) * i.abs_diff(j) as f64;
                    if cls[j] {
                        s.cls += f64::from(w);
                    }
                    if sep[j] {
                        s.sep += f64::from(w);
                    }
                }
                s.same += f64::from(row[i]);
                if i > 0 {
                    s.previous += f64::from(row[i - 1]);
                }
                if i + 1 < t {
                    s.next += f64::from(row[i + 1]);
                }
            }
            let per_query = |x: f64| (x / t as f64) as f32;
            let per_neighbour = |x: f64| {
                if t > 1 {
                    (x / (t - 1) as f64) as f32
                } else {
                    0.0
                }
            };
            all.push(HeadStats {
                layer,
                head,
                entropy: per_query(s.entropy),
                cls: per_query(s.cls),
                sep: per_query(s.sep),
                previous: per_neighbour(s.previous),
                next: per_neighbour(s.next),
                same: per_query(s.same),
                distance: per_query(s.distance),
            });
        }
    }
    Ok(all)
}

#[derive(Default)]
struct Sums {
    entropy: f64,
    cls: f64,
    sep: f64,
    previous: f64,
    next: f64,
    same: f64,
    distance: f64,
}

/// A head that stands out, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Notable {
    pub layer: usize,
    pub head: usize,
    /// What it does, e.g. "attends to the previous token".
    pub role: String,
    /// The statistic behind the role.
    pub value: f32,
}

/// The head that does each thing most: previous/next/same token, `[CLS]`, `[SEP]`, the most
/// focused (lowest entropy), the broadest (highest entropy) and the longest reach.
///
/// A role is only named when its head gives it a real share (≥ 0.3 for the token-position and
/// special-token roles); an input without special tokens names no `[CLS]`/`[SEP]` head.
pub fn notable_heads(stats: &[HeadStats]) -> Vec<Notable> {
    type Key = fn(&HeadStats) -> f32;
    let roles: [(&str, Key, bool, Option<f32>); 8] = [
        (
            "attends to the previous token",
            |s| s.previous,
            true,
            Some(0.3),
        ),
        ("attends to the next token", |s| s.next, true, Some(0.3)),
        ("attends to the token itself", |s| s.same, true, Some(0.3)),
        ("attends to [CLS]", |s| s.cls, true, Some(0.3)),
        ("attends to [SEP]", |s| s.sep, true, Some(0.3)),
        (
            "is the most focused (lowest entropy, nats)",
            |s| s.entropy,
            false,
            None,
        ),
        (
            "is the broadest (highest entropy, nats)",
            |s| s.entropy,
            true,
            None,
        ),
        (
            "reaches furthest (mean distance, tokens)",
            |s| s.distance,
            true,
            None,
        ),
    ];
    let mut notable = Vec::new();
    for (role, key, highest, floor) in roles {
        let best = stats.iter().max_by(|a, b| {
            let order = key(a).total_cmp(&key(b));
            if highest { order } else { order.reverse() }
        });
        // A comparison every head ties (one head, or one token: entropy and distance 0
        // everywhere) names none; the shares have their floors.
        let tied = floor.is_none() && stats.iter().all(|s| key(s) == key(&stats[0]));
        if let Some(best) = best
            && !tied
            && floor.is_none_or(|f| key(best) >= f)
        {
            notable.push(Notable {
                layer: best.layer,
                head: best.head,
                role: role.to_string(),
                value: key(best),
            });
        }
    }
    notable
}

/// What the `[CLS]` and `[SEP]` shares stand for when the text's special tokens have other names
/// (RoBERTa's `<s>` and `</s>`) or it has none (GPT-2): the leading special token and every
/// other one. `None` for BERT's own.
pub fn special_columns_note(tokens: &[Token]) -> Option<String> {
    let leading = tokens
        .first()
        .filter(|t| t.special)
        .map(|t| t.text.as_str());
    let mut others: Vec<&str> = Vec::new();
    for t in tokens.iter().skip(usize::from(leading.is_some())) {
        if t.special && !others.contains(&t.text.as_str()) {
            others.push(&t.text);
        }
    }
    match (leading, others.as_slice()) {
        (None, []) => Some("note: this text has no special tokens: [CLS] and [SEP] are 0".into()),
        (Some("[CLS]"), [] | ["[SEP]"]) => None,
        _ => Some(format!(
            "note: [CLS] is the leading special token ({}), [SEP] every other one ({})",
            leading.unwrap_or("none here"),
            match others.is_empty() {
                true => "none here".to_string(),
                false => others.join(", "),
            }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(texts: &[(&str, bool)]) -> Vec<Token> {
        texts
            .iter()
            .map(|&(text, special)| Token {
                text: text.into(),
                id: 0,
                span: None,
                segment: 0,
                special,
            })
            .collect()
    }

    #[test]
    fn the_special_columns_are_named_after_the_models_own_tokens() {
        let bert = tokens(&[("[CLS]", true), ("cat", false), ("[SEP]", true)]);
        assert_eq!(special_columns_note(&bert), None);
        let roberta = tokens(&[
            ("<s>", true),
            ("cat", false),
            ("</s>", true),
            ("</s>", true),
        ]);
        assert_eq!(
            special_columns_note(&roberta).unwrap(),
            "note: [CLS] is the leading special token (<s>), [SEP] every other one (</s>)"
        );
        let gpt2 = tokens(&[("The", false), ("Ġcat", false)]);
        assert_eq!(
            special_columns_note(&gpt2).unwrap(),
            "note: this text has no special tokens: [CLS] and [SEP] are 0"
        );
        let typed = tokens(&[("The", false), ("<|endoftext|>", true)]);
        assert_eq!(
            special_columns_note(&typed).unwrap(),
            "note: [CLS] is the leading special token (none here), [SEP] every other one \
             (<|endoftext|>)"
        );
    }
}
