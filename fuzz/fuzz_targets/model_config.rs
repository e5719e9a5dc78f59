//! `config.json`, `modules.json` and the pooling config of a model directory, and the
//! model-to-config shape checks: the fuzzed files sit next to a real checkpoint and tokenizer
//! (tiny-gpt2 and llm/llama from the golden data for GPT-2 and Llama-style configs, the cached
//! all-MiniLM-L6-v2 for BERT configs) and go through [`Model::load`]. A model that loads must run a short text and
//! return attention of the shape its config promises.
//!
//! Input: `config.json` NUL `modules.json` NUL `1_Pooling/config.json` (empty = absent).
#![no_main]

use std::path::Path;

use attn_models::{Model, ModelConfig, ModelKind, RunOptions};
use attnscope_fuzz::{cached_minilm, fields, golden, scratch_dir};
use libfuzzer_sys::fuzz_target;

fn link(from: &Path, to: &Path) {
    let _ = std::fs::remove_file(to);
    std::os::unix::fs::symlink(from, to).expect("linking a checkpoint into the scratch model");
}

fn write_or_remove(path: &Path, bytes: &[u8]) {
    if bytes.is_empty() {
        let _ = std::fs::remove_file(path);
    } else {
        std::fs::write(path, bytes).expect("writing a fuzzed model file");
    }
}

fuzz_target!(|data: &[u8]| {
    let parts = fields(data, 3);
    let Ok(config_text) = std::str::from_utf8(parts[0]) else {
        return;
    };
    let Ok(config) = ModelConfig::from_json(config_text) else {
        return;
    };
    let base = match config.kind() {
        ModelKind::Gpt2 => golden().join("tiny-gpt2"),
        ModelKind::Llama => golden().join("llm/llama"),
        ModelKind::Bert => match cached_minilm() {
            Some(dir) => dir,
            None => return,
        },
    };
    let dir = scratch_dir().join("model");
    std::fs::create_dir_all(dir.join("1_Pooling")).expect("creating the scratch model");
    link(
        &base.join("model.safetensors"),
        &dir.join("model.safetensors"),
    );
    link(&base.join("tokenizer.json"), &dir.join("tokenizer.json"));
    std::fs::write(dir.join("config.json"), parts[0]).expect("writing config.json");
    write_or_remove(&dir.join("modules.json"), parts[1]);
    write_or_remove(&dir.join("1_Pooling/config.json"), parts[2]);

    let Ok(model) = Model::load(&dir) else {
        return;
    };
    let enc = model
        .encode("Hello, world", None)
        .expect("a short text fits any model");
    let out = model
        .forward(
            &enc,
            &RunOptions {
                attentions: true,
                ..RunOptions::default()
            },
        )
        .expect("a loaded model runs a short text");
    let t = enc.len();
    let weights = out.attentions.expect("attentions were asked for");
    assert_eq!(weights.len(), model.n_layers() * model.n_heads() * t * t);
    let _ = model.embed(&["Hello, world"]);
});
