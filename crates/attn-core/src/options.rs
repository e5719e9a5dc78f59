//! Options of an attention call, each with the semantics the [crate docs](crate) give.

use crate::cpu::{FiniteBits, Isa, prefetch_l2};
use crate::error::AttnError;
use crate::mask::{BoolMask, Causal, FloatMask, KeyPadding, Window, diagonal_offset, key_range};
use crate::shape::{AttnShape, MAX_WEIGHTS_BYTES, f32_bytes};

/// Which attention weights to return besides the output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WeightsRequest {
    /// No weights: the call pays nothing for them.
    #[default]
    None,
    /// Every query row: `[batch, n_heads, seq_q, seq_kv]`.
    All,
    /// Only these query rows, in this order: `[batch, n_heads, rows.len(), seq_kv]`.
    Rows(Vec<usize>),
    /// Averaged over the heads: `[batch, seq_q, seq_kv]`.
    HeadAverage,
}

/// Dropout on the attention weights, for training. Each weight is kept with probability `1 − p`
/// and scaled by `1 / (1 − p)`; `p = 1` drops every weight (the output is 0, as in PyTorch).
/// Whether weight `(b, h, i, j)` is dropped depends only on `seed` and its index, so any kernel
/// (and a backward pass) replays the same mask.
/// The weights [`crate::sdpa`] returns are the softmax before dropout (those it saves the
/// log-sum-exp of); [`crate::mha::MultiheadAttention`] returns them after, as PyTorch's module
/// does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of dropping a weight, in `[0, 1]`.
    pub p: f32,
    /// Picks the dropped weights: the same seed drops the same ones.
    pub seed: u64,
}

impl Dropout {
    /// Whether weight `(b, h, i, j)` survives: a SplitMix64 hash of the seed and the index.
    pub fn keep(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        let mut x = self.seed;
        for idx in [b, h, i, j] {
            x = splitmix64(x ^ idx as u64);
        }
        // 24 random bits give a uniform value in [0, 1) exactly representable in f32.
        let u = (x >> 40) as f32 / (1u64 << 24) as f32;
        u >= self.p
    }

    /// The factor applied to kept weights: `1 / (1 − p)`, and 0 at `p = 1`, where no weight is
    /// kept (the factor then multiplies only zeros, never ∞).
    pub fn scale(&self) -> f32 {
        if self.p >= 1.0 {
            0.0
        } else {
            1.0 / (1.0 - self.p)
        }
    }

    /// `weight` after dropout: scaled when `(b, h, i, j)` is kept, else 0.
    pub fn apply(&self, weight: f32, b: usize, h: usize, i: usize, j: usize) -> f32 {
        if self.keep(b, h, i, j) {
            weight * self.scale()
        } else {
            0.0
        }
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Everything about an attention call except its inputs. `Default` is plain attention with
/// scale `1/√head_dim` and no weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AttnOptions {
    /// Multiplies `q·k`; `None` means `1/√head_dim`.
    pub scale: Option<f32>,
    /// `score = c · tanh(score / c)` with `c = softcap`.
    pub softcap: Option<f32>,
    /// One slope per query head: `score -= slope_h · |i + o − j|`.
    pub alibi: Option<Vec<f32>>,
    /// Added to the scores.
    pub float_mask: Option<FloatMask>,
    /// Hide the keys after each query's (aligned) position.
    pub causal: Option<Causal>,
    /// Hide the keys outside a window around the (aligned) diagonal.
    pub window: Option<Window>,
    /// Where the diagonal of the window and ALiBi rules sits without a causal mask: `None` or
    /// `TopLeft` at `j = i` (PyTorch), `BottomRight` at `j = i + seq_kv − seq_q`, where
    /// FlashAttention puts every rule's and xFormers' `LocalAttentionFromBottomRightMask` its
    /// window. With a causal mask, its alignment places the diagonal; another here is an
    /// error.
    pub align: Option<Causal>,
    /// `true` = may attend.
    pub bool_mask: Option<BoolMask>,
    /// `true` = a real key.
    pub key_padding: Option<KeyPadding>,
    /// Dropout on the weights (training).
    pub dropout: Option<Dropout>,
    /// Which weights to return besides the output (none by default).
    pub weights: WeightsRequest,
    /// The kernels to run: `None` for [`Isa::best`], else these (an ISA this CPU lacks is an
    /// error), to check one against another. The reference twins ignore it.
    pub isa: Option<Isa>,
    /// Backward passes only: with a float mask, also its gradient ([`crate::Grads::dmask`],
    /// PyTorch's `attn_mask.grad`), which takes about as long again.
    pub float_mask_grad: bool,
}

impl AttnOptions {
    /// Whether the bool mask and the key padding let query `i` of head `h` in batch `b` see key
    /// `j` (the causal and window rules are [`crate::mask::key_range`]'s).
    pub(crate) fn masks_allow(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        self.bool_mask.as_ref().is_none_or(|m| m.at(b, h, i, j))
            && self.key_padding.as_ref().is_none_or(|kp| kp.is_real(b, j))
    }

    /// The diagonal offset `o` of the causal, window and ALiBi rules for `seq_q` queries
    /// against `seq_kv` keys: the causal mask's alignment, else [`AttnOptions::align`].
    pub fn offset(&self, seq_q: usize, seq_kv: usize) -> isize {
        diagonal_offset(self.causal.or(self.align), seq_q, seq_kv)
    }

    /// Steps 2–5 of the rules on the scaled scores of query `i` of head `h` in batch `b` against
    /// keys `j0..`: the softcap, then [`AttnOptions::apply_extras`], on `isa`.
    pub(crate) fn apply_rules(
        &self,
        isa: Isa,
        bhi: (usize, usize, usize),
        offset: isize,
        j0: usize,
        row: &mut [f32],
    ) {
        if let Some(c) = self.softcap {
            row.iter_mut().for_each(|x| *x = c * (*x / c).tanh());
        }
        self.apply_extras(isa, bhi, offset, j0, row);
    }

    /// Steps 3–5 of the rules on the scores of query `i` of head `h` in batch `b` against keys
    /// `j0..` (`offset` the diagonal's): ALiBi, the float mask, then the boolean mask and key
    /// padding (a hidden key's score becomes −∞). One rule at a time, in loops that vectorise
    /// (16 lanes on the AVX-512 ISAs), each key seeing the rules in the reference's
    /// order, so the scores are the same. Key by key, with every rule tested at each key, the
    /// loops would not vectorise and masked calls would be much slower.
    pub(crate) fn apply_extras(
        &self,
        isa: Isa,
        bhi: (usize, usize, usize),
        offset: isize,
        j0: usize,
        row: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            // SAFETY: an AVX-512 ISA only runs where available.
            return unsafe { self.apply_extras_avx512(bhi, offset, j0, row) };
        }
        self.apply_extras_body(bhi, offset, j0, row);
    }

    /// # Safety
    /// AVX-512F must be available.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn apply_extras_avx512(
        &self,
        bhi: (usize, usize, usize),
        offset: isize,
        j0: usize,
        row: &mut [f32],
    ) {
        self.apply_extras_body(bhi, offset, j0, row);
    }

    #[inline(always)]
    fn apply_extras_body(
        &self,
        (b, h, i): (usize, usize, usize),
        offset: isize,
        j0: usize,
        row: &mut [f32],
    ) {
        let n = row.len();
        if let Some(slopes) = &self.alibi {
            let slope = slopes[h];
            for (j, x) in (j0..).zip(row.iter_mut()) {
                let dist = (i as isize + offset - j as isize).unsigned_abs();
                *x -= slope * dist as f32;
            }
        }
        // A mask row is one value per key, or one for all (`stride` 0).
        if let Some(mask) = &self.float_mask {
            let (off, stride) = mask.row(b, h, i);
            match stride {
                0 => row.iter_mut().for_each(|x| *x += mask.data()[off]),
                _ => {
                    (row.iter_mut().zip(&mask.data()[off + j0..][..n])).for_each(|(x, m)| *x += m);
                    prefetch_l2(mask.data(), off + j0 + n, n);
                }
            }
        }
        let hide = |row: &mut [f32], visible: &[bool]| {
            (row.iter_mut().zip(visible)).for_each(|(x, &v)| {
                if !v {
                    *x = f32::NEG_INFINITY;
                }
            })
        };
        if let Some(mask) = &self.bool_mask {
            let (off, stride) = mask.row(b, h, i);
            match stride {
                0 if !mask.data()[off] => row.fill(f32::NEG_INFINITY),
                0 => {}
                _ => hide(row, &mask.data()[off + j0..][..n]),
            }
        }
        if let Some(padding) = &self.key_padding {
            hide(row, &padding.row(b)[j0..][..n]);
        }
    }

    /// The kernels a call with these options runs on ([`AttnOptions::isa`], else the best).
    pub(crate) fn chosen_isa(&self) -> Isa {
        self.isa.unwrap_or_else(Isa::best)
    }

    /// The scale in effect for `shape`.
    pub fn scale_for(&self, shape: &AttnShape) -> f32 {
        self.scale.unwrap_or(1.0 / (shape.head_dim as f32).sqrt())
    }

    /// Checks every option against the call's shape. Both kernels call this first.
    pub fn validate(&self, shape: &AttnShape) -> Result<(), AttnError> {
        shape.validate()?;
        if let Some(isa) = self.isa {
            isa.require()?;
        }
        if self.float_mask_grad && self.float_mask.is_none() {
            return Err(AttnError::InvalidOption {
                option: "float_mask_grad",
                reason: "asks for the float mask's gradient, but no float mask is given".into(),
            });
        }
        if let Some(scale) = self.scale
            && !scale.is_finite()
        {
            return Err(AttnError::InvalidOption {
                option: "scale",
                reason: format!("must be finite, got {scale}"),
            });
        }
        // 1/√0: every score would be 0·∞ = NaN (PyTorch's outputs are NaN).
        if self.scale.is_none() && shape.head_dim == 0 && !shape.score_dims().contains(&0) {
            return Err(AttnError::InvalidOption {
                option: "scale",
                reason: "the default 1/√head_dim is infinite for head_dim 0: give a scale".into(),
            });
        }
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(AttnError::InvalidOption {
                option: "softcap",
                reason: format!("must be finite and > 0, got {c}"),
            });
        }
        if let (Some(causal), Some(align)) = (self.causal, self.align)
            && causal != align
        {
            return Err(AttnError::InvalidOption {
                option: "align",
                reason: format!(
                    "is {align:?} but the causal mask is {causal:?}, which places the diagonal: \
                     give one alignment"
                ),
            });
        }
        if let Some(slopes) = &self.alibi {
            if slopes.len() != shape.n_heads {
                return Err(AttnError::PerHeadLength {
                    what: "alibi",
                    expected: shape.n_heads,
                    got: slopes.len(),
                });
            }
            if let Some((index, &value)) = slopes.iter().enumerate().find(|(_, s)| !s.is_finite()) {
                return Err(AttnError::NonFinite {
                    tensor: "alibi",
                    index,
                    value,
                });
            }
        }
        if let Some(m) = &self.float_mask {
            m.validate(shape)?;
        }
        if let Some(m) = &self.bool_mask {
            m.validate(shape)?;
        }
        if let Some(kp) = &self.key_padding {
            kp.validate(shape)?;
        }
        if let Some(d) = self.dropout
            && !(0.0..=1.0).contains(&d.p)
        {
            return Err(AttnError::InvalidOption {
                option: "dropout",
                reason: format!("p must be in [0, 1], got {}", d.p),
            });
        }
        let weights_dims = match &self.weights {
            WeightsRequest::None => None,
            WeightsRequest::All => Some(shape.score_dims().to_vec()),
            WeightsRequest::Rows(rows) => {
                if let Some(&row) = rows.iter().find(|&&r| r >= shape.seq_q) {
                    return Err(AttnError::RowOutOfRange {
                        row,
                        seq_q: shape.seq_q,
                    });
                }
                Some(vec![shape.batch, shape.n_heads, rows.len(), shape.seq_kv])
            }
            WeightsRequest::HeadAverage => Some(vec![shape.batch, shape.seq_q, shape.seq_kv]),
        };
        if let Some(dims) = weights_dims {
            let bytes = f32_bytes(&dims);
            if bytes > MAX_WEIGHTS_BYTES {
                return Err(AttnError::TooLarge {
                    what: "attention weights",
                    shape: dims,
                    bytes,
                });
            }
        }
        Ok(())
    }
}

/// Refuses a call whose scores overflowed f32 from finite inputs: a row's log-sum-exp of NaN or
/// +∞, or of −∞ (every score −∞) although the masks leave the row a key with no `-inf` in the
/// float mask, while `q`, `k` and `v` are finite (read only then; a NaN or ∞ the inputs opted in
/// to is theirs to keep, as in PyTorch). Only the rows of −∞ reread the masks: a row the masks
/// hide entirely keeps its output 0.
pub(crate) fn check_overflow<T: FiniteBits>(
    lse: &[f32],
    shape: &AttnShape,
    options: &AttnOptions,
    [q, k, v]: [&[T]; 3],
) -> Result<(), AttnError> {
    let Some(at) = lse.iter().enumerate().position(|(at, &x)| {
        x.is_nan()
            || x == f32::INFINITY
            || (x == f32::NEG_INFINITY && sees_a_key(shape, options, shape.query_row(at)))
    }) else {
        return Ok(());
    };
    if ![q, k, v].into_iter().all(T::all_finite) {
        return Ok(());
    }
    let (batch, head, row) = shape.query_row(at);
    Err(AttnError::ScoreOverflow { batch, head, row })
}

/// Whether query row `i` of head `h` in batch `b` has a key that every rule leaves visible and
/// the float mask does not set to `-inf`: its scores cannot all be `-inf` unless they overflowed.
fn sees_a_key(shape: &AttnShape, options: &AttnOptions, (b, h, i): (usize, usize, usize)) -> bool {
    let offset = options.offset(shape.seq_q, shape.seq_kv);
    let (lo, hi) = key_range(options.causal, options.window, offset, i, shape.seq_kv);
    (lo..hi).any(|j| {
        options.masks_allow(b, h, i, j)
            && (options.float_mask.as_ref()).is_none_or(|m| m.at(b, h, i, j) != f32::NEG_INFINITY)
    })
}
