//! `attnscope bench embed`: sentence-embedding throughput on the workload of
//! `shared/bench/minilm_ref.py` (its sentences, batch size and median-of-reps timing), so the
//! two can be compared in the same run.

use std::time::Instant;

use anyhow::bail;
use attn_models::GemmKernel;

use crate::maps::load_model;

#[derive(clap::Args)]
pub struct Args {
    /// Threads for the model.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Texts run through the model at once.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Number of sentences per repetition.
    #[arg(long, default_value_t = 256)]
    pub sentences: usize,
    /// Timed repetitions after one warm-up; the median counts.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Model directory, or id in the Hugging Face cache [default: all-MiniLM-L6-v2]
    ///
    /// Model directory, or a model id in the Hugging Face cache [default: $ATTNSCOPE_MODEL,
    /// else the cached default model].
    #[arg(long, value_name = "DIR")]
    pub model: Option<std::path::PathBuf>,
    /// The multiply of the linear layers: auto, f32 (faer) or bf16x3 (AMX)
    ///
    /// The multiply of the linear layers: auto (bf16x3 on AMX tiles where the CPU has them and
    /// the batch is large, else f32), f32 (faer), or bf16x3 (AMX whenever present).
    #[arg(long, value_enum, default_value_t = Gemm::Auto)]
    pub gemm: Gemm,
    /// Print one JSON line instead of text
    ///
    /// Print one JSON line: {"engine", "model", "threads", "batch", "sentences", "gemm",
    /// "sentences_per_s"}.
    #[arg(long)]
    pub json: bool,
}

/// `--gemm`: which [`GemmKernel`] the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Gemm {
    Auto,
    F32,
    Bf16x3,
}

impl From<Gemm> for GemmKernel {
    fn from(gemm: Gemm) -> GemmKernel {
        match gemm {
            Gemm::Auto => GemmKernel::Auto,
            Gemm::F32 => GemmKernel::F32,
            Gemm::Bf16x3 => GemmKernel::Bf16x3,
        }
    }
}

/// The most sentences per repetition (about 100 MB of text).
const MAX_SENTENCES: usize = 1_000_000;

pub fn run(args: Args) -> anyhow::Result<()> {
    super::check_reps(args.reps)?;
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    if !(1..=MAX_SENTENCES).contains(&args.sentences) {
        bail!(
            "--sentences must be between 1 and {MAX_SENTENCES}, not {}",
            args.sentences
        );
    }
    let mut model = load_model(args.model.as_deref(), Some(args.threads))?;
    model.set_gemm_kernel(args.gemm.into());
    let sentences: Vec<String> = (0..args.sentences)
        .map(|i| {
            format!(
                "The cat that ate the mouse that lived in the barn ran away number {i} and then some more words here to pad"
            )
        })
        .collect();
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let run_once = || -> anyhow::Result<()> {
        for chunk in refs.chunks(args.batch) {
            model.embed(chunk)?;
        }
        Ok(())
    };
    run_once()?;
    let mut times = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        let start = Instant::now();
        run_once()?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let per_s = args.sentences as f64 / times[times.len() / 2];
    if args.json {
        let doc = serde_json::json!({
            "engine": "attnscope",
            "model": model.name(),
            "threads": args.threads,
            "batch": args.batch,
            "sentences": args.sentences,
            "gemm": super::spelled(args.gemm),
            "sentences_per_s": per_s,
        });
        crate::outln!("{doc}")?;
    } else {
        crate::outln!(
            "{}: {per_s:.1} sentences/s ({} sentences, batches of {}, {} threads, --gemm {}, median of {})",
            model.name(),
            args.sentences,
            args.batch,
            args.threads,
            super::spelled(args.gemm),
            super::runs(args.reps)
        )?;
    }
    Ok(())
}
