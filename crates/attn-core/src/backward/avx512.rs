//! The AVX-512 build of the backward kernels: a register-blocked f32 GEMM (6 rows × 64
//! columns of `C` in 24 registers, 4 loads and 6 broadcasts per 24 FMAs, as the forward's
//! kernel in `fused/avx512.rs`), and the elementwise body of `kernels.rs` compiled with the
//! feature on.
//!
//! Every function here is an `unsafe fn` with `#[target_feature]`: callers must have checked
//! the CPU ([`super::kernels::Kernels::avx512`]). The last 16-lane group of a row is handled
//! with masked loads and stores, so no kernel touches a column outside the views it was given.

use std::arch::x86_64::*;

use super::kernels::{Mat, MatMut, probs_and_grads_body};

/// Rows of `C` per register tile.
const MR: usize = 6;
/// 16-lane vectors of `C` per register tile row.
const NV: usize = 4;

/// The lane masks of the `NV` vectors covering columns `col..col + 16·NV` of an `n`-column row.
fn tile_masks(col: usize, n: usize) -> [__mmask16; NV] {
    std::array::from_fn(|v| {
        let lanes = n.saturating_sub(col + v * 16).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    })
}

/// Where one register tile reads and writes: `R` rows of `A` (`k` values each, `lda` apart),
/// `k` rows of `B` (`ldb` apart) and `R` rows of `C` (`ldc` apart).
struct Tile {
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    masks: [__mmask16; NV],
    accumulate: bool,
}

/// One `R × 64` tile of `C (+)= A · B`.
///
/// # Safety
/// AVX-512F must be available, and `t` must describe memory inside live views, the masked-on
/// columns of `B` and `C` included.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize>(t: &Tile) {
    // SAFETY (whole body): the caller guarantees the bounds; masked-off lanes are never
    // touched, and their addresses are formed with `wrapping_add`.
    unsafe {
        let masks = t.masks;
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        if t.accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_maskz_loadu_ps(masks[v], t.c.wrapping_add(r * t.ldc + v * 16));
                }
            }
        }
        for p in 0..t.k {
            let bp = t.b.wrapping_add(p * t.ldb);
            let bv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], bp.wrapping_add(v * 16)));
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*t.a.add(r * t.lda + p));
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, bx, *x);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                _mm512_mask_storeu_ps(t.c.wrapping_add(r * t.ldc + v * 16), masks[v], x);
            }
        }
    }
}

/// `C (+)= A · B`, tile by tile: each 64-column panel of `B` stays in L1 while the row tiles
/// of `A` stream past it.
///
/// # Safety
/// AVX-512F must be available; the shapes of the views must agree (`a` `[m, k]`, `b` `[k, n]`,
/// `c` `[m, n]`).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn gemm(c: MatMut<'_>, a: Mat<'_>, b: Mat<'_>, accumulate: bool) {
    let (m, n, k) = (c.rows, c.cols, a.cols);
    let (ap, bp, cp) = (a.data.as_ptr(), b.data.as_ptr(), c.data.as_mut_ptr());
    for col in (0..n).step_by(16 * NV) {
        let masks = tile_masks(col, n);
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR);
            let t = Tile {
                k,
                a: ap.wrapping_add(row * a.ld),
                lda: a.ld,
                b: bp.wrapping_add(col),
                ldb: b.ld,
                c: cp.wrapping_add(row * c.ld + col),
                ldc: c.ld,
                masks,
                accumulate,
            };
            // SAFETY: AVX-512F is available (caller); the tile lies inside the views, whose
            // bounds were checked when they were made.
            unsafe {
                match rows {
                    6 => tile::<6>(&t),
                    5 => tile::<5>(&t),
                    4 => tile::<4>(&t),
                    3 => tile::<3>(&t),
                    2 => tile::<2>(&t),
                    _ => tile::<1>(&t),
                }
            }
            row += rows;
        }
    }
}

/// [`probs_and_grads_body`] vectorised 16 lanes wide.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn probs_and_grads(s: &mut [f32], dp: &mut [f32], lse: &[f32], delta: &[f32]) {
    probs_and_grads_body(s, dp, lse, delta);
}
