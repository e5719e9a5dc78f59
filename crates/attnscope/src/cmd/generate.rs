//! `attnscope generate`: continue a prompt with a GPT-2 or Llama-style decoder (KV-cached decoding),
//! greedy or sampled, and optionally show which words each generated token attended to.

use std::io::Write;
use std::num::NonZeroUsize;

use anyhow::Context;
use attn_models::ModelError;
use attn_models::{GenerateOptions, Sampling, Temperature, generate};
use attn_viz::words::{byte_label, byte_level_bytes};

use crate::maps::ModelArgs;

/// How many attended words `--explain` lists per generated token.
const EXPLAIN_TOP: usize = 3;

#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("sampling").args(["temperature", "top_k"]).multiple(true))]
pub struct Args {
    /// The prompt to continue.
    pub prompt: String,
    /// A decoder (GPT-2 or Llama-style) (`--model gpt2`): the default one is BERT,
    /// which cannot generate.
    #[command(flatten)]
    pub model: ModelArgs,
    /// How many tokens to generate (all of them: the end-of-text token does not stop early).
    #[arg(long, value_name = "N")]
    pub max_new_tokens: usize,
    /// Sample from softmax(logits / T) instead of taking the most likely token
    ///
    /// Sample from softmax(logits / T) instead of taking the most likely token [default: greedy].
    /// Over the whole vocabulary unless --top-k cuts it (transformers' generate also keeps its
    /// default top_k of 50 when sampling).
    #[arg(long, value_name = "T", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Sample only among the K most likely tokens [default: every token]
    ///
    /// Sample only among the K most likely tokens (samples at temperature 1 when --temperature
    /// is not given) [default: every token].
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Seed of the sampler (needs --temperature or --top-k)
    ///
    /// Seed of the sampler: the same seed, prompt and thread count give the same text (another
    /// thread count sums the logits in another order, which can tip a near tie). Needs
    /// --temperature or --top-k (without them decoding is greedy and has nothing to seed).
    #[arg(long, value_name = "S", default_value_t = 0, requires = "sampling")]
    pub seed: u64,
    /// For each new token, print the tokens the attention that chose it weighed most
    ///
    /// For each generated token, print the tokens the attention that chose it weighed most (its
    /// query is the token before it; last layer, heads averaged, top 3).
    #[arg(long)]
    pub explain: bool,
    /// Print {"model", "prompt", "ids", "pieces", "labels", "text"} as JSON
    ///
    /// Print {"model", "prompt", "ids", "pieces", "labels", "text"} (with --explain, "explain"
    /// too): "pieces" each new token decoded alone, "labels" the same with a byte that does not
    /// complete a character as "<0xF0>", as --explain names them.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let top_k = match args.top_k {
        Some(k) => Some(NonZeroUsize::new(k).context("--top-k must be at least 1")?),
        None => None,
    };
    let temperature = match args.temperature {
        Some(t) => Some(
            Temperature::new(t)
                .with_context(|| format!("--temperature must be a number above 0, got {t}"))?,
        ),
        None => None,
    };
    let sampling = match (temperature, top_k) {
        (None, None) => Sampling::Greedy,
        (temperature, top_k) => Sampling::Sample {
            temperature: temperature.unwrap_or(Temperature::ONE),
            top_k,
            seed: args.seed,
        },
    };
    let model = args.model.load()?;
    let options = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling,
        attention: args.explain,
    };
    let generation = generate(&model, &args.prompt, &options).map_err(|err| match err {
        ModelError::CacheFull { n_positions, .. } if args.max_new_tokens > n_positions => {
            anyhow::anyhow!(
                "--max-new-tokens {} is more than the model's {n_positions} positions",
                args.max_new_tokens
            )
        }
        // The cache needs the prompt's positions and those of every new token but the last.
        ModelError::CacheFull {
            needed, capacity, ..
        } => {
            let prompt = needed + 1 - args.max_new_tokens;
            let fit = match (capacity + 1).saturating_sub(prompt) {
                1 => "1 new token fits".to_string(),
                n => format!("{n} new tokens fit"),
            };
            anyhow::anyhow!(
                "--max-new-tokens {} after a {prompt}-token prompt needs {needed} positions, and \
                 the model has {capacity}: at most {fit} (the last one is never fed back)",
                args.max_new_tokens
            )
        }
        err => err.into(),
    })?;
    // A piece that is part of a character (a byte-level token of an emoji) reads as its bytes,
    // `<0xF0>`, where decoding it alone gives U+FFFD.
    let label = |id: u32, piece: &str| {
        let bytes = piece
            .contains('\u{fffd}')
            .then(|| model.token(id).and_then(|t| byte_level_bytes(&t)))
            .flatten();
        bytes.map_or_else(|| piece.to_string(), |b| byte_label(&b))
    };
    let pieces: Vec<String> = (generation.ids.iter().zip(&generation.pieces))
        .map(|(&id, piece)| label(id, piece))
        .collect();
    let explained = generation.attention.as_ref().map(|rows| {
        // The prompt's tokens, each decoded alone as the new ones are: the four byte pieces of
        // an emoji are four labels, not the emoji four times.
        let prompt_pieces: Vec<String> = (generation.prompt.ids.iter())
            .map(|&id| {
                let piece = model.decode(&[id]).unwrap_or_default();
                label(id, &piece)
            })
            .collect();
        explain(&prompt_pieces, &pieces, rows)
    });

    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let mut doc = serde_json::json!({
            "model": model.name(),
            "prompt": args.prompt,
            "ids": generation.ids,
            "pieces": generation.pieces,
            "labels": pieces,
            "text": generation.text,
        });
        if let Some(explained) = &explained {
            doc["explain"] = explained
                .iter()
                .map(|top| {
                    top.iter()
                        .map(|(word, weight)| serde_json::json!({"word": word, "weight": weight}))
                        .collect()
                })
                .collect::<Vec<serde_json::Value>>()
                .into();
        }
        serde_json::to_writer(&mut w, &doc)?;
        writeln!(w)?;
    } else {
        writeln!(w, "{}", generation.text)?;
        if let Some(explained) = &explained {
            writeln!(
                w,
                "\nthe attention that chose each new token (its query is the token before it: the \
                 prompt's last, then each new one; last layer, heads averaged, top {EXPLAIN_TOP}):"
            )?;
            for (i, (piece, top)) in pieces.iter().zip(explained).enumerate() {
                let words: Vec<String> = top
                    .iter()
                    .map(|(word, weight)| format!("{word:?} {weight:.2}"))
                    .collect();
                writeln!(w, "{:>3} {piece:?} ← {}", i + 1, words.join(", "))?;
            }
        }
    }
    w.flush()?;
    Ok(())
}

/// Each generated token's [`EXPLAIN_TOP`] most attended tokens (the prompt's pieces, then the
/// generated ones), strongest first; ties keep the earlier token first.
fn explain(prompt: &[String], pieces: &[String], rows: &[Vec<f32>]) -> Vec<Vec<(String, f32)>> {
    let words: Vec<String> = prompt.iter().chain(pieces).cloned().collect();
    rows.iter()
        .map(|row| {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            order
                .into_iter()
                .take(EXPLAIN_TOP)
                .map(|j| (words[j].clone(), row[j]))
                .collect()
        })
        .collect()
}
