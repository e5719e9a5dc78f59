//! `attnscope embed`: sentence embeddings of a real model (mean pooling over real tokens, L2
//! normalised when its sentence-transformers config says so), as JSON or as a readable summary
//! with the texts' cosine similarities.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use attn_models::Model;

use super::attention::read_text_file;
use crate::maps::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    /// The texts to embed (or --file).
    #[arg(required_unless_present = "file")]
    pub texts: Vec<String>,
    /// Read the texts from this UTF-8 file, one per non-empty line ("-" reads standard input).
    #[arg(long, value_name = "FILE", conflicts_with = "texts")]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Cut texts longer than the model embeds instead of refusing them
    ///
    /// Cut texts longer than the model embeds (sentence-transformers' max_seq_length, else its
    /// positions) instead of refusing them, as sentence-transformers does.
    #[arg(long)]
    pub truncate: bool,
    /// Print the embeddings and their cosine similarities as JSON
    ///
    /// Print {"model", "texts", "embeddings": [[...], ...], "cosine": [[...], ...]} (the cosine
    /// similarity of every pair of texts).
    #[arg(long)]
    pub json: bool,
}

/// Says on stderr which of `texts` `--truncate` cut for an embedding, and how long each was,
/// text `i` named by `name(i)`.
pub(crate) fn note_truncated(model: &Model, texts: &[&str], name: impl Fn(usize) -> String) {
    for (i, text) in texts.iter().enumerate() {
        if let Some(e) = model.embed_too_long(text) {
            crate::note!(
                "note: --truncate: {}: {e}; its embedding is of the tokens that fit",
                name(i)
            );
        }
    }
}

/// Texts up to which the cosine similarities are printed as a table (12 columns fit 88
/// characters); past it, each text's most similar other text.
const TABLE_TEXTS: usize = 12;

pub fn run(args: Args) -> anyhow::Result<()> {
    // Each text, and its line number in --file.
    let (texts, lines): (Vec<String>, Vec<usize>) = match &args.file {
        Some(file) => read_text_file(file)?
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(n, l)| (l.to_string(), n + 1))
            .unzip(),
        None => (args.texts.clone(), Vec::new()),
    };
    if texts.is_empty() {
        bail!("no texts to embed");
    }
    // (--file skips blank lines; a blank TEXT is named by its place in the listing below.)
    if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
        bail!("text {i} is empty");
    }
    let model = args.model.load()?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let embeddings = model.embed_with(&refs, args.truncate).map_err(|e| {
        let what = match (e.text(), &args.file) {
            (Some(i), None) => format!("text {i}"),
            (Some(i), Some(file)) => format!("{}, line {}", file.display(), lines[i]),
            (None, _) => "the texts".to_string(),
        };
        anyhow::Error::new(e).context(format!("embedding {what}"))
    })?;
    if args.truncate {
        note_truncated(&model, &refs, |i| match &args.file {
            None => format!("text {i}"),
            Some(file) => format!("{}, line {}", file.display(), lines[i]),
        });
    }
    if !model.is_sentence_model() {
        crate::note!(
            "note: {} is not a sentence-transformers model (no modules.json): these are the mean of its \
             last hidden states over each text's tokens, as sentence-transformers pools a plain \
             checkpoint, not embeddings it was trained to make",
            model.name()
        );
    }
    let norm = |a: &[f32]| a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let cosine: Vec<Vec<f32>> = (embeddings.iter())
        .map(|a| {
            (embeddings.iter())
                .map(|b| {
                    let dot = a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
                    dot / (norm(a) * norm(b)).max(1e-12)
                })
                .collect()
        })
        .collect();
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let doc = serde_json::json!({
            "model": model.name(),
            "texts": texts,
            "embeddings": embeddings,
            "cosine": cosine,
        });
        serde_json::to_writer(&mut w, &doc)?;
        writeln!(w)?;
    } else {
        writeln!(
            w,
            "model {}, {} dimensions",
            model.name(),
            model.hidden_size()
        )?;
        for (i, (text, e)) in texts.iter().zip(&embeddings).enumerate() {
            let head: Vec<String> = e.iter().take(6).map(|v| format!("{v:+.4}")).collect();
            writeln!(w, "{i}: {text:?}\n   [{}, …]", head.join(", "))?;
        }
        if embeddings.len() > TABLE_TEXTS {
            // A table of thousands of columns helps no one: each text's nearest other text.
            writeln!(
                w,
                "\nmost similar other text, by cosine similarity (the whole table: --json)"
            )?;
            for (i, row) in cosine.iter().enumerate() {
                let (j, c) = (row.iter().enumerate())
                    .filter(|&(j, _)| j != i)
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .expect("more than one text");
                writeln!(w, "{i:>4} → {j:>4}  {c:.3}")?;
            }
        } else if embeddings.len() > 1 {
            writeln!(w, "\ncosine similarity (rows and columns: the texts above)")?;
            let header: Vec<String> = (0..cosine.len()).map(|j| format!("{j:>6}")).collect();
            writeln!(w, "    {}", header.join(" "))?;
            for (i, row) in cosine.iter().enumerate() {
                let row: Vec<String> = row.iter().map(|c| format!("{c:6.3}")).collect();
                writeln!(w, "{i:>3} {}", row.join(" "))?;
            }
        }
    }
    w.flush()?;
    Ok(())
}
