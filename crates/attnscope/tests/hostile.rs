//! Every command against hostile input: broken model directories, broken weight files, bad
//! text files, out-of-range flags, malformed saved maps and attention cases. Each must end with
//! exit status 1 (a usage error too), an `error:` line naming what was wrong, no panic, and
//! no existing output file touched.
//!
//! The test prints one table row per case (`| command | hostile input | exit | first line |`);
//! `scripts/reliability.sh` collects them into the reliability table.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `tests/data`, the reference files in the repository.
fn golden() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data"))
}

fn tiny_gpt2() -> PathBuf {
    golden().join("tiny-gpt2")
}

fn attnscope(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(args)
        // Never the real cache: a command that wanted the default model would fail here
        // instead of fetching it.
        .env("ATTNSCOPE_CACHE", "/nonexistent/attnscope-cache")
        .env("NO_COLOR", "1")
        .output()
        .expect("running attnscope")
}

/// One hostile invocation and what its error must say.
struct Case {
    command: &'static str,
    input: String,
    args: Vec<String>,
    exit: i32,
    /// Fragments the error must contain (case-insensitive).
    needles: Vec<&'static str>,
}

fn case(command: &'static str, input: &str, args: &[&str], needles: &[&'static str]) -> Case {
    let mut all = vec![command.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    Case {
        command,
        input: input.to_string(),
        args: all,
        exit: 1,
        needles: needles.to_vec(),
    }
}

/// A usage error: clap's message, whose `error:` line is the first of several, exit status 1
/// as for any bad input.
fn usage(command: &'static str, input: &str, args: &[&str], needles: &[&'static str]) -> Case {
    case(command, input, args, needles)
}

/// A copy of tiny-gpt2 in `root/name` with `edit` applied to its files.
fn model_dir(root: &Path, name: &str, edit: impl FnOnce(&Path)) -> String {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny_gpt2().join(file), dir.join(file)).unwrap();
    }
    edit(&dir);
    dir.to_str().unwrap().to_string()
}

/// tiny-gpt2's config with `field` set to `value` (JSON).
fn config_with(dir: &Path, field: &str, value: &str) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config[field] = serde_json::from_str(value).unwrap();
    std::fs::write(path, config.to_string()).unwrap();
}

fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_string()
}

/// A safetensors file from a header and data.
fn safetensors(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// An attention case with q, k, v of shape `dims` filled with `fill`, and `metadata`.
fn sdpa_case(dims: &str, numel: usize, fill: f32, metadata: &str) -> Vec<u8> {
    let bytes: Vec<u8> = (0..numel).flat_map(|_| fill.to_le_bytes()).collect();
    let n = bytes.len();
    let header = format!(
        r#"{{"__metadata__":{metadata},"q":{{"dtype":"F32","shape":{dims},"data_offsets":[0,{n}]}},"k":{{"dtype":"F32","shape":{dims},"data_offsets":[{n},{}]}},"v":{{"dtype":"F32","shape":{dims},"data_offsets":[{},{}]}}}}"#,
        2 * n,
        2 * n,
        3 * n
    );
    safetensors(&header, &bytes.repeat(3))
}

fn maps_json(n_layers: usize, n_heads: usize, weights: &str) -> String {
    format!(
        r#"{{"model":"m","text":"a b","pair":null,"tokens":[{{"text":"a","id":0,"span":[0,1],"segment":0,"special":false}},{{"text":"b","id":1,"span":[2,3],"segment":0,"special":false}}],"n_layers":{n_layers},"n_heads":{n_heads},"weights":{weights}}}"#
    )
}

fn cases(root: &Path) -> Vec<Case> {
    let tiny = tiny_gpt2();
    let tiny = tiny.to_str().unwrap();
    let out = |name: &str| root.join(name).to_str().unwrap().to_string();

    // Broken model directories: every command that loads a model shares the loader, and each
    // command is tried with at least two of them.
    let missing = out("no-such-model");
    let not_json = model_dir(root, "config-not-json", |d| {
        write(d, "config.json", "{ \"model_type\": ");
    });
    let falcon = model_dir(root, "falcon", |d| {
        config_with(d, "model_type", "\"falcon\"")
    });
    let indivisible = model_dir(root, "indivisible", |d| config_with(d, "n_embd", "30"));
    let wider = model_dir(root, "wider-than-weights", |d| {
        config_with(d, "n_embd", "64")
    });
    let zero_positions = model_dir(root, "zero-positions", |d| {
        config_with(d, "n_positions", "0")
    });
    let huge_vocab = model_dir(root, "huge-vocab", |d| {
        config_with(d, "vocab_size", "1000000000000000")
    });
    // n_inner is null: 4 · n_embd, which the error must trace back to n_embd.
    let huge_embd = model_dir(root, "huge-embd", |d| {
        config_with(d, "n_embd", "1000000000")
    });
    let config_file = format!("{}/config.json", model_dir(root, "as-file", |_| ()));
    let fewer_layers = model_dir(root, "fewer-layers", |d| config_with(d, "n_layer", "1"));
    let negative_eps = model_dir(root, "negative-eps", |d| {
        config_with(d, "layer_norm_epsilon", "-1e-5")
    });
    let truncated = model_dir(root, "truncated-weights", |d| {
        let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
        write(d, "model.safetensors", &bytes[..bytes.len() / 2]);
    });
    let header_past_end = model_dir(root, "header-past-end", |d| {
        write(d, "model.safetensors", [0xff; 64]);
    });
    let empty_weights = model_dir(root, "empty-weights", |d| {
        write(d, "model.safetensors", []);
    });
    let weights_dir = model_dir(root, "weights-are-a-directory", |d| {
        std::fs::remove_file(d.join("model.safetensors")).unwrap();
        std::fs::create_dir(d.join("model.safetensors")).unwrap();
    });
    let overlapping = model_dir(root, "overlapping-tensors", |d| {
        let header = r#"{"wte.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"wpe.weight":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
        write(d, "model.safetensors", safetensors(header, &[0; 12]));
    });
    let overflowing = model_dir(root, "overflowing-shape", |d| {
        let header = r#"{"wte.weight":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}}"#;
        write(d, "model.safetensors", safetensors(header, &[0; 16]));
    });
    let bad_tokenizer = model_dir(root, "bad-tokenizer", |d| {
        write(d, "tokenizer.json", "[1, 2, 3]");
    });
    let no_tokenizer = model_dir(root, "no-tokenizer", |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap();
    });
    let more_layers = model_dir(root, "more-layers", |d| config_with(d, "n_layer", "7"));
    let both_names = model_dir(root, "head-count-twice", |d| {
        config_with(d, "num_attention_heads", "8")
    });
    let ragged_tokenizer = model_dir(root, "special-token-two-ids", |d| {
        let path = d.join("tokenizer.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        json["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0, 1], "tokens": ["<s>"]}}
        });
        std::fs::write(&path, json.to_string()).unwrap();
    });
    #[cfg(unix)]
    let dangling_modules = model_dir(root, "dangling-modules", |d| {
        std::os::unix::fs::symlink("nowhere.json", d.join("modules.json")).unwrap();
    });
    let bad_modules = model_dir(root, "bad-modules", |d| {
        write(
            d,
            "modules.json",
            r#"[{"path": "1_Pooling", "type": "Pooling"}]"#,
        );
    });

    // Text files and saved maps.
    let latin1 = write(root, "latin1.txt", b"caf\xe9 cr\xe8me");
    let empty_text = write(root, "empty.txt", "");
    let long_text = write(root, "long.txt", "the cat sat on the mat ".repeat(40));
    // More than 4 words per position: refused before it is tokenized.
    let longer_text = write(root, "longer.txt", "cat ".repeat(300));
    let maps_not_json = write(root, "maps-not-json.json", "[");
    let maps_short = write(root, "maps-short.json", maps_json(1, 1, "[0.5, 0.5, 1.0]"));
    let maps_negative = write(
        root,
        "maps-negative.json",
        maps_json(1, 1, "[1.5, -0.5, 0.0, 1.0]"),
    );
    let maps_no_heads = write(root, "maps-no-heads.json", maps_json(0, 1, "[]"));
    let maps_not_softmax = write(
        root,
        "maps-not-softmax.json",
        maps_json(1, 1, "[2.0, 2.0, 2.0, 2.0]"),
    );
    let maps_overflow = write(
        root,
        "maps-overflow.json",
        maps_json(usize::MAX, 2, "[1.0, 0.0, 0.0, 1.0]"),
    );
    let maps_span = write(
        root,
        "maps-span.json",
        maps_json(1, 1, "[1.0, 0.0, 0.0, 1.0]").replace("[2,3]", "[5,100]"),
    );
    let maps_segment = write(
        root,
        "maps-segment.json",
        maps_json(1, 1, "[1.0, 0.0, 0.0, 1.0]").replace(
            "\"segment\":0,\"special\":false}]",
            "\"segment\":7,\"special\":false}]",
        ),
    );
    let entries_bad = write(root, "entries.txt", "no equals sign here\n");

    // Attention cases.
    let case_empty = write(root, "case-empty.safetensors", []);
    let case_header = write(root, "case-header.safetensors", [0xff; 16]);
    let case_rank3 = write(
        root,
        "case-rank3.safetensors",
        sdpa_case("[1,2,2]", 4, 0.5, "{}"),
    );
    let case_nan = write(
        root,
        "case-nan.safetensors",
        sdpa_case("[1,1,2,2]", 4, f32::NAN, "{}"),
    );
    let case_inf = write(
        root,
        "case-inf.safetensors",
        sdpa_case("[1,1,2,2]", 4, f32::INFINITY, "{}"),
    );
    let case_causal = write(
        root,
        "case-causal.safetensors",
        sdpa_case("[1,1,2,2]", 4, 0.5, r#"{"causal":"\"diagonal\""}"#),
    );
    let case_meta = write(
        root,
        "case-meta.safetensors",
        sdpa_case("[1,1,2,2]", 4, 0.5, r#"{"sacle":"0.5"}"#),
    );
    let case_scale = write(
        root,
        "case-scale.safetensors",
        sdpa_case("[1,1,2,2]", 4, 0.5, r#"{"scale":"\"big\""}"#),
    );
    let case_zero_dim = write(
        root,
        "case-zero-dim.safetensors",
        sdpa_case("[1,1,0,2]", 0, 0.5, "{}"),
    );
    let case_trillion = write(
        root,
        "case-trillion.safetensors",
        sdpa_case("[1,1,1000000000000,0]", 0, 0.5, "{}"),
    );
    let case_empty_head = write(
        root,
        "case-empty-head.safetensors",
        sdpa_case("[1,1,1048576,0]", 0, 0.5, r#"{"scale":"1.0"}"#),
    );
    let case_fifo = root.join("case-fifo.safetensors");
    let made = std::process::Command::new("mkfifo")
        .arg(&case_fifo)
        .status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "mkfifo {}",
        case_fifo.display()
    );
    let case_fifo = case_fifo.to_str().unwrap().to_string();
    let case_linked = root.join("case-linked.safetensors");
    std::fs::hard_link(&case_rank3, &case_linked).unwrap();
    let case_linked = case_linked.to_str().unwrap().to_string();
    let four = |fill: f32| -> Vec<u8> { (0..4).flat_map(|_| fill.to_le_bytes()).collect() };
    let tensor = |name: &str, dtype: &str, at: usize, len: usize| {
        format!(
            r#""{name}":{{"dtype":"{dtype}","shape":[1,1,2,2],"data_offsets":[{at},{}]}}"#,
            at + len
        )
    };
    let case_twice_q = write(
        root,
        "case-twice-q.safetensors",
        safetensors(
            &format!(
                "{{{},{},{},{}}}",
                tensor("q", "F32", 0, 16),
                tensor("k", "F32", 16, 16),
                tensor("v", "F32", 32, 16),
                tensor("q", "F32", 0, 16)
            ),
            &four(0.5).repeat(3),
        ),
    );
    let case_twice_scale = write(
        root,
        "case-twice-scale.safetensors",
        sdpa_case("[1,1,2,2]", 4, 0.5, r#"{"scale":"1.0","scale":"2.0"}"#),
    );
    let bf16_half = 0x3f00u16.to_le_bytes().repeat(4);
    let case_bf16_grad = write(
        root,
        "case-bf16-grad.safetensors",
        safetensors(
            &format!(
                "{{{},{},{},{},{}}}",
                tensor("q", "F32", 0, 16),
                tensor("k", "F32", 16, 16),
                tensor("v", "F32", 32, 16),
                tensor("dout", "F32", 48, 16),
                tensor("expected_dq", "BF16", 64, 8)
            ),
            &[four(0.5).repeat(4), bf16_half].concat(),
        ),
    );
    let walk_bad = write(
        root,
        "walk.json",
        r#"{"x": [[1, 2], [3]], "w_q": [], "w_k": [], "w_v": []}"#,
    );
    let walk_escape = write(
        root,
        "walk-escape.json",
        r#"{"words": ["a\u001b[2J"], "x": [[1, 2]], "w_q": [[1],[1]], "w_k": [[1],[1]], "w_v": [[1],[1]]}"#,
    );
    let walk_nan = write(
        root,
        "walk-nan.json",
        r#"{"x": [[1e39, 2]], "w_q": [[1],[1]], "w_k": [[1],[1]], "w_v": [[1],[1]]}"#,
    );
    let out_png = out("out.png");
    let out_html = out("out.html");
    let out_st = out("out.safetensors");
    let no_dir_png = out("no/such/dir/out.png");

    let mut cases = Vec::new();
    for (input, dir, needles) in [
        ("model dir does not exist", &missing, &["no-such-model"][..]),
        ("config.json not JSON", &not_json, &["config.json"]),
        ("model_type falcon", &falcon, &["falcon"]),
        ("n_embd 30 with 4 heads", &indivisible, &["n_embd", "30"]),
        ("config wider than the weights", &wider, &["shape"]),
        ("n_positions 0", &zero_positions, &["n_positions"]),
        ("vocab_size 1e15", &huge_vocab, &["vocab_size"]),
        ("n_embd 1e9", &huge_embd, &["n_embd 1000000000"]),
        (
            "config.json sets 1 layer of the checkpoint's 2",
            &fewer_layers,
            &["h.1.ln_2.weight", "past the 1"],
        ),
        (
            "--model names config.json, not its folder",
            &config_file,
            &["config.json", "is a file, not a model directory"],
        ),
        ("layer_norm_epsilon < 0", &negative_eps, &["layer_norm_eps"]),
        ("weights truncated", &truncated, &["model.safetensors"]),
        (
            "weights header length past EOF",
            &header_past_end,
            &["header"],
        ),
        ("weights file empty", &empty_weights, &["model.safetensors"]),
        (
            "weights path is a directory",
            &weights_dir,
            &["model.safetensors", "a directory, not a regular file"],
        ),
        (
            "overlapping tensor ranges",
            &overlapping,
            &["model.safetensors"],
        ),
        ("tensor shape overflows", &overflowing, &["wte.weight"]),
        (
            "tokenizer.json not a tokenizer",
            &bad_tokenizer,
            &["tokenizer"],
        ),
        ("tokenizer.json missing", &no_tokenizer, &["tokenizer.json"]),
        (
            "modules.json names a missing pooling config",
            &bad_modules,
            &["config.json"],
        ),
        (
            "config.json sets 7 layers of the checkpoint's 2",
            &more_layers,
            &["sets 7 layers", "no tensor of layer 2"],
        ),
        (
            "n_head and its alias num_attention_heads both set",
            &both_names,
            &["n_head: set twice, as n_head (4) and as its alias num_attention_heads (8)"],
        ),
        (
            "a special token of 2 ids and 1 token",
            &ragged_tokenizer,
            &["tokenizer.json gives", "as many tokens as ids"],
        ),
        #[cfg(unix)]
        (
            "modules.json a link to nothing",
            &dangling_modules,
            &[
                "modules.json",
                "a symbolic link whose target does not exist",
            ],
        ),
    ] {
        cases.push(case(
            "attention",
            input,
            &["hello", "--model", dir],
            needles,
        ));
    }
    for (input, dir, needles) in [
        ("config wider than the weights", &wider, &["shape"][..]),
        ("weights truncated", &truncated, &["model.safetensors"]),
    ] {
        cases.push(case("embed", input, &["hello", "--model", dir], needles));
        cases.push(case("explain", input, &["hello", "--model", dir], needles));
        cases.push(case("heads", input, &["hello", "--model", dir], needles));
        cases.push(case(
            "heatmap",
            input,
            &["hello", "--model", dir, "-o", &out_png],
            needles,
        ));
        cases.push(case(
            "html",
            input,
            &["hello", "--model", dir, "-o", &out_html],
            needles,
        ));
        cases.push(case(
            "lookup",
            input,
            &["--query", "a", "--entry", "k=v", "--model", dir],
            needles,
        ));
    }

    // `bench sdpa` makes its own inputs: sizes and counts that cannot be met are refused before
    // anything is allocated or started.
    let bench = |input: &str, args: &[&str], needles: &[&'static str]| {
        let mut all = vec!["sdpa", "--heads", "1"];
        all.extend(args);
        case("bench", input, &all, needles)
    };
    cases.extend([
        bench(
            "inputs and outputs of 1.5 TiB",
            &["--seq", "100000000", "--batch", "8", "--head-dim", "128"],
            &["--seq 100000000", "GiB", "this machine has"],
        ),
        bench(
            "--head-dim usize::MAX",
            &["--seq", "1", "--head-dim", "18446744073709551615"],
            &["--head-dim 18446744073709551615", "this machine has"],
        ),
        bench(
            "--seq usize::MAX",
            &["--seq", "18446744073709551615", "--head-dim", "8"],
            &["--seq 18446744073709551615", "this machine has"],
        ),
        bench(
            "--seq and --head-dim usize::MAX, a float mask",
            &[
                "--seq",
                "18446744073709551615",
                "--head-dim",
                "18446744073709551615",
                "--mask",
                "float",
            ],
            &["--seq 18446744073709551615", "this machine has"],
        ),
        bench(
            "--reps usize::MAX",
            &[
                "--seq",
                "8",
                "--head-dim",
                "8",
                "--reps",
                "18446744073709551615",
            ],
            &["--reps", "1000000"],
        ),
        bench(
            "--threads 10000",
            &["--seq", "8", "--head-dim", "8", "--threads", "10000"],
            &["--threads", "1024"],
        ),
    ]);
    // The model benchmarks check their counts before loading anything: a count past what can
    // be kept aborted allocating (`bench embed --sentences`/`--reps` 10^14), and a thread count
    // of 100000 (every model command) spent minutes starting threads.
    cases.extend([
        case(
            "bench",
            "embed --sentences 10^14",
            &["embed", "--sentences", "100000000000000"],
            &["--sentences", "1000000"],
        ),
        case(
            "bench",
            "embed --reps 10^14",
            &["embed", "--reps", "100000000000000"],
            &["--reps", "1000000"],
        ),
        // prompt + new tokens − 1 overflowed: a nonsense capacity in release builds, a panic in
        // debug ones.
        case(
            "bench",
            "generate --max-new-tokens usize::MAX",
            &[
                "generate",
                "--model",
                tiny,
                "--max-new-tokens",
                "18446744073709551615",
            ],
            &["18446744073709551615 are needed", "64 positions"],
        ),
        case(
            "bench",
            "generate --reps 10^14",
            &["generate", "--model", tiny, "--reps", "100000000000000"],
            &["--reps", "1000000"],
        ),
        case(
            "bench",
            "embed --threads 100000",
            &["embed", "--threads", "100000"],
            &["threads", "1024"],
        ),
        case(
            "embed",
            "--threads 100000",
            &["a text", "--threads", "100000"],
            &["threads", "1024"],
        ),
    ]);
    cases.extend([
        case(
            "attention",
            "empty text",
            &["", "--model", tiny],
            &["empty"],
        ),
        case(
            "attention",
            "text over 64 tokens",
            &["--file", &long_text, "--model", tiny],
            &["64"],
        ),
        case(
            "attention",
            "text of 300 words for 64 positions",
            &["--file", &longer_text, "--model", tiny],
            &["300 words", "64 positions"],
        ),
        case(
            "attention",
            "Latin-1 file (invalid UTF-8)",
            &["--file", &latin1, "--model", tiny],
            &["UTF-8"],
        ),
        case(
            "attention",
            "empty file",
            &["--file", &empty_text, "--model", tiny],
            &["empty"],
        ),
        case(
            "attention",
            "file does not exist",
            &["--file", &out("nope.txt"), "--model", tiny],
            &["nope.txt"],
        ),
        case(
            "attention",
            "file is a directory",
            &["--file", root.to_str().unwrap(), "--model", tiny],
            &["directory"],
        ),
        case(
            "attention",
            "--layer 99",
            &["hi", "--model", tiny, "--layer", "99"],
            &["layer", "99"],
        ),
        case(
            "attention",
            "--head 99",
            &["hi", "--model", tiny, "--layer", "0", "--head", "99"],
            &["head", "99"],
        ),
        case(
            "attention",
            "--threads 0",
            &["hi", "--model", tiny, "--threads", "0"],
            &["threads"],
        ),
        usage(
            "attention",
            "--layer -1",
            &["hi", "--model", tiny, "--layer", "-1"],
            &["-1"],
        ),
        // The JSON holds every layer and head: a --layer or --head beside it was ignored.
        usage(
            "attention",
            "--json --layer 0",
            &["hi", "--model", tiny, "--json", "--layer", "0"],
            &["--layer", "cannot be used"],
        ),
        case(
            "embed",
            "empty text among texts",
            &["a", "", "--model", tiny],
            &["empty"],
        ),
        case(
            "embed",
            "Latin-1 file",
            &["--file", &latin1, "--model", tiny],
            &["UTF-8"],
        ),
        // Endless input: read up to the limit, not until memory runs out.
        case(
            "embed",
            "--file /dev/zero",
            &["--file", "/dev/zero", "--model", tiny],
            &["/dev/zero", "64 MiB"],
        ),
        case(
            "walkthrough",
            "--file /dev/zero",
            &["--file", "/dev/zero"],
            &["/dev/zero", "64 MiB"],
        ),
        case(
            "sdpa",
            "case /dev/zero",
            &["/dev/zero", "-o", &out_st],
            &["/dev/zero", "not a regular file"],
        ),
        case(
            "explain",
            "--focus not in the text",
            &["the cat", "--model", tiny, "--focus", "dog"],
            &["dog"],
        ),
        case(
            "explain",
            "--layer 2 of 2",
            &["the cat", "--model", tiny, "--layer", "2"],
            &["--layer 2 is out of range: this model's layers are 0..=1"],
        ),
        usage(
            "explain",
            "--top 0",
            &["the cat", "--model", tiny, "--top", "0"],
            &["--top"],
        ),
        case(
            "explain",
            "maps not JSON",
            &["--maps", &maps_not_json],
            &["maps-not-json.json"],
        ),
        case(
            "explain",
            "maps weights too short",
            &["--maps", &maps_short],
            &["maps-short.json"],
        ),
        case(
            "explain",
            "maps negative weight",
            &["--maps", &maps_negative],
            &["-0.5"],
        ),
        case(
            "explain",
            "maps 0 layers",
            &["--maps", &maps_no_heads],
            &["maps-no-heads.json"],
        ),
        case(
            "explain",
            "maps n_layers usize::MAX",
            &["--maps", &maps_overflow],
            &["maps-overflow.json"],
        ),
        case(
            "heads",
            "maps weights too short",
            &["--maps", &maps_short],
            &["maps-short.json"],
        ),
        case(
            "heads",
            "maps negative weight",
            &["--maps", &maps_negative],
            &["-0.5"],
        ),
        // Every view refuses them, naming the file (`explain` and `heatmap` did, without it;
        // `heads` and `html` took them).
        case(
            "heads",
            "maps token span past its text",
            &["--maps", &maps_span],
            &["maps-span.json", "token 1 has span 5..100"],
        ),
        case(
            "html",
            "maps token of segment 7",
            &["--maps", &maps_segment, "-o", &out_html],
            &["maps-segment.json", "segment 7"],
        ),
        case(
            "explain",
            "maps token span past its text",
            &["--maps", &maps_span],
            &["maps-span.json", "token 1 has span 5..100"],
        ),
        case(
            "heads",
            "maps rows summing to 4",
            &["--maps", &maps_not_softmax],
            &["maps-not-softmax.json", "sum to 4"],
        ),
        case(
            "heatmap",
            "unknown image extension",
            &["the cat", "--model", tiny, "-o", &out("x.bmp")],
            &["bmp"],
        ),
        case(
            "heatmap",
            "--head 4 of 4",
            &[
                "the cat",
                "--model",
                tiny,
                "--layer",
                "0",
                "--head",
                "4",
                "-o",
                &out("x.png"),
            ],
            &["--head 4 is out of range: this model's heads are 0..=3"],
        ),
        case(
            "heatmap",
            "output directory missing",
            &["the cat", "--model", tiny, "-o", &no_dir_png],
            &["no/such/dir"],
        ),
        case(
            "heatmap",
            "maps n_layers usize::MAX",
            &["--maps", &maps_overflow, "-o", &out_png],
            &["maps-overflow.json"],
        ),
        case(
            "html",
            "output directory missing",
            &["the cat", "--model", tiny, "-o", &out("no/such/dir/x.html")],
            &["no/such/dir"],
        ),
        case(
            "html",
            "--neuron-layer 5 of 2",
            &[
                "the cat",
                "--model",
                tiny,
                "-o",
                &out_html,
                "--neuron-layer",
                "5",
            ],
            &["5"],
        ),
        case(
            "html",
            "maps negative weight",
            &["--maps", &maps_negative, "-o", &out_html],
            &["-0.5"],
        ),
        case(
            "lookup",
            "--temperature 0",
            &[
                "--query",
                "a",
                "--entry",
                "k=v",
                "--model",
                tiny,
                "--temperature",
                "0",
            ],
            &["temperature"],
        ),
        case(
            "lookup",
            "--temperature NaN",
            &[
                "--query",
                "a",
                "--entry",
                "k=v",
                "--model",
                tiny,
                "--temperature",
                "NaN",
            ],
            &["temperature"],
        ),
        case(
            "lookup",
            "--entry without =",
            &["--query", "a", "--entry", "kv", "--model", tiny],
            &["kv"],
        ),
        case(
            "lookup",
            "--entries line without =",
            &["--query", "a", "--entries", &entries_bad, "--model", tiny],
            &["entries.txt"],
        ),
        case(
            "lookup",
            "one key twice",
            &[
                "--query", "a", "--entry", "cat=cat", "--entry", "cat=dog", "--model", tiny,
            ],
            &["--entry #2", "\"cat\"", "twice", "--entry #1"],
        ),
        case(
            "lookup",
            "no entries",
            &["--query", "a", "--model", tiny],
            &["entr"],
        ),
        case(
            "sdpa",
            "case file does not exist",
            &[&out("nope.safetensors"), "-o", &out_st],
            &["nope.safetensors"],
        ),
        case(
            "sdpa",
            "empty case file",
            &[&case_empty, "-o", &out_st],
            &["case-empty"],
        ),
        case(
            "sdpa",
            "-o names the case file itself",
            &[&case_empty, "-o", &case_empty],
            &["it is the case file itself"],
        ),
        case(
            "sdpa",
            "header length past EOF",
            &[&case_header, "-o", &out_st],
            &["case-header"],
        ),
        case("sdpa", "q of rank 3", &[&case_rank3, "-o", &out_st], &["q"]),
        case(
            "sdpa",
            "NaN in q",
            &[&case_nan, "-o", &out_st],
            &["q", "NaN"],
        ),
        case(
            "sdpa",
            "+inf in q",
            &[&case_inf, "-o", &out_st],
            &["q", "inf"],
        ),
        case(
            "sdpa",
            "causal \"diagonal\"",
            &[&case_causal, "-o", &out_st],
            &["causal", "diagonal"],
        ),
        case(
            "sdpa",
            "misspelt metadata key",
            &[&case_meta, "-o", &out_st],
            &["sacle"],
        ),
        case(
            "sdpa",
            "scale is a string",
            &[&case_scale, "-o", &out_st],
            &["scale"],
        ),
        case(
            "sdpa",
            "empty tensors declaring 10^12 rows",
            &[&case_trillion, "-o", &out_st],
            &["rows"],
        ),
        case(
            "sdpa",
            "empty q and k declaring 2^20 × 2^20 scores",
            &[&case_empty_head, "-o", &out_st],
            &["head_dim is 0", "1099511627776 scores"],
        ),
        case(
            "sdpa",
            "the case is a named pipe",
            &[&case_fifo, "-o", &out_st],
            &["case-fifo", "not a regular file"],
        ),
        case(
            "sdpa",
            "-o names a hard link to the case",
            &[&case_rank3, "-o", &case_linked],
            &["it is the case file itself"],
        ),
        case(
            "sdpa",
            "a tensor named twice",
            &[&case_twice_q, "-o", &out_st],
            &["tensor \"q\" twice"],
        ),
        case(
            "sdpa",
            "a metadata key named twice",
            &[&case_twice_scale, "-o", &out_st],
            &["metadata key \"scale\" twice"],
        ),
        case(
            "sdpa",
            "a BF16 expected gradient",
            &[&case_bf16_grad, "-o", &out_st, "--backward"],
            &["expected_dq is BF16", "float32"],
        ),
        case(
            "sdpa",
            "output directory missing",
            &[&case_zero_dim, "-o", &out("no/such/dir/o.safetensors")],
            &["no/such/dir"],
        ),
        case(
            "walkthrough",
            "a word with an escape sequence",
            &["--file", &walk_escape],
            &["walk-escape.json", "words[0]", "control character"],
        ),
        case(
            "walkthrough",
            "ragged x",
            &["--file", &walk_bad],
            &["walk.json"],
        ),
        case(
            "walkthrough",
            "value beyond f32",
            &["--file", &walk_nan],
            &["walk-nan.json"],
        ),
        case(
            "walkthrough",
            "--mask padding:99",
            &["--mask", "padding:99"],
            &["padding"],
        ),
        case(
            "walkthrough",
            "--mask sideways",
            &["--mask", "sideways"],
            &["sideways"],
        ),
        case(
            "walkthrough",
            "--word not in the sentence",
            &["--word", "zebra"],
            &["zebra"],
        ),
        case("mask", "causal 0 queries", &["causal", "0"], &["seq_q"]),
        usage("mask", "causal -3", &["causal", "-3"], &["-3"]),
        // Greedy decoding has nothing to seed: --seed alone was silently ignored.
        usage(
            "generate",
            "--seed without --temperature or --top-k",
            &[
                "The",
                "--model",
                tiny,
                "--max-new-tokens",
                "2",
                "--seed",
                "5",
            ],
            &["--temperature", "--top-k"],
        ),
        usage(
            "serve",
            "--host not an address",
            &["--host", "999.1.1.1", "--model", tiny],
            &["999.1.1.1"],
        ),
        case(
            "serve",
            "model dir does not exist",
            &["--port", "0", "--model", &missing],
            &["no-such-model"],
        ),
        usage(
            "serve",
            "--port 70000",
            &["--port", "70000", "--model", tiny],
            &["70000"],
        ),
        // Checked before the model is loaded (here it cannot be): not after a whole run.
        case(
            "attention",
            "--save-maps into a missing folder",
            &["hi", "--save-maps", "/nonexistent-dir/m.json"],
            &["/nonexistent-dir", "does not exist"],
        ),
        // 1e-10 s became no time at all: every connection closed before its headers came.
        usage(
            "serve",
            "--body-timeout 1e-10",
            &["--body-timeout", "1e-10", "--model", tiny],
            &["1e-10", "from 0.1"],
        ),
    ]);
    cases.extend(task_cases(root));
    cases
}

/// The task commands and `attribute`: a model without the head, bad files, bad flags.
fn task_cases(root: &Path) -> Vec<Case> {
    let heads = golden().join("heads");
    let (cls, qa, mlm) = (
        heads.join("bert-cls").to_str().unwrap().to_string(),
        heads.join("bert-qa").to_str().unwrap().to_string(),
        heads.join("bert-mlm").to_str().unwrap().to_string(),
    );
    let tiny = tiny_gpt2().to_str().unwrap().to_string();
    let blank = write(root, "blank.txt", "\n  \n\n");
    let binary = write(root, "binary.txt", [0xff, 0xfe, 0x00, 0x41]);
    let not_json = write(
        root,
        "questions.jsonl",
        "{\"question\": \"Who?\", \"context\": \"He.\"}\nnot json\n",
    );
    vec![
        case(
            "classify",
            "a masked LM (no classifier)",
            &["Hello", "--model", &mlm],
            &["sequence-classification", "BertForMaskedLM"],
        ),
        case(
            "classify",
            "an empty text",
            &["  ", "--model", &cls],
            &["empty"],
        ),
        case(
            "classify",
            "--file of blank lines",
            &["--file", &blank, "--model", &cls],
            &["no text"],
        ),
        case(
            "classify",
            "--file not UTF-8",
            &["--file", &binary, "--model", &cls],
            &["binary.txt"],
        ),
        case(
            "classify",
            "--file missing",
            &["--file", "/nonexistent/reviews.txt", "--model", &cls],
            &["/nonexistent/reviews.txt"],
        ),
        case(
            "answer",
            "a classifier (no QA head)",
            &["--question", "Who?", "--context", "He.", "--model", &cls],
            &["question-answering", "BertForSequenceClassification"],
        ),
        case(
            "answer",
            "an empty context",
            &["--question", "Who?", "--context", " ", "--model", &qa],
            &["context", "empty"],
        ),
        case(
            "answer",
            "--file with a line not JSON",
            &["--file", &not_json, "--model", &qa],
            &["line 2"],
        ),
        case(
            "predict",
            "no [MASK] in the text",
            &["The cat sat", "--model", &mlm],
            &["[MASK]"],
        ),
        usage(
            "predict",
            "--top 0",
            &["The [MASK] sat", "--model", &mlm, "--top", "0"],
            &["--top"],
        ),
        case(
            "predict",
            "a classifier (no LM head)",
            &["The [MASK] sat", "--model", &cls],
            &["BertForSequenceClassification"],
        ),
        case(
            "attribute",
            "--position past the text",
            &[
                "hi",
                "--method",
                "alti",
                "--model",
                &tiny,
                "--position",
                "99",
            ],
            &["--position 99"],
        ),
        case(
            "attribute",
            "--focus a word not in the text",
            &[
                "The cat", "--method", "norm", "--model", &tiny, "--focus", "dog",
            ],
            &["dog"],
        ),
        usage(
            "attribute",
            "an unknown --method",
            &["The cat", "--method", "shapley", "--model", &tiny],
            &["shapley"],
        ),
        case(
            "attribute",
            "an empty text",
            &["  ", "--method", "alti", "--model", &cls],
            &["empty"],
        ),
    ]
}

#[test]
fn every_command_refuses_hostile_input_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = cases(tmp.path());
    let mut failures = Vec::new();
    println!("| command | hostile input | exit | error |");
    println!("|---|---|---|---|");
    for c in &cases {
        let output = attnscope(&c.args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        // The `error:` line (a usage error's is the first of several).
        let first = stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or("")
            .to_string();
        let code = output.status.code().unwrap_or(-1);
        println!(
            "| {} | {} | {} | {} |",
            c.command,
            c.input,
            code,
            first.replace('|', "\\|")
        );
        let lower = stderr.to_lowercase();
        let mut why = Vec::new();
        if code != c.exit {
            why.push(format!("exit {code}, expected {}", c.exit));
        }
        if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
            why.push("panicked".into());
        }
        if !first.starts_with("error: ") {
            why.push("no `error:` line".into());
        }
        for needle in &c.needles {
            if !lower.contains(&needle.to_lowercase()) {
                why.push(format!("does not say {needle:?}"));
            }
        }
        if !why.is_empty() {
            failures.push(format!(
                "{} ({}): {}\n  args: {:?}\n  stderr: {}",
                c.command,
                c.input,
                why.join("; "),
                c.args,
                stderr.trim()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} hostile cases misbehaved:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A failed run leaves an existing output file as it was: nothing the user had is lost.
#[test]
fn a_failed_run_leaves_the_output_file_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let bad = model_dir(root, "wider", |d| config_with(d, "n_embd", "64"));
    let maps = write(root, "maps.json", maps_json(1, 1, "[1.5, -0.5, 0.0, 1.0]"));
    let case = write(
        root,
        "case.safetensors",
        sdpa_case("[1,1,2,2]", 4, f32::NAN, "{}"),
    );
    let runs: [(&str, Vec<&str>); 5] = [
        (
            "keep.png",
            vec!["heatmap", "the cat", "--model", &bad, "-o"],
        ),
        ("keep.svg", vec!["heatmap", "--maps", &maps, "-o"]),
        ("keep.html", vec!["html", "the cat", "--model", &bad, "-o"]),
        ("keep2.html", vec!["html", "--maps", &maps, "-o"]),
        ("keep.safetensors", vec!["sdpa", &case, "-o"]),
    ];
    for (name, args) in runs {
        let path = write(root, name, "precious");
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(path.clone());
        let output = attnscope(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "precious",
            "{args:?} touched its output"
        );
    }
}
