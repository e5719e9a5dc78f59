//! `attnscope translate`: an encoder-decoder model's translation of a text, by beam search as
//! its generation_config.json asks (or greedy).

use std::io::Write;

use anyhow::Context;

use crate::maps::ModelArgs;

#[derive(clap::Args)]
#[command(after_help = "Example:
  attnscope translate \"I love machine learning\" --model Helsinki-NLP/opus-mt-en-fr")]
pub struct Args {
    /// The text to translate.
    pub text: String,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most new tokens [default: the checkpoint's generation_config.json max_length, else 64]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_new_tokens: Option<u32>,
    /// Beams of the beam search [default: the checkpoint's generation_config.json num_beams, else 1: greedy]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub num_beams: Option<u32>,
    /// Cut a text longer than the model's positions instead of refusing it.
    #[arg(long)]
    pub truncate: bool,
    /// Print {"model", "source", "translation", "ids"} (ids: generated, start token excluded).
    #[arg(long)]
    pub json: bool,
}

/// New tokens without --max-new-tokens or a max_length in the checkpoint.
const DEFAULT_NEW_TOKENS: usize = 64;

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.text.trim().is_empty(),
        "the text is empty or only whitespace"
    );
    let model = args.model.load_seq2seq()?.context(
        "translate needs an encoder-decoder model (model_type bart, mbart, marian or t5): give one with --model",
    )?;
    let source = crate::maps::seq2seq_side(&model, &args.text, "source", args.truncate)?.ids;
    let max_new = match args.max_new_tokens {
        Some(n) => n as usize,
        None => model
            .config()
            .generation
            .max_length
            .map_or(DEFAULT_NEW_TOKENS, |m| m.saturating_sub(1)),
    };
    let beams = match args.num_beams {
        Some(n) => n as usize,
        None => model.config().generation.num_beams.unwrap_or(1),
    };
    let ids = model.beam_search(&source, max_new, beams)?;
    let translation = model.decode_text(&ids)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({
            "model": model.name(),
            "source": args.text,
            "translation": translation,
            "ids": ids,
        });
        serde_json::to_writer(&mut out, &doc)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{}", crate::terminal_safe(&translation))?;
    }
    out.flush()?;
    Ok(())
}
