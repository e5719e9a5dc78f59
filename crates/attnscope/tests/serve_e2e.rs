//! `attnscope serve` end to end: its JSON API and limits, then the page in headless Chromium —
//! type text, submit, see every view draw the tokens; hostile text runs no script.

mod explorer_support;

use std::time::Duration;

use explorer_support::{
    Browser, KEY_DOWN, KEY_ENTER, KEY_ESCAPE, KEY_RIGHT, Server, get, label, post, tiny_gpt2,
    unpack_weights,
};
use serde_json::{Value, json};

fn labels(data: &Value) -> Vec<String> {
    data["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(label)
        .collect()
}

#[test]
fn api_answers_and_refuses_clearly() {
    let mut server = Server::start(&tiny_gpt2());
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );

    let (status, page, csp) = get(&server.url);
    assert_eq!(status, 200);
    assert!(page.contains("data-mode=\"app\""));
    assert!(csp.unwrap().contains("default-src 'none'"));

    let (status, body) = post(
        &server.api(),
        &json!({"text": "The cat sat", "pair": "on the mat"}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    let n = data["tokens"].as_array().unwrap().len();
    assert!(
        data["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["segment"] == 1)
    );
    let weights = unpack_weights(&data);
    assert_eq!(weights.len(), 2 * 4 * n * n);
    // Every query row of every head sums to 1, up to n roundings of at most 0.0005 each.
    for row in weights.chunks(n) {
        let sum: f32 = row.iter().sum();
        assert!(
            (sum - 1.0).abs() <= 0.0005 * n as f32 + 1e-6,
            "row sums to {sum}"
        );
    }

    // The neuron view asks for the layer it shows first.
    let (status, body) = post(
        &server.api(),
        &json!({"text": "The cat", "neuron_layer": 0}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(data["neuron"]["layers"], json!([0, 1]));

    // A body over 1 MiB: 413, as JSON the page can show.
    let big = json!({ "text": "a".repeat((1 << 20) + 1) }).to_string();
    let (status, body) = post(&server.api(), &big);
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("larger than 1024 KiB"), "{body}");

    // Text over the model's 64 positions: a readable error.
    let long = json!({ "text": "the cat sat on the mat ".repeat(40) }).to_string();
    let (status, body) = post(&server.api(), &long);
    assert_eq!(status, 422, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(
        error["error"].as_str().unwrap().contains("at most 64"),
        "{body}"
    );

    for (bad, why) in [
        ("{", "not JSON"),
        ("{\"txt\": \"a\"}", "unknown field"),
        ("{\"text\": 5}", "wrong type"),
        ("{\"text\": \"\"}", "empty text"),
        (
            "{\"text\": \"a\", \"neuron_layer\": 7}",
            "layer out of range",
        ),
    ] {
        let (status, body) = post(&server.api(), bad);
        assert!((400..500).contains(&status), "{why}: {status} {body}");
        let error: Value = serde_json::from_str(&body).unwrap();
        assert!(error["error"].is_string(), "{why}: {body}");
    }

    // Odd text never brings the server down.
    for text in ["\u{0}\u{fffd}\u{202e}", "🙂🙂🙂", "\r\n\t", "\u{10ffff}"] {
        let (status, body) = post(&server.api(), &json!({ "text": text }).to_string());
        assert!(status == 200 || status == 422, "{text:?}: {status} {body}");
    }
    assert!(server.alive());
}

#[test]
fn a_hundred_concurrent_requests_all_complete() {
    let mut server = Server::start(&tiny_gpt2());
    let api = server.api();
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..100)
            .map(|i| {
                let api = &api;
                scope.spawn(move || {
                    let text = "the cat sat on the mat ".repeat(1 + i % 10);
                    post(api, &json!({ "text": text }).to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        let data: Value = serde_json::from_str(body).unwrap();
        assert!(!data["tokens"].as_array().unwrap().is_empty());
    }
    assert!(server.alive());
}

#[test]
fn browser_shows_every_view_of_the_submitted_text() {
    let server = Server::start(&tiny_gpt2());
    let dir = tempfile::tempdir().unwrap();
    let (text, pair) = ("The cat sat", "on the mat");
    let (_, body) = post(
        &server.api(),
        &json!({"text": text, "pair": pair}).to_string(),
    );
    let expected = labels(&serde_json::from_str(&body).unwrap());

    let browser = Browser::start();
    browser.goto(&server.url);
    assert_eq!(browser.settled_state(), "idle");
    browser.type_into("#input-text", text);
    browser.type_into("#input-pair", pair);
    browser.click("#input-submit");
    browser.expect_ready();
    // The address names what is shown, so that it can be bookmarked or shared.
    assert_eq!(
        browser.exec("return [location.search, location.hash];", json!([])),
        json!(["?text=The+cat+sat&pair=on+the+mat", "#view=head&layer=1"])
    );
    // A link opened in this tab shows what it names, and the rest as a new tab would: the
    // filter and the heads turned off here do not carry over.
    browser.exec(
        "location.hash = 'filter=AB&heads=1.2'; return null;",
        json!([]),
    );
    assert!(browser.wait_for(
        "document.getElementById('filter').value === 'AB'",
        Duration::from_secs(10)
    ));
    browser.exec(
        "location.hash = 'view=model&layer=1'; return null;",
        json!([]),
    );
    assert!(browser.wait_for(
        "location.hash === '#view=model&layer=1' && document.getElementById('filter').value === 'all'",
        Duration::from_secs(10)
    ));
    browser.exec(
        "location.hash = 'view=head&layer=1'; return null;",
        json!([]),
    );
    assert!(browser.wait_for(
        "!document.getElementById('view-head').hidden",
        Duration::from_secs(10)
    ));
    browser.expect_ready();

    let column = |side: &str| {
        browser.exec(
            &format!("return [...document.querySelectorAll('#view-head .tokens.{side} .tok')].map(t => t.textContent);"),
            json!([]),
        )
    };
    assert_eq!(column("left"), json!(expected));
    assert_eq!(column("right"), json!(expected));
    // The head view drew lines: its canvas has coloured pixels.
    let painted = "const c = document.querySelector(arguments[0]);
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;";
    assert!(
        browser
            .exec(painted, json!(["#view-head canvas"]))
            .as_u64()
            .unwrap()
            > 100
    );
    assert_eq!(
        browser.exec(
            "return !document.getElementById('filter-control').hidden;",
            json!([])
        ),
        json!(true),
        "a pair offers the A/B filter"
    );
    browser.screenshot(dir.path(), "serve-head.png");

    // Pointing at a token isolates its lines: the first query of a causal model sees only
    // itself, one line instead of every line.
    let all_lines = browser.exec(painted, json!(["#view-head canvas"]));
    browser.exec(
        "document.querySelector('#view-head .tokens.left .tok')
             .dispatchEvent(new MouseEvent('mouseover', { bubbles: true })); return null;",
        json!([]),
    );
    let one_token = browser.exec(painted, json!(["#view-head canvas"]));
    assert!(
        one_token.as_u64().unwrap() * 3 < all_lines.as_u64().unwrap(),
        "{one_token} vs {all_lines}"
    );
    browser.exec(
        "document.querySelector('#view-head .headview').dispatchEvent(new MouseEvent('mouseleave'));
         return null;",
        json!([]),
    );

    // The A/B filter: GPT-2 is causal and the text (A) comes first, so A's queries never see
    // B's keys (no line at all) while B's queries do see A's keys.
    let set_filter = |value: &str| {
        browser.exec(
            "const f = document.getElementById('filter'); f.value = arguments[0];
             f.dispatchEvent(new Event('change')); return null;",
            json!([value]),
        );
        browser.expect_ready();
        browser
            .exec(painted, json!(["#view-head canvas"]))
            .as_u64()
            .unwrap()
    };
    assert_eq!(set_filter("AB"), 0);
    // The empty view says why instead of showing nothing.
    let caption = browser.exec(
        "return document.querySelector('#view-head > p.muted').textContent;",
        json!([]),
    );
    assert!(
        caption
            .as_str()
            .unwrap()
            .contains("A comes before B, so a causal model's A tokens cannot see B"),
        "{caption}"
    );
    assert!(set_filter("BA") > 0);
    let all_lines = set_filter("all");

    // Clicking a token pins its lines: they stay when the pointer leaves, and clicking it
    // again lets them go.
    let lines = || {
        browser
            .exec(painted, json!(["#view-head canvas"]))
            .as_u64()
            .unwrap()
    };
    let pinned = || {
        browser.exec(
            "const t = document.querySelector('#view-head .tok.pinned');
             return t && [t.dataset.side, Number(t.dataset.index), t.getAttribute('aria-selected')];",
            json!([]),
        )
    };
    browser.click("#view-head .tokens.left .tok:nth-child(3)");
    assert_eq!(pinned(), json!(["left", 2, "true"]));
    let one_query = lines();
    assert!(
        one_query > 0 && one_query * 3 < all_lines,
        "{one_query} vs {all_lines}"
    );
    browser.exec(
        "document.querySelector('#view-head .headview').dispatchEvent(new MouseEvent('mouseleave'));
         return null;",
        json!([]),
    );
    assert_eq!(lines(), one_query);
    browser.click("#view-head .tokens.left .tok:nth-child(3)");
    assert_eq!(pinned(), json!(null));
    assert_eq!(lines(), all_lines);

    // By keyboard: the query column takes focus, arrow keys pin and move a token, Escape lets
    // it go, Enter on a pinned query opens its neuron view.
    let column = "#view-head .tokens.left";
    browser.press(column, &KEY_DOWN.repeat(2));
    assert_eq!(pinned(), json!(["left", 1, "true"]));
    // The pin stays through a new layer and a narrower window (lines redrawn, focus kept).
    browser.exec(
        "const l = document.getElementById('layer'); l.value = '0';
         l.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    browser.expect_ready();
    assert_eq!(pinned(), json!(["left", 1, "true"]));
    browser.exec(
        "window.dispatchEvent(new Event('resize')); return null;",
        json!([]),
    );
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(pinned(), json!(["left", 1, "true"]));
    browser.press(column, KEY_ESCAPE);
    assert_eq!(pinned(), json!(null));
    assert_eq!(lines(), all_lines);
    browser.press(column, &format!("{}{KEY_ENTER}", KEY_DOWN.repeat(3)));
    browser.expect_ready();
    assert_eq!(
        browser.exec(
            "return [document.getElementById('view-neuron').hidden,
                     document.querySelector('#neuron-body strong').textContent,
                     document.getElementById('filter-control').hidden];",
            json!([])
        ),
        json!([false, serde_json::to_string(&expected[2]).unwrap(), true]),
        "the neuron view of the third token, without the A/B filter (it does not apply there)"
    );

    browser.click("#tabs button[data-view=model]");
    browser.expect_ready();
    assert_eq!(
        browser.exec(
            "return document.querySelectorAll('#view-model canvas').length;",
            json!([])
        ),
        json!(2 * 4)
    );
    assert!(
        browser
            .exec(
                painted,
                json!(["#view-model canvas[data-layer='1'][data-head='2']"])
            )
            .as_u64()
            .unwrap()
            > 0
    );
    browser.click("#view-model canvas[data-layer='1'][data-head='2']");
    assert_eq!(
        browser.exec("return [document.getElementById('overlay').hidden, document.getElementById('overlay-title').textContent, document.querySelectorAll('#overlay-body .tokens.left .tok').length];", json!([])),
        json!([false, "Layer 1, head 2", expected.len()])
    );
    assert!(
        browser
            .exec(painted, json!(["#overlay-body canvas"]))
            .as_u64()
            .unwrap()
            > 0
    );
    browser.screenshot(dir.path(), "serve-model-enlarged.png");
    // Escape closes the enlarged head, and focus goes back to its thumbnail.
    let overlay = || {
        browser.exec(
            "const a = document.activeElement;
             return [document.getElementById('overlay').hidden,
                     document.getElementById('overlay-title').textContent,
                     a.dataset.layer || a.id, a.dataset.head || null];",
            json!([]),
        )
    };
    browser.press("#overlay-close", KEY_ESCAPE);
    assert_eq!(overlay(), json!([true, "Layer 1, head 2", "1", "2"]));
    // By keyboard: arrow keys move between thumbnails, Enter enlarges one (focus on Close),
    // arrow keys step to the next head, Escape closes it.
    browser.press(
        "#view-model canvas[data-layer='1'][data-head='2']",
        &format!("{KEY_RIGHT}{KEY_ENTER}"),
    );
    assert_eq!(
        overlay(),
        json!([false, "Layer 1, head 3", "overlay-close", null])
    );
    browser.press("#overlay-close", KEY_RIGHT);
    assert_eq!(
        overlay(),
        json!([false, "Layer 1, head 3", "overlay-close", null]),
        "head 3 is the last"
    );
    browser.press("#overlay-close", KEY_ESCAPE);
    assert_eq!(overlay(), json!([true, "Layer 1, head 3", "1", "3"]));

    browser.click("#tabs button[data-view=heatmap]");
    browser.expect_ready();
    assert!(
        browser
            .exec(painted, json!(["#heatmap-canvas"]))
            .as_u64()
            .unwrap()
            > 100
    );
    browser.screenshot(dir.path(), "serve-heatmap.png");
    // The readout names the layer and heads it read, and a new layer clears it (it kept the
    // old layer's number while the pointer stood still).
    let readout = |script: &str| {
        browser.exec(
            &format!("{script} return document.getElementById('heatmap-readout').textContent;"),
            json!([]),
        )
    };
    let pointed = readout(
        "const c = document.getElementById('heatmap-canvas'), b = c.getBoundingClientRect();
         c.dispatchEvent(new MouseEvent('mousemove', { clientX: b.right - 70, clientY: b.bottom - 8 }));",
    );
    // The row and column under the pointer are outlined, and no longer once it leaves.
    let outlined = || {
        browser
            .exec(painted, json!(["#heatmap-cross"]))
            .as_u64()
            .unwrap()
    };
    assert!(outlined() > 0);
    browser.exec(
        "document.getElementById('heatmap-canvas').dispatchEvent(new MouseEvent('mouseleave'));
         return null;",
        json!([]),
    );
    assert_eq!(outlined(), 0);
    let layer = browser.exec("return document.getElementById('layer').value;", json!([]));
    assert!(
        pointed.as_str().unwrap().starts_with(&format!(
            "layer {}, mean of heads: query",
            layer.as_str().unwrap()
        )),
        "{pointed}"
    );
    let after = readout(
        "const l = document.getElementById('layer'); l.value = '0';
         l.dispatchEvent(new Event('change'));",
    );
    assert_eq!(
        after,
        json!(
            "Point at a cell to read its weight (layer 0, mean of heads); grey cells are masked: \
             a causal model's query cannot see later keys."
        )
    );

    browser.click("#tabs button[data-view=neuron]");
    browser.expect_ready();
    let keys = browser.exec(
        "return [...document.querySelectorAll('#neuron-body tr.key td.token')].map(t => t.textContent);",
        json!([]),
    );
    assert_eq!(keys, json!(expected));
    // Query 0 of a causal model sees only key 0: weight 1 there, the rest masked.
    browser.exec(
        "const s = document.getElementById('neuron-query'); s.value = '0';
         s.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    browser.expect_ready();
    let first_row = browser.exec(
        "return [...document.querySelectorAll('#neuron-body tr.key')[0].cells].slice(3, 7).map(c => c.textContent);",
        json!([]),
    );
    assert_eq!(first_row[2], "1.000", "{first_row}");
    assert_eq!(first_row[3], "1.000", "{first_row}");
    // The last query sees every key: the softmax of the page's own q·k (from half-float q and
    // k) must match the model's weights, which checks the q/k layout, scale and masking.
    browser.exec(
        "const s = document.getElementById('neuron-query'); s.value = String(s.options.length - 1);
         s.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    browser.expect_ready();
    let pairs = browser.exec(
        "return [...document.querySelectorAll('#neuron-body tr.key')]
            .map(r => [Number(r.cells[5].textContent), Number(r.cells[6].textContent)]);",
        json!([]),
    );
    let pairs = pairs.as_array().unwrap();
    assert_eq!(pairs.len(), expected.len());
    for pair in pairs {
        let (ours, model) = (pair[0].as_f64().unwrap(), pair[1].as_f64().unwrap());
        assert!(
            (ours - model).abs() <= 0.003,
            "softmax {ours} vs model {model}"
        );
    }
    browser.screenshot(dir.path(), "serve-neuron.png");

    // A text over the model's limit: the page shows the server's message.
    browser.type_into("#input-text", &"the cat sat on the mat ".repeat(40));
    browser.click("#input-submit");
    assert_eq!(browser.settled_state(), "error");
    let message = browser.exec(
        "return document.getElementById('error').textContent;",
        json!([]),
    );
    assert!(
        message.as_str().unwrap().contains("at most 64"),
        "{message}"
    );
    // The address still names the text shown (it named the refused one, which a reload or a
    // bookmark then asked for again).
    let search = browser.exec("return location.search;", json!([]));
    assert!(
        !search
            .as_str()
            .unwrap()
            .contains("the+cat+sat+on+the+mat+the"),
        "{search}"
    );
    assert!(search.as_str().unwrap().starts_with("?text="), "{search}");
}

#[test]
fn hostile_text_runs_no_script_in_the_app() {
    let server = Server::start(&tiny_gpt2());
    let dir = tempfile::tempdir().unwrap();
    let browser = Browser::start();
    browser.goto(&server.url);
    assert_eq!(browser.settled_state(), "idle");
    // Any alert() from injected markup would count here (and also leave a dialog open).
    browser.exec(
        "window.__alerts = 0; window.alert = () => { window.__alerts++; }; return null;",
        json!([]),
    );
    // The tiny model reads 64 tokens, about one per character of markup: one attack at a time.
    let attacks = [
        ("</script><script>alert(1)</script>", ""),
        ("<img src=x onerror=alert(1)>", "<svg onload=alert(1)>"),
        ("\"'&amp;<!--", "<iframe src=javascript:alert(1)>"),
    ];
    for (text, pair) in attacks {
        browser.type_into("#input-text", text);
        browser.type_into("#input-pair", pair);
        browser.click("#input-submit");
        browser.expect_ready();
        for view in ["model", "heatmap", "neuron", "head"] {
            browser.click(&format!("#tabs button[data-view={view}]"));
            browser.expect_ready();
        }
        std::thread::sleep(Duration::from_millis(300)); // let any onerror/onload fire
        assert_eq!(browser.alert_text(), None);
        let state = browser.exec(
            "return [window.__alerts, document.scripts.length, document.images.length,
                     document.querySelectorAll('svg, iframe').length,
                     document.getElementById('summary').textContent];",
            json!([]),
        );
        assert_eq!(state[0], 0, "{text}: {state}");
        assert_eq!(state[1], 2, "{text}: {state}");
        assert_eq!(state[2], 0, "{text}: {state}");
        assert_eq!(state[3], 0, "{text}: {state}");
        let summary = state[4].as_str().unwrap();
        assert!(
            summary.contains(&serde_json::to_string(text).unwrap()),
            "{summary}"
        );
    }
    browser.screenshot(dir.path(), "serve-xss.png");

    // The counter above is live: a script calling alert() is counted.
    browser.exec("setTimeout(() => alert(2), 0); return null;", json!([]));
    assert!(browser.wait_for("window.__alerts === 1", Duration::from_secs(5)));
}

/// A 512-token page file hides its smallest weights to stay under 5 MB (its notice says how
/// much: its floor hid up to 84% of a diffuse row's attention); the web app has no file to keep
/// small and sends every weight to 3 decimals, with no floor.
#[test]
fn the_app_sends_every_weight_of_a_long_text() {
    let model = attn_models::default_model_dir(false).expect("the default model");
    let server = Server::start(&model);
    let text = "The cat that ate the mouse that lived in the barn ran away. ".repeat(36);
    let (status, body) = post(&server.api(), &json!({ "text": text }).to_string());
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    let data: Value = serde_json::from_str(&body).unwrap();
    let n = data["tokens"].as_array().unwrap().len();
    assert!(n > 450, "{n} tokens");
    assert_eq!(data["weight_floor"], 0);
    // Only rounding to 3 decimals stores weights as 0, and the page says how much they hold.
    let rounded = data["zero_hidden_max"].as_f64().unwrap();
    assert!(rounded > 0.0 && rounded < 0.2, "{rounded}");
    assert!(
        body.len() > 4_500_000,
        "{} bytes: within a page file's budget",
        body.len()
    );
    // Every row keeps its attention, up to n roundings of at most 0.0005 each.
    for row in unpack_weights(&data).chunks(n) {
        let sum: f32 = row.iter().sum();
        assert!(
            (sum - 1.0).abs() <= 0.0005 * n as f32 + 1e-6,
            "row sums to {sum}"
        );
    }
}

/// The neuron view asks the server for a layer the page lacks. Asked while a submitted text was
/// still loading, it asked for the old text's layer, and the page dropped the submitted text's
/// answer as superseded: the old text stayed on screen under the new one's address.
#[test]
fn a_neuron_layer_asked_during_a_submit_does_not_supersede_it() {
    let model = attn_models::default_model_dir(false).expect("the default model");
    let server = Server::start(&model);
    let browser = Browser::start();
    // 200 words: the answer holds the queries and keys of the last layers only.
    browser.goto(&format!(
        "{}?text={}&view=head",
        server.url,
        "cat+".repeat(200)
    ));
    browser.expect_ready();
    browser.exec(
        "const l = document.getElementById('layer'); l.value = '0';
         l.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    browser.expect_ready();
    // The next answer comes a second late, and the neuron view is opened meanwhile.
    browser.exec(
        "const fetch = window.fetch; let first = true;
         window.fetch = (...args) => {
           const slow = first; first = false;
           return slow ? new Promise((ok) => setTimeout(() => ok(fetch(...args)), 1000)) : fetch(...args);
         };
         return null;",
        json!([]),
    );
    browser.type_into("#input-text", "Dogs bark loudly at night");
    browser.click("#input-submit");
    browser.click("#tabs button[data-view=neuron]");
    assert!(browser.wait_for(
        "document.getElementById('summary').textContent.includes('Dogs bark loudly at night')",
        Duration::from_secs(20)
    ));
    browser.expect_ready();
    // The neuron view then asked for layer 0 of the new text.
    let intro = browser.exec(
        "return document.querySelector('#neuron-body strong').textContent;",
        json!([]),
    );
    assert_eq!(intro, json!("\"[CLS]\""));
}

/// The app reads the encoder under a task head (a classifier here) as it reads any model.
#[test]
fn serve_runs_a_task_models_encoder() {
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/heads/bert-cls");
    let mut server = Server::start(&model);
    let (status, body) = post(
        &server.api(),
        &json!({"text": "The movie was good"}).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(labels(&data)[0], "[CLS]");
    let n = data["tokens"].as_array().unwrap().len();
    let weights = unpack_weights(&data);
    assert_eq!(weights.len(), 2 * 2 * n * n);
    for row in weights.chunks(n) {
        let sum: f32 = row.iter().sum();
        assert!(
            (sum - 1.0).abs() <= 0.0005 * n as f32 + 1e-6,
            "row sums to {sum}"
        );
    }
    assert!(server.alive());
}

/// Each answer carries the measures `--methods` names (norm and ALTI by default), and the
/// app's heatmap offers them; a method that cannot run on the model stops the server at start.
#[test]
fn serve_offers_the_attribution_methods() {
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/heads/bert-cls");
    let mut server = Server::start_with(&model, &["--methods", "norm,alti,attn-grad"]);
    let text = "The movie was good";
    let (status, body) = post(&server.api(), &json!({ "text": text }).to_string());
    assert_eq!(status, 200, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    let n = data["tokens"].as_array().unwrap().len();
    let measures = data["measures"].as_array().unwrap();
    let names: Vec<&str> = measures
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["norm", "alti", "attn-grad"]);
    // ALTI's rows, rolled out, are the shares `attribute --method alti` gives.
    let output = explorer_support::attnscope()
        .args(["attribute", text, "--method", "alti", "--json", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    let alti: Value = serde_json::from_slice(&output.stdout).unwrap();
    let got = explorer_support::unpack_matrix(&data, measures[1]["matrix"].as_str().unwrap());
    assert_eq!(got.len(), n * n);
    for (i, row) in alti["matrix"].as_array().unwrap().iter().enumerate() {
        let row: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let sum: f64 = row.iter().sum();
        for (j, v) in row.iter().enumerate() {
            let want = v / sum;
            assert!(
                (f64::from(got[i * n + j]) - want).abs() <= 5.001e-4,
                "[{i}][{j}]"
            );
        }
    }
    assert_eq!(measures[0]["layers"], 2);

    let browser = Browser::start();
    browser.goto(&server.url);
    browser.type_into("#input-text", text);
    browser.click("#input-submit");
    browser.expect_ready();
    browser.click("#tabs button[data-view=heatmap]");
    browser.expect_ready();
    browser.exec(
        "const s = document.getElementById('heatmap-method'); s.value = 'attn-grad';
         s.dispatchEvent(new Event('change')); return null;",
        json!([]),
    );
    browser.expect_ready();
    let readout = browser.exec(
        "return document.getElementById('heatmap-readout').textContent;",
        json!([]),
    );
    assert!(
        readout
            .as_str()
            .unwrap()
            .contains("Attention × gradient of the logit of"),
        "{readout}"
    );
    assert!(server.alive());

    let output = explorer_support::attnscope()
        .args([
            "serve",
            "--port",
            "0",
            "--methods",
            "attn-grad",
            "--label",
            "nope",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--methods: --label \"nope\""), "{stderr}");
}

/// The random encoder-decoder test checkpoint `name` (tests/data/s2s).
fn s2s_model(name: &str) -> std::path::PathBuf {
    explorer_support::golden().join("s2s").join(name)
}

/// The kind `name` of an encoder-decoder answer.
fn kind<'a>(data: &'a Value, name: &str) -> &'a Value {
    (data["kinds"].as_array().unwrap().iter())
        .find(|k| k["name"] == name)
        .unwrap_or_else(|| panic!("no kind {name} in {data}"))
}

/// An encoder-decoder model's app asks for a source and a target and answers with the
/// encoder's, the decoder's and the cross-attention, the weights `attention --target --json`
/// gives; the page's Attention select switches between them; a pair is refused, and so is a
/// target for a model that reads one text, and --methods at start.
#[test]
fn serve_answers_an_encoder_decoder_models_three_kinds() {
    let (source, target) = (
        "I love machine learning",
        "J'adore l'apprentissage automatique",
    );
    let model = s2s_model("marian");
    let mut server = Server::start(&model);
    let (status, page, _) = get(&server.url);
    assert_eq!(status, 200);
    assert_eq!(
        explorer_support::embedded_data(&page),
        json!({"seq2seq": true})
    );
    let (status, body) = post(
        &server.api(),
        &json!({ "text": source, "target": target }).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let data: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (&data["target"], &data["kind"]),
        (&json!(target), &json!("cross"))
    );
    let output = explorer_support::attnscope()
        .args(["attention", source, "--target", target, "--json", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    let want: Value = serde_json::from_slice(&output.stdout).unwrap();
    for (name, field) in [
        ("encoder", "encoder_attentions"),
        ("decoder", "decoder_attentions"),
        ("cross", "cross_attentions"),
    ] {
        let kind = kind(&data, name);
        let layers = want[field].as_array().unwrap();
        let rows = layers[0][0].as_array().unwrap();
        let keys = kind["key_tokens"]
            .as_array()
            .unwrap_or_else(|| kind["tokens"].as_array().unwrap());
        assert_eq!(
            (kind["tokens"].as_array().unwrap().len(), keys.len()),
            (rows.len(), rows[0].as_array().unwrap().len()),
            "{name}"
        );
        let values: Vec<f64> = (layers.iter())
            .flat_map(|l| l.as_array().unwrap().iter())
            .flat_map(|h| h.as_array().unwrap().iter())
            .flat_map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
            .collect();
        let got = explorer_support::unpack_matrix(kind, kind["weights"].as_str().unwrap());
        assert_eq!(got.len(), values.len(), "{name}");
        for (g, w) in got.iter().zip(&values) {
            assert!((f64::from(*g) - w).abs() <= 5.001e-4, "{name}: {g} vs {w}");
        }
    }
    // An empty target is the model's own translation, as `translate` prints it.
    let (status, body) = post(
        &server.api(),
        &json!({ "text": source, "target": "" }).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let own: Value = serde_json::from_str(&body).unwrap();
    let output = explorer_support::attnscope()
        .args(["translate", source, "--model"])
        .arg(&model)
        .output()
        .unwrap();
    let translation = String::from_utf8(output.stdout).unwrap();
    assert_eq!(own["target"], translation.trim_end_matches('\n'));
    let (status, body) = post(
        &server.api(),
        &json!({ "text": source, "pair": "a pair" }).to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("not a pair"), "{body}");
    let (status, body) = post(
        &server.api(),
        &json!({ "text": source, "neuron_layer": 0 }).to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("no neuron view"), "{body}");

    // The page: a Target field instead of the Pair; the select switches the head view.
    let browser = Browser::start();
    browser.goto(&server.url);
    assert_eq!(browser.settled_state(), "idle");
    let hidden = |id: &str| {
        browser.exec(
            "return document.getElementById(arguments[0]).hidden;",
            json!([id]),
        )
    };
    assert_eq!(hidden("input-target-control"), json!(false));
    assert_eq!(hidden("input-pair-control"), json!(true));
    browser.type_into("#input-text", source);
    browser.type_into("#input-target", target);
    browser.click("#input-submit");
    browser.expect_ready();
    let columns = || {
        browser.exec(
            "const n = (s) => document.querySelectorAll('#view-head .tokens.' + s + ' .tok').length;
             return [n('left'), n('right')];",
            json!([]),
        )
    };
    let count = |name: &str, field: &str| {
        let kind = kind(&data, name);
        let field = if kind[field].is_null() {
            "tokens"
        } else {
            field
        };
        kind[field].as_array().unwrap().len()
    };
    let (s, t) = (count("encoder", "tokens"), count("cross", "tokens"));
    assert_eq!(columns(), json!([t, s]));
    for (name, rows, cols) in [("encoder", s, s), ("decoder", t, t), ("cross", t, s)] {
        browser.exec(
            "const s = document.getElementById('kind'); s.value = arguments[0];
             s.dispatchEvent(new Event('change')); return null;",
            json!([name]),
        );
        browser.expect_ready();
        assert_eq!(columns(), json!([rows, cols]), "{name}");
    }
    let address = browser.exec("return location.search;", json!([]));
    assert!(address.as_str().unwrap().contains("target="), "{address}");
    assert!(server.alive());

    // A target for a model that reads one text: refused, saying what reads one.
    let mut gpt2 = Server::start(&tiny_gpt2());
    let (status, body) = post(
        &gpt2.api(),
        &json!({ "text": "The cat", "target": "Le chat" }).to_string(),
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("A target is read by an encoder-decoder model"),
        "{body}"
    );
    assert!(gpt2.alive());

    let output = explorer_support::attnscope()
        .args(["serve", "--port", "0", "--methods", "norm", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "--methods: the attribution measures are not computed for an encoder-decoder model"
        ),
        "{stderr}"
    );
}
