//! `attnscope heads`: per-head statistics (entropy, `[CLS]`/`[SEP]` share, previous/next/self
//! share, distance) and the heads that stand out.

use std::io::Write;

use anyhow::Context;
use attn_viz::stats::{
    HeadStats, Leading, Notable, Shares, has_special_tokens, head_stats, notable_heads,
    sees_only_earlier_keys, special_columns_note, uniform_shares,
};

use crate::maps::SourceArgs;

#[derive(clap::Args)]
#[command(
    after_help = "Columns, each a mean over the query tokens ([CLS]/[SEP] included), on raw tokens:
  entropy   -Σ w·ln w of a query's weights, in nats
  [CLS]     the weight on [CLS] (without special tokens, as on GPT-2: on the first token;
            on a Llama-style decoder \"sink\": on its first token, the attention sink)
  [SEP]     the weight on every other special token
  prev      the weight on the token before (queries 1..T), next on the token after (0..T-1)
  self      the weight on the query token itself
  distance  how far the attention travels: Σ w·|i − j| in tokens over the keys other than
            [CLS]/[SEP] (what a head parks there travels 0)
The row 'even' gives the same figures for attention spread evenly over the keys each query sees.

Example:
  attnscope heads \"The cat that ate the mouse that lived in the barn ran away\""
)]
pub struct Args {
    /// The text to look at.
    #[arg(required_unless_present = "maps", conflicts_with = "maps")]
    pub text: Option<String>,
    /// A second text, run as a sentence pair with TEXT
    ///
    /// A second text, run as a sentence pair with TEXT (an encoder's segment B; a causal model
    /// reads it after TEXT, which cannot see it).
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
    /// What each head's `cls` figure is the share of: `cls`, `first` or `sink`.
    leading: Leading,
    heads: &'a [HeadStats],
    /// The figures of even attention over the keys each query sees.
    uniform: Shares,
    notable: &'a [Notable],
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let maps = args
        .source
        .maps(args.text.as_deref(), args.pair.as_deref())?;
    let stats = head_stats(&maps)?;
    let uniform = uniform_shares(&maps)?;
    let specials = has_special_tokens(&maps);
    let leading = Leading::of(&maps);
    let notable = notable_heads(&stats, &uniform, leading);
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = Report {
            model: &maps.model,
            text: &maps.text,
            pair: maps.pair.as_deref(),
            tokens: maps.seq_len(),
            leading,
            heads: &stats,
            uniform,
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
    // Without [CLS]/[SEP] (GPT-2) the first column is the first token's share, the sink of
    // attention such models do not need.
    // and there is no [SEP] column (it would be 0 throughout; JSON keeps its field).
    // A decoder's sink is often its only special token: no [SEP] column of zeros then.
    let sep_column = maps.tokens.iter().skip(1).any(|t| t.special) || leading == Leading::Cls;
    let (first, sep) = match sep_column {
        true => (leading.label(), "  [SEP]"),
        false => (leading.label(), ""),
    };
    writeln!(
        out,
        "layer head  entropy  {first:>5}{sep}   prev   next   self  distance"
    )?;
    // A causal model's next token is masked: "-", not a share of 0.00 (JSON keeps the 0).
    let causal = sees_only_earlier_keys(&maps);
    let row = |label: &str, s: &Shares| {
        let sep = match sep_column {
            true => format!("  {:>5.2}", s.sep),
            false => String::new(),
        };
        let next = match causal {
            true => format!("{:>5}", "-"),
            false => format!("{:>5.2}", s.next),
        };
        format!(
            "{label:>10}  {:>7.3}  {:>5.2}{sep}  {:>5.2}  {next}  {:>5.2}  {:>8.2}",
            s.entropy, s.cls, s.previous, s.same, s.distance
        )
    };
    for s in &stats {
        let label = format!("{:>5} {:>4}", s.layer, s.head);
        writeln!(out, "{}", row(&label, &s.shares))?;
    }
    writeln!(out, "{}", row("even", &uniform))?;
    writeln!(out, "\nNotable heads:")?;
    if notable.is_empty() {
        writeln!(
            out,
            "  none: every head's figures are close to even attention's"
        )?;
    }
    for n in &notable {
        let unit = if n.unit.is_empty() { "" } else { " " };
        writeln!(
            out,
            "  layer {} head {} {} ({} {:.2}{unit}{})",
            n.layer, n.head, n.role, n.measure, n.value, n.unit
        )?;
    }
    let n = maps.seq_len();
    writeln!(
        out,
        "even: every query's attention spread evenly over the keys it sees{}; entropy in nats \
         (ln {n} = {:.2} is even over all tokens); distance: how far a query's attention travels, \
         Σ weight × |i − j| in tokens over the keys other than {} (what a head parks there \
         travels 0){}",
        if causal && n > 1 {
            " (here: itself and the tokens before it)"
        } else {
            ""
        },
        (n as f32).ln(),
        match (leading, specials) {
            (Leading::Sink, _) => "the sink and the other special tokens",
            (_, true) => "[CLS]/[SEP]",
            (_, false) => "the first token",
        },
        if causal {
            "; next: - (masked: a causal model's query cannot see the token after it)"
        } else {
            ""
        }
    )?;
    if leading == Leading::Sink {
        let others: Vec<&str> = (maps.tokens.iter().skip(1))
            .filter(|t| t.special)
            .map(|t| t.text.as_str())
            .collect();
        writeln!(
            out,
            "note: sink is the first token ({:?}), where a decoder's heads park the attention \
             they do not need (an attention sink; the row even gives its share under even \
             attention){}",
            maps.tokens[0].text,
            match others.is_empty() {
                true => String::new(),
                false => format!("; [SEP] every other special token ({})", others.join(", ")),
            }
        )?;
    } else if let Some(note) = special_columns_note(&maps.tokens) {
        writeln!(out, "{note}")?;
    }
    out.flush()?;
    Ok(())
}
