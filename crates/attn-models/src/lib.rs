//! `attn-models`: run Hugging Face BERT and GPT-2 checkpoints on the CPU and capture what they
//! attend to — every layer's and head's attention, queries and keys, hidden states, GPT-2 logits
//! and sentence-transformers embeddings — reproducing transformers' outputs.

pub mod bf16x3;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod fetch;
pub mod generate;
pub mod hub;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod pooling;
pub mod tokenize;
pub mod weights;

pub use config::{Activation, Family, ModelConfig, ModelKind, SUPPORTED_MODEL_TYPES};
pub use error::ModelError;
pub use model::{EMBED_BATCH, Model, ModelOutput, QueryKey, RunOptions, set_threads};
pub use tokenize::Encoding;
