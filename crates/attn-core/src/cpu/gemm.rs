//! How the `A` operand of a GEMM microkernel is laid out, for every instruction set.

/// Rows of `C` per register tile of the AVX2 and AVX-512 GEMMs (and rows per panel of an `A` in
/// [`Lhs::Panels`]).
pub(crate) const MR: usize = 6;

/// How the `A` of a GEMM is laid out.
#[derive(Clone, Copy)]
pub(crate) enum Lhs {
    /// Row-major, rows this far apart.
    Rows(usize),
    /// In panels of [`MR`] rows (the last may hold fewer), as the backward pass packs them:
    /// the panel of rows `r0..` starts at `r0 · k` and holds `[k, panel rows]`.
    Panels,
}
