//! The interactive explorer: one self-contained HTML page (no CDN, no network request) with a
//! head view, a model view, a heatmap and a neuron view, in the manner of bertviz
//! (Vig 2019, <https://arxiv.org/abs/1906.05714>), written in plain JS, SVG and canvas.
//!
//! The same page serves two uses: [`standalone_page`] embeds one text's data for `attnscope html`,
//! and [`app_page`] carries no data but a form that posts to `POST /api/attention`, whose answer
//! is [`payload_json`], for `attnscope serve`.
//!
//! User text reaches the page only as JSON inside `<script type="application/json">`, escaped by
//! [`script_json`] so that no `</script>` or `<!--` can end the element, and the page inserts
//! every token with `textContent`, never as markup. As a second wall, the page's
//! [`content_security_policy`] lets only its own script run (by hash) and load nothing.

mod payload;

pub use payload::{
    FORMAT, Measure, PageOptions, QueryKeys, Seq2SeqMaps, WEIGHT_SCALE, payload_json,
    rows_payload_json, seq2seq_payload_json,
};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};

use crate::{AttentionMaps, VizError};

const TEMPLATE: &str = include_str!("../../assets/explorer.html");
const STYLE: &str = include_str!("../../assets/explorer.css");
const SCRIPT: &str = include_str!("../../assets/explorer.js");

/// Escapes JSON for the inside of a `<script>` element: `<`, `>` and `&` become `\u003c`,
/// `\u003e` and `\u0026`, and U+2028/U+2029 become `\u2028`/`\u2029`.
///
/// Valid for JSON text only: these characters can occur in JSON only inside strings, where the
/// escapes decode to the same characters, so `JSON.parse` returns exactly the original value.
pub fn script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The explorer for one text as a single self-contained HTML file.
///
/// # Shapes
/// - `maps.weights`: `[n_layers, n_heads, T, T]`
/// - `qk.q`, `qk.k`: `[n_layers, n_heads, T, head_dim]`
/// - each `measures[m].values`: `[measures[m].layers, T, T]`
pub fn standalone_page(
    maps: &AttentionMaps,
    qk: Option<&QueryKeys>,
    measures: &[Measure],
    options: &PageOptions,
) -> Result<String, VizError> {
    let json = payload_json(maps, qk, measures, options)?;
    Ok(render("file", &script_json(&json)))
}

/// The explorer for an encoder-decoder model's source and target as a single self-contained
/// HTML file: its encoder, decoder and cross-attention, which a selector switches between.
pub fn seq2seq_page(maps: &Seq2SeqMaps, options: &PageOptions) -> Result<String, VizError> {
    let json = seq2seq_payload_json(maps, options)?;
    Ok(render("file", &script_json(&json)))
}

/// The explorer for the rows `rows` (token positions) of one text's attention, each over every
/// token, as a single self-contained HTML file (see [`rows_payload_json`]).
///
/// # Shapes
/// - `maps.weights`: `[n_layers, n_heads, held rows, T]` or `[n_layers, n_heads, T, T]`
pub fn rows_page(
    maps: &AttentionMaps,
    rows: &[usize],
    alone: bool,
    options: &PageOptions,
) -> Result<String, VizError> {
    let json = rows_payload_json(maps, rows, alone, options)?;
    Ok(render("file", &script_json(&json)))
}

/// The explorer for `attnscope serve`: no data, a form that asks `POST /api/attention`.
pub fn app_page() -> String {
    render("app", "null")
}

/// [`app_page`] for an encoder-decoder model: its form asks for a target, not a pair.
pub fn seq2seq_app_page() -> String {
    render("app", r#"{"seq2seq":true}"#)
}

/// The page's Content-Security-Policy (also in its `<meta>`; `attnscope serve` sends it as a
/// header): no request to anywhere but the serving origin, no plugin, no frame, and no script
/// but the page's own, named by its SHA-256 — injected markup could not run even if it got in.
pub fn content_security_policy() -> String {
    let hash = BASE64.encode(Sha256::digest(SCRIPT.as_bytes()));
    format!(
        "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
         img-src data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'"
    )
}

/// Fills the template. The data goes in last but one and in one piece, so nothing in it is
/// ever searched for placeholders.
fn render(mode: &str, data: &str) -> String {
    let csp = content_security_policy();
    let (head, rest) = split(TEMPLATE, "{{CSP}}");
    let (before_style, rest) = split(rest, "{{STYLE}}");
    let (middle, rest) = split(rest, "{{MODE}}");
    let (before_data, rest) = split(rest, "{{DATA}}");
    let (before_script, tail) = split(rest, "{{SCRIPT}}");
    let mut page = String::with_capacity(TEMPLATE.len() + STYLE.len() + SCRIPT.len() + data.len());
    for piece in [
        head,
        &csp,
        before_style,
        STYLE,
        middle,
        mode,
        before_data,
        data,
        before_script,
        SCRIPT,
        tail,
    ] {
        page.push_str(piece);
    }
    page
}

/// Splits the (compile-time) template at a marker it contains exactly once (checked by tests).
fn split<'a>(text: &'a str, marker: &str) -> (&'a str, &'a str) {
    text.split_once(marker).unwrap_or((text, ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Token;

    fn maps(text: &str, tokens: &[&str]) -> AttentionMaps {
        let n = tokens.len();
        AttentionMaps {
            model: "hand-made <b>model</b>".into(),
            text: text.into(),
            pair: None,
            tokens: tokens
                .iter()
                .map(|t| Token {
                    text: t.to_string(),
                    id: 0,
                    span: None,
                    segment: 0,
                    special: false,
                })
                .collect(),
            n_layers: 1,
            n_heads: 1,
            // Uniform rows: each of the n keys gets 1/n.
            weights: vec![1.0 / n as f32; n * n],
            rows: None,
        }
    }

    /// The JSON inside `<script id="attnscope-data" ...>...</script>`.
    fn embedded_json(page: &str) -> &str {
        let start = page.find("id=\"attnscope-data\"").unwrap();
        let open = start + page[start..].find('>').unwrap() + 1;
        let close = open + page[open..].find("</script>").unwrap();
        &page[open..close]
    }

    #[test]
    fn markers_appear_once_in_the_template() {
        for marker in ["{{CSP}}", "{{STYLE}}", "{{MODE}}", "{{DATA}}", "{{SCRIPT}}"] {
            assert_eq!(TEMPLATE.matches(marker).count(), 1, "{marker}");
        }
    }

    #[test]
    fn script_json_escapes_what_could_end_the_script() {
        let json = serde_json::to_string("</script><!--&\u{2028}\u{2029}").unwrap();
        let escaped = script_json(&json);
        assert_eq!(
            escaped,
            r#""\u003c/script\u003e\u003c!--\u0026\u2028\u2029""#
        );
        let back: String = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, "</script><!--&\u{2028}\u{2029}");
    }

    #[test]
    fn script_json_round_trips_every_character() {
        // Every scalar value of the first four planes, plus the two line separators.
        let text: String = (0..0x4_0000).filter_map(char::from_u32).collect();
        let escaped = script_json(&serde_json::to_string(&text).unwrap());
        for bad in ['<', '>', '&', '\u{2028}', '\u{2029}'] {
            assert!(!escaped.contains(bad), "{bad:?} left unescaped");
        }
        let back: String = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back, text);
    }

    #[test]
    fn hostile_text_stays_inside_the_data_element() {
        let text = "</script><script>alert(1)</script><img src=x onerror=alert(1)>{{DATA}}";
        let page = standalone_page(
            &maps(
                text,
                &["</script>", "<img src=x onerror=alert(1)>", "{{SCRIPT}}"],
            ),
            None,
            &[],
            &PageOptions::default(),
        )
        .unwrap();
        let json = embedded_json(&page);
        assert!(!json.contains('<') && !json.contains('>'), "{json}");
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(value["text"], text);
        assert_eq!(value["tokens"][1]["label"], "<img src=x onerror=alert(1)>");
        assert_eq!(value["model"], "hand-made <b>model</b>");
        // The page has exactly the template's script elements: the data and the code.
        assert_eq!(page.matches("<script").count(), 2);
        assert_eq!(page.matches("</script>").count(), 2);
        // The attribute text survives only inside the JSON string, never as markup.
        assert!(!page.contains("<img"));
    }

    #[test]
    fn page_is_self_contained() {
        let page = standalone_page(
            &maps("a b", &["a", "b"]),
            None,
            &[],
            &PageOptions::default(),
        )
        .unwrap();
        let lower = page.to_ascii_lowercase();
        for attribute in ["src=", "href=", "url(", "@import", "fetch(\"http", "//cdn"] {
            for scheme in ["\"http", "'http", "http://", "https://"] {
                let probe = format!("{attribute}{scheme}");
                assert!(!lower.contains(&probe), "page contains {probe}");
            }
        }
        assert!(!lower.contains("http://") && !lower.contains("https://"));
        assert!(page.contains("data-mode=\"file\""));
    }

    #[test]
    fn policy_names_the_hash_of_the_one_script_that_runs() {
        let page = app_page();
        let open = page.rfind("<script>").unwrap() + "<script>".len();
        let close = open + page[open..].find("</script>").unwrap();
        let hash = BASE64.encode(Sha256::digest(&page.as_bytes()[open..close]));
        let policy = content_security_policy();
        assert!(
            policy.contains(&format!("script-src 'sha256-{hash}';")),
            "{policy}"
        );
        assert!(policy.starts_with("default-src 'none';"));
        assert!(page.contains(&format!("content=\"{policy}\"")));
    }

    #[test]
    fn app_page_has_the_form_and_no_data() {
        let page = app_page();
        assert!(page.contains("data-mode=\"app\""));
        assert!(page.contains("id=\"input-form\""));
        assert_eq!(embedded_json(&page), "null");
    }

    #[test]
    fn a_seq2seq_page_keeps_hostile_source_and_target_inside_its_data() {
        let hostile = "</script><img src=x onerror=alert(1)>";
        let source = maps(hostile, &[hostile, "b"]);
        let mut cross = maps(hostile, &[hostile, "b", hostile]);
        cross.pair = Some(hostile.into());
        cross.tokens[2].segment = 1;
        cross.weights = vec![0.5, 0.5, 0.0];
        cross.rows = Some(vec![2]);
        let page = seq2seq_page(
            &Seq2SeqMaps {
                target: hostile.into(),
                encoder: source.clone(),
                decoder: source,
                cross,
            },
            &PageOptions::default(),
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(embedded_json(&page)).unwrap();
        assert_eq!(
            (&value["text"], &value["target"]),
            (&hostile.into(), &hostile.into())
        );
        assert_eq!(value["kinds"][0]["tokens"][0]["label"], hostile);
        assert_eq!(page.matches("<script").count(), 2);
        assert!(!page.contains("<img"));
    }

    #[test]
    fn a_rows_page_keeps_hostile_tokens_inside_its_data() {
        let hostile = "</script><img src=x onerror=alert(1)>";
        let page = rows_page(
            &maps(hostile, &[hostile, "b"]),
            &[1],
            true,
            &PageOptions::default(),
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(embedded_json(&page)).unwrap();
        assert_eq!(value["kinds"][0]["key_tokens"][0]["label"], hostile);
        assert_eq!(page.matches("<script").count(), 2);
        assert!(!page.contains("<img"));
    }

    #[test]
    fn the_seq2seq_app_page_says_its_form_asks_for_a_target() {
        let page = seq2seq_app_page();
        assert!(page.contains("data-mode=\"app\""));
        assert!(page.contains("id=\"input-target\""));
        assert_eq!(embedded_json(&page), r#"{"seq2seq":true}"#);
    }
}
