//! `attnscope html`: one text's attention as a self-contained interactive HTML file (head view,
//! model view, heatmap, neuron view) that works offline. Also the model run behind it (with
//! the queries and keys the neuron view needs) that `attnscope serve` shares.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use attn_models::Model;
use attn_viz::AttentionMaps;
use attn_viz::html::{Measure, PageOptions, QueryKeys, standalone_page};

use crate::cmd::attribute::PageMethods;
use crate::maps::{SourceArgs, check_output, read_maps, run_encoded};

#[derive(clap::Args)]
#[command(after_help = "Examples:
  attnscope html \"The cat sat on the mat\" -o cat.html
  attnscope html \"Where is the Eiffel Tower?\" --pair \"The Eiffel Tower is in Paris.\" -o pair.html")]
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
    #[command(flatten)]
    pub methods: PageMethods,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    check_extension(&args.output)?;
    check_output(&args.output)?;
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
