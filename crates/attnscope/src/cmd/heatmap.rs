//! `attnscope heatmap`: the attention matrix as a PNG or SVG picture, or every layer × head as
//! small multiples (`--grid`).

use std::path::PathBuf;

use anyhow::Context;

use attn_viz::AttentionMaps;
use attn_viz::heatmap::{Heatmap, ImageFormat, Panel, write_grid, write_heatmap};
use attn_viz::select::{Selection, select};
use attn_viz::words::{self, Unit, keep_and_renormalise, merge_matrix};

use crate::maps::{SourceArgs, check_output, progress_bar};

#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope heatmap \"The cat sat on the mat\" -o cat.png
  attnscope heatmap \"The cat sat on the mat\" -o heads.svg --grid")]
pub struct Args {
    /// The text to look at.
    #[arg(required_unless_present = "maps", conflicts_with = "maps")]
    pub text: Option<String>,
    /// A second text, run as a sentence pair with TEXT.
    #[arg(long, value_name = "TEXT", conflicts_with = "maps")]
    pub pair: Option<String>,
    /// The picture to write: FILE.png or FILE.svg.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// One layer (0-based), its heads averaged; default: every layer and head averaged.
    #[arg(long, value_name = "L")]
    pub layer: Option<usize>,
    /// One head (0-based) of --layer.
    #[arg(long, value_name = "H", requires = "layer")]
    pub head: Option<usize>,
    /// Attention rollout through every layer (as `explain --rollout`: heads averaged,
    /// 0.5·A + 0.5·I, rows renormalised, layers multiplied from the input up).
    #[arg(long, conflicts_with_all = ["layer", "head"])]
    pub rollout: bool,
    /// Every layer × head as small multiples in one picture.
    #[arg(long, conflicts_with_all = ["layer", "head", "rollout"])]
    pub grid: bool,
    /// Raw tokens instead of words.
    #[arg(long)]
    pub tokens: bool,
    /// Show special tokens ([CLS], [SEP]) instead of hiding them.
    #[arg(long)]
    pub special: bool,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    ImageFormat::from_path(&args.output)?;
    check_output(&args.output)?;
    let maps = args
        .source
        .maps(args.text.as_deref(), args.pair.as_deref())?;
    let units = if args.tokens {
        words::tokens(&maps)
    } else {
        words::words(&maps)?
    };
    let shown: Vec<usize> = (0..units.len())
        .filter(|&u| args.special || !units[u].special)
        .collect();
    if shown.is_empty() {
        anyhow::bail!("nothing to draw: the input has only special tokens (--special shows them)");
    }
    let labels: Vec<String> = shown.iter().map(|&u| units[u].label.clone()).collect();
    let view = View {
        maps: &maps,
        units: &units,
        shown: &shown,
    };
    let level = if args.tokens { "tokens" } else { "words" };
    // The special tokens hidden, as this model writes them ("[CLS]/[SEP]", "<|endoftext|>").
    let specials = match args.special {
        true => String::new(),
        false => words::special_labels(&units),
    };
    let hidden = if specials.is_empty() {
        String::new()
    } else {
        format!(", {specials} hidden, rows renormalised")
    };
    if args.grid {
        let bar = progress_bar((maps.n_layers * maps.n_heads) as u64, "heads");
        let mut panels = Vec::with_capacity(maps.n_layers * maps.n_heads);
        for layer in 0..maps.n_layers {
            for head in 0..maps.n_heads {
                panels.push(Panel {
                    title: format!("L{layer} H{head}"),
                    matrix: view.merge(maps.head(layer, head)?),
                });
                if let Some(bar) = &bar {
                    bar.inc(1);
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        let title = format!(
            "{} — every layer (row) × head (column) — {} — {level}{hidden}",
            short(&maps.text),
            maps.model
        );
        write_grid(&args.output, &title, shown.len(), maps.n_heads, &panels).with_context(
            || {
                format!(
                    "--grid of {} layers × {} heads (--layer L --head H draws one)",
                    maps.n_layers, maps.n_heads
                )
            },
        )?;
    } else {
        let selection = match (args.layer, args.head) {
            (Some(layer), Some(head)) => Selection::Head { layer, head },
            (Some(layer), None) => Selection::Layer { layer },
            _ if args.rollout => Selection::Rollout,
            _ => Selection::All,
        };
        let selected = select(&maps, selection).map_err(crate::maps::name_the_flag)?;
        let matrix = view.merge(&selected);
        let title = format!(
            "{} — {} — {} — {level}{hidden}",
            short(&maps.text),
            selection.describe(&maps),
            maps.model
        );
        write_heatmap(
            &args.output,
            &Heatmap {
                title: &title,
                labels: &labels,
                matrix: &matrix,
            },
        )?;
    }
    crate::note!("wrote {}", args.output.display());
    Ok(())
}

/// The units a picture shows.
struct View<'a> {
    maps: &'a AttentionMaps,
    units: &'a [Unit],
    shown: &'a [usize],
}

impl View<'_> {
    /// A token matrix merged into units, the shown ones kept, rows renormalised.
    ///
    /// # Shapes
    /// `tokens: [T, T]` → `[S, S]` with `S = shown.len()`.
    fn merge(&self, tokens: &[f32]) -> Vec<f32> {
        let merged = merge_matrix(tokens, self.maps.seq_len(), self.units);
        keep_and_renormalise(&merged, self.units.len(), self.shown)
    }
}

/// The text for a title: one line, cut at 60 characters.
fn short(text: &str) -> String {
    // One line, without the invisible characters labels leave out, and without the title's
    // own separator (" — " starts a new title piece).
    let text = attn_viz::words::without_hidden(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" — ", " – ");
    if text.chars().count() > 60 {
        format!("\"{}…\"", text.chars().take(59).collect::<String>())
    } else {
        format!("\"{text}\"")
    }
}
