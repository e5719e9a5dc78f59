//! The BERT family's other members: all-MiniLM-L6-v2's weights rewritten as a RoBERTa and as a
//! DistilBERT checkpoint compute what transformers computes for the original BERT
//! (`tests/data/minilm`), once their embeddings are moved to where each family reads them.
//! The rewrites put something else where a family must not read, so that a wrong position, a
//! missing or extra token type, or a wrong tensor name fails.
//! (`scripts/check_model_families.py` compares random checkpoints of each family with
//! transformers itself.)

mod common;

use attn_models::default_model_dir;
use attn_models::{Family, Model, ModelConfig, ModelError, ModelKind, RunOptions};
use common::{Golden, RawTensor, assert_close, cosine, edited_checkpoint, minilm_text_files};

/// RoBERTa's pad token id in the rewrite: its texts' positions start at `PAD + 1`.
const PAD: usize = 3;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The tensor `name` of `tensors`, removed.
fn take(tensors: &mut Vec<RawTensor>, name: &str) -> RawTensor {
    let at = tensors.iter().position(|(n, ..)| n == name).unwrap();
    tensors.remove(at)
}

/// all-MiniLM-L6-v2 as `model_type` `"roberta"`: `PAD + 1` rows of 10.0 before the position
/// embeddings (which no text may read), every tensor under the `roberta.` prefix of task heads.
fn minilm_as_roberta(dir: &std::path::Path) -> Model {
    let minilm = default_model_dir(false).expect("the default model is cached or can be fetched");
    let rewrite = |tensors: &mut Vec<RawTensor>| {
        let (name, dtype, shape, data) = take(tensors, "embeddings.position_embeddings.weight");
        let mut table = vec![10.0f32; (PAD + 1) * shape[1]];
        table.extend(f32s(&data));
        tensors.push((
            name,
            dtype,
            vec![shape[0] + PAD + 1, shape[1]],
            bytes(&table),
        ));
        for (name, ..) in tensors.iter_mut() {
            *name = format!("roberta.{name}");
        }
    };
    edited_checkpoint(
        &minilm,
        dir,
        |config| {
            config["model_type"] = "roberta".into();
            config["pad_token_id"] = PAD.into();
            config["max_position_embeddings"] = (512 + PAD + 1).into();
        },
        Some(&rewrite),
    );
    Model::load(dir).unwrap()
}

/// all-MiniLM-L6-v2 as `model_type` `"distilbert"`: DistilBERT's tensor names and config
/// fields, token type 0's embedding added to every position's (DistilBERT has no token types).
fn minilm_as_distilbert(dir: &std::path::Path) -> Model {
    let minilm = default_model_dir(false).expect("the default model is cached or can be fetched");
    let rewrite = |tensors: &mut Vec<RawTensor>| {
        let (.., types) = take(tensors, "embeddings.token_type_embeddings.weight");
        let (name, dtype, shape, data) = take(tensors, "embeddings.position_embeddings.weight");
        let first_type = &f32s(&types)[..shape[1]];
        let table: Vec<f32> = f32s(&data)
            .chunks_exact(shape[1])
            .flat_map(|row| row.iter().zip(first_type).map(|(p, t)| p + t))
            .collect();
        tensors.push((name, dtype, shape, bytes(&table)));
        tensors
            .retain(|(name, ..)| !name.starts_with("pooler.") && !name.ends_with("position_ids"));
        for (name, ..) in tensors.iter_mut() {
            let renamed = name
                .replace("encoder.layer.", "transformer.layer.")
                .replace("attention.self.query", "attention.q_lin")
                .replace("attention.self.key", "attention.k_lin")
                .replace("attention.self.value", "attention.v_lin")
                .replace("attention.output.dense", "attention.out_lin")
                .replace("attention.output.LayerNorm", "sa_layer_norm")
                .replace("intermediate.dense", "ffn.lin1")
                .replace("output.dense", "ffn.lin2")
                .replace("output.LayerNorm", "output_layer_norm");
            *name = format!("distilbert.{renamed}");
        }
    };
    edited_checkpoint(
        &minilm,
        dir,
        |config| {
            *config = serde_json::json!({
                "model_type": "distilbert",
                "vocab_size": 30522,
                "dim": 384,
                "n_layers": 6,
                "n_heads": 12,
                "hidden_dim": 1536,
                "activation": "gelu",
                "max_position_embeddings": 512,
                "pad_token_id": 0,
            });
        },
        Some(&rewrite),
    );
    Model::load(dir).unwrap()
}

/// Every one-text golden file of all-MiniLM-L6-v2 (the pairs use token type 1, which neither
/// rewrite keeps) through `model`, at the tolerances of the BERT golden test.
fn matches_minilm_golden(model: &Model, family: &str) {
    let all = RunOptions {
        attentions: true,
        qk: false,
        hidden_states: false,
    };
    let mut checked = 0;
    for path in minilm_text_files() {
        let g = Golden::read(&path);
        if g.text("text_pair").is_some() {
            continue;
        }
        let name = format!("{family} {}", path.file_name().unwrap().to_string_lossy());
        let text = g.text("text").unwrap();
        let enc = model.encode(&text, None).unwrap();
        assert_eq!(enc.ids, g.ids("input_ids"), "{name}: input_ids");
        assert_eq!(enc.tokens, g.strings("tokens"), "{name}: tokens");
        let out = model.forward(&enc, &all).unwrap();
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
        let e = model.embed(&[text.as_str()]).unwrap();
        let cos = cosine(&e[0], &g.tensor("embedding").1);
        assert!(cos >= 0.99999, "{name}: embed() cosine {cos}");
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} one-text golden files");
}

#[test]
fn minilm_as_roberta_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let model = minilm_as_roberta(dir.path());
    assert_eq!(
        (model.kind(), model.config().family),
        (ModelKind::Bert, Family::Roberta)
    );
    // 516 rows, of which the first PAD + 1 are never a text's.
    assert_eq!(model.max_positions(), 512);
    matches_minilm_golden(&model, "roberta");
    // A pair: RoBERTa reads token type 0 for both texts (the rewrite keeps MiniLM's row 1,
    // which differs from row 0).
    let pair = model.encode("The cat sat", Some("on the mat")).unwrap();
    assert!(pair.segments.contains(&1));
    let mut zeroed = pair.clone();
    zeroed.segments.fill(0);
    let out = |enc| model.forward(enc, &RunOptions::default()).unwrap();
    assert_eq!(out(&pair).last_hidden_state, out(&zeroed).last_hidden_state);
}

#[test]
fn minilm_as_distilbert_matches_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let model = minilm_as_distilbert(dir.path());
    assert_eq!(
        (model.kind(), model.config().family),
        (ModelKind::Bert, Family::DistilBert)
    );
    assert_eq!(model.max_positions(), 512);
    matches_minilm_golden(&model, "distilbert");
    let err = attn_models::KvCache::new(&model).err().unwrap();
    assert!(err.to_string().ends_with("is a distilbert model"), "{err}");
}

#[test]
fn roberta_numbers_positions_after_the_pad_token() {
    let config = ModelConfig::from_json(
        r#"{"model_type": "xlm-roberta", "vocab_size": 10, "hidden_size": 4,
            "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4,
            "max_position_embeddings": 12, "pad_token_id": 3}"#,
    )
    .unwrap();
    assert_eq!(config.family, Family::Roberta);
    assert_eq!(config.max_tokens(), 8);
    // transformers' create_position_ids_from_input_ids: cumsum(id ≠ pad) · (id ≠ pad) + pad.
    // For ids [0, 5, 3, 7] and two padded places: mask 1 1 0 1 0 0, cumsum 1 2 2 3 3 3.
    assert_eq!(config.positions(&[0, 5, 3, 7], 6), [4, 5, 3, 6, 3, 3]);
    // RobertaConfig's default pad_token_id is 1.
    let default_pad = ModelConfig::from_json(
        r#"{"model_type": "roberta", "vocab_size": 10, "hidden_size": 4,
            "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4,
            "max_position_embeddings": 12}"#,
    )
    .unwrap();
    assert_eq!(default_pad.pad_token_id, 1);
    assert_eq!(default_pad.positions(&[0, 5], 2), [2, 3]);
    let bert = ModelConfig::from_json(
        r#"{"model_type": "bert", "vocab_size": 10, "hidden_size": 4,
            "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4,
            "max_position_embeddings": 12, "pad_token_id": 3}"#,
    )
    .unwrap();
    assert_eq!(bert.max_tokens(), 12);
    assert_eq!(bert.positions(&[0, 5, 3, 7], 6), [0, 1, 2, 3, 4, 5]);
}

#[test]
fn family_config_errors_name_their_fields() {
    let roberta = |extra: &str| {
        ModelConfig::from_json(&format!(
            r#"{{"model_type": "roberta", "vocab_size": 10, "hidden_size": 4,
                "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 4,
                {extra}}}"#
        ))
    };
    let err = roberta(r#""max_position_embeddings": 2, "pad_token_id": 1"#).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InvalidConfig {
                field: "max_position_embeddings",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("pad_token_id 1"), "{err}");
    let err = roberta(r#""max_position_embeddings": 8, "type_vocab_size": 0"#).unwrap_err();
    assert!(err.to_string().contains("type_vocab_size"), "{err}");

    let distilbert = |extra: &str| {
        ModelConfig::from_json(&format!(
            r#"{{"model_type": "distilbert", "vocab_size": 10 {extra}}}"#
        ))
    };
    // DistilBertConfig's defaults: 6 layers of 12 heads, 768 wide, 3072 in the feed-forward.
    let defaults = distilbert("").unwrap();
    assert_eq!(
        (
            defaults.n_layers,
            defaults.n_heads,
            defaults.hidden_size,
            defaults.intermediate_size,
            defaults.max_tokens()
        ),
        (6, 12, 768, 3072, 512)
    );
    for (extra, field) in [
        (r#", "dim": 10"#, "dim"),
        (r#", "n_heads": 0"#, "n_heads"),
        (r#", "hidden_dim": 0"#, "hidden_dim"),
        (r#", "activation": "swish""#, "activation"),
    ] {
        let err = distilbert(extra).unwrap_err();
        assert!(
            matches!(&err, ModelError::InvalidConfig { field: f, .. } if *f == field),
            "{extra}: {err:?}"
        );
    }
    // DistilBertConfig's attribute_map aliases: a head count under `num_attention_heads` was
    // ignored (12 heads ran where transformers runs 4); both names at once are read when they
    // agree, refused when they do not.
    let aliased = distilbert(
        r#", "hidden_size": 48, "num_attention_heads": 4, "num_hidden_layers": 2, "hidden_dim": 8"#,
    )
    .unwrap();
    assert_eq!(
        (aliased.hidden_size, aliased.n_heads, aliased.n_layers),
        (48, 4, 2)
    );
    let err = distilbert(r#", "n_heads": 4, "num_attention_heads": 6"#).unwrap_err();
    assert!(err.to_string().contains("n_heads: set twice"), "{err}");
    let both = distilbert(r#", "dim": 48, "n_heads": 4, "num_attention_heads": 4"#).unwrap();
    assert_eq!(both.n_heads, 4);
    // The encoders' padding index must be a token, as transformers requires.
    for (config, vocab) in [
        (
            roberta(r#""max_position_embeddings": 8, "pad_token_id": 10"#),
            10,
        ),
        (distilbert(r#", "pad_token_id": 4294967295"#), 10),
    ] {
        let err = config.unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::InvalidConfig {
                    field: "pad_token_id",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&format!("{vocab} tokens")),
            "{err}"
        );
    }
    let err = ModelConfig::from_json(r#"{"vocab_size": 10}"#).unwrap_err();
    assert!(
        err.to_string().contains("model_type: missing") && err.to_string().contains("distilbert"),
        "{err}"
    );
    let err = ModelConfig::from_json(r#"{"model_type": "mpnet"}"#).unwrap_err();
    assert!(
        err.to_string().contains(
            "bert, roberta, xlm-roberta, camembert, distilbert, gpt2, llama, mistral, qwen2"
        ),
        "{err}"
    );
}

#[test]
fn a_distilbert_checkpoint_missing_a_layer_tensor_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    minilm_as_distilbert(dir.path());
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let missing = "distilbert.transformer.layer.5.ffn.lin1.weight";
    let views: Vec<_> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != missing)
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let err = Model::load(dir.path()).err().unwrap();
    assert!(err.to_string().contains(missing), "{err}");
}
