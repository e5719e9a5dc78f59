//! The one error type of `attn-viz`.

use std::path::PathBuf;

use crate::ROW_SUM_TOLERANCE;

/// Everything a view can refuse, with the facts needed to fix the input.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum VizError {
    #[error("the attention maps have no tokens")]
    NoTokens,
    #[error(
        "the attention maps have {n_layers} layers and {n_heads} heads; need at least one of each"
    )]
    NoHeads { n_layers: usize, n_heads: usize },
    #[error(
        "attention weights have {got} values; {n_layers} layers × {n_heads} heads × {seq_len}² tokens need {}",
        n_layers.saturating_mul(*n_heads).saturating_mul(seq_len.saturating_mul(*seq_len))
    )]
    WeightsShape {
        n_layers: usize,
        n_heads: usize,
        seq_len: usize,
        got: usize,
    },
    #[error(
        "attention weights have {got} values; {n_layers} layers × {n_heads} heads × {rows} rows × {seq_len} tokens need {}",
        n_layers.saturating_mul(*n_heads).saturating_mul(rows.saturating_mul(*seq_len))
    )]
    RowsShape {
        n_layers: usize,
        n_heads: usize,
        rows: usize,
        seq_len: usize,
        got: usize,
    },
    #[error("the attention maps' rows are wrong: {reason}")]
    BadRows { reason: String },
    #[error(
        "the attention maps hold the weights of {held} of the {seq_len} query tokens, and this \
         view needs every row"
    )]
    RowsOnly { held: usize, seq_len: usize },
    #[error(
        "attention weight at layer {layer}, head {head}, row {row}, column {col} is {value}; weights must be finite and not negative"
    )]
    BadWeight {
        layer: usize,
        head: usize,
        row: usize,
        col: usize,
        value: f32,
    },
    #[error(
        "attention weights at layer {layer}, head {head}, row {row} sum to {sum}; each row of a \
         softmax sums to 1 (within {ROW_SUM_TOLERANCE})"
    )]
    RowSum {
        layer: usize,
        head: usize,
        row: usize,
        sum: f32,
    },
    #[error("{reason}")]
    BadSelection { reason: &'static str },
    #[error("layer {layer} is out of range: this model's layers are 0..={}", n_layers - 1)]
    LayerOutOfRange { layer: usize, n_layers: usize },
    #[error("head {head} is out of range: this model's heads are 0..={}", n_heads - 1)]
    HeadOutOfRange { head: usize, n_heads: usize },
    #[error("token {index} is out of range: the input has {seq_len} tokens")]
    TokenOutOfRange { index: usize, seq_len: usize },
    #[error("token {index} belongs to segment {segment}, which has no text")]
    BadSegment { index: usize, segment: usize },
    #[error(
        "token {index} has span {}..{}, which is not a character range of its {text_len}-byte text",
        span.0, span.1
    )]
    BadSpan {
        index: usize,
        span: (usize, usize),
        text_len: usize,
    },
    #[error(
        "no {unit} {word:?} in {place}; the {unit}s are: {}",
        quoted(available)
    )]
    UnknownFocus {
        word: String,
        /// "word", or "token" for raw tokens.
        unit: &'static str,
        available: Vec<String>,
        /// Where --focus looks: "the input", or "the question (--focus looks from its words)".
        place: String,
    },
    #[error("{focus:?}: the number after '#' is too large (it picks the n-th occurrence)")]
    FocusNumber { focus: String },
    #[error("{word:?}#0: occurrences count from 1 ({word}#1 is the first)")]
    FocusZero { word: String },
    #[error(
        "{word:?} occurs {} in {place}; #{occurrence} asks for more",
        if *count == 1 { "once".to_string() } else { format!("{count} times") }
    )]
    FocusOccurrence {
        word: String,
        count: usize,
        occurrence: usize,
        place: String,
    },
    #[error(
        "a view across a sentence pair (--across) needs two texts (TEXT and --pair TEXT), and this input is one text"
    )]
    NoPair,
    #[error(
        "the two grids differ in their {what}: a comparison needs grids of one model, text and focus"
    )]
    GridsDiffer { what: &'static str },
    #[error(
        "{model} is causal: its question comes first and cannot see the context after it, so \
         every weight to the context is 0 by the mask; run the context and question as one text \
         (\"CONTEXT QUESTION\") with --focus on a question word, or use an encoder"
    )]
    CausalQuestion { model: String },
    #[error("nothing to show: {what}")]
    NothingToShow { what: String },
    #[error("attention flow is limited to {max} tokens; this input has {seq_len}")]
    FlowTooLong { seq_len: usize, max: usize },
    #[error("a lookup needs at least one entry")]
    NoEntries,
    #[error(
        "temperature must be a number above 0, at least {:?} (f32's smallest normal number: cosine / temperature overflows below it), got {temperature:?}",
        f32::MIN_POSITIVE
    )]
    BadTemperature { temperature: f32 },
    #[error("embedding of key {index} has {got} values; the query's has {expected}")]
    EmbeddingSize {
        index: usize,
        expected: usize,
        got: usize,
    },
    #[error("the embedding of {what} is zero (or not finite), so it has no direction to compare")]
    ZeroEmbedding { what: String },
    #[error("{}: unknown image format; use a .png or .svg file name", path.display())]
    UnknownImageFormat { path: PathBuf },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the picture would be {width} × {height} pixels, more than the {} million allowed; draw fewer tokens or heads",
        max / 1_000_000
    )]
    TooLarge { width: u64, height: u64, max: u64 },
    #[error("drawing the image failed: {message}")]
    Draw { message: String },
    #[error(
        "the {name} matrices have {got} values; {layers} × {seq_len}² tokens need {} (at least one matrix)",
        layers.saturating_mul(seq_len.saturating_mul(*seq_len))
    )]
    MeasureShape {
        name: String,
        layers: usize,
        seq_len: usize,
        got: usize,
    },
    #[error(
        "the {name} value at matrix {layer}, row {row}, column {col} is {value}; it must be finite and not negative"
    )]
    BadMeasure {
        name: String,
        layer: usize,
        row: usize,
        col: usize,
        value: f32,
    },
    #[error(
        "{tensor} has {got} values, expected [{n_layers}, {n_heads}, {n_tokens}, {head_dim}] (layers, heads, tokens, head_dim > 0)"
    )]
    QueryKeysShape {
        tensor: &'static str,
        n_layers: usize,
        n_heads: usize,
        n_tokens: usize,
        head_dim: usize,
        got: usize,
    },
    #[error("{tensor}[{index}] is {value}; queries and keys must be finite")]
    NonFiniteQueryKey {
        tensor: &'static str,
        index: usize,
        value: f32,
    },
    #[error("softmax scale {scale} must be finite and positive")]
    BadScale { scale: f32 },
    #[error("could not encode the {what}")]
    Encode {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn quoted(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("{w:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}
