//! The README's Rust examples are the crates' front-page doc examples, which `cargo test` runs:
//! each ```rust block of the README must be, line for line, the example in the docs of
//! `attn-core` or `attn-models` (without the lines rustdoc hides). What the README says the
//! second prints is what the model gives.

use std::path::Path;

use attn_models::fetch::default_model_dir;
use attn_models::{Model, RunOptions};

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of each fenced block of `lang` in a markdown text.
fn fenced(text: &str, lang: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in text.lines() {
        match (&mut current, line.trim_end()) {
            (None, fence) if fence == format!("```{lang}") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), line) => block.push(line.to_string()),
            (None, _) => {}
        }
    }
    blocks
}

/// The example of a crate's front page: the lines of the first fenced block of its `//!` docs,
/// without the lines rustdoc hides (`# …`).
fn front_page_example(lib: &str) -> Vec<String> {
    let text = read(lib);
    let mut docs = (text.lines())
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l));
    assert!(
        docs.any(|l| l.starts_with("```")),
        "{lib}: an example on the front page"
    );
    docs.take_while(|l| !l.starts_with("```"))
        .map(str::trim_end)
        .filter(|l| !l.starts_with("# ") && *l != "#")
        .map(str::to_string)
        .collect()
}

#[test]
fn the_readme_rust_examples_are_the_tested_doc_examples() {
    let readme = fenced(&read("README.md"), "rust");
    let examples = [
        front_page_example("crates/attn-core/src/lib.rs"),
        front_page_example("crates/attn-models/src/lib.rs"),
    ];
    assert_eq!(readme.len(), examples.len(), "one README block per example");
    for (block, example) in readme.iter().zip(&examples) {
        assert_eq!(block, example);
    }
}

/// The README's "It prints" block after the model example: each token's weight from "sat" in
/// layer 3, head 7, to 3 decimals, and the two sentences' cosine, to 4.
#[test]
fn what_the_readme_says_the_model_example_prints_is_what_it_prints() {
    let readme = read("README.md");
    let lead = "It prints (the cosine of the two sentences is ";
    let at = readme
        .find(lead)
        .expect("the README shows what the example prints");
    let rest = &readme[at + lead.len()..];
    let cosine: f32 = rest[..rest.find(')').unwrap()].parse().unwrap();
    let printed = &fenced(rest, "")[0];

    let model = Model::load(&default_model_dir(false).unwrap()).unwrap();
    let text = "The cat sat on the mat";
    let enc = model.encode(text, None).unwrap();
    let options = RunOptions {
        attentions: true,
        ..RunOptions::default()
    };
    let out = model.forward(&enc, &options).unwrap();
    let sat = enc.tokens.iter().position(|t| t == "sat").unwrap();
    let row = out.attention(0, 3, 7, sat).unwrap();
    assert_eq!(printed.len(), enc.tokens.len());
    for ((line, token), weight) in printed.iter().zip(&enc.tokens).zip(row) {
        assert_eq!(line, &format!("{token:>6} {weight:.3}"));
    }
    let emb = model.embed(&[text, "A dog lay on the rug"]).unwrap();
    let got: f32 = emb[0].iter().zip(&emb[1]).map(|(a, b)| a * b).sum();
    assert!(
        (got - cosine).abs() <= 5e-5,
        "cosine {got}, the README says {cosine}"
    );
}
