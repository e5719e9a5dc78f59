//! The text path: arbitrary bytes, read as a file's text would be (invalid UTF-8 replaced),
//! through the tokenizer, the model and every view, HTML escaping included. A text the model
//! accepts must give valid attention maps, and the explorer page built from them must carry the
//! text only as escaped JSON: no `<` inside the data element, and exactly the template's two
//! script elements.
//!
//! Input: one flag byte (bit 0: BERT (cached all-MiniLM-L6-v2) instead of GPT-2 (golden
//! tiny-gpt2); bit 1: truncate; bit 2: the text after the first NUL is a sentence pair), then
//! the text.
#![no_main]

use std::sync::OnceLock;

use attn_models::Model;
use attn_viz::bars::BarStyle;
use attn_viz::explain::{ExplainOptions, Level, Method, explain, query_rows, render};
use attn_viz::html::{PageOptions, standalone_page};
use attn_viz::select::{Selection, rollout};
use attn_viz::stats::{Leading, head_stats, notable_heads, uniform_shares};
use attn_viz::words::words;
use attnscope::maps;
use attnscope_fuzz::{cached_minilm, golden};
use libfuzzer_sys::fuzz_target;

const DATA_OPEN: &str = "<script type=\"application/json\" id=\"attnscope-data\">";

fn gpt2() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| Model::load(&golden().join("tiny-gpt2")).expect("golden tiny-gpt2 loads"))
}

fn bert() -> Option<&'static Model> {
    static MODEL: OnceLock<Option<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| cached_minilm().map(|dir| Model::load(&dir).expect("cached MiniLM loads")))
        .as_ref()
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let model = if flags & 1 == 1 {
        match bert() {
            Some(m) => m,
            None => return,
        }
    } else {
        gpt2()
    };
    let truncate = flags & 2 == 2;
    let all = String::from_utf8_lossy(rest);
    let (text, pair) = match (flags & 4 == 4, all.split_once('\0')) {
        (true, Some((t, p))) => (t, Some(p)),
        _ => (all.as_ref(), None),
    };
    let Ok(maps) = maps::run_model(model, text, pair, truncate) else {
        return;
    };
    maps.validate().expect("model attention is valid");
    assert!(maps.seq_len() <= model.max_positions());

    words(&maps).expect("tokens merge into words");
    for question in [false, true] {
        let options = ExplainOptions {
            method: Method::Attention {
                selection: Selection::All,
            },
            level: Level::Words,
            special: question,
            focus: None,
            question: question && pair.is_some(),
            across: false,
            top: Some(5),
            focus_tokens: Vec::new(),
            only_segment: None,
            focus_segment: None,
        };
        if let Ok(e) = explain(&maps, &options, |_, _| {}) {
            render(&e, BarStyle::default());
        }
    }
    // The rows of the last token alone give the bars every row gives.
    let last = ExplainOptions {
        method: Method::Attention {
            selection: Selection::All,
        },
        level: Level::Words,
        special: true,
        focus: None,
        question: false,
        across: false,
        top: None,
        focus_tokens: vec![maps.seq_len() - 1],
        only_segment: None,
        focus_segment: None,
    };
    let rows = maps::run_model_rows(model, (text, pair), truncate, |header| {
        Ok(query_rows(header, &last)?)
    })
    .expect("the rows of a text the model ran on");
    rows.validate_rows().expect("rows-only attention is valid");
    let (a, b) = (
        explain(&rows, &last, |_, _| {}).expect("explain from its rows"),
        explain(&maps, &last, |_, _| {}).expect("explain from every row"),
    );
    for (x, y) in a.rows.iter().zip(&b.rows) {
        assert!(
            (x.weight - y.weight).abs() <= 1e-5,
            "{} {} {}",
            x.word,
            x.weight,
            y.weight
        );
    }
    if maps.seq_len() <= 16 {
        let options = ExplainOptions {
            method: Method::Flow,
            level: Level::Tokens,
            special: true,
            ..ExplainOptions::default()
        };
        explain(&maps, &options, |_, _| {}).expect("flow over a short text");
    }
    let stats = head_stats(&maps).expect("head statistics");
    let uniform = uniform_shares(&maps).expect("even shares");
    notable_heads(&stats, &uniform, Leading::of(&maps));
    rollout(&maps).expect("rollout");

    let page = standalone_page(&maps, None, &[], &PageOptions::default()).expect("explorer page");
    assert_eq!(
        page.matches("<script").count(),
        2,
        "user text opened a script element"
    );
    let start = page.find(DATA_OPEN).expect("data element") + DATA_OPEN.len();
    let len = page[start..]
        .find("</script>")
        .expect("data element closes");
    let json = &page[start..start + len];
    assert!(!json.contains('<'), "unescaped < in the page data");
    let payload: serde_json::Value = serde_json::from_str(json).expect("page data is JSON");
    assert_eq!(payload["text"].as_str(), Some(text));
    assert_eq!(payload["pair"].as_str(), pair);
});
