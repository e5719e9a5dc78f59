//! The gradient with respect to the float mask, checked two independent ways: against central
//! finite differences of the reference forward pass on small cases (every way a mask
//! broadcasts, with the other options), and the fast path against its plain twin on awkward
//! shapes through every instruction set; then rows whose saved lse cannot be trusted, and bad
//! input.

mod common;

use attn_core::Isa;
use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnShape, BoolMask, Causal, Dropout, FloatMask, KeyPadding,
    Window, sdpa, sdpa_backward_reference, sdpa_reference,
};

use common::on;
use common::rng::Rng;

/// `options` asking the backward pass for the float mask's gradient.
fn asking(options: &AttnOptions) -> AttnOptions {
    AttnOptions {
        float_mask_grad: true,
        ..options.clone()
    }
}

/// The fast path's gradient of the float mask, from a forward pass's `out` and `lse`.
fn mask_grad(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> Result<Vec<f32>, AttnError> {
    let grads = common::backward(input, &asking(options), (out, lse), dout)?;
    Ok(grads.dmask.expect("asked for"))
}

/// [`mask_grad`] on the kernels of `isa`.
fn mask_grad_on(
    isa: Isa,
    input: &AttnInput<'_>,
    options: &AttnOptions,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> Result<Vec<f32>, AttnError> {
    mask_grad(input, &on(isa, options), out, lse, dout)
}

/// The twin's gradient of the float mask.
fn mask_grad_reference(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    dout: &[f32],
) -> Result<Vec<f32>, AttnError> {
    let grads = sdpa_backward_reference(input, &asking(options), dout)?;
    Ok(grads.dmask.expect("asked for"))
}

struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
}

fn case(sh: AttnShape, seed: u64) -> Case {
    let numel = |d: [usize; 4]| d.iter().product::<usize>();
    let mut rng = Rng(seed);
    Case {
        q: rng.vec(numel(sh.q_dims()), 1.5),
        k: rng.vec(numel(sh.k_dims()), 1.5),
        v: rng.vec(numel(sh.v_dims()), 1.5),
        dout: rng.vec(numel(sh.out_dims()), 1.5),
    }
}

/// `options` with the float mask `data` of `dims`.
fn with_mask(options: &AttnOptions, data: Vec<f32>, dims: &[usize]) -> AttnOptions {
    AttnOptions {
        float_mask: Some(FloatMask::from_vec(data, dims).unwrap()),
        ..options.clone()
    }
}

/// `sum(out · dout)` of the reference forward pass, in f64.
fn loss(sh: AttnShape, x: &Case, options: &AttnOptions) -> f64 {
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let out = sdpa_reference(&input, options).unwrap().out;
    (out.iter().zip(&x.dout))
        .map(|(&o, &g)| f64::from(o) * f64::from(g))
        .sum()
}

/// The fast gradient on `isa`, from a forward pass of the fast kernel.
fn fast(isa: Isa, sh: AttnShape, x: &Case, options: &AttnOptions) -> Vec<f32> {
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let fwd = sdpa(&input, options).unwrap();
    mask_grad_on(isa, &input, options, &fwd.out, &fwd.lse, &x.dout).unwrap()
}

fn twin(sh: AttnShape, x: &Case, options: &AttnOptions) -> Vec<f32> {
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    mask_grad_reference(&input, options, &x.dout).unwrap()
}

/// Asserts `got` is within `tol · max(1, |expected|)` of `expected`, naming the worst entry.
fn assert_close(case: &str, got: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(got.len(), expected.len(), "{case}: length");
    let (worst, at) = (got.iter().zip(expected))
        .map(|(a, b)| match a.is_nan() || b.is_nan() {
            true => f32::INFINITY,
            false => (a - b).abs() / b.abs().max(1.0),
        })
        .enumerate()
        .fold((0.0f32, 0), |w, (i, d)| if d > w.0 { (d, i) } else { w });
    assert!(
        worst <= tol,
        "{case}: differs by {worst:e} at {at} (got {}, expected {}), tolerance {tol:e}",
        got[at],
        expected[at]
    );
}

/// B = 2, H = 4 on 2 key/value heads, L = 5, S = 7, d = 4, dv = 3.
fn small() -> AttnShape {
    AttnShape {
        batch: 2,
        n_heads: 4,
        n_kv_heads: 2,
        seq_q: 5,
        seq_kv: 7,
        head_dim: 4,
        value_dim: 3,
    }
}

/// Every way a mask broadcasts to `[B, H, L, S]` of `sh`, each with a name.
fn mask_dims(sh: AttnShape) -> Vec<(&'static str, Vec<usize>)> {
    let (b, h, l, s) = (sh.batch, sh.n_heads, sh.seq_q, sh.seq_kv);
    vec![
        ("[B, H, L, S]", vec![b, h, l, s]),
        ("[L, S]", vec![l, s]),
        ("[1, H, 1, S]", vec![1, h, 1, s]),
        ("[B, 1, L, 1]", vec![b, 1, l, 1]),
        ("[S]", vec![s]),
    ]
}

/// The options the mask meets, each with a name.
fn other_options(sh: AttnShape) -> Vec<(&'static str, AttnOptions)> {
    let (b, h, l, s) = (sh.batch, sh.n_heads, sh.seq_q, sh.seq_kv);
    vec![
        ("plain", AttnOptions::default()),
        (
            "causal bottom-right + alibi + softcap + scale",
            AttnOptions {
                causal: Some(Causal::BottomRight),
                alibi: Some((0..h).map(|x| 0.1 * (x + 1) as f32).collect()),
                softcap: Some(2.0),
                scale: Some(0.7),
                ..AttnOptions::default()
            },
        ),
        (
            "dropout + key padding + bool mask",
            AttnOptions {
                dropout: Some(Dropout { p: 0.3, seed: 5 }),
                key_padding: Some(KeyPadding::from_lengths(&[s, s.saturating_sub(2)], s).unwrap()),
                bool_mask: Some(
                    BoolMask::from_vec((0..l * s).map(|x| x % 5 != 1).collect(), &[l, s]).unwrap(),
                ),
                ..AttnOptions::default()
            },
        ),
        (
            "bottom-right window",
            AttnOptions {
                align: Some(Causal::BottomRight),
                window: Some(Window {
                    left: Some(2),
                    right: Some(1),
                }),
                ..AttnOptions::default()
            },
        ),
    ]
    .into_iter()
    .filter(|_| b > 0)
    .collect()
}

#[test]
fn the_mask_gradient_matches_finite_differences() {
    // f32 rounding of the loss over 2·EPS gives ~1e-5 of noise; the truncation error is
    // EPS²/6 · f''' ≈ 2e-5 for these order-1 inputs.
    const EPS: f32 = 1e-2;
    let sh = small();
    let x = case(sh, 3);
    let mut seed = 10;
    for (options_name, options) in other_options(sh) {
        for (dims_name, dims) in mask_dims(sh) {
            seed += 1;
            let data = Rng(seed).vec(dims.iter().product(), 2.0);
            let name = format!("{options_name}, mask {dims_name}");
            let fd: Vec<f32> = (0..data.len())
                .map(|at| {
                    let eval = |delta: f32| {
                        let mut data = data.clone();
                        data[at] += delta;
                        loss(sh, &x, &with_mask(&options, data, &dims))
                    };
                    ((eval(EPS) - eval(-EPS)) / (2.0 * f64::from(EPS))) as f32
                })
                .collect();
            let options = with_mask(&options, data, &dims);
            assert_close(
                &format!("{name} (twin vs fd)"),
                &twin(sh, &x, &options),
                &fd,
                2e-3,
            );
            for isa in [Isa::Portable, Isa::best()] {
                let got = fast(isa, sh, &x, &options);
                assert_close(&format!("{name} ({isa:?} vs fd)"), &got, &fd, 2e-3);
            }
            // A mask that repeats across keys moves every score of a row alike, which the
            // softmax does not see: its gradient is 0. Any other is not.
            let biggest = fd.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            match dims.last() == Some(&1) {
                true => assert!(biggest < 1e-4, "{name}: {biggest}"),
                false => assert!(biggest > 1e-2, "{name}: the case moves nothing"),
            }
        }
    }
}

#[test]
fn the_fast_mask_gradient_matches_its_twin_on_awkward_shapes() {
    let mut seed = 100;
    // 600 query rows: 38 blocks of 16, summed in runs of more than one for a mask of one row.
    for (l, s) in [(1, 1), (7, 63), (65, 7), (129, 130), (40, 300), (600, 40)] {
        for (h, hkv) in [(1, 1), (4, 2)] {
            for (d, dv) in [(8, 5), (64, 64)] {
                let sh = AttnShape {
                    batch: 2,
                    n_heads: h,
                    n_kv_heads: hkv,
                    seq_q: l,
                    seq_kv: s,
                    head_dim: d,
                    value_dim: dv,
                };
                seed += 1;
                let x = case(sh, seed);
                let options = other_options(sh);
                for (n, (dims_name, dims)) in mask_dims(sh).into_iter().enumerate() {
                    let (options_name, options) = &options[(seed as usize + n) % options.len()];
                    let data = Rng(seed + n as u64).vec(dims.iter().product(), 3.0);
                    let options = with_mask(options, data, &dims);
                    let want = twin(sh, &x, &options);
                    for isa in [Isa::Portable, Isa::best()] {
                        let name = format!("{options_name}, mask {dims_name}, {sh:?} on {isa:?}");
                        assert_close(&name, &fast(isa, sh, &x, &options), &want, 1e-4);
                    }
                }
            }
        }
    }
}

/// A row under a mask of −1e30 on every key (its scores lost in it: each weight 1/9) has an lse
/// of −1e30, which holds its sum only to 2⁻²⁴ of that (`P = e^(s − lse)` would be 1 at each
/// key): the fast pass sums such a row itself. A row the mask hides whole (−∞) sees no
/// key and gets 0, as do the mask's −∞ entries elsewhere.
#[test]
fn rows_whose_lse_cannot_hold_their_sum_sum_their_own() {
    let sh = AttnShape {
        batch: 1,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q: 20,
        seq_kv: 9,
        head_dim: 8,
        value_dim: 8,
    };
    let x = case(sh, 7);
    let mut data = Rng(8).vec(sh.seq_q * sh.seq_kv, 2.0);
    data[3 * 9..4 * 9].fill(-1e30);
    data[5 * 9..6 * 9].fill(f32::NEG_INFINITY);
    data[7 * 9 + 4] = f32::NEG_INFINITY;
    let options = with_mask(&AttnOptions::default(), data, &[20, 9]);
    let want = twin(sh, &x, &options);
    assert!(
        want[3 * 9..4 * 9].iter().any(|&g| g.abs() > 1e-2),
        "{want:?}"
    );
    assert!(want[5 * 9..6 * 9].iter().all(|&g| g == 0.0) && want[7 * 9 + 4] == 0.0);
    for isa in [Isa::Portable, Isa::best()] {
        let got = fast(isa, sh, &x, &options);
        assert_close(&format!("{isa:?}"), &got, &want, 1e-5);
        assert!(got[5 * 9..6 * 9].iter().all(|&g| g == 0.0) && got[7 * 9 + 4] == 0.0);
    }
}

#[test]
fn a_call_without_a_float_mask_or_with_bad_tensors_is_refused() {
    let sh = small();
    let x = case(sh, 1);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let fwd = sdpa(&input, &AttnOptions::default()).unwrap();
    let err = mask_grad(&input, &AttnOptions::default(), &fwd.out, &fwd.lse, &x.dout).unwrap_err();
    assert_eq!(
        err.to_string(),
        "float_mask_grad: asks for the float mask's gradient, but no float mask is given"
    );
    let twin_err = mask_grad_reference(&input, &AttnOptions::default(), &x.dout).unwrap_err();
    assert_eq!(twin_err.to_string(), err.to_string());
    let options = with_mask(&AttnOptions::default(), vec![0.0; 7], &[7]);
    let err = mask_grad(&input, &options, &fwd.out, &fwd.lse, &x.dout[1..]).unwrap_err();
    assert!(matches!(err, AttnError::LengthMismatch { .. }), "{err:?}");
    let err = mask_grad(&input, &options, &fwd.out, &fwd.lse[1..], &x.dout).unwrap_err();
    assert!(err.to_string().contains("lse"), "{err}");
}
