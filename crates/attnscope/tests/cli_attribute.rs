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
        &["attribute", "The cat", "--method", "shapley"],
        "invalid value 'shapley'",
    );
    fails_with(
        &["attribute", "The cat", "--method", "alti", "--focus", "dog"],
        "--focus \"dog\": no such word in the text (its words: The, cat)",
    );
    fails_with(&["attribute", "   ", "--method", "norm"], "empty");
}

/// `(label, token, target_text)` of a gradient reference's metadata, and the reference's path.
fn gradient_reference(file: &str) -> (serde_json::Map<String, Value>, PathBuf) {
    let path = data(&format!("gradients/{file}.safetensors"));
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = (meta.metadata().as_ref().unwrap().iter())
        .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap()))
        .collect();
    (meta, path)
}

fn tensor(path: &PathBuf, name: &str) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    (st.tensor(name).unwrap().data().chunks_exact(4))
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

/// `max |got − want| ≤ tol · max(1, max |want|)`.
fn close_relative(what: &str, got: &[f64], want: &[f64], tol: f64) {
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    close(what, got, want, tol * scale);
}

#[test]
fn the_gradient_methods_give_the_references_scores() {
    for (file, model, extra) in [
        ("bert-cls", Some(data("heads/bert-cls")), vec![]),
        ("gpt2-cls", Some(data("heads/gpt2-cls")), vec![]),
        ("tiny-gpt2", Some(data("tiny-gpt2")), vec![]),
        (
            "minilm",
            None,
            vec!["--target-text", "A dog lay on the rug"],
        ),
    ] {
        let (meta, path) = gradient_reference(file);
        let text = meta["text"].as_str().unwrap();
        let dir = model.map(|d| d.to_str().unwrap().to_string());
        let run = |method: &str| -> Value {
            let mut args = vec!["attribute", text, "--method", method, "--json"];
            args.extend(&extra);
            if let Some(dir) = &dir {
                args.extend(["--model", dir.as_str()]);
            }
            serde_json::from_str(&ok(&args)).unwrap()
        };
        // Input × gradient: ‖e_j ⊙ ∂y/∂e_j‖₂ from the reference's own e and gradient.
        let doc = run("grad-input");
        let (e, g) = (
            tensor(&path, "embeddings"),
            tensor(&path, "d_embeddings1.0"),
        );
        let t = doc["tokens"].as_array().unwrap().len();
        let d = e.len() / t;
        let want: Vec<f64> = (0..t)
            .map(|j| {
                (0..d)
                    .map(|k| (e[j * d + k] * g[j * d + k]).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        close_relative(
            &format!("{file} grad-input"),
            &flat(&doc["scores"]),
            &want,
            1e-4,
        );
        match meta.get("label") {
            Some(label) => {
                let labels = ["negative", "neutral", "positive"];
                assert_eq!(
                    doc["target"]["label"],
                    labels[label.as_u64().unwrap() as usize]
                );
            }
            None if meta.contains_key("token") => assert_eq!(doc["target"]["id"], meta["token"]),
            None => assert_eq!(doc["target"]["target_text"], "A dog lay on the rug"),
        }
        // Integrated gradients at the default 50 steps, and its completeness.
        let doc = run("ig");
        let want = tensor(&path, "ig50");
        close_relative(&format!("{file} ig"), &flat(&doc["scores"]), &want, 1e-3);
        let gap = doc["completeness_gap"].as_f64().unwrap();
        let change: f64 = want.iter().sum::<f64>().abs();
        assert!(
            gap <= 0.01 * change.max(1e-6),
            "{file}: gap {gap} of {change}"
        );
        // Attention × gradient: the row of its rolled-out matrix, which holds I + ….
        let doc = run("attn-grad");
        let matrix = flat(&doc["matrix"]);
        for i in 0..t {
            assert!(
                matrix[i * t + i] >= 1.0,
                "{file}: R[{i}][{i}] = {}",
                matrix[i * t + i]
            );
        }
        let scores = flat(&doc["scores"]);
        let rows: Vec<usize> = match doc["target"]["position"].as_u64() {
            Some(p) => vec![p as usize],
            None => (0..t).collect(),
        };
        let want: Vec<f64> = (0..t)
            .map(|j| rows.iter().map(|&i| matrix[i * t + j]).sum::<f64>() / rows.len() as f64)
            .collect();
        close(&format!("{file} attn-grad row"), &scores, &want, 1e-5);
    }
}

#[test]
fn gradient_targets_that_do_not_apply_are_clear_errors() {
    let (cls, qa, gpt2) = (
        data("heads/bert-cls"),
        data("heads/bert-qa"),
        data("tiny-gpt2"),
    );
    let (cls, qa, gpt2) = (
        cls.to_str().unwrap(),
        qa.to_str().unwrap(),
        gpt2.to_str().unwrap(),
    );
    let text = "The cat sat on the mat";
    for (args, needle) in [
        (
            vec!["--method", "ig", "--label", "positive"],
            "--label is for a classifier",
        ),
        (vec!["--method", "ig"], "give --target-text T"),
        (
            vec!["--method", "ig", "--model", cls, "--label", "happy"],
            "has the labels negative, neutral, positive",
        ),
        (
            vec!["--method", "ig", "--model", cls, "--token", "the"],
            "--token is for a causal language model",
        ),
        (
            vec!["--method", "ig", "--model", gpt2, "--target-text", "x"],
            "--target-text is for an embedding model",
        ),
        (
            vec![
                "--method",
                "ig",
                "--model",
                gpt2,
                "--token",
                "extraordinarily",
            ],
            "tokenizes to",
        ),
        (
            vec!["--method", "grad-input", "--model", qa],
            "has a question-answering head",
        ),
        (
            vec!["--method", "ig", "--model", cls, "--steps", "0"],
            "--steps",
        ),
    ] {
        let mut all = vec!["attribute", text];
        all.extend(&args);
        fails_with(&all, needle);
    }
}

/// `explain --method M` gives `attribute --method M`'s bars and JSON; "the#2" is the second "the".
#[test]
fn explain_method_is_attribute() {
    let text = "The cat and the dog";
    for method in ["alti", "grad-input"] {
        let mut a = vec!["attribute", text, "--method", method, "--focus", "the#2"];
        let mut e = vec!["explain", text, "--method", method, "--focus", "the#2"];
        if method == "grad-input" {
            a.extend(["--target-text", "A bird"]);
            e.extend(["--target-text", "A bird"]);
        }
        assert_eq!(ok(&a), ok(&e), "{method}");
    }
    let doc: Value = serde_json::from_str(&ok(&[
        "explain", text, "--method", "alti", "--focus", "the#2", "--json",
    ]))
    .unwrap();
    assert_eq!(doc["target"]["positions"], serde_json::json!([4]));
    fails_with(
        &["explain", text, "--method", "alti", "--layer", "1"],
        "cannot be used",
    );
    fails_with(&["explain", text, "--label", "x"], "--method");
}

/// `heatmap --method M` draws each matrix method's matrix; the per-token methods are refused.
#[test]
fn heatmap_method_draws_the_matrix_methods() {
    let dir = tempfile::tempdir().unwrap();
    let cls = data("heads/bert-cls");
    let cls = cls.to_str().unwrap();
    for method in ["norm", "alti", "rollout", "flow", "attn-grad"] {
        let out = dir.path().join(format!("{method}.svg"));
        let out = out.to_str().unwrap();
        ok(&[
            "heatmap",
            "The movie was good",
            "--method",
            method,
            "--model",
            cls,
            "-o",
            out,
        ]);
        let svg = std::fs::read_to_string(out).unwrap();
        assert!(
            svg.contains("movie") && svg.contains("bert-cls"),
            "{method}"
        );
    }
    let png = dir.path().join("ig.png");
    fails_with(
        &[
            "heatmap",
            "The cat",
            "--method",
            "ig",
            "-o",
            png.to_str().unwrap(),
        ],
        "one score per token, not a matrix",
    );
    assert!(!png.exists());
}

#[test]
fn bench_attribute_times_the_references_integrated_gradients() {
    // `bench attribute` runs what `attribute --method ig` runs: its scores are the reference's.
    let (meta, path) = gradient_reference("bert-cls");
    let text = meta["text"].as_str().unwrap();
    let model = data("heads/bert-cls");
    let model = model.to_str().unwrap();
    let out = ok(&[
        "bench",
        "attribute",
        "--method",
        "ig",
        "--text",
        text,
        "--model",
        model,
        "--reps",
        "2",
        "--threads",
        "1",
        "--json",
    ]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["engine"], "attnscope");
    assert_eq!(doc["method"], "ig");
    assert_eq!(doc["steps"], 50);
    assert_eq!(doc["threads"], 1);
    let ms = doc["ms"].as_f64().unwrap();
    assert!(ms.is_finite() && ms > 0.0, "{doc}");
    let want = tensor(&path, "ig50");
    assert_eq!(doc["tokens"].as_u64(), Some(want.len() as u64));
    close_relative("bench ig", &flat(&doc["scores"]), &want, 1e-3);
    // The methods without a target time a pass and print no scores.
    let doc: Value = serde_json::from_str(&ok(&[
        "bench",
        "attribute",
        "--method",
        "contributions",
        "--model",
        model,
        "--reps",
        "1",
        "--json",
    ]))
    .unwrap();
    assert!(doc.get("scores").is_none(), "{doc}");
    for (args, says) in [
        (
            vec!["--method", "ig", "--reps", "0"],
            "--reps must be between 1",
        ),
        (vec!["--method", "ig", "--steps", "0"], "--steps"),
        (
            vec!["--method", "ig", "--token", "the"],
            "--token is for a causal language model",
        ),
        (vec!["--method", "saliency"], "invalid value 'saliency'"),
    ] {
        let mut all = vec!["bench", "attribute", "--model", model];
        all.extend(args);
        fails_with(&all, says);
    }
}
