//! The encoder-decoder models on the random BART, mBART, Marian and T5 checkpoints of
//! `tests/data/s2s` (scripts/test_data/seq2seq.py): token ids, teacher forcing, logits and the three kinds of
//! attention against transformers, greedy generation against its `generate()`, and bad configs
//! as errors.

#[allow(dead_code)]
mod common;

use std::path::PathBuf;

use attn_models::{ModelError, Seq2Seq, is_seq2seq};
use common::{Golden, golden_dir};

const MODELS: [&str; 5] = ["bart", "mbart", "marian", "t5", "t5-relu"];

fn dir_of(name: &str) -> PathBuf {
    golden_dir().join("s2s").join(name)
}

fn dir() -> PathBuf {
    dir_of("bart")
}

/// `got` against `want` within `tol`, relative where |want| > 1.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: value count");
    let (worst, at) = (got.iter().zip(want).enumerate())
        .map(|(i, (&g, &w))| ((f64::from(g) - w).abs() / w.abs().max(1.0), i))
        .fold(
            (0.0f64, 0),
            |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a },
        );
    assert!(worst <= tol, "{what}: error {worst:.3e} at {at}");
}

#[test]
fn teacher_forced_attentions_and_logits_match_transformers() {
    for name in MODELS {
        teacher_forced_matches(name);
    }
}

fn teacher_forced_matches(name: &str) {
    let dir = dir_of(name);
    assert!(is_seq2seq(&dir));
    let model = Seq2Seq::load(&dir).unwrap();
    let g = Golden::read(&dir.join("expected.safetensors"));
    let pairs = g.meta["pairs"].as_array().unwrap();
    for (n, pair) in pairs.iter().enumerate() {
        let (source, target) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
        let src = model.encode_source(source).unwrap();
        assert_eq!(
            src,
            g.ids(&format!("source_ids{n}")),
            "pair {n}: source ids"
        );
        let (decoder, labels) = model.teacher_forcing(target).unwrap();
        assert_eq!(
            decoder,
            g.ids(&format!("decoder_ids{n}")),
            "pair {n}: decoder ids"
        );
        assert_eq!(labels, g.ids(&format!("labels{n}")), "pair {n}: labels");
        let out = model.forward(&src, &decoder).unwrap();
        for (what, got) in [
            ("logits", &out.logits),
            ("encoder_attentions", &out.encoder_attentions),
            ("decoder_attentions", &out.decoder_attentions),
            ("cross_attentions", &out.cross_attentions),
        ] {
            let want = &g.tensor(&format!("{what}{n}")).1;
            assert_close(&format!("{name} pair {n}: {what}"), got, want, 1e-4);
        }
    }
}

#[test]
fn greedy_translation_matches_transformers() {
    for name in MODELS {
        let model = Seq2Seq::load(&dir_of(name)).unwrap();
        let g = Golden::read(&dir_of(name).join("expected.safetensors"));
        let source = g.meta["pairs"][0][0].as_str().unwrap();
        let want = g.ids("generated");
        let n = g.meta["new_tokens"].as_u64().unwrap() as usize;
        let got = model
            .greedy(&model.encode_source(source).unwrap(), n)
            .unwrap();
        assert_eq!(got, want, "{name}");
        assert!(!model.decode_text(&got).unwrap().contains("</s>"), "{name}");
    }
    // BART's forced first and last tokens (<s>, </s>) are there.
    let want = Golden::read(&dir().join("expected.safetensors")).ids("generated");
    assert_eq!((want[0], want[want.len() - 1]), (0, 2));
}

/// Beam search, 4 beams, with the checkpoint's settings and with length_penalty 2 and
/// early_stopping true, gives transformers' `generate()` ids.
#[test]
fn beam_search_matches_transformers() {
    for name in MODELS {
        let mut model = Seq2Seq::load(&dir_of(name)).unwrap();
        let g = Golden::read(&dir_of(name).join("expected.safetensors"));
        let source = model
            .encode_source(g.meta["pairs"][0][0].as_str().unwrap())
            .unwrap();
        let n = g.meta["new_tokens"].as_u64().unwrap() as usize;
        let got = model.beam_search(&source, n, 4).unwrap();
        assert_eq!(got, g.ids("beam4"), "{name}");
        assert_eq!(
            model.beam_search(&source, n, 1).unwrap(),
            g.ids("generated"),
            "{name}"
        );
        let mut settings = model.config().generation.clone();
        settings.length_penalty = Some(2.0);
        settings.early_stopping = Some(serde_json::Value::Bool(true));
        model.set_generation(settings);
        let got = model.beam_search(&source, n, 4).unwrap();
        assert_eq!(
            got,
            g.ids("beam4_penalty"),
            "{name}: length_penalty 2, early stopping"
        );
    }
    // mBART's beams find what greedy decoding does not.
    let g = Golden::read(&dir_of("mbart").join("expected.safetensors"));
    assert_ne!(g.ids("beam4"), g.ids("generated"));
}

/// The decoder fed one token at a time (its keys and values cached, the encoder's projected
/// once) gives the teacher-forced pass's logits at every row.
#[test]
fn cached_decoding_matches_the_teacher_forced_pass() {
    for name in MODELS {
        let model = Seq2Seq::load(&dir_of(name)).unwrap();
        let g = Golden::read(&dir_of(name).join("expected.safetensors"));
        let (source, target) = (g.ids("source_ids0"), g.ids("decoder_ids0"));
        let full = model.forward(&source, &target).unwrap().logits;
        let (encoded, _) = model.encode(&source).unwrap();
        let mut cache = model.decoder_cache(&encoded);
        let stepped: Vec<f32> = (target.iter())
            .flat_map(|&id| cache.feed(id).unwrap())
            .collect();
        let full: Vec<f64> = full.iter().map(|&x| f64::from(x)).collect();
        assert_close(&format!("{name}: cached"), &stepped, &full, 1e-4);
        let err = cache.feed(u32::MAX).unwrap_err();
        assert!(matches!(err, ModelError::TokenOutOfVocab { .. }), "{err}");
    }
}

/// MarianTokenizer's ids (the sentencepiece library's pieces through vocab.json), and T5's
/// tokenizer.json's, on texts with accents, punctuation, NFKC-folded characters, runs of
/// spaces, pieces the model lacks and a language code.
#[test]
fn sentencepiece_ids_match_transformers() {
    for name in ["marian", "t5"] {
        sentencepiece_ids_match(name);
    }
}

fn sentencepiece_ids_match(name: &str) {
    let model = Seq2Seq::load(&dir_of(name)).unwrap();
    let g = Golden::read(&dir_of(name).join("expected.safetensors"));
    let texts = g.meta["texts"].as_array().unwrap();
    for (n, text) in texts.iter().enumerate() {
        let text = text.as_str().unwrap();
        let enc = model.source_encoding(text, false).unwrap();
        assert_eq!(enc.ids, g.ids(&format!("tokens{n}")), "{name}: {text:?}");
        // Each piece's span is a piece of the text, and only </s> has none.
        for (span, token) in enc.spans.iter().zip(&enc.tokens) {
            match span {
                Some((a, b)) => assert!(text.get(*a..*b).is_some(), "{text:?}: {token}"),
                None => assert_eq!(token, "</s>"),
            }
        }
    }
}

/// `dir` (a model's files) with each `(field, value, says)` case's field of `config` set to
/// its value is refused by `Seq2Seq::load` with an error that says `says`.
fn refuses_edited_configs(
    dir: &std::path::Path,
    config: &serde_json::Value,
    cases: impl IntoIterator<Item = (&'static str, serde_json::Value, &'static str)>,
) {
    for (field, value, says) in cases {
        let mut edited = config.clone();
        edited[field] = value;
        std::fs::write(dir.join("config.json"), edited.to_string()).unwrap();
        let err = Seq2Seq::load(dir).err().unwrap();
        assert!(err.to_string().contains(says), "{field}: {err}");
    }
}

#[test]
fn bad_seq2seq_configs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(dir().join(f), tmp.path().join(f)).unwrap();
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("config.json")).unwrap()).unwrap();
    let cases: [(&str, serde_json::Value, &str); 3] = [
        (
            "decoder_attention_heads",
            5.into(),
            "5 heads do not divide d_model 32",
        ),
        (
            "model_type",
            "pegasus".into(),
            "unsupported model_type \"pegasus\"; supported: bart, mbart, marian, t5",
        ),
        ("decoder_layers", 3.into(), "model.decoder.layers.2"),
    ];
    refuses_edited_configs(tmp.path(), &config, cases);
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let model = Seq2Seq::load(tmp.path()).unwrap();
    let err = model.forward(&[], &[2]).unwrap_err();
    assert!(matches!(err, ModelError::EmptyText { .. }), "{err}");
    let err = model.forward(&[0, 9999], &[2]).unwrap_err();
    assert!(
        matches!(err, ModelError::TokenOutOfVocab { id: 9999, .. }),
        "{err}"
    );
}

/// T5 from two BF16 shards and their `model.safetensors.index.json` (how the larger T5
/// checkpoints are stored) runs exactly as one F32 file of the same, rounded, values.
#[test]
fn sharded_bf16_weights_load_as_one_f32_file_does() {
    use safetensors::{Dtype, tensor::TensorView};
    let tmp = tempfile::tempdir().unwrap();
    let (sharded, single) = (tmp.path().join("sharded"), tmp.path().join("single"));
    for out in [&sharded, &single] {
        std::fs::create_dir(out).unwrap();
        for f in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ] {
            std::fs::copy(dir_of("t5").join(f), out.join(f)).unwrap();
        }
    }
    let bytes = std::fs::read(dir_of("t5").join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    // Each tensor as bf16 bits, and as the f32 values they stand for.
    type Rounded = (String, Vec<usize>, Vec<u8>, Vec<u8>);
    let tensors: Vec<Rounded> = (names.iter())
        .map(|name| {
            let t = st.tensor(name).unwrap();
            assert_eq!(t.dtype(), Dtype::F32, "{name}");
            let values = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()));
            let halves: Vec<half::bf16> = values.map(half::bf16::from_f32).collect();
            let bf16: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
            let f32s: Vec<u8> = halves
                .iter()
                .flat_map(|h| h.to_f32().to_le_bytes())
                .collect();
            ((*name).to_string(), t.shape().to_vec(), bf16, f32s)
        })
        .collect();
    fn view<'a>(
        name: &str,
        shape: &[usize],
        data: &'a [u8],
        dtype: Dtype,
    ) -> (String, TensorView<'a>) {
        (
            name.to_string(),
            TensorView::new(dtype, shape.to_vec(), data).unwrap(),
        )
    }
    let all = tensors.iter().map(|(n, s, _, f)| view(n, s, f, Dtype::F32));
    std::fs::write(
        single.join("model.safetensors"),
        safetensors::serialize(all.collect::<Vec<_>>(), None).unwrap(),
    )
    .unwrap();
    let half = tensors.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (n, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", n + 1);
        let views = part
            .iter()
            .map(|(name, s, b, _)| view(name, s, b, Dtype::BF16));
        let shard = safetensors::serialize(views.collect::<Vec<_>>(), None).unwrap();
        std::fs::write(sharded.join(&file), shard).unwrap();
        for (name, ..) in part {
            weight_map.insert(name.clone(), file.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        sharded.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let (a, b) = (
        Seq2Seq::load(&sharded).unwrap(),
        Seq2Seq::load(&single).unwrap(),
    );
    let g = Golden::read(&dir_of("t5").join("expected.safetensors"));
    let (source, decoder) = (g.ids("source_ids0"), g.ids("decoder_ids0"));
    assert_eq!(
        a.forward(&source, &decoder).unwrap(),
        b.forward(&source, &decoder).unwrap()
    );
    // The rounding moved the weights: the rounded model is not the original.
    let original = Seq2Seq::load(&dir_of("t5")).unwrap();
    assert_ne!(
        original.forward(&source, &decoder).unwrap().logits,
        b.forward(&source, &decoder).unwrap().logits
    );
}

#[test]
fn bad_t5_configs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let t5 = dir_of("t5");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(t5.join(f), tmp.path().join(f)).unwrap();
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(t5.join("config.json")).unwrap()).unwrap();
    let cases: [(&str, serde_json::Value, &str); 5] = [
        (
            "feed_forward_proj",
            "fancy-gelu".into(),
            "feed_forward_proj: \"fancy-gelu\": expected ACT or gated-ACT",
        ),
        (
            "feed_forward_proj",
            "gated-tanh".into(),
            "\"tanh\" is not supported",
        ),
        (
            "relative_attention_num_buckets",
            2.into(),
            "relative_attention_num_buckets: 2: T5's buckets need at least 4",
        ),
        (
            "relative_attention_max_distance",
            4.into(),
            "relative_attention_max_distance: 4 must pass the exact buckets' distances",
        ),
        (
            "d_kv",
            16.into(),
            "encoder.block.0.layer.0.SelfAttention.q.weight",
        ),
    ];
    refuses_edited_configs(tmp.path(), &config, cases);
}

/// T5's relative position buckets against transformers' `_relative_position_bucket` on every
/// distance from -300 to 300, for the real models' 32 buckets up to 128 and the test
/// checkpoint's 8 up to 16, each direction.
#[test]
fn t5_buckets_match_transformers() {
    let g = Golden::read(&dir_of("t5").join("expected.safetensors"));
    for (name, buckets, max_distance) in [("buckets_32_128", 32, 128), ("buckets_8_16", 8, 16)] {
        for bidirectional in [true, false] {
            let key = format!(
                "{name}_{}",
                if bidirectional { "encoder" } else { "decoder" }
            );
            let want = g.ids(&key);
            let got: Vec<u32> = (-300..=300)
                .map(|r| {
                    attn_models::relative_position_bucket(r, bidirectional, buckets, max_distance)
                        as u32
                })
                .collect();
            assert_eq!(got, want, "{key}");
        }
    }
}

/// A source and a target past the 64 positions: refused, naming the side and its length; with
/// `truncate`, the ids transformers' tokenizers give with `truncation=True`
/// (tests/data/s2s/truncation.json).
#[test]
fn truncation_matches_transformers() {
    let path = golden_dir().join("s2s").join("truncation.json");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        (v.as_array().unwrap().iter())
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let (source, target) = (
        want["source"].as_str().unwrap(),
        want["target"].as_str().unwrap(),
    );
    for name in ["bart", "marian"] {
        let model = Seq2Seq::load(&dir_of(name)).unwrap();
        let w = &want[name];
        let enc = model.source_encoding(source, true).unwrap();
        assert_eq!(enc.ids, ids(&w["source_ids"]), "{name}: source");
        assert_eq!(enc.tokens.len(), 64, "{name}: every part cut");
        assert_eq!(enc.special.last(), Some(&true), "{name}: </s> kept");
        let labels = model.target_encoding(target, true).unwrap().ids;
        assert_eq!(labels, ids(&w["labels"]), "{name}: target");
        for (side, err, len) in [
            (
                "source",
                model.source_encoding(source, false),
                &w["source_len"],
            ),
            (
                "target",
                model.target_encoding(target, false),
                &w["target_len"],
            ),
        ] {
            let err = err.unwrap_err().to_string();
            let says =
                format!("the {side} is {len} tokens long, more than the model's 64 positions");
            assert_eq!(err, says, "{name}");
        }
    }
}

/// A vocabulary with ids past the embedding's rows (a tokenizer of another model) is refused
/// at load, naming the file, for Marian's vocab.json and BART's tokenizer.json.
#[test]
fn a_vocabulary_past_the_embedding_is_refused() {
    for (name, file) in [("marian", "vocab.json"), ("bart", "tokenizer.json")] {
        let tmp = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(dir_of(name)).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, tmp.path().join(path.file_name().unwrap())).unwrap();
        }
        let path = tmp.path().join(file);
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let vocab = match name {
            "marian" => &mut json,
            _ => &mut json["model"]["vocab"],
        };
        vocab["zzz"] = 5000.into();
        std::fs::write(&path, json.to_string()).unwrap();
        let Err(err) = Seq2Seq::load(tmp.path()) else {
            panic!("{name}: a vocabulary past the embedding loaded");
        };
        let err = err.to_string();
        assert!(
            err.starts_with(&format!(
                "{file} has ids up to 5000, but the model's embedding has"
            )),
            "{name}: {err}"
        );
    }
}
