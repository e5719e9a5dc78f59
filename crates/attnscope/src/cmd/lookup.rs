//! `attnscope lookup`: attention as a soft database lookup (the notes' Paris/London/Tokyo
//! example) over real sentence embeddings: the query is matched to each key by cosine
//! similarity, scaled by a temperature, softmaxed, and the values are mixed by those weights.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use attn_viz::bars::{self, BarStyle, display_width, pad_end, printable};
use attn_viz::lookup::{DEFAULT_TEMPERATURE, Lookup, MIN_TEMPERATURE, soft_lookup};

use super::attention::read_text_file;
use crate::maps::{ColorChoice, ModelArgs};

#[derive(clap::Args)]
#[command(after_help = "Example:
  attnscope lookup --query \"Where is the Eiffel Tower?\" \\
    --entry \"Paris=Capital of France, home to Eiffel Tower\" \\
    --entry \"London=Capital of UK, home to Big Ben\" \\
    --entry \"Tokyo=Capital of Japan, largest city\"")]
pub struct Args {
    /// What to look up.
    #[arg(long, value_name = "TEXT")]
    pub query: String,
    /// One database entry, KEY=VALUE (repeatable).
    #[arg(long = "entry", value_name = "KEY=VALUE")]
    pub entries: Vec<String>,
    /// A file of entries, one KEY=VALUE a line (blank lines and lines starting with # skipped).
    #[arg(long = "entries", value_name = "FILE")]
    pub entries_file: Option<PathBuf>,
    /// Softmax temperature: weights = softmax(cosine / T)
    ///
    /// Softmax temperature: weights = softmax(cosine / T). The default, 0.05, is the scale
    /// all-MiniLM-L6-v2 was trained with.
    #[arg(long, value_name = "T", default_value_t = DEFAULT_TEMPERATURE)]
    pub temperature: f32,
    /// Cut a query or key longer than the model embeds instead of refusing it.
    #[arg(long)]
    pub truncate: bool,
    /// Print JSON instead of bars.
    #[arg(long)]
    pub json: bool,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    #[command(flatten)]
    pub model: ModelArgs,
}

/// One `key=value` entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
struct Entry {
    key: String,
    value: String,
}

#[derive(serde::Serialize)]
struct Report<'a> {
    model: &'a str,
    query: &'a str,
    temperature: f32,
    entries: Vec<Scored<'a>>,
}

#[derive(serde::Serialize)]
struct Scored<'a> {
    key: &'a str,
    value: &'a str,
    cosine: f32,
    scaled: f32,
    weight: f32,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Each entry, and where it was given (for errors about it).
    let mut entries = Vec::new();
    let mut sources = Vec::new();
    for (n, raw) in args.entries.iter().enumerate() {
        let source = format!("--entry #{}", n + 1);
        entries.push(parse_entry(raw).with_context(|| source.clone())?);
        sources.push(source);
    }
    if let Some(path) = &args.entries_file {
        for (line, entry) in read_entries(path)? {
            entries.push(entry);
            sources.push(format!("{}, line {line}", path.display()));
        }
    }
    if entries.is_empty() {
        anyhow::bail!(
            "no entries to look up: give --entry KEY=VALUE (repeatable) or --entries FILE"
        );
    }
    // Two entries with one key would be two rows of the same label, and the same score.
    let mut first = std::collections::HashMap::new();
    for (entry, source) in entries.iter().zip(&sources) {
        if let Some(earlier) = first.insert(entry.key.as_str(), source) {
            anyhow::bail!(
                "{source}: the key {:?} is given twice (first at {earlier})",
                entry.key
            );
        }
    }
    if args.query.trim().is_empty() {
        anyhow::bail!("the --query is empty");
    }
    if !args.temperature.is_finite() {
        anyhow::bail!(
            "--temperature must be a finite number above 0; got {:?}",
            args.temperature
        );
    }
    if args.temperature < MIN_TEMPERATURE {
        let why = if args.temperature > 0.0 {
            " (smaller ones overflow cosine / temperature)"
        } else {
            ": a small one, such as 0.01, puts nearly all the weight on the best match; a large \
             one spreads it evenly"
        };
        anyhow::bail!(
            "--temperature must be above 0, at least {MIN_TEMPERATURE:.2e}{why}; got {:?}",
            args.temperature
        );
    }
    let model = args.model.load()?;
    let mut texts: Vec<&str> = vec![args.query.as_str()];
    texts.extend(entries.iter().map(|e| e.key.as_str()));
    let embeddings = model.embed_with(&texts, args.truncate).map_err(|e| {
        let what = match e.text() {
            Some(0) => "the --query".to_string(),
            Some(i) => format!(
                "the key of {} ({})",
                sources[i - 1],
                opening(&entries[i - 1].key)
            ),
            None => "the query and keys".to_string(),
        };
        anyhow::Error::new(e).context(format!("embedding {what}"))
    })?;
    if args.truncate {
        super::embed::note_truncated(&model, &texts, |i| match i {
            0 => "the --query".to_string(),
            i => format!("the key of {}", sources[i - 1]),
        });
    }
    let lookup = soft_lookup(&embeddings[0], &embeddings[1..], args.temperature)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = Report {
            model: model.name(),
            query: &args.query,
            temperature: args.temperature,
            entries: entries
                .iter()
                .enumerate()
                .map(|(i, e)| Scored {
                    key: &e.key,
                    value: &e.value,
                    cosine: lookup.cosine[i],
                    scaled: lookup.scaled[i],
                    weight: lookup.weights[i],
                })
                .collect(),
        };
        serde_json::to_writer_pretty(&mut out, &report).context("writing JSON")?;
        writeln!(out)?;
    } else {
        let colour = args.color.enabled();
        let text = render(
            &args.query,
            model.name(),
            args.temperature,
            &entries,
            &lookup,
            colour,
        );
        out.write_all(text.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

fn render(
    query: &str,
    model: &str,
    temperature: f32,
    entries: &[Entry],
    lookup: &Lookup,
    colour: bool,
) -> String {
    // Keys as the terminal may show them: control characters escaped.
    let keys: Vec<String> = entries
        .iter()
        .map(|e| printable(&e.key).into_owned())
        .collect();
    let width = keys
        .iter()
        .map(|k| display_width(k))
        .max()
        .unwrap_or(0)
        .max(8);
    let mut s = format!("Query: {query:?}  ({model}, temperature {temperature})\n\n");
    s.push_str(
        "Step 1: match the query to each key (cosine similarity of sentence embeddings), divided \
         by the temperature as attention divides q·k by √d_k (lower is sharper)\n",
    );
    // Enough decimals for 3 or 4 significant digits (at temperature 10 the scores are 0.04).
    let largest = lookup.scaled.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let decimals = if largest >= 1.0 || largest == 0.0 {
        2
    } else {
        (3.0 - largest.log10().floor()).clamp(2.0, 6.0) as usize
    };
    for (key, (c, sc)) in keys.iter().zip(lookup.cosine.iter().zip(&lookup.scaled)) {
        s.push_str(&format!(
            "  {} {c:>7.4}   / {temperature} = {sc:>7.decimals$}\n",
            pad_end(key, width)
        ));
    }
    s.push_str("\nStep 2: softmax to get attention weights\n");
    let rows: Vec<(String, f32)> = keys
        .iter()
        .zip(&lookup.weights)
        .map(|(key, &w)| (key.clone(), w))
        .collect();
    let heavy = bars::heavy(&lookup.weights);
    s.push_str(&bars::render_bars(
        &rows,
        &heavy,
        BarStyle {
            colour,
            ..BarStyle::default()
        },
    ));
    s.push_str("\nStep 3: retrieve the weighted combination of values (ranked by weight)\n");
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| lookup.weights[b].total_cmp(&lookup.weights[a]));
    for &i in &order {
        s.push_str(&format!(
            "  {:.2} × {:?}  ({})\n",
            lookup.weights[i], entries[i].value, keys[i]
        ));
    }
    s.push_str(&verdict(entries, &lookup.weights, &order));
    s
}

/// The last line: the entry whose information the result mostly holds, when its weight is at
/// least [`DOMINANT`] times the next one's; else that none dominates (a tie, or a temperature
/// that evens the weights out).
fn verdict(entries: &[Entry], weights: &[f32], order: &[usize]) -> String {
    match order {
        [top] => format!("\nAll {:?} information!\n", entries[*top].key),
        [top, next, ..] if weights[*top] >= DOMINANT * weights[*next] => {
            format!("\nMostly {:?} information!\n", entries[*top].key)
        }
        [top, next, ..] => format!(
            "\nNo entry dominates: {:?} weighs {:.2}, {:?} {:.2} (a lower --temperature \
             sharpens the weights)\n",
            entries[*top].key, weights[*top], entries[*next].key, weights[*next]
        ),
        [] => String::new(),
    }
}

/// How many times the next entry's weight the top one's must be for the result to be "mostly"
/// its information.
const DOMINANT: f32 = 1.5;

/// `key=value`, split at the first `=`, both sides trimmed and non-empty.
fn parse_entry(raw: &str) -> anyhow::Result<Entry> {
    let (key, value) = raw
        .split_once('=')
        .with_context(|| format!("{raw:?} is not KEY=VALUE (no '=')"))?;
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() {
        anyhow::bail!("{raw:?} has an empty key");
    }
    if value.is_empty() {
        anyhow::bail!("{raw:?} has an empty value");
    }
    Ok(Entry {
        key: key.to_string(),
        value: value.to_string(),
    })
}

/// The first words of `text`, quoted, for an error about all of it: a 400,000-word key made a
/// 2 MB message.
fn opening(text: &str) -> String {
    const SHOWN: usize = 40;
    match text.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{:?}…", &text[..cut]),
        None => format!("{text:?}"),
    }
}

/// Entries of a file, one `key=value` a line, each with its line number (from 1). Read as
/// `--file` texts are ([`read_text_file`]: a byte-order mark is not part of the first line).
fn read_entries(path: &Path) -> anyhow::Result<Vec<(usize, Entry)>> {
    let text = read_text_file(path)?;
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let entry =
            parse_entry(line).with_context(|| format!("{}, line {}", path.display(), n + 1))?;
        entries.push((n + 1, entry));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_split_at_the_first_equals_sign() {
        let e = parse_entry(" Paris = Capital of France, a=b ").unwrap();
        assert_eq!(e.key, "Paris");
        assert_eq!(e.value, "Capital of France, a=b");
    }

    #[test]
    fn bad_entries_are_named() {
        for (raw, says) in [
            ("Paris", "no '='"),
            ("=Capital", "empty key"),
            ("Paris=  ", "empty value"),
        ] {
            let err = parse_entry(raw).unwrap_err().to_string();
            assert!(err.contains(says), "{raw:?}: {err}");
        }
    }

    #[test]
    fn entry_files_skip_blanks_and_comments_and_name_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.txt");
        std::fs::write(&good, "# cities\nParis=France\n\nTokyo=Japan\n").unwrap();
        let entries = read_entries(&good).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!((entries[1].0, entries[1].1.key.as_str()), (4, "Tokyo"));
        // A byte-order mark (Windows editors write one) made line 1 "\u{feff}# cities".
        let bom = dir.path().join("bom.txt");
        std::fs::write(&bom, "\u{feff}# cities\nParis=France\n").unwrap();
        assert_eq!(read_entries(&bom).unwrap()[0].1.key, "Paris");
        assert_eq!(opening(&"word ".repeat(1000)).chars().count(), 43);
        let bad = dir.path().join("bad.txt");
        std::fs::write(&bad, "Paris=France\nLondon\n").unwrap();
        let err = format!("{:#}", read_entries(&bad).unwrap_err());
        assert!(
            err.contains("line 2") && err.contains("\"London\""),
            "{err}"
        );
    }
}
