//! bf16 inputs of the fused kernel: the same call as [`crate::AttnInput`], stored as bf16.

use half::bf16;

use crate::shape::check_finite;
use crate::{AttnError, AttnShape};

/// Borrowed, contiguous, row-major bf16 inputs of one attention call.
///
/// # Shapes
/// - `q`: `[batch, n_heads, seq_q, head_dim]`
/// - `k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `v`: `[batch, n_kv_heads, seq_kv, value_dim]`
#[derive(Debug, Clone, Copy)]
pub struct AttnInputBf16<'a> {
    /// Queries, `[batch, n_heads, seq_q, head_dim]`.
    pub q: &'a [bf16],
    /// Keys, `[batch, n_kv_heads, seq_kv, head_dim]`.
    pub k: &'a [bf16],
    /// Values, `[batch, n_kv_heads, seq_kv, value_dim]`.
    pub v: &'a [bf16],
    /// The dims the slices are read with (every call checks the slices' lengths against it).
    pub shape: AttnShape,
}

impl<'a> AttnInputBf16<'a> {
    /// Checks the head grouping, every slice's length against `shape`, and that every value is
    /// finite (NaN or infinity is [`AttnError::NonFinite`] naming the tensor), as
    /// [`crate::AttnInput::new`] does for f32.
    ///
    /// # Shapes
    /// As [`AttnInputBf16`].
    pub fn new(
        q: &'a [bf16],
        k: &'a [bf16],
        v: &'a [bf16],
        shape: AttnShape,
    ) -> Result<Self, AttnError> {
        let input = Self::allowing_non_finite(q, k, v, shape)?;
        check_finite("q", q)?;
        check_finite("k", k)?;
        check_finite("v", v)?;
        Ok(input)
    }

    /// Like [`AttnInputBf16::new`] without the finiteness check, for callers that want NaN and
    /// infinity to flow through (as [`crate::AttnInput::allowing_non_finite`]).
    ///
    /// # Shapes
    /// As [`AttnInputBf16`].
    pub fn allowing_non_finite(
        q: &'a [bf16],
        k: &'a [bf16],
        v: &'a [bf16],
        shape: AttnShape,
    ) -> Result<Self, AttnError> {
        shape.check_lens(q.len(), k.len(), v.len())?;
        Ok(AttnInputBf16 { q, k, v, shape })
    }
}
