//! `attnscope bench attribute`: the time of one attribution method on one text after the model
//! is loaded, as `scripts/bench_attribute.py` times Captum's integrated gradients on the same
//! model, text and target.

use std::time::Instant;

use attn_models::RunOptions;

use crate::cmd::attribute::{TargetArgs, gradient_target};
use crate::maps::load_model;

#[derive(clap::Args)]
pub struct Args {
    /// The text.
    #[arg(
        long,
        default_value = "The cat that ate the mouse that lived in the old barn by the river ran away when the farmer came home late"
    )]
    pub text: String,
    /// What to time: a gradient method, norm and ALTI (both come from one pass), or a forward
    /// pass for scale.
    #[arg(long, value_enum)]
    pub method: Timed,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Timed runs after one warm-up; the median counts.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Model directory, or id in the Hugging Face cache [default: all-MiniLM-L6-v2]
    #[arg(long, value_name = "DIR")]
    pub model: Option<std::path::PathBuf>,
    /// Threads for the model.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Print one JSON line: {"engine", "model", "method", "tokens", "steps", "threads", "ms",
    /// "scores"}.
    #[arg(long)]
    pub json: bool,
}

/// `--method`: what one timed run computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Timed {
    Forward,
    Contributions,
    GradInput,
    Ig,
    AttnGrad,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::check_reps(args.reps)?;
    let model = load_model(args.model.as_deref(), Some(args.threads))?;
    let enc = crate::maps::encode(&model, &args.text, None, false)?;
    let needs_target = matches!(args.method, Timed::GradInput | Timed::Ig | Timed::AttnGrad);
    let target = match needs_target {
        true => Some(gradient_target(&model, &enc, &args.target)?.0),
        false => None,
    };
    let once = || -> anyhow::Result<Vec<f32>> {
        Ok(match (args.method, &target) {
            (Timed::Forward, _) => {
                model
                    .forward(&enc, &RunOptions::default())?
                    .last_hidden_state
            }
            (Timed::Contributions, _) => model.contributions(&enc)?.alti,
            (Timed::GradInput, Some(y)) => model.grad_input(&enc, y)?.0,
            (Timed::Ig, Some(y)) => {
                (model.integrated_gradients(&enc, y, args.target.steps as usize)?).scores
            }
            (Timed::AttnGrad, Some(y)) => model.attention_gradient_rollout(&enc, y)?.0,
            (_, None) => anyhow::bail!("a gradient method without a target"),
        })
    };
    let scores = once()?;
    let mut times = Vec::with_capacity(args.reps);
    for _ in 0..args.reps {
        let start = Instant::now();
        once()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let ms = super::median(times);
    let method = super::spelled(args.method);
    let threads = args.threads;
    if args.json {
        let mut doc = serde_json::json!({
            "engine": "attnscope",
            "model": model.name(),
            "method": method,
            "tokens": enc.len(),
            "steps": args.target.steps,
            "threads": threads,
            "ms": ms,
        });
        if matches!(args.method, Timed::GradInput | Timed::Ig) {
            doc["scores"] = serde_json::json!(scores);
        }
        crate::outln!("{doc}")?;
    } else {
        let steps = match args.method {
            Timed::Ig => format!(", {} steps", args.target.steps),
            _ => String::new(),
        };
        crate::outln!(
            "{}: {method} {ms:.1} ms ({} tokens{steps}, {threads} threads, median of {})",
            model.name(),
            enc.len(),
            super::runs(args.reps)
        )?;
    }
    Ok(())
}
