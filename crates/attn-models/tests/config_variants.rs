//! Config settings that change what a checkpoint computes: GPT-2 with its own language-model
//! head (`tie_word_embeddings: false`), BERT built as a decoder (`is_decoder: true`), and the
//! sentence-transformers settings of embeddings (`max_seq_length`, `do_lower_case`, the
//! `Normalize` module). Each is checked against an independent computation, and against the
//! setting's absence so that the test fails if the setting is ignored.

#[allow(dead_code)]
mod common;

use attn_models::KvCache;
use attn_models::TextTokenizer;
use attn_models::default_model_dir;
use attn_models::{Encoding, Model, RunOptions};
use common::{RawTensor, edited_checkpoint, golden_dir};
use safetensors::Dtype;

/// The logits `h·headᵀ` in f64, `head` being `[vocab, hidden]`.
fn logits_of(hidden: &[f32], head: &[f32], h: usize) -> Vec<f64> {
    hidden
        .chunks_exact(h)
        .flat_map(|row| {
            head.chunks_exact(h).map(move |w| {
                row.iter()
                    .zip(w)
                    .map(|(&x, &y)| f64::from(x) * f64::from(y))
                    .sum::<f64>()
            })
        })
        .collect()
}

fn as_f64(xs: &[f32]) -> Vec<f64> {
    xs.iter().map(|&x| f64::from(x)).collect()
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - y).abs())
        .fold(0.0, f64::max)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// tiny-gpt2 with `tie_word_embeddings: false` and an `lm_head.weight` of its own: the word
/// embeddings with their rows in reverse order, halved.
fn untied_tiny_gpt2(dir: &std::path::Path, with_head: bool) -> Vec<f32> {
    let head = std::cell::RefCell::new(Vec::new());
    let add_head = |tensors: &mut Vec<RawTensor>| {
        let (_, _, shape, data) = tensors
            .iter()
            .find(|(name, ..)| name.ends_with("wte.weight"))
            .unwrap()
            .clone();
        let wte = f32s(&data);
        let h = shape[1];
        let reversed: Vec<f32> = wte
            .chunks_exact(h)
            .rev()
            .flatten()
            .map(|x| 0.5 * x)
            .collect();
        let bytes = reversed.iter().flat_map(|x| x.to_le_bytes()).collect();
        if with_head {
            tensors.push(("lm_head.weight".into(), Dtype::F32, shape, bytes));
        }
        *head.borrow_mut() = reversed;
    };
    edited_checkpoint(
        &golden_dir().join("tiny-gpt2"),
        dir,
        |config| config["tie_word_embeddings"] = false.into(),
        Some(&add_head),
    );
    head.into_inner()
}

#[test]
fn an_untied_gpt2_head_is_read_from_lm_head_weight() {
    let dir = tempfile::tempdir().unwrap();
    let head = untied_tiny_gpt2(dir.path(), true);
    let model = Model::load(dir.path()).unwrap();
    let tied = Model::load(&golden_dir().join("tiny-gpt2")).unwrap();
    let h = model.hidden_size();
    let enc = model.encode("Hello there, friend of mine", None).unwrap();
    let out = model.forward(&enc, &RunOptions::default()).unwrap();
    let logits = out.logits.unwrap();

    let want = logits_of(&out.last_hidden_state, &head, h);
    let err = max_diff(&logits, &want);
    assert!(err < 1e-4, "logits against h·lm_headᵀ: {err:e}");
    // The same hidden states through the word embeddings give other logits.
    let tied_out = tied.forward(&enc, &RunOptions::default()).unwrap();
    let hidden = as_f64(&out.last_hidden_state);
    assert!(max_diff(&tied_out.last_hidden_state, &hidden) < 1e-6);
    assert!(max_diff(&tied_out.logits.unwrap(), &want) > 1e-2);

    // The KV cache's logits, the whole prompt at once and then one token at a time.
    let mut cache = KvCache::new(&model).unwrap();
    let (first, rest) = enc.ids.split_at(2);
    let mut cached = cache.feed(first, false).unwrap().logits;
    for &id in rest {
        cached.extend(cache.feed(&[id], false).unwrap().logits);
    }
    let err = max_diff(&cached, &want);
    assert!(err < 1e-4, "cached logits against h·lm_headᵀ: {err:e}");
}

/// An output head with a NaN row (token 5, which the prompt does not use): the hidden states
/// stay finite, the logits did not, and nothing said so: greedy skipped the NaN, sampling drew
/// the same tokens whatever the seed. Both passes now refuse it, naming the token.
#[test]
fn a_nan_in_the_output_head_is_refused_naming_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let nan_row = |tensors: &mut Vec<RawTensor>| {
        let (_, _, shape, data) = tensors
            .iter()
            .find(|(name, ..)| name.ends_with("wte.weight"))
            .unwrap()
            .clone();
        let mut head = f32s(&data);
        let h = shape[1];
        head[5 * h..6 * h].fill(f32::NAN);
        let bytes = head.iter().flat_map(|x| x.to_le_bytes()).collect();
        tensors.push(("lm_head.weight".into(), Dtype::F32, shape, bytes));
    };
    edited_checkpoint(
        &golden_dir().join("tiny-gpt2"),
        dir.path(),
        |config| config["tie_word_embeddings"] = false.into(),
        Some(&nan_row),
    );
    let model = Model::load(dir.path()).unwrap();
    let enc = model.encode("Hello there", None).unwrap();
    assert!(!enc.ids.contains(&5));
    for err in [
        model.forward(&enc, &RunOptions::default()).err().unwrap(),
        KvCache::new(&model)
            .unwrap()
            .feed(&enc.ids, false)
            .err()
            .unwrap(),
    ] {
        let message = err.to_string();
        assert!(
            message.contains("non-finite logit (NaN) for token id 5")
                && message.contains("lm_head"),
            "{message}"
        );
    }
}

#[test]
fn an_untied_gpt2_without_lm_head_weight_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    untied_tiny_gpt2(dir.path(), false);
    let message = Model::load(dir.path()).err().unwrap().to_string();
    assert!(message.contains("lm_head.weight"), "{message}");
}

/// The first `n` tokens of `enc`.
fn prefix(enc: &Encoding, n: usize) -> Encoding {
    Encoding {
        ids: enc.ids[..n].to_vec(),
        tokens: enc.tokens[..n].to_vec(),
        spans: enc.spans[..n].to_vec(),
        segments: enc.segments[..n].to_vec(),
        special: enc.special[..n].to_vec(),
    }
}

#[test]
fn a_bert_decoder_attends_causally() {
    let minilm = default_model_dir(false).expect("the default model is cached or can be fetched");
    let dir = tempfile::tempdir().unwrap();
    edited_checkpoint(
        &minilm,
        dir.path(),
        |config| config["is_decoder"] = true.into(),
        None,
    );
    let decoder = Model::load(dir.path()).unwrap();
    let encoder = Model::load(&minilm).unwrap();
    let options = RunOptions {
        attentions: true,
        ..RunOptions::default()
    };
    let enc = decoder.encode("The cat sat on the mat", None).unwrap();
    let t = enc.len();
    let h = decoder.hidden_size();
    let out = decoder.forward(&enc, &options).unwrap();

    // Every layer's and head's row i weighs no key after i, and sums to 1.
    for (r, row) in out.attentions.unwrap().chunks_exact(t).enumerate() {
        let i = r % t;
        assert!(row[i + 1..].iter().all(|&w| w == 0.0), "row {r}: {row:?}");
        let sum: f32 = row.iter().sum();
        assert!((sum - 1.0).abs() < 1e-5, "row {r} sums to {sum}");
    }
    // So a prefix's hidden states are the whole text's first rows.
    for n in [1, 3, t - 1] {
        let part = decoder.forward(&prefix(&enc, n), &options).unwrap();
        let whole = as_f64(&out.last_hidden_state[..n * h]);
        let err = max_diff(&part.last_hidden_state, &whole);
        assert!(err < 1e-4, "prefix of {n}: {err:e}");
    }
    // The encoder's rows see later keys.
    let bidirectional = encoder.forward(&enc, &options).unwrap();
    let first_row = &bidirectional.attentions.unwrap()[..t];
    assert!(first_row[1..].iter().any(|&w| w > 1e-3), "{first_row:?}");
}

#[test]
fn unsupported_settings_are_refused_naming_their_field() {
    let gpt2 = std::fs::read_to_string(golden_dir().join("tiny-gpt2/config.json")).unwrap();
    let minilm = default_model_dir(false).expect("the default model is cached or can be fetched");
    let bert = std::fs::read_to_string(minilm.join("config.json")).unwrap();
    for (base, field) in [
        (&bert, "add_cross_attention"),
        (&gpt2, "add_cross_attention"),
        (&gpt2, "scale_attn_by_inverse_layer_idx"),
    ] {
        let mut config: serde_json::Value = serde_json::from_str(base).unwrap();
        config[field] = true.into();
        let message = attn_models::ModelConfig::from_json(&config.to_string())
            .unwrap_err()
            .to_string();
        assert!(message.contains(field), "{field}: {message}");
    }
}

fn minilm_copy(dir: &std::path::Path) -> std::path::PathBuf {
    let minilm = default_model_dir(false).expect("the default model is cached or can be fetched");
    edited_checkpoint(&minilm, dir, |_| {}, None);
    minilm
}

/// Rewrites the JSON file `name` in `dir`.
fn edit_json(dir: &std::path::Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(name);
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(&path, doc.to_string()).unwrap();
}

#[test]
fn embeddings_stop_at_sentence_transformers_max_seq_length() {
    let model = Model::load(&default_model_dir(false).unwrap()).unwrap();
    // "cat" is one token: n words are n + 2 tokens with [CLS] and [SEP].
    let cats = |n: usize| "cat ".repeat(n);
    assert_eq!(model.encode(&cats(300), None).unwrap().len(), 302);
    for n in [255, 300] {
        let err = model.embed(&["fine", &cats(n)]).unwrap_err();
        assert!(
            matches!(
                err,
                attn_models::ModelError::TooLong {
                    max: 256,
                    embedding: true,
                    text: Some(1),
                    ..
                }
            ),
            "{n}: {err:?}"
        );
        assert!(err.to_string().contains("max_seq_length"), "{err}");
    }
    // Cut to 256 tokens: [CLS], 254 cats, [SEP], the same tokens as 254 cats.
    let cut = model.embed_with(&[&cats(300)], true).unwrap();
    let whole = model.embed(&[&cats(254)]).unwrap();
    assert_eq!(cut, whole);
    // The attention views still take the model's 512 positions.
    assert_eq!(model.encode(&cats(510), None).unwrap().len(), 512);
}

#[test]
fn a_plain_checkpoint_is_mean_pooled_without_normalising() {
    let dir = tempfile::tempdir().unwrap();
    let minilm = minilm_copy(dir.path());
    std::fs::remove_file(dir.path().join("modules.json")).unwrap();
    let plain = Model::load(dir.path()).unwrap();
    let normalised = Model::load(&minilm).unwrap();
    let texts = ["The cat sat on the mat", "A completely different sentence"];
    let got = plain.embed(&texts).unwrap();
    let want = normalised.embed(&texts).unwrap();
    for (g, w) in got.iter().zip(&want) {
        let norm = g.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() > 0.1, "norm {norm}");
        let scaled: Vec<f64> = g.iter().map(|&x| f64::from(x) / norm).collect();
        let err = max_diff(w, &scaled);
        assert!(err < 1e-6, "direction differs by {err:e}");
    }
}

#[test]
fn do_lower_case_lowers_texts_before_tokenizing() {
    let dir = tempfile::tempdir().unwrap();
    minilm_copy(dir.path());
    // A cased tokenizer, so that only do_lower_case can make "The CAT" and "the cat" agree.
    edit_json(dir.path(), "tokenizer.json", |t| {
        t["normalizer"]["lowercase"] = false.into();
    });
    let cased = Model::load(dir.path()).unwrap();
    let differ = cased.embed(&["The CAT sat", "the cat sat"]).unwrap();
    assert_ne!(differ[0], differ[1]);
    edit_json(dir.path(), "sentence_bert_config.json", |c| {
        c["do_lower_case"] = true.into();
    });
    let lowered = Model::load(dir.path()).unwrap();
    let same = lowered.embed(&["The CAT sat", "the cat sat"]).unwrap();
    assert_eq!(same[0], same[1]);
    assert_eq!(same[1], differ[1]);
}

#[test]
fn relu_keeps_a_nan_for_the_finiteness_check() {
    let dir = tempfile::tempdir().unwrap();
    let poison = |tensors: &mut Vec<RawTensor>| {
        let (_, _, _, data) = tensors
            .iter_mut()
            .find(|(name, ..)| name.ends_with("h.0.mlp.c_fc.bias"))
            .unwrap();
        data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    };
    edited_checkpoint(
        &golden_dir().join("tiny-gpt2"),
        dir.path(),
        |config| config["activation_function"] = "relu".into(),
        Some(&poison),
    );
    let model = Model::load(dir.path()).unwrap();
    let enc = model.encode("The cat sat", None).unwrap();
    let err = model.forward(&enc, &RunOptions::default()).unwrap_err();
    assert!(
        matches!(err, attn_models::ModelError::NonFinite { value, .. } if value.is_nan()),
        "{err:?}"
    );
}

#[test]
fn truncating_below_the_special_tokens_is_an_error_not_a_panic() {
    let minilm = default_model_dir(false).expect("the default model is cached or can be fetched");
    let path = minilm.join("tokenizer.json");
    for (positions, pair, fits) in [
        (1, None, false),
        (2, None, false),
        (3, None, true),
        (3, Some("bye now"), false),
        (4, Some("bye now"), false),
        (5, Some("bye now"), true),
    ] {
        let tokenizer = TextTokenizer::from_file(&path, positions).unwrap();
        let got = tokenizer.encode("hello world again", pair, true);
        match fits {
            true => assert_eq!(got.unwrap().len(), positions),
            false => {
                let message = got.unwrap_err().to_string();
                assert!(message.contains("special tokens"), "{message}");
            }
        }
    }
}

/// tiny-gpt2 with every tensor stored as `dtype`, the values given by `store` (f32 → bytes).
fn tiny_gpt2_as(dir: &std::path::Path, dtype: Dtype, store: fn(f32) -> Vec<u8>) {
    let convert = |tensors: &mut Vec<RawTensor>| {
        for (_, dt, _, data) in tensors.iter_mut() {
            *data = f32s(data).into_iter().flat_map(store).collect();
            *dt = dtype;
        }
    };
    edited_checkpoint(&golden_dir().join("tiny-gpt2"), dir, |_| {}, Some(&convert));
}

#[test]
fn f16_bf16_and_f64_checkpoints_load_as_f32() {
    use half::{bf16, f16};
    let run = |dtype, store: fn(f32) -> Vec<u8>| {
        let dir = tempfile::tempdir().unwrap();
        tiny_gpt2_as(dir.path(), dtype, store);
        let model = Model::load(dir.path()).unwrap();
        let enc = model.encode("The cat sat on the mat", None).unwrap();
        let out = model.forward(&enc, &RunOptions::default()).unwrap();
        out.logits.unwrap()
    };
    let f32_bytes = |x: f32| x.to_le_bytes().to_vec();
    // F64 holds every f32 exactly: the same logits, bit for bit.
    let reference = run(Dtype::F32, f32_bytes);
    assert_eq!(
        run(Dtype::F64, |x| f64::from(x).to_le_bytes().to_vec()),
        reference
    );
    // F16 and BF16: the same logits as F32 weights holding the rounded values.
    let rounded = [
        (
            Dtype::F16,
            (|x| f16::from_f32(x).to_le_bytes().to_vec()) as fn(f32) -> Vec<u8>,
            (|x| f16::from_f32(x).to_f32().to_le_bytes().to_vec()) as fn(f32) -> Vec<u8>,
        ),
        (
            Dtype::BF16,
            |x| bf16::from_f32(x).to_le_bytes().to_vec(),
            |x| bf16::from_f32(x).to_f32().to_le_bytes().to_vec(),
        ),
    ];
    for (dtype, store, store_rounded) in rounded {
        let got = run(dtype, store);
        assert_eq!(got, run(Dtype::F32, store_rounded), "{dtype:?}");
        assert_ne!(got, reference, "{dtype:?} rounds the weights");
    }
}

#[test]
fn gpt2_config_errors_name_gpt2_fields_and_eos_lists_are_read() {
    let gpt2 = std::fs::read_to_string(golden_dir().join("tiny-gpt2/config.json")).unwrap();
    let with = |field: &str, value: serde_json::Value| {
        let mut config: serde_json::Value = serde_json::from_str(&gpt2).unwrap();
        config[field] = value;
        attn_models::ModelConfig::from_json(&config.to_string())
    };
    for (field, value) in [
        ("n_head", 0.into()),
        ("n_inner", 0.into()),
        ("n_positions", 0.into()),
        ("n_layer", 0.into()),
        ("layer_norm_epsilon", 1e-50.into()),
        ("activation_function", "silu".into()),
    ] {
        let message = with(field, value).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("config.json: {field}")),
            "{message}"
        );
    }
    let config = with("eos_token_id", serde_json::json!([7, 9])).unwrap();
    assert_eq!(config.pad_token_id, 7);
    // A bad one is named (it was "data did not match any variant of untagged enum TokenIds").
    for bad in [serde_json::json!(-1), serde_json::json!("0")] {
        let message = with("eos_token_id", bad).unwrap_err().to_string();
        assert!(
            message.contains("eos_token_id to be a token id"),
            "{message}"
        );
    }
    // GPT2Config's attribute_map: transformers reads "num_attention_heads" as n_head (a config
    // with both ran tiny-gpt2's 4 heads where transformers runs 8). Alone, an alias is read;
    // next to its field, refused.
    let mut config: serde_json::Value = serde_json::from_str(&gpt2).unwrap();
    let fields = config.as_object_mut().unwrap();
    for (field, alias) in [
        ("n_head", "num_attention_heads"),
        ("n_layer", "num_hidden_layers"),
        ("n_embd", "hidden_size"),
        ("n_positions", "max_position_embeddings"),
    ] {
        let value = fields.remove(field).unwrap();
        fields.insert(alias.to_string(), value);
    }
    let read = attn_models::ModelConfig::from_json(&config.to_string()).unwrap();
    let own = attn_models::ModelConfig::from_json(&gpt2).unwrap();
    assert_eq!(
        (
            read.n_heads,
            read.n_layers,
            read.hidden_size,
            read.max_positions
        ),
        (
            own.n_heads,
            own.n_layers,
            own.hidden_size,
            own.max_positions
        )
    );
    let message = with("num_attention_heads", 8.into())
        .unwrap_err()
        .to_string();
    assert!(
        message
            .contains("n_head: set twice, as n_head (4) and as its alias num_attention_heads (8)"),
        "{message}"
    );
    // Both with one value, as transformers loads it, is read.
    assert_eq!(with("num_attention_heads", 4.into()).unwrap().n_heads, 4);
}
