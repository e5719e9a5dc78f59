//! Packed variable-length batches: each sequence of the pack gives exactly what running it
//! alone gives (forward and backward, with every option a pack takes), dropout follows the
//! padded batch's mask, and bad offsets are refused with clear errors.

use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnShape, BoolMask, Causal, Dropout, FloatMask, KeyPadding,
    PackedDims, PackedInput, WeightsRequest, Window, sdpa, sdpa_backward, sdpa_varlen,
    sdpa_varlen_backward,
};

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Rows `range` of a token-major `[tokens, heads, width]` tensor as `[1, heads, len, width]`.
fn alone(x: &[f32], range: std::ops::Range<usize>, heads: usize, width: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(range.len() * heads * width);
    for h in 0..heads {
        for t in range.clone() {
            y.extend_from_slice(&x[(t * heads + h) * width..][..width]);
        }
    }
    y
}

const DIMS: PackedDims = PackedDims {
    n_heads: 4,
    n_kv_heads: 2,
    head_dim: 8,
    value_dim: 5,
};

/// Lengths chosen to cross the kernels' block edges, with an empty query sequence, an empty
/// key sequence and L ≠ S.
const LENS_Q: [usize; 5] = [3, 0, 17, 65, 130];
const LENS_KV: [usize; 5] = [5, 4, 0, 65, 129];

fn offsets(lens: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(lens.iter().scan(0, |acc, &l| {
            *acc += l;
            Some(*acc)
        }))
        .collect()
}

#[test]
fn each_sequence_equals_running_it_alone() {
    let (cu_q, cu_kv) = (offsets(&LENS_Q), offsets(&LENS_KV));
    let (tq, tkv) = (*cu_q.last().unwrap(), *cu_kv.last().unwrap());
    let d = DIMS;
    let q = random(tq * d.n_heads * d.head_dim, 1);
    let k = random(tkv * d.n_kv_heads * d.head_dim, 2);
    let v = random(tkv * d.n_kv_heads * d.value_dim, 3);
    let dout = random(tq * d.n_heads * d.value_dim, 4);
    let input = PackedInput::new(&q, &k, &v, &cu_q, &cu_kv, d).unwrap();
    let option_sets = [
        AttnOptions::default(),
        AttnOptions {
            causal: Some(Causal::BottomRight),
            window: Some(Window {
                left: Some(20),
                right: None,
            }),
            softcap: Some(2.0),
            alibi: Some(vec![0.1, 0.05, 0.02, 0.01]),
            scale: Some(0.3),
            ..AttnOptions::default()
        },
        AttnOptions {
            causal: Some(Causal::TopLeft),
            dropout: Some(Dropout { p: 0.25, seed: 9 }),
            ..AttnOptions::default()
        },
    ];
    for opt in &option_sets {
        let packed = sdpa_varlen(&input, opt).unwrap();
        let grads = sdpa_varlen_backward(&input, opt, &packed, &dout).unwrap();
        assert_eq!(packed.out.len(), tq * d.n_heads * d.value_dim);
        assert_eq!(packed.lse.len(), d.n_heads * tq);
        for b in 0..LENS_Q.len() {
            let (rq, rkv) = (cu_q[b]..cu_q[b + 1], cu_kv[b]..cu_kv[b + 1]);
            let shape = AttnShape {
                batch: 1,
                n_heads: d.n_heads,
                n_kv_heads: d.n_kv_heads,
                seq_q: rq.len(),
                seq_kv: rkv.len(),
                head_dim: d.head_dim,
                value_dim: d.value_dim,
            };
            let (qb, kb, vb) = (
                alone(&q, rq.clone(), d.n_heads, d.head_dim),
                alone(&k, rkv.clone(), d.n_kv_heads, d.head_dim),
                alone(&v, rkv.clone(), d.n_kv_heads, d.value_dim),
            );
            // Alone, sequence b's dropout is batch index 0 of a seed that mixes in b.
            let mut opt_b = opt.clone();
            if let Some(drop) = opt.dropout {
                opt_b.dropout = Some(Dropout {
                    p: drop.p,
                    seed: drop.seed ^ b as u64,
                });
            }
            let inp = AttnInput::new(&qb, &kb, &vb, shape).unwrap();
            let single = sdpa(&inp, &opt_b).unwrap();
            let dout_b = alone(&dout, rq.clone(), d.n_heads, d.value_dim);
            let g = sdpa_backward(&inp, &opt_b, &single, &dout_b).unwrap();
            let ctx = format!("sequence {b} with {opt:?}");
            assert_eq!(
                alone(&packed.out, rq.clone(), d.n_heads, d.value_dim),
                single.out,
                "{ctx}: out"
            );
            let lse_b: Vec<f32> = (0..d.n_heads)
                .flat_map(|h| packed.lse[h * tq + rq.start..][..rq.len()].to_vec())
                .collect();
            assert_eq!(lse_b, single.lse, "{ctx}: lse");
            assert_eq!(
                alone(&grads.dq, rq.clone(), d.n_heads, d.head_dim),
                g.dq,
                "{ctx}: dq"
            );
            assert_eq!(
                alone(&grads.dk, rkv.clone(), d.n_kv_heads, d.head_dim),
                g.dk,
                "{ctx}: dk"
            );
            assert_eq!(
                alone(&grads.dv, rkv.clone(), d.n_kv_heads, d.value_dim),
                g.dv,
                "{ctx}: dv"
            );
        }
    }
}

#[test]
fn equal_lengths_match_the_padded_batch_dropout_included() {
    // Three sequences of 33 queries and 40 keys: the pack is a plain batch in another layout,
    // so it must agree with one batched call, whose dropout draws (b, h, i, j).
    let (n, l, s) = (3, 33, 40);
    let d = DIMS;
    let (cu_q, cu_kv) = (offsets(&[l; 3]), offsets(&[s; 3]));
    let q = random(n * l * d.n_heads * d.head_dim, 5);
    let k = random(n * s * d.n_kv_heads * d.head_dim, 6);
    let v = random(n * s * d.n_kv_heads * d.value_dim, 7);
    let opt = AttnOptions {
        causal: Some(Causal::BottomRight),
        dropout: Some(Dropout { p: 0.4, seed: 77 }),
        ..AttnOptions::default()
    };
    let packed = sdpa_varlen(
        &PackedInput::new(&q, &k, &v, &cu_q, &cu_kv, d).unwrap(),
        &opt,
    )
    .unwrap();
    let batched = |x: &[f32], seq: usize, heads: usize, width: usize| -> Vec<f32> {
        (0..n)
            .flat_map(|b| alone(x, b * seq..(b + 1) * seq, heads, width))
            .collect()
    };
    let (qb, kb, vb) = (
        batched(&q, l, d.n_heads, d.head_dim),
        batched(&k, s, d.n_kv_heads, d.head_dim),
        batched(&v, s, d.n_kv_heads, d.value_dim),
    );
    let shape = AttnShape {
        batch: n,
        n_heads: d.n_heads,
        n_kv_heads: d.n_kv_heads,
        seq_q: l,
        seq_kv: s,
        head_dim: d.head_dim,
        value_dim: d.value_dim,
    };
    let full = sdpa(&AttnInput::new(&qb, &kb, &vb, shape).unwrap(), &opt).unwrap();
    assert_eq!(batched(&packed.out, l, d.n_heads, d.value_dim), full.out);
}

fn packed_error(cu_q: &[usize], cu_kv: &[usize], tq: usize, tkv: usize) -> AttnError {
    let d = DIMS;
    let q = vec![0.0; tq * d.n_heads * d.head_dim];
    let k = vec![0.0; tkv * d.n_kv_heads * d.head_dim];
    let v = vec![0.0; tkv * d.n_kv_heads * d.value_dim];
    PackedInput::new(&q, &k, &v, cu_q, cu_kv, d).unwrap_err()
}

fn reason(err: &AttnError) -> (&'static str, &str) {
    match err {
        AttnError::InvalidOption { option, reason } => (option, reason.as_str()),
        other => panic!("expected InvalidOption, got {other}"),
    }
}

#[test]
fn bad_offsets_are_refused() {
    let err = packed_error(&[1, 4], &[0, 4], 4, 4);
    assert_eq!(reason(&err), ("cu_seqlens_q", "must start at 0, got 1"));
    let err = packed_error(&[0, 4, 3, 6], &[0, 1, 2, 6], 6, 6);
    assert_eq!(
        reason(&err),
        (
            "cu_seqlens_q",
            "offsets must not decrease: entry 1 is 4, entry 2 is 3"
        )
    );
    let err = packed_error(&[0, 2], &[], 2, 0);
    assert_eq!(reason(&err).0, "cu_seqlens_kv");
    assert!(reason(&err).1.contains("got none"));
    let err = packed_error(&[0, 2, 4], &[0, 4], 4, 4);
    assert_eq!(reason(&err).0, "cu_seqlens_kv");
    assert!(
        reason(&err)
            .1
            .contains("1 sequences) but cu_seqlens_q has 3 (2 sequences)")
    );
    // Offsets past the tokens given: the last offset says 9 query tokens, q holds 8.
    let err = packed_error(&[0, 9], &[0, 4], 8, 4);
    assert_eq!(
        err,
        AttnError::LengthMismatch {
            tensor: "q",
            shape: vec![9, 4, 8],
            expected: 288,
            got: 256
        }
    );
    let err = packed_error(&[0, 4], &[0, 3], 4, 4);
    assert!(
        matches!(err, AttnError::LengthMismatch { tensor: "k", .. }),
        "{err}"
    );
    let d = PackedDims {
        n_kv_heads: 3,
        ..DIMS
    };
    let err = PackedInput::new(&[], &[], &[], &[0], &[0], d).unwrap_err();
    assert_eq!(
        err,
        AttnError::HeadsNotDivisible {
            n_heads: 4,
            n_kv_heads: 3
        }
    );
}

#[test]
fn padded_batch_options_are_refused() {
    let d = DIMS;
    let (cu_q, cu_kv) = ([0, 2, 5], [0, 3, 4]);
    let q = random(5 * d.n_heads * d.head_dim, 1);
    let k = random(4 * d.n_kv_heads * d.head_dim, 2);
    let v = random(4 * d.n_kv_heads * d.value_dim, 3);
    let input = PackedInput::new(&q, &k, &v, &cu_q, &cu_kv, d).unwrap();
    let cases = [
        (
            AttnOptions {
                bool_mask: Some(BoolMask::from_vec(vec![true; 3], &[3]).unwrap()),
                ..AttnOptions::default()
            },
            "bool_mask",
        ),
        (
            AttnOptions {
                float_mask: Some(FloatMask::from_vec(vec![0.0; 3], &[3]).unwrap()),
                ..AttnOptions::default()
            },
            "float_mask",
        ),
        (
            AttnOptions {
                key_padding: Some(KeyPadding::from_lengths(&[3, 1], 3).unwrap()),
                ..AttnOptions::default()
            },
            "key_padding",
        ),
        (
            AttnOptions {
                weights: WeightsRequest::All,
                ..AttnOptions::default()
            },
            "weights",
        ),
    ];
    for (opt, option) in cases {
        let err = sdpa_varlen(&input, &opt).unwrap_err();
        assert_eq!(reason(&err).0, option);
    }
    let err = sdpa_varlen(
        &input,
        &AttnOptions {
            alibi: Some(vec![0.1]),
            ..AttnOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, AttnError::PerHeadLength { .. }), "{err}");
    let fwd = sdpa_varlen(&input, &AttnOptions::default()).unwrap();
    let short = vec![0.0; 5 * d.n_heads * d.value_dim - 1];
    let err = sdpa_varlen_backward(&input, &AttnOptions::default(), &fwd, &short).unwrap_err();
    assert!(
        matches!(err, AttnError::LengthMismatch { tensor: "dout", .. }),
        "{err}"
    );
}

/// A packed input built without `PackedInput::new` (its fields are public) is checked by the
/// packed calls themselves: an empty offsets list made the batch size wrap and the call loop
/// for ever, offsets that disagree in count or do not start at 0, and short slices panicked or
/// dropped tokens. Forward and backward refuse each with the error `new` gives.
#[test]
fn inputs_built_without_new_are_checked_by_the_calls() {
    let d = DIMS;
    let (cu_q, cu_kv) = ([0usize, 2, 5], [0usize, 3, 4]);
    let q = random(5 * d.n_heads * d.head_dim, 1);
    let k = random(4 * d.n_kv_heads * d.head_dim, 2);
    let v = random(4 * d.n_kv_heads * d.value_dim, 3);
    let good = PackedInput::new(&q, &k, &v, &cu_q, &cu_kv, d).unwrap();
    let fwd = sdpa_varlen(&good, &AttnOptions::default()).unwrap();
    let dout = vec![1.0; fwd.out.len()];
    let (none, three, late): (&[usize], &[usize], &[usize]) = (&[], &[0, 2, 4, 5], &[1, 2, 5]);
    let cases = [
        (
            PackedInput {
                cu_seqlens_q: none,
                cu_seqlens_kv: none,
                ..good
            },
            "cu_seqlens_q",
        ),
        (
            PackedInput {
                cu_seqlens_q: three,
                ..good
            },
            "cu_seqlens_kv",
        ),
        (
            PackedInput {
                cu_seqlens_q: late,
                ..good
            },
            "cu_seqlens_q",
        ),
        (PackedInput { q: &q[1..], ..good }, "q"),
        (
            PackedInput {
                v: &v[..v.len() - 1],
                ..good
            },
            "v",
        ),
    ];
    for (input, named) in cases {
        let name = |err: AttnError| match err {
            AttnError::InvalidOption { option, .. } => option,
            AttnError::LengthMismatch { tensor, .. } => tensor,
            other => panic!("{named}: {other}"),
        };
        let err = sdpa_varlen(&input, &AttnOptions::default()).unwrap_err();
        assert_eq!(name(err), named);
        let err = sdpa_varlen_backward(&input, &AttnOptions::default(), &fwd, &dout).unwrap_err();
        assert_eq!(name(err), named);
    }
}

/// The totals of a packed batch have the padded call's limit: 40 sequences of 2^28 queries
/// (empty rows, head_dim 0) passed every per-sequence check, then aborted allocating 6 GiB.
/// (Each such sequence is now refused on its own, past `MAX_EMPTY_HEAD_SCORES`: 40 of 2^26,
/// the most one may declare, are refused by their total.)
#[test]
fn packed_totals_beyond_the_limit_are_refused_before_allocating() {
    let d = PackedDims {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 0,
        value_dim: 0,
    };
    let cu_q: Vec<usize> = (0..=40).map(|b| b << 26).collect();
    let cu_kv: Vec<usize> = (0..=40).collect();
    let err = PackedInput::new(&[], &[], &[], &cu_q, &cu_kv, d).unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::TooLarge {
                what: "query rows",
                ..
            }
        ),
        "{err}"
    );
}

/// With head_dim 0 the packed totals counted `total_q × total_kv` scores, pairs of sequences no
/// call computes: 16 sequences of 1024 queries and keys (2^24 scores) were refused as 2^28.
/// The sequences' own scores count, up to the limit and not past it.
#[test]
fn empty_heads_count_each_sequences_own_scores() {
    let d = PackedDims {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 0,
        value_dim: 1,
    };
    let offsets = |n: usize, len: usize| (0..=n).map(|b| b * len).collect::<Vec<_>>();
    let (cu, v) = (offsets(16, 1024), vec![1.0f32; 16 * 1024]);
    let input = PackedInput::new(&[], &[], &v, &cu, &cu, d).unwrap();
    let options = AttnOptions {
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    let out = sdpa_varlen(&input, &options).unwrap();
    assert!(out.out.iter().all(|&o| o == 1.0));
    // 65 sequences of 1024: 65 · 2^20 scores, past the 2^26 a call may declare.
    let (cu, v) = (offsets(65, 1024), vec![1.0f32; 65 * 1024]);
    let err = PackedInput::new(&[], &[], &v, &cu, &cu, d).unwrap_err();
    assert!(
        matches!(err, AttnError::EmptyHeadTooLarge { scores, .. } if scores == 65 << 20),
        "{err}"
    );
}

/// A NaN in a packed tensor was reported at its index in one sequence's gathered copy (`q[4]`,
/// in sequence 1, as `q[0]`); `dout[5]` as `dout[1]`. The packed tensors are checked first,
/// and a score overflow names its sequence.
#[test]
fn non_finite_values_are_named_at_their_packed_index() {
    let dims = PackedDims {
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 2,
        value_dim: 2,
    };
    let cu = [0, 2, 3];
    let (mut q, k, v) = (vec![0.0f32; 6], vec![0.0f32; 6], vec![0.0f32; 6]);
    q[4] = f32::NAN;
    let input = PackedInput::new(&q, &k, &v, &cu, &cu, dims).unwrap();
    let err = sdpa_varlen(&input, &AttnOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "q",
                index: 4,
                ..
            }
        ),
        "{err:?}"
    );
    q[4] = 0.0;
    let input = PackedInput::new(&q, &k, &v, &cu, &cu, dims).unwrap();
    let fwd = sdpa_varlen(&input, &AttnOptions::default()).unwrap();
    let mut dout = vec![1.0f32; 6];
    dout[5] = f32::INFINITY;
    let err = sdpa_varlen_backward(&input, &AttnOptions::default(), &fwd, &dout).unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "dout",
                index: 5,
                ..
            }
        ),
        "{err:?}"
    );
    let mut nan_lse = fwd.clone();
    nan_lse.lse[2] = f32::NAN;
    let err =
        sdpa_varlen_backward(&input, &AttnOptions::default(), &nan_lse, &[1.0; 6]).unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "lse",
                index: 2,
                ..
            }
        ),
        "{err:?}"
    );
    // Scores past f32 in sequence 1 (its only row) were named as batch 0.
    (q[4], q[5]) = (3e19, 0.0);
    let mut k = k.clone();
    (k[4], k[5]) = (3e19, 0.0);
    let input = PackedInput::new(&q, &k, &v, &cu, &cu, dims).unwrap();
    assert_eq!(
        sdpa_varlen(&input, &AttnOptions::default()).unwrap_err(),
        AttnError::ScoreOverflow {
            batch: 1,
            head: 0,
            row: 0
        }
    );
}
