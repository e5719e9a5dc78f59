//! The library's own API on the real default model: reading one attention row, and the inputs a
//! caller can build or change by hand (an `Encoding`, a `ModelOutput` handed back to `pool`,
//! ids to decode) refused with an error naming what disagrees, not a panic or a wrong answer.

use attn_models::default_model_dir;
use attn_models::{Model, ModelError, RunOptions};

fn minilm() -> Model {
    Model::load(&default_model_dir(false).expect("the default model is cached or can be fetched"))
        .unwrap()
}

const ATTENTIONS: RunOptions = RunOptions {
    attentions: true,
    qk: false,
    hidden_states: false,
};

#[test]
fn attention_reads_one_row_of_the_flat_tensor() {
    let model = minilm();
    let encs = [
        model.encode("The cat sat on the mat", None).unwrap(),
        model.encode("Hi", None).unwrap(),
    ];
    let out = model.forward_batch(&encs, &ATTENTIONS).unwrap();
    let (t, layers, heads) = (out.seq_len, model.n_layers(), model.n_heads());
    assert_eq!((out.n_layers, out.n_heads), (layers, heads));
    let flat = out.attentions.as_ref().unwrap();
    for (b, layer, head, query) in [(0, 0, 0, 0), (0, 3, 7, 3), (1, 5, 11, 2), (0, 2, 4, 7)] {
        let start = (((b * layers + layer) * heads + head) * t + query) * t;
        assert_eq!(
            out.attention(b, layer, head, query).unwrap(),
            &flat[start..start + t]
        );
    }
    // "Hi" is [CLS] hi [SEP]: its query 3 is padding.
    assert_eq!(out.lengths, [8, 3]);
    for (b, layer, head, query) in [
        (2, 0, 0, 0),
        (0, 6, 0, 0),
        (0, 0, 12, 0),
        (0, 0, 0, t),
        (1, 0, 0, 3),
    ] {
        assert_eq!(out.attention(b, layer, head, query), None);
    }
    let plain = model.forward(&encs[0], &RunOptions::default()).unwrap();
    assert_eq!(
        plain.attention(0, 0, 0, 0),
        None,
        "attentions not asked for"
    );
}

#[test]
fn pool_refuses_an_output_whose_fields_disagree() {
    let model = minilm();
    let enc = model.encode("The cat sat", None).unwrap();
    let out = model.forward(&enc, &RunOptions::default()).unwrap();
    assert_eq!(
        model.pool(&out).unwrap(),
        model.embed(&["The cat sat"]).unwrap()
    );
    let message = |change: &dyn Fn(&mut attn_models::ModelOutput)| {
        let mut bad = out.clone();
        change(&mut bad);
        let err = model.pool(&bad).unwrap_err();
        assert!(matches!(err, ModelError::InvalidInput { .. }), "{err:?}");
        err.to_string()
    };
    // No lengths divided by zero; a length past the tokens averaged padding that is not there.
    assert!(message(&|o| o.lengths.clear()).contains("0 lengths for a batch of 1"));
    assert!(message(&|o| o.lengths = vec![9]).contains("a text of 9 tokens"));
    assert!(message(&|o| o.lengths = vec![0]).contains("a text of 0 tokens"));
    assert!(
        message(&|o| {
            o.last_hidden_state.pop();
        })
        .contains("hidden 384")
    );
}

#[test]
fn encodings_built_by_hand_are_checked() {
    let model = minilm();
    let enc = model.encode("The cat sat", None).unwrap();
    let mut short = enc.clone();
    short.segments.pop();
    let err = model.forward(&short, &RunOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "encoding: 4 segments for 5 ids (one segment per token)"
    );
    let mut third = enc.clone();
    third.segments[1] = 7;
    let err = model.forward(&third, &RunOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "encoding: token 1 is in segment 7, and the model has 2 (config.json's type_vocab_size)"
    );
    let err = model
        .forward_batch(&[], &RunOptions::default())
        .unwrap_err();
    assert!(matches!(err, ModelError::EmptyBatch), "{err:?}");
}

#[test]
fn decoding_an_id_the_tokenizer_lacks_is_an_error() {
    let model = minilm();
    assert_eq!(model.decode(&[7592, 2088]).unwrap(), "hello world");
    // The vocabulary's last id, and the first past it.
    assert_eq!(model.decode(&[30521]).unwrap(), "##～");
    let err = model.decode(&[7592, 30522]).unwrap_err();
    assert_eq!(err.to_string(), "the tokenizer has no token for id 30522");
}
