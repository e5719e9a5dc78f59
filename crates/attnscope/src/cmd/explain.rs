//! `attnscope explain`: which words a word attends to, as bars (the notes' main example).

use std::io::Write;

use anyhow::Context;
use attn_viz::AttentionMaps;
use attn_viz::bars::BarStyle;
use attn_viz::explain::{
    ExplainOptions, Level, Method, compare_grids, explain, head_grid, render, render_comparison,
    render_grid,
};
use attn_viz::select::Selection;

use crate::maps::{ColorChoice, SourceArgs, progress_bar};

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope explain \"The cat that ate the mouse that lived in the barn ran away\" --focus ran
  attnscope explain --question \"Where is the Eiffel Tower?\" --context \"The Eiffel Tower is located in Paris, France.\"
  attnscope explain \"I love machine learning\" --pair \"J'adore l'apprentissage automatique\" --focus apprentissage --across
  attnscope explain \"The cat sat on the mat\" --focus sat --layer 2 --head 5
  attnscope explain \"The cat that ate the mouse that lived in the barn ran away\" --focus ran --to cat")]
pub struct Args {
    /// The text to look at.
    #[arg(
        required_unless_present_any = ["question", "maps"],
        conflicts_with_all = ["question", "maps"]
    )]
    pub text: Option<String>,
    /// A second text, run as a sentence pair with TEXT
    ///
    /// A second text, run as a sentence pair with TEXT (an encoder's segment B; a causal model
    /// reads it after TEXT, which cannot see it).
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["question", "maps"])]
    pub pair: Option<String>,
    /// Show the attention from this question's words to --context's words.
    #[arg(
        long,
        value_name = "TEXT",
        requires = "context",
        conflicts_with = "maps"
    )]
    pub question: Option<String>,
    /// The context the question's words attend to (with --question).
    #[arg(long, value_name = "TEXT", requires = "question")]
    pub context: Option<String>,
    /// With --pair: show only the words of the other text
    ///
    /// With --pair: show only the words of the text the focus word is not in (e.g. which
    /// English words a French word attends to). The pair is one input to one model here: an
    /// encoder's self-attention across two texts, not a translation model's cross-attention.
    #[arg(long, conflicts_with = "question")]
    pub across: bool,
    /// The word to look from ("the#2": the second "the") [default: every word averaged]
    ///
    /// The word to look from ("the#2" for the second "the"); default: every word averaged. A
    /// word is as the model's tokenizer splits the text at spaces and punctuation: BERT reads
    /// "don't" as the words "don", "'" and "t" (an unknown word's error lists them).
    #[arg(long, value_name = "WORD")]
    pub focus: Option<String>,
    /// A word to look at: its weight from --focus in each layer and head (repeatable)
    ///
    /// A word to look at: print the weight from --focus (or every word averaged) to it in
    /// every layer and head, as a table, and name up to five heads that give it at least 1.5 ×
    /// even attention: where a relation between two words lives. A head whose words shown got
    /// under a quarter of its attention (the rest on [CLS]/[SEP], or the question's own words)
    /// is starred and not named. Give it again to compare words (`--to trophy --to suitcase`):
    /// one table each (with --json, an array of them), and for two words a table of their
    /// difference (text only: the JSON holds both tables), naming the heads that prefer each:
    /// they give it at least 1.5 × what they give the other, and at least 1.5 × its even
    /// attention.
    #[arg(long, value_name = "WORD", conflicts_with_all = ["layer", "head", "rollout", "flow", "top"])]
    pub to: Vec<String>,
    /// One layer (0-based), its heads averaged; default: every layer and head averaged.
    #[arg(long, value_name = "L", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub layer: Option<usize>,
    /// One head (0-based) of --layer.
    #[arg(long, value_name = "H", requires = "layer", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub head: Option<usize>,
    /// Attention rollout through every layer (Abnar & Zuidema 2020)
    ///
    /// Attention rollout through every layer (Abnar & Zuidema 2020): per layer the heads
    /// averaged, 0.5·A + 0.5·I for the residual, rows renormalised; layers multiplied from the
    /// input up.
    #[arg(long, conflicts_with_all = ["layer", "head"])]
    pub rollout: bool,
    /// Attention flow (max-flow through the layers, Abnar & Zuidema 2020); up to 64 tokens.
    #[arg(long, conflicts_with_all = ["layer", "head", "rollout"])]
    pub flow: bool,
    /// Bars of another measure than raw weights (as `attnscope attribute --method`)
    ///
    /// Bars of another measure than raw weights, as `attnscope attribute --method` gives them:
    /// norm, alti, rollout, flow, grad-input, ig, attn-grad (from --focus, else the model's
    /// default row; the gradient methods' target from --label, --token or --target-text).
    #[arg(long, value_enum, conflicts_with_all = ["to", "layer", "head", "rollout", "flow", "question", "across", "tokens", "top", "maps", "truncate"])]
    pub method: Option<crate::cmd::attribute::AttributionMethod>,
    #[command(flatten)]
    pub attribution: crate::cmd::attribute::TargetArgs,
    /// An encoder-decoder model's target: the bars of the decoder row that generates --focus
    ///
    /// An encoder-decoder model's target (a translation of TEXT), which the decoder reads:
    /// --focus names a word of it, and the bars are the cross-attention of the decoder row
    /// that generates that word over TEXT's words; default: the model's own translation.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["pair", "question", "maps", "method"])]
    pub target: Option<String>,
    /// An encoder-decoder model's attention to show: cross (decoder over the source), encoder,
    /// or decoder (its causal self-attention over the start token and the target).
    #[arg(long, value_enum, default_value_t = crate::maps::Seq2SeqAttention::Cross, conflicts_with_all = ["pair", "question", "maps", "method"])]
    pub attention: crate::maps::Seq2SeqAttention,
    /// Raw tokens instead of words.
    #[arg(long)]
    pub tokens: bool,
    /// Show special tokens ([CLS], [SEP]) instead of hiding them.
    #[arg(long)]
    pub special: bool,
    /// Only the K heaviest words, heaviest first [default: every word, in the text's order].
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..))]
    pub top: Option<u32>,
    /// Print JSON instead of bars.
    #[arg(long)]
    pub json: bool,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(method) = args.method {
        let text = args.text.context("--method needs a TEXT")?;
        return crate::cmd::attribute::run(crate::cmd::attribute::Args {
            text,
            pair: args.pair,
            method,
            position: None,
            focus: args.focus,
            target: args.attribution,
            json: args.json,
            special: args.special,
            color: args.color,
            model: args.source.model,
        });
    }
    // The tokenizer would call them "the text" and "the pair text".
    for (flag, value) in [("--question", &args.question), ("--context", &args.context)] {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            anyhow::bail!("{flag} is empty or only whitespace");
        }
    }
    let (text, pair) = match (&args.question, &args.context) {
        (Some(q), Some(c)) => (Some(q.as_str()), Some(c.as_str())),
        _ => (args.text.as_deref(), args.pair.as_deref()),
    };
    let selection = Selection::from_flags(args.layer, args.head, args.rollout)?;
    let options = ExplainOptions {
        method: if args.flow {
            Method::Flow
        } else {
            Method::Attention { selection }
        },
        level: if args.tokens {
            Level::Tokens
        } else {
            Level::Words
        },
        special: args.special,
        focus: args.focus.clone(),
        question: args.question.is_some(),
        across: args.across,
        top: args.top.map(|k| k as usize),
        ..ExplainOptions::default()
    };
    let seq2seq = match (&args.source.maps, text) {
        (None, Some(_)) => args.source.model.load_seq2seq()?,
        _ => None,
    };
    if seq2seq.is_none() && args.target.is_some() {
        anyhow::bail!(
            "--target is the target of an encoder-decoder model (BART, mBART, Marian, T5); this model reads one text"
        );
    }
    if let (Some(model), Some(text)) = (&seq2seq, text) {
        anyhow::ensure!(
            !args.rollout && !args.flow,
            "--rollout and --flow go through one stack's layers: an encoder-decoder model's \
             cross-attention has none to go through"
        );
        let maps = crate::maps::seq2seq_maps(
            model,
            (text, args.target.as_deref()),
            args.attention,
            args.source.truncate,
        )?;
        let cross = args.attention == crate::maps::Seq2SeqAttention::Cross;
        let target = maps.pair.clone().unwrap_or_default();
        let ask = format!(
            "give --focus WORD, a word of the target ({target:?}): the bars are the \
             cross-attention of the decoder row that generates it (--attention encoder looks \
             from the source's words)"
        );
        anyhow::ensure!(!cross || args.focus.is_some(), "{ask}");
        let options = ExplainOptions {
            across: cross,
            focus_segment: cross.then_some(1),
            ..options
        };
        if let Err(e) = attn_viz::explain::query_rows(&maps, &options) {
            let anywhere = ExplainOptions {
                focus_segment: None,
                ..options.clone()
            };
            anyhow::ensure!(
                attn_viz::explain::query_rows(&maps, &anywhere).is_err(),
                "--focus {:?} is a word of the source: {ask}",
                args.focus.as_deref().unwrap_or_default()
            );
            return Err(crate::maps::name_the_flag(e));
        }
        return show(&args, &maps, &options);
    }
    // Only the rows the bars read: a long prompt's every row would not fit in memory.
    let maps = match (&args.source.maps, text) {
        (None, Some(text)) => {
            let model = args.source.model.load()?;
            crate::maps::run_model_rows(&model, (text, pair), args.source.truncate, |header| {
                attn_viz::explain::query_rows(header, &options).map_err(crate::maps::name_the_flag)
            })?
        }
        _ => args.source.maps(text, pair)?,
    };
    show(&args, &maps, &options)
}

/// The bars of `maps` as `options` asks (or `--to`'s tables), printed.
fn show(args: &Args, maps: &AttentionMaps, options: &ExplainOptions) -> anyhow::Result<()> {
    if !args.to.is_empty() {
        let grids = (args.to.iter())
            .map(|to| head_grid(maps, options, to).map_err(crate::maps::name_the_flag))
            .collect::<anyhow::Result<Vec<_>>>()?;
        for i in 0..grids.len() {
            for j in i + 1..grids.len() {
                if grids[i].to == grids[j].to {
                    anyhow::bail!(
                        "--to {:?} and --to {:?} are the same word ({:?}): give each word once",
                        args.to[i],
                        args.to[j],
                        grids[i].to
                    );
                }
            }
        }
        // Two words: which heads prefer which, after their tables.
        let comparison = match &grids[..] {
            [a, b] => Some(compare_grids(a, b)?),
            _ => None,
        };
        return print(args, &grids, |style| {
            let mut tables: Vec<String> = grids.iter().map(|g| render_grid(g, style)).collect();
            tables.extend(comparison.map(|c| render_comparison(&c, style)));
            tables.join("\n")
        });
    }
    let bar = if args.flow {
        progress_bar(0, "attention flow")
    } else {
        None
    };
    let explanation = explain(maps, options, |done, total| {
        if let Some(bar) = &bar {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
    })
    .map_err(crate::maps::name_the_flag)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    print(args, &explanation, |style| render(&explanation, style))
}

/// Prints `value` as JSON with `--json`, else as `text` renders it (in colour when asked).
fn print(
    args: &Args,
    value: &impl serde::Serialize,
    text: impl FnOnce(BarStyle) -> String,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, value).context("writing JSON")?;
        writeln!(out)?;
    } else {
        let style = BarStyle {
            colour: args.color.enabled(),
            ..BarStyle::default()
        };
        out.write_all(text(style).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}
