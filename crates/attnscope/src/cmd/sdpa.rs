//! `attnscope sdpa CASE.safetensors -o OUT.safetensors`: one attention call on tensors saved from
//! PyTorch, in the format of `tests/data/sdpa` (see its README): tensors `q`, `k`, `v`, optional
//! `mask` (bool or f32) and `key_padding`; options in the metadata, each value JSON-encoded.
//! Every tensor and option is checked before the call; the results go to OUT as F32 tensors, and
//! when the case holds `expected_*` tensors the largest difference to each is printed.
//! With `--backward` it also reads `dout` (the `tests/data/grad` format) and writes the
//! gradients `dq`, `dk`, `dv` of `sum(out · dout)` (and `dmask` of a float mask), compared with
//! `expected_d*` when present.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail, ensure};
use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnOutput, AttnShape, BoolMask, Causal, Dropout, FloatMask,
    Grads, KeyPadding, Weights, WeightsRequest, Window, bf16, sdpa, sdpa_backward,
    sdpa_backward_reference, sdpa_reference,
};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

#[derive(clap::Args)]
#[command(after_help = "\
Tensors (F32, or BF16: q, k and v all BF16 run the bf16 kernels, with f32 results; any other
BF16 tensor is widened):
  q [batch, n_heads, seq_q, head_dim]     k [batch, n_kv_heads, seq_kv, head_dim]
  v [batch, n_kv_heads, seq_kv, value_dim]
  mask (optional, BOOL: true = may attend, or F32 or BF16: added to the scores), broadcastable to
       [batch, n_heads, seq_q, seq_kv]
  key_padding (optional, BOOL [batch, seq_kv]: true = a real key)
  expected_out, expected_lse, expected_weights (optional): compared with the results
  dout [batch, n_heads, seq_q, value_dim] (needed by --backward)
  expected_dq, expected_dk, expected_dv, expected_dmask (optional, with --backward): compared
       with the gradients
Metadata (optional, each value JSON text, so a string is quoted: json.dumps(\"top_left\")):
  scale (default 1/sqrt(head_dim)), causal (\"top_left\" | \"bottom_right\"), window ([left,
  right], null or -1 = unbounded), alibi ([one slope per query head]: score -= slope·|i + o - j|),
  softcap, gqa (true when n_kv_heads < n_heads), dropout_p, seed (default 0), tolerance, note,
  case, align (\"top_left\" | \"bottom_right\", without causal). The window and ALiBi's
  diagonal is o = seq_kv - seq_q with causal or align bottom_right, else 0: FlashAttention
  aligns them bottom-right with or without its causal mask, PyTorch top-left.
  Dropout keeps each weight by a hash of (seed, batch, head, query, key), not PyTorch's random
  numbers: the same seed drops the same weights here, not the ones PyTorch would.
OUT holds out [batch, n_heads, seq_q, value_dim], lse [batch, n_heads, seq_q] (the natural log
of the sum of exp over the scores a query sees, after scale, softcap, ALiBi and the float mask;
-inf for a query that sees no key), with --weights, weights [batch, n_heads, seq_q, seq_kv]
(before dropout), and with --backward dq, dk, dv (the shapes of q, k, v: gradients of sum(out *
dout), summed over the query heads sharing a key/value head) and, for a float mask, dmask (the
mask's shape, summed over what it broadcasts along, as PyTorch's attn_mask.grad).
Each expected_* tensor is compared, and a result past its tolerance (|got - expected| / max(1,
|expected|) over the metadata's tolerance, default 1e-5, 1/64 for BF16 cases; lse 1e-4, or for
BF16 cases the larger of 1e-4 and the tolerance; gradients 1e-4 absolute, so their expected_*
tensors must be F32; --backward takes F32 cases only) makes the command fail with exit code 1
after writing OUT. -3e38 or less, expected or got, counts as -inf.")]
pub struct Args {
    /// The attention call to run (a .safetensors file).
    case: PathBuf,
    /// Where to write the results (a .safetensors file).
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    /// Also write the attention weights.
    #[arg(long)]
    weights: bool,
    /// Run the plain reference twin instead of the fast path
    ///
    /// Run the plain reference twin instead of the fast path (for a BF16 case, in f32 on the
    /// BF16 values).
    #[arg(long)]
    reference: bool,
    /// Also compute and write the gradients of q, k and v (and of a float mask)
    ///
    /// Also compute the gradients of q, k and v (and of a float mask) for the case's dout; write
    /// dq, dk, dv (and dmask).
    #[arg(long)]
    backward: bool,
}

/// Metadata keys this command reads; any other key is an error, so a misspelt option
/// cannot silently change the result.
const KNOWN_METADATA: &[&str] = &[
    "scale",
    "causal",
    "window",
    "align",
    "alibi",
    "softcap",
    "gqa",
    "dropout_p",
    "seed",
    "tolerance",
    "note",
    "case",
];

/// Tensors this command reads or compares (`dout` and `expected_d*` only with `--backward`;
/// without it they are accepted and left alone).
const KNOWN_TENSORS: &[&str] = &[
    "q",
    "k",
    "v",
    "mask",
    "key_padding",
    "expected_out",
    "expected_lse",
    "expected_weights",
    "dout",
    "expected_dq",
    "expected_dk",
    "expected_dv",
    "expected_dmask",
];

/// The gradients' tolerance: the `tests/data/grad` files' 1e-4, absolute.
const GRAD_TOLERANCE: f64 = 1e-4;

/// The default tolerance of a BF16 case's `expected_out` and `expected_weights`: about two
/// bf16 roundings (2^-6), as P is rounded to bf16 here and the output too in PyTorch's bf16
/// call.
const BF16_TOLERANCE: f32 = 1.0 / 64.0;

/// The case file, mapped: only the tensors it names are read, so a huge or sparse file costs
/// what its header declares, and a device (`/dev/zero`) or a pipe, which could be read forever,
/// is refused.
fn map_case(path: &Path) -> anyhow::Result<memmap2::Mmap> {
    let context = || format!("reading {}", path.display());
    // Checked before opening: opening a pipe waits for a writer, which may never come.
    let meta = std::fs::metadata(path).with_context(context)?;
    ensure!(meta.is_file(), "{} is not a regular file", path.display());
    let file = std::fs::File::open(path).with_context(context)?;
    let meta = file.metadata().with_context(context)?;
    ensure!(meta.is_file(), "{} is not a regular file", path.display());
    // SAFETY: the map is read-only and private to this process; like every reader of
    // safetensors files we assume nobody truncates the file while it is mapped.
    unsafe { memmap2::Mmap::map(&file) }.with_context(context)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    crate::maps::check_output(&args.output)?;
    // Writing the results over the case would truncate the file this command has mapped.
    if crate::maps::same_file(&args.output, &args.case) {
        anyhow::bail!(
            "cannot write {}: it is the case file itself; name another output",
            args.output.display()
        );
    }
    let bytes = map_case(&args.case)?;
    let case =
        Case::parse(&bytes, args.backward).with_context(|| format!("{}", args.case.display()))?;
    let mut options = case.options.clone();
    if args.weights || case.expected_weights.is_some() {
        options.weights = WeightsRequest::All;
    }
    let input = AttnInput::new(&case.q.data, &case.k.data, &case.v.data, case.shape)
        .with_context(|| format!("{}", args.case.display()))?;
    let result = match (args.reference, case.bf16) {
        (true, _) => sdpa_reference(&input, &options),
        (false, false) => sdpa(&input, &options),
        (false, true) => {
            // The widened values are bf16 values: narrowing them back is exact.
            let narrow = |t: &F32Tensor| -> Vec<bf16> {
                t.data.iter().map(|&x| bf16::from_f32(x)).collect()
            };
            let (q, k, v) = (narrow(&case.q), narrow(&case.k), narrow(&case.v));
            AttnInput::new(&q, &k, &v, case.shape).and_then(|input| sdpa(&input, &options))
        }
    }
    .with_context(|| format!("{}", args.case.display()))?;
    let grads = match &case.backward {
        None => None,
        Some(bw) => Some(gradients((&input, &options), &result, bw, args.reference)),
    }
    .transpose()
    .with_context(|| format!("{}", args.case.display()))?;

    let weights = match &result.weights {
        Some(Weights::All { data: w, .. }) => Some(w.as_slice()),
        _ => None,
    };
    let mask_dims = case
        .backward
        .as_ref()
        .and_then(|bw| bw.mask_dims.as_deref());
    write_results(
        &args.output,
        &case.shape,
        &result,
        args.weights,
        grads.as_ref().map(|g| (g, mask_dims.unwrap_or_default())),
    )?;
    crate::outln!(
        "wrote out {:?}, lse {:?}{}{} to {}",
        case.shape.out_dims(),
        &case.shape.out_dims()[..3],
        if args.weights {
            format!(", weights {:?}", case.shape.score_dims())
        } else {
            String::new()
        },
        match (&grads, mask_dims) {
            (None, _) => String::new(),
            (Some(_), mask) => format!(
                ", dq {:?}, dk {:?}, dv {:?}{}",
                case.shape.q_dims(),
                case.shape.k_dims(),
                case.shape.v_dims(),
                mask.map(|dims| format!(", dmask {dims:?}"))
                    .unwrap_or_default()
            ),
        },
        args.output.display()
    )?;
    let mut over = report_differences(&case, &result, weights)?;
    if let (Some(bw), Some(grads)) = (&case.backward, &grads) {
        over.extend(report_grad_differences(bw, grads)?);
    }
    // A case that carries its expected results is a test: missing it fails (the results are
    // written all the same, to look at).
    if !over.is_empty() {
        bail!(
            "{}: {} past the tolerance (see above)",
            args.case.display(),
            over.join(", ")
        );
    }
    Ok(())
}

/// A tensor read from the case: its dims and f32 values (BF16 widened, exactly).
struct F32Tensor {
    dims: Vec<usize>,
    data: Vec<f32>,
    /// Whether the file stores it as BF16.
    bf16: bool,
}

/// A validated case: the inputs, the options and what to compare with.
struct Case {
    shape: AttnShape,
    /// q, k and v are BF16: the bf16 kernels run.
    bf16: bool,
    q: F32Tensor,
    k: F32Tensor,
    v: F32Tensor,
    options: AttnOptions,
    tolerance: f32,
    expected_out: Option<F32Tensor>,
    expected_lse: Option<F32Tensor>,
    expected_weights: Option<F32Tensor>,
    /// Present with `--backward`.
    backward: Option<Backward>,
}

/// What `--backward` reads: the gradient arriving at the output, and what to compare with.
struct Backward {
    dout: F32Tensor,
    expected_dq: Option<F32Tensor>,
    expected_dk: Option<F32Tensor>,
    expected_dv: Option<F32Tensor>,
    /// The float mask's dims, when the case has one: its gradient `dmask` is computed too.
    mask_dims: Option<Vec<usize>>,
    expected_dmask: Option<F32Tensor>,
}

/// What `--backward` computes: the gradients of q, k and v, and of the float mask when there is
/// one.
struct Gradients {
    grads: Grads,
    dmask: Option<Vec<f32>>,
}

impl Case {
    /// Reads and checks every tensor and option of a case, in the order its errors are reported.
    fn parse(bytes: &[u8], backward: bool) -> anyhow::Result<Case> {
        let (st, meta) = open_case(bytes)?;
        let (q, k, v) = read_inputs(&st, backward)?;
        let is_bf16 = q.bf16;
        let shape = check_shapes(&q, &k, &v, &meta)?;
        let mut options = read_options(&meta)?;
        // The float mask's dims as stored: its gradient's.
        let float_mask_dims = read_mask(&st, &shape, &mut options)?;
        options.key_padding = read_key_padding(&st, &shape)?;
        options.validate(&shape).map_err(named_as_in_the_case)?;
        for t in [(&q, "q"), (&k, "k"), (&v, "v")] {
            check_finite(t.1, t.0)?;
        }
        let backward = match backward {
            true => Some(read_backward(&st, &shape, float_mask_dims)?),
            false => None,
        };
        let tolerance = read_tolerance(&meta, is_bf16)?;
        Ok(Case {
            bf16: is_bf16,
            backward,
            expected_out: read_expected(&st, "expected_out", shape.out_dims().to_vec())?,
            expected_lse: read_expected(&st, "expected_lse", shape.out_dims()[..3].to_vec())?,
            expected_weights: read_expected(&st, "expected_weights", shape.score_dims().to_vec())?,
            tolerance,
            shape,
            q,
            k,
            v,
            options,
        })
    }
}

/// Reads the case's header: refuses a repeated key, a malformed file, an unknown tensor and an
/// unknown or non-JSON metadata value.
fn open_case(bytes: &[u8]) -> anyhow::Result<(SafeTensors<'_>, Metadata)> {
    let invalid = |e: safetensors::SafeTensorError| {
        anyhow::anyhow!("not a valid safetensors file (truncated or malformed): {e}")
    };
    // The reader keeps one of a repeated key's entries (or reports a tensor named twice as
    // a bad offset): a case must mean one thing. A header too short or too long to read is
    // the reader's to report.
    let header_len = bytes.first_chunk::<8>().map(|n| u64::from_le_bytes(*n));
    let header_json = header_len
        .and_then(|n| bytes.get(8..8usize.checked_add(usize::try_from(n).ok()?)?))
        .and_then(|json| std::str::from_utf8(json).ok());
    if let Some(key) = header_json.and_then(attn_models::repeated_header_key) {
        bail!("the header names {key} twice");
    }
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(invalid)?;
    let st = SafeTensors::deserialize(bytes).map_err(invalid)?;
    let mut names = st.names();
    names.sort();
    if let Some(name) = names.iter().find(|n| !KNOWN_TENSORS.contains(n)) {
        bail!(
            "unknown tensor {name:?}; a case holds {}",
            KNOWN_TENSORS.join(", ")
        );
    }
    let meta = parse_metadata(header.metadata().clone().unwrap_or_default())?;
    Ok((st, meta))
}

/// Reads q, k and v, which must share one dtype (and be F32 for `--backward`).
fn read_inputs(
    st: &SafeTensors<'_>,
    backward: bool,
) -> anyhow::Result<(F32Tensor, F32Tensor, F32Tensor)> {
    let q = read_f32(st, "q", Some("[batch, n_heads, seq_q, head_dim]"))?;
    let k = read_f32(st, "k", Some("[batch, n_kv_heads, seq_kv, head_dim]"))?;
    let v = read_f32(st, "v", Some("[batch, n_kv_heads, seq_kv, value_dim]"))?;
    let is_bf16 = q.bf16;
    for t in [("k", &k), ("v", &v)] {
        ensure!(
            t.1.bf16 == is_bf16,
            "q is {} but {} is {}: q, k and v share one dtype (F32, or BF16 for the bf16 \
             kernels)",
            if is_bf16 { "BF16" } else { "F32" },
            t.0,
            if t.1.bf16 { "BF16" } else { "F32" }
        );
    }
    ensure!(
        !(is_bf16 && backward),
        "--backward takes F32 cases: the backward pass has no bf16 kernels (save q, k and v \
         as float32)"
    );
    Ok((q, k, v))
}

/// The call's shape from q, k and v, once their dims agree (different head counts only with
/// metadata `gqa`).
fn check_shapes(
    q: &F32Tensor,
    k: &F32Tensor,
    v: &F32Tensor,
    meta: &Metadata,
) -> anyhow::Result<AttnShape> {
    let (qd, kd, vd) = (&q.dims, &k.dims, &v.dims);
    ensure!(
        kd[0] == qd[0] && kd[3] == qd[3],
        "k has shape {kd:?} but q has shape {qd:?}: batch and head_dim must agree \
         (q [batch, n_heads, seq_q, head_dim], k [batch, n_kv_heads, seq_kv, head_dim])"
    );
    ensure!(
        vd[..3] == kd[..3],
        "v has shape {vd:?} but k has shape {kd:?}: batch, n_kv_heads and seq_kv must agree \
         (v [batch, n_kv_heads, seq_kv, value_dim])"
    );
    let gqa = meta.bool("gqa")?.unwrap_or(false);
    ensure!(
        gqa || kd[1] == qd[1],
        "k has {} heads but q has {} (shapes {kd:?} and {qd:?}); set metadata gqa to true \
         for grouped-query attention",
        kd[1],
        qd[1]
    );
    let shape = AttnShape {
        batch: qd[0],
        n_heads: qd[1],
        n_kv_heads: kd[1],
        seq_q: qd[2],
        seq_kv: kd[2],
        head_dim: qd[3],
        value_dim: vd[3],
    };
    shape.validate()?;
    Ok(shape)
}

/// The options the metadata sets: scale, softcap, ALiBi, causal, window, align and dropout.
fn read_options(meta: &Metadata) -> anyhow::Result<AttnOptions> {
    let mut options = AttnOptions {
        scale: meta.f32("scale")?,
        softcap: meta.f32("softcap")?,
        alibi: meta.f32_list("alibi")?,
        causal: meta.alignment("causal")?,
        window: meta.window()?,
        align: meta.alignment("align")?,
        ..AttnOptions::default()
    };
    if let Some(p) = meta.f32("dropout_p")? {
        let seed = meta.u64("seed")?.unwrap_or(0);
        options.dropout = Some(Dropout { p, seed });
    } else if meta.get("seed").is_some() {
        bail!("metadata seed is given without dropout_p");
    }
    Ok(options)
}

/// Sets the case's `mask` (BOOL, or F32 or BF16 added to the scores) in `options`; returns a
/// float mask's dims as stored.
fn read_mask(
    st: &SafeTensors<'_>,
    shape: &AttnShape,
    options: &mut AttnOptions,
) -> anyhow::Result<Option<Vec<usize>>> {
    match st.tensor("mask").ok().map(|t| t.dtype()) {
        None => Ok(None),
        Some(Dtype::BOOL) => {
            let (dims, data) = read_bool(st, "mask")?;
            ensure!(
                (1..=4).contains(&dims.len()),
                "mask has shape {dims:?}: expected 1 to 4 dims broadcastable to \
                 [batch, n_heads, seq_q, seq_kv] = {:?}",
                shape.score_dims()
            );
            options.bool_mask = Some(BoolMask::from_vec(data, &dims)?);
            Ok(None)
        }
        Some(Dtype::F32 | Dtype::BF16) => {
            let m = read_f32(st, "mask", None)?;
            ensure!(
                (1..=4).contains(&m.dims.len()),
                "mask has shape {:?}: expected 1 to 4 dims broadcastable to \
                 [batch, n_heads, seq_q, seq_kv] = {:?}",
                m.dims,
                shape.score_dims()
            );
            let dims = m.dims.clone();
            options.float_mask = Some(FloatMask::from_vec(m.data, &m.dims)?);
            Ok(Some(dims))
        }
        Some(other) => bail!("mask has dtype {other}; expected BOOL, F32 or BF16"),
    }
}

/// The case's `key_padding`, when it has one: BOOL `[batch, seq_kv]`.
fn read_key_padding(st: &SafeTensors<'_>, shape: &AttnShape) -> anyhow::Result<Option<KeyPadding>> {
    if st.tensor("key_padding").is_err() {
        return Ok(None);
    }
    let (dims, data) = read_bool(st, "key_padding")?;
    ensure!(
        dims == [shape.batch, shape.seq_kv],
        "key_padding has shape {dims:?}; expected [batch, seq_kv] = [{}, {}]",
        shape.batch,
        shape.seq_kv
    );
    Ok(Some(KeyPadding::from_vec(data, dims[0], dims[1])?))
}

/// An `expected_*` tensor, when the case has it: it must have the results' `dims`.
fn read_expected(
    st: &SafeTensors<'_>,
    name: &str,
    dims: Vec<usize>,
) -> anyhow::Result<Option<F32Tensor>> {
    if st.tensor(name).is_err() {
        return Ok(None);
    }
    let t = read_f32(st, name, None)?;
    ensure!(
        t.dims == dims,
        "{name} has shape {:?}; the results have shape {dims:?}",
        t.dims
    );
    Ok(Some(t))
}

/// An `expected_d*` gradient, when the case has it: F32, as gradients are compared at
/// [`GRAD_TOLERANCE`] absolute, finer than bf16 holds them.
fn read_expected_grad(
    st: &SafeTensors<'_>,
    name: &str,
    dims: Vec<usize>,
) -> anyhow::Result<Option<F32Tensor>> {
    let t = read_expected(st, name, dims)?;
    if let Some(t) = &t {
        ensure!(
            !t.bf16,
            "{name} is BF16; the gradients are compared at {GRAD_TOLERANCE:e} \
             absolute, finer than bf16 holds them: save it as float32"
        );
    }
    Ok(t)
}

/// What `--backward` reads: `dout` (required, the output's shape, finite) and the expected
/// gradients, `expected_dmask` only for a case with a float mask (of `float_mask_dims`).
fn read_backward(
    st: &SafeTensors<'_>,
    shape: &AttnShape,
    float_mask_dims: Option<Vec<usize>>,
) -> anyhow::Result<Backward> {
    let dout = st
        .tensor("dout")
        .is_ok()
        .then(|| read_f32(st, "dout", None));
    let dout = dout.transpose()?.with_context(|| {
        "missing tensor dout [batch, n_heads, seq_q, value_dim]: --backward needs the \
         gradient arriving at the output"
    })?;
    ensure!(
        dout.dims == shape.out_dims(),
        "dout has shape {:?}; expected the output's shape \
         [batch, n_heads, seq_q, value_dim] = {:?}",
        dout.dims,
        shape.out_dims()
    );
    check_finite("dout", &dout)?;
    let expected_dmask = match &float_mask_dims {
        Some(dims) => read_expected_grad(st, "expected_dmask", dims.clone())?,
        None => {
            ensure!(
                st.tensor("expected_dmask").is_err(),
                "expected_dmask is given but the case has no float mask to take the \
                 gradient of"
            );
            None
        }
    };
    Ok(Backward {
        dout,
        expected_dq: read_expected_grad(st, "expected_dq", shape.q_dims().to_vec())?,
        expected_dk: read_expected_grad(st, "expected_dk", shape.k_dims().to_vec())?,
        expected_dv: read_expected_grad(st, "expected_dv", shape.v_dims().to_vec())?,
        mask_dims: float_mask_dims,
        expected_dmask,
    })
}

/// Metadata `tolerance` (a finite number ≥ 0), else the default for the case's dtype.
fn read_tolerance(meta: &Metadata, is_bf16: bool) -> anyhow::Result<f32> {
    // bf16 rounds P and, on PyTorch's side, the output to 8 bits.
    let tolerance = (meta.f32("tolerance")?).unwrap_or(if is_bf16 { BF16_TOLERANCE } else { 1e-5 });
    ensure!(
        tolerance.is_finite() && tolerance >= 0.0,
        "metadata tolerance is {tolerance}; it must be a finite number ≥ 0"
    );
    Ok(tolerance)
}

/// Reads an F32 tensor; `rank4` names the dims it must have when it is an input.
fn read_f32(st: &SafeTensors<'_>, name: &str, rank4: Option<&str>) -> anyhow::Result<F32Tensor> {
    let view = st.tensor(name).map_err(|_| match rank4 {
        Some(dims) => anyhow::anyhow!("missing tensor {name} {dims}"),
        None => anyhow::anyhow!("missing tensor {name}"),
    })?;
    let is_bf16 = view.dtype() == Dtype::BF16;
    ensure!(
        view.dtype() == Dtype::F32 || is_bf16,
        "{name} has dtype {}; expected F32 or BF16 (save it as float32)",
        view.dtype()
    );
    let dims = view.shape().to_vec();
    if let Some(want) = rank4 {
        ensure!(
            dims.len() == 4,
            "{name} has shape {dims:?}; expected 4 dims {want}"
        );
    }
    let data = match is_bf16 {
        true => (view.data().chunks_exact(2))
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        false => (view.data().chunks_exact(4))
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    };
    Ok(F32Tensor {
        dims,
        data,
        bf16: is_bf16,
    })
}

fn read_bool(st: &SafeTensors<'_>, name: &str) -> anyhow::Result<(Vec<usize>, Vec<bool>)> {
    let view = st
        .tensor(name)
        .map_err(|_| anyhow::anyhow!("missing tensor {name}"))?;
    ensure!(
        view.dtype() == Dtype::BOOL,
        "{name} has dtype {}; expected BOOL",
        view.dtype()
    );
    let data = view
        .data()
        .iter()
        .enumerate()
        .map(|(i, &b)| match b {
            0 => Ok(false),
            1 => Ok(true),
            other => bail!("{name} holds byte {other} at flat index {i}; a BOOL is 0 or 1"),
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((view.shape().to_vec(), data))
}

fn check_finite(name: &str, t: &F32Tensor) -> anyhow::Result<()> {
    if let Some((i, x)) = t.data.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        bail!(
            "{name} holds {x} at {:?} (shape {:?}); inputs must be finite",
            unravel(i, &t.dims),
            t.dims
        );
    }
    Ok(())
}

/// The case's metadata, each value JSON-decoded.
struct Metadata(HashMap<String, Value>);

impl Metadata {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn f32(&self, key: &str) -> anyhow::Result<Option<f32>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .filter(|x| x.is_finite())
                    .with_context(|| format!("metadata {key} is {v}; expected a finite number"))
            })
            .transpose()
    }

    fn u64(&self, key: &str) -> anyhow::Result<Option<u64>> {
        self.get(key)
            .map(|v| {
                v.as_u64().with_context(|| {
                    format!("metadata {key} is {v}; expected a non-negative integer")
                })
            })
            .transpose()
    }

    fn bool(&self, key: &str) -> anyhow::Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .with_context(|| format!("metadata {key} is {v}; expected true or false"))
            })
            .transpose()
    }

    fn f32_list(&self, key: &str) -> anyhow::Result<Option<Vec<f32>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let bad = || format!("metadata {key} is {v}; expected a list of finite numbers");
        v.as_array()
            .with_context(bad)?
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|x| x as f32)
                    .filter(|x| x.is_finite())
                    .with_context(bad)
            })
            .collect::<anyhow::Result<Vec<f32>>>()
            .map(Some)
    }

    /// `causal` (the mask and its alignment) or `align` (the window's and ALiBi's without one).
    fn alignment(&self, key: &str) -> anyhow::Result<Option<Causal>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_str() {
                Some("top_left") => Ok(Some(Causal::TopLeft)),
                Some("bottom_right") => Ok(Some(Causal::BottomRight)),
                _ => bail!("metadata {key} is {v}; expected \"top_left\" or \"bottom_right\""),
            },
        }
    }

    fn window(&self) -> anyhow::Result<Option<Window>> {
        let Some(v) = self.get("window") else {
            return Ok(None);
        };
        let bad = || {
            format!(
                "metadata window is {v}; expected [left, right], each a non-negative integer, \
                 or null or -1 for unbounded"
            )
        };
        let sides = v.as_array().filter(|a| a.len() == 2).with_context(bad)?;
        let side = |x: &Value| -> anyhow::Result<Option<usize>> {
            if x.is_null() || x.as_i64() == Some(-1) {
                return Ok(None);
            }
            let n = x.as_u64().with_context(bad)?;
            Ok(Some(usize::try_from(n).with_context(bad)?))
        };
        Ok(Some(Window {
            left: side(&sides[0])?,
            right: side(&sides[1])?,
        }))
    }
}

fn parse_metadata(raw: HashMap<String, String>) -> anyhow::Result<Metadata> {
    let mut keys: Vec<&String> = raw.keys().collect();
    keys.sort();
    if let Some(key) = keys.iter().find(|k| !KNOWN_METADATA.contains(&k.as_str())) {
        bail!(
            "unknown metadata key {key:?}; known keys: {}",
            KNOWN_METADATA.join(", ")
        );
    }
    raw.into_iter()
        .map(|(k, v)| {
            let parsed = serde_json::from_str(&v).with_context(|| {
                let stored = match v.is_empty() {
                    true => "empty".to_string(),
                    false => format!("{} (as stored, without quotes)", v.escape_debug()),
                };
                // Only the string-valued keys take a quoted value.
                let hint = match k.as_str() {
                    "causal" | "note" | "case" => format!(
                        ", a string with its quotes ({})",
                        serde_json::Value::String(v.clone())
                    ),
                    _ => String::new(),
                };
                format!(
                    "metadata {k} is {stored}, which is not JSON: each value is JSON text, a \
                     number as 0.3{hint}"
                )
            })?;
            Ok((k, parsed))
        })
        .collect::<anyhow::Result<_>>()
        .map(Metadata)
}

/// The gradients `--backward` asks for: through the plain twin with `--reference`, else the
/// fast path from the forward pass's `out` and `lse`.
fn gradients(
    (input, options): (&AttnInput<'_>, &AttnOptions),
    result: &AttnOutput,
    bw: &Backward,
    reference: bool,
) -> Result<Gradients, AttnError> {
    let dout = &bw.dout.data;
    let options = AttnOptions {
        float_mask_grad: bw.mask_dims.is_some(),
        ..options.clone()
    };
    let mut grads = match reference {
        true => sdpa_backward_reference(input, &options, dout)?,
        false => sdpa_backward(input, &options, result, dout)?,
    };
    let dmask = grads.dmask.take();
    Ok(Gradients { grads, dmask })
}

fn write_results(
    path: &Path,
    shape: &AttnShape,
    result: &AttnOutput,
    with_weights: bool,
    grads: Option<(&Gradients, &[usize])>,
) -> anyhow::Result<()> {
    let bytes = |x: &[f32]| -> Vec<u8> { x.iter().flat_map(|v| v.to_le_bytes()).collect() };
    let mut tensors: Vec<(&str, Vec<usize>, Vec<u8>)> = vec![
        ("out", shape.out_dims().to_vec(), bytes(&result.out)),
        ("lse", shape.out_dims()[..3].to_vec(), bytes(&result.lse)),
    ];
    if with_weights && let Some(Weights::All { data: w, .. }) = &result.weights {
        tensors.push(("weights", shape.score_dims().to_vec(), bytes(w)));
    }
    if let Some((Gradients { grads: g, dmask }, mask_dims)) = grads {
        tensors.push(("dq", shape.q_dims().to_vec(), bytes(&g.dq)));
        tensors.push(("dk", shape.k_dims().to_vec(), bytes(&g.dk)));
        tensors.push(("dv", shape.v_dims().to_vec(), bytes(&g.dv)));
        if let Some(dmask) = dmask {
            tensors.push(("dmask", mask_dims.to_vec(), bytes(dmask)));
        }
    }
    let views = tensors
        .iter()
        .map(|(name, dims, data)| Ok((*name, TensorView::new(Dtype::F32, dims.clone(), data)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    // Written through the path, as the other commands write: into a device or a symlink's
    // target, with the file's own permissions (safetensors' own writer renames a new file over
    // it, which replaced /dev/null and symlinks and reported a full disk as success).
    let bytes = safetensors::serialize(views, None)?;
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Prints, for each `expected_*` tensor, the largest absolute difference and where it is, and
/// whether the README's measure (|got − expected| / max(1, |expected|)) is within tolerance.
/// Returns the names of the results past it.
fn report_differences(
    case: &Case,
    result: &AttnOutput,
    weights: Option<&[f32]>,
) -> anyhow::Result<Vec<&'static str>> {
    let mut over = Vec::new();
    let rows = [
        (
            "out",
            case.expected_out.as_ref(),
            Some(&result.out[..]),
            case.tolerance,
        ),
        (
            "lse",
            case.expected_lse.as_ref(),
            Some(&result.lse[..]),
            if case.bf16 {
                case.tolerance.max(1e-4)
            } else {
                1e-4
            },
        ),
        (
            "weights",
            case.expected_weights.as_ref(),
            weights,
            case.tolerance,
        ),
    ];
    for (name, expected, got, tol) in rows {
        let (Some(expected), Some(got)) = (expected, got) else {
            continue;
        };
        if expected.data.is_empty() {
            crate::outln!(
                "{name:<7} is empty ({:?}): nothing to compare",
                expected.dims
            )?;
            continue;
        }
        let d = compare(got, &expected.data);
        let ok = d.relative <= f64::from(tol);
        crate::outln!(
            "max abs diff {name:<7} {:.3e} at {:?} (got {}, expected {}); relative {:.3e}, \
             tolerance {tol:e} on |got − expected| / max(1, |expected|): {}",
            d.abs,
            unravel(d.abs_at, &expected.dims),
            got[d.abs_at],
            expected.data[d.abs_at],
            d.relative,
            if ok { "ok" } else { "OVER" }
        )?;
        if !ok {
            over.push(name);
        }
    }
    Ok(over)
}

/// Prints, for each `expected_d*` tensor, the largest absolute difference and where it is, and
/// whether it is within the gradients' absolute tolerance. Returns the names of the gradients
/// past it.
fn report_grad_differences(
    bw: &Backward,
    Gradients { grads, dmask }: &Gradients,
) -> std::io::Result<Vec<&'static str>> {
    let mut over = Vec::new();
    let rows = [
        ("dq", bw.expected_dq.as_ref(), Some(&grads.dq)),
        ("dk", bw.expected_dk.as_ref(), Some(&grads.dk)),
        ("dv", bw.expected_dv.as_ref(), Some(&grads.dv)),
        ("dmask", bw.expected_dmask.as_ref(), dmask.as_ref()),
    ];
    for (name, expected, got) in rows {
        let (Some(expected), Some(got)) = (expected, got) else {
            continue;
        };
        if expected.data.is_empty() {
            crate::outln!(
                "{name:<7} is empty ({:?}): nothing to compare",
                expected.dims
            )?;
            continue;
        }
        let d = compare(got, &expected.data);
        let ok = d.abs <= GRAD_TOLERANCE;
        crate::outln!(
            "max abs diff {name:<7} {:.3e} at {:?} (got {}, expected {}); tolerance \
             {GRAD_TOLERANCE:e} absolute: {}",
            d.abs,
            unravel(d.abs_at, &expected.dims),
            got[d.abs_at],
            expected.data[d.abs_at],
            if ok { "ok" } else { "OVER" }
        )?;
        if !ok {
            over.push(name);
        }
    }
    Ok(over)
}

struct Difference {
    abs: f64,
    abs_at: usize,
    relative: f64,
}

/// `-3e38` or less stands for −∞ (the golden files' convention), in `expected` and in `got`
/// alike: a row whose float mask holds `f32::MIN` has an lse of about `f32::MIN` on both sides.
fn compare(got: &[f32], expected: &[f32]) -> Difference {
    let mut d = Difference {
        abs: 0.0,
        abs_at: 0,
        relative: 0.0,
    };
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        let infinite = |x: f32| if x <= -3.0e38 { f32::NEG_INFINITY } else { x };
        let (g, e) = (infinite(g), infinite(e));
        let (abs, rel) = if g == e {
            (0.0, 0.0)
        } else if g.is_finite() && e.is_finite() {
            let abs = (f64::from(g) - f64::from(e)).abs();
            (abs, abs / f64::from(e.abs()).max(1.0))
        } else {
            (f64::INFINITY, f64::INFINITY)
        };
        if abs > d.abs {
            d.abs = abs;
            d.abs_at = i;
        }
        d.relative = d.relative.max(rel);
    }
    d
}

/// Flat index → multi-dimensional index of a row-major tensor.
fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for (slot, &d) in idx.iter_mut().zip(dims).rev() {
        if d > 0 {
            *slot = flat % d;
            flat /= d;
        }
    }
    idx
}

/// An option's error in the case file's words: the library names the masks `bool_mask` and
/// `float_mask`, the file holds either as its tensor `mask`.
fn named_as_in_the_case(err: AttnError) -> anyhow::Error {
    let tensor = match &err {
        AttnError::NotBroadcastable { tensor, .. }
        | AttnError::NonFinite { tensor, .. }
        | AttnError::LengthMismatch { tensor, .. } => Some(*tensor),
        _ => None,
    };
    match tensor.filter(|t| t.ends_with("_mask")) {
        // "bool_mask: shape [..] does not broadcast …" as "mask: shape [..] …".
        Some(tensor) => anyhow::anyhow!("{}", err.to_string().replacen(tensor, "mask", 1)),
        None => err.into(),
    }
}
