//! The plain twin of the backward pass: one query row at a time, with its own softmax and no
//! saved state, every rule of the [crate docs](crate) in order. Slow and simple, to check
//! the fast path against.

use super::grads::{Grads, float_mask, refuse_mask_overflow, validate};
use crate::error::AttnError;
use crate::input::AttnInput;
use crate::mask::key_range;
use crate::options::AttnOptions;
use crate::reference::{dot, score};

/// Gradients of `sum(out · dout)` computed the plain way: one query row at a time, with its
/// own softmax (no saved `out` or `lse`), every rule of the [crate docs](crate) in order; the
/// float mask's too with [`AttnOptions::float_mask_grad`].
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - `dout`: `[batch, n_heads, seq_q, value_dim]`
/// - returns `dq`, `dk`, `dv` shaped like `q`, `k`, `v`, and `dmask` like the float mask.
///
/// # Errors
/// As [`super::sdpa_backward`].
pub fn sdpa_backward_reference(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    dout: &[f32],
) -> Result<Grads, AttnError> {
    validate(input, options, None, dout)?;
    let mut g = zero_grads(input);
    let mut dmask = match options.float_mask_grad {
        true => Some(vec![0.0; float_mask(options)?.data().len()]),
        false => None,
    };
    let rows = input.shape.batch * input.shape.n_heads * input.shape.seq_q;
    add_rows(input, options, dout, 0..rows, (&mut g, dmask.as_mut()));
    let dmask = dmask.map(|d| refuse_mask_overflow(d, input)).transpose()?;
    Ok(Grads {
        dmask,
        ..g.refuse_overflow(input)?
    })
}

/// [`sdpa_backward_reference`]'s `dq`, `dk` and `dv`, for calls the fast path hands over.
pub(super) fn qkv_grads(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    dout: &[f32],
) -> Result<Grads, AttnError> {
    validate(input, options, None, dout)?;
    let mut g = zero_grads(input);
    let rows = input.shape.batch * input.shape.n_heads * input.shape.seq_q;
    add_rows(input, options, dout, 0..rows, (&mut g, None));
    g.refuse_overflow(input)
}

/// Zero gradients shaped like `input`'s q, k and v.
fn zero_grads(input: &AttnInput<'_>) -> Grads {
    Grads {
        dq: vec![0.0; input.q.len()],
        dk: vec![0.0; input.k.len()],
        dv: vec![0.0; input.v.len()],
        dmask: None,
    }
}

/// Adds the gradients that query rows `rows` (flat indices into `[batch, n_heads, seq_q]`)
/// contribute, each with its own softmax, to `g` (and the float mask's to `dmask`, shaped as
/// the mask): the whole of the reference's loop, and the fast path's for rows whose saved lse
/// cannot be trusted (`super::LSE_BOUND`). `input`, `options` and `dout` are validated by the
/// caller.
pub(super) fn add_rows(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    dout: &[f32],
    rows: impl IntoIterator<Item = usize>,
    (g, mut dmask): (&mut Grads, Option<&mut Vec<f32>>),
) {
    let sh = input.shape;
    let (s_n, d, dv) = (sh.seq_kv, sh.head_dim, sh.value_dim);
    let scale = options.scale_for(&sh);
    let offset = options.offset(sh.seq_q, s_n);
    // Per key of one row: score, visibility, d(capped)/d(raw), P, dropout factor Z, dP.
    let (mut s, mut vis, mut dcap) = (vec![0.0f32; s_n], vec![false; s_n], vec![1.0f32; s_n]);
    let (mut p, mut z, mut dp) = (vec![0.0f32; s_n], vec![1.0f32; s_n], vec![0.0f32; s_n]);
    for row in rows {
        let (b, h, i) = sh.query_row(row);
        let kv = b * sh.n_kv_heads + sh.kv_head(h);
        let q_row = &input.q[row * d..][..d];
        let do_row = &dout[row * dv..][..dv];
        let (lo, hi) = key_range(options.causal, options.window, offset, i, s_n);
        for j in 0..s_n {
            let qk = dot(q_row, &input.k[(kv * s_n + j) * d..][..d]);
            (s[j], dcap[j]) = score(options, (scale, offset), qk, (b, h, i, j));
            vis[j] = j >= lo && j < hi && options.masks_allow(b, h, i, j);
            z[j] = options.dropout.map_or(1.0, |d| d.apply(1.0, b, h, i, j));
        }
        // NaN when any visible score is (`f32::max` would skip it), as in the forward
        // reference: a NaN input poisons the gradients of exactly what it reaches.
        let max = (0..s_n)
            .filter(|&j| vis[j])
            .map(|j| s[j])
            .fold(f32::NEG_INFINITY, crate::cpu::max_keeping_nan);
        if max == f32::NEG_INFINITY {
            continue; // nothing visible: the output is 0 whatever the inputs
        }
        let sum: f32 = (0..s_n)
            .filter(|&j| vis[j])
            .map(|j| (s[j] - max).exp())
            .sum();
        for j in 0..s_n {
            p[j] = if vis[j] {
                (s[j] - max).exp() / sum
            } else {
                0.0
            };
            // out = Σ_j P_j·Z_j·v_j, so ∂/∂P_j = Z_j·(dout·v_j)
            dp[j] = z[j] * dot(do_row, &input.v[(kv * s_n + j) * dv..][..dv]);
        }
        // Softmax backward: dS_j = P_j·(dP_j − Σ_k P_k·dP_k), of the scores the float mask is
        // added to.
        let delta: f32 = (0..s_n).map(|j| p[j] * dp[j]).sum();
        if let (Some(dmask), Some(mask)) = (dmask.as_deref_mut(), &options.float_mask) {
            let (at, stride) = mask.row(b, h, i);
            for j in (0..s_n).filter(|&j| p[j] != 0.0) {
                dmask[at + j * stride] += p[j] * (dp[j] - delta);
            }
        }
        for j in 0..s_n {
            if p[j] == 0.0 {
                continue;
            }
            let ds = p[j] * (dp[j] - delta) * dcap[j] * scale;
            let k_at = (kv * s_n + j) * d;
            let k_row = &input.k[k_at..][..d];
            for (dq, &kx) in g.dq[row * d..][..d].iter_mut().zip(k_row) {
                *dq += ds * kx;
            }
            for (dk, &qx) in g.dk[k_at..][..d].iter_mut().zip(q_row) {
                *dk += ds * qx;
            }
            let w = p[j] * z[j];
            for (dvx, &o) in g.dv[(kv * s_n + j) * dv..][..dv].iter_mut().zip(do_row) {
                *dvx += w * o;
            }
        }
    }
}
