//! `attnscope html`: the file it writes (self-contained, the model's weights to 3 decimals,
//! hostile text kept inert, also when Chromium opens it) and its errors.

mod explorer_support;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use explorer_support::{
    Browser, KEY_DOWN, attnscope, embedded_data, golden, label, tiny_gpt2, unpack_matrix,
    unpack_weights,
};
use safetensors::SafeTensors;
use serde_json::json;

fn html(args: &[&str], out: &Path) -> Output {
    attnscope()
        .arg("html")
        .args(args)
        .arg("-o")
        .arg(out)
        .arg("--model")
        .arg(tiny_gpt2())
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Writes `maps` (an `AttentionMaps` JSON) to `dir/maps.json` and makes `dir/NAME` from it
/// with `html --maps`; returns the page's path.
fn page_from_maps(dir: &Path, maps: &serde_json::Value, name: &str) -> std::path::PathBuf {
    let saved = dir.join("maps.json");
    std::fs::write(&saved, maps.to_string()).unwrap();
    let out = dir.join(name);
    let output = html_from_maps(&saved, &out, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    out
}

/// `attnscope html --maps saved -o out` with `extra` arguments.
fn html_from_maps(saved: &Path, out: &Path, extra: &[&str]) -> Output {
    attnscope()
        .args(["html", "--maps"])
        .arg(saved)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// Each payload token's label, as the page shows it before `␣` for blanks.
fn payload_labels(data: &serde_json::Value) -> Vec<&str> {
    (data["tokens"].as_array().unwrap().iter())
        .map(|t| t["label"].as_str().unwrap())
        .collect()
}

/// Chromium on the page `out`, its heatmap shown, each file it saves kept (blob and name in
/// `window.saved` and `window.names`) instead of downloaded: saving goes through a blob link.
fn heatmap_keeping_saves(out: &Path) -> Browser {
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    browser.exec(
        "window.saved = []; window.names = [];
         const make = URL.createObjectURL;
         URL.createObjectURL = (blob) => { window.saved.push(blob); return make(blob); };
         HTMLAnchorElement.prototype.click = function () { window.names.push(this.download); };
         document.querySelector('#tabs button[data-view=heatmap]').click(); return null;",
        json!([]),
    );
    browser.expect_ready();
    browser
}

/// The CSV the heatmap's Save CSV button makes now.
fn saved_csv(browser: &Browser) -> String {
    browser.exec(
        "window.text = undefined; document.getElementById('heatmap-csv').click();
         window.saved[window.saved.length - 1].text().then((t) => { window.text = t; }); return null;",
        json!([]),
    );
    assert!(browser.wait_for("window.text !== undefined", Duration::from_secs(10)));
    browser
        .exec("return window.text;", json!([]))
        .as_str()
        .unwrap()
        .to_string()
}

/// A saved heatmap's `t` rows of `t` values, row-major (its header line and each row's token
/// field, which may hold commas, left out).
fn csv_values(csv: &str, t: usize) -> Vec<f64> {
    let lines: Vec<&str> = csv.split_terminator("\r\n").collect();
    assert_eq!(lines.len(), 1 + t, "{csv}");
    (lines[1..].iter())
        .flat_map(|line| {
            let cells: Vec<&str> = line.rsplitn(t + 1, ',').collect();
            cells[..t]
                .iter()
                .rev()
                .map(|c| c.parse().unwrap())
                .collect::<Vec<f64>>()
        })
        .collect()
}

fn f32s(tensors: &SafeTensors, name: &str) -> Vec<f32> {
    tensors
        .tensor(name)
        .unwrap()
        .data()
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn page_carries_the_models_attention_to_three_decimals() {
    let bytes = std::fs::read(tiny_gpt2().join("expected/text00.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().as_ref().unwrap();
    let text: String = serde_json::from_str(&meta["text"]).unwrap();
    let tokens: Vec<String> = serde_json::from_str(&meta["tokens"]).unwrap();
    let golden = SafeTensors::deserialize(&bytes).unwrap();
    let expected = f32s(&golden, "attentions"); // [2 layers, 4 heads, 6, 6]

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cat.html");
    let output = html(&[&text], &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let page = std::fs::read_to_string(&out).unwrap();
    let data = embedded_data(&page);
    assert_eq!(data["text"], text.as_str());
    assert_eq!(
        (data["n_layers"].as_u64(), data["n_heads"].as_u64()),
        (Some(2), Some(4))
    );
    // The page reads GPT-2's tokens as the text they cover ("Ġcat" as " cat"): one label per
    // token of transformers', together the text.
    let labels = payload_labels(&data);
    assert_eq!(labels.len(), tokens.len());
    assert_eq!(labels.concat(), text);

    let weights = unpack_weights(&data);
    assert_eq!(data["weight_floor"], 0, "a short text is stored exactly");
    assert_eq!(weights.len(), expected.len());
    // Rounding to 3 decimals moves a weight by at most 0.0005; allow 1e-5 for the model itself.
    let (worst, at) = weights
        .iter()
        .zip(&expected)
        .map(|(g, e)| (g - e).abs())
        .enumerate()
        .fold(
            (0.0f32, 0),
            |(m, at), (i, d)| if d > m { (d, i) } else { (m, at) },
        );
    assert!(
        worst <= 0.0005 + 1e-5,
        "max |error| {worst} at flat index {at}"
    );

    // GPT-2 is causal: the neuron view must mask keys after the query.
    assert_eq!(data["neuron"]["causal"], true);
    assert_eq!(data["neuron"]["head_dim"], 8); // n_embd 32 / n_head 4
    assert_eq!(data["neuron"]["layers"], json!([1, 0])); // the last layer first, both fit
}

/// The default model (all-MiniLM-L6-v2, fetched into the cache on first use) on the golden
/// text: the page's weights match transformers' to 3 decimals, and the neuron view's own
/// softmax of q·k (half-float q and k) matches the model's weights for every head.
#[test]
fn real_model_page_matches_golden_and_neuron_view_agrees() {
    let bytes = std::fs::read(golden().join("minilm/text00.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().as_ref().unwrap();
    let text: String = serde_json::from_str(&meta["text"]).unwrap();
    let golden_tensors = SafeTensors::deserialize(&bytes).unwrap();
    let expected = f32s(&golden_tensors, "attentions"); // [6, 12, 15, 15]

    let model = attn_models::default_model_dir(false).expect("the default model");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("minilm.html");
    let output = attnscope()
        .args(["html", &text, "-o"])
        .arg(&out)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    let weights = unpack_weights(&data);
    assert_eq!(weights.len(), expected.len());
    let worst = weights
        .iter()
        .zip(&expected)
        .map(|(g, e)| (g - e).abs())
        .fold(0.0f32, f32::max);
    // Rounding to 3 decimals: at most 0.0005; the model itself: 1e-5 (attn-models' golden test).
    assert!(worst <= 0.0005 + 1e-5, "max |error| {worst}");
    assert_eq!(data["neuron"]["layers"], json!([5, 4, 3, 2, 1, 0]));

    let browser = Browser::start();
    browser.goto(&format!("file://{}?view=neuron", out.display()));
    browser.expect_ready();
    let mut worst = 0.0f64;
    for head in 0..12 {
        let pairs = browser.exec(
            "document.getElementById('neuron-query').value = '12';
             const h = document.getElementById('neuron-head'); h.value = String(arguments[0]);
             h.dispatchEvent(new Event('change'));
             return [...document.querySelectorAll('#neuron-body tr.key')]
                 .map(r => [Number(r.cells[5].textContent), Number(r.cells[6].textContent)]);",
            json!([head]),
        );
        let pairs = pairs.as_array().unwrap();
        assert_eq!(pairs.len(), 15);
        for pair in pairs {
            let (ours, model) = (pair[0].as_f64().unwrap(), pair[1].as_f64().unwrap());
            worst = worst.max((ours - model).abs());
        }
    }
    // Both columns are rounded to 3 decimals (0.001 apart at most) and half floats move a
    // score by about 1e-3 (11-bit mantissa on q and k), which moves a weight w by that times w
    // (measured: 0.001 at most, all from rounding).
    assert!(
        worst <= 0.002,
        "neuron softmax vs model: max |difference| {worst}"
    );
    browser.screenshot(dir.path(), "html-minilm-neuron.png");
}

#[test]
fn page_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("page.htm");
    let output = html(&["The cat sat", "--pair", "on the mat"], &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let page = std::fs::read_to_string(&out).unwrap().to_ascii_lowercase();
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the page names a network address"
    );
    for attribute in ["src=", "href="] {
        assert!(
            !page.contains(attribute),
            "the page has a {attribute} attribute"
        );
    }
}

#[test]
fn gpt2_tokens_read_as_the_bytes_they_stand_for() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bytes.html");
    let text = "Café naïve — 😀 “quotes”\tend\nnext\u{1b}[0m";
    let output = html(&[text], &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    let labels = payload_labels(&data);
    // Read back: `<0xHH>` is a byte, `\n`, `\t` and `\r` are those characters, the rest
    // as it is. Together the labels are the text's bytes, in order.
    let mut bytes = Vec::new();
    for label in &labels {
        let mut rest = *label;
        while let Some(c) = rest.chars().next() {
            if let Some(hex) = rest
                .strip_prefix("<0x")
                .filter(|r| r.get(2..3) == Some(">"))
            {
                bytes.push(u8::from_str_radix(&hex[..2], 16).unwrap());
                rest = &hex[3..];
            } else if let Some(after) = rest.strip_prefix('\\') {
                let escaped = after.chars().next().unwrap();
                bytes.push(match escaped {
                    'n' => b'\n',
                    't' => b'\t',
                    'r' => b'\r',
                    other => panic!("unknown escape \\{other} in {label:?}"),
                });
                rest = &after[1..];
            } else {
                bytes.extend(c.to_string().bytes());
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    assert_eq!(String::from_utf8_lossy(&bytes), text, "{labels:?}");
    // No byte-level letters: "é" is not "Ã©", the space not "Ġ", the escape not shown raw.
    for label in &labels {
        assert!(
            !label.contains(['Ã', 'Ġ', 'Ċ', 'ĉ', 'ð', '\u{1b}']),
            "{label:?} in {labels:?}"
        );
    }
    assert!(labels.iter().any(|l| l.starts_with("<0x")), "{labels:?}");
}

#[test]
fn hostile_text_is_data_not_markup() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("xss.html");
    let text = "</script><script>alert(1)</script>";
    let pair = "<img src=x onerror=alert(1)><!--";
    let output = html(&[text, "--pair", pair], &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let page = std::fs::read_to_string(&out).unwrap();
    // Only the template's two script elements; the data round-trips exactly.
    assert_eq!(page.matches("<script").count(), 2);
    assert!(!page.contains("<img"));
    let data = embedded_data(&page);
    assert_eq!(
        (data["text"].as_str(), data["pair"].as_str()),
        (Some(text), Some(pair))
    );

    // Chromium opens it offline: no script of the text runs, the tokens are shown as text.
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    assert_eq!(browser.alert_text(), None, "an alert opened");
    let counts = browser.exec(
        "return [document.scripts.length, document.images.length,
                 document.querySelectorAll('#view-head .tokens.left .tok').length];",
        json!([]),
    );
    let n_tokens = data["tokens"].as_array().unwrap().len();
    assert_eq!(counts, json!([2, 0, n_tokens]));
    let shown = browser.exec(
        "return [...document.querySelectorAll('#view-head .tokens.left .tok')].map(t => t.textContent).join('');",
        json!([]),
    );
    let expected: String = data["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(label)
        .collect();
    assert_eq!(shown.as_str(), Some(expected.as_str()));
    assert!(expected.contains("<") && expected.contains("script"));
    browser.screenshot(dir.path(), "html-xss.png");

    // The check above can fail: a script that does call alert() is seen.
    browser.exec(
        "setTimeout(() => alert('seen'), 0); return null;",
        json!([]),
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(browser.alert_text().as_deref(), Some("seen"));
    browser.dismiss_alert();
}

#[test]
fn unwritable_output_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("x.html");
    let output = html(&["The cat"], &missing);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("does not exist"),
        "{}",
        stderr(&output)
    );
    assert!(!missing.exists());

    let is_dir = dir.path().join("a-dir.html");
    std::fs::create_dir(&is_dir).unwrap();
    let output = html(&["The cat"], &is_dir);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("is a folder"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn unknown_extension_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["x.png", "x"] {
        let output = html(&["The cat"], &dir.path().join(name));
        assert_eq!(output.status.code(), Some(1));
        assert!(
            stderr(&output).contains("unknown extension"),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn text_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.html");
    // tiny-gpt2 has 64 positions; its byte-level BPE gives at least one token per 2 words here.
    let long = "the cat sat on the mat ".repeat(40);
    let output = html(&[&long], &out);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("64 positions"),
        "{}",
        stderr(&output)
    );

    let output = html(&[""], &out);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("error: the text is empty"),
        "{}",
        stderr(&output)
    );
    assert!(!out.exists());
}

#[test]
fn neuron_layer_out_of_range_names_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let output = html(
        &["The cat", "--neuron-layer", "2"],
        &dir.path().join("x.html"),
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("0..=1"), "{}", stderr(&output));
}

#[test]
fn bad_model_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = attnscope()
        .args(["html", "The cat", "-o"])
        .arg(dir.path().join("x.html"))
        .arg("--model")
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("loading the model in"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn saved_maps_make_a_page_without_the_neuron_view() {
    let dir = tempfile::tempdir().unwrap();
    let token =
        |text: &str| json!({"text": text, "id": 0, "span": null, "segment": 0, "special": false});
    // 1 layer, 1 head, 2 tokens: rows [0.25, 0.75] and [0.5, 0.5].
    let maps = json!({
        "model": "saved", "text": "a b", "pair": null,
        "tokens": [token("a"), token("b")],
        "n_layers": 1, "n_heads": 1, "weights": [0.25, 0.75, 0.5, 0.5]
    });
    let out = page_from_maps(dir.path(), &maps, "saved.html");
    let saved = dir.path().join("maps.json");
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(unpack_weights(&data), [0.25, 0.75, 0.5, 0.5]);
    assert!(data["neuron"].is_null());
    // The maps hold their own text, and no queries or keys: a TEXT, --pair or --neuron-layer
    // beside them would be silently ignored.
    for extra in [
        &["The dog barked"][..],
        &["--pair", "b"],
        &["--neuron-layer", "0"],
    ] {
        let output = html_from_maps(&saved, &out, extra);
        assert_eq!(output.status.code(), Some(1), "{extra:?}");
        assert!(stderr(&output).contains("cannot be used"), "{extra:?}");
    }

    std::fs::write(&saved, "{\"model\": 1}").unwrap();
    let output = html_from_maps(&saved, &out, &[]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("not attention maps JSON"),
        "{}",
        stderr(&output)
    );
}

/// The heatmap also shows every layer's heads averaged and the attention rollout, and saves
/// what it shows as PNG and CSV (tokens that a spreadsheet would read as a formula, or that
/// hold a comma or a quote, stay one cell of text).
#[test]
fn the_heatmap_shows_all_layers_and_rollout_and_saves_them() {
    let dir = tempfile::tempdir().unwrap();
    // The third token is the pair's (segment B), for the A/B filter.
    let texts = ["=x", "a,b", "\"q\""];
    let token = |(i, text): (usize, &str)| json!({"text": text, "id": 0, "span": null, "segment": usize::from(i == 2), "special": false});
    // 2 layers × 2 heads × 3 tokens, every row a different mix that sums to 1.
    let (n_layers, n_heads, t) = (2, 2, 3);
    let mut weights = Vec::new();
    for block in 0..n_layers * n_heads {
        for i in 0..t {
            let a = 0.1 * (1 + (block + i) % 5) as f64;
            let b = 0.05 * (1 + (2 * block + i) % 7) as f64;
            let mut row = [a, b, 1.0 - a - b];
            row.rotate_left((block + i) % t);
            weights.extend(row);
        }
    }
    let maps = json!({
        "model": "hand-made", "text": "=x a,b", "pair": "\"q\"",
        "tokens": texts.iter().copied().enumerate().map(token).collect::<Vec<_>>(),
        "n_layers": n_layers, "n_heads": n_heads, "weights": weights
    });
    let out = page_from_maps(dir.path(), &maps, "page.html");
    // Independently: the mean of every layer's heads, and the rollout (per layer the heads
    // averaged, 0.5·A + 0.5·I, layers multiplied from the input up).
    let w = |l: usize, h: usize, i: usize, j: usize| weights[((l * n_heads + h) * t + i) * t + j];
    let mean = |l: usize, i: usize, j: usize| {
        (0..n_heads).map(|h| w(l, h, i, j)).sum::<f64>() / n_heads as f64
    };
    let all: Vec<f64> = (0..t * t)
        .map(|k| (0..n_layers).map(|l| mean(l, k / t, k % t)).sum::<f64>() / n_layers as f64)
        .collect();
    let mut rollout: Vec<f64> = (0..t * t).map(|k| f64::from(k / t == k % t)).collect();
    for l in 0..n_layers {
        let residual = |i: usize, j: usize| 0.5 * mean(l, i, j) + 0.5 * f64::from(i == j);
        rollout = (0..t * t)
            .map(|k| {
                (0..t)
                    .map(|m| residual(k / t, m) * rollout[m * t + k % t])
                    .sum()
            })
            .collect();
    }

    let browser = heatmap_keeping_saves(&out);
    let csv_of = |choice: &str, expected: &[f64], name: &str| {
        browser.exec(
            "const s = document.getElementById('heatmap-head'); s.value = arguments[0];
             s.dispatchEvent(new Event('change')); return null;",
            json!([choice]),
        );
        browser.expect_ready();
        let hidden = browser.exec(
            "return document.getElementById('layer-control').hidden;",
            json!([]),
        );
        assert_eq!(
            hidden,
            json!(true),
            "{choice}: the layer control has no say"
        );
        let readout = browser.exec(
            "return document.getElementById('heatmap-readout').textContent;",
            json!([]),
        );
        assert!(
            readout.as_str().unwrap().contains(if choice == "all" {
                "all 2 layers"
            } else {
                "rollout"
            }),
            "{readout}"
        );
        let csv = saved_csv(&browser);
        assert_eq!(
            csv.lines().next().unwrap(),
            "query\\key,0:=x,\"1:a,b\",\"2:\"\"q\"\"\"",
            "{csv}"
        );
        for (k, got) in csv_values(&csv, t).into_iter().enumerate() {
            // The page holds both exact to 3 decimals.
            let (i, j) = (k / t, k % t);
            assert!(
                (got - expected[k]).abs() <= 5.001e-4,
                "{choice} [{i}][{j}]: {got} vs {}",
                expected[k]
            );
        }
        let names = browser.exec("return window.names;", json!([]));
        assert_eq!(names.as_array().unwrap().last().unwrap(), name);
    };
    csv_of("all", &all, "attnscope-all.csv");
    csv_of("rollout", &rollout, "attnscope-rollout.csv");
    // Filtered A → B: queries of the text, keys of the pair; the file's name says so.
    browser.exec(
        "const f = document.getElementById('filter'); f.value = 'AB';
         f.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    browser.expect_ready();
    let csv = saved_csv(&browser);
    let want = format!(
        "query\\key,\"2:\"\"q\"\"\"\r\n0:=x,{:.3}\r\n\"1:a,b\",{:.3}\r\n",
        rollout[2],
        rollout[t + 2]
    );
    assert_eq!(csv, want);
    let names = browser.exec("return window.names;", json!([]));
    assert_eq!(
        names.as_array().unwrap().last().unwrap(),
        "attnscope-rollout-AB.csv"
    );
    browser.exec(
        "window.saved = []; document.getElementById('heatmap-png').click(); return null;",
        json!([]),
    );
    assert!(browser.wait_for("window.saved.length === 1", Duration::from_secs(10)));
    let png = browser.exec(
        "return [window.saved[0].type, window.names[window.names.length - 1]];",
        json!([]),
    );
    assert_eq!(png, json!(["image/png", "attnscope-rollout-AB.png"]));
    browser.exec(
        "window.text = undefined; const reader = new FileReader();
         reader.onload = () => { window.text = reader.result; }; reader.readAsDataURL(window.saved[0]);
         return null;",
        json!([]),
    );
    assert!(browser.wait_for("window.text !== undefined", Duration::from_secs(10)));
    let url = browser.exec("return window.text;", json!([]));
    let bytes = BASE64
        .decode(
            url.as_str()
                .unwrap()
                .trim_start_matches("data:image/png;base64,"),
        )
        .unwrap();
    // The file is the canvas under a 28-px title band (IHDR: width and height, big-endian).
    let size = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let canvas = browser.exec(
        "const c = document.getElementById('heatmap-canvas'); return [c.width, c.height, window.devicePixelRatio];",
        json!([]),
    );
    let dpr = canvas[2].as_f64().unwrap();
    assert!(
        size(16) >= canvas[0].as_u64().unwrap() as u32,
        "{canvas} vs {}",
        size(16)
    );
    assert_eq!(
        size(20),
        canvas[1].as_u64().unwrap() as u32 + (28.0 * dpr).round() as u32
    );
    if let Ok(keep) = std::env::var("ATTNSCOPE_SCREENSHOTS") {
        std::fs::write(Path::new(&keep).join("html-rollout-saved.png"), &bytes).unwrap();
    }
    browser.screenshot(dir.path(), "html-rollout.png");
}

/// Weights under 0.0005 show as 0 at 3 decimals, without any floor: the page says how much
/// of a row's attention that hides (3,000 tokens of even attention drew an empty page and
/// said nothing). Each row here puts 0.99 on its own token and 0.00025 on each of 40 others.
#[test]
fn a_page_says_how_much_attention_rounds_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let t = 41;
    let token = |i: usize| json!({"text": format!("t{i}"), "id": 0, "span": null, "segment": 0, "special": false});
    let weights: Vec<f64> = (0..t * t)
        .map(|k| if k / t == k % t { 0.99 } else { 0.00025 })
        .collect();
    let maps = json!({
        "model": "hand-made", "text": "t", "pair": null,
        "tokens": (0..t).map(token).collect::<Vec<_>>(),
        "n_layers": 1, "n_heads": 1, "weights": weights
    });
    let out = page_from_maps(dir.path(), &maps, "page.html");
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    let notice = browser.exec(
        "const n = document.getElementById('notice'); return [n.hidden, n.textContent];",
        json!([]),
    );
    assert_eq!(notice[0], false, "{notice}");
    assert_eq!(
        notice[1],
        "Weights are shown to 3 decimals: those under 0.0005 show as 0 (1.0% of a row's \
         attention on average, 1.0% at most)."
    );
}

/// 512 tokens (the default model's limit) stay under 5 MB, and the page still draws.
#[test]
fn a_512_token_page_is_small_and_renders() {
    let model = attn_models::default_model_dir(false).expect("the default model");
    let text = "The cat that ate the mouse that lived in the barn ran away. ".repeat(60);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("long.html");
    let output = attnscope()
        .args(["html", &text, "--truncate", "-o"])
        .arg(&out)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let page = std::fs::read_to_string(&out).unwrap();
    assert!(page.len() < 5_000_000, "{} bytes", page.len());
    let data = embedded_data(&page);
    let n = data["tokens"].as_array().unwrap().len();
    assert_eq!(n, 512);
    // Weights below the floor are stored as 0: a row loses at most n * floor; rounding moves
    // it by at most n * 0.0005.
    let floor = data["weight_floor"].as_f64().unwrap() / 1000.0;
    for row in unpack_weights(&data).chunks(n) {
        let sum: f64 = row.iter().map(|&w| f64::from(w)).sum();
        assert!(
            sum <= 1.0 + n as f64 * 0.0005 && sum >= 1.0 - n as f64 * (floor + 0.0005),
            "row sums to {sum} (floor {floor})"
        );
    }
    // Only the last layer's queries and keys fit; the neuron view says so for the others.
    assert_eq!(data["neuron"]["layers"], json!([5]));
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    browser.exec(
        "const l = document.getElementById('layer'); l.value = '0';
         l.dispatchEvent(new Event('change'));
         document.querySelector('#tabs button[data-view=neuron]').click(); return null;",
        json!([]),
    );
    browser.expect_ready();
    let message = browser.exec(
        "return document.getElementById('neuron-body').textContent;",
        json!([]),
    );
    assert!(
        message.as_str().unwrap().contains("--neuron-layer 0"),
        "{message}"
    );
    browser.screenshot(dir.path(), "html-512-neuron.png");
    // The heatmap keeps cells of 3 px that a pointer can hit (1 px before), in a box that
    // scrolls.
    browser.click("#tabs button[data-view=heatmap]");
    browser.expect_ready();
    let width = browser.exec(
        "return document.getElementById('heatmap-canvas').getBoundingClientRect().width;",
        json!([]),
    );
    assert!(width.as_f64().unwrap() >= 3.0 * n as f64, "{width}");
}

#[test]
fn the_address_keeps_what_is_shown_and_masked_cells_are_grey() {
    // tiny-gpt2 is causal: its heatmap greys the cells of later keys.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("causal.html");
    let output = html(&["The cat sat on the mat"], &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let browser = Browser::start();
    // Opened with a #fragment: the heatmap of layer 1, head 2.
    let url = format!("file://{}", out.display());
    browser.goto(&format!("{url}#view=heatmap&layer=1&matrix=2"));
    browser.expect_ready();
    let shown = || {
        browser.exec(
            "return [document.getElementById('view-heatmap').hidden,
                     document.getElementById('layer').value,
                     document.getElementById('heatmap-head').value, location.hash];",
            json!([]),
        )
    };
    assert_eq!(
        shown(),
        json!([false, "1", "2", "#view=heatmap&layer=1&matrix=2"])
    );
    // The readout of the first row's last key (masked) and of the last row's first (seen); the
    // bitmap's colour of the first there.
    let cell = "const c = document.getElementById('heatmap-canvas'), b = c.getBoundingClientRect();
        const dpr = window.devicePixelRatio || 1;
        const [x, y] = [b.left + arguments[0], b.top + arguments[1]];
        c.dispatchEvent(new MouseEvent('mousemove', { clientX: x, clientY: y }));
        const px = c.getContext('2d').getImageData(Math.round((x - b.left) * dpr), Math.round((y - b.top) * dpr), 1, 1).data;
        return [document.getElementById('heatmap-readout').textContent, [px[0], px[1], px[2]]];";
    let geometry = browser.exec(
        "const c = document.getElementById('heatmap-canvas'), b = c.getBoundingClientRect();
         return [b.width, b.height];",
        json!([]),
    );
    // Six tokens, 24 px cells, a 60 px colour bar at the right and 4 px below: the matrix's
    // top-right cell is 72 px left of the right edge, its bottom-left 4 + 12 px above the
    // bottom.
    let (w, h) = (geometry[0].as_f64().unwrap(), geometry[1].as_f64().unwrap());
    let (left, top) = (w - 60.0 - 6.0 * 24.0, h - 4.0 - 6.0 * 24.0);
    let masked = browser.exec(cell, json!([left + 5.5 * 24.0, top + 12.0]));
    assert!(
        masked[0]
            .as_str()
            .unwrap()
            .ends_with("(5): masked (a causal model's query cannot see later keys)"),
        "{masked}"
    );
    assert_eq!(masked[1], json!([222, 222, 222]));
    let seen = browser.exec(cell, json!([left + 12.0, top + 5.5 * 24.0]));
    assert!(seen[0].as_str().unwrap().contains("(0): 0."), "{seen}");
    assert_ne!(seen[1], json!([222, 222, 222]));
    // A new #fragment in the same tab shows what it names.
    browser.exec(
        "location.hash = '#view=model&layer=1'; return null;",
        json!([]),
    );
    assert!(browser.wait_for(
        "!document.getElementById('view-model').hidden",
        Duration::from_secs(10)
    ));
    browser.expect_ready();
    browser.click("#tabs button[data-view=heatmap]");
    browser.expect_ready();
    // Changing the view writes the address; reopening it restores the view.
    browser.click("#tabs button[data-view=neuron]");
    browser.expect_ready();
    let hash = browser.exec("return location.hash;", json!([]));
    assert!(
        hash.as_str()
            .unwrap()
            .starts_with("#view=neuron&layer=1&head="),
        "{hash}"
    );
    browser.goto("about:blank");
    browser.goto(&format!("{url}{}", hash.as_str().unwrap()));
    browser.expect_ready();
    assert_eq!(
        browser.exec(
            "return [document.getElementById('view-neuron').hidden, document.getElementById('layer').value];",
            json!([])
        ),
        json!([false, "1"])
    );
}

/// The heatmap's Method select shows what `attnscope attribute` computes (norm per layer, ALTI,
/// attention × gradient rolled out, flow), each row as shares of its sum; the layer select
/// applies to norm alone, and the address and the saved file name say the method.
#[test]
fn the_heatmap_offers_the_attribution_methods() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("methods.html");
    let text = "the cat that ate the mouse ran away";
    let output = html(&[text, "--methods", "norm,alti,attn-grad,flow"], &out);
    assert!(output.status.success(), "{}", stderr(&output));
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    let t = data["tokens"].as_array().unwrap().len();
    // Independently: `attribute --json`'s matrices, each row divided by its sum.
    let attribute_at = |method: &str, key: &str, extra: &[&str]| -> Vec<f32> {
        let output = attnscope()
            .args(["attribute", text, "--method", method, "--json", "--model"])
            .arg(tiny_gpt2())
            .args(extra)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let mut flat = Vec::new();
        let mut stack = vec![&json[key]];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Array(items) => stack.extend(items.iter().rev()),
                v => flat.push(v.as_f64().unwrap() as f32),
            }
        }
        flat
    };
    let shares = |values: Vec<f32>| -> Vec<f32> {
        values
            .chunks(t)
            .flat_map(|row| {
                let sum: f32 = row.iter().sum();
                row.iter()
                    .map(move |v| if sum > 0.0 { v / sum } else { 0.0 })
            })
            .collect()
    };
    // Flow's JSON holds the scored row alone: one run per position.
    let flow: Vec<f32> = (0..t)
        .flat_map(|p| attribute_at("flow", "scores", &["--position", &p.to_string()]))
        .collect();
    let expected = [
        ("norm", 2, shares(attribute_at("norm", "per_layer", &[]))),
        ("alti", 1, shares(attribute_at("alti", "matrix", &[]))),
        (
            "attn-grad",
            1,
            shares(attribute_at("attn-grad", "matrix", &[])),
        ),
        ("flow", 1, shares(flow)),
    ];
    let measures = data["measures"].as_array().unwrap();
    assert_eq!(measures.len(), expected.len());
    for ((name, layers, want), measure) in expected.iter().zip(measures) {
        assert_eq!(measure["name"], *name);
        assert_eq!(measure["layers"], *layers);
        let got = unpack_matrix(&data, measure["matrix"].as_str().unwrap());
        assert_eq!(got.len(), want.len(), "{name}");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 5.001e-4, "{name} [{k}]: {g} vs {w}");
        }
    }
    assert!(
        measures[2]["label"]
            .as_str()
            .unwrap()
            .contains("the logit of the next token"),
        "{}",
        measures[2]["label"]
    );

    let browser = heatmap_keeping_saves(&out);
    let choose = |id: &str, value: &str| {
        browser.exec(
            "const s = document.getElementById(arguments[0]); s.value = arguments[1];
             s.dispatchEvent(new Event('change')); return null;",
            json!([id, value]),
        );
        browser.expect_ready();
    };
    let shown = |method: &str, layer: usize, want: &[f32], name: &str| {
        let controls = browser.exec(
            "return [document.getElementById('layer-control').hidden,
                     document.getElementById('heatmap-head-control').hidden,
                     document.getElementById('heatmap-readout').textContent, location.hash];",
            json!([]),
        );
        assert_eq!(controls[0], json!(method != "norm"), "{method}: {controls}");
        assert_eq!(controls[1], json!(true), "{method}: a measure has no heads");
        assert!(
            controls[2].as_str().unwrap().contains("shares of its sum"),
            "{controls}"
        );
        assert!(
            controls[3]
                .as_str()
                .unwrap()
                .contains(&format!("method={method}")),
            "{controls}"
        );
        let csv = saved_csv(&browser);
        for (k, got) in csv_values(&csv, t).into_iter().enumerate() {
            let (i, j) = (k / t, k % t);
            let w = f64::from(want[layer * t * t + k]);
            assert!(
                (got - w).abs() <= 5.001e-4,
                "{method} [{i}][{j}]: {got} vs {w}"
            );
        }
        let names = browser.exec("return window.names;", json!([]));
        assert_eq!(names.as_array().unwrap().last().unwrap(), name);
    };
    choose("heatmap-method", "norm");
    choose("layer", "0");
    shown("norm", 0, &expected[0].2, "attnscope-norm-layer0.csv");
    choose("layer", "1");
    shown("norm", 1, &expected[0].2, "attnscope-norm-layer1.csv");
    for (name, _, want) in &expected[1..] {
        choose("heatmap-method", name);
        shown(name, 0, want, &format!("attnscope-{name}.csv"));
    }
    browser.screenshot(dir.path(), "html-methods.png");
    // Back to raw weights: the Matrix select returns.
    choose("heatmap-method", "weights");
    let hidden = browser.exec(
        "return document.getElementById('heatmap-head-control').hidden;",
        json!([]),
    );
    assert_eq!(hidden, json!(false));
}

/// A page from saved maps has no measures (and says nothing of them); --methods on one, or a
/// method the heatmap cannot show, is refused.
#[test]
fn methods_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bad.html");
    for (args, message) in [
        (
            vec!["a cat", "--methods", "ig"],
            "--method ig gives one score per token, not a matrix",
        ),
        (
            vec!["a cat", "--methods", "rollout"],
            "the heatmap always offers the rollout",
        ),
        (vec!["a cat", "--methods", "nope"], "invalid value 'nope'"),
        (
            vec!["a cat", "--label", "x"],
            "the following required arguments were not provided",
        ),
        (
            vec!["a cat", "--methods", "attn-grad", "--label", "x"],
            "--label is for a classifier",
        ),
    ] {
        let output = html(&args, &out);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&output).contains(message),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!out.exists(), "{args:?}");
    }
    let maps = dir.path().join("maps.json");
    let saved = attnscope()
        .args(["attention", "a cat", "--save-maps"])
        .arg(&maps)
        .arg("--model")
        .arg(tiny_gpt2())
        .output()
        .unwrap();
    assert!(saved.status.success(), "{}", stderr(&saved));
    let output = html_from_maps(&maps, &out, &["--methods", "norm"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("--methods needs the model run on a TEXT"));
    let output = html_from_maps(&maps, &out, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(data["measures"], json!([]));
}

const S2S_SOURCE: &str = "I love machine learning";
const S2S_TARGET: &str = "J'adore l'apprentissage automatique";

/// The random encoder-decoder test checkpoint `name` (tests/data/s2s).
fn s2s_model(name: &str) -> std::path::PathBuf {
    golden().join("s2s").join(name)
}

/// `attnscope html SOURCE -o dir/NAME.html --model s2s/NAME` with `extra` arguments; the
/// page's embedded data.
fn s2s_page(dir: &Path, name: &str, extra: &[&str]) -> (std::path::PathBuf, serde_json::Value) {
    let out = dir.join(format!("{name}.html"));
    let output = attnscope()
        .args(["html", S2S_SOURCE])
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg("--model")
        .arg(s2s_model(name))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    (out, data)
}

/// The kind `name` of an encoder-decoder payload.
fn kind<'a>(data: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    (data["kinds"].as_array().unwrap().iter())
        .find(|k| k["name"] == name)
        .unwrap_or_else(|| panic!("no kind {name}"))
}

/// `[L][H][rows][cols]` JSON as its shape and its values, row-major.
fn nested(value: &serde_json::Value) -> ([usize; 4], Vec<f64>) {
    let mut shape = [0; 4];
    let mut at = value;
    for dim in &mut shape {
        *dim = at.as_array().unwrap().len();
        at = &at[0];
    }
    let mut values = Vec::new();
    for layer in value.as_array().unwrap() {
        for head in layer.as_array().unwrap() {
            for row in head.as_array().unwrap() {
                values.extend(row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()));
            }
        }
    }
    (shape, values)
}

/// A Marian's, a BART's and a T5's page hold the encoder's, the decoder's and the cross-attention,
/// each of the shape and, to 3 decimals, the values of `attention --target --json`:
/// cross-attention's rows the target's tokens over the source's as its columns.
#[test]
fn an_encoder_decoder_page_holds_its_three_kinds_of_attention() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["marian", "bart", "t5"] {
        let (_, data) = s2s_page(dir.path(), name, &["--target", S2S_TARGET]);
        let output = attnscope()
            .args(["attention", S2S_SOURCE, "--target", S2S_TARGET, "--json"])
            .arg("--model")
            .arg(s2s_model(name))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let want: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            (&data["text"], &data["target"], &data["kind"]),
            (&json!(S2S_SOURCE), &json!(S2S_TARGET), &json!("cross")),
            "{name}"
        );
        assert!(data["neuron"].is_null() && data["pair"].is_null(), "{name}");
        let names: Vec<&str> = (data["kinds"].as_array().unwrap().iter())
            .map(|k| k["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["cross", "encoder", "decoder"], "{name}");
        let count = |field: &str| want[field].as_array().unwrap().len();
        let (s, t) = (count("source_tokens"), count("decoder_tokens"));
        assert_eq!(count("predicted_tokens"), t, "{name}");
        for (kind_name, field, rows, cols, causal) in [
            ("encoder", "encoder_attentions", s, s, false),
            ("decoder", "decoder_attentions", t, t, true),
            ("cross", "cross_attentions", t, s, false),
        ] {
            let kind = kind(&data, kind_name);
            let (shape, values) = nested(&want[field]);
            assert_eq!(shape[2..], [rows, cols], "{name} {kind_name}");
            assert_eq!(
                (&kind["n_layers"], &kind["n_heads"]),
                (&json!(shape[0]), &json!(shape[1])),
                "{name} {kind_name}"
            );
            let keys = kind["key_tokens"]
                .as_array()
                .unwrap_or_else(|| kind["tokens"].as_array().unwrap());
            assert_eq!(
                (kind["tokens"].as_array().unwrap().len(), keys.len()),
                (rows, cols),
                "{name} {kind_name}"
            );
            assert_eq!(kind["causal"], causal, "{name} {kind_name}");
            assert_eq!(kind["weight_floor"], 0, "{name} {kind_name}");
            let got = unpack_matrix(kind, kind["weights"].as_str().unwrap());
            assert_eq!(got.len(), values.len(), "{name} {kind_name}");
            let worst = (got.iter().zip(&values))
                .map(|(g, w)| (f64::from(*g) - w).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 5.001e-4, "{name} {kind_name}: off by {worst}");
        }
        // Cross-attention's keys are the encoder's tokens, its queries the target's tokens,
        // which the decoder reads one place later (after its start token).
        let labels = |kind: &serde_json::Value, field: &str| -> Vec<String> {
            kind[field].as_array().unwrap().iter().map(label).collect()
        };
        let (cross, decoder) = (kind(&data, "cross"), kind(&data, "decoder"));
        assert_eq!(
            labels(cross, "key_tokens"),
            labels(kind(&data, "encoder"), "tokens"),
            "{name}"
        );
        assert_eq!(
            labels(cross, "tokens")[..t - 1],
            labels(decoder, "tokens")[1..],
            "{name}"
        );
        assert!(decoder["tokens"][0]["special"] == true, "{name}");
        assert!(kind(&data, "cross")["rollout"].is_null(), "{name}");
    }
    // Without --target the target is the model's own translation, which `translate` prints.
    let (_, data) = s2s_page(dir.path(), "marian", &[]);
    let output = attnscope()
        .args(["translate", S2S_SOURCE, "--model"])
        .arg(s2s_model("marian"))
        .output()
        .unwrap();
    let translation = String::from_utf8(output.stdout).unwrap();
    assert_eq!(data["target"], translation.trim_end_matches('\n'));
}

/// The page's Attention select switches the head view, the model view and the heatmap
/// between the three kinds: cross-attention draws the target's tokens against the source's,
/// the encoder's the source against itself, the decoder's what it reads against itself; the
/// neuron view says it is not available.
#[test]
fn the_attention_select_switches_every_view_between_the_three_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let (out, data) = s2s_page(dir.path(), "marian", &["--target", S2S_TARGET]);
    let labels = |kind_name: &str, field: &str| -> Vec<String> {
        let kind = kind(&data, kind_name);
        let field = if kind[field].is_null() {
            "tokens"
        } else {
            field
        };
        kind[field].as_array().unwrap().iter().map(label).collect()
    };
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    let columns = || -> (Vec<String>, Vec<String>) {
        let got = browser.exec(
            "const side = (s) => [...document.querySelectorAll('#view-head .tokens.' + s + ' .tok')].map((t) => t.textContent);
             return [side('left'), side('right')];",
            json!([]),
        );
        serde_json::from_value(got).unwrap()
    };
    let choose = |kind: &str| {
        browser.exec(
            "const s = document.getElementById('kind'); s.value = arguments[0];
             s.dispatchEvent(new Event('change')); return null;",
            json!([kind]),
        );
        browser.expect_ready();
    };
    let shown = |css: &str| {
        browser.exec(
            "const e = document.querySelector(arguments[0]); return !!e && !e.closest('[hidden]');",
            json!([css]),
        ) == json!(true)
    };
    // Cross-attention first: the target's tokens down the left, the source's on the right.
    assert!(shown("#kind-control"));
    assert!(!shown("#filter-control"));
    assert_eq!(
        browser.exec("return document.getElementById('kind').value;", json!([])),
        "cross"
    );
    assert_eq!(
        columns(),
        (labels("cross", "tokens"), labels("cross", "key_tokens"))
    );
    let about = browser.exec(
        "return document.getElementById('kind-about').textContent;",
        json!([]),
    );
    assert!(about.as_str().unwrap().starts_with("Cross:"), "{about}");
    for (kind_name, rows) in [
        ("encoder", "encoder"),
        ("decoder", "decoder"),
        ("cross", "cross"),
    ] {
        choose(kind_name);
        assert_eq!(
            columns(),
            (labels(rows, "tokens"), labels(rows, "key_tokens")),
            "{kind_name}"
        );
        let hash = browser.exec("return location.hash;", json!([]));
        assert!(
            hash.as_str()
                .unwrap()
                .contains(&format!("attention={kind_name}")),
            "{hash}"
        );
    }
    // A pinned target token draws only its own lines: to the source's tokens.
    browser.click("#view-head .tokens.left .tok[data-index='1']");
    let caption = browser.exec(
        "return document.querySelector('#view-head p.muted').textContent;",
        json!([]),
    );
    assert!(
        caption
            .as_str()
            .unwrap()
            .starts_with("Query \"J\" (1) is pinned"),
        "{caption}"
    );
    // The model view: a thumbnail per decoder layer and head, for each kind.
    browser.click("#tabs button[data-view=model]");
    browser.expect_ready();
    assert!(shown("#kind-control"));
    for kind_name in ["encoder", "cross"] {
        choose(kind_name);
        let thumbs = browser.exec(
            "return document.querySelectorAll('#view-model canvas').length;",
            json!([]),
        );
        assert_eq!(thumbs, json!(8), "{kind_name}");
    }
    // The heatmap: rows × columns of the kind shown, rollout only for self-attention.
    browser.click("#tabs button[data-view=heatmap]");
    browser.expect_ready();
    let (s, t) = (
        labels("encoder", "tokens").len(),
        labels("cross", "tokens").len(),
    );
    let heatmap = || {
        browser.exec(
            "const c = document.getElementById('heatmap-canvas');
             return [c.getAttribute('aria-label'), [...document.getElementById('heatmap-head').options].some((o) => o.value === 'rollout')];",
            json!([]),
        )
    };
    for (kind_name, rows, cols, rollout) in [
        ("cross", t, s, false),
        ("encoder", s, s, true),
        ("decoder", t, t, true),
    ] {
        choose(kind_name);
        let got = heatmap();
        assert!(
            got[0].as_str().unwrap().ends_with(&format!(
                "{rows} queries × {cols} keys: arrow keys read a cell's weight"
            )),
            "{kind_name}: {got}"
        );
        assert_eq!(got[1], rollout, "{kind_name}");
    }
    // The readout names the cross-attention's query (target) and key (source) tokens.
    choose("cross");
    browser.press("#heatmap-canvas", KEY_DOWN);
    let readout = browser.exec(
        "return document.getElementById('heatmap-readout').textContent;",
        json!([]),
    );
    let first = format!(
        "query {:?} (0) → key {:?} (0): ",
        labels("cross", "tokens")[0],
        labels("encoder", "tokens")[0]
    );
    assert!(readout.as_str().unwrap().contains(&first), "{readout}");
    // The neuron view says why it is not there.
    browser.click("#tabs button[data-view=neuron]");
    browser.expect_ready();
    let neuron = browser.exec(
        "return document.getElementById('neuron-body').textContent;",
        json!([]),
    );
    assert!(
        neuron
            .as_str()
            .unwrap()
            .contains("not available for an encoder-decoder model"),
        "{neuron}"
    );
    assert!(!shown("#kind-control") && !shown("#neuron-head") && !shown("#layer"));
    let error = browser.exec("return document.getElementById('error').hidden;", json!([]));
    assert_eq!(error, json!(true));
}

/// A hostile source and target stay data on an encoder-decoder model's page: no script of
/// theirs runs in Chromium, and every kind's tokens are drawn as text.
#[test]
fn a_hostile_source_and_target_are_data_on_an_encoder_decoder_page() {
    let dir = tempfile::tempdir().unwrap();
    let target = "<img src=x onerror=alert(1)><!--";
    let out = dir.path().join("xss.html");
    let output = attnscope()
        .args([
            "html",
            "</script><script>alert(1)</script>",
            "--target",
            target,
        ])
        .arg("-o")
        .arg(&out)
        .arg("--model")
        .arg(s2s_model("bart"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let page = std::fs::read_to_string(&out).unwrap();
    assert_eq!(page.matches("<script").count(), 2);
    assert!(!page.contains("<img"));
    let data = embedded_data(&page);
    assert_eq!(data["target"], target);
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    for name in ["cross", "encoder", "decoder"] {
        browser.exec(
            "const s = document.getElementById('kind'); s.value = arguments[0];
             s.dispatchEvent(new Event('change')); return null;",
            json!([name]),
        );
        browser.expect_ready();
        let shown = browser.exec(
            "return [document.scripts.length, document.images.length,
                     [...document.querySelectorAll('#view-head .tokens.left .tok')].map(t => t.textContent).join('')];",
            json!([]),
        );
        let expected: String = (kind(&data, name)["tokens"].as_array().unwrap().iter())
            .map(label)
            .collect();
        assert_eq!(shown, json!([2, 0, expected]), "{name}");
    }
    assert!(
        (kind(&data, "cross")["tokens"].as_array().unwrap().iter())
            .map(label)
            .collect::<String>()
            .contains('<')
    );
    assert_eq!(browser.alert_text(), None, "an alert opened");
}

const ROWS_TEXT: &str = "The cat that ate the mouse that lived in the barn ran away";

/// The random Qwen2 decoder checkpoint (tests/data/llm/qwen2).
fn qwen2() -> std::path::PathBuf {
    golden().join("llm").join("qwen2")
}

/// `attnscope html ROWS_TEXT --rows ROWS -o dir/NAME` with `source` ("--model", DIR) or
/// `html --maps FILE --rows ROWS -o dir/NAME` with ("--maps", FILE); the page's path and its
/// embedded data.
fn rows_page(
    dir: &Path,
    name: &str,
    source: (&str, &Path),
    rows: &str,
) -> (std::path::PathBuf, serde_json::Value) {
    let out = dir.join(name);
    let mut command = attnscope();
    match source {
        ("--maps", maps) => command.args(["html", "--maps"]).arg(maps),
        (_, model) => command.args(["html", ROWS_TEXT, "--model"]).arg(model),
    };
    let output = command
        .args(["--rows", rows, "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let data = embedded_data(&std::fs::read_to_string(&out).unwrap());
    (out, data)
}

/// A `--rows` page of Qwen2 (causal) and of MiniLM (bidirectional) holds one kind: the rows
/// asked for over every token, which the model computed alone and which are, to 3 decimals,
/// the same rows of the full pass (`attention --json`); from saved full maps, the same.
#[test]
fn a_rows_page_holds_the_chosen_rows_of_the_full_pass() {
    let dir = tempfile::tempdir().unwrap();
    let minilm = attn_models::default_model_dir(false).expect("the default model");
    for (model, causal) in [(qwen2(), true), (minilm, false)] {
        let output = attnscope()
            .args(["attention", ROWS_TEXT, "--json", "--model"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let want: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let ([l, h, t, _], full) = nested(&want["attentions"]);
        for (rows, chosen) in [("3..6", 3..6), ("-2..", t - 2..t)] {
            let (_, data) = rows_page(dir.path(), "rows.html", ("--model", model.as_path()), rows);
            let what = format!("{} --rows {rows}", model.display());
            assert_eq!(
                (&data["rows"], &data["kind"]),
                (&json!(true), &json!("rows"))
            );
            assert!(data["neuron"].is_null(), "{what}");
            assert_eq!(data["measures"], json!([]), "{what}");
            let kinds = data["kinds"].as_array().unwrap();
            assert_eq!(kinds.len(), 1, "{what}");
            let kind = &kinds[0];
            let r = chosen.len();
            assert_eq!(
                (
                    kind["tokens"].as_array().unwrap().len(),
                    kind["key_tokens"].as_array().unwrap().len()
                ),
                (r, t),
                "{what}"
            );
            assert_eq!(kind["positions"], json!(chosen.clone().collect::<Vec<_>>()));
            assert_eq!(kind["causal"], causal, "{what}");
            assert_eq!(
                (&kind["n_layers"], &kind["n_heads"]),
                (&json!(l), &json!(h))
            );
            assert_eq!(kind["weight_floor"], 0, "{what}");
            let about = kind["about"].as_str().unwrap();
            assert_eq!(
                about,
                format!(
                    "Rows {}..{} of the {t} tokens (queries, left; heatmap rows), each over \
                     every token (keys, right; columns): the model computed these rows' \
                     weights alone.",
                    chosen.start, chosen.end
                ),
                "{what}"
            );
            // The full pass's rows `chosen` of every layer and head.
            let expected: Vec<f64> = (0..l * h)
                .flat_map(|lh| chosen.clone().map(move |i| (lh * t + i) * t))
                .flat_map(|at| full[at..at + t].iter().copied())
                .collect();
            let got = unpack_matrix(kind, kind["weights"].as_str().unwrap());
            assert_eq!(got.len(), expected.len(), "{what}");
            let worst = (got.iter().zip(&expected))
                .map(|(g, w)| (f64::from(*g) - w).abs())
                .fold(0.0, f64::max);
            assert!(worst <= 5.001e-4, "{what}: off by {worst}");
        }
    }
    // From saved maps of every row: the same rows, said to be taken from them.
    let maps = dir.path().join("maps.json");
    let output = attnscope()
        .args(["attention", ROWS_TEXT, "--save-maps"])
        .arg(&maps)
        .arg("--model")
        .arg(qwen2())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let (_, alone) = rows_page(
        dir.path(),
        "alone.html",
        ("--model", qwen2().as_path()),
        "3..6",
    );
    let (_, sliced) = rows_page(
        dir.path(),
        "sliced.html",
        ("--maps", maps.as_path()),
        "3..6",
    );
    let (alone, sliced) = (&alone["kinds"][0], &sliced["kinds"][0]);
    assert!(
        (sliced["about"].as_str().unwrap()).ends_with(": taken from a pass over every row."),
        "{sliced}"
    );
    let values = |kind: &serde_json::Value| unpack_matrix(kind, kind["weights"].as_str().unwrap());
    let worst = (values(alone).iter().zip(values(sliced)))
        .map(|(a, s)| (a - s).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 0.0011, "the sliced rows are off by {worst}");
    assert_eq!(alone["tokens"], sliced["tokens"]);
    assert_eq!(alone["key_tokens"], sliced["key_tokens"]);
}

/// The head view of a `--rows` page lists the chosen rows' tokens as queries (left) and every
/// token as keys (right); the page says what it shows, offers no kind to choose, and its
/// neuron view says why it is not there.
#[test]
fn a_rows_page_shows_the_chosen_queries_over_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let (out, data) = rows_page(
        dir.path(),
        "rows.html",
        ("--model", qwen2().as_path()),
        "2..5",
    );
    let kind = &data["kinds"][0];
    let labels = |field: &str| -> Vec<String> {
        kind[field].as_array().unwrap().iter().map(label).collect()
    };
    let t = labels("key_tokens").len();
    let browser = Browser::start();
    browser.goto(&format!("file://{}", out.display()));
    browser.expect_ready();
    let columns = browser.exec(
        "const side = (s) => [...document.querySelectorAll('#view-head .tokens.' + s + ' .tok')].map((t) => t.textContent);
         return [side('left'), side('right')];",
        json!([]),
    );
    let (left, right): (Vec<String>, Vec<String>) = serde_json::from_value(columns).unwrap();
    assert_eq!(left, labels("tokens"));
    assert_eq!(right, labels("key_tokens"));
    assert_eq!((left.len(), right.len()), (3, t));
    let shown = |css: &str| {
        browser.exec(
            "const e = document.querySelector(arguments[0]); return !!e && !e.closest('[hidden]');",
            json!([css]),
        ) == json!(true)
    };
    assert!(!shown("#kind-control") && shown("#kind-about"));
    let text = |id: &str| {
        browser
            .exec(
                "return document.getElementById(arguments[0]).textContent;",
                json!([id]),
            )
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        text("kind-about").starts_with(&format!("Rows 2..5 of the {t} tokens")),
        "{}",
        text("kind-about")
    );
    let summary = text("summary");
    assert!(
        summary.contains(&format!(
            "3 of {t} tokens as queries, each over every token"
        )),
        "{summary}"
    );
    // A pinned query is named by its position in the text, not its row on the page.
    browser.click("#view-head .tokens.left .tok[data-index='0']");
    let caption = browser.exec(
        "return document.querySelector('#view-head p.muted').textContent;",
        json!([]),
    );
    let pinned = format!("Query {:?} (2) is pinned", labels("tokens")[0]);
    assert!(caption.as_str().unwrap().starts_with(&pinned), "{caption}");
    browser.click("#tabs button[data-view=neuron]");
    browser.expect_ready();
    let neuron = text("neuron-body");
    assert!(
        neuron.contains("not available on a page of chosen rows (--rows)"),
        "{neuron}"
    );
    assert!(!shown("#neuron-head"));
    let error = browser.exec("return document.getElementById('error').hidden;", json!([]));
    assert_eq!(error, json!(true));
}

/// A causal model's `--rows` heatmap greys each chosen row's keys after its own position (not
/// after its row on the page) and shows the keys up to it.
#[test]
fn a_rows_heatmap_masks_the_keys_after_each_rows_position() {
    let dir = tempfile::tempdir().unwrap();
    let (out, data) = rows_page(
        dir.path(),
        "rows.html",
        ("--model", qwen2().as_path()),
        "2..5",
    );
    let t = data["kinds"][0]["key_tokens"].as_array().unwrap().len();
    let browser = heatmap_keeping_saves(&out);
    let geometry = browser.exec(
        "const c = document.getElementById('heatmap-canvas'), b = c.getBoundingClientRect();
         return [b.width, b.height];",
        json!([]),
    );
    // 3 rows of t keys in 24 px cells (t is under 30), a 60 px colour bar at the right and
    // 4 px below.
    let cell = 24.0;
    let (w, h) = (geometry[0].as_f64().unwrap(), geometry[1].as_f64().unwrap());
    let (left, top) = (w - 60.0 - t as f64 * cell, h - 4.0 - 3.0 * cell);
    let read = |row: usize, key: usize| {
        browser.exec(
            "const c = document.getElementById('heatmap-canvas'), b = c.getBoundingClientRect();
             const dpr = window.devicePixelRatio || 1;
             const [x, y] = [b.left + arguments[0], b.top + arguments[1]];
             c.dispatchEvent(new MouseEvent('mousemove', { clientX: x, clientY: y }));
             const px = c.getContext('2d').getImageData(Math.round((x - b.left) * dpr), Math.round((y - b.top) * dpr), 1, 1).data;
             return [document.getElementById('heatmap-readout').textContent, [px[0], px[1], px[2]]];",
            json!([
                left + (key as f64 + 0.5) * cell,
                top + (row as f64 + 0.5) * cell
            ]),
        )
    };
    let grey = json!([222, 222, 222]);
    for (row, position) in [(0, 2), (2, 4)] {
        // Its own key and the one before it are seen; the one after it is masked.
        for key in [position - 1, position] {
            let seen = read(row, key);
            let says = format!("({position}) → key");
            let readout = seen[0].as_str().unwrap();
            assert!(
                readout.contains(&says) && !readout.contains("masked"),
                "{seen}"
            );
            assert_ne!(seen[1], grey, "row {row}, key {key}");
        }
        let masked = read(row, position + 1);
        assert!(
            (masked[0].as_str().unwrap())
                .ends_with("masked (a causal model's query cannot see later keys)"),
            "{masked}"
        );
        assert_eq!(masked[1], grey, "row {row}, key {}", position + 1);
    }
    // The saved CSV names each row by its position too.
    let csv = saved_csv(&browser);
    let firsts: Vec<&str> = (csv.split_terminator("\r\n").skip(1))
        .map(|line| line.split(':').next().unwrap())
        .collect();
    assert_eq!(firsts, ["2", "3", "4"], "{csv}");
}

/// `--rows` refuses what it cannot show, naming the flag, with exit status 1: an empty or
/// malformed range, the measures, the neuron view, an encoder-decoder model.
#[test]
fn rows_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.html");
    let fails = |args: &[&str], model: &Path, says: &str| {
        let output = attnscope()
            .arg("html")
            .args(args)
            .arg("-o")
            .arg(&out)
            .arg("--model")
            .arg(model)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(says),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!out.exists(), "{args:?} wrote a page");
    };
    let gpt2 = tiny_gpt2();
    let text = "The cat sat on the mat";
    for (rows, says) in [
        ("5..2", "--rows 5..2 selects no row of the 6 tokens"),
        ("6..", "--rows 6.. selects no row of the 6 tokens"),
        ("x", "invalid value 'x' for '--rows <START..END>'"),
        ("x..2", "START \"x\" is not a whole number"),
    ] {
        fails(&[text, "--rows", rows], &gpt2, says);
    }
    fails(
        &[text, "--rows", "0..2", "--methods", "norm"],
        &gpt2,
        "--methods: a page of --rows holds those rows' attention weights alone",
    );
    fails(
        &[text, "--rows", "0..2", "--neuron-layer", "0"],
        &gpt2,
        "--neuron-layer: a page of --rows has no neuron view",
    );
    fails(
        &[S2S_SOURCE, "--rows", "0..2"],
        &s2s_model("marian"),
        "--rows: an encoder-decoder model's page holds its three kinds of attention whole",
    );
}
