//! Properties of attention that hold for every input, checked with proptest on both the
//! reference twin ([`sdpa_reference`]) and the fast path ([`sdpa`]), plus the numerics of
//! extreme inputs: huge and subnormal logits, and NaN or infinity in the inputs (refused by
//! [`AttnInput::new`], propagated only where they reach with [`AttnInput::allowing_non_finite`]).
//!
//! Visibility is recomputed here from the rules of `tests/data/README.md` (step 5), not taken
//! from the crate, so the mask properties test the kernels' masking against an independent oracle.

use attn_core::bf16;
use attn_core::{
    AttnError, AttnInput, AttnOptions, AttnOutput, AttnShape, BoolMask, Causal, FloatMask,
    KeyPadding, Weights, WeightsRequest, Window, sdpa, sdpa_reference,
};
use proptest::prelude::*;

/// Query, key and value data of one call.
type Qkv = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Which output rows (head-major) a poisoned input reaches.
type Reached<'a> = dyn Fn(usize) -> bool + 'a;

type Kernel = fn(&AttnInput<'_>, &AttnOptions) -> Result<AttnOutput, AttnError>;

const KERNELS: [(&str, Kernel); 2] = [("reference", sdpa_reference), ("fused", sdpa)];

/// One attention call: inputs and the masks that hide keys.
#[derive(Debug, Clone)]
struct Case {
    shape: AttnShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    causal: Option<Causal>,
    window: Option<Window>,
    /// Full `[batch, n_heads, seq_q, seq_kv]`, `true` = may attend.
    bool_mask: Option<Vec<bool>>,
    /// `[batch, seq_kv]`, `true` = a real key.
    padding: Option<Vec<bool>>,
}

impl Case {
    fn options(&self, weights: WeightsRequest) -> AttnOptions {
        let sh = &self.shape;
        AttnOptions {
            causal: self.causal,
            window: self.window,
            bool_mask: self
                .bool_mask
                .as_ref()
                .map(|m| BoolMask::from_vec(m.clone(), &sh.score_dims()).expect("full-shape mask")),
            key_padding: self.padding.as_ref().map(|p| {
                KeyPadding::from_vec(p.clone(), sh.batch, sh.seq_kv).expect("[batch, seq_kv]")
            }),
            weights,
            ..AttnOptions::default()
        }
    }

    fn run(&self, kernel: Kernel, scale: Option<f32>) -> AttnOutput {
        let input = AttnInput::new(&self.q, &self.k, &self.v, self.shape).expect("valid input");
        let options = AttnOptions {
            scale,
            ..self.options(WeightsRequest::All)
        };
        kernel(&input, &options).expect("valid call")
    }

    /// Whether query `i` of batch `b`, head `h` may see key `j` (README step 5).
    fn visible(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let sh = &self.shape;
        let o = match self.causal {
            Some(Causal::BottomRight) => sh.seq_kv as i64 - sh.seq_q as i64,
            _ => 0,
        };
        let (diag, j64) = (i as i64 + o, j as i64);
        self.causal.is_none_or(|_| j64 <= diag)
            && self.window.is_none_or(|w| {
                w.left.is_none_or(|l| j64 >= diag - l as i64)
                    && w.right.is_none_or(|r| j64 <= diag + r as i64)
            })
            && self
                .bool_mask
                .as_ref()
                .is_none_or(|m| m[((b * sh.n_heads + h) * sh.seq_q + i) * sh.seq_kv + j])
            && self.padding.as_ref().is_none_or(|p| p[b * sh.seq_kv + j])
    }

    /// Every `(b, h, i)` query row with its flat row index.
    fn rows(&self) -> impl Iterator<Item = (usize, usize, usize, usize)> + use<> {
        let sh = self.shape;
        (0..sh.batch).flat_map(move |b| {
            (0..sh.n_heads).flat_map(move |h| {
                (0..sh.seq_q).map(move |i| (b, h, i, (b * sh.n_heads + h) * sh.seq_q + i))
            })
        })
    }
}

fn all_weights(out: &AttnOutput) -> &[f32] {
    match &out.weights {
        Some(Weights::All { data: w, .. }) => w,
        other => panic!("asked for all weights, got {other:?}"),
    }
}

/// Dims: batch, n_kv_heads, group, seq_q, seq_kv, head_dim, value_dim.
fn dims() -> impl Strategy<Value = AttnShape> {
    (
        1..=2usize,
        1..=2usize,
        1..=3usize,
        1..=6usize,
        1..=9usize,
        1..=9usize,
        1..=5usize,
    )
        .prop_map(
            |(batch, n_kv_heads, group, seq_q, seq_kv, head_dim, value_dim)| AttnShape {
                batch,
                n_heads: n_kv_heads * group,
                n_kv_heads,
                seq_q,
                seq_kv,
                head_dim,
                value_dim,
            },
        )
}

/// A case on `shape` whose values come from `value`; masks are drawn independently.
fn case_with(shape: AttnShape, value: BoxedStrategy<f32>) -> impl Strategy<Value = Case> {
    let n = |dims: &[usize]| dims.iter().product::<usize>();
    let causal = prop_oneof![
        Just(None),
        Just(Some(Causal::TopLeft)),
        Just(Some(Causal::BottomRight))
    ];
    let window = proptest::option::of(
        (
            proptest::option::of(0..4usize),
            proptest::option::of(0..4usize),
        )
            .prop_map(|(left, right)| Window { left, right }),
    );
    (
        proptest::collection::vec(value.clone(), n(&shape.q_dims())),
        proptest::collection::vec(value.clone(), n(&shape.k_dims())),
        proptest::collection::vec(value, n(&shape.v_dims())),
        causal,
        window,
        proptest::option::of(proptest::collection::vec(
            proptest::bool::weighted(0.7),
            n(&shape.score_dims()),
        )),
        proptest::option::of(proptest::collection::vec(
            proptest::bool::weighted(0.8),
            shape.batch * shape.seq_kv,
        )),
    )
        .prop_map(move |(q, k, v, causal, window, bool_mask, padding)| Case {
            shape,
            q,
            k,
            v,
            causal,
            window,
            bool_mask,
            padding,
        })
}

fn case() -> impl Strategy<Value = Case> {
    dims().prop_flat_map(|shape| case_with(shape, (-3.0f32..3.0).boxed()))
}

/// Small integers: every `q·k` is exact in f32, so ties and gaps are known exactly.
fn integer_case() -> impl Strategy<Value = Case> {
    dims().prop_flat_map(|shape| case_with(shape, (-3i8..=3).prop_map(f32::from).boxed()))
}

/// `|a − b| ≤ tol · max(1, |b|)`, elementwise, reporting the worst place.
fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| (i, (g - w).abs() / w.abs().max(1.0)))
        .fold((0, 0.0f32), |a, b| if b.1 > a.1 { b } else { a });
    assert!(
        worst.1 <= tol,
        "{what}: max error {} at {} (got {}, want {})",
        worst.1,
        worst.0,
        got[worst.0],
        want[worst.0]
    );
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

proptest! {
    // No regression file: tests write nothing into the source tree.
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Rows of weights sum to 1, or are all 0 (output 0, lse −∞) for a row that sees nothing;
    /// a masked weight is exactly 0.
    #[test]
    fn rows_sum_to_one_and_masked_weights_are_zero(c in case()) {
        let (s, dv) = (c.shape.seq_kv, c.shape.value_dim);
        for (name, kernel) in KERNELS {
            let out = c.run(kernel, None);
            let w = all_weights(&out);
            for (b, h, i, row) in c.rows() {
                let w_row = &w[row * s..][..s];
                let seen = (0..s).filter(|&j| c.visible(b, h, i, j)).count();
                for (j, &x) in w_row.iter().enumerate() {
                    if !c.visible(b, h, i, j) {
                        prop_assert_eq!(x, 0.0, "{}: masked weight ({}, {}, {}, {})", name, b, h, i, j);
                    }
                }
                if seen == 0 {
                    prop_assert!(w_row.iter().all(|&x| x == 0.0), "{}: row {} sees nothing", name, row);
                    prop_assert!(out.out[row * dv..][..dv].iter().all(|&x| x == 0.0));
                    prop_assert_eq!(out.lse[row], f32::NEG_INFINITY);
                } else {
                    let sum: f32 = w_row.iter().sum();
                    prop_assert!((sum - 1.0).abs() <= 1e-5, "{}: row {} sums to {}", name, row, sum);
                }
            }
        }
    }

    /// Changing a key and value that a row cannot see leaves that row bit-identical.
    #[test]
    fn unseen_keys_do_not_touch_a_row(
        c in case(),
        pick in any::<prop::sample::Index>(),
        garbage in -1e3f32..1e3,
    ) {
        let sh = c.shape;
        let j = pick.index(sh.seq_kv);
        let mut changed = c.clone();
        for bh in 0..sh.batch * sh.n_kv_heads {
            let base = bh * sh.seq_kv + j;
            changed.k[base * sh.head_dim..][..sh.head_dim].fill(garbage);
            changed.v[base * sh.value_dim..][..sh.value_dim].fill(-garbage);
        }
        for (name, kernel) in KERNELS {
            let (before, after) = (c.run(kernel, None), changed.run(kernel, None));
            let dv = sh.value_dim;
            for (b, h, i, row) in c.rows().filter(|&(b, h, i, _)| !c.visible(b, h, i, j)) {
                prop_assert_eq!(
                    bits(&before.out[row * dv..][..dv]),
                    bits(&after.out[row * dv..][..dv]),
                    "{}: row ({}, {}, {}) moved when unseen key {} changed", name, b, h, i, j
                );
                prop_assert_eq!(before.lse[row].to_bits(), after.lse[row].to_bits());
            }
        }
    }

    /// With a causal mask, the outputs at query rows ≤ p do not change when later queries and
    /// the keys and values after p (aligned: after p + o) change.
    #[test]
    fn causal_rows_ignore_later_tokens(
        c in case(),
        bottom_right in any::<bool>(),
        pick in any::<prop::sample::Index>(),
        seed in -3.0f32..3.0,
    ) {
        let mut c = c;
        c.causal = Some(if bottom_right { Causal::BottomRight } else { Causal::TopLeft });
        let sh = c.shape;
        let p = pick.index(sh.seq_q);
        let o = if bottom_right { sh.seq_kv as i64 - sh.seq_q as i64 } else { 0 };
        let first_later_key = (p as i64 + o + 1).clamp(0, sh.seq_kv as i64) as usize;
        let mut changed = c.clone();
        let mut x = seed;
        let mut next = || {
            x = (x * 1.7 + 0.3).sin() * 3.0;
            x
        };
        for bh in 0..sh.batch * sh.n_heads {
            for i in p + 1..sh.seq_q {
                changed.q[(bh * sh.seq_q + i) * sh.head_dim..][..sh.head_dim].fill_with(&mut next);
            }
        }
        for bh in 0..sh.batch * sh.n_kv_heads {
            for j in first_later_key..sh.seq_kv {
                let base = bh * sh.seq_kv + j;
                changed.k[base * sh.head_dim..][..sh.head_dim].fill_with(&mut next);
                changed.v[base * sh.value_dim..][..sh.value_dim].fill_with(&mut next);
            }
        }
        for (name, kernel) in KERNELS {
            let (before, after) = (c.run(kernel, None), changed.run(kernel, None));
            let dv = sh.value_dim;
            for (_, _, i, row) in c.rows().filter(|&(_, _, i, _)| i <= p) {
                prop_assert_eq!(
                    bits(&before.out[row * dv..][..dv]),
                    bits(&after.out[row * dv..][..dv]),
                    "{}: causal row {} changed with tokens after {}", name, i, p
                );
            }
        }
    }

    /// Permuting keys and values together (and the masks' key axis with them) permutes the
    /// weights the same way and leaves the output unchanged up to rounding.
    #[test]
    fn permuting_keys_and_values_together_changes_nothing(
        c in case(),
        perm_seed in proptest::collection::vec(any::<u32>(), 9),
    ) {
        let mut c = c;
        (c.causal, c.window) = (None, None);
        let sh = c.shape;
        let s = sh.seq_kv;
        // perm[new] = old: sort the keys by a random label.
        let mut perm: Vec<usize> = (0..s).collect();
        perm.sort_by_key(|&j| (perm_seed[j], j));
        let mut p = c.clone();
        for bh in 0..sh.batch * sh.n_kv_heads {
            for (new, &old) in perm.iter().enumerate() {
                let (dst, src) = (bh * s + new, bh * s + old);
                p.k[dst * sh.head_dim..][..sh.head_dim]
                    .copy_from_slice(&c.k[src * sh.head_dim..][..sh.head_dim]);
                p.v[dst * sh.value_dim..][..sh.value_dim]
                    .copy_from_slice(&c.v[src * sh.value_dim..][..sh.value_dim]);
            }
        }
        let permute_rows = |m: &Vec<bool>| -> Vec<bool> {
            m.chunks(s).flat_map(|row| perm.iter().map(|&old| row[old])).collect()
        };
        p.bool_mask = c.bool_mask.as_ref().map(permute_rows);
        p.padding = c.padding.as_ref().map(permute_rows);
        for (name, kernel) in KERNELS {
            let (before, after) = (c.run(kernel, None), p.run(kernel, None));
            assert_close(&format!("{name} out"), &after.out, &before.out, 1e-5);
            assert_close(&format!("{name} lse"), &after.lse, &before.lse, 1e-5);
            let want: Vec<f32> = all_weights(&before)
                .chunks(s)
                .flat_map(|row| perm.iter().map(|&old| row[old]))
                .collect();
            assert_close(&format!("{name} weights"), all_weights(&after), &want, 1e-5);
        }
    }

    /// The temperature limits of the softmax: a huge scale puts all weight on the arg-max
    /// (split evenly between exact ties), a zero scale spreads it evenly over the visible keys.
    /// Scores are small integers, so ties are exact and a gap is at least 1: at scale 200 a
    /// losing key weighs at most e^-200, which is 0 in f32. The fused kernel's base-2 exponent
    /// rounds a score s to about |s|·2⁻²⁴ (see [`check_logits`]); scores here reach 200·81.
    #[test]
    fn temperature_limits_give_argmax_and_uniform(c in integer_case()) {
        let sh = c.shape;
        let (s, d) = (sh.seq_kv, sh.head_dim);
        for (name, kernel) in KERNELS {
            let tol = if name == "fused" { 200.0 * 81.0 * 2f32.powi(-22) } else { 1e-6 };
            let (hot, cold) = (c.run(kernel, Some(200.0)), c.run(kernel, Some(0.0)));
            let (hot_w, cold_w) = (all_weights(&hot), all_weights(&cold));
            for (b, h, i, row) in c.rows() {
                let vis: Vec<usize> = (0..s).filter(|&j| c.visible(b, h, i, j)).collect();
                if vis.is_empty() {
                    continue;
                }
                let q = &c.q[row * d..][..d];
                let kv = (b * sh.n_kv_heads + sh.kv_head(h)) * s;
                let score = |j: usize| -> f32 {
                    q.iter().zip(&c.k[(kv + j) * d..][..d]).map(|(a, b)| a * b).sum()
                };
                let max = vis.iter().map(|&j| score(j)).fold(f32::NEG_INFINITY, f32::max);
                let ties = vis.iter().filter(|&&j| score(j) == max).count();
                for j in 0..s {
                    let hot_want = if vis.contains(&j) && score(j) == max { 1.0 / ties as f32 } else { 0.0 };
                    let cold_want = if vis.contains(&j) { 1.0 / vis.len() as f32 } else { 0.0 };
                    let (hot_got, cold_got) = (hot_w[row * s + j], cold_w[row * s + j]);
                    prop_assert!((hot_got - hot_want).abs() <= tol,
                        "{}: scale 200, row {} key {}: {} vs {}", name, row, j, hot_got, hot_want);
                    prop_assert!((cold_got - cold_want).abs() <= 1e-6,
                        "{}: scale 0, row {} key {}: {} vs {}", name, row, j, cold_got, cold_want);
                }
            }
        }
    }

    /// Grouped-query attention equals plain multi-head attention on keys and values repeated
    /// per query head (PyTorch's `repeat_interleave` order: query head h reads kv head h / group).
    #[test]
    fn gqa_equals_mha_on_repeated_heads(c in case()) {
        let sh = c.shape;
        let group = sh.group_size();
        let mut plain = c.clone();
        plain.shape.n_kv_heads = sh.n_heads;
        let repeat = |x: &[f32], per_head: usize| -> Vec<f32> {
            x.chunks(per_head)
                .flat_map(|head| std::iter::repeat_n(head, group).flatten().copied())
                .collect()
        };
        plain.k = repeat(&c.k, sh.seq_kv * sh.head_dim);
        plain.v = repeat(&c.v, sh.seq_kv * sh.value_dim);
        for (name, kernel) in KERNELS {
            let (gqa, mha) = (c.run(kernel, None), plain.run(kernel, None));
            assert_close(&format!("{name} out"), &gqa.out, &mha.out, 1e-6);
            assert_close(&format!("{name} lse"), &gqa.lse, &mha.lse, 1e-6);
            assert_close(&format!("{name} weights"), all_weights(&gqa), all_weights(&mha), 1e-6);
        }
    }
}

/// One head whose scores are exactly `logits`: q rows are the unit vector e₀ and key j is
/// `logits[j]·e₀` (the other components 0), scale 1. Values are `v[j] = [j, −j]`.
/// Returns the f64 softmax of the logits as the expectation: weights, output and lse.
fn logit_case(logits: &[f32], head_dim: usize, seq_q: usize) -> (Case, Vec<f64>, [f64; 2], f64) {
    let s = logits.len();
    let mut q = vec![0.0; seq_q * head_dim];
    q.chunks_mut(head_dim).for_each(|row| row[0] = 1.0);
    let mut k = vec![0.0; s * head_dim];
    k.chunks_mut(head_dim)
        .zip(logits)
        .for_each(|(row, &l)| row[0] = l);
    let v: Vec<f32> = (0..s).flat_map(|j| [j as f32, -(j as f32)]).collect();
    let shape = AttnShape {
        value_dim: 2,
        ..AttnShape::new(1, 1, seq_q, s, head_dim)
    };
    let max = logits
        .iter()
        .map(|&l| f64::from(l))
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    let w: Vec<f64> = e.iter().map(|x| x / sum).collect();
    let mean = w.iter().enumerate().map(|(j, x)| x * j as f64).sum::<f64>();
    let case = Case {
        shape,
        q,
        k,
        v,
        causal: None,
        window: None,
        bool_mask: None,
        padding: None,
    };
    (case, w, [mean, -mean], max + sum.ln())
}

/// Checks both kernels against the f64 softmax of `logits`. The fused kernel folds
/// `scale·log2(e)` into q and exponentiates in base 2, so a score of magnitude |s| carries an
/// error of about |s|·2⁻²⁴ in its exponent: it gets `fused_tol` (the golden README's `hugelogits`
/// cases use 1e-3 for scores near 1e4 for the same reason), the reference 1e-5.
fn check_logits(what: &str, logits: &[f32], fused_tol: f32) {
    // head_dim 1 and 16, one and several query rows: the scalar and the tiled paths.
    for (head_dim, seq_q) in [(1, 1), (16, 7)] {
        let (c, w, out, lse) = logit_case(logits, head_dim, seq_q);
        let as_f32 = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
        for (name, kernel) in KERNELS {
            let tol = if name == "fused" { fused_tol } else { 1e-5 };
            let got = c.run(kernel, Some(1.0));
            let label = format!("{what}, {name}, head_dim {head_dim}");
            assert!(
                got.out.iter().chain(&got.lse).all(|x| x.is_finite()),
                "{label}: not finite"
            );
            for row in 0..seq_q {
                let s = logits.len();
                assert_close(&label, &all_weights(&got)[row * s..][..s], &as_f32(&w), tol);
                assert_close(&label, &got.out[row * 2..][..2], &as_f32(&out), tol);
                assert_close(&label, &got.lse[row..][..1], &[lse as f32], 1e-6);
            }
        }
    }
}

/// Cycles `pattern` to `n` logits.
fn cycle(pattern: &[f32], n: usize) -> Vec<f32> {
    pattern.iter().copied().cycle().take(n).collect()
}

#[test]
fn logits_near_1e4_match_the_f64_softmax() {
    // Hand check of the pattern's first three keys alone: scores 1e4, 9999, −1e4 give weights
    // 1/(1 + e^−1) = 0.7310586, e^−1/(1 + e^−1) = 0.2689414, e^−2e4 = 0, and lse
    // 1e4 + ln(1 + e^−1) = 10000.313.
    let (c, ..) = logit_case(&[1e4, 9999.0, -1e4], 1, 1);
    for (name, kernel) in KERNELS {
        let tol = if name == "fused" { 1e-3 } else { 1e-6 };
        let got = c.run(kernel, Some(1.0));
        assert_close(
            name,
            all_weights(&got),
            &[0.731_058_6, 0.268_941_4, 0.0],
            tol,
        );
        assert_close(name, &got.lse, &[10_000.313], 1e-6);
    }
    check_logits(
        "±1e4",
        &cycle(&[1e4, 9999.0, -1e4, 9999.5, -9999.0], 37),
        1e-3,
    );
}

#[test]
fn logits_near_the_f32_limit_stay_finite() {
    // Gaps between distinct logits here are ≥ 1e36: the weights are exact ties or exact zeros.
    check_logits("±3e38", &cycle(&[3e38, -3e38, 3e38, 2.9e38], 37), 1e-5);
    check_logits("−3e38 only", &cycle(&[-3e38, -3e38, -2.99e38], 37), 1e-5);
    check_logits("f32::MAX", &cycle(&[f32::MAX, -f32::MAX, 3e38], 19), 1e-5);
}

#[test]
fn subnormal_logits_and_values_give_finite_right_results() {
    let tiny = f32::MIN_POSITIVE / 8.0;
    assert!(tiny.is_subnormal());
    check_logits(
        "subnormal logits",
        &cycle(&[tiny, -tiny, 3.0 * tiny, 0.0], 37),
        1e-5,
    );
    // Subnormal queries, keys and values: every score rounds to 0, so the weights are uniform
    // and the output is the mean of the values, itself subnormal.
    let shape = AttnShape::new(1, 2, 5, 33, 16);
    let q = vec![tiny; 2 * 5 * 16];
    let k = vec![-tiny; 2 * 33 * 16];
    let v: Vec<f32> = (0..2 * 33 * 16).map(|x| tiny * (x % 3) as f32).collect();
    let input = AttnInput::new(&q, &k, &v, shape).unwrap();
    let options = AttnOptions {
        weights: WeightsRequest::All,
        ..AttnOptions::default()
    };
    for (name, kernel) in KERNELS {
        let got = kernel(&input, &options).unwrap();
        let w = match &got.weights {
            Some(Weights::All { data: w, .. }) => w.clone(),
            _ => unreachable!("asked for all weights"),
        };
        assert_close(name, &w, &vec![1.0 / 33.0; w.len()], 1e-6);
        assert!(
            got.out
                .iter()
                .all(|x| x.is_finite() && *x >= 0.0 && *x <= tiny * 2.0)
        );
    }
}

#[test]
fn non_finite_inputs_are_refused_naming_the_tensor() {
    let shape = AttnShape::new(1, 1, 2, 3, 2);
    let ok = |n: usize| vec![0.5f32; n];
    let with = |n: usize, at: usize, x: f32| {
        let mut v = ok(n);
        v[at] = x;
        v
    };
    let (q, k, v) = (ok(4), ok(6), ok(6));
    // (tensor, its bad index, the bad value, q, k, v); the last has two bad tensors: q is
    // checked first.
    let cases: [(&str, usize, f32, Qkv); 4] = [
        (
            "q",
            3,
            f32::NAN,
            (with(4, 3, f32::NAN), k.clone(), v.clone()),
        ),
        (
            "k",
            1,
            f32::INFINITY,
            (q.clone(), with(6, 1, f32::INFINITY), v.clone()),
        ),
        (
            "v",
            5,
            f32::NEG_INFINITY,
            (q.clone(), k.clone(), with(6, 5, f32::NEG_INFINITY)),
        ),
        (
            "q",
            0,
            f32::NEG_INFINITY,
            (
                with(4, 0, f32::NEG_INFINITY),
                with(6, 0, f32::NAN),
                v.clone(),
            ),
        ),
    ];
    for (tensor, index, value, (q, k, v)) in cases {
        let err = AttnInput::new(&q, &k, &v, shape).unwrap_err();
        match err {
            AttnError::NonFinite {
                tensor: t,
                index: i,
                value: x,
            } => {
                assert_eq!((t, i), (tensor, index));
                assert_eq!(x.to_bits(), value.to_bits());
            }
            other => panic!("expected NonFinite for {tensor}, got {other:?}"),
        }
        assert!(err_message(&q, &k, &v, shape).contains(tensor));
        // The opt-out accepts the same tensors.
        AttnInput::allowing_non_finite(&q, &k, &v, shape).unwrap();
    }
    // Built from dims, the same check applies.
    let bad_q = with(4, 2, f32::NAN);
    let err = AttnInput::from_dims(
        (&bad_q, &[1, 1, 2, 2]),
        (&k, &[1, 1, 3, 2]),
        (&v, &[1, 1, 3, 2]),
    );
    assert!(matches!(
        err,
        Err(AttnError::NonFinite {
            tensor: "q",
            index: 2,
            ..
        })
    ));
}

fn err_message(q: &[f32], k: &[f32], v: &[f32], shape: AttnShape) -> String {
    AttnInput::new(q, k, v, shape).unwrap_err().to_string()
}

/// With the check opted out, a NaN reaches exactly the output rows that read it: a query
/// element its own row; a key or value the rows that can see it (here, with a causal mask, the
/// rows at and after its position). Every other row is bit-identical to the clean run.
#[test]
fn opted_out_nan_reaches_only_the_rows_it_touches() {
    let (l, s, d, dv) = (6, 6, 16, 3);
    let shape = AttnShape {
        value_dim: dv,
        ..AttnShape::new(1, 2, l, s, d)
    };
    let wave = |n: usize, f: f32| (0..n).map(|x| (x as f32 * f).sin()).collect::<Vec<f32>>();
    let (q, k, v) = (
        wave(2 * l * d, 0.37),
        wave(2 * s * d, 0.71),
        wave(2 * s * dv, 1.13),
    );
    let options = AttnOptions {
        causal: Some(Causal::TopLeft),
        ..AttnOptions::default()
    };
    let (row, key) = (4, 3);
    // Rows reached (head-major, row = h·l + i): the query's own row in head 0; a key or value
    // of head 0 at position `key` reaches rows i ≥ key of head 0 only.
    let reached_by_q = |r: usize| r == row;
    let reached_by_kv = |r: usize| r < l && r >= key;
    let poisoned = |x: &[f32], at: usize| {
        let mut x = x.to_vec();
        x[at] = f32::NAN;
        x
    };
    let mut failures = Vec::new();
    for (name, kernel) in KERNELS {
        let clean = kernel(&AttnInput::new(&q, &k, &v, shape).unwrap(), &options).unwrap();
        let runs: [(&str, &Reached<'_>, Qkv); 3] = [
            (
                "q",
                &reached_by_q,
                (poisoned(&q, row * d + 5), k.clone(), v.clone()),
            ),
            (
                "k",
                &reached_by_kv,
                (q.clone(), poisoned(&k, key * d + 2), v.clone()),
            ),
            (
                "v",
                &reached_by_kv,
                (q.clone(), k.clone(), poisoned(&v, key * dv + 1)),
            ),
        ];
        for (tensor, reached, (q, k, v)) in runs {
            let input = AttnInput::allowing_non_finite(&q, &k, &v, shape).unwrap();
            let got = kernel(&input, &options).unwrap();
            for r in 0..2 * l {
                let (o, c) = (&got.out[r * dv..][..dv], &clean.out[r * dv..][..dv]);
                if reached(r) {
                    if !o.iter().any(|x| x.is_nan()) {
                        failures.push(format!("{name}: NaN in {tensor} missed row {r}: {o:?}"));
                    }
                } else if bits(o) != bits(c) {
                    failures.push(format!(
                        "{name}: NaN in {tensor} leaked into row {r}: {o:?}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Found by hand while writing the `sdpa_case` fuzz target (10 fuzzing minutes had not hit it):
/// with `head_dim = value_dim = 0` every tensor is empty, so the inputs put no bound on `seq_q`
/// or `seq_kv`, and a case declaring 10¹² rows made both kernels allocate terabytes and abort.
/// Now refused before allocating.
#[test]
fn empty_tensors_declaring_a_trillion_rows_are_refused_not_allocated() {
    let trillion = 1_000_000_000_000;
    for (what, shape) in [
        ("query rows", AttnShape::new(1, 1, trillion, 1, 0)),
        ("key rows", AttnShape::new(1, 1, 1, trillion, 0)),
    ] {
        let err = AttnInput::<f32>::new(&[], &[], &[], shape).unwrap_err();
        assert!(
            matches!(err, AttnError::TooLarge { what: w, bytes, .. } if w == what && bytes == 4 * trillion as u128),
            "{err:?}"
        );
        // A hand-built input is caught by the kernels' own validation.
        let input = AttnInput {
            q: &[],
            k: &[],
            v: &[],
            shape,
        };
        for (name, kernel) in KERNELS {
            let err = kernel(&input, &AttnOptions::default()).unwrap_err();
            assert!(matches!(err, AttnError::TooLarge { .. }), "{name}: {err:?}");
        }
    }
}

/// Finite inputs whose scores pass f32's range (q·k = 4e38) made the row's softmax NaN, with no
/// error, on every kernel (PyTorch's float32 path does the same); now the call is refused,
/// naming the row. A NaN the inputs opted in to still propagates.
#[test]
fn finite_inputs_whose_scores_overflow_are_refused_naming_the_row() {
    let shape = AttnShape::new(1, 1, 3, 2, 1);
    let (q, k, v) = ([1.0, -1.0, 2e19], [2e19, 1.0], [1.0, 2.0]);
    let input = AttnInput::new(&q, &k, &v, shape).unwrap();
    let options = AttnOptions {
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    let overflow = AttnError::ScoreOverflow {
        batch: 0,
        head: 0,
        row: 2,
    };
    assert_eq!(sdpa_reference(&input, &options).unwrap_err(), overflow);
    assert_eq!(sdpa(&input, &options).unwrap_err(), overflow);
    let to_bf16 = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
    let (qb, kb, vb) = (to_bf16(&q), to_bf16(&k), to_bf16(&v));
    let input_bf16 = AttnInput::new(&qb, &kb, &vb, shape).unwrap();
    assert_eq!(sdpa(&input_bf16, &options).unwrap_err(), overflow);
    let message = overflow.to_string();
    assert!(
        message.contains("query row 2") && message.contains("overflow"),
        "{message}"
    );

    let nan_q = [1.0, f32::NAN, 0.5];
    let opted_out = AttnInput::allowing_non_finite(&nan_q, &k, &v, shape).unwrap();
    let out = sdpa(&opted_out, &options).unwrap();
    assert!(out.lse[1].is_nan() && out.lse[0].is_finite());
}

/// Finite scores that all fall below −3.4e38 (q·k of −4e38 and −6e38, or −1e38 plus a float
/// mask of −3e38) made a row's lse −∞ and its output 0, as if the masks hid every key; now the
/// call is refused, naming the row, on every kernel. Rows the masks hide (a `false` bool mask,
/// a float mask of −∞) keep output 0 and lse −∞ whatever their scores.
#[test]
fn scores_that_all_overflow_to_minus_infinity_are_refused_naming_the_row() {
    let shape = AttnShape::new(1, 1, 3, 2, 1);
    let (q, k, v) = ([1.0, -2e19, 0.5], [2e19, 3e19], [1.0, 2.0]);
    let to_bf16 = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
    let (qb, kb, vb) = (to_bf16(&q), to_bf16(&k), to_bf16(&v));
    let input = AttnInput::new(&q, &k, &v, shape).unwrap();
    let input_bf16 = AttnInput::new(&qb, &kb, &vb, shape).unwrap();
    let run = |options: &AttnOptions| {
        [
            sdpa_reference(&input, options),
            sdpa(&input, options),
            sdpa(&input_bf16, options),
        ]
    };
    let plain = AttnOptions {
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    let row_1 = AttnError::ScoreOverflow {
        batch: 0,
        head: 0,
        row: 1,
    };
    for result in run(&plain) {
        assert_eq!(result.unwrap_err(), row_1);
    }

    // Row 1 hidden by the masks, either way: output 0, lse −∞, no error.
    let hide_row_1 = |value: f32| {
        let mut m = vec![0.0f32; 6];
        m[2..4].fill(value);
        m
    };
    let bool_mask = (0..6).map(|x| !(2..4).contains(&x)).collect();
    let hidden = [
        AttnOptions {
            bool_mask: Some(BoolMask::from_vec(bool_mask, &[3, 2]).unwrap()),
            ..plain.clone()
        },
        AttnOptions {
            float_mask: Some(FloatMask::from_vec(hide_row_1(f32::NEG_INFINITY), &[3, 2]).unwrap()),
            ..plain.clone()
        },
    ];
    for options in &hidden {
        for result in run(options) {
            let out = result.unwrap();
            assert_eq!(
                (out.lse[1], &out.out[1..2]),
                (f32::NEG_INFINITY, &[0.0][..])
            );
            assert!(out.lse[0].is_finite() && out.lse[2].is_finite());
        }
    }

    // A finite float mask whose sum with a finite score falls below −3.4e38.
    let q_small = [1.0, -1e19, 0.5];
    let k_small = [1e19, 1e19];
    let masked = AttnOptions {
        float_mask: Some(FloatMask::from_vec(hide_row_1(-3e38), &[3, 2]).unwrap()),
        ..plain.clone()
    };
    let input = AttnInput::new(&q_small, &k_small, &v, shape).unwrap();
    assert_eq!(sdpa_reference(&input, &masked).unwrap_err(), row_1);
    assert_eq!(sdpa(&input, &masked).unwrap_err(), row_1);
}
