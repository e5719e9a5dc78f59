//! Reads the golden cases of `tests/data/sdpa` and compares results the way its README says.
#![allow(dead_code)] // each test binary uses its own part of this module

pub mod rng;

use std::cell::Cell;
use std::io::Write;
use std::path::PathBuf;

use attn_core::{AttnOptions, AttnShape, BoolMask, Causal, FloatMask, Isa, KeyPadding, Window};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

/// Says on the process's standard error, which the test harness does not capture, that the
/// running test leaves `what` unchecked because this CPU cannot run it: a skip shows in every
/// run's output instead of passing for a check.
pub fn not_on_this_cpu(what: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = writeln!(
        std::io::stderr(),
        "note: {test}: {what} not checked, this CPU lacks it"
    );
}

/// Every instruction set this CPU runs (the portable one always); the others are named once per
/// test as not checked ([`not_on_this_cpu`]).
pub fn isas() -> Vec<Isa> {
    thread_local! {
        static SAID: Cell<bool> = const { Cell::new(false) };
    }
    let (run, lacking): (Vec<Isa>, Vec<Isa>) =
        Isa::ALL.into_iter().partition(|isa| isa.is_available());
    if !lacking.is_empty() && !SAID.replace(true) {
        not_on_this_cpu(&format!("{lacking:?}"));
    }
    run
}

pub fn golden_dir(sub: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data")).join(sub)
}

/// Every `.safetensors` file of a golden folder, sorted; panics if the folder is missing or empty,
/// so a missing checkout can never pass silently.
pub fn golden_files(sub: &str) -> Vec<PathBuf> {
    let dir = golden_dir(sub);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no golden files in {}", dir.display());
    files
}

pub struct Tensor {
    pub dims: Vec<usize>,
    pub f32: Vec<f32>,
    pub bool: Vec<bool>,
}

pub struct Case {
    pub name: String,
    pub shape: AttnShape,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub options: AttnOptions,
    pub tolerance: f32,
    pub expected_out: Vec<f32>,
    pub expected_weights: Vec<f32>,
    pub expected_lse: Vec<f32>,
    pub extra: std::collections::HashMap<String, Tensor>,
}

fn tensor(st: &SafeTensors<'_>, name: &str) -> Option<Tensor> {
    let view = st.tensor(name).ok()?;
    let bytes = view.data();
    let (f32, bool) = match view.dtype() {
        Dtype::F32 => (
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            vec![],
        ),
        Dtype::BOOL => (vec![], bytes.iter().map(|&b| b != 0).collect()),
        other => panic!("{name}: unexpected dtype {other:?}"),
    };
    Some(Tensor {
        dims: view.shape().to_vec(),
        f32,
        bool,
    })
}

pub fn load_case(path: &std::path::Path) -> Case {
    let bytes = std::fs::read(path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let md: std::collections::HashMap<String, Value> = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
        .collect();
    let q = tensor(&st, "q").unwrap();
    let k = tensor(&st, "k").unwrap();
    let v = tensor(&st, "v").unwrap();
    let shape = AttnShape {
        batch: q.dims[0],
        n_heads: q.dims[1],
        n_kv_heads: k.dims[1],
        seq_q: q.dims[2],
        seq_kv: k.dims[2],
        head_dim: q.dims[3],
        value_dim: v.dims[3],
    };
    let mut options = AttnOptions {
        scale: md.get("scale").map(|s| s.as_f64().unwrap() as f32),
        softcap: md.get("softcap").map(|s| s.as_f64().unwrap() as f32),
        alibi: md.get("alibi").map(|a| {
            a.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        }),
        causal: md.get("causal").map(|c| match c.as_str().unwrap() {
            "top_left" => Causal::TopLeft,
            "bottom_right" => Causal::BottomRight,
            other => panic!("causal {other}"),
        }),
        window: md.get("window").map(|w| {
            let w = w.as_array().unwrap();
            Window {
                left: w[0].as_u64().map(|x| x as usize),
                right: w[1].as_u64().map(|x| x as usize),
            }
        }),
        ..AttnOptions::default()
    };
    if let Some(m) = tensor(&st, "mask") {
        if m.bool.is_empty() {
            options.float_mask = Some(FloatMask::from_vec(m.f32, &m.dims).unwrap());
        } else {
            options.bool_mask = Some(BoolMask::from_vec(m.bool, &m.dims).unwrap());
        }
    }
    if let Some(kp) = tensor(&st, "key_padding") {
        options.key_padding = Some(KeyPadding::from_vec(kp.bool, kp.dims[0], kp.dims[1]).unwrap());
    }
    let extra = ["dout", "expected_dq", "expected_dk", "expected_dv"]
        .into_iter()
        .filter_map(|n| tensor(&st, n).map(|t| (n.to_string(), t)))
        .collect();
    Case {
        name: path.file_stem().unwrap().to_string_lossy().into_owned(),
        shape,
        q: q.f32,
        k: k.f32,
        v: v.f32,
        options,
        tolerance: md
            .get("tolerance")
            .map_or(1e-5, |t| t.as_f64().unwrap() as f32),
        expected_out: tensor(&st, "expected_out").unwrap().f32,
        expected_weights: tensor(&st, "expected_weights")
            .map(|t| t.f32)
            .unwrap_or_default(),
        expected_lse: tensor(&st, "expected_lse").unwrap().f32,
        extra,
    }
}

/// Max of |got − expected| / max(1, |expected|), and where it is; `-3e38` in `expected` stands
/// for −∞ and must match −∞ exactly.
pub fn max_diff(got: &[f32], expected: &[f32]) -> (f32, usize) {
    assert_eq!(got.len(), expected.len(), "length differs");
    let mut worst = (0.0f32, 0usize);
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let d = if e <= -3.0e38 {
            if g == f32::NEG_INFINITY {
                0.0
            } else {
                f32::INFINITY
            }
        } else if g.is_nan() {
            f32::INFINITY
        } else {
            (g - e).abs() / e.abs().max(1.0)
        };
        if d > worst.0 {
            worst = (d, i);
        }
    }
    worst
}

/// Asserts `got` is within `tol` of `expected`, reporting the worst element.
pub fn assert_close(what: &str, case: &str, got: &[f32], expected: &[f32], tol: f32) {
    let (d, at) = max_diff(got, expected);
    assert!(
        d <= tol,
        "{case}: {what} differs by {d:e} at flat index {at} (got {}, expected {}), tolerance {tol:e}",
        got[at],
        expected[at]
    );
}

/// Every tensor of a golden file by name, and its metadata with each value JSON-decoded.
pub fn load_tensors(
    path: &std::path::Path,
) -> (
    std::collections::HashMap<String, Tensor>,
    std::collections::HashMap<String, Value>,
) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let md = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, serde_json::from_str(&v).unwrap()))
        .collect();
    let tensors = st
        .names()
        .into_iter()
        .map(|name| (name.to_string(), tensor(&st, name).unwrap()))
        .collect();
    (tensors, md)
}

/// `options` with the kernels of `isa` forced ([`AttnOptions::isa`]).
pub fn on(isa: Isa, options: &AttnOptions) -> AttnOptions {
    AttnOptions {
        isa: Some(isa),
        ..options.clone()
    }
}

/// [`attn_core::sdpa`] on the kernels of `isa`.
pub fn sdpa_on<T: attn_core::AttnElement>(
    isa: Isa,
    input: &attn_core::AttnInput<'_, T>,
    options: &AttnOptions,
) -> Result<attn_core::AttnOutput, attn_core::AttnError> {
    attn_core::sdpa(input, &on(isa, options))
}

/// [`attn_core::sdpa_backward`] from a forward pass's `out` and `lse`.
pub fn backward(
    input: &attn_core::AttnInput<'_>,
    options: &AttnOptions,
    (out, lse): (&[f32], &[f32]),
    dout: &[f32],
) -> Result<attn_core::Grads, attn_core::AttnError> {
    let forward = attn_core::AttnOutput {
        out: out.to_vec(),
        lse: lse.to_vec(),
        weights: None,
    };
    attn_core::sdpa_backward(input, options, &forward, dout)
}

/// [`backward`] on the kernels of `isa`.
pub fn backward_on(
    isa: Isa,
    input: &attn_core::AttnInput<'_>,
    options: &AttnOptions,
    out_lse: (&[f32], &[f32]),
    dout: &[f32],
) -> Result<attn_core::Grads, attn_core::AttnError> {
    backward(input, &on(isa, options), out_lse, dout)
}
