//! `attribute` end to end: its JSON against the reference contributions of
//! `tests/data/contributions` (`scripts/test_data/contributions.py`, PyTorch on transformers'
//! tensors), the rollout of ALTI's layers against a product taken here, each model's default
//! row, and bad input.

mod cli_support;

use std::path::PathBuf;

use cli_support::{fails_with, ok};
use serde_json::Value;

fn data(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(path)
}

/// The reference tensor `name` of `contributions/<file>.safetensors`, and the texts.
fn reference(file: &str, name: &str) -> (Vec<f64>, Vec<String>) {
    let bytes = std::fs::read(data(&format!("contributions/{file}.safetensors"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let values = (st.tensor(name).unwrap().data().chunks_exact(4))
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let texts = serde_json::from_str(&meta.metadata().as_ref().unwrap()["texts"]).unwrap();
    (values, texts)
}

fn flat(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(flat).collect(),
        other => vec![other.as_f64().unwrap()],
    }
}

fn close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (n, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "{what}[{n}]: {g} vs {w}");
    }
}

/// `C_L ··· C_1` of `[L, T, T]` matrices, in f64.
fn product(per_layer: &[f64], t: usize) -> Vec<f64> {
    let mut rolled = per_layer[..t * t].to_vec();
    for c in per_layer.chunks_exact(t * t).skip(1) {
        rolled = (0..t * t)
            .map(|at| {
                (0..t)
                    .map(|k| c[at / t * t + k] * rolled[k * t + at % t])
                    .sum()
            })
            .collect();
    }
    rolled
}

#[test]
fn alti_and_norm_give_the_references_contributions_and_their_rows() {
    // (reference file, model, the row a model reads by default: None for the mean of rows)
    for (file, model, row) in [
        ("bert-cls", Some(data("heads/bert-cls")), Some(0)),
        ("gpt2-cls", Some(data("heads/gpt2-cls")), Some(usize::MAX)),
        ("minilm", None, None),
    ] {
        let (_, texts) = reference(file, "alti0");
        for (n, text) in texts.iter().enumerate() {
            for method in ["alti", "norm"] {
                let mut args = vec!["attribute", text, "--method", method, "--json"];
                let dir = model.as_ref().map(|d| d.to_str().unwrap().to_string());
                if let Some(dir) = &dir {
                    args.extend(["--model", dir]);
                }
                let doc: Value = serde_json::from_str(&ok(&args)).unwrap();
                let t = doc["tokens"].as_array().unwrap().len();
                let (want, _) = reference(file, &format!("{method}{n}"));
                let per_layer = flat(&doc["per_layer"]);
                close(
                    &format!("{file} {method} per layer"),
                    &per_layer,
                    &want,
                    1e-4,
                );
                // ALTI's scores are a row of its layers rolled out, the norm's of its last layer.
                let matrix = match method {
                    "alti" => {
                        let matrix = flat(&doc["matrix"]);
                        close(
                            &format!("{file} rolled out"),
                            &matrix,
                            &product(&want, t),
                            1e-4,
                        );
                        matrix
                    }
                    _ => {
                        assert!(
                            doc["matrix"].is_null(),
                            "{file}: the norm is not rolled out"
                        );
                        want[want.len() - t * t..].to_vec()
                    }
                };
                let scores = flat(&doc["scores"]);
                let expected: Vec<f64> = match row {
                    Some(r) => {
                        let r = r.min(t - 1);
                        assert_eq!(doc["target"]["position"], r, "{file}");
                        matrix[r * t..][..t].to_vec()
                    }
                    None => {
                        assert_eq!(doc["target"]["rows"], "mean", "{file}");
                        (0..t)
                            .map(|j| (0..t).map(|i| matrix[i * t + j]).sum::<f64>() / t as f64)
                            .collect()
                    }
                };
                close(&format!("{file} {method} scores"), &scores, &expected, 1e-5);
            }
        }
    }
}

#[test]
fn rollout_flow_and_the_bars() {
    let text = "The cat sat on the mat";
    let doc: Value = serde_json::from_str(&ok(&[
        "attribute",
        text,
        "--method",
        "rollout",
        "--json",
        "--position",
        "2",
    ]))
    .unwrap();
    let t = doc["tokens"].as_array().unwrap().len();
    let matrix = flat(&doc["matrix"]);
    for row in matrix.chunks_exact(t) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    }
    close(
        "rollout row 2",
        &flat(&doc["scores"]),
        &matrix[2 * t..][..t],
        1e-6,
    );
    let doc: Value =
        serde_json::from_str(&ok(&["attribute", text, "--method", "flow", "--json"])).unwrap();
    assert_eq!(flat(&doc["scores"]).len(), t);
    // A word's rows: "cat" is token 2 alone.
    let json = |extra: &[&str]| -> Value {
        let mut args = vec!["attribute", text, "--method", "alti", "--json"];
        args.extend(extra);
        serde_json::from_str(&ok(&args)).unwrap()
    };
    let (by_word, by_position) = (json(&["--focus", "Cat"]), json(&["--position", "2"]));
    assert_eq!(by_word["target"]["positions"], serde_json::json!([2]));
    assert_eq!(by_word["scores"], by_position["scores"]);
    let bars = ok(&["attribute", text, "--method", "alti", "--position", "2"]);
    assert!(
        bars.starts_with(
            "ALTI, every layer rolled out: how much each word contributes to \"cat\" (token 2)"
        ),
        "{bars}"
    );
    assert!(bars.contains("  mat "), "{bars}");
    assert!(!bars.contains("[CLS]"), "{bars}");
    assert!(ok(&["attribute", text, "--method", "norm", "--special"]).contains("[CLS]"));
}

#[test]
fn bad_attribute_input_is_a_clear_error() {
    fails_with(
        &[
            "attribute",
            "The cat",
            "--method",
            "alti",
            "--position",
            "9",
        ],
        "--position 9: the text has 4 tokens",
    );
    fails_with(
        &["attribute", "The cat", "--method", "ig"],
        "invalid value 'ig'",
    );
    fails_with(
        &["attribute", "The cat", "--method", "alti", "--focus", "dog"],
        "--focus \"dog\": no such word in the text (its words: The, cat)",
    );
    fails_with(&["attribute", "   ", "--method", "norm"], "empty");
}
