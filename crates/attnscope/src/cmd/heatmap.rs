//! `attnscope heatmap`: the attention matrix as a PNG or SVG picture, or every layer × head as
//! small multiples (`--grid`).

use std::path::PathBuf;

use anyhow::Context;

use attn_viz::AttentionMaps;
use attn_viz::explain::heads_row;
use attn_viz::heatmap::{
    Heatmap, ImageFormat, Marks, Panel, missing_glyphs, write_grid, write_heatmap,
};
use attn_viz::select::{Selection, select};
use attn_viz::stats::sees_only_earlier_keys;
use attn_viz::words::{self, Unit, keep_and_renormalise, merge_matrix};

use crate::cmd::{RowRange, parse_rows};
use crate::maps::{Seq2SeqAttention, SourceArgs, check_output, progress_bar};

// The fields' docs are --help text, where [CLS] is a token, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope heatmap \"The cat sat on the mat\" -o cat.png
  attnscope heatmap \"The cat sat on the mat\" -o heads.svg --grid
  attnscope heatmap \"$(cat long-prompt.txt)\" --model Qwen/Qwen2.5-0.5B --rows -8.. -o last.png
  attnscope heatmap \"I love machine learning\" --target \"J'adore l'apprentissage automatique\" \
    --model Helsinki-NLP/opus-mt-en-fr -o cross.png")]
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
    /// An encoder-decoder model's target (a translation of TEXT); default: its own translation
    ///
    /// An encoder-decoder model's target (a translation of TEXT), which the decoder reads;
    /// default: the model's own translation. The cross-attention is drawn with the target's
    /// tokens down (row t: the decoder row that predicts target token t) and the source's
    /// across.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["pair", "maps", "method", "grid", "rollout"])]
    pub target: Option<String>,
    /// An encoder-decoder model's attention to draw: cross, encoder or decoder
    #[arg(long, value_enum, default_value_t = Seq2SeqAttention::Cross, conflicts_with_all = ["pair", "maps", "method", "grid", "rollout"])]
    pub attention: Seq2SeqAttention,
    /// The picture to write: FILE.png or FILE.svg.
    #[arg(short, long, value_name = "FILE")]
    pub output: PathBuf,
    /// One layer (0-based), its heads averaged; default: every layer and head averaged.
    #[arg(long, value_name = "L", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub layer: Option<usize>,
    /// One head (0-based) of --layer.
    #[arg(long, value_name = "H", requires = "layer", value_parser = crate::cmd::index, allow_negative_numbers = true)]
    pub head: Option<usize>,
    /// Attention rollout through every layer (as `explain --rollout`)
    ///
    /// Attention rollout through every layer (as `explain --rollout`: heads averaged,
    /// 0.5·A + 0.5·I, rows renormalised, layers multiplied from the input up).
    #[arg(long, conflicts_with_all = ["layer", "head"])]
    pub rollout: bool,
    /// Every layer × head as small multiples in one picture.
    #[arg(long, conflicts_with_all = ["layer", "head", "rollout"])]
    pub grid: bool,
    /// Only these rows, each over every word: START..END of the words shown (END excluded;
    /// negative: from the end)
    ///
    /// Only these rows (queries), each over every word: START..END of the words shown (of the
    /// tokens with --tokens), 0-based, END excluded, either one left out for the start or the
    /// end, a negative one counting from the end (-8.. is the last 8). The model computes only
    /// these rows' weights, so a prompt of thousands of tokens draws without the memory of its
    /// every row.
    #[arg(
        long,
        value_name = "START..END",
        allow_hyphen_values = true,
        value_parser = parse_rows,
        conflicts_with_all = ["grid", "rollout", "method", "target"]
    )]
    pub rows: Option<RowRange>,
    /// The matrix of another measure than raw weights: norm, alti, attn-grad, rollout, flow
    ///
    /// The matrix of another measure than raw weights, as `attnscope attribute --method`
    /// computes it: norm (the last layer's), alti and attn-grad (rolled out), rollout, flow
    /// (up to 64 tokens); rows renormalised as the picture shows them. The gradient methods'
    /// target comes from --label, --token or --target-text.
    #[arg(long, value_enum, conflicts_with_all = ["layer", "head", "rollout", "grid", "maps", "truncate"])]
    pub method: Option<crate::cmd::attribute::AttributionMethod>,
    #[command(flatten)]
    pub attribution: crate::cmd::attribute::TargetArgs,
    /// Raw tokens instead of words
    ///
    /// Raw tokens instead of words. A word's column is the sum of its tokens' columns, its row
    /// the mean of their rows (as `explain` shows it); with [CLS]/[SEP] hidden, each row is
    /// renormalised over the words shown.
    #[arg(long)]
    pub tokens: bool,
    /// Show special tokens ([CLS], [SEP]) instead of hiding them.
    #[arg(long)]
    pub special: bool,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_output(&args.output)?;
    let format = ImageFormat::from_path(&args.output)?;
    let seq2seq = match (&args.source.maps, &args.text) {
        (None, Some(_)) => args.source.model.load_seq2seq()?,
        _ => None,
    };
    if let (Some(model), Some(text)) = (&seq2seq, &args.text) {
        return run_seq2seq(&args, model, text);
    }
    if args.target.is_some() {
        anyhow::bail!(
            "--target is the target of an encoder-decoder model (BART, mBART, Marian, T5); this model reads one text"
        );
    }
    if let Some(range) = args.rows {
        return run_rows(&args, range);
    }
    let (maps, measured) = match args.method {
        Some(method) => {
            let text = args.text.as_deref().context("--method needs a TEXT")?;
            let (text, pair) = (text, args.pair.as_deref());
            let (maps, matrix) = crate::cmd::attribute::matrix(
                &args.source.model,
                (text, pair),
                method,
                &args.attribution,
            )?;
            (maps, Some((method, matrix)))
        }
        None => {
            let maps = (args.source).maps(args.text.as_deref(), args.pair.as_deref())?;
            (maps, None)
        }
    };
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
    if format == ImageFormat::Png {
        let missing = missing_glyphs(
            labels
                .iter()
                .map(String::as_str)
                .chain([maps.text.as_str()]),
        );
        if !missing.is_empty() {
            let some: String = missing.iter().take(8).collect();
            crate::note!(
                "note: the PNG's font (DejaVu Sans) has no glyph for {} character{} ({some}{}): they \
                 show as boxes; an SVG (-o FILE.svg) leaves them to the viewer's fonts",
                missing.len(),
                if missing.len() == 1 { "" } else { "s" },
                if missing.len() > 8 { "…" } else { "" }
            );
        }
    }
    // A causal model's masked cells are grey, and a line marks where the pair's text starts.
    let marks = Marks {
        causal: shown.len() > 1 && sees_only_earlier_keys(&maps),
        divider: shown
            .iter()
            .position(|&u| units[u].segment == 1)
            .filter(|&d| d > 0),
    };
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
    // What hiding them takes away: their share of the rows shown, on average.
    let hidden = |merged: Option<&[f32]>| match (specials.is_empty(), merged) {
        (true, _) => String::new(),
        (false, None) => format!(", {specials} hidden, rows renormalised"),
        (false, Some(merged)) => {
            let kept = view.kept_shares(merged);
            format!(
                ", {specials} hidden (they took {:.0}%), rows renormalised{}",
                100.0 * hidden_share(&kept),
                view.faint_rows(&kept)
            )
        }
    };
    let texts = match &maps.pair {
        Some(pair) => format!("{} + {}", short(&maps.text), short(pair)),
        None => short(&maps.text),
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
            "{texts} — every layer (row) × head (column) — {} — {level}{}",
            maps.model,
            hidden(None)
        );
        write_grid(
            &args.output,
            &title,
            shown.len(),
            maps.n_heads,
            &panels,
            marks,
        )
        .with_context(|| {
            format!(
                "--grid of {} layers × {} heads (--layer L --head H draws one)",
                maps.n_layers, maps.n_heads
            )
        })?;
    } else {
        let selection = Selection::from_flags(args.layer, args.head, args.rollout)?;
        let (selected, what) = match measured {
            Some((method, matrix)) => (matrix, method.describe().to_string()),
            None => {
                let selected = select(&maps, selection).map_err(crate::maps::name_the_flag)?;
                (selected, selection.describe(&maps))
            }
        };
        // Merged once: the picture keeps the shown units, the title weighs the hidden ones.
        let merged = view.units_of(&selected);
        let matrix = view.keep(&merged);
        let title = format!(
            "{texts} — {what} — {} — {level}{}",
            maps.model,
            hidden(Some(&merged))
        );
        write_heatmap(
            &args.output,
            &Heatmap {
                title: &title,
                labels: &labels,
                columns: None,
                matrix: &matrix,
                marks,
            },
        )?;
    }
    crate::note!("wrote {}", args.output.display());
    Ok(())
}

/// `heatmap --rows`: the chosen rows of the shown units over every shown unit, from a model run
/// that computes those rows' weights alone (or from saved maps).
fn run_rows(args: &Args, range: RowRange) -> anyhow::Result<()> {
    let units_of = |maps: &AttentionMaps| -> anyhow::Result<Vec<Unit>> {
        Ok(match args.tokens {
            true => words::tokens(maps),
            false => words::words(maps)?,
        })
    };
    let shown_of = |units: &[Unit]| -> Vec<usize> {
        (0..units.len())
            .filter(|&u| args.special || !units[u].special)
            .collect()
    };
    let chosen = |maps: &AttentionMaps| -> anyhow::Result<(Vec<Unit>, Vec<usize>, Vec<usize>)> {
        let units = units_of(maps)?;
        let shown = shown_of(&units);
        let rows = range
            .resolve(shown.len(), "shown")
            .map_err(anyhow::Error::msg)?;
        let rows = shown[rows].to_vec();
        Ok((units, shown, rows))
    };
    let maps = match (&args.source.maps, &args.text) {
        (None, Some(text)) => {
            let model = args.source.model.load()?;
            let (text, pair) = (text.as_str(), args.pair.as_deref());
            crate::maps::run_model_rows(&model, (text, pair), args.source.truncate, |header| {
                let (units, _, rows) = chosen(header)?;
                let mut tokens: Vec<usize> = (rows.iter())
                    .flat_map(|&u| units[u].tokens.iter().copied())
                    .collect();
                tokens.sort_unstable();
                Ok(tokens)
            })?
        }
        _ => args
            .source
            .maps(args.text.as_deref(), args.pair.as_deref())?,
    };
    let (units, shown, rows) = chosen(&maps)?;
    let selection = Selection::from_flags(args.layer, args.head, false)?;
    selection.check(&maps).map_err(crate::maps::name_the_flag)?;
    let heads = selection.heads(&maps);
    let mut matrix = Vec::with_capacity(rows.len() * shown.len());
    let mut kept = Vec::with_capacity(rows.len());
    for &u in &rows {
        // The unit's row: the mean of its tokens' rows, each the chosen heads' mean.
        let tokens = &units[u].tokens;
        let from: Vec<(usize, f64)> = (tokens.iter())
            .map(|&i| (i, 1.0 / tokens.len() as f64))
            .collect();
        let row = heads_row(&maps, &heads, &from).map_err(crate::maps::name_the_flag)?;
        let merged = words::row_to_units(&row, &units);
        let row: Vec<f32> = shown.iter().map(|&j| merged[j]).collect();
        let total: f32 = merged.iter().sum();
        kept.push((
            u,
            (row.iter().sum::<f32>() / total.max(f32::MIN_POSITIVE)).min(1.0),
        ));
        matrix.extend(words::renormalised(&row));
    }
    let label = |u: &usize| units[*u].label.clone();
    let (row_labels, labels): (Vec<String>, Vec<String>) = (
        rows.iter().map(label).collect(),
        shown.iter().map(label).collect(),
    );
    let view = View {
        maps: &maps,
        units: &units,
        shown: &shown,
    };
    let specials = match args.special {
        true => String::new(),
        false => words::special_labels(&units),
    };
    let hidden = match specials.is_empty() {
        true => String::new(),
        false => format!(
            ", {specials} hidden (they took {:.0}%), rows renormalised{}",
            100.0 * hidden_share(&kept),
            view.faint_rows(&kept)
        ),
    };
    let first = shown.iter().position(|&s| s == rows[0]).unwrap_or(0);
    let title = format!(
        "{} — {} rows ({}..{} of {}) — {} — {} — {}{hidden}",
        short(&maps.text),
        if args.tokens { "token" } else { "word" },
        first,
        first + rows.len(),
        shown.len(),
        selection.describe(&maps),
        maps.model,
        if args.tokens { "tokens" } else { "words" },
    );
    write_heatmap(
        &args.output,
        &Heatmap {
            title: &title,
            labels: &row_labels,
            columns: Some(&labels),
            matrix: &matrix,
            marks: Marks::default(),
        },
    )?;
    crate::note!("wrote {}", args.output.display());
    Ok(())
}

/// `heatmap` on an encoder-decoder model: one kind of its attention on `text` and the target
/// (`--target`, else its own translation), token by token, special tokens included.
fn run_seq2seq(args: &Args, model: &attn_models::Seq2Seq, text: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.grid
            && !args.rollout
            && args.method.is_none()
            && args.pair.is_none()
            && args.rows.is_none(),
        "an encoder-decoder model's heatmap is one kind of its attention (--attention cross, \
         encoder or decoder) of one layer (--layer), one head (--head) or all averaged: --grid, \
         --rollout, --method, --pair and --rows draw an encoder's or a decoder's"
    );
    let pass =
        crate::maps::teacher_forced(model, text, args.target.as_deref(), args.source.truncate)?;
    if args.target.is_none() {
        crate::maps::note_own_translation(&pass.target);
    }
    let c = model.config();
    // Each token as its text writes it; special tokens by name.
    let label = |enc_text: &str, span: Option<(usize, usize)>, id: u32| match span {
        Some((a, b)) => enc_text.get(a..b).unwrap_or_default().trim().to_string(),
        None => model.token(id).unwrap_or_default(),
    };
    let src = &pass.source_encoding;
    let source: Vec<String> = (src.ids.iter().zip(&src.spans))
        .map(|(&id, &span)| label(text, span, id))
        .collect();
    let tgt = &pass.target_encoding;
    let target: Vec<String> = (tgt.ids.iter().zip(&tgt.spans))
        .map(|(&id, &span)| label(&pass.target, span, id))
        .collect();
    let mut decoder = vec![label("", None, pass.decoder[0])];
    decoder.extend_from_slice(&target[..target.len() - 1]);
    let (weights, (n_layers, n_heads), rows, columns, kind) = match args.attention {
        Seq2SeqAttention::Cross => (
            &pass.output.cross_attentions,
            (c.decoder_layers, c.decoder_heads),
            &target,
            Some(&source),
            "cross-attention (target down, source across)",
        ),
        Seq2SeqAttention::Encoder => (
            &pass.output.encoder_attentions,
            (c.encoder_layers, c.encoder_heads),
            &source,
            None,
            "encoder self-attention",
        ),
        Seq2SeqAttention::Decoder => (
            &pass.output.decoder_attentions,
            (c.decoder_layers, c.decoder_heads),
            &decoder,
            None,
            "decoder self-attention",
        ),
    };
    let width = columns.map_or(rows.len(), |c| c.len());
    let block = rows.len() * width;
    let stack = match args.attention {
        Seq2SeqAttention::Encoder => "encoder",
        _ => "decoder",
    };
    if let Some(l) = args.layer.filter(|&l| l >= n_layers) {
        anyhow::bail!(
            "--layer {l}: the {stack} has {n_layers} layers (0 to {})",
            n_layers - 1
        );
    }
    if let Some(h) = args.head.filter(|&h| h >= n_heads) {
        anyhow::bail!(
            "--head {h}: the {stack} has {n_heads} heads (0 to {})",
            n_heads - 1
        );
    }
    let chosen: Vec<usize> = (0..n_layers * n_heads)
        .filter(|&lh| args.layer.is_none_or(|l| lh / n_heads == l))
        .filter(|&lh| args.head.is_none_or(|h| lh % n_heads == h))
        .collect();
    let mut matrix = vec![0.0f32; block];
    for &lh in &chosen {
        let w = &weights[lh * block..(lh + 1) * block];
        matrix.iter_mut().zip(w).for_each(|(m, x)| *m += x);
    }
    matrix.iter_mut().for_each(|m| *m /= chosen.len() as f32);
    let what = match (args.layer, args.head) {
        (Some(l), Some(h)) => format!("layer {l}, head {h}"),
        (Some(l), None) => format!("layer {l}, its {n_heads} heads averaged"),
        _ => format!("all {n_layers} layers × {n_heads} heads averaged"),
    };
    let title = format!(
        "{} → {} — {kind} — {what} — {} — tokens, special tokens shown",
        short(text),
        short(&pass.target),
        model.name()
    );
    let marks = Marks {
        causal: args.attention == Seq2SeqAttention::Decoder && rows.len() > 1,
        divider: None,
    };
    write_heatmap(
        &args.output,
        &Heatmap {
            title: &title,
            labels: rows,
            columns: columns.map(Vec::as_slice),
            matrix: &matrix,
            marks,
        },
    )?;
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
        self.keep(&self.units_of(tokens))
    }

    /// A token matrix merged into units, every unit kept.
    ///
    /// # Shapes
    /// `tokens: [T, T]` → `[U, U]` with `U = units.len()`.
    fn units_of(&self, tokens: &[f32]) -> Vec<f32> {
        merge_matrix(tokens, self.maps.seq_len(), self.units)
    }

    /// A unit matrix's shown units, rows renormalised.
    ///
    /// # Shapes
    /// `merged: [U, U]` → `[S, S]` with `S = shown.len()`.
    fn keep(&self, merged: &[f32]) -> Vec<f32> {
        keep_and_renormalise(merged, self.units.len(), self.shown)
    }

    /// Each shown row's unit and the share of its attention the shown units got.
    ///
    /// # Shapes
    /// `merged: [U, U]` ([`View::units_of`]) → `[S]`.
    fn kept_shares(&self, merged: &[f32]) -> Vec<(usize, f32)> {
        let n = self.units.len();
        (self.shown.iter())
            .map(|&i| {
                let row = &merged[i * n..(i + 1) * n];
                let kept: f32 = self.shown.iter().map(|&j| row[j]).sum();
                let total: f32 = row.iter().sum();
                (i, (kept / total.max(f32::MIN_POSITIVE)).min(1.0))
            })
            .collect()
    }

    /// The rows of `kept` ([`View::kept_shares`]) that kept under [`FAINT_ROW`] of their
    /// attention, for the title: renormalised, such a row's leftovers look as bright as a head's
    /// real weights.
    fn faint_rows(&self, kept: &[(usize, f32)]) -> String {
        let faint: Vec<(usize, f32)> = (kept.iter().copied())
            .filter(|&(_, kept)| kept < FAINT_ROW)
            .collect();
        let label = |u: usize| format!("{:?}", attn_viz::bars::Quoted(&self.units[u].label));
        match &faint[..] {
            [] => String::new(),
            &[(u, kept)] => format!(
                "; {} kept {} of its row: renormalised, that little fills it",
                label(u),
                percent(kept)
            ),
            [_, _] | [_, _, _] => {
                let rows: Vec<String> = (faint.iter())
                    .map(|&(u, kept)| format!("{} ({})", label(u), percent(kept)))
                    .collect();
                format!(
                    "; {} kept little of their rows: renormalised, that little fills them",
                    rows.join(", ")
                )
            }
            _ => format!(
                "; {} rows kept under {:.0}% of their attention: renormalised, that little fills \
                 them",
                faint.len(),
                100.0 * FAINT_ROW
            ),
        }
    }
}

/// The share of the shown rows' attention that goes to units not shown, on average, from
/// their kept shares ([`View::kept_shares`]).
fn hidden_share(kept: &[(usize, f32)]) -> f32 {
    let total: f32 = kept.iter().map(|&(_, kept)| 1.0 - kept).sum();
    total / kept.len() as f32
}

/// The share of its attention under which a row's renormalised weights are called out in the
/// title.
const FAINT_ROW: f32 = 0.05;

/// A share as a percentage with the digits a small one needs: 3%, 0.4%, 0.0005%.
fn percent(share: f32) -> String {
    let p = 100.0 * share;
    match p {
        _ if p >= 1.0 || p == 0.0 => format!("{p:.0}%"),
        _ => format!("{:.*}%", (-p.log10()).ceil() as usize, p),
    }
}

/// The text for a title: one line, cut at 60 characters.
fn short(text: &str) -> String {
    // One line, without the invisible characters labels leave out. The title's own separator
    // (" — " starts a new title piece) keeps its dash with a no-break space after it.
    let text = attn_viz::words::without_hidden(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" — ", " —\u{a0}");
    if text.chars().count() > 60 {
        format!("\"{}…\"", text.chars().take(59).collect::<String>())
    } else {
        format!("\"{text}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The title quotes a faint row's word as written, escaping a control character once: `{:?}`
    /// of the escaped label escaped it twice (`\\u{1b}`) and wrote a combining accent as
    /// `\u{301}`.
    #[test]
    fn a_faint_row_is_named_as_written() {
        let maps = AttentionMaps {
            model: String::new(),
            text: String::new(),
            pair: None,
            tokens: Vec::new(),
            n_layers: 0,
            n_heads: 0,
            weights: Vec::new(),
            rows: None,
        };
        let unit = |label: &str| Unit {
            label: label.to_string(),
            tokens: Vec::new(),
            segment: 0,
            special: false,
        };
        let units = [unit("cafe\u{301}"), unit("a\u{1b}b")];
        let view = View {
            maps: &maps,
            units: &units,
            shown: &[],
        };
        let title = view.faint_rows(&[(0, 0.01), (1, 0.02)]);
        assert!(
            title.starts_with("; \"cafe\u{301}\" (1%), \"a\\u{1b}b\" (2%) kept little"),
            "{title}"
        );
    }
}
