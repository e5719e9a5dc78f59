//! What each token passes on through attention, from the model's own tensors, not only where
//! a head looks: for layer `l`, with `x_j` the value projection's input for token `j` (the
//! layer's input for BERT; GPT-2's `ln_1` of it), `A^h` a head's weights and
//! `f^h(x) = (x·W_V^h + b_V^h)·W_O^h` (`W_O^h` the head's rows of the output projection; its bias
//! `b_O` is no token's share):
//!
//! - the norm of Kobayashi et al. 2020, "Attention is Not Only a Weight":
//!   `N[i][j] = ‖Σ_h A^h[i][j] · f^h(x_j)‖₂`;
//! - ALTI, Ferrando et al. 2022, "Measuring the Mixing of Contextual Information in the
//!   Transformer" (their reference code: mt-upc/transformer-contributions):
//!   `T_i(x_j) = 𝓛_i(Σ_h A^h[i][j] f^h(x_j) + δ_ij x_i)` and
//!   `c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)`, normalised over `j`. For post-LN models
//!   (BERT) `𝓛_i` is the linear part of the LayerNorm after the residual, token `i`'s
//!   `σ = √(biased variance + eps)` held fixed, and `y_i` that LayerNorm's output; for pre-LN
//!   models (GPT-2) there is no LayerNorm: `y_i` is the residual stream after attention, and the
//!   `x_i` of `δ_ij x_i` the residual stream entering the layer. (The reference code takes σ
//!   as the unbiased standard deviation of `pre-LN + eps`; this takes the LayerNorm's own.)

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use crate::model::parallelism;
use crate::ops::{Epilogue, Gemm, lanes, lanes2, lanes3};
use crate::weights::Layer;
use crate::{Encoding, Model, ModelError, ModelKind, RunOptions};

/// Every layer's token-to-token contributions for one text: row `i` the token that receives,
/// column `j` the token whose vector it receives.
#[derive(Debug, Clone, PartialEq)]
pub struct Contributions {
    /// Layers.
    pub n_layers: usize,
    /// Tokens.
    pub seq_len: usize,
    /// `[layers, T, T]`: `‖Σ_h A^h[i][j] · f^h(x_j)‖₂`.
    pub norm: Vec<f32>,
    /// `[layers, T, T]`: ALTI's `c_ij`, each row summing to 1 (all 0 where no source adds to
    /// `y_i`), before the layers are rolled out.
    pub alti: Vec<f32>,
    /// The forward pass's attention weights, `[layers, heads, T, T]`.
    pub attentions: Vec<f32>,
}

impl Model {
    /// The norm-based and ALTI contributions of every layer for `enc`, from one forward pass
    /// (its attentions and hidden states) and each layer's value and output projections again.
    pub fn contributions(&self, enc: &Encoding) -> Result<Contributions, ModelError> {
        if !self.config().has_attributions() {
            return Err(ModelError::NotForFamily {
                what: "norm and ALTI contributions",
                model_type: self.config().model_type.clone(),
            });
        }
        let options = RunOptions {
            attentions: true,
            hidden_states: true,
            ..RunOptions::default()
        };
        let out = self.forward(enc, &options)?;
        let c = self.config();
        let (t, d, heads, dh) = (enc.len(), c.hidden_size, c.n_heads, c.head_dim());
        let missing = |what| ModelError::InvalidInput {
            what: "forward pass",
            reason: format!("it returned no {what}"),
        };
        let attentions = out.attentions.ok_or_else(|| missing("attentions"))?;
        let hidden = out.hidden_states.ok_or_else(|| missing("hidden states"))?;
        let gemm = Gemm {
            par: parallelism(),
            kernel: self.gemm_kernel(),
        };
        let layers = self.layers();
        let mut norm = vec![0.0f32; layers.len() * t * t];
        let mut alti = vec![0.0f32; layers.len() * t * t];
        let mut normed = vec![0.0f32; t * d];
        let mut qkv = vec![0.0f32; t * 3 * d];
        for (l, layer) in layers.iter().enumerate() {
            let x = &hidden[l * t * d..][..t * d];
            let xv: &[f32] = match c.kind() {
                ModelKind::Bert => x,
                ModelKind::Gpt2 | ModelKind::Llama => {
                    layer.norm_attn.apply_into(x, &mut normed);
                    &normed
                }
            };
            layer.qkv.forward(xv, &mut qkv, Epilogue::Bias, gemm);
            // f^h(x_j), [T, H, d]: token-major, so that each token's heads are one block.
            let mut f = vec![0.0f32; t * heads * d];
            let mut fh = vec![0.0f32; t * d];
            for h in 0..heads {
                let v = &qkv[2 * d + h * dh..];
                (layer.attn_out).multiply_input_rows(v, (t, 3 * d), h * dh..(h + 1) * dh, &mut fh);
                for (j, row) in fh.chunks_exact(d).enumerate() {
                    f[(j * heads + h) * d..][..d].copy_from_slice(row);
                }
            }
            let a = &attentions[l * heads * t * t..][..heads * t * t];
            let layer_kind = (c.kind(), layer);
            let (norm_l, alti_l) = layer_contributions(layer_kind, (a, &f, x), (t, heads, d));
            norm[l * t * t..][..t * t].copy_from_slice(&norm_l);
            alti[l * t * t..][..t * t].copy_from_slice(&alti_l);
        }
        Ok(Contributions {
            n_layers: layers.len(),
            seq_len: t,
            norm,
            alti,
            attentions,
        })
    }
}

/// `x` times the `[rows, cols]` row-major `b` into the row-major `out` (`[rows_x, cols]`), with
/// `x` `[rows_x, rows]` row-major.
fn gemm(x: &[f32], (m, k, n): (usize, usize, usize), b: &[f32], out: &mut [f32]) {
    let x = MatRef::from_row_major_slice(&x[..m * k], m, k);
    let b = MatRef::from_row_major_slice(&b[..k * n], k, n);
    let dst = MatMut::from_row_major_slice_mut(&mut out[..m * n], m, n);
    matmul(dst, Accum::Replace, x, b, 1.0f32, Par::Seq);
}

/// One layer's norm and ALTI matrices (`[T, T]` each) from its weights `a` (`[H, T, T]`), the
/// transformed values `f` (`[T, H, d]`) and its input `x` (`[T, d]`).
///
/// For each source `j` the vectors `s_ij = Σ_h A^h[i][j] f^h(x_j)` of every `i` are one GEMM,
/// `[T, H] · [H, d]`, so no `[T, T, d]` tensor is ever held.
fn layer_contributions(
    (kind, layer): (ModelKind, &Layer),
    (a, f, x): (&[f32], &[f32], &[f32]),
    (t, heads, d): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let bias = &layer.attn_out.bias;
    // The residual stream after attention before any LayerNorm: x_i + Σ_h (A^h f^h)_i + b_O.
    let mut pre: Vec<f32> = (x.chunks_exact(d))
        .flat_map(|xi| xi.iter().zip(bias).map(|(x, b)| x + b))
        .collect();
    let mut fh = vec![0.0f32; t * d];
    let mut out = vec![0.0f32; t * d];
    for h in 0..heads {
        for (j, row) in fh.chunks_exact_mut(d).enumerate() {
            row.copy_from_slice(&f[(j * heads + h) * d..][..d]);
        }
        gemm(&a[h * t * t..], (t, t, d), &fh, &mut out);
        pre.iter_mut().zip(&out).for_each(|(p, v)| *p += v);
    }
    // y_i, and for BERT the LayerNorm's σ_i (1 for GPT-2, whose 𝓛_i is the identity).
    let ln = &layer.norm_attn;
    let (y, sigma): (Vec<f32>, Vec<f32>) = match kind {
        ModelKind::Gpt2 | ModelKind::Llama => (pre, vec![1.0; t]),
        ModelKind::Bert => {
            let mut y = Vec::with_capacity(t * d);
            let mut sigma = Vec::with_capacity(t);
            for row in pre.chunks_exact(d) {
                let mean = row.iter().sum::<f32>() / d as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
                let s = (var + ln.eps).sqrt();
                y.extend(
                    (row.iter().zip(&ln.gamma).zip(&ln.beta))
                        .map(|((v, g), b)| g * (v - mean) / s + b),
                );
                sigma.push(s);
            }
            (y, sigma)
        }
    };
    let y_norms: Vec<f32> = y
        .chunks_exact(d)
        .map(|r| r.iter().map(|v| v.abs()).sum())
        .collect();
    // Column j of both matrices, for every j.
    let columns: Vec<(Vec<f32>, Vec<f32>)> = (0..t)
        .into_par_iter()
        .map(|j| {
            let mut aj = vec![0.0f32; t * heads];
            for i in 0..t {
                for h in 0..heads {
                    aj[i * heads + h] = a[(h * t + i) * t + j];
                }
            }
            let mut s = vec![0.0f32; t * d];
            gemm(&aj, (t, heads, d), &f[j * heads * d..], &mut s);
            let mut norm_col = vec![0.0f32; t];
            let mut alti_col = vec![0.0f32; t];
            for (i, sij) in s.chunks_exact_mut(d).enumerate() {
                norm_col[i] = lanes(sij, |v| v * v).sqrt();
                if i == j {
                    sij.iter_mut()
                        .zip(&x[i * d..][..d])
                        .for_each(|(v, x)| *v += x);
                }
                let yi = &y[i * d..][..d];
                let distance = match kind {
                    ModelKind::Gpt2 | ModelKind::Llama => lanes2(yi, sij, |y, v| (y - v).abs()),
                    ModelKind::Bert => {
                        let mean = lanes(sij, |v| v) / d as f32;
                        let scale = 1.0 / sigma[i];
                        lanes3(yi, sij, &ln.gamma, |y, v, g| {
                            (y - g * (v - mean) * scale).abs()
                        })
                    }
                };
                alti_col[i] = (y_norms[i] - distance).max(0.0);
            }
            (norm_col, alti_col)
        })
        .collect();
    let mut norm = vec![0.0f32; t * t];
    let mut alti = vec![0.0f32; t * t];
    for (j, (n, c)) in columns.iter().enumerate() {
        for i in 0..t {
            norm[i * t + j] = n[i];
            alti[i * t + j] = c[i];
        }
    }
    for row in alti.chunks_exact_mut(t) {
        let total: f32 = row.iter().sum();
        if total > 0.0 {
            row.iter_mut().for_each(|v| *v /= total);
        }
    }
    (norm, alti)
}
