//! The backward pass against PyTorch autograd through transformers' own models
//! (`scripts/test_data/gradients.py`): the target, its gradient with respect to the input
//! embeddings at two scalings, and with respect to every layer's attention weights, for
//! all-MiniLM-L6-v2 (a cosine), the four random classifiers (a logit) and tiny-gpt2 (the next
//! token's logit); and against central finite differences of the forward pass.

mod common;

use attn_models::{GradTarget, Model, default_model_dir, gauss_legendre};
use common::{Golden, assert_close, golden_dir};

/// `max |got − want| ≤ tol · max(1, max |want|)`: gradients are checked relative to their size.
fn close_relative(what: &str, got: &[f32], want: &(Vec<usize>, Vec<f64>), tol: f64) {
    let scale = want.1.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    assert_close(what, got, want, tol * scale);
}

fn model_and_golden(name: &str) -> (Model, Golden) {
    let dir = match name {
        "minilm" => default_model_dir(false).unwrap(),
        "tiny-gpt2" => golden_dir().join("tiny-gpt2"),
        other => golden_dir().join("heads").join(other),
    };
    let model = Model::load(&dir).unwrap();
    (
        model,
        Golden::read(
            &golden_dir()
                .join("gradients")
                .join(format!("{name}.safetensors")),
        ),
    )
}

fn target(model: &Model, g: &Golden) -> GradTarget {
    match g.text("kind").unwrap().as_str() {
        "classifier" => GradTarget::Logit(g.meta["label"].as_u64().unwrap() as usize),
        "lm" => GradTarget::NextToken(g.meta["token"].as_u64().unwrap() as u32),
        _ => {
            let text = g.text("target_text").unwrap();
            GradTarget::Cosine(model.embed(&[text.as_str()]).unwrap().remove(0))
        }
    }
}

#[test]
fn gradients_match_pytorch_autograd() {
    for name in [
        "minilm",
        "bert-cls",
        "distilbert-cls",
        "roberta-cls",
        "gpt2-cls",
        "tiny-gpt2",
    ] {
        let (model, g) = model_and_golden(name);
        let enc = model.encode(&g.text("text").unwrap(), None).unwrap();
        assert_eq!(enc.ids, g.ids("ids"), "{name}: ids");
        let target = target(&model, &g);
        let grads = model.gradients(&enc, &target, &[1.0, 0.5], true).unwrap();
        let per = enc.len() * model.hidden_size();
        for (n, scale) in ["1.0", "0.5"].into_iter().enumerate() {
            let want = g.tensor(&format!("value{scale}")).1[0];
            let got = f64::from(grads.value[n]);
            assert!(
                (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                "{name} y at {scale}: {got} vs {want}"
            );
            close_relative(
                &format!("{name} ∂y/∂x at scale {scale}"),
                &grads.d_embeddings[n * per..][..per],
                g.tensor(&format!("d_embeddings{scale}")),
                1e-4,
            );
        }
        let (weights, d_weights) = grads.attentions.as_ref().unwrap();
        let per = model.n_layers() * model.n_heads() * enc.len() * enc.len();
        assert_close(
            &format!("{name} attentions"),
            &weights[..per],
            g.tensor("attentions"),
            1e-4,
        );
        close_relative(
            &format!("{name} ∂y/∂A"),
            &d_weights[..per],
            g.tensor("d_attentions"),
            1e-4,
        );
    }
}

/// Central differences of y along a few embedding coordinates, against the backward pass.
#[test]
fn gradients_match_finite_differences() {
    for name in ["bert-cls", "gpt2-cls"] {
        let (model, g) = model_and_golden(name);
        let enc = model.encode(&g.text("text").unwrap(), None).unwrap();
        let target = target(&model, &g);
        let grads = model.gradients(&enc, &target, &[1.0], false).unwrap();
        // The directional derivative along e itself, dy/ds at s = 1 of y(s·e), is
        // Σ_jk e_jk ∂y/∂x_jk: central differences of the forward pass against the backward's.
        let h = 1e-2f32;
        let up = model
            .gradients(&enc, &target, &[1.0 + h], false)
            .unwrap()
            .value[0];
        let down = model
            .gradients(&enc, &target, &[1.0 - h], false)
            .unwrap()
            .value[0];
        let numeric = f64::from(up - down) / f64::from(2.0 * h);
        let analytic: f64 = (grads.embeddings.iter().zip(&grads.d_embeddings))
            .map(|(e, g)| f64::from(e * g))
            .sum();
        assert!(
            (numeric - analytic).abs() <= 2e-3 * analytic.abs().max(1e-2),
            "{name}: finite difference {numeric} vs backward {analytic}"
        );
    }
}

#[test]
fn gauss_legendre_integrates_polynomials_exactly() {
    for n in [1, 2, 8, 50] {
        let points = gauss_legendre(n);
        assert_eq!(points.len(), n);
        // Exact for degree ≤ 2n − 1: ∫₀¹ x^k dx = 1/(k + 1).
        for k in 0..(2 * n).min(30) {
            let sum: f64 = points.iter().map(|&(x, w)| w * x.powi(k as i32)).sum();
            assert!(
                (sum - 1.0 / (k as f64 + 1.0)).abs() < 1e-12,
                "n {n}, x^{k}: {sum}"
            );
        }
    }
}

/// Integrated gradients (8 and 50 points) against the reference's, its completeness gap, and
/// attention × gradient against the rule applied here to the reference's own tensors.
#[test]
fn integrated_gradients_and_attention_gradients_match_the_reference() {
    for name in ["minilm", "bert-cls", "gpt2-cls", "tiny-gpt2"] {
        let (model, g) = model_and_golden(name);
        let enc = model.encode(&g.text("text").unwrap(), None).unwrap();
        let target = target(&model, &g);
        for steps in [8, 50] {
            let ig = model.integrated_gradients(&enc, &target, steps).unwrap();
            close_relative(
                &format!("{name} ig{steps}"),
                &ig.scores,
                g.tensor(&format!("ig{steps}")),
                1e-3,
            );
            let change = f64::from(ig.value - ig.baseline).abs();
            if steps == 50 {
                assert!(
                    f64::from(ig.completeness_gap) <= 0.01 * change,
                    "{name}: gap {} of a change {change}",
                    ig.completeness_gap
                );
            }
        }
        let t = enc.len();
        let (a, da) = (g.tensor("attentions"), g.tensor("d_attentions"));
        let (layers, heads) = (model.n_layers(), model.n_heads());
        let mut r: Vec<f64> = (0..t * t)
            .map(|at| if at / t == at % t { 1.0 } else { 0.0 })
            .collect();
        for l in 0..layers {
            let mut mean = vec![0.0f64; t * t];
            for h in 0..heads {
                let first = (l * heads + h) * t * t;
                for (at, m) in mean.iter_mut().enumerate() {
                    let i = first + at;
                    *m += (a.1[i] * da.1[i]).max(0.0) / heads as f64;
                }
            }
            let next: Vec<f64> = (0..t * t)
                .map(|at| {
                    r[at]
                        + (0..t)
                            .map(|k| mean[at / t * t + k] * r[k * t + at % t])
                            .sum::<f64>()
                })
                .collect();
            r = next;
        }
        let (got, _) = model.attention_gradient_rollout(&enc, &target).unwrap();
        close_relative(&format!("{name} attn-grad"), &got, &(vec![t, t], r), 1e-4);
    }
}
