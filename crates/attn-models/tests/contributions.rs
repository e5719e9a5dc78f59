//! The norm-based and ALTI contributions against an independent PyTorch implementation of their
//! formulas on transformers' own tensors (`scripts/test_data/contributions.py`), for
//! all-MiniLM-L6-v2 and the encoders of the random task checkpoints (BERT, DistilBERT, RoBERTa:
//! post-LN; GPT-2: pre-LN).

mod common;

use attn_models::{Model, default_model_dir};
use common::{Golden, assert_close, golden_dir};

fn check(model: &Model, name: &str) {
    let g = Golden::read(
        &golden_dir()
            .join("contributions")
            .join(format!("{name}.safetensors")),
    );
    for (n, text) in g.strings("texts").iter().enumerate() {
        let enc = model.encode(text, None).unwrap();
        assert_eq!(enc.ids, g.ids(&format!("ids{n}")), "{name} {text:?}: ids");
        let c = model.contributions(&enc).unwrap();
        assert_eq!((c.n_layers, c.seq_len), (model.n_layers(), enc.len()));
        let what = format!("{name} {text:?}");
        assert_close(
            &format!("{what} norm"),
            &c.norm,
            g.tensor(&format!("norm{n}")),
            1e-4,
        );
        assert_close(
            &format!("{what} alti"),
            &c.alti,
            g.tensor(&format!("alti{n}")),
            1e-4,
        );
        // Each row sums to 1, but for a row where no source comes within ‖y_i‖₁ of y_i (which
        // the width-8 checkpoints have): that one stays 0.
        let mut empty = 0;
        for row in c.alti.chunks_exact(enc.len()) {
            let sum: f32 = row.iter().sum();
            empty += usize::from(sum == 0.0);
            assert!(
                sum == 0.0 || (sum - 1.0).abs() < 1e-5,
                "{what}: an ALTI row sums to {sum}"
            );
        }
        assert!(
            empty * 4 < c.n_layers * enc.len(),
            "{what}: {empty} empty rows"
        );
    }
}

#[test]
fn contributions_of_the_task_checkpoints_match_the_reference() {
    for name in ["bert-cls", "distilbert-cls", "roberta-cls", "gpt2-cls"] {
        let model = Model::load(&golden_dir().join("heads").join(name)).unwrap();
        check(&model, name);
    }
}

#[test]
fn contributions_of_the_default_model_match_the_reference() {
    let model = Model::load(&default_model_dir(false).unwrap()).unwrap();
    check(&model, "minilm");
}
