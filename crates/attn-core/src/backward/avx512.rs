//! The AVX-512 build of the backward kernels: a register-blocked f32 GEMM (6 rows × 64
//! columns of `C` in 24 registers, 4 loads and 6 broadcasts per 24 FMAs, as the forward's
//! kernel in `fused/avx512.rs`), and the elementwise body of `kernels.rs` compiled with the
//! feature on. An `A` packed in panels ([`Panels`]) is read with one pointer that moves by a
//! panel column per step, which measured ~190 GFLOP/s per core on 64×64×64 blocks against
//! ~165 for row-major `A` (FMA peak ~215).
//!
//! Every function here is an `unsafe fn` with `#[target_feature]`: callers must have checked
//! the CPU ([`super::kernels::Kernels::avx512`]). The last 16-lane group of a row is handled
//! with masked loads and stores, so no kernel touches a column outside the views it was given.

use std::arch::x86_64::*;

use super::kernels::{Lhs, MR, Mat, MatMut, probs_and_grads_body};

/// 16-lane vectors of `C` per register tile row.
const NV: usize = 4;

/// The lane masks of the `NV` vectors covering columns `col..col + 16·NV` of an `n`-column row.
fn tile_masks(col: usize, n: usize) -> [__mmask16; NV] {
    std::array::from_fn(|v| {
        let lanes = n.saturating_sub(col + v * 16).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    })
}

/// Where one register tile reads and writes: `R` rows of `A` (`k` values each, `lda` apart,
/// or one panel of `R` rows), `k` rows of `B` (`ldb` apart) and `R` rows of `C` (`ldc`
/// apart).
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

/// One `R × 64` tile of `C (+)= A · B`, `A` read as a panel when `PANEL`.
///
/// # Safety
/// AVX-512F must be available, and `t` must describe memory inside live views, the masked-on
/// columns of `B` and `C` included.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize, const PANEL: bool>(t: &Tile) {
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
        let (mut ap, mut bp) = (t.a, t.b);
        for _ in 0..t.k {
            let bv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], bp.wrapping_add(v * 16)));
            bp = bp.wrapping_add(t.ldb);
            for (r, row) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*ap.add(if PANEL { r } else { r * t.lda }));
                for (x, &bx) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, bx, *x);
                }
            }
            ap = ap.wrapping_add(if PANEL { R } else { 1 });
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
pub(super) unsafe fn gemm(c: MatMut<'_>, a: Lhs<'_>, b: Mat<'_>, accumulate: bool) {
    let (m, n, k) = (c.rows, c.cols, b.rows);
    let (panel, ap, lda) = match a {
        Lhs::Rows(a) => (false, a.data.as_ptr(), a.ld),
        Lhs::Panels(a) => (true, a.data.as_ptr(), k),
    };
    let (bp, cp) = (b.data.as_ptr(), c.data.as_mut_ptr());
    for col in (0..n).step_by(16 * NV) {
        let masks = tile_masks(col, n);
        let mut row = 0;
        while row < m {
            let rows = (m - row).min(MR);
            let t = Tile {
                k,
                // A panel starts at `row · k`, as row `row` does at `row · lda`.
                a: ap.wrapping_add(row * lda),
                lda,
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
                match (rows, panel) {
                    (6, false) => tile::<6, false>(&t),
                    (5, false) => tile::<5, false>(&t),
                    (4, false) => tile::<4, false>(&t),
                    (3, false) => tile::<3, false>(&t),
                    (2, false) => tile::<2, false>(&t),
                    (_, false) => tile::<1, false>(&t),
                    (6, true) => tile::<6, true>(&t),
                    (5, true) => tile::<5, true>(&t),
                    (4, true) => tile::<4, true>(&t),
                    (3, true) => tile::<3, true>(&t),
                    (2, true) => tile::<2, true>(&t),
                    (_, true) => tile::<1, true>(&t),
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
