//! The README's Rust examples are the crates' front-page doc examples, which `cargo test` runs:
//! each ```rust block of the README must be, line for line, the example in the docs of
//! `attn-core` or `attn-models` (without the lines rustdoc hides). What the README says the
//! second prints is what the model gives, and each `$ attnscope …` block shows what that
//! command prints.

use std::path::Path;

use attn_models::default_model_dir;
use attn_models::{Model, RunOptions};

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of each fenced block of `lang` (`""` for a block with no language) in a markdown
/// text.
fn fenced(text: &str, lang: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    // The open block's language and lines.
    let mut open: Option<(String, Vec<String>)> = None;
    for line in text.lines().map(str::trim_end) {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.to_string(), Vec::new())),
            (Some((info, lines)), Some("")) => blocks.extend((info == lang).then_some(lines)),
            (Some((info, mut lines)), _) => {
                lines.push(line.to_string());
                open = Some((info, lines));
            }
            (None, None) => {}
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

/// A command line as the README writes it: words split at spaces, double quotes keeping
/// spaces in a word.
fn words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut started) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '"' => (quoted, started) = (!quoted, true),
            ' ' if !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                }
                started = false;
            }
            c => (word, started) = (word + &c.to_string(), true),
        }
    }
    assert!(!quoted, "unbalanced quotes in {line:?}");
    words.extend(started.then_some(word));
    words
}

/// Every block of the README and of the CLI tour (`docs/cli.md`) that starts with
/// `$ attnscope …` (a line ending in `\\` goes on) shows, line for line, what that command
/// prints (piped, so without colour; the default model).
#[test]
fn the_readme_command_examples_print_what_the_readme_shows() {
    for (doc, blocks) in [("README.md", 3), ("docs/cli.md", 12)] {
        assert_eq!(command_examples(doc), blocks, "{doc}'s command examples");
    }
}

/// Checks each `$ attnscope …` block of `doc` against what the command prints; returns how many
/// there are.
fn command_examples(doc: &str) -> usize {
    let text = read(doc);
    let mut checked = 0;
    for block in fenced(&text, "") {
        let Some(first) = block.first().and_then(|l| l.strip_prefix("$ attnscope ")) else {
            continue;
        };
        let mut line = first.to_string();
        let mut rest = block[1..].iter();
        while let Some(head) = line.strip_suffix('\\') {
            line = head.to_string() + rest.next().expect("a continued line").trim_start();
        }
        let args = words(&line);
        // Piped, the output has no colour; run from the repository's root, where the docs'
        // paths (`tests/data/heads/…`) start.
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_attnscope"))
            .args(&args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
            .env_remove("ATTNSCOPE_MODEL")
            .output()
            .expect("attnscope runs");
        assert!(
            out.status.success(),
            "{doc}: {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8(out.stdout).expect("stdout is UTF-8");
        let shown: Vec<&str> = rest.map(String::as_str).collect();
        assert_eq!(
            printed.lines().collect::<Vec<_>>(),
            shown,
            "{doc}: {args:?}"
        );
        checked += 1;
    }
    checked
}
