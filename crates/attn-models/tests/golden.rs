//! attn-models against the reference outputs of Hugging Face transformers in
//! `tests/data/minilm` (all-MiniLM-L6-v2, fetched by `default_model_dir` when not cached)
//! and `tests/data/tiny-gpt2` (checkpoint and expected outputs).

mod common;

use attn_models::default_model_dir;
use attn_models::{Model, ModelKind, RunOptions};
use common::{Golden, assert_close, cosine, golden_dir, minilm_text_files};

fn minilm() -> Model {
    let dir = default_model_dir(false).expect("the default model is cached or can be fetched");
    Model::load(&dir).unwrap()
}

fn all() -> RunOptions {
    RunOptions {
        attentions: true,
        qk: true,
        hidden_states: true,
    }
}

#[test]
fn minilm_texts_match_transformers() {
    let model = minilm();
    assert_eq!(model.kind(), ModelKind::Bert);
    assert_eq!(
        (model.n_layers(), model.n_heads(), model.max_positions()),
        (6, 12, 512)
    );
    let files = minilm_text_files();
    for path in files {
        let g = Golden::read(&path);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = g.text("text").unwrap();
        let pair = g.text("text_pair");
        let enc = model.encode(&text, pair.as_deref()).unwrap();
        assert_eq!(enc.ids, g.ids("input_ids"), "{name}: input_ids");
        assert_eq!(enc.tokens, g.strings("tokens"), "{name}: tokens");
        let types: Vec<u32> = enc.segments.iter().map(|&s| s as u32).collect();
        assert_eq!(types, g.ids("token_type_ids"), "{name}: token_type_ids");
        for ((span, tok), &special) in enc.spans.iter().zip(&enc.tokens).zip(&enc.special) {
            assert_eq!(span.is_none(), special, "{name}: {tok}");
        }

        let out = model.forward(&enc, &all()).unwrap();
        assert_close(
            &format!("{name} attentions"),
            out.attentions.as_ref().unwrap(),
            g.tensor("attentions"),
            1e-4,
        );
        assert_close(
            &format!("{name} last_hidden_state"),
            &out.last_hidden_state,
            g.tensor("last_hidden_state"),
            1e-3,
        );
        let hs = out.hidden_states.as_ref().unwrap();
        let last = &hs[hs.len() - out.last_hidden_state.len()..];
        assert_eq!(
            last,
            &out.last_hidden_state[..],
            "{name}: last hidden state slot"
        );
        let pooled = model.pool(&out).unwrap();
        let cos = cosine(&pooled[0], &g.tensor("embedding").1);
        assert!(cos >= 0.99999, "{name}: embedding cosine {cos}");
        if pair.is_none() {
            let e = model.embed(&[text.as_str()]).unwrap();
            let cos = cosine(&e[0], &g.tensor("embedding").1);
            assert!(cos >= 0.99999, "{name}: embed() cosine {cos}");
        }
    }
}

#[test]
fn minilm_padded_batch_matches_transformers() {
    let model = minilm();
    let g = Golden::read(&golden_dir().join("minilm/batch00.safetensors"));
    let texts: Vec<String> = g.strings("texts");
    let encs: Vec<_> = texts
        .iter()
        .map(|t| model.encode(t, None).unwrap())
        .collect();
    let out = model.forward_batch(&encs, &all()).unwrap();
    let (shape, ids) = g.tensor("input_ids");
    assert_eq!(shape, &vec![out.batch, out.seq_len]);
    let mask = &g.tensor("attention_mask").1;
    for (b, enc) in encs.iter().enumerate() {
        let row = &ids[b * out.seq_len..][..out.seq_len];
        let real = mask[b * out.seq_len..][..out.seq_len]
            .iter()
            .filter(|&&m| m == 1.0)
            .count();
        assert_eq!(real, out.lengths[b], "text {b}: real tokens");
        let got: Vec<f64> = enc.ids.iter().map(|&i| i as f64).collect();
        assert_eq!(&row[..real], &got[..], "text {b}: input_ids");
    }
    assert_close(
        "batch attentions",
        out.attentions.as_ref().unwrap(),
        g.tensor("attentions"),
        1e-4,
    );
    assert_close(
        "batch last_hidden_state",
        &out.last_hidden_state,
        g.tensor("last_hidden_state"),
        1e-3,
    );
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let embeddings = model.embed(&refs).unwrap();
    let (_, want) = g.tensor("embeddings");
    for (b, e) in embeddings.iter().enumerate() {
        let cos = cosine(e, &want[b * e.len()..][..e.len()]);
        assert!(cos >= 0.99999, "text {b}: embedding cosine {cos}");
        let norm: f32 = e.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "text {b}: norm {norm}");
    }
}

#[test]
fn padding_does_not_change_real_tokens() {
    let model = minilm();
    let texts = [
        "Hello",
        "The cat that ate the mouse that lived in the barn ran away",
        "The cat sat",
    ];
    let encs: Vec<_> = texts
        .iter()
        .map(|t| model.encode(t, None).unwrap())
        .collect();
    let batch = model.forward_batch(&encs, &all()).unwrap();
    let (layers, heads, t, h) = (
        model.n_layers(),
        model.n_heads(),
        batch.seq_len,
        model.hidden_size(),
    );
    for (b, enc) in encs.iter().enumerate() {
        let alone = model.forward(enc, &all()).unwrap();
        let n = enc.len();
        let mut worst = 0.0f32;
        for i in 0..n {
            for c in 0..h {
                let x = batch.last_hidden_state[(b * t + i) * h + c];
                worst = worst.max((x - alone.last_hidden_state[i * h + c]).abs());
            }
        }
        let ba = batch.attentions.as_ref().unwrap();
        let aa = alone.attentions.as_ref().unwrap();
        for lh in 0..layers * heads {
            for i in 0..n {
                for j in 0..t {
                    let x = ba[((b * layers * heads + lh) * t + i) * t + j];
                    if j < n {
                        worst = worst.max((x - aa[(lh * n + i) * n + j]).abs());
                    } else {
                        assert_eq!(x, 0.0, "text {b}: padded key {j} has weight");
                    }
                }
            }
        }
        assert!(worst < 1e-5, "text {b}: padding changed results by {worst}");
        let single = model.embed(&[texts[b]]).unwrap();
        let batched = model.embed(&texts).unwrap();
        let diff = single[0]
            .iter()
            .zip(&batched[b])
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(
            diff < 1e-6,
            "text {b}: embedding changed by {diff} in a batch"
        );
    }
}

#[test]
fn attention_rows_sum_to_one_and_qk_reproduce_them() {
    let model = minilm();
    let enc = model.encode("The cat sat on the mat", None).unwrap();
    let out = model.forward(&enc, &all()).unwrap();
    let (t, d) = (enc.len(), model.hidden_size() / model.n_heads());
    let att = out.attentions.as_ref().unwrap();
    for row in att.chunks_exact(t) {
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "row sums to {s}");
    }
    // Layer 0, head 0: softmax(q·k / √d) from the returned q and k equals the returned weights.
    let qk = out.qk.as_ref().unwrap();
    for i in 0..t {
        let scores: Vec<f32> = (0..t)
            .map(|j| {
                (0..d)
                    .map(|c| qk.q[i * d + c] * qk.k[j * d + c])
                    .sum::<f32>()
                    / (d as f32).sqrt()
            })
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let z: f32 = scores.iter().map(|s| (s - max).exp()).sum();
        for j in 0..t {
            let w = (scores[j] - max).exp() / z;
            assert!(
                (w - att[i * t + j]).abs() < 1e-5,
                "({i}, {j}): {w} vs {}",
                att[i * t + j]
            );
        }
    }
}

#[test]
fn tiny_gpt2_matches_transformers() {
    let dir = golden_dir().join("tiny-gpt2");
    let model = Model::load(&dir).unwrap();
    assert_eq!(model.kind(), ModelKind::Gpt2);
    for n in 0..2 {
        let g = Golden::read(&dir.join(format!("expected/text{n:02}.safetensors")));
        let text = g.text("text").unwrap();
        let enc = model.encode(&text, None).unwrap();
        assert_eq!(enc.ids, g.ids("input_ids"), "text{n}: input_ids");
        assert_eq!(enc.tokens, g.strings("tokens"), "text{n}: tokens");
        let out = model.forward(&enc, &all()).unwrap();
        assert_close(
            &format!("text{n} attentions"),
            out.attentions.as_ref().unwrap(),
            g.tensor("attentions"),
            1e-3,
        );
        assert_close(
            &format!("text{n} last_hidden_state"),
            &out.last_hidden_state,
            g.tensor("last_hidden_state"),
            1e-3,
        );
        assert_close(
            &format!("text{n} logits"),
            out.logits.as_ref().unwrap(),
            g.tensor("logits"),
            1e-3,
        );
        // Causal: no query attends to a later key.
        let t = enc.len();
        let att = out.attentions.as_ref().unwrap();
        for (r, row) in att.chunks_exact(t).enumerate() {
            assert!(
                row[r % t + 1..].iter().all(|&w| w == 0.0),
                "row {r} sees the future"
            );
        }
    }
}

#[test]
fn spans_are_byte_ranges_of_their_segment() {
    let model = minilm();
    let (text, pair) = (
        "Where is the Eiffel Tower?",
        "Café prices in Paris, France.",
    );
    let enc = model.encode(text, Some(pair)).unwrap();
    for i in 0..enc.len() {
        let token = enc.tokens[i].trim_start_matches("##");
        match enc.spans[i] {
            None => assert!(
                enc.special[i] && ["[CLS]", "[SEP]"].contains(&token),
                "{token}"
            ),
            Some((start, end)) => {
                let source = if enc.segments[i] == 0 { text } else { pair };
                // The tokenizer lower-cases and strips accents: compare the same way.
                let piece = source[start..end].to_lowercase().replace('é', "e");
                assert_eq!(piece, token, "token {i} span {start}..{end}");
            }
        }
    }
    assert!(enc.tokens.contains(&"cafe".to_string()), "{:?}", enc.tokens);

    let gpt2 = Model::load(&golden_dir().join("tiny-gpt2")).unwrap();
    let text = "The cat sat on the mat";
    let enc = gpt2.encode(text, None).unwrap();
    let words: Vec<&str> = enc
        .spans
        .iter()
        .map(|s| &text[s.unwrap().0..s.unwrap().1])
        .collect();
    assert_eq!(words.concat().replace(' ', ""), text.replace(' ', ""));
}

#[test]
fn a_model_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>(_: &T) {}
    let model = Model::load(&golden_dir().join("tiny-gpt2")).unwrap();
    shareable(&model);
    let enc = model.encode("The cat sat", None).unwrap();
    let alone = model.forward(&enc, &RunOptions::default()).unwrap();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|_| s.spawn(|| model.forward(&enc, &RunOptions::default()).unwrap()))
            .collect();
        for run in runs {
            assert_eq!(run.join().unwrap().logits, alone.logits);
        }
    });
}
