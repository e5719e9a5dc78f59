//! The commands on the Llama-style decoders (tests/data/llm: random Llama, Mistral and Qwen2
//! checkpoints made with transformers): `attention --json` equals transformers' attentions,
//! `generate --json` its greedy ids, and the views run; what the family lacks is a clear error.

mod cli_support;

use std::path::PathBuf;

use cli_support::{fails_with, ok};
use safetensors::SafeTensors;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/llm")).join(name)
}

/// The expected tensor `name` of family `family`, as f64 (f32 or i64 in the file).
fn expected(family: &str, name: &str) -> Vec<f64> {
    let bytes = std::fs::read(dir(family).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let view = st.tensor(name).unwrap();
    match view.dtype() {
        safetensors::Dtype::F32 => (view.data().chunks_exact(4))
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        _ => (view.data().chunks_exact(8))
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as f64)
            .collect(),
    }
}

fn flatten(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Array(items) => items.iter().for_each(|x| flatten(x, out)),
        x => out.push(x.as_f64().unwrap()),
    }
}

const TEXT: &str = "The cat that ate the mouse that lived in the barn ran away";

#[test]
fn attention_and_generate_match_transformers() {
    for family in [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma2",
        "llama-bf16",
        "mistral-f16",
    ] {
        let model = dir(family);
        let model = model.to_str().unwrap();
        let json: serde_json::Value =
            serde_json::from_str(&ok(&["attention", TEXT, "--json", "--model", model])).unwrap();
        let mut got = Vec::new();
        flatten(&json["attentions"], &mut got);
        let want = expected(family, "attentions1");
        assert_eq!(got.len(), want.len(), "{family}");
        let worst = (got.iter().zip(&want)).fold(0.0f64, |m, (g, w)| m.max((g - w).abs()));
        assert!(worst <= 1e-4, "{family}: attentions off by {worst}");

        let json: serde_json::Value = serde_json::from_str(&ok(&[
            "generate",
            "The cat sat on the mat",
            "--max-new-tokens",
            "32",
            "--json",
            "--model",
            model,
        ]))
        .unwrap();
        let ids: Vec<f64> = (json["ids"].as_array().unwrap().iter())
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(ids, expected(family, "generated"), "{family}");
    }
}

#[test]
fn the_views_run_on_a_decoder() {
    let model = dir("llama");
    let model = model.to_str().unwrap();
    let bars = ok(&["explain", TEXT, "--focus", "ran", "--model", model]);
    assert!(bars.contains("away") && bars.contains("masked"), "{bars}");
    let heads = ok(&["heads", TEXT, "--model", model]);
    assert!(heads.contains("8 heads of llama"), "{heads}");
    let generated = ok(&[
        "generate",
        "The cat",
        "--max-new-tokens",
        "3",
        "--explain",
        "--model",
        model,
    ]);
    assert!(
        generated.contains("the attention that chose each new token"),
        "{generated}"
    );
    let tmp = tempfile::tempdir().unwrap();
    for file in ["page.html", "map.png"] {
        let out = tmp.path().join(file);
        let command = if file.ends_with("html") {
            "html"
        } else {
            "heatmap"
        };
        ok(&[command, TEXT, "-o", out.to_str().unwrap(), "--model", model]);
        assert!(std::fs::metadata(&out).unwrap().len() > 1000, "{file}");
    }
}

/// `heatmap --rows` draws the rows asked for over every word: computed alone (only those
/// rows' weights), they are the rows the saved full maps hold, cell for cell.
#[test]
fn heatmap_rows_draw_only_the_rows_asked_for() {
    let model = dir("qwen2");
    let model = model.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let maps = out("maps.json");
    ok(&["attention", TEXT, "--model", model, "--save-maps", &maps]);
    let (alone, sliced) = (out("alone.svg"), out("sliced.svg"));
    let rows = ["--rows", "-3..", "--layer", "1"];
    let mut args = vec!["heatmap", TEXT, "--model", model, "-o", &alone];
    args.extend(rows);
    ok(&args);
    let mut args = vec!["heatmap", "--maps", &maps, "-o", &sliced];
    args.extend(rows);
    ok(&args);
    let (alone, sliced) = (
        std::fs::read_to_string(&alone).unwrap(),
        std::fs::read_to_string(&sliced).unwrap(),
    );
    // The cells, not the title (which names the model directory or the maps' model alike).
    let cells = |svg: &str| -> Vec<String> {
        (svg.split("<rect ").skip(1))
            .map(|r| r[..r.find("/>").unwrap()].to_string())
            .collect()
    };
    assert_eq!(cells(&alone), cells(&sliced));
    // 3 rows of the 12 words shown (the first token, a sink, hidden) over the 12.
    assert!(alone.contains("word rows (9..12 of 12)"), "{alone}");
    let matrix = &cells(&alone)[1];
    let num = |name: &str| -> f64 {
        let at = matrix.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        matrix[at..at + matrix[at..].find('"').unwrap()]
            .parse()
            .unwrap()
    };
    let (w, h) = (num("width"), num("height"));
    assert!((w / 12.0) > 10.0 && (h / 3.0) >= w / 12.0, "{w} × {h}");
    for (rows, says) in [
        ("12..", "--rows 12.. selects no row of the 12 shown"),
        ("4..2", "--rows 4..2 selects no row"),
        ("x..2", "START \"x\" is not a whole number"),
        ("3", "expected START..END"),
    ] {
        fails_with(
            &[
                "heatmap",
                TEXT,
                "--model",
                model,
                "--rows",
                rows,
                "-o",
                &out("x.png"),
            ],
            says,
        );
    }
    fails_with(
        &[
            "heatmap",
            TEXT,
            "--model",
            model,
            "--rows",
            "1..2",
            "--grid",
            "-o",
            &out("x.png"),
        ],
        "cannot be used with",
    );
}

#[test]
fn what_the_family_lacks_is_a_clear_error() {
    let model = dir("qwen2");
    let model = model.to_str().unwrap();
    for method in ["alti", "grad-input"] {
        fails_with(
            &["attribute", TEXT, "--method", method, "--model", model],
            "not available for qwen2 models yet; it runs on BERT",
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("page.html");
    fails_with(
        &[
            "html",
            TEXT,
            "-o",
            out.to_str().unwrap(),
            "--methods",
            "norm",
            "--model",
            model,
        ],
        "not available for qwen2 models yet",
    );
}

/// A decoder's first token (Llama's `<s>`, Qwen's first word) is hidden as an attention sink,
/// with the share it took; `--special` shows it.
#[test]
fn the_first_token_is_named_as_an_attention_sink() {
    for (family, first) in [("llama", "<s>"), ("qwen2", "The")] {
        let model = dir(family);
        let model = model.to_str().unwrap();
        let bars = ok(&["explain", TEXT, "--focus", "ran", "--model", model]);
        let note = format!("note: the first token \"{first}\", an attention sink, took ");
        assert!(bars.contains(&note), "{family}: {bars}");
        assert!(bars.contains("(--special shows it)"), "{family}: {bars}");
        let json: serde_json::Value = serde_json::from_str(&ok(&[
            "explain", TEXT, "--focus", "ran", "--json", "--model", model,
        ]))
        .unwrap();
        let share = json["hidden_share"].as_f64().unwrap();
        assert!(share > 0.0 && share < 1.0, "{family}: {share}");
        let shown = ok(&[
            "explain",
            TEXT,
            "--focus",
            "ran",
            "--special",
            "--model",
            model,
        ]);
        assert!(
            shown
                .lines()
                .nth(1)
                .unwrap()
                .trim_start()
                .starts_with(first),
            "{shown}"
        );
    }
}

/// `heads` on a decoder names its first column the sink, and each head's sink share is the
/// mean over the query tokens of the weight `attention --json` gives the first token.
#[test]
fn heads_report_each_heads_sink_share() {
    for family in ["llama", "qwen2"] {
        let model = dir(family);
        let model = model.to_str().unwrap();
        let table = ok(&["heads", TEXT, "--model", model]);
        let header = table.lines().nth(1).unwrap();
        assert!(
            header.contains(" sink ") && !header.contains("[SEP]"),
            "{table}"
        );
        assert!(table.contains("note: sink is the first token"), "{table}");
        let json: serde_json::Value =
            serde_json::from_str(&ok(&["heads", TEXT, "--model", model, "--json"])).unwrap();
        assert_eq!(json["leading"], "sink", "{family}");
        let attention: serde_json::Value =
            serde_json::from_str(&ok(&["attention", TEXT, "--model", model, "--json"])).unwrap();
        let layers = attention["attentions"].as_array().unwrap();
        for head in json["heads"].as_array().unwrap() {
            let (l, h) = (
                head["layer"].as_u64().unwrap(),
                head["head"].as_u64().unwrap(),
            );
            let rows = layers[l as usize][h as usize].as_array().unwrap();
            let want = (rows.iter())
                .map(|row| row[0].as_f64().unwrap())
                .sum::<f64>()
                / rows.len() as f64;
            let got = head["cls"].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-5,
                "{family} {l}.{h}: {got} against {want}"
            );
        }
    }
}
