//! The reference twin: plain, readable attention, one query row at a time, every rule of the
//! [crate docs](crate) written out in order. The fast path is tested against it.

use crate::error::AttnError;
use crate::input::{AttnElement, AttnInput};
use crate::mask::key_range;
use crate::options::check_overflow;
use crate::options::{AttnOptions, WeightsRequest};
use crate::shape::{AttnOutput, Weights};

/// Scaled dot-product attention, computed the plain way (O(seq_kv) scratch per row), on f32 or
/// bf16 inputs (widened to f32 exactly).
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - output `out`: `[batch, n_heads, seq_q, value_dim]`, `lse`: `[batch, n_heads, seq_q]`,
///   weights as [`WeightsRequest`] says.
pub fn sdpa_reference<T: AttnElement>(
    input: &AttnInput<'_, T>,
    options: &AttnOptions,
) -> Result<AttnOutput, AttnError> {
    T::sdpa_reference(input, options)
}

/// [`sdpa_reference`] on f32 inputs: the twin itself.
pub(crate) fn sdpa_f32(
    input: &AttnInput<'_>,
    options: &AttnOptions,
) -> Result<AttnOutput, AttnError> {
    let sh = input.shape;
    // The input's fields are public: one built without its constructor may disagree with its
    // shape.
    sh.check_lens(input.q.len(), input.k.len(), input.v.len())?;
    options.validate(&sh)?;
    let (b_n, h_n, l_n, s_n, d, dv) = (
        sh.batch,
        sh.n_heads,
        sh.seq_q,
        sh.seq_kv,
        sh.head_dim,
        sh.value_dim,
    );
    let scale = options.scale_for(&sh);
    let offset = options.offset(l_n, s_n);

    let mut out = vec![0.0f32; b_n * h_n * l_n * dv];
    let mut lse = vec![f32::NEG_INFINITY; b_n * h_n * l_n];
    // The weights asked for, and no more: every row's, the rows asked for (`at`: each asked-for
    // row with its place in the list, which may name a row more than once, sorted by row), or
    // each batch's sum over heads.
    let mut kept = vec![
        0.0f32;
        match &options.weights {
            WeightsRequest::None => 0,
            WeightsRequest::All => b_n * h_n * l_n * s_n,
            WeightsRequest::Rows(rows) => b_n * h_n * rows.len() * s_n,
            WeightsRequest::HeadAverage => b_n * l_n * s_n,
        }
    ];
    let mut at: Vec<(usize, usize)> = match &options.weights {
        WeightsRequest::Rows(rows) => rows.iter().enumerate().map(|(p, &i)| (i, p)).collect(),
        _ => Vec::new(),
    };
    at.sort_unstable();
    let mut w_row = vec![0.0f32; s_n];
    let mut scores = vec![0.0f32; s_n];
    let mut visible = vec![false; s_n];

    // Without query rows there is nothing to visit, however many heads the call declares.
    for b in 0..b_n * usize::from(l_n > 0) {
        for h in 0..h_n {
            let kvh = sh.kv_head(h);
            let k_head = &input.k[(b * sh.n_kv_heads + kvh) * s_n * d..][..s_n * d];
            let v_head = &input.v[(b * sh.n_kv_heads + kvh) * s_n * dv..][..s_n * dv];
            for i in 0..l_n {
                let row = (b * h_n + h) * l_n + i;
                let q_row = &input.q[row * d..][..d];
                let (lo, hi) = key_range(options.causal, options.window, offset, i, s_n);
                for j in 0..s_n {
                    // 1–4. scale · q·k, softcap, ALiBi, float mask
                    let qk = dot(q_row, &k_head[j * d..][..d]);
                    scores[j] = score(options, (scale, offset), qk, (b, h, i, j)).0;
                    // 5. visibility
                    visible[j] = j >= lo && j < hi && options.masks_allow(b, h, i, j);
                }
                // 6. softmax over visible keys; -inf scores (from a float mask) weigh 0. The max
                // is NaN when any visible score is (`f32::max` would skip it), so a NaN input
                // poisons exactly the rows that read it instead of passing for a masked row.
                let max = (0..s_n)
                    .filter(|&j| visible[j])
                    .map(|j| scores[j])
                    .fold(f32::NEG_INFINITY, crate::cpu::max_keeping_nan);
                if max == f32::NEG_INFINITY {
                    continue; // nothing visible: output 0, weights 0, lse -inf
                }
                let sum: f32 = (0..s_n)
                    .filter(|&j| visible[j])
                    .map(|j| (scores[j] - max).exp())
                    .sum();
                lse[row] = max + sum.ln();
                for j in 0..s_n {
                    w_row[j] = if visible[j] {
                        (scores[j] - max).exp() / sum
                    } else {
                        0.0
                    };
                }
                match &options.weights {
                    WeightsRequest::None => {}
                    WeightsRequest::All => kept[row * s_n..][..s_n].copy_from_slice(&w_row),
                    WeightsRequest::Rows(rows) => {
                        let first = at.partition_point(|&(r, _)| r < i);
                        for &(_, p) in at[first..].iter().take_while(|&&(r, _)| r == i) {
                            let dst = ((b * h_n + h) * rows.len() + p) * s_n;
                            kept[dst..][..s_n].copy_from_slice(&w_row);
                        }
                    }
                    WeightsRequest::HeadAverage => {
                        let sum = &mut kept[(b * l_n + i) * s_n..][..s_n];
                        sum.iter_mut().zip(&w_row).for_each(|(a, &w)| *a += w);
                    }
                }
                let o_row = &mut out[row * dv..][..dv];
                for (j, &w) in w_row.iter().enumerate() {
                    // A NaN weight (a row that met a NaN score) stays NaN where dropout drops
                    // it, as PyTorch's `weight · mask` keeps it and the fused kernel's NaN sum
                    // does: the row's output is NaN whichever keys are dropped.
                    let w = match options.dropout {
                        Some(d) if !w.is_nan() => d.apply(w, b, h, i, j),
                        _ => w,
                    };
                    if w != 0.0 {
                        for (o, &x) in o_row.iter_mut().zip(&v_head[j * dv..][..dv]) {
                            *o += w * x;
                        }
                    }
                }
            }
        }
    }

    check_overflow(&lse, &sh, options, [input.q, input.k, input.v])?;
    let weights = match &options.weights {
        WeightsRequest::None => None,
        WeightsRequest::All => Some(Weights::All(kept)),
        WeightsRequest::Rows(rows) => Some(Weights::Rows {
            rows: rows.clone(),
            data: kept,
        }),
        WeightsRequest::HeadAverage => {
            kept.iter_mut().for_each(|a| *a /= h_n as f32);
            Some(Weights::HeadAverage(kept))
        }
    };
    Ok(AttnOutput { out, lse, weights })
}

/// Steps 1–4 of the rules for query `i` of head `h` in batch `b` and key `j`, from `q·k`:
/// times the scale, the softcap, the ALiBi penalty on the distance to the aligned diagonal
/// (`offset`), the float mask. Also returns the softcap's derivative `d(capped)/d(raw)` (1
/// without one), which the backward twin needs.
pub(crate) fn score(
    options: &AttnOptions,
    (scale, offset): (f32, isize),
    qk: f32,
    (b, h, i, j): (usize, usize, usize, usize),
) -> (f32, f32) {
    let mut s = scale * qk;
    let mut dcap = 1.0;
    if let Some(c) = options.softcap {
        let t = (s / c).tanh();
        s = c * t;
        dcap = 1.0 - t * t;
    }
    if let Some(slopes) = &options.alibi {
        let dist = (i as isize + offset - j as isize).unsigned_abs();
        s -= slopes[h] * dist as f32;
    }
    if let Some(m) = &options.float_mask {
        s += m.at(b, h, i, j);
    }
    (s, dcap)
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
