//! Views of attention: terminal bars, heatmaps, HTML, rollout, head statistics.
//!
//! Views consume an [`AttentionMaps`]: tokens and a `[layers, heads, T, T]` weight tensor. They
//! never reach into a model's internals.

/// One token as the views show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Token {
    /// The token as the tokenizer writes it (`"##iff"`, `"Ġcat"`, `"[CLS]"`).
    pub text: String,
    pub id: u32,
    /// Byte span of the token in its segment's text; `None` for special tokens.
    pub span: Option<(usize, usize)>,
    /// 0 for the first text, 1 for the pair.
    pub segment: usize,
    /// `[CLS]`, `[SEP]`, `<|endoftext|>` and alike.
    pub special: bool,
}

/// Every layer's and head's attention for one text (or a sentence pair).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionMaps {
    /// The model's name or directory, for titles.
    pub model: String,
    pub text: String,
    pub pair: Option<String>,
    pub tokens: Vec<Token>,
    pub n_layers: usize,
    pub n_heads: usize,
    /// `[n_layers, n_heads, T, T]`, row = query token, column = key token; rows sum to 1.
    pub weights: Vec<f32>,
}
