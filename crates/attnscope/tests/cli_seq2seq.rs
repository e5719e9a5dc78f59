//! The commands on an encoder-decoder model (tests/data/s2s/bart, a random BART made with
//! transformers by scripts/test_data/seq2seq.py): `translate` equals transformers' greedy and
//! 4-beam `generate()`, `attention --target --json` its three kinds of attention, `explain --target
//! --focus` the cross-attention rows of the decoder row that generates the focus; and what
//! does not apply is a clear error.

mod cli_support;

use std::path::PathBuf;

use cli_support::{fails_with, ok};
use safetensors::SafeTensors;

fn model() -> String {
    model_of("bart")
}

fn model_of(name: &str) -> String {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/s2s"));
    dir.join(name).to_str().unwrap().to_string()
}

/// The expected tensor `name` as f64 (f32 or i64 in the file).
fn expected(name: &str) -> Vec<f64> {
    expected_of("bart", name)
}

fn expected_of(model: &str, name: &str) -> Vec<f64> {
    let bytes = std::fs::read(PathBuf::from(model_of(model)).join("expected.safetensors")).unwrap();
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

const SOURCE: &str = "I love machine learning";
const TARGET: &str = "J'adore l'apprentissage automatique";

#[test]
fn translate_is_transformers_greedy_generation() {
    for name in ["bart", "mbart", "marian", "t5", "t5-relu"] {
        translate_matches(name);
    }
}

fn translate_matches(name: &str) {
    let m = model_of(name);
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "translate",
        SOURCE,
        "--model",
        &m,
        "--max-new-tokens",
        "20",
        "--json",
    ]))
    .unwrap();
    let ids: Vec<f64> = json["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(ids, expected_of(name, "generated"), "{name}");
    let beams: serde_json::Value = serde_json::from_str(&ok(&[
        "translate",
        SOURCE,
        "--model",
        &m,
        "--max-new-tokens",
        "20",
        "--num-beams",
        "4",
        "--json",
    ]))
    .unwrap();
    let ids: Vec<f64> = (beams["ids"].as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(ids, expected_of(name, "beam4"), "{name}: 4 beams");
    assert_eq!(json["source"], SOURCE);
    let text = ok(&["translate", SOURCE, "--model", &m, "--max-new-tokens", "20"]);
    let translation = json["translation"].as_str().unwrap();
    // The terminal gets control characters (a random model writes some) escaped.
    if !translation.chars().any(char::is_control) {
        assert_eq!(text.trim_end(), translation, "{name}");
    }
}

#[test]
fn attention_with_a_target_is_transformers_three_attentions() {
    for name in ["bart", "marian", "t5"] {
        attention_matches(name);
    }
}

fn attention_matches(name: &str) {
    let m = model_of(name);
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "attention",
        SOURCE,
        "--target",
        TARGET,
        "--model",
        &m,
        "--json",
    ]))
    .unwrap();
    for kind in [
        "encoder_attentions",
        "decoder_attentions",
        "cross_attentions",
    ] {
        let mut got = Vec::new();
        flatten(&json[kind], &mut got);
        let want = expected_of(name, &format!("{kind}0"));
        assert_eq!(got.len(), want.len(), "{kind}");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-4, "{kind}: {worst}");
    }
    let t = expected_of(name, "labels0").len();
    assert_eq!(json["decoder_tokens"].as_array().unwrap().len(), t);
    assert_eq!(json["predicted_tokens"].as_array().unwrap().len(), t);
    assert_eq!(
        json["decoder_tokens"][1], json["predicted_tokens"][0],
        "shifted right"
    );
    let table = ok(&["attention", SOURCE, "--target", TARGET, "--model", &m]);
    assert!(
        table.contains("cross-attention of each decoder row"),
        "{table}"
    );
}

/// The bars from the target token "J" are its decoder row's cross-attention over the source
/// tokens, averaged over every decoder layer and head.
#[test]
fn explain_shows_the_cross_attention_of_the_row_that_generates_the_focus() {
    let m = model();
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "explain",
        SOURCE,
        "--target",
        TARGET,
        "--focus",
        "J",
        "--tokens",
        "--special",
        "--json",
        "--model",
        &m,
    ]))
    .unwrap();
    let cross = expected("cross_attentions0");
    let (s, t) = (expected("source_ids0").len(), expected("labels0").len());
    let per = cross.len() / (t * s);
    // "J" is the target's first token after <s>: label 1, decoder row 1.
    let rows = json["rows"].as_array().unwrap();
    for (j, row) in rows.iter().take(s).enumerate() {
        let want = (0..per).map(|lh| cross[(lh * t + 1) * s + j]).sum::<f64>() / per as f64;
        let got = row["raw"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-5,
            "source token {j}: {got} against {want}"
        );
    }
    let bars = ok(&[
        "explain",
        SOURCE,
        "--target",
        TARGET,
        "--focus",
        "apprentissage",
        "--model",
        &m,
    ]);
    assert!(
        bars.contains("Attention weights from \"apprentissage\""),
        "{bars}"
    );
    for word in ["I", "love", "machine", "learning"] {
        assert!(bars.contains(&format!("  {word} ")), "{bars}");
    }
    let encoder = ok(&[
        "explain",
        SOURCE,
        "--attention",
        "encoder",
        "--focus",
        "machine",
        "--model",
        &m,
    ]);
    assert!(
        encoder.contains("Attention weights from \"machine\""),
        "{encoder}"
    );
}

#[test]
fn what_does_not_apply_to_an_encoder_decoder_is_a_clear_error() {
    let m = model();
    let gpt2 = cli_support::tiny_gpt2();
    let gpt2 = gpt2.to_str().unwrap();
    for (args, says) in [
        (
            vec![
                "explain", SOURCE, "--target", TARGET, "--focus", "machine", "--model", &m,
            ],
            "--focus \"machine\" is a word of the source",
        ),
        (
            vec!["explain", SOURCE, "--target", TARGET, "--model", &m],
            "give --focus WORD",
        ),
        (
            vec![
                "explain",
                SOURCE,
                "--target",
                TARGET,
                "--focus",
                "J",
                "--rollout",
                "--model",
                &m,
            ],
            "--rollout and --flow",
        ),
        (
            vec!["translate", SOURCE, "--model", gpt2],
            "translate needs an encoder-decoder model",
        ),
        (
            vec!["attention", SOURCE, "--target", TARGET, "--model", gpt2],
            "--target is the target",
        ),
        (
            vec!["explain", SOURCE, "--target", TARGET, "--model", gpt2],
            "--target is the target",
        ),
        (vec!["translate", " ", "--model", &m], "the text is empty"),
        (
            vec!["translate", SOURCE, "--num-beams", "0", "--model", &m],
            "0 is not in 1..=64",
        ),
        (
            vec!["heads", SOURCE, "--model", &m],
            "is an encoder-decoder model",
        ),
    ] {
        fails_with(&args, says);
    }
    // A Marian directory without one of its tokenizer's files.
    for (missing, says) in [
        (
            "source.spm",
            "source.spm is missing (a SentencePiece model)",
        ),
        (
            "vocab.json",
            "vocab.json is missing (the model's vocab.json)",
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(model_of("marian")).unwrap() {
            let f = f.unwrap().path();
            if f.file_name().unwrap() != missing {
                std::fs::copy(&f, tmp.path().join(f.file_name().unwrap())).unwrap();
            }
        }
        fails_with(
            &["translate", SOURCE, "--model", tmp.path().to_str().unwrap()],
            says,
        );
    }
    // Marian's weights as PyTorch's pickle only: the transformers line that rewrites them.
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "vocab.json", "source.spm", "target.spm"] {
        std::fs::copy(
            PathBuf::from(model_of("marian")).join(f),
            tmp.path().join(f),
        )
        .unwrap();
    }
    std::fs::write(tmp.path().join("pytorch_model.bin"), b"").unwrap();
    let dir = tmp.path().to_str().unwrap();
    fails_with(
        &["translate", SOURCE, "--model", dir],
        "AutoModelForSeq2SeqLM.from_pretrained",
    );
    // A SentencePiece model that is not one.
    std::fs::copy(
        PathBuf::from(model_of("marian")).join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    std::fs::write(tmp.path().join("source.spm"), [0x0a, 0x05, 0x01]).unwrap();
    fails_with(
        &["translate", SOURCE, "--model", dir],
        "source.spm: not a SentencePiece model",
    );
}

/// `--truncate` on each command that reads a source: without it a long source is refused with
/// the hint, with it the model reads 64 tokens, ending in </s>, and says what it cut.
#[test]
fn a_long_source_is_refused_or_truncated() {
    let long = "The cat that ate the mouse ran away. ".repeat(12);
    for name in ["bart", "marian", "t5"] {
        let m = model_of(name);
        let err = fails_with(
            &["translate", &long, "--model", &m],
            "more than the model's 64 positions",
        );
        assert!(
            err.contains("the source is") && err.contains("--truncate"),
            "{err}"
        );
        let out = cli_support::attnscope(&[
            "translate",
            &long,
            "--truncate",
            "--max-new-tokens",
            "3",
            "--model",
            &m,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("the model reads its first 64"), "{stderr}");
        let json: serde_json::Value = serde_json::from_str(&ok(&[
            "attention",
            &long,
            "--target",
            &long,
            "--truncate",
            "--json",
            "--model",
            &m,
        ]))
        .unwrap();
        for side in ["source_tokens", "decoder_tokens"] {
            assert_eq!(json[side].as_array().unwrap().len(), 64, "{name}: {side}");
        }
        let source = json["source_tokens"].as_array().unwrap();
        assert_eq!(source.last().unwrap(), "</s>", "{name}");
        fails_with(
            &["attention", SOURCE, "--target", &long, "--model", &m],
            "the target is",
        );
    }
}

/// A focus word in both the source and the target is the target's: the bars are the
/// cross-attention of the decoder row that predicts it (`attention --json`'s, itself checked
/// against transformers above).
#[test]
fn a_focus_word_in_both_texts_is_the_targets() {
    let (source, target) = ("The cat sat on the mat", "the cat");
    let m = model();
    let att: serde_json::Value = serde_json::from_str(&ok(&[
        "attention",
        source,
        "--target",
        target,
        "--json",
        "--model",
        &m,
    ]))
    .unwrap();
    let predicted = att["predicted_tokens"].as_array().unwrap();
    let row = (predicted.iter())
        .position(|t| t.as_str().unwrap().contains("cat"))
        .unwrap();
    let cross = att["cross_attentions"].as_array().unwrap();
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "explain",
        source,
        "--target",
        target,
        "--focus",
        "cat",
        "--tokens",
        "--special",
        "--json",
        "--model",
        &m,
    ]))
    .unwrap();
    let rows = json["rows"].as_array().unwrap();
    let s = att["source_tokens"].as_array().unwrap().len();
    let mut heads = 0;
    let mut want = vec![0.0f64; s];
    for layer in cross {
        for head in layer.as_array().unwrap() {
            heads += 1;
            for (w, x) in want.iter_mut().zip(head[row].as_array().unwrap()) {
                *w += x.as_f64().unwrap();
            }
        }
    }
    for (j, r) in rows.iter().take(s).enumerate() {
        let got = r["raw"].as_f64().unwrap();
        let want = want[j] / f64::from(heads);
        assert!(
            (got - want).abs() < 1e-5,
            "source token {j}: {got} against {want}"
        );
    }
    fails_with(
        &[
            "explain", source, "--target", target, "--focus", "mat", "--model", &m,
        ],
        "is a word of the source",
    );
    fails_with(
        &[
            "explain", source, "--target", target, "--focus", "dog", "--model", &m,
        ],
        "no word \"dog\" in the target",
    );
}

/// `heatmap` on an encoder-decoder model draws the chosen kind with the right shape: the
/// cross-attention's target tokens down and source tokens across, its brightest cell where
/// `attention --json`'s weights (checked against transformers above) are largest; and refuses
/// what it cannot draw.
#[test]
fn heatmap_draws_the_cross_attention_target_down_source_across() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let att: serde_json::Value = serde_json::from_str(&ok(&[
        "attention",
        SOURCE,
        "--target",
        TARGET,
        "--json",
        "--model",
        &m,
    ]))
    .unwrap();
    let count = |key: &str| att[key].as_array().unwrap().len();
    for (kind, rows, cols, weights, layer, head) in [
        (
            "cross",
            count("predicted_tokens"),
            count("source_tokens"),
            "cross_attentions",
            1,
            2,
        ),
        (
            "encoder",
            count("source_tokens"),
            count("source_tokens"),
            "encoder_attentions",
            0,
            1,
        ),
        (
            "decoder",
            count("decoder_tokens"),
            count("decoder_tokens"),
            "decoder_attentions",
            1,
            3,
        ),
    ] {
        let out = dir.path().join(format!("{kind}.svg"));
        let out = out.to_str().unwrap();
        let (l, h) = (layer.to_string(), head.to_string());
        ok(&[
            "heatmap",
            SOURCE,
            "--target",
            TARGET,
            "--attention",
            kind,
            "--layer",
            &l,
            "--head",
            &h,
            "--model",
            &m,
            "-o",
            out,
        ]);
        let svg = std::fs::read_to_string(out).unwrap();
        let rects: Vec<(f64, f64, f64, f64, String)> = svg
            .split("<rect ")
            .skip(1)
            .map(|r| {
                let r = format!(" {}", &r[..r.find("/>").unwrap()]);
                let attr = |name: &str| {
                    let at = r.find(&format!(" {name}=\"")).unwrap();
                    let rest = &r[at + name.len() + 3..];
                    rest[..rest.find('"').unwrap()].to_string()
                };
                let num = |name: &str| attr(name).parse::<f64>().unwrap();
                (
                    num("x"),
                    num("y"),
                    num("width"),
                    num("height"),
                    attr("fill"),
                )
            })
            .collect();
        // The first rectangle is the page, the second the matrix's background.
        let (x0, y0, w, hgt, _) = rects[1].clone();
        let cell = w / cols as f64;
        assert!(
            (hgt - cell * rows as f64).abs() <= 2.0,
            "{kind}: {rows} × {cols} cells of {cell} px in {w} × {hgt}"
        );
        // The cells drawn in the scale's top colour: within half a step of 256 of the largest.
        let matrix: Vec<Vec<f64>> = (att[weights][layer][head].as_array().unwrap().iter())
            .map(|row| {
                (row.as_array().unwrap().iter())
                    .map(|x| x.as_f64().unwrap())
                    .collect()
            })
            .collect();
        let vmax = matrix.iter().flatten().copied().fold(0.0f64, f64::max);
        let mut top = Vec::new();
        for (i, row) in matrix.iter().enumerate() {
            for (j, &x) in row.iter().enumerate() {
                if (x / vmax * 255.0).round() == 255.0 {
                    top.push((i, j));
                }
            }
        }
        let brightest: Vec<(usize, usize)> = (rects.iter())
            // The matrix's cells, not the colour bar beside it.
            .filter(|r| r.4 == "#FDE725" && r.0 < x0 + w && r.1 < y0 + hgt)
            .map(|r| {
                (
                    ((r.1 - y0) / cell).round() as usize,
                    ((r.0 - x0) / cell).round() as usize,
                )
            })
            .collect();
        assert_eq!(brightest, top, "{kind}");
        assert!(
            svg.contains(&format!("layer {layer}, head {head}")),
            "{kind}"
        );
    }
    let png = dir.path().join("x.png");
    let png = png.to_str().unwrap();
    for (args, says) in [
        (vec!["--layer", "2"], "--layer 2: the decoder has 2 layers"),
        (
            vec!["--attention", "encoder", "--layer", "0", "--head", "4"],
            "--head 4: the encoder has 4 heads",
        ),
        (vec!["--grid"], "--grid"),
    ] {
        let mut all = vec![
            "heatmap", SOURCE, "--target", TARGET, "--model", &m, "-o", png,
        ];
        all.extend(args);
        fails_with(&all, says);
    }
    fails_with(
        &[
            "heatmap",
            SOURCE,
            "--target",
            TARGET,
            "-o",
            png,
            "--model",
            cli_support::tiny_gpt2().to_str().unwrap(),
        ],
        "--target is the target",
    );
}

/// `html` on an encoder-decoder model refuses what its page cannot show (a pair, the
/// attribution measures, the neuron view), and `--target` on a model that reads one text,
/// each naming the flag; no page is written.
#[test]
fn html_refuses_what_an_encoder_decoder_page_cannot_show() {
    let m = model_of("marian");
    let gpt2 = cli_support::tiny_gpt2();
    let gpt2 = gpt2.to_str().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("page.html");
    let out = out.to_str().unwrap();
    for (args, says) in [
        (
            vec!["html", SOURCE, "--pair", TARGET, "--model", &m, "-o", out],
            "--pair: an encoder-decoder model reads one source text; give its translation with --target",
        ),
        (
            vec![
                "html",
                SOURCE,
                "--methods",
                "norm",
                "--model",
                &m,
                "-o",
                out,
            ],
            "--methods: the attribution measures are not computed for an encoder-decoder model",
        ),
        (
            vec![
                "html",
                SOURCE,
                "--neuron-layer",
                "0",
                "--model",
                &m,
                "-o",
                out,
            ],
            "--neuron-layer: an encoder-decoder model's page has no neuron view",
        ),
        (
            vec![
                "html", SOURCE, "--target", TARGET, "--model", gpt2, "-o", out,
            ],
            "--target is the target of an encoder-decoder model",
        ),
        (
            vec!["html", SOURCE, "--target", " ", "--model", &m, "-o", out],
            "the target is empty",
        ),
    ] {
        fails_with(&args, says);
        assert!(!std::path::Path::new(out).exists(), "{args:?} wrote a page");
    }
}

/// Without `--target` each command says on stderr that it read the model's own translation,
/// and which; with one, or for the encoder's attention (which needs no target), it does not.
#[test]
fn the_commands_say_when_the_target_is_the_models_own_translation() {
    let dir = tempfile::tempdir().unwrap();
    let m = model();
    let translation = ok(&["translate", SOURCE, "--model", &m]);
    let note = format!(
        "note: no --target: the target is the model's own translation, {:?}",
        translation.trim_end()
    );
    let png = dir.path().join("h.png");
    let html = dir.path().join("p.html");
    let (png, html) = (png.to_str().unwrap(), html.to_str().unwrap());
    for (args, says) in [
        (vec!["attention", SOURCE, "--json"], true),
        (vec!["explain", SOURCE, "--attention", "decoder"], true),
        (vec!["explain", SOURCE, "--attention", "encoder"], false),
        (
            vec!["heatmap", SOURCE, "--attention", "cross", "-o", png],
            true,
        ),
        (vec!["html", SOURCE, "-o", html], true),
        (
            vec!["attention", SOURCE, "--target", TARGET, "--json"],
            false,
        ),
    ] {
        let mut all = args.clone();
        all.extend(["--model", m.as_str()]);
        let out = cli_support::attnscope(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{all:?}: {stderr}");
        assert_eq!(
            stderr.matches(&note).count(),
            usize::from(says),
            "{all:?}: {stderr}"
        );
    }
}
