//! Regression tests: inputs that once crashed or misled attn-models, each named after what it
//! was. Found by the fuzz targets in `fuzz/` or by hand while hardening.

use std::path::PathBuf;

use attn_models::ModelConfig;

/// `tests/data`, the reference files in the repository.
fn golden() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// Found by hand reading `config.rs` for the `model_config` fuzz target: `n_inner` defaults to
/// `4 · n_embd`, computed unchecked, so n_embd ≥ 2^62 panicked (debug) or wrapped (release).
#[test]
fn gpt2_config_with_huge_n_embd_and_no_n_inner_is_refused() {
    let text = std::fs::read_to_string(golden().join("tiny-gpt2/config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["n_embd"] = (1u64 << 62).into();
    config["n_head"] = 1.into();
    config["n_inner"] = serde_json::Value::Null;
    let message = ModelConfig::from_json(&config.to_string())
        .unwrap_err()
        .to_string();
    assert!(
        ["n_embd", "hidden_size", "n_inner", "intermediate_size"]
            .iter()
            .any(|field| message.contains(field)),
        "{message}"
    );
}
