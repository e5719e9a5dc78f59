//! The task heads against transformers, on the random checkpoints of `tests/data/heads`
//! (`scripts/test_data/task_heads.py`): classifiers' logits, labels and attentions, masked
//! language models' most likely tokens, question answering's windows, logits and the
//! pipeline's answers, and GPT-2's next token.

mod common;

use attn_models::{Model, ModelError, RunOptions, Scoring, Task};
use common::{Golden, assert_close, edited_checkpoint, golden_dir};

fn heads_dir(name: &str) -> std::path::PathBuf {
    golden_dir().join("heads").join(name)
}

fn load(name: &str) -> (Model, Golden) {
    let dir = heads_dir(name);
    let model = Model::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    (model, Golden::read(&dir.join("expected.safetensors")))
}

fn with_attentions() -> RunOptions {
    RunOptions {
        attentions: true,
        ..RunOptions::default()
    }
}

/// The metadata's list of inputs.
fn inputs(g: &Golden) -> Vec<serde_json::Value> {
    g.meta["inputs"].as_array().unwrap().clone()
}

#[test]
fn classifiers_match_transformers() {
    for name in ["bert-cls", "distilbert-cls", "roberta-cls", "gpt2-cls"] {
        let (model, g) = load(name);
        assert_eq!(model.task(), Some(Task::Classification), "{name}");
        assert_eq!(model.labels().unwrap(), ["negative", "neutral", "positive"]);
        let mut encs = Vec::new();
        for (n, input) in inputs(&g).iter().enumerate() {
            let text = input["text"].as_str().unwrap();
            let pair = input["pair"].as_str();
            let enc = model.encode(text, pair).unwrap();
            assert_eq!(enc.ids, g.ids(&format!("ids{n}")), "{name} input {n}: ids");
            let out = model.forward(&enc, &with_attentions()).unwrap();
            let c = &model.classify(&out, std::slice::from_ref(&enc)).unwrap()[0];
            let what = format!("{name} input {n}");
            let attentions = out.attentions.as_ref().unwrap();
            assert_close(
                &format!("{what} attentions"),
                attentions,
                g.tensor(&format!("attentions{n}")),
                1e-4,
            );
            assert_close(
                &format!("{what} logits"),
                &c.logits,
                g.tensor(&format!("logits{n}")),
                1e-4,
            );
            assert_eq!(c.scoring, Scoring::Softmax);
            let labels: Vec<&str> = c.ranked.iter().map(|(l, _)| l.as_str()).collect();
            let want: Vec<&str> = (input["labels"].as_array().unwrap().iter())
                .map(|l| l.as_str().unwrap())
                .collect();
            assert_eq!(labels, want, "{what}: labels highest first");
            for ((_, got), want) in c.ranked.iter().zip(input["scores"].as_array().unwrap()) {
                let want = want.as_f64().unwrap();
                assert!(
                    (f64::from(*got) - want).abs() < 1e-5,
                    "{what}: score {got} vs {want}"
                );
            }
            let pooled = if name == "gpt2-cls" { enc.len() - 1 } else { 0 };
            assert_eq!(c.pooled_token, pooled, "{what}: the token the head reads");
            encs.push(enc);
        }
        // A padded batch gives each text what it gets alone.
        let out = model.forward_batch(&encs, &RunOptions::default()).unwrap();
        for (n, c) in model.classify(&out, &encs).unwrap().iter().enumerate() {
            assert_close(
                &format!("{name} batch {n}"),
                &c.logits,
                g.tensor(&format!("logits{n}")),
                1e-4,
            );
        }
    }
}

/// The batch path (`classify_all`, whose last layer runs for the pooled row alone) against
/// transformers, and against the full forward pass where the row is not the last token.
#[test]
fn classify_all_runs_only_the_pooled_row_of_the_last_layer_exactly() {
    for name in ["bert-cls", "distilbert-cls", "roberta-cls", "gpt2-cls"] {
        let (model, g) = load(name);
        let encs: Vec<_> = (inputs(&g).iter())
            .map(|input| {
                let text = input["text"].as_str().unwrap();
                model.encode(text, input["pair"].as_str()).unwrap()
            })
            .collect();
        // Every text several times, so that each thread's share is a padded batch.
        let many: Vec<_> = (0..5).flat_map(|_| encs.iter().cloned()).collect();
        for (n, c) in model.classify_all(&many).unwrap().iter().enumerate() {
            let want = g.tensor(&format!("logits{}", n % encs.len()));
            assert_close(&format!("{name} text {n}"), &c.logits, want, 1e-4);
        }
    }
    // GPT-2 reads the last token that is not the pad token (id 0 here): with pad tokens at
    // the end that row is not the last one, and sees only the keys up to it.
    let (model, _) = load("gpt2-cls");
    let mut enc = model.encode("The cat sat on the mat", None).unwrap();
    for _ in 0..3 {
        enc.ids.push(0);
        enc.tokens.push("<pad>".into());
        enc.spans.push(None);
        enc.segments.push(0);
        enc.special.push(false);
    }
    let short = model.encode("Hello", None).unwrap();
    let encs = [enc.clone(), short.clone(), enc, short];
    let full = model.forward_batch(&encs, &RunOptions::default()).unwrap();
    let want = model.classify(&full, &encs).unwrap();
    assert_eq!(want[0].pooled_token, encs[0].len() - 4);
    for (n, (got, want)) in model
        .classify_all(&encs)
        .unwrap()
        .iter()
        .zip(&want)
        .enumerate()
    {
        assert_eq!(got.pooled_token, want.pooled_token);
        for (a, b) in got.logits.iter().zip(&want.logits) {
            assert!((a - b).abs() <= 1e-5, "padded text {n}: {a} vs {b}");
        }
    }
}

#[test]
fn masked_language_models_match_transformers() {
    for name in ["bert-mlm", "distilbert-mlm", "roberta-mlm"] {
        let (model, g) = load(name);
        assert_eq!(model.task(), Some(Task::MaskedLm), "{name}");
        for (n, input) in inputs(&g).iter().enumerate() {
            let what = format!("{name} input {n}");
            let enc = model.encode(input["text"].as_str().unwrap(), None).unwrap();
            assert_eq!(enc.ids, g.ids(&format!("ids{n}")), "{what}: ids");
            let out = model.forward(&enc, &with_attentions()).unwrap();
            let attentions = out.attentions.as_ref().unwrap();
            assert_close(
                &format!("{what} attentions"),
                attentions,
                g.tensor(&format!("attentions{n}")),
                1e-4,
            );
            let predictions = model
                .predict(&out, std::slice::from_ref(&enc), 0, 10)
                .unwrap();
            let positions: Vec<u32> = predictions.iter().map(|p| p.position as u32).collect();
            assert_eq!(
                positions,
                g.ids(&format!("mask_positions{n}")),
                "{what}: mask positions"
            );
            let ids: Vec<u32> = (predictions.iter())
                .flat_map(|p| p.top.iter().map(|&(id, _)| id))
                .collect();
            assert_eq!(
                ids,
                g.ids(&format!("top_ids{n}")),
                "{what}: the ten most likely tokens"
            );
            let probs: Vec<f32> = (predictions.iter())
                .flat_map(|p| p.top.iter().map(|&(_, p)| p))
                .collect();
            assert_close(
                &format!("{what} probabilities"),
                &probs,
                g.tensor(&format!("top_probs{n}")),
                1e-5,
            );
            let at: Vec<usize> = predictions.iter().map(|p| p.position).collect();
            let logits = model.masked_logits(&out, 0, &at).unwrap();
            let top_logits: Vec<f32> = (logits.iter().zip(&predictions))
                .flat_map(|(l, p)| p.top.iter().map(|&(id, _)| l[id as usize]))
                .collect();
            assert_close(
                &format!("{what} logits"),
                &top_logits,
                g.tensor(&format!("top_logits{n}")),
                1e-4,
            );
        }
    }
}

#[test]
fn question_answering_matches_the_pipeline() {
    for name in ["bert-qa", "distilbert-qa", "roberta-qa"] {
        let (model, g) = load(name);
        assert_eq!(model.task(), Some(Task::QuestionAnswering), "{name}");
        assert_eq!(
            model.answer_windows(),
            (64, 32),
            "{name}: window and overlap"
        );
        for (n, input) in inputs(&g).iter().enumerate() {
            let what = format!("{name} input {n}");
            let (question, context) = (
                input["question"].as_str().unwrap(),
                input["context"].as_str().unwrap(),
            );
            let answered = model.answer(question, context, &with_attentions()).unwrap();
            // The windows: transformers pads them to one length, with its attention mask.
            let (shape, ids) = g.tensor(&format!("ids{n}"));
            let mask = &g.tensor(&format!("attention_mask{n}")).1;
            assert_eq!(answered.windows.len(), shape[0], "{what}: windows");
            assert_eq!(shape[0] as u64, input["windows"].as_u64().unwrap());
            for (w, enc) in answered.windows.iter().enumerate() {
                let row = &ids[w * shape[1]..][..shape[1]];
                let real: Vec<u32> = (row.iter().zip(&mask[w * shape[1]..]))
                    .filter(|(_, m)| **m == 1.0)
                    .map(|(&id, _)| id as u32)
                    .collect();
                assert_eq!(enc.ids, real, "{what} window {w}: ids");
                for (which, got) in [
                    ("start", &answered.logits[w].start),
                    ("end", &answered.logits[w].end),
                ] {
                    let (_, all) = g.tensor(&format!("{which}_logits{n}"));
                    let want: Vec<f64> = all[w * shape[1]..][..real.len()].to_vec();
                    assert_close(
                        &format!("{what} window {w} {which} logits"),
                        got,
                        &(vec![real.len()], want),
                        1e-4,
                    );
                }
            }
            let first = &answered.output;
            let t = first.seq_len;
            let per_window = model.n_layers() * model.n_heads() * t * t;
            let window0 = &first.attentions.as_ref().unwrap()[..per_window];
            // transformers pads its windows to the longest, which the first is.
            let expected = g.tensor(&format!("attentions{n}"));
            assert_eq!(expected.0[2], t, "{what}: window 0's length");
            assert_close(&format!("{what} attentions"), window0, expected, 1e-4);
            let answer = answered.answer.expect("an answer");
            let expected = &input["answer"];
            assert_eq!(
                answer.text,
                expected["answer"].as_str().unwrap(),
                "{what}: answer"
            );
            assert_eq!(
                answer.start as u64,
                expected["start"].as_u64().unwrap(),
                "{what}: start"
            );
            assert_eq!(
                answer.end as u64,
                expected["end"].as_u64().unwrap(),
                "{what}: end"
            );
            let score = expected["score"].as_f64().unwrap();
            assert!(
                (f64::from(answer.score) - score).abs() < 1e-4,
                "{what}: score {} vs {score}",
                answer.score
            );
        }
    }
}

#[test]
fn gpt2_predicts_the_next_token_as_transformers() {
    let model = Model::load(&golden_dir().join("tiny-gpt2")).unwrap();
    assert_eq!(model.task(), Some(Task::NextToken));
    let g = Golden::read(&heads_dir("next_token.safetensors"));
    for (n, text) in g.strings("texts").iter().enumerate() {
        let enc = model.encode(text, None).unwrap();
        assert_eq!(enc.ids, g.ids(&format!("ids{n}")), "{text}: ids");
        let out = model.forward(&enc, &RunOptions::default()).unwrap();
        let p = model
            .predict(&out, std::slice::from_ref(&enc), 0, 10)
            .unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].position, enc.len() - 1);
        let ids: Vec<u32> = p[0].top.iter().map(|&(id, _)| id).collect();
        assert_eq!(
            ids,
            g.ids(&format!("top_ids{n}")),
            "{text}: the ten most likely"
        );
        let probs: Vec<f32> = p[0].top.iter().map(|&(_, p)| p).collect();
        assert_close(text, &probs, g.tensor(&format!("top_probs{n}")), 1e-5);
    }
}

#[test]
fn a_model_without_the_head_says_which_it_has() {
    let (mlm, _) = load("bert-mlm");
    let enc = mlm.encode("The cat sat", None).unwrap();
    let out = mlm.forward(&enc, &RunOptions::default()).unwrap();
    let err = mlm.classify(&out, &[enc]).unwrap_err().to_string();
    assert!(err.contains("has no sequence-classification head"), "{err}");
    assert!(err.contains("BertForMaskedLM"), "{err}");
    let (cls, _) = load("bert-cls");
    let err = cls
        .answer("Who?", "Me.", &RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("question-answering head") && err.contains("BertForSequenceClassification"),
        "{err}"
    );
}

#[test]
fn bad_heads_and_inputs_are_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    // num_labels disagreeing with the classifier's rows.
    let dir = tmp.path().join("labels");
    edited_checkpoint(
        &heads_dir("bert-cls"),
        &dir,
        |c| c["num_labels"] = 5.into(),
        None,
    );
    let err = Model::load(&dir).unwrap_err().to_string();
    assert!(
        err.contains("num_labels") && err.contains("5 labels") && err.contains("3 rows"),
        "{err}"
    );
    // A missing head tensor.
    let dir = tmp.path().join("missing");
    let drop_qa: &dyn Fn(&mut Vec<common::RawTensor>) =
        &|t| t.retain(|(n, ..)| n != "qa_outputs.weight");
    edited_checkpoint(&heads_dir("bert-qa"), &dir, |_| {}, Some(drop_qa));
    let err = Model::load(&dir).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { tensor } if tensor == "qa_outputs.weight"),
        "{err}"
    );
    // The labels are the classifier's rows: two rows with two labels load, two rows with the
    // config's three do not.
    let cut: &dyn Fn(&mut Vec<common::RawTensor>) = &|t| {
        for (name, _, shape, data) in t.iter_mut() {
            if name.starts_with("classifier.") {
                shape[0] = 2;
                let per_row = data.len() / 3;
                data.truncate(2 * per_row);
            }
        }
    };
    let dir = tmp.path().join("two");
    edited_checkpoint(
        &heads_dir("bert-cls"),
        &dir,
        |c| {
            c["id2label"] = serde_json::json!({"0": "a", "1": "b"});
            c["label2id"] = serde_json::json!({"a": 0, "b": 1});
        },
        Some(cut),
    );
    assert_eq!(Model::load(&dir).unwrap().labels().unwrap(), ["a", "b"]);
    let dir = tmp.path().join("two_of_three");
    edited_checkpoint(&heads_dir("bert-cls"), &dir, |_| {}, Some(cut));
    let err = Model::load(&dir).unwrap_err().to_string();
    assert!(err.contains("3 labels") && err.contains("2 rows"), "{err}");

    // Inputs.
    let (qa, _) = load("bert-qa");
    let none = RunOptions::default();
    for (q, c, what) in [("", "Paris.", "question"), ("Where?", "  ", "context")] {
        let err = qa.answer(q, c, &none).unwrap_err();
        assert!(
            matches!(err, ModelError::EmptyText { which } if which == what),
            "{err}"
        );
    }
    let long_question = "where is it ".repeat(20);
    let long_context = "Paris is in France. ".repeat(20);
    let err = qa
        .answer(&long_question, &long_context, &none)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the question takes") && err.contains("64-token window"),
        "{err}"
    );
    let (mlm, _) = load("distilbert-mlm");
    let enc = mlm.encode("The cat sat", None).unwrap();
    let out = mlm.forward(&enc, &none).unwrap();
    let err = mlm.predict(&out, &[enc], 0, 5).unwrap_err().to_string();
    assert_eq!(
        err,
        "the text has no [MASK] token: write [MASK] where the model is to fill in a word"
    );
}
