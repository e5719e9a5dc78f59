//! Per-head statistics, after Clark et al., "What Does BERT Look At?" (2019,
//! <https://arxiv.org/abs/1906.04341>): how spread out a head's attention is, how much of it goes
//! to `[CLS]` and `[SEP]`, to the previous, next or same token, and how far it reaches.
//!
//! Every figure is a mean over query tokens, on raw tokens (special tokens included). Each is
//! read against what it would be if every query spread its attention evenly over the keys it
//! sees ([`uniform_shares`]): on a causal model a query sees only the keys up to itself, so even
//! attention gives the first queries large previous-token and self shares.
//! `[CLS]` is a special token at position 0 (BERT's `[CLS]`, RoBERTa's `<s>`); `[SEP]` is every
//! other special token. On an input without special tokens (GPT-2's) the `[CLS]` figure is the
//! first token's, where such models park attention they do not need (an "attention sink",
//! Xiao et al. 2023, <https://arxiv.org/abs/2309.17453>), and `[SEP]`'s is 0. The distance
//! counts only attention to the other keys: what a head parks on `[CLS]`/`[SEP]` (or on the
//! first token) reaches nowhere.

use crate::{AttentionMaps, Token, VizError};

/// Statistics of one head.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeadStats {
    pub layer: usize,
    pub head: usize,
    #[serde(flatten)]
    pub shares: Shares,
}

/// The figures of one head's (or of even) attention. Shares are in `0..=1`.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Shares {
    /// Entropy of a query's weights in nats, `-Σ w·ln w`, mean over queries.
    pub entropy: f32,
    /// Weight on `[CLS]`, or on the first token when there are no special tokens.
    pub cls: f32,
    /// Weight on `[SEP]` (every special token but a leading one).
    pub sep: f32,
    /// Weight on the previous token (queries 1..T).
    pub previous: f32,
    /// Weight on the next token (queries 0..T-1).
    pub next: f32,
    /// Weight on the query token itself (`self` in JSON, as `heads` heads its column).
    #[serde(rename = "self")]
    pub same: f32,
    /// `Σ_j w_ij·|i − j|` over the keys other than those of `cls` and `sep`, in tokens: a
    /// head that parks its attention there does not reach far for it.
    pub distance: f32,
}

/// Statistics of every head, layer by layer.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `n_layers · n_heads` entries.
pub fn head_stats(maps: &AttentionMaps) -> Result<Vec<HeadStats>, VizError> {
    maps.validate()?;
    let special = Special::of(&maps.tokens);
    let mut all = Vec::with_capacity(maps.n_layers * maps.n_heads);
    for layer in 0..maps.n_layers {
        for head in 0..maps.n_heads {
            let shares = shares_of(maps.head(layer, head)?, maps.seq_len(), &special);
            all.push(HeadStats {
                layer,
                head,
                shares,
            });
        }
    }
    Ok(all)
}

/// Whether every head of every layer gives the keys after each query exactly 0 (a causal
/// model): then a query sees only the keys up to itself. Maps of some rows only answer for
/// the rows they hold.
pub fn sees_only_earlier_keys(maps: &AttentionMaps) -> bool {
    let t = maps.seq_len();
    let rows = maps.held_rows();
    (maps.weights.chunks_exact(t).zip(rows.iter().cycle()))
        .all(|(row, &i)| row[i + 1..].iter().all(|&w| w == 0.0))
}

/// What the figures would be if each query spread its attention evenly over the keys it sees:
/// every key, or the keys up to the query ([`sees_only_earlier_keys`]).
pub fn uniform_shares(maps: &AttentionMaps) -> Result<Shares, VizError> {
    maps.validate()?;
    let t = maps.seq_len();
    let even = even_matrix(t, sees_only_earlier_keys(maps));
    Ok(shares_of(&even, t, &Special::of(&maps.tokens)))
}

/// The `[t, t]` attention of queries that each spread their weight evenly over the keys they
/// see: all of them, or under a causal mask those up to themselves.
pub(crate) fn even_matrix(t: usize, causal: bool) -> Vec<f32> {
    let mut even = vec![0.0f32; t * t];
    for (i, row) in even.chunks_exact_mut(t).enumerate() {
        let seen = if causal { i + 1 } else { t };
        row[..seen].fill(1.0 / seen as f32);
    }
    even
}

/// Which keys count as `[CLS]` (a special token at position 0) and as `[SEP]` (every other
/// special token).
struct Special {
    cls: Vec<bool>,
    sep: Vec<bool>,
}

impl Special {
    fn of(tokens: &[Token]) -> Special {
        let none = !tokens.iter().any(|t| t.special);
        let (cls, sep) = (tokens.iter().enumerate())
            .map(|(i, t)| ((t.special || none) && i == 0, t.special && i != 0))
            .unzip();
        Special { cls, sep }
    }
}

/// Whether the input has special tokens (`[CLS]`, `[SEP]`); without them the `[CLS]` figure is
/// the first token's.
pub fn has_special_tokens(maps: &AttentionMaps) -> bool {
    maps.tokens.iter().any(|t| t.special)
}

/// What the first column of the figures ([`Shares::cls`]) is the share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Leading {
    /// An encoder's leading special token (`[CLS]`, `<s>`).
    Cls,
    /// The first token of an input without special tokens (GPT-2's).
    First,
    /// A causal model's leading special token: the attention sink, where its heads park the
    /// attention they do not need (Llama's `<s>`, the first token of a Llama-style decoder).
    Sink,
}

impl Leading {
    /// What `maps`' first column measures.
    pub fn of(maps: &AttentionMaps) -> Leading {
        match maps.tokens.first() {
            _ if !has_special_tokens(maps) => Leading::First,
            Some(t) if t.special && sees_only_earlier_keys(maps) => Leading::Sink,
            _ => Leading::Cls,
        }
    }

    /// The column's heading.
    pub fn label(self) -> &'static str {
        match self {
            Leading::Cls => "[CLS]",
            Leading::First => "first",
            Leading::Sink => "sink",
        }
    }
}

/// The figures of one `[T, T]` attention matrix `a`.
fn shares_of(a: &[f32], t: usize, special: &Special) -> Shares {
    let mut s = Sums::default();
    for (i, row) in a.chunks_exact(t).enumerate() {
        for (j, &w) in row.iter().enumerate() {
            if w > 0.0 {
                s.entropy -= f64::from(w) * f64::from(w).ln();
            }
            if special.cls[j] {
                s.cls += f64::from(w);
            } else if special.sep[j] {
                s.sep += f64::from(w);
            } else {
                s.distance += f64::from(w) * i.abs_diff(j) as f64;
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
    Shares {
        entropy: per_query(s.entropy),
        cls: per_query(s.cls),
        sep: per_query(s.sep),
        previous: per_neighbour(s.previous),
        next: per_neighbour(s.next),
        same: per_query(s.same),
        distance: per_query(s.distance),
    }
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
    /// The statistic behind the role ("share", "entropy", "distance") and its unit ("",
    /// "nats", "tokens").
    pub measure: String,
    pub unit: String,
    pub value: f32,
}

/// The head that does each thing most: previous/next/same token, `[CLS]`, `[SEP]`, the most
/// focused (lowest entropy), the broadest (highest entropy) and the longest reach.
///
/// A role is only named when its head does it more than even attention would (`uniform`,
/// [`uniform_shares`]): a share of at least 0.3 and [`SHARE_MARGIN`] above the even one, an
/// entropy [`ENTROPY_MARGIN`] below even for the most focused; the broadest and the longest
/// reach only when the heads differ in them (by [`ENTROPY_MARGIN`] nats, by a tenth of the even
/// distance). The first column's role is named as `leading` says ([`Leading::of`]): the head
/// that attends to `[CLS]`, to the first token, or to the attention sink; heads that all attend
/// evenly (a causal model on three tokens) name none.
pub fn notable_heads(stats: &[HeadStats], uniform: &Shares, leading: Leading) -> Vec<Notable> {
    type Key = fn(&Shares) -> f32;
    let share = |key: Key| Test::Above((key(uniform) + SHARE_MARGIN).max(0.3));
    const SHARE: (&str, &str) = ("share", "");
    const ENTROPY: (&str, &str) = ("entropy", "nats");
    // What a head does, its figure's measure and unit, the figure, whether the highest or the
    // lowest stands out, and when it is named.
    type Role = (&'static str, (&'static str, &'static str), Key, bool, Test);
    let roles: [Role; 8] = [
        (
            "attends to the previous token",
            SHARE,
            |s| s.previous,
            true,
            share(|s| s.previous),
        ),
        (
            "attends to the next token",
            SHARE,
            |s| s.next,
            true,
            share(|s| s.next),
        ),
        (
            "attends to the token itself",
            SHARE,
            |s| s.same,
            true,
            share(|s| s.same),
        ),
        (
            match leading {
                Leading::Cls => "attends to [CLS]",
                Leading::First => "attends to the first token",
                Leading::Sink => "attends to the sink (the first token)",
            },
            SHARE,
            |s| s.cls,
            true,
            share(|s| s.cls),
        ),
        ("attends to [SEP]", SHARE, |s| s.sep, true, share(|s| s.sep)),
        (
            "is the most focused",
            ENTROPY,
            |s| s.entropy,
            false,
            Test::Below(uniform.entropy - ENTROPY_MARGIN),
        ),
        (
            "is the broadest",
            ENTROPY,
            |s| s.entropy,
            true,
            Test::Spread(ENTROPY_MARGIN),
        ),
        (
            "reaches furthest",
            ("distance", "tokens"),
            |s| s.distance,
            true,
            Test::Spread((0.1 * uniform.distance).max(f32::MIN_POSITIVE)),
        ),
    ];
    let mut notable = Vec::new();
    for (role, (measure, unit), key, highest, test) in roles {
        let key = |s: &HeadStats| key(&s.shares);
        let best = stats.iter().max_by(|a, b| {
            let order = key(a).total_cmp(&key(b));
            if highest { order } else { order.reverse() }
        });
        let Some(best) = best else { continue };
        let named = match test {
            Test::Above(floor) => key(best) >= floor,
            Test::Below(ceiling) => key(best) <= ceiling,
            // One head, or heads that all do the same, name none.
            Test::Spread(by) => {
                let (lo, hi) = stats
                    .iter()
                    .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), s| {
                        (lo.min(key(s)), hi.max(key(s)))
                    });
                stats.len() > 1 && hi - lo >= by
            }
        };
        if named {
            notable.push(Notable {
                layer: best.layer,
                head: best.head,
                role: role.to_string(),
                measure: measure.to_string(),
                unit: unit.to_string(),
                value: key(best),
            });
        }
    }
    notable
}

/// How far above even attention's share a head's must be to be named for it.
pub const SHARE_MARGIN: f32 = 0.15;

/// How far below even attention's entropy (nats) the most focused head must be, and how far
/// apart the heads' entropies must be for a broadest one.
pub const ENTROPY_MARGIN: f32 = 0.1;

/// When a role's head is named: its figure at least, at most, or the heads' figures apart by
/// at least this much.
enum Test {
    Above(f32),
    Below(f32),
    Spread(f32),
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
        (None, []) => Some(
            "note: this text has no special tokens: \"first\" is the first token's share (where \
             models like GPT-2 park attention they do not need); there is no [SEP] column"
                .into(),
        ),
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
            "note: this text has no special tokens: \"first\" is the first token's share \
             (where models like GPT-2 park attention they do not need); there is no [SEP] column"
        );
        let typed = tokens(&[("The", false), ("<|endoftext|>", true)]);
        assert_eq!(
            special_columns_note(&typed).unwrap(),
            "note: [CLS] is the leading special token (none here), [SEP] every other one \
             (<|endoftext|>)"
        );
    }
}
