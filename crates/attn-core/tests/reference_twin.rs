//! A second, independent formulation of attention — the full score matrix in f64 with an explicit
//! visibility matrix, then softmax and a matmul — against `sdpa_reference` and the fast `sdpa`
//! on a sweep of awkward shapes and every option; plus tiny cases whose values are derived by
//! hand in comments.

mod common;

use attn_core::{
    AttnInput, AttnOptions, AttnOutput, AttnShape, BoolMask, Causal, Dropout, FloatMask,
    KeyPadding, Weights, WeightsRequest, Window, sdpa, sdpa_reference,
};

use common::rng::Rng;

/// Expands a mask of `dims` (rank ≤ 4, PyTorch broadcasting) to the full `[B, H, L, S]`.
fn expand<T: Copy>(data: &[T], dims: [usize; 4], full: [usize; 4]) -> Vec<T> {
    let mut out = Vec::with_capacity(full.iter().product());
    for b in 0..full[0] {
        for h in 0..full[1] {
            for i in 0..full[2] {
                for j in 0..full[3] {
                    let idx = [b, h, i, j];
                    let flat = (0..4).fold(0, |acc, a| {
                        let pick = if dims[a] == 1 { 0 } else { idx[a] };
                        acc * dims[a] + pick
                    });
                    out.push(data[flat]);
                }
            }
        }
    }
    out
}

/// The twin's results, in f64: out `[B, H, L, dv]`, lse `[B, H, L]`, weights `[B, H, L, S]`.
struct Twin {
    out: Vec<f64>,
    lse: Vec<f64>,
    weights: Vec<f64>,
}

/// Attention written as matrices: `P = scale · Q Kᵀ` (f64), softcap, ALiBi, float mask, then an
/// explicit 0/1 visibility matrix from the rules of `tests/data/README.md`, softmax over each
/// row's visible finite scores, and `O = P · V` (with dropout's mask and 1/(1-p) applied).
fn twin(sh: AttnShape, q: &[f32], k: &[f32], v: &[f32], o: &AttnOptions) -> Twin {
    let (bn, hn, ln, sn, d, dv) = (
        sh.batch,
        sh.n_heads,
        sh.seq_q,
        sh.seq_kv,
        sh.head_dim,
        sh.value_dim,
    );
    let full = [bn, hn, ln, sn];
    let scale = o.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    // The causal mask's alignment, else `align` (FlashAttention's non-causal windows and
    // ALiBi).
    let offset: i64 = match (o.causal, o.align) {
        (Some(Causal::BottomRight), _) | (None, Some(Causal::BottomRight)) => sn as i64 - ln as i64,
        _ => 0,
    };
    let bool_mask = o
        .bool_mask
        .as_ref()
        .map(|m| expand(m.data(), m.dims(), full));
    let float_mask = o
        .float_mask
        .as_ref()
        .map(|m| expand(m.data(), m.dims(), full));
    let group = hn / sh.n_kv_heads;

    let mut out = vec![0.0f64; bn * hn * ln * dv];
    let mut lse = vec![f64::NEG_INFINITY; bn * hn * ln];
    let mut weights = vec![0.0f64; bn * hn * ln * sn];
    for b in 0..bn {
        for h in 0..hn {
            let kvh = h / group; // repeat_interleave: query heads [g·kvh, g·kvh + g) share kvh
            let kv = b * sh.n_kv_heads + kvh;
            // P: [L, S] scores of this head, and the visibility matrix.
            let mut p = vec![f64::NEG_INFINITY; ln * sn];
            let mut vis = vec![false; ln * sn];
            for i in 0..ln {
                for j in 0..sn {
                    let qi = &q[((b * hn + h) * ln + i) * d..][..d];
                    let kj = &k[(kv * sn + j) * d..][..d];
                    let mut s: f64 = qi
                        .iter()
                        .zip(kj)
                        .map(|(&x, &y)| f64::from(x) * f64::from(y))
                        .sum::<f64>()
                        * scale;
                    if let Some(c) = o.softcap {
                        let c = f64::from(c);
                        s = c * (s / c).tanh();
                    }
                    let diag = i as i64 + offset;
                    if let Some(slopes) = &o.alibi {
                        s -= f64::from(slopes[h]) * (diag - j as i64).abs() as f64;
                    }
                    let flat = ((b * hn + h) * ln + i) * sn + j;
                    if let Some(fm) = &float_mask {
                        s += f64::from(fm[flat]);
                    }
                    let j = j as i64;
                    let mut visible = true;
                    if o.causal.is_some() {
                        visible &= j <= diag;
                    }
                    if let Some(w) = o.window {
                        if let Some(left) = w.left {
                            visible &= j >= diag - left as i64;
                        }
                        if let Some(right) = w.right {
                            visible &= j <= diag + right as i64;
                        }
                    }
                    if let Some(bm) = &bool_mask {
                        visible &= bm[flat];
                    }
                    if let Some(kp) = &o.key_padding {
                        visible &= kp.row(b)[j as usize];
                    }
                    p[i * sn + j as usize] = s;
                    vis[i * sn + j as usize] = visible;
                }
            }
            for i in 0..ln {
                let row = (b * hn + h) * ln + i;
                let live: Vec<usize> = (0..sn)
                    .filter(|&j| vis[i * sn + j] && p[i * sn + j] > f64::NEG_INFINITY)
                    .collect();
                if live.is_empty() {
                    continue;
                }
                let m = live.iter().map(|&j| p[i * sn + j]).fold(f64::MIN, f64::max);
                let z: f64 = live.iter().map(|&j| (p[i * sn + j] - m).exp()).sum();
                lse[row] = m + z.ln();
                for &j in &live {
                    let w = (p[i * sn + j] - m).exp() / z;
                    weights[row * sn + j] = w;
                    let dropped = match o.dropout {
                        Some(dr) if dr.keep(b, h, i, j) => w / (1.0 - f64::from(dr.p)),
                        Some(_) => 0.0,
                        None => w,
                    };
                    for c in 0..dv {
                        out[row * dv + c] += dropped * f64::from(v[(kv * sn + j) * dv + c]);
                    }
                }
            }
        }
    }
    Twin { out, lse, weights }
}

/// Max of |got − want| / max(1, |want|); −∞ must meet −∞, and NaN never passes.
fn worst(got: &[f32], want: &[f64]) -> (f64, usize) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let mut w = (0.0, 0);
    for (i, (&g, &e)) in got.iter().zip(want).enumerate() {
        let d = if e == f64::NEG_INFINITY {
            if g == f32::NEG_INFINITY {
                0.0
            } else {
                f64::INFINITY
            }
        } else if g.is_finite() {
            (f64::from(g) - e).abs() / e.abs().max(1.0)
        } else {
            f64::INFINITY
        };
        if d > w.0 {
            w = (d, i);
        }
    }
    w
}

fn check(label: &str, what: &str, got: &[f32], want: &[f64], tol: f64) {
    let (d, at) = worst(got, want);
    assert!(
        d <= tol,
        "{label}: {what} differs by {d:e} at flat index {at} (got {}, twin {})",
        got[at],
        want[at]
    );
}

/// Compares one kernel's output (and the weights it was asked for) with the twin.
fn compare(label: &str, sh: AttnShape, got: &AttnOutput, twin: &Twin, request: &WeightsRequest) {
    let tol = 2e-5;
    check(label, "out", &got.out, &twin.out, tol);
    check(label, "lse", &got.lse, &twin.lse, 1e-4);
    let (bh, ln, sn) = (sh.batch * sh.n_heads, sh.seq_q, sh.seq_kv);
    let want: Vec<f64> = match request {
        WeightsRequest::None => {
            assert!(got.weights.is_none(), "{label}: weights not asked for");
            return;
        }
        WeightsRequest::All => twin.weights.clone(),
        WeightsRequest::Rows(rows) => (0..bh)
            .flat_map(|x| rows.iter().map(move |&i| (x, i)))
            .flat_map(|(x, i)| twin.weights[(x * ln + i) * sn..][..sn].to_vec())
            .collect(),
        WeightsRequest::HeadAverage => {
            let mut avg = vec![0.0; sh.batch * ln * sn];
            for (x, w) in twin.weights.iter().enumerate() {
                let b = x / (sh.n_heads * ln * sn);
                avg[b * ln * sn + x % (ln * sn)] += w / sh.n_heads as f64;
            }
            avg
        }
    };
    let data = match (&got.weights, request) {
        (Some(Weights::All { data: w, .. }), WeightsRequest::All)
        | (Some(Weights::HeadAverage { data: w, .. }), WeightsRequest::HeadAverage) => w,
        (Some(Weights::Rows { rows, data, .. }), WeightsRequest::Rows(asked)) => {
            assert_eq!(rows, asked, "{label}: rows echoed back");
            data
        }
        (other, _) => panic!("{label}: weights {other:?} for request {request:?}"),
    };
    check(label, "weights", data, &want, tol);
}

/// One random case: a shape plus a recipe of options drawn for it.
fn options_for(recipe: usize, sh: AttnShape, rng: &mut Rng) -> AttnOptions {
    let (b, h, l, s) = (sh.batch, sh.n_heads, sh.seq_q, sh.seq_kv);
    let bools = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.chance(0.7)).collect::<Vec<_>>();
    let mut o = AttnOptions::default();
    match recipe {
        0 => {}
        1 => {
            o.scale = Some(0.3);
            o.softcap = Some(2.0);
        }
        2 => o.bool_mask = Some(BoolMask::from_vec(bools(rng, l * s), &[l, s]).unwrap()),
        3 => o.bool_mask = Some(BoolMask::from_vec(bools(rng, b * l * s), &[b, 1, l, s]).unwrap()),
        4 => {
            // Per-head, per-key additive bias with some −∞ entries: [1, H, 1, S].
            let data = (0..h * s)
                .map(|_| {
                    if rng.chance(0.2) {
                        f32::NEG_INFINITY
                    } else {
                        2.0 * rng.sym(1.0)
                    }
                })
                .collect();
            o.float_mask = Some(FloatMask::from_vec(data, &[1, h, 1, s]).unwrap());
        }
        5 => {
            let data = rng.vec(b * h * l * s, 3.0);
            o.float_mask = Some(FloatMask::from_vec(data, &[b, h, l, s]).unwrap());
        }
        6 => {
            // Random padding; batch 0 keeps only its first key when there is one.
            let mut real = bools(rng, b * s);
            (1..s).for_each(|j| real[j] = false);
            o.key_padding = Some(KeyPadding::from_vec(real, b, s).unwrap());
        }
        7 => o.causal = Some(Causal::TopLeft),
        8 => {
            o.causal = Some(Causal::BottomRight);
            o.window = Some(Window {
                left: Some(3),
                right: Some(0),
            });
        }
        9 => {
            o.window = Some(Window {
                left: Some(2),
                right: Some(1),
            })
        }
        10 => {
            o.window = Some(Window {
                left: Some(5),
                right: None,
            })
        }
        11 => {
            o.causal = Some(Causal::BottomRight);
            o.alibi = Some((0..h).map(|x| 0.5f32.powi(x as i32 + 1)).collect());
        }
        12 => {
            o.alibi = Some(rng.vec(h, 0.5));
        }
        13 => {
            o.dropout = Some(Dropout {
                p: 0.3,
                seed: rng.next_u64(),
            })
        }
        14 => {
            o.align = Some(Causal::BottomRight);
            o.window = Some(Window {
                left: Some(2),
                right: Some(1),
            });
        }
        15 => {
            o.align = Some(Causal::BottomRight);
            o.alibi = Some(rng.vec(h, 0.5));
        }
        _ => {
            // Everything at once.
            o.scale = Some(0.5);
            o.softcap = Some(3.0);
            o.alibi = Some(rng.vec(h, 0.3));
            o.causal = Some(Causal::TopLeft);
            o.window = Some(Window {
                left: Some(4),
                right: Some(2),
            });
            o.float_mask = Some(FloatMask::from_vec(rng.vec(l * s, 1.0), &[1, 1, l, s]).unwrap());
            o.bool_mask = Some(BoolMask::from_vec(bools(rng, b * h * s), &[b, h, 1, s]).unwrap());
            o.key_padding = Some(KeyPadding::from_vec(bools(rng, b * s), b, s).unwrap());
            o.dropout = Some(Dropout { p: 0.5, seed: 7 });
        }
    }
    o
}

const RECIPES: usize = 17;

#[test]
fn both_kernels_match_the_twin_on_awkward_shapes() {
    let mut rng = Rng(0x5eed);
    let mut runs = 0;
    for &seq_kv in &[0usize, 1, 7, 63, 65] {
        for &seq_q in &[1usize, 7, 65] {
            for &(n_kv_heads, ratio) in &[(2usize, 1usize), (1, 2), (2, 4)] {
                for recipe in 0..RECIPES {
                    let (head_dim, value_dim) = [(8, 8), (16, 5), (1, 3)][runs % 3];
                    let sh = AttnShape {
                        batch: 2,
                        n_heads: n_kv_heads * ratio,
                        n_kv_heads,
                        seq_q,
                        seq_kv,
                        head_dim,
                        value_dim,
                    };
                    let q = rng.vec(sh.q_dims().iter().product(), 2.0);
                    let k = rng.vec(sh.k_dims().iter().product(), 2.0);
                    let v = rng.vec(sh.v_dims().iter().product(), 1.0);
                    let mut options = options_for(recipe, sh, &mut rng);
                    options.weights = match runs % 4 {
                        0 => WeightsRequest::All,
                        1 => WeightsRequest::HeadAverage,
                        2 => WeightsRequest::Rows(vec![seq_q - 1, 0, seq_q / 2, 0]),
                        _ => WeightsRequest::None,
                    };
                    let label = format!("recipe {recipe} on {sh:?}");
                    let want = twin(sh, &q, &k, &v, &options);
                    let input = AttnInput::new(&q, &k, &v, sh).unwrap();
                    for (name, kernel) in [
                        ("sdpa_reference", sdpa_reference as fn(&_, &_) -> _),
                        ("sdpa", sdpa),
                    ] {
                        let got = kernel(&input, &options).unwrap();
                        compare(
                            &format!("{name}, {label}"),
                            sh,
                            &got,
                            &want,
                            &options.weights,
                        );
                    }
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 5 * 3 * 3 * RECIPES);
}

/// Runs both kernels with all weights on a one-batch, one-head case.
fn both(q: &[f32], k: &[f32], v: &[f32], sh: AttnShape, options: AttnOptions) -> [AttnOutput; 2] {
    let options = AttnOptions {
        weights: WeightsRequest::All,
        ..options
    };
    let input = AttnInput::new(q, k, v, sh).unwrap();
    [
        sdpa_reference(&input, &options).unwrap(),
        sdpa(&input, &options).unwrap(),
    ]
}

fn assert_near(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6, "got {got:?}, want {want:?}");
    }
}

fn all_weights(out: &AttnOutput) -> &[f32] {
    match &out.weights {
        Some(Weights::All { data: w, .. }) => w,
        other => panic!("weights {other:?}"),
    }
}

#[test]
fn two_keys_with_equal_scores_share_the_weight() {
    // q = [1, 0], k0 = [0, 1], k1 = [0, 2]: both scores are 0, so the weights are 1/2, 1/2,
    // out = (2 + 4) / 2 = 3, and lse = ln(e⁰ + e⁰) = ln 2.
    let sh = AttnShape {
        value_dim: 1,
        ..AttnShape::new(1, 1, 1, 2, 2)
    };
    for got in both(
        &[1.0, 0.0],
        &[0.0, 1.0, 0.0, 2.0],
        &[2.0, 4.0],
        sh,
        AttnOptions::default(),
    ) {
        assert_near(all_weights(&got), &[0.5, 0.5]);
        assert_near(&got.out, &[3.0]);
        assert_near(&got.lse, &[2f32.ln()]);
    }
}

#[test]
fn scores_zero_and_ln3_give_a_quarter_and_three_quarters() {
    // scale 1, q = [1], k = [0, ln 3]: scores 0 and ln 3, exp → 1 and 3, weights 1/4 and 3/4;
    // out = 1/4·4 + 3/4·8 = 7; lse = ln(1 + 3) = ln 4.
    let sh = AttnShape::new(1, 1, 1, 2, 1);
    let options = AttnOptions {
        scale: Some(1.0),
        ..AttnOptions::default()
    };
    for got in both(&[1.0], &[0.0, 3f32.ln()], &[4.0, 8.0], sh, options.clone()) {
        assert_near(all_weights(&got), &[0.25, 0.75]);
        assert_near(&got.out, &[7.0]);
        assert_near(&got.lse, &[4f32.ln()]);
    }
}

#[test]
fn softcap_saturates_at_the_cap() {
    // Scores 100 and 0 under softcap c = ln 3: c·tanh(100/c) = c (tanh(91) is 1 in f32) and
    // c·tanh(0) = 0, so the weights are e^c : e^0 = 3 : 1 → 3/4, 1/4.
    let sh = AttnShape::new(1, 1, 1, 2, 1);
    let options = AttnOptions {
        scale: Some(1.0),
        softcap: Some(3f32.ln()),
        ..AttnOptions::default()
    };
    for got in both(&[10.0], &[10.0, 0.0], &[1.0, 0.0], sh, options.clone()) {
        assert_near(all_weights(&got), &[0.75, 0.25]);
    }
}

#[test]
fn alibi_halves_the_weight_per_step_of_distance() {
    // Equal raw scores (k = 0), slope ln 2, causal: query 2 sees keys 0, 1, 2 at distances
    // 2, 1, 0, so scores are −2 ln 2, −ln 2, 0 → exp 1/4, 1/2, 1 → weights 1/7, 2/7, 4/7.
    let sh = AttnShape::new(1, 1, 3, 3, 1);
    let options = AttnOptions {
        causal: Some(Causal::TopLeft),
        alibi: Some(vec![2f32.ln()]),
        ..AttnOptions::default()
    };
    for got in both(&[1.0; 3], &[0.0; 3], &[7.0, 0.0, 0.0], sh, options.clone()) {
        let w = all_weights(&got);
        // Row 0 sees key 0 only; row 2 is the derivation above.
        assert_near(&w[0..3], &[1.0, 0.0, 0.0]);
        assert_near(&w[6..9], &[1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]);
        // out[2] = 1/7 · 7 = 1.
        assert_near(&got.out[2..3], &[1.0]);
    }
}

#[test]
fn causal_alignment_decides_what_a_single_query_sees() {
    // One query, three keys with equal scores. Top-left: it sees key 0 only (out = v0 = 3).
    // Bottom-right (o = 2): it sees all three (out = (3 + 6 + 9) / 3 = 6).
    let sh = AttnShape::new(1, 1, 1, 3, 1);
    for (causal, want) in [(Causal::TopLeft, 3.0), (Causal::BottomRight, 6.0)] {
        let options = AttnOptions {
            causal: Some(causal),
            ..AttnOptions::default()
        };
        for got in both(
            &[0.0],
            &[1.0, 2.0, 3.0],
            &[3.0, 6.0, 9.0],
            sh,
            options.clone(),
        ) {
            assert_near(&got.out, &[want]);
        }
    }
}

#[test]
fn fully_masked_rows_give_zeros_and_minus_infinity_never_nan() {
    // Row 0: the bool mask hides every key. Row 1: the float mask is −∞ on every key.
    // Both give out 0, weights 0, lse −∞. Row 2 sees everything.
    let sh = AttnShape::new(1, 1, 3, 2, 2);
    let q = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let k = [0.5, -0.5, 1.0, 1.0];
    let v = [1.0, 2.0, 3.0, 4.0];
    let options = AttnOptions {
        bool_mask: Some(
            BoolMask::from_vec(vec![false, false, true, true, true, true], &[3, 2]).unwrap(),
        ),
        float_mask: Some(
            FloatMask::from_vec(
                vec![0.0, 0.0, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0, 0.0],
                &[3, 2],
            )
            .unwrap(),
        ),
        ..AttnOptions::default()
    };
    for got in both(&q, &k, &v, sh, options.clone()) {
        let w = all_weights(&got);
        assert_eq!(&got.out[..4], &[0.0; 4]);
        assert_eq!(&w[..4], &[0.0; 4]);
        assert_eq!(&got.lse[..2], &[f32::NEG_INFINITY; 2]);
        assert!(got.lse[2].is_finite());
        assert!((w[4] + w[5] - 1.0).abs() < 1e-6);
        assert!(got.out.iter().chain(w).all(|x| !x.is_nan()));
    }
    // No keys at all: every row is fully masked.
    let empty = AttnShape::new(1, 1, 2, 0, 2);
    for got in both(&q[..4], &[], &[], empty, AttnOptions::default()) {
        assert_eq!(got.out, vec![0.0; 4]);
        assert_eq!(got.lse, vec![f32::NEG_INFINITY; 2]);
    }
}

#[test]
fn padded_keys_do_not_change_real_outputs_and_rows_sum_to_one() {
    // Invariance: whatever the padded keys and values hold, the outputs are the same.
    let mut rng = Rng(42);
    let sh = AttnShape::new(2, 3, 5, 9, 4);
    let q = rng.vec(2 * 3 * 5 * 4, 1.0);
    let k = rng.vec(2 * 3 * 9 * 4, 1.0);
    let v = rng.vec(2 * 3 * 9 * 4, 1.0);
    let padding = KeyPadding::from_lengths(&[9, 6], 9).unwrap();
    let options = AttnOptions {
        key_padding: Some(padding),
        ..AttnOptions::default()
    };
    let (mut k2, mut v2) = (k.clone(), v.clone());
    for h in 0..3 {
        for j in 6..9 {
            let row = ((3 + h) * 9 + j) * 4; // batch 1, head h, key j
            k2[row..row + 4].fill(100.0);
            v2[row..row + 4].fill(-50.0);
        }
    }
    let [a, _] = both(&q, &k, &v, sh, options.clone());
    for got in both(&q, &k2, &v2, sh, options.clone()) {
        assert_near(&got.out, &a.out);
        for row in all_weights(&got).chunks(9) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
    }
}

#[test]
fn query_heads_sharing_a_key_value_head_read_the_same_keys() {
    // GQA 2:1 with the same query in both heads: both heads give the same output, equal to
    // plain attention of that query against the one key/value head.
    let mut rng = Rng(3);
    let q1 = rng.vec(4 * 8, 1.0);
    let k = rng.vec(6 * 8, 1.0);
    let v = rng.vec(6 * 8, 1.0);
    let q2 = [q1.clone(), q1.clone()].concat();
    let gqa = AttnShape {
        n_kv_heads: 1,
        ..AttnShape::new(1, 2, 4, 6, 8)
    };
    let [single, _] = both(
        &q1,
        &k,
        &v,
        AttnShape::new(1, 1, 4, 6, 8),
        AttnOptions::default(),
    );
    for got in both(&q2, &k, &v, gqa, AttnOptions::default()) {
        assert_near(&got.out[..32], &single.out);
        assert_near(&got.out[32..], &single.out);
    }
}
