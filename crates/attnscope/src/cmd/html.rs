//! `attnscope html`: one text's attention as a self-contained interactive HTML file (head view,
//! model view, heatmap, neuron view) that works offline; for an encoder-decoder model, its
//! encoder's, decoder's and cross-attention on a source and target, which a selector switches
//! between; with `--rows`, a few tokens' rows over every token, computed alone. Also the model
//! runs behind it (with the queries and keys the neuron view needs) that `attnscope serve`
//! shares.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use attn_models::{Model, Seq2Seq};
use attn_viz::AttentionMaps;
use attn_viz::html::{
    Measure, PageOptions, QueryKeys, Seq2SeqMaps, rows_page, seq2seq_page, standalone_page,
};

use crate::cmd::RowRange;
use crate::cmd::attribute::PageMethods;
use crate::maps::{
    Seq2SeqAttention, SourceArgs, check_output, pass_maps, read_maps, run_encoded, run_model_rows,
    teacher_forced,
};

#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope html \"The cat sat on the mat\" -o cat.html
  attnscope html \"Where is the Eiffel Tower?\" --pair \"The Eiffel Tower is in Paris.\" -o pair.html
  attnscope html \"$(cat long-prompt.txt)\" --model Qwen/Qwen2.5-0.5B --rows -8.. -o last.html
  attnscope html \"I love machine learning\" --model Helsinki-NLP/opus-mt-en-fr -o translation.html")]
pub struct Args {
    /// The text to look at.
    #[arg(required_unless_present = "maps", conflicts_with = "maps")]
    pub text: Option<String>,
    /// A second text, run as a sentence pair with TEXT
    ///
    /// A second text, run as a sentence pair with TEXT (an encoder's segment B; a causal model
    /// reads it after TEXT, which cannot see it); the page can then show attention from A to B
    /// and from B to A.
    #[arg(long, value_name = "TEXT", conflicts_with = "maps")]
    pub pair: Option<String>,
    /// An encoder-decoder model's target (a translation of TEXT); default: its own translation
    ///
    /// An encoder-decoder model's target (a translation of TEXT), which the decoder reads;
    /// default: the model's own translation. The page holds the encoder's, the decoder's and
    /// the cross-attention, and a selector switches between them.
    #[arg(long, value_name = "TEXT", conflicts_with = "maps")]
    pub target: Option<String>,
    /// Where to write the page (a .html or .htm file).
    #[arg(short, long, value_name = "FILE.html")]
    pub output: PathBuf,
    /// The layer whose queries and keys the neuron view gets first [default: the last]
    ///
    /// The layer whose queries and keys the neuron view gets first [default: the last]; nearby
    /// layers are added while the file stays small. (Saved maps hold no queries or keys: a page
    /// from --maps has no neuron view.)
    #[arg(
        long,
        value_name = "L",
        conflicts_with = "maps",
        value_parser = crate::cmd::index,
        allow_negative_numbers = true
    )]
    pub neuron_layer: Option<usize>,
    /// Only these tokens' rows, each over every token: START..END of the tokens (END excluded;
    /// negative: from the end)
    ///
    /// Only these tokens' rows (queries), each over every token: START..END of the model's
    /// tokens, 0-based, END excluded, either one left out for the start or the end, a negative
    /// one counting from the end (-8.. is the last 8). The model computes only these rows'
    /// weights, so a prompt of thousands of tokens makes a page without the memory of its every
    /// row; the page has no neuron view and no measures (--methods).
    #[arg(
        long,
        value_name = "START..END",
        allow_hyphen_values = true,
        value_parser = crate::cmd::parse_rows
    )]
    pub rows: Option<RowRange>,
    #[command(flatten)]
    pub methods: PageMethods,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_extension(&args.output)?;
    check_output(&args.output)?;
    if let Some(range) = args.rows {
        return run_rows(&args, range);
    }
    // Saved maps carry no queries and keys: the page then says the neuron view is unavailable.
    let (maps, qk, measures) = match (&args.source.maps, &args.text) {
        (Some(path), _) => {
            if !args.methods.methods.is_empty() {
                bail!(
                    "--methods needs the model run on a TEXT; saved maps hold only attention weights"
                );
            }
            (read_maps(path)?, None, Vec::new())
        }
        (None, Some(text)) => {
            if let Some(model) = args.source.model.load_seq2seq()? {
                return run_seq2seq(&args, &model, text);
            }
            if args.target.is_some() {
                bail!(
                    "--target is the target of an encoder-decoder model (BART, mBART, Marian, T5); this model reads one text"
                );
            }
            let model = args.source.model.load()?;
            let (maps, qk, measures) = analyse(
                &model,
                (text, args.pair.as_deref()),
                args.source.truncate,
                &args.methods,
            )?;
            (maps, Some(qk), measures)
        }
        (None, None) => bail!("give a TEXT to look at (or --maps FILE.json)"),
    };
    if let Some(layer) = args.neuron_layer {
        maps.check_layer(layer).context("--neuron-layer")?;
    }
    let options = PageOptions {
        neuron_layer: args.neuron_layer,
        ..PageOptions::default()
    };
    let page = standalone_page(&maps, qk.as_ref(), &measures, &options)?;
    std::fs::write(&args.output, &page)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    crate::note!(
        "wrote {} ({} tokens, {} layers × {} heads, {:.2} MB)",
        args.output.display(),
        maps.tokens.len(),
        maps.n_layers,
        maps.n_heads,
        page.len() as f64 / 1e6
    );
    Ok(())
}

/// `html --rows`: the chosen tokens' rows over every token, from a model run that computes
/// those rows' weights alone (or from saved maps).
fn run_rows(args: &Args, range: RowRange) -> anyhow::Result<()> {
    if !args.methods.methods.is_empty() {
        bail!(
            "--methods: a page of --rows holds those rows' attention weights alone; the measures \
             need every row (leave out --rows for them)"
        );
    }
    if args.neuron_layer.is_some() {
        bail!(
            "--neuron-layer: a page of --rows has no neuron view (it holds those rows' weights, \
             not the model's queries and keys)"
        );
    }
    let chosen = |maps: &AttentionMaps| -> anyhow::Result<Vec<usize>> {
        let rows = (range.resolve(maps.seq_len(), "tokens")).map_err(anyhow::Error::msg)?;
        Ok(rows.collect())
    };
    let (maps, alone) = match (&args.source.maps, &args.text) {
        (Some(path), _) => (read_maps(path)?, false),
        (None, Some(text)) => {
            if args.source.model.load_seq2seq()?.is_some() {
                bail!(
                    "--rows: an encoder-decoder model's page holds its three kinds of attention \
                     whole; --rows chooses rows of a model that reads one text (an encoder or a \
                     decoder)"
                );
            }
            if args.target.is_some() {
                bail!(
                    "--target is the target of an encoder-decoder model (BART, mBART, Marian, T5); this model reads one text"
                );
            }
            let model = args.source.model.load()?;
            let (text, pair) = (text.as_str(), args.pair.as_deref());
            let maps = run_model_rows(&model, (text, pair), args.source.truncate, chosen)?;
            // A range of every token runs the full pass.
            let alone = maps.rows.is_some();
            (maps, alone)
        }
        (None, None) => bail!("give a TEXT to look at (or --maps FILE.json)"),
    };
    let rows = chosen(&maps)?;
    let page = rows_page(&maps, &rows, alone, &PageOptions::default())?;
    std::fs::write(&args.output, &page)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    crate::note!(
        "wrote {} (rows {}..{} of {} tokens, {} layers × {} heads, {:.2} MB)",
        args.output.display(),
        rows[0],
        rows[rows.len() - 1] + 1,
        maps.tokens.len(),
        maps.n_layers,
        maps.n_heads,
        page.len() as f64 / 1e6
    );
    Ok(())
}

/// `html` on an encoder-decoder model: a page of its three kinds of attention on `text` and
/// the target (`--target`, else its own translation).
fn run_seq2seq(args: &Args, model: &Seq2Seq, text: &str) -> anyhow::Result<()> {
    if args.pair.is_some() {
        bail!(
            "--pair: an encoder-decoder model reads one source text; give its translation with \
             --target TEXT (without it, the target is the model's own translation)"
        );
    }
    if !args.methods.methods.is_empty() {
        bail!(
            "--methods: the attribution measures are not computed for an encoder-decoder model; \
             its page shows the attention weights"
        );
    }
    if args.neuron_layer.is_some() {
        bail!(
            "--neuron-layer: an encoder-decoder model's page has no neuron view (attnscope does \
             not take out its queries and keys)"
        );
    }
    let maps = analyse_seq2seq(model, text, args.target.as_deref(), args.source.truncate)?;
    if args.target.is_none() {
        crate::maps::note_own_translation(&maps.target);
    }
    let page = seq2seq_page(&maps, &PageOptions::default())?;
    std::fs::write(&args.output, &page)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    crate::note!(
        "wrote {} ({} source tokens, {} target tokens; encoder {} × {}, decoder {} × {} \
         layers × heads; {:.2} MB)",
        args.output.display(),
        maps.encoder.tokens.len(),
        maps.cross.tokens.len() - maps.encoder.tokens.len(),
        maps.encoder.n_layers,
        maps.encoder.n_heads,
        maps.decoder.n_layers,
        maps.decoder.n_heads,
        page.len() as f64 / 1e6
    );
    Ok(())
}

/// An encoder-decoder model's three kinds of attention on `source` and `target` (else its own
/// translation), from one teacher-forced pass.
pub fn analyse_seq2seq(
    model: &Seq2Seq,
    source: &str,
    target: Option<&str>,
    truncate: bool,
) -> anyhow::Result<Seq2SeqMaps> {
    let pass = teacher_forced(model, source, target, truncate)?;
    let maps = |kind| pass_maps(model, source, &pass, kind);
    Ok(Seq2SeqMaps {
        encoder: maps(Seq2SeqAttention::Encoder)?,
        decoder: maps(Seq2SeqAttention::Decoder)?,
        cross: maps(Seq2SeqAttention::Cross)?,
        target: pass.target.clone(),
    })
}

/// Refuses, before any work, a file name that is not `.html`/`.htm`.
fn check_extension(path: &Path) -> anyhow::Result<()> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if !matches!(extension.as_deref(), Some("html" | "htm")) {
        bail!(
            "{}: unknown extension; the explorer is written as a .html (or .htm) file",
            path.display()
        );
    }
    Ok(())
}

/// Runs the model and returns what the explorer shows: every head's attention, the queries and
/// keys behind it, and the measures of `methods`.
///
/// # Shapes
/// - returned `maps.weights`: `[n_layers, n_heads, T, T]`
/// - returned `qk.q`, `qk.k`: `[n_layers, n_heads, T, head_dim]`
pub fn analyse(
    model: &Model,
    (text, pair): (&str, Option<&str>),
    truncate: bool,
    methods: &PageMethods,
) -> anyhow::Result<(AttentionMaps, QueryKeys, Vec<Measure>)> {
    let enc = crate::maps::encode(model, text, pair, truncate)?;
    let (maps, qk) = run_encoded(model, text, pair, &enc, true)?;
    let measures = crate::cmd::attribute::measures(
        model,
        &enc,
        &maps,
        &methods.chosen(model),
        &methods.target,
    )?;
    let qk = qk.context("the model returned no queries and keys")?;
    let head_dim = model.config().head_dim();
    let qk = QueryKeys {
        head_dim,
        // BERT, GPT-2 (attn-models refuses other GPT-2 scalings) and Llama use 1/√head_dim.
        scale: 1.0 / (head_dim as f32).sqrt(),
        causal: model.config().causal,
        q: qk.q,
        k: qk.k,
    };
    Ok((maps, qk, measures))
}
