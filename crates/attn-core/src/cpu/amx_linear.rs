//! Linear layers on Intel AMX tiles with close to f32 accuracy: "bf16x3".
//!
//! AMX multiplies bf16 matrices (8-bit significands) with f32 accumulation, an order of
//! magnitude faster than f32 FMAs. To keep f32-like results each f32 value `x` is split into two
//! bf16 values, `hi = bf16(x)` and `lo = bf16(x − hi)`, which together hold 16 significant bits,
//! and a product is taken as `hi·hi + hi·lo + lo·hi` (the dropped `lo·lo` and the split's
//! remainders are ≈ 2⁻¹⁷ of the product): three bf16 tile products per f32 product
//! (Henry, Tang & Heinecke, "Leveraging the bfloat16 Artificial Intelligence Datatype For
//! Higher-Precision Computations", ARITH 2019, <https://arxiv.org/abs/1904.06376>).
//!
//! Weights are split and packed into tile order once ([`Bf16x3Weight`]); activations are split
//! as the tiles need them, 32 rows by one block of k at a time.
//! [`Bf16x3Weight::matmul_reference`] computes the same sums in plain Rust, so the numerics can
//! be checked on any CPU.
//!
//! Tile instructions (Intel SDM vol. 1 ch. 18, "Intel AMX"): `tdpbf16ps C, A, B` adds
//! `A[16 rows, 32 bf16] · B` to `C[16 rows, 16 f32]`, with `B` stored in pairs of k
//! ("VNNI" layout: tile row `r` holds, for each of 16 columns, the values at k = 2r and 2r + 1).

use std::ops::Range;

use rayon::prelude::*;

use super::amx::Tiles;
use super::element::FiniteBits;
use super::isa::Features;

/// Rows of a tile; also the f32 columns of an output tile.
const TILE_ROWS: usize = 16;
/// bf16 values along k in one tile row (64 bytes).
const TILE_K: usize = 32;
/// Output rows and columns of one kernel block: 2 × 2 C tiles.
const BLOCK: usize = 32;
/// Lines of one k step of a packed block: `hi` of tiles 0 and 1, then `lo` of both.
const STEP_LINES: usize = 4 * TILE_ROWS;
/// Most k steps of a block of the weight that stays in L2 while every row block meets it
/// (GotoBLAS blocking: Goto & van de Geijn, "Anatomy of High-Performance Matrix
/// Multiplication", TOMS 2008). 24 steps = 768 k: every row block's output is read back and
/// added to once per such block, so few and long blocks are better, while the row block's
/// share (32 rows × 768 k × 4 bytes = 96 KiB) still stays in L2 beside the weight's.
const KC_MAX_STEPS: usize = 24;
/// Bytes of the block of the weight kept in L2 (of 2 MiB per core on Sapphire Rapids).
const WEIGHT_BLOCK_BYTES: usize = 1280 * 1024;

/// One tile row: 32 bf16 values, 64-byte aligned so that tile loads never split cache lines.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Line([u16; TILE_K]);

const ZERO_LINE: Line = Line([0; TILE_K]);

/// `x` rounded to the nearest bf16 (ties to even), as its bit pattern.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bf16 bit pattern.
#[inline(always)]
fn bf16_value(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// `(hi, lo)` with `hi = bf16(x)` and `lo = bf16(x − hi)`.
#[inline(always)]
fn split(x: f32) -> (u16, u16) {
    let hi = bf16_bits(x);
    (hi, bf16_bits(x - bf16_value(hi)))
}

/// A weight `W` `[n_in, n_out]` split into bf16 `hi` and `lo` and laid out in B tiles: for each
/// block of 32 output columns, for each step of 32 along k, the `hi` tiles of columns 0‥16 and
/// 16‥32, then their `lo` tiles. k and the output columns are padded with zeros to whole blocks.
#[derive(Clone)]
pub struct Bf16x3Weight {
    lines: Vec<Line>,
    n_in: usize,
    n_out: usize,
    k_steps: usize,
}

impl std::fmt::Debug for Bf16x3Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bf16x3Weight")
            .field("n_in", &self.n_in)
            .field("n_out", &self.n_out)
            .finish_non_exhaustive()
    }
}

impl Bf16x3Weight {
    /// The largest magnitude the tiles take. bf16's largest finite value is 3.39e38, so
    /// `bf16(x)` of a larger f32 is ∞ and its product NaN; past 2¹²⁶ the products run in f32
    /// instead. At the other end the tiles flush bf16 subnormals to 0: parts below 2⁻¹²⁶ (a `lo`
    /// part of values below about 2⁻¹¹⁷ ≈ 6e-36) are lost, an absolute error under 1e-35 per
    /// product.
    pub const MAX_ABS: f32 = 8.507_059e37;

    /// Whether every value of `values` is within [`Bf16x3Weight::MAX_ABS`] (NaN is not).
    pub fn fits(values: &[f32]) -> bool {
        // A check of bits, 512 at a time: a scalar loop over each GEMM's input cost 12% of a
        // batch of classifications.
        let above = f32::from_bits(Self::MAX_ABS.to_bits() + 1);
        <f32 as FiniteBits>::all_below(values, above)
    }

    /// Whether this CPU and OS run AMX bf16 tiles ([`crate::Isa::Amx`]: checked, and on Linux
    /// the tile state requested for the process, once).
    pub fn available() -> bool {
        Features::get().amx
    }

    /// Packs the weight whose element at input `k`, output `n` is `w(k, n)`.
    ///
    /// # Shapes
    /// - `w`: `[n_in, n_out]` as a function of `(k, n)`
    pub fn pack(n_in: usize, n_out: usize, w: impl Fn(usize, usize) -> f32 + Sync) -> Self {
        Self::pack_columns(n_in, n_out, |n, column| {
            for (k, v) in column.iter_mut().enumerate() {
                *v = w(k, n);
            }
        })
    }

    /// Packs the weight whose output column `n` `column(n, out)` writes into `out` (`[n_in]`):
    /// one call per column, for weights whose columns are contiguous (a PyTorch `[n_out, n_in]`
    /// weight, or one widened from 16 bits as it is read).
    ///
    /// # Shapes
    /// - `out`: `[n_in]`
    pub fn pack_columns(
        n_in: usize,
        n_out: usize,
        column: impl Fn(usize, &mut [f32]) + Sync,
    ) -> Self {
        let k_steps = n_in.div_ceil(TILE_K);
        let panel_lines = k_steps * STEP_LINES;
        let mut lines = vec![ZERO_LINE; n_out.div_ceil(BLOCK) * panel_lines];
        lines
            .par_chunks_mut(panel_lines)
            .enumerate()
            .for_each(|(nb, panel)| {
                // The step's values are gathered in tile order first, then split in one
                // contiguous loop that vectorises (splitting as they were gathered was a
                // third of a cold `classify --file`'s packing).
                let mut step = [[0.0f32; TILE_K]; 2 * TILE_ROWS];
                let cols = BLOCK.min(n_out - nb * BLOCK);
                let mut columns = vec![0.0f32; cols * n_in];
                for (c, out) in columns.chunks_exact_mut(n_in.max(1)).enumerate() {
                    column(nb * BLOCK + c, out);
                }
                for (ks, tiles) in panel.chunks_exact_mut(STEP_LINES).enumerate() {
                    let (hi, lo) = tiles.split_at_mut(2 * TILE_ROWS);
                    let ks_k = ks * TILE_K..n_in.min((ks + 1) * TILE_K);
                    for (c, column) in columns.chunks_exact(n_in.max(1)).enumerate() {
                        let lines = &mut step[(c / TILE_ROWS) * TILE_ROWS..][..TILE_ROWS];
                        let at = 2 * (c % TILE_ROWS);
                        // Line r holds k = 2r and 2r + 1 of each column side by side.
                        for (line, pair) in lines.iter_mut().zip(column[ks_k.clone()].chunks(2)) {
                            for (slot, &v) in line[at..].iter_mut().zip(pair) {
                                *slot = v;
                            }
                        }
                    }
                    for ((values, hi), lo) in step.iter_mut().zip(hi).zip(lo) {
                        for ((x, h), l) in values.iter_mut().zip(&mut hi.0).zip(&mut lo.0) {
                            (*h, *l) = split(std::mem::take(x));
                        }
                    }
                }
            });
        Bf16x3Weight {
            lines,
            n_in,
            n_out,
            k_steps,
        }
    }

    /// `y = x·W` on AMX tiles, then `epilogue(rows, cols)` on each finished block of `y` (while it
    /// is still in cache): `rows` is a `[r ≤ 32, n_out]` slice of `y`, `cols` the finished columns.
    /// With `parallel`, the rows are shared out among rayon's threads.
    ///
    /// # Shapes
    /// - `x`: `[rows, n_in]`, `y`: `[rows, n_out]`
    ///
    /// # Panics
    /// If [`Bf16x3Weight::available`] is false.
    pub fn matmul(
        &self,
        x: &[f32],
        y: &mut [f32],
        parallel: bool,
        epilogue: impl Fn(&mut [f32], Range<usize>) + Sync,
    ) {
        assert!(Self::available(), "Bf16x3Weight::matmul needs AMX tiles");
        let w = self;
        let (n_in, n_out) = (w.n_in, w.n_out);
        let rows = x.len() / n_in;
        debug_assert_eq!(x.len(), rows * n_in);
        debug_assert_eq!(y.len(), rows * n_out);
        // SAFETY: `available` saw AMX-BF16 and the OS granted the tile state; `x` and `y` have
        // the same rows.
        let run = |(x, y): (&[f32], &mut [f32])| unsafe { multiply_rows(w, x, y, &epilogue) };
        let threads = if parallel {
            rayon::current_num_threads()
        } else {
            1
        };
        // Whole row blocks per thread.
        let share = rows.div_ceil(threads).div_ceil(BLOCK).max(1) * BLOCK;
        let parts = x.chunks(share * n_in).zip(y.chunks_mut(share * n_out));
        if threads > 1 && rows > share {
            parts.par_bridge().for_each(run);
        } else {
            parts.for_each(run);
        }
    }

    /// The sums [`Bf16x3Weight::matmul`] computes, in plain Rust on any CPU: `y[m, n] = Σ_k hi(x)·hi(w) +
    /// hi(x)·lo(w) + lo(x)·hi(w)`, each product exact and the sum in f64 (the tiles add in f32, so
    /// the two differ by f32 rounding of the sum only).
    ///
    /// # Shapes
    /// - `x`: `[rows, n_in]`, `y`: `[rows, n_out]`
    pub fn matmul_reference(&self, x: &[f32], y: &mut [f32]) {
        let w = self;
        let (n_in, n_out) = (w.n_in, w.n_out);
        for (xr, yr) in x.chunks_exact(n_in).zip(y.chunks_exact_mut(n_out)) {
            let xs: Vec<(f64, f64)> = xr
                .iter()
                .map(|&v| {
                    let (h, l) = split(v);
                    (f64::from(bf16_value(h)), f64::from(bf16_value(l)))
                })
                .collect();
            for (n, out) in yr.iter_mut().enumerate() {
                let sum: f64 = xs
                    .iter()
                    .enumerate()
                    .map(|(k, &(xh, xl))| {
                        let (h, l) = w.get(k, n);
                        let (wh, wl) = (f64::from(bf16_value(h)), f64::from(bf16_value(l)));
                        xh * wh + xh * wl + xl * wh
                    })
                    .sum();
                *out = sum as f32;
            }
        }
    }

    /// Input width (rows of the packed matrix).
    pub fn n_in(&self) -> usize {
        self.n_in
    }

    /// Output width (columns of the packed matrix).
    pub fn n_out(&self) -> usize {
        self.n_out
    }

    /// The lines of output column block `nb`: `k_steps × [hi, hi, lo, lo tiles]`.
    fn panel(&self, nb: usize) -> &[Line] {
        let len = self.k_steps * STEP_LINES;
        &self.lines[nb * len..][..len]
    }

    /// `(hi, lo)` of `W[k, n]` read back from the packed tiles.
    fn get(&self, k: usize, n: usize) -> (u16, u16) {
        let step = &self.panel(n / BLOCK)[(k / TILE_K) * STEP_LINES..][..STEP_LINES];
        let c = n % BLOCK;
        let line = (c / TILE_ROWS) * TILE_ROWS + (k % TILE_K) / 2;
        let at = 2 * (c % TILE_ROWS) + k % 2;
        (step[line].0[at], step[2 * TILE_ROWS + line].0[at])
    }
}

/// Splits rows `x[rows ≤ 32, n_in]`, k steps `steps` of them, into `out`: per step four A
/// tiles, `hi` of rows 0‥16, `hi` of rows 16‥32, then the same for `lo`. Missing rows and k
/// beyond `n_in` are zero.
fn pack_block(x: &[f32], n_in: usize, steps: Range<usize>, out: &mut [Line]) {
    #[cfg(target_arch = "x86_64")]
    if Features::get().avx512_bf16 {
        // SAFETY: the CPU has AVX-512F/BW/VL and AVX512-BF16 (every AMX CPU has).
        unsafe { pack_block_avx512(x, n_in, steps, out) };
        return;
    }
    pack_block_body(x, n_in, steps, out, |x, hi, lo| {
        hi.0 = [0; TILE_K];
        lo.0 = [0; TILE_K];
        for ((&v, h), l) in x.iter().zip(&mut hi.0).zip(&mut lo.0) {
            (*h, *l) = split(v);
        }
    });
}

/// # Safety
/// The CPU must have AVX-512F/BW/VL and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn pack_block_avx512(x: &[f32], n_in: usize, steps: Range<usize>, out: &mut [Line]) {
    // SAFETY: the CPU has what `split_line_avx512` needs.
    pack_block_body(x, n_in, steps, out, |x, hi, lo| unsafe {
        split_line_avx512(x, hi, lo)
    });
}

/// The loop of [`pack_block`]: the output is written in order, one step (4 KiB) at a time.
#[inline(always)]
fn pack_block_body(
    x: &[f32],
    n_in: usize,
    steps: Range<usize>,
    out: &mut [Line],
    split_line: impl Fn(&[f32], &mut Line, &mut Line),
) {
    let rows = x.len() / n_in;
    for (ks, step) in steps.zip(out.chunks_exact_mut(STEP_LINES)) {
        let (hi, lo) = step.split_at_mut(2 * TILE_ROWS);
        let k = ks * TILE_K..n_in.min((ks + 1) * TILE_K);
        for (r, (hi, lo)) in hi.iter_mut().zip(lo.iter_mut()).enumerate() {
            if r < rows {
                split_line(&x[r * n_in..][k.clone()], hi, lo);
            } else {
                *hi = ZERO_LINE;
                *lo = ZERO_LINE;
            }
        }
    }
}

/// Asks for the cache lines of k steps `steps` of the rows `x` `[rows, n_in]` (into L1; on
/// other targets nothing).
fn prefetch_rows(x: &[f32], n_in: usize, steps: Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let k = steps.start * TILE_K..n_in.min(steps.end * TILE_K);
        for row in x.chunks_exact(n_in) {
            // 16 f32 per 64-byte line.
            for line in row[k.clone()].chunks(16) {
                // SAFETY: a prefetch only hints the cache; the address is inside `x`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (x, n_in, steps);
}

/// Splits up to 32 values into a `hi` and a `lo` line (zeros after them), 16 at a time
/// ([`super::bf16x::split`]: nearest even like [`split`], subnormals flushed as the tiles do
/// anyway).
///
/// # Safety
/// The CPU must have AVX-512F/BW/VL and AVX512-BF16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn split_line_avx512(x: &[f32], hi: &mut Line, lo: &mut Line) {
    use std::arch::x86_64::*;
    for half in 0..2 {
        let n = x.len().saturating_sub(half * 16).min(16);
        let mask = (((1u32 << n) - 1) & 0xffff) as __mmask16;
        // SAFETY: the mask reads only `n` values, all inside `x` (none when `n` is 0); the
        // stores write 16 u16 into the 32-value lines at offset 0 or 16; the CPU has what
        // `split` needs (caller).
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, x.as_ptr().wrapping_add(half * 16));
            let [h, l] = super::bf16x::split::<2>(v);
            _mm256_storeu_si256(hi.0.as_mut_ptr().add(half * 16).cast(), h);
            _mm256_storeu_si256(lo.0.as_mut_ptr().add(half * 16).cast(), l);
        }
    }
}

/// `y = x·W`, block by block of the weight (k steps × columns kept in L2), splitting each 32
/// rows' share of `x` just before use and calling `epilogue` on each block of rows and columns
/// once its last k step is added.
///
/// # Safety
/// The CPU must have AMX-BF16 with the tile state granted; `x` `[rows, n_in]` and `y`
/// `[rows, n_out]`.
#[cfg(target_arch = "x86_64")]
unsafe fn multiply_rows(
    w: &Bf16x3Weight,
    x: &[f32],
    y: &mut [f32],
    epilogue: &impl Fn(&mut [f32], Range<usize>),
) {
    let (n_in, n_out) = (w.n_in, w.n_out);
    let rows = y.len() / n_out;
    debug_assert_eq!(x.len(), rows * n_in);
    let n_blocks = n_out.div_ceil(BLOCK);
    // Equal k blocks of at most KC_MAX_STEPS; as many column blocks as fit the L2 budget.
    let kc_steps = w.k_steps.div_ceil(w.k_steps.div_ceil(KC_MAX_STEPS));
    let nc_blocks = (WEIGHT_BLOCK_BYTES / (kc_steps * STEP_LINES * 64)).max(1);
    let mut a_block = vec![ZERO_LINE; kc_steps * STEP_LINES];
    let mut edge = [0.0f32; BLOCK * BLOCK];
    let _tiles = Tiles::configure().expect("the caller saw AMX available");
    for nc in (0..n_blocks).step_by(nc_blocks) {
        let nbs = nc..n_blocks.min(nc + nc_blocks);
        let cols = nc * BLOCK..n_out.min(nbs.end * BLOCK);
        for kc in (0..w.k_steps).step_by(kc_steps) {
            let steps = kc_steps.min(w.k_steps - kc);
            let accumulate = kc > 0;
            for mb in 0..rows.div_ceil(BLOCK) {
                let (row, block_rows) = (mb * BLOCK, BLOCK.min(rows - mb * BLOCK));
                pack_block(
                    &x[row * n_in..][..block_rows * n_in],
                    n_in,
                    kc..kc + steps,
                    &mut a_block,
                );
                // The next row block's share of `x` is fetched while this one meets the weight,
                // a few rows per column block (all at once would fill the miss buffers).
                let next = &x[rows.min(row + BLOCK) * n_in..rows.min(row + 2 * BLOCK) * n_in];
                let per_nb = (next.len() / n_in).div_ceil(nbs.len()).max(1) * n_in;
                let mut next = next.chunks(per_nb);
                let a = a_block.as_ptr();
                for nb in nbs.clone() {
                    if let Some(rows) = next.next() {
                        prefetch_rows(rows, n_in, kc..kc + steps);
                    }
                    let b = w.panel(nb)[kc * STEP_LINES..].as_ptr();
                    let (col, block_cols) = (nb * BLOCK, BLOCK.min(n_out - nb * BLOCK));
                    // A whole block is read and written in place; one at an edge through `edge`.
                    let whole = block_cols == BLOCK && block_rows == BLOCK;
                    let (c, c_stride) = if whole {
                        (y[row * n_out + col..].as_mut_ptr(), n_out * 4)
                    } else {
                        if accumulate {
                            for r in 0..block_rows {
                                edge[r * BLOCK..][..block_cols]
                                    .copy_from_slice(&y[(row + r) * n_out + col..][..block_cols]);
                            }
                        }
                        (edge.as_mut_ptr(), BLOCK * 4)
                    };
                    // SAFETY: `a` and `b` hold `steps` × 4 tiles of 1 KiB; `c` points at 32
                    // rows of 32 f32 with row stride `c_stride` bytes (inside `y` when `whole`).
                    unsafe { kernel(a, b, steps, c, c_stride, accumulate) };
                    if !whole {
                        for r in 0..block_rows {
                            y[(row + r) * n_out + col..][..block_cols]
                                .copy_from_slice(&edge[r * BLOCK..][..block_cols]);
                        }
                    }
                }
                if kc + steps == w.k_steps {
                    epilogue(&mut y[row * n_out..][..block_rows * n_out], cols.clone());
                }
            }
        }
    }
}

/// `C (+)= A·W` for one 32 × 32 block over `steps` k steps.
///
/// Per k step, 12 tile products from 8 tile loads: with A `hi` and W `lo` loaded, `hi·lo`;
/// W `hi` replaces W `lo` for `hi·hi`; A `lo` replaces A `hi` for `lo·hi`.
///
/// # Safety
/// The tiles must be configured ([`Tiles`]: 16 rows × 64 bytes each); `a` and `b` must point at `steps` × 4
/// tiles of 1 KiB, `c` at 32 rows of 32 f32 `c_stride` bytes apart.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn kernel(
    a: *const Line,
    b: *const Line,
    steps: usize,
    c: *mut f32,
    c_stride: usize,
    accumulate: bool,
) {
    // SAFETY: as the caller guarantees.
    unsafe {
        std::arch::asm!(
            "test {acc}, {acc}",
            "jz 3f",
            "tileloadd tmm0, [{c} + {cs}*1]",
            "tileloadd tmm1, [{c} + {cs}*1 + 64]",
            "tileloadd tmm2, [{c1} + {cs}*1]",
            "tileloadd tmm3, [{c1} + {cs}*1 + 64]",
            "jmp 2f",
            "3:",
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a} + {s}*1]",
            "tileloadd tmm6, [{b} + {s}*1 + 2048]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{a} + {s}*1 + 1024]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm7, [{b} + {s}*1 + 3072]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "tileloadd tmm6, [{b} + {s}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tileloadd tmm7, [{b} + {s}*1 + 1024]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "tileloadd tmm4, [{a} + {s}*1 + 2048]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a} + {s}*1 + 3072]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 4096",
            "add {b}, 4096",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c} + {cs}*1], tmm0",
            "tilestored [{c} + {cs}*1 + 64], tmm1",
            "tilestored [{c1} + {cs}*1], tmm2",
            "tilestored [{c1} + {cs}*1 + 64], tmm3",
            a = inout(reg) a => _,
            b = inout(reg) b => _,
            n = inout(reg) steps => _,
            acc = in(reg) usize::from(accumulate),
            s = in(reg) 64usize,
            c = in(reg) c,
            c1 = in(reg) c.byte_add(TILE_ROWS * c_stride),
            cs = in(reg) c_stride,
            options(nostack),
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn multiply_rows(
    _: &Bf16x3Weight,
    _: &[f32],
    _: &mut [f32],
    _: &impl Fn(&mut [f32], Range<usize>),
) {
    unreachable!("AMX is x86-64 only: `available` is false elsewhere")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_takes_magnitudes_up_to_the_bound_and_no_nan() {
        let max = Bf16x3Weight::MAX_ABS;
        let above = f32::from_bits(max.to_bits() + 1);
        assert!(Bf16x3Weight::fits(&[]));
        // Every position of a vector past a few 512-bit blocks, so the vector loop and its
        // tail are both checked.
        for len in [1, 15, 16, 17, 100] {
            for at in 0..len {
                let mut v: Vec<f32> = (0..len).map(|i| (i as f32 - 50.0) * 1e30).collect();
                v[at] = -max;
                assert!(Bf16x3Weight::fits(&v), "len {len}: -MAX_ABS at {at}");
                for bad in [above, -above, f32::INFINITY, f32::NAN, -f32::NAN] {
                    v[at] = bad;
                    assert!(!Bf16x3Weight::fits(&v), "len {len}: {bad} at {at}");
                }
            }
        }
    }

    #[test]
    fn split_keeps_sixteen_bits() {
        // 1 + 2⁻⁷ is a bf16 (7 fraction bits): hi = x, lo = 0.
        assert_eq!(split(1.0 + 2f32.powi(-7)), (0x3f81, 0));
        // 1 + 2⁻¹² needs 12 fraction bits: hi = 1.0 (0x3f80), lo = 2⁻¹² (exponent 127 − 12 =
        // 115 → bits 115 << 7 = 0x3980).
        assert_eq!(split(1.0 + 2f32.powi(-12)), (0x3f80, 0x3980));
        // Ties round to even: 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷ → 1, lo = 2⁻⁸.
        assert_eq!(split(1.0 + 2f32.powi(-8)).0, 0x3f80);
        // Any f32 is within 2⁻¹⁶ of hi + lo (relative).
        for i in 0..10_000 {
            let x = ((i as f32) * 0.618_034).sin() * 1e3 + 1e-3;
            let (h, l) = split(x);
            let back = f64::from(bf16_value(h)) + f64::from(bf16_value(l));
            assert!(
                ((back - f64::from(x)) / f64::from(x)).abs() < 2f64.powi(-16),
                "x = {x}: hi + lo = {back}"
            );
        }
    }

    #[test]
    fn packing_round_trips() {
        // Awkward sizes: k = 37 (one full step and a partial one), 21 outputs (a partial block).
        let (n_in, n_out) = (37, 21);
        let w = |k: usize, n: usize| (k * 31 + n * 7) as f32 / 13.0 - 40.0;
        let packed = Bf16x3Weight::pack(n_in, n_out, w);
        for k in 0..n_in {
            for n in 0..n_out {
                assert_eq!(packed.get(k, n), split(w(k, n)), "W[{k}, {n}]");
            }
        }
    }

    #[test]
    fn reference_is_close_to_f64() {
        // hi·hi + hi·lo + lo·hi misses ≈ 2⁻¹⁶ of each product at most.
        let (rows, n_in, n_out) = (3, 70, 5);
        let x: Vec<f32> = (0..rows * n_in).map(|i| (i as f32 * 0.37).sin()).collect();
        let w = |k: usize, n: usize| ((k * n_out + n) as f32 * 0.11).cos();
        let packed = Bf16x3Weight::pack(n_in, n_out, w);
        let mut y = vec![0.0; rows * n_out];
        packed.matmul_reference(&x, &mut y);
        for r in 0..rows {
            for n in 0..n_out {
                let (exact, scale) = (0..n_in).fold((0.0f64, 0.0f64), |(s, a), k| {
                    let p = f64::from(x[r * n_in + k]) * f64::from(w(k, n));
                    (s + p, a + p.abs())
                });
                let err = (f64::from(y[r * n_out + n]) - exact).abs();
                assert!(err <= scale * 2f64.powi(-15), "y[{r}, {n}]: off by {err}");
            }
        }
    }
}
