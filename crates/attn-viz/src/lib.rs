//! Views of attention: terminal bars, heatmaps, HTML, rollout, head statistics.
//!
//! Views consume an [`AttentionMaps`]: tokens and a `[layers, heads, T, T]` weight tensor. They
//! never reach into a model's internals.
//!
//! - [`words`]: subword tokens merged back into the words of the input;
//! - [`select`]: which attention to look at (one head, a layer's mean, all, rollout);
//! - [`flow`]: attention flow (Abnar & Zuidema 2020);
//! - [`explain`]: which words one word attends to, as bars in a terminal;
//! - [`heatmap`]: PNG/SVG pictures; [`stats`]: per-head statistics; [`lookup`]: attention as a
//!   soft database lookup over embeddings.

pub mod bars;
pub mod error;
pub mod explain;
pub mod flow;
pub mod heatmap;
pub mod html;
pub mod lookup;
pub mod select;
pub mod stats;
pub mod words;

pub use error::VizError;

/// How far a row of attention weights may sum from 1 ([`AttentionMaps::validate`]): room for
/// f32 sums and for weights saved with 4 decimals (rows of 512 drift by up to 0.004), none for
/// ones that are not a softmax. Weights cut to 3 decimals drift further on long rows (up to
/// 0.05 at 512 tokens, the small ones all rounding to 0) and are refused.
pub const ROW_SUM_TOLERANCE: f32 = 0.01;

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
    /// With `rows`, `[n_layers, n_heads, rows.len(), T]`: only those query tokens' rows.
    pub weights: Vec<f32>,
    /// The query tokens `weights` holds the rows of, ascending, when not every token's: what
    /// `explain --focus` needs of a long prompt, where every row would not fit in memory.
    /// Only [`AttentionMaps::validate_rows`] and [`AttentionMaps::row`] take such maps; every
    /// view that needs whole matrices refuses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<usize>>,
}

impl AttentionMaps {
    /// Number of tokens `T`.
    pub fn seq_len(&self) -> usize {
        self.tokens.len()
    }

    /// The text of segment 0 (the text) or 1 (the pair).
    pub fn segment_text(&self, segment: usize) -> Option<&str> {
        match segment {
            0 => Some(&self.text),
            1 => self.pair.as_deref(),
            _ => None,
        }
    }

    /// Token `index`'s segment text and, when it has a span, its piece of that text; an error
    /// when the segment has no text or the span is not a character range of it.
    pub fn token_text(&self, index: usize) -> Result<(&str, Option<&str>), VizError> {
        let token = &self.tokens[index];
        let text = self
            .segment_text(token.segment)
            .ok_or(VizError::BadSegment {
                index,
                segment: token.segment,
            })?;
        let piece = match token.span {
            None => None,
            Some(span) => Some(text.get(span.0..span.1).ok_or(VizError::BadSpan {
                index,
                span,
                text_len: text.len(),
            })?),
        };
        Ok((text, piece))
    }

    /// Checks what every view relies on: at least one token, each of a segment with a text and
    /// a span inside it (when it has one), at least one layer and head, a weight
    /// tensor of `[n_layers, n_heads, T, T]` values, each finite and not negative, each row
    /// summing to 1 within [`ROW_SUM_TOLERANCE`] (maps of 2.0 everywhere gave `heads` an entropy
    /// of −27.7 and shares of 2.00). Maps of some rows only ([`AttentionMaps::rows`]) are
    /// refused: see [`AttentionMaps::validate_rows`].
    pub fn validate(&self) -> Result<(), VizError> {
        self.validate_rows()?;
        match &self.rows {
            Some(rows) => Err(VizError::RowsOnly {
                held: rows.len(),
                seq_len: self.seq_len(),
            }),
            None => Ok(()),
        }
    }

    /// [`AttentionMaps::validate`] for maps that may hold some rows only: `rows` ascending and
    /// in range, `weights` `[n_layers, n_heads, rows.len(), T]`, each row a distribution.
    pub fn validate_rows(&self) -> Result<(), VizError> {
        let t = self.seq_len();
        if t == 0 {
            return Err(VizError::NoTokens);
        }
        if self.n_layers == 0 || self.n_heads == 0 {
            return Err(VizError::NoHeads {
                n_layers: self.n_layers,
                n_heads: self.n_heads,
            });
        }
        if let Some(rows) = &self.rows
            && let Some(w) = rows.windows(2).find(|w| w[0] >= w[1])
        {
            return Err(VizError::BadRows {
                reason: format!("row {} follows row {}: rows must ascend", w[1], w[0]),
            });
        }
        if let Some(&row) = self.rows.iter().flatten().find(|&&r| r >= t) {
            return Err(VizError::BadRows {
                reason: format!("row {row} is past the {t} tokens"),
            });
        }
        let held = self.rows.as_ref().map_or(t, Vec::len);
        let expected = self
            .n_layers
            .checked_mul(self.n_heads)
            .and_then(|n| n.checked_mul(held))
            .and_then(|n| n.checked_mul(t));
        if expected != Some(self.weights.len()) {
            let (n_layers, n_heads, got) = (self.n_layers, self.n_heads, self.weights.len());
            return Err(match self.rows {
                Some(_) => VizError::RowsShape {
                    n_layers,
                    n_heads,
                    rows: held,
                    seq_len: t,
                    got,
                },
                None => VizError::WeightsShape {
                    n_layers,
                    n_heads,
                    seq_len: t,
                    got,
                },
            });
        }
        // Every view reads a token's text through these: `heads` and `html` took maps that
        // `explain` and `heatmap` refused.
        for index in 0..t {
            self.token_text(index)?;
        }
        let query = |at: usize| match &self.rows {
            Some(rows) => rows[at % held],
            None => at % held,
        };
        if let Some(pos) = self.weights.iter().position(|w| !w.is_finite() || *w < 0.0) {
            let per_head = held * t;
            return Err(VizError::BadWeight {
                layer: pos / (self.n_heads * per_head),
                head: pos / per_head % self.n_heads,
                row: query(pos / t),
                col: pos % t,
                value: self.weights[pos],
            });
        }
        for (at, row) in self.weights.chunks_exact(t).enumerate() {
            // In f64: f32 sums of 512 weights near 1 drift by more than the rounding of each.
            let sum = row.iter().map(|&w| f64::from(w)).sum::<f64>();
            if (sum - 1.0).abs() > f64::from(ROW_SUM_TOLERANCE) {
                return Err(VizError::RowSum {
                    layer: at / (self.n_heads * held),
                    head: at / held % self.n_heads,
                    row: query(at),
                    sum: sum as f32,
                });
            }
        }
        Ok(())
    }

    /// The query tokens whose rows `weights` holds: every token, or [`AttentionMaps::rows`].
    pub fn held_rows(&self) -> Vec<usize> {
        match &self.rows {
            Some(rows) => rows.clone(),
            None => (0..self.seq_len()).collect(),
        }
    }

    /// Token `query`'s weights over the `T` keys in `layer`, `head`; `None` when an index is
    /// out of range or the maps do not hold that row.
    pub fn row(&self, layer: usize, head: usize, query: usize) -> Option<&[f32]> {
        let t = self.seq_len();
        if layer >= self.n_layers || head >= self.n_heads || query >= t {
            return None;
        }
        let (held, at) = match &self.rows {
            Some(rows) => (rows.len(), rows.binary_search(&query).ok()?),
            None => (t, query),
        };
        let start = ((layer * self.n_heads + head) * held + at) * t;
        self.weights.get(start..start + t)
    }

    /// Checks that `layer` exists.
    pub fn check_layer(&self, layer: usize) -> Result<(), VizError> {
        if layer >= self.n_layers {
            return Err(VizError::LayerOutOfRange {
                layer,
                n_layers: self.n_layers,
            });
        }
        Ok(())
    }

    /// Checks that `head` exists.
    pub fn check_head(&self, head: usize) -> Result<(), VizError> {
        if head >= self.n_heads {
            return Err(VizError::HeadOutOfRange {
                head,
                n_heads: self.n_heads,
            });
        }
        Ok(())
    }

    /// One head's weights.
    ///
    /// # Shapes
    /// Returns `[T, T]` (row = query, column = key) out of `weights: [n_layers, n_heads, T, T]`.
    pub fn head(&self, layer: usize, head: usize) -> Result<&[f32], VizError> {
        self.check_layer(layer)?;
        self.check_head(head)?;
        let per_head = self.seq_len() * self.seq_len();
        let start = (layer * self.n_heads + head) * per_head;
        self.weights
            .get(start..start + per_head)
            .ok_or(VizError::WeightsShape {
                n_layers: self.n_layers,
                n_heads: self.n_heads,
                seq_len: self.seq_len(),
                got: self.weights.len(),
            })
    }
}
