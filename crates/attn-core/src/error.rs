//! The one error type of `attn-core`: every variant names what was wrong.

/// What went wrong in an attention call or in building a module.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
// Each variant's message says what its fields hold.
#[allow(missing_docs)]
pub enum AttnError {
    /// A tensor's length or shape disagrees with what the call needs.
    #[error("{tensor}: expected shape {expected:?}, got {got:?}")]
    ShapeMismatch {
        tensor: &'static str,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A tensor has the wrong number of dims.
    #[error("{tensor}: expected {expected} dims, got shape {got:?}")]
    RankMismatch {
        tensor: &'static str,
        expected: usize,
        got: Vec<usize>,
    },
    /// A tensor's element count disagrees with its declared shape.
    #[error("{tensor}: shape {shape:?} needs {expected} elements, got {got}")]
    LengthMismatch {
        tensor: &'static str,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    /// A mask cannot be broadcast to the score matrix.
    #[error("{tensor}: shape {got:?} does not broadcast to {target:?}")]
    NotBroadcastable {
        tensor: &'static str,
        got: Vec<usize>,
        target: Vec<usize>,
    },
    /// `n_heads` is not a multiple of `n_kv_heads` (grouped-query attention).
    #[error("n_heads ({n_heads}) is not a multiple of n_kv_heads ({n_kv_heads})")]
    HeadsNotDivisible { n_heads: usize, n_kv_heads: usize },
    /// A score overflowed f32 although q, k and v are finite (`scale · q·k`, with ALiBi and the
    /// float mask, beyond ±3.4e38): the row's softmax would be NaN, or, when every score of a
    /// row the masks leave keys falls to `-inf`, the row would pass for one that sees none.
    #[error(
        "the scores of query row {row} (batch {batch}, head {head}) overflow f32: scale · q·k \
         (with ALiBi and the float mask) passes ±3.4e38 although q, k and v are finite; scale \
         the inputs, the scale, the ALiBi slopes or the float mask down"
    )]
    ScoreOverflow {
        batch: usize,
        head: usize,
        row: usize,
    },
    /// A gradient overflowed f32 although every input is finite: `dout`, `v` or the scores
    /// are too large for the products of the backward pass (`dP = dout·vᵀ`, `dS·k`, `dS·q`,
    /// `Pᵀ·dout`).
    #[error(
        "{tensor} overflows f32 at flat index {index} although q, k, v and dout are finite: \
         the products of the backward pass (dout·vᵀ, dS·k, dS·q, Pᵀ·dout) pass ±3.4e38; \
         scale dout (or v, or the scores) down"
    )]
    GradientOverflow { tensor: &'static str, index: usize },
    /// Keys and values need at least one head (queries may have none: the output is empty).
    #[error("n_kv_heads is 0 (n_heads {n_heads}): keys and values need at least one head")]
    NoKvHeads { n_heads: usize },
    /// `embed_dim` is not a multiple of `num_heads` (multi-head attention).
    #[error("embed_dim ({embed_dim}) is not a multiple of num_heads ({num_heads})")]
    EmbedNotDivisible { embed_dim: usize, num_heads: usize },
    /// A tensor a module needs is missing from its state dict.
    #[error("state dict: missing tensor {name}")]
    MissingTensor { name: &'static str },
    /// A state dict holds a tensor the module does not know (PyTorch's "unexpected key").
    #[error("state dict: unexpected tensor {name}; known tensors: {known}")]
    UnexpectedTensor { name: String, known: &'static str },
    /// A per-head list (ALiBi slopes) has the wrong length.
    #[error("{what}: expected {expected} values (one per query head), got {got}")]
    PerHeadLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// An option value is outside its valid range.
    #[error("{option}: {reason}")]
    InvalidOption {
        option: &'static str,
        reason: String,
    },
    /// A query row index asked for in the weights is out of range.
    #[error("weights row {row} is out of range: seq_q is {seq_q}")]
    RowOutOfRange { row: usize, seq_q: usize },
    /// A tensor holds NaN or infinity where a finite value is needed.
    #[error("{tensor} holds a non-finite value ({value}) at flat index {index}")]
    NonFinite {
        tensor: &'static str,
        index: usize,
        value: f32,
    },
    /// A call with `head_dim` 0 declares more scores than
    /// [`crate::shape::MAX_EMPTY_HEAD_SCORES`]: its queries and keys hold nothing, so the
    /// inputs bound neither its work nor its per-row state.
    #[error(
        "head_dim is 0, so q and k hold no values, yet the call declares {scores} scores \
         ({shape:?}); such a call may declare at most {max}"
    )]
    EmptyHeadTooLarge {
        shape: Vec<usize>,
        scores: u128,
        max: usize,
    },
    /// The requested result would need more memory than is reasonable to allocate.
    /// `bytes` is `u128::MAX` when the shape's element count overflows `usize`.
    #[error("{}", too_large_text(what, shape, *bytes))]
    TooLarge {
        what: &'static str,
        shape: Vec<usize>,
        bytes: u128,
    },
}

/// [`AttnError::TooLarge`]'s message, with what to do about it: weights can be asked for in
/// less room; a shape too large for its per-row state cannot.
fn too_large_text(what: &str, shape: &[usize], bytes: u128) -> String {
    let hint = if what == "attention weights" {
        "; ask for fewer rows or the head average"
    } else {
        ""
    };
    if bytes == u128::MAX {
        format!("{what}: shape {shape:?} has more elements than can be counted{hint}")
    } else {
        format!(
            "{what} would need {bytes} bytes ({shape:?} f32 values), too many to allocate{hint}"
        )
    }
}
