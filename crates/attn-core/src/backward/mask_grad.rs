//! The gradient with respect to the float mask (PyTorch's `attn_mask.grad`, xFormers'
//! `attn_bias` gradient): how learned biases such as T5's relative positions are trained.
//!
//! The mask is added to the final scores, after the scale, softcap and ALiBi, so the gradient
//! of the entry added to query `i`'s score of key `j` is the softmax backward's
//! `dS_ij = P_ij·(Z_ij·dP_ij − D_i)` with no factor of its own, summed over every (batch,
//! head, query, key) the entry is broadcast to: `P = e^(S − lse)` from the saved log-sum-exp,
//! `dP = dout·Vᵀ`, `D = rowsum(dout ∘ out)`, `Z` the dropout factor. A key that another rule
//! hides (causal, window, boolean mask, key padding), or the mask's own −∞, gets 0.
//!
//! The work is split into blocks of [`ROWS`] query rows of one (mask batch, mask head): each
//! block takes its scores and `dP` against every key on [`Isa::gemm_abt`], so its rows are
//! whole, and a row whose saved lse cannot be trusted ([`LSE_BOUND`]) sums its own.

use rayon::prelude::*;

use super::grads::{LSE_BOUND, refuse_mask_overflow, row_deltas, validate};
use super::kernels::probs_and_grads;
use crate::cpu::{Isa, max_keeping_nan};
use crate::error::AttnError;
use crate::input::AttnInput;
use crate::mask::key_range;
use crate::options::AttnOptions;

/// Query rows per block: few enough for [`Isa::gemm_abt`]'s kernel, which reads the keys as
/// they are stored.
const ROWS: usize = 16;

/// Runs of blocks whose sums a mask of one row for all queries keeps apart (see [`dmask`]): enough for the threads of a large machine, each run's
/// row `seq_kv` floats.
const GROUPS: usize = 32;

/// The gradient of `sum(out · dout)` with respect to `options.float_mask` ([`Grads::dmask`],
/// asked for by [`AttnOptions::float_mask_grad`]), on the kernels of `isa`. It takes about as
/// long as the gradients of `q`, `k` and `v` with the same mask.
///
/// [`Grads::dmask`]: super::Grads::dmask
pub(super) fn dmask(
    isa: Isa,
    input: &AttnInput<'_>,
    options: &AttnOptions,
    (out, lse): (&[f32], &[f32]),
    dout: &[f32],
) -> Result<Vec<f32>, AttnError> {
    validate(input, options, Some((out, lse)), dout)?;
    let mask = super::grads::float_mask(options)?;
    let sh = input.shape;
    let [mb, mh, ml, ms] = mask.dims();
    let delta = row_deltas(dout, out, sh.value_dim, lse.len());
    // Each mask head's part is written with zeros by the thread that takes it, before its
    // sums read it: no page of it is first read (see `zeros_written`).
    let mut dmask = vec![0.0; mask.data().len()];
    if sh.seq_q == 0 || sh.seq_kv == 0 || dmask.is_empty() {
        return Ok(dmask); // no score, so nothing to add
    }
    let blocks = sh.seq_q.div_ceil(ROWS);
    let pass = Pass {
        isa,
        input,
        options,
        lse,
        delta: &delta,
        dout,
    };
    // Each mask head (`bm·mh + hm`) takes its query rows `ROWS` at a time. With a row of the
    // mask for every query row (`ml == seq_q`) each block writes its own rows of the result;
    // with one for all (`ml == 1`) the blocks are split into at most `GROUPS` runs, each summed
    // into a row of its own, and the runs' rows are added in order: the same sums whatever the
    // thread count, in `GROUPS` rows of memory (a row per block took 1 GiB at L = S = 65536).
    let dims = [mb, mh, ml, ms];
    (dmask.par_chunks_mut(ml * ms).enumerate()).for_each(|(m, dmask)| {
        dmask.fill(0.0);
        let head = (m / mh, m % mh);
        if ml == 1 {
            let groups = blocks.min(GROUPS);
            let parts: Vec<Vec<f32>> = (0..groups)
                .into_par_iter()
                .map(|g| {
                    let mut sums = vec![0.0; ms];
                    for u in g * blocks / groups..(g + 1) * blocks / groups {
                        pass.block(head, ROWS * u, dims, &mut sums);
                    }
                    sums
                })
                .collect();
            for part in parts {
                dmask.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
        } else {
            (dmask.par_chunks_mut(ROWS * ms).enumerate())
                .for_each(|(u, sums)| pass.block(head, ROWS * u, dims, sums));
        }
    });
    refuse_mask_overflow(dmask, input)
}

/// What every block reads.
struct Pass<'a> {
    isa: Isa,
    input: &'a AttnInput<'a>,
    options: &'a AttnOptions,
    lse: &'a [f32],
    delta: &'a [f32],
    dout: &'a [f32],
}

impl Pass<'_> {
    /// Adds the gradients of the query rows `i0..` (up to [`ROWS`]) for mask head `(bm, hm)`
    /// of a mask of `dims` to `sums`: `[rows, ms]`, or `[ms]` when the mask has one row for
    /// every query.
    fn block(
        &self,
        (bm, hm): (usize, usize),
        i0: usize,
        [mb, mh, ml, ms]: [usize; 4],
        sums: &mut [f32],
    ) {
        let sh = self.input.shape;
        let (s_n, d, dv) = (sh.seq_kv, sh.head_dim, sh.value_dim);
        let n = ROWS.min(sh.seq_q - i0);
        let (mut s, mut dp) = (vec![0.0; n * s_n], vec![0.0; n * s_n]);
        // A row's lse and D, once per key (as `probs_and_grads` takes them).
        let mut saved = (vec![0.0; s_n], vec![0.0; s_n]);
        // The (batch, head) pairs the mask head is broadcast to.
        let batches = if mb == 1 { 0..sh.batch } else { bm..bm + 1 };
        for b in batches {
            let heads = if mh == 1 { 0..sh.n_heads } else { hm..hm + 1 };
            for h in heads {
                let kv = b * sh.n_kv_heads + sh.kv_head(h);
                let row0 = (b * sh.n_heads + h) * sh.seq_q + i0;
                let (q, k) = (&self.input.q[row0 * d..], &self.input.k[kv * s_n * d..]);
                self.isa.gemm_abt((n, s_n, d), q, d, k, d, &mut s, s_n);
                let (dout, v) = (&self.dout[row0 * dv..], &self.input.v[kv * s_n * dv..]);
                self.isa
                    .gemm_abt((n, s_n, dv), dout, dv, v, dv, &mut dp, s_n);
                for r in 0..n {
                    let (i, row) = (i0 + r, row0 + r);
                    let sums = if ml == 1 {
                        &mut sums[..]
                    } else {
                        &mut sums[r * ms..][..ms]
                    };
                    let (s, dp) = (&mut s[r * s_n..][..s_n], &mut dp[r * s_n..][..s_n]);
                    saved.0.fill(self.lse[row]);
                    saved.1.fill(self.delta[row]);
                    self.add_row((b, h, i), (s, dp), (&saved.0, &saved.1), sums);
                }
            }
        }
    }

    /// Adds row `(b, h, i)`'s `dS` to `sums` (one per key, or one for all when the mask
    /// repeats across keys), from its raw scores `q·k` and `dP` (both overwritten) and its
    /// saved lse and `D` (repeated once per key).
    fn add_row(
        &self,
        (b, h, i): (usize, usize, usize),
        (s, dp): (&mut [f32], &mut [f32]),
        (lse_row, delta_row): (&[f32], &[f32]),
        sums: &mut [f32],
    ) {
        let (lse, delta) = (lse_row[0], delta_row[0]);
        let (sh, opt) = (self.input.shape, self.options);
        if lse == f32::NEG_INFINITY {
            return; // the row saw no key
        }
        let (scale, offset) = (opt.scale_for(&sh), opt.offset(sh.seq_q, sh.seq_kv));
        let (lo, hi) = key_range(opt.causal, opt.window, offset, i, sh.seq_kv);
        // The scores as the forward pass finishes them: scaled, then the rules.
        let scores = &mut s[lo..hi];
        scores.iter_mut().for_each(|x| *x *= scale);
        opt.apply_rules(self.isa, (b, h, i), offset, lo, scores);
        if let Some(d) = opt.dropout {
            for (j, x) in (lo..hi).zip(&mut dp[lo..hi]) {
                *x = d.apply(*x, b, h, i, j);
            }
        }
        let (p, ds) = (&mut s[lo..hi], &mut dp[lo..hi]);
        // `P = e^(s − lse)`, `dS = P ∘ (dP − D)` in place. The saved lse holds the row's sum
        // only to `|lse|·2⁻²⁴` ([`LSE_BOUND`]): past it the row takes its own max and sum.
        if lse.abs() <= LSE_BOUND {
            probs_and_grads(self.isa, p, ds, lse_row, delta_row);
        } else {
            let max = p.iter().copied().fold(f32::NEG_INFINITY, max_keeping_nan);
            let sum: f32 = p.iter().map(|&x| (x - max).exp()).sum();
            for (p, ds) in p.iter_mut().zip(ds.iter_mut()) {
                *p = (*p - max).exp() / sum;
                *ds = *p * (*ds - delta);
            }
        }
        // Keys of weight 0 add nothing (as in the twin: not even a NaN of their values).
        for (j, (&p, &ds)) in (lo..hi).zip(p.iter().zip(ds.iter())) {
            if p != 0.0 {
                // One sum for all keys when the mask repeats across them (or there is one key).
                sums[if sums.len() == 1 { 0 } else { j }] += ds;
            }
        }
    }
}
