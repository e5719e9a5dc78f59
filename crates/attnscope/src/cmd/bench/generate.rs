//! `attnscope bench generate`: greedy decoding speed of a decoder (GPT-2, Llama, Mistral,
//! Qwen2) with the KV cache.
//! One run feeds the prompt in one pass (the prefill, which gives the first new token), then
//! one token per step; tokens/s counts the whole run, as `scripts/generate_ref.py` times
//! transformers' `generate`, so the two can be compared in the same run. The mean step time of
//! the first and the last quarter of the steps shows whether a token costs more as the cache
//! grows.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use attn_models::KvCache;
use attn_models::greedy;
use attn_models::{Model, ModelError};

use crate::maps::load_model;

#[derive(clap::Args)]
pub struct Args {
    /// A decoder's directory (GPT-2 or Llama-style) or Hugging Face cache id [default:
    /// $ATTNSCOPE_MODEL]
    ///
    /// A decoder's directory (GPT-2 or Llama-style) in Hugging Face layout, or its model
    /// id in the Hugging Face cache [default: $ATTNSCOPE_MODEL; one of the two is required: the default model is
    /// an encoder, which cannot generate].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// The prompt to continue.
    #[arg(long, default_value = "The cat sat on the mat because it was tired")]
    pub prompt: String,
    /// Tokens generated per run (the end-of-text token does not stop early).
    #[arg(long = "max-new-tokens", value_name = "N", default_value_t = 32)]
    pub new_tokens: usize,
    /// Threads for the model.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Timed runs after one warm-up; the median counts.
    #[arg(long, default_value_t = 5)]
    pub reps: usize,
    /// Print one JSON line instead of text
    ///
    /// Print one JSON line: {"engine", "model", "threads", "prompt_tokens", "new_tokens",
    /// "prefill_ms", "per_token_ms", "per_token_ms_first_quarter", "per_token_ms_last_quarter",
    /// "tokens_per_s", "decode_tokens_per_s", "ids"} (per-token fields are null for one token).
    #[arg(long)]
    pub json: bool,
}

/// The timings of one greedy generation, in seconds.
struct Run {
    prefill: f64,
    /// One per new token after the first: feeding the previous token and choosing the next.
    steps: Vec<f64>,
    ids: Vec<u32>,
}

impl Run {
    fn total(&self) -> f64 {
        self.prefill + self.steps.iter().sum::<f64>()
    }

    /// The mean step time over the first (`last == false`) or last quarter of the steps (at
    /// least one step); `None` without steps.
    fn quarter_mean(&self, last: bool) -> Option<f64> {
        let n = (self.steps.len() / 4).max(1).min(self.steps.len());
        let part = if last {
            &self.steps[self.steps.len() - n..]
        } else {
            &self.steps[..n]
        };
        mean(part)
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// Greedy decoding of `new_tokens` tokens after `prompt` (ids), timed step by step.
fn run_once(model: &Model, prompt: &[u32], new_tokens: usize) -> Result<Run, ModelError> {
    let vocab = model.config().vocab_size;
    let last_row = |logits: &[f32]| greedy(&logits[logits.len() - vocab..]);
    let start = Instant::now();
    // The last new token is never fed back: prompt + N − 1 positions.
    let positions = prompt.len().saturating_add(new_tokens - 1);
    let mut cache = KvCache::with_capacity(model, positions)?;
    let mut next = last_row(&cache.feed_last(prompt, false)?.logits);
    let prefill = start.elapsed().as_secs_f64();
    let mut ids = vec![next];
    let mut steps = Vec::with_capacity(new_tokens - 1);
    while ids.len() < new_tokens {
        let start = Instant::now();
        next = last_row(&cache.feed_last(&[next], false)?.logits);
        steps.push(start.elapsed().as_secs_f64());
        ids.push(next);
    }
    Ok(Run {
        prefill,
        steps,
        ids,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let from_env = attn_models::model_from_env();
    let Some(dir) = args.model.as_ref().or(from_env.as_ref()) else {
        bail!(
            "bench generate needs --model DIR (or ATTNSCOPE_MODEL), a GPT-2-family checkpoint: \
             the default model is an encoder and cannot generate"
        );
    };
    super::check_reps(args.reps)?;
    if args.new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    let model = load_model(Some(dir), Some(args.threads))?;
    // An encoder is refused here, before its tokenizer sees the prompt.
    KvCache::with_capacity(&model, 0)?;
    let prompt = model.encode(&args.prompt, None)?.ids;
    let generate = || {
        run_once(&model, &prompt, args.new_tokens).with_context(|| {
            format!(
                "--max-new-tokens {} after a {}-token prompt",
                args.new_tokens,
                prompt.len()
            )
        })
    };
    generate()?;
    let runs = (0..args.reps)
        .map(|_| generate())
        .collect::<anyhow::Result<Vec<_>>>()?;

    let ms = |secs: f64| secs * 1e3;
    let median_of = |f: &dyn Fn(&Run) -> Option<f64>| {
        let xs: Option<Vec<f64>> = runs.iter().map(f).collect();
        xs.map(|xs| ms(super::median(xs)))
    };
    let tokens_per_s =
        args.new_tokens as f64 / super::median(runs.iter().map(Run::total).collect());
    let prefill_ms = ms(super::median(runs.iter().map(|r| r.prefill).collect()));
    let per_token_ms = median_of(&|r| mean(&r.steps));
    let first_ms = median_of(&|r| r.quarter_mean(false));
    let last_ms = median_of(&|r| r.quarter_mean(true));
    let decode_tokens_per_s = per_token_ms.map(|t| 1e3 / t);
    if args.json {
        let doc = serde_json::json!({
            "engine": "attnscope",
            "model": model.name(),
            "threads": args.threads,
            "prompt_tokens": prompt.len(),
            "new_tokens": args.new_tokens,
            "prefill_ms": prefill_ms,
            "per_token_ms": per_token_ms,
            "per_token_ms_first_quarter": first_ms,
            "per_token_ms_last_quarter": last_ms,
            "tokens_per_s": tokens_per_s,
            "decode_tokens_per_s": decode_tokens_per_s,
            "ids": runs[0].ids,
        });
        crate::outln!("{doc}")?;
    } else {
        crate::outln!(
            "{}: {tokens_per_s:.1} tokens/s ({} new tokens after a {}-token prompt, greedy, {} \
             threads, median of {})",
            model.name(),
            args.new_tokens,
            prompt.len(),
            args.threads,
            super::runs(args.reps)
        )?;
        crate::out!("prefill {prefill_ms:.2} ms")?;
        if let (Some(t), Some(first), Some(last)) = (per_token_ms, first_ms, last_ms) {
            crate::out!(
                ", then {t:.2} ms per token (first quarter {first:.2} ms, last quarter {last:.2} ms)"
            )?;
        }
        crate::outln!()?;
    }
    Ok(())
}
