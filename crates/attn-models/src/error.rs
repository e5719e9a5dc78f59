//! The one error type of `attn-models`: every variant names the file, tensor or value at fault.

use std::path::PathBuf;

use attn_core::AttnError;

/// What went wrong loading a checkpoint, tokenizing text, running a model or fetching the default
/// model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
// Each variant's message says what its fields hold.
#[allow(missing_docs)]
pub enum ModelError {
    /// A file of the model directory could not be read.
    /// (The I/O error is part of the message, not a source: `{err:#}` would print it twice.)
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A model id (`gpt2`, `org/name@revision`) that is no directory and that the Hugging Face
    /// cache does not hold ([`crate::resolve_model`]).
    #[error("{spec}: {reason}")]
    HubCache { spec: String, reason: String },
    /// The directory holds the weights or the tokenizer in a form this crate does not read (a
    /// PyTorch pickle, a sharded checkpoint, a slow tokenizer's vocabulary) instead of the one
    /// it does.
    #[error(
        "{} is missing; the directory has {found} instead, which attnscope does not read: \
         write {needed} once with transformers: `{how}`",
        dir.join(needed).display()
    )]
    NeedsConversion {
        dir: PathBuf,
        found: &'static str,
        needed: &'static str,
        how: String,
    },
    /// A file the model directory must hold is not there.
    #[error("{} is missing ({what})", path.display())]
    MissingFile { path: PathBuf, what: &'static str },
    /// The checkpoint holds a layer past those `config.json` sets: running only the first ones
    /// would be a different model, with no word of it.
    #[error(
        "model.safetensors holds {tensor}, a layer past the {n_layers} that config.json sets: \
         set the config's layer count to the checkpoint's"
    )]
    ExtraLayers { tensor: String, n_layers: usize },
    /// The config sets more layers than the checkpoint holds.
    #[error(
        "config.json sets {n_layers} layers, but model.safetensors has no tensor of layer \
         {layer} (none starts {prefix:?}): set the config's layer count to the checkpoint's"
    )]
    MissingLayers {
        n_layers: usize,
        layer: usize,
        prefix: String,
    },
    /// The model path names a file, not the directory that holds the model's files.
    #[error(
        "{} is a file, not a model directory: give the folder that holds config.json, \
         model.safetensors and tokenizer.json",
        path.display()
    )]
    NotADirectory { path: PathBuf },
    /// A JSON file (config, tokenizer, pooling) is malformed or lacks a field.
    #[error("{}: {reason}", path.display())]
    BadJson { path: PathBuf, reason: String },
    /// `config.json` names an architecture this crate does not run.
    #[error("unsupported model_type {model_type:?}; supported: {}", supported.join(", "))]
    UnsupportedModelType {
        model_type: String,
        supported: &'static [&'static str],
    },
    /// A config value is out of range or inconsistent with another.
    #[error("config.json: {field}: {reason}")]
    InvalidConfig { field: &'static str, reason: String },
    /// The safetensors header length is larger than the cap or than the file.
    #[error("{}: safetensors header claims {size} bytes, more than {limit}", path.display())]
    HeaderTooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    /// The safetensors file is too short to hold its 8-byte length prefix.
    #[error("{}: file is {len} bytes, too short for a safetensors header", path.display())]
    FileTooShort { path: PathBuf, len: u64 },
    /// The safetensors header is not the JSON it should be.
    #[error("{}: bad safetensors header: {reason}", path.display())]
    BadHeader { path: PathBuf, reason: String },
    /// A tensor's byte range does not lie inside the data section.
    #[error("{}: tensor {tensor} spans bytes {begin}..{end}, outside the {data_len}-byte data section", path.display())]
    TensorOutOfBounds {
        path: PathBuf,
        tensor: String,
        begin: u64,
        end: u64,
        data_len: u64,
    },
    /// Tensors overlap or leave a gap: the data section must be covered exactly, in order.
    #[error("{}: tensor {tensor} starts at byte {got}, expected {expected} (tensors must be contiguous, without gaps or overlaps)", path.display())]
    TensorNotContiguous {
        path: PathBuf,
        tensor: String,
        expected: u64,
        got: u64,
    },
    /// A tensor's byte length disagrees with its dtype and shape.
    #[error("{}: tensor {tensor} ({dtype} {shape:?}) needs {expected} bytes, its range holds {got}", path.display())]
    TensorByteLength {
        path: PathBuf,
        tensor: String,
        dtype: String,
        shape: Vec<usize>,
        expected: u64,
        got: u64,
    },
    /// A tensor the model needs has a dtype it cannot read.
    #[error("tensor {tensor}: dtype {dtype} is not supported (expected F32, F16, BF16 or F64)")]
    UnsupportedDtype { tensor: String, dtype: String },
    /// An F64 tensor holds a value beyond f32's range.
    #[error("tensor {tensor}: value {value:e} at flat index {index} does not fit in f32")]
    ValueOutOfRange {
        tensor: String,
        index: usize,
        value: f64,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("tensor {tensor} is missing from the checkpoint")]
    MissingTensor { tensor: String },
    /// The command needs a task head the checkpoint does not have.
    #[error(
        "{model} has no {wanted}: its config.json names {}",
        match architectures.is_empty() {
            true => "no architectures (a bare encoder or decoder, no task head)".to_string(),
            false => format!("the architectures {}", architectures.join(", ")),
        }
    )]
    NoHead {
        model: String,
        wanted: &'static str,
        architectures: Vec<String>,
    },
    /// A question that leaves its context no room in the model's window.
    #[error(
        "the question takes {tokens} tokens: with the {special} special tokens and the \
         {stride}-token overlap between windows of the context, that leaves no room for the \
         context in the model's {max}-token window; ask a shorter question"
    )]
    QuestionTooLong {
        tokens: usize,
        special: usize,
        max: usize,
        stride: usize,
    },
    /// The text of a masked-language-model prediction has no mask token.
    #[error("the text has no {mask} token: write {mask} where the model is to fill in a word")]
    NoMask { mask: String },
    /// A tensor's shape disagrees with the config.
    #[error("tensor {tensor}: config says shape {expected:?}, checkpoint has {got:?}")]
    TensorShape {
        tensor: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// `tokenizer.json` could not be loaded or failed on the text.
    #[error("tokenizer: {reason}")]
    Tokenizer { reason: String },
    /// One input of several run together ([`crate::Model::answer_all`]'s questions) failed
    /// before the run: `error` says how, `index` which (0-based, as [`ModelError::text`] gives it).
    #[error("{error}")]
    Input {
        index: usize,
        error: Box<ModelError>,
    },
    /// The text (or the text pair) is empty or only whitespace (every model here needs a word:
    /// BERT's tokenizer drops whitespace).
    #[error("the {which} is empty or only whitespace")]
    EmptyText { which: &'static str },
    /// A key/value cache was fed no tokens.
    #[error("no tokens to feed the key/value cache")]
    NoTokens,
    /// The text needs more tokens than the model reads: its positions, or for embeddings the
    /// `max_seq_length` of its sentence-transformers config.
    #[error("the text is {tokens} tokens long, more than {}", limit(*.max, *.embedding))]
    TooLong {
        tokens: usize,
        max: usize,
        /// The limit is sentence-transformers' `max_seq_length` (embeddings), not the positions.
        embedding: bool,
        /// Which of the texts embedded together (0-based), for the caller to name.
        text: Option<usize>,
    },
    /// A tokenizer whose ids run past the embedding's rows: its ids and the weights are of
    /// different models.
    #[error(
        "{file} has ids up to {max_id}, but the model's embedding has {rows} rows (vocab_size \
         {rows} in config.json): the tokenizer and the weights are not of the same model"
    )]
    VocabPastEmbedding {
        file: &'static str,
        max_id: u32,
        rows: usize,
    },
    /// An encoder-decoder model's source or target past the model's positions.
    #[error("the {which} is {tokens} tokens long, more than the model's {max} positions")]
    SideTooLong {
        which: &'static str,
        tokens: usize,
        max: usize,
    },
    /// A text with far more words than the model's positions whose first words alone pass the
    /// limit: refused without tokenizing the rest (tens of megabytes take tens of seconds and
    /// gigabytes).
    #[error(
        "the {which} has {words} words, and its first {first} alone are {tokens} tokens, more \
         than {}",
        limit(*.max, *.embedding)
    )]
    TooManyWords {
        /// "text" or "pair text".
        which: &'static str,
        words: usize,
        /// How many of its first words were tokenized, and the tokens they make.
        first: usize,
        tokens: usize,
        max: usize,
        /// As [`ModelError::TooLong`]'s.
        embedding: bool,
        /// As [`ModelError::TooLong`]'s.
        text: Option<usize>,
    },
    /// The tokenizer gave an encoding whose parts (ids, tokens, offsets, segments, special
    /// marks) differ in length, as a `tokenizer.json` whose post-processor lists a special
    /// token with more ids than tokens does.
    #[error(
        "tokenizer.json gives {ids} token ids but {tokens} tokens, {offsets} offsets, {segments} \
         segment ids and {special_marks} special-token marks for this text: its \
         post_processor's special_tokens must list as many tokens as ids"
    )]
    RaggedEncoding {
        ids: usize,
        tokens: usize,
        offsets: usize,
        segments: usize,
        special_marks: usize,
    },
    /// Text generation (a KV cache) was asked of a model that is not a decoder.
    #[error(
        "generating text needs a decoder (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2); {model} is a {model_type} model"
    )]
    NotADecoder {
        /// The model directory's name.
        model: String,
        /// Its `config.json` `model_type`.
        model_type: String,
    },
    /// A computation the model's family does not have yet (gradients and contributions run on
    /// the BERT family and GPT-2).
    #[error(
        "{what}: not available for {model_type} models yet; it runs on BERT, RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT and GPT-2"
    )]
    NotForFamily {
        /// What was asked.
        what: &'static str,
        /// The model's `config.json` `model_type`.
        model_type: String,
    },
    /// Decoding needs more positions than the KV cache holds: its capacity, at most the model's
    /// `n_positions`.
    #[error(
        "the KV cache holds {capacity} positions and {needed} are needed (the model has {n_positions}); use a shorter prompt or fewer new tokens"
    )]
    CacheFull {
        needed: usize,
        capacity: usize,
        n_positions: usize,
    },
    /// A token id outside the model's embedding table.
    #[error("token id {id} is outside the model's vocabulary of {vocab_size}")]
    TokenOutOfVocab { id: u32, vocab_size: usize },
    /// An id to decode that the tokenizer has no token for.
    #[error("the tokenizer has no token for id {id}")]
    UnknownTokenId { id: u32 },
    /// `embed` or `forward_batch` was called with no texts.
    #[error("no texts given: embedding or running a batch needs at least one")]
    EmptyBatch,
    /// An input built by the caller (an [`crate::Encoding`], a [`crate::ModelOutput`] handed
    /// back) disagrees with itself or with the model.
    #[error("{what}: {reason}")]
    InvalidInput { what: &'static str, reason: String },
    /// A sentence-transformers module this crate cannot reproduce.
    #[error("{}: {reason}", path.display())]
    UnsupportedPooling { path: PathBuf, reason: String },
    /// The thread pool could not be set up.
    #[error("threads: {reason}")]
    Threads { reason: String },
    /// The forward pass produced NaN or infinity: the weights hold one, or the activations
    /// overflowed f32.
    #[error(
        "the model produced a non-finite value ({value}) in {state} at token {token}: the checkpoint's weights hold NaN or infinity, or its activations overflow f32"
    )]
    NonFinite {
        /// Which activations held it: the final hidden state, or the last values a pass
        /// computed when it stops early.
        state: &'static str,
        /// Which of the texts run together (0-based), for the caller to name.
        text: usize,
        /// The token's position in its text.
        token: usize,
        value: f32,
    },
    /// A logit came out NaN or infinite from a finite hidden state: the output head (the
    /// untied `lm_head.weight`, or the tied embeddings) holds one, or the products overflow.
    #[error(
        "the model produced a non-finite logit ({value}) for token id {token} at position {position}: the checkpoint's output head (lm_head.weight or the tied embeddings) holds NaN or infinity, or its logits overflow f32"
    )]
    NonFiniteLogit {
        position: usize,
        token: usize,
        value: f32,
    },
    /// An attention call failed: in `layer` of the model, or outside one. (`error` is not a
    /// `source`: the message already holds it, and a chain would print it twice.)
    #[error("{}", attention_message(*layer, error))]
    Attention {
        layer: Option<usize>,
        error: AttnError,
    },
    /// Fetching the default model failed; `manual` says what to run by hand.
    #[error("fetching the default model failed: {reason}\nto install it by hand, run:\n{manual}")]
    Fetch { reason: String, manual: String },
    /// A downloaded file does not have the expected sha256.
    #[error("{}: sha256 is {got}, expected {expected}", path.display())]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        got: String,
    },
    /// An archive entry would be written outside the target directory.
    #[error("archive entry {name:?} escapes the target directory")]
    UnsafeArchivePath { name: String },
}

impl ModelError {
    /// An I/O error on `path`, which holds `what`; a missing file gets its own variant.
    pub(crate) fn io(path: impl Into<PathBuf>, what: &'static str, source: std::io::Error) -> Self {
        let path = path.into();
        let error = match source.kind() {
            std::io::ErrorKind::NotFound if !crate::config::present(&path) => {
                return ModelError::MissingFile { path, what };
            }
            // Not missing: a symbolic link whose target is.
            std::io::ErrorKind::NotFound => std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "a symbolic link whose target does not exist",
            ),
            _ => source,
        };
        ModelError::Io { path, error }
    }

    /// Which of several texts run together (0-based) the error is about, if it is about one:
    /// too many tokens, a score overflow, a non-finite hidden state.
    pub fn text(&self) -> Option<usize> {
        match self {
            ModelError::TooLong { text, .. } | ModelError::TooManyWords { text, .. } => *text,
            ModelError::Attention {
                error: AttnError::ScoreOverflow { batch, .. },
                ..
            } => Some(*batch),
            ModelError::NonFinite { text, .. } => Some(*text),
            ModelError::Input { index, .. } => Some(*index),
            _ => None,
        }
    }

    /// The error about text `index` (0-based) of several run together: the errors
    /// [`ModelError::text`] names take `index` as their text; other errors are unchanged.
    pub fn in_text(mut self, index: usize) -> ModelError {
        match &mut self {
            ModelError::TooLong { text, .. } | ModelError::TooManyWords { text, .. } => {
                *text = Some(index)
            }
            ModelError::Attention {
                error: AttnError::ScoreOverflow { batch, .. },
                ..
            } => *batch = index,
            ModelError::NonFinite { text, .. } => *text = index,
            ModelError::Input { index: at, .. } => *at = index,
            _ => {}
        }
        self
    }
}

fn limit(max: usize, embedding: bool) -> String {
    match embedding {
        true => format!(
            "the {max} that sentence-transformers embeds with this model (max_seq_length in \
             sentence_bert_config.json)"
        ),
        false => format!("the model's {max} positions"),
    }
}

impl From<AttnError> for ModelError {
    fn from(error: AttnError) -> Self {
        ModelError::Attention { layer: None, error }
    }
}

/// What a failed attention call says. In a model's layer the call's inputs are the model's own,
/// so a score overflow is the checkpoint's doing, not a scale, ALiBi slope or mask to turn down.
fn attention_message(layer: Option<usize>, error: &AttnError) -> String {
    match (layer, error) {
        (Some(layer), AttnError::ScoreOverflow { head, row, .. }) => format!(
            "layer {layer}, head {head}: the attention scores of token {row} overflow f32 \
             (scale · q·k passes ±3.4e38) although the hidden states are finite: the \
             checkpoint's query or key weights are far too large"
        ),
        (Some(layer), error) => format!("attention in layer {layer}: {error}"),
        (None, error) => format!("attention: {error}"),
    }
}
