//! Sentence embeddings as sentence-transformers computes them: the `modules.json` pipeline
//! (Transformer → Pooling → Normalize), of which mean pooling and L2 normalisation are supported,
//! with the Transformer module's `sentence_bert_config.json` (`max_seq_length`, `do_lower_case`).
//!
//! Mirrors `sentence_transformers/models/Transformer.py`, `Pooling.py` and `Normalize.py`
//! (<https://github.com/UKPLab/sentence-transformers/blob/v3.0.1/sentence_transformers/models/Pooling.py>).

use std::path::Path;

use serde::Deserialize;

use crate::ModelError;
use crate::config::{present, read_text};

/// How texts become one sentence vector each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    /// Divide by the L2 norm after pooling (a `Normalize` module).
    pub normalize: bool,
    /// The most tokens a text is embedded with (`max_seq_length`); `None`: the model's positions.
    pub max_seq_length: Option<usize>,
    /// Lower-case each text before tokenizing it (`do_lower_case`).
    pub lower_case: bool,
    /// Whether the directory is a sentence-transformers model (it has `modules.json`): one
    /// trained to make sentence embeddings, not only a checkpoint pooled by default.
    pub sentence_transformers: bool,
}

#[derive(Deserialize)]
struct TransformerJson {
    #[serde(default)]
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PoolingJson {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

impl Pooling {
    /// Reads `modules.json` of a sentence-transformers directory. A plain transformers
    /// checkpoint (no `modules.json`) gets what sentence-transformers builds for one: mean
    /// pooling, no normalisation, texts up to the model's positions.
    pub fn from_dir(dir: &Path) -> Result<Pooling, ModelError> {
        let modules_path = dir.join("modules.json");
        let mut pooling = Pooling {
            normalize: false,
            max_seq_length: None,
            lower_case: false,
            sentence_transformers: false,
        };
        if !present(&modules_path) {
            return Ok(pooling);
        }
        pooling.sentence_transformers = true;
        let bad = |path: &Path, e: serde_json::Error| ModelError::BadJson {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let modules: Vec<Module> = serde_json::from_str(&read_text(
            &modules_path,
            "sentence-transformers modules.json",
        )?)
        .map_err(|e| bad(&modules_path, e))?;
        let mut pooled = false;
        for m in &modules {
            let kind = m.kind.rsplit('.').next().unwrap_or_default();
            match kind {
                "Transformer" => {
                    let path = dir.join(&m.path).join("sentence_bert_config.json");
                    if present(&path) {
                        let t: TransformerJson =
                            serde_json::from_str(&read_text(&path, "sentence_bert_config.json")?)
                                .map_err(|e| bad(&path, e))?;
                        if t.max_seq_length == Some(0) {
                            return Err(ModelError::UnsupportedPooling {
                                path,
                                reason: "max_seq_length is 0".into(),
                            });
                        }
                        pooling.max_seq_length = t.max_seq_length;
                        pooling.lower_case = t.do_lower_case;
                    }
                }
                "Pooling" => {
                    let path = dir.join(&m.path).join("config.json");
                    let p: PoolingJson =
                        serde_json::from_str(&read_text(&path, "the pooling config")?)
                            .map_err(|e| bad(&path, e))?;
                    let others = p.pooling_mode_cls_token
                        || p.pooling_mode_max_tokens
                        || p.pooling_mode_mean_sqrt_len_tokens
                        || p.pooling_mode_weightedmean_tokens
                        || p.pooling_mode_lasttoken;
                    if !p.pooling_mode_mean_tokens || others {
                        return Err(ModelError::UnsupportedPooling {
                            path,
                            reason:
                                "only mean pooling (pooling_mode_mean_tokens alone) is supported"
                                    .into(),
                        });
                    }
                    pooled = true;
                }
                "Normalize" => pooling.normalize = true,
                other => {
                    return Err(ModelError::UnsupportedPooling {
                        path: modules_path.clone(),
                        reason: format!(
                            "module type {other:?} is not supported (Transformer, Pooling, Normalize)"
                        ),
                    });
                }
            }
        }
        if !pooled {
            return Err(ModelError::UnsupportedPooling {
                path: modules_path,
                reason: "no Pooling module".into(),
            });
        }
        Ok(pooling)
    }

    /// The mean of the first `len` rows of `states`, L2-normalised if asked (with PyTorch's
    /// `normalize` floor of 1e-12 on the norm).
    ///
    /// # Shapes
    /// - `states`: `[seq_len, hidden]` with `seq_len ≥ len ≥ 1`; returns `[hidden]`
    pub fn pool(&self, states: &[f32], hidden: usize, len: usize) -> Vec<f32> {
        let mut sum = vec![0.0f32; hidden];
        for row in states.chunks_exact(hidden).take(len) {
            sum.iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        let inv_len = 1.0 / len as f32;
        sum.iter_mut().for_each(|s| *s *= inv_len);
        if self.normalize {
            let norm = sum.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
            sum.iter_mut().for_each(|s| *s /= norm);
        }
        sum
    }
}
