//! Task heads on top of a checkpoint's encoder or decoder, as transformers builds them: the
//! head `architectures` in `config.json` names, read from the same `model.safetensors`.
//!
//! - `…ForSequenceClassification`: BERT's pooler (`tanh` of a dense layer on `[CLS]`) then
//!   `classifier`; DistilBERT's `pre_classifier` (ReLU) then `classifier`, on `[CLS]`;
//!   RoBERTa's `classifier.dense` (`tanh`) then `classifier.out_proj`, on `<s>`; GPT-2's `score`
//!   (no bias) on the last token that is not the pad token.
//! - `…ForQuestionAnswering`: `qa_outputs`, a start and an end logit per token.
//! - `…ForMaskedLM`: a dense layer, the activation and a LayerNorm, then the word embeddings
//!   (tied) or the checkpoint's own decoder, with a bias per vocabulary entry.
//! - `GPT2LMHeadModel`: the language-model head every GPT-2 here has.
//!
//! (<https://github.com/huggingface/transformers/blob/v4.57.0/src/transformers/models/bert/modeling_bert.py>,
//! `.../distilbert/modeling_distilbert.py`, `.../roberta/modeling_roberta.py`,
//! `.../gpt2/modeling_gpt2.py`.)

use std::collections::BTreeMap;

use faer::Par;
use serde::Deserialize;

use crate::checkpoint::WeightData;
use crate::checkpoint::{Checkpoint, F32Data};
use crate::ops::{Epilogue, Gemm, GemmKernel, LayerNorm, Linear, WeightLayout, gemm_bt, tanh};
use crate::{Activation, Encoding, Family, ModelConfig, ModelError, ModelOutput};

/// What a checkpoint's head does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// `…ForSequenceClassification`: labels for a text or a pair.
    Classification,
    /// `…ForQuestionAnswering`: the span of a context that answers a question.
    QuestionAnswering,
    /// `…ForMaskedLM`: the tokens behind each `[MASK]` (fill-mask).
    MaskedLm,
    /// `GPT2LMHeadModel`: the next token.
    NextToken,
}

impl Task {
    /// The task in words, for messages.
    pub fn describe(self) -> &'static str {
        match self {
            Task::Classification => "sequence-classification head (…ForSequenceClassification)",
            Task::QuestionAnswering => "question-answering head (…ForQuestionAnswering)",
            Task::MaskedLm => "masked-language-model head (…ForMaskedLM)",
            Task::NextToken => "language-model head (GPT2LMHeadModel)",
        }
    }

    /// The task of architecture `name` (`"BertForSequenceClassification"`), if attnscope runs
    /// it.
    fn of(name: &str) -> Option<Task> {
        [
            ("ForSequenceClassification", Task::Classification),
            ("ForQuestionAnswering", Task::QuestionAnswering),
            ("ForMaskedLM", Task::MaskedLm),
            ("LMHeadModel", Task::NextToken),
            ("ForCausalLM", Task::NextToken),
        ]
        .into_iter()
        .find_map(|(suffix, task)| name.ends_with(suffix).then_some(task))
    }
}

/// How a classifier's logits become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    /// One label per text (`problem_type` single-label, or unset with several labels).
    Softmax,
    /// Any number of labels per text (`problem_type` multi-label): each its own sigmoid.
    Sigmoid,
    /// A regression (`num_labels` 1, or `problem_type` regression): the logit itself.
    Raw,
}

/// A classifier's verdict on one text.
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    /// The logits, in label id order.
    pub logits: Vec<f32>,
    /// Every label with its score, highest first (ties keep id order).
    pub ranked: Vec<(String, f32)>,
    /// How the scores were made from the logits.
    pub scoring: Scoring,
    /// The token the head read (`[CLS]`, or GPT-2's last real token).
    pub pooled_token: usize,
}

/// The start and end logits of a question-answering head for one text.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanLogits {
    /// `[T]`
    pub start: Vec<f32>,
    /// `[T]`
    pub end: Vec<f32>,
}

/// Which token a classifier reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooled {
    /// The first (`[CLS]`, `<s>`).
    First,
    /// The last token whose id is not this pad id (GPT-2), or the last token without one.
    LastNotPad(Option<u32>),
}

/// The dense layer before a classifier's output layer, and its activation.
enum PreActivation {
    Tanh,
    Relu,
}

pub(crate) struct ClassifierHead {
    pre: Option<(Linear, PreActivation)>,
    out: Linear,
    pooled: Pooled,
    labels: Vec<String>,
    scoring: Scoring,
}

pub(crate) struct MaskedLmHead {
    transform: Linear,
    activation: Activation,
    norm: LayerNorm,
    /// `[vocab, hidden]`; `None`: the word embeddings (tied).
    decoder: Option<F32Data>,
    /// `[vocab]`
    bias: Vec<f32>,
}

/// The head of a loaded checkpoint.
pub(crate) enum Head {
    /// A bare encoder (`BertModel`), or an architecture attnscope runs without its head.
    None,
    Classifier(ClassifierHead),
    QuestionAnswering(Linear),
    MaskedLm(MaskedLmHead),
    /// GPT-2's language-model head, part of the model's own weights.
    NextToken,
}

/// The fields of `config.json` the heads read.
#[derive(Deserialize, Default)]
struct HeadJson {
    #[serde(default)]
    architectures: Option<Vec<String>>,
    #[serde(default)]
    id2label: Option<BTreeMap<String, String>>,
    #[serde(default)]
    num_labels: Option<usize>,
    #[serde(default)]
    problem_type: Option<String>,
    #[serde(default)]
    pad_token_id: Option<u32>,
}

/// What a directory's `config.json` says of its head: its architectures, and the task of the
/// first that attnscope runs.
pub(crate) struct HeadConfig {
    pub(crate) architectures: Vec<String>,
    json: HeadJson,
}

impl HeadConfig {
    /// The head's fields of `text`, a `config.json` that [`ModelConfig`] read.
    pub(crate) fn from_json(text: &str) -> Result<HeadConfig, ModelError> {
        let json: HeadJson = serde_json::from_str(text).map_err(|e| ModelError::InvalidConfig {
            field: "architectures",
            reason: e.to_string(),
        })?;
        Ok(HeadConfig {
            architectures: json.architectures.clone().unwrap_or_default(),
            json,
        })
    }

    /// The task of the checkpoint's head, if `architectures` names one attnscope runs.
    pub(crate) fn task(&self) -> Option<Task> {
        self.architectures.first().and_then(|a| Task::of(a))
    }

    /// The labels in id order: `id2label`, else `LABEL_i` for `num_labels`.
    fn labels(&self, n: usize) -> Result<Vec<String>, ModelError> {
        let Some(map) = &self.json.id2label else {
            return Ok((0..n).map(|i| format!("LABEL_{i}")).collect());
        };
        let mut labels = vec![None; map.len()];
        for (id, label) in map {
            let at = id.parse::<usize>().ok().filter(|&i| i < map.len());
            let Some(at) = at else {
                return Err(ModelError::InvalidConfig {
                    field: "id2label",
                    reason: format!("key {id:?} is not a label id from 0 to {}", map.len() - 1),
                });
            };
            labels[at] = Some(label.clone());
        }
        Ok(labels.into_iter().flatten().collect())
    }

    fn scoring(&self, n: usize) -> Result<Scoring, ModelError> {
        match self.json.problem_type.as_deref() {
            Some("regression") => Ok(Scoring::Raw),
            Some("multi_label_classification") => Ok(Scoring::Sigmoid),
            Some("single_label_classification") => Ok(Scoring::Softmax),
            None if n == 1 => Ok(Scoring::Raw),
            None => Ok(Scoring::Softmax),
            Some(other) => Err(ModelError::InvalidConfig {
                field: "problem_type",
                reason: format!(
                    "{other:?} is not one of regression, single_label_classification, \
                     multi_label_classification"
                ),
            }),
        }
    }
}

/// A PyTorch `nn.Linear` named `name` (`weight` `[n_out, n_in]`, and `bias` unless
/// `!with_bias`, where it is 0).
fn linear(
    ckpt: &Checkpoint,
    name: &str,
    (n_in, n_out): (usize, usize),
    with_bias: bool,
) -> Result<Linear, ModelError> {
    let bias = match with_bias {
        true => ckpt.f32(&format!("{name}.bias"), &[n_out])?,
        false => vec![0.0; n_out],
    };
    Ok(Linear::new(
        WeightData::F32(ckpt.f32_data(&format!("{name}.weight"), &[n_out, n_in])?),
        WeightLayout::OutIn,
        bias,
        n_in,
        n_out,
    ))
}

/// The first of `names` the checkpoint holds (a tied parameter is saved under one of its
/// names only).
fn first_present<'a>(ckpt: &Checkpoint, names: &[&'a str]) -> Option<&'a str> {
    names.iter().copied().find(|n| ckpt.contains(n))
}

impl Head {
    /// Reads the head `head` names from `ckpt`, checking each tensor against `config`.
    pub(crate) fn load(
        ckpt: &Checkpoint,
        config: &ModelConfig,
        head: &HeadConfig,
    ) -> Result<Head, ModelError> {
        let h = config.hidden_size;
        match head.task() {
            None => Ok(Head::None),
            Some(Task::NextToken) => match config.family {
                Family::Gpt2 | Family::Llama => Ok(Head::NextToken),
                _ => Ok(Head::None),
            },
            Some(task) if config.family == Family::Llama => Err(ModelError::InvalidConfig {
                field: "architectures",
                reason: format!(
                    "a {} of a {} model is not supported yet (its causal LM is)",
                    task.describe(),
                    config.model_type
                ),
            }),
            Some(Task::QuestionAnswering) => Ok(Head::QuestionAnswering(linear(
                ckpt,
                "qa_outputs",
                (h, 2),
                true,
            )?)),
            Some(Task::Classification) => classifier(ckpt, config, head).map(Head::Classifier),
            Some(Task::MaskedLm) => masked_lm(ckpt, config).map(Head::MaskedLm),
        }
    }
}

fn classifier(
    ckpt: &Checkpoint,
    config: &ModelConfig,
    head: &HeadConfig,
) -> Result<ClassifierHead, ModelError> {
    let h = config.hidden_size;
    let out_name = match config.family {
        Family::Roberta => "classifier.out_proj",
        Family::Gpt2 | Family::Llama => "score",
        Family::Bert | Family::DistilBert => "classifier",
    };
    // The output layer's rows are the labels: read them from the tensor, then check the config.
    let rows = ckpt
        .info(&format!("{out_name}.weight"))
        .map(|t| t.shape.first().copied().unwrap_or(0))
        .ok_or_else(|| ModelError::MissingTensor {
            tensor: format!("{out_name}.weight"),
        })?;
    let n = head
        .json
        .num_labels
        .or(head.json.id2label.as_ref().map(BTreeMap::len));
    if let Some(n) = n.filter(|&n| n != rows) {
        return Err(ModelError::InvalidConfig {
            field: "num_labels",
            reason: format!(
                "config.json gives {n} labels but {out_name}.weight has {rows} rows, one per label"
            ),
        });
    }
    let labels = head.labels(rows)?;
    if labels.len() != rows {
        return Err(ModelError::InvalidConfig {
            field: "id2label",
            reason: format!(
                "{} labels for the {rows} rows of {out_name}.weight",
                labels.len()
            ),
        });
    }
    let pre = match config.family {
        Family::Bert => {
            // Under the task prefix, or none (a checkpoint saved from the bare BertModel).
            let probe = ["bert.pooler.dense.weight", "pooler.dense.weight"];
            let name = first_present(ckpt, &probe).unwrap_or(probe[0]);
            let name = name.trim_end_matches(".weight");
            Some((linear(ckpt, name, (h, h), true)?, PreActivation::Tanh))
        }
        Family::Roberta => Some((
            linear(ckpt, "classifier.dense", (h, h), true)?,
            PreActivation::Tanh,
        )),
        Family::DistilBert => Some((
            linear(ckpt, "pre_classifier", (h, h), true)?,
            PreActivation::Relu,
        )),
        Family::Gpt2 | Family::Llama => None,
    };
    Ok(ClassifierHead {
        pre,
        out: linear(ckpt, out_name, (h, rows), config.family != Family::Gpt2)?,
        pooled: match config.family {
            Family::Gpt2 => Pooled::LastNotPad(head.json.pad_token_id),
            _ => Pooled::First,
        },
        labels,
        scoring: head.scoring(rows)?,
    })
}

fn masked_lm(ckpt: &Checkpoint, config: &ModelConfig) -> Result<MaskedLmHead, ModelError> {
    let (h, v) = (config.hidden_size, config.vocab_size);
    // (dense, its activation, LayerNorm, LayerNorm eps, decoder weight, bias names)
    let (dense, activation, norm_name, eps, decoder, biases): (_, _, _, _, _, &[&str]) =
        match config.family {
            Family::Bert => (
                "cls.predictions.transform.dense",
                config.activation,
                "cls.predictions.transform.LayerNorm",
                config.layer_norm_eps,
                "cls.predictions.decoder.weight",
                &["cls.predictions.bias", "cls.predictions.decoder.bias"],
            ),
            Family::DistilBert => (
                "vocab_transform",
                config.activation,
                "vocab_layer_norm",
                1e-12,
                "vocab_projector.weight",
                &["vocab_projector.bias"],
            ),
            Family::Roberta => (
                "lm_head.dense",
                Activation::GeluErf,
                "lm_head.layer_norm",
                config.layer_norm_eps,
                "lm_head.decoder.weight",
                &["lm_head.bias", "lm_head.decoder.bias"],
            ),
            Family::Gpt2 | Family::Llama => {
                return Err(ModelError::InvalidConfig {
                    field: "architectures",
                    reason: format!("{} has no masked-language-model head", config.model_type),
                });
            }
        };
    let bias_name = first_present(ckpt, biases).ok_or_else(|| ModelError::MissingTensor {
        tensor: biases[0].to_string(),
    })?;
    Ok(MaskedLmHead {
        transform: linear(ckpt, dense, (h, h), true)?,
        activation,
        norm: LayerNorm {
            gamma: ckpt.f32(&format!("{norm_name}.weight"), &[h])?,
            beta: ckpt.f32(&format!("{norm_name}.bias"), &[h])?,
            eps,
            rms: false,
        },
        decoder: match ckpt.contains(decoder) {
            true => Some(ckpt.f32_data(decoder, &[v, h])?),
            false => None,
        },
        bias: ckpt.f32(bias_name, &[v])?,
    })
}

/// One thread, f32: the heads multiply a handful of rows.
const HEAD_GEMM: Gemm = Gemm {
    par: Par::Seq,
    kernel: GemmKernel::F32,
};

impl ClassifierHead {
    pub(crate) fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The position of the token the classifier reads in a text of these `ids`.
    pub(crate) fn pooled_at(&self, ids: &[u32]) -> usize {
        match self.pooled {
            Pooled::First => 0,
            // transformers takes the argmax of position · (id ≠ pad): 0 when every token is
            // the pad token.
            Pooled::LastNotPad(Some(pad)) => ids.iter().rposition(|&id| id != pad).unwrap_or(0),
            Pooled::LastNotPad(None) => ids.len().saturating_sub(1),
        }
    }

    /// Logit `label` of the pooled token's hidden state `x`, and its gradient with respect to
    /// `x`: back through the output layer and the dense layer and activation before it.
    pub(crate) fn logit_grad(&self, x: &[f32], label: usize) -> (f32, Vec<f32>) {
        let h = self.out.n_in;
        let (pooled, pre) = match &self.pre {
            None => (x.to_vec(), None),
            Some((dense, act)) => {
                let mut z = vec![0.0; h];
                dense.forward(x, &mut z, Epilogue::Bias, HEAD_GEMM);
                let y: Vec<f32> = match act {
                    PreActivation::Relu => z.iter().map(|v| v.max(0.0)).collect(),
                    PreActivation::Tanh => z.iter().map(|&v| tanh(v)).collect(),
                };
                (y, Some((dense, act, z)))
            }
        };
        let mut logits = vec![0.0; self.out.n_out];
        self.out
            .forward(&pooled, &mut logits, Epilogue::Bias, HEAD_GEMM);
        let mut onehot = vec![0.0; self.out.n_out];
        onehot[label] = 1.0;
        let mut d_pooled = vec![0.0; h];
        self.out.backward_input(&onehot, &mut d_pooled, HEAD_GEMM);
        let dx = match pre {
            None => d_pooled,
            Some((dense, act, z)) => {
                let dz: Vec<f32> = (d_pooled.iter().zip(&z).zip(&pooled))
                    .map(|((g, &z), &y)| match act {
                        PreActivation::Relu => g * f32::from(u8::from(z > 0.0)),
                        PreActivation::Tanh => g * (1.0 - y * y),
                    })
                    .collect();
                let mut dx = vec![0.0; h];
                dense.backward_input(&dz, &mut dx, HEAD_GEMM);
                dx
            }
        };
        (logits[label], dx)
    }

    /// The verdicts on the texts `encs` whose last hidden states are `hidden`
    /// (`[encs.len(), seq_len, h]`, `lengths` real tokens each), read at each one's pooled
    /// token.
    pub(crate) fn classify(
        &self,
        (hidden, seq_len, lengths): (&[f32], usize, &[usize]),
        encs: &[Encoding],
    ) -> Result<Vec<Classification>, ModelError> {
        let h = self.out.n_in;
        (0..lengths.len())
            .map(|b| {
                let at = self.pooled_at(&encs[b].ids[..lengths[b]]);
                let x = &hidden[(b * seq_len + at) * h..][..h];
                let pooled = match &self.pre {
                    None => x.to_vec(),
                    Some((dense, act)) => {
                        let mut y = vec![0.0; h];
                        let epilogue = match act {
                            PreActivation::Relu => Epilogue::BiasActivation(Activation::Relu),
                            PreActivation::Tanh => Epilogue::Bias,
                        };
                        dense.forward(x, &mut y, epilogue, HEAD_GEMM);
                        if matches!(act, PreActivation::Tanh) {
                            y.iter_mut().for_each(|v| *v = tanh(*v));
                        }
                        y
                    }
                };
                let mut logits = vec![0.0; self.out.n_out];
                self.out
                    .forward(&pooled, &mut logits, Epilogue::Bias, HEAD_GEMM);
                crate::model::check_logits(&logits, logits.len())?;
                Ok(Classification {
                    ranked: rank(&self.labels, &scores(&logits, self.scoring)),
                    logits,
                    scoring: self.scoring,
                    pooled_token: at,
                })
            })
            .collect()
    }
}

/// The scores of `logits` under `scoring`.
pub(crate) fn scores(logits: &[f32], scoring: Scoring) -> Vec<f32> {
    match scoring {
        Scoring::Raw => logits.to_vec(),
        Scoring::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
        Scoring::Softmax => softmax(logits),
    }
}

/// `e^(x − max) / Σ e^(x − max)`, in f64 so that the probabilities of a large vocabulary
/// keep their digits.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.iter().map(|&x| f64::from(x - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|&e| (e / sum) as f32).collect()
}

/// `labels` with their scores, highest first; equal scores keep id order.
fn rank(labels: &[String], scores: &[f32]) -> Vec<(String, f32)> {
    let mut ranked: Vec<(String, f32)> =
        labels.iter().cloned().zip(scores.iter().copied()).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked
}

/// The question-answering head's logits for each text of `out`, over its real tokens.
pub(crate) fn span_logits(
    qa: &Linear,
    (hidden, seq_len, lengths): (&[f32], usize, &[usize]),
) -> Vec<SpanLogits> {
    let h = qa.n_in;
    (lengths.iter().enumerate())
        .map(|(b, &len)| {
            let x = &hidden[b * seq_len * h..][..len * h];
            let mut y = vec![0.0; len * 2];
            qa.forward(x, &mut y, Epilogue::Bias, HEAD_GEMM);
            SpanLogits {
                start: y.iter().step_by(2).copied().collect(),
                end: y.iter().skip(1).step_by(2).copied().collect(),
            }
        })
        .collect()
}

impl MaskedLmHead {
    /// The vocabulary's logits at token positions `at` of text `b` of `out`: `[at.len()][vocab]`.
    pub(crate) fn logits(
        &self,
        out: &ModelOutput,
        b: usize,
        at: &[usize],
        word_embeddings: &[f32],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let h = self.transform.n_in;
        let mut x = Vec::with_capacity(at.len() * h);
        for &t in at {
            x.extend_from_slice(&out.last_hidden_state[(b * out.seq_len + t) * h..][..h]);
        }
        let mut y = vec![0.0; x.len()];
        self.transform.forward(
            &x,
            &mut y,
            Epilogue::BiasActivation(self.activation),
            HEAD_GEMM,
        );
        self.norm.apply(&mut y);
        let decoder = self.decoder.as_deref().unwrap_or(word_embeddings);
        let v = self.bias.len();
        let mut logits = vec![0.0; at.len() * v];
        gemm_bt(
            &y,
            at.len(),
            h,
            decoder,
            v,
            &mut logits,
            crate::model::parallelism(),
        );
        for row in logits.chunks_exact_mut(v) {
            row.iter_mut().zip(&self.bias).for_each(|(l, b)| *l += b);
        }
        crate::model::check_logits(&logits, v)?;
        Ok(logits.chunks_exact(v).map(<[f32]>::to_vec).collect())
    }
}

/// The tokens predicted at one position of a text.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// The token position whose logits predict (a mask token, or the last token, whose logits
    /// are the next token's).
    pub position: usize,
    /// The most likely token ids with their probabilities (the softmax of the logits), most
    /// likely first; equal probabilities keep id order.
    pub top: Vec<(u32, f32)>,
}

/// The `k` most likely entries of `logits` with their softmax probabilities.
pub(crate) fn top_tokens(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let probs = softmax(logits);
    let mut ids: Vec<u32> = (0..probs.len() as u32).collect();
    let k = k.min(ids.len());
    if k == 0 {
        return Vec::new();
    }
    let by_prob = |a: &u32, b: &u32| {
        probs[*b as usize]
            .total_cmp(&probs[*a as usize])
            .then(a.cmp(b))
    };
    ids.select_nth_unstable_by(k - 1, by_prob);
    ids.truncate(k);
    ids.sort_by(by_prob);
    ids.into_iter().map(|id| (id, probs[id as usize])).collect()
}
