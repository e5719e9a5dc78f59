//! `attnscope`: compute and see transformer attention. This binary only turns flags into calls
//! to the `attn-core`, `attn-models` and `attn-viz` crates.

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use attnscope::cmd;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "attnscope",
    version,
    about = "Compute and see transformer attention"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one attention call saved as safetensors (the tests/data/sdpa format).
    Sdpa(cmd::sdpa::Args),
    /// Walk through "The cat sat" (or your own matrices) step by step.
    Walkthrough(cmd::walkthrough::Args),
    /// Print a mask matrix: `mask causal 4`, `mask padding "The cat <PAD> <PAD>"`.
    Mask(cmd::mask::Args),
    /// Every layer's and head's attention of a real model, for one text (or a pair).
    Attention(cmd::attention::Args),
    /// Sentence embeddings of a real model.
    Embed(cmd::embed::Args),
    /// What each token contributes, beyond raw weights: norms, ALTI, rollout, flow, gradients.
    Attribute(cmd::attribute::Args),
    /// Which words a word attends to, as bars in the terminal.
    Explain(cmd::explain::Args),
    /// Draw the attention matrix as a PNG or SVG heatmap.
    Heatmap(cmd::heatmap::Args),
    /// Write a self-contained interactive HTML explorer.
    Html(cmd::html::Args),
    /// Serve the explorer as a local web app.
    Serve(cmd::serve::Args),
    /// Per-head statistics: entropy, [CLS]/[SEP] share, previous/next/self share, distance.
    Heads(cmd::heads::Args),
    /// Attention as a soft database lookup over real sentence embeddings.
    Lookup(cmd::lookup::Args),
    /// Continue a prompt with a decoder (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2)
    ///
    /// Continue a prompt with a decoder (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2); --explain shows the tokens the attention that chose each new token weighed most.
    Generate(cmd::generate::Args),
    /// Translate a text with an encoder-decoder model (BART, mBART, Marian, T5).
    Translate(cmd::translate::Args),
    /// A sequence classifier's labels for a text (sentiment, topic, entailment).
    Classify(cmd::classify::Args),
    /// Answer a question from a context with an extractive question-answering model.
    Answer(cmd::answer::Args),
    /// The most likely next token (GPT-2) or [MASK] token (BERT, RoBERTa, DistilBERT).
    Predict(cmd::predict::Args),
    /// Benchmarks: attention kernels and model throughput.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
}

/// Keeps freed memory in the process instead of giving it back to the kernel after each call.
///
/// glibc serves allocations above 128 KiB (a threshold that grows with use, to at most 32 MiB)
/// with fresh `mmap`s and trims the heap when 2× that is free, so a loop of same-sized calls
/// (benchmarks, training steps, a server) faults every output page in again each time: about
/// 8% of a forward+backward pass at seq 512 (84 600 page faults over 110 calls, 3 000 with this
/// policy). From 64 MiB up, buffers still get their own mapping, and up to 256 MiB of free heap
/// is kept before trimming.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    // SAFETY: `mallopt` only changes glibc's malloc parameters; it runs before any other thread
    // exists. A refused setting (return 0) leaves glibc's defaults, which are also correct.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    keep_freed_memory();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage(&err),
    };
    let truncates = matches!(
        cli.command,
        Command::Attention(_)
            | Command::Embed(_)
            | Command::Explain(_)
            | Command::Heatmap(_)
            | Command::Html(_)
            | Command::Heads(_)
            | Command::Lookup(_)
            | Command::Translate(_)
    );
    let result = check_rayon_threads(&cli.command).and_then(|()| match cli.command {
        Command::Sdpa(args) => cmd::sdpa::run(args),
        Command::Walkthrough(args) => cmd::walkthrough::run(args),
        Command::Mask(args) => cmd::mask::run(args),
        Command::Attention(args) => cmd::attention::run(args),
        Command::Embed(args) => cmd::embed::run(args),
        Command::Attribute(args) => cmd::attribute::run(args),
        Command::Explain(args) => cmd::explain::run(args),
        Command::Heatmap(args) => cmd::heatmap::run(args),
        Command::Html(args) => cmd::html::run(args),
        Command::Serve(args) => cmd::serve::run(args),
        Command::Heads(args) => cmd::heads::run(args),
        Command::Lookup(args) => cmd::lookup::run(args),
        Command::Generate(args) => cmd::generate::run(args),
        Command::Translate(args) => cmd::translate::run(args),
        Command::Classify(args) => cmd::classify::run(args),
        Command::Answer(args) => cmd::answer::run(args),
        Command::Predict(args) => cmd::predict::run(args),
        Command::Bench(command) => cmd::bench::run(command),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // Written, not `eprintln!`ed: with standard error closed too, the exit status is
            // all that is left to say it (`eprintln!` would panic).
            let mut stderr = std::io::stderr();
            let _ = writeln!(
                stderr,
                "error: {}",
                attnscope::terminal_safe(&format!("{err:#}"))
            );
            if is_too_long(&err) {
                let _ = match truncates {
                    true => writeln!(
                        stderr,
                        "hint: shorten it, or pass --truncate to cut it to fit"
                    ),
                    false => writeln!(stderr, "hint: shorten it"),
                };
            }
            ExitCode::from(1)
        }
    }
}

/// Prints clap's answer to the command line: `--help` and `--version` succeed; a bad flag or
/// value is bad input like any other, exit status 1 (clap's own default is 2).
fn usage(err: &clap::Error) -> ExitCode {
    let _ = err.print();
    match err.use_stderr() {
        true => ExitCode::from(1),
        false => ExitCode::SUCCESS,
    }
}

/// The model arguments of a command that runs a model.
fn model_args(command: &Command) -> Option<&attnscope::maps::ModelArgs> {
    match command {
        Command::Attention(args) => Some(&args.model),
        Command::Embed(args) => Some(&args.model),
        Command::Attribute(args) => Some(&args.model),
        Command::Generate(args) => Some(&args.model),
        Command::Translate(args) => Some(&args.model),
        Command::Classify(args) => Some(&args.model),
        Command::Answer(args) => Some(&args.model),
        Command::Predict(args) => Some(&args.model),
        Command::Lookup(args) => Some(&args.model),
        Command::Serve(args) => Some(&args.model),
        Command::Explain(args) => Some(&args.source.model),
        Command::Heatmap(args) => Some(&args.source.model),
        Command::Html(args) => Some(&args.source.model),
        Command::Heads(args) => Some(&args.source.model),
        _ => None,
    }
}

/// `RAYON_NUM_THREADS` sizes the thread pool of a command run without `--threads` (the
/// benchmarks always set theirs): the same limit as `--threads` (1 to 1024; 0, empty or unset
/// is rayon's "every core"), checked before any work, as a pool of 100000 threads takes minutes
/// to start.
fn check_rayon_threads(command: &Command) -> anyhow::Result<()> {
    let given = matches!(command, Command::Bench(_))
        || model_args(command).is_some_and(|m| m.threads.is_some());
    let Some(value) = std::env::var_os("RAYON_NUM_THREADS").filter(|v| !v.is_empty() && !given)
    else {
        return Ok(());
    };
    let text = value.to_string_lossy();
    match text.parse::<usize>() {
        Ok(n) if n <= attn_core::MAX_THREADS => Ok(()),
        _ => anyhow::bail!(
            "RAYON_NUM_THREADS={text}: must be a thread count from 1 to {} (0 or unset: every \
             core)",
            attn_core::MAX_THREADS
        ),
    }
}

/// A text longer than the model reads: the commands that take `--truncate` say so.
fn is_too_long(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        matches!(
            e.downcast_ref::<attn_models::ModelError>(),
            Some(
                attn_models::ModelError::TooLong { .. }
                    | attn_models::ModelError::SideTooLong { .. }
                    | attn_models::ModelError::TooManyWords { .. }
            )
        )
    })
}

/// Output piped into `head` closes early; that is not an error (ripgrep does the same). JSON
/// output fails with serde_json's error, which carries the I/O error's kind.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .map(std::io::Error::kind)
            .or_else(|| e.downcast_ref::<serde_json::Error>()?.io_error_kind())
            == Some(ErrorKind::BrokenPipe)
    })
}
