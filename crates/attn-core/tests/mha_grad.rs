//! Multi-head attention's gradients (inputs, projection weights and biases) against central
//! finite differences of its forward pass, and its bad inputs.

use attn_core::{
    AttnError, AttnOptions, Causal, Dropout, KeyPadding, Linear, MhaConfig, MhaGrads, MhaInput,
    MultiheadAttention,
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

/// Every number the loss depends on, in one flat list of named parts.
#[derive(Clone)]
struct Params {
    config: MhaConfig,
    /// q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, query, key, value (empty bias = none)
    parts: Vec<(&'static str, Vec<f32>)>,
    batch: usize,
    seq_q: usize,
    seq_kv: usize,
}

impl Params {
    fn new(
        config: MhaConfig,
        with_bias: bool,
        (batch, seq_q, seq_kv): (usize, usize, usize),
    ) -> Self {
        let e = config.embed_dim;
        let bias = |seed| if with_bias { random(e, seed) } else { vec![] };
        Params {
            config,
            parts: vec![
                ("q_proj.weight", random(e * e, 1)),
                ("q_proj.bias", bias(2)),
                ("k_proj.weight", random(e * config.kdim, 3)),
                ("k_proj.bias", bias(4)),
                ("v_proj.weight", random(e * config.vdim, 5)),
                ("v_proj.bias", bias(6)),
                ("out_proj.weight", random(e * e, 7)),
                ("out_proj.bias", bias(8)),
                ("query", random(batch * seq_q * e, 9)),
                ("key", random(batch * seq_kv * config.kdim, 10)),
                ("value", random(batch * seq_kv * config.vdim, 11)),
            ],
            batch,
            seq_q,
            seq_kv,
        }
    }

    fn module(&self) -> MultiheadAttention {
        let c = self.config;
        let e = c.embed_dim;
        let p = |i: usize| self.parts[i].1.clone();
        let b = |i: usize| Some(p(i)).filter(|b| !b.is_empty());
        MultiheadAttention::new(
            c,
            Linear::new("q", p(0), e, e, b(1)).unwrap(),
            Linear::new("k", p(2), e, c.kdim, b(3)).unwrap(),
            Linear::new("v", p(4), e, c.vdim, b(5)).unwrap(),
            Linear::new("o", p(6), e, e, b(7)).unwrap(),
        )
        .unwrap()
    }

    fn input(&self) -> MhaInput<'_> {
        MhaInput {
            query: &self.parts[8].1,
            key: &self.parts[9].1,
            value: &self.parts[10].1,
            batch: self.batch,
            seq_q: self.seq_q,
            seq_kv: self.seq_kv,
        }
    }

    /// `sum(out · dout)`, accumulated in f64.
    fn loss(&self, options: &AttnOptions, dout: &[f32]) -> f64 {
        let out = self.module().forward(&self.input(), options).unwrap().out;
        out.iter()
            .zip(dout)
            .map(|(&o, &g)| f64::from(o) * f64::from(g))
            .sum()
    }
}

/// The analytic gradients in the order of [`Params::parts`].
fn flatten(g: &MhaGrads) -> Vec<Vec<f32>> {
    let bias = |b: &Option<Vec<f32>>| b.clone().unwrap_or_default();
    vec![
        g.q_proj.weight.clone(),
        bias(&g.q_proj.bias),
        g.k_proj.weight.clone(),
        bias(&g.k_proj.bias),
        g.v_proj.weight.clone(),
        bias(&g.v_proj.bias),
        g.out_proj.weight.clone(),
        bias(&g.out_proj.bias),
        g.query.clone(),
        g.key.clone(),
        g.value.clone(),
    ]
}

fn check(case: &str, params: &Params, options: &AttnOptions) {
    // Central differences: f32 rounding of the loss over 2·EPS is ~1e-5, truncation ~EPS²/6.
    const EPS: f32 = 1e-2;
    let c = params.config;
    let dout = random(params.batch * params.seq_q * c.embed_dim, 12);
    let grads = params
        .module()
        .backward(&params.input(), options, &dout)
        .unwrap();
    let analytic = flatten(&grads);
    for (part, ((name, values), got)) in params.parts.iter().zip(&analytic).enumerate() {
        assert_eq!(values.len(), got.len(), "{case}: {name} gradient length");
        for (idx, &g) in got.iter().enumerate() {
            let at = |delta: f32| {
                let mut p = params.clone();
                p.parts[part].1[idx] += delta;
                p.loss(options, &dout)
            };
            let fd = ((at(EPS) - at(-EPS)) / (2.0 * f64::from(EPS))) as f32;
            let err = (g - fd).abs() / fd.abs().max(1.0);
            assert!(
                err <= 2e-3,
                "{case}: d {name}[{idx}] is {g} but finite differences give {fd} (error {err:e})"
            );
        }
        // The key bias adds q·b_k to every score of a row, which the softmax cancels: its
        // gradient is exactly 0 (the finite differences above agree). Every other part matters.
        assert!(
            got.is_empty() || *name == "k_proj.bias" || got.iter().any(|x| x.abs() > 1e-3),
            "{case}: {name} gradient is all zero"
        );
    }
}

#[test]
fn gradients_match_finite_differences_with_biases() {
    // E = 8 over 2 heads, key and value inputs of their own widths; batch 2, L = 3, S = 4.
    let config = MhaConfig::with_kv_dims(8, 2, 6, 5).unwrap();
    let params = Params::new(config, true, (2, 3, 4));
    check("plain", &params, &AttnOptions::default());
}

#[test]
fn gradients_match_finite_differences_with_masks_and_dropout() {
    let config = MhaConfig::new(6, 3).unwrap();
    let params = Params::new(config, false, (2, 4, 5));
    let options = AttnOptions {
        causal: Some(Causal::BottomRight),
        key_padding: Some(KeyPadding::from_lengths(&[5, 3], 5).unwrap()),
        dropout: Some(Dropout { p: 0.2, seed: 3 }),
        ..AttnOptions::default()
    };
    check("causal + padding + dropout, no bias", &params, &options);
}

#[test]
fn a_bad_dout_is_refused() {
    let params = Params::new(MhaConfig::new(4, 2).unwrap(), true, (1, 2, 3));
    let module = params.module();
    let err = module
        .backward(&params.input(), &AttnOptions::default(), &[0.0; 7])
        .unwrap_err();
    assert_eq!(
        err,
        AttnError::LengthMismatch {
            tensor: "dout",
            shape: vec![1, 2, 4],
            expected: 8,
            got: 7
        }
    );
    let mut dout = [0.5f32; 8];
    dout[6] = f32::NEG_INFINITY;
    let err = module
        .backward(&params.input(), &AttnOptions::default(), &dout)
        .unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::NonFinite {
                tensor: "dout",
                index: 6,
                ..
            }
        ),
        "{err}"
    );
    let short = MhaInput {
        query: &params.parts[8].1[1..],
        ..params.input()
    };
    let err = module
        .backward(&short, &AttnOptions::default(), &dout)
        .unwrap_err();
    assert!(
        matches!(
            err,
            AttnError::LengthMismatch {
                tensor: "query",
                ..
            }
        ),
        "{err}"
    );
}

/// The weights the module returns under dropout are those its output used, as PyTorch's module
/// returns them: with identity projections, out = weights · value for one head; with two, the
/// head average is the mean of the heads' dropped weights, and chosen rows are theirs.
#[test]
fn returned_weights_are_after_dropout() {
    use attn_core::{Weights, WeightsRequest};
    let identity = |e: usize| -> Vec<f32> {
        (0..e * e)
            .map(|i| if i / e == i % e { 1.0 } else { 0.0 })
            .collect()
    };
    let module = |e: usize, heads: usize| {
        let lin = |name| Linear::new(name, identity(e), e, e, None).unwrap();
        MultiheadAttention::new(
            MhaConfig::new(e, heads).unwrap(),
            lin("q_proj_weight"),
            lin("k_proj_weight"),
            lin("v_proj_weight"),
            lin("out_proj.weight"),
        )
        .unwrap()
    };
    let (b, l, s, e) = (2, 5, 6, 4);
    let query = random(b * l * e, 21);
    let key = random(b * s * e, 22);
    let value = random(b * s * e, 23);
    let input = MhaInput {
        query: &query,
        key: &key,
        value: &value,
        batch: b,
        seq_q: l,
        seq_kv: s,
    };
    let with = |weights| AttnOptions {
        dropout: Some(Dropout { p: 0.5, seed: 7 }),
        weights,
        ..AttnOptions::default()
    };
    // One head of width e: out[b, i] = Σ_j w[b, i, j] · value[b, j].
    let one = module(e, 1)
        .forward(&input, &with(WeightsRequest::HeadAverage))
        .unwrap();
    let w = one.weights.unwrap().data().to_vec();
    assert!(w.contains(&0.0), "some weights are dropped");
    for (row, w_row) in w.chunks_exact(s).enumerate() {
        let batch = row / l;
        for c in 0..e {
            let want: f32 = (0..s)
                .map(|j| w_row[j] * value[(batch * s + j) * e + c])
                .sum();
            let got = one.out[row * e + c];
            assert!(
                (got - want).abs() < 1e-5,
                "row {row} col {c}: {got} vs {want}"
            );
        }
    }
    // Two heads: the average and the rows agree with every head's dropped weights.
    let two = module(e, 2);
    let all = match two
        .forward(&input, &with(WeightsRequest::All))
        .unwrap()
        .weights
    {
        Some(Weights::All { data: w, .. }) => w,
        other => panic!("{other:?}"),
    };
    let average = two
        .forward(&input, &with(WeightsRequest::HeadAverage))
        .unwrap();
    let average = average.weights.unwrap().data().to_vec();
    for (n, &got) in average.iter().enumerate() {
        let (batch, at) = (n / (l * s), n % (l * s));
        let want = (all[(batch * 2) * l * s + at] + all[(batch * 2 + 1) * l * s + at]) / 2.0;
        assert!((got - want).abs() < 1e-6, "average at {n}: {got} vs {want}");
    }
    let rows = two
        .forward(&input, &with(WeightsRequest::Rows(vec![3, 0])))
        .unwrap();
    let rows = rows.weights.unwrap().data().to_vec();
    for (n, &got) in rows.iter().enumerate() {
        let (bh, r, j) = (n / (2 * s), n / s % 2, n % s);
        let i = [3, 0][r];
        assert_eq!(got, all[(bh * l + i) * s + j], "row {r} of head-batch {bh}");
    }
}
