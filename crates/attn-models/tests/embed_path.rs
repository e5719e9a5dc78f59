//! The embedding path's own behaviour: the buffers a thread keeps between batches change no
//! result, and a checkpoint whose weights hold NaN is an error rather than NaN embeddings.

use std::path::PathBuf;

use attn_models::fetch::default_model_dir;
use attn_models::{Model, ModelError, RunOptions};

fn tiny_gpt2() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/golden/tiny-gpt2"
    ))
}

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
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(tiny_gpt2().join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(tiny_gpt2().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data().to_vec();
            (name, view.dtype(), view.shape().to_vec(), data)
        })
        .collect();
    // The first weight of layer 0's query/key/value projection: every later value sees it.
    let (_, _, _, data) = tensors
        .iter_mut()
        .find(|(name, ..)| name.ends_with("h.0.attn.c_attn.weight"))
        .unwrap();
    data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();

    let model = Model::load(dir.path()).unwrap();
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
