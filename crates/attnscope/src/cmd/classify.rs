//! `attnscope classify`: a sequence classifier's labels for a text (or a pair), or for every
//! line of a file in batches; `--explain` shows what the token the classifier reads attends to.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use attn_models::{Classification, Model, Scoring, Task};

use super::attention::read_text_file;
use super::task::{ExplainArgs, render_bars, require, write_out};
use crate::maps::ModelArgs;

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope classify \"The movie was good but the ending was terrible\" --model distilbert-base-uncased-finetuned-sst-2-english --explain
  attnscope classify --file reviews.txt --json --model DIR")]
pub struct Args {
    /// The text to classify (or --file).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub text: Option<String>,
    /// A second text, classified as a pair with TEXT (entailment, paraphrase).
    #[arg(long, value_name = "TEXT", conflicts_with = "file")]
    pub pair: Option<String>,
    /// Classify every non-empty line of FILE ("-": standard input), in batches
    ///
    /// Classify every non-empty line of FILE ("-" reads standard input), in batches: one line
    /// of output per text, and with --json one JSON object per line.
    #[arg(long, value_name = "FILE", conflicts_with = "explain")]
    pub file: Option<PathBuf>,
    /// Print JSON: {"model", "labels": [{"label", "score"}...] (highest first), "logits"}
    ///
    /// Print {"model", "labels": [{"label", "score"}, ...] (highest first), "logits": [...] (in
    /// label id order)}, with "explain" (the bars' data) when --explain is given, and "text"
    /// with --file.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub view: ExplainArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// What a verdict's scores are, in words.
fn scored(scoring: Scoring) -> &'static str {
    match scoring {
        Scoring::Softmax => "probabilities (softmax)",
        Scoring::Sigmoid => "probabilities, each label on its own (sigmoid)",
        Scoring::Raw => "the regression's raw score",
    }
}

/// The verdict as JSON.
fn to_json(model: &Model, c: &Classification) -> serde_json::Value {
    let labels: Vec<serde_json::Value> = (c.ranked.iter())
        .map(|(label, score)| serde_json::json!({"label": label, "score": score}))
        .collect();
    serde_json::json!({"model": model.name(), "labels": labels, "logits": c.logits})
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    require(&model, Task::Classification, "classify")?;
    match &args.file {
        Some(file) => run_file(&args, &model, file),
        None => run_one(&args, &model),
    }
}

fn run_one(args: &Args, model: &Model) -> anyhow::Result<()> {
    let text = args
        .text
        .as_deref()
        .context("give a TEXT to classify (or --file)")?;
    let pair = args.pair.as_deref();
    let enc = crate::maps::encode(model, text, pair, false)?;
    let out = model.forward(&enc, &args.view.run_options())?;
    let verdict = model.classify(&out, std::slice::from_ref(&enc))?.remove(0);
    let bars = match (args.view.explain, out.attentions) {
        (true, Some(weights)) => {
            let from = vec![verdict.pooled_token];
            Some(
                args.view
                    .bars(model, (text, pair), &enc, weights, (from, None))?,
            )
        }
        _ => None,
    };
    if args.json {
        let mut doc = to_json(model, &verdict);
        if let Some(bars) = &bars {
            doc["explain"] = serde_json::to_value(bars)?;
        }
        return write_out(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    let mut s = format!(
        "{}: {} labels, {}\n",
        model.name(),
        verdict.ranked.len(),
        scored(verdict.scoring)
    );
    let width = verdict
        .ranked
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    for (label, score) in &verdict.ranked {
        let bar = match verdict.scoring {
            Scoring::Raw => String::new(),
            _ => "█".repeat((score.clamp(0.0, 1.0) * 40.0).round() as usize),
        };
        writeln!(s, "  {label:<width$}  {score:>7.4}  {bar}")?;
    }
    if let Some(bars) = &bars {
        let token = enc.tokens[verdict.pooled_token].clone();
        let what = format!(
            "what {token} (token {}), which the classifier reads, attends to:",
            verdict.pooled_token
        );
        s.push_str(&render_bars(bars, &what, args.view.style()));
    }
    write_out(&s)
}

fn run_file(args: &Args, model: &Model, file: &std::path::Path) -> anyhow::Result<()> {
    let (texts, lines): (Vec<String>, Vec<usize>) = read_text_file(file)?
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| (l.to_string(), n + 1))
        .unzip();
    anyhow::ensure!(
        !texts.is_empty(),
        "{}: no text to classify (every line is empty)",
        file.display()
    );
    let encs = texts
        .iter()
        .zip(&lines)
        .map(|(t, n)| {
            model
                .encode(t, None)
                .with_context(|| format!("{}, line {n}", file.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let verdicts = model.classify_all(&encs).map_err(|e| {
        let what = match e.text() {
            Some(i) => format!("{}, line {}", file.display(), lines[i]),
            None => file.display().to_string(),
        };
        anyhow::Error::new(e).context(format!("classifying {what}"))
    })?;
    let mut s = String::new();
    for ((text, line), v) in texts.iter().zip(&lines).zip(&verdicts) {
        if args.json {
            let mut doc = to_json(model, v);
            doc["text"] = text.as_str().into();
            writeln!(s, "{}", serde_json::to_string(&doc)?)?;
        } else {
            let (label, score) = &v.ranked[0];
            writeln!(
                s,
                "{line:>5}  {label}  {score:.4}  {}",
                crate::terminal_safe(text)
            )?;
        }
    }
    write_out(&s)
}
