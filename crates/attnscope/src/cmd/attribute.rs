//! `attnscope attribute`: how much each token contributes to a position, by methods that
//! measure more than where a head looks: the norms of what attention passes on (Kobayashi et
//! al. 2020), ALTI (Ferrando et al. 2022), and attention rollout and flow (Abnar & Zuidema
//! 2020), as word-level bars or JSON.

use std::fmt::Write as _;

use anyhow::Context;
use attn_models::{GradTarget, Model, RunOptions, Task};
use attn_viz::bars::{BarStyle, render_bars};
use attn_viz::html::Measure;
use attn_viz::words::{Unit, renormalised, row_to_units, words};
use serde_json::json;

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
    /// Input × gradient: ‖e_j ⊙ ∂y/∂e_j‖₂ of each token's word embedding
    GradInput,
    /// Integrated gradients from no word embeddings, --steps Gauss–Legendre points
    Ig,
    /// Attention × gradient (Chefer et al. 2021): mean_h (∇_A y ⊙ A)⁺ per layer, rolled out
    AttnGrad,
}

impl AttributionMethod {
    pub fn name(self) -> &'static str {
        match self {
            AttributionMethod::Norm => "norm",
            AttributionMethod::Alti => "alti",
            AttributionMethod::Rollout => "rollout",
            AttributionMethod::Flow => "flow",
            AttributionMethod::GradInput => "grad-input",
            AttributionMethod::Ig => "ig",
            AttributionMethod::AttnGrad => "attn-grad",
        }
    }

    /// Whether the method takes gradients of a target.
    fn needs_target(self) -> bool {
        matches!(
            self,
            AttributionMethod::GradInput | AttributionMethod::Ig | AttributionMethod::AttnGrad
        )
    }

    pub fn describe(self) -> &'static str {
        match self {
            AttributionMethod::Norm => "Norms of what the last layer's attention passes on",
            AttributionMethod::Alti => "ALTI, every layer rolled out",
            AttributionMethod::Rollout => "Attention rollout",
            AttributionMethod::Flow => "Attention flow",
            AttributionMethod::GradInput => "Input × gradient",
            AttributionMethod::Ig => "Integrated gradients",
            AttributionMethod::AttnGrad => "Attention × gradient, rolled out",
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
    /// The word whose sources are scored (its tokens' rows averaged; "the#2": the second "the")
    #[arg(long, value_name = "WORD", conflicts_with = "position")]
    pub focus: Option<String>,
    #[command(flatten)]
    pub target: TargetArgs,
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

/// The gradient methods' target and integrated gradients' steps (`attribute`, and
/// `explain --method`).
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// The gradient methods' target: this label's logit [default: the predicted label]
    #[arg(long, value_name = "NAME", requires = "method")]
    pub label: Option<String>,
    /// The gradient methods' target on a causal LM: this next token's logit [default: the most
    /// likely]; a vocabulary entry, else a word that is one token
    #[arg(long, value_name = "W", requires = "method")]
    pub token: Option<String>,
    /// The gradient methods' target on an embedding model: the cosine with this text's
    /// sentence embedding
    #[arg(long, value_name = "T", requires = "method")]
    pub target_text: Option<String>,
    /// Integrated gradients' Gauss–Legendre points on [0, 1].
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub steps: u32,
}

impl Default for TargetArgs {
    /// What the command line takes when none of the flags is given.
    fn default() -> Self {
        TargetArgs {
            label: None,
            token: None,
            target_text: None,
            steps: 50,
        }
    }
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
        if let Some(focus) = &args.focus {
            // "the#2": the second "the".
            let (word, nth) = match focus.rsplit_once('#') {
                Some((w, n)) if !w.is_empty() && n.parse::<usize>().is_ok_and(|n| n >= 1) => {
                    (w, n.parse::<usize>().unwrap_or(1))
                }
                _ => (focus.as_str(), 1),
            };
            let unit = (units.iter())
                .filter(|u| !u.special && u.label.to_lowercase() == word.to_lowercase())
                .nth(nth - 1)
                .with_context(|| {
                    let words: Vec<&str> = (units.iter().filter(|u| !u.special))
                        .map(|u| u.label.as_str())
                        .collect();
                    format!(
                        "--focus {focus:?}: no such word in the text (its words: {})",
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

/// The scalar the gradient methods differentiate, and how JSON names it: a classifier's logit,
/// a causal language model's next-token logit at the last position, an embedding model's cosine
/// with `--target-text`'s embedding.
pub(crate) fn gradient_target(
    model: &Model,
    enc: &attn_models::Encoding,
    args: &TargetArgs,
) -> anyhow::Result<(GradTarget, serde_json::Value)> {
    let causal_lm = model.config().causal && model.task().is_none_or(|t| t == Task::NextToken);
    let classifier = model.task() == Some(Task::Classification);
    let embedding = model.task().is_none() && !model.config().causal;
    let refuse = |flag: &str, what: &str| {
        anyhow::anyhow!("{flag} is for {what}; {} is not one", model.name())
    };
    if args.label.is_some() && !classifier {
        return Err(refuse("--label", "a classifier"));
    }
    if args.token.is_some() && !causal_lm {
        return Err(refuse("--token", "a causal language model"));
    }
    if args.target_text.is_some() && !embedding {
        return Err(refuse("--target-text", "an embedding model"));
    }
    if classifier {
        let labels = model.labels()?;
        let label = match &args.label {
            Some(name) => labels.iter().position(|l| l == name).with_context(|| {
                format!(
                    "--label {name:?}: {} has the labels {}",
                    model.name(),
                    labels.join(", ")
                )
            })?,
            None => {
                let out = model.forward(enc, &RunOptions::default())?;
                let verdict = model.classify(&out, std::slice::from_ref(enc))?.remove(0);
                let best = verdict
                    .logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1));
                best.map_or(0, |(i, _)| i)
            }
        };
        return Ok((GradTarget::Logit(label), json!({ "label": labels[label] })));
    }
    if causal_lm {
        let id = match &args.token {
            Some(w) => match model.tokenizer().token_id(w) {
                Some(id) => id,
                None => match model.tokenizer().word_ids(w)?.as_slice() {
                    [id] => *id,
                    ids => anyhow::bail!(
                        "--token {w:?}: not a vocabulary entry, and it tokenizes to {} tokens, not one",
                        ids.len()
                    ),
                },
            },
            None => {
                let out = model.forward(enc, &RunOptions::default())?;
                let top = model.predict(&out, std::slice::from_ref(enc), 0, 1)?;
                top[0].top[0].0
            }
        };
        let token = model.token(id).unwrap_or_default();
        return Ok((
            GradTarget::NextToken(id),
            json!({ "token": token, "id": id }),
        ));
    }
    if embedding {
        let text = args.target_text.as_deref().with_context(|| {
            format!(
                "{} is an embedding model: give --target-text T, whose cosine with the text's \
                 embedding the gradient methods differentiate",
                model.name()
            )
        })?;
        let v = model.embed(&[text])?.remove(0);
        return Ok((GradTarget::Cosine(v), json!({ "target_text": text })));
    }
    let head = model.task().map_or("no head", Task::describe);
    anyhow::bail!(
        "the gradient methods take a classifier's logit, a causal language model's next token or \
         an embedding model's cosine; {} has a {head}",
        model.name()
    )
}

/// The gradient target in words: `the logit of "negative"`.
fn describe_target(what: &serde_json::Value) -> String {
    if let Some(label) = what["label"].as_str() {
        format!("the logit of {:?}", crate::terminal_safe(label))
    } else if let Some(token) = what["token"].as_str() {
        format!(
            "the logit of the next token {:?}",
            crate::terminal_safe(token)
        )
    } else {
        let text = what["target_text"].as_str().unwrap_or_default();
        format!("the cosine with {:?}", crate::terminal_safe(text))
    }
}

/// `[n, T, T]` as nested rows.
fn nested(matrices: &[f32], t: usize) -> Vec<Vec<Vec<f32>>> {
    (matrices.chunks_exact((t * t).max(1)))
        .map(|m| m.chunks_exact(t.max(1)).map(<[f32]>::to_vec).collect())
        .collect()
}

/// Every layer's and head's attention weights of `enc`, `[layers, heads, T, T]`.
fn attention_weights(model: &Model, enc: &attn_models::Encoding) -> anyhow::Result<Vec<f32>> {
    let options = RunOptions {
        attentions: true,
        ..RunOptions::default()
    };
    let out = model.forward(enc, &options)?;
    out.attentions
        .context("the model returned no attention weights")
}

/// A `[T, T]` matrix of `method` for a heatmap, with the maps of the same run: ALTI and
/// attention × gradient rolled out, the last layer's norms, rollout, flow (every row).
pub fn matrix(
    model_args: &ModelArgs,
    (text, pair): (&str, Option<&str>),
    method: AttributionMethod,
    target: &TargetArgs,
) -> anyhow::Result<(attn_viz::AttentionMaps, Vec<f32>)> {
    let model = model_args.load()?;
    let enc = crate::maps::encode(&model, text, pair, false)?;
    let t = enc.len();
    let maps = crate::maps::to_maps(
        &model,
        text,
        pair,
        &enc,
        attention_weights(&model, &enc)?,
        None,
    )?;
    let matrix = match method {
        AttributionMethod::Rollout => attn_viz::select::rollout(&maps)?,
        _ => {
            let mut measured = measures(&model, &enc, &maps, &[method], target)?;
            let values = measured.pop().map(|m| m.values).unwrap_or_default();
            values[values.len().saturating_sub(t * t)..].to_vec()
        }
    };
    Ok((maps, matrix))
}

/// The measures the explorer's heatmap offers beside raw weights (`html`, `serve`), and the
/// gradient target of attention × gradient. The default is what the command line takes when
/// none of the flags is given.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PageMethods {
    /// The measures the heatmap offers beside raw weights: norm, alti, attn-grad, flow
    /// [default: norm,alti]
    ///
    /// The measures the heatmap offers beside raw weights, as `attnscope attribute --method`
    /// computes them: norm (every layer's), alti and attn-grad (rolled out), flow (up to 64
    /// tokens) [default: norm,alti]. attn-grad differentiates the target that --label, --token
    /// or --target-text names (a classifier's predicted label and a causal model's next token
    /// by default).
    #[arg(
        long = "methods",
        id = "method",
        value_name = "M,...",
        value_enum,
        value_delimiter = ','
    )]
    pub methods: Vec<AttributionMethod>,
    #[command(flatten)]
    pub target: TargetArgs,
}

impl PageMethods {
    /// The methods asked for, else norm and ALTI (cheap: 1.6 forward passes) where `model`'s
    /// family has them.
    pub fn chosen(&self, model: &Model) -> Vec<AttributionMethod> {
        match self.methods.is_empty() {
            true if !model.config().has_attributions() => Vec::new(),
            true => vec![AttributionMethod::Norm, AttributionMethod::Alti],
            false => self.methods.clone(),
        }
    }
}

/// The matrices of `methods` on `enc` for a page or a heatmap: norm `[L, T, T]`, the others
/// `[1, T, T]` (ALTI and attention × gradient rolled out, flow from every token).
pub fn measures(
    model: &Model,
    enc: &attn_models::Encoding,
    maps: &attn_viz::AttentionMaps,
    methods: &[AttributionMethod],
    target: &TargetArgs,
) -> anyhow::Result<Vec<Measure>> {
    let t = enc.len();
    let contributions = if (methods.iter())
        .any(|m| matches!(m, AttributionMethod::Norm | AttributionMethod::Alti))
    {
        Some(model.contributions(enc)?)
    } else {
        None
    };
    let mut out = Vec::with_capacity(methods.len());
    for &method in methods {
        let one = |label: String, values: Vec<f32>| Measure {
            name: method.name().to_string(),
            label,
            layers: values.len() / (t * t).max(1),
            values,
        };
        out.push(match (method, &contributions) {
            (AttributionMethod::Norm, Some(c)) => one(
                "Norms of what each layer's attention passes on".into(),
                c.norm.clone(),
            ),
            (AttributionMethod::Alti, Some(c)) => one(
                method.describe().into(),
                attn_viz::select::rolled_out(&c.alti, t),
            ),
            (AttributionMethod::AttnGrad, _) => {
                let (y, what) = gradient_target(model, enc, target)?;
                let (matrix, _) = model.attention_gradient_rollout(enc, &y)?;
                let label = format!(
                    "Attention × gradient of {}, rolled out",
                    describe_target(&what)
                );
                one(label, matrix)
            }
            (AttributionMethod::Flow, _) => {
                let sources: Vec<usize> = (0..t).collect();
                let flow = attn_viz::flow::attention_flow(maps, &sources, |_, _| {})?;
                one(method.describe().into(), flow)
            }
            (AttributionMethod::Rollout, _) => anyhow::bail!(
                "the heatmap always offers the rollout; --methods takes norm, alti, attn-grad, flow"
            ),
            _ => anyhow::bail!(
                "--method {} gives one score per token, not a matrix: `explain --method {}` shows them",
                method.name(),
                method.name()
            ),
        });
    }
    Ok(out)
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
        _ => (attention_weights(&model, &enc)?, None, None),
    };
    let maps = crate::maps::to_maps(&model, text, pair, &enc, attentions, None)?;
    let units = words(&maps)?;
    let target = Target::of(&model, &enc, &args, &units)?;
    let gradient = match args.method.needs_target() {
        true => Some(gradient_target(&model, &enc, &args.target)?),
        false => None,
    };
    let mut gap = None;
    let (scores, matrix) = match (args.method, matrix, &per_layer) {
        (
            AttributionMethod::GradInput | AttributionMethod::Ig | AttributionMethod::AttnGrad,
            _,
            _,
        ) => {
            let (y, _) = gradient
                .as_ref()
                .context("a gradient method without a target")?;
            match args.method {
                AttributionMethod::GradInput => (model.grad_input(&enc, y)?.0, None),
                AttributionMethod::Ig => {
                    let ig = model.integrated_gradients(&enc, y, args.target.steps as usize)?;
                    gap = Some((ig.completeness_gap, ig.value - ig.baseline));
                    (ig.scores, None)
                }
                _ => {
                    let (r, _) = model.attention_gradient_rollout(&enc, y)?;
                    (target.row(&r, t), Some(r))
                }
            }
        }
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
        let mut target_json = target.json();
        if let Some((_, what)) = &gradient {
            match args.method {
                // Their scores are of the embeddings, not of a row.
                AttributionMethod::GradInput | AttributionMethod::Ig => target_json = what.clone(),
                _ => {
                    let (Some(a), Some(b)) = (target_json.as_object_mut(), what.as_object()) else {
                        anyhow::bail!("a target that is not a JSON object");
                    };
                    a.extend(b.clone());
                }
            }
        }
        let mut doc = serde_json::json!({
            "model": model.name(),
            "method": args.method.name(),
            "target": target_json,
            "tokens": enc.tokens,
            "scores": scores,
        });
        if let Some((gap, _)) = gap {
            doc["completeness_gap"] = gap.into();
        }
        if let Some(per_layer) = &per_layer {
            doc["per_layer"] = serde_json::to_value(nested(per_layer, t))?;
        }
        if let Some(matrix) = &matrix {
            doc["matrix"] = serde_json::to_value(&nested(matrix, t)[0])?;
        }
        return write_out(&format!("{}\n", serde_json::to_string(&doc)?));
    }
    // Integrated gradients' scores are signed: the bars show their magnitudes.
    let signed = scores.iter().any(|&v| v < 0.0);
    let magnitudes: Vec<f32> = scores.iter().map(|v| v.abs()).collect();
    let merged = row_to_units(&magnitudes, &units);
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
    let of = gradient.as_ref().map(|(_, what)| describe_target(what));
    let to = match (args.method, &of) {
        (AttributionMethod::GradInput | AttributionMethod::Ig, Some(of)) => format!("to {of}"),
        (_, Some(of)) => format!("to {whose}, for {of}"),
        (_, None) => format!("to {whose}"),
    };
    let mut s = String::new();
    writeln!(
        s,
        "{}: how much each word contributes {to} — {}:",
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
    if signed {
        writeln!(
            s,
            "note: the bars show the scores' magnitudes (--json gives the signed scores)"
        )?;
    }
    if let Some((gap, change)) = gap {
        // As a power of ten: the gap's own digits are rounding, different on each CPU.
        let within = match gap > 0.0 {
            true => format!("within 1e{}", gap.log10().ceil()),
            false => "exactly".to_string(),
        };
        writeln!(
            s,
            "note: completeness: the scores add up to y(text) − y(baseline) = {change:.4} {within} \
             ({} steps; --json gives the gap)",
            args.target.steps
        )?;
    }
    writeln!(
        s,
        "note: word level: a word's score is the sum over its tokens (--json gives the tokens')"
    )?;
    write_out(&s)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        methods: PageMethods,
    }

    #[test]
    fn the_defaults_are_the_command_lines() {
        let parsed = Flags::parse_from(["attnscope"]).methods;
        let default = PageMethods::default();
        assert_eq!(parsed.methods, default.methods);
        assert_eq!(parsed.target.steps, default.target.steps);
        assert_eq!(
            (
                parsed.target.label,
                parsed.target.token,
                parsed.target.target_text
            ),
            (None, None, None)
        );
    }
}
