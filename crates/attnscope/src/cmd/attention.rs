//! `attnscope attention`: every layer's and head's attention of a real model for one text (or a
//! text pair), as JSON or as readable head-averaged tables.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::maps::ModelArgs;
use anyhow::{Context, bail};
use attn_models::{Encoding, Model, RunOptions, Seq2Seq};
use attn_viz::VizError;
use attn_viz::bars::{display_width, pad_start, truncate_to_width};

use crate::maps::name_the_flag;

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
pub struct Args {
    /// The text to look at (or --file).
    #[arg(required_unless_present = "file")]
    pub text: Option<String>,
    /// Read the text from this UTF-8 file instead ("-" reads standard input).
    #[arg(long, value_name = "FILE", conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// A second text, run as a sentence pair with TEXT
    ///
    /// A second text, run as a sentence pair with TEXT (an encoder's segment B; a causal model
    /// reads it after TEXT, which cannot see it).
    #[arg(long, value_name = "TEXT")]
    pub pair: Option<String>,
    /// An encoder-decoder model's target: the decoder reads it (teacher forcing)
    ///
    /// An encoder-decoder model's target (a translation of TEXT): the decoder reads the start
    /// token and the target's tokens, each row predicting the next; default: the model's own
    /// translation (beam search as its generation_config.json asks).
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["pair", "save_maps", "layer", "head"])]
    pub target: Option<String>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Cut a text longer than the model's positions instead of refusing it.
    #[arg(long)]
    pub truncate: bool,
    /// Print {"model", "tokens", "attentions": [layers][heads][T][T]} (row = query token).
    #[arg(long, conflicts_with_all = ["layer", "head"])]
    pub json: bool,
    /// Save the maps to this file instead of printing them (for --maps)
    ///
    /// Save the maps to this file instead of printing them, for `explain`, `heatmap`, `heads`
    /// and `html --maps FILE.json` (an `AttentionMaps`: the text, its tokens with their spans,
    /// every layer's and head's weights).
    #[arg(long, value_name = "FILE.json", conflicts_with_all = ["json", "layer", "head"])]
    pub save_maps: Option<PathBuf>,
    /// Readable form: show this layer only (0-based) [default: every layer].
    #[arg(long, value_name = "L", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub layer: Option<usize>,
    /// Readable form: show this head instead of the average over heads (0-based).
    #[arg(long, value_name = "H", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub head: Option<usize>,
}

/// The most bytes a text file (or standard input) may hold: far more than any model reads
/// (512 tokens) or a lookup table needs, and a bound on what `/dev/zero` or an endless pipe
/// can make the command hold.
const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Reads a text file that must be UTF-8, without a leading byte-order mark, of at most
/// [`MAX_TEXT_BYTES`]; "-" is standard input.
pub(crate) fn read_text_file(path: &Path) -> anyhow::Result<String> {
    let stdin = path == Path::new("-");
    let name = if stdin {
        "standard input".to_string()
    } else {
        path.display().to_string()
    };
    let source: Box<dyn Read> = if stdin {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?)
    };
    let mut bytes = Vec::new();
    source
        .take(MAX_TEXT_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {name}"))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_TEXT_BYTES,
        "{name} holds more than {} MiB, the most attnscope reads as text",
        MAX_TEXT_BYTES >> 20
    );
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{name} is not valid UTF-8 (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })?;
    // A byte-order mark (Windows editors write one) is not part of the text.
    Ok(match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => read_text_file(file)?,
        (None, None) => bail!("give a TEXT or --file FILE"),
    };
    if let Some(path) = &args.save_maps {
        crate::maps::check_output(path)?;
    }
    if let Some(model) = args.model.load_seq2seq()? {
        return run_seq2seq(&args, &model, &text);
    }
    if args.target.is_some() {
        bail!(
            "--target is the target of an encoder-decoder model (BART, mBART, Marian, T5); this model reads one text"
        );
    }
    let model = args.model.load()?;
    if let Some(layer) = args.layer.filter(|&l| l >= model.n_layers()) {
        let n_layers = model.n_layers();
        return Err(name_the_flag(VizError::LayerOutOfRange { layer, n_layers }));
    }
    if let Some(head) = args.head.filter(|&h| h >= model.n_heads()) {
        let n_heads = model.n_heads();
        return Err(name_the_flag(VizError::HeadOutOfRange { head, n_heads }));
    }
    let pair = args.pair.as_deref();
    if let Some(path) = &args.save_maps {
        let maps = crate::maps::run_model(&model, &text, pair, args.truncate)?;
        let json = serde_json::to_vec(&maps).context("encoding the maps")?;
        std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
        crate::note!(
            "wrote {} ({} tokens, {} layers × {} heads)",
            path.display(),
            maps.tokens.len(),
            maps.n_layers,
            maps.n_heads
        );
        return Ok(());
    }
    let enc = crate::maps::encode(&model, &text, pair, args.truncate)?;
    let out = model.forward(
        &enc,
        &RunOptions {
            attentions: true,
            ..RunOptions::default()
        },
    )?;
    let Some(attentions) = out.attentions else {
        bail!("the model returned no attention weights");
    };
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if args.json {
        write_json(&mut w, &model, &enc, &attentions)?;
    } else {
        write_readable(&mut w, &model, &enc, &attentions, args.layer, args.head)?;
    }
    w.flush()?;
    Ok(())
}

/// `attention` on an encoder-decoder model: its three kinds of attention for the source
/// `text` and the target (`--target`, else the model's own translation).
fn run_seq2seq(args: &Args, model: &Seq2Seq, text: &str) -> anyhow::Result<()> {
    let pass = crate::maps::teacher_forced(model, text, args.target.as_deref(), args.truncate)?;
    if args.target.is_none() {
        crate::maps::note_own_translation(&pass.target);
    }
    let c = model.config();
    let (s, t) = (pass.source.len(), pass.decoder.len());
    let nest = |att: &[f32], heads: usize, rows: usize, cols: usize| -> Vec<Vec<Vec<Vec<f32>>>> {
        (att.chunks_exact(heads * rows * cols))
            .map(|l| {
                (l.chunks_exact(rows * cols))
                    .map(|h| h.chunks_exact(cols).map(<[f32]>::to_vec).collect())
                    .collect()
            })
            .collect()
    };
    let token = |id: u32| model.token(id).unwrap_or_default();
    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    if args.json {
        let out = &pass.output;
        let doc = serde_json::json!({
            "model": model.name(),
            "source_tokens": pass.source.iter().map(|&id| token(id)).collect::<Vec<_>>(),
            "decoder_tokens": pass.decoder.iter().map(|&id| token(id)).collect::<Vec<_>>(),
            "predicted_tokens": pass.labels.iter().map(|&id| token(id)).collect::<Vec<_>>(),
            "encoder_attentions": nest(&out.encoder_attentions, c.encoder_heads, s, s),
            "decoder_attentions": nest(&out.decoder_attentions, c.decoder_heads, t, t),
            "cross_attentions": nest(&out.cross_attentions, c.decoder_heads, t, s),
        });
        serde_json::to_writer(&mut w, &doc)?;
        writeln!(w)?;
    } else {
        writeln!(
            w,
            "model {} (encoder-decoder, {} + {} layers × {} heads): cross-attention of each \
             decoder row, {} layers × {} heads averaged, its three heaviest source tokens",
            model.name(),
            c.encoder_layers,
            c.decoder_layers,
            c.decoder_heads,
            c.decoder_layers,
            c.decoder_heads
        )?;
        let per = c.decoder_layers * c.decoder_heads;
        for (row, &label) in pass.labels.iter().enumerate() {
            let mut mean = vec![0.0f32; s];
            for block in pass.output.cross_attentions.chunks_exact(t * s) {
                for (m, &x) in mean.iter_mut().zip(&block[row * s..][..s]) {
                    *m += x / per as f32;
                }
            }
            let mut order: Vec<usize> = (0..s).collect();
            order.sort_by(|&a, &b| mean[b].total_cmp(&mean[a]));
            let top: Vec<String> = (order.iter().take(3))
                .map(|&j| format!("{} {:.2}", token(pass.source[j]), mean[j]))
                .collect();
            writeln!(w, "{row:>3} → {:<16} {}", token(label), top.join(", "))?;
        }
    }
    w.flush()?;
    Ok(())
}

fn write_json(
    w: &mut impl Write,
    model: &Model,
    enc: &Encoding,
    att: &[f32],
) -> anyhow::Result<()> {
    let t = enc.len();
    let attentions: Vec<Vec<Vec<&[f32]>>> = att
        .chunks_exact(model.n_heads() * t * t)
        .map(|layer| {
            layer
                .chunks_exact(t * t)
                .map(|head| head.chunks_exact(t).collect())
                .collect()
        })
        .collect();
    let doc = serde_json::json!({
        "model": model.name(),
        "tokens": enc.tokens,
        "attentions": attentions,
    });
    serde_json::to_writer(&mut *w, &doc)?;
    writeln!(w)?;
    Ok(())
}

fn write_readable(
    w: &mut impl Write,
    model: &Model,
    enc: &Encoding,
    att: &[f32],
    layer: Option<usize>,
    head: Option<usize>,
) -> anyhow::Result<()> {
    let (t, n_heads) = (enc.len(), model.n_heads());
    writeln!(
        w,
        "model {} ({:?}, {} layers × {} heads), {} tokens",
        model.name(),
        model.kind(),
        model.n_layers(),
        n_heads,
        t
    )?;
    let width = enc
        .tokens
        .iter()
        .map(|s| display_width(s))
        .max()
        .unwrap_or(1)
        .clamp(5, 16);
    let label = |s: &str| pad_start(truncate_to_width(s, width), width);
    // A causal model's keys after the query are masked: shown as such, not as a weight of 0.
    let causal = model.config().causal;
    let layers: Vec<usize> = match layer {
        Some(l) => vec![l],
        None => (0..model.n_layers()).collect(),
    };
    for l in layers {
        match head {
            Some(h) => writeln!(
                w,
                "\nlayer {l}, head {h} (row = query token, column = key token)"
            )?,
            None => writeln!(
                w,
                "\nlayer {l}, average over {n_heads} heads (row = query token, column = key token)"
            )?,
        }
        // Each row starts with its query's index and token; the header holds the keys' indices.
        let index_width = (t - 1).to_string().len();
        write!(w, "{:>1$} ", "", index_width + 1 + width)?;
        for j in 0..t {
            write!(w, " {:>5}", j)?;
        }
        writeln!(w)?;
        for i in 0..t {
            write!(w, "{i:>index_width$} {} ", label(&enc.tokens[i]))?;
            for j in 0..t {
                let at = |h: usize| att[((l * n_heads + h) * t + i) * t + j];
                let value = match head {
                    Some(h) => at(h),
                    None => (0..n_heads).map(at).sum::<f32>() / n_heads as f32,
                };
                match causal && j > i {
                    true => write!(w, " {:>5}", "-")?,
                    false => write!(w, " {value:5.2}")?,
                }
            }
            writeln!(w)?;
        }
    }
    if causal {
        writeln!(
            w,
            "\n-: masked (the model is causal: a query sees only the keys up to itself)"
        )?;
    }
    Ok(())
}
