//! The reference twin: plain, readable attention, one query row at a time, every rule of the
//! [crate docs](crate) written out in order. The fast path is tested against it.

use crate::error::AttnError;
use crate::input::{AttnElement, AttnInput};
use crate::mask::key_range;
use crate::options::check_overflow;
use crate::options::{AttnOptions, WeightsRequest};
use crate::shape::{AttnOutput, AttnShape, Weights};

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
    let (l_n, dv) = (sh.seq_q, sh.value_dim);
    let mut out = vec![0.0f32; sh.batch * sh.n_heads * l_n * dv];
    let mut lse = vec![f32::NEG_INFINITY; sh.batch * sh.n_heads * l_n];
    let mut kept = Kept::new(&options.weights, &sh);
    let mut row = Row::new(sh.seq_kv);
    // Without query rows there is nothing to visit, however many heads the call declares.
    for b in 0..sh.batch * usize::from(l_n > 0) {
        for h in 0..sh.n_heads {
            for i in 0..l_n {
                let at = (b * sh.n_heads + h) * l_n + i;
                // Nothing visible: output 0, weights 0, lse −∞.
                let Some(row_lse) = row.softmax(input, options, (b, h, i)) else {
                    continue;
                };
                lse[at] = row_lse;
                kept.add((b, h, i), &row.weights);
                row.weigh_values(input, options, (b, h, i), &mut out[at * dv..][..dv]);
            }
        }
    }
    check_overflow(&lse, &sh, options, [input.q, input.k, input.v])?;
    let weights = kept.finish();
    Ok(AttnOutput { out, lse, weights })
}

/// One query row's scores, visibility and weights over the `seq_kv` keys.
struct Row {
    scores: Vec<f32>,
    visible: Vec<bool>,
    weights: Vec<f32>,
}

impl Row {
    fn new(seq_kv: usize) -> Row {
        Row {
            scores: vec![0.0; seq_kv],
            visible: vec![false; seq_kv],
            weights: vec![0.0; seq_kv],
        }
    }

    /// The rules' steps 1–6 for query `i` of head `h` in batch `b`: its weights, and its
    /// log-sum-exp (`None` when it sees no key).
    fn softmax(
        &mut self,
        input: &AttnInput<'_>,
        options: &AttnOptions,
        (b, h, i): (usize, usize, usize),
    ) -> Option<f32> {
        let sh = input.shape;
        let (s_n, d) = (sh.seq_kv, sh.head_dim);
        let (scale, offset) = (options.scale_for(&sh), options.offset(sh.seq_q, s_n));
        let q_row = &input.q[((b * sh.n_heads + h) * sh.seq_q + i) * d..][..d];
        let k_head = &input.k[(b * sh.n_kv_heads + sh.kv_head(h)) * s_n * d..][..s_n * d];
        let (lo, hi) = key_range(options.causal, options.window, offset, i, s_n);
        for j in 0..s_n {
            // 1–4. scale · q·k, softcap, ALiBi, float mask
            let qk = dot(q_row, &k_head[j * d..][..d]);
            self.scores[j] = score(options, (scale, offset), qk, (b, h, i, j)).0;
            // 5. visibility
            self.visible[j] = j >= lo && j < hi && options.masks_allow(b, h, i, j);
        }
        // 6. softmax over visible keys; -inf scores (from a float mask) weigh 0. The max is NaN
        // when any visible score is (`f32::max` would skip it), so a NaN input poisons exactly
        // the rows that read it instead of passing for a masked row.
        let visible = || (0..s_n).filter(|&j| self.visible[j]);
        let max = visible()
            .map(|j| self.scores[j])
            .fold(f32::NEG_INFINITY, crate::cpu::max_keeping_nan);
        if max == f32::NEG_INFINITY {
            return None;
        }
        let sum: f32 = visible().map(|j| (self.scores[j] - max).exp()).sum();
        for j in 0..s_n {
            self.weights[j] = match self.visible[j] {
                true => (self.scores[j] - max).exp() / sum,
                false => 0.0,
            };
        }
        Some(max + sum.ln())
    }

    /// `out_row = Σ_j w_j · v_j` over this row's weights (after dropout) of query `i` of head `h`
    /// in batch `b`.
    fn weigh_values(
        &self,
        input: &AttnInput<'_>,
        options: &AttnOptions,
        (b, h, i): (usize, usize, usize),
        out_row: &mut [f32],
    ) {
        let sh = input.shape;
        let (s_n, dv) = (sh.seq_kv, sh.value_dim);
        let v_head = &input.v[(b * sh.n_kv_heads + sh.kv_head(h)) * s_n * dv..][..s_n * dv];
        for (j, &w) in self.weights.iter().enumerate() {
            // A NaN weight (a row that met a NaN score) stays NaN where dropout drops it, as
            // PyTorch's `weight · mask` keeps it and the fused kernel's NaN sum does: the row's
            // output is NaN whichever keys are dropped.
            let w = match options.dropout {
                Some(d) if !w.is_nan() => d.apply(w, b, h, i, j),
                _ => w,
            };
            if w != 0.0 {
                for (o, &x) in out_row.iter_mut().zip(&v_head[j * dv..][..dv]) {
                    *o += w * x;
                }
            }
        }
    }
}

/// The weights asked for, and no more: every row's, the rows asked for, or each batch's sum
/// over heads.
struct Kept<'r> {
    request: &'r WeightsRequest,
    data: Vec<f32>,
    /// Each asked-for row with its place in the list (which may name a row more than once),
    /// sorted by row.
    at: Vec<(usize, usize)>,
    /// The call's shape.
    shape: AttnShape,
}

impl<'r> Kept<'r> {
    fn new(request: &'r WeightsRequest, sh: &AttnShape) -> Kept<'r> {
        let (b, h, l, s) = (sh.batch, sh.n_heads, sh.seq_q, sh.seq_kv);
        let len = match request {
            WeightsRequest::None => 0,
            WeightsRequest::All => b * h * l * s,
            WeightsRequest::Rows(rows) => b * h * rows.len() * s,
            WeightsRequest::HeadAverage => b * l * s,
        };
        let mut at: Vec<(usize, usize)> = match request {
            WeightsRequest::Rows(rows) => rows.iter().enumerate().map(|(p, &i)| (i, p)).collect(),
            _ => Vec::new(),
        };
        at.sort_unstable();
        Kept {
            request,
            data: vec![0.0; len],
            at,
            shape: *sh,
        }
    }

    /// Keeps what the request asks of query `i`'s weights `w` (head `h`, batch `b`).
    fn add(&mut self, (b, h, i): (usize, usize, usize), w: &[f32]) {
        let (h_n, l_n, s_n) = (self.shape.n_heads, self.shape.seq_q, self.shape.seq_kv);
        match self.request {
            WeightsRequest::None => {}
            WeightsRequest::All => {
                self.data[((b * h_n + h) * l_n + i) * s_n..][..s_n].copy_from_slice(w);
            }
            WeightsRequest::Rows(rows) => {
                let first = self.at.partition_point(|&(r, _)| r < i);
                for &(_, p) in self.at[first..].iter().take_while(|&&(r, _)| r == i) {
                    let dst = ((b * h_n + h) * rows.len() + p) * s_n;
                    self.data[dst..][..s_n].copy_from_slice(w);
                }
            }
            WeightsRequest::HeadAverage => {
                let sum = &mut self.data[(b * l_n + i) * s_n..][..s_n];
                sum.iter_mut().zip(w).for_each(|(a, &x)| *a += x);
            }
        }
    }

    /// The weights as the request asked for them.
    fn finish(mut self) -> Option<Weights> {
        match self.request {
            WeightsRequest::None => None,
            WeightsRequest::All => Some(Weights::all(&self.shape, self.data)),
            WeightsRequest::Rows(rows) => Some(Weights::rows(&self.shape, rows.clone(), self.data)),
            WeightsRequest::HeadAverage => {
                let heads = self.shape.n_heads as f32;
                self.data.iter_mut().for_each(|a| *a /= heads);
                Some(Weights::head_average(&self.shape, self.data))
            }
        }
    }
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
