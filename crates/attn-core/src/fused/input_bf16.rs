//! bf16 inputs of the fused kernel: the same call as [`crate::AttnInput`], stored as bf16.

use half::bf16;

use crate::shape::check_len;
use crate::{AttnError, AttnShape};

/// Borrowed, contiguous, row-major bf16 inputs of one attention call.
///
/// # Shapes
/// - `q`: `[batch, n_heads, seq_q, head_dim]`
/// - `k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `v`: `[batch, n_kv_heads, seq_kv, value_dim]`
#[derive(Debug, Clone, Copy)]
pub struct AttnInputBf16<'a> {
    pub q: &'a [bf16],
    pub k: &'a [bf16],
    pub v: &'a [bf16],
    pub shape: AttnShape,
}

impl<'a> AttnInputBf16<'a> {
    /// Checks the head grouping and every slice's length against `shape`.
    ///
    /// # Shapes
    /// As [`AttnInputBf16`].
    pub fn new(
        q: &'a [bf16],
        k: &'a [bf16],
        v: &'a [bf16],
        shape: AttnShape,
    ) -> Result<Self, AttnError> {
        shape.validate()?;
        check_len("q", &shape.q_dims(), q.len())?;
        check_len("k", &shape.k_dims(), k.len())?;
        check_len("v", &shape.v_dims(), v.len())?;
        Ok(AttnInputBf16 { q, k, v, shape })
    }
}
