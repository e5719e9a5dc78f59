//! What both passes of the fused kernel share: the call's inputs and plan, where a block's
//! results go, the values' scale, and the online softmax's step of one row.

use std::borrow::Cow;

use half::bf16;

use crate::cpu::{FiniteBits, Isa, max_keeping_nan};
use crate::mask::key_range;
use crate::options::AttnOptions;
use crate::shape::AttnShape;

/// Query rows per head up to which the scores are taken against the keys as the inputs hold
/// them ([`Plan::few_rows`]), for f32 and for bf16 inputs: up to these counts that beats the
/// other passes, which first transpose or split each head's keys; bf16 inputs, whose other
/// pass is the tiles without a split, lose that lead after fewer rows.
pub(super) const FEW_ROWS: (usize, usize) = (16, 6);

/// The inputs of one call, in their stored element type.
#[derive(Clone, Copy)]
pub(super) enum Src<'a> {
    F32 {
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
    },
    Bf16 {
        q: &'a [bf16],
        k: &'a [bf16],
        v: &'a [bf16],
    },
}

/// Everything a task needs to know about the call.
pub(super) struct Plan<'a> {
    pub(super) isa: Isa,
    pub(super) src: Src<'a>,
    pub(super) sh: AttnShape,
    pub(super) opt: &'a AttnOptions,
    pub(super) scale: f32,
    pub(super) offset: isize,
    /// Whether any rule beyond scale, causal and window applies (the per-key slow lane).
    pub(super) extras: bool,
}

/// Where a query block's results go: `out` `[rows, value_dim]`, `lse` `[rows]`, and each row's
/// final `[max, sum]` `[rows]`. `out` is zeroed (`f32`: the AVX-512 and portable kernels
/// accumulate into it) or not yet written (`MaybeUninit<f32>`: the AMX path writes each value
/// once, at the end).
pub(super) struct BlockOut<'a, T = f32> {
    pub(super) out: &'a mut [T],
    pub(super) lse: &'a mut [f32],
    pub(super) stats: &'a mut [[f32; 2]],
}

/// How a key/value head's values reach the kernels. The kernels sum `P·V` with unnormalised
/// weights over every key (each at most 1, or `e^5.5` on the tiles, `amx::MAX_HEADROOM`) and
/// divide by the weights' sum at the end, so values near f32's limit would overflow there where
/// the reference's normalised sum does not. A head whose largest finite value reaches
/// `2^limit` ([`ValueScale::limit`]) has its values divided by the smallest power of two that
/// brings that value under it, and its output multiplied back. That is exact, unless a value
/// becomes subnormal: values under `2^(shift − 126)` lose bits (on the tiles, which read
/// subnormal bf16 as 0, they become 0). With 1000 keys the shift is at most 20, so only values
/// under `2^-106` (1e-32), in heads that also hold values near f32's limit, lose anything.
#[derive(Clone, Copy)]
pub(super) struct ValueScale {
    /// Whether every value is finite (inputs may opt out of that check).
    pub(super) finite: bool,
    /// The exponent of the power of two the values are divided by (0 when they are not).
    pub(super) shift: i32,
}

impl ValueScale {
    /// The exponent `e` from which values of a head with `seq_kv` keys are scaled: a sum of
    /// `seq_kv` products of weights under `2^8` and values under `2^e` stays under `2^126`.
    /// At most 100, which the f32 tiles' parts need (`amx::F32_MAGNITUDE_BOUND`).
    pub(super) fn limit(seq_kv: usize) -> i32 {
        let log2_keys = usize::BITS - (seq_kv.max(1) - 1).leading_zeros();
        (118 - log2_keys as i32).min(100)
    }

    /// The scale of the values `v` of a head with `seq_kv` keys: one pass when they are all
    /// below `2^limit` (almost always). Non-finite values do not count towards the shift: the
    /// rows that do not see them get the scaled values' output.
    pub(super) fn of<T: FiniteBits + Into<f32>>(
        v: &[T],
        seq_kv: usize,
        from_f32: fn(f32) -> T,
    ) -> ValueScale {
        let limit = Self::limit(seq_kv);
        if T::all_below(v, from_f32(pow2(limit))) {
            return ValueScale {
                finite: true,
                shift: 0,
            };
        }
        let (mut finite, mut max) = (true, 0.0f32);
        for &x in v {
            let x: f32 = x.into();
            if x.is_finite() {
                max = max.max(x.abs());
            } else {
                finite = false;
            }
        }
        // `max / 2^(e − limit + 1) < 2^limit`, with `e` the exponent of `max` (a normal number
        // where it reaches the limit).
        let exponent = (max.to_bits() >> 23) as i32 - 127;
        ValueScale {
            finite,
            shift: (exponent - limit + 1).max(0),
        }
    }

    /// `v` as the kernels take it: borrowed when it is not scaled, else a copy with each value
    /// `x` as `times(x, 2^-shift)`.
    pub(super) fn apply<'v, T: Clone>(
        self,
        v: &'v [T],
        times: impl Fn(T, f32) -> T,
    ) -> Cow<'v, [T]> {
        if self.shift == 0 {
            return Cow::Borrowed(v);
        }
        let down = self.down();
        Cow::Owned(v.iter().map(|x| times(x.clone(), down)).collect())
    }

    /// `2^-shift`, what the kernels' values are.
    pub(super) fn down(self) -> f32 {
        pow2(-self.shift)
    }

    /// `2^shift`, what the output is multiplied by.
    pub(super) fn up(self) -> f32 {
        pow2(self.shift)
    }
}

/// `2^e` for `e` in f32's normal range.
pub(super) fn pow2(e: i32) -> f32 {
    debug_assert!((-126..=127).contains(&e));
    f32::from_bits(((127 + e) as u32) << 23)
}

/// The end of a fused step: the row's running max and sum move to `m_new` and on by
/// `block_sum`; returns the factor `e^(m − m')` the accumulator must be scaled by, when the max
/// changed. `None` (nothing changed) when `block_sum` is NaN: a NaN score the max lost.
pub(super) fn advance(
    (m, sum): (&mut f32, &mut f32),
    m_new: f32,
    block_sum: f32,
) -> Option<Option<f32>> {
    if block_sum.is_nan() {
        return None;
    }
    if m_new == *m {
        *sum += block_sum;
        return Some(None);
    }
    let alpha = (*m - m_new).exp();
    *sum = *sum * alpha + block_sum;
    *m = m_new;
    Some(Some(alpha))
}

impl Plan<'_> {
    /// Whether the call's heads have so few query rows ([`FEW_ROWS`]) that their scores are
    /// taken against the keys as the inputs hold them: each key is read once, so transposing
    /// the keys first (for the vector kernels) or splitting them (for the tiles) would cost
    /// more than the scores. Every pass takes such a call's scores the same way, so its
    /// output does not depend on which pass ran.
    pub(super) fn few_rows(&self) -> bool {
        let (f32_rows, bf16_rows) = FEW_ROWS;
        self.sh.seq_q
            <= match self.src {
                Src::F32 { .. } => f32_rows,
                Src::Bf16 { .. } => bf16_rows,
            }
    }

    /// Whether the call has no rule beyond the causal and window ranges, no dropout and a
    /// positive scale: its rows take a fused step over their visible keys, the scale inside it
    /// ([`Self::plain_step`], and on the tiles `softmax_step_plain`).
    pub(super) fn plain(&self) -> bool {
        !self.extras && self.opt.dropout.is_none() && self.scale > 0.0
    }

    /// Turns raw scores of query `i` (head `(b, h)`) against keys `j0..` into the final scores
    /// of the reference's steps 1–5: hidden keys become `−∞`.
    pub(super) fn finish_scores(
        &self,
        (b, h, i): (usize, usize, usize),
        j0: usize,
        row: &mut [f32],
    ) {
        if self.extras {
            self.opt
                .apply_rules(self.isa, (b, h, i), self.offset, j0, row);
        }
        let (lo, hi) = key_range(
            self.opt.causal,
            self.opt.window,
            self.offset,
            i,
            self.sh.seq_kv,
        );
        let end = j0 + row.len();
        let (lo, hi) = (lo.clamp(j0, end) - j0, hi.clamp(j0, end) - j0);
        row[..lo].fill(f32::NEG_INFINITY);
        row[hi.max(lo)..].fill(f32::NEG_INFINITY);
    }

    /// One step of the online softmax for query `i` of head `(b, h)` over keys `j0..`: the raw
    /// scores `scale·(q·k)` in `row` get the rules of [`Self::finish_scores`], then become
    /// `P = e^(S − m')` (0 where dropped), and the row's running max `m` and sum move on.
    /// Returns the factor `e^(m − m')` the row's accumulator must be scaled by, when `m` changed.
    pub(super) fn softmax_step(
        &self,
        (b, h, i): (usize, usize, usize),
        j0: usize,
        row: &mut [f32],
        (m, sum): (&mut f32, &mut f32),
    ) -> Option<f32> {
        self.finish_scores((b, h, i), j0, row);
        self.softmax_step_finished((b, h, i), j0, row, (m, sum))
    }

    /// [`Plan::softmax_step`] on scores that [`Plan::finish_scores`] finished already.
    pub(super) fn softmax_step_finished(
        &self,
        (b, h, i): (usize, usize, usize),
        j0: usize,
        row: &mut [f32],
        (m, sum): (&mut f32, &mut f32),
    ) -> Option<f32> {
        // A NaN score (only from inputs that opted out of the finiteness check) must reach this
        // row's output, as in the reference, and its running max stays NaN from then on, so
        // that the weights recomputed from it are NaN at its visible keys and 0 at the others:
        // `f32::max` would drop it, in this block or the next.
        let m_new = max_keeping_nan(*m, self.isa.max(row));
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            return None;
        }
        let block_sum = self.isa.exp_sub_sum(row, m_new);
        let alpha = if m_new == *m {
            *sum += block_sum;
            None
        } else {
            let alpha = (*m - m_new).exp();
            *sum = *sum * alpha + block_sum;
            *m = m_new;
            Some(alpha)
        };
        if let Some(drop) = self.opt.dropout {
            for (j, p) in (j0..).zip(row.iter_mut()) {
                if !drop.keep(b, h, i, j) {
                    *p = 0.0;
                }
            }
        }
        alpha
    }
}
