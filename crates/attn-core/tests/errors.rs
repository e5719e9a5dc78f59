//! One test per `AttnError` variant: each bad input gives that error, with a message naming the
//! tensor or option and the shapes — never a panic.

use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnShape, BoolMask, Causal, Dropout, FloatMask, KeyPadding,
    Linear, MhaConfig, MhaInput, MultiheadAttention, PackedDims, PackedInput, StateDict,
    WeightsRequest, sdpa, sdpa_backward, sdpa_backward_reference, sdpa_reference, sdpa_varlen,
    sdpa_varlen_backward,
};
use attn_core::{Isa, bf16};

mod common;

use common::sdpa_on;

/// A valid 1×2×3×4 call (batch 1, 2 heads, 3 queries, 4 keys, head_dim 2).
fn shape() -> AttnShape {
    AttnShape::new(1, 2, 3, 4, 2)
}

fn data(sh: AttnShape) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = |d: [usize; 4]| vec![0.5; d.iter().product()];
    (n(sh.q_dims()), n(sh.k_dims()), n(sh.v_dims()))
}

/// Runs both kernels with `options` on the valid call; both must fail the same way.
fn fails_with(options: AttnOptions) -> AttnError {
    let sh = shape();
    let (q, k, v) = data(sh);
    let input = AttnInput::new(&q, &k, &v, sh).unwrap();
    let a = sdpa_reference(&input, &options).unwrap_err();
    let b = sdpa(&input, &options).unwrap_err();
    // Compared as text: a NaN inside an error is not equal to itself.
    assert_eq!(
        format!("{a:?}"),
        format!("{b:?}"),
        "both kernels reject the same way"
    );
    a
}

#[test]
fn shape_mismatch_names_the_tensor_and_both_shapes() {
    // k's head_dim (3) differs from q's (2).
    let err = AttnInput::from_dims(
        (&[0.0; 12], &[1, 2, 3, 2]),
        (&[0.0; 24], &[1, 2, 4, 3]),
        (&[0.0; 16], &[1, 2, 4, 2]),
    )
    .unwrap_err();
    assert_eq!(
        err,
        AttnError::ShapeMismatch {
            tensor: "k",
            expected: vec![1, 2, 4, 2],
            got: vec![1, 2, 4, 3],
        }
    );
    assert_eq!(
        err.to_string(),
        "k: expected shape [1, 2, 4, 2], got [1, 2, 4, 3]"
    );
    // Key padding for the wrong batch or length.
    let kp = KeyPadding::from_vec(vec![true; 5], 1, 5).unwrap();
    let err = fails_with(AttnOptions {
        key_padding: Some(kp),
        ..AttnOptions::default()
    });
    assert!(matches!(
        err,
        AttnError::ShapeMismatch {
            tensor: "key_padding",
            ..
        }
    ));
    assert!(err.to_string().contains("[1, 4]") && err.to_string().contains("[1, 5]"));
}

#[test]
fn length_mismatch_when_a_slice_disagrees_with_its_shape() {
    let sh = shape();
    let (q, k, v) = data(sh);
    let err = AttnInput::new(&q[1..], &k, &v, sh).unwrap_err();
    assert_eq!(
        err,
        AttnError::LengthMismatch {
            tensor: "q",
            shape: vec![1, 2, 3, 2],
            expected: 12,
            got: 11,
        }
    );
    assert!(
        err.to_string()
            .starts_with("q: shape [1, 2, 3, 2] needs 12 elements, got 11")
    );
    // An input built without `new` (its fields are public) is checked by the call itself, on
    // every path, instead of indexing past its slices.
    let short = AttnInput {
        q: &q,
        k: &k,
        v: &v[1..],
        shape: sh,
    };
    let bf = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (qb, kb, vb) = (bf(&q), bf(&k), bf(&v[1..]));
    let short_bf16 = AttnInput {
        q: &qb,
        k: &kb,
        v: &vb,
        shape: sh,
    };
    let options = AttnOptions::default();
    let mut results = vec![sdpa_reference(&short, &options), sdpa(&short, &options)];
    for isa in Isa::ALL {
        if isa.is_available() {
            results.push(sdpa_on(isa, &short, &options));
            results.push(sdpa_on(isa, &short_bf16, &options));
        }
    }
    for result in results {
        assert!(
            matches!(
                result,
                Err(AttnError::LengthMismatch {
                    tensor: "v",
                    expected: 16,
                    got: 15,
                    ..
                })
            ),
            "{:?}",
            result.map(|o| o.out.len())
        );
    }
    // The same rule guards masks and the MHA inputs.
    assert!(matches!(
        BoolMask::from_vec(vec![true; 5], &[2, 3]),
        Err(AttnError::LengthMismatch {
            tensor: "bool_mask",
            ..
        })
    ));
    let mha = tiny_mha();
    let err = mha
        .forward(
            &MhaInput::self_attention(&[0.0; 7], 1, 2),
            &AttnOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(
        err,
        AttnError::LengthMismatch {
            tensor: "query",
            expected: 8,
            got: 7,
            ..
        }
    ));
}

#[test]
fn not_broadcastable_mask() {
    // [3, 4] would need seq_q = 3 (ok) … but [2, 4] does not match seq_q = 3.
    let mask = BoolMask::from_vec(vec![true; 8], &[2, 4]).unwrap();
    let err = fails_with(AttnOptions {
        bool_mask: Some(mask),
        ..AttnOptions::default()
    });
    assert_eq!(
        err,
        AttnError::NotBroadcastable {
            tensor: "bool_mask",
            got: vec![1, 1, 2, 4],
            target: vec![1, 2, 3, 4],
        }
    );
    let float = FloatMask::from_vec(vec![0.0; 3 * 3], &[3, 3]).unwrap();
    let err = fails_with(AttnOptions {
        float_mask: Some(float),
        ..AttnOptions::default()
    });
    assert!(
        err.to_string()
            .contains("does not broadcast to [1, 2, 3, 4]")
    );
}

#[test]
fn heads_not_divisible() {
    let sh = AttnShape {
        n_kv_heads: 2,
        ..AttnShape::new(1, 3, 1, 1, 1)
    };
    let err = AttnInput::new(&[0.0; 3], &[0.0; 2], &[0.0; 2], sh).unwrap_err();
    assert_eq!(
        err,
        AttnError::HeadsNotDivisible {
            n_heads: 3,
            n_kv_heads: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "n_heads (3) is not a multiple of n_kv_heads (2)"
    );
    for n_heads in [3, 0] {
        let zero = AttnShape {
            n_heads,
            n_kv_heads: 0,
            ..sh
        };
        let err = zero.validate().unwrap_err();
        assert_eq!(err, AttnError::NoKvHeads { n_heads });
        assert!(err.to_string().contains("need at least one head"), "{err}");
    }
}

#[test]
fn a_bias_of_the_wrong_length_is_named() {
    let err = Linear::new("out_proj.weight", vec![0.0; 4], 2, 2, Some(vec![0.0; 3])).unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::LengthMismatch {
                tensor: "out_proj.bias",
                ..
            }
        ),
        "{err}"
    );
    let err = Linear::new("q_proj_weight", vec![0.0; 4], 2, 2, Some(vec![0.0; 3])).unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::LengthMismatch {
                tensor: "in_proj_bias",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn embed_not_divisible_at_construction() {
    assert_eq!(
        MhaConfig::new(10, 3).unwrap_err(),
        AttnError::EmbedNotDivisible {
            embed_dim: 10,
            num_heads: 3
        }
    );
    // No heads, or no width, is said as such (it read "embed_dim (0) is not a multiple of
    // num_heads (0)").
    assert_eq!(
        MhaConfig::new(8, 0).unwrap_err().to_string(),
        "num_heads: must be at least 1"
    );
    assert_eq!(
        MhaConfig::new(0, 0).unwrap_err().to_string(),
        "embed_dim: must be at least 1"
    );
    assert_eq!(
        MhaConfig::new(10, 3).unwrap_err().to_string(),
        "embed_dim (10) is not a multiple of num_heads (3)"
    );
}

/// A 2-head module with embed_dim 4 and zero weights.
fn tiny_mha() -> MultiheadAttention {
    let state = tiny_state();
    MultiheadAttention::from_state_dict(MhaConfig::new(4, 2).unwrap(), &state).unwrap()
}

fn tiny_state() -> StateDict {
    [
        ("in_proj_weight", vec![12, 4]),
        ("in_proj_bias", vec![12]),
        ("out_proj.weight", vec![4, 4]),
        ("out_proj.bias", vec![4]),
    ]
    .into_iter()
    .map(|(name, dims)| {
        let n = dims.iter().product();
        (name.to_string(), (dims, vec![0.1; n]))
    })
    .collect()
}

/// NaN or ∞ parameters are refused when the module is built, naming the state dict's tensor
/// (they made every output NaN without a word), and a NaN input is reported in the caller's
/// tensor and layout, not in the projected queries'.
#[test]
fn non_finite_parameters_and_inputs_name_their_tensor() {
    let config = MhaConfig::new(4, 2).unwrap();
    for (name, at) in [
        ("in_proj_weight", 5),
        ("out_proj.bias", 3),
        ("in_proj_bias", 0),
    ] {
        for bad in [f32::NAN, f32::INFINITY] {
            let mut state = tiny_state();
            state.get_mut(name).unwrap().1[at] = bad;
            let err = MultiheadAttention::from_state_dict(config, &state).unwrap_err();
            assert!(
                matches!(err, AttnError::NonFinite { tensor, index, .. } if tensor == name && index == at),
                "{name}: {err}"
            );
        }
    }
    let mha = tiny_mha();
    let mut x = vec![0.5; 2 * 3 * 4];
    x[5] = f32::NAN;
    let query = MhaInput::self_attention(&x, 2, 3);
    let options = AttnOptions::default();
    let forward = mha.forward(&query, &options).map(|_| ());
    let backward = mha.backward(&query, &options, &[1.0; 24]).map(|_| ());
    for err in [forward.unwrap_err(), backward.unwrap_err()] {
        let named = matches!(err, AttnError::NonFinite { tensor, index, .. } if tensor == "query" && index == 5);
        assert!(named, "{err}");
    }
}

#[test]
fn missing_tensor_in_a_state_dict() {
    let config = MhaConfig::new(4, 2).unwrap();
    let mut state = tiny_state();
    state.remove("out_proj.weight");
    let err = MultiheadAttention::from_state_dict(config, &state).unwrap_err();
    assert_eq!(
        err,
        AttnError::MissingTensor {
            name: "out_proj.weight"
        }
    );
    // Neither the packed nor the separate projections.
    let mut state = tiny_state();
    state.remove("in_proj_weight");
    let err = MultiheadAttention::from_state_dict(config, &state).unwrap_err();
    assert_eq!(err.to_string(), "state dict: missing tensor q_proj_weight");
}

#[test]
fn unexpected_tensor_in_a_state_dict() {
    let config = MhaConfig::new(4, 2).unwrap();
    let mut state = tiny_state();
    state.insert("bias_k".to_string(), (vec![1, 1, 4], vec![0.0; 4]));
    let err = MultiheadAttention::from_state_dict(config, &state).unwrap_err();
    assert!(matches!(&err, AttnError::UnexpectedTensor { name, .. } if name == "bias_k"));
    assert!(err.to_string().contains("in_proj_weight"));
    // Packed and separate projections at once.
    let mut state = tiny_state();
    state.insert("q_proj_weight".to_string(), (vec![4, 4], vec![0.0; 16]));
    assert!(matches!(
        MultiheadAttention::from_state_dict(config, &state),
        Err(AttnError::UnexpectedTensor { .. })
    ));
}

#[test]
fn state_dict_tensor_of_the_wrong_shape() {
    let config = MhaConfig::new(4, 2).unwrap();
    let mut state = tiny_state();
    state.insert("in_proj_weight".to_string(), (vec![4, 12], vec![0.0; 48]));
    assert_eq!(
        MultiheadAttention::from_state_dict(config, &state).unwrap_err(),
        AttnError::ShapeMismatch {
            tensor: "in_proj_weight",
            expected: vec![12, 4],
            got: vec![4, 12],
        }
    );
    // A projection whose input width disagrees with kdim.
    let lin = |name, o, i| Linear::new(name, vec![0.0; o * i], o, i, None).unwrap();
    let err = MultiheadAttention::new(
        MhaConfig::with_kv_dims(4, 2, 3, 4).unwrap(),
        lin("q_proj_weight", 4, 4),
        lin("k_proj_weight", 4, 4),
        lin("v_proj_weight", 4, 4),
        lin("out_proj.weight", 4, 4),
    )
    .unwrap_err();
    assert_eq!(
        err,
        AttnError::ShapeMismatch {
            tensor: "k_proj_weight",
            expected: vec![4, 3],
            got: vec![4, 4],
        }
    );
}

#[test]
fn per_head_length_of_alibi() {
    let err = fails_with(AttnOptions {
        alibi: Some(vec![0.5; 3]),
        ..AttnOptions::default()
    });
    assert_eq!(
        err,
        AttnError::PerHeadLength {
            what: "alibi",
            expected: 2,
            got: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "alibi: expected 2 values (one per query head), got 3"
    );
}

#[test]
fn invalid_options() {
    let cases = [
        (
            "scale",
            AttnOptions {
                scale: Some(f32::NAN),
                ..AttnOptions::default()
            },
        ),
        (
            "softcap",
            AttnOptions {
                softcap: Some(0.0),
                ..AttnOptions::default()
            },
        ),
        (
            "dropout",
            AttnOptions {
                dropout: Some(Dropout { p: -0.5, seed: 0 }),
                ..AttnOptions::default()
            },
        ),
        (
            "align",
            AttnOptions {
                causal: Some(Causal::TopLeft),
                align: Some(Causal::BottomRight),
                ..AttnOptions::default()
            },
        ),
    ];
    for (option, options) in cases {
        let err = fails_with(options);
        assert!(
            matches!(err, AttnError::InvalidOption { option: o, .. } if o == option),
            "{option}: {err:?}"
        );
    }
    let conflict = AttnOptions {
        causal: Some(Causal::TopLeft),
        align: Some(Causal::BottomRight),
        ..AttnOptions::default()
    };
    assert_eq!(
        fails_with(conflict).to_string(),
        "align: is BottomRight but the causal mask is TopLeft, which places the \
         diagonal: give one alignment"
    );
    // The same alignment twice is one alignment.
    let (q, k, v) = data(shape());
    let input = AttnInput::new(&q, &k, &v, shape()).unwrap();
    let both = AttnOptions {
        causal: Some(Causal::BottomRight),
        align: Some(Causal::BottomRight),
        ..AttnOptions::default()
    };
    assert!(sdpa(&input, &both).is_ok() && sdpa_reference(&input, &both).is_ok());
    // A rank-5 mask is refused when it is built.
    let err = BoolMask::from_vec(vec![true; 4], &[1, 1, 1, 1, 4]).unwrap_err();
    assert!(matches!(
        err,
        AttnError::InvalidOption {
            option: "bool_mask",
            ..
        }
    ));
    assert!(err.to_string().contains("[1, 1, 1, 1, 4]"));
    assert!(matches!(
        MhaConfig::with_kv_dims(4, 2, 0, 4),
        Err(AttnError::InvalidOption { option: "kdim", .. })
    ));
    assert!(matches!(
        KeyPadding::from_lengths(&[5], 4),
        Err(AttnError::InvalidOption {
            option: "key_padding",
            ..
        })
    ));
}

#[test]
fn row_out_of_range() {
    let err = fails_with(AttnOptions {
        weights: WeightsRequest::Rows(vec![0, 3]),
        ..AttnOptions::default()
    });
    assert_eq!(err, AttnError::RowOutOfRange { row: 3, seq_q: 3 });
}

#[test]
fn non_finite_mask_and_slopes() {
    let nan_mask = FloatMask::from_vec(vec![0.0, f32::NAN, 0.0, 0.0], &[4]).unwrap();
    let err = fails_with(AttnOptions {
        float_mask: Some(nan_mask),
        ..AttnOptions::default()
    });
    assert!(matches!(
        err,
        AttnError::NonFinite {
            tensor: "float_mask",
            index: 1,
            ..
        }
    ));
    // +∞ would turn the softmax into ∞ − ∞ = NaN; −∞ is allowed (it hides the key).
    let inf_mask = FloatMask::from_vec(vec![0.0, 0.0, f32::INFINITY, 0.0], &[4]).unwrap();
    let err = fails_with(AttnOptions {
        float_mask: Some(inf_mask),
        ..AttnOptions::default()
    });
    assert!(matches!(
        err,
        AttnError::NonFinite {
            tensor: "float_mask",
            index: 2,
            ..
        }
    ));
    let err = fails_with(AttnOptions {
        alibi: Some(vec![0.5, f32::INFINITY]),
        ..AttnOptions::default()
    });
    assert!(matches!(
        err,
        AttnError::NonFinite {
            tensor: "alibi",
            index: 1,
            ..
        }
    ));
}

#[test]
fn too_large_weights_are_refused_before_allocating() {
    // 4 MiB of queries, keys and values whose weights would be 2²⁰ × 2²⁰ f32 = 4 TiB.
    let sh = AttnShape::new(1, 1, 1 << 20, 1 << 20, 1);
    let x = vec![0.0f32; 1 << 20];
    let input = AttnInput::new(&x, &x, &x, sh).unwrap();
    let options = AttnOptions {
        weights: WeightsRequest::All,
        ..AttnOptions::default()
    };
    for err in [
        sdpa_reference(&input, &options).unwrap_err(),
        sdpa(&input, &options).unwrap_err(),
    ] {
        assert!(matches!(err, AttnError::TooLarge { bytes, .. } if bytes == 4 << 40));
    }
    // A module whose projection weights could not even be counted.
    assert!(matches!(
        MhaConfig::new(1 << 40, 1),
        Err(AttnError::TooLarge {
            what: "the three input projections",
            ..
        })
    ));
    // Dims whose product overflows usize.
    let huge = AttnShape::new(usize::MAX, 2, 1, 1, 1);
    assert!(matches!(
        AttnInput::<f32>::new(&[], &[], &[], huge),
        Err(AttnError::TooLarge { .. })
    ));
}

/// Found by a hostile-input review of `attnscope sdpa`: with head_dim 0, q and k are empty, so a
/// case of a few hundred bytes could declare 2^20 rows and keys (2^40 steps, minutes) or 2^31
/// rows (48 GiB of the reference's per-row lists, then an abort); and 1 MiB of queries and
/// values could ask for terabytes of output. All refused before any work.
#[test]
fn shapes_the_inputs_do_not_bound_are_refused() {
    for (b, h, l, s) in [
        (1, 1, 1 << 20, 1 << 20),
        (1, 1, 1 << 31, 1),
        (1, 1, 1, 1 << 31),
        (1 << 15, 1 << 15, 1, 1),
    ] {
        let sh = AttnShape::new(b, h, l, s, 0);
        let err = AttnInput::<f32>::new(&[], &[], &[], sh).unwrap_err();
        assert!(
            matches!(&err, AttnError::EmptyHeadTooLarge { shape, .. } if shape == &[b, h, l, s]),
            "{err:?}"
        );
        assert!(err.to_string().contains("head_dim is 0"), "{err}");
        // A hand-built input is caught by the kernels' own validation.
        let input = AttnInput::<f32> {
            q: &[],
            k: &[],
            v: &[],
            shape: sh,
        };
        let options = AttnOptions {
            scale: Some(1.0),
            ..AttnOptions::default()
        };
        assert!(sdpa(&input, &options).is_err());
        assert!(sdpa_reference(&input, &options).is_err());
    }
    // The bound itself is allowed: 2^13 × 2^13 scores of nothing, uniform weights.
    let n = 1 << 13;
    let sh = AttnShape::new(1, 1, n, n, 0).with_value_dim(1);
    let v: Vec<f32> = (0..n).map(|j| j as f32).collect();
    let input = AttnInput::new(&[], &[], &v, sh).unwrap();
    let options = AttnOptions {
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    let out = sdpa(&input, &options).unwrap();
    let mean = (n - 1) as f32 / 2.0;
    assert!(
        out.out.iter().all(|&o| (o - mean).abs() <= 1e-3 * mean),
        "{:?}",
        &out.out[..4]
    );
    // 2^20 queries of one value each and one key whose value has 2^20 values: 8 MiB of input,
    // 4 TiB of output.
    let (l, dv) = (1 << 20, 1 << 20);
    let sh = AttnShape::new(1, 1, l, 1, 1).with_value_dim(dv);
    let (q, k, v) = (vec![0.0f32; l], vec![0.0f32; 1], vec![0.0f32; dv]);
    let err = AttnInput::new(&q, &k, &v, sh).unwrap_err();
    assert!(
        matches!(&err, AttnError::TooLarge { what: "the output", bytes, .. } if *bytes == 4 << 40),
        "{err:?}"
    );
    // An output past 8 GiB that is no larger than its inputs is the caller's to ask for (16
    // GiB of queries give 16 GiB of output); a little more output than input is not.
    let sh = AttnShape::new(16, 32, 1 << 16, 1 << 16, 128);
    assert_eq!(sh.validate(), Ok(()));
    let (l, dv) = (1 << 24, 200);
    let sh = AttnShape::new(1, 1, l, 1, dv - 1).with_value_dim(dv);
    let (out, inputs) = (4 * l * dv, 4 * (l * (dv - 1) + (dv - 1) + dv));
    assert!(out > 8 << 30 && out > inputs && out < inputs + inputs / 100);
    assert!(matches!(
        sh.validate(),
        Err(AttnError::TooLarge {
            what: "the output",
            ..
        })
    ));
    let sh = AttnShape::new(1, 1, l, 1, dv).with_value_dim(dv);
    assert_eq!(sh.validate(), Ok(()));
}

/// head_dim 0 with the default scale (1/√0 = ∞) made every score 0·∞ = NaN, which the call then
/// blamed on q·k overflowing; it is refused naming the scale, and a given scale still works
/// (uniform weights over the keys).
#[test]
fn a_head_dim_of_0_needs_a_scale() {
    let sh = AttnShape::new(1, 1, 4, 4, 0);
    let v: Vec<f32> = (0..32).map(|x| x as f32).collect();
    let sh = AttnShape { value_dim: 8, ..sh };
    let input = AttnInput::new(&[], &[], &v, sh).unwrap();
    for err in [
        sdpa_reference(&input, &AttnOptions::default()).unwrap_err(),
        sdpa(&input, &AttnOptions::default()).unwrap_err(),
    ] {
        assert!(
            matches!(
                err,
                AttnError::InvalidOption {
                    option: "scale",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("head_dim 0"), "{err}");
    }
    let given = AttnOptions {
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    let out = sdpa(&input, &given).unwrap();
    // Each output row is the mean of the 4 value rows: 12 + c at column c.
    assert_eq!(
        &out.out[..8],
        &[12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    );
}

/// `MhaConfig`'s fields are public: a struct literal of no heads (or a `kdim` of 0) skipped
/// `with_kv_dims`, was accepted, and `forward` panicked dividing by 0 (or slicing an empty
/// projection). Both constructors check the config again.
#[test]
fn a_config_built_by_hand_is_checked_by_the_module() {
    let lin = |name, o, i| Linear::new(name, vec![0.1; o * i], o, i, None).unwrap();
    let state = tiny_state();
    for (config, want) in [
        (
            MhaConfig {
                embed_dim: 4,
                num_heads: 0,
                kdim: 4,
                vdim: 4,
            },
            "num_heads: must be at least 1",
        ),
        (
            MhaConfig {
                embed_dim: 4,
                num_heads: 2,
                kdim: 0,
                vdim: 4,
            },
            "kdim",
        ),
    ] {
        let err = MultiheadAttention::new(
            config,
            lin("q_proj_weight", 4, 4),
            lin("k_proj_weight", 4, config.kdim),
            lin("v_proj_weight", 4, 4),
            lin("out_proj.weight", 4, 4),
        )
        .unwrap_err();
        assert!(err.to_string().contains(want), "{err}");
        let err = MultiheadAttention::from_state_dict(config, &state).unwrap_err();
        assert!(err.to_string().contains(want), "{err}");
    }
    let no_heads = MhaConfig {
        embed_dim: 4,
        num_heads: 0,
        kdim: 4,
        vdim: 4,
    };
    assert_eq!(no_heads.head_dim(), 0);
}

/// One query against four keys of values near 1 (d 2): a `dout` of 2e38 makes
/// `dP = dout·vᵀ` pass f32's range (about 4e38) although every gradient, computed in f64, is
/// finite (|dq| below 3e34). Both backward paths returned NaN for `dq` and `dk`.
#[test]
fn a_gradient_that_overflows_is_refused_naming_it() {
    let sh = AttnShape::new(1, 1, 1, 4, 2);
    let (q, k) = (
        vec![0.5, -0.3],
        vec![0.1, 0.2, -0.4, 0.3, 0.6, -0.1, 0.0, 0.5],
    );
    let v = vec![1.0, 1.001, 0.999, 1.0, 1.002, 0.998, 1.0005, 1.0];
    let input = AttnInput::new(&q, &k, &v, sh).unwrap();
    let options = AttnOptions::default();
    let fwd = sdpa(&input, &options).unwrap();
    let dout = vec![2e38f32; 2];
    for (path, err) in [
        (
            "fast",
            sdpa_backward(&input, &options, &fwd, &dout).unwrap_err(),
        ),
        (
            "reference",
            sdpa_backward_reference(&input, &options, &dout).unwrap_err(),
        ),
    ] {
        assert!(
            matches!(err, AttnError::GradientOverflow { tensor: "dq", .. }),
            "{path}: {err:?}"
        );
        assert!(err.to_string().contains("scale dout"), "{path}: {err}");
    }
    // Half that dout gives finite gradients.
    let half = vec![1e38f32; 2];
    let g = sdpa_backward(&input, &options, &fwd, &half).unwrap();
    assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|x| x.is_finite()));
}

/// Overflows in the second sequence of a packed batch are named at their packed index: each
/// sequence's own call indexes `[heads, seq, width]`, the packed gradients `[tokens, heads,
/// width]`. Sequence 1 holds queries 2..5 and keys 3..7, so its query 1 of head 1 is packed row
/// `(3 + 1)·2 + 1` and its key 2 of key/value head 1 row `(3 + 2)·2 + 1` (neither its own
/// index nor one shifted by the sequence's start).
#[test]
fn a_packed_gradient_overflow_names_the_packed_index() {
    let dims = PackedDims {
        n_heads: 2,
        n_kv_heads: 2,
        head_dim: 2,
        value_dim: 3,
    };
    let (cu_q, cu_kv) = ([0, 2, 5], [0, 3, 7]);
    let q: Vec<f32> = (0..5 * 2 * 2).map(|i| 0.1 * (i % 5) as f32 - 0.2).collect();
    let mut k: Vec<f32> = (0..7 * 2 * 2).map(|i| 0.1 * (i % 7) as f32 - 0.3).collect();
    let v: Vec<f32> = (0..7 * 2 * 3)
        .map(|i| 1e-3 * (1.0 + 0.01 * i as f32))
        .collect();
    let options = AttnOptions::default();
    let run = |q: &[f32], k: &[f32], v: &[f32], dout: &[f32]| {
        let input = PackedInput::new(q, k, v, &cu_q, &cu_kv, dims).unwrap();
        let fwd = sdpa_varlen(&input, &options).unwrap();
        match sdpa_varlen_backward(&input, &options, &fwd, dout).unwrap_err() {
            AttnError::GradientOverflow { tensor, index } => (tensor, index),
            err => panic!("{err:?}"),
        }
    };
    // dq: query token 3 (sequence 1's query 1), head 1, with a dout of 3e38 against values
    // near 1: dP = dout·v passes f32's range.
    let mut dout = vec![1.0f32; 5 * 2 * 3];
    dout[(3 * 2 + 1) * 3..][..3].fill(3e38);
    let v_one: Vec<f32> = v.iter().map(|x| x * 1e3).collect();
    assert_eq!(run(&q, &k, &v_one, &dout), ("dq", (3 * 2 + 1) * 2), "dq");
    // dv: sequence 1's key 2 of key/value head 1 takes all the weight of head 1's three
    // queries, whose dout is 2e38 in column 1: dv sums them past f32's range, and nothing
    // else overflows (dP = dout·v is 2e35).
    let mut q = q.clone();
    for t in 2..5 {
        q[(t * 2 + 1) * 2..][..2].fill(1.0);
    }
    for t in 3..7 {
        k[(t * 2 + 1) * 2..][..2].fill(if t == 5 { 60.0 } else { 0.0 });
    }
    let mut dout = vec![1.0f32; 5 * 2 * 3];
    for t in 2..5 {
        dout[(t * 2 + 1) * 3 + 1] = 2e38;
    }
    assert_eq!(run(&q, &k, &v, &dout), ("dv", (5 * 2 + 1) * 3 + 1), "dv");
}

/// A call of 2^40 heads without a query or a key has nothing to compute: the reference looped
/// over every head and was still running after a minute. Run on a thread so that a regression
/// fails instead of hanging.
#[test]
fn a_call_without_rows_returns_at_once_whatever_its_head_count() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let sh = AttnShape::new(1, 1 << 40, 0, 0, 8);
        let input = AttnInput::<f32>::new(&[], &[], &[], sh).unwrap();
        let fwd = sdpa_reference(&input, &AttnOptions::default()).unwrap();
        let grads = sdpa_backward_reference(&input, &AttnOptions::default(), &[]).unwrap();
        tx.send((fwd.out.len(), grads.dq.len())).unwrap();
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(60));
    assert_eq!(got, Ok((0, 0)), "no answer within 60 s");
}

/// A tensor of the wrong rank is said as such (it read "expected shape [0, 0, 0, 0]").
#[test]
fn from_dims_names_a_tensor_of_the_wrong_rank() {
    let err = AttnInput::from_dims(
        (&[0.0; 6], &[2, 3]),
        (&[0.0; 6], &[1, 1, 3, 2]),
        (&[0.0; 6], &[1, 1, 3, 2]),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "q: expected 4 dims, got shape [2, 3]");
}

/// A count past `usize` is said as such, not as 2^128 - 1 bytes of f32 values (the key
/// padding is bools).
#[test]
fn a_shape_too_large_to_count_is_said_as_such() {
    let err = KeyPadding::from_vec(vec![], usize::MAX, 2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "key_padding: shape [18446744073709551615, 2] has more elements than can be counted"
    );
}

/// Key 7 of a batch of sequences of 5 keys is out of range, and so is sequence 2 of 2, each
/// said as such: key 7 of sequence 0 had read sequence 1's key 2, and only past the last
/// sequence did it panic (with any slice's message).
#[test]
fn key_padding_past_a_sequence_panics() {
    let padding = KeyPadding::from_lengths(&[5, 2], 5).unwrap();
    let message = |(b, j): (usize, usize)| {
        let panic = std::panic::catch_unwind(|| padding.is_real(b, j)).unwrap_err();
        panic.downcast::<String>().map(|s| *s).unwrap_or_default()
    };
    assert_eq!(message((0, 7)), "key 7 past a sequence of 5 keys");
    assert_eq!(message((1, 5)), "key 5 past a sequence of 5 keys");
    assert_eq!(message((2, 0)), "sequence 2 past a batch of 2");
    assert!(padding.is_real(1, 1) && !padding.is_real(1, 2));
}

/// A mask's index past a dim of its own panics, saying so; a dim of 1 repeats. On a mask of
/// two sequences, key 2 of query 0 read query 1's key 0, and query 2 read the next sequence.
#[test]
fn mask_indices_repeat_dims_of_1_and_stop_at_the_others() {
    let mask = BoolMask::from_vec(
        vec![true, false, true, true, false, false, false, true],
        &[2, 1, 2, 2],
    )
    .unwrap();
    assert!(!mask.at(0, 7, 0, 1) && mask.at(0, 3, 1, 1) && mask.at(1, 0, 1, 1));
    let message = |index: [usize; 4]| {
        let [b, h, i, j] = index;
        let panic = std::panic::catch_unwind(|| mask.at(b, h, i, j)).unwrap_err();
        panic.downcast::<String>().map(|s| *s).unwrap_or_default()
    };
    assert_eq!(message([0, 0, 0, 2]), "key 2 past a mask dim of 2");
    assert_eq!(message([0, 0, 2, 0]), "index 2 past a mask dim of 2");
    assert_eq!(message([2, 0, 0, 0]), "index 2 past a mask dim of 2");
}
