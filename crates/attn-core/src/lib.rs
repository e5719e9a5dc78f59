//! Exact scaled dot-product attention with every mask PyTorch, FlashAttention and xFormers offer.
//!
//! `attention(Q, K, V) = softmax(scale · Q·Kᵀ [+ softcap, ALiBi, float mask] | visible) · V`, with
//! PyTorch's semantics (the repository's tests check them against PyTorch's own outputs), in
//! the order they apply:
//! 1. `score = scale · q·k`
//! 2. softcap `c`: `score = c · tanh(score / c)`
//! 3. ALiBi: `score -= slope_h · |i + o − j|`
//! 4. float mask: `score += mask`
//! 5. visibility: causal, window, boolean mask, key padding ([`Causal`], [`Window`],
//!    [`BoolMask`], [`KeyPadding`])
//! 6. softmax over the visible keys; a query row that sees no key gets output 0, weights 0 and
//!    log-sum-exp −∞ — never NaN.
//!
//! The diagonal offset `o` (ALiBi, causal, window) is `seq_kv − seq_q` for a bottom-right
//! causal mask, else 0. Without a causal mask, [`AttnOptions::align`] can put the window and
//! ALiBi at the bottom right too, as FlashAttention always does.
//!
//! [`sdpa`] is the fast path; [`sdpa_reference`] is its plain, readable twin that tests compare
//! against. [`MultiheadAttention`] builds multi-head attention (projections, masks, weights) on
//! top.
//!
//! Tensors are row-major `f32` (or `bf16`) slices with their dims in an
//! [`AttnShape`]: q is `[batch, n_heads, seq_q, head_dim]`, k and v `[batch, n_kv_heads,
//! seq_kv, _]`, the output `[batch, n_heads, seq_q, value_dim]`. Indices count from 0.
//!
//! ```
//! use attn_core::{AttnInput, AttnOptions, AttnShape, Causal, WeightsRequest, sdpa, sdpa_reference};
//!
//! // One sequence, 2 heads, 4 tokens, head_dim 8 (with `.with_kv_heads(1)` and k, v of one
//! // head each, 32 values, the two heads would share one key/value head).
//! let shape = AttnShape::new(1, 2, 4, 4, 8);
//! let q: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
//! let k: Vec<f32> = (0..64).map(|i| (i as f32 * 0.11).cos()).collect();
//! let v: Vec<f32> = (0..64).map(|i| i as f32 / 64.0).collect();
//! let input = AttnInput::new(&q, &k, &v, shape)?;
//!
//! // Causal attention, and the weights of query 2 only: recomputed from the saved
//! // log-sum-exp, they cost one row, not the whole matrix.
//! let options = AttnOptions {
//!     causal: Some(Causal::TopLeft),
//!     weights: WeightsRequest::Rows(vec![2]),
//!     ..AttnOptions::default()
//! };
//! let fast = sdpa(&input, &options)?;
//! let weights = fast.weights.as_ref().expect("asked for");
//! let row = weights.row(0, 1, 2).expect("row 2 was asked for"); // batch 0, head 1
//! assert_eq!(row[3], 0.0); // query 2 does not see key 3
//! assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//!
//! // The plain reference twin gives the same output.
//! let slow = sdpa_reference(&input, &options)?;
//! assert!(fast.out.iter().zip(&slow.out).all(|(a, b)| (a - b).abs() < 1e-5));
//! # Ok::<(), attn_core::AttnError>(())
//! ```
//!
//! # The whole surface
//!
//! | what | items |
//! |---|---|
//! | one call | [`sdpa`], [`sdpa_reference`], on f32 or [`bf16`] inputs ([`AttnElement`]) |
//! | its tensors | [`AttnShape`], [`AttnInput`], [`AttnOutput`], [`Weights`] |
//! | its options | [`AttnOptions`], [`WeightsRequest`], [`Dropout`] |
//! | masks | [`Causal`], [`Window`], [`BoolMask`], [`FloatMask`] (both a [`Broadcast`]), [`KeyPadding`], [`causal_matrix`] |
//! | gradients | [`sdpa_backward`], [`sdpa_backward_reference`], [`Grads`] (a float mask's with [`AttnOptions::float_mask_grad`]) |
//! | packed batches | [`sdpa_varlen`], [`sdpa_varlen_backward`], [`PackedInput`], [`PackedDims`], [`PackedOutput`] |
//! | `nn.MultiheadAttention` | [`MultiheadAttention`], [`MhaConfig`], [`MhaInput`], [`MhaOutput`], [`MhaGrads`], [`Linear`], [`LinearGrads`], [`StateDict`] |
//! | the CPU | [`Isa`] (forced with [`AttnOptions::isa`]), [`set_global_threads`], [`MAX_THREADS`] |
//! | limits and errors | [`AttnError`], [`MAX_WEIGHTS_BYTES`], [`MAX_EMPTY_HEAD_SCORES`], [`f32_bytes`] |

#![warn(missing_docs)]

mod backward;
mod cpu;
mod error;
mod fused;
mod input;
mod mask;
mod mha;
mod options;
mod reference;
mod shape;
mod varlen;

pub use backward::{Grads, sdpa_backward, sdpa_backward_reference};
pub use cpu::{Bf16x3Weight, Isa, MAX_THREADS, set_global_threads};
pub use error::AttnError;
pub use fused::sdpa;
/// The bf16 type of [`AttnInput`]s in bf16 (from the `half` crate), for callers without that
/// dependency.
pub use half::bf16;
pub use input::{AttnElement, AttnInput};
pub use mask::{BoolMask, Broadcast, Causal, FloatMask, KeyPadding, Window, causal_matrix};
pub use mha::{
    Linear, LinearGrads, MhaConfig, MhaGrads, MhaInput, MhaOutput, MultiheadAttention, StateDict,
};
pub use options::{AttnOptions, Dropout, WeightsRequest};
pub use reference::sdpa_reference;
pub use shape::{
    AttnOutput, AttnShape, MAX_EMPTY_HEAD_SCORES, MAX_WEIGHTS_BYTES, Weights, f32_bytes,
};
pub use varlen::{PackedDims, PackedInput, PackedOutput, sdpa_varlen, sdpa_varlen_backward};
