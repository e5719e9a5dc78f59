//! The core commands end to end: `sdpa` on every golden case and on each kind of bad file
//! (literal bytes), `walkthrough` and `mask` against numbers derived in the tests.

use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

// These commands read no model: the shared runner (which hides `ATTNSCOPE_MODEL`) and success
// check serve; failures are checked here, against several needles and the `error: ` prefix.
#[allow(dead_code)]
mod cli_support;

use cli_support::{attnscope, ok};

fn golden(sub: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(sub)
}

/// Runs a command that must fail with exit code 1 and a message containing every `needle`.
fn fails_with(args: &[&str], needles: &[&str]) {
    let out = attnscope(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: stderr {stderr}");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    for needle in needles {
        assert!(
            stderr.contains(needle),
            "{args:?}: expected {needle:?} in {stderr}"
        );
    }
}

/// A tensor's name, dims and values.
type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// The F32 tensors of a safetensors file (BOOL tensors are skipped) and its `tolerance`.
fn read_f32s(path: &Path) -> (Vec<NamedTensor>, Option<Value>) {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let tolerance = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get("tolerance"))
        .map(|t| serde_json::from_str(t).unwrap());
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.dtype() == Dtype::F32)
        .map(|(name, t)| {
            let data = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (name, t.shape().to_vec(), data)
        })
        .collect();
    (tensors, tolerance)
}

/// |got − expected| / max(1, |expected|), the golden README's measure; −3e38 stands for −∞.
fn worst(got: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(got.len(), expected.len());
    got.iter()
        .zip(expected)
        .map(|(&g, &e)| {
            if e <= -3.0e38 {
                if g == f32::NEG_INFINITY {
                    0.0
                } else {
                    f32::INFINITY
                }
            } else if g.is_finite() {
                (g - e).abs() / e.abs().max(1.0)
            } else {
                f32::INFINITY
            }
        })
        .fold(0.0, f32::max)
}

#[test]
fn sdpa_reproduces_every_golden_case() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out.safetensors");
    let out_arg = out_path.to_str().unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden("sdpa"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 65, "tests/data/sdpa should hold 65 cases");
    for (n, case) in files.iter().enumerate() {
        let case_arg = case.to_str().unwrap();
        // Every fourth case through the reference twin, the rest through the fast path.
        let mut args = vec!["sdpa", case_arg, "-o", out_arg, "--weights"];
        if n % 4 == 0 {
            args.push("--reference");
        }
        let stdout = ok(&args);
        // The printed report: one line per expected tensor, each within tolerance.
        for name in ["out ", "lse ", "weights "] {
            let line = stdout
                .lines()
                .find(|l| l.starts_with(&format!("max abs diff {name}")))
                .unwrap_or_else(|| panic!("{case:?}: no line for {name} in {stdout}"));
            assert!(line.ends_with(": ok"), "{case:?}: {line}");
        }
        // The written results, compared here with the case's expected tensors.
        let (expected, tolerance) = read_f32s(case);
        let tol = tolerance.map_or(1e-5, |t| t.as_f64().unwrap() as f32);
        let (written, _) = read_f32s(&out_path);
        let mut names: Vec<&str> = written.iter().map(|(n, _, _)| n.as_str()).collect();
        names.sort();
        assert_eq!(names, ["lse", "out", "weights"], "{case:?}");
        for (name, dims, data) in &written {
            let (_, want_dims, want) = expected
                .iter()
                .find(|(n, _, _)| *n == format!("expected_{name}"))
                .unwrap();
            assert_eq!(dims, want_dims, "{case:?}: {name} shape");
            let limit = if name == "lse" { 1e-4 } else { tol };
            let d = worst(data, want);
            assert!(d <= limit, "{case:?}: {name} differs by {d:e}");
        }
    }
}

#[test]
fn sdpa_without_weights_writes_out_and_lse_only() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.safetensors");
    let case = golden("sdpa").join("the_cat_sat.safetensors");
    ok(&["sdpa", case.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let (written, _) = read_f32s(&out);
    let mut names: Vec<&str> = written.iter().map(|(n, _, _)| n.as_str()).collect();
    names.sort();
    assert_eq!(names, ["lse", "out"]);
}

/// `-o` is written through, as the other commands' outputs are: a symlink stays one, its target
/// gets the results, and an existing file keeps its permissions (safetensors' writer renamed a
/// new file over the path: a symlink became a file, `/dev/null` too). The case file itself is
/// refused, not overwritten.
#[cfg(unix)]
#[test]
fn sdpa_writes_through_its_output_path_and_not_over_its_case() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let case = dir.path().join("case.safetensors");
    std::fs::copy(golden("sdpa").join("the_cat_sat.safetensors"), &case).unwrap();
    let (target, link) = (dir.path().join("target.st"), dir.path().join("link.st"));
    std::fs::write(&target, b"old").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    ok(&["sdpa", case.to_str().unwrap(), "-o", link.to_str().unwrap()]);
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o664);
    let (written, _) = read_f32s(&target);
    assert_eq!(written.len(), 2, "out and lse");
    let before = std::fs::read(&case).unwrap();
    let case_link = dir.path().join("case-link.st");
    std::os::unix::fs::symlink(&case, &case_link).unwrap();
    for out in [&case, &case_link] {
        fails_with(
            &["sdpa", case.to_str().unwrap(), "-o", out.to_str().unwrap()],
            &["it is the case file itself"],
        );
    }
    assert_eq!(std::fs::read(&case).unwrap(), before);
}

/// A safetensors file from a literal header and data bytes: 8-byte little-endian header length,
/// the header JSON, the data.
fn st_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    b
}

/// A valid one-head case, q [1,1,1,2], k and v [1,1,2,2], plus extra entries: `extra_header`
/// (tensors placed after byte 40 of data, given with `extra_data`) and `metadata` (JSON object
/// text of string values).
fn case_bytes(q: (&str, &str), extra_header: &str, extra_data: &[u8], metadata: &str) -> Vec<u8> {
    let (q_dtype, q_shape) = q;
    let q_len: usize = if q_dtype == "F64" { 16 } else { 8 };
    let header = format!(
        "{{\"__metadata__\":{metadata},\
         \"q\":{{\"dtype\":\"{q_dtype}\",\"shape\":{q_shape},\"data_offsets\":[0,{q_len}]}},\
         \"k\":{{\"dtype\":\"F32\",\"shape\":[1,1,2,2],\"data_offsets\":[{q_len},{}]}},\
         \"v\":{{\"dtype\":\"F32\",\"shape\":[1,1,2,2],\"data_offsets\":[{},{}]}}{extra_header}}}",
        q_len + 16,
        q_len + 16,
        q_len + 32
    );
    let mut data: Vec<u8> = Vec::new();
    let floats = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (0.25 * i as f32).to_le_bytes())
            .collect()
    };
    data.extend(if q_dtype == "F64" {
        [0.5f64, 1.0].iter().flat_map(|x| x.to_le_bytes()).collect()
    } else {
        floats(2)
    });
    data.extend(floats(8));
    data.extend_from_slice(extra_data);
    st_bytes(&header, &data)
}

fn valid_case() -> Vec<u8> {
    case_bytes(("F32", "[1,1,1,2]"), "", &[], "{}")
}

/// Writes `bytes` as a case and runs `sdpa` on it, expecting failure with `needles`.
fn bad_case(dir: &Path, name: &str, bytes: &[u8], needles: &[&str]) {
    let path = dir.join(format!("{name}.safetensors"));
    std::fs::write(&path, bytes).unwrap();
    let out = dir.join("out.safetensors");
    fails_with(
        &["sdpa", path.to_str().unwrap(), "-o", out.to_str().unwrap()],
        needles,
    );
    assert!(!out.exists(), "{name}: no output is written for a bad case");
}

/// The hand-made case's weights and output, in float64: q = [0, 0.25]; k rows [0, 0.25] and
/// [0.5, 0.75]; scale 1/√2, so the scores are 0.25·0.25/√2 = 0.0442 and 0.25·0.75/√2 = 0.1326
/// and the weights 0.4779, 0.5221; v rows [1, 1.25] and [1.5, 1.75].
fn hand_made_result() -> ([f64; 2], [f64; 2]) {
    let s0 = 0.25f64 * 0.25 / 2f64.sqrt();
    let s1 = 0.25f64 * 0.75 / 2f64.sqrt();
    let w0 = s0.exp() / (s0.exp() + s1.exp());
    let out = [w0 + 1.5 * (1.0 - w0), 1.25 * w0 + 1.75 * (1.0 - w0)];
    ([w0, 1.0 - w0], out)
}

#[test]
fn sdpa_accepts_the_hand_made_case() {
    // The helper's valid case runs, so each bad case below fails for its own reason.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.safetensors");
    std::fs::write(&path, valid_case()).unwrap();
    let out = dir.path().join("out.safetensors");
    ok(&[
        "sdpa",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--weights",
    ]);
    let (written, _) = read_f32s(&out);
    let (_, _, w) = written.iter().find(|(n, _, _)| n == "weights").unwrap();
    let (weights, _) = hand_made_result();
    assert!((0..2).all(|j| (f64::from(w[j]) - weights[j]).abs() < 1e-6));
}

/// A float mask of `f32::MIN` (how Hugging Face hides keys) gives an lse of about `f32::MIN`,
/// here and in PyTorch; "-3e38 or less stands for −∞" was applied to the expected side only, so
/// a right lse was reported OVER and the command failed. And a BF16 mask is widened, as the
/// other BF16 tensors are (it was refused).
#[test]
fn sdpa_takes_an_f32_min_mask_and_a_bf16_mask() {
    let dir = tempfile::tempdir().unwrap();
    let f32s = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let tensor = |name: &str, dtype: &str, shape: &str, at: usize, len: usize| {
        format!(
            r#","{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{at},{}]}}"#,
            at + len
        )
    };
    // Both keys hidden by f32::MIN: the scores (0.044 and 0.133) vanish beside it (its last
    // place is 2^104), so both weigh 1/2, the output is the mean of the value rows [1, 1.25] and
    // [1.5, 1.75], and the lse is f32::MIN + ln 2, which rounds to f32::MIN.
    let header = [
        tensor("mask", "F32", "[1,2]", 40, 8),
        tensor("expected_lse", "F32", "[1,1,1]", 48, 4),
        tensor("expected_out", "F32", "[1,1,1,2]", 52, 8),
    ]
    .concat();
    let data = f32s(&[f32::MIN, f32::MIN, f32::MIN, 1.25, 1.5]);
    let path = dir.path().join("min.safetensors");
    std::fs::write(
        &path,
        case_bytes(("F32", "[1,1,1,2]"), &header, &data, "{}"),
    )
    .unwrap();
    let out = dir.path().join("out.safetensors");
    let stdout = ok(&["sdpa", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(!stdout.contains("OVER"), "{stdout}");
    // A BF16 mask of [0, −∞] leaves the first key: the output is its value row, the lse its
    // score, 0.25·0.25/√2.
    let lse = (0.25f64 * 0.25 / 2f64.sqrt()) as f32;
    let header = [
        tensor("mask", "BF16", "[1,2]", 40, 4),
        tensor("expected_lse", "F32", "[1,1,1]", 44, 4),
        tensor("expected_out", "F32", "[1,1,1,2]", 48, 8),
    ]
    .concat();
    let mask: Vec<u8> = [0x0000u16, 0xff80]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let data = [mask, f32s(&[lse, 1.0, 1.25])].concat();
    std::fs::write(
        &path,
        case_bytes(("F32", "[1,1,1,2]"), &header, &data, "{}"),
    )
    .unwrap();
    let stdout = ok(&["sdpa", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(
        stdout.contains("out") && !stdout.contains("OVER"),
        "{stdout}"
    );
}

/// Metadata `align` puts a window without a causal mask on the bottom-right diagonal, as
/// FlashAttention does: the one query of the 1 × 2 case then sees the second key, not the first.
#[test]
fn sdpa_aligns_a_window_bottom_right_without_a_causal_mask() {
    let dir = tempfile::tempdir().unwrap();
    for (align, want) in [
        ("", [1.0, 0.0]),
        (r#","align":"\"bottom_right\"""#, [0.0, 1.0]),
    ] {
        let meta = format!(r#"{{"window":"[0, 0]"{align}}}"#);
        let path = dir.path().join("window.safetensors");
        std::fs::write(&path, case_bytes(("F32", "[1,1,1,2]"), "", &[], &meta)).unwrap();
        let out = dir.path().join("out.safetensors");
        let (path, out_path) = (path.to_str().unwrap(), out.to_str().unwrap());
        ok(&["sdpa", path, "-o", out_path, "--weights"]);
        let (written, _) = read_f32s(&out);
        let (_, _, w) = written.iter().find(|(n, _, _)| n == "weights").unwrap();
        assert_eq!(w[..], want, "{meta}");
    }
}

/// A case whose `expected_out` the result misses fails with exit code 1, after writing OUT and
/// printing the difference; one it matches succeeds. A miss printed "OVER" and exited 0.
#[test]
fn sdpa_fails_a_case_whose_expected_out_it_misses() {
    let (_, out) = hand_made_result();
    let dir = tempfile::tempdir().unwrap();
    let run = |shift: f64| {
        let data: Vec<u8> = (out.iter())
            .flat_map(|x| ((x + shift) as f32).to_le_bytes())
            .collect();
        let header =
            ",\"expected_out\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[40,48]}";
        let path = dir.path().join(format!("shift{shift}.safetensors"));
        std::fs::write(&path, case_bytes(("F32", "[1,1,1,2]"), header, &data, "{}")).unwrap();
        let written = dir.path().join(format!("out{shift}.safetensors"));
        let args = [
            "sdpa",
            path.to_str().unwrap(),
            "-o",
            written.to_str().unwrap(),
        ];
        (attnscope(&args), written)
    };
    let (output, _) = run(0.0);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("max abs diff out"));
    let (output, written) = run(0.01);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stdout).contains(": OVER"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("out past the tolerance"));
    assert!(written.exists(), "the results are written all the same");
}

/// The gradients' check fails the command too: a case whose expected_dq is 1 off exits 1,
/// naming dq.
#[test]
fn sdpa_fails_a_case_whose_expected_gradient_it_misses() {
    let dir = tempfile::tempdir().unwrap();
    // dout [1, 1, 1, 2] of ones, then an expected_dq [1, 1, 1, 2] of 1 (the true dq is small:
    // the scores differ by 0.09).
    let data: Vec<u8> = [1.0f32, 1.0, 1.0, 1.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let header = ",\"dout\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[40,48]},\
                  \"expected_dq\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[48,56]}";
    let path = dir.path().join("grad.safetensors");
    std::fs::write(&path, case_bytes(("F32", "[1,1,1,2]"), header, &data, "{}")).unwrap();
    let written = dir.path().join("out.safetensors");
    let args = [
        "sdpa",
        path.to_str().unwrap(),
        "-o",
        written.to_str().unwrap(),
        "--backward",
    ];
    let output = attnscope(&args);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stdout).contains("max abs diff dq"));
    assert!(String::from_utf8_lossy(&output.stderr).contains("dq past the tolerance"));
    assert!(written.exists());
}

/// The hand-made case with q, k and v stored as BF16 (their values are exact in bf16): the bf16
/// kernels run, within the default 1/64 of the float64 result; q, k and v of mixed dtypes and
/// `--backward` on BF16 are refused, naming why.
#[test]
fn sdpa_runs_a_bf16_case_on_the_bf16_kernels() {
    let (_, out) = hand_made_result();
    // bf16 keeps the high half of an f32's bits.
    let halves = |xs: &[f32]| -> Vec<u8> {
        (xs.iter())
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect()
    };
    let case = |k_dtype: &str| {
        let k_len = if k_dtype == "BF16" { 8 } else { 16 };
        let header = format!(
            "{{\"q\":{{\"dtype\":\"BF16\",\"shape\":[1,1,1,2],\"data_offsets\":[0,4]}},\
             \"k\":{{\"dtype\":\"{k_dtype}\",\"shape\":[1,1,2,2],\"data_offsets\":[4,{}]}},\
             \"v\":{{\"dtype\":\"BF16\",\"shape\":[1,1,2,2],\"data_offsets\":[{},{}]}},\
             \"expected_out\":{{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[{},{}]}}}}",
            4 + k_len,
            4 + k_len,
            12 + k_len,
            12 + k_len,
            20 + k_len
        );
        let keys = [0.0f32, 0.25, 0.5, 0.75];
        let mut data = halves(&[0.0, 0.25]);
        data.extend(match k_dtype {
            "BF16" => halves(&keys),
            _ => keys.iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
        data.extend(halves(&[1.0, 1.25, 1.5, 1.75]));
        data.extend(out.iter().flat_map(|&x| (x as f32).to_le_bytes()));
        st_bytes(&header, &data)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bf16.safetensors");
    std::fs::write(&path, case("BF16")).unwrap();
    let written = dir.path().join("out.safetensors");
    let (p, w) = (path.to_str().unwrap(), written.to_str().unwrap());
    let stdout = ok(&["sdpa", p, "-o", w]);
    assert!(
        stdout.contains("tolerance 1.5625e-2") && stdout.contains(": ok"),
        "{stdout}"
    );
    let (results, _) = read_f32s(&written);
    let (_, _, got) = results.iter().find(|(n, _, _)| n == "out").unwrap();
    // P rounded to bf16 moves the output by at most 2^-8 of the largest value.
    for (g, e) in got.iter().zip(out) {
        assert!(
            (f64::from(*g) - e).abs() <= 1.75 / 256.0,
            "{got:?} against {out:?}"
        );
    }
    fails_with(
        &["sdpa", p, "-o", w, "--backward"],
        &["--backward takes F32 cases"],
    );
    let mixed = dir.path().join("mixed.safetensors");
    std::fs::write(&mixed, case("F32")).unwrap();
    fails_with(
        &["sdpa", mixed.to_str().unwrap(), "-o", w],
        &["q is BF16 but k is F32: q, k and v share one dtype"],
    );
}

#[test]
fn sdpa_rejects_each_bad_file_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let valid = valid_case();
    let mask_header = |dtype: &str, shape: &str, len: usize| {
        format!(
            ",\"mask\":{{\"dtype\":\"{dtype}\",\"shape\":{shape},\"data_offsets\":[40,{}]}}",
            40 + len
        )
    };

    // Files that are not safetensors at all.
    bad_case(
        d,
        "truncated",
        &valid[..valid.len() - 3],
        &["not a valid safetensors file"],
    );
    bad_case(d, "tiny", &[1, 0, 0], &["not a valid safetensors file"]);
    bad_case(
        d,
        "header_past_end",
        &[0xff, 0xff, 0, 0, 0, 0, 0, 0, b'{', b'}'],
        &["not a valid safetensors file"],
    );
    bad_case(
        d,
        "malformed_header",
        &st_bytes("{\"q\": [", &[]),
        &["not a valid safetensors file"],
    );
    bad_case(
        d,
        "offsets_past_data",
        &st_bytes(
            "{\"q\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[0,8]}}",
            &[0; 4],
        ),
        &["not a valid safetensors file"],
    );

    // Tensors that are missing, of the wrong dtype or rank, or that disagree.
    bad_case(
        d,
        "missing_v",
        &st_bytes(
            "{\"q\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2],\"data_offsets\":[0,8]},\
              \"k\":{\"dtype\":\"F32\",\"shape\":[1,1,2,2],\"data_offsets\":[8,24]}}",
            &[0; 24],
        ),
        &["missing tensor v", "[batch, n_kv_heads, seq_kv, value_dim]"],
    );
    bad_case(
        d,
        "q_f64",
        &case_bytes(("F64", "[1,1,1,2]"), "", &[], "{}"),
        &["q has dtype F64", "expected F32"],
    );
    bad_case(
        d,
        "q_rank3",
        &case_bytes(("F32", "[1,1,2]"), "", &[], "{}"),
        &["q has shape [1, 1, 2]", "expected 4 dims"],
    );
    bad_case(
        d,
        "head_dim_disagrees",
        &case_bytes(("F32", "[1,1,2,1]"), "", &[], "{}"),
        &["k has shape [1, 1, 2, 2] but q has shape [1, 1, 2, 1]"],
    );
    bad_case(
        d,
        "q_nan",
        &{
            let mut b = valid.clone();
            let at = b.len() - 32 - 4; // q's second value
            b[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
            b
        },
        &["q holds NaN at [0, 0, 0, 1]"],
    );
    bad_case(
        d,
        "unknown_tensor",
        &case_bytes(
            ("F32", "[1,1,1,2]"),
            ",\"maks\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[40,42]}",
            &[1, 1],
            "{}",
        ),
        &["unknown tensor \"maks\""],
    );

    // Masks.
    bad_case(
        d,
        "mask_not_broadcastable",
        &case_bytes(
            ("F32", "[1,1,1,2]"),
            &mask_header("BOOL", "[3]", 3),
            &[1, 1, 1],
            "{}",
        ),
        &["mask: shape [1, 1, 1, 3] does not broadcast to [1, 1, 1, 2]"],
    );
    // A float mask holding NaN is named by the file's name for it (it read "mask:float_mask").
    let nan_mask: Vec<u8> = [0.0f32, f32::NAN]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    bad_case(
        d,
        "mask_nan",
        &case_bytes(
            ("F32", "[1,1,1,2]"),
            &mask_header("F32", "[2]", 8),
            &nan_mask,
            "{}",
        ),
        &["mask holds a non-finite value (NaN) at flat index 1"],
    );
    bad_case(
        d,
        "mask_i32",
        &case_bytes(
            ("F32", "[1,1,1,2]"),
            &mask_header("I32", "[2]", 8),
            &[0; 8],
            "{}",
        ),
        &["mask has dtype I32", "BOOL, F32 or BF16"],
    );
    bad_case(
        d,
        "mask_bad_bool",
        &case_bytes(
            ("F32", "[1,1,1,2]"),
            &mask_header("BOOL", "[2]", 2),
            &[1, 7],
            "{}",
        ),
        &["mask holds byte 7 at flat index 1"],
    );
    bad_case(
        d,
        "key_padding_shape",
        &case_bytes(
            ("F32", "[1,1,1,2]"),
            ",\"key_padding\":{\"dtype\":\"BOOL\",\"shape\":[1,3],\"data_offsets\":[40,43]}",
            &[1, 1, 1],
            "{}",
        ),
        &["key_padding has shape [1, 3]", "[batch, seq_kv] = [1, 2]"],
    );

    // Options in the metadata.
    let meta = |m: &str| case_bytes(("F32", "[1,1,1,2]"), "", &[], m);
    bad_case(
        d,
        "alibi_length",
        &meta(r#"{"alibi":"[0.5, 0.25]"}"#),
        &["alibi: expected 1 values (one per query head), got 2"],
    );
    bad_case(
        d,
        "window_length",
        &meta(r#"{"window":"[3]"}"#),
        &["metadata window is [3]", "[left, right]"],
    );
    bad_case(
        d,
        "window_negative",
        &meta(r#"{"window":"[-2, 0]"}"#),
        &["metadata window is [-2,0]"],
    );
    bad_case(
        d,
        "causal_unknown",
        &meta(r#"{"causal":"\"diagonal\""}"#),
        &["metadata causal is \"diagonal\"", "top_left"],
    );
    bad_case(
        d,
        "align_unknown",
        &meta(r#"{"align":"\"middle\""}"#),
        &["metadata align is \"middle\"", "bottom_right"],
    );
    bad_case(
        d,
        "align_against_causal",
        &meta(r#"{"causal":"\"top_left\"","align":"\"bottom_right\""}"#),
        &["align: is BottomRight but the causal mask is TopLeft"],
    );
    bad_case(
        d,
        "scale_not_json",
        &meta(r#"{"scale":"abc"}"#),
        &["metadata scale is abc (as stored, without quotes), which is not JSON"],
    );
    // A string written unquoted: the message shows it quoted.
    bad_case(
        d,
        "causal_unquoted",
        &meta(r#"{"causal":"top_left"}"#),
        &[
            "metadata causal is top_left (as stored, without quotes), which is not JSON",
            "a string with its quotes (\"top_left\")",
        ],
    );
    bad_case(
        d,
        "softcap_negative",
        &meta(r#"{"softcap":"-1.0"}"#),
        &["softcap: must be finite and > 0"],
    );
    bad_case(
        d,
        "unknown_key",
        &meta(r#"{"casual":"\"top_left\""}"#),
        &["unknown metadata key \"casual\""],
    );
    bad_case(
        d,
        "dropout_p_above_one",
        &meta(r#"{"dropout_p":"1.5"}"#),
        &["dropout: p must be in [0, 1]"],
    );

    // Head counts: different without gqa, and not dividing with it.
    let heads = |hq: usize, hkv: usize, meta: &str| {
        let (nq, nk) = (hq * 2, hkv * 4);
        let header = format!(
            "{{\"__metadata__\":{meta},\
             \"q\":{{\"dtype\":\"F32\",\"shape\":[1,{hq},1,2],\"data_offsets\":[0,{}]}},\
             \"k\":{{\"dtype\":\"F32\",\"shape\":[1,{hkv},2,2],\"data_offsets\":[{},{}]}},\
             \"v\":{{\"dtype\":\"F32\",\"shape\":[1,{hkv},2,2],\"data_offsets\":[{},{}]}}}}",
            4 * nq,
            4 * nq,
            4 * (nq + nk),
            4 * (nq + nk),
            4 * (nq + 2 * nk)
        );
        st_bytes(&header, &vec![0; 4 * (nq + 2 * nk)])
    };
    bad_case(
        d,
        "heads_without_gqa",
        &heads(4, 2, "{}"),
        &["k has 2 heads but q has 4", "gqa"],
    );
    bad_case(
        d,
        "heads_not_dividing",
        &heads(3, 2, r#"{"gqa":"true"}"#),
        &["n_heads (3) is not a multiple of n_kv_heads (2)"],
    );

    // The file itself.
    fails_with(
        &[
            "sdpa",
            d.join("nope.safetensors").to_str().unwrap(),
            "-o",
            "x",
        ],
        &["reading", "nope.safetensors"],
    );
    let good = d.join("good.safetensors");
    std::fs::write(&good, &valid).unwrap();
    fails_with(
        &[
            "sdpa",
            good.to_str().unwrap(),
            "-o",
            d.join("no/such/dir/out.safetensors").to_str().unwrap(),
        ],
        &["the folder", "no/such/dir", "does not exist"],
    );
    // Under a file, however deep: the file is named.
    fails_with(
        &[
            "sdpa",
            good.to_str().unwrap(),
            "-o",
            good.join("sub/out.safetensors").to_str().unwrap(),
        ],
        &["good.safetensors is not a folder"],
    );
    // A missing -o is a usage error: exit code 1, as for any bad input.
    assert_eq!(
        attnscope(&["sdpa", good.to_str().unwrap()]).status.code(),
        Some(1)
    );
    // Asking for help or the version is not an error.
    for ask in [&["--help"][..], &["--version"], &["explain", "--help"]] {
        let output = attnscope(ask);
        assert_eq!(output.status.code(), Some(0), "{ask:?}");
        assert!(!output.stdout.is_empty(), "{ask:?}");
    }
}

/// The notes' embeddings and the walkthrough's documented illustrative matrices.
const X: [[f64; 4]; 3] = [
    [0.2, 0.1, 0.5, 0.3],
    [0.5, 0.8, 0.2, 0.1],
    [0.1, 0.3, 0.9, 0.4],
];
const H: [[f64; 4]; 4] = [
    [1.0, 1.0, 1.0, 1.0],
    [1.0, -1.0, 1.0, -1.0],
    [1.0, 1.0, -1.0, -1.0],
    [1.0, -1.0, -1.0, 1.0],
];
const W_V: [[f64; 4]; 4] = [
    [1.0, 0.0, 0.0, 0.5],
    [0.0, 1.0, 0.5, 0.0],
    [0.0, 0.5, 1.0, 0.0],
    [0.5, 0.0, 0.0, 1.0],
];

fn matmul<const N: usize, const K: usize, const M: usize>(
    a: &[[f64; K]; N],
    b: &[[f64; M]; K],
) -> [[f64; M]; N] {
    let mut c = [[0.0; M]; N];
    for i in 0..N {
        for j in 0..M {
            c[i][j] = (0..K).map(|k| a[i][k] * b[k][j]).sum();
        }
    }
    c
}

/// Softmax of `scores[i] / 2` (√d_k = 2) over the keys `visible[i][j]`.
fn softmax_rows(scores: &[[f64; 3]; 3], visible: &[[bool; 3]; 3]) -> [[f64; 3]; 3] {
    let mut w = [[0.0; 3]; 3];
    for i in 0..3 {
        let z: f64 = (0..3)
            .filter(|&j| visible[i][j])
            .map(|j| (scores[i][j] / 2.0).exp())
            .sum();
        for j in 0..3 {
            if visible[i][j] {
                w[i][j] = (scores[i][j] / 2.0).exp() / z;
            }
        }
    }
    w
}

fn percent_line(word: &str, words: &[&str], i: usize, w: &[f64; 3], masked: &[bool; 3]) -> String {
    let parts: Vec<String> = (0..3)
        .map(|j| {
            let to = if j == i { "itself" } else { words[j] };
            let m = if masked[j] { " (masked)" } else { "" };
            format!("{:.0}% to {to}{m}", 100.0 * w[j])
        })
        .collect();
    format!("{word}: {}", parts.join(", "))
}

#[test]
fn walkthrough_prints_the_notes_example_with_numbers_derived_here() {
    let stdout = ok(&["walkthrough"]);
    assert!(stdout.contains("ILLUSTRATIVE"), "{stdout}");
    // W_q = W_k makes the scores symmetric, which a trained model's need not be: said.
    assert!(
        stdout.contains("a trained model's W_q and W_k differ"),
        "{stdout}"
    );
    // Q = K = X·H, V = X·W_v; scores Q·Kᵀ; weights softmax(scores / 2), computed here in f64.
    let q = matmul(&X, &H);
    let kt: [[f64; 3]; 4] = std::array::from_fn(|c| std::array::from_fn(|r| q[r][c]));
    let scores = matmul(&q, &kt);
    let w = softmax_rows(&scores, &[[true; 3]; 3]);
    let words = ["The", "cat", "sat"];
    for (i, word) in words.iter().enumerate() {
        let line = percent_line(word, &words, i, &w[i], &[false; 3]);
        assert!(
            stdout.contains(&format!("   {line}\n")),
            "missing {line:?} in\n{stdout}"
        );
    }
    // The row for "cat" as a weighted sum of V rows, then its value.
    let v = matmul(&X, &W_V);
    let symbolic = format!(
        "output[1] = {:.3}·V[0] + {:.3}·V[1] + {:.3}·V[2]",
        w[1][0], w[1][1], w[1][2]
    );
    assert!(stdout.contains(&symbolic), "missing {symbolic:?}");
    let out1: Vec<String> = (0..4)
        .map(|c| format!("{:.3}", (0..3).map(|j| w[1][j] * v[j][c]).sum::<f64>()))
        .collect();
    let value = format!("= [{}]", out1.join(", "));
    assert!(stdout.contains(&value), "missing {value:?} in\n{stdout}");
    // The scaled score of cat → cat: 4·|x_cat|² / 2 = 2 · 0.94 = 1.880.
    assert!(stdout.contains("1.880"));
}

#[test]
fn walkthrough_masks_follow_the_mask_matrix() {
    let words = ["The", "cat", "sat"];
    let q = matmul(&X, &H);
    let kt: [[f64; 3]; 4] = std::array::from_fn(|c| std::array::from_fn(|r| q[r][c]));
    let scores = matmul(&q, &kt);

    // Causal: word i sees words 0..=i.
    let causal: [[bool; 3]; 3] = std::array::from_fn(|i| std::array::from_fn(|j| j <= i));
    let stdout = ok(&["walkthrough", "--mask", "causal"]);
    assert!(stdout.contains("The    1   0   0\n") && stdout.contains("sat    1   1   1\n"));
    let w = softmax_rows(&scores, &causal);
    for (i, word) in words.iter().enumerate() {
        let masked = causal[i].map(|v| !v);
        let line = percent_line(word, &words, i, &w[i], &masked);
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }
    // The first word sees only itself.
    assert!(stdout.contains("The: 100% to itself, 0% to cat (masked), 0% to sat (masked)"));

    // padding:1: "sat" is padding, nobody attends to it.
    let padded = [[true, true, false]; 3];
    let stdout = ok(&["walkthrough", "--mask", "padding:1"]);
    assert!(stdout.contains("cat    1   1   0\n"));
    assert!(stdout.contains("(each row sums to 1)"), "{stdout}");
    let w = softmax_rows(&scores, &padded);
    for (i, word) in words.iter().enumerate() {
        let line = percent_line(word, &words, i, &w[i], &[false, false, true]);
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }
}

#[test]
fn walkthrough_takes_a_users_matrices() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mine.json");
    // W_q = 0 makes every score 0, so each row's weights are uniform over what it sees:
    // 1/3 each without a mask (33%), and under the causal mask 1, 1/2, 1/3.
    // V = X·I = X, so output[1] causal = (x0 + x1) / 2 = [(1+3)/2, (2+4)/2] = [2, 3].
    std::fs::write(
        &path,
        r#"{"words": ["a", "b", "c"], "x": [[1, 2], [3, 4], [5, 6]],
            "w_q": [[0, 0], [0, 0]], "w_k": [[1, 0], [0, 1]], "w_v": [[1, 0], [0, 1]]}"#,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let stdout = ok(&["walkthrough", "--file", p]);
    assert!(
        stdout.contains("a: 33% to itself, 33% to b, 33% to c"),
        "{stdout}"
    );
    assert!(!stdout.contains("ILLUSTRATIVE"));
    let stdout = ok(&[
        "walkthrough",
        "--file",
        p,
        "--mask",
        "causal",
        "--word",
        "b",
    ]);
    assert!(
        stdout.contains("b: 50% to a, 50% to itself, 0% to c (masked)"),
        "{stdout}"
    );
    assert!(stdout.contains("c: 33% to a, 33% to b, 33% to itself"));
    assert!(stdout.contains("output[1] = 0.500·V[0] + 0.500·V[1] + 0.000·V[2]"));
    assert!(stdout.contains("= [2.000, 3.000]"), "{stdout}");
    // --word as explain's --focus takes it: any case, and "B#2" the second "b" (counted in any
    // case: "B" and "b" are both "b"). Causal, W_q = 0: the second (row 2) spreads over the
    // three, output[2] = (x0 + x1 + x2) / 3.
    let repeated = dir.path().join("repeated.json");
    std::fs::write(
        &repeated,
        r#"{"words": ["a", "B", "b"], "x": [[1, 2], [3, 4], [5, 6]],
            "w_q": [[0, 0], [0, 0]], "w_k": [[1, 0], [0, 1]], "w_v": [[1, 0], [0, 1]]}"#,
    )
    .unwrap();
    let r = repeated.to_str().unwrap();
    let args = ["walkthrough", "--file", r, "--mask", "causal", "--word"];
    let stdout = ok(&[&args[..], &["B#2"]].concat());
    assert!(stdout.contains("= [3.000, 4.000]"), "{stdout}");
    assert!(stdout.contains("output[2] = "), "{stdout}");
    assert_eq!(
        ok(&[&args[..], &["B"]].concat()),
        ok(&[&args[..], &["b"]].concat())
    );
    for (word, says) in [
        ("b#3", "\"b\" occurs 2 times in the words; #3 asks for more"),
        ("b#0", "occurrences count from 1"),
        ("d", "is not one of the words: a, B, b"),
    ] {
        fails_with(&[&args[..], &[word]].concat(), &[says]);
    }
    // However its accent is encoded, "café" is one word: café#2 is the decomposed third.
    std::fs::write(
        &repeated,
        r#"{"words": ["café", "b", "cafe\u0301"], "x": [[1, 2], [3, 4], [5, 6]],
            "w_q": [[0, 0], [0, 0]], "w_k": [[1, 0], [0, 1]], "w_v": [[1, 0], [0, 1]]}"#,
    )
    .unwrap();
    let stdout = ok(&[&args[..], &["café#2"]].concat());
    assert!(stdout.contains("output[2] = "), "{stdout}");
    assert!(stdout.contains("= [3.000, 4.000]"), "{stdout}");
    // All words padding: no row sees anything, outputs are 0.
    let stdout = ok(&["walkthrough", "--file", p, "--mask", "padding:3"]);
    assert!(stdout.contains("a: sees no word"), "{stdout}");
    assert!(stdout.contains("a row that sees none is 0"), "{stdout}");
    assert!(!stdout.contains("(each row sums to 1)"), "{stdout}");
}

#[test]
fn walkthrough_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let ok_x = r#""x": [[1, 2], [3, 4]], "w_k": [[1, 0], [0, 1]], "w_v": [[1], [1]]"#;
    let cases = [
        ("not_json", "{".to_string(), vec!["not valid JSON"]),
        (
            "w_q_rows",
            format!(r#"{{{ok_x}, "w_q": [[1, 0, 0]]}}"#),
            vec!["w_q is 1×3 but x is 2×2", "d_model = 2 rows"],
        ),
        (
            "ragged",
            r#"{"x": [[1, 2], [3]], "w_q": [[1]], "w_k": [[1]], "w_v": [[1]]}"#.to_string(),
            vec!["x row 1 has 1 values but row 0 has 2"],
        ),
        (
            "d_k_differs",
            format!(r#"{{{ok_x}, "w_q": [[1], [1]]}}"#),
            vec!["w_q is 2×1 but w_k is 2×2", "same width d_k"],
        ),
        (
            "missing",
            r#"{"x": [[1]], "w_q": [[1]], "w_k": [[1]]}"#.to_string(),
            vec!["missing field w_v"],
        ),
        (
            "words",
            format!(r#"{{{ok_x}, "w_q": [[1, 0], [0, 1]], "words": ["one"]}}"#),
            vec!["words holds 1 words but x has 2 rows"],
        ),
        (
            "text_value",
            r#"{"x": [["a"]], "w_q": [[1]], "w_k": [[1]], "w_v": [[1]]}"#.to_string(),
            vec!["x[0][0] is \"a\"; expected a finite number"],
        ),
        (
            // 1e30 · 1e30 + 1e30 · 1e30 overflows: q[0][0] = inf.
            "overflow",
            r#"{"x": [[1e30, 1e30]], "w_q": [[1e30], [1e30]], "w_k": [[1], [1]], "w_v": [[1], [1]]}"#
                .to_string(),
            vec!["overflow.json", "q = X·W_q is inf at row 0, column 0"],
        ),
    ];
    for (name, text, needles) in cases {
        let p = write(&format!("{name}.json"), &text);
        fails_with(&["walkthrough", "--file", &p], &needles);
    }
    fails_with(
        &["walkthrough", "--mask", "diagonal"],
        &["expected causal or padding:N"],
    );
    fails_with(
        &["walkthrough", "--mask", "padding:x"],
        &["N must be a whole number"],
    );
    fails_with(&["walkthrough", "--mask", "padding:4"], &["only 3 words"]);
    fails_with(
        &["walkthrough", "--word", "dog"],
        &["\"dog\" is not one of the words: The, cat, sat"],
    );
    fails_with(
        &["walkthrough", "--file", "/nonexistent/x.json"],
        &["cannot read /nonexistent/x.json"],
    );
}

#[test]
fn mask_matrices_match_the_notes() {
    // Causal over 4 tokens: row i has ones in columns 0..=i (the notes' lower triangle).
    let stdout = ok(&["mask", "causal", "4"]);
    let rows: Vec<Vec<u8>> = stdout
        .lines()
        .skip(2)
        .take(4)
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect()
        })
        .collect();
    let want: Vec<Vec<u8>> = (0..4)
        .map(|i| (0..4).map(|j| u8::from(j <= i)).collect())
        .collect();
    assert_eq!(rows, want, "{stdout}");
    // The notes' "when predicting word 2, it sees words 0 and 1" is row 1.
    assert!(
        stdout.ends_with("predicting token 2 is row 1, which sees tokens 0 and 1.\n"),
        "{stdout}"
    );
    assert!(ok(&["mask", "causal", "1"]).starts_with("Causal mask, 1 query × 1 key ("));

    // Bottom-right, 2 queries over 4 keys: offset 2, so row 0 sees keys 0..=2, row 1 all 4.
    let stdout = ok(&[
        "mask",
        "causal",
        "2",
        "--seq-kv",
        "4",
        "--align",
        "bottom-right",
    ]);
    assert!(stdout.ends_with("0  1 1 1 0\n1  1 1 1 1\n"), "{stdout}");

    // Padding: <PAD> and [PAD] are padding.
    let stdout = ok(&["mask", "padding", "The cat <PAD> <PAD>"]);
    assert!(stdout.contains("mask = [[1, 1, 0, 0]]"), "{stdout}");
    assert!(stdout.contains("2 real, 2 padding"));
    assert!(
        stdout.contains("<PAD>      1     1     0     0\n"),
        "{stdout}"
    );
    // In any case.
    let stdout = ok(&["mask", "padding", "The cat <pad> [Pad]"]);
    assert!(stdout.contains("mask = [[1, 1, 0, 0]]"), "{stdout}");
    let stdout = ok(&["mask", "padding", "[CLS] hi [SEP] [PAD]"]);
    assert!(stdout.contains("mask = [[1, 1, 1, 0]]"), "{stdout}");
    assert!(!stdout.contains("see no key"), "{stdout}");

    // Rows without a key say what attention gives them: bottom-right, 5 queries over 3 keys
    // leaves rows 0 and 1 blind; all padding, every row.
    let stdout = ok(&[
        "mask",
        "causal",
        "5",
        "--seq-kv",
        "3",
        "--align",
        "bottom-right",
    ]);
    assert!(
        stdout.ends_with(
            "Rows 0 to 1 (2 rows) see no key: attnscope gives them output 0 and weights 0, as \
             FlashAttention does (PyTorch's softmax of a row of −∞ gives NaN, and a mask of \
             −1e9, as in the notes' masked_fill, gives even weights).\n"
        ),
        "{stdout}"
    );
    let stdout = ok(&["mask", "padding", "<PAD>"]);
    assert!(stdout.contains("Row 0 sees no key"), "{stdout}");

    fails_with(&["mask", "causal", "0"], &["seq_q is 0"]);
    fails_with(&["mask", "padding", "   "], &["no tokens"]);
    assert_eq!(attnscope(&["mask", "causal", "-3"]).status.code(), Some(1));
}

#[test]
fn sdpa_backward_reproduces_every_golden_gradient_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden("grad"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 8, "the golden README lists 8 gradient files");
    for case in &files {
        let (inputs, _) = read_f32s(case);
        let want = |name: &str| {
            let (_, dims, data) = inputs.iter().find(|(n, _, _)| n == name).unwrap();
            (dims.clone(), data.clone())
        };
        for extra in [None, Some("--reference")] {
            let out = dir.path().join("grads.safetensors");
            let mut args = vec![
                "sdpa",
                case.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--backward",
            ];
            args.extend(extra);
            let stdout = ok(&args);
            let (written, _) = read_f32s(&out);
            for name in ["dq", "dk", "dv"] {
                let (dims, expected) = want(&format!("expected_{name}"));
                let (_, got_dims, got) = written.iter().find(|(n, _, _)| n == name).unwrap();
                assert_eq!(got_dims, &dims, "{case:?} {extra:?}: {name} shape");
                let d = got
                    .iter()
                    .zip(&expected)
                    .map(|(g, e)| (g - e).abs())
                    .fold(0.0f32, f32::max);
                assert!(d <= 1e-4, "{case:?} {extra:?}: {name} differs by {d:e}");
                let line = stdout
                    .lines()
                    .find(|l| l.starts_with(&format!("max abs diff {name} ")))
                    .unwrap_or_else(|| panic!("{case:?}: no {name} line in {stdout}"));
                assert!(line.ends_with("absolute: ok"), "{case:?}: {line}");
            }
        }
    }
}

/// `case_bytes` plus a `dout` tensor of `shape` and `values` (F32), after byte 40 of data.
fn case_with_dout(shape: &str, values: &[f32], more_header: &str, more_data: &[u8]) -> Vec<u8> {
    let end = 40 + 4 * values.len();
    let header = format!(
        ",\"dout\":{{\"dtype\":\"F32\",\"shape\":{shape},\"data_offsets\":[40,{end}]}}{more_header}"
    );
    let mut data: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
    data.extend_from_slice(more_data);
    case_bytes(("F32", "[1,1,1,2]"), &header, &data, "{}")
}

#[test]
fn sdpa_backward_writes_gradients_for_a_hand_made_case() {
    // q = [0, 0.25], k = [[0, 0.25], [0.5, 0.75]], v = [[1, 1.25], [1.5, 1.75]], scale 1/√2.
    // Scores s_j = q·k_j/√2 = [0.0625, 0.1875]/√2; P = softmax(s); dout = [1, 0]:
    // dv_j = P_j·dout, dP_j = dout·v_j = [1, 1.5], dS_j = P_j·(dP_j − Σ P·dP),
    // dq = Σ_j dS_j·k_j/√2, dk_j = dS_j·q/√2.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("case.safetensors");
    std::fs::write(&path, case_with_dout("[1,1,1,2]", &[1.0, 0.0], "", &[])).unwrap();
    let out = dir.path().join("o.safetensors");
    let stdout = ok(&[
        "sdpa",
        path.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--backward",
    ]);
    assert!(stdout.contains("dq [1, 1, 1, 2], dk [1, 1, 2, 2], dv [1, 1, 2, 2]"));
    let (written, _) = read_f32s(&out);
    let get = |name: &str| {
        written
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap()
            .2
            .clone()
    };
    let r2 = 2f64.sqrt();
    let s = [0.0625 / r2, 0.1875 / r2];
    let e = [s[0].exp(), s[1].exp()];
    let p = [e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1])];
    let dp = [1.0, 1.5];
    let mean = p[0] * dp[0] + p[1] * dp[1];
    let ds = [p[0] * (dp[0] - mean), p[1] * (dp[1] - mean)];
    let dq = [
        (ds[0] * 0.0 + ds[1] * 0.5) / r2,
        (ds[0] * 0.25 + ds[1] * 0.75) / r2,
    ];
    let dk = [0.0, ds[0] * 0.25 / r2, 0.0, ds[1] * 0.25 / r2];
    let dv = [p[0], 0.0, p[1], 0.0];
    for (name, want) in [("dq", &dq[..]), ("dk", &dk[..]), ("dv", &dv[..])] {
        let got = get(name);
        for (g, w) in got.iter().zip(want) {
            assert!(
                (f64::from(*g) - w).abs() < 1e-6,
                "{name}: {got:?} vs {want:?}"
            );
        }
    }
}

/// With an F32 mask, `--backward` also writes `dmask`: the hand-made case's scores plus the
/// mask [0.1, −0.2], `dS_j = P_j·(dP_j − Σ P·dP)` of them (derived here in f64). An
/// `expected_dmask` it matches passes; one it misses fails with exit code 1.
#[test]
fn sdpa_backward_writes_the_float_masks_gradient() {
    let r2 = 2f64.sqrt();
    let mask = [0.1f32, -0.2];
    let s = [0.0625 / r2 + 0.1, 0.1875 / r2 - 0.2];
    let e = [s[0].exp(), s[1].exp()];
    let p = [e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1])];
    let dp = [1.0, 1.5];
    let mean = p[0] * dp[0] + p[1] * dp[1];
    let ds = [p[0] * (dp[0] - mean), p[1] * (dp[1] - mean)];
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, expected: Option<[f64; 2]>, reference: bool| {
        let mut header =
            String::from(",\"mask\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[48,56]}");
        let mut data: Vec<u8> = mask.iter().flat_map(|x| x.to_le_bytes()).collect();
        if let Some(expected) = expected {
            header +=
                ",\"expected_dmask\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[56,64]}";
            data.extend(expected.iter().flat_map(|&x| (x as f32).to_le_bytes()));
        }
        let path = dir.path().join(format!("{name}.safetensors"));
        std::fs::write(
            &path,
            case_with_dout("[1,1,1,2]", &[1.0, 0.0], &header, &data),
        )
        .unwrap();
        let out = dir.path().join(format!("{name}_out.safetensors"));
        let (path, out_path) = (path.to_str().unwrap(), out.to_str().unwrap());
        let mut args = vec!["sdpa", path, "-o", out_path, "--backward"];
        if reference {
            args.push("--reference");
        }
        (attnscope(&args), out)
    };
    for reference in [false, true] {
        let (output, out) = run("mask", None, reference);
        assert!(output.status.success());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("dv [1, 1, 2, 2], dmask [2]"), "{stdout}");
        let (written, _) = read_f32s(&out);
        let (_, dims, dmask) = written.iter().find(|(n, _, _)| n == "dmask").unwrap();
        assert_eq!(dims, &[2]);
        for (g, w) in dmask.iter().zip(ds) {
            assert!(
                (f64::from(*g) - w).abs() < 1e-6,
                "{reference}: {dmask:?} vs {ds:?}"
            );
        }
    }
    let (output, _) = run("expected", Some(ds), false);
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("max abs diff dmask "));
    let (output, _) = run("missed", Some([ds[0] + 0.01, ds[1]]), false);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("dmask past the tolerance"));
}

#[test]
fn sdpa_backward_rejects_bad_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, bytes: &[u8], needles: &[&str]| {
        let path = dir.path().join(format!("{name}.safetensors"));
        std::fs::write(&path, bytes).unwrap();
        let out = dir.path().join("out.safetensors");
        fails_with(
            &[
                "sdpa",
                path.to_str().unwrap(),
                "-o",
                out.to_str().unwrap(),
                "--backward",
            ],
            needles,
        );
        assert!(!out.exists(), "{name}: no output is written for a bad case");
    };
    run(
        "wrong_shape",
        &case_with_dout("[1,1,1,3]", &[1.0, 2.0, 3.0], "", &[]),
        &[
            "dout has shape [1, 1, 1, 3]",
            "[batch, n_heads, seq_q, value_dim] = [1, 1, 1, 2]",
        ],
    );
    run(
        "wrong_rank",
        &case_with_dout("[2]", &[1.0, 2.0], "", &[]),
        &["dout has shape [2]"],
    );
    run(
        "missing",
        &valid_case(),
        &["missing tensor dout", "--backward"],
    );
    run(
        "nan",
        &case_with_dout("[1,1,1,2]", &[1.0, f32::NAN], "", &[]),
        &["dout holds NaN at [0, 0, 0, 1]"],
    );
    run(
        "expected_dq_shape",
        &case_with_dout(
            "[1,1,1,2]",
            &[1.0, 0.0],
            ",\"expected_dq\":{\"dtype\":\"F32\",\"shape\":[1,1,2,1],\"data_offsets\":[48,56]}",
            &[0; 8],
        ),
        &["expected_dq has shape [1, 1, 2, 1]", "[1, 1, 1, 2]"],
    );
    run(
        "expected_dmask_without_a_mask",
        &case_with_dout(
            "[1,1,1,2]",
            &[1.0, 0.0],
            ",\"expected_dmask\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[48,56]}",
            &[0; 8],
        ),
        &["expected_dmask is given but the case has no float mask"],
    );
    // Without --backward a dout of any shape is left alone.
    let path = dir.path().join("ignored.safetensors");
    std::fs::write(
        &path,
        case_with_dout("[1,1,1,3]", &[1.0, 2.0, 3.0], "", &[]),
    )
    .unwrap();
    let out = dir.path().join("o.safetensors");
    ok(&["sdpa", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
}

#[test]
fn bench_sdpa_backward_reports_forward_plus_backward() {
    let stdout = ok(&[
        "bench",
        "sdpa",
        "--seq",
        "70",
        "--seq-kv",
        "33",
        "--heads",
        "4",
        "--head-dim",
        "16",
        "--causal",
        "--backward",
        "--reps",
        "1",
        "--threads",
        "1",
        "--json",
    ]);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["backward"], Value::Bool(true), "{report}");
    let (ms, gflops) = (
        report["ms"].as_f64().unwrap(),
        report["gflops"].as_f64().unwrap(),
    );
    // FLOPs = 4·B·H·L·S·d, halved when causal, times 3.5 with the backward pass.
    let flops = 4.0 * 4.0 * 70.0 * 33.0 * 16.0 * 0.5 * 3.5;
    let expected = flops / (ms * 1e-3) / 1e9;
    assert!(
        (gflops - expected).abs() <= 1e-6 * expected,
        "{gflops} vs {expected}"
    );
    let text = ok(&[
        "bench",
        "sdpa",
        "--seq",
        "16",
        "--heads",
        "1",
        "--head-dim",
        "8",
        "--backward",
        "--reps",
        "1",
        "--threads",
        "1",
    ]);
    assert!(text.starts_with("sdpa forward+backward f32"), "{text}");
    fails_with(
        &[
            "bench",
            "sdpa",
            "--seq",
            "16",
            "--heads",
            "1",
            "--head-dim",
            "8",
            "--backward",
            "--dtype",
            "bf16",
        ],
        &["--backward needs --dtype f32"],
    );
}

/// Empty results (no queries) compare as nothing: the comparison indexed element 0 of an empty
/// tensor and panicked after writing the results. A negative tolerance is refused.
#[test]
fn sdpa_compares_empty_results_and_refuses_a_negative_tolerance() {
    let dir = tempfile::tempdir().unwrap();
    let header = r#"{"q":{"dtype":"F32","shape":[1,1,0,2],"data_offsets":[0,0]},
        "k":{"dtype":"F32","shape":[1,1,2,2],"data_offsets":[0,16]},
        "v":{"dtype":"F32","shape":[1,1,2,2],"data_offsets":[16,32]},
        "expected_out":{"dtype":"F32","shape":[1,1,0,2],"data_offsets":[32,32]},
        "expected_lse":{"dtype":"F32","shape":[1,1,0],"data_offsets":[32,32]}}"#;
    let path = dir.path().join("empty.safetensors");
    std::fs::write(&path, st_bytes(header, &[0; 32])).unwrap();
    let out = dir.path().join("out.safetensors");
    let stdout = ok(&["sdpa", path.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(
        stdout.contains("out     is empty ([1, 1, 0, 2]): nothing to compare"),
        "{stdout}"
    );
    assert!(stdout.contains("lse     is empty"), "{stdout}");

    std::fs::remove_file(&out).unwrap();
    let negative = case_bytes(("F32", "[1,1,1,2]"), "", &[], r#"{"tolerance":"-1"}"#);
    bad_case(
        dir.path(),
        "negative-tolerance",
        &negative,
        &["tolerance is -1"],
    );
}

/// Output piped into a reader that stops early (`| head`) ends the command quietly with exit
/// status 0, and a closed standard error leaves the exit status to speak: `print!`,
/// `println!` and `eprintln!` panicked there (exit 101), as did serde's JSON writer's error.
#[test]
fn closed_pipes_end_commands_without_a_panic() {
    use std::io::Read;
    use std::process::{Command, Stdio};

    let entries = tempfile::NamedTempFile::new().unwrap();
    let lines: String = (0..3000).map(|i| format!("k{i}=value {i}\n")).collect();
    std::fs::write(entries.path(), lines).unwrap();
    let tiny = cli_support::tiny_gpt2();
    let entries = entries.path().to_str().unwrap();
    let tiny = tiny.to_str().unwrap();
    // Each writes far more than a pipe holds (64 KiB).
    let commands: [&[&str]; 2] = [
        &["mask", "causal", "512"],
        &[
            "lookup",
            "--query",
            "a",
            "--entries",
            entries,
            "--model",
            tiny,
            "--json",
        ],
    ];
    for args in commands {
        let mut child = Command::new(env!("CARGO_BIN_EXE_attnscope"))
            .args(args)
            .env_remove("ATTNSCOPE_MODEL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut head = [0u8; 10];
        child.stdout.take().unwrap().read_exact(&mut head).unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
    // Standard error closed (`2>&-`) on a failing command: exit 1, no panic.
    let output = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 2>&-; {} mask causal 0",
            env!("CARGO_BIN_EXE_attnscope")
        ))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
}
