//! The inputs of one attention call: three borrowed tensors and the dims they are read with, in
//! f32 or bf16.

use half::bf16;

use crate::error::AttnError;
use crate::options::AttnOptions;
use crate::shape::{AttnOutput, AttnShape};

/// The element types of [`AttnInput`]: `f32`, and `bf16` (accumulated in f32: see [`crate::sdpa`]
/// for what bf16 inputs round). Sealed: the crate implements it for these two only.
pub trait AttnElement: sealed::Sealed {}

impl AttnElement for f32 {}
impl AttnElement for bf16 {}

/// What the crate does with each element type; implemented beside the kernels (`fused`).
pub(crate) mod sealed {
    use super::*;

    pub trait Sealed: Copy + Send + Sync + Into<f32> + std::fmt::Debug + 'static {
        /// The first NaN or infinity in `data`, as [`AttnError::NonFinite`] naming `tensor`.
        fn check_finite(tensor: &'static str, data: &[Self]) -> Result<(), AttnError>;
        /// [`crate::sdpa`] on inputs of this type.
        fn sdpa(
            input: &AttnInput<'_, Self>,
            options: &AttnOptions,
        ) -> Result<AttnOutput, AttnError>
        where
            Self: AttnElement;
        /// [`crate::sdpa_reference`] on inputs of this type.
        fn sdpa_reference(
            input: &AttnInput<'_, Self>,
            options: &AttnOptions,
        ) -> Result<AttnOutput, AttnError>
        where
            Self: AttnElement;
    }
}

/// Borrowed, contiguous, row-major inputs of one attention call, in f32 or bf16 ([`AttnElement`]).
///
/// # Shapes
/// - `q`: `[batch, n_heads, seq_q, head_dim]`
/// - `k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `v`: `[batch, n_kv_heads, seq_kv, value_dim]`
#[derive(Debug, Clone, Copy)]
pub struct AttnInput<'a, T: AttnElement = f32> {
    /// Queries, `[batch, n_heads, seq_q, head_dim]`.
    pub q: &'a [T],
    /// Keys, `[batch, n_kv_heads, seq_kv, head_dim]`.
    pub k: &'a [T],
    /// Values, `[batch, n_kv_heads, seq_kv, value_dim]`.
    pub v: &'a [T],
    /// The dims the slices are read with. Every call checks the slices' lengths against it,
    /// so an input built without [`AttnInput::new`] gets [`AttnError::LengthMismatch`], not a
    /// panic.
    pub shape: AttnShape,
}

impl<'a, T: AttnElement> AttnInput<'a, T> {
    /// Checks the head grouping, every slice's length against `shape`, and that every value is
    /// finite: a NaN or infinity in `q`, `k` or `v` is [`AttnError::NonFinite`] naming the
    /// tensor and the first bad index.
    ///
    /// # Shapes
    /// - `q`: `[batch, n_heads, seq_q, head_dim]`
    /// - `k`: `[batch, n_kv_heads, seq_kv, head_dim]`
    /// - `v`: `[batch, n_kv_heads, seq_kv, value_dim]`
    pub fn new(q: &'a [T], k: &'a [T], v: &'a [T], shape: AttnShape) -> Result<Self, AttnError> {
        let input = Self::allowing_non_finite(q, k, v, shape)?;
        T::check_finite("q", q)?;
        T::check_finite("k", k)?;
        T::check_finite("v", v)?;
        Ok(input)
    }

    /// Like [`AttnInput::new`] without the finiteness check, for callers that want NaN and
    /// infinity to flow through. A non-finite query element then reaches only its own output
    /// row; a non-finite key or value only the rows that can see it.
    ///
    /// # Shapes
    /// As [`AttnInput::new`].
    pub fn allowing_non_finite(
        q: &'a [T],
        k: &'a [T],
        v: &'a [T],
        shape: AttnShape,
    ) -> Result<Self, AttnError> {
        shape.check_lens(q.len(), k.len(), v.len())?;
        Ok(AttnInput { q, k, v, shape })
    }

    /// Builds the input from tensors given with their own dims, checking that they agree and
    /// that every value is finite (as [`AttnInput::new`]).
    ///
    /// # Shapes
    /// - `q`: `[batch, n_heads, seq_q, head_dim]`
    /// - `k`: `[batch, n_kv_heads, seq_kv, head_dim]`
    /// - `v`: `[batch, n_kv_heads, seq_kv, value_dim]`
    pub fn from_dims(
        q: (&'a [T], &[usize]),
        k: (&'a [T], &[usize]),
        v: (&'a [T], &[usize]),
    ) -> Result<Self, AttnError> {
        let rank4 = |tensor: &'static str, dims: &[usize]| -> Result<[usize; 4], AttnError> {
            <[usize; 4]>::try_from(dims).map_err(|_| AttnError::RankMismatch {
                tensor,
                expected: 4,
                got: dims.to_vec(),
            })
        };
        let [b, hq, l, d] = rank4("q", q.1)?;
        let [kb, hkv, s, kd] = rank4("k", k.1)?;
        let vdims = rank4("v", v.1)?;
        if kb != b || kd != d {
            return Err(AttnError::ShapeMismatch {
                tensor: "k",
                expected: vec![b, hkv, s, d],
                got: k.1.to_vec(),
            });
        }
        if vdims[0] != b || vdims[1] != hkv || vdims[2] != s {
            return Err(AttnError::ShapeMismatch {
                tensor: "v",
                expected: vec![b, hkv, s, vdims[3]],
                got: v.1.to_vec(),
            });
        }
        let shape = AttnShape {
            batch: b,
            n_heads: hq,
            n_kv_heads: hkv,
            seq_q: l,
            seq_kv: s,
            head_dim: d,
            value_dim: vdims[3],
        };
        Self::new(q.0, k.0, v.0, shape)
    }
}
