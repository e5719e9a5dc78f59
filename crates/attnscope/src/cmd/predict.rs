//! `attnscope predict`: the most likely tokens a language model predicts: the next token for a
//! causal model (GPT-2), each `[MASK]` / `<mask>` for a masked one (BERT, DistilBERT,
//! RoBERTa); `--explain` shows what the predicting position attends to.

use std::fmt::Write as _;

use attn_models::{ModelKind, Task};

use super::task::{ExplainArgs, render_bars, write_out};
use crate::maps::ModelArgs;

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]
#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope predict \"The cat that ate the mouse that lived in the barn\" --model gpt2 --explain
  attnscope predict \"The cat [MASK] on the mat.\" --model bert-base-uncased --top 3")]
pub struct Args {
    /// The text: a prompt for a causal model, a text with [MASK] (or <mask>) for a masked one.
    pub text: String,
    /// How many of the most likely tokens to show.
    #[arg(long, value_name = "K", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub top: u32,
    /// Print JSON: {"model", "predictions": [[{"token", "id", "probability"}...] per position]}
    ///
    /// Print {"model", "predictions": [[{"token", "id", "probability"}, ...], ...]}: one list
    /// per predicted position (the next token; each mask token in the text's order), most
    /// likely first; with --explain, "explain" holds each position's bars' data.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub view: ExplainArgs,
    #[command(flatten)]
    pub model: ModelArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.model.load()?;
    // A causal model predicts the next token whatever its head; an encoder needs its MLM head.
    if model.kind() == ModelKind::Bert {
        super::task::require(&model, Task::MaskedLm, "predict")?;
    }
    // (Not maps::encode: its note on special tokens a text writes would flag every [MASK].)
    let enc = model.encode(&args.text, None)?;
    let out = model.forward(&enc, &args.view.run_options())?;
    let predictions = model.predict(&out, std::slice::from_ref(&enc), 0, args.top as usize)?;
    let mut bars = Vec::new();
    if let (true, Some(weights)) = (args.view.explain, &out.attentions) {
        for p in &predictions {
            let from = vec![p.position];
            bars.push(args.view.bars(
                &model,
                (&args.text, None),
                &enc,
                weights.clone(),
                (from, None),
            )?);
        }
    }
    let token = |id: u32| model.decode(&[id]);
    if args.json {
        let lists = predictions
            .iter()
            .map(|p| {
                p.top
                    .iter()
                    .map(|&(id, probability)| {
                        Ok(serde_json::json!({"token": token(id)?, "id": id, "probability": probability}))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut doc = serde_json::json!({"model": model.name(), "predictions": lists});
        if !bars.is_empty() {
            doc["explain"] = serde_json::to_value(&bars)?;
        }
        return write_out(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    let mut s = String::new();
    let causal = model.kind() != ModelKind::Bert;
    for (n, p) in predictions.iter().enumerate() {
        let title = match causal {
            true => format!("{}: the next token after {:?}", model.name(), args.text),
            false => format!(
                "{}: {} {} of {} (token {})",
                model.name(),
                enc.tokens[p.position],
                n + 1,
                predictions.len(),
                p.position
            ),
        };
        writeln!(s, "{}", crate::terminal_safe(&title))?;
        for &(id, probability) in &p.top {
            let bar = "█".repeat((probability * 40.0).round() as usize);
            let shown = crate::terminal_safe(&format!("{:?}", token(id)?));
            let line = format!("  {probability:>7.4}  {shown:<16} (id {id})  {bar}");
            writeln!(s, "{}", line.trim_end())?;
        }
        if let Some(b) = bars.get(n) {
            let what = format!(
                "what {} (token {}) attends to, predicting:",
                enc.tokens[p.position], p.position
            );
            s.push_str(&render_bars(
                b,
                &crate::terminal_safe(&what),
                args.view.style(),
            ));
        }
    }
    write_out(&s)
}
