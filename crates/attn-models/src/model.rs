//! A loaded checkpoint and its forward pass: tokens in; hidden states, every head's attention,
//! per-head queries and keys, GPT-2 logits and sentence embeddings out.
//!
//! The layers mirror transformers' `BertLayer` (post-norm) and `GPT2Block` (pre-norm)
//! (<https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/models/bert/modeling_bert.py>,
//! `.../models/gpt2/modeling_gpt2.py`); attention itself is [`attn_core::sdpa`], asked for its
//! weights only when the caller wants them.

use std::path::{Path, PathBuf};

use attn_core::{AttnInput, AttnOptions, AttnShape, Causal, KeyPadding, WeightsRequest, Window};
use faer::Par;
use rayon::prelude::*;

use crate::block::{Buffers, Multiply};
use crate::checkpoint::Checkpoint;
use crate::heads::{
    Classification, Head, HeadConfig, Prediction, SpanLogits, Task, span_logits, top_tokens,
};
use crate::ops::{Gemm, GemmKernel, Linear, for_row_chunks, gemm_bt_weight};
use crate::pooling::Pooling;
use crate::tokenize::{Encoding, Limit, TextTokenizer, TokenizerConfig};
use crate::weights::{Layer, Weights};
use crate::{Family, ModelConfig, ModelError, ModelKind};

/// How many texts [`Model::embed`] runs through the model at once.
pub const EMBED_BATCH: usize = 64;

/// What a forward pass returns besides the last hidden state (and GPT-2's logits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Every layer's and head's attention weights.
    pub attentions: bool,
    /// Every layer's queries and keys after projection, per head.
    pub qk: bool,
    /// The input of the first layer and every layer's output.
    pub hidden_states: bool,
}

/// Queries and keys after projection (with bias, before the `1/√head_dim` scaling):
/// `score = q·k / √head_dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryKey {
    /// `[batch, layers, heads, seq_len, head_dim]`
    pub q: Vec<f32>,
    /// `[batch, layers, heads, seq_len, head_dim]`
    pub k: Vec<f32>,
}

/// The result of a forward pass over `batch` texts padded to `seq_len` tokens. For one text
/// (`batch == 1`) drop the leading dimension: attentions are `[layers, heads, T, T]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOutput {
    /// Texts run together.
    pub batch: usize,
    /// Tokens per text after padding (the longest text's).
    pub seq_len: usize,
    /// The model's layers.
    pub n_layers: usize,
    /// Attention heads per layer.
    pub n_heads: usize,
    /// Real (unpadded) tokens of each text.
    pub lengths: Vec<usize>,
    /// `[batch, layers, heads, seq_len, seq_len]` (row = query token, column = key token);
    /// padded keys get weight 0. Present when [`RunOptions::attentions`] asked for them;
    /// [`ModelOutput::attention`] reads one row.
    pub attentions: Option<Vec<f32>>,
    /// Present when [`RunOptions::qk`] asked for them.
    pub qk: Option<QueryKey>,
    /// `[batch, layers + 1, seq_len, hidden]`: the embeddings, then each layer's output
    /// (for GPT-2 the last one after the final LayerNorm, as transformers reports it).
    pub hidden_states: Option<Vec<f32>>,
    /// `[batch, seq_len, hidden]`
    pub last_hidden_state: Vec<f32>,
    /// GPT-2 only: `[batch, seq_len, vocab]`.
    pub logits: Option<Vec<f32>>,
}

impl ModelOutput {
    /// Token `query`'s attention over the `seq_len` keys in layer `layer`, head `head` of text
    /// `b` (indices from 0; the padding keys past the text's length weigh 0). `None` when
    /// attentions were not asked for, an index is out of range, or `query` is padding (past
    /// `lengths[b]`).
    pub fn attention(&self, b: usize, layer: usize, head: usize, query: usize) -> Option<&[f32]> {
        let t = self.seq_len;
        if b >= self.batch || layer >= self.n_layers || head >= self.n_heads {
            return None;
        }
        if query >= *self.lengths.get(b)? || query >= t {
            return None;
        }
        let start = (((b * self.n_layers + layer) * self.n_heads + head) * t + query) * t;
        self.attentions.as_ref()?.get(start..start + t)
    }
}

/// A Hugging Face checkpoint ready to run.
pub struct Model {
    name: String,
    dir: PathBuf,
    config: ModelConfig,
    tokenizer: TextTokenizer,
    weights: Weights,
    pooling: Pooling,
    head: Head,
    head_config: HeadConfig,
    tokenizer_config: TokenizerConfig,
    gemm_kernel: GemmKernel,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Buffers of one forward pass, allocated once and reused by every layer (and, on the
/// embedding path, by every batch a thread runs: see [`Workspace::take`]).
#[derive(Default)]
struct Workspace {
    /// `[rows, hidden]`: the residual stream.
    hidden: Vec<f32>,
    /// `[rows, hidden]`: GPT-2's and Llama's normed input of a sublayer.
    normed: Vec<f32>,
    /// `[rows, qkv_width]`
    qkv: Vec<f32>,
    /// `[batch, heads, seq_len, head_dim]`; k and v with the key/value heads.
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// `[rows, n_heads · head_dim]`: attention output with heads merged.
    context: Vec<f32>,
    /// `[rows, hidden]`: a sublayer's output before bias and residual.
    sublayer: Vec<f32>,
    /// `[rows, ff_width]`
    intermediate: Vec<f32>,
}

/// The most bytes of buffers a thread keeps between embedding batches (64 sentences of 128
/// tokens of all-MiniLM-L6-v2 need 26 MiB).
const KEPT_WORKSPACE_BYTES: usize = 64 << 20;

thread_local! {
    /// This thread's buffers between embedding batches (`None` while a run holds them).
    static KEPT: std::cell::Cell<Option<Workspace>> = const { std::cell::Cell::new(None) };
}

impl Workspace {
    /// Sizes every buffer for `rows` rows. Every buffer is written in full before it is read,
    /// so reused memory needs no clearing.
    fn resize(&mut self, rows: usize, c: &ModelConfig) {
        let h = c.hidden_size;
        let pre_norm = c.kind() != ModelKind::Bert;
        let kv = c.n_kv_heads() * c.head_dim();
        for (buf, len) in [
            (&mut self.hidden, rows * h),
            (&mut self.normed, if pre_norm { rows * h } else { 0 }),
            (&mut self.qkv, rows * c.qkv_width()),
            (&mut self.q, rows * c.q_width()),
            (&mut self.k, rows * kv),
            (&mut self.v, rows * kv),
            (&mut self.context, rows * c.q_width()),
            (&mut self.sublayer, rows * h),
            (&mut self.intermediate, rows * c.ff_width()),
        ] {
            buf.truncate(len);
            buf.resize(len, 0.0);
        }
    }

    /// Buffers for `rows` rows: this thread's kept ones when it has them (a nested run, e.g.
    /// one rayon steals while this thread waits inside a run, gets new ones).
    fn take(rows: usize, c: &ModelConfig) -> Workspace {
        let mut ws = KEPT.take().unwrap_or_default();
        ws.resize(rows, c);
        ws
    }

    /// Keeps the buffers for this thread's next [`Workspace::take`], unless they are large.
    fn keep(self) {
        let floats = self.hidden.capacity()
            + self.normed.capacity()
            + self.qkv.capacity()
            + self.q.capacity()
            + self.k.capacity()
            + self.v.capacity()
            + self.context.capacity()
            + self.sublayer.capacity()
            + self.intermediate.capacity();
        if floats * 4 <= KEPT_WORKSPACE_BYTES {
            KEPT.set(Some(self));
        }
    }
}

/// What a forward pass returns besides the final hidden state (left in the workspace).
pub(crate) struct LayersOutput {
    pub(crate) seq_len: usize,
    pub(crate) lengths: Vec<usize>,
    attentions: Option<Vec<f32>>,
    qk: Option<QueryKey>,
    hidden_states: Option<Vec<f32>>,
}

/// Refuses logits (`[rows, vocab]`) holding NaN or ∞, naming the position and the token: a
/// sampler sorts a NaN first and then draws the last token whatever the seed, greedy skips it.
pub(crate) fn check_logits(logits: &[f32], vocab: usize) -> Result<(), ModelError> {
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(at) => Err(ModelError::NonFiniteLogit {
            position: at / vocab.max(1),
            token: at % vocab.max(1),
            value: logits[at],
        }),
    }
}

/// Files that Hugging Face directories hold in place of `model.safetensors` or
/// `tokenizer.json`, and the transformers call that rewrites them as those (`MODEL` and `DIR`
/// filled in by [`check_convertible`]).
const CONVERTIBLE: [(&str, &str, &str); 5] = [
    (
        "model.safetensors",
        "pytorch_model.bin",
        "MODEL.from_pretrained(DIR).save_pretrained(DIR)",
    ),
    (
        "model.safetensors",
        "pytorch_model.bin.index.json",
        "MODEL.from_pretrained(DIR).save_pretrained(DIR, max_shard_size=\"100GB\")",
    ),
    (
        "model.safetensors",
        "tf_model.h5",
        "MODEL.from_pretrained(DIR, from_tf=True).save_pretrained(DIR)",
    ),
    (
        "tokenizer.json",
        "vocab.txt",
        "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)",
    ),
    (
        "tokenizer.json",
        "vocab.json",
        "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)",
    ),
];

/// [`ModelError::NeedsConversion`] when `dir` lacks `model.safetensors` or `tokenizer.json` but
/// holds what transformers can rewrite as it.
/// `model` is the transformers class that reads the checkpoint; `tokenizer_json` whether the
/// model needs a tokenizer.json (Marian's SentencePiece files stand in for one).
pub(crate) fn check_convertible(
    dir: &Path,
    model: &str,
    tokenizer_json: bool,
) -> Result<(), ModelError> {
    for (needed, found, how) in CONVERTIBLE {
        let wanted = tokenizer_json || needed != "tokenizer.json";
        if wanted && !crate::config::present(&dir.join(needed)) && dir.join(found).exists() {
            let dir_arg = format!("{:?}", dir.display().to_string());
            return Err(ModelError::NeedsConversion {
                dir: dir.to_path_buf(),
                found,
                needed,
                how: how.replace("MODEL", model).replace("DIR", &dir_arg),
            });
        }
    }
    Ok(())
}

/// Sets how many threads every later model call uses (rayon's global pool, which otherwise
/// follows `RAYON_NUM_THREADS` or the number of cores), as the attention kernels' own
/// [`attn_core::set_global_threads`] does: 1 to
/// [`attn_core::MAX_THREADS`]. Call it once, before the first run.
pub fn set_threads(threads: usize) -> Result<(), ModelError> {
    attn_core::set_global_threads(threads).map_err(|e| ModelError::Threads {
        reason: match e {
            attn_core::AttnError::InvalidOption { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

/// The parallelism for the GEMMs: rayon's pool (sized by `RAYON_NUM_THREADS` or
/// [`set_threads`]). Even one short text gains from it: its GEMMs stream every weight once.
pub(crate) fn parallelism() -> Par {
    match rayon::current_num_threads() {
        0 | 1 => Par::Seq,
        n => Par::rayon(n),
    }
}

impl Model {
    /// Loads a model directory: `config.json`, `model.safetensors`, `tokenizer.json`, and for
    /// sentence-transformers `modules.json` with its pooling config.
    pub fn load(dir: &Path) -> Result<Model, ModelError> {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(ModelError::NotADirectory {
                    path: dir.to_path_buf(),
                });
            }
            // Missing, a link to nothing, a link loop: each as itself.
            Err(e) => return Err(ModelError::io(dir, "the model directory", e)),
        }
        let (config, config_text) = ModelConfig::read_file(&dir.join("config.json"))?;
        let head_config = HeadConfig::from_json(&config_text)?;
        let tokenizer_config = TokenizerConfig::from_dir(dir)?;
        let class = match config.kind() {
            ModelKind::Bert => "AutoModel",
            ModelKind::Gpt2 | ModelKind::Llama => "AutoModelForCausalLM",
        };
        check_convertible(dir, class, true)?;
        // Parsing tokenizer.json takes as long as mapping and checking the weights: do both at
        // once. A tokenizer error is reported first, as if they had run in turn.
        let (tokenizer, weights) = std::thread::scope(|scope| {
            let tokenizer = scope.spawn(|| {
                let mut tokenizer =
                    TextTokenizer::from_file(&dir.join("tokenizer.json"), config.max_tokens())?;
                tokenizer.add_config_tokens(&tokenizer_config)?;
                Ok::<_, ModelError>(tokenizer)
            });
            let weights = Checkpoint::open_dir(dir).and_then(|checkpoint| {
                let weights = Weights::load(&checkpoint, &config)?;
                Ok((weights, Head::load(&checkpoint, &config, &head_config)?))
            });
            let tokenizer = tokenizer.join().unwrap_or_else(|_| {
                Err(ModelError::Tokenizer {
                    reason: "loading tokenizer.json panicked".into(),
                })
            });
            (tokenizer, weights)
        });
        let (tokenizer, (weights, head)) = (tokenizer?, weights?);
        let pooling = Pooling::from_dir(dir)?;
        // A snapshot of the Hugging Face cache is named by its model id and short commit.
        let name = crate::hub::repo_of(dir)
            .or_else(|| {
                let dir = dir.canonicalize().ok()?;
                Some(dir.file_name()?.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| dir.display().to_string());
        Ok(Model {
            name,
            dir: dir.to_path_buf(),
            config,
            tokenizer,
            weights,
            pooling,
            head,
            head_config,
            tokenizer_config,
            gemm_kernel: GemmKernel::Auto,
        })
    }

    /// The task of the checkpoint's head: the first of `architectures` in `config.json`, when
    /// attnscope runs it (`None` for a bare encoder such as all-MiniLM-L6-v2).
    pub fn task(&self) -> Option<Task> {
        match self.head {
            Head::None => None,
            Head::Classifier(_) => Some(Task::Classification),
            Head::QuestionAnswering(_) => Some(Task::QuestionAnswering),
            Head::MaskedLm(_) => Some(Task::MaskedLm),
            Head::NextToken => Some(Task::NextToken),
        }
    }

    /// `Ok` when the checkpoint's head does `task`, else [`ModelError::NoHead`] (naming the
    /// architectures its config.json has).
    pub fn require_task(&self, task: Task) -> Result<(), ModelError> {
        match self.task() == Some(task) {
            true => Ok(()),
            false => Err(self.no_head(task)),
        }
    }

    /// [`ModelError::NoHead`] for a command that needs `task`.
    pub(crate) fn no_head(&self, task: Task) -> ModelError {
        ModelError::NoHead {
            model: self.name.clone(),
            wanted: task.describe(),
            architectures: self.head_config.architectures.clone(),
        }
    }

    /// The position of the token a classifier reads in `enc` (its first, or GPT-2's last that
    /// is not the pad token); `None` for a model without a classifier.
    pub fn pooled_token(&self, enc: &Encoding) -> Option<usize> {
        match &self.head {
            Head::Classifier(c) => Some(c.pooled_at(&enc.ids)),
            _ => None,
        }
    }

    /// The classifier's labels in id order.
    pub fn labels(&self) -> Result<&[String], ModelError> {
        match &self.head {
            Head::Classifier(c) => Ok(c.labels()),
            _ => Err(self.no_head(Task::Classification)),
        }
    }

    /// The classifier's verdict on each text of `out`, a forward pass over `encs`.
    pub fn classify(
        &self,
        out: &ModelOutput,
        encs: &[Encoding],
    ) -> Result<Vec<Classification>, ModelError> {
        match &self.head {
            Head::Classifier(c) => {
                c.classify((&out.last_hidden_state, out.seq_len, &out.lengths), encs)
            }
            _ => Err(self.no_head(Task::Classification)),
        }
    }

    /// The classifier's verdict on each of `encs`, run for throughput as [`Model::embed`] runs
    /// texts: batches of [`EMBED_BATCH`], each thread its share of a batch on its own.
    pub fn classify_all(&self, encs: &[Encoding]) -> Result<Vec<Classification>, ModelError> {
        let Head::Classifier(head) = &self.head else {
            return Err(self.no_head(Task::Classification));
        };
        if encs.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        // The head reads one token of each text: the last layer runs for that row alone.
        let rows = |part: &[Encoding]| Some(part.iter().map(|e| head.pooled_at(&e.ids)).collect());
        self.run_in_shares(encs, rows, |hidden, run, part| {
            head.classify((hidden, run.seq_len, &run.lengths), part)
        })
    }

    /// `finish(last hidden states, run, texts)` of `encs` run in batches of [`EMBED_BATCH`],
    /// each thread its share of a batch on its own: the GEMMs then need no synchronisation,
    /// and each share pads only to its own longest text. With `rows(texts)` some, `finish`
    /// reads only that row of each text's last hidden state (see [`Model::run_layers`]). An
    /// error names its text in `encs`.
    pub(crate) fn run_in_shares<R: Send>(
        &self,
        encs: &[Encoding],
        rows: impl Fn(&[Encoding]) -> Option<Vec<usize>> + Sync,
        finish: impl Fn(&[f32], &LayersOutput, &[Encoding]) -> Result<Vec<R>, ModelError> + Sync,
    ) -> Result<Vec<R>, ModelError> {
        let threads = rayon::current_num_threads().max(1);
        let first = &encs[..encs.len().min(EMBED_BATCH)];
        let share_rows = first.len().div_ceil(threads) * max_len(first);
        if self.gemm_kernel.uses_tiles(share_rows) {
            self.weights.prepare_tiles();
        }
        let mut out = Vec::with_capacity(encs.len());
        for (c, chunk) in encs.chunks(EMBED_BATCH).enumerate() {
            let share = chunk.len().div_ceil(threads);
            let parts: Vec<Result<Vec<R>, ModelError>> = chunk
                .par_chunks(share)
                .enumerate()
                .map(|(i, part)| {
                    let mut ws = Workspace::take(part.len() * max_len(part), &self.config);
                    let at = rows(part);
                    let run = self.run_layers(
                        part,
                        &RunOptions::default(),
                        None,
                        at.as_deref(),
                        Par::Seq,
                        &mut ws,
                    );
                    let done = run.and_then(|run| finish(&ws.hidden, &run, part));
                    ws.keep();
                    // An error names its text in `part`; the caller's texts count from the
                    // chunk's and the part's start.
                    done.map_err(|e| match e.text() {
                        Some(t) => e.in_text(c * EMBED_BATCH + i * share + t),
                        None => e,
                    })
                })
                .collect();
            for part in parts {
                out.extend(part?);
            }
        }
        Ok(out)
    }

    /// The classifier's logit `label` of the pooled token's hidden state `x`, and its gradient.
    pub(crate) fn classifier_logit_grad(
        &self,
        x: &[f32],
        label: usize,
    ) -> Result<(f32, Vec<f32>), ModelError> {
        match &self.head {
            Head::Classifier(c) => Ok(c.logit_grad(x, label)),
            _ => Err(self.no_head(Task::Classification)),
        }
    }

    /// The transformer blocks, from the input up.
    pub(crate) fn layers(&self) -> &[Layer] {
        &self.weights.layers
    }

    /// The question-answering head, or the error that names the heads the model has.
    pub(crate) fn qa_head(&self) -> Result<&Linear, ModelError> {
        match &self.head {
            Head::QuestionAnswering(qa) => Ok(qa),
            _ => Err(self.no_head(Task::QuestionAnswering)),
        }
    }

    /// The question-answering head's start and end logits for each text of `out`.
    pub fn span_logits(&self, out: &ModelOutput) -> Result<Vec<SpanLogits>, ModelError> {
        match &self.head {
            Head::QuestionAnswering(qa) => Ok(span_logits(
                qa,
                (&out.last_hidden_state, out.seq_len, &out.lengths),
            )),
            _ => Err(self.no_head(Task::QuestionAnswering)),
        }
    }

    /// The masked-language-model head's vocabulary logits at token positions `at` of text `b`
    /// of `out`: `[at.len()][vocab]`.
    pub fn masked_logits(
        &self,
        out: &ModelOutput,
        b: usize,
        at: &[usize],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        match &self.head {
            Head::MaskedLm(m) => m.logits(out, b, at, &self.weights.word_embeddings.to_f32()),
            _ => Err(self.no_head(Task::MaskedLm)),
        }
    }

    /// The `k` most likely tokens where the head predicts, for text `b` of `out` (a forward
    /// pass over `encs`): for a masked language model at each mask token, for GPT-2 after the
    /// last token.
    pub fn predict(
        &self,
        out: &ModelOutput,
        encs: &[Encoding],
        b: usize,
        k: usize,
    ) -> Result<Vec<Prediction>, ModelError> {
        let len = out.lengths[b];
        match &self.head {
            Head::MaskedLm(m) => {
                let (mask, id) = self.mask_token().ok_or_else(|| ModelError::Tokenizer {
                    reason: "the tokenizer has no mask token ([MASK] or <mask>)".into(),
                })?;
                let at: Vec<usize> = (0..len).filter(|&t| encs[b].ids[t] == id).collect();
                if at.is_empty() {
                    return Err(ModelError::NoMask { mask });
                }
                let logits = m.logits(out, b, &at, &self.weights.word_embeddings.to_f32())?;
                Ok((at.iter().zip(&logits))
                    .map(|(&position, l)| Prediction {
                        position,
                        top: top_tokens(l, k),
                    })
                    .collect())
            }
            Head::NextToken | Head::None if self.kind() != ModelKind::Bert => {
                let logits = out.logits.as_ref().ok_or_else(|| ModelError::Tokenizer {
                    reason: "the forward pass returned no logits".into(),
                })?;
                let v = self.config.vocab_size;
                let row = &logits[(b * out.seq_len + len - 1) * v..][..v];
                Ok(vec![Prediction {
                    position: len - 1,
                    top: top_tokens(row, k),
                }])
            }
            _ => Err(ModelError::NoHead {
                model: self.name.clone(),
                wanted: "masked-language-model head (…ForMaskedLM) or language-model head \
                         (GPT2LMHeadModel)",
                architectures: self.head_config.architectures.clone(),
            }),
        }
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// `model_max_length` of `tokenizer_config.json`, when it sets one.
    pub(crate) fn model_max_length(&self) -> Option<usize> {
        self.tokenizer_config.model_max_length
    }

    /// The id of the classification token (`cls_token` of `tokenizer_config.json`, else
    /// `[CLS]` or `<s>`), if the vocabulary has it.
    pub(crate) fn cls_token_id(&self) -> Option<u32> {
        let named = self.tokenizer_config.cls_token.as_deref();
        named
            .into_iter()
            .chain(["[CLS]", "<s>"])
            .find_map(|t| self.tokenizer.token_id(t))
    }

    /// The tokenizer's mask token (`[MASK]`, `<mask>`) and its id, if it has one.
    pub fn mask_token(&self) -> Option<(String, u32)> {
        self.tokenizer.mask_token()
    }

    /// The model directory's name (`all-MiniLM-L6-v2`), or its model id and short commit for a
    /// snapshot of the Hugging Face cache (`openai-community/gpt2@607a30d`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The directory the model was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The checkpoint's dimensions and constants, from `config.json`.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// Encoder (BERT family) or decoder (GPT-2 family).
    pub fn kind(&self) -> ModelKind {
        self.config.kind()
    }
    /// Transformer blocks.
    pub fn n_layers(&self) -> usize {
        self.config.n_layers
    }
    /// Attention heads per block.
    pub fn n_heads(&self) -> usize {
        self.config.n_heads
    }
    /// Width of the hidden states.
    pub fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }
    /// The most tokens one text may have ([`ModelConfig::max_tokens`]).
    pub fn max_positions(&self) -> usize {
        self.config.max_tokens()
    }
    /// Chooses the multiply of the linear layers for later runs ([`GemmKernel::Auto`] unless
    /// set).
    pub fn set_gemm_kernel(&mut self, kernel: GemmKernel) {
        self.gemm_kernel = kernel;
    }
    /// The multiply of the linear layers.
    pub fn gemm_kernel(&self) -> GemmKernel {
        self.gemm_kernel
    }
    /// The loaded weights (the KV-cached decoder, gradients).
    pub(crate) fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Tokenizes a text (and pair) with the model's special tokens. Empty text and text longer
    /// than [`Model::max_positions`] are errors.
    pub fn encode(&self, text: &str, pair: Option<&str>) -> Result<Encoding, ModelError> {
        self.tokenizer.encode(text, pair, false)
    }

    /// The text of `ids`, special tokens included; an id the tokenizer has no token for is
    /// [`ModelError::UnknownTokenId`].
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.tokenizer.decode(ids)
    }

    /// Whether the model is a sentence-transformers one (it has `modules.json`), trained to make
    /// sentence embeddings; others are mean-pooled as sentence-transformers pools a plain
    /// checkpoint.
    pub fn is_sentence_model(&self) -> bool {
        self.pooling.sentence_transformers
    }

    /// The tokenizer's own string for token `id` (`"Ġcat"`, `"##ing"`), if the vocabulary has
    /// it.
    pub fn token(&self, id: u32) -> Option<String> {
        self.tokenizer.token(id)
    }

    /// Whether token `id` is one of the tokenizer's special tokens (`[CLS]`, `[PAD]`,
    /// `<|endoftext|>`). A text that writes one (`"The cat [PAD]"`) is read as that token, as
    /// transformers reads it: its [`Encoding`] has a span there, unlike the tokens the
    /// tokenizer adds.
    pub fn is_special_token(&self, id: u32) -> bool {
        self.tokenizer.is_special(id)
    }

    /// Like [`Model::encode`], but a text that is too long is cut to fit (longest segment first).
    pub fn encode_truncated(&self, text: &str, pair: Option<&str>) -> Result<Encoding, ModelError> {
        self.tokenizer.encode(text, pair, true)
    }

    /// Runs one encoded text.
    ///
    /// # Shapes
    /// - `enc.ids`: `[T]`; see [`ModelOutput`] (with `batch = 1`)
    pub fn forward(&self, enc: &Encoding, options: &RunOptions) -> Result<ModelOutput, ModelError> {
        self.forward_batch(std::slice::from_ref(enc), options)
    }

    /// Every layer's and head's attention from the query tokens `rows` (ascending) of `enc`,
    /// and nothing else (no logits): the weights a view of a few words needs, in
    /// O(layers · heads · rows · T) memory where every row would take O(layers · heads · T²),
    /// 90 GB for 24 layers × 14 heads at 8,192 tokens. The rows come from the attention's
    /// saved log-sum-exp, equal to those of [`RunOptions::attentions`].
    ///
    /// # Shapes
    /// - `enc.ids`: `[T]`; returns `[layers, heads, rows.len(), T]`
    pub fn attention_rows(&self, enc: &Encoding, rows: &[usize]) -> Result<Vec<f32>, ModelError> {
        let bad = |reason: String| ModelError::InvalidInput {
            what: "attention rows",
            reason,
        };
        if let Some(w) = rows.windows(2).find(|w| w[0] >= w[1]) {
            return Err(bad(format!(
                "row {} follows row {}: rows must ascend",
                w[1], w[0]
            )));
        }
        if let Some(&row) = rows.iter().find(|&&r| r >= enc.len()) {
            return Err(bad(format!(
                "row {row} is past the text's {} tokens",
                enc.len()
            )));
        }
        let mut ws = Workspace::default();
        let encs = std::slice::from_ref(enc);
        let out = self.run_layers(
            encs,
            &RunOptions::default(),
            Some(rows),
            None,
            parallelism(),
            &mut ws,
        )?;
        Ok(out.attentions.unwrap_or_default())
    }

    /// Runs several encoded texts padded together to the longest; padded keys are masked, so
    /// each text's results are those it gets alone.
    ///
    /// # Shapes
    /// - `encs[b].ids`: `[T_b]`; see [`ModelOutput`] with `seq_len = max T_b`
    pub fn forward_batch(
        &self,
        encs: &[Encoding],
        options: &RunOptions,
    ) -> Result<ModelOutput, ModelError> {
        self.run_batch(encs, options, parallelism())
    }

    /// [`Model::forward_batch`] with the GEMMs' parallelism chosen by the caller.
    fn run_batch(
        &self,
        encs: &[Encoding],
        options: &RunOptions,
        par: Par,
    ) -> Result<ModelOutput, ModelError> {
        let mut ws = Workspace::default();
        let out = self.run_layers(encs, options, None, None, par, &mut ws)?;
        let c = &self.config;
        let rows = encs.len() * out.seq_len;
        let logits = (c.kind() != ModelKind::Bert).then(|| {
            let mut logits = vec![0.0f32; rows * c.vocab_size];
            let head = self.weights.lm_head();
            let h = c.hidden_size;
            gemm_bt_weight(&ws.hidden, rows, h, head, c.vocab_size, &mut logits, par);
            logits
        });
        let logits = logits.map(|mut l| {
            softcap_logits(c, &mut l);
            l
        });
        if let Some(logits) = &logits {
            check_logits(logits, c.vocab_size)?;
        }
        Ok(ModelOutput {
            batch: encs.len(),
            seq_len: out.seq_len,
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            lengths: out.lengths,
            attentions: out.attentions,
            qk: out.qk,
            hidden_states: out.hidden_states,
            last_hidden_state: ws.hidden,
            logits,
        })
    }

    /// The last layer for row `at[b]` of each text `b` alone, the one row a classifier reads:
    /// keys and values of every token, the query, attention output and feed-forward of that
    /// row. A causal model's row `t` sees keys `0..=t`, for one row the same as padding after
    /// it. Only those rows of `ws.hidden` are written.
    fn last_layer_at(
        &self,
        layer: &Layer,
        at: &[usize],
        (lengths, seq_len): (&[usize], usize),
        ws: &mut Workspace,
        multiply: &Multiply<'_>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (batch, h, n_heads, d) = (at.len(), c.hidden_size, c.n_heads, c.head_dim());
        let Workspace {
            hidden,
            normed,
            qkv,
            q,
            k,
            v,
            context,
            sublayer,
            intermediate,
        } = ws;
        layer.project(c.kind(), hidden, normed, qkv, multiply);
        split_heads(
            qkv,
            batch,
            seq_len,
            (n_heads, n_heads),
            d,
            [&mut *q, &mut *k, &mut *v],
        );
        let mut q_at = Vec::with_capacity(batch * h);
        for (b, &t) in at.iter().enumerate() {
            for head in 0..n_heads {
                q_at.extend_from_slice(&q[((b * n_heads + head) * seq_len + t) * d..][..d]);
            }
        }
        let seen: Vec<usize> = (at.iter().zip(lengths))
            .map(|(&t, &len)| if c.causal { t + 1 } else { len })
            .collect();
        let attn_options = AttnOptions {
            key_padding: match seen.iter().all(|&n| n == seq_len) {
                true => None,
                false => Some(KeyPadding::from_lengths(&seen, seq_len)?),
            },
            ..AttnOptions::default()
        };
        let shape = AttnShape::new(batch, n_heads, 1, seq_len, d);
        let input = AttnInput::allowing_non_finite(&q_at, k, v, shape)?;
        let out =
            attn_core::sdpa(&input, &attn_options).map_err(|error| ModelError::Attention {
                layer: Some(c.n_layers - 1),
                error,
            })?;
        let rows = batch * h;
        merge_heads(&out.out, batch, 1, n_heads, d, &mut context[..rows]);
        let mut x: Vec<f32> = (at.iter().enumerate())
            .flat_map(|(b, &t)| &hidden[(b * seq_len + t) * h..][..h])
            .copied()
            .collect();
        let normed = match c.kind() {
            ModelKind::Bert => &mut normed[..0],
            ModelKind::Gpt2 | ModelKind::Llama => &mut normed[..rows],
        };
        let buf = (
            normed,
            &mut sublayer[..rows],
            &mut intermediate[..batch * c.ff_width()],
        );
        layer.after_attention(
            (c.kind(), c.activation),
            &mut x,
            &context[..rows],
            buf,
            multiply,
        );
        for (b, &t) in at.iter().enumerate() {
            hidden[(b * seq_len + t) * h..][..h].copy_from_slice(&x[b * h..][..h]);
        }
        Ok(())
    }

    /// The lengths of a batch's texts and the longest, once every text is one the model can
    /// read: some tokens, no more than its positions, ids in its vocabulary, one segment per
    /// token and no segment past its token types.
    pub(crate) fn check_batch(&self, encs: &[Encoding]) -> Result<(Vec<usize>, usize), ModelError> {
        let c = &self.config;
        if encs.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        let lengths: Vec<usize> = encs.iter().map(Encoding::len).collect();
        let seq_len = lengths.iter().copied().max().unwrap_or(0);
        if lengths.contains(&0) {
            return Err(ModelError::EmptyText { which: "text" });
        }
        if seq_len > c.max_tokens() {
            return Err(ModelError::TooLong {
                tokens: seq_len,
                max: c.max_tokens(),
                embedding: false,
                text: None,
            });
        }
        for enc in encs {
            if let Some(&id) = enc.ids.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(ModelError::TokenOutOfVocab {
                    id,
                    vocab_size: c.vocab_size,
                });
            }
            if enc.segments.len() != enc.ids.len() {
                return Err(ModelError::InvalidInput {
                    what: "encoding",
                    reason: format!(
                        "{} segments for {} ids (one segment per token)",
                        enc.segments.len(),
                        enc.ids.len()
                    ),
                });
            }
            if c.family == Family::Bert
                && let Some((t, &s)) =
                    (enc.segments.iter().enumerate()).find(|(_, s)| **s >= c.type_vocab_size)
            {
                return Err(ModelError::InvalidInput {
                    what: "encoding",
                    reason: format!(
                        "token {t} is in segment {s}, and the model has {} (config.json's \
                         type_vocab_size)",
                        c.type_vocab_size
                    ),
                });
            }
        }
        Ok((lengths, seq_len))
    }

    /// The layers of a forward pass, the final hidden state `[batch, seq_len, hidden]` left in
    /// `ws.hidden`. With `last_rows` (one position per text, and nothing asked of `options`)
    /// the last layer runs for those rows alone: the other rows of `ws.hidden` are then the
    /// layer below's.
    fn run_layers(
        &self,
        encs: &[Encoding],
        options: &RunOptions,
        attention_rows: Option<&[usize]>,
        last_rows: Option<&[usize]>,
        par: Par,
        ws: &mut Workspace,
    ) -> Result<LayersOutput, ModelError> {
        let c = &self.config;
        let (lengths, seq_len) = self.check_batch(encs)?;
        let (batch, h, n_heads, d) = (encs.len(), c.hidden_size, c.n_heads, c.head_dim());
        let n_layers = c.n_layers;
        let rows = batch * seq_len;
        let gemm = Gemm {
            par,
            kernel: self.gemm_kernel,
        };
        ws.resize(rows, c);
        self.embed_tokens(encs, seq_len, &mut ws.hidden);

        let per_layer = |extra: usize| batch * n_layers * n_heads * seq_len * extra;
        let mut attentions = match attention_rows {
            Some(rows) => Some(vec![0.0f32; per_layer(rows.len())]),
            None => options.attentions.then(|| vec![0.0f32; per_layer(seq_len)]),
        };
        let mut qk = options.qk.then(|| QueryKey {
            q: vec![0.0; per_layer(d)],
            k: vec![0.0; per_layer(d)],
        });
        let mut hidden_states = options
            .hidden_states
            .then(|| vec![0.0f32; batch * (n_layers + 1) * seq_len * h]);
        let save_hidden = |hs: &mut Option<Vec<f32>>, slot: usize, hidden: &[f32]| {
            if let Some(hs) = hs {
                for (b, src) in hidden.chunks_exact(seq_len * h).enumerate() {
                    let at = (b * (n_layers + 1) + slot) * seq_len * h;
                    hs[at..at + seq_len * h].copy_from_slice(src);
                }
            }
        };
        save_hidden(&mut hidden_states, 0, &ws.hidden);

        let n_kv = c.n_kv_heads();
        let shape = AttnShape::new(batch, n_heads, seq_len, seq_len, d).with_kv_heads(n_kv);
        let decoder = c.decoder.as_ref();
        let attn_options = AttnOptions {
            causal: c.causal.then_some(Causal::TopLeft),
            scale: decoder.and_then(|dec| dec.scale),
            softcap: decoder.and_then(|dec| dec.softcap),
            key_padding: if lengths.iter().all(|&l| l == seq_len) {
                None
            } else {
                Some(KeyPadding::from_lengths(&lengths, seq_len)?)
            },
            weights: match attention_rows {
                Some(rows) => WeightsRequest::Rows(rows.to_vec()),
                None if options.attentions => WeightsRequest::All,
                None => WeightsRequest::None,
            },
            ..AttnOptions::default()
        };

        let multiply = |layer: &Linear, x: &[f32], y: &mut [f32], epilogue| {
            layer.forward(x, y, epilogue, gemm)
        };
        // Every layer turns its queries and keys by the same angles.
        let rotation = decoder.map(|dec| Rotation::new(&dec.inv_freq, d, 0, seq_len));
        // Llama's classifiers are not read yet: its passes run every row of every layer.
        let last_rows = last_rows.filter(|at| {
            let asked = options.attentions || options.qk || options.hidden_states;
            debug_assert!(!asked && at.len() == batch, "last_rows with {options:?}");
            !asked && at.len() == batch && c.kind() != ModelKind::Llama
        });
        for (l, layer) in self.weights.layers.iter().enumerate() {
            if let Some(at) = last_rows.filter(|_| l + 1 == n_layers) {
                self.last_layer_at(layer, at, (&lengths, seq_len), ws, &multiply)?;
                continue;
            }
            let Workspace {
                hidden,
                normed,
                qkv,
                q,
                k,
                v,
                context,
                sublayer,
                intermediate,
            } = &mut *ws;
            let mut attend = |qkv: &[f32], context: &mut [f32]| {
                split_heads(
                    qkv,
                    batch,
                    seq_len,
                    (n_heads, n_kv),
                    d,
                    [&mut *q, &mut *k, &mut *v],
                );
                if let Some((q_norm, k_norm)) = &layer.qk_norm {
                    q_norm.apply(q);
                    k_norm.apply(k);
                }
                if let Some(rotation) = &rotation {
                    rotation.apply_heads(q, seq_len);
                    rotation.apply_heads(k, seq_len);
                }
                if let Some(qk) = &mut qk {
                    copy_per_layer(q, &mut qk.q, batch, l, n_layers);
                    match n_kv == n_heads {
                        true => copy_per_layer(k, &mut qk.k, batch, l, n_layers),
                        false => {
                            let k = repeat_kv(k, batch, (n_heads, n_kv), seq_len * d);
                            copy_per_layer(&k, &mut qk.k, batch, l, n_layers);
                        }
                    }
                }
                // Unchecked: scanning q, k and v for NaN every layer costs more than the one
                // scan of the final hidden state below, which any non-finite value reaches.
                let input = AttnInput::allowing_non_finite(q, k, v, shape)?;
                let window = decoder.and_then(|dec| dec.window(l));
                let layer_options = match window {
                    Some(w) => &AttnOptions {
                        window: Some(Window {
                            left: Some(w - 1),
                            right: None,
                        }),
                        ..attn_options.clone()
                    },
                    None => &attn_options,
                };
                let out = attn_core::sdpa(&input, layer_options).map_err(|error| {
                    ModelError::Attention {
                        layer: Some(l),
                        error,
                    }
                })?;
                if let (Some(all), Some(w)) = (&mut attentions, &out.weights) {
                    copy_per_layer(w.data(), all, batch, l, n_layers);
                }
                merge_heads(&out.out, batch, seq_len, n_heads, d, context);
                Ok(())
            };
            // A view of a few rows reads the last layer's attention and nothing after it: no
            // output projection, feed-forward or final norm. Any non-finite value before the
            // attention reaches its q | k | v, checked in place of the final hidden state.
            if attention_rows.is_some() && l + 1 == n_layers {
                layer.project(c.kind(), hidden, normed, qkv, &multiply);
                check_finite(qkv, qkv.len() / rows, seq_len, LAST_QKV)?;
                attend(qkv, context)?;
                return Ok(LayersOutput {
                    seq_len,
                    lengths,
                    attentions,
                    qk,
                    hidden_states,
                });
            }
            let buffers = Buffers {
                normed,
                qkv,
                context,
                sublayer,
                intermediate,
            };
            layer.forward((c.kind(), c.activation), hidden, buffers, &multiply, attend)?;
            if l + 1 < n_layers || self.weights.final_norm.is_none() {
                save_hidden(&mut hidden_states, l + 1, &ws.hidden);
            }
        }

        if let Some(norm) = &self.weights.final_norm {
            norm.apply(&mut ws.hidden);
            save_hidden(&mut hidden_states, n_layers, &ws.hidden);
        }
        check_finite(&ws.hidden, c.hidden_size, seq_len, FINAL_HIDDEN_STATE)?;
        Ok(LayersOutput {
            seq_len,
            lengths,
            attentions,
            qk,
            hidden_states,
        })
    }

    /// Sentence embeddings of `texts`, as sentence-transformers computes them: batches of
    /// [`EMBED_BATCH`] padded together, mean over each text's real tokens, L2-normalised when the
    /// model's `modules.json` says so. A text longer than sentence-transformers embeds
    /// (`max_seq_length`, else the model's positions) is an error.
    ///
    /// # Shapes
    /// - returns `[texts.len()][hidden]`
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.embed_with(texts, false)
    }

    /// The error [`Model::embed`] gives `text` for its length ([`ModelError::TooLong`] or
    /// [`ModelError::TooManyWords`]), if any: what [`Model::embed_with`] with `truncate` cuts,
    /// for a caller to say so.
    pub fn embed_too_long(&self, text: &str) -> Option<ModelError> {
        match self.embed_encoding(text, false) {
            Err(e @ (ModelError::TooLong { .. } | ModelError::TooManyWords { .. })) => Some(e),
            _ => None,
        }
    }

    /// `text` tokenized as an embedding reads it: lower-cased when the pooling config says so,
    /// within sentence-transformers' `max_seq_length` (else the positions), cut to it with
    /// `truncate`.
    fn embed_encoding(&self, text: &str, truncate: bool) -> Result<Encoding, ModelError> {
        let lowered = self.pooling.lower_case.then(|| text.to_lowercase());
        let text = lowered.as_deref().unwrap_or(text);
        let limit = self
            .pooling
            .max_seq_length
            .map_or(Limit::Positions, Limit::Embedding);
        self.tokenizer.encode_within(text, None, limit, truncate)
    }

    /// [`Model::embed`], cutting texts that are too long when `truncate` is set (as
    /// sentence-transformers always does).
    ///
    /// # Shapes
    /// - returns `[texts.len()][hidden]`
    pub fn embed_with(&self, texts: &[&str], truncate: bool) -> Result<Vec<Vec<f32>>, ModelError> {
        if texts.is_empty() {
            return Err(ModelError::EmptyBatch);
        }
        let encs = texts
            .par_iter()
            .enumerate()
            .map(|(i, &text)| {
                self.embed_encoding(text, truncate)
                    .map_err(|e| e.in_text(i))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.run_in_shares(
            &encs,
            |_| None,
            |hidden, run, _| Ok(self.pool_states(hidden, &run.lengths)),
        )
    }

    /// Sentence embeddings of the texts of a forward pass (pooled over each text's real tokens).
    /// An output whose fields disagree (changed by the caller: `lengths` not one per text, a
    /// length of 0 or past `seq_len`, a last hidden state of another size) is
    /// [`ModelError::InvalidInput`].
    ///
    /// # Shapes
    /// - returns `[out.batch][hidden]`
    pub fn pool(&self, out: &ModelOutput) -> Result<Vec<Vec<f32>>, ModelError> {
        let invalid = |reason: String| ModelError::InvalidInput {
            what: "model output",
            reason,
        };
        let h = self.config.hidden_size;
        if out.lengths.len() != out.batch || out.batch == 0 {
            return Err(invalid(format!(
                "{} lengths for a batch of {} texts",
                out.lengths.len(),
                out.batch
            )));
        }
        if let Some(&len) = (out.lengths.iter()).find(|&&len| len == 0 || len > out.seq_len) {
            return Err(invalid(format!(
                "a text of {len} tokens in a batch padded to {}",
                out.seq_len
            )));
        }
        let rows = out.batch.checked_mul(out.seq_len);
        if rows.and_then(|rows| rows.checked_mul(h)) != Some(out.last_hidden_state.len()) {
            return Err(invalid(format!(
                "the last hidden state holds {} values, not batch {} × seq_len {} × hidden {h}",
                out.last_hidden_state.len(),
                out.batch,
                out.seq_len
            )));
        }
        Ok(self.pool_states(&out.last_hidden_state, &out.lengths))
    }

    /// [`Model::pool`] of a final hidden state `[lengths.len(), seq_len, hidden]`.
    fn pool_states(&self, states: &[f32], lengths: &[usize]) -> Vec<Vec<f32>> {
        let h = self.config.hidden_size;
        states
            .chunks_exact(states.len() / lengths.len())
            .zip(lengths)
            .map(|(states, &len)| self.pooling.pool(states, h, len))
            .collect()
    }

    /// Word + position (+ token type) embeddings, then the encoders' embedding LayerNorm.
    /// Padded positions hold the pad token.
    fn embed_tokens(&self, encs: &[Encoding], seq_len: usize, hidden: &mut [f32]) {
        let c = &self.config;
        let h = c.hidden_size;
        let words = &self.weights.word_embeddings;
        let pad = (c.pad_token_id as usize).min(c.vocab_size - 1);
        for (b, enc) in encs.iter().enumerate() {
            let positions = c.positions(&enc.ids, seq_len);
            for (t, position) in positions.into_iter().enumerate() {
                let (id, segment) = match enc.ids.get(t) {
                    Some(&id) => (id as usize, enc.segments.get(t).copied().unwrap_or(0)),
                    None => (pad, 0),
                };
                let row = &mut hidden[(b * seq_len + t) * h..][..h];
                self.embedding_row((&words.row(id, h), 1.0), position, segment, row);
            }
        }
        if let Some(norm) = &self.weights.embed_norm {
            norm.apply(hidden);
        }
    }

    /// One token's input before the embedding LayerNorm: its word embedding times `scale`
    /// (integrated gradients' path; 1 otherwise), its position's and, for BERT and RoBERTa, its
    /// token type's.
    pub(crate) fn embedding_row(
        &self,
        (word, scale): (&[f32], f32),
        position: usize,
        segment: usize,
        row: &mut [f32],
    ) {
        let c = &self.config;
        let h = c.hidden_size;
        if let Some(dec) = &c.decoder {
            // Llama's positions are rotary, in the attention: no table. Gemma 2 scales its
            // embeddings by √hidden.
            let embed = dec.embed_scale.unwrap_or(1.0);
            row.iter_mut()
                .zip(word)
                .for_each(|(v, w)| *v = scale * w * embed);
        } else {
            let pos = &self.weights.position[position * h..][..h];
            row.iter_mut()
                .zip(word)
                .zip(pos)
                .for_each(|((v, w), p)| *v = scale * w + p);
        }
        let token_type = match c.family {
            Family::Bert => Some(segment),
            Family::Roberta => Some(0),
            Family::DistilBert | Family::Gpt2 | Family::Llama => None,
        };
        if let Some(ty) = token_type {
            let ty = &self.weights.token_type[ty * h..][..h];
            row.iter_mut().zip(ty).for_each(|(v, t)| *v += t);
        }
    }
}

/// Gemma 2's final logit softcapping, `c · tanh(logits / c)`, in place.
pub(crate) fn softcap_logits(c: &ModelConfig, logits: &mut [f32]) {
    if let Some(cap) = c.decoder.as_ref().and_then(|dec| dec.final_softcap) {
        logits.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
    }
}

/// The longest text of a batch, in tokens.
fn max_len(encs: &[Encoding]) -> usize {
    encs.iter().map(Encoding::len).max().unwrap_or(0)
}

/// `[rows, (n_heads + 2·n_kv_heads)·head_dim]` (q | k | v, each head's `head_dim` values side
/// by side) into q `[batch, n_heads, seq_len, head_dim]` and k, v `[batch, n_kv_heads, seq_len,
/// head_dim]`.
/// What [`check_finite`] names when the final hidden state holds a non-finite value.
pub(crate) const FINAL_HIDDEN_STATE: &str = "the final hidden state";
/// What it names when a view of a few rows stops at the last layer's attention.
const LAST_QKV: &str = "the last layer's queries, keys and values";

/// [`ModelError::NonFinite`] at the first NaN or infinity of `x` (`[texts, seq_len, width]`),
/// naming `state`.
pub(crate) fn check_finite(
    x: &[f32],
    width: usize,
    seq_len: usize,
    state: &'static str,
) -> Result<(), ModelError> {
    let Some(index) = x.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    let token = index / width.max(1);
    Err(ModelError::NonFinite {
        state,
        text: token / seq_len.max(1),
        token: token % seq_len.max(1),
        value: x[index],
    })
}

pub(crate) fn split_heads(
    qkv: &[f32],
    batch: usize,
    seq_len: usize,
    (n_heads, n_kv_heads): (usize, usize),
    d: usize,
    out: [&mut Vec<f32>; 3],
) {
    let (h, kv) = (n_heads * d, n_kv_heads * d);
    let stride = h + 2 * kv;
    for (part, dst) in out.into_iter().enumerate() {
        let (start, heads) = match part {
            0 => (0, n_heads),
            _ => (h + (part - 1) * kv, n_kv_heads),
        };
        // Row `r` of `dst` is token `t` of head `head` of text `b`.
        for_row_chunks(&mut dst[..batch * heads * seq_len * d], d, |first, rows| {
            for (i, row) in rows.chunks_exact_mut(d).enumerate() {
                let (bh, t) = ((first + i) / seq_len, (first + i) % seq_len);
                let (b, head) = (bh / heads, bh % heads);
                copy_head_row(
                    row,
                    &qkv[(b * seq_len + t) * stride + start + head * d..][..d],
                );
            }
        });
    }
}

/// Rotary position embeddings for the positions `first..first + n`, as transformers'
/// `apply_rotary_pos_emb` with `rotate_half`: dims `i` and `i + d/2` turn by `position ·
/// inv_freq[i]` (the angle in f32, its cosine and sine rounded from f64). The cosines and
/// sines are taken once and serve every head of every row.
pub(crate) struct Rotation {
    d: usize,
    /// The pairs turned: `d/2`, or fewer where `inv_freq` is shorter.
    turned: usize,
    /// `[n, turned]`.
    cos: Vec<f32>,
    /// `[n, turned]`.
    sin: Vec<f32>,
}

impl Rotation {
    pub(crate) fn new(inv_freq: &[f32], d: usize, first: usize, n: usize) -> Rotation {
        let half = d / 2;
        let turned = half.min(inv_freq.len());
        let (mut cos, mut sin) = (
            Vec::with_capacity(n * turned),
            Vec::with_capacity(n * turned),
        );
        for t in 0..n {
            let position = (first + t) as f32;
            for &f in &inv_freq[..turned] {
                let angle = f64::from(position * f);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Rotation {
            d,
            turned,
            cos,
            sin,
        }
    }

    /// Turns `rows` (`[n, d]`, the positions of [`Rotation::new`]) in place.
    pub(crate) fn apply(&self, rows: &mut [f32]) {
        for (t, row) in rows.chunks_exact_mut(self.d).enumerate() {
            self.turn(row, t);
        }
    }

    /// Turns every head of `x` (`[heads, n, d]`, each head's rows the positions of
    /// [`Rotation::new`]) in place, blocks of rows in parallel.
    pub(crate) fn apply_heads(&self, x: &mut [f32], n: usize) {
        for_row_chunks(x, self.d, |first, rows| {
            for (i, row) in rows.chunks_exact_mut(self.d).enumerate() {
                self.turn(row, (first + i) % n);
            }
        });
    }

    /// Turns one row (`[d]`) by the angles of the `t`-th position.
    fn turn(&self, row: &mut [f32], t: usize) {
        let turned = self.turned;
        let (cos, sin) = (
            &self.cos[t * turned..][..turned],
            &self.sin[t * turned..][..turned],
        );
        let (x1, x2) = row.split_at_mut(self.d / 2);
        let pairs = x1.iter_mut().zip(x2.iter_mut());
        for ((x1, x2), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
            let (a, b) = (*x1, *x2);
            *x1 = a * c - b * s;
            *x2 = b * c + a * s;
        }
    }
}

/// `[batch, n_kv_heads, T, d]` keys as `[batch, n_heads, T, d]`: each key/value head repeated
/// for the query heads that share it.
fn repeat_kv(
    k: &[f32],
    batch: usize,
    (n_heads, n_kv_heads): (usize, usize),
    per_head: usize,
) -> Vec<f32> {
    let group = n_heads / n_kv_heads;
    let mut out = Vec::with_capacity(batch * n_heads * per_head);
    for b in 0..batch {
        for head in 0..n_heads {
            let src = (b * n_kv_heads + head / group) * per_head;
            out.extend_from_slice(&k[src..src + per_head]);
        }
    }
    out
}

/// `[batch, heads, seq_len, head_dim]` into `[rows, hidden]`.
pub(crate) fn merge_heads(
    out: &[f32],
    batch: usize,
    seq_len: usize,
    n_heads: usize,
    d: usize,
    dst: &mut [f32],
) {
    let h = n_heads * d;
    // Row `r` of `dst` is token `r % seq_len` of text `r / seq_len`.
    for_row_chunks(&mut dst[..batch * seq_len * h], h, |first, rows| {
        for (i, row) in rows.chunks_exact_mut(h).enumerate() {
            let (b, t) = ((first + i) / seq_len, (first + i) % seq_len);
            for (head, dst) in row.chunks_exact_mut(d).enumerate() {
                copy_head_row(dst, &out[((b * n_heads + head) * seq_len + t) * d..][..d]);
            }
        }
    });
}

/// `dst = src` for one head's row: for the usual widths a fixed-length copy the compiler
/// inlines, instead of a call to `memcpy` per 128 bytes.
#[inline(always)]
fn copy_head_row(dst: &mut [f32], src: &[f32]) {
    match src.len() {
        32 => dst[..32].copy_from_slice(&src[..32]),
        64 => dst[..64].copy_from_slice(&src[..64]),
        _ => dst.copy_from_slice(src),
    }
}

/// Copies one layer's `[batch, rest…]` tensor into slot `layer` of `[batch, layers, rest…]`.
fn copy_per_layer(src: &[f32], dst: &mut [f32], batch: usize, layer: usize, n_layers: usize) {
    let per_batch = src.len() / batch;
    for (b, chunk) in src.chunks_exact(per_batch).enumerate() {
        let at = (b * n_layers + layer) * per_batch;
        dst[at..at + per_batch].copy_from_slice(chunk);
    }
}
