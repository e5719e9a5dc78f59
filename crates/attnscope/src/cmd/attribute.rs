//! `attnscope attribute`: how much each token contributes to a position, by methods that
//! measure more than where a head looks: the norms of what attention passes on (Kobayashi et
//! al. 2020), ALTI (Ferrando et al. 2022), and attention rollout and flow (Abnar & Zuidema
//! 2020), as word-level bars or JSON.

use std::fmt::Write as _;

use anyhow::Context;
use attn_models::{Model, RunOptions};
use attn_viz::bars::{BarStyle, render_bars};
use attn_viz::words::{Unit, renormalised, row_to_units, words};

use super::task::write_out;
use crate::maps::{ColorChoice, ModelArgs};

/// How a token's contribution is measured.
// The variants' docs are --help text, where [i][j] are indices, not links.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttributionMethod {
    /// ‖Σ_h A^h[i][j] · f^h(x_j)‖₂ of the last layer: what attention passes on, not only its weight
    Norm,
    /// ALTI: each layer's contributions with its residual and LayerNorm, layers multiplied
    Alti,
    /// Attention rollout: heads averaged, 0.5·A + 0.5·I per layer, layers multiplied
    Rollout,
    /// Attention flow: max-flow through rollout's graph (up to 64 tokens)
    Flow,
}

impl AttributionMethod {
    fn name(self) -> &'static str {
        match self {
            AttributionMethod::Norm => "norm",
            AttributionMethod::Alti => "alti",
            AttributionMethod::Rollout => "rollout",
            AttributionMethod::Flow => "flow",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            AttributionMethod::Norm => "Norms of what the last layer's attention passes on",
            AttributionMethod::Alti => "ALTI, every layer rolled out",
            AttributionMethod::Rollout => "Attention rollout",
            AttributionMethod::Flow => "Attention flow",
        }
    }
}

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope attribute \"The cat that ate the mouse ran away\" --method alti --focus ran
  attnscope attribute \"The movie was good but the ending was terrible\" --method norm --model DIR --json")]
pub struct Args {
    /// The text.
    pub text: String,
    /// A second text, read as a pair with TEXT.
    #[arg(long, value_name = "TEXT")]
    pub pair: Option<String>,
    /// How to measure each token's contribution.
    #[arg(long, value_enum)]
    pub method: AttributionMethod,
    /// The token (0-based) whose sources are scored [default: the token a classifier reads,
    /// a causal model's last token, else every token averaged]
    #[arg(long, value_name = "T", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub position: Option<usize>,
    /// The word whose sources are scored (its tokens' rows averaged; the first such word)
    #[arg(long, value_name = "WORD", conflicts_with = "position")]
    pub focus: Option<String>,
    /// Print JSON: {"model", "method", "target", "tokens", "scores", "per_layer" | "matrix"}
    ///
    /// Print {"model", "method", "target": {"position"}, {"word", "positions"} or {"rows":
    /// "mean"}, "tokens", "scores":
    /// [T] (token level, as computed), and "per_layer": [L][T][T] (norm, alti: before rollout)
    /// and "matrix": [T][T] (alti, rollout: rolled out)}.
    #[arg(long)]
    pub json: bool,
    /// Show special tokens ([CLS], [SEP]) instead of hiding them.
    #[arg(long)]
    pub special: bool,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// Which rows of a `[T, T]` matrix the scores come from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Position(usize),
    /// A word's tokens, their rows averaged.
    Word(String, Vec<usize>),
    Mean,
}

impl Target {
    fn of(
        model: &Model,
        enc: &attn_models::Encoding,
        args: &Args,
        units: &[Unit],
    ) -> anyhow::Result<Target> {
        if let Some(p) = args.position {
            anyhow::ensure!(
                p < enc.len(),
                "--position {p}: the text has {} tokens (0 to {})",
                enc.len(),
                enc.len() - 1
            );
            return Ok(Target::Position(p));
        }
        if let Some(word) = &args.focus {
            let unit = (units.iter())
                .find(|u| !u.special && u.label.to_lowercase() == word.to_lowercase())
                .with_context(|| {
                    let words: Vec<&str> = (units.iter().filter(|u| !u.special))
                        .map(|u| u.label.as_str())
                        .collect();
                    format!(
                        "--focus {word:?}: no such word in the text (its words: {})",
                        words.join(", ")
                    )
                })?;
            return Ok(Target::Word(unit.label.clone(), unit.tokens.clone()));
        }
        Ok(match model.pooled_token(enc) {
            Some(p) => Target::Position(p),
            None if model.config().causal => Target::Position(enc.len() - 1),
            None => Target::Mean,
        })
    }

    /// The scores of `matrix` (`[T, T]`): its row, or the mean of its rows.
    fn row(&self, matrix: &[f32], t: usize) -> Vec<f32> {
        let rows: Vec<usize> = match self {
            Target::Position(p) => vec![*p],
            Target::Word(_, tokens) => tokens.clone(),
            Target::Mean => (0..t).collect(),
        };
        (0..t)
            .map(|j| rows.iter().map(|&i| matrix[i * t + j]).sum::<f32>() / rows.len() as f32)
            .collect()
    }

    /// The tokens whose rows are read.
    fn rows(&self, t: usize) -> Vec<usize> {
        match self {
            Target::Position(p) => vec![*p],
            Target::Word(_, tokens) => tokens.clone(),
            Target::Mean => (0..t).collect(),
        }
    }

    fn json(&self) -> serde_json::Value {
        match self {
            Target::Position(p) => serde_json::json!({ "position": p }),
            Target::Word(word, tokens) => serde_json::json!({ "word": word, "positions": tokens }),
            Target::Mean => serde_json::json!({ "rows": "mean" }),
        }
    }
}

/// `[n, T, T]` as nested rows.
fn nested(matrices: &[f32], t: usize) -> Vec<Vec<Vec<f32>>> {
    (matrices.chunks_exact((t * t).max(1)))
        .map(|m| m.chunks_exact(t.max(1)).map(<[f32]>::to_vec).collect())
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    let (text, pair) = (args.text.as_str(), args.pair.as_deref());
    let enc = crate::maps::encode(&model, text, pair, false)?;
    let t = enc.len();
    let (attentions, per_layer, matrix) = match args.method {
        AttributionMethod::Norm | AttributionMethod::Alti => {
            let c = model.contributions(&enc)?;
            let (per_layer, matrix) = match args.method {
                AttributionMethod::Norm => (c.norm, None),
                _ => {
                    let rolled = attn_viz::select::rolled_out(&c.alti, t);
                    (c.alti, Some(rolled))
                }
            };
            (c.attentions, Some(per_layer), matrix)
        }
        AttributionMethod::Rollout | AttributionMethod::Flow => {
            let options = RunOptions {
                attentions: true,
                ..RunOptions::default()
            };
            let out = model.forward(&enc, &options)?;
            let weights = out
                .attentions
                .context("the model returned no attention weights")?;
            (weights, None, None)
        }
    };
    let maps = crate::maps::to_maps(&model, text, pair, &enc, attentions)?;
    let units = words(&maps)?;
    let target = Target::of(&model, &enc, &args, &units)?;
    let (scores, matrix) = match (args.method, matrix, &per_layer) {
        (AttributionMethod::Norm, _, Some(per_layer)) => {
            let last = &per_layer[per_layer.len() - t * t..];
            (target.row(last, t), None)
        }
        (AttributionMethod::Rollout, _, _) => {
            let rolled = attn_viz::select::rollout(&maps)?;
            (target.row(&rolled, t), Some(rolled))
        }
        (AttributionMethod::Flow, _, _) => {
            let sources = target.rows(t);
            let flows = attn_viz::flow::attention_flow(&maps, &sources, |_, _| {})?;
            let scores = (0..t)
                .map(|j| {
                    flows.chunks_exact(t).map(|row| row[j]).sum::<f32>() / sources.len() as f32
                })
                .collect();
            (scores, None)
        }
        (_, Some(matrix), _) => (target.row(&matrix, t), Some(matrix)),
        _ => anyhow::bail!("{}: no scores computed", args.method.name()),
    };
    if args.json {
        let mut doc = serde_json::json!({
            "model": model.name(),
            "method": args.method.name(),
            "target": target.json(),
            "tokens": enc.tokens,
            "scores": scores,
        });
        if let Some(per_layer) = &per_layer {
            doc["per_layer"] = serde_json::to_value(nested(per_layer, t))?;
        }
        if let Some(matrix) = &matrix {
            doc["matrix"] = serde_json::to_value(&nested(matrix, t)[0])?;
        }
        return write_out(&format!("{}\n", serde_json::to_string(&doc)?));
    }
    let merged = row_to_units(&scores, &units);
    let shown: Vec<usize> = (0..units.len())
        .filter(|&u| args.special || !units[u].special)
        .collect();
    let total: f32 = merged.iter().sum();
    let kept: f32 = shown.iter().map(|&u| merged[u]).sum();
    let weights = renormalised(&shown.iter().map(|&u| merged[u]).collect::<Vec<_>>());
    let rows: Vec<(String, f32)> = (shown.iter().zip(&weights))
        .map(|(&u, &w)| (crate::terminal_safe(&units[u].label), w))
        .collect();
    let style = BarStyle {
        colour: args.color.enabled(),
        ..BarStyle::default()
    };
    let whose = match &target {
        Target::Position(p) => format!("{:?} (token {p})", crate::terminal_safe(&enc.tokens[*p])),
        Target::Word(word, _) => format!("{:?}", crate::terminal_safe(word)),
        Target::Mean => "every token (averaged)".to_string(),
    };
    let mut s = String::new();
    writeln!(
        s,
        "{}: how much each word contributes to {whose} — {}:",
        args.method.describe(),
        model.name()
    )?;
    s.push_str(&render_bars(&rows, &[], style));
    if !args.special && total > 0.0 && kept < total {
        writeln!(
            s,
            "note: special tokens took {:.0}% of the scores; the scores shown are renormalised to \
             sum to 1 over the words shown (--special shows them)",
            100.0 * (1.0 - kept / total)
        )?;
    } else {
        writeln!(s, "note: the scores shown are renormalised to sum to 1")?;
    }
    writeln!(
        s,
        "note: word level: a word's score is the sum over its tokens (--json gives the tokens')"
    )?;
    write_out(&s)
}
