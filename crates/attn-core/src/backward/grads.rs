//! What every backward pass shares: the gradients' type, the checks of its inputs and saved
//! results, and the refusal of gradients that overflowed.

use rayon::prelude::*;

use crate::cpu::FiniteBits;
use crate::error::AttnError;
use crate::input::AttnInput;
use crate::mask::FloatMask;
use crate::options::AttnOptions;
use crate::shape::{check_finite, check_len};

/// The largest `|lse|` the fast path recomputes `P = e^(S − lse)` from. The saved f32 `lse` of
/// a row holds `ln(Σ e^(s − max))` only to `|lse|·2⁻²⁴`, which `P` takes as a relative error:
/// at most 8e-6 here, but under a float mask of −1e30 on every key of a row (or of
/// `finfo.min`, or scores near 1e30) the row's sum is lost whole, `P = 1` at each of its keys,
/// and `dv` came out 4 times too large for 4 keys (PyTorch's fused CPU backward does the
/// same; its math path and the reference loop, which recompute the softmax, do not). Rows
/// past it run the reference's loop (`reference::add_rows`), the others the fast path: row by
/// row, so that one such row (a left-padded query under a `finfo.min` causal mask) does not
/// send its whole call to the slow loop.
pub(super) const LSE_BOUND: f32 = 128.0;

/// Gradients of `sum(out · dout)` with respect to the inputs of an attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    /// `[batch, n_heads, seq_q, head_dim]`
    pub dq: Vec<f32>,
    /// `[batch, n_kv_heads, seq_kv, head_dim]`, summed over the query heads of each group.
    pub dk: Vec<f32>,
    /// `[batch, n_kv_heads, seq_kv, value_dim]`, summed over the query heads of each group.
    pub dv: Vec<f32>,
    /// The float mask's, shaped as it is ([`crate::FloatMask::dims`]), each entry summed over
    /// everything it is broadcast to, as PyTorch sums `attn_mask.grad`: present when
    /// [`AttnOptions::float_mask_grad`] asked for it.
    pub dmask: Option<Vec<f32>>,
}

impl Grads {
    /// Refuses gradients holding NaN or ±∞ when `input` is finite (`dout`, `out` and `lse`
    /// were checked by `validate`): only an overflow gives them then, and NaN or ∞ would come
    /// back as a result. Non-finite inputs (`AttnInput::allowing_non_finite`) keep theirs.
    pub(super) fn refuse_overflow(self, input: &AttnInput<'_>) -> Result<Grads, AttnError> {
        let overflow = [("dq", &self.dq), ("dk", &self.dk), ("dv", &self.dv)]
            .into_iter()
            .filter(|(_, g)| !g.par_chunks(1 << 14).all(f32::all_finite))
            .find_map(|(tensor, g)| Some((tensor, g.iter().position(|x| !x.is_finite())?)));
        match overflow {
            Some((tensor, index))
                if [input.q, input.k, input.v]
                    .iter()
                    .all(|x| x.par_chunks(1 << 14).all(f32::all_finite)) =>
            {
                Err(AttnError::GradientOverflow { tensor, index })
            }
            _ => Ok(self),
        }
    }
}

/// `D = rowsum(dout ∘ out)` for each of the `rows` rows of `value_dim` values.
pub(super) fn row_deltas(dout: &[f32], out: &[f32], value_dim: usize, rows: usize) -> Vec<f32> {
    if value_dim == 0 {
        return vec![0.0; rows];
    }
    dout.par_chunks(value_dim)
        .zip(out.par_chunks(value_dim))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
        .collect()
}

/// Refuses a saved log-sum-exp holding NaN or +∞, which no forward pass gives (−∞ is a row
/// that saw no key).
pub(crate) fn check_saved_lse(lse: &[f32]) -> Result<(), AttnError> {
    match lse.iter().position(|x| x.is_nan() || *x == f32::INFINITY) {
        None => Ok(()),
        Some(index) => Err(AttnError::NonFinite {
            tensor: "lse",
            index,
            value: lse[index],
        }),
    }
}

/// Checks the saved forward results and the incoming gradient against the call's shape.
pub(super) fn validate(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    saved: Option<(&[f32], &[f32])>,
    dout: &[f32],
) -> Result<(), AttnError> {
    let sh = input.shape;
    options.validate(&sh)?;
    sh.check_lens(input.q.len(), input.k.len(), input.v.len())?;
    check_len("dout", &sh.out_dims(), dout.len())?;
    let mut finite = vec![("dout", dout)];
    if let Some((out, lse)) = saved {
        check_len("out", &sh.out_dims(), out.len())?;
        check_len("lse", &sh.out_dims()[..3], lse.len())?;
        finite.push(("out", out));
        check_saved_lse(lse)?;
        // A row that saw no key has output 0: an lse of −∞ beside any other output is not from
        // the same forward pass, and would silently give that row no gradient.
        let dv = sh.value_dim;
        if let Some(row) = (0..lse.len())
            .find(|&r| lse[r] == f32::NEG_INFINITY && out[r * dv..][..dv].iter().any(|&x| x != 0.0))
        {
            return Err(AttnError::InvalidOption {
                option: "lse",
                reason: format!(
                    "row {row} has lse −∞ (it saw no key) but a non-zero output: lse and out \
                     are not from the same forward pass"
                ),
            });
        }
    }
    for (tensor, data) in finite {
        // The bits check on every thread; the search for the first bad value only on failure.
        if !data.par_chunks(1 << 14).all(f32::all_finite) {
            check_finite(tensor, data)?;
        }
    }
    Ok(())
}

/// The float mask whose gradient is asked for, or the error that there is none.
pub(super) fn float_mask(options: &AttnOptions) -> Result<&FloatMask, AttnError> {
    options
        .float_mask
        .as_ref()
        .ok_or_else(|| AttnError::InvalidOption {
            option: "float_mask",
            reason: "is not given, so there is no mask gradient to compute".into(),
        })
}

/// Refuses a mask gradient holding NaN or ±∞ when `input` is finite, as
/// [`Grads`] are refused: only an overflow gives them then.
pub(super) fn refuse_mask_overflow(
    dmask: Vec<f32>,
    input: &AttnInput<'_>,
) -> Result<Vec<f32>, AttnError> {
    let finite = |x: &[f32]| x.par_chunks(1 << 14).all(f32::all_finite);
    if !finite(&dmask) && [input.q, input.k, input.v].iter().all(|x| finite(x)) {
        let index = dmask
            .iter()
            .position(|x| !x.is_finite())
            .unwrap_or_default();
        return Err(AttnError::GradientOverflow {
            tensor: "float_mask",
            index,
        });
    }
    Ok(dmask)
}
