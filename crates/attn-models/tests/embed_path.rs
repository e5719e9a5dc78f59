//! The embedding path's own behaviour: the buffers a thread keeps between batches change no
//! result, and a checkpoint whose weights hold NaN is an error rather than NaN embeddings.

use attn_models::default_model_dir;
use attn_models::{Model, ModelError, RunOptions};

#[allow(dead_code)]
mod common;

#[test]
fn kept_buffers_change_no_embedding() {
    let dir = default_model_dir(false).expect("the default model is cached or can be fetched");
    let model = Model::load(&dir).unwrap();
    let short = ["The cat sat", "A dog"];
    let long: Vec<String> = (0..100)
        .map(|i| format!("sentence number {i} is a little longer than the others were"))
        .collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    // Short batches, then long ones (the kept buffers grow), then short again (they shrink).
    let first = model.embed(&short).unwrap();
    let long_first = model.embed(&long).unwrap();
    assert_eq!(model.embed(&short).unwrap(), first);
    assert_eq!(model.embed(&long).unwrap(), long_first);
    // Each text alone gives what it gets in its batch.
    for (text, e) in short.iter().zip(&first) {
        assert_eq!(&model.embed(&[text]).unwrap()[0], e, "{text}");
    }
}

#[test]
fn nan_weights_are_an_error_naming_the_final_hidden_state() {
    let dir = tempfile::tempdir().unwrap();
    // The first weight of layer 0's query/key/value projection: every later value sees it.
    let model = common::tiny_gpt2_with_a_nan(dir.path(), "h.0.attn.c_attn.weight");
    let enc = model.encode("The cat sat", None).unwrap();
    let errors = [
        model.forward(&enc, &RunOptions::default()).unwrap_err(),
        model.embed(&["The cat sat"]).unwrap_err(),
    ];
    for err in errors {
        match &err {
            ModelError::NonFinite { value, .. } => {
                assert!(value.is_nan(), "{err}");
            }
            other => panic!("expected a non-finite error, got {other:?}"),
        }
        assert!(err.to_string().contains("non-finite"), "{err}");
    }
}

#[test]
fn attention_rows_stop_at_the_last_layers_attention() {
    let clean = Model::load(&common::golden_dir().join("tiny-gpt2")).unwrap();
    let enc = clean.encode("The cat sat on the mat", None).unwrap();
    let rows = [1, enc.len() - 1];
    let want = clean.attention_rows(&enc, &rows).unwrap();
    // A NaN in the last layer's feed-forward: the forward pass reports it; the rows, which
    // never read it, are the clean model's.
    let dir = tempfile::tempdir().unwrap();
    let last = clean.n_layers() - 1;
    let mlp = common::tiny_gpt2_with_a_nan(dir.path(), &format!("h.{last}.mlp.c_fc.weight"));
    let err = mlp.forward(&enc, &RunOptions::default()).unwrap_err();
    assert!(err.to_string().contains("the final hidden state"), "{err}");
    assert_eq!(mlp.attention_rows(&enc, &rows).unwrap(), want);
    // One in layer 0's projection reaches every later value: the rows name where it was found.
    let dir = tempfile::tempdir().unwrap();
    let qkv = common::tiny_gpt2_with_a_nan(dir.path(), "h.0.attn.c_attn.weight");
    let err = qkv.attention_rows(&enc, &rows).unwrap_err();
    assert!(
        matches!(err, ModelError::NonFinite { value, .. } if value.is_nan()),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("in the last layer's queries, keys and values at token 0"),
        "{message}"
    );
}

#[test]
fn a_hidden_state_whose_variance_overflows_is_an_error_not_beta() {
    // Word embeddings × 1e30: the first LayerNorm's variance passes f32's range. Its rows were
    // scaled by 1/√∞ = 0, to β: uniform attention and text generated from nothing, exit 0.
    let dir = tempfile::tempdir().unwrap();
    let blow_up = |tensors: &mut Vec<common::RawTensor>| {
        let (_, _, _, data) = (tensors.iter_mut())
            .find(|(name, ..)| name.ends_with("wte.weight"))
            .unwrap();
        for x in data.chunks_exact_mut(4) {
            let v = f32::from_le_bytes(x.try_into().unwrap()) * 1e30;
            x.copy_from_slice(&v.to_le_bytes());
        }
    };
    let tiny = common::golden_dir().join("tiny-gpt2");
    common::edited_checkpoint(&tiny, dir.path(), |_| {}, Some(&blow_up));
    let model = Model::load(dir.path()).unwrap();
    let enc = model.encode("The cat sat", None).unwrap();
    let Err(err) = model.forward(&enc, &RunOptions::default()) else {
        panic!("an error, not the rows' β");
    };
    assert!(matches!(err, ModelError::NonFinite { .. }), "{err:?}");
}

#[test]
fn a_nan_in_one_text_of_a_batch_names_that_text_and_token() {
    let clean = Model::load(&common::golden_dir().join("tiny-gpt2")).unwrap();
    let cat = clean.encode("The dog cat", None).unwrap();
    let (at, &id) = (cat.ids.len() - 1, cat.ids.last().unwrap());
    // The embedding row of the last token of "The dog cat" (" cat": only that text holds it)
    // is NaN; GPT-2 is causal, so that token is its text's first non-finite one.
    let dir = tempfile::tempdir().unwrap();
    let h = clean.hidden_size();
    let model = common::tiny_gpt2_with_a_nan_at(dir.path(), "wte.weight", id as usize * h);
    // 70 texts, the poisoned one at 66: in the second chunk of 64 (texts 64..70), which three
    // threads run in shares of 2; 66 is the first of the second share.
    let mut texts = ["The dog", "A dog", "The dog ran", "dog dog", "A dog ran"].repeat(14);
    texts[66] = "The dog cat";
    assert!(
        (texts.iter().enumerate())
            .all(|(i, t)| i == 66 || !model.encode(t, None).unwrap().ids.contains(&id)),
        "only text 66 holds the poisoned token"
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let err = pool.install(|| model.embed(&texts)).unwrap_err();
    match &err {
        ModelError::NonFinite {
            state,
            text,
            token,
            value,
        } => {
            assert_eq!(*state, "the final hidden state", "{err}");
            assert_eq!((*text, *token), (66, at), "{err}");
            assert!(value.is_nan(), "{err}");
        }
        other => panic!("expected a non-finite error, got {other:?}"),
    }
    assert_eq!(err.text(), Some(66));
    assert!(err.to_string().contains(&format!("at token {at}")), "{err}");
}
