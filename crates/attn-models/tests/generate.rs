//! KV-cached decoding and generation on `tests/data/tiny-gpt2`: cached logits against the
//! full masked pass and transformers' expected logits, generation against a full-pass argmax,
//! and each bad input as an error.

// Shared helpers: this test uses the golden reader and `assert_close`, not all of them.
#[allow(dead_code)]
mod common;

use attn_models::default_model_dir;
use std::num::NonZeroUsize;

use attn_models::KvCache;
use attn_models::{Encoding, Model, ModelError, RunOptions};
use attn_models::{GenerateOptions, Sampling, Temperature, generate, greedy};
use common::{Golden, assert_close, golden_dir, tiny_gpt2_with_a_nan};

fn tiny_gpt2() -> Model {
    Model::load(&golden_dir().join("tiny-gpt2")).unwrap()
}

/// An encoding of raw ids (the forward pass reads only `ids` and `segments` for GPT-2).
fn encoding(ids: &[u32]) -> Encoding {
    Encoding {
        ids: ids.to_vec(),
        tokens: ids.iter().map(u32::to_string).collect(),
        spans: vec![None; ids.len()],
        segments: vec![0; ids.len()],
        special: vec![false; ids.len()],
    }
}

/// The full pass's logits and attentions over `ids`.
fn full_pass(model: &Model, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let options = RunOptions {
        attentions: true,
        ..RunOptions::default()
    };
    let out = model.forward(&encoding(ids), &options).unwrap();
    (out.logits.unwrap(), out.attentions.unwrap())
}

fn as_f64(xs: &[f32]) -> (Vec<usize>, Vec<f64>) {
    (vec![xs.len()], xs.iter().map(|&x| f64::from(x)).collect())
}

fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn cached_decoding_matches_the_full_pass_and_transformers() {
    let dir = golden_dir().join("tiny-gpt2");
    let model = tiny_gpt2();
    let vocab = model.config().vocab_size;
    let (n_layers, n_heads) = (model.n_layers(), model.n_heads());
    for n in 0..2 {
        let g = Golden::read(&dir.join(format!("expected/text{n:02}.safetensors")));
        let ids = g.ids("input_ids");
        let t = ids.len();
        let (full, attentions) = full_pass(&model, &ids);
        let expected = &g.tensor("logits").1;
        // Feed a prefix of every length at once, then the rest one token at a time.
        for prefix in 1..=t {
            let mut cache = KvCache::new(&model).unwrap();
            let first = cache.feed(&ids[..prefix], false).unwrap();
            assert!(first.last_layer_attention.is_none());
            let mut logits = first.logits;
            for (pos, &id) in ids.iter().enumerate().skip(prefix) {
                let step = cache.feed(&[id], true).unwrap();
                assert_eq!(cache.len(), pos + 1);
                logits.extend_from_slice(&step.logits);
                // The head average of the last layer's row `pos` of the full pass.
                let got = step.last_layer_attention.unwrap();
                let mut want = vec![0.0f32; pos + 1];
                for head in 0..n_heads {
                    let at = (((n_layers - 1) * n_heads + head) * t + pos) * t;
                    for (w, &a) in want.iter_mut().zip(&attentions[at..][..pos + 1]) {
                        *w += a / n_heads as f32;
                    }
                }
                assert_close(
                    &format!("text{n} prefix {prefix} attention at {pos}"),
                    &got,
                    &as_f64(&want),
                    1e-5,
                );
            }
            assert_eq!(logits.len(), t * vocab);
            let what = format!("text{n} prefix {prefix}");
            assert_close(
                &format!("{what} vs full pass"),
                &logits,
                &as_f64(&full),
                1e-4,
            );
            assert_close(
                &format!("{what} vs transformers"),
                &logits,
                &(vec![t, vocab], expected.clone()),
                1e-3,
            );
        }
    }
}

#[test]
fn a_cache_longer_than_n_positions_is_an_error_and_leaves_the_cache_as_it_was() {
    let model = tiny_gpt2();
    let max = model.max_positions();
    let mut cache = KvCache::new(&model).unwrap();
    assert_eq!(cache.capacity(), max);
    let err = cache.feed(&vec![1; max + 1], false).unwrap_err();
    assert!(
        matches!(err, ModelError::CacheFull { needed, capacity, n_positions }
            if needed == max + 1 && capacity == max && n_positions == max),
        "{err:?}"
    );
    assert!(cache.is_empty());
    cache.feed(&vec![1; max - 1], false).unwrap();
    cache.feed(&[2], false).unwrap();
    assert_eq!(cache.len(), max);
    let err = cache.feed(&[3], false).unwrap_err();
    assert!(
        matches!(err, ModelError::CacheFull { needed, capacity, .. } if needed == max + 1 && capacity == max),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("KV cache holds 64 positions and 65 are needed"),
        "{err}"
    );
    assert_eq!(cache.len(), max);
}

#[test]
fn decoding_one_token_at_a_time_up_to_n_positions_matches_the_full_pass() {
    let model = tiny_gpt2();
    let (max, vocab) = (model.max_positions(), model.config().vocab_size);
    // 64 distinct ids spread over the vocabulary (37 is prime to 400, and 64 < 400).
    let ids: Vec<u32> = (0..max as u32)
        .map(|i| (i * 37 + 5) % vocab as u32)
        .collect();
    let (full, _) = full_pass(&model, &ids);
    let mut cache = KvCache::new(&model).unwrap();
    let mut logits = Vec::with_capacity(max * vocab);
    for &id in &ids {
        logits.extend(cache.feed(&[id], false).unwrap().logits);
    }
    assert_eq!(cache.len(), max);
    assert_close(
        "64 single-token steps vs full pass",
        &logits,
        &as_f64(&full),
        1e-4,
    );
    let err = cache.feed(&[1], false).unwrap_err();
    assert!(
        matches!(err, ModelError::CacheFull { needed: 65, .. }),
        "{err:?}"
    );
}

#[test]
fn a_smaller_capacity_is_kept_and_a_larger_one_refused() {
    let model = tiny_gpt2();
    let max = model.max_positions();
    let mut cache = KvCache::with_capacity(&model, 5).unwrap();
    assert_eq!(cache.capacity(), 5);
    let step = cache.feed(&[1, 2, 3], false).unwrap();
    let err = cache.feed(&[4, 5, 6], false).unwrap_err();
    assert!(
        matches!(err, ModelError::CacheFull { needed: 6, capacity: 5, n_positions }
            if n_positions == max),
        "{err:?}"
    );
    assert_eq!(cache.len(), 3);
    // The refused feed wrote nothing that counts: the next token sees the same 3-token past.
    let next = cache.feed(&[4, 5], false).unwrap();
    let (full, _) = full_pass(&model, &[1, 2, 3, 4, 5]);
    let mut logits = step.logits;
    logits.extend(next.logits);
    assert_close("capacity 5 vs full pass", &logits, &as_f64(&full), 1e-4);

    let err = KvCache::with_capacity(&model, max + 1).unwrap_err();
    assert!(
        matches!(err, ModelError::CacheFull { needed, capacity, .. } if needed == max + 1 && capacity == max),
        "{err:?}"
    );
    assert!(
        KvCache::with_capacity(&model, 0)
            .unwrap()
            .feed(&[1], false)
            .is_err()
    );
}

#[test]
fn bad_tokens_are_errors() {
    let model = tiny_gpt2();
    let vocab = model.config().vocab_size as u32;
    let mut cache = KvCache::new(&model).unwrap();
    let err = cache.feed(&[], false).unwrap_err();
    assert!(matches!(err, ModelError::NoTokens), "{err:?}");
    let err = cache.feed(&[1, vocab], false).unwrap_err();
    assert!(
        matches!(err, ModelError::TokenOutOfVocab { id, .. } if id == vocab),
        "{err:?}"
    );
    assert!(cache.is_empty());
}

#[test]
fn a_bert_model_cannot_generate() {
    let dir = default_model_dir(false).expect("the default model is cached or can be fetched");
    let bert = Model::load(&dir).unwrap();
    let is_not_a_decoder = |err: &ModelError| {
        matches!(err, ModelError::NotADecoder { model, model_type }
            if model_type == "bert" && model == "all-MiniLM-L6-v2")
    };
    let err = KvCache::new(&bert).unwrap_err();
    assert!(is_not_a_decoder(&err), "{err:?}");
    assert_eq!(
        err.to_string(),
        "generating text needs a decoder (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2); all-MiniLM-L6-v2 is a bert model"
    );
    let err = KvCache::with_capacity(&bert, 4).unwrap_err();
    assert!(is_not_a_decoder(&err), "{err:?}");
    let options = GenerateOptions {
        max_new_tokens: 2,
        sampling: Sampling::Greedy,
        attention: false,
    };
    let err = generate(&bert, "The cat sat", &options).unwrap_err();
    assert!(is_not_a_decoder(&err), "{err:?}");
    // Checked before the prompt: an empty prompt to a BERT model is still "not a decoder".
    let err = generate(&bert, "", &options).unwrap_err();
    assert!(is_not_a_decoder(&err), "{err:?}");
}

#[test]
fn greedy_generation_is_the_full_pass_argmax() {
    let model = tiny_gpt2();
    let prompt = "The cat sat on the mat";
    let options = GenerateOptions {
        max_new_tokens: 8,
        sampling: Sampling::Greedy,
        attention: true,
    };
    let out = generate(&model, prompt, &options).unwrap();
    assert_eq!(out.ids.len(), 8);
    assert_eq!(out.pieces.len(), 8);
    // Independently: rerun the full pass on the growing sequence and take its last argmax.
    let vocab = model.config().vocab_size;
    let mut ids = model.encode(prompt, None).unwrap().ids;
    assert_eq!(out.prompt.ids, ids);
    let attention = out.attention.as_ref().unwrap();
    for (i, &got) in out.ids.iter().enumerate() {
        let (logits, _) = full_pass(&model, &ids);
        let want = argmax(&logits[(ids.len() - 1) * vocab..]);
        assert_eq!(got, want, "token {i}");
        assert_eq!(attention[i].len(), ids.len(), "attention of token {i}");
        let sum: f32 = attention[i].iter().sum();
        assert!(
            (sum - 1.0).abs() < 1e-5,
            "attention of token {i} sums to {sum}"
        );
        ids.push(want);
    }
    // Sampling restricted to the single most likely token is greedy.
    let top1 = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: Temperature::new(0.7).unwrap(),
            top_k: NonZeroUsize::new(1),
            seed: 9,
        },
        attention: false,
        ..options
    };
    assert_eq!(generate(&model, prompt, &top1).unwrap().ids, out.ids);
}

#[test]
fn sampling_is_reproducible_with_a_seed() {
    let model = tiny_gpt2();
    let sample = |seed| GenerateOptions {
        max_new_tokens: 12,
        sampling: Sampling::Sample {
            temperature: Temperature::new(1.5).unwrap(),
            top_k: None,
            seed,
        },
        attention: false,
    };
    let a = generate(&model, "Hello there", &sample(7)).unwrap();
    let b = generate(&model, "Hello there", &sample(7)).unwrap();
    assert_eq!(a, b);
    // 400 tokens at temperature 1.5: two seeds giving the same 12 tokens would be a broken
    // generator, not chance.
    let c = generate(&model, "Hello there", &sample(8)).unwrap();
    assert_ne!(a.ids, c.ids);
}

#[test]
fn nan_weights_are_an_error_and_leave_the_cache_as_it_was() {
    let is_nan_error =
        |err: &ModelError| matches!(err, ModelError::NonFinite { value, .. } if value.is_nan());
    // The first weight of the last layer's query/key/value projection (`[in, 3·hidden]`:
    // input 0's weight in head 0's first query column): every fed token's query there is NaN.
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_gpt2_with_a_nan(dir.path(), "h.1.attn.c_attn.weight");
    let mut cache = KvCache::new(&model).unwrap();
    let err = cache.feed(&[1, 2, 3], false).unwrap_err();
    assert!(is_nan_error(&err), "{err:?}");
    assert!(err.to_string().contains("non-finite"), "{err}");
    assert!(cache.is_empty());
    let err = cache.feed(&[1], true).unwrap_err();
    assert!(is_nan_error(&err), "{err:?}");
    assert!(cache.is_empty());
    let options = GenerateOptions {
        max_new_tokens: 3,
        sampling: Sampling::Greedy,
        attention: false,
    };
    let err = generate(&model, "The cat", &options).unwrap_err();
    assert!(is_nan_error(&err), "{err:?}");
}

/// Query and key weights so large that `q·k` passes f32's range: the error names the layer,
/// the head and the checkpoint, once, in the forward pass and in the cached decoder alike. It
/// said "attention: …" twice over, and told the user to scale ALiBi slopes or a float mask
/// down, which a GPT-2 has none of.
#[test]
fn overflowing_attention_scores_name_the_layer_and_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    // `[in, 3·hidden]`: input 0's weight in head 1's first query and key columns (the cached
    // decoder's one-head calls said head 0 whatever the head).
    let huge = |tensors: &mut Vec<common::RawTensor>| {
        let (_, _, shape, data) = tensors
            .iter_mut()
            .find(|(name, ..)| name.ends_with("h.1.attn.c_attn.weight"))
            .unwrap();
        let (hidden, head_dim) = (shape[1] / 3, shape[1] / 3 / 4);
        for column in [head_dim, hidden + head_dim] {
            data[4 * column..][..4].copy_from_slice(&1e30f32.to_le_bytes());
        }
    };
    common::edited_checkpoint(
        &golden_dir().join("tiny-gpt2"),
        dir.path(),
        |_| {},
        Some(&huge),
    );
    let model = Model::load(dir.path()).unwrap();
    let options = GenerateOptions {
        max_new_tokens: 2,
        sampling: Sampling::Greedy,
        attention: false,
    };
    let forward = model
        .forward(
            &model.encode("The cat sat", None).unwrap(),
            &RunOptions::default(),
        )
        .unwrap_err();
    let decoding = generate(&model, "The cat sat", &options).unwrap_err();
    for err in [forward, decoding] {
        let message = err.to_string();
        assert!(
            matches!(err, ModelError::Attention { layer: Some(1), .. }),
            "{err:?}"
        );
        assert!(
            message.starts_with("layer 1, head 1: the attention scores of token ")
                && message.contains("query or key weights"),
            "{message}"
        );
        assert!(std::error::Error::source(&err).is_none(), "{err:?}");
    }
}

#[test]
fn greedy_takes_the_largest_logit_and_the_lowest_id_on_a_tie() {
    assert_eq!(greedy(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(greedy(&[-5.0]), 0);
    assert_eq!(greedy(&[f32::NEG_INFINITY, -1e30, 0.5]), 2);
}

#[test]
fn temperatures_must_be_finite_and_above_zero() {
    for t in [0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(Temperature::new(t), None, "{t}");
    }
    assert_eq!(Temperature::ONE.get(), 1.0);
    for t in [f32::MIN_POSITIVE, 0.5, 1.0, 100.0] {
        assert_eq!(Temperature::new(t).map(Temperature::get), Some(t));
    }
}

#[test]
fn bad_prompts_and_lengths_are_errors() {
    let model = tiny_gpt2();
    let greedy = |max_new_tokens| GenerateOptions {
        max_new_tokens,
        sampling: Sampling::Greedy,
        attention: false,
    };
    let err = generate(&model, "", &greedy(3)).unwrap_err();
    assert!(matches!(err, ModelError::EmptyText { .. }), "{err:?}");
    // Whitespace is a GPT-2 prompt, as in transformers.
    assert_eq!(generate(&model, "   ", &greedy(3)).unwrap().ids.len(), 3);
    // The last new token is never fed back: P prompt tokens + N new ones need P + N − 1
    // positions.
    let max = model.max_positions();
    let prompt_len = model.encode("Hi", None).unwrap().len();
    let out = generate(&model, "Hi", &greedy(max + 1 - prompt_len)).unwrap();
    assert_eq!(out.ids.len(), max + 1 - prompt_len);
    let err = generate(&model, "Hi", &greedy(max + 2 - prompt_len)).unwrap_err();
    assert!(
        matches!(err, ModelError::CacheFull { needed, capacity, .. } if needed == max + 1 && capacity == max),
        "{err:?}"
    );
    assert!(generate(&model, "Hi", &greedy(0)).unwrap().ids.is_empty());
    for huge in [usize::MAX, usize::MAX - 1] {
        let err = generate(&model, "Hi", &greedy(huge)).unwrap_err();
        assert!(
            matches!(err, ModelError::CacheFull { needed: usize::MAX, capacity, .. } if capacity == max),
            "{err:?}"
        );
    }
}

#[test]
fn the_cache_runs_the_models_gemm_kernel() {
    use attn_models::GemmKernel;
    let prefill = |kernel| {
        let mut model = tiny_gpt2();
        model.set_gemm_kernel(kernel);
        let mut cache = KvCache::new(&model).unwrap();
        cache
            .feed(&(1..40).collect::<Vec<u32>>(), false)
            .unwrap()
            .logits
    };
    let (tiles, f32) = (prefill(GemmKernel::Bf16x3), prefill(GemmKernel::F32));
    // bf16x3 rounds differently from f32 GEMMs; without AMX it is f32.
    let available = attn_core::Bf16x3Weight::available();
    assert_eq!(
        tiles != f32,
        available,
        "the kernels' logits differ only on AMX"
    );
    assert_close("bf16x3 against f32", &tiles, &as_f64(&f32), 1e-3);
}

/// tiny-gpt2 in `dir` with only the tokenizer's ids that `keep` keeps (and the merges whose
/// pieces are all kept), loaded: a model whose embedding table has rows no text comes from.
fn tiny_gpt2_writing_only(dir: &std::path::Path, keep: impl Fn(u64) -> bool) -> Model {
    common::edited_checkpoint(&golden_dir().join("tiny-gpt2"), dir, |_| {}, None);
    let path = dir.join("tokenizer.json");
    let mut tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let model = &mut tokenizer["model"];
    let vocab = model["vocab"].as_object_mut().unwrap();
    vocab.retain(|_, id| keep(id.as_u64().unwrap()));
    let known: std::collections::HashSet<String> = vocab.keys().cloned().collect();
    let merges = model["merges"].as_array_mut().unwrap();
    merges.retain(|merge| {
        let pieces: Vec<String> = match merge {
            serde_json::Value::String(s) => s.split(' ').map(str::to_string).collect(),
            other => (other.as_array().unwrap().iter())
                .map(|p| p.as_str().unwrap().to_string())
                .collect(),
        };
        pieces.iter().all(|p| known.contains(p)) && known.contains(&pieces.concat())
    });
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    Model::load(dir).unwrap()
}

/// A model whose tokenizer lacks some of its ids generates only ids the tokenizer can write,
/// greedy or sampled, each decoded. Greedy decoding of the prompt picks id 160 with the full
/// tokenizer; here the tokenizer lacks it, either past the end of a vocabulary cut at 150 or in
/// a gap (150 to 170) below ids it has. Without the mask generation chose ids the tokenizer
/// has no token for (decoded as "" before `decode` refused them).
#[test]
fn generation_chooses_only_ids_the_tokenizer_can_write() {
    let greedy = GenerateOptions {
        max_new_tokens: 6,
        sampling: Sampling::Greedy,
        attention: false,
    };
    let sampled = GenerateOptions {
        sampling: Sampling::Sample {
            temperature: Temperature::new(5.0).unwrap(),
            top_k: None,
            seed: 3,
        },
        max_new_tokens: 40,
        ..greedy
    };
    let prompt = "The cat sat on the mat";
    let full = generate(&tiny_gpt2(), prompt, &greedy).unwrap();
    assert!(full.ids.contains(&160), "{:?}", full.ids);
    let cuts: [&dyn Fn(u64) -> bool; 2] = [&|id| id < 150, &|id| !(150..=170).contains(&id)];
    for keep in cuts {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_gpt2_writing_only(dir.path(), keep);
        assert_eq!(model.config().vocab_size, 400);
        assert_eq!(model.token(160), None);
        assert_eq!(
            model.decode(&[160]).unwrap_err().to_string(),
            "the tokenizer has no token for id 160"
        );
        for options in [&greedy, &sampled] {
            let out = generate(&model, prompt, options).unwrap();
            assert!(out.ids.iter().all(|&id| keep(id.into())), "{:?}", out.ids);
            assert_eq!(out.pieces.len(), options.max_new_tokens);
        }
    }
}
