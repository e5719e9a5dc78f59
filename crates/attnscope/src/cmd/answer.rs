//! `attnscope answer`: an extractive question-answering model's answer, as transformers'
//! question-answering pipeline gives it; `--explain` shows which context words the answer's
//! tokens attend to.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use attn_models::{Answer, Model, RunOptions, Task};

use super::attention::read_text_file;
use super::task::{ExplainArgs, render_bars, require, write_out};
use crate::maps::ModelArgs;

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope answer --question \"Who invented the transformer?\" --context \"The transformer architecture was invented by Vaswani et al. in 2017 at Google Brain.\" --model distilbert-base-cased-distilled-squad
  attnscope answer --file questions.jsonl --json --model DIR")]
pub struct Args {
    /// The question.
    #[arg(
        long,
        value_name = "TEXT",
        required_unless_present = "file",
        requires = "context"
    )]
    pub question: Option<String>,
    /// The text that holds the answer; a long one runs in overlapping windows.
    #[arg(
        long,
        value_name = "TEXT",
        required_unless_present = "file",
        requires = "question"
    )]
    pub context: Option<String>,
    /// Answer every line of FILE, each a JSON object {"question", "context"} ("-": stdin)
    #[arg(long, value_name = "FILE", conflicts_with_all = ["question", "context", "explain"])]
    pub file: Option<PathBuf>,
    /// Print JSON: {"model", "answer", "start", "end", "score"}
    ///
    /// Print {"model", "answer", "start", "end", "score"}: start and end are character offsets
    /// into the context (the answer is context[start:end] in Python), as the pipeline gives
    /// them; with --explain, "explain" holds the bars' data, and with --file each line's object
    /// has its "question".
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub view: ExplainArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    require(&model, Task::QuestionAnswering, "answer")?;
    match &args.file {
        Some(file) => run_file(&args, &model, file),
        None => run_one(&args, &model),
    }
}

/// The answer as JSON (an empty answer at 0 when no span of the context could be one).
fn to_json(model: &Model, answer: Option<&Answer>) -> serde_json::Value {
    match answer {
        Some(a) => serde_json::json!({
            "model": model.name(), "answer": a.text, "start": a.start, "end": a.end, "score": a.score
        }),
        None => {
            serde_json::json!({"model": model.name(), "answer": "", "start": 0, "end": 0, "score": 0.0})
        }
    }
}

fn run_one(args: &Args, model: &Model) -> anyhow::Result<()> {
    let (question, context) = match (&args.question, &args.context) {
        (Some(q), Some(c)) => (q.as_str(), c.as_str()),
        _ => anyhow::bail!("give --question and --context (or --file)"),
    };
    let answered = model.answer(question, context, &RunOptions::default())?;
    let bars = match (&answered.answer, args.view.explain) {
        (Some(a), true) => {
            // The answer's window alone, with its attentions.
            let (window, first, last) = a.span;
            let enc = &answered.windows[window];
            let out = model.forward(enc, &args.view.run_options())?;
            let weights = out
                .attentions
                .context("the model returned no attention weights")?;
            let from = (first..=last).collect();
            let bars = args.view.bars(
                model,
                (question, Some(context)),
                enc,
                weights,
                (from, Some(1)),
            )?;
            Some((bars, window))
        }
        _ => None,
    };
    if args.json {
        let mut doc = to_json(model, answered.answer.as_ref());
        if let Some((bars, _)) = &bars {
            doc["explain"] = serde_json::to_value(bars)?;
        }
        return write_out(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    let mut s = String::new();
    match &answered.answer {
        Some(a) => writeln!(
            s,
            "answer: {:?}  score {:.4}  (characters {}..{} of the context; {} window{})",
            a.text,
            a.score,
            a.start,
            a.end,
            answered.windows.len(),
            if answered.windows.len() == 1 { "" } else { "s" }
        )?,
        None => writeln!(s, "no span of the context can be an answer")?,
    }
    if let Some((bars, window)) = &bars {
        let windows = match answered.windows.len() {
            1 => String::new(),
            _ => format!(" (window {window})"),
        };
        let what = format!("which context words the answer's tokens attend to{windows}:");
        s.push_str(&render_bars(bars, &what, args.view.style()));
    }
    write_out(&s)
}

#[derive(serde::Deserialize)]
struct Line {
    question: String,
    context: String,
}

fn run_file(args: &Args, model: &Model, file: &std::path::Path) -> anyhow::Result<()> {
    let text = read_text_file(file)?;
    let mut questions = Vec::new();
    let mut lines = Vec::new();
    for (n, line) in (text.lines().enumerate()).filter(|(_, l)| !l.trim().is_empty()) {
        let q: Line = serde_json::from_str(line).with_context(|| {
            format!(
                "{}, line {}: not a JSON object {{\"question\", \"context\"}}",
                file.display(),
                n + 1
            )
        })?;
        questions.push(q);
        lines.push(n + 1);
    }
    anyhow::ensure!(
        !questions.is_empty(),
        "{}: no question to answer (every line is empty)",
        file.display()
    );
    let pairs: Vec<(&str, &str)> = (questions.iter())
        .map(|q| (q.question.as_str(), q.context.as_str()))
        .collect();
    let answers = model.answer_all(&pairs).map_err(|e| {
        let what = match e.text() {
            Some(i) => format!("{}, line {}", file.display(), lines[i]),
            None => file.display().to_string(),
        };
        anyhow::Error::new(e).context(what)
    })?;
    let mut s = String::new();
    for ((q, line), answer) in questions.iter().zip(&lines).zip(&answers) {
        if args.json {
            let mut doc = to_json(model, answer.as_ref());
            doc["question"] = q.question.as_str().into();
            writeln!(s, "{}", serde_json::to_string(&doc)?)?;
        } else {
            let (text, score) = answer
                .as_ref()
                .map_or(("", 0.0), |a| (a.text.as_str(), a.score));
            writeln!(
                s,
                "{line:>5}  {:?}  {score:.4}  {}",
                crate::terminal_safe(text),
                crate::terminal_safe(&q.question)
            )?;
        }
    }
    write_out(&s)
}
