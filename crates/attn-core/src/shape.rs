//! The dimensions of an attention call, its inputs as slices, and its outputs.

use crate::cpu::FiniteBits;
use crate::error::AttnError;

/// Largest weights tensor an attention call will allocate (8 GiB of f32).
pub const MAX_WEIGHTS_BYTES: u128 = 8 << 30;

/// The dimensions of one attention call. One vocabulary everywhere:
/// `batch, n_heads, n_kv_heads, seq_q, seq_kv, head_dim, value_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Independent sequences (masks and key padding may differ per sequence).
    pub batch: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads: `n_heads` for plain multi-head attention, fewer for grouped-query
    /// attention (`n_heads` a multiple of it), 1 for multi-query attention.
    pub n_kv_heads: usize,
    /// Queries per sequence (rows of the score matrix).
    pub seq_q: usize,
    /// Keys and values per sequence (columns of the score matrix).
    pub seq_kv: usize,
    /// Length of a query and a key vector; the default scale is `1/√head_dim`.
    pub head_dim: usize,
    /// Length of a value vector, and of an output row.
    pub value_dim: usize,
}

impl AttnShape {
    /// Plain multi-head attention: as many key/value heads as query heads, `value_dim == head_dim`.
    pub fn new(batch: usize, n_heads: usize, seq_q: usize, seq_kv: usize, head_dim: usize) -> Self {
        AttnShape {
            batch,
            n_heads,
            n_kv_heads: n_heads,
            seq_q,
            seq_kv,
            head_dim,
            value_dim: head_dim,
        }
    }

    /// The same shape with `n_kv_heads` key/value heads (grouped-query attention; 1 for
    /// multi-query attention).
    pub fn with_kv_heads(self, n_kv_heads: usize) -> Self {
        AttnShape { n_kv_heads, ..self }
    }

    /// The same shape with values (and output rows) of length `value_dim`.
    pub fn with_value_dim(self, value_dim: usize) -> Self {
        AttnShape { value_dim, ..self }
    }

    /// How many query heads share one key/value head.
    ///
    /// # Panics
    /// When `n_kv_heads` is 0 (which [`AttnShape::validate`] refuses).
    pub fn group_size(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// The key/value head that query head `h` reads (PyTorch's `repeat_interleave` order).
    ///
    /// # Panics
    /// When `n_kv_heads` is 0 (which [`AttnShape::validate`] refuses).
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group_size()
    }

    /// `(batch, head, query)` of row `row` of a `[batch, n_heads, seq_q]` tensor (the lse, or
    /// the rows of `q` and `out`).
    pub(crate) fn query_row(&self, row: usize) -> (usize, usize, usize) {
        let (h, l) = (self.n_heads, self.seq_q);
        (row / (h * l), row / l % h, row % l)
    }

    /// `[batch, n_heads, seq_q, head_dim]`
    pub fn q_dims(&self) -> [usize; 4] {
        [self.batch, self.n_heads, self.seq_q, self.head_dim]
    }
    /// `[batch, n_kv_heads, seq_kv, head_dim]`
    pub fn k_dims(&self) -> [usize; 4] {
        [self.batch, self.n_kv_heads, self.seq_kv, self.head_dim]
    }
    /// `[batch, n_kv_heads, seq_kv, value_dim]`
    pub fn v_dims(&self) -> [usize; 4] {
        [self.batch, self.n_kv_heads, self.seq_kv, self.value_dim]
    }
    /// `[batch, n_heads, seq_q, value_dim]`
    pub fn out_dims(&self) -> [usize; 4] {
        [self.batch, self.n_heads, self.seq_q, self.value_dim]
    }
    /// The dims every mask broadcasts to: `[batch, n_heads, seq_q, seq_kv]`.
    pub fn score_dims(&self) -> [usize; 4] {
        [self.batch, self.n_heads, self.seq_q, self.seq_kv]
    }

    /// Checks the shape itself ([`AttnShape::validate`]) and the element counts of q, k and v
    /// against it.
    pub(crate) fn check_lens(&self, q: usize, k: usize, v: usize) -> Result<(), AttnError> {
        self.validate()?;
        check_len("q", &self.q_dims(), q)?;
        check_len("k", &self.k_dims(), k)?;
        check_len("v", &self.v_dims(), v)
    }

    /// Checks the head grouping, that the per-row state and the output fit, and that a call
    /// whose queries and keys are empty declares few scores; element counts are checked by
    /// [`crate::AttnInput::new`].
    ///
    /// The kernels keep an f32 per query row (the log-sum-exp) and per key (scores), even when
    /// `head_dim` or `value_dim` is 0 and every tensor is empty. Without this check an empty case
    /// declaring 10¹² rows asked for terabytes and aborted; now `batch · n_heads · seq_q` and
    /// `batch · n_kv_heads · seq_kv` f32 values must each fit in [`MAX_WEIGHTS_BYTES`], which
    /// any input that holds at least one value per row already does, and so must the output
    /// (`[batch, n_heads, seq_q, value_dim]`: 1 MiB of queries and of values could otherwise ask
    /// for terabytes of it) unless it is no larger than q, k and v together.
    ///
    /// With `head_dim` 0 nothing in the inputs bounds the rows, keys or scores (every score is
    /// 0·scale): such a call may declare at most [`MAX_EMPTY_HEAD_SCORES`] scores. Without this,
    /// a 256-byte case declaring 2^20 rows and keys ran 2^40 steps, and one of 2^31 rows allocated
    /// more state per row than the check above counts.
    pub fn validate(&self) -> Result<(), AttnError> {
        self.validate_sizes()?;
        if self.head_dim == 0 {
            let scores = self.score_dims();
            let count = scores
                .iter()
                .fold(1u128, |n, &d| n.saturating_mul(d as u128));
            check_empty_head_scores(&scores, count)?;
        }
        Ok(())
    }

    /// [`AttnShape::validate`] but for the count of scores with `head_dim` 0: the head grouping,
    /// the per-row state and the output. A packed batch's totals take this, and the count of
    /// their sequences' own scores.
    pub(crate) fn validate_sizes(&self) -> Result<(), AttnError> {
        if self.n_kv_heads == 0 {
            return Err(AttnError::NoKvHeads {
                n_heads: self.n_heads,
            });
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(AttnError::HeadsNotDivisible {
                n_heads: self.n_heads,
                n_kv_heads: self.n_kv_heads,
            });
        }
        let q_rows = [self.batch, self.n_heads, self.seq_q];
        let k_rows = [self.batch, self.n_kv_heads, self.seq_kv];
        let out = self.out_dims();
        let inputs = [self.q_dims(), self.k_dims(), self.v_dims()]
            .iter()
            .map(|dims| f32_bytes(dims))
            .fold(0u128, u128::saturating_add);
        for (what, dims, bound) in [
            ("query rows", &q_rows[..], MAX_WEIGHTS_BYTES),
            ("key rows", &k_rows[..], MAX_WEIGHTS_BYTES),
            // An output no larger than the inputs is theirs to ask for.
            ("the output", &out[..], MAX_WEIGHTS_BYTES.max(inputs)),
        ] {
            let bytes = f32_bytes(dims);
            if bytes > bound {
                return Err(AttnError::TooLarge {
                    what,
                    shape: dims.to_vec(),
                    bytes,
                });
            }
        }
        Ok(())
    }
}

/// Refuses `count` scores (of a call with `head_dim` 0, whose scores are `shape`) past
/// [`MAX_EMPTY_HEAD_SCORES`].
pub(crate) fn check_empty_head_scores(shape: &[usize], count: u128) -> Result<(), AttnError> {
    match count > MAX_EMPTY_HEAD_SCORES as u128 {
        true => Err(AttnError::EmptyHeadTooLarge {
            shape: shape.to_vec(),
            scores: count,
            max: MAX_EMPTY_HEAD_SCORES,
        }),
        false => Ok(()),
    }
}

/// The most scores a call with `head_dim` 0 may declare ([`AttnShape::validate`]): its queries
/// and keys hold nothing, so the inputs bound neither its work nor its per-row state. 2^26
/// scores keep such a call short.
pub const MAX_EMPTY_HEAD_SCORES: usize = 1 << 26;

/// Bytes of an f32 tensor of shape `dims`, saturating at `u128::MAX`: a size to compare with a
/// limit before allocating, whatever the dims.
pub fn f32_bytes(dims: &[usize]) -> u128 {
    dims.iter()
        .fold(4u128, |acc, &d| acc.saturating_mul(d as u128))
}

/// Number of elements of a shape, or `None` on overflow.
pub fn checked_numel(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

pub(crate) fn check_len(tensor: &'static str, dims: &[usize], got: usize) -> Result<(), AttnError> {
    let expected = checked_numel(dims).ok_or_else(|| AttnError::TooLarge {
        what: tensor,
        shape: dims.to_vec(),
        bytes: u128::MAX,
    })?;
    if expected != got {
        return Err(AttnError::LengthMismatch {
            tensor,
            shape: dims.to_vec(),
            expected,
            got,
        });
    }
    Ok(())
}

/// The first NaN or infinity in `data`, as [`AttnError::NonFinite`] naming `tensor`.
pub(crate) fn check_finite<T: FiniteBits>(tensor: &'static str, data: &[T]) -> Result<(), AttnError>
where
    f32: From<T>,
{
    // One vectorised pass; the search runs only when something is not finite.
    if T::all_finite(data) {
        return Ok(());
    }
    match data.iter().position(|&x| !f32::from(x).is_finite()) {
        None => Ok(()),
        Some(index) => Err(AttnError::NonFinite {
            tensor,
            index,
            value: f32::from(data[index]),
        }),
    }
}

/// Attention weights, as asked for by [`crate::WeightsRequest`], with their dims.
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    /// Every row.
    All {
        /// `[batch, n_heads, seq_q, seq_kv]`
        dims: [usize; 4],
        /// Row-major, as `dims` says.
        data: Vec<f32>,
    },
    /// The chosen query rows, in the order asked.
    Rows {
        /// The query rows, in the order asked.
        rows: Vec<usize>,
        /// `[batch, n_heads, rows.len(), seq_kv]`
        dims: [usize; 4],
        /// Row-major, as `dims` says.
        data: Vec<f32>,
    },
    /// Averaged over heads.
    HeadAverage {
        /// `[batch, seq_q, seq_kv]`
        dims: [usize; 3],
        /// Row-major, as `dims` says.
        data: Vec<f32>,
    },
}

impl Weights {
    /// Every row's weights of a call of `shape`.
    pub(crate) fn all(shape: &AttnShape, data: Vec<f32>) -> Weights {
        let dims = [shape.batch, shape.n_heads, shape.seq_q, shape.seq_kv];
        Weights::All { dims, data }
    }

    /// The weights of query rows `rows` of a call of `shape`.
    pub(crate) fn rows(shape: &AttnShape, rows: Vec<usize>, data: Vec<f32>) -> Weights {
        let dims = [shape.batch, shape.n_heads, rows.len(), shape.seq_kv];
        Weights::Rows { rows, dims, data }
    }

    /// The heads' average weights of a call of `shape`.
    pub(crate) fn head_average(shape: &AttnShape, data: Vec<f32>) -> Weights {
        let dims = [shape.batch, shape.seq_q, shape.seq_kv];
        Weights::HeadAverage { dims, data }
    }

    /// The weights' values, whatever was asked for.
    pub fn data(&self) -> &[f32] {
        match self {
            Weights::All { data, .. }
            | Weights::Rows { data, .. }
            | Weights::HeadAverage { data, .. } => data,
        }
    }

    /// The dims of [`Weights::data`].
    pub fn dims(&self) -> &[usize] {
        match self {
            Weights::All { dims, .. } | Weights::Rows { dims, .. } => dims,
            Weights::HeadAverage { dims, .. } => dims,
        }
    }

    /// Query `i`'s weights over the keys in batch `b`, head `h`: from [`Weights::All`], or
    /// from [`Weights::Rows`] when `i` is one of its rows. `None` when the weights do not hold
    /// that row, an index is out of range, or `data` disagrees with `dims`; the head
    /// average's rows are [`Weights::average_row`].
    pub fn row(&self, b: usize, h: usize, i: usize) -> Option<&[f32]> {
        let (r, dims, data) = match self {
            Weights::All { dims, data } => (i, dims, data),
            Weights::Rows { rows, dims, data } => {
                (rows.iter().position(|&row| row == i)?, dims, data)
            }
            Weights::HeadAverage { .. } => return None,
        };
        let [batch, heads, n_rows, seq_kv] = *dims;
        if b >= batch || h >= heads || r >= n_rows {
            return None;
        }
        (checked_numel(dims)? == data.len()).then_some(())?;
        let start = ((b * heads + h) * n_rows + r) * seq_kv;
        data.get(start..start + seq_kv)
    }

    /// Query `i`'s weights over the keys, averaged over the heads, in batch `b`: from
    /// [`Weights::HeadAverage`]; `None` for the other kinds, an index out of range, or `data`
    /// that disagrees with `dims`.
    pub fn average_row(&self, b: usize, i: usize) -> Option<&[f32]> {
        let Weights::HeadAverage { dims, data } = self else {
            return None;
        };
        let [batch, seq_q, seq_kv] = *dims;
        if b >= batch || i >= seq_q {
            return None;
        }
        (checked_numel(dims)? == data.len()).then_some(())?;
        let start = (b * seq_q + i) * seq_kv;
        data.get(start..start + seq_kv)
    }
}

/// The result of an attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttnOutput {
    /// `[batch, n_heads, seq_q, value_dim]`
    pub out: Vec<f32>,
    /// Natural-log sum of exp of the visible scores, `[batch, n_heads, seq_q]`; −∞ for a row that
    /// sees no key.
    pub lse: Vec<f32>,
    /// Present when asked for.
    pub weights: Option<Weights>,
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;

    /// Every finite value passes, down to the extremes; any NaN or infinity, anywhere (vector
    /// bodies and tails), is found at its index.
    #[test]
    fn check_finite_finds_every_non_finite_value() {
        fn case<T: FiniteBits + std::fmt::Debug>(finite: &[T], bad: &[T])
        where
            f32: From<T>,
        {
            for n in [0, 1, 15, 16, 17, 1000] {
                let data: Vec<T> = (0..n).map(|i| finite[i % finite.len()]).collect();
                assert!(T::all_finite(&data), "{data:?}");
                assert!(T::all_below_in(&data, T::INFINITY), "{data:?}");
                assert_eq!(check_finite("x", &data), Ok(()));
                for at in [0, n / 2, n.saturating_sub(1)]
                    .into_iter()
                    .filter(|_| n > 0)
                {
                    for &b in bad {
                        let mut data = data.clone();
                        data[at] = b;
                        assert!(!T::all_finite(&data), "{b:?} at {at} of {n}");
                        assert!(!T::all_below_in(&data, T::INFINITY), "{b:?} at {at} of {n}");
                        let err = check_finite("x", &data).unwrap_err();
                        assert!(
                            matches!(err, AttnError::NonFinite { tensor: "x", index, .. } if index == at),
                            "{b:?} at {at} of {n}: {err:?}"
                        );
                    }
                }
            }
        }
        let f32_finite = [
            0.0,
            -0.0,
            1.5,
            -3.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
        ];
        let f32_bad = [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        case(&f32_finite, &f32_bad);
        let bf16_finite = [
            bf16::ZERO,
            bf16::NEG_ZERO,
            bf16::MAX,
            bf16::MIN,
            bf16::from_bits(1),
        ];
        let bf16_bad = [
            bf16::NAN,
            bf16::INFINITY,
            bf16::NEG_INFINITY,
            bf16::from_bits(0xff81),
        ];
        case(&bf16_finite, &bf16_bad);
    }
}
