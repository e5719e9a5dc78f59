//! `classify`, `answer` and `predict` end to end on the random task-head checkpoints of
//! `tests/data/heads`, against what transformers gave for them (`expected.safetensors`), and
//! each bad input as a clear error with exit code 1.

mod cli_support;

use std::path::PathBuf;

use cli_support::{fails_with, ok, tiny_gpt2};
use serde_json::{Value, json};

fn heads(name: &str) -> String {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/heads"
    ))
    .join(name)
    .to_string_lossy()
    .into_owned()
}

/// The metadata `key` of a checkpoint's expected outputs.
fn expected(name: &str, key: &str) -> Value {
    let bytes = std::fs::read(PathBuf::from(heads(name)).join("expected.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    serde_json::from_str(&meta.metadata().as_ref().unwrap()[key]).unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).unwrap()
}

#[test]
fn classify_prints_every_label_highest_first() {
    for name in ["bert-cls", "roberta-cls", "distilbert-cls", "gpt2-cls"] {
        let model = heads(name);
        let inputs = expected(name, "inputs");
        let first = &inputs[0];
        let text = first["text"].as_str().unwrap();
        let doc = json(&["classify", text, "--model", &model, "--json"]);
        let labels: Vec<&str> = (doc["labels"].as_array().unwrap().iter())
            .map(|l| l["label"].as_str().unwrap())
            .collect();
        let want: Vec<&str> = (first["labels"].as_array().unwrap().iter())
            .map(|l| l.as_str().unwrap())
            .collect();
        assert_eq!(labels, want, "{name}");
        for (got, want) in doc["labels"]
            .as_array()
            .unwrap()
            .iter()
            .zip(first["scores"].as_array().unwrap())
        {
            let (g, w) = (got["score"].as_f64().unwrap(), want.as_f64().unwrap());
            assert!((g - w).abs() < 1e-5, "{name}: {g} vs {w}");
        }
        assert_eq!(doc["logits"].as_array().unwrap().len(), 3);
        // The same text among others in a file, one JSON object per line.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("texts.txt");
        std::fs::write(&file, format!("I love machine learning\n\n{text}\nHello\n")).unwrap();
        let out = ok(&[
            "classify",
            "--file",
            file.to_str().unwrap(),
            "--model",
            &model,
            "--json",
        ]);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{name}: the blank line is skipped");
        assert_eq!(lines[1]["text"], text);
        let (batched, alone) = (
            lines[1]["labels"].as_array().unwrap(),
            doc["labels"].as_array().unwrap(),
        );
        for (b, a) in batched.iter().zip(alone) {
            assert_eq!(b["label"], a["label"], "{name}: batched as alone");
            let (b, a) = (b["score"].as_f64().unwrap(), a["score"].as_f64().unwrap());
            assert!((b - a).abs() < 1e-5, "{name}: batched {b}, alone {a}");
        }
    }
    let bars = ok(&[
        "classify",
        "The movie was good",
        "--model",
        &heads("bert-cls"),
        "--explain",
        "--color",
        "never",
    ]);
    assert!(
        bars.contains("what [CLS] (token 0), which the classifier reads, attends to"),
        "{bars}"
    );
    assert!(bars.contains("movie"), "{bars}");
}

#[test]
fn answer_gives_the_pipelines_answer() {
    for name in ["bert-qa", "distilbert-qa", "roberta-qa"] {
        for input in expected(name, "inputs").as_array().unwrap() {
            let (q, c) = (
                input["question"].as_str().unwrap(),
                input["context"].as_str().unwrap(),
            );
            let doc = json(&[
                "answer",
                "--question",
                q,
                "--context",
                c,
                "--model",
                &heads(name),
                "--json",
            ]);
            let want = &input["answer"];
            assert_eq!(doc["answer"], want["answer"], "{name}: {q}");
            assert_eq!(
                (doc["start"].as_u64(), doc["end"].as_u64()),
                (want["start"].as_u64(), want["end"].as_u64())
            );
            let (g, w) = (
                doc["score"].as_f64().unwrap(),
                want["score"].as_f64().unwrap(),
            );
            assert!((g - w).abs() < 1e-4, "{name}: score {g} vs {w}");
            let answer = want["answer"].as_str().unwrap();
            let (s, e) = (
                want["start"].as_u64().unwrap() as usize,
                want["end"].as_u64().unwrap() as usize,
            );
            let cut: String = c.chars().skip(s).take(e - s).collect();
            assert_eq!(cut, answer, "character offsets into the context");
        }
    }
    let bars = ok(&[
        "answer",
        "--question",
        "Who invented the transformer?",
        "--context",
        "The transformer was invented by Vaswani et al. in 2017.",
        "--model",
        &heads("bert-qa"),
        "--explain",
        "--color",
        "never",
    ]);
    assert!(
        bars.contains("which context words the answer's tokens attend to"),
        "{bars}"
    );
    assert!(!bars.contains("  invented?"), "{bars}");
    // Questions from a file of JSON lines, their windows run together: each line's answer is
    // the pipeline's, the long context's (several windows) among them.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("q.jsonl");
    for name in ["bert-qa", "roberta-qa"] {
        let inputs = expected(name, "inputs");
        let inputs = inputs.as_array().unwrap();
        let lines: Vec<String> = (0..3)
            .flat_map(|_| inputs.iter())
            .map(|i| json!({"question": i["question"], "context": i["context"]}).to_string())
            .collect();
        std::fs::write(&file, lines.join("\n\n")).unwrap();
        let out = ok(&[
            "answer",
            "--file",
            file.to_str().unwrap(),
            "--model",
            &heads(name),
            "--json",
        ]);
        let docs: Vec<Value> = (out.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(docs.len(), lines.len(), "{out}");
        for (n, doc) in docs.iter().enumerate() {
            let input = &inputs[n % inputs.len()];
            let want = &input["answer"];
            assert_eq!(doc["question"], input["question"]);
            assert_eq!(
                (&doc["answer"], &doc["start"], &doc["end"]),
                (&want["answer"], &want["start"], &want["end"]),
                "{name} line {n}"
            );
            let (g, w) = (
                doc["score"].as_f64().unwrap(),
                want["score"].as_f64().unwrap(),
            );
            assert!((g - w).abs() < 1e-4, "{name} line {n}: score {g} vs {w}");
        }
    }
    // A bad line is named by its number, whether JSON or the question is at fault.
    for (lines, at) in [
        ("{\"question\": \"Who?\"}\n", "line 1: not a JSON object"),
        (
            "{\"question\": \"Who?\", \"context\": \"Vaswani.\"}\n\n{\"question\": \" \", \"context\": \"Vaswani.\"}\n",
            "line 3: the question is empty",
        ),
    ] {
        std::fs::write(&file, lines).unwrap();
        fails_with(
            &[
                "answer",
                "--file",
                file.to_str().unwrap(),
                "--model",
                &heads("bert-qa"),
            ],
            at,
        );
    }
}

#[test]
fn predict_gives_the_softmaxs_most_likely_tokens() {
    let doc = json(&[
        "predict",
        "The cat sat on the",
        "--model",
        tiny_gpt2().to_str().unwrap(),
        "--top",
        "10",
        "--json",
    ]);
    let top = doc["predictions"][0].as_array().unwrap();
    assert_eq!(top.len(), 10);
    let probs: Vec<f64> = top
        .iter()
        .map(|p| p["probability"].as_f64().unwrap())
        .collect();
    assert!(probs.windows(2).all(|w| w[0] >= w[1]), "{probs:?}");
    let doc = json(&[
        "predict",
        "The [MASK] that ate the mouse [MASK] away",
        "--model",
        &heads("bert-mlm"),
        "--json",
    ]);
    assert_eq!(
        doc["predictions"].as_array().unwrap().len(),
        2,
        "one list per mask"
    );
    let bars = ok(&[
        "predict",
        "The cat [MASK] on the mat",
        "--model",
        &heads("bert-mlm"),
        "--explain",
        "--color",
        "never",
    ]);
    assert!(bars.contains("what [MASK] (token 3) attends to"), "{bars}");
}

#[test]
fn bad_task_inputs_are_clear_errors() {
    let (cls, qa, mlm) = (heads("bert-cls"), heads("bert-qa"), heads("bert-mlm"));
    fails_with(
        &["classify", "Hello", "--model", &mlm],
        "has no sequence-classification head",
    );
    fails_with(&["classify", "Hello", "--model", &mlm], "BertForMaskedLM");
    fails_with(
        &[
            "answer",
            "--question",
            "Who?",
            "--context",
            "Me.",
            "--model",
            &cls,
        ],
        "has no question-answering head",
    );
    fails_with(
        &["predict", "Hello [MASK]", "--model", &cls],
        "has no masked-language-model head",
    );
    fails_with(
        &["predict", "The cat sat", "--model", &mlm],
        "the text has no [MASK] token",
    );
    // A flag's value out of range is bad input: exit code 1, named by clap.
    let zero =
        cli_support::attnscope(&["predict", "The [MASK] sat", "--model", &mlm, "--top", "0"]);
    assert_eq!(zero.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&zero.stderr).contains("'--top <K>'"));
    fails_with(
        &[
            "answer",
            "--question",
            " ",
            "--context",
            "Paris.",
            "--model",
            &qa,
        ],
        "question is empty",
    );
    fails_with(
        &[
            "answer",
            "--question",
            "Where?",
            "--context",
            "",
            "--model",
            &qa,
        ],
        "context is empty",
    );
    let long = "where is it ".repeat(20);
    let context = "Paris is in France. ".repeat(20);
    fails_with(
        &[
            "answer",
            "--question",
            &long,
            "--context",
            &context,
            "--model",
            &qa,
        ],
        "the question takes",
    );
    fails_with(&["classify", "", "--model", &cls], "empty");
}

/// Tensor `name` of a checkpoint's expected outputs (F32).
fn expected_tensor(name: &str, tensor: &str) -> Vec<f32> {
    let bytes = std::fs::read(PathBuf::from(heads(name)).join("expected.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor(tensor).unwrap();
    assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name} {tensor}");
    (view.data().chunks_exact(4))
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// The views read the encoder under any head: `attention` gives transformers' attentions of
/// the task models, and `explain`, `heatmap`, `heads` and `html` run on each kind of head.
#[test]
fn the_views_run_on_the_encoder_under_each_head() {
    for name in ["bert-cls", "distilbert-cls", "roberta-mlm", "gpt2-cls"] {
        let model = heads(name);
        for (n, input) in expected(name, "inputs")
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let mut args = vec!["attention", input["text"].as_str().unwrap()];
            if let Some(pair) = input["pair"].as_str() {
                args.extend(["--pair", pair]);
            }
            args.extend(["--model", &model, "--json"]);
            let doc = json(&args);
            let got: Vec<f64> = (doc["attentions"].as_array().unwrap().iter())
                .flat_map(|l| l.as_array().unwrap())
                .flat_map(|h| h.as_array().unwrap())
                .flat_map(|r| r.as_array().unwrap())
                .map(|w| w.as_f64().unwrap())
                .collect();
            let want = expected_tensor(name, &format!("attentions{n}"));
            assert_eq!(got.len(), want.len(), "{name} input {n}");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - f64::from(*w)).abs() < 1e-4,
                    "{name} input {n}: {g} vs {w}"
                );
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let text = "The movie was good but the ending was terrible";
    for name in ["bert-cls", "distilbert-qa", "roberta-mlm", "gpt2-cls"] {
        let model = heads(name);
        let bars = ok(&["explain", text, "--focus", "movie", "--model", &model]);
        assert!(bars.contains("terrible"), "{name}: {bars}");
        let png = dir.path().join(format!("{name}.png"));
        ok(&[
            "heatmap",
            text,
            "--model",
            &model,
            "-o",
            png.to_str().unwrap(),
        ]);
        assert!(
            std::fs::read(&png).unwrap().starts_with(b"\x89PNG"),
            "{name}"
        );
        let stats = ok(&["heads", text, "--model", &model]);
        assert!(stats.contains("entropy"), "{name}: {stats}");
        let page = dir.path().join(format!("{name}.html"));
        ok(&[
            "html",
            text,
            "--model",
            &model,
            "-o",
            page.to_str().unwrap(),
        ]);
        assert!(
            std::fs::read_to_string(&page).unwrap().contains("terrible"),
            "{name}"
        );
    }
}
