//! `attn-models`: run Hugging Face BERT and GPT-2 checkpoints on the CPU and capture what they
//! attend to — every layer's and head's attention, queries and keys, hidden states, GPT-2 logits
//! and sentence-transformers embeddings — reproducing transformers' outputs.
//!
//! A model is a directory with `config.json`, `model.safetensors` and `tokenizer.json`
//! ([`Model::load`]); [`resolve_model`] finds one that transformers left in the Hugging Face
//! cache by its id, and [`default_model_dir`] gives all-MiniLM-L6-v2, fetched into the
//! cache on first use. Layers, heads and tokens count from 0.
//!
//! ```
//! use attn_models::{Model, RunOptions};
//!
//! let model = Model::load(&attn_models::default_model_dir(false)?)?;
//! let enc = model.encode("The cat sat on the mat", None)?; // [CLS] the cat sat on the mat [SEP]
//! let options = RunOptions { attentions: true, ..RunOptions::default() };
//! let out = model.forward(&enc, &options)?;
//!
//! // Where "sat" looks in layer 3, head 7.
//! let sat = enc.tokens.iter().position(|t| t == "sat").expect("a token of the text");
//! let row = out.attention(0, 3, 7, sat).expect("attentions were asked for");
//! for (token, weight) in enc.tokens.iter().zip(row) {
//!     println!("{token:>6} {weight:.3}");
//! }
//! assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4);
//!
//! // Sentence embeddings as sentence-transformers makes them (unit length).
//! let emb = model.embed(&["The cat sat on the mat", "A dog lay on the rug"])?;
//! let cosine: f32 = emb[0].iter().zip(&emb[1]).map(|(a, b)| a * b).sum();
//! assert!(cosine > 0.0 && cosine < 1.0);
//! # Ok::<(), attn_models::ModelError>(())
//! ```

#![warn(missing_docs)]

mod answer;
mod block;
mod checkpoint;
mod config;
mod contributions;
mod error;
mod fetch;
mod generate;
mod gradients;
mod heads;
mod hub;
mod kv_cache;
mod model;
mod ops;
mod pooling;
mod seq2seq;
mod spm;
mod tokenize;
mod weights;

pub use answer::{Answer, Answered, MAX_ANSWER_TOKENS, MAX_WINDOW};
pub use checkpoint::{
    Checkpoint, F32Data, Half, MAX_HEADER_BYTES, TensorInfo, WeightData, repeated_header_key,
};
pub use config::{
    Activation, DecoderConfig, Family, ModelConfig, ModelKind, SUPPORTED_MODEL_TYPES,
};
pub use contributions::Contributions;
pub use error::ModelError;
pub use fetch::{
    DEFAULT_SHA256, cache_dir, default_model_dir, is_complete, model_from_env, unpack_model,
    verify_sha256,
};
pub use generate::{GenerateOptions, Generation, Sampling, Temperature, generate, greedy};
pub use gradients::{GradTarget, Gradients, IntegratedGradients, gauss_legendre};
pub use heads::{Classification, Prediction, Scoring, SpanLogits, Task, softmax};
pub use hub::resolve_model;
pub use kv_cache::{KvCache, Step};
pub use model::{EMBED_BATCH, Model, ModelOutput, QueryKey, RunOptions, set_threads};
pub use ops::{AUTO_MIN_ROWS, GemmKernel};
pub use seq2seq::{
    Decoded, GenerationSettings, SEQ2SEQ_MODEL_TYPES, Seq2Seq, Seq2SeqConfig, Seq2SeqOutput,
    T5Settings, is_seq2seq, relative_position_bucket,
};
pub use spm::MarianTokenizer;
pub use tokenize::{Encoding, Limit, TextTokenizer};
