//! `attnscope bench generate` end to end on `tests/data/tiny-gpt2`: the JSON fields and their
//! consistency, the greedy ids against `attnscope generate`, and each bad input as a clear error
//! with exit code 1.

mod cli_support;

use cli_support::{fails_with, ok, tiny_gpt2};
use serde_json::Value;

fn number(doc: &Value, field: &str) -> f64 {
    doc[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} is not a number in {doc}"))
}

#[test]
fn json_reports_consistent_timings_and_the_greedy_ids() {
    let model = tiny_gpt2().to_str().unwrap().to_string();
    let prompt = "The cat sat on the mat";
    let out = ok(&[
        "bench",
        "generate",
        "--model",
        &model,
        "--prompt",
        prompt,
        "--max-new-tokens",
        "9",
        "--reps",
        "3",
        "--threads",
        "1",
        "--json",
    ]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["engine"], "attnscope");
    assert_eq!(doc["model"], "tiny-gpt2");
    assert_eq!(doc["threads"], 1);
    assert_eq!(doc["new_tokens"], 9);
    let tokens_per_s = number(&doc, "tokens_per_s");
    let (prefill, per_token) = (number(&doc, "prefill_ms"), number(&doc, "per_token_ms"));
    for (name, x) in [
        ("tokens_per_s", tokens_per_s),
        ("prefill_ms", prefill),
        ("per_token_ms", per_token),
        ("first", number(&doc, "per_token_ms_first_quarter")),
        ("last", number(&doc, "per_token_ms_last_quarter")),
    ] {
        assert!(x.is_finite() && x > 0.0, "{name} = {x}");
    }
    assert!(
        (number(&doc, "decode_tokens_per_s") - 1e3 / per_token).abs() < 1e-6 * 1e3 / per_token,
        "{doc}"
    );
    // A run of 9 tokens is its prefill plus 8 steps, so its total exceeds its prefill and 8
    // times its mean step; the median total then exceeds both medians (order statistics are
    // monotone), which bounds tokens/s = 9 / median total from above.
    assert!(tokens_per_s < 9.0 / (prefill / 1e3), "{doc}");
    assert!(tokens_per_s < 9.0 / (8.0 * per_token / 1e3), "{doc}");

    // The same greedy continuation as `attnscope generate`, and the same prompt length.
    let gen_out = ok(&[
        "generate",
        prompt,
        "--model",
        &model,
        "--max-new-tokens",
        "9",
        "--json",
    ]);
    let generated: Value = serde_json::from_str(&gen_out).unwrap();
    assert_eq!(doc["ids"], generated["ids"]);
    let prompt_tokens = doc["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens >= 1, "{doc}");

    // One new token: the prefill alone, no per-token figures.
    let one: Value = serde_json::from_str(&ok(&[
        "bench",
        "generate",
        "--model",
        &model,
        "--max-new-tokens",
        "1",
        "--reps",
        "1",
        "--json",
    ]))
    .unwrap();
    assert_eq!(one["ids"].as_array().unwrap().len(), 1);
    assert!(one["per_token_ms"].is_null(), "{one}");
    assert!(one["decode_tokens_per_s"].is_null(), "{one}");
}

#[test]
fn plain_output_names_the_model_and_the_rates() {
    let out = ok(&[
        "bench",
        "generate",
        "--model",
        tiny_gpt2().to_str().unwrap(),
        "--max-new-tokens",
        "5",
        "--reps",
        "1",
    ]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].starts_with("tiny-gpt2: ") && lines[0].contains(" tokens/s (5 new tokens"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("prefill ") && lines[1].contains("ms per token (first quarter"),
        "{out}"
    );
}

#[test]
fn bad_models_and_options_are_clear_errors() {
    let model = tiny_gpt2().to_str().unwrap().to_string();
    fails_with(
        &["bench", "generate", "--max-new-tokens", "4"],
        "bench generate needs --model DIR (or ATTNSCOPE_MODEL), a GPT-2-family checkpoint",
    );
    // `ATTNSCOPE_MODEL` stands in for `--model`, as in every other command.
    let from_env = std::process::Command::new(env!("CARGO_BIN_EXE_attnscope"))
        .args([
            "bench",
            "generate",
            "--max-new-tokens",
            "2",
            "--reps",
            "1",
            "--json",
        ])
        .env("ATTNSCOPE_MODEL", &model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&from_env.stdout);
    assert!(from_env.status.success(), "{from_env:?}");
    assert!(stdout.contains(r#""model":"tiny-gpt2""#), "{stdout}");
    let bert = attn_models::default_model_dir(false)
        .expect("the default model is cached or can be fetched");
    fails_with(
        &["bench", "generate", "--model", bert.to_str().unwrap()],
        "generating text needs a decoder (GPT-2, Llama, Mistral, Qwen2, Qwen3, Gemma 2); all-MiniLM-L6-v2 is a bert model",
    );
    fails_with(
        &["bench", "generate", "--model", "/nonexistent/model"],
        "/nonexistent/model",
    );
    for (flag, value, says) in [
        (
            "--max-new-tokens",
            "0",
            "--max-new-tokens must be at least 1",
        ),
        ("--reps", "0", "--reps must be between 1 and 1000000, not 0"),
    ] {
        fails_with(&["bench", "generate", "--model", &model, flag, value], says);
    }
    fails_with(
        &["bench", "generate", "--model", &model, "--threads", "0"],
        "--threads: must be between 1 and 1024, not 0",
    );
    fails_with(
        &["bench", "generate", "--model", &model, "--prompt", ""],
        "is empty",
    );
    // tiny-gpt2 has 64 positions: P prompt tokens and 66 − P new ones need P + 65 − P = 65.
    let prompt_len = attn_models::Model::load(std::path::Path::new(&model))
        .unwrap()
        .encode("Hi", None)
        .unwrap()
        .len();
    let over = (66 - prompt_len).to_string();
    fails_with(
        &[
            "bench",
            "generate",
            "--model",
            &model,
            "--prompt",
            "Hi",
            "--max-new-tokens",
            &over,
        ],
        "the KV cache holds 64 positions and 65 are needed",
    );
}
