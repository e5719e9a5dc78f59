//! Gradients of a scalar target `y` with respect to the word embeddings and every layer's
//! attention weights, for gradient-based attribution (input × gradient, integrated gradients,
//! Chefer et al.'s attention × gradient).
//!
//! The forward pass runs again, keeping what its backward pass needs (each LayerNorm's
//! normalised input and `1/σ`, the projections' outputs, the attention's output and
//! log-sum-exp); the backward pass then runs through the target's head, each block (linear
//! layers by `dx = dy·Wᵀ`, LayerNorm, GELU, attention through attn-core's fused backward) and
//! the embedding LayerNorm down to the word embeddings, which transformers takes as
//! `inputs_embeds`. No weight's gradient is formed. Several scalings of the word embeddings
//! (integrated gradients' path) run as one batch.

use attn_core::{AttnInput, AttnOptions, AttnShape, Causal, sdpa, sdpa_backward};
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef};

use crate::model::{merge_heads, parallelism, split_heads};
use rayon::prelude::*;

use crate::ops::{
    Epilogue, Gemm, LayerNorm, Linear, activation_backward, bias_activation_block, lanes, lanes2,
    lanes3,
};
use crate::{Encoding, Model, ModelError, ModelKind, Task};

/// The scalar a gradient is taken of.
#[derive(Debug, Clone, PartialEq)]
pub enum GradTarget {
    /// A classifier's logit of this label id.
    Logit(usize),
    /// A causal language model's logit of this token at the last position.
    NextToken(u32),
    /// The cosine between the text's sentence embedding (mean pooling) and this vector.
    Cosine(Vec<f32>),
}

/// `y` and its gradients for each scaling of the word embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct Gradients {
    /// Tokens.
    pub seq_len: usize,
    /// `y` for each scaling.
    pub value: Vec<f32>,
    /// The word embeddings of the text, unscaled: `[T, hidden]`.
    pub embeddings: Vec<f32>,
    /// `∂y/∂x` at each scaling `x = scale · e` of the word embeddings (what integrated
    /// gradients integrates): `[scales, T, hidden]`.
    pub d_embeddings: Vec<f32>,
    /// Every layer's attention weights and `∂y/∂A` for each scaling, when asked:
    /// `[scales, layers, heads, T, T]` each.
    pub attentions: Option<(Vec<f32>, Vec<f32>)>,
}

/// A LayerNorm's saved state for its backward pass: `x̂` and `1/σ` of each row.
struct NormState {
    normalised: Vec<f32>,
    inv_sigma: Vec<f32>,
}

/// Rows per task of the row-wise loops: fewer would cost more in scheduling than they save.
const ROWS_PER_TASK: usize = 64;

/// `y = LayerNorm(x)` row by row (biased variance, as PyTorch), keeping `x̂` and `1/σ`; rows
/// in parallel.
fn norm_forward(ln: &LayerNorm, x: &[f32], y: &mut [f32]) -> NormState {
    let d = ln.gamma.len();
    let mut normalised = vec![0.0f32; x.len()];
    let mut inv_sigma = vec![0.0f32; x.len() / d];
    (x.par_chunks_exact(d).zip(y.par_chunks_exact_mut(d)))
        .zip(
            normalised
                .par_chunks_exact_mut(d)
                .zip(inv_sigma.par_iter_mut()),
        )
        .for_each(|((row, y), (n, inv))| {
            let mean = lanes(row, |v| v) / d as f32;
            let var = lanes(row, |v| (v - mean) * (v - mean)) / d as f32;
            *inv = 1.0 / (var + ln.eps).sqrt();
            for k in 0..d {
                n[k] = (row[k] - mean) * *inv;
                y[k] = n[k] * ln.gamma[k] + ln.beta[k];
            }
        });
    NormState {
        normalised,
        inv_sigma,
    }
}

/// `x ← LayerNorm(x)` where the model has this LayerNorm, keeping its state.
fn norm_in_place(ln: Option<&LayerNorm>, x: &mut Vec<f32>) -> Option<NormState> {
    let ln = ln?;
    let mut y = vec![0.0f32; x.len()];
    let s = norm_forward(ln, x, &mut y);
    *x = y;
    Some(s)
}

/// `dx` of a LayerNorm from `dy`: `(1/σ)(g − mean(g) − x̂·mean(g·x̂))` with `g = dy ⊙ γ`; rows
/// in parallel.
fn norm_backward(ln: &LayerNorm, s: &NormState, dy: &[f32]) -> Vec<f32> {
    let d = ln.gamma.len();
    let mut dx = vec![0.0f32; dy.len()];
    (dx.par_chunks_exact_mut(d).zip(dy.par_chunks_exact(d)))
        .zip(s.normalised.par_chunks_exact(d).zip(s.inv_sigma.par_iter()))
        .with_min_len(ROWS_PER_TASK)
        .for_each(|((dx, dy), (n, &inv))| {
            let mean_g = lanes2(dy, &ln.gamma, |a, g| a * g) / d as f32;
            let mean_gn = lanes3(dy, &ln.gamma, n, |a, g, n| a * g * n) / d as f32;
            for k in 0..d {
                dx[k] = inv * (dy[k] * ln.gamma[k] - mean_g - n[k] * mean_gn);
            }
        });
    dx
}

/// What one block's backward pass needs.
struct Saved {
    ln_attn: Option<NormState>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: attn_core::AttnOutput,
    after_attn: NormState,
    pre_act: Vec<f32>,
    ln_ff: Option<NormState>,
}

/// `dx = dy · Wᵀ` for a linear layer.
fn linear_backward(layer: &Linear, dy: &[f32], rows: usize, gemm: Gemm) -> Vec<f32> {
    let mut dx = vec![0.0f32; rows * layer.n_in];
    layer.backward_input(dy, &mut dx, gemm);
    dx
}

impl Model {
    /// `y` and its gradients for `enc` with the word embeddings scaled by each of `scales` (1:
    /// the text itself; integrated gradients' points between the 0 baseline and it), run as
    /// one batch. `attentions` also returns every layer's weights and their gradients.
    pub fn gradients(
        &self,
        enc: &Encoding,
        target: &GradTarget,
        scales: &[f32],
        attentions: bool,
    ) -> Result<Gradients, ModelError> {
        let c = self.config();
        if !c.has_attributions() {
            return Err(ModelError::NotForFamily {
                what: "the backward pass (gradient methods)",
                model_type: c.model_type.clone(),
            });
        }
        let (t, d, heads, dh) = (enc.len(), c.hidden_size, c.n_heads, c.head_dim());
        let batch = scales.len();
        if batch == 0 {
            return Err(ModelError::EmptyBatch);
        }
        self.check_target(target)?;
        self.check_batch(std::slice::from_ref(enc))?;
        let rows = batch * t;
        let gemm = Gemm {
            par: parallelism(),
            kernel: self.gemm_kernel(),
        };
        let w = self.weights();
        let words: Vec<f32> = (enc.ids.iter())
            .flat_map(|&id| w.word_embeddings.row(id as usize, d).into_owned())
            .collect();
        // Word embeddings scaled, plus position and token-type embeddings.
        let positions = c.positions(&enc.ids, t);
        let mut x = vec![0.0f32; rows * d];
        for (b, &scale) in scales.iter().enumerate() {
            for (i, &p) in positions.iter().enumerate() {
                let row = &mut x[(b * t + i) * d..][..d];
                self.embedding_row((&words[i * d..][..d], scale), p, enc.segments[i], row);
            }
        }
        let embed_norm = norm_in_place(w.embed_norm.as_ref(), &mut x);
        let shape = AttnShape::new(batch, heads, t, t, dh);
        let options = AttnOptions {
            causal: c.causal.then_some(Causal::TopLeft),
            ..AttnOptions::default()
        };
        let kind = c.kind();
        let mut saved = Vec::with_capacity(c.n_layers);
        for layer in self.layers() {
            let input = &x[..];
            // The value projection's input: the block's (BERT), its ln_1 (GPT-2).
            let mut normed = Vec::new();
            let ln_attn = match kind {
                ModelKind::Bert => None,
                ModelKind::Gpt2 | ModelKind::Llama => {
                    normed = vec![0.0f32; rows * d];
                    Some(norm_forward(&layer.norm_attn, input, &mut normed))
                }
            };
            let xv = if ln_attn.is_some() {
                &normed[..]
            } else {
                input
            };
            let mut qkv = vec![0.0f32; rows * 3 * d];
            layer.qkv.forward(xv, &mut qkv, Epilogue::Bias, gemm);
            let (mut q, mut k, mut v) = (
                vec![0.0; rows * d],
                vec![0.0; rows * d],
                vec![0.0; rows * d],
            );
            split_heads(&qkv, batch, t, (heads, heads), dh, [&mut q, &mut k, &mut v]);
            let attn = {
                let input = AttnInput::allowing_non_finite(&q, &k, &v, shape)?;
                sdpa(&input, &options)
                    .map_err(|error| ModelError::Attention { layer: None, error })?
            };
            let mut ctx = vec![0.0f32; rows * d];
            merge_heads(&attn.out, batch, t, heads, dh, &mut ctx);
            let mut a = vec![0.0f32; rows * d];
            layer.attn_out.forward(&ctx, &mut a, Epilogue::Bias, gemm);
            // The residual stream after attention, then (BERT) its LayerNorm.
            let mut r: Vec<f32> = input.iter().zip(&a).map(|(x, a)| x + a).collect();
            let (after_attn, ff_in) = match kind {
                ModelKind::Bert => {
                    let mut y = vec![0.0f32; rows * d];
                    let s = norm_forward(&layer.norm_attn, &r, &mut y);
                    r = y.clone();
                    (s, y)
                }
                ModelKind::Gpt2 | ModelKind::Llama => {
                    let mut y = vec![0.0f32; rows * d];
                    let s = norm_forward(&layer.norm_ff, &r, &mut y);
                    (s, y)
                }
            };
            let inter = layer.ff_in.n_out;
            let mut pre_act = vec![0.0f32; rows * inter];
            layer
                .ff_in
                .forward(&ff_in, &mut pre_act, Epilogue::Bias, gemm);
            let mut act = pre_act.clone();
            let no_bias = vec![0.0; inter];
            bias_activation_block(&mut act, inter, 0, &no_bias, Some(c.activation));
            let mut o = vec![0.0f32; rows * d];
            layer.ff_out.forward(&act, &mut o, Epilogue::Bias, gemm);
            let mut out: Vec<f32> = r.iter().zip(&o).map(|(r, o)| r + o).collect();
            let ln_ff = match kind {
                ModelKind::Bert => {
                    let mut y = vec![0.0f32; rows * d];
                    let s = norm_forward(&layer.norm_ff, &out, &mut y);
                    out = y;
                    Some(s)
                }
                ModelKind::Gpt2 | ModelKind::Llama => None,
            };
            saved.push(Saved {
                ln_attn,
                q,
                k,
                v,
                attn,
                after_attn,
                pre_act,
                ln_ff,
            });
            x = out;
        }
        let final_norm = norm_in_place(w.final_norm.as_ref(), &mut x);
        // The target and its gradient with respect to the last hidden state.
        let mut dx = vec![0.0f32; rows * d];
        let mut value = Vec::with_capacity(batch);
        for b in 0..batch {
            let states = &x[b * t * d..][..t * d];
            let grad = &mut dx[b * t * d..][..t * d];
            value.push(self.target_grad(target, enc, states, grad)?);
        }
        // Backward through the blocks.
        if let (Some(ln), Some(s)) = (&w.final_norm, &final_norm) {
            dx = norm_backward(ln, s, &dx);
        }
        let mut d_attn = attentions.then(|| vec![0.0f32; batch * c.n_layers * heads * t * t]);
        let mut weights = attentions.then(|| vec![0.0f32; batch * c.n_layers * heads * t * t]);
        for (l, (layer, s)) in self.layers().iter().zip(&saved).enumerate().rev() {
            // dx: the gradient of the block's output.
            let (d_r, d_ff_in) = match kind {
                ModelKind::Bert => {
                    let d_out = norm_backward(&layer.norm_ff, s.ln_ff.as_ref().expect("BERT"), &dx);
                    (d_out.clone(), d_out)
                }
                ModelKind::Gpt2 | ModelKind::Llama => (dx.clone(), dx.clone()),
            };
            let inter = layer.ff_in.n_out;
            let mut d_act = linear_backward(&layer.ff_out, &d_ff_in, rows, gemm);
            let block = inter * ROWS_PER_TASK;
            (d_act.par_chunks_mut(block).zip(s.pre_act.par_chunks(block)))
                .for_each(|(g, z)| activation_backward(c.activation, g, z));
            debug_assert_eq!(d_act.len(), rows * inter);
            let d_ffx = linear_backward(&layer.ff_in, &d_act, rows, gemm);
            // The gradient of the residual stream after attention (before BERT's LayerNorm).
            let d_res: Vec<f32> = match kind {
                ModelKind::Bert => {
                    let total: Vec<f32> = d_r.iter().zip(&d_ffx).map(|(a, b)| a + b).collect();
                    norm_backward(&layer.norm_attn, &s.after_attn, &total)
                }
                ModelKind::Gpt2 | ModelKind::Llama => {
                    let through = norm_backward(&layer.norm_ff, &s.after_attn, &d_ffx);
                    d_r.iter().zip(&through).map(|(a, b)| a + b).collect()
                }
            };
            let d_ctx = linear_backward(&layer.attn_out, &d_res, rows, gemm);
            let mut d_out = vec![0.0f32; rows * d];
            split_heads_of(&d_ctx, (batch, t, heads, dh), &mut d_out);
            if let (Some(da), Some(ws)) = (&mut d_attn, &mut weights) {
                let at = (l, c.n_layers, c.causal);
                attention_grads(s, &d_out, (batch, heads, t, dh), at, (da, ws));
            }
            let input = AttnInput::allowing_non_finite(&s.q, &s.k, &s.v, shape)?;
            let g = sdpa_backward(&input, &options, &s.attn, &d_out).map_err(|error| {
                ModelError::Attention {
                    layer: Some(l),
                    error,
                }
            })?;
            let mut d_qkv = vec![0.0f32; rows * 3 * d];
            merge_qkv(&g.dq, &g.dk, &g.dv, (batch, t, heads, dh), &mut d_qkv);
            let d_xv = linear_backward(&layer.qkv, &d_qkv, rows, gemm);
            let d_input: Vec<f32> = match kind {
                ModelKind::Bert => d_res.iter().zip(&d_xv).map(|(a, b)| a + b).collect(),
                ModelKind::Gpt2 | ModelKind::Llama => {
                    let ln = s.ln_attn.as_ref().expect("GPT-2");
                    let through = norm_backward(&layer.norm_attn, ln, &d_xv);
                    d_res.iter().zip(&through).map(|(a, b)| a + b).collect()
                }
            };
            dx = d_input;
        }
        if let (Some(ln), Some(s)) = (&w.embed_norm, &embed_norm) {
            dx = norm_backward(ln, s, &dx);
        }
        Ok(Gradients {
            seq_len: t,
            value,
            embeddings: words,
            d_embeddings: dx,
            attentions: weights.zip(d_attn),
        })
    }

    /// Refuses a target the model cannot give.
    fn check_target(&self, target: &GradTarget) -> Result<(), ModelError> {
        let c = self.config();
        match target {
            GradTarget::Logit(label) => {
                let n = self.labels()?.len();
                if *label >= n {
                    return Err(ModelError::InvalidInput {
                        what: "target",
                        reason: format!("label {label} of a classifier with {n} labels"),
                    });
                }
            }
            GradTarget::NextToken(id) => {
                if !(c.causal && self.task().is_none_or(|t| t == Task::NextToken)) {
                    return Err(self.no_head(Task::NextToken));
                }
                if *id as usize >= c.vocab_size {
                    return Err(ModelError::TokenOutOfVocab {
                        id: *id,
                        vocab_size: c.vocab_size,
                    });
                }
            }
            GradTarget::Cosine(v) => {
                if v.len() != c.hidden_size {
                    return Err(ModelError::InvalidInput {
                        what: "target",
                        reason: format!(
                            "an embedding of {} values for a model of width {}",
                            v.len(),
                            c.hidden_size
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// `y` of one text's last hidden state `states` (`[T, hidden]`), and `∂y/∂states` into
    /// `grad`.
    fn target_grad(
        &self,
        target: &GradTarget,
        enc: &Encoding,
        states: &[f32],
        grad: &mut [f32],
    ) -> Result<f32, ModelError> {
        let d = self.config().hidden_size;
        let t = enc.len();
        match target {
            GradTarget::Logit(label) => {
                let at = self
                    .pooled_token(enc)
                    .ok_or_else(|| self.no_head(Task::Classification))?;
                let (y, g) = self.classifier_logit_grad(&states[at * d..][..d], *label)?;
                grad[at * d..][..d].copy_from_slice(&g);
                Ok(y)
            }
            GradTarget::NextToken(id) => {
                let row = &*self.weights().lm_head().row(*id as usize, d);
                let last = &states[(t - 1) * d..][..d];
                grad[(t - 1) * d..][..d].copy_from_slice(row);
                Ok(last.iter().zip(row).map(|(a, b)| a * b).sum())
            }
            GradTarget::Cosine(target) => {
                let mut u = vec![0.0f32; d];
                for row in states.chunks_exact(d) {
                    u.iter_mut().zip(row).for_each(|(u, v)| *u += v / t as f32);
                }
                let nu = u.iter().map(|v| v * v).sum::<f32>().sqrt();
                let nt = target.iter().map(|v| v * v).sum::<f32>().sqrt();
                if nu == 0.0 || nt == 0.0 {
                    return Err(ModelError::InvalidInput {
                        what: "target",
                        reason: "a cosine with a zero vector".into(),
                    });
                }
                let dot: f32 = u.iter().zip(target).map(|(a, b)| a * b).sum();
                let y = dot / (nu * nt);
                let du: Vec<f32> = (u.iter().zip(target))
                    .map(|(u, tv)| tv / (nu * nt) - y * u / (nu * nu))
                    .collect();
                for row in grad.chunks_exact_mut(d) {
                    row.iter_mut().zip(&du).for_each(|(g, v)| *g = v / t as f32);
                }
                Ok(y)
            }
        }
    }
}

/// `[rows, hidden]` into `[batch, heads, T, head_dim]` (`q`'s layout) in `dst`.
fn split_heads_of(x: &[f32], (batch, t, heads, dh): (usize, usize, usize, usize), dst: &mut [f32]) {
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..t {
                dst[((b * heads + h) * t + i) * dh..][..dh]
                    .copy_from_slice(&x[(b * t + i) * heads * dh + h * dh..][..dh]);
            }
        }
    }
}

/// `dq | dk | dv` (`[batch, heads, T, head_dim]` each) into `[rows, 3·hidden]`, the layout of
/// the query/key/value projection's output.
fn merge_qkv(
    dq: &[f32],
    dk: &[f32],
    dv: &[f32],
    (batch, t, heads, dh): (usize, usize, usize, usize),
    dst: &mut [f32],
) {
    let d = heads * dh;
    for (part, src) in [dq, dk, dv].into_iter().enumerate() {
        for b in 0..batch {
            for h in 0..heads {
                for i in 0..t {
                    dst[(b * t + i) * 3 * d + part * d + h * dh..][..dh]
                        .copy_from_slice(&src[((b * heads + h) * t + i) * dh..][..dh]);
                }
            }
        }
    }
}

/// Layer `l`'s weights `A = softmax(q·kᵀ/√d)` (from the saved log-sum-exp; a causal model's
/// query `i` sees keys `0..=i`) and `∂y/∂A = ∂y/∂out · vᵀ`, into `[batch, layers, heads, T, T]`.
fn attention_grads(
    s: &Saved,
    d_out: &[f32],
    (batch, heads, t, dh): (usize, usize, usize, usize),
    (l, n_layers, causal): (usize, usize, bool),
    (d_attn, weights): (&mut [f32], &mut [f32]),
) {
    let scale = 1.0 / (dh as f32).sqrt();
    for b in 0..batch {
        for h in 0..heads {
            let base = ((b * heads + h) * t) * dh;
            let q = MatRef::from_row_major_slice(&s.q[base..][..t * dh], t, dh);
            let k = MatRef::from_row_major_slice(&s.k[base..][..t * dh], t, dh);
            let v = MatRef::from_row_major_slice(&s.v[base..][..t * dh], t, dh);
            let g = MatRef::from_row_major_slice(&d_out[base..][..t * dh], t, dh);
            let at = ((b * n_layers + l) * heads + h) * t * t;
            let mut scores = vec![0.0f32; t * t];
            matmul(
                MatMut::from_row_major_slice_mut(&mut scores, t, t),
                Accum::Replace,
                q,
                k.transpose(),
                scale,
                faer::Par::Seq,
            );
            let lse = &s.attn.lse[(b * heads + h) * t..][..t];
            for i in 0..t {
                for j in 0..t {
                    let seen = !causal || j <= i;
                    weights[at + i * t + j] = match seen {
                        true => (scores[i * t + j] - lse[i]).exp(),
                        false => 0.0,
                    };
                }
            }
            matmul(
                MatMut::from_row_major_slice_mut(&mut d_attn[at..][..t * t], t, t),
                Accum::Replace,
                g,
                v.transpose(),
                1.0f32,
                faer::Par::Seq,
            );
        }
    }
}

/// The most rows (points × tokens) integrated gradients runs as one batch: each batch holds
/// every layer's activations (about 80 KiB a row for a width of 384).
const IG_ROWS: usize = 2048;

/// `n`-point Gauss–Legendre nodes and weights on `[0, 1]` (numpy's `leggauss`, which Captum's
/// default integration uses, mapped from `[−1, 1]`), by Newton's method on `P_n`.
pub fn gauss_legendre(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|i| {
            let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            let mut dp = 1.0;
            for _ in 0..100 {
                let (mut p0, mut p1) = (1.0, x);
                for k in 2..=n {
                    let p2 = ((2 * k - 1) as f64 * x * p1 - (k - 1) as f64 * p0) / k as f64;
                    (p0, p1) = (p1, p2);
                }
                dp = n as f64 * (x * p1 - p0) / (x * x - 1.0);
                let step = p1 / dp;
                x -= step;
                if step.abs() < 1e-15 {
                    break;
                }
            }
            let w = 2.0 / ((1.0 - x * x) * dp * dp);
            (0.5 * (x + 1.0), 0.5 * w)
        })
        .collect()
}

/// Integrated gradients of a text: each token's score and the completeness gap.
#[derive(Debug, Clone, PartialEq)]
pub struct IntegratedGradients {
    /// `s_j = Σ_d e_jd · ∫₀¹ ∂y/∂x_jd(α·e) dα`, `[T]`.
    pub scores: Vec<f32>,
    /// `y(e)`.
    pub value: f32,
    /// `y(0)`: the baseline's (no word embeddings; positions and token types kept).
    pub baseline: f32,
    /// `|Σ_j s_j − (y(e) − y(0))|`.
    pub completeness_gap: f32,
}

impl Model {
    /// Input × gradient: `s_j = ‖e_j ⊙ ∂y/∂e_j‖₂` and `y`.
    pub fn grad_input(
        &self,
        enc: &Encoding,
        target: &GradTarget,
    ) -> Result<(Vec<f32>, f32), ModelError> {
        let g = self.gradients(enc, target, &[1.0], false)?;
        let d = self.config().hidden_size;
        let scores = (g
            .embeddings
            .chunks_exact(d)
            .zip(g.d_embeddings.chunks_exact(d)))
        .map(|(e, g)| {
            e.iter()
                .zip(g)
                .map(|(e, g)| (e * g) * (e * g))
                .sum::<f32>()
                .sqrt()
        })
        .collect();
        Ok((scores, g.value[0]))
    }

    /// Integrated gradients from the baseline of no word embeddings (`inputs_embeds` 0, as
    /// transformers adds positions and token types to it) with `steps` Gauss–Legendre points,
    /// run in batches.
    pub fn integrated_gradients(
        &self,
        enc: &Encoding,
        target: &GradTarget,
        steps: usize,
    ) -> Result<IntegratedGradients, ModelError> {
        if steps == 0 {
            return Err(ModelError::InvalidInput {
                what: "steps",
                reason: "integrated gradients needs at least 1 step".into(),
            });
        }
        let d = self.config().hidden_size;
        let t = enc.len();
        // The path's points, then its two ends (y(e) and y(0)) in the same batches.
        let mut points = gauss_legendre(steps);
        points.extend([(1.0, 0.0), (0.0, 0.0)]);
        let mut integral = vec![0.0f64; t * d];
        let mut embeddings = Vec::new();
        let mut values = Vec::with_capacity(points.len());
        for chunk in points.chunks((IG_ROWS / t).max(1)) {
            let scales: Vec<f32> = chunk.iter().map(|&(a, _)| a as f32).collect();
            let g = self.gradients(enc, target, &scales, false)?;
            for (n, &(_, w)) in chunk.iter().enumerate() {
                let grad = &g.d_embeddings[n * t * d..][..t * d];
                integral
                    .iter_mut()
                    .zip(grad)
                    .for_each(|(acc, &g)| *acc += w * f64::from(g));
            }
            values.extend(g.value);
            embeddings = g.embeddings;
        }
        let (value, baseline) = (values[steps], values[steps + 1]);
        let scores: Vec<f32> = (embeddings.chunks_exact(d).zip(integral.chunks_exact(d)))
            .map(|(e, g)| {
                e.iter()
                    .zip(g)
                    .map(|(&e, &g)| f64::from(e) * g)
                    .sum::<f64>() as f32
            })
            .collect();
        let total: f64 = scores.iter().map(|&s| f64::from(s)).sum();
        Ok(IntegratedGradients {
            completeness_gap: (total - f64::from(value - baseline)).abs() as f32,
            scores,
            value,
            baseline,
        })
    }

    /// Chefer et al. 2021's generic rule: `Ā_l = mean_h (∇_{A_l} y ⊙ A_l)⁺`, `R = I`,
    /// `R ← R + Ā_l · R` for each layer from the input up; returns `R` (`[T, T]`) and `y`.
    pub fn attention_gradient_rollout(
        &self,
        enc: &Encoding,
        target: &GradTarget,
    ) -> Result<(Vec<f32>, f32), ModelError> {
        let g = self.gradients(enc, target, &[1.0], true)?;
        let c = self.config();
        let (t, heads) = (enc.len(), c.n_heads);
        let Some((weights, d_weights)) = &g.attentions else {
            return Err(ModelError::InvalidInput {
                what: "gradients",
                reason: "no attention gradients were returned".into(),
            });
        };
        let mut r: Vec<f64> = (0..t * t)
            .map(|at| f64::from(u8::from(at / t == at % t)))
            .collect();
        for l in 0..c.n_layers {
            let mut mean = vec![0.0f64; t * t];
            for h in 0..heads {
                let at = (l * heads + h) * t * t;
                for (m, (a, g)) in mean
                    .iter_mut()
                    .zip(weights[at..][..t * t].iter().zip(&d_weights[at..][..t * t]))
                {
                    *m += f64::from((a * g).max(0.0)) / heads as f64;
                }
            }
            // R + Ā R
            let product: Vec<f64> = (0..t * t)
                .map(|at| {
                    (0..t)
                        .map(|k| mean[at / t * t + k] * r[k * t + at % t])
                        .sum()
                })
                .collect();
            r.iter_mut().zip(product).for_each(|(r, p)| *r += p);
        }
        Ok((r.iter().map(|&v| v as f32).collect(), g.value[0]))
    }
}
