//! The encoder-decoder models on the random BART checkpoint of `tests/data/s2s/bart`
//! (scripts/test_data/seq2seq.py): token ids, teacher forcing, logits and the three kinds of
//! attention against transformers, greedy generation against its `generate()`, and bad configs
//! as errors.

#[allow(dead_code)]
mod common;

use std::path::PathBuf;

use attn_models::{ModelError, Seq2Seq, is_seq2seq};
use common::{Golden, golden_dir};

fn dir() -> PathBuf {
    golden_dir().join("s2s").join("bart")
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
    assert!(is_seq2seq(&dir()));
    let model = Seq2Seq::load(&dir()).unwrap();
    let g = Golden::read(&dir().join("expected.safetensors"));
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
            assert_close(&format!("pair {n}: {what}"), got, want, 1e-4);
        }
    }
}

#[test]
fn greedy_translation_matches_transformers() {
    let model = Seq2Seq::load(&dir()).unwrap();
    let g = Golden::read(&dir().join("expected.safetensors"));
    let source = g.meta["pairs"][0][0].as_str().unwrap();
    let want = g.ids("generated");
    let n = g.meta["new_tokens"].as_u64().unwrap() as usize;
    let got = model
        .greedy(&model.encode_source(source).unwrap(), n)
        .unwrap();
    assert_eq!(got, want);
    // The forced first and last tokens (<s>, </s>) are there, and decode drops them.
    assert_eq!((got[0], got[n - 1]), (0, 2));
    assert!(!model.decode_text(&got).unwrap().contains("</s>"));
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
            "t5".into(),
            "unsupported model_type \"t5\"; supported: bart",
        ),
        ("decoder_layers", 3.into(), "model.decoder.layers.2"),
    ];
    for (field, value, says) in cases {
        let mut edited = config.clone();
        edited[field] = value;
        std::fs::write(tmp.path().join("config.json"), edited.to_string()).unwrap();
        let err = Seq2Seq::load(tmp.path()).err().unwrap();
        assert!(err.to_string().contains(says), "{field}: {err}");
    }
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
