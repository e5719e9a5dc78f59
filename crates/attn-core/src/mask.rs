//! Masks: which keys each query may see, and what is added to its scores.
//!
//! Visibility is the conjunction of four independent rules, each optional:
//! - [`Causal`]: key `j` is visible to query `i` when `j ≤ i + o`, where the alignment picks `o`;
//! - [`Window`]: `i + o − left ≤ j ≤ i + o + right` (the same `o`);
//! - [`BoolMask`]: `true` = may attend, broadcast to `[batch, n_heads, seq_q, seq_kv]`;
//! - [`KeyPadding`]: `true` = a real key, `false` = padding, per `[batch, seq_kv]`.
//!
//! A [`FloatMask`] does not hide keys: it is added to the scaled scores (a `-inf` entry makes a
//! weight 0 all the same).

use rayon::prelude::*;

use crate::{AttnError, AttnShape};

/// Where the causal diagonal sits when `seq_q != seq_kv` (and, as
/// [`AttnOptions::align`](crate::AttnOptions::align), where the window's and ALiBi's sits
/// without a causal mask).
///
/// With offset `o`, query `i` sees keys `j ≤ i + o`:
/// - `TopLeft`: `o = 0`, PyTorch's `is_causal=True`; with `seq_q > seq_kv` the last queries see all keys.
/// - `BottomRight`: `o = seq_kv − seq_q`, FlashAttention's rule and the one for decoding against a
///   key/value cache: the last query sees every key. With `seq_q > seq_kv` the first
///   `seq_q − seq_kv` queries see nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Causal {
    /// `o = 0` (PyTorch's `is_causal=True`).
    TopLeft,
    /// `o = seq_kv − seq_q` (FlashAttention's rule; decoding against a key/value cache).
    BottomRight,
}

/// A local attention window around the (aligned) diagonal: query `i` sees keys
/// `i + o − left ..= i + o + right`, with `o` from the causal alignment, or without a causal
/// mask from [`AttnOptions::align`](crate::AttnOptions::align) (0 unless one of them is
/// bottom-right). `None` leaves that side unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Keys before the diagonal a query sees; `None` for all of them.
    pub left: Option<usize>,
    /// Keys after the diagonal a query sees; `None` for all of them.
    pub right: Option<usize>,
}

/// The diagonal offset `o` of the causal and window rules (see [`Causal`]).
pub fn diagonal_offset(causal: Option<Causal>, seq_q: usize, seq_kv: usize) -> isize {
    match causal {
        Some(Causal::BottomRight) => seq_kv as isize - seq_q as isize,
        _ => 0,
    }
}

/// The contiguous range `lo..hi` of keys that the causal and window rules leave visible to
/// query row `i`. Boolean masks and key padding may hide more inside it.
pub fn key_range(
    causal: Option<Causal>,
    window: Option<Window>,
    offset: isize,
    i: usize,
    seq_kv: usize,
) -> (usize, usize) {
    let diag = i as isize + offset;
    let s = seq_kv as isize;
    let mut lo: isize = 0;
    let mut hi: isize = s;
    if causal.is_some() {
        hi = hi.min(diag + 1);
    }
    if let Some(w) = window {
        // A side wider than `isize` reaches every key, as no side does.
        let wide = |side: usize| isize::try_from(side).unwrap_or(isize::MAX);
        if let Some(left) = w.left {
            lo = lo.max(diag.saturating_sub(wide(left)));
        }
        if let Some(right) = w.right {
            hi = hi.min(diag.saturating_add(wide(right)).saturating_add(1));
        }
    }
    let lo = lo.clamp(0, s) as usize;
    let hi = hi.clamp(0, s) as usize;
    (lo, hi.max(lo))
}

/// A mask tensor broadcastable to `[batch, n_heads, seq_q, seq_kv]`, as PyTorch broadcasts:
/// dims are right-aligned, missing leading dims are 1, and a dim of 1 repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct Broadcast<T> {
    data: Vec<T>,
    dims: [usize; 4],
}

impl<T: Copy> Broadcast<T> {
    fn new(tensor: &'static str, data: Vec<T>, dims: &[usize]) -> Result<Self, AttnError> {
        if dims.is_empty() || dims.len() > 4 {
            return Err(AttnError::InvalidOption {
                option: tensor,
                reason: format!("a mask has 1 to 4 dims, got shape {dims:?}"),
            });
        }
        crate::shape::check_len(tensor, dims, data.len())?;
        let mut full = [1usize; 4];
        full[4 - dims.len()..].copy_from_slice(dims);
        Ok(Broadcast { data, dims: full })
    }

    /// The mask's dims, left-padded with 1 to rank 4.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    /// The mask's values, row-major over [`Self::dims`].
    pub fn data(&self) -> &[T] {
        &self.data
    }

    fn check(&self, tensor: &'static str, shape: &AttnShape) -> Result<(), AttnError> {
        let target = shape.score_dims();
        if self.dims.iter().zip(target).any(|(&d, t)| d != 1 && d != t) {
            return Err(AttnError::NotBroadcastable {
                tensor,
                got: self.dims.to_vec(),
                target: target.to_vec(),
            });
        }
        Ok(())
    }

    /// Where row `(b, h, i)` starts in [`Self::data`], and the stride between keys (0 when the
    /// mask repeats one value across keys). Valid once the mask was checked against the shape.
    ///
    /// # Panics
    /// When `b`, `h` or `i` is past a dim of the mask's that is not 1 (a dim of 1 repeats).
    pub fn row(&self, b: usize, h: usize, i: usize) -> (usize, usize) {
        let [db, dh, dl, ds] = self.dims;
        let pick = |idx: usize, d: usize| {
            assert!(d == 1 || idx < d, "index {idx} past a mask dim of {d}");
            if d == 1 { 0 } else { idx }
        };
        let off = ((pick(b, db) * dh + pick(h, dh)) * dl + pick(i, dl)) * ds;
        (off, usize::from(ds != 1))
    }

    /// The value for query `i` and key `j` of batch `b`, head `h`.
    ///
    /// # Panics
    /// When an index is past a dim of the mask's that is not 1 (a dim of 1 repeats).
    pub fn at(&self, b: usize, h: usize, i: usize, j: usize) -> T {
        let (off, stride) = self.row(b, h, i);
        let keys = self.dims[3];
        assert!(keys == 1 || j < keys, "key {j} past a mask dim of {keys}");
        self.data[off + j * stride]
    }
}

/// Boolean attention mask: `true` = the query may attend to the key, `false` = hidden.
/// Broadcastable to `[batch, n_heads, seq_q, seq_kv]` (PyTorch SDPA's `attn_mask` of dtype bool).
pub type BoolMask = Broadcast<bool>;

/// Additive float mask: added to the scaled (and soft-capped, ALiBi-biased) scores. `-inf`
/// entries give weight 0. Broadcastable to `[batch, n_heads, seq_q, seq_kv]`.
pub type FloatMask = Broadcast<f32>;

impl BoolMask {
    /// # Shapes
    /// `dims` (rank 1 to 4) broadcastable to `[batch, n_heads, seq_q, seq_kv]`.
    pub fn from_vec(data: Vec<bool>, dims: &[usize]) -> Result<Self, AttnError> {
        Broadcast::new("bool_mask", data, dims)
    }

    pub(crate) fn validate(&self, shape: &AttnShape) -> Result<(), AttnError> {
        self.check("bool_mask", shape)
    }
}

impl FloatMask {
    /// # Shapes
    /// `dims` (rank 1 to 4) broadcastable to `[batch, n_heads, seq_q, seq_kv]`.
    pub fn from_vec(data: Vec<f32>, dims: &[usize]) -> Result<Self, AttnError> {
        Broadcast::new("float_mask", data, dims)
    }

    /// NaN and +∞ are refused: +∞ would make the softmax ∞ − ∞ = NaN. −∞ hides the key.
    pub(crate) fn validate(&self, shape: &AttnShape) -> Result<(), AttnError> {
        // Every value below +∞ (NaN never is), checked in parallel chunks whose loops
        // vectorise; the search runs only when one is not, as a scan one value at a time is
        // slow on a large mask.
        let below_infinity = |c: &[f32]| c.iter().fold(true, |ok, &x| ok & (x < f32::INFINITY));
        if !self.data.par_chunks(1 << 16).all(below_infinity)
            && let Some((index, &value)) =
                (self.data.iter().enumerate()).find(|(_, v)| v.is_nan() || **v == f32::INFINITY)
        {
            return Err(AttnError::NonFinite {
                tensor: "float_mask",
                index,
                value,
            });
        }
        self.check("float_mask", shape)
    }
}

/// Key padding: `true` = a real key, `false` = a padding key no query may see.
///
/// # Shapes
/// `[batch, seq_kv]`
#[derive(Debug, Clone, PartialEq)]
pub struct KeyPadding {
    real: Vec<bool>,
    batch: usize,
    seq_kv: usize,
}

impl KeyPadding {
    /// From one flag per key of each sequence, `[batch, seq_kv]` row-major.
    pub fn from_vec(real: Vec<bool>, batch: usize, seq_kv: usize) -> Result<Self, AttnError> {
        crate::shape::check_len("key_padding", &[batch, seq_kv], real.len())?;
        Ok(KeyPadding {
            real,
            batch,
            seq_kv,
        })
    }

    /// From the number of real tokens in each sequence of the batch (the rest is padding).
    pub fn from_lengths(lengths: &[usize], seq_kv: usize) -> Result<Self, AttnError> {
        if let Some(&len) = lengths.iter().find(|&&l| l > seq_kv) {
            return Err(AttnError::InvalidOption {
                option: "key_padding",
                reason: format!("a sequence length {len} exceeds seq_kv {seq_kv}"),
            });
        }
        let real = lengths
            .iter()
            .flat_map(|&len| (0..seq_kv).map(move |j| j < len))
            .collect();
        Self::from_vec(real, lengths.len(), seq_kv)
    }

    /// Whether key `j` of batch `b` is real.
    ///
    /// # Panics
    /// When `b` or `j` is out of range (`b >= batch` or `j >= seq_kv`).
    pub fn is_real(&self, b: usize, j: usize) -> bool {
        let seq_kv = self.seq_kv;
        assert!(j < seq_kv, "key {j} past a sequence of {seq_kv} keys");
        self.row(b)[j]
    }

    /// The flags of batch `b`, one per key.
    ///
    /// # Panics
    /// When `b >= batch`.
    pub fn row(&self, b: usize) -> &[bool] {
        let batch = self.batch;
        assert!(b < batch, "sequence {b} past a batch of {batch}");
        &self.real[b * self.seq_kv..(b + 1) * self.seq_kv]
    }

    pub(crate) fn validate(&self, shape: &AttnShape) -> Result<(), AttnError> {
        if self.batch != shape.batch || self.seq_kv != shape.seq_kv {
            return Err(AttnError::ShapeMismatch {
                tensor: "key_padding",
                expected: vec![shape.batch, shape.seq_kv],
                got: vec![self.batch, self.seq_kv],
            });
        }
        Ok(())
    }
}

/// The 0/1 matrix of a causal mask over `n` tokens (1 = visible), as the notes print it.
pub fn causal_matrix(seq_q: usize, seq_kv: usize, causal: Causal) -> Vec<Vec<u8>> {
    let o = diagonal_offset(Some(causal), seq_q, seq_kv);
    (0..seq_q)
        .map(|i| {
            let (lo, hi) = key_range(Some(causal), None, o, i, seq_kv);
            (0..seq_kv).map(|j| u8::from(j >= lo && j < hi)).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_alignments_differ_when_lengths_differ() {
        // 2 queries, 4 keys. Top-left: row 0 sees key 0, row 1 sees keys 0..=1.
        // Bottom-right (o = 2): row 0 sees keys 0..=2, row 1 sees all 4.
        assert_eq!(
            causal_matrix(2, 4, Causal::TopLeft),
            vec![vec![1, 0, 0, 0], vec![1, 1, 0, 0]]
        );
        assert_eq!(
            causal_matrix(2, 4, Causal::BottomRight),
            vec![vec![1, 1, 1, 0], vec![1, 1, 1, 1]]
        );
        // 3 queries, 1 key, bottom-right (o = -2): only the last query sees the key.
        assert_eq!(
            causal_matrix(3, 1, Causal::BottomRight),
            vec![vec![0], vec![0], vec![1]]
        );
    }

    #[test]
    fn window_is_relative_to_the_aligned_diagonal() {
        let w = Some(Window {
            left: Some(1),
            right: Some(0),
        });
        // Row 2 of 5 with o = 0 sees keys 1..=2.
        assert_eq!(key_range(None, w, 0, 2, 5), (1, 3));
        // Row 0 sees key 0 only; the range never leaves 0..seq_kv.
        assert_eq!(key_range(None, w, 0, 0, 5), (0, 1));
        assert_eq!(key_range(Some(Causal::BottomRight), None, -3, 1, 2), (0, 0));
    }

    #[test]
    fn broadcast_rejects_mismatched_dims() {
        let shape = AttnShape::new(2, 3, 4, 5, 8);
        let ok = BoolMask::from_vec(vec![true; 2 * 4 * 5], &[2, 1, 4, 5]).unwrap();
        assert!(ok.validate(&shape).is_ok());
        let bad = BoolMask::from_vec(vec![true; 3 * 5], &[3, 5]).unwrap();
        assert!(matches!(
            bad.validate(&shape),
            Err(AttnError::NotBroadcastable { .. })
        ));
        assert!(matches!(
            BoolMask::from_vec(vec![true; 3], &[2, 2]),
            Err(AttnError::LengthMismatch { .. })
        ));
    }
}
