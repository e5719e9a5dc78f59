//! The README's Rust examples are the crates' front-page doc examples, which `cargo test` runs:
//! each ```rust block of the README must be, line for line, the example in the docs of
//! `attn-core` or `attn-models` (without the lines rustdoc hides).

use std::path::Path;

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
        .filter(|l| !l.starts_with("# "))
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
