//! Helpers shared by the command-line tests that run `attnscope` on the golden tiny GPT-2 and
//! real models: run the binary (without a model from the environment), expect success, expect a
//! clear failure.

use std::path::PathBuf;
use std::process::{Command, Output};

/// `tests/data/tiny-gpt2`, next to the repository.
#[allow(dead_code)] // not every test file runs each helper
pub fn tiny_gpt2() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/tiny-gpt2"
    ))
}

/// Runs the binary with `args`, ignoring any `ATTNSCOPE_MODEL` of the caller's environment.
#[allow(dead_code)] // not every test file runs each helper
pub fn attnscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args(args)
        .env_remove("ATTNSCOPE_MODEL")
        .output()
        .expect("attnscope runs")
}

/// Runs a command that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = attnscope(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs a command that must fail with exit code 1, without a panic, and a message containing
/// `needle`; returns the message.
#[allow(dead_code)] // not every test file runs each helper
pub fn fails_with(args: &[&str], needle: &str) -> String {
    let out = attnscope(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: stderr {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: {stderr:?} does not mention {needle:?}"
    );
    stderr
}
