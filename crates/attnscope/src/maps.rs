//! Where the views' attention comes from: a real model run on the user's text (the default
//! model, or `--model DIR`), or a saved [`AttentionMaps`] JSON file (`--maps FILE`). Shared by
//! `explain`, `heatmap`, `heads` and `lookup`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use attn_models::{Model, QueryKey, RunOptions};
use attn_viz::{AttentionMaps, Token};
use indicatif::{ProgressBar, ProgressStyle};

/// Which model to run and on how many threads: the arguments of every command that runs one.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// Model directory, or id in the Hugging Face cache [default: all-MiniLM-L6-v2]
    ///
    /// A Hugging Face model directory (config.json, model.safetensors, tokenizer.json), or a
    /// model id in the Hugging Face cache (`gpt2`, `org/name@revision`) [default:
    /// $ATTNSCOPE_MODEL, else all-MiniLM-L6-v2 from the cache, fetched on first use].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Threads for the model [default: $RAYON_NUM_THREADS, else every core]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// Sizes the thread pool, then loads the model (fetching the default one on first use).
    pub fn load(&self) -> anyhow::Result<Model> {
        load_model(self.model.as_deref(), self.threads)
    }

    /// The encoder-decoder model `--model` names (translation), loaded, or `None` when it
    /// names another kind (or none: the default model is an encoder).
    pub fn load_seq2seq(&self) -> anyhow::Result<Option<attn_models::Seq2Seq>> {
        let Some(dir) = &self.model else {
            return Ok(None);
        };
        let dir = attn_models::resolve_model(dir)?;
        if !attn_models::is_seq2seq(&dir) {
            return Ok(None);
        }
        if let Some(n) = self.threads {
            set_threads(n)?;
        }
        let model = attn_models::Seq2Seq::load(&dir)
            .with_context(|| format!("loading the model in {}", dir.display()))?;
        Ok(Some(model))
    }
}

/// An encoder-decoder model's teacher-forced pass over a source and its target.
pub struct TeacherForced {
    /// The source's ids.
    pub source: Vec<u32>,
    /// The source's encoding (its ids, with their spans in the source).
    pub source_encoding: attn_models::Encoding,
    /// What the decoder read: the start token, then the target's tokens but the last.
    pub decoder: Vec<u32>,
    /// What each decoder row predicts: the target's tokens.
    pub labels: Vec<u32>,
    /// The target's encoding (the labels, with their spans in `target`).
    pub target_encoding: attn_models::Encoding,
    /// The target text: `--target`, or the model's own translation.
    pub target: String,
    /// The attentions and logits.
    pub output: attn_models::Seq2SeqOutput,
}

/// Says on stderr that, without `--target`, the target is the model's own translation: the
/// command line's note (a server's response carries the target itself).
pub fn note_own_translation(target: &str) {
    crate::note!("note: no --target: the target is the model's own translation, {target:?}");
}

/// The pass of `model` over `source` and `target`, or, without one, the model's own
/// translation (its generation settings' beams and length).
pub fn teacher_forced(
    model: &attn_models::Seq2Seq,
    source: &str,
    target: Option<&str>,
    truncate: bool,
) -> anyhow::Result<TeacherForced> {
    let source_encoding = seq2seq_side(model, source, "source", truncate)?;
    let source_ids = source_encoding.ids.clone();
    let (encoded, encoder_attentions) = model.encode(&source_ids)?;
    let target = match target {
        Some(t) => t.to_string(),
        None => {
            let max = model
                .config()
                .generation
                .max_length
                .unwrap_or(64)
                .saturating_sub(1);
            let beams = model.config().generation.num_beams.unwrap_or(1);
            let ids = model.beam_search_encoded(&encoded, max.max(1), beams)?;
            model.decode_text(&ids)?
        }
    };
    anyhow::ensure!(
        !target.trim().is_empty(),
        "the target is empty or only whitespace"
    );
    let target_encoding = seq2seq_side(model, &target, "target", truncate)?;
    let labels = target_encoding.ids.clone();
    let decoder = model.shift_right(&labels);
    let decoded = model.decode(&encoded, &decoder)?;
    let output = attn_models::Seq2SeqOutput {
        encoder_attentions,
        decoder_attentions: decoded.self_attentions,
        cross_attentions: decoded.cross_attentions,
        logits: decoded.logits,
    };
    Ok(TeacherForced {
        source: source_ids,
        source_encoding,
        decoder,
        labels,
        target_encoding,
        target,
        output,
    })
}

/// The `which` side (`"source"`, `"target"`) of an encoder-decoder model's input, tokenized;
/// with `truncate`, cut to the model's positions, saying so on stderr.
pub fn seq2seq_side(
    model: &attn_models::Seq2Seq,
    text: &str,
    which: &'static str,
    truncate: bool,
) -> anyhow::Result<attn_models::Encoding> {
    let encode = |truncate| match which {
        "target" => model.target_encoding(text, truncate),
        _ => model.source_encoding(text, truncate),
    };
    if !truncate {
        return Ok(encode(false)?);
    }
    let enc = encode(true)?;
    // Say what was cut: every view then shows the kept tokens as if they were all.
    match encode(false) {
        Err(
            attn_models::ModelError::TooLong { tokens, max, .. }
            | attn_models::ModelError::SideTooLong { tokens, max, .. },
        ) => crate::note!(
            "note: --truncate: the {which} is {tokens} tokens; the model reads its first {max} \
             ({} cut from the end, its closing token kept)",
            tokens - max
        ),
        Err(attn_models::ModelError::TooManyWords { words, max, .. }) => crate::note!(
            "note: --truncate: the {which} is {words} words; the model reads its first {max} \
             tokens (cut from the end, its closing token kept)"
        ),
        _ => {}
    }
    Ok(enc)
}

/// Which attention of an encoder-decoder model a view shows.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Seq2SeqAttention {
    /// The decoder's rows over the source's tokens.
    #[default]
    Cross,
    /// The encoder's self-attention over the source.
    Encoder,
    /// The decoder's causal self-attention over what it reads: the start token, then the
    /// target's tokens.
    Decoder,
}

/// An encoder-decoder model's attention on `source` (and `target`, else its own translation)
/// as maps the views read. Cross: the source's tokens (segment 0, the text)
/// then the target's (segment 1, the pair), holding the rows of the target's tokens alone,
/// each target token's row the decoder row that generates it (over the source's columns; the
/// target's columns 0). Encoder: the source alone, every row. Decoder: what the decoder reads
/// (the start token, then the target's tokens but the last, spans in the target), every row.
/// Without a target, says on stderr which translation it read.
pub fn seq2seq_maps(
    model: &attn_models::Seq2Seq,
    (source, target): (&str, Option<&str>),
    kind: Seq2SeqAttention,
    truncate: bool,
) -> anyhow::Result<AttentionMaps> {
    // The encoder's attention alone needs no target, nor the translation that would make one.
    if kind == Seq2SeqAttention::Encoder {
        let src = seq2seq_side(model, source, "source", truncate)?;
        let weights = model.encode(&src.ids)?.1;
        return encoder_maps(model, source, &src, weights);
    }
    let pass = teacher_forced(model, source, target, truncate)?;
    if target.is_none() {
        note_own_translation(&pass.target);
    }
    pass_maps(model, source, &pass, kind)
}

/// [`seq2seq_maps`] of a pass already run over `source` and its target: any of the three
/// kinds, so that one pass gives them all.
pub fn pass_maps(
    model: &attn_models::Seq2Seq,
    source: &str,
    pass: &TeacherForced,
    kind: Seq2SeqAttention,
) -> anyhow::Result<AttentionMaps> {
    let src = &pass.source_encoding;
    let c = model.config();
    let mut tokens: Vec<Token> = (0..src.len())
        .map(|i| seq2seq_token(model, src, i, 0))
        .collect();
    let s = tokens.len();
    let mut text = source.to_string();
    let (weights, rows, pair) = match kind {
        Seq2SeqAttention::Encoder => {
            return encoder_maps(model, source, src, pass.output.encoder_attentions.clone());
        }
        Seq2SeqAttention::Cross => {
            let tgt = &pass.target_encoding;
            tokens.extend((0..tgt.len()).map(|i| seq2seq_token(model, tgt, i, 1)));
            let (t, width) = (tgt.len(), tokens.len());
            let mut weights = vec![0.0f32; c.decoder_layers * c.decoder_heads * t * width];
            for (row, cross) in
                (weights.chunks_exact_mut(width)).zip(pass.output.cross_attentions.chunks_exact(s))
            {
                row[..s].copy_from_slice(cross);
            }
            (
                weights,
                Some((s..s + t).collect()),
                Some(pass.target.clone()),
            )
        }
        Seq2SeqAttention::Decoder => {
            let tgt = &pass.target_encoding;
            let start = pass.decoder[0];
            tokens = vec![Token {
                text: model.token(start).unwrap_or_default(),
                id: start,
                span: None,
                segment: 0,
                special: true,
            }];
            tokens.extend((0..tgt.len() - 1).map(|i| seq2seq_token(model, tgt, i, 0)));
            text = pass.target.clone();
            (pass.output.decoder_attentions.clone(), None, None)
        }
    };
    let maps = AttentionMaps {
        model: model.name().to_string(),
        text,
        pair,
        tokens,
        n_layers: c.decoder_layers,
        n_heads: c.decoder_heads,
        weights,
        rows,
    };
    maps.validate_rows().context("the model's attention")?;
    Ok(maps)
}

/// Token `i` of one side's encoding, in `segment`.
fn seq2seq_token(
    model: &attn_models::Seq2Seq,
    enc: &attn_models::Encoding,
    i: usize,
    segment: usize,
) -> Token {
    Token {
        text: enc.tokens[i].clone(),
        id: enc.ids[i],
        span: enc.spans[i],
        segment,
        special: enc.special[i] || model.is_special(enc.ids[i]),
    }
}

/// The encoder's self-attention `weights` over `src`, the encoding of `source`, as maps.
fn encoder_maps(
    model: &attn_models::Seq2Seq,
    source: &str,
    src: &attn_models::Encoding,
    weights: Vec<f32>,
) -> anyhow::Result<AttentionMaps> {
    let c = model.config();
    let maps = AttentionMaps {
        model: model.name().to_string(),
        text: source.to_string(),
        pair: None,
        tokens: (0..src.len())
            .map(|i| seq2seq_token(model, src, i, 0))
            .collect(),
        n_layers: c.encoder_layers,
        n_heads: c.encoder_heads,
        weights,
        rows: None,
    };
    maps.validate_rows().context("the model's attention")?;
    Ok(maps)
}

/// The model in `dir` (a directory or a Hugging Face cache id, [`attn_models::resolve_model`]), else the
/// default one (`$ATTNSCOPE_MODEL`, else fetched on first use, with progress on stderr).
pub fn load_model(dir: Option<&Path>, threads: Option<usize>) -> anyhow::Result<Model> {
    if let Some(n) = threads {
        set_threads(n)?;
    }
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        None => attn_models::default_model_dir(true).context("finding the default model")?,
    };
    let dir = attn_models::resolve_model(&dir)?;
    if attn_models::is_seq2seq(&dir) {
        anyhow::bail!(
            "{} is an encoder-decoder model: this command does not run one yet; `attnscope \
             translate`, `explain SOURCE --target TARGET --focus WORD` and `heatmap SOURCE \
             --target TARGET -o FILE` (its cross-attention), `attention SOURCE --target TARGET \
             --json`, `html SOURCE --target TARGET -o FILE.html` and `serve` (all three kinds) do",
            dir.display()
        );
    }
    Model::load(&dir).with_context(|| format!("loading the model in {}", dir.display()))
}

/// Sizes the thread pool every model and kernel call runs on; an invalid count names the
/// `--threads` flag.
pub fn set_threads(threads: usize) -> anyhow::Result<()> {
    attn_models::set_threads(threads).map_err(|e| match e {
        attn_models::ModelError::Threads { reason } => anyhow::anyhow!("--threads: {reason}"),
        other => other.into(),
    })
}

/// `err` as the command line says it: a layer or head out of range names its flag, as
/// `attention` does (attn-viz's own message serves the web app too, which has no flags).
pub fn name_the_flag(err: attn_viz::VizError) -> anyhow::Error {
    use attn_viz::VizError;
    match err {
        VizError::LayerOutOfRange { layer, n_layers } => anyhow::anyhow!(
            "--layer {layer} is out of range: this model's layers are 0..={}",
            n_layers - 1
        ),
        VizError::HeadOutOfRange { head, n_heads } => anyhow::anyhow!(
            "--head {head} is out of range: this model's heads are 0..={}",
            n_heads - 1
        ),
        other => other.into(),
    }
}

/// The attention of one text (and its pair), from a model or a file.
#[derive(clap::Args, Debug, Clone)]
pub struct SourceArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Read attention maps saved by `attention --save-maps` instead of running a model
    ///
    /// Read attention maps saved by `attnscope attention TEXT --save-maps FILE.json` (an
    /// `AttentionMaps`: model, text, pair, tokens, n_layers, n_heads, weights) instead of
    /// running a model.
    #[arg(long, value_name = "FILE.json", conflicts_with = "model")]
    pub maps: Option<PathBuf>,
    /// Cut a text longer than the model's positions to fit (the longest segment first).
    #[arg(long, conflicts_with = "maps")]
    pub truncate: bool,
}

impl SourceArgs {
    /// Runs the model on `text` (and `pair`), or reads `--maps`.
    pub fn maps(&self, text: Option<&str>, pair: Option<&str>) -> anyhow::Result<AttentionMaps> {
        match (&self.maps, text) {
            (Some(path), _) => read_maps(path),
            (None, Some(text)) => {
                let model = self.model.load()?;
                run_model(&model, text, pair, self.truncate)
            }
            (None, None) => anyhow::bail!("give a TEXT to look at (or --maps FILE.json)"),
        }
    }
}

/// Every layer's and head's attention of `model` on `text` (and `pair`).
pub fn run_model(
    model: &Model,
    text: &str,
    pair: Option<&str>,
    truncate: bool,
) -> anyhow::Result<AttentionMaps> {
    run_model_with(model, text, pair, truncate, false).map(|(maps, _)| maps)
}

/// The text (and pair) encoded for `model`; with `truncate`, cut to fit, saying on stderr
/// what was cut, and which special tokens the text writes itself.
pub fn encode(
    model: &Model,
    text: &str,
    pair: Option<&str>,
    truncate: bool,
) -> anyhow::Result<attn_models::Encoding> {
    let enc = encode_quietly(model, text, pair, truncate)?;
    if pair.is_some() && model.config().causal {
        crate::note!(
            "note: {} is causal: the pair is read after the text as one sequence (as its \
             tokenizer joins them), so the text cannot see the pair",
            model.name()
        );
    }
    // A special token the text writes itself is that token, as transformers reads it: say so,
    // as "[PAD]" in a text is easily taken for padding (which a mask hides).
    // (A character the vocabulary lacks is also read as one, [UNK], which the text did not
    // write: only a token spelled out at its place counts.)
    let mut written: Vec<String> = Vec::new();
    for ((&id, span), &segment) in enc.ids.iter().zip(&enc.spans).zip(&enc.segments) {
        let source = if segment == 0 { Some(text) } else { pair };
        let spelled = span.and_then(|(a, b)| source?.get(a..b));
        let Some(token) = model
            .token(id)
            .filter(|t| model.is_special_token(id) && spelled == Some(t))
        else {
            continue;
        };
        if !written.contains(&token) {
            written.push(token);
        }
    }
    if !written.is_empty() {
        let (token, them, it) = match written.len() {
            1 => ("token", "it", "a token"),
            _ => ("tokens", "them", "tokens"),
        };
        crate::note!(
            "note: the text writes the tokenizer's special {token} {} itself: read as {it} the \
             model attends to (as transformers reads {them}), not as padding or a separator the \
             tokenizer adds",
            written.join(", ")
        );
    }
    Ok(enc)
}

/// [`encode`] without its notes on how the model reads the text (a causal model's pair,
/// special tokens the text writes); with the one on what `truncate` cut.
fn encode_quietly(
    model: &Model,
    text: &str,
    pair: Option<&str>,
    truncate: bool,
) -> anyhow::Result<attn_models::Encoding> {
    // The tokenizer's errors already say what is wrong with the text ("the text is empty").
    if truncate {
        let enc = model.encode_truncated(text, pair)?;
        // Say what was cut: every view then shows the kept tokens as if they were all.
        let longer = match pair {
            Some(_) => " of the longer text first",
            None => "",
        };
        match model.encode(text, pair) {
            Err(attn_models::ModelError::TooLong { tokens, max, .. }) => crate::note!(
                "note: --truncate: the input is {tokens} tokens; the attention shown is of the {max} \
                 the model reads ({} cut from the end{longer})",
                tokens - max
            ),
            Err(attn_models::ModelError::TooManyWords { words, max, .. }) => crate::note!(
                "note: --truncate: the input is {words} words; the attention shown is of the {max} \
                 tokens the model reads (cut from the end{longer})"
            ),
            _ => {}
        }
        Ok(enc)
    } else {
        Ok(model.encode(text, pair)?)
    }
}

/// [`run_model`], and with `qk` also the queries and keys behind the weights (the explorer's
/// neuron view needs them).
///
/// # Shapes
/// - returned `maps.weights`: `[n_layers, n_heads, T, T]`
/// - returned `q`, `k`: `[n_layers, n_heads, T, head_dim]`
pub fn run_model_with(
    model: &Model,
    text: &str,
    pair: Option<&str>,
    truncate: bool,
    qk: bool,
) -> anyhow::Result<(AttentionMaps, Option<QueryKey>)> {
    let enc = encode(model, text, pair, truncate)?;
    run_encoded(model, text, pair, &enc, qk)
}

/// [`run_model_with`] on `enc`, an encoding of `text` and `pair`.
pub fn run_encoded(
    model: &Model,
    text: &str,
    pair: Option<&str>,
    enc: &attn_models::Encoding,
    qk: bool,
) -> anyhow::Result<(AttentionMaps, Option<QueryKey>)> {
    let spinner = spinner(&format!("running {} on {} tokens", model.name(), enc.len()));
    let out = model
        .forward(
            enc,
            &RunOptions {
                attentions: true,
                qk,
                hidden_states: false,
            },
        )
        .context("running the model")?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    let weights = out
        .attentions
        .context("the model returned no attention weights")?;
    let maps = to_maps(model, text, pair, enc, weights, None)?;
    Ok((maps, out.qk))
}

/// [`run_model`] computing only the weight rows `wanted` asks for, given the maps' tokens
/// (maps holding no rows yet): what a view of a few words of a long prompt needs, in memory
/// for those rows alone. Every row asked for runs [`run_model`].
pub fn run_model_rows(
    model: &Model,
    (text, pair): (&str, Option<&str>),
    truncate: bool,
    wanted: impl FnOnce(&AttentionMaps) -> anyhow::Result<Vec<usize>>,
) -> anyhow::Result<AttentionMaps> {
    let enc = encode(model, text, pair, truncate)?;
    let header = to_maps(model, text, pair, &enc, Vec::new(), Some(Vec::new()))?;
    let mut rows = wanted(&header)?;
    if rows.len() >= enc.len() {
        return run_encoded(model, text, pair, &enc, false).map(|(maps, _)| maps);
    }
    // A bidirectional model's first row sees the keys after it: with it the maps show that
    // the model is not causal, which the rows of the last token alone would not.
    if !model.config().causal && rows.first() != Some(&0) {
        rows.insert(0, 0);
    }
    let spinner = spinner(&format!(
        "running {} on {} tokens ({} rows of weights)",
        model.name(),
        enc.len(),
        rows.len()
    ));
    let weights = model
        .attention_rows(&enc, &rows)
        .context("running the model")?;
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    to_maps(model, text, pair, &enc, weights, Some(rows))
}

/// The attention maps of `model` on `enc` (of `text` and `pair`): `weights` `[n_layers,
/// n_heads, T, T]` from a forward pass over `enc` alone, or `[n_layers, n_heads, rows.len(),
/// T]` with `rows`.
pub fn to_maps(
    model: &Model,
    text: &str,
    pair: Option<&str>,
    enc: &attn_models::Encoding,
    weights: Vec<f32>,
    rows: Option<Vec<usize>>,
) -> anyhow::Result<AttentionMaps> {
    // A Llama-style decoder's first token is where its heads park attention (an attention
    // sink, <s> or the first word): the views hide it as they hide [CLS], and say so.
    let sink = model.kind() == attn_models::ModelKind::Llama;
    let tokens = (0..enc.len())
        .map(|i| Token {
            text: enc.tokens[i].clone(),
            id: enc.ids[i],
            span: enc.spans[i],
            segment: enc.segments[i],
            special: enc.special[i] || (sink && i == 0),
        })
        .collect();
    let maps = AttentionMaps {
        model: model.name().to_string(),
        text: text.to_string(),
        pair: pair.map(str::to_string),
        tokens,
        n_layers: model.n_layers(),
        n_heads: model.n_heads(),
        weights,
        rows,
    };
    maps.validate_rows().context("the model's attention")?;
    Ok(maps)
}

/// Reads and checks an `AttentionMaps` JSON file.
pub fn read_maps(path: &Path) -> anyhow::Result<AttentionMaps> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let maps: AttentionMaps = serde_json::from_reader(std::io::BufReader::new(file))
        .with_context(|| format!("{}: not attention maps JSON", path.display()))?;
    maps.validate()
        .with_context(|| format!("{}: bad attention maps", path.display()))?;
    Ok(maps)
}

/// A spinner on stderr while something slow runs, only when stderr is a terminal.
pub fn spinner(message: &str) -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new_spinner().with_message(message.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    })
}

/// A progress bar on stderr of `total` steps, only when stderr is a terminal.
pub fn progress_bar(total: u64, message: &str) -> Option<ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(total).with_message(message.to_string());
        if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({eta})") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    })
}

/// Whether to colour output: `--color always/never`, or on a terminal unless `NO_COLOR` is set.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    pub fn enabled(self) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            }
        }
    }
}

/// Whether `a` and `b` are one file: the same path once links and `..` are resolved, or (on
/// Unix) the same device and inode, which a hard link shares. False when either is missing.
pub fn same_file(a: &Path, b: &Path) -> bool {
    let canonical = |p: &Path| std::fs::canonicalize(p).ok();
    if canonical(a).is_some_and(|a| Some(a) == canonical(b)) {
        return true;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        id(a).is_some_and(|a| Some(a) == id(b))
    }
    #[cfg(not(unix))]
    false
}

/// Checks before any work that `path` can be written: its folder exists and it is not a folder.
pub fn check_output(path: &Path) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // The nearest folder above that exists must be one (`file.txt/sub/out.png`).
    if let Some(file) = parent
        .ancestors()
        .find(|p| p.exists())
        .filter(|p| !p.is_dir())
    {
        anyhow::bail!(
            "cannot write {}: {} is not a folder",
            path.display(),
            file.display()
        );
    }
    if !parent.is_dir() {
        anyhow::bail!(
            "cannot write {}: the folder {} does not exist",
            path.display(),
            parent.display()
        );
    }
    if path.is_dir() {
        anyhow::bail!("cannot write {}: it is a folder", path.display());
    }
    Ok(())
}
