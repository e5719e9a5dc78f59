//! Exact scaled dot-product attention with every mask PyTorch, FlashAttention and xFormers offer.
//!
//! `attention(Q, K, V) = softmax(scale · Q·Kᵀ [+ softcap, ALiBi, float mask] | visible) · V`, with
//! PyTorch's semantics (the repository's tests check them against PyTorch's own outputs), in
//! the order they apply:
//! 1. `score = scale · q·k`
//! 2. softcap `c`: `score = c · tanh(score / c)`
//! 3. ALiBi: `score -= slope_h · |i + o − j|`
//! 4. float mask: `score += mask`
//! 5. visibility: causal, window, boolean mask, key padding ([`mask`])
//! 6. softmax over the visible keys; a query row that sees no key gets output 0, weights 0 and
//!    log-sum-exp −∞ — never NaN.
//!
//! The diagonal offset `o` (ALiBi, causal, window) is `seq_kv − seq_q` for a bottom-right
//! causal mask, else 0. Without a causal mask, [`AttnOptions::align`] can put the window and
//! ALiBi at the bottom right too, as FlashAttention always does.
//!
//! [`sdpa`] is the fast path; [`sdpa_reference`] is its plain, readable twin that tests compare
//! against. [`mha`] builds multi-head attention (projections, masks, weights) on top.
//!
//! Tensors are row-major `f32` slices (`bf16` for [`sdpa_bf16`]) with their dims in an
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
//! let row = weights.row(&shape, 0, 1, 2).expect("row 2 was asked for"); // batch 0, head 1
//! assert_eq!(row[3], 0.0); // query 2 does not see key 3
//! assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
//!
//! // The plain reference twin gives the same output.
//! let slow = sdpa_reference(&input, &options)?;
//! assert!(fast.out.iter().zip(&slow.out).all(|(a, b)| (a - b).abs() < 1e-5));
//! # Ok::<(), attn_core::AttnError>(())
//! ```

#![warn(missing_docs)]

mod aligned;
pub mod amx;
pub mod backward;
mod bf16dot;
#[cfg(target_arch = "x86_64")]
mod bf16x;
pub mod error;
pub mod fused;
pub mod mask;
pub mod mha;
pub mod options;
pub mod reference;
pub mod shape;
pub mod varlen;

pub use backward::{
    Grads, sdpa_backward, sdpa_backward_float_mask, sdpa_backward_float_mask_reference,
    sdpa_backward_reference,
};
pub use error::AttnError;
pub use fused::{AttnInputBf16, Isa, sdpa_bf16, set_global_threads};
pub use half::bf16;
pub use mask::{BoolMask, Causal, FloatMask, KeyPadding, Window};
pub use mha::{
    Linear, LinearGrads, MhaConfig, MhaGrads, MhaInput, MhaOutput, MultiheadAttention, StateDict,
};
pub use options::{AttnOptions, Dropout, WeightsRequest};
pub use reference::sdpa_reference;
pub use shape::{AttnInput, AttnOutput, AttnShape, Weights};
pub use varlen::{PackedDims, PackedInput, PackedOutput, sdpa_varlen, sdpa_varlen_backward};

/// Says on the process's standard error, which the test harness does not capture, that the
/// running test leaves `what` unchecked because this CPU cannot run it.
#[cfg(test)]
pub(crate) fn not_on_this_cpu(what: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let _ = writeln!(
        std::io::stderr(),
        "note: {test}: {what} not checked, this CPU lacks it"
    );
}

/// Every instruction set this CPU runs; the others are named as not checked
/// ([`not_on_this_cpu`]).
#[cfg(test)]
pub(crate) fn available_isas() -> Vec<Isa> {
    let (run, lacking): (Vec<Isa>, Vec<Isa>) =
        Isa::ALL.into_iter().partition(|isa| isa.is_available());
    if !lacking.is_empty() {
        not_on_this_cpu(&format!("{lacking:?}"));
    }
    run
}

/// `n` zeros written one by one, for a buffer that is read before it is written.
///
/// `vec![0.0; n]` maps a large buffer to the kernel's shared zero page: a read maps that page
/// and the first write then takes a copy-on-write fault whose TLB flush interrupts every other
/// core (measured at about 15% of a 2048-token backward pass). Writing the zeros takes plain
/// first-touch faults instead.
pub(crate) fn zeros_written(n: usize) -> Vec<f32> {
    let mut buf = Vec::with_capacity(n);
    buf.resize(n, 0.0);
    buf
}

/// The larger of `a` and `b`, NaN when either is: `f32::max` skips a NaN, which would let a NaN
/// score pass for a hidden one.
pub(crate) fn max_keeping_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Scaled dot-product attention: the fast path.
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - output `out`: `[batch, n_heads, seq_q, value_dim]`, `lse`: `[batch, n_heads, seq_q]`
///
/// The fused kernel of [`fused`] on the best instruction set of this CPU: O((seq_q + seq_kv) ·
/// head_dim) memory, weights recomputed from the saved log-sum-exp only when asked for.
pub fn sdpa(input: &AttnInput<'_>, options: &AttnOptions) -> Result<AttnOutput, AttnError> {
    fused::sdpa_with(fused::Isa::best(), input, options)
}
