//! The backward pass checked two independent ways:
//! - against central finite differences of the reference forward pass ([`sdpa_reference`]) on
//!   small random cases, one per option the forward pass supports (dropout included: its mask
//!   is a fixed function of the seed, so the loss stays smooth in q, k and v);
//! - the fast path against its plain twin on a sweep of awkward shapes;
//!
//! and one test per bad input.

mod common;

use attn_core::Isa;
use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnShape, BoolMask, Causal, Dropout, FloatMask, Grads,
    KeyPadding, Window, sdpa, sdpa_backward, sdpa_backward_reference, sdpa_reference,
};

use common::rng::Rng;
use common::{backward_on, isas, not_on_this_cpu};

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
}

fn random_inputs(sh: AttnShape, seed: u64) -> Inputs {
    let numel = |d: [usize; 4]| d.iter().product::<usize>();
    let mut rng = Rng(seed);
    // Scores of order 1 (entries up to 1.5, head_dim 4) keep the softmax away from saturation.
    let mut scaled = |n: usize| rng.vec(n, 1.5);
    Inputs {
        q: scaled(numel(sh.q_dims())),
        k: scaled(numel(sh.k_dims())),
        v: scaled(numel(sh.v_dims())),
        dout: scaled(numel(sh.out_dims())),
    }
}

/// `sum(out · dout)` of the reference forward pass, accumulated in f64.
fn loss(sh: AttnShape, opt: &AttnOptions, q: &[f32], k: &[f32], v: &[f32], dout: &[f32]) -> f64 {
    let out = sdpa_reference(&AttnInput::new(q, k, v, sh).unwrap(), opt).unwrap();
    out.out
        .iter()
        .zip(dout)
        .map(|(&o, &g)| f64::from(o) * f64::from(g))
        .sum()
}

/// Central differences of [`loss`] for every element of q, k and v.
fn finite_differences(sh: AttnShape, opt: &AttnOptions, x: &Inputs) -> Grads {
    // f32 rounding of the loss (~1e-7 relative) over 2·EPS gives ~1e-5 of noise; the
    // truncation error is EPS²/6 · f''' ≈ 2e-5 for these order-1 inputs.
    const EPS: f32 = 1e-2;
    let mut grads = Grads {
        dq: vec![0.0; x.q.len()],
        dk: vec![0.0; x.k.len()],
        dv: vec![0.0; x.v.len()],
        dmask: None,
    };
    for which in 0..3 {
        let n = [x.q.len(), x.k.len(), x.v.len()][which];
        for idx in 0..n {
            let eval = |delta: f32| {
                let (mut q, mut k, mut v) = (x.q.clone(), x.k.clone(), x.v.clone());
                [&mut q, &mut k, &mut v][which][idx] += delta;
                loss(sh, opt, &q, &k, &v, &x.dout)
            };
            let d = ((eval(EPS) - eval(-EPS)) / (2.0 * f64::from(EPS))) as f32;
            [&mut grads.dq, &mut grads.dk, &mut grads.dv][which][idx] = d;
        }
    }
    grads
}

/// Asserts `got` is within `tol · max(1, |expected|)` of `expected`, naming the worst element.
fn assert_grads_close(case: &str, got: &Grads, expected: &Grads, tol: f32) {
    for (name, g, e) in [
        ("dq", &got.dq, &expected.dq),
        ("dk", &got.dk, &expected.dk),
        ("dv", &got.dv, &expected.dv),
    ] {
        assert_eq!(g.len(), e.len(), "{case}: {name} length");
        let (worst, at) = g
            .iter()
            .zip(e.iter())
            .map(|(a, b)| {
                if a.is_nan() {
                    f32::INFINITY
                } else {
                    (a - b).abs() / b.abs().max(1.0)
                }
            })
            .enumerate()
            .fold((0.0f32, 0), |w, (i, d)| if d > w.0 { (d, i) } else { w });
        assert!(
            worst <= tol,
            "{case}: {name} differs by {worst:e} at flat index {at} (got {}, expected {}), \
             tolerance {tol:e}",
            g[at],
            e[at]
        );
    }
}

/// Both backward passes on a case, checked against finite differences.
fn check_against_fd(case: &str, sh: AttnShape, opt: AttnOptions, seed: u64) {
    let x = random_inputs(sh, seed);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let fd = finite_differences(sh, &opt, &x);
    let reference = sdpa_backward_reference(&input, &opt, &x.dout).unwrap();
    let fwd = sdpa(&input, &opt).unwrap();
    let fast = sdpa_backward(&input, &opt, &fwd, &x.dout).unwrap();
    // The gradients are of order 1; 2e-3 is ~50× the finite differences' own error and far
    // below what a missing term (a chain-rule factor, a dropout factor, a GQA sum) changes.
    assert_grads_close(&format!("{case} (reference vs fd)"), &reference, &fd, 2e-3);
    assert_grads_close(&format!("{case} (fast vs fd)"), &fast, &fd, 2e-3);
    // Nothing is trivially zero: the case exercises q, k and v.
    for (name, g) in [("dq", &fd.dq), ("dk", &fd.dk), ("dv", &fd.dv)] {
        assert!(
            g.iter().any(|x| x.abs() > 1e-2),
            "{case}: {name} is all zero"
        );
    }
}

/// B = 2, H = 2, L = 5, S = 7, d = 4, dv = 3.
fn small() -> AttnShape {
    AttnShape {
        batch: 2,
        n_heads: 2,
        n_kv_heads: 2,
        seq_q: 5,
        seq_kv: 7,
        head_dim: 4,
        value_dim: 3,
    }
}

#[test]
fn plain_and_scaled() {
    check_against_fd("plain", small(), AttnOptions::default(), 1);
    let opt = AttnOptions {
        scale: Some(0.8),
        ..AttnOptions::default()
    };
    check_against_fd("scale", small(), opt, 2);
}

#[test]
fn softcap() {
    // c = 0.5 is below the raw scores' spread, so tanh bends and its derivative matters.
    let opt = AttnOptions {
        softcap: Some(0.5),
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    check_against_fd("softcap", small(), opt, 3);
}

#[test]
fn alibi() {
    let opt = AttnOptions {
        alibi: Some(vec![0.5, 0.25]),
        causal: Some(Causal::BottomRight),
        ..AttnOptions::default()
    };
    check_against_fd("alibi", small(), opt, 4);
}

#[test]
fn float_and_bool_masks() {
    let sh = small();
    let mut rng = Rng(5);
    // [L, S] additive mask with one −∞ per row 1 (key 3), and a [B, 1, L, S] boolean mask.
    let float: Vec<f32> = (0..sh.seq_q * sh.seq_kv)
        .map(|idx| {
            if idx == 7 + 3 {
                f32::NEG_INFINITY
            } else {
                rng.sym(1.0)
            }
        })
        .collect();
    let opt = AttnOptions {
        float_mask: Some(FloatMask::from_vec(float, &[sh.seq_q, sh.seq_kv]).unwrap()),
        ..AttnOptions::default()
    };
    check_against_fd("float mask", sh, opt, 6);
    let mask: Vec<bool> = (0..sh.batch * sh.seq_q * sh.seq_kv)
        .map(|_| rng.sym(1.0) > -0.5)
        .collect();
    let opt = AttnOptions {
        bool_mask: Some(BoolMask::from_vec(mask, &[sh.batch, 1, sh.seq_q, sh.seq_kv]).unwrap()),
        ..AttnOptions::default()
    };
    check_against_fd("bool mask", sh, opt, 7);
}

#[test]
fn key_padding_and_a_row_that_sees_nothing() {
    let sh = small();
    let opt = AttnOptions {
        key_padding: Some(KeyPadding::from_lengths(&[7, 4], sh.seq_kv).unwrap()),
        ..AttnOptions::default()
    };
    check_against_fd("key padding", sh, opt, 8);
    // L = 5 > S = 3, bottom-right: queries 0 and 1 see no key and get zero gradients.
    let sh = AttnShape {
        seq_kv: 3,
        ..small()
    };
    let opt = AttnOptions {
        causal: Some(Causal::BottomRight),
        ..AttnOptions::default()
    };
    check_against_fd("empty rows", sh, opt.clone(), 9);
    let x = random_inputs(sh, 9);
    let g = sdpa_backward_reference(
        &AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap(),
        &opt,
        &x.dout,
    )
    .unwrap();
    assert!(g.dq[..2 * sh.head_dim].iter().all(|&x| x == 0.0));
}

#[test]
fn causal_alignments_and_window() {
    for (name, causal) in [
        ("causal top-left", Causal::TopLeft),
        ("causal bottom-right", Causal::BottomRight),
    ] {
        let opt = AttnOptions {
            causal: Some(causal),
            ..AttnOptions::default()
        };
        check_against_fd(name, small(), opt, 10);
    }
    let opt = AttnOptions {
        window: Some(Window {
            left: Some(2),
            right: Some(1),
        }),
        ..AttnOptions::default()
    };
    check_against_fd("window", small(), opt, 11);
    // FlashAttention's non-causal window and ALiBi: on the diagonal j = i + 2 (S − L).
    let opt = AttnOptions {
        align: Some(Causal::BottomRight),
        window: Some(Window {
            left: Some(1),
            right: Some(1),
        }),
        alibi: Some(vec![0.3, 0.7]),
        ..AttnOptions::default()
    };
    check_against_fd("bottom-right window + alibi", small(), opt, 12);
}

#[test]
fn grouped_query_attention() {
    // 4 query heads share 2 key/value heads: dk, dv sum over each pair.
    let sh = AttnShape {
        n_heads: 4,
        n_kv_heads: 2,
        ..small()
    };
    check_against_fd("gqa", sh, AttnOptions::default(), 12);
}

#[test]
fn dropout_replays_the_forward_mask() {
    let opt = AttnOptions {
        dropout: Some(Dropout { p: 0.3, seed: 42 }),
        ..AttnOptions::default()
    };
    check_against_fd("dropout", small(), opt.clone(), 13);
    let all = AttnOptions {
        causal: Some(Causal::TopLeft),
        softcap: Some(2.0),
        alibi: Some(vec![0.3, 0.1, 0.2, 0.05]),
        ..opt
    };
    let sh = AttnShape {
        n_heads: 4,
        n_kv_heads: 1,
        ..small()
    };
    check_against_fd("dropout + causal + softcap + alibi + gqa", sh, all, 14);
}

/// Dropout with p = 1 drops every weight, as PyTorch's does: the output and every gradient are 0
/// on every kernel (the factor 1 / (1 − p) made them NaN), while the weights and log-sum-exp
/// returned are those of the call without dropout.
#[test]
fn dropout_of_one_drops_every_weight() {
    let sh = AttnShape {
        seq_q: 40,
        seq_kv: 70,
        head_dim: 32,
        value_dim: 32,
        ..small()
    };
    let x = random_inputs(sh, 15);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let plain = AttnOptions {
        weights: attn_core::WeightsRequest::All,
        ..AttnOptions::default()
    };
    let all_dropped = AttnOptions {
        dropout: Some(Dropout { p: 1.0, seed: 3 }),
        ..plain.clone()
    };
    type Kernel = fn(&AttnInput, &AttnOptions) -> Result<attn_core::AttnOutput, AttnError>;
    let kernels: [(&str, Kernel); 2] = [("reference", sdpa_reference), ("fused", sdpa)];
    for (kernel, run) in kernels {
        let (got, want) = (
            run(&input, &all_dropped).unwrap(),
            run(&input, &plain).unwrap(),
        );
        assert!(got.out.iter().all(|&o| o == 0.0), "{kernel}: out");
        // Dropout may take another path through the kernel: the same values, other roundings.
        let weights = |o: &attn_core::AttnOutput| o.weights.as_ref().unwrap().data().to_vec();
        for (what, a, b) in [
            ("weights", weights(&got), weights(&want)),
            ("lse", got.lse, want.lse),
        ] {
            let err = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-5, "{kernel}: {what} off by {err}");
        }
    }
    let bf16 = |v: &[f32]| {
        v.iter()
            .map(|&x| attn_core::bf16::from_f32(x))
            .collect::<Vec<_>>()
    };
    let (qb, kb, vb) = (bf16(&x.q), bf16(&x.k), bf16(&x.v));
    let input_bf16 = attn_core::AttnInput::new(&qb, &kb, &vb, sh).unwrap();
    let got = attn_core::sdpa(&input_bf16, &all_dropped).unwrap();
    assert!(got.out.iter().all(|&o| o == 0.0), "bf16: out");

    let fwd = sdpa(&input, &all_dropped).unwrap();
    let fast = sdpa_backward(&input, &all_dropped, &fwd, &x.dout).unwrap();
    let slow = sdpa_backward_reference(&input, &all_dropped, &x.dout).unwrap();
    for (kernel, g) in [("fast", fast), ("reference", slow)] {
        for (name, grad) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
            assert!(grad.iter().all(|&d| d == 0.0), "{kernel} {name}");
        }
    }
}

/// Fast path vs reference twin, within 1e-4 · max(1, |x|).
fn check_twin(case: &str, sh: AttnShape, opt: &AttnOptions, seed: u64) {
    let x = random_inputs(sh, seed);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let fwd = sdpa(&input, opt).unwrap();
    let fast = sdpa_backward(&input, opt, &fwd, &x.dout).unwrap();
    let reference = sdpa_backward_reference(&input, opt, &x.dout).unwrap();
    assert_grads_close(case, &fast, &reference, 1e-4);
}

#[test]
fn fast_matches_the_twin_on_awkward_shapes() {
    let lengths = [
        (0, 5),
        (5, 0),
        (1, 1),
        (7, 63),
        (65, 7),
        (129, 130),
        (200, 257),
    ];
    let groups = [(1, 1), (3, 3), (4, 2), (6, 1)];
    let mut seed = 100;
    for &(l, s) in &lengths {
        for &(h, hkv) in &groups {
            for (d, dv) in [(1, 1), (8, 5), (64, 64)] {
                let sh = AttnShape {
                    batch: 2,
                    n_heads: h,
                    n_kv_heads: hkv,
                    seq_q: l,
                    seq_kv: s,
                    head_dim: d,
                    value_dim: dv,
                };
                if l * s * h * d > 3_000_000 {
                    continue; // the plain twin would take seconds
                }
                seed += 1;
                let opts = [
                    ("plain", AttnOptions::default()),
                    (
                        "causal bottom-right + window",
                        AttnOptions {
                            causal: Some(Causal::BottomRight),
                            window: Some(Window {
                                left: Some(40),
                                right: None,
                            }),
                            ..AttnOptions::default()
                        },
                    ),
                    (
                        "bottom-right window + alibi, no causal mask",
                        AttnOptions {
                            align: Some(Causal::BottomRight),
                            window: Some(Window {
                                left: Some(40),
                                right: Some(3),
                            }),
                            alibi: Some((0..h).map(|i| 0.05 * i as f32).collect()),
                            ..AttnOptions::default()
                        },
                    ),
                    (
                        "key padding",
                        AttnOptions {
                            key_padding: Some(
                                KeyPadding::from_lengths(&[s, s * 2 / 3], s).unwrap(),
                            ),
                            ..AttnOptions::default()
                        },
                    ),
                    (
                        "float mask [B, H, 1, S] with -inf + bool mask [S]",
                        AttnOptions {
                            float_mask: Some(
                                FloatMask::from_vec(
                                    (0..2 * h * s)
                                        .map(|x| match x % 7 {
                                            3 => f32::NEG_INFINITY,
                                            r => 0.3 * r as f32 - 1.0,
                                        })
                                        .collect(),
                                    &[2, h, 1, s],
                                )
                                .unwrap(),
                            ),
                            bool_mask: Some(
                                BoolMask::from_vec((0..s).map(|j| j % 5 != 2).collect(), &[s])
                                    .unwrap(),
                            ),
                            ..AttnOptions::default()
                        },
                    ),
                    (
                        "top-left + softcap + alibi + padding + dropout",
                        AttnOptions {
                            causal: Some(Causal::TopLeft),
                            softcap: Some(3.0),
                            alibi: Some((0..h).map(|i| 0.02 * i as f32).collect()),
                            key_padding: Some(KeyPadding::from_lengths(&[s, s / 2], s).unwrap()),
                            dropout: Some(Dropout { p: 0.2, seed }),
                            ..AttnOptions::default()
                        },
                    ),
                ];
                for (name, opt) in &opts {
                    let case = format!("{name} B2 H{h}/{hkv} L{l} S{s} d{d} dv{dv}");
                    check_twin(&case, sh, opt, seed);
                }
            }
        }
    }
}

#[test]
fn the_portable_build_matches_the_best_one() {
    // The elementwise steps have an AVX-512 build and a portable one; both must agree (the
    // same arithmetic, so to rounding) on shapes that leave vector tails.
    let opt = AttnOptions {
        causal: Some(Causal::BottomRight),
        softcap: Some(4.0),
        ..AttnOptions::default()
    };
    for (l, s) in [(1, 1), (37, 70), (130, 129)] {
        let sh = AttnShape {
            batch: 1,
            n_heads: 2,
            n_kv_heads: 1,
            seq_q: l,
            seq_kv: s,
            head_dim: 24,
            value_dim: 17,
        };
        let x = random_inputs(sh, l as u64);
        let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
        let fwd = sdpa(&input, &opt).unwrap();
        let run = |isa| backward_on(isa, &input, &opt, (&fwd.out, &fwd.lse), &x.dout).unwrap();
        let best = run(Isa::best());
        assert_grads_close(
            &format!("portable L{l} S{s}"),
            &run(Isa::Portable),
            &best,
            1e-6,
        );
        assert_grads_close(
            &format!("best L{l} S{s}"),
            &best,
            &sdpa_backward_reference(&input, &opt, &x.dout).unwrap(),
            1e-4,
        );
    }
}

/// Largest `|a − b| / max(1, |b|)` over all three gradients.
fn worst_difference(a: &Grads, b: &Grads) -> f32 {
    [(&a.dq, &b.dq), (&a.dk, &b.dk), (&a.dv, &b.dv)]
        .into_iter()
        .flat_map(|(x, y)| x.iter().zip(y.iter()))
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn the_amx_build_matches_the_fma_build_and_the_twin() {
    // Whole 64 × 64 blocks with head_dim and value_dim multiples of 32 take the AMX products
    // (`backward/amx.rs`: three in bf16x6, `dK` and `dQ` in bf16x3, ≤ 3·2⁻¹⁶ relative per
    // product); ragged edges take the FMA
    // kernels. Both must meet the twin's 1e-4, and the AMX run must really differ from the FMA
    // run (it is another summation), or the path did not run.
    let cases = [
        (
            "plain",
            (4, 2),
            (192, 192),
            (64, 64),
            AttnOptions::default(),
        ),
        (
            "causal bottom-right + dropout + softcap + alibi + padding",
            (2, 2),
            (130, 257),
            (32, 64),
            AttnOptions {
                causal: Some(Causal::BottomRight),
                dropout: Some(Dropout { p: 0.1, seed: 5 }),
                softcap: Some(5.0),
                alibi: Some(vec![0.01, 0.03]),
                key_padding: Some(KeyPadding::from_lengths(&[250], 257).unwrap()),
                ..AttnOptions::default()
            },
        ),
        (
            "window",
            (2, 1),
            (256, 256),
            (128, 32),
            AttnOptions {
                window: Some(Window {
                    left: Some(70),
                    right: Some(10),
                }),
                ..AttnOptions::default()
            },
        ),
        // Rules every query shares, on the transposed scores of whole blocks (`key_rules`):
        // key padding that hides a whole key block and part of the next, a per-key float mask
        // with −∞ and a per-key bool mask.
        (
            "key padding + float mask [1, H, 1, S] + bool mask [S]",
            (2, 2),
            (128, 256),
            (64, 64),
            AttnOptions {
                key_padding: Some(KeyPadding::from_lengths(&[100], 256).unwrap()),
                float_mask: Some(
                    FloatMask::from_vec(
                        (0..2 * 256)
                            .map(|x| match x % 9 {
                                4 => f32::NEG_INFINITY,
                                r => 0.2 * r as f32 - 0.8,
                            })
                            .collect(),
                        &[1, 2, 1, 256],
                    )
                    .unwrap(),
                ),
                bool_mask: Some(
                    BoolMask::from_vec((0..256).map(|j| j % 6 != 1).collect(), &[256]).unwrap(),
                ),
                ..AttnOptions::default()
            },
        ),
        // A mask with a row per query, on a transposed copy, then the fast lane (`mask_block`).
        (
            "float mask [L, S]",
            (2, 1),
            (128, 192),
            (64, 64),
            AttnOptions {
                float_mask: Some(
                    FloatMask::from_vec(
                        (0..128 * 192)
                            .map(|x| ((x * 37 % 101) as f32 - 50.0) / 40.0)
                            .collect(),
                        &[128, 192],
                    )
                    .unwrap(),
                ),
                ..AttnOptions::default()
            },
        ),
    ];
    for (name, (h, hkv), (l, s), (d, dv), opt) in cases {
        let sh = AttnShape {
            batch: 1,
            n_heads: h,
            n_kv_heads: hkv,
            seq_q: l,
            seq_kv: s,
            head_dim: d,
            value_dim: dv,
        };
        let x = random_inputs(sh, l as u64);
        let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
        let fwd = sdpa(&input, &opt).unwrap();
        let run = |isa| backward_on(isa, &input, &opt, (&fwd.out, &fwd.lse), &x.dout);
        if !Isa::Amx.is_available() {
            // This CPU cannot check the AMX build; asking for it is an error.
            let err = run(Isa::Amx).unwrap_err();
            assert!(matches!(
                err,
                AttnError::InvalidOption { option: "isa", .. }
            ));
            not_on_this_cpu(&format!("Amx on {name}"));
            continue;
        }
        let (amx, fma) = (run(Isa::Amx).unwrap(), run(Isa::Avx512).unwrap());
        let reference = sdpa_backward_reference(&input, &opt, &x.dout).unwrap();
        // Measured here: 3e-6 to 1e-5 (FMA vs twin: 3e-7 to 8e-7).
        let apart = worst_difference(&amx, &fma);
        assert!(
            apart > 0.0,
            "{name}: the AMX run equals the FMA run bit for bit"
        );
        assert_grads_close(&format!("amx vs fma, {name}"), &amx, &fma, 1e-4);
        assert_grads_close(&format!("amx vs twin, {name}"), &amx, &reference, 1e-4);
    }
}

fn errors_of(sh: AttnShape, f: impl Fn(&mut Inputs, &mut Vec<f32>, &mut Vec<f32>)) -> AttnError {
    let mut x = random_inputs(sh, 7);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let fwd = sdpa(&input, &AttnOptions::default()).unwrap();
    let (mut out, mut lse) = (fwd.out, fwd.lse);
    f(&mut x, &mut out, &mut lse);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let forward = attn_core::AttnOutput {
        out,
        lse,
        weights: None,
    };
    sdpa_backward(&input, &AttnOptions::default(), &forward, &x.dout).unwrap_err()
}

#[test]
fn a_wrong_shaped_dout_is_refused() {
    let err = errors_of(small(), |x, _, _| {
        x.dout.pop();
    });
    assert_eq!(
        err,
        AttnError::LengthMismatch {
            tensor: "dout",
            shape: vec![2, 2, 5, 3],
            expected: 60,
            got: 59
        }
    );
    let x = random_inputs(small(), 1);
    let input = AttnInput::new(&x.q, &x.k, &x.v, small()).unwrap();
    let err = sdpa_backward_reference(&input, &AttnOptions::default(), &x.dout[1..]).unwrap_err();
    assert!(matches!(
        err,
        AttnError::LengthMismatch { tensor: "dout", .. }
    ));
}

#[test]
fn wrong_shaped_saved_results_are_refused() {
    let err = errors_of(small(), |_, out, _| out.push(0.0));
    assert!(
        matches!(err, AttnError::LengthMismatch { tensor: "out", .. }),
        "{err}"
    );
    let err = errors_of(small(), |_, _, lse| {
        lse.pop();
    });
    assert!(
        matches!(err, AttnError::LengthMismatch { tensor: "lse", .. }),
        "{err}"
    );
}

/// An lse of −∞ says the row saw no key, whose output is 0: beside a non-zero output it is not
/// from the same forward pass, and gave that row no gradient without a word.
#[test]
fn an_lse_of_minus_infinity_beside_an_output_is_refused() {
    let err = errors_of(small(), |_, _, lse| lse[4] = f32::NEG_INFINITY);
    let named = matches!(&err, AttnError::InvalidOption { option: "lse", reason } if reason.contains("row 4"));
    assert!(named, "{err}");
}

#[test]
fn non_finite_gradients_and_saved_results_are_refused() {
    let err = errors_of(small(), |x, _, _| x.dout[3] = f32::NAN);
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "dout",
                index: 3,
                ..
            }
        ),
        "{err}"
    );
    let err = errors_of(small(), |_, out, _| out[5] = f32::INFINITY);
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "out",
                index: 5,
                ..
            }
        ),
        "{err}"
    );
    let err = errors_of(small(), |_, _, lse| lse[2] = f32::INFINITY);
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "lse",
                index: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_options_are_refused_as_in_the_forward_pass() {
    let sh = small();
    let x = random_inputs(sh, 1);
    let input = AttnInput::new(&x.q, &x.k, &x.v, sh).unwrap();
    let opt = AttnOptions {
        alibi: Some(vec![0.5]),
        ..AttnOptions::default()
    };
    let err = sdpa_backward_reference(&input, &opt, &x.dout).unwrap_err();
    assert_eq!(
        err,
        AttnError::PerHeadLength {
            what: "alibi",
            expected: 2,
            got: 1
        }
    );
}

/// Just under the tile bound (`scale·max ‖q‖·max ‖k‖` = 31.9) on queries and keys that share
/// one direction, the AMX lane gives the reference's gradients within 3.5e-5 of their largest
/// value (measured: `dq` 2.5e-5, `dk` 2.5e-6, `dv` 4.1e-6). Its scores were bf16x3 products,
/// `3·2⁻¹⁶` of `Σ|q·k|` each, which `P = e^(S − lse)` took whole: `dq` was 2.1e-4 off here, and
/// 1.2e-4 to 1.5e-3 from float64 in a review's cases (PyTorch's own backward: 1e-5). With
/// bf16x6 scores but uncentred `dK` and `dQ` products, `dq` was 4.5e-5 off and `dk` 5.7e-6.
#[test]
fn scores_near_the_tile_bound_keep_the_amx_lane_exact() {
    if !Isa::Amx.is_available() {
        not_on_this_cpu("Amx");
        return;
    }
    let (l, s, d) = (128, 64, 32);
    let shape = AttnShape::new(1, 1, l, s, d);
    let mut rng = Rng(17);
    let unit = |x: Vec<f32>| {
        let norm = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        x.into_iter().map(move |v| v / norm)
    };
    let u: Vec<f32> = unit(rng.vec(d, 1.0)).collect();
    // Rows u + noise/20, of norm a: scale·a² = 31.9 with the default scale 1/√d.
    let a = (31.9 * (d as f32).sqrt()).sqrt();
    let mut rows = |n: usize| -> Vec<f32> {
        (0..n)
            .flat_map(|_| {
                let row: Vec<f32> = u
                    .iter()
                    .zip(rng.vec(d, 1.0))
                    .map(|(u, e)| u + 0.05 * e)
                    .collect();
                unit(row).map(|v| v * a).collect::<Vec<_>>()
            })
            .collect()
    };
    let (q, k) = (rows(l), rows(s));
    let (v, dout) = (rng.vec(s * d, 1.0), rng.vec(l * d, 1.0));
    let input = AttnInput::new(&q, &k, &v, shape).unwrap();
    let options = AttnOptions::default();
    let fwd = sdpa(&input, &options).unwrap();
    let want = sdpa_backward_reference(&input, &options, &dout).unwrap();
    let got = backward_on(Isa::Amx, &input, &options, (&fwd.out, &fwd.lse), &dout).unwrap();
    assert_within_of_largest("amx", &got, &want, 3.5e-5);
}

/// At a large scale (10) on scores near 0 (queries of 1e-20), `dq = scale·dS·K` takes the
/// products' rounding times 10: with `dK` and `dQ` in bf16x3 (`3·2⁻¹⁶` of each term) the AMX
/// lane's `dq` was 7.5e-4 from float64 on a review's case (this one, 1.3e-4 from the
/// reference), PyTorch's float32 backward 1e-5. Past `|scale|·max(‖q‖, ‖k‖) = 8` they take
/// bf16x6, as the other three products: 5.9e-6 here.
#[test]
fn a_large_scale_keeps_the_amx_lanes_gradients_exact() {
    if !Isa::Amx.is_available() {
        not_on_this_cpu("Amx");
        return;
    }
    let (l, s, d) = (64, 128, 64);
    let shape = AttnShape::new(1, 2, l, s, d);
    let mut rng = Rng(29);
    let q: Vec<f32> = rng.vec(2 * l * d, 1.0).iter().map(|x| x * 1e-20).collect();
    let (k, v, dout) = (
        rng.vec(2 * s * d, 1.0),
        rng.vec(2 * s * d, 1.0),
        rng.vec(2 * l * d, 1.0),
    );
    let input = AttnInput::new(&q, &k, &v, shape).unwrap();
    let options = AttnOptions {
        scale: Some(10.0),
        causal: Some(Causal::TopLeft),
        ..AttnOptions::default()
    };
    let fwd = sdpa(&input, &options).unwrap();
    let want = sdpa_backward_reference(&input, &options, &dout).unwrap();
    let got = backward_on(Isa::Amx, &input, &options, (&fwd.out, &fwd.lse), &dout).unwrap();
    // The golden files' metric and gradient tolerance: |got − want| / max(1, |want|) ≤ 1e-4.
    for (name, got, want) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let err = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs() / w.abs().max(1.0)));
        assert!(err <= 1e-4, "{name}: {err}");
    }
}

/// Asserts that each gradient of `got` is within `tol` times the largest value of `want`'s.
fn assert_within_of_largest(what: &str, got: &Grads, want: &Grads, tol: f32) {
    for (name, got, want) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        let largest = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        let err = got
            .iter()
            .zip(want)
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(
            err <= tol * largest,
            "{what} {name}: off by {err} of {largest}"
        );
    }
}

/// Scores past the forward pass's tile bound take the FMA kernels in the backward pass too,
/// whatever the ISA: when the AMX lane's scores were bf16x3 products, they put `dq` off by a
/// tenth of its largest value on keys that share a component of 1000 (scores near 125),
/// against 4e-4 on the FMA kernels.
#[test]
fn large_scores_leave_the_amx_lane() {
    let (n, d) = (64, 64);
    let shape = AttnShape::new(1, 1, n, n, d);
    let mut rng = Rng(123);
    let (mut q, mut k) = (rng.vec(n * d, 1.0), rng.vec(n * d, 1.0));
    let (v, dout) = (rng.vec(n * d, 1.0), rng.vec(n * d, 1.0));
    for row in 0..n {
        q[row * d] = 1.0;
        k[row * d] += 1000.0;
    }
    let options = AttnOptions {
        scale: Some(0.125),
        ..AttnOptions::default()
    };
    let input = AttnInput::new(&q, &k, &v, shape).unwrap();
    let fwd = sdpa(&input, &options).unwrap();
    let want = sdpa_backward_reference(&input, &options, &dout).unwrap();
    let run = |isa| backward_on(isa, &input, &options, (&fwd.out, &fwd.lse), &dout).unwrap();
    for isa in isas().into_iter().filter(|&isa| isa != Isa::Portable) {
        assert_within_of_largest(&format!("{isa:?}"), &run(isa), &want, 1e-3);
    }
}

/// The backward reference lets a NaN input (opted out of the finiteness check) poison what it
/// reaches, as the forward reference does: a NaN query row gets NaN gradients, and so do the
/// keys and values it sees, while the other rows' gradients stay finite. It returned a
/// gradient of 0 for that row and dropped it from the keys' and values' sums.
#[test]
fn the_backward_reference_keeps_a_nan_query_in_its_row() {
    let (n, d) = (4, 2);
    let shape = AttnShape::new(1, 1, n, n, d);
    let mut rng = Rng(7);
    let (mut q, k, v, dout) = (
        rng.vec(n * d, 1.0),
        rng.vec(n * d, 1.0),
        rng.vec(n * d, 1.0),
        rng.vec(n * d, 1.0),
    );
    q[2 * d] = f32::NAN;
    let input = AttnInput::allowing_non_finite(&q, &k, &v, shape).unwrap();
    // Causal: row 2 sees keys 0..=2, row 3 all four.
    let options = AttnOptions {
        causal: Some(Causal::TopLeft),
        ..AttnOptions::default()
    };
    let fwd = sdpa_reference(&input, &options).unwrap();
    assert!(fwd.lse[2].is_nan() && fwd.lse[3].is_finite());
    let g = sdpa_backward_reference(&input, &options, &dout).unwrap();
    let rows = |x: &[f32], r: usize| x[r * d..][..d].to_vec();
    assert!(rows(&g.dq, 2).iter().all(|x| x.is_nan()), "{:?}", g.dq);
    for r in [0, 1, 3] {
        assert!(rows(&g.dq, r).iter().all(|x| x.is_finite()), "{:?}", g.dq);
    }
    for j in 0..3 {
        assert!(rows(&g.dk, j).iter().all(|x| x.is_nan()), "{:?}", g.dk);
        assert!(rows(&g.dv, j).iter().all(|x| x.is_nan()), "{:?}", g.dv);
    }
    // Key 3 is hidden from row 2: only row 3 reaches it.
    assert!(rows(&g.dk, 3).iter().all(|x| x.is_finite()), "{:?}", g.dk);
    assert!(rows(&g.dv, 3).iter().all(|x| x.is_finite()), "{:?}", g.dv);
}

/// Extreme scales give the reference's gradients on every ISA. Past `2^±60` the fast path
/// hands the call to the reference's loop (bit for bit): a scale of 1e30 on queries of 1e10
/// against keys of 1e-40 (scores of order 1; `dq` and `dv` finite, `dk` past f32's range,
/// which every path refuses naming `dk`), and 1e-37 against keys of 1.5e37 with values and
/// gradients of 100. Scaling the queries first overflowed in the first (NaN and infinite
/// gradients where the reference's are finite), summing `dS·K` before the scale in the second
/// (`dq` infinite). Just inside the bounds (scales of 5e17 and 2e-18, rows of norm up to
/// 8e8, under 2^30) the fast kernels run, in another order of operations than the
/// reference's: within 1e-4, and not bit for bit.
#[test]
fn extreme_scales_give_the_references_gradients() {
    let shape = AttnShape::new(1, 1, 4, 5, 4);
    let mut rng = Rng(11);
    let times = |x: Vec<f32>, a: f32| x.into_iter().map(|v| v * a).collect::<Vec<_>>();
    for (scale, qa, ka, va) in [
        (1e30f32, 1e10f32, 1e-40f32, 1.0f32),
        (1e-37, 1.0, 1.5e37, 100.0),
        (5e17, 1e-9, 1e-9, 1.0),
        (2e-18, 4e8, 4e8, 100.0),
    ] {
        let fast_path = (2f32.powi(-60)..=2f32.powi(60)).contains(&scale);
        let mut differs = false;
        let q = times(rng.vec(16, 1.0), qa);
        let k = times(rng.vec(20, 1.0), ka);
        let v = times(rng.vec(20, 1.0), va);
        let dout = times(rng.vec(16, 1.0), va);
        let options = AttnOptions {
            scale: Some(scale),
            ..AttnOptions::default()
        };
        let input = AttnInput::new(&q, &k, &v, shape).unwrap();
        let fwd = sdpa_reference(&input, &options).unwrap();
        let want = sdpa_backward_reference(&input, &options, &dout);
        for isa in isas() {
            let got = backward_on(isa, &input, &options, (&fwd.out, &fwd.lse), &dout);
            let (got, want) = match (got, &want) {
                (Ok(got), Ok(want)) => (got, want),
                (got, want) => {
                    assert!(scale == 1e30, "scale {scale:e}, {isa:?}: {got:?}");
                    for g in [got, want.clone()] {
                        assert!(
                            matches!(g, Err(AttnError::GradientOverflow { tensor: "dk", .. })),
                            "{isa:?}: {g:?}"
                        );
                    }
                    continue;
                }
            };
            for (name, got, want) in [
                ("dq", &got.dq, &want.dq),
                ("dk", &got.dk, &want.dk),
                ("dv", &got.dv, &want.dv),
            ] {
                let close = got
                    .iter()
                    .zip(want)
                    .all(|(g, w)| g == w || (g - w).abs() <= 1e-4 * w.abs().max(1.0));
                assert!(
                    close,
                    "scale {scale:e}, {isa:?} {name}: {got:?} vs {want:?}"
                );
                let same_bits = got
                    .iter()
                    .zip(want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    fast_path || same_bits,
                    "scale {scale:e}, {isa:?} {name}: not the reference's loop"
                );
                differs |= !same_bits;
            }
        }
        assert!(
            !fast_path || differs,
            "scale {scale:e}: every ISA gave the reference's bits, so none ran the fast path"
        );
    }
}

/// A float mask of −1e30 on every key of a row (or −1e4, BERT's old padding value, or
/// `finfo.min`) makes the row's saved lse too large to hold its sum: the fast path's
/// `P = e^(S − lse)` was 1 at each key, so with all four keys at weight 1/4, `dv` came out 1
/// instead of 1/4 and `dq` 4 times too large. Now such rows take the reference's loop, and
/// every build gives its gradients, beside rows of ordinary size on the fast path.
#[test]
fn a_large_float_mask_on_a_whole_row_gives_the_references_gradients() {
    let shape = AttnShape::new(1, 1, 1, 4, 8);
    let q = vec![0.0f32; 8];
    let k: Vec<f32> = (0..32).map(|x| x as f32 / 32.0).collect();
    let v = k.clone();
    let dout = vec![1.0f32; 8];
    for offset in [-1e30f32, f32::MIN, -1e4, 1e6] {
        let options = AttnOptions {
            float_mask: Some(FloatMask::from_vec(vec![offset; 4], &[1, 4]).unwrap()),
            ..AttnOptions::default()
        };
        let input = AttnInput::new(&q, &k, &v, shape).unwrap();
        let fwd = sdpa(&input, &options).unwrap();
        let want = sdpa_backward_reference(&input, &options, &dout).unwrap();
        // All scores are the offset: weights 1/4, so dv = dout / 4.
        assert!(
            want.dv.iter().all(|&x| (x - 0.25).abs() < 1e-6),
            "{offset:e}: {:?}",
            want.dv
        );
        for isa in isas() {
            let got = backward_on(isa, &input, &options, (&fwd.out, &fwd.lse), &dout).unwrap();
            let worst = worst_difference(&got, &want);
            assert!(worst <= 1e-6, "mask {offset:e}, {isa:?}: off by {worst:e}");
        }
    }

    // Hugging Face's causal mask with left padding: keys 0..4 are padding (finfo.min), and
    // so is every key past the query. Query rows 0..4 see only padding (their lse near
    // −3.4e38 takes the reference's row loop), the others the fast path: together, the
    // reference's gradients on every build.
    let shape = AttnShape::new(1, 2, 64, 64, 32);
    let x = random_inputs(shape, 5);
    let mask: Vec<f32> = (0..64 * 64)
        .map(|at| {
            let (i, j) = (at / 64, at % 64);
            if j < 4 || j > i { f32::MIN } else { 0.0 }
        })
        .collect();
    let options = AttnOptions {
        float_mask: Some(FloatMask::from_vec(mask, &[64, 64]).unwrap()),
        ..AttnOptions::default()
    };
    let input = AttnInput::new(&x.q, &x.k, &x.v, shape).unwrap();
    let fwd = sdpa(&input, &options).unwrap();
    assert!(fwd.lse[0] < -1e38 && fwd.lse[10].abs() < 10.0);
    let want = sdpa_backward_reference(&input, &options, &x.dout).unwrap();
    for isa in isas() {
        let got = backward_on(isa, &input, &options, (&fwd.out, &fwd.lse), &x.dout).unwrap();
        let worst = worst_difference(&got, &want);
        assert!(worst <= 2e-5, "left padding, {isa:?}: off by {worst:e}");
    }
}
