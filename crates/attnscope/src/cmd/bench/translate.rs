//! `attnscope bench translate`: an encoder-decoder model's translation time (encoder, then
//! greedy or beam-search decoding with the key/value cache), the whole `beam_search` call
//! timed as `scripts/bench_translate.py` times transformers' `generate()`; then what capturing
//! all three attention kinds of that translation adds (`attention SOURCE` without `--target`:
//! the teacher-forced decoder pass over the translation; the encoder's attentions come with
//! the translation).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};

use crate::maps::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    /// An encoder-decoder model's directory (BART, mBART, Marian, T5) or Hugging Face cache id.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// The text to translate.
    #[arg(long, default_value = "The mouse lived in the barn")]
    pub source: String,
    /// Most new tokens per run.
    #[arg(long = "max-new-tokens", value_name = "N", default_value_t = 20)]
    pub new_tokens: usize,
    /// Beams (1: greedy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub num_beams: u32,
    /// Threads for the model.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Timed runs after one warm-up; the median counts.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print one JSON line: {"engine", "model", "threads", "source_tokens", "num_beams",
    /// "ms", "capture_ms", "ids"}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::check_reps(args.reps)?;
    if args.new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let source_args = ModelArgs {
        model: Some(args.model.clone()),
        threads: Some(args.threads),
    };
    let model = source_args
        .load_seq2seq()?
        .context("bench translate needs an encoder-decoder model (BART, mBART, Marian, T5)")?;
    let source = model.encode_source(&args.source)?;
    let beams = args.num_beams as usize;
    let translate = || -> anyhow::Result<(Vec<f32>, Vec<u32>)> {
        let (encoded, _) = model.encode(&source)?;
        let ids = model.beam_search_encoded(&encoded, args.new_tokens, beams)?;
        Ok((encoded, ids))
    };
    let (encoded, ids) = translate()?;
    let translation = model.decode_text(&ids)?;
    // What `attention SOURCE` adds to the translation: the teacher-forced decoder pass over
    // it, against the encoder output the translation made.
    let capture = || -> anyhow::Result<()> {
        let (decoder, _) = model.teacher_forcing(&translation)?;
        model.decode(&encoded, &decoder)?;
        Ok(())
    };
    let ms = median_ms(args.reps, || translate().map(drop))?;
    let capture_ms = median_ms(args.reps, capture)?;
    if args.json {
        let doc = serde_json::json!({
            "engine": "attnscope",
            "model": model.name(),
            "threads": args.threads,
            "source_tokens": source.len(),
            "num_beams": beams,
            "ms": ms,
            "capture_ms": capture_ms,
            "ids": ids,
        });
        crate::outln!("{doc}")?;
    } else {
        crate::outln!(
            "{}: {ms:.1} ms per translation ({} source tokens, {} new tokens, {beams} beam{}, {} \
             threads, median of {}); capturing its attention {capture_ms:.1} ms more ({:+.0}%)",
            model.name(),
            source.len(),
            ids.len(),
            if beams == 1 { "" } else { "s" },
            args.threads,
            super::runs(args.reps),
            capture_ms / ms * 100.0
        )?;
    }
    Ok(())
}

/// The median wall time of `reps` runs of `f`, in milliseconds.
fn median_ms(reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(super::median(times))
}
