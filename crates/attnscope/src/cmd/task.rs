//! What the task commands (`classify`, `answer`, `predict`) share: `--explain`, the bars of the
//! attention of the tokens a head reads, as `explain` draws them.

use std::io::Write;

use anyhow::Context;
use attn_models::{Encoding, Model, RunOptions, Task};
use attn_viz::bars::BarStyle;
use attn_viz::explain::{ExplainOptions, Explanation, Method, explain, render};
use attn_viz::select::Selection;

use crate::maps::ColorChoice;

/// `--explain` and the attention it shows.
// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args, Debug, Clone)]
pub struct ExplainArgs {
    /// Also show which words the prediction's tokens attend to, as bars
    ///
    /// Also show which words the tokens the head reads attend to (a classifier's [CLS] or last
    /// token, an answer's tokens, the predicting position), as `explain` draws them: every
    /// layer and head averaged unless --layer, --head or --rollout say otherwise; special
    /// tokens hidden unless --special.
    #[arg(long)]
    pub explain: bool,
    /// With --explain: one layer (0-based), its heads averaged.
    #[arg(long, value_name = "L", requires = "explain", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub layer: Option<usize>,
    /// With --explain: one head (0-based) of --layer.
    #[arg(long, value_name = "H", requires = "layer", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub head: Option<usize>,
    /// With --explain: attention rollout through every layer (Abnar & Zuidema 2020).
    #[arg(long, requires = "explain", conflicts_with_all = ["layer", "head"])]
    pub rollout: bool,
    /// With --explain: show special tokens ([CLS], [SEP]) instead of hiding them.
    #[arg(long, requires = "explain")]
    pub special: bool,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

impl ExplainArgs {
    /// The run options of the forward pass: attentions only with --explain.
    pub fn run_options(&self) -> RunOptions {
        RunOptions {
            attentions: self.explain,
            ..RunOptions::default()
        }
    }

    /// The bars' style.
    pub fn style(&self) -> BarStyle {
        BarStyle {
            colour: self.color.enabled(),
            ..BarStyle::default()
        }
    }

    /// The explanation of what tokens `from` of `enc` attend to, from the attentions of a
    /// forward pass over `enc` alone (`[layers, heads, T, T]`); with `only_segment`, over that
    /// segment's words.
    pub fn bars(
        &self,
        model: &Model,
        (text, pair): (&str, Option<&str>),
        enc: &Encoding,
        weights: Vec<f32>,
        (from, only_segment): (Vec<usize>, Option<usize>),
    ) -> anyhow::Result<Explanation> {
        let maps = crate::maps::to_maps(model, text, pair, enc, weights, None)?;
        let selection = Selection::from_flags(self.layer, self.head, self.rollout)?;
        let options = ExplainOptions {
            method: Method::Attention { selection },
            special: self.special,
            focus_tokens: from,
            only_segment,
            ..ExplainOptions::default()
        };
        explain(&maps, &options, |_, _| {}).map_err(crate::maps::name_the_flag)
    }
}

/// Refuses a model whose head is not `task`, before any text is run (the error names the
/// architectures its config.json has).
pub fn require(model: &Model, task: Task, command: &str) -> anyhow::Result<()> {
    model
        .require_task(task)
        .with_context(|| format!("{command} runs a model's {}", task.describe()))
}

/// Writes `text` to standard output, flushed.
pub fn write_out(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .context("writing the output")?;
    out.flush().context("writing the output")?;
    Ok(())
}

/// `explanation` rendered, after a blank line and a line that says whose attention it is.
pub fn render_bars(explanation: &Explanation, what: &str, style: BarStyle) -> String {
    format!("\n{what}\n{}", render(explanation, style))
}
