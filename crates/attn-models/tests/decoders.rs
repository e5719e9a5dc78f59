//! The Llama-style decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 2) on the random checkpoints of
//! `tests/data/llm` (scripts/test_data/decoders.py): token ids, logits and attentions against
//! transformers, greedy generation against its `generate()`, cached decoding against the full
//! pass at every prefix, and bad configs as errors. The BF16 and F16 checkpoints are read in
//! their stored dtype, widened exactly as they are multiplied: they meet transformers' f32 pass
//! over the same weights as closely as the f32 checkpoints do.

// Shared helpers: this test uses the golden reader and `assert_close`, not all of them.
#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use attn_models::{GenerateOptions, KvCache, Model, ModelError, RunOptions, Sampling, generate};
use common::{Golden, golden_dir};

const FAMILIES: [&str; 7] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "llama-bf16",
    "mistral-f16",
];

/// The checkpoints stored in 16 bits, and the name of transformers' own pass in that dtype.
const HALF: [(&str, &str); 2] = [
    ("llama-bf16", "bf16_logits0"),
    ("mistral-f16", "f16_logits0"),
];

fn dir(name: &str) -> PathBuf {
    golden_dir().join("llm").join(name)
}

/// `got` against `want` within `tol`, relative where |want| > 1.
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: value count");
    let (worst, at) = (got.iter().zip(want).enumerate())
        .map(|(i, (&g, &w))| ((f64::from(g) - w).abs() / w.abs().max(1.0), i))
        .fold(
            (0.0f64, 0),
            |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a },
        );
    assert!(
        worst <= tol,
        "{what}: error {worst:.3e} > {tol:e} at {at} (got {}, expected {})",
        got[at],
        want[at]
    );
}

fn widen(xs: &[f32]) -> Vec<f64> {
    xs.iter().map(|&x| f64::from(x)).collect()
}

#[test]
fn logits_and_attentions_match_transformers() {
    for name in FAMILIES {
        let model = Model::load(&dir(name)).unwrap();
        let g = Golden::read(&dir(name).join("expected.safetensors"));
        let texts = g.meta["texts"].as_array().unwrap();
        for (n, text) in texts.iter().enumerate() {
            let enc = model.encode(text.as_str().unwrap(), None).unwrap();
            assert_eq!(enc.ids, g.ids(&format!("ids{n}")), "{name} text {n}: ids");
            let options = RunOptions {
                attentions: true,
                ..RunOptions::default()
            };
            let out = model.forward(&enc, &options).unwrap();
            let what = format!("{name} text {n}");
            assert_close(
                &format!("{what}: logits"),
                out.logits.as_ref().unwrap(),
                &g.tensor(&format!("logits{n}")).1,
                1e-4,
            );
            assert_close(
                &format!("{what}: attentions"),
                out.attentions.as_ref().unwrap(),
                &g.tensor(&format!("attentions{n}")).1,
                1e-4,
            );
        }
    }
}

/// Max |a − b| / max(1, |b|).
fn worst(a: &[f64], b: &[f64]) -> f64 {
    (a.iter().zip(b))
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f64::max)
}

#[test]
fn half_weights_on_amx_tiles_match_transformers() {
    if !attn_core::Bf16x3Weight::available() {
        println!(
            "note: this CPU has no AMX tiles: the 16-bit weights were checked on f32 GEMMs only"
        );
        return;
    }
    for (name, _) in HALF {
        let g = Golden::read(&dir(name).join("expected.safetensors"));
        let text = g.meta["texts"][1].as_str().unwrap();
        let logits = |kernel| {
            let mut model = Model::load(&dir(name)).unwrap();
            model.set_gemm_kernel(kernel);
            let out = model.forward(&model.encode(text, None).unwrap(), &RunOptions::default());
            out.unwrap().logits.unwrap()
        };
        let tiles = logits(attn_models::GemmKernel::Bf16x3);
        assert_ne!(
            tiles,
            logits(attn_models::GemmKernel::F32),
            "{name}: tiles ran"
        );
        // bf16x3 keeps 2⁻¹⁶ of each product: 1e-3 after two layers, as for f32 weights.
        assert_close(
            &format!("{name} on tiles: logits"),
            &tiles,
            &g.tensor("logits1").1,
            1e-3,
        );
    }
}

#[test]
fn half_weights_are_as_far_from_a_half_pass_as_f32_is() {
    for (name, low) in HALF {
        let model = Model::load(&dir(name)).unwrap();
        let g = Golden::read(&dir(name).join("expected.safetensors"));
        let text = g.meta["texts"][0].as_str().unwrap();
        let out = model.forward(&model.encode(text, None).unwrap(), &RunOptions::default());
        let ours = widen(out.unwrap().logits.as_ref().unwrap());
        let (exact, low) = (&g.tensor("logits0").1, &g.tensor(low).1);
        // transformers in 16 bits rounds every activation: its gap to the exact pass is the
        // dtype's, and ours (exact products of the stored weights) is the same gap.
        let (gap, ours_gap) = (worst(exact, low), worst(&ours, low));
        println!(
            "{name}: transformers' 16-bit pass is {gap:.2e} from its f32 pass, {ours_gap:.2e} from ours"
        );
        assert!(gap > 1e-4, "{name}: the 16-bit pass should round visibly");
        assert!(
            ours_gap <= gap + 1e-4,
            "{name}: {ours_gap:e} > {gap:e} + 1e-4"
        );
    }
}

#[test]
fn attention_rows_are_the_rows_of_every_attention() {
    let text = "The cat that ate the mouse that lived in the barn ran away";
    let dirs = FAMILIES.map(dir);
    for dir in dirs.iter().chain([&golden_dir().join("tiny-gpt2")]) {
        let model = Model::load(dir).unwrap();
        let enc = model.encode(text, None).unwrap();
        let t = enc.len();
        let options = RunOptions {
            attentions: true,
            ..RunOptions::default()
        };
        let all = model.forward(&enc, &options).unwrap().attentions.unwrap();
        let rows = [0, t / 2, t - 1];
        let got = model.attention_rows(&enc, &rows).unwrap();
        let want: Vec<f64> = (all.chunks_exact(t * t))
            .flat_map(|head| rows.iter().flat_map(move |&i| &head[i * t..(i + 1) * t]))
            .map(|&w| f64::from(w))
            .collect();
        assert_close(
            &format!("{}: rows {rows:?}", dir.display()),
            &got,
            &want,
            1e-6,
        );
        for (bad, says) in [
            (vec![3, 1], "row 1 follows row 3"),
            (vec![t], "past the text's"),
        ] {
            let err = model.attention_rows(&enc, &bad).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
        }
    }
}

#[test]
fn mistral_attends_within_its_window() {
    let model = Model::load(&dir("mistral")).unwrap();
    let enc = model
        .encode(
            "The cat that ate the mouse that lived in the barn ran away",
            None,
        )
        .unwrap();
    let t = enc.len();
    assert!(t > 5, "the text is longer than the window of 5");
    let options = RunOptions {
        attentions: true,
        ..RunOptions::default()
    };
    let w = model.forward(&enc, &options).unwrap().attentions.unwrap();
    for (k, &x) in w.iter().enumerate() {
        let (i, j) = (k / t % t, k % t);
        if j > i || i - j >= 5 {
            assert_eq!(x, 0.0, "query {i} sees key {j}");
        }
    }
}

#[test]
fn greedy_generation_matches_transformers() {
    for name in FAMILIES {
        let model = Model::load(&dir(name)).unwrap();
        let g = Golden::read(&dir(name).join("expected.safetensors"));
        let text = g.meta["texts"][0].as_str().unwrap();
        let want = g.ids("generated");
        assert_eq!(want.len(), 32);
        let options = GenerateOptions {
            max_new_tokens: want.len(),
            sampling: Sampling::Greedy,
            attention: false,
        };
        let got = generate(&model, text, &options).unwrap();
        assert_eq!(got.ids, want, "{name}");
    }
}

#[test]
fn cached_decoding_matches_the_full_pass_at_every_prefix() {
    for name in FAMILIES {
        let model = Model::load(&dir(name)).unwrap();
        let enc = model
            .encode(
                "The cat that ate the mouse that lived in the barn ran away",
                None,
            )
            .unwrap();
        let t = enc.len();
        let full = model.forward(&enc, &RunOptions::default()).unwrap();
        let full = full.logits.unwrap();
        let vocab = full.len() / t;
        let mut cache = KvCache::new(&model).unwrap();
        let last = cache.feed_last(&enc.ids, false).unwrap().logits;
        let want = widen(&full[(t - 1) * vocab..]);
        assert_close(&format!("{name}: feed_last"), &last, &want, 1e-5);
        for prefix in 1..=t {
            let mut cache = KvCache::new(&model).unwrap();
            let mut logits = cache.feed(&enc.ids[..prefix], false).unwrap().logits;
            for &id in &enc.ids[prefix..] {
                logits.extend(cache.feed(&[id], false).unwrap().logits);
            }
            assert_close(
                &format!("{name}: prefix {prefix}"),
                &logits,
                &widen(&full),
                1e-4,
            );
        }
    }
}

/// A change to a config.json.
type ConfigEdit = fn(&mut serde_json::Value);

/// A copy of the llama checkpoint with `edit` applied to its config.json.
fn with_config(tmp: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let out = tmp.join("model");
    std::fs::create_dir_all(&out).unwrap();
    for file in std::fs::read_dir(dir("llama")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, out.join(file.file_name().unwrap())).unwrap();
    }
    let path = out.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    out
}

#[test]
fn bad_configs_are_clear_errors() {
    let cases: [(&str, ConfigEdit); 6] = [
        ("num_key_value_heads", |c| {
            c["num_key_value_heads"] = 3.into()
        }),
        ("num_attention_heads", |c| {
            c["num_attention_heads"] = 5.into()
        }),
        ("rope_scaling", |c| {
            c["rope_scaling"]["rope_type"] = "yarn".into()
        }),
        ("head_dim", |c| c["head_dim"] = 7.into()),
        ("hidden_act", |c| c["hidden_act"] = "gelu".into()),
        ("rope_theta", |c| c["rope_theta"] = (-1.0).into()),
    ];
    for (field, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let err = match Model::load(&with_config(tmp.path(), edit)) {
            Ok(_) => panic!("{field}: loaded"),
            Err(err) => err,
        };
        let text = format!("{err:#}");
        assert!(text.contains(field), "{field}: {text}");
        assert!(
            matches!(err, ModelError::InvalidConfig { .. }),
            "{field}: {err:?}"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let err = Model::load(&with_config(tmp.path(), |c| {
        c["model_type"] = "falcon".into()
    }))
    .err()
    .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("falcon") && text.contains("llama, mistral, qwen2"),
        "{text}"
    );
}

#[test]
fn the_gradient_methods_say_which_families_have_them() {
    let model = Model::load(&dir("llama")).unwrap();
    let enc = model.encode("The cat sat", None).unwrap();
    let err = model.contributions(&enc).err().unwrap();
    assert!(
        err.to_string()
            .contains("not available for llama models yet; it runs on BERT"),
        "{err}"
    );
}

/// The llama checkpoint written as two shards with `model.safetensors.index.json` (its tensors
/// split in name order), after `edit` has had its say over the index and the shards' bytes.
fn sharded(tmp: &Path, edit: impl FnOnce(&mut serde_json::Value, &mut [Vec<u8>; 2])) -> PathBuf {
    let out = tmp.join("sharded");
    std::fs::create_dir_all(&out).unwrap();
    for file in std::fs::read_dir(dir("llama")).unwrap() {
        let file = file.unwrap().path();
        if file.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&file, out.join(file.file_name().unwrap())).unwrap();
        }
    }
    let bytes = std::fs::read(dir("llama").join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    let half = names.len() / 2;
    let files = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut weight_map = serde_json::Map::new();
    let mut shards = [Vec::new(), Vec::new()];
    for (n, part) in [&names[..half], &names[half..]].into_iter().enumerate() {
        let views: Vec<(String, safetensors::tensor::TensorView)> = part
            .iter()
            .map(|name| ((*name).to_string(), st.tensor(name).unwrap()))
            .collect();
        shards[n] = safetensors::serialize(views, None).unwrap();
        for name in part {
            weight_map.insert((*name).to_string(), files[n].into());
        }
    }
    let mut index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    edit(&mut index, &mut shards);
    for (file, shard) in files.iter().zip(&shards) {
        std::fs::write(out.join(file), shard).unwrap();
    }
    std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
    out
}

#[test]
fn sharded_weights_load_as_one_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let model = Model::load(&sharded(tmp.path(), |_, _| {})).unwrap();
    let single = Model::load(&dir("llama")).unwrap();
    let enc = single.encode("The cat sat on the mat", None).unwrap();
    let got = model.forward(&enc, &RunOptions::default()).unwrap();
    let want = single.forward(&enc, &RunOptions::default()).unwrap();
    assert_eq!(got.logits, want.logits);
}

#[test]
fn a_bad_shard_index_is_a_clear_error() {
    let first = "model-00001-of-00002.safetensors";
    let cases: [(&str, ShardEdit); 5] = [
        ("model-00003-of-00002.safetensors", |index, _| {
            index["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors".into();
        }),
        ("../model.safetensors", |index, _| {
            index["weight_map"]["lm_head.weight"] = "../model.safetensors".into();
        }),
        ("which does not hold it", |index, _| {
            index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors".into();
        }),
        ("is in both", |_, shards| shards[1] = shards[0].clone()),
        ("outside the", |_, shards| {
            // The second shard's header claims more data than the file holds.
            let n = shards[1].len();
            shards[1].truncate(n - 4);
        }),
    ];
    for (needle, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let err = Model::load(&sharded(tmp.path(), edit)).err().unwrap();
        let text = format!("{err:#}");
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // A tensor named twice: the index's JSON repeats the key.
    let tmp = tempfile::tempdir().unwrap();
    let path = sharded(tmp.path(), |_, _| {});
    let index = path.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap().replacen(
        "\"weight_map\":{",
        &format!("\"weight_map\":{{\"lm_head.weight\":\"{first}\","),
        1,
    );
    std::fs::write(&index, text).unwrap();
    let err = Model::load(&path).err().unwrap().to_string();
    assert!(
        err.contains("names tensor \"lm_head.weight\" twice"),
        "{err}"
    );
}

/// A change to a shard index and the shards' bytes.
type ShardEdit = fn(&mut serde_json::Value, &mut [Vec<u8>; 2]);

#[test]
fn chat_tokens_from_tokenizer_config_match_transformers() {
    use attn_models::TextTokenizer;
    let dir = dir("chat-tokenizer");
    let plain = TextTokenizer::from_file(&dir.join("tokenizer.json"), 128).unwrap();
    assert_eq!(
        plain.token_id("<|im_start|>"),
        None,
        "tokenizer.json alone lacks them"
    );
    let tokenizer = TextTokenizer::from_dir(&dir, 128).unwrap();
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let special: Vec<u64> = (expected["special_ids"].as_array().unwrap().iter())
        .map(|id| id.as_u64().unwrap())
        .collect();
    let texts = expected["texts"].as_array().unwrap();
    for (text, ids) in texts.iter().zip(expected["ids"].as_array().unwrap()) {
        let text = text.as_str().unwrap();
        let want: Vec<u32> = (ids.as_array().unwrap().iter())
            .map(|id| id.as_u64().unwrap() as u32)
            .collect();
        let enc = tokenizer.encode(text, None, false).unwrap();
        assert_eq!(enc.ids, want, "{text:?}");
        for &id in &enc.ids {
            let is = special.contains(&u64::from(id));
            assert_eq!(tokenizer.is_special(id), is, "{text:?}: id {id}");
        }
    }
    // An added token whose id tokenizer.json would not give it.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.join("tokenizer.json"),
        tmp.path().join("tokenizer.json"),
    )
    .unwrap();
    let config = std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap();
    let config = config.replace("\"302\"", "\"303\"");
    std::fs::write(tmp.path().join("tokenizer_config.json"), config).unwrap();
    let err = TextTokenizer::from_dir(tmp.path(), 128)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("gives \"zzq\" id 303, and tokenizer.json gives it id 302"),
        "{err}"
    );
}
