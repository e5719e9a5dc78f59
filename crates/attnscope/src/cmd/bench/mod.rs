//! `attnscope bench …`: one module per benchmark.

mod attribute;
mod embed;
mod generate;
mod sdpa;
mod translate;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Time one attention call (fused kernel): ms and GFLOP/s.
    Sdpa(sdpa::Args),
    /// Sentence embeddings per second of a real model (the shared/bench/minilm_ref.py workload).
    Embed(embed::Args),
    /// Greedy decoding tokens/s of a decoder (GPT-2 or Llama-style) (KV cache), with
    /// prefill and per-token ms.
    Generate(generate::Args),
    /// Translation time of an encoder-decoder model (greedy or beam search, KV cache).
    Translate(translate::Args),
    /// Time of one attribution method on one text after the model is loaded.
    Attribute(attribute::Args),
}

/// The most timed repetitions of any benchmark: their times are kept to take the median.
const MAX_REPS: usize = 1_000_000;

/// Refuses a `--reps` of 0 or past [`MAX_REPS`].
fn check_reps(reps: usize) -> anyhow::Result<()> {
    if !(1..=MAX_REPS).contains(&reps) {
        anyhow::bail!("--reps must be between 1 and {MAX_REPS}, not {reps}");
    }
    Ok(())
}

/// A flag's value as the command line spells it (`bf16x3`, not `Bf16x3`).
fn spelled(value: impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string())
}

/// "1 run", "3 runs".
fn runs(n: usize) -> String {
    format!("{n} run{}", if n == 1 { "" } else { "s" })
}

/// The middle of `xs` (the upper one of an even count); `xs` is not empty.
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Sdpa(args) => sdpa::run(args),
        BenchCommand::Embed(args) => embed::run(args),
        BenchCommand::Generate(args) => generate::run(args),
        BenchCommand::Translate(args) => translate::run(args),
        BenchCommand::Attribute(args) => attribute::run(args),
    }
}
