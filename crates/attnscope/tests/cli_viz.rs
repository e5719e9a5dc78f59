//! `explain`, `heatmap`, `heads` and `lookup` end to end: on the real default model (checked
//! against the golden attentions of Hugging Face transformers), and each bad input as a clear
//! error with exit code 1 (usage errors: 2), run on small hand-made maps files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::{Value, json};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data");
const MAIN_JOB: &str = "The cat that ate the mouse that lived in the barn ran away";
const QUESTION: &str = "Where is the Eiffel Tower?";
const CONTEXT: &str = "The Eiffel Tower is located in Paris, France.";

/// The default model, fetched once for the whole test binary when it is not cached.
fn model_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| attn_models::default_model_dir(false).expect("the default model can be had"))
}

fn attnscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(args)
        .env("ATTNSCOPE_MODEL", model_dir())
        .env_remove("NO_COLOR")
        .output()
        .expect("attnscope runs")
}

fn ok(args: &[&str]) -> String {
    let out = attnscope(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

fn fails_with(args: &[&str], code: i32, needle: &str) -> String {
    let out = attnscope(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "{args:?}: stderr {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: {stderr:?} lacks {needle:?}"
    );
    stderr
}

/// Golden attentions `[6, 12, T, T]` and tokens of `tests/data/minilm/{name}`.
fn golden(name: &str) -> (Vec<f32>, Vec<String>) {
    let bytes = std::fs::read(format!("{GOLDEN}/minilm/{name}.safetensors")).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let tokens = &header.metadata().as_ref().unwrap()["tokens"];
    let tokens: Vec<String> = serde_json::from_str(tokens).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let weights = st
        .tensor("attentions")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    (weights, tokens)
}

#[test]
fn the_main_job_prints_one_bar_per_word() {
    let out = ok(&["explain", MAIN_JOB, "--focus", "ran"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("Attention weights from \"ran\""),
        "{out}"
    );
    let words: Vec<&str> = lines[1..14]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(words, MAIN_JOB.split(' ').collect::<Vec<_>>());
    for line in &lines[1..14] {
        // "  The      [0.07]  ███████"
        assert!(
            line.starts_with("  ") && line.contains(" [0.") && line.contains("]  "),
            "{line}"
        );
        assert!(line.ends_with('█') || line.ends_with('▁'), "{line}");
    }
    assert!(out.contains("\nModel focuses heavily on: \""), "{out}");
    assert!(!out.contains('\x1b'), "piped output has no colour");
    assert!(
        out.contains("[CLS]/[SEP] took"),
        "the footer says what was hidden: {out}"
    );
    let coloured = ok(&["explain", MAIN_JOB, "--focus", "ran", "--color", "always"]);
    assert!(coloured.contains("\x1b["));
}

/// `--to`: each cell of the layer × head table is what `explain --layer L --head H` gives the
/// word (checked in JSON on heads 0, 7 and 11 of every layer; the hand-made maps of attn-viz's
/// tests derive the values), the heads named are the heaviest, and the README's layer 3, head 7
/// is among them.
#[test]
fn the_head_table_holds_each_heads_bar_for_the_word() {
    let grids: Value = serde_json::from_str(&ok(&[
        "explain", MAIN_JOB, "--focus", "ran", "--to", "cat", "--json",
    ]))
    .unwrap();
    let grid = &grids.as_array().unwrap()[0];
    let weights = grid["weights"].as_array().unwrap();
    assert_eq!(weights.len(), 6);
    for (layer, row) in weights.iter().enumerate() {
        assert_eq!(row.as_array().unwrap().len(), 12);
        for head in [0, 7, 11] {
            let (l, h) = (layer.to_string(), head.to_string());
            let bars: Value = serde_json::from_str(&ok(&[
                "explain", MAIN_JOB, "--focus", "ran", "--layer", &l, "--head", &h, "--json",
            ]))
            .unwrap();
            let cat = bars["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["word"] == "cat");
            assert_eq!(
                row[head],
                cat.unwrap()["weight"],
                "layer {layer}, head {head}"
            );
        }
    }
    let named = grid["stand_out"].as_array().unwrap();
    let by_weight: Vec<f64> = named
        .iter()
        .map(|h| h["weight"].as_f64().unwrap())
        .collect();
    assert!(by_weight.windows(2).all(|w| w[0] >= w[1]), "{by_weight:?}");
    assert!(
        named.iter().any(|h| h["layer"] == 3 && h["head"] == 7),
        "{named:?}"
    );
    let table = ok(&["explain", MAIN_JOB, "--focus", "ran", "--to", "cat"]);
    assert!(table.starts_with("Attention from \"ran\" to \"cat\" in each layer and head"));
    assert!(table.contains("layer 3 head 7 (0.26)"), "{table}");
    let coloured = ok(&[
        "explain", MAIN_JOB, "--focus", "ran", "--to", "cat", "--color", "always",
    ]);
    assert!(
        coloured.contains("\x1b[1m\x1b[33m0.26\x1b[0m"),
        "{coloured}"
    );
    for other in ["--layer", "--rollout", "--flow", "--top"] {
        let mut args = vec!["explain", MAIN_JOB, "--focus", "ran", "--to", "cat", other];
        if other == "--layer" || other == "--top" {
            args.push("1");
        }
        assert_eq!(attnscope(&args).status.code(), Some(1), "{other}");
    }
    fails_with(
        &["explain", MAIN_JOB, "--focus", "ran", "--to", "dog"],
        1,
        "no word \"dog\"",
    );
    // Two words: a table each, in the order given; in JSON an array of two.
    let two = ok(&[
        "explain", MAIN_JOB, "--focus", "ran", "--to", "cat", "--to", "mouse",
    ]);
    let mouse = two.find("Attention from \"ran\" to \"mouse\"").unwrap();
    assert!(
        two.starts_with("Attention from \"ran\" to \"cat\""),
        "{two}"
    );
    assert!(two[..mouse].ends_with("shows one head's bars\n\n"), "{two}");
    let grids: Value = serde_json::from_str(&ok(&[
        "explain", MAIN_JOB, "--focus", "ran", "--to", "cat", "--to", "mouse", "--json",
    ]))
    .unwrap();
    let to: Vec<&str> = (grids.as_array().unwrap().iter())
        .map(|g| g["to"].as_str().unwrap())
        .collect();
    assert_eq!(to, ["cat", "mouse"]);
}

/// A special token the text writes itself is read as that token, as transformers reads it, and
/// a note says so: the notes' "[PAD]" is easily taken for padding, which a mask would hide.
#[test]
fn special_tokens_written_in_the_text_are_pointed_out() {
    let out = attnscope(&["explain", "The cat [PAD] [PAD]", "--focus", "cat"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("note: the text writes the tokenizer's special token [PAD] itself"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("[PAD]"));
    // The tokens the tokenizer adds ([CLS], [SEP]) are not the text's, nor is the [UNK] it
    // reads a character it lacks as.
    for text in ["The cat sat", "I love 😀 my cat"] {
        let out = attnscope(&["explain", text, "--focus", "cat"]);
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("special token"),
            "{text}"
        );
    }
}

/// Two `--to` words: a third table, each cell the first word's weight minus the second's (the
/// tables' JSON weights, rounded as shown), and a count of the heads that prefer each word
/// recomputed from the JSON: not starred (the words shown got at least 25% of the head), and
/// at least 1.5 × the other word's weight and 1.5 × the word's even share.
#[test]
fn two_words_get_a_table_of_their_difference() {
    let args = [
        "explain", MAIN_JOB, "--focus", "ran", "--to", "cat", "--to", "mouse",
    ];
    let text = ok(&args);
    let json: Value = serde_json::from_str(&ok(&[&args[..], &["--json"]].concat())).unwrap();
    let grids = json.as_array().unwrap();
    assert_eq!(grids.len(), 2, "the JSON stays the two tables");
    let table = |g: &Value, key: &str| -> Vec<Vec<f64>> {
        (g[key].as_array().unwrap().iter())
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|w| w.as_f64().unwrap())
                    .collect()
            })
            .collect()
    };
    let (cat, mouse, shares) = (
        table(&grids[0], "weights"),
        table(&grids[1], "weights"),
        table(&grids[0], "shares"),
    );
    let start = text
        .find("\"cat\" against \"mouse\" from \"ran\": the weight to \"cat\" minus")
        .unwrap_or_else(|| panic!("no comparison in\n{text}"));
    let rows: Vec<&str> = text[start..]
        .lines()
        .filter(|l| l.starts_with("  layer"))
        .collect();
    assert_eq!(rows.len(), 6);
    for (layer, line) in rows.iter().enumerate() {
        let texts: Vec<&str> = line.split_whitespace().skip(2).collect();
        assert_eq!(texts.len(), 12, "{line}");
        for (head, text) in texts.iter().enumerate() {
            let cell: f64 = text.trim_end_matches(['*', '•']).parse().unwrap();
            let d = cat[layer][head] - mouse[layer][head];
            assert!(
                (cell - d).abs() <= 0.005 + 1e-6,
                "layer {layer} head {head}: {cell} vs {d}"
            );
            assert_eq!(text.ends_with('*'), shares[layer][head] < 0.25);
            // • marks a head that prefers either word by the rule recomputed below.
            let prefers = |w: f64, v: f64, even: f64| {
                let (w, v, even) = (w as f32, v as f32, even as f32);
                w > 0.0 && w >= 1.5 * even && w >= 1.5 * v
            };
            let evens = [
                grids[0]["even"].as_f64().unwrap(),
                grids[1]["even"].as_f64().unwrap(),
            ];
            let (c, m) = (cat[layer][head], mouse[layer][head]);
            let marked =
                shares[layer][head] >= 0.25 && (prefers(c, m, evens[0]) || prefers(m, c, evens[1]));
            assert_eq!(
                text.ends_with('•'),
                marked,
                "layer {layer} head {head}: {text}"
            );
        }
    }
    for (x, (word, other)) in [("cat", "mouse"), ("mouse", "cat")].iter().enumerate() {
        let even = grids[x]["even"].as_f64().unwrap();
        let (w, v) = if x == 0 {
            (&cat, &mouse)
        } else {
            (&mouse, &cat)
        };
        let prefer = (0..6)
            .flat_map(|l| (0..12).map(move |h| (l, h)))
            .filter(|&(l, h)| {
                let (w, v) = (w[l][h] as f32, v[l][h] as f32);
                shares[l][h] >= 0.25 && w > 0.0 && w >= 1.5 * even as f32 && w >= 1.5 * v
            })
            .count();
        let line = match prefer {
            0 => format!(
                "No head prefers {word:?}: none gives it at least 1.5 × what it gives {other:?}"
            ),
            1 => format!(
                "One head prefers {word:?} (it gives it at least 1.5 × what it gives {other:?}"
            ),
            n => format!(
                "{n} heads prefer {word:?} (each gives it at least 1.5 × what it gives {other:?}"
            ),
        };
        assert!(text[start..].contains(&line), "{line}\nnot in\n{text}");
    }
    // Three words: three tables, no difference.
    let three = ok(&[&args[..], &["--to", "barn"]].concat());
    assert_eq!(three.matches("Attention from \"ran\"").count(), 3);
    assert!(!three.contains(" against "), "{three}");
    // A word given twice (here as its first occurrence) is refused.
    fails_with(
        &[
            "explain", MAIN_JOB, "--focus", "ran", "--to", "cat", "--to", "cat#1",
        ],
        1,
        "--to \"cat\" and --to \"cat#1\" are the same word (\"cat\"): give each word once",
    );
}

#[test]
fn the_eiffel_question_matches_the_golden_attention() {
    // Raw tokens, specials hidden: the mean over the question's 8 tokens (1..=8) of the
    // all-layer, all-head mean, on the context's tokens 10..=21, renormalised over them.
    let (weights, tokens) = golden("text01");
    let t = tokens.len();
    let mean = |i: usize, j: usize| {
        (0..72)
            .map(|lh| f64::from(weights[(lh * t + i) * t + j]))
            .sum::<f64>()
            / 72.0
    };
    let raw: Vec<f64> = (10..=21)
        .map(|j| (1..=8).map(|i| mean(i, j)).sum::<f64>() / 8.0)
        .collect();
    let sum: f64 = raw.iter().sum();
    let args = [
        "explain",
        "--question",
        QUESTION,
        "--context",
        CONTEXT,
        "--tokens",
        "--json",
    ];
    let e: Value = serde_json::from_str(&ok(&args)).unwrap();
    // An empty question or context is named by its flag (the tokenizer says "the text").
    for (flag, question, context) in [("--question", " ", CONTEXT), ("--context", QUESTION, "")] {
        let args = ["explain", "--question", question, "--context", context];
        fails_with(&args, 1, &format!("{flag} is empty or only whitespace"));
    }
    let rows = e["rows"].as_array().unwrap();
    let got_tokens: Vec<&str> = rows.iter().map(|r| r["word"].as_str().unwrap()).collect();
    assert_eq!(
        got_tokens,
        tokens[10..=21]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    for (row, expected) in rows.iter().zip(&raw) {
        let got = row["weight"].as_f64().unwrap();
        assert!(
            (got - expected / sum).abs() < 1e-4,
            "{row}: expected {}",
            expected / sum
        );
    }
    // Word level: "e ##iff ##el" is one word, and it is among the heaviest.
    let words: Value = serde_json::from_str(&ok(&[
        "explain",
        "--question",
        QUESTION,
        "--context",
        CONTEXT,
        "--json",
    ]))
    .unwrap();
    let labels: Vec<&str> = words["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["word"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "The", "Eiffel", "Tower", "is", "located", "in", "Paris", ",", "France", "."
        ]
    );
    // "Eiffel" has the longest bar, but it is three tokens (e ##iff ##el), which even
    // attention gives three shares: only "Tower" gets 1.5 times its even share.
    let rows = words["rows"].as_array().unwrap();
    let (eiffel, tower) = (&rows[1], &rows[2]);
    assert_eq!(
        (eiffel["tokens"].as_u64(), tower["tokens"].as_u64()),
        (Some(3), Some(1))
    );
    let even = |r: &Value| r["even"].as_f64().unwrap();
    assert!((even(eiffel) - 3.0 * even(tower)).abs() < 1e-6);
    assert_eq!(words["focuses_on"], json!(["Tower"]));
}

#[test]
fn every_selection_runs_on_the_real_model() {
    for extra in [
        &["--layer", "5"][..],
        &["--layer", "0", "--head", "11"],
        &["--rollout"],
        &["--flow"],
        &["--special", "--top", "3"],
    ] {
        let mut args = vec!["explain", "The cat sat on the mat", "--focus", "sat"];
        args.extend_from_slice(extra);
        let out = ok(&args);
        // Either words stand out, or the summary says none does.
        assert!(
            out.contains("Model focuses heavily on:") || out.contains("No word stands out"),
            "{extra:?}: {out}"
        );
        let header = match extra[0] {
            "--rollout" => "Attention rollout from \"sat\"",
            "--flow" => "Attention flow from \"sat\"",
            _ => "Attention weights from \"sat\"",
        };
        assert!(out.starts_with(header), "{extra:?}: {out}");
    }
    let top: Value = serde_json::from_str(&ok(&[
        "explain",
        "The cat sat on the mat",
        "--special",
        "--top",
        "3",
        "--json",
    ]))
    .unwrap();
    assert_eq!(top["rows"].as_array().unwrap().len(), 3);
    // Under --top the weights sum to 1 over every word, not the ones shown (the note said so).
    let top_one = ok(&["explain", "The cat sat", "--focus", "cat", "--top", "1"]);
    assert!(
        top_one.contains("renormalised to sum to 1 over every word (the 1 heaviest shown)"),
        "{top_one}"
    );
    // `hidden_share` is a share for every method: flows do not sum to 1, and it was the flow to
    // [CLS]/[SEP] itself (1.81 for "The cat sat").
    for method in ["--flow", "--rollout"] {
        let json: Value =
            serde_json::from_str(&ok(&["explain", "The cat sat", method, "--json"])).unwrap();
        let share = json["hidden_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{method}: {share}");
    }
}

#[test]
fn heatmaps_heads_and_lookup_on_the_real_model() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [
        ("all.png", &[][..]),
        ("head.svg", &["--layer", "2", "--head", "3"]),
        ("rollout.png", &["--rollout", "--tokens", "--special"]),
        ("grid.png", &["--grid"]),
    ] {
        let path = dir.path().join(name);
        let mut args = vec!["heatmap", MAIN_JOB, "-o", path.to_str().unwrap()];
        args.extend_from_slice(extra);
        ok(&args);
        let bytes = std::fs::read(&path).unwrap();
        if name.ends_with(".png") {
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}");
        } else {
            assert!(bytes.starts_with(b"<svg"), "{name}");
        }
    }
    let heads: Value = serde_json::from_str(&ok(&["heads", MAIN_JOB, "--json"])).unwrap();
    assert_eq!(heads["heads"].as_array().unwrap().len(), 72);
    assert!(!heads["notable"].as_array().unwrap().is_empty());
    let table = ok(&["heads", MAIN_JOB]);
    assert!(
        table.contains("Notable heads:") && table.lines().count() > 72,
        "{table}"
    );

    let entries = [
        "--entry",
        "Paris=Capital of France, home to Eiffel Tower",
        "--entry",
        "London=Capital of UK, home to Big Ben",
        "--entry",
        "Tokyo=Capital of Japan, largest city",
    ];
    let mut args = vec!["lookup", "--query", QUESTION, "--json"];
    args.extend_from_slice(&entries);
    let l: Value = serde_json::from_str(&ok(&args)).unwrap();
    let weights: Vec<f64> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["weight"].as_f64().unwrap())
        .collect();
    assert!((weights.iter().sum::<f64>() - 1.0).abs() < 1e-5);
    assert!(
        weights[0] > weights[1] && weights[0] > weights[2],
        "{weights:?}"
    );
    // The readable form names the entry that dominates, or says none does (a high
    // temperature evens the weights: it named one at 0.34 against 0.33); a key's escape
    // sequence is shown, not sent to the terminal.
    let mut args = vec!["lookup", "--query", QUESTION];
    args.extend_from_slice(&entries);
    assert!(ok(&args).contains("Mostly \"Paris\" information!"));
    let even = ok(&[
        "lookup",
        "--query",
        "x",
        "--entry",
        "a=1",
        "--entry",
        "b=2",
        "--entry",
        "c\u{1b}[2J=3",
        "--temperature",
        "10",
    ]);
    assert!(
        even.contains("No entry dominates:") && !even.contains("Mostly"),
        "{even}"
    );
    assert!(
        even.contains("c\\u{1b}[2J") && !even.contains('\u{1b}'),
        "{even}"
    );
    let file = dir.path().join("entries.txt");
    std::fs::write(
        &file,
        "# the notes' database\nParis=Capital of France\nTokyo=Capital of Japan\n",
    )
    .unwrap();
    let text = ok(&[
        "lookup",
        "--query",
        QUESTION,
        "--entries",
        file.to_str().unwrap(),
    ]);
    assert!(
        text.contains("Step 2: softmax") && text.contains("information!"),
        "{text}"
    );
}

#[test]
fn model_input_errors_are_clear() {
    fails_with(&["explain", ""], 1, "empty");
    let long = "word ".repeat(600);
    fails_with(&["explain", &long], 1, "512");
    let cut = ok(&["explain", &long, "--truncate", "--top", "2"]);
    assert!(cut.contains("Model focuses heavily on:"), "{cut}");
    fails_with(&["explain", MAIN_JOB, "--focus", "dog"], 1, "\"ran\"");
    fails_with(
        &["explain", MAIN_JOB, "--layer", "6"],
        1,
        "layers are 0..=5",
    );
    fails_with(
        &["explain", MAIN_JOB, "--layer", "1", "--head", "12"],
        1,
        "heads are 0..=11",
    );
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    fails_with(
        &[
            "heatmap",
            MAIN_JOB,
            "-o",
            png.to_str().unwrap(),
            "--layer",
            "9",
        ],
        1,
        "layers are 0..=5",
    );
    assert!(!png.exists());
    let flow_long = "cat ".repeat(70);
    fails_with(&["explain", &flow_long, "--flow"], 1, "64 tokens");
}

/// A one-layer, one-head maps file for "a bc" (tokens [CLS] a b ##c [SEP]), uniform weights.
fn maps_file(dir: &Path) -> PathBuf {
    let tokens: Vec<Value> = [
        ("[CLS]", None, true),
        ("a", Some([0, 1]), false),
        ("b", Some([2, 3]), false),
        ("##c", Some([3, 4]), false),
        ("[SEP]", None, true),
    ]
    .iter()
    .map(|(text, span, special)| {
        json!({"text": text, "id": 0, "span": span, "segment": 0, "special": special})
    })
    .collect();
    let maps = json!({
        "model": "hand", "text": "a bc", "pair": null, "tokens": tokens,
        "n_layers": 1, "n_heads": 1, "weights": vec![0.2; 25],
    });
    let path = dir.join("maps.json");
    std::fs::write(&path, maps.to_string()).unwrap();
    path
}

#[test]
fn saved_maps_are_explained_and_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let maps = maps_file(dir.path());
    let maps = maps.to_str().unwrap();
    // Uniform .2: a → a .2, bc .4 of .6 shown → 1/3, 2/3.
    let out = ok(&["explain", "--maps", maps, "--focus", "a"]);
    assert!(
        out.contains("  a        [0.33]") && out.contains("  bc       [0.67]"),
        "{out}"
    );
    let png = dir.path().join("m.png");
    ok(&["heatmap", "--maps", maps, "-o", png.to_str().unwrap()]);
    assert!(png.is_file());
    assert!(ok(&["heads", "--maps", maps]).contains("Notable heads:"));

    // No command wrote the maps format: `attention --save-maps` does, and every view of the
    // saved maps is the view of the model's run.
    let saved = dir.path().join("eiffel.json");
    let text = "Where is the Eiffel Tower?";
    let out = attnscope(&["attention", text, "--save-maps", saved.to_str().unwrap()]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    let saved = saved.to_str().unwrap();
    for view in [&["explain", "--focus", "Tower"][..], &["heads"]] {
        let mut from_model = view.to_vec();
        from_model.insert(1, text);
        let mut from_file = view.to_vec();
        from_file.extend(["--maps", saved]);
        assert_eq!(ok(&from_file), ok(&from_model), "{view:?}");
    }
}

/// `RAYON_NUM_THREADS` sized the pool of every command without `--threads`, unchecked:
/// 100000 spent minutes starting threads. A `--threads` given overrides it, and an empty one
/// is rayon's default.
#[test]
fn a_thread_count_from_the_environment_has_the_flags_limit() {
    let run = |args: &[&str], value: &str| {
        Command::new(env!("CARGO_BIN_EXE_attnscope"))
            .args(args)
            .env("RAYON_NUM_THREADS", value)
            .output()
            .unwrap()
    };
    for value in ["100000", "many", " 4"] {
        let out = run(&["mask", "causal", "2"], value);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{value}: {stderr}");
        assert!(
            stderr.contains(&format!("RAYON_NUM_THREADS={value}")) && stderr.contains("1024"),
            "{stderr}"
        );
    }
    assert!(run(&["mask", "causal", "2"], "").status.success());
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/tiny-gpt2");
    let out = run(
        &["attention", "hi", "--model", tiny, "--threads", "2"],
        "100000",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn bad_flags_and_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let maps_path = maps_file(dir.path());
    let maps = maps_path.to_str().unwrap();
    let stderr = fails_with(
        &["explain", "--maps", maps, "--focus", "zzz"],
        1,
        "no word \"zzz\"",
    );
    assert!(
        stderr.contains("\"a\", \"bc\""),
        "lists the words: {stderr}"
    );
    fails_with(
        &["explain", "--maps", maps, "--layer", "1"],
        1,
        "layers are 0..=0",
    );
    fails_with(
        &["explain", "--maps", maps, "--layer", "0", "--head", "1"],
        1,
        "heads are 0..=0",
    );
    fails_with(&["explain", "--maps", maps, "--top", "0"], 1, "--top");
    // Python's -1 for the last layer: indices count from 0, none from the end.
    fails_with(
        &["explain", "--maps", maps, "--layer", "-1"],
        1,
        "indices count from 0 (0 is the first) and none counts from the end",
    );
    fails_with(&["explain", "--maps", maps, "--head", "0"], 1, "--layer");
    fails_with(
        &["explain", "--maps", maps, "--rollout", "--flow"],
        1,
        "cannot be used",
    );
    fails_with(
        &[
            "explain",
            "--maps",
            maps,
            "--question",
            "q",
            "--context",
            "c",
        ],
        1,
        "cannot be used",
    );
    // The maps hold their own text: a TEXT or --pair beside them would be silently ignored.
    let png = dir.path().join("text.png");
    let png = png.to_str().unwrap();
    for args in [
        &["explain", "The dog barked", "--maps", maps][..],
        &["explain", "--maps", maps, "--pair", "b"],
        &["heatmap", "The dog barked", "--maps", maps, "-o", png],
        &["heatmap", "--maps", maps, "--pair", "b", "-o", png],
        &["heads", "The dog barked", "--maps", maps],
        &["heads", "--maps", maps, "--pair", "b"],
    ] {
        fails_with(args, 1, "cannot be used");
    }

    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    fails_with(
        &["heatmap", "--maps", maps, "-o", &out("a.jpg")],
        1,
        "use a .png or .svg",
    );
    fails_with(
        &["heatmap", "--maps", maps, "-o", &out("no/dir/a.png")],
        1,
        "does not exist",
    );
    // A folder is named as one, with or without an image's extension.
    fails_with(
        &["heatmap", "--maps", maps, "-o", &out("")],
        1,
        "it is a folder",
    );
    let folder = dir.path().join("folder.png");
    std::fs::create_dir(&folder).unwrap();
    fails_with(
        &["heatmap", "--maps", maps, "-o", folder.to_str().unwrap()],
        1,
        "is a folder",
    );
    fails_with(
        &[
            "heatmap",
            "--maps",
            maps,
            "-o",
            &out("x.png"),
            "--grid",
            "--rollout",
        ],
        1,
        "cannot be used",
    );

    // 60 layers × 60 heads of one token: an 8290 × 8845 grid (220 MB of pixels) is refused.
    let tokens = [json!({"text": "a", "id": 0, "span": [0, 1], "segment": 0, "special": false})];
    let many = json!({
        "model": "hand", "text": "a", "pair": null, "tokens": tokens,
        "n_layers": 60, "n_heads": 60, "weights": vec![1.0; 3600],
    });
    std::fs::write(out("many.json"), many.to_string()).unwrap();
    let stderr = fails_with(
        &[
            "heatmap",
            "--maps",
            &out("many.json"),
            "-o",
            &out("many.png"),
            "--grid",
        ],
        1,
        "--grid of 60 layers × 60 heads",
    );
    assert!(stderr.contains("8290 × 8845 pixels"), "{stderr}");
    assert!(!dir.path().join("many.png").exists());

    fails_with(&["heads", "--maps", &out("missing.json")], 1, "cannot read");
    std::fs::write(out("bad.json"), "{not json").unwrap();
    fails_with(
        &["heads", "--maps", &out("bad.json")],
        1,
        "not attention maps JSON",
    );
    let mut short: Value =
        serde_json::from_str(&std::fs::read_to_string(&maps_path).unwrap()).unwrap();
    short["weights"] = json!(vec![0.2; 24]);
    std::fs::write(out("short.json"), short.to_string()).unwrap();
    fails_with(&["explain", "--maps", &out("short.json")], 1, "need 25");

    fails_with(&["lookup", "--query", "q"], 1, "no entries");
    fails_with(
        &["lookup", "--query", "q", "--entry", "Paris"],
        1,
        "not KEY=VALUE",
    );
    fails_with(&["lookup", "--query", "q", "--entry", "=x"], 1, "empty key");
    fails_with(
        &["lookup", "--query", "q", "--entries", &out("none.txt")],
        1,
        "cannot read",
    );
    fails_with(
        &[
            "lookup",
            "--query",
            "q",
            "--entry",
            "a=b",
            "--temperature",
            "0",
        ],
        1,
        "above 0",
    );
    // 1e-39 overflowed cosine / T to inf for both entries: NaN weights, exit 0.
    fails_with(
        &[
            "lookup",
            "--query",
            "x",
            "--entry",
            "a=b",
            "--entry",
            "c=d",
            "--temperature",
            "1e-39",
        ],
        1,
        "at least 1.18e-38 (smaller ones overflow cosine / temperature); got 1e-39",
    );
    fails_with(&["lookup", "--query", " ", "--entry", "a=b"], 1, "empty");
    for t in ["inf", "NaN"] {
        let args = [
            "lookup",
            "--query",
            "x",
            "--entry",
            "a=b",
            "--temperature",
            t,
        ];
        fails_with(&args, 1, "--temperature must be a finite number above 0");
    }
}

#[test]
fn heatmaps_say_what_they_leave_out() {
    let dir = tempfile::tempdir().unwrap();
    let out = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let tiny = format!("{GOLDEN}/tiny-gpt2");
    // A causal model: the masked cells are grey and the caption says so.
    let causal = out("causal.svg");
    ok(&[
        "heatmap",
        "The cat sat on the mat",
        "--model",
        &tiny,
        "-o",
        &causal,
    ]);
    let svg = std::fs::read_to_string(&causal).unwrap();
    assert!(svg.contains("grey: masked") && svg.contains("#DEDEDE"));
    // BERT sees every key: no grey. A pair: a line where B starts, both texts in the title,
    // and the share [CLS]/[SEP] took from what is shown.
    let pair = out("pair.svg");
    ok(&["heatmap", QUESTION, "--pair", CONTEXT, "-o", &pair]);
    let svg = std::fs::read_to_string(&pair).unwrap();
    assert!(!svg.contains("#DEDEDE") && svg.contains("white lines"));
    assert!(
        svg.contains(&format!("&quot;{QUESTION}&quot; + &quot;{CONTEXT}&quot;")),
        "{}",
        &svg[..1500]
    );
    let hidden = svg
        .split("[CLS]/[SEP] hidden (they took ")
        .nth(1)
        .and_then(|rest| rest.split('%').next())
        .and_then(|share| share.parse::<f32>().ok())
        .expect("the title gives the hidden share");
    assert!((1.0..100.0).contains(&hidden), "{hidden}");
    // Layer 0, head 2 of "The cat sat on the mat": the row of "The" keeps almost nothing
    // after [CLS]/[SEP] (its share recomputed here from `attention --json`); renormalised, that
    // little fills the row, and the title says so, to the digits the share needs.
    let text = "The cat sat on the mat";
    let json: Value = serde_json::from_str(&ok(&["attention", text, "--json"])).unwrap();
    let row = &json["attentions"][0][2][1];
    let t = row.as_array().unwrap().len();
    let kept: f64 = (1..t - 1).map(|j| row[j].as_f64().unwrap()).sum();
    let total: f64 = (0..t).map(|j| row[j].as_f64().unwrap()).sum();
    let percent = 100.0 * kept / total;
    assert!(percent < 5.0, "{percent}");
    let digits = (-percent.log10()).ceil() as usize;
    let faint = out("faint.svg");
    let args = ["heatmap", text, "--layer", "0", "--head", "2", "-o", &faint];
    ok(&args);
    // The picture's texts, one after the other (the title wraps at spaces).
    let svg = std::fs::read_to_string(&faint).unwrap();
    let texts: Vec<&str> = (svg.split("</text>"))
        .filter_map(|piece| piece.rsplit_once('>').map(|(_, text)| text.trim()))
        .collect();
    let title = texts.join(" ");
    let said = format!(
        "&quot;The&quot; kept {percent:.digits$}% of its row: renormalised, that little fills it"
    );
    assert!(title.contains(&said), "{said} not in {title}");
    // The title quotes the text as written: an em dash stays one.
    ok(&["heatmap", "Paris — France", "-o", &pair]);
    assert!(
        std::fs::read_to_string(&pair)
            .unwrap()
            .contains("&quot;Paris —")
    );
    // A PNG's font lacks CJK: said on stderr, not left to the boxes.
    let cjk = attnscope(&["heatmap", "東京 is big", "-o", &out("cjk.png")]);
    assert!(cjk.status.success());
    let stderr = String::from_utf8_lossy(&cjk.stderr);
    assert!(
        stderr.contains("no glyph for 2 characters (東京)"),
        "{stderr}"
    );
    // --truncate says how much it cut.
    let long = "word ".repeat(600);
    let cut = attnscope(&["heatmap", &long, "--truncate", "-o", &out("cut.svg")]);
    assert!(cut.status.success());
    let stderr = String::from_utf8_lossy(&cut.stderr);
    assert!(
        stderr.contains(
            "--truncate: the input is 602 tokens; the attention shown is of the 512 the model reads (90 cut from the end)"
        ),
        "{stderr}"
    );
}

#[test]
fn gpt2_words_read_the_golden_causal_attention() {
    // tiny-gpt2 adds no special tokens and each word is one token ("The", "Ġcat", ...), so
    // the row of "mat" at layer 1, head 2 is the golden row as it is (nothing to renormalise).
    let bytes = std::fs::read(format!("{GOLDEN}/tiny-gpt2/expected/text00.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let att: Vec<f32> = st
        .tensor("attentions")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (t, heads) = (6, 4);
    let row = &att[((heads + 2) * t + 5) * t..((heads + 2) * t + 6) * t];
    let model = format!("{GOLDEN}/tiny-gpt2");
    let args = [
        "explain",
        "The cat sat on the mat",
        "--model",
        &model,
        "--focus",
        "mat",
        "--layer",
        "1",
        "--head",
        "2",
        "--json",
    ];
    let e: Value = serde_json::from_str(&ok(&args)).unwrap();
    let rows = e["rows"].as_array().unwrap();
    let words: Vec<&str> = rows.iter().map(|r| r["word"].as_str().unwrap()).collect();
    assert_eq!(words, ["The", "cat", "sat", "on", "the", "mat"]);
    for (r, expected) in rows.iter().zip(row) {
        let got = r["weight"].as_f64().unwrap();
        assert!(
            (got - f64::from(*expected)).abs() < 1e-4,
            "{r}: expected {expected}"
        );
    }
    // Causal: "cat" sees nothing after itself.
    let args = [
        "explain",
        "The cat sat on the mat",
        "--model",
        &model,
        "--focus",
        "cat",
        "--json",
    ];
    let e: Value = serde_json::from_str(&ok(&args)).unwrap();
    let after: f64 = e["rows"].as_array().unwrap()[2..]
        .iter()
        .map(|r| r["weight"].as_f64().unwrap())
        .sum();
    assert_eq!(after, 0.0);
}

#[test]
fn across_a_pair_shows_the_other_language() {
    let args = [
        "explain",
        "I love machine learning",
        "--pair",
        "J'adore l'apprentissage automatique",
        "--focus",
        "apprentissage",
        "--across",
        "--json",
    ];
    let e: Value = serde_json::from_str(&ok(&args)).unwrap();
    let words: Vec<&str> = e["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["word"].as_str().unwrap())
        .collect();
    assert_eq!(words, ["I", "love", "machine", "learning"]);
    let stderr = fails_with(&["explain", "one text", "--across"], 1, "sentence pair");
    assert!(
        stderr.contains("--across") && stderr.contains("--pair"),
        "names the flags: {stderr}"
    );
}

/// A key of an `--entries` file too long for the model was named "entry #2" (counting the
/// `--entry` flags and the file together) and quoted whole (2 MB for a 400,000-word key).
#[test]
fn a_too_long_key_is_named_by_its_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.txt");
    let long_key = "word ".repeat(400);
    std::fs::write(&file, format!("# cities\nParis=France\n\n{long_key}=v\n")).unwrap();
    let file = file.to_str().unwrap();
    let stderr = fails_with(
        &[
            "lookup",
            "--query",
            "q",
            "--entry",
            "Rome=Italy",
            "--entries",
            file,
        ],
        1,
        &format!("the key of {file}, line 4"),
    );
    assert!(stderr.len() < 1000, "{} bytes: {stderr}", stderr.len());
}
