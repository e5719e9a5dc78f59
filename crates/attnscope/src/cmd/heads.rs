//! `attnscope heads`: per-head statistics (entropy, [CLS]/[SEP] share, previous/next/self share,
//! mean distance) and the heads that stand out.

use std::io::Write;

use anyhow::Context;
use attn_viz::stats::{HeadStats, Notable, head_stats, notable_heads, special_columns_note};

use crate::maps::SourceArgs;

#[derive(clap::Args)]
#[command(after_help = "Example:
  attnscope heads \"The cat that ate the mouse that lived in the barn ran away\"")]
pub struct Args {
    /// The text to look at.
    #[arg(required_unless_present = "maps", conflicts_with = "maps")]
    pub text: Option<String>,
    /// A second text, run as a sentence pair with TEXT.
    #[arg(long, value_name = "TEXT", conflicts_with = "maps")]
    pub pair: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub source: SourceArgs,
}

#[derive(serde::Serialize)]
struct Report<'a> {
    model: &'a str,
    text: &'a str,
    pair: Option<&'a str>,
    tokens: usize,
    heads: &'a [HeadStats],
    notable: &'a [Notable],
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let maps = args
        .source
        .maps(args.text.as_deref(), args.pair.as_deref())?;
    let stats = head_stats(&maps)?;
    let notable = notable_heads(&stats);
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = Report {
            model: &maps.model,
            text: &maps.text,
            pair: maps.pair.as_deref(),
            tokens: maps.seq_len(),
            heads: &stats,
            notable: &notable,
        };
        serde_json::to_writer_pretty(&mut out, &report).context("writing JSON")?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} heads of {} on {} tokens (shares are means over query tokens):",
        stats.len(),
        maps.model,
        maps.seq_len()
    )?;
    writeln!(
        out,
        "layer head  entropy  [CLS]  [SEP]   prev   next   self  distance"
    )?;
    for s in &stats {
        writeln!(
            out,
            "{:>5} {:>4}  {:>7.3}  {:>5.2}  {:>5.2}  {:>5.2}  {:>5.2}  {:>5.2}  {:>8.2}",
            s.layer, s.head, s.entropy, s.cls, s.sep, s.previous, s.next, s.same, s.distance
        )?;
    }
    writeln!(out, "\nNotable heads:")?;
    for n in &notable {
        writeln!(
            out,
            "  layer {} head {} {} ({:.2})",
            n.layer, n.head, n.role, n.value
        )?;
    }
    writeln!(
        out,
        "entropy in nats (ln {} = {:.2} is uniform over all tokens); distance in tokens",
        maps.seq_len(),
        (maps.seq_len() as f32).ln()
    )?;
    if let Some(note) = special_columns_note(&maps.tokens) {
        writeln!(out, "{note}")?;
    }
    out.flush()?;
    Ok(())
}
