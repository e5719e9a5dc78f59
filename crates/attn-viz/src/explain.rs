//! "Which words does this word look at?": one row of attention, merged into words, as bars.
//!
//! The row is the focus word's attention (the mean over its tokens), or, without a focus, the
//! mean over every word shown (each word counts once, however many tokens it has). For a
//! question/context pair, rows come from the question's words and columns are the context's;
//! `across` a pair, columns are the words of the text the focus word is not in.
//!
//! Special tokens (`[CLS]`, `[SEP]`) usually take much of BERT's attention; hidden (the default)
//! they would leave rows that sum to well under 1. The weights shown are therefore renormalised to
//! sum to 1 over the words shown, and the footer says how much the hidden tokens took.

use unicode_categories::UnicodeCategories;
use unicode_normalization_alignments::UnicodeNormalization;

use crate::bars::{self, BarStyle, Quoted};
use crate::flow::attention_flow;
use crate::select::{Selection, select};
use crate::stats::sees_only_earlier_keys;
use crate::words::{self, Unit, renormalised, row_to_units};
use crate::{AttentionMaps, VizError};

/// Words (merged by spans) or raw tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Words,
    Tokens,
}

/// Where the weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Method {
    /// Attention weights, rollout included.
    Attention { selection: Selection },
    /// Attention flow (see [`crate::flow`]).
    Flow,
}

/// What to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplainOptions {
    pub method: Method,
    pub level: Level,
    /// Show special tokens instead of hiding them.
    pub special: bool,
    /// The word to look from; `"the#2"` is the second "the". Case is ignored.
    pub focus: Option<String>,
    /// Sentence pair as question (segment 0) and context (segment 1): rows from the question,
    /// columns of the context.
    pub question: bool,
    /// For a sentence pair: columns are the words of the other text than the focus word's (the
    /// notes' translation example); without a focus, as `question`.
    pub across: bool,
    /// Show only the `top` heaviest words, heaviest first.
    pub top: Option<usize>,
    /// Token positions to look from instead of `focus`: the tokens a task head reads (a
    /// classifier's `[CLS]`, an answer's span), special ones included; their words are averaged
    /// as `focus`'s occurrences would be.
    pub focus_tokens: Vec<usize>,
    /// Show only the words of this segment (0: the text, 1: the pair), and the special tokens
    /// with `special`.
    pub only_segment: Option<usize>,
    /// Look for `focus` among this segment's words alone: an encoder-decoder model's source
    /// (0) or target (1), whose words the other may share; `"the#2"` then counts there.
    pub focus_segment: Option<usize>,
}

impl Default for ExplainOptions {
    /// Every layer and head averaged, by words, special tokens hidden, no focus word.
    fn default() -> Self {
        ExplainOptions {
            method: Method::Attention {
                selection: Selection::All,
            },
            level: Level::Words,
            special: false,
            focus: None,
            question: false,
            across: false,
            top: None,
            focus_tokens: Vec::new(),
            only_segment: None,
            focus_segment: None,
        }
    }
}

/// One word's weight.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Row {
    pub word: String,
    /// The weight shown: renormalised over the words shown.
    pub weight: f32,
    /// The weight before renormalisation.
    pub raw: f32,
    /// The weight even attention would give the word: every query token spreading its weight
    /// evenly over the tokens of the words shown that it sees, summed into words and averaged
    /// as `weight` is (a word of three tokens gets three shares).
    pub even: f32,
    /// How many tokens the word has (1 for raw tokens).
    pub tokens: usize,
    /// Whether the word is named in [`Explanation::focuses_on`] (and highlighted).
    pub heavy: bool,
    /// Whether a causal model's query cannot see the word: it comes after every token looked
    /// from. Its weight is 0 by the mask, not by the model's choice.
    pub masked: bool,
}

impl Row {
    /// Whether the row may be named as what the model focuses on: a word the query sees, with a
    /// letter or digit (punctuation keeps its bar but is never named).
    fn nameable(&self) -> bool {
        !self.masked && self.word.chars().any(char::is_alphanumeric)
    }
}

/// An explanation, ready to print or to serialise.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Explanation {
    pub model: String,
    pub text: String,
    pub pair: Option<String>,
    /// The attention used, in words ("all 6 layers × 12 heads averaged").
    pub attention: String,
    pub method: Method,
    pub level: Level,
    /// The word looked from, or a description of the average ("every word (averaged)").
    pub focus: String,
    /// Whether `focus` was picked because none was asked for.
    pub focus_is_default: bool,
    /// Rows shown: input order, or heaviest first with `top`.
    pub rows: Vec<Row>,
    /// The words that stand out (each gets at least [`STANDS_OUT`] times `Row::even`), at most
    /// three, heaviest first, and at least half of the heaviest of them ([`bars::heavy`]; with
    /// `top`, only words that have a bar); punctuation is never named.
    pub focuses_on: Vec<String>,
    /// Whether no word stands out: none that may be named gets [`STANDS_OUT`] times what even
    /// attention would give it (`Row::even`), so that none is named.
    pub spread: bool,
    /// The one word shown that the focus sees, when there is one (a one-word text, or a causal
    /// model's first word): all of the attention shown is on it, which names nothing.
    pub sees_only: Option<String>,
    /// Whether the model is causal (each query sees only the keys up to itself).
    pub causal: bool,
    /// Share (0..=1) of the row's raw weight that went to words not shown (special tokens, the
    /// question's own words).
    pub hidden_share: f32,
    /// Lines for the footer: how the numbers were made.
    pub notes: Vec<String>,
}

/// Computes an explanation.
///
/// `progress(done, total)` reports attention-flow progress (other methods are quick).
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]`.
pub fn explain(
    maps: &AttentionMaps,
    options: &ExplainOptions,
    progress: impl FnMut(usize, usize),
) -> Result<Explanation, VizError> {
    let Layout {
        units,
        from,
        targets,
        focus,
        focus_is_default,
        mut notes,
    } = layout(maps, options)?;
    let token_row = method_row(maps, options.method, &from, progress)?;
    let unit_row = row_to_units(&token_row, &units);
    let raw: Vec<f32> = targets.iter().map(|&u| unit_row[u]).collect();
    let shown = renormalised(&raw);
    let causal = sees_only_earlier_keys(maps);
    let even = even_row(maps, options.method, (&units, &from, &targets), causal)?;
    let mut rows: Vec<Row> = (targets.iter().enumerate())
        .map(|(k, &u)| Row {
            word: units[u].label.clone(),
            weight: shown[k],
            raw: raw[k],
            even: even[k],
            tokens: units[u].tokens.len(),
            heavy: false,
            masked: causal && unseen(&units[u], &from),
        })
        .collect();
    // One word the query sees gets everything: nothing to stand out from.
    let compared = rows.iter().filter(|r| !r.masked).count() >= 2;
    let left_out = keep_top(&mut rows, options.top);
    let (focuses_on, spread, sees_only) = name_standouts(&mut rows, compared);
    let total: f32 = unit_row.iter().sum();
    let hidden_share = (total - raw.iter().sum::<f32>()).max(0.0) / total.max(f32::MIN_POSITIVE);
    let seen = raw.iter().sum::<f32>() > 0.0;
    push_method_notes(
        &mut notes,
        options,
        (&units, causal),
        (hidden_share, seen),
        left_out,
    );
    if rows.iter().any(|r| r.masked) {
        notes.push(format!(
            "masked: the model is causal, so {} sees only what comes before it; the words \
             after it get no attention by the mask, not by choice",
            if focus_is_default {
                "each word".to_string()
            } else {
                format!("{:?}", Quoted(&focus))
            }
        ));
    }
    if options.level == Level::Words {
        notes.push(
            "word level: weight to a word = sum over its tokens, from a word = mean over its \
             tokens (--tokens shows raw tokens)"
                .to_string(),
        );
    }
    let attention = match options.method {
        Method::Attention { selection } => selection.describe(maps),
        Method::Flow => format!("attention flow over {} layers", maps.n_layers),
    };
    Ok(Explanation {
        model: maps.model.clone(),
        text: maps.text.clone(),
        pair: maps.pair.clone(),
        attention,
        method: options.method,
        level: options.level,
        focus,
        focus_is_default,
        rows,
        focuses_on,
        spread,
        sees_only,
        causal,
        hidden_share,
        notes,
    })
}

/// The weights even attention gives the `targets` from `from`, as the row shows them. Rollout
/// and flow carry the residual's 0.5·I and, under a causal mask, compound it: even attention
/// does not come out even through them, so their baseline is the same computation on even
/// attention.
fn even_row(
    maps: &AttentionMaps,
    method: Method,
    (units, from, targets): (&[Unit], &[(usize, f64)], &[usize]),
    causal: bool,
) -> Result<Vec<f32>, VizError> {
    Ok(match method {
        Method::Attention {
            selection: Selection::Rollout,
        }
        | Method::Flow => {
            let even_maps = even_attention(maps, causal);
            let even_row = method_row(&even_maps, method, from, |_, _| {})?;
            let even_units = row_to_units(&even_row, units);
            renormalised(&targets.iter().map(|&u| even_units[u]).collect::<Vec<_>>())
        }
        Method::Attention { .. } => even_shares(units, from, targets, causal),
    })
}

/// With `top`, the `top` heaviest rows, masked words last; returns how many rows there were and
/// what the rows left out hold, when some were.
fn keep_top(rows: &mut Vec<Row>, top: Option<usize>) -> Option<(usize, f32)> {
    let k = top?;
    rows.sort_by(|a, b| a.masked.cmp(&b.masked).then(b.weight.total_cmp(&a.weight)));
    let left_out = (rows.len() > k).then(|| (rows.len(), rows[k..].iter().map(|r| r.weight).sum()));
    rows.truncate(k);
    left_out
}

/// Marks the rows the model "focuses on" (heavy) and returns their words, whether the weight
/// is spread with none standing out, and the one word a query that sees one sees. Punctuation
/// keeps its bar but is not named; and a word is named only when it stands out from even
/// attention on its own (flat rows named three words at 0.34 against 0.33, and a word of three
/// tokens at 0.17 where even attention gives it 0.25).
fn name_standouts(rows: &mut [Row], compared: bool) -> (Vec<String>, bool, Option<String>) {
    let stands_out = |r: &Row| compared && r.weight >= STANDS_OUT * r.even;
    let sees_only = match compared {
        true => None,
        false => (rows.iter()).find(|r| !r.masked).map(|r| r.word.clone()),
    };
    let named: Vec<f32> = (rows.iter())
        .map(|r| match r.nameable() && stands_out(r) {
            true => r.weight,
            false => 0.0,
        })
        .collect();
    let spread = compared
        && named.iter().all(|&w| w <= 0.0)
        && rows.iter().any(|r| r.nameable() && r.weight > 0.0);
    let mut focuses_on = Vec::new();
    for i in bars::heavy(&named) {
        rows[i].heavy = true;
        focuses_on.push(rows[i].word.clone());
    }
    (focuses_on, spread, sees_only)
}

/// The notes on what the method and the selection of rows did: rollout's and flow's baseline,
/// flow's scaling, the share of the attention hidden words took (`hidden_share`; `seen` when the
/// words shown got some; a causal model's first token, when it is the one hidden, named as the
/// attention sink it is), and what `--top` left out.
fn push_method_notes(
    notes: &mut Vec<String>,
    options: &ExplainOptions,
    (units, causal): (&[Unit], bool),
    (hidden_share, seen): (f32, bool),
    left_out: Option<(usize, f32)>,
) {
    // With --top the weights are renormalised before the lightest words are dropped.
    let over = match (options.top, left_out) {
        (Some(k), Some(_)) => format!("over every word (the {k} heaviest shown)"),
        _ => "over the words shown".to_string(),
    };
    let through = match options.method {
        Method::Flow => Some("flow"),
        Method::Attention {
            selection: Selection::Rollout,
        } => Some("rollout"),
        Method::Attention { .. } => None,
    };
    if let Some(through) = through {
        notes.push(format!(
            "even attention here is the {through} of even attention in every layer: the residual \
             it adds favours each word itself"
        ));
    }
    match options.method {
        Method::Flow => notes.push(format!(
            "attention flow (max-flow through the layers, Abnar & Zuidema 2020); flows overlap, so \
             they are scaled to sum to 1 {over}"
        )),
        Method::Attention { .. } if hidden_share > 0.0005 => {
            let sink = causal
                && !options.special
                && !(options.question || options.across)
                && units.first().is_some_and(|u| u.special)
                && units.iter().filter(|u| u.special).count() == 1;
            let (what, shows) = match sink {
                true => (
                    format!(
                        "the first token {:?}, an attention sink,",
                        Quoted(&units[0].label)
                    ),
                    " (--special shows it)".to_string(),
                ),
                false => hidden_and_hint(options, units),
            };
            notes.push(if seen {
                format!(
                    "{what} took {:.0}% of this attention; the weights shown are renormalised to \
                     sum to 1 {over}{shows}",
                    100.0 * hidden_share
                )
            } else {
                // A causal model's first text cannot see its pair: nothing to renormalise.
                format!("{what} took all of this attention: the words shown got none{shows}")
            })
        }
        Method::Attention { .. } => {}
    }
    if let (Some(k), Some((n, rest))) = (options.top, left_out) {
        let unit = match options.level {
            Level::Words => "words",
            Level::Tokens => "tokens",
        };
        notes.push(format!(
            "showing the {k} heaviest of {n} {unit}: the other {} {} {:.0}% of the weight",
            n - k,
            if n - k == 1 { "holds" } else { "hold" },
            100.0 * rest
        ));
    }
}

/// What a row of attention is made of: the units shown, the query tokens looked from (each
/// with its share of the row), the units the row is shown over, and the notes so far.
struct Layout {
    units: Vec<Unit>,
    /// `(token, weight)`: the focus units' tokens, each focus unit counting once.
    from: Vec<(usize, f64)>,
    /// The units shown, in input order.
    targets: Vec<usize>,
    focus: String,
    focus_is_default: bool,
    notes: Vec<String>,
}

/// Resolves the options against the input: the units, the focus, and the units shown.
fn layout(maps: &AttentionMaps, options: &ExplainOptions) -> Result<Layout, VizError> {
    maps.validate_rows()?;
    if let Method::Attention { selection } = options.method {
        selection.check(maps)?;
    }
    // A causal model reads the question first: it cannot see the context after it.
    if options.question && maps.pair.is_some() && sees_only_earlier_keys(maps) {
        return Err(VizError::CausalQuestion {
            model: maps.model.clone(),
        });
    }
    let layout = token_layout(maps, options)?;
    if let Some(&(i, _)) = layout
        .from
        .iter()
        .find(|&&(i, _)| maps.row(0, 0, i).is_none())
    {
        return Err(VizError::BadRows {
            reason: format!("the maps do not hold row {i}, which the view looks from"),
        });
    }
    Ok(layout)
}

/// The query tokens whose weight rows [`explain`] and [`head_grid`] read with `options`: all
/// they need of maps that hold some rows only ([`AttentionMaps::rows`]). `maps`' weights are
/// not read: its tokens and texts say it all. Rollout and flow need every row.
pub fn query_rows(maps: &AttentionMaps, options: &ExplainOptions) -> Result<Vec<usize>, VizError> {
    let mut rows: Vec<usize> = match options.method {
        Method::Attention {
            selection: Selection::Rollout,
        }
        | Method::Flow => (0..maps.seq_len()).collect(),
        Method::Attention { .. } => (token_layout(maps, options)?.from)
            .into_iter()
            .map(|(i, _)| i)
            .collect(),
    };
    rows.sort_unstable();
    rows.dedup();
    Ok(rows)
}

/// [`layout`] from the tokens alone: the units, the rows looked from and the units shown.
fn token_layout(maps: &AttentionMaps, options: &ExplainOptions) -> Result<Layout, VizError> {
    if maps.seq_len() == 0 {
        return Err(VizError::NoTokens);
    }
    if (options.question || options.across) && maps.pair.is_none() {
        return Err(VizError::NoPair);
    }
    let units = match options.level {
        Level::Words => words::words(maps)?,
        Level::Tokens => words::tokens(maps),
    };
    let visible = |u: &Unit| options.special || !u.special;
    // Question → context: rows from segment 0's words, columns of segment 1 (and, with
    // --special, every special token, whichever segment the tokenizer put it in).
    let one_way = options.question || (options.across && options.focus.is_none());
    let sources: Vec<usize> = (0..units.len())
        .filter(|&u| match one_way {
            true => !units[u].special && units[u].segment == 0,
            false => {
                visible(&units[u]) && (options.focus_segment).is_none_or(|s| units[u].segment == s)
            }
        })
        .collect();
    // What the rows of a question or `across` view without a focus are.
    let first_text = match options.question {
        true => "the question's",
        false => "the first text's",
    };
    let nothing = |what: &str| VizError::NothingToShow {
        what: format!(
            "the input has no {what} to show (special tokens are hidden without --special)"
        ),
    };
    if sources.is_empty() {
        return Err(nothing(match (one_way, options.question) {
            (true, true) => "question words",
            (true, false) => "words in the first text",
            (false, _) => "words",
        }));
    }
    let mut notes = Vec::new();
    let (focus_units, focus, focus_is_default) = match &options.focus {
        _ if !options.focus_tokens.is_empty() => {
            let chosen: Vec<usize> = (0..units.len())
                .filter(|&u| {
                    units[u]
                        .tokens
                        .iter()
                        .any(|t| options.focus_tokens.contains(t))
                })
                .collect();
            if chosen.is_empty() {
                return Err(nothing("tokens at the positions to look from"));
            }
            let label = (chosen.iter().map(|&u| units[u].label.as_str()))
                .collect::<Vec<_>>()
                .join(" ");
            (chosen, label, false)
        }
        Some(asked) => {
            let place = match (one_way, options.focus_segment) {
                (true, _) => {
                    "the question (--focus picks one of its words, which look at the context)"
                }
                (false, Some(0)) => "the source",
                (false, Some(_)) => "the target",
                (false, None) => "the input",
            };
            let (unit, note) = find_focus(asked, &units, &sources, place, options.level)?;
            notes.extend(note);
            (vec![unit], units[unit].label.clone(), false)
        }
        None => {
            let what = match (one_way, options.level) {
                (true, Level::Words) => format!("{first_text} words (averaged)"),
                (true, Level::Tokens) => format!("{first_text} tokens (averaged)"),
                (false, Level::Words) => "every word (averaged)".to_string(),
                (false, Level::Tokens) => "every token (averaged)".to_string(),
            };
            notes.push(format!("no --focus given: showing the attention of {what}"));
            (sources.clone(), what, true)
        }
    };
    let target_segment = if options.only_segment.is_some() {
        options.only_segment
    } else if one_way {
        Some(1)
    } else if options.across {
        Some(1 - units[focus_units[0]].segment.min(1))
    } else {
        None
    };
    let targets: Vec<usize> = (0..units.len())
        .filter(|&u| {
            let unit = &units[u];
            visible(unit) && (unit.special || target_segment.is_none_or(|s| unit.segment == s))
        })
        .collect();
    if targets.is_empty() {
        return Err(nothing(if target_segment.is_some() {
            "words in the other text"
        } else {
            "words"
        }));
    }
    // Token weights of the row: each focus unit counts once, split over its tokens.
    let mut from: Vec<(usize, f64)> = Vec::new();
    for &u in &focus_units {
        let tokens = &units[u].tokens;
        for &i in tokens {
            from.push((i, 1.0 / (focus_units.len() * tokens.len()) as f64));
        }
    }
    Ok(Layout {
        units,
        from,
        targets,
        focus,
        focus_is_default,
        notes,
    })
}

/// The token row `method` gives from the `(query token, weight)` pairs `from`.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `[T]`.
fn method_row(
    maps: &AttentionMaps,
    method: Method,
    from: &[(usize, f64)],
    progress: impl FnMut(usize, usize),
) -> Result<Vec<f32>, VizError> {
    let t = maps.seq_len();
    Ok(match method {
        Method::Attention {
            selection: Selection::Rollout,
        } => weighted_rows(&select(maps, Selection::Rollout)?, from, t),
        Method::Attention { selection } => heads_row(maps, &selection.heads(maps), from)?,
        Method::Flow => {
            // Flows come back one row per source token, in `from`'s order.
            let sources: Vec<usize> = from.iter().map(|&(i, _)| i).collect();
            let flows = attention_flow(maps, &sources, progress)?;
            let by_row: Vec<(usize, f64)> = from.iter().map(|&(_, w)| w).enumerate().collect();
            weighted_rows(&flows, &by_row, t)
        }
    })
}

/// `maps` with every layer's attention even: each query spreading its weight over the keys it
/// sees (all of them, or under a causal mask those up to itself), one head a layer.
fn even_attention(maps: &AttentionMaps, causal: bool) -> AttentionMaps {
    let t = maps.seq_len();
    let layer = crate::stats::even_matrix(t, causal);
    AttentionMaps {
        model: maps.model.clone(),
        text: maps.text.clone(),
        pair: maps.pair.clone(),
        tokens: maps.tokens.clone(),
        n_layers: maps.n_layers,
        n_heads: 1,
        weights: layer.repeat(maps.n_layers),
        rows: None,
    }
}

/// What each unit shown would get if every query token spread its attention evenly over the
/// tokens of the units shown that it sees (on a causal model, those at or before it), summed
/// into units and averaged as the row is: a word of three tokens gets three shares, as it would
/// from a head that looks nowhere in particular, and averaged over a causal model's queries
/// the first words get most.
fn even_shares(units: &[Unit], from: &[(usize, f64)], targets: &[usize], causal: bool) -> Vec<f32> {
    let mut even = vec![0.0f64; targets.len()];
    for &(i, w) in from {
        let seen_of = |u: usize| {
            (units[u].tokens.iter())
                .filter(|&&j| !causal || j <= i)
                .count()
        };
        let seen: usize = targets.iter().map(|&u| seen_of(u)).sum();
        if seen == 0 {
            continue;
        }
        for (e, &u) in even.iter_mut().zip(targets) {
            *e += w * seen_of(u) as f64 / seen as f64;
        }
    }
    let even: Vec<f32> = even.into_iter().map(|e| e as f32).collect();
    renormalised(&even)
}

/// Whether every token of `unit` comes after every token looked from: on a causal model, the
/// mask hides it.
fn unseen(unit: &Unit, from: &[(usize, f64)]) -> bool {
    let last_query = from.iter().map(|&(i, _)| i).max().unwrap_or(0);
    unit.tokens.iter().all(|&j| j > last_query)
}

/// One head's weight in a [`HeadGrid`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HeadWeight {
    pub layer: usize,
    pub head: usize,
    pub weight: f32,
}

/// The weight from the focus word to one other word in every layer and head: where a relation
/// between two words lives ("when predicting 'ran', attention looks at 'cat'": which heads?).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HeadGrid {
    pub model: String,
    pub text: String,
    pub pair: Option<String>,
    /// The word looked from, or a description of the average ("every word (averaged)").
    pub focus: String,
    /// Whether `focus` was picked because none was asked for.
    pub focus_is_default: bool,
    /// The word looked at (`"the#2"` when the words shown hold it more than once).
    pub to: String,
    /// `[n_layers][n_heads]`: the weight from `focus` to `to`, renormalised over the words
    /// shown as [`explain`]'s bars are (each cell is what `explain` shows for `to` with that
    /// layer and head).
    pub weights: Vec<Vec<f32>>,
    /// `[n_layers][n_heads]`: the share of each head's attention that the words shown got
    /// before renormalising (the rest went to what `hidden` names).
    pub shares: Vec<Vec<f32>>,
    /// What the words not shown are (`"[CLS]/[SEP]"`, `"the words of its own text"`); empty
    /// when every word is shown.
    pub hidden: String,
    /// The weight even attention over the tokens shown would give `to` (the same in every
    /// head).
    pub even: f32,
    /// Whether a causal model's focus cannot see `to` (every weight is 0 by the mask).
    pub masked: bool,
    /// Whether `to` is the only word shown that the focus sees (every weight is 1).
    pub only_word: bool,
    /// How many heads stand out: they give `to` at least [`STANDS_OUT`] times `even`, and the
    /// words shown got at least [`GRID_WORDS_SHARE`] of their attention.
    pub standing_out: usize,
    /// How many heads give `to` that much but left the words shown under
    /// [`GRID_WORDS_SHARE`] of their attention (not named).
    pub parked: usize,
    /// The heaviest heads that stand out, heaviest first (at most five).
    pub stand_out: Vec<HeadWeight>,
    /// Lines for the footer.
    pub notes: Vec<String>,
}

/// How many heads [`HeadGrid::stand_out`] names at most.
const GRID_NAMED: usize = 5;

/// The share of a head's attention the words shown must get for the head to be named in a
/// [`HeadGrid`]: a head that sends 90% to `[CLS]` and the rest mostly to one word is parked,
/// not looking at that word.
pub const GRID_WORDS_SHARE: f32 = 0.25;

/// The weight from the focus word (`options.focus`, or every word averaged) to the word `to`
/// (`"the#2"` for the second "the"), in every layer and head. `options.method` must be
/// attention (its selection is what the grid varies); `options.top` is not used.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `weights: [n_layers][n_heads]`.
pub fn head_grid(
    maps: &AttentionMaps,
    options: &ExplainOptions,
    to: &str,
) -> Result<HeadGrid, VizError> {
    let Layout {
        units,
        from,
        targets,
        focus,
        focus_is_default,
        mut notes,
    } = layout(maps, options)?;
    let shown = match options.level {
        Level::Words => "the words shown",
        Level::Tokens => "the tokens shown",
    };
    let (target, note) = find_focus(to, &units, &targets, shown, options.level)?;
    notes.extend(note.map(|n| format!("--to: {n}")));
    let k = (targets.iter().position(|&u| u == target)).unwrap_or_default();
    // The word's name, with its occurrence when the words shown spell it more than once.
    let label = &units[target].label;
    // Counted as `find_focus` counts them: "the#2" names what --to the#2 finds.
    let same: Vec<usize> = (targets.iter().copied())
        .filter(|&u| word_key(&units[u].label) == word_key(label))
        .collect();
    let to_label = match same.iter().position(|&u| u == target) {
        Some(n) if same.len() > 1 => format!("{label}#{}", n + 1),
        _ => label.clone(),
    };
    let (mut weights, mut shares) = (Vec::new(), Vec::new());
    for layer in 0..maps.n_layers {
        let (mut weight_row, mut share_row) = (Vec::new(), Vec::new());
        for head in 0..maps.n_heads {
            let unit_row = row_to_units(&heads_row(maps, &[(layer, head)], &from)?, &units);
            let raw: Vec<f32> = targets.iter().map(|&u| unit_row[u]).collect();
            let total: f32 = unit_row.iter().sum();
            weight_row.push(renormalised(&raw)[k]);
            share_row.push((raw.iter().sum::<f32>() / total.max(f32::MIN_POSITIVE)).min(1.0));
        }
        weights.push(weight_row);
        shares.push(share_row);
    }
    let causal = sees_only_earlier_keys(maps);
    let even = even_shares(&units, &from, &targets, causal)[k];
    let masked = causal && unseen(&units[target], &from);
    let seen = (targets.iter())
        .filter(|&&u| !(causal && unseen(&units[u], &from)))
        .count();
    let only_word = !masked && seen < 2;
    let reaching: Vec<(usize, usize)> = (0..maps.n_layers)
        .flat_map(|layer| (0..maps.n_heads).map(move |head| (layer, head)))
        .filter(|&(layer, head)| {
            let w = weights[layer][head];
            !only_word && w > 0.0 && w >= STANDS_OUT * even
        })
        .collect();
    let mut heads: Vec<HeadWeight> = (reaching.iter())
        .filter(|&&(layer, head)| shares[layer][head] >= GRID_WORDS_SHARE)
        .map(|&(layer, head)| HeadWeight {
            layer,
            head,
            weight: weights[layer][head],
        })
        .collect();
    heads.sort_by(|a, b| b.weight.total_cmp(&a.weight));
    let standing_out = heads.len();
    let parked = reaching.len() - standing_out;
    heads.truncate(GRID_NAMED);
    let any_hidden = shares.iter().flatten().any(|&s| s < 0.9995);
    let (what, shows) = hidden_and_hint(options, &units);
    let hidden = match any_hidden {
        true => what,
        false => String::new(),
    };
    // Under the mask every weight is 0: nothing was renormalised.
    if any_hidden && !masked {
        notes.push(format!(
            "each weight is renormalised over the words shown, as explain's bars are, after \
             {hidden} took the rest{shows}; * marks a head whose words got under {:.0}% of its \
             attention (not named here)",
            100.0 * GRID_WORDS_SHARE
        ));
    }
    notes.push(
        "a weight says where a head looks, not what the model concluded; explain --layer L \
         --head H shows one head's bars"
            .to_string(),
    );
    Ok(HeadGrid {
        model: maps.model.clone(),
        text: maps.text.clone(),
        pair: maps.pair.clone(),
        focus,
        focus_is_default,
        to: to_label,
        weights,
        shares,
        hidden,
        even,
        masked,
        only_word,
        standing_out,
        parked,
        stand_out: heads,
        notes,
    })
}

/// The grid as a table: one line per layer, one column per head, the heads that stand out
/// emphasised and named below, the heads whose words got little of their attention starred.
pub fn render_grid(grid: &HeadGrid, style: BarStyle) -> String {
    let from = match grid.focus_is_default {
        true => grid.focus.clone(),
        false => format!("{:?}", Quoted(&grid.focus)),
    };
    let mut out = format!(
        "Attention from {from} to {:?} in each layer and head — {}:\n",
        Quoted(&grid.to),
        grid.model
    );
    let max = grid.weights.iter().flatten().fold(0.0f32, |m, &w| m.max(w));
    let decimals = bars::decimals_for(max);
    let width = (decimals + 2).max(4);
    out.push_str(&table_header(
        grid.weights.first().map_or(0, Vec::len),
        width,
    ));
    for (layer, row) in grid.weights.iter().enumerate() {
        out.push_str(&layer_label(layer));
        for (head, w) in row.iter().enumerate() {
            let cell = format!("{w:>width$.decimals$}");
            let named = (grid.stand_out.iter()).any(|h| (h.layer, h.head) == (layer, head));
            let starred = !grid.masked && grid.shares[layer][head] < GRID_WORDS_SHARE;
            out.push(' ');
            out.push_str(&match named {
                true => bars::emphasised(&cell, style.colour),
                false => cell,
            });
            out.push(if starred { '*' } else { ' ' });
        }
        out.truncate(out.trim_end_matches(' ').len());
        out.push('\n');
    }
    out.push('\n');
    let even = format!("{:.decimals$}", grid.even);
    let least = format!("{:.decimals$}", STANDS_OUT * grid.even);
    if grid.masked {
        out.push_str(&format!(
            "{:?} comes after {from}: the model is causal, so every head gives it 0 by the mask\n",
            Quoted(&grid.to)
        ));
    } else if grid.only_word {
        out.push_str(&format!(
            "{:?} is the only word shown that {from} sees: every head gives it all the weight \
             shown\n",
            Quoted(&grid.to)
        ));
    } else if grid.stand_out.is_empty() {
        let parked = match grid.parked {
            0 => String::new(),
            1 => "; one starred head does".to_string(),
            n => format!("; {n} starred heads do"),
        };
        out.push_str(&format!(
            "No head stands out: none gives {:?} {least} ({STANDS_OUT} × the {even} even attention \
             would give it){parked}\n",
            Quoted(&grid.to)
        ));
    } else {
        let named: Vec<String> = (grid.stand_out.iter())
            .map(|h| {
                format!(
                    "layer {} head {} ({:.decimals$})",
                    h.layer, h.head, h.weight
                )
            })
            .collect();
        let which = match grid.standing_out {
            n if n > named.len() => format!("The {} heaviest of {n} heads give", named.len()),
            1 => "One head gives".to_string(),
            n => format!("{n} heads give"),
        };
        out.push_str(&format!(
            "{which} {:?} at least {least} ({STANDS_OUT} × the {even} of even attention): {}\n",
            Quoted(&grid.to),
            named.join(", ")
        ));
    }
    for note in &grid.notes {
        out.push_str(&bars::dim(&format!("note: {note}"), style.colour));
        out.push('\n');
    }
    out
}

/// Which of two words each head gives more, from the focus's [`HeadGrid`]s for them
/// ([`compare_grids`]): does "it" look at "trophy" or at "suitcase", and in which heads?
#[derive(Debug, Clone, PartialEq)]
pub struct GridComparison {
    pub model: String,
    /// The word looked from, as the grids give it.
    pub focus: String,
    /// Whether `focus` was picked because none was asked for.
    pub focus_is_default: bool,
    /// The two words, as their grids name them.
    pub words: [String; 2],
    /// `[n_layers][n_heads]`: the weight to the first word minus the weight to the second.
    pub difference: Vec<Vec<f32>>,
    /// `[n_layers][n_heads]`: whether the words shown got under [`GRID_WORDS_SHARE`] of the
    /// head's attention (such a head prefers neither word here).
    pub starred: Vec<Vec<bool>>,
    /// For each word, the heads that prefer it by the widest gaps, widest first (at most
    /// five).
    pub prefer: [Vec<Preference>; 2],
    /// `[n_layers][n_heads]`: the word each head prefers (0 or 1), if any: it gives it at least
    /// [`STANDS_OUT`] times what it gives the other word, and at least [`STANDS_OUT`] times its
    /// even share.
    pub preference: Vec<Vec<Option<usize>>>,
    /// The even share of each word (as in its grid).
    pub even: [f32; 2],
    /// Whether a causal model's focus cannot see each word (as in its grid): no head can
    /// prefer it.
    pub masked: [bool; 2],
}

impl GridComparison {
    /// How many heads prefer word `x` (0 or 1).
    pub fn preferring(&self, x: usize) -> usize {
        (self.preference.iter().flatten())
            .filter(|&&p| p == Some(x))
            .count()
    }
}

/// A head that prefers one word of a [`GridComparison`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preference {
    pub layer: usize,
    pub head: usize,
    /// The head's weights to the comparison's two words, in its `words`' order.
    pub weights: [f32; 2],
}

/// Compares the grids of one focus for two words head by head (`explain --to A --to B`).
/// The grids must come from the same maps and focus.
pub fn compare_grids(a: &HeadGrid, b: &HeadGrid) -> Result<GridComparison, VizError> {
    let differs = [
        ("model", a.model != b.model),
        ("text", (&a.text, &a.pair) != (&b.text, &b.pair)),
        ("focus", a.focus != b.focus),
        ("layers and heads", !same_shape(&a.weights, &b.weights)),
    ];
    if let Some(&(what, _)) = differs.iter().find(|(_, d)| *d) {
        return Err(VizError::GridsDiffer { what });
    }
    let grids = [a, b];
    let starred: Vec<Vec<bool>> = (a.shares.iter())
        .map(|row| row.iter().map(|&s| s < GRID_WORDS_SHARE).collect())
        .collect();
    let mut prefer: [Vec<Preference>; 2] = [Vec::new(), Vec::new()];
    for (layer, row) in starred.iter().enumerate() {
        for (head, &starred) in row.iter().enumerate() {
            let weights = [a.weights[layer][head], b.weights[layer][head]];
            for (x, y) in [(0, 1), (1, 0)] {
                let stands_out = weights[x] > 0.0 && weights[x] >= STANDS_OUT * grids[x].even;
                if !starred && stands_out && weights[x] >= STANDS_OUT * weights[y] {
                    prefer[x].push(Preference {
                        layer,
                        head,
                        weights,
                    });
                }
            }
        }
    }
    let mut preference: Vec<Vec<Option<usize>>> = (a.weights.iter())
        .map(|row| vec![None; row.len()])
        .collect();
    for (x, heads) in prefer.iter().enumerate() {
        for p in heads {
            preference[p.layer][p.head] = Some(x);
        }
    }
    for (x, heads) in prefer.iter_mut().enumerate() {
        let gap = |p: &Preference| p.weights[x] - p.weights[1 - x];
        heads.sort_by(|p, q| gap(q).total_cmp(&gap(p)));
        heads.truncate(GRID_NAMED);
    }
    let difference = (a.weights.iter().zip(&b.weights))
        .map(|(ra, rb)| ra.iter().zip(rb).map(|(wa, wb)| wa - wb).collect())
        .collect();
    Ok(GridComparison {
        model: a.model.clone(),
        focus: a.focus.clone(),
        focus_is_default: a.focus_is_default,
        words: [a.to.clone(), b.to.clone()],
        difference,
        starred,
        prefer,
        preference,
        even: [a.even, b.even],
        masked: [a.masked, b.masked],
    })
}

/// Whether two `[n_layers][n_heads]` tables have the same shape.
fn same_shape(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
}

/// The comparison as a table of differences (first word minus second), the heads that prefer
/// each word emphasised and named below, the heads whose words got little of their attention
/// starred.
pub fn render_comparison(c: &GridComparison, style: BarStyle) -> String {
    let from = match c.focus_is_default {
        true => c.focus.clone(),
        false => format!("{:?}", Quoted(&c.focus)),
    };
    let (first, second) = (Quoted(&c.words[0]), Quoted(&c.words[1]));
    let mut out = format!(
        "{first:?} against {second:?} from {from}: the weight to {first:?} minus the weight to \
         {second:?} in each layer and head — {}:\n",
        c.model
    );
    let max = (c.prefer.iter().flatten())
        .flat_map(|p| p.weights)
        .chain(c.difference.iter().flatten().map(|d| d.abs()))
        .fold(0.0f32, f32::max);
    let decimals = bars::decimals_for(max);
    let width = decimals + 3;
    out.push_str(&table_header(
        c.difference.first().map_or(0, Vec::len),
        width,
    ));
    // A gap that rounds to nothing shows no sign ("0.00", not "+0.00" or "-0.00").
    let zero = format!("{:.decimals$}", 0.0);
    for (layer, row) in c.difference.iter().enumerate() {
        out.push_str(&layer_label(layer));
        for (head, d) in row.iter().enumerate() {
            let cell = match format!("{:.decimals$}", d.abs()) == zero {
                true => format!("{zero:>width$}"),
                false => format!("{d:>+width$.decimals$}"),
            };
            let named = (c.prefer.iter().flatten()).any(|p| (p.layer, p.head) == (layer, head));
            out.push(' ');
            out.push_str(&match named {
                true => bars::emphasised(&cell, style.colour),
                false => cell,
            });
            out.push(match (c.starred[layer][head], c.preference[layer][head]) {
                (true, _) => '*',
                (false, Some(_)) => '•',
                (false, None) => ' ',
            });
        }
        out.truncate(out.trim_end_matches(' ').len());
        out.push('\n');
    }
    out.push('\n');
    for (x, word) in c.words.iter().enumerate() {
        let (word, other) = (Quoted(word), Quoted(&c.words[1 - x]));
        let least = format!("{:.decimals$}", STANDS_OUT * c.even[x]);
        let even = format!("{:.decimals$}", c.even[x]);
        let rule = format!(
            "at least {STANDS_OUT} × what it gives {other:?}, and at least {least}: {STANDS_OUT} × \
             the {even} of even attention"
        );
        let heads = &c.prefer[x];
        if c.masked[x] {
            out.push_str(&format!(
                "{word:?} comes after {from}: the model is causal, so no head can prefer it\n"
            ));
            continue;
        }
        if heads.is_empty() {
            out.push_str(&format!("No head prefers {word:?}: none gives it {rule}\n"));
            continue;
        }
        let named: Vec<String> = (heads.iter())
            .map(|p| {
                format!(
                    "layer {} head {} ({:.decimals$} against {:.decimals$})",
                    p.layer,
                    p.head,
                    p.weights[x],
                    p.weights[1 - x]
                )
            })
            .collect();
        let preferring = c.preferring(x);
        let (which, each) = match preferring {
            1 => ("One head prefers".to_string(), "it"),
            n => (format!("{n} heads prefer"), "each"),
        };
        let widest = match preferring > heads.len() {
            true => format!("; the {} widest gaps", heads.len()),
            false => String::new(),
        };
        out.push_str(&format!(
            "{which} {word:?} ({each} gives it {rule}){widest}: {}\n",
            named.join(", ")
        ));
    }
    let starred = c.starred.iter().flatten().any(|&s| s);
    let preferring = c.preference.iter().flatten().any(Option::is_some);
    let notes = [
        preferring.then(|| {
            "• marks each head that prefers a word (the sign says which; the widest gaps are \
             named above)"
                .to_string()
        }),
        starred.then(|| {
            format!(
                "* marks a head whose words got under {:.0}% of its attention (counted for \
                 neither word)",
                100.0 * GRID_WORDS_SHARE
            )
        }),
        Some(
            "a head's preference says where it looks, not which word the model took the focus \
             to mean"
                .to_string(),
        ),
    ];
    for note in notes.iter().flatten() {
        out.push_str(&bars::dim(&format!("note: {note}"), style.colour));
        out.push('\n');
    }
    out
}

/// The header line of a layer × head table whose cells are `width` wide, each with a mark's
/// column after it: "  head" and the heads' numbers over their cells.
fn table_header(n_heads: usize, width: usize) -> String {
    let mut header = format!("{:<w$}", "  head", w = layer_label(0).len());
    for head in 0..n_heads {
        header.push_str(&format!(" {head:>width$} "));
    }
    header.truncate(header.trim_end_matches(' ').len());
    header.push('\n');
    header
}

/// A layer × head table's row label.
fn layer_label(layer: usize) -> String {
    format!("  layer {layer:<2}")
}

/// What the words shown leave out, in words ([`hidden_what`]), and the hint that shows the
/// special tokens among them (`" (--special shows [CLS]/[SEP])"`; empty with `--special`).
fn hidden_and_hint(options: &ExplainOptions, units: &[Unit]) -> (String, String) {
    // The special tokens the view hides: none with --special.
    let specials = match options.special {
        true => String::new(),
        false => words::special_labels(units),
    };
    let hint = match specials.is_empty() {
        true => String::new(),
        false => format!(" (--special shows {specials})"),
    };
    (hidden_what(options, &specials), hint)
}

/// What took the hidden share: the focus's own text (question and `across` views) and the
/// hidden special tokens, by name.
fn hidden_what(options: &ExplainOptions, specials: &str) -> String {
    match (options.question || options.across, specials.is_empty()) {
        (true, true) => "the words of its own text".to_string(),
        (true, false) => format!("the words of its own text and {specials}"),
        (false, true) => "the words not shown".to_string(),
        (false, false) => specials.to_string(),
    }
}

/// `Σ_k w_k · mean_(l, h) A^h_l[row_k]` over `(row, weight)` pairs and the `(layer, head)`s
/// `heads`, read row by row (so maps that hold some rows only serve as well as whole ones).
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, R, T]` → `[T]`.
pub fn heads_row(
    maps: &AttentionMaps,
    heads: &[(usize, usize)],
    rows: &[(usize, f64)],
) -> Result<Vec<f32>, VizError> {
    let t = maps.seq_len();
    let mut acc = vec![0.0f64; t];
    let share = 1.0 / heads.len() as f64;
    for &(i, w) in rows {
        for &(layer, head) in heads {
            let row = maps.row(layer, head, i).ok_or_else(|| VizError::BadRows {
                reason: format!("no row {i} in layer {layer}, head {head}"),
            })?;
            for (a, &x) in acc.iter_mut().zip(row) {
                *a += w * share * f64::from(x);
            }
        }
    }
    Ok(acc.into_iter().map(|x| x as f32).collect())
}

/// `Σ_k w_k · matrix[row_k]` over `(row, weight)` pairs.
///
/// # Shapes
/// `matrix: [R, T]` → `[T]`.
fn weighted_rows(matrix: &[f32], rows: &[(usize, f64)], t: usize) -> Vec<f32> {
    let mut acc = vec![0.0f64; t];
    for &(i, w) in rows {
        for (a, &x) in acc.iter_mut().zip(&matrix[i * t..(i + 1) * t]) {
            *a += w * f64::from(x);
        }
    }
    acc.into_iter().map(|x| x as f32).collect()
}

/// `text` in Unicode's composed form (NFC): "cafe\u{301}" and "café" alike are "café".
fn nfc(text: &str) -> String {
    text.nfc().map(|(c, _)| c).collect()
}

/// `text` without the characters a terminal does not show ([`words::invisible`]):
/// "and\u{200d}joiner" is found as the terminal shows it, "zero\u{200b}width" as it was typed.
fn visible(text: &str) -> String {
    text.chars().filter(|&c| !words::invisible(c)).collect()
}

/// What two words must share to be one word to `--focus`, `--to` and `word#n`: the same
/// visible characters in any case and however accents are encoded ("The" and "the",
/// "cafe\u{301}" and "café").
pub fn word_key(word: &str) -> String {
    nfc(&visible(word).to_lowercase())
}

/// Resolves `"word"` or `"word#n"` (the n-th occurrence, from 1) among `candidates`, ignoring
/// case and how accents are encoded, and with raw tokens also the tokenizer's marks (`Ġ`, `▁`,
/// `##`), then accents themselves. Returns the unit and, when the word is ambiguous, a note
/// saying which one was used. `place` says where the candidates are, and `level` what they
/// are (words or tokens), for errors.
fn find_focus(
    asked: &str,
    units: &[Unit],
    candidates: &[usize],
    place: &str,
    level: Level,
) -> Result<(usize, Option<String>), VizError> {
    let (word, occurrence) = match asked.rsplit_once('#') {
        Some((word, n))
            if !word.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) =>
        {
            let n = n.parse::<usize>().map_err(|_| VizError::FocusNumber {
                focus: asked.to_string(),
            })?;
            (word, Some(n))
        }
        _ => (asked, None),
    };
    // Invisible characters never count.
    let word = &visible(word);
    let find = |key: fn(&str) -> String| -> Vec<usize> {
        candidates
            .iter()
            .copied()
            .filter(|&u| key(&visible(&units[u].label)) == key(word))
            .collect()
    };
    // The label as written (composed or decomposed alike: "café" finds "cafe\u{301}"), else
    // without a tokenizer's marks ("mat" finds GPT-2's "Ġmat"), else without accents, as BERT's
    // uncased tokenizers read words ("cafe" finds "café").
    let mut matches = find(word_key);
    if matches.is_empty() {
        matches = find(|s| {
            nfc(&s
                .trim_start_matches(['Ġ', '▁'])
                .trim_start_matches("##")
                .to_lowercase())
        });
    }
    if matches.is_empty() {
        matches = find(|s| {
            s.to_lowercase()
                .nfd()
                .map(|(c, _)| c)
                .filter(|c| !c.is_mark())
                .collect()
        });
    }
    if matches.is_empty() {
        let mut available: Vec<String> = Vec::new();
        for &u in candidates {
            if !available.contains(&units[u].label) {
                available.push(units[u].label.clone());
            }
        }
        return Err(VizError::UnknownFocus {
            word: asked.to_string(),
            unit: match level {
                Level::Words => "word",
                Level::Tokens => "token",
            },
            available,
            place: place.to_string(),
        });
    }
    match occurrence {
        Some(n) if n >= 1 && n <= matches.len() => Ok((matches[n - 1], None)),
        Some(0) => Err(VizError::FocusZero {
            word: word.to_string(),
        }),
        Some(n) => Err(VizError::FocusOccurrence {
            word: word.to_string(),
            count: matches.len(),
            occurrence: n,
            place: place.to_string(),
        }),
        None if matches.len() > 1 => Ok((
            matches[0],
            Some(format!(
                "{:?} occurs {} times; showing the first ({word}#2 picks the second)",
                Quoted(word),
                matches.len()
            )),
        )),
        None => Ok((matches[0], None)),
    }
}

/// How many times its even share (`Row::even`) a word's weight must be for the word to be named
/// (as `lookup` names an entry at 1.5 times the next); `--to` names heads by the same rule.
pub const STANDS_OUT: f32 = 1.5;

/// The explanation as the notes print it: a header, one bar per word, the words the model
/// focuses on, and the footer notes.
pub fn render(explanation: &Explanation, style: BarStyle) -> String {
    let rows: Vec<(String, f32)> = explanation
        .rows
        .iter()
        .map(|r| (r.word.clone(), r.weight))
        .collect();
    let highlight: Vec<usize> = (0..rows.len())
        .filter(|&i| explanation.rows[i].heavy)
        .collect();
    let masked: Vec<usize> = (0..rows.len())
        .filter(|&i| explanation.rows[i].masked)
        .collect();
    let from = if explanation.focus_is_default {
        explanation.focus.clone()
    } else {
        format!("{:?}", Quoted(&explanation.focus))
    };
    // Rollout and flow are not one layer's weights: the header names them.
    let what = match explanation.method {
        Method::Flow => "Attention flow",
        Method::Attention {
            selection: Selection::Rollout,
        } => "Attention rollout",
        Method::Attention { .. } => "Attention weights",
    };
    let mut out = format!(
        "{what} from {from} — {} — {}:\n",
        explanation.attention, explanation.model
    );
    out.push_str(&bars::render_bars_masked(&rows, &highlight, &masked, style));
    let heavy: Vec<String> = explanation
        .focuses_on
        .iter()
        .map(|w| format!("{:?}", Quoted(w)))
        .collect();
    // Most of the row went elsewhere (special tokens, the question's own words): the words
    // named lead only what is left.
    let among = if explanation.hidden_share >= 0.5 {
        format!(
            " (among the words, which got {:.0}% of this attention)",
            100.0 * (1.0 - explanation.hidden_share)
        )
    } else {
        String::new()
    };
    // As many decimals as the bars show.
    let d = bars::decimals_for(
        explanation
            .rows
            .iter()
            .map(|r| r.weight)
            .fold(0.0f32, f32::max),
    );
    // A word of several tokens gets a share for each from even attention.
    let tokens = |row: &Row| match row.tokens {
        1 => String::new(),
        n => format!(" ({n} tokens)"),
    };
    let top = (explanation.rows.iter())
        .filter(|r| r.nameable())
        .max_by(|a, b| a.weight.total_cmp(&b.weight));
    if let Some(only) = &explanation.sees_only {
        out.push_str(&match explanation.causal {
            true => format!(
                "\n{:?} is the only word shown that {from} sees: the model is causal, so all of \
                 this attention is on it by the mask, not by choice\n",
                Quoted(only)
            ),
            false => format!(
                "\n{:?} is the only word shown: all of the attention shown is on it, which says \
                 nothing of a choice\n",
                Quoted(only)
            ),
        });
    } else if !heavy.is_empty() {
        out.push_str(&format!(
            "\nModel focuses heavily on: {}{among}\n",
            heavy.join(", ")
        ));
        // The longest bar not named: say why, or the reader wonders.
        if let Some(top) = top.filter(|r| !r.heavy) {
            out.push_str(&format!(
                "{:?}{} has the longest bar, {:.d$}, but that is under {STANDS_OUT} × the {:.d$} \
                 even attention would give it\n",
                Quoted(&top.word),
                tokens(top),
                top.weight,
                top.even
            ));
        }
    } else if explanation.spread {
        if let Some(top) = top {
            out.push_str(&format!(
                "\nNo word stands out{among}: the heaviest, {:?}{}, weighs {:.d$}, under \
                 {STANDS_OUT} × the {:.d$} even attention would give it\n",
                Quoted(&top.word),
                tokens(top),
                top.weight,
                top.even
            ));
        }
    } else if explanation.rows.iter().any(|r| r.weight > 0.0) {
        out.push_str(
            "\nModel focuses on no word: the attention shown went to punctuation and symbols\n",
        );
    } else {
        out.push_str("\nModel focuses on no word: the words shown got no attention\n");
    }
    for note in &explanation.notes {
        out.push_str(&bars::dim(&format!("note: {note}"), style.colour));
        out.push('\n');
    }
    out
}
