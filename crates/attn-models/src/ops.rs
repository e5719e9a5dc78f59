//! The dense pieces of a transformer layer besides attention: linear layers (faer GEMMs, or
//! [`attn_core::Bf16x3Weight`] AMX tiles on weights packed once), bias + activation in one pass,
//! residual + bias + LayerNorm in one pass, and the GELU variants with a vectorisable `erf`.

use std::sync::OnceLock;

use attn_core::{Bf16x3Weight, Isa};
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use crate::Activation;
use crate::checkpoint::WeightData;

/// Which multiply the linear layers run on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GemmKernel {
    /// [`GemmKernel::Bf16x3`] for products of at least [`AUTO_MIN_ROWS`] rows, where packing
    /// the weight once pays off; [`GemmKernel::F32`] for fewer.
    #[default]
    Auto,
    /// f32 GEMMs (faer) on the checkpoint's weights.
    F32,
    /// bf16x3 on AMX tiles whenever the CPU has them (about 2⁻¹⁶ relative per product, see
    /// [`attn_core::Bf16x3Weight`]); f32 on CPUs without AMX.
    Bf16x3,
}

/// The fewest rows for which [`GemmKernel::Auto`] packs a weight and uses AMX tiles: a short
/// text (the one-sentence views) stays on f32 GEMMs and never pays for packing.
pub const AUTO_MIN_ROWS: usize = 128;

impl GemmKernel {
    /// Whether a product of `rows` rows runs on AMX tiles.
    pub fn uses_tiles(self, rows: usize) -> bool {
        match self {
            GemmKernel::F32 => false,
            GemmKernel::Auto => rows >= AUTO_MIN_ROWS && Bf16x3Weight::available(),
            GemmKernel::Bf16x3 => Bf16x3Weight::available(),
        }
    }
}

/// How a linear layer multiplies: the kernel, and the threads it may use.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Threads the GEMM may use.
    pub par: Par,
    /// The kernel that multiplies.
    pub kernel: GemmKernel,
}

/// What a linear layer applies to its product before returning it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// `y = x·W` (the caller fuses the bias into its next pass).
    None,
    /// `y = x·W + b`
    Bias,
    /// `y = act(x·W + b)`
    BiasActivation(Activation),
}

impl Epilogue {
    /// Applies the epilogue to columns `cols` of rows of a product, on the calling thread: the
    /// AMX tiles call it from their own tasks, with the thread's tiles configured, where a
    /// nested parallel loop could run another product's task that releases them.
    ///
    /// # Shapes
    /// - `y`: `[rows, bias.len()]`
    pub(crate) fn apply(self, y: &mut [f32], bias: &[f32], cols: std::ops::Range<usize>) {
        let act = match self {
            Epilogue::None => return,
            Epilogue::Bias => None,
            Epilogue::BiasActivation(act) => Some(act),
        };
        bias_activation_rows(y, bias.len(), cols.start, &bias[cols], act);
    }
}

/// How a linear layer's weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[n_out, n_in]`: PyTorch `nn.Linear`.
    OutIn,
    /// `[n_in, n_out]`: GPT-2 `Conv1D`.
    InOut,
}

/// One weight matrix in the checkpoint's own layout and dtype, read in place from the map when
/// possible (the GEMM packs either layout as it goes, so nothing is copied or transposed at
/// load; 16-bit weights are widened a block at a time as they are multiplied).
#[derive(Debug, Clone)]
pub struct Weight {
    /// `[n_out, n_in]` or `[n_in, n_out]`, as `layout` says.
    pub data: WeightData,
    /// Which of the two layouts `data` is stored in.
    pub layout: WeightLayout,
    /// Output width of this block of columns.
    pub n_out: usize,
}

/// A linear layer `y = x·W + b`. `W` may be stored as several matrices side by side along the
/// output (BERT's separate query, key and value): each GEMM writes its own block of columns.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The matrices side by side, in output order.
    pub parts: Vec<Weight>,
    /// `[n_out]`
    pub bias: Vec<f32>,
    /// Input width.
    pub n_in: usize,
    /// Sum of the parts' `n_out`.
    pub n_out: usize,
    /// `W` packed for AMX tiles, made on the first product that runs on them; `None` when `W`
    /// holds values the tiles cannot take ([`Bf16x3Weight::fits`]). 16-bit weights are packed
    /// for each product instead: kept, the packing would take twice their memory.
    packed: OnceLock<Option<Bf16x3Weight>>,
    /// Whether every value of `W` fits the tiles, checked on first use.
    fits: OnceLock<bool>,
    /// `Wᵀ` packed for AMX tiles, for the backward pass's `dy · Wᵀ`; made on first use.
    packed_transpose: OnceLock<Option<Bf16x3Weight>>,
}

impl Linear {
    /// A layer with one weight matrix.
    ///
    /// # Shapes
    /// - `data`: `[n_out, n_in]` or `[n_in, n_out]` by `layout`; `bias`: `[n_out]`
    pub fn new(
        data: WeightData,
        layout: WeightLayout,
        bias: Vec<f32>,
        n_in: usize,
        n_out: usize,
    ) -> Linear {
        Linear::from_parts(
            vec![Weight {
                data,
                layout,
                n_out,
            }],
            bias,
            n_in,
        )
    }

    /// A layer whose weight is `parts` side by side along the output.
    ///
    /// # Shapes
    /// - `parts[i].data`: `[parts[i].n_out, n_in]` or `[n_in, parts[i].n_out]`;
    ///   `bias`: `[Σ parts[i].n_out]`
    pub fn from_parts(parts: Vec<Weight>, bias: Vec<f32>, n_in: usize) -> Linear {
        let n_out = parts.iter().map(|p| p.n_out).sum();
        Linear {
            parts,
            bias,
            n_in,
            n_out,
            packed: OnceLock::new(),
            fits: OnceLock::new(),
            packed_transpose: OnceLock::new(),
        }
    }

    /// Whether any part is stored in 16 bits.
    fn is_half(&self) -> bool {
        self.parts.iter().any(|p| p.data.f32().is_none())
    }

    /// Whether every value of `W` fits the tiles ([`Bf16x3Weight::fits`]).
    fn weight_fits(&self) -> bool {
        *self
            .fits
            .get_or_init(|| (self.parts.iter()).all(|p| Bf16x3Weight::fits(&p.data.to_f32())))
    }

    /// `y = epilogue(x·W)` on the kernel `gemm` picks for this many rows.
    ///
    /// # Shapes
    /// - `x`: `[rows, n_in]`, `y`: `[rows, n_out]`
    pub fn forward(&self, x: &[f32], y: &mut [f32], epilogue: Epilogue, gemm: Gemm) {
        let rows = x.len() / self.n_in;
        debug_assert_eq!(x.len(), rows * self.n_in);
        debug_assert_eq!(y.len(), rows * self.n_out);
        let parallel = !matches!(gemm.par, Par::Seq);
        let on_tiles = gemm.kernel.uses_tiles(rows) && Bf16x3Weight::fits(x);
        if on_tiles && self.is_half() && self.weight_fits() {
            self.pack_half().matmul(x, y, parallel, |rows, cols| {
                epilogue.apply(rows, &self.bias, cols)
            });
            return;
        }
        if on_tiles && let Some(packed) = self.packed() {
            packed.matmul(x, y, parallel, |rows, cols| {
                epilogue.apply(rows, &self.bias, cols)
            });
            return;
        }
        match epilogue {
            Epilogue::BiasActivation(act) => self.matmul_f32(x, y, Some(act), gemm.par),
            _ => {
                self.matmul_f32(x, y, None, gemm.par);
                if epilogue == Epilogue::Bias {
                    bias_activation_block(y, self.n_out, 0, &self.bias, None);
                }
            }
        }
    }

    /// Packs the weight for AMX tiles now, if it will be used there and is not packed yet.
    pub fn prepare_tiles(&self) {
        self.packed();
    }

    /// The weight packed for AMX tiles (packed on first use), unless the tiles cannot take it.
    ///
    /// The packing is rayon work, so it runs outside the `OnceLock`'s initialisation: a thread
    /// waiting for its share of the packing may steal another text's task, which needs this
    /// weight too, and would then wait for the initialisation it is itself running (a
    /// deadlock, seen in `embed_path`'s batches). Several threads may pack the weight at the
    /// same time (one per thread, in a batch's first layer): the first to finish keeps it, the
    /// others' work is lost.
    fn packed(&self) -> Option<&Bf16x3Weight> {
        if self.is_half() {
            return None;
        }
        self.packed_once(&self.packed, || self.pack())
    }

    /// `cell`'s packing of this weight, made by `pack` on first use, unless the tiles cannot
    /// take the weight's values ([`Linear::packed`] says why this is not `get_or_init`).
    fn packed_once<'a>(
        &'a self,
        cell: &'a OnceLock<Option<Bf16x3Weight>>,
        pack: impl FnOnce() -> Bf16x3Weight,
    ) -> Option<&'a Bf16x3Weight> {
        if let Some(packed) = cell.get() {
            return packed.as_ref();
        }
        // Refused (and dropped) when another thread set it first.
        let _ = cell.set(self.weight_fits().then(pack));
        cell.get().and_then(Option::as_ref)
    }

    /// `W` split and laid out in tiles; its parts must be f32.
    fn pack(&self) -> Bf16x3Weight {
        let data: Vec<&[f32]> = (self.parts.iter())
            .map(|p| p.data.f32().unwrap_or_default())
            .collect();
        self.pack_from(&data)
    }

    /// `W` of 16-bit parts split and laid out in tiles, each `[n_out, n_in]` part's rows
    /// widened as they are packed (the other layout is widened whole first).
    fn pack_half(&self) -> Bf16x3Weight {
        if self.parts.iter().any(|p| p.layout == WeightLayout::InOut) {
            let data: Vec<_> = self.parts.iter().map(|p| p.data.to_f32()).collect();
            return self.pack_from(&data.iter().map(|d| &d[..]).collect::<Vec<_>>());
        }
        self.pack_rows(|part, start, column| part.data.widen(start, column))
    }

    /// `W` of `[n_out, n_in]` parts laid out in tiles, `read(part, start, out)` writing the
    /// part's values `start..start + n_in` (one output column) into `out`.
    fn pack_rows(&self, read: impl Fn(&Weight, usize, &mut [f32]) + Sync) -> Bf16x3Weight {
        let mut start = 0;
        let parts: Vec<(usize, &Weight)> = (self.parts.iter())
            .map(|p| {
                start += p.n_out;
                (start - p.n_out, p)
            })
            .collect();
        let n_in = self.n_in;
        Bf16x3Weight::pack_columns(n_in, self.n_out, |n, column| {
            let (col, part) = (parts.iter().rev())
                .find(|(col, _)| *col <= n)
                .copied()
                .unwrap_or(parts[0]);
            read(part, (n - col) * n_in, column);
        })
    }

    /// `W` split and laid out in tiles, its parts' values `data` (f32, in their layouts).
    fn pack_from(&self, data: &[&[f32]]) -> Bf16x3Weight {
        if self.parts.iter().all(|p| p.layout == WeightLayout::OutIn) {
            let index = |part: &Weight| (self.parts.iter()).position(|p| std::ptr::eq(p, part));
            return self.pack_rows(|part, start, column| {
                let data = data[index(part).unwrap_or_default()];
                column.copy_from_slice(&data[start..start + column.len()]);
            });
        }
        let mut start = 0;
        let parts: Vec<(usize, &Weight, &[f32])> = (self.parts.iter().zip(data))
            .map(|(p, &data)| {
                start += p.n_out;
                (start - p.n_out, p, data)
            })
            .collect();
        let n_in = self.n_in;
        Bf16x3Weight::pack(n_in, self.n_out, |k, n| {
            let (col, part, data) = (parts.iter().rev())
                .find(|(col, _, _)| *col <= n)
                .copied()
                .unwrap_or(parts[0]);
            match part.layout {
                WeightLayout::OutIn => data[(n - col) * n_in + k],
                WeightLayout::InOut => data[k * part.n_out + n - col],
            }
        })
    }

    /// `y = x·W`, or with `act` `y = act(x·W + b)`, with faer. An f32 part without `act` is
    /// one GEMM; otherwise the part is multiplied in blocks of [`ACTIVATION_BLOCK_COLS`]
    /// output columns, each block getting its bias and activation while it is still in cache,
    /// and a 16-bit part widened one block at a time.
    fn matmul_f32(&self, x: &[f32], y: &mut [f32], act: Option<Activation>, par: Par) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        let rows = x.len() / n_in;
        let x = MatRef::from_row_major_slice(x, rows, n_in);
        let mut scratch = Vec::new();
        let mut start = 0;
        for part in &self.parts {
            // At least 1: a part may have no columns (a layer split unevenly).
            let block = match (part.data.f32(), act) {
                (Some(_), None) => part.n_out.max(1),
                _ => ACTIVATION_BLOCK_COLS,
            };
            for col in (0..part.n_out).step_by(block) {
                let cols = block.min(part.n_out - col);
                let w = part.columns(col, cols, n_in, &mut scratch);
                // Row-major [rows, cols] with row stride n_out, built as the transpose of a
                // column-major view: faer 0.24's `from_row_major_slice_with_stride_mut` swaps
                // the strides.
                let dst = MatMut::from_column_major_slice_with_stride_mut(
                    &mut y[start + col..],
                    cols,
                    rows,
                    n_out,
                )
                .transpose_mut();
                matmul(dst, Accum::Replace, x, w, 1.0f32, par);
                if let Some(act) = act {
                    let at = start + col;
                    bias_activation_block(y, n_out, at, &self.bias[at..at + cols], Some(act));
                }
            }
            start += part.n_out;
        }
    }
}

impl Weight {
    /// Output columns `col..col + cols` of the weight as an `[n_in, cols]` view: of the f32
    /// values in place, or of 16-bit values widened into `scratch`.
    fn columns<'a>(
        &'a self,
        col: usize,
        cols: usize,
        n_in: usize,
        scratch: &'a mut Vec<f32>,
    ) -> MatRef<'a, f32> {
        let n_out = self.n_out;
        match (self.data.f32(), self.layout) {
            (Some(data), WeightLayout::OutIn) => {
                MatRef::from_row_major_slice(&data[col * n_in..][..cols * n_in], cols, n_in)
                    .transpose()
            }
            (Some(data), WeightLayout::InOut) => {
                MatRef::from_column_major_slice_with_stride(&data[col..], cols, n_in, n_out)
                    .transpose()
            }
            (None, layout) => {
                scratch.resize(cols * n_in, 0.0);
                match layout {
                    WeightLayout::OutIn => {
                        self.data.widen(col * n_in, scratch);
                        MatRef::from_row_major_slice(scratch, cols, n_in).transpose()
                    }
                    WeightLayout::InOut => {
                        for (k, row) in scratch.chunks_exact_mut(cols).enumerate() {
                            self.data.widen(k * n_out + col, row);
                        }
                        MatRef::from_row_major_slice(scratch, n_in, cols)
                    }
                }
            }
        }
    }
}

impl Linear {
    /// `Wᵀ` packed for AMX tiles (on first use), unless the tiles cannot take it.
    fn packed_transpose(&self) -> Option<&Bf16x3Weight> {
        self.packed_once(&self.packed_transpose, || {
            let data: Vec<_> = self.parts.iter().map(|p| p.data.to_f32()).collect();
            // Each output column's values and their stride along the input.
            let columns: Vec<(&[f32], usize)> = (self.parts.iter().zip(&data))
                .flat_map(|(p, data)| {
                    (0..p.n_out).map(move |c| match p.layout {
                        WeightLayout::OutIn => (&data[c * self.n_in..], 1),
                        WeightLayout::InOut => (&data[c..], p.n_out),
                    })
                })
                .collect();
            Bf16x3Weight::pack(self.n_out, self.n_in, |k, n| {
                let (data, stride) = columns[k];
                data[n * stride]
            })
        })
    }

    /// `dx = dy · Wᵀ`: the gradient of the layer's input from its output's (no bias, no
    /// weight gradient), on the kernel `gemm` picks for this many rows.
    ///
    /// # Shapes
    /// - `dy`: `[rows, n_out]`, `dx`: `[rows, n_in]`
    pub(crate) fn backward_input(&self, dy: &[f32], dx: &mut [f32], gemm: Gemm) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        let rows = dy.len() / n_out;
        if gemm.kernel.uses_tiles(rows)
            && let Some(packed) = self.packed_transpose()
            && Bf16x3Weight::fits(dy)
        {
            let parallel = !matches!(gemm.par, Par::Seq);
            packed.matmul(dy, &mut dx[..rows * n_in], parallel, |_, _| {});
            return;
        }
        let mut dst = MatMut::from_row_major_slice_mut(&mut dx[..rows * n_in], rows, n_in);
        let mut col = 0;
        for (p, part) in self.parts.iter().enumerate() {
            // This part's columns of dy, [rows, part.n_out] with row stride n_out.
            let g =
                MatRef::from_column_major_slice_with_stride(&dy[col..], part.n_out, rows, n_out)
                    .transpose();
            // Wᵀ of the part: [part.n_out, n_in].
            let data = part.data.to_f32();
            let wt = match part.layout {
                WeightLayout::OutIn => MatRef::from_row_major_slice(&data, part.n_out, n_in),
                WeightLayout::InOut => {
                    MatRef::from_row_major_slice(&data, n_in, part.n_out).transpose()
                }
            };
            let accum = if p == 0 { Accum::Replace } else { Accum::Add };
            matmul(
                dst.as_mut(),
                accum,
                g,
                wt,
                1.0f32,
                crate::model::parallelism(),
            );
            col += part.n_out;
        }
    }

    /// `y = x · W[inputs, :]`, no bias: the product of `x` (`[rows, inputs.len()]`, row stride
    /// `ld`) with the weight's rows `inputs` (one head's rows of an attention output
    /// projection), in f32. The weight must be one part.
    ///
    /// # Shapes
    /// - `x`: `[rows, ld]`, its first `inputs.len()` columns read; `y`: `[rows, n_out]`
    pub(crate) fn multiply_input_rows(
        &self,
        x: &[f32],
        (rows, ld): (usize, usize),
        inputs: std::ops::Range<usize>,
        y: &mut [f32],
    ) {
        let part = &self.parts[0];
        debug_assert_eq!(self.parts.len(), 1);
        let (n_in, n_out, k) = (self.n_in, self.n_out, inputs.len());
        let data = part.data.to_f32();
        let w = match part.layout {
            WeightLayout::InOut => {
                MatRef::from_row_major_slice(&data[inputs.start * n_out..][..k * n_out], k, n_out)
            }
            WeightLayout::OutIn => MatRef::from_row_major_slice(&data, n_out, n_in)
                .transpose()
                .subrows(inputs.start, k),
        };
        let x = MatRef::from_column_major_slice_with_stride(x, k, rows, ld).transpose();
        let dst = MatMut::from_row_major_slice_mut(&mut y[..rows * n_out], rows, n_out);
        matmul(dst, Accum::Replace, x, w, 1.0f32, Par::Seq);
    }
}

/// Output columns per GEMM in [`Linear::matmul_f32`]'s blocks: a `[rows, 384]` block of the
/// output (1.2 MiB for 800 rows) is still in L2 when its bias and activation are applied.
const ACTIVATION_BLOCK_COLS: usize = 384;

/// `y = a·bᵀ` for row-major `a` `[m, k]` and `b` `[n, k]` (a tied output embedding).
///
/// # Shapes
/// - `a`: `[m, k]`, `b`: `[n, k]`, `y`: `[m, n]`
pub fn gemm_bt(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, y: &mut [f32], par: Par) {
    let a = MatRef::from_row_major_slice(a, m, k);
    let b = MatRef::from_row_major_slice(b, n, k).transpose();
    let y = MatMut::from_row_major_slice_mut(y, m, n);
    matmul(y, Accum::Replace, a, b, 1.0f32, par);
}

/// Rows of a 16-bit `b` widened per GEMM in [`gemm_bt_weight`] (3.5 MiB of f32 at k = 896).
const WIDEN_BLOCK_ROWS: usize = 1024;

/// [`gemm_bt`] for `b` in its stored dtype: 16-bit rows are widened a block at a time.
///
/// # Shapes
/// - `a`: `[m, k]`, `b`: `[n, k]`, `y`: `[m, n]`
pub fn gemm_bt_weight(
    a: &[f32],
    m: usize,
    k: usize,
    b: &WeightData,
    n: usize,
    y: &mut [f32],
    par: Par,
) {
    if let Some(b) = b.f32() {
        return gemm_bt(a, m, k, b, n, y, par);
    }
    let a = MatRef::from_row_major_slice(a, m, k);
    let mut scratch = vec![0.0f32; WIDEN_BLOCK_ROWS.min(n) * k];
    for row in (0..n).step_by(WIDEN_BLOCK_ROWS) {
        let rows = WIDEN_BLOCK_ROWS.min(n - row);
        let block = &mut scratch[..rows * k];
        b.widen(row * k, block);
        let bt = MatRef::from_row_major_slice(block, rows, k).transpose();
        let dst = MatMut::from_column_major_slice_with_stride_mut(&mut y[row..], rows, m, n)
            .transpose_mut();
        matmul(dst, Accum::Replace, a, bt, 1.0f32, par);
    }
}

/// `$name(args)`: `$body(args)` compiled for AVX-512F, for AVX2 + FMA and for the base target,
/// run in the one [`Isa::best`] picks, so that each gets its own vector width (`$body` is
/// `#[inline(always)]`).
macro_rules! per_isa {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $body:ident
    ) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) {
            /// # Safety
            /// The CPU must support AVX-512F (which brings FMA).
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,fma")]
            unsafe fn avx512($($arg: $ty),*) {
                $body($($arg),*)
            }
            /// # Safety
            /// The CPU must support AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) {
                $body($($arg),*)
            }
            match Isa::best() {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::best` is an ISA this CPU runs, and it runs AVX-512F.
                isa if isa.avx512() => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: `Isa::best` is an ISA this CPU runs: AVX2 and FMA.
                Isa::Avx2 => unsafe { avx2($($arg),*) },
                _ => $body($($arg),*),
            }
        }
    };
}

/// Rows a task takes in the passes that go row by row (norms, bias and activation, residuals,
/// the gated feed-forward, heads split, turned and merged). They run in parallel, so that on a
/// long prompt the other threads do not wait for them; a pass over fewer rows stays on the
/// calling thread.
const ROWS_PER_TASK: usize = 32;

/// `f(first, rows)` on the rows of `x` (`width` values each), [`ROWS_PER_TASK`] at a time in
/// parallel, `first` the index of the chunk's first row.
pub(crate) fn for_row_chunks(x: &mut [f32], width: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let chunk = ROWS_PER_TASK * width.max(1);
    if x.len() <= chunk {
        return f(0, x);
    }
    (x.par_chunks_mut(chunk).enumerate()).for_each(|(t, rows)| f(t * ROWS_PER_TASK, rows));
}

/// `y[:, col..col + bias.len()] = act(… + bias)` on a block of columns of a row-major matrix.
///
/// # Shapes
/// - `y`: `[rows, row_stride]`, `bias`: `[n]` with `col + n ≤ row_stride`
pub fn bias_activation_block(
    y: &mut [f32],
    row_stride: usize,
    col: usize,
    bias: &[f32],
    act: Option<Activation>,
) {
    for_row_chunks(y, row_stride, |_, rows| {
        bias_activation_rows(rows, row_stride, col, bias, act)
    });
}

per_isa! {
    /// [`bias_activation_block`] on one thread.
    fn bias_activation_rows(
        y: &mut [f32],
        row_stride: usize,
        col: usize,
        bias: &[f32],
        act: Option<Activation>,
    ) => bias_activation_body
}

/// The loop every ISA path compiles (inlined so each gets its own vector width).
#[inline(always)]
fn bias_activation_body(
    y: &mut [f32],
    row_stride: usize,
    col: usize,
    bias: &[f32],
    act: Option<Activation>,
) {
    for row in y.chunks_exact_mut(row_stride) {
        let row = &mut row[col..col + bias.len()];
        match act {
            None => row.iter_mut().zip(bias).for_each(|(v, b)| *v += b),
            Some(Activation::GeluErf) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = gelu_erf(*v + b)),
            Some(Activation::GeluTanh) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = gelu_tanh(*v + b)),
            Some(Activation::Relu) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = relu(*v + b)),
            Some(Activation::Silu) => row
                .iter_mut()
                .zip(bias)
                .for_each(|(v, b)| *v = silu(*v + b)),
        }
    }
}

/// LayerNorm parameters: `γ ⊙ (x − mean) / √(var + eps) + β` over the last dimension, or
/// with `rms` Llama's RMSNorm, `γ ⊙ x / √(mean(x²) + eps)`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// `γ`, `[hidden]`.
    pub gamma: Vec<f32>,
    /// `β`, `[hidden]`; empty for an RMSNorm.
    pub beta: Vec<f32>,
    /// Added to the variance.
    pub eps: f32,
    /// An RMSNorm: no mean taken away, no `β`.
    pub rms: bool,
}

impl LayerNorm {
    /// Normalises `x` in place, row by row.
    ///
    /// # Shapes
    /// - `x`: `[rows, n]` with `n = gamma.len()`
    pub fn apply(&self, x: &mut [f32]) {
        let n = self.gamma.len();
        for_row_chunks(x, n, |_, rows| layer_norm(self, rows, None));
    }

    /// `out = LayerNorm(x)`, row by row.
    ///
    /// # Shapes
    /// - `x`, `out`: `[rows, n]` with `n = gamma.len()`
    pub fn apply_into(&self, x: &[f32], out: &mut [f32]) {
        out.copy_from_slice(x);
        self.apply(out);
    }

    /// `residual = LayerNorm(residual + y + bias)`: BERT's post-norm sublayer end, in one pass
    /// per row.
    ///
    /// # Shapes
    /// - `residual`, `y`: `[rows, n]`, `bias`: `[n]`
    pub fn residual_bias_apply(&self, residual: &mut [f32], y: &[f32], bias: &[f32]) {
        let n = self.gamma.len();
        for_row_chunks(residual, n, |first, rows| {
            layer_norm(self, rows, Some((&y[first * n..][..rows.len()], bias)))
        });
    }
}

per_isa! {
    /// `ln` applied to each row of `x`, after adding `y + bias` to it where `add` is given, on
    /// one thread.
    fn layer_norm(
        ln: &LayerNorm,
        x: &mut [f32],
        add: Option<(&[f32], &[f32])>,
    ) => layer_norm_body
}

/// Per row: optionally `x += y + bias`, then the LayerNorm, in one visit of the row.
#[inline(always)]
fn layer_norm_body(ln: &LayerNorm, x: &mut [f32], add: Option<(&[f32], &[f32])>) {
    let n = ln.gamma.len();
    for (i, row) in x.chunks_exact_mut(n).enumerate() {
        if let Some((y, bias)) = add {
            row.iter_mut()
                .zip(&y[i * n..][..n])
                .zip(bias)
                .for_each(|((r, y), b)| *r += y + b);
        }
        let inv_n = 1.0 / n as f32;
        if ln.rms {
            // transformers' LlamaRMSNorm: x · rsqrt(mean(x²) + eps) in f32, then γ.
            let inv = 1.0 / (lane_sum(row, |v| v * v) * inv_n + ln.eps).sqrt();
            row.iter_mut()
                .zip(&ln.gamma)
                .for_each(|(v, g)| *v = *v * inv * g);
            continue;
        }
        // Two-pass mean and variance in f32, like PyTorch; summed in 16 lanes so it vectorises.
        let mean = lane_sum(row, |v| v) * inv_n;
        let var = lane_sum(row, |v| (v - mean) * (v - mean)) * inv_n;
        // A variance past f32's range would scale the row by 0, to β, a made-up finite row
        // (PyTorch's two-pass variance gives NaN for the checkpoints that reach it, word
        // embeddings of 1e30, not for every row): NaN instead, which the forward pass reports.
        let inv = match var.is_finite() {
            true => 1.0 / (var + ln.eps).sqrt(),
            false => f32::NAN,
        };
        row.iter_mut()
            .zip(&ln.gamma)
            .zip(&ln.beta)
            .for_each(|((v, g), b)| *v = (*v - mean) * inv * g + b);
    }
}

/// `Σ f(v)` accumulated in 16 independent lanes (a SIMD-friendly summation order).
#[inline(always)]
fn lane_sum(row: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = row.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for chunk in chunks {
        lanes.iter_mut().zip(chunk).for_each(|(l, &v)| *l += f(v));
    }
    lanes.iter().sum::<f32>() + tail
}

/// `residual += y + bias`: GPT-2's pre-norm sublayer end.
///
/// # Shapes
/// - `residual`, `y`: `[rows, n]`, `bias`: `[n]`
pub fn residual_bias_add(residual: &mut [f32], y: &[f32], bias: &[f32]) {
    let n = bias.len();
    for_row_chunks(residual, n, |first, rows| {
        let y = &y[first * n..][..rows.len()];
        for (r, yr) in rows.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
            r.iter_mut()
                .zip(yr)
                .zip(bias)
                .for_each(|((r, y), b)| *r += y + b);
        }
    });
}

/// `x · Φ(x) = 0.5·x·(1 + erf(x/√2))`, PyTorch's exact `gelu`.
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `x · sigmoid(x)`, `torch.nn.functional.silu`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `e^x` for f32 as branch-free arithmetic, so loops over it vectorise (libm's `expf` is a
/// call per element): Cephes' `expf`, `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2` (`ln 2` in two
/// pieces, Cody and Waite), `e^r ≈ 1 + r + r²·P(r)` with P of degree 5, `2^n` built in the
/// exponent bits.
/// Within 2 ulp of `expf` where the result is normal; 0 below `ln` of the least normal f32 and
/// +∞ above `ln f32::MAX`; NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const P: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    // NaN stays NaN through the steps below; the last line returns it.
    let clamped = x.clamp(-87.336_55, 88.722_84);
    // Rounded to the nearest integer by adding and taking away 1.5·2²³, which vectorises
    // where `round_ties_even` without SSE4.1 is a call to `rintf`; the sum's low mantissa
    // bits hold that integer, read without a float-to-int conversion (whose saturation
    // does not vectorise).
    const ROUND: f32 = 12_582_912.0;
    let big = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = big - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let p = P[1..].iter().fold(P[0], |acc, &c| acc * r + c);
    let e_r = p * r * r + r + 1.0;
    // n ∈ [−126, 128] after the clamp: 2^n as a normal 2^min(n, 127), doubled when n = 128.
    let n_int = (big.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let two_m = f32::from_bits(((n_int.min(127) + 127) as u32) << 23);
    let y = e_r * two_m * (n - n.min(127.0) + 1.0);
    let y = if x < -87.336_55 { 0.0 } else { y };
    let y = if x > 88.722_84 { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

/// A decoder's gated feed-forward in place: each row of `gate_up` (`[rows, 2·n]`, gate | up)
/// becomes `act(gate) ⊙ up` (SiLU for Llama, tanh GELU for Gemma 2), packed into the first
/// `rows · n` values. Rows `k..2k` are written where rows `k/2..k` were read, and read from
/// past where any of them is written: once the rows below `k` are done they run in parallel,
/// so row 0 goes first, then row 1, rows 2–3, 4–7, and so on.
pub(crate) fn gated_in_place(gate_up: &mut [f32], n: usize, act: Activation) {
    let rows = gate_up.len() / (2 * n).max(1);
    if rows == 0 {
        return;
    }
    let first = gate_up[..2 * n].to_vec();
    gated_rows(&mut gate_up[..n], &first, n, act);
    let mut k = 1;
    while k < rows {
        let end = (2 * k).min(rows);
        let (done, rest) = gate_up.split_at_mut(2 * k * n);
        let (out, src) = (&mut done[k * n..end * n], &rest[..2 * (end - k) * n]);
        match end - k <= ROWS_PER_TASK {
            true => gated_rows(out, src, n, act),
            false => (out.par_chunks_mut(ROWS_PER_TASK * n))
                .zip(src.par_chunks(2 * ROWS_PER_TASK * n))
                .for_each(|(out, src)| gated_rows(out, src, n, act)),
        }
        k = end;
    }
}

per_isa! {
    /// `out`'s row r = `act(gate) ⊙ up` of row r of `gate_up` (`[rows, 2·n]`, gate | up).
    fn gated_rows(out: &mut [f32], gate_up: &[f32], n: usize, act: Activation) => gated_body
}

/// The loop every ISA path compiles, one per activation so each vectorises.
#[inline(always)]
fn gated_body(out: &mut [f32], gate_up: &[f32], n: usize, act: Activation) {
    match act {
        Activation::GeluTanh => gated_loop(out, gate_up, n, gelu_tanh),
        Activation::GeluErf => gated_loop(out, gate_up, n, gelu_erf),
        Activation::Relu => gated_loop(out, gate_up, n, relu),
        Activation::Silu => gated_loop(out, gate_up, n, silu),
    }
}

#[inline(always)]
fn gated_loop(out: &mut [f32], gate_up: &[f32], n: usize, f: impl Fn(f32) -> f32) {
    for (out, row) in out.chunks_exact_mut(n).zip(gate_up.chunks_exact(2 * n)) {
        let (gate, up) = row.split_at(n);
        (out.iter_mut().zip(gate).zip(up)).for_each(|((o, &g), &u)| *o = f(g) * u);
    }
}

per_isa! {
    /// `g ⊙= act′(z)`: the gradient of an activation's input from its output's, element by
    /// element.
    ///
    /// # Shapes
    /// - `g`, `z`: the same length
    pub(crate) fn activation_backward(
        act: Activation,
        g: &mut [f32],
        z: &[f32],
    ) => activation_backward_body
}

/// The loop every ISA path compiles, one per activation so each vectorises.
#[inline(always)]
fn activation_backward_body(act: Activation, g: &mut [f32], z: &[f32]) {
    match act {
        Activation::Relu => scale_by(g, z, relu_grad),
        Activation::Silu => scale_by(g, z, silu_grad),
        Activation::GeluErf => scale_by(g, z, gelu_erf_grad),
        Activation::GeluTanh => scale_by(g, z, gelu_tanh_grad),
    }
}

/// `g[i] *= derivative(z[i])`; `derivative` an `#[inline(always)]` function, so that it is
/// compiled for the caller's ISA (a closure would not be).
#[inline(always)]
fn scale_by(g: &mut [f32], z: &[f32], derivative: fn(f32) -> f32) {
    let z = &z[..g.len()];
    for i in 0..g.len() {
        g[i] *= derivative(z[i]);
    }
}

#[inline(always)]
fn relu_grad(z: f32) -> f32 {
    f32::from(u8::from(z > 0.0))
}

#[inline(always)]
fn silu_grad(z: f32) -> f32 {
    let s = 1.0 / (1.0 + exp(-z));
    s * (1.0 + z * (1.0 - s))
}

#[inline(always)]
fn gelu_erf_grad(z: f32) -> f32 {
    let cdf = 0.5 * (1.0 + erf(z * std::f32::consts::FRAC_1_SQRT_2));
    let pdf = exp(-0.5 * z * z) * 0.398_942_3;
    cdf + z * pdf
}

#[inline(always)]
fn gelu_tanh_grad(z: f32) -> f32 {
    let c = 0.797_884_6f32;
    let t = tanh(c * (z + 0.044715 * z * z * z));
    0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z)
}

/// `max(x, 0)` keeping NaN, as `torch.relu` does (`f32::max` would turn NaN into 0).
fn relu(x: f32) -> f32 {
    if x < 0.0 { 0.0 } else { x }
}

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, GPT-2's `gelu_new`.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
}

/// `tanh(x)` for f32 as a branch-free rational function, so loops over it vectorise (libm's
/// `tanhf` is a call per element).
///
/// The odd numerator / even denominator fit of Eigen's `ptanh_float`, on `[-c, c]` with
/// c ≈ 7.9053 (beyond it `tanh` is ±1 in f32); within 3.3e-7 of `tanh` everywhere.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    const A: [f32; 7] = [
        -2.760_768_5e-16,
        2.000_188e-13,
        -8.604_672e-11,
        5.122_297e-8,
        1.485_722_4e-5,
        6.372_619_3e-4,
        4.893_524_6e-3,
    ];
    const B: [f32; 4] = [1.198_258_4e-6, 1.185_347e-4, 2.268_434_6e-3, 4.893_525e-3];
    let x = x.clamp(-7.905_311, 7.905_311);
    let x2 = x * x;
    let p = A.iter().fold(0.0f32, |acc, &a| acc * x2 + a) * x;
    let q = B.iter().fold(0.0f32, |acc, &b| acc * x2 + b);
    p / q
}

/// `erf(x)` for f32 as a branch-free rational function, so loops over it vectorise.
///
/// The odd numerator / even denominator minimax fit of Eigen's `generic_fast_erf_float`
/// (and XLA's `ErfImpl32`), accurate to a few ulp on `[-4, 4]`; outside, `erf` is ±1 in f32.
/// Plain multiply-adds rather than `mul_add`: without FMA in the target, `mul_add` is a libm
/// call that blocks vectorisation.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    const A: [f32; 7] = [
        -2.726_142_3e-10,
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_600_5e-3,
        -1.609_603_3e-2,
    ];
    const B: [f32; 5] = [
        -1.456_607_2e-5,
        -2.133_740_6e-4,
        -1.682_827e-3,
        -7.373_329_2e-3,
        -1.426_474e-2,
    ];
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = A.iter().fold(0.0f32, |acc, &a| acc * x2 + a) * x;
    let q = B.iter().fold(0.0f32, |acc, &b| acc * x2 + b);
    p / q
}

/// `Σ_k f(a[k])` in 16 interleaved sums, which the compiler turns into vector adds: a plain
/// `f32` sum is one chain of dependent additions, and was most of ALTI's time at 100 tokens.
pub(crate) fn lanes(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut blocks = a.chunks_exact(16);
    for block in &mut blocks {
        for (s, &v) in acc.iter_mut().zip(block) {
            *s += f(v);
        }
    }
    acc.iter().sum::<f32>() + blocks.remainder().iter().map(|&v| f(v)).sum::<f32>()
}

/// `Σ_k f(a[k], b[k])`, in lanes.
pub(crate) fn lanes2(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let (mut xa, mut xb) = (a.chunks_exact(16), b.chunks_exact(16));
    for (ba, bb) in (&mut xa).zip(&mut xb) {
        for ((s, &u), &v) in acc.iter_mut().zip(ba).zip(bb) {
            *s += f(u, v);
        }
    }
    let rest: f32 = xa
        .remainder()
        .iter()
        .zip(xb.remainder())
        .map(|(&u, &v)| f(u, v))
        .sum();
    acc.iter().sum::<f32>() + rest
}

/// `Σ_k f(a[k], b[k], c[k])`, in lanes.
pub(crate) fn lanes3(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let (mut xa, mut xb, mut xc) = (a.chunks_exact(16), b.chunks_exact(16), c.chunks_exact(16));
    for ((ba, bb), bc) in (&mut xa).zip(&mut xb).zip(&mut xc) {
        for (((s, &u), &v), &w) in acc.iter_mut().zip(ba).zip(bb).zip(bc) {
            *s += f(u, v, w);
        }
    }
    let rest = (xa
        .remainder()
        .iter()
        .zip(xb.remainder())
        .zip(xc.remainder()))
    .map(|((&u, &v), &w)| f(u, v, w))
    .sum::<f32>();
    acc.iter().sum::<f32>() + rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::F32Data;

    /// One thread, f32 GEMMs.
    const SEQ_F32: Gemm = Gemm {
        par: Par::Seq,
        kernel: GemmKernel::F32,
    };

    /// The largest |f(x) − reference(x)| over `xs`, and the x where it occurs.
    fn worst_error(
        f: impl Fn(f32) -> f32,
        reference: impl Fn(f64) -> f64,
        xs: impl Iterator<Item = f32>,
    ) -> (f64, f32) {
        xs.map(|x| ((f(x) as f64 - reference(x as f64)).abs(), x))
            .fold((0.0, 0.0), |worst, e| if e.0 > worst.0 { e } else { worst })
    }

    #[test]
    fn tanh_matches_libm_everywhere() {
        let worst = worst_error(
            tanh,
            libm::tanh,
            (-120_000..=120_000).map(|i| i as f32 * 1e-4),
        );
        assert!(
            worst.0 < 5e-7,
            "max |tanh − libm::tanh| = {} at x = {}",
            worst.0,
            worst.1
        );
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(1e30), 1.0);
        assert_eq!(tanh(-1e30), -1.0);
    }

    #[test]
    fn erf_matches_libm_everywhere() {
        let worst = worst_error(
            erf,
            libm::erf,
            (-100_000..=100_000).map(|i| i as f32 * 1e-4 * 6.0),
        );
        assert!(
            worst.0 < 1e-6,
            "max |erf − libm::erf| = {} at x = {}",
            worst.0,
            worst.1
        );
    }

    #[test]
    fn exp_matches_libm_everywhere() {
        // Relative error where e^x is a normal f32 (2 ulp is 2.4e-7).
        let worst = (-873_365..=887_228)
            .map(|i| i as f32 * 1e-4)
            .map(|x| ((exp(x) as f64 / libm::exp(x as f64) - 1.0).abs(), x))
            .fold((0.0, 0.0), |w, e| if e.0 > w.0 { e } else { w });
        assert!(
            worst.0 < 2.4e-7,
            "max relative error {} at x = {}",
            worst.0,
            worst.1
        );
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(88.72).is_finite());
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn gated_rows_are_act_of_gate_times_up() {
        // 200 rows of gate | up (rows 1, 2–3, …, 128–199 each a step, the last ones in
        // parallel), n = 5 (not a whole vector), packed into the first 1,000 values; the vector
        // loops give the scalar functions' values bit for bit.
        let (rows, n) = (200, 5);
        let gate_up: Vec<f32> = (0..rows * 2 * n)
            .map(|i| ((i % 29) as f32 - 13.0) * 0.37)
            .collect();
        let acts = [
            (Activation::Silu, silu as fn(f32) -> f32),
            (Activation::GeluTanh, gelu_tanh),
            (Activation::GeluErf, gelu_erf),
            (Activation::Relu, relu),
        ];
        for (act, f) in acts {
            let mut got = gate_up.clone();
            gated_in_place(&mut got, n, act);
            for r in 0..rows {
                for j in 0..n {
                    let (g, u) = (gate_up[r * 2 * n + j], gate_up[r * 2 * n + n + j]);
                    assert_eq!(got[r * n + j], f(g) * u, "{act:?} row {r} col {j}");
                }
            }
        }
        let silu_of_one = 1.0 / (1.0 + (-1.0f64).exp());
        assert!((silu(1.0) as f64 - silu_of_one).abs() < 1e-7);
    }

    #[test]
    fn activation_backward_is_the_derivative() {
        // Against central differences of the f64 functions, on a grid over [-9, 9] (not a
        // whole number of vectors) with g = 1; within 5e-6, as f32's tanh GELU is flat to 0
        // past about −4.9 where the true slope is −2e-6.
        let z: Vec<f32> = (-900..=900).map(|i| i as f32 * 0.01 + 0.003).collect();
        let erf64 = |x: f64| libm::erf(x);
        let gelu = move |x: f64| 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
        let gelu_t = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        let acts: [(Activation, &dyn Fn(f64) -> f64); 4] = [
            (Activation::Silu, &|x| x / (1.0 + (-x).exp())),
            (Activation::GeluErf, &gelu),
            (Activation::GeluTanh, &gelu_t),
            (Activation::Relu, &|x: f64| x.max(0.0)),
        ];
        for (act, f) in acts {
            let mut g = vec![1.0f32; z.len()];
            activation_backward(act, &mut g, &z);
            for (&d, &z) in g.iter().zip(&z) {
                let (z, h) = (z as f64, 1e-5);
                let want = (f(z + h) - f(z - h)) / (2.0 * h);
                assert!(
                    (d as f64 - want).abs() < 5e-6,
                    "{act:?} at {z}: {d} vs {want}"
                );
            }
        }
    }

    #[test]
    fn gelu_of_zero_and_large_values() {
        // GELU(0) = 0; GELU(x) → x for large x and → 0 for very negative x (Φ → 1 and 0).
        assert_eq!(gelu_erf(0.0), 0.0);
        assert_eq!(gelu_erf(10.0), 10.0);
        assert_eq!(gelu_erf(-10.0), 0.0);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }

    #[test]
    fn gemm_small_by_hand() {
        // [[1, 2], [3, 4]] · [[5, 6], [7, 8]] = [[1·5+2·7, 1·6+2·8], [3·5+4·7, 3·6+4·8]],
        // given as a·bᵀ with b = [[5, 7], [6, 8]].
        let mut y = [0.0; 4];
        gemm_bt(
            &[1.0, 2.0, 3.0, 4.0],
            2,
            2,
            &[5.0, 7.0, 6.0, 8.0],
            2,
            &mut y,
            Par::Seq,
        );
        assert_eq!(y, [19.0, 22.0, 43.0, 50.0]);
    }

    #[test]
    fn linear_layouts_agree() {
        // PyTorch weight [n_out=3, n_in=2] = [[1, 2], [3, 4], [5, 6]]; x = [1, 1] → [3, 7, 11] + b.
        let torch = Linear::new(
            WeightData::F32(F32Data::Owned(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])),
            WeightLayout::OutIn,
            vec![0.5, 0.0, -1.0],
            2,
            3,
        );
        let mut y = [0.0; 3];
        torch.forward(&[1.0, 1.0], &mut y, Epilogue::None, SEQ_F32);
        bias_activation_block(&mut y, 3, 0, &torch.bias, None);
        assert_eq!(y, [3.5, 7.0, 10.0]);
        // The same weight as Conv1D [n_in=2, n_out=3] = [[1, 3, 5], [2, 4, 6]].
        let conv = Linear::new(
            WeightData::F32(F32Data::Owned(vec![1.0, 3.0, 5.0, 2.0, 4.0, 6.0])),
            WeightLayout::InOut,
            vec![0.5, 0.0, -1.0],
            2,
            3,
        );
        conv.forward(&[1.0, 1.0], &mut y, Epilogue::None, SEQ_F32);
        bias_activation_block(&mut y, 3, 0, &conv.bias, None);
        assert_eq!(y, [3.5, 7.0, 10.0]);
        // Split in two along the output: rows [1, 2] and [3, 4], [5, 6] of the PyTorch weight,
        // written side by side.
        let split = Linear::from_parts(
            vec![
                Weight {
                    data: WeightData::F32(F32Data::Owned(vec![1.0, 2.0])),
                    layout: WeightLayout::OutIn,
                    n_out: 1,
                },
                Weight {
                    data: WeightData::F32(F32Data::Owned(vec![3.0, 5.0, 4.0, 6.0])),
                    layout: WeightLayout::InOut,
                    n_out: 2,
                },
            ],
            conv.bias.clone(),
            2,
        );
        let mut y = [0.0; 6];
        split.forward(&[1.0, 1.0, 1.0, 0.0], &mut y, Epilogue::None, SEQ_F32);
        // Rows x = [1, 1] → [3, 7, 11]; x = [1, 0] → [1, 3, 5].
        assert_eq!(y, [3.0, 7.0, 11.0, 1.0, 3.0, 5.0]);
    }

    #[test]
    fn blocked_activation_matches_matmul_then_activation() {
        // 900 outputs: two full blocks of 384 and a partial one of 132, in both layouts.
        let (n_in, n_out, rows) = (5, 900, 3);
        let w: Vec<f32> = (0..n_in * n_out)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 40.0)
            .collect();
        let w_t: Vec<f32> = (0..n_in * n_out)
            .map(|i| w[(i % n_out) * n_in + i / n_out])
            .collect();
        let bias: Vec<f32> = (0..n_out).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let x: Vec<f32> = (0..rows * n_in).map(|i| (i as f32 * 0.37).sin()).collect();
        for (data, layout) in [(w, WeightLayout::OutIn), (w_t, WeightLayout::InOut)] {
            let lin = Linear::new(
                WeightData::F32(F32Data::Owned(data)),
                layout,
                bias.clone(),
                n_in,
                n_out,
            );
            let mut want = vec![0.0; rows * n_out];
            lin.forward(&x, &mut want, Epilogue::None, SEQ_F32);
            bias_activation_block(&mut want, n_out, 0, &bias, Some(Activation::GeluErf));
            let mut got = vec![0.0; rows * n_out];
            lin.forward(
                &x,
                &mut got,
                Epilogue::BiasActivation(Activation::GeluErf),
                SEQ_F32,
            );
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-5, "{layout:?}: max abs difference {worst}");
        }
    }

    /// A weight of two parts side by side in both layouts, `[n_in, n_out]` overall, with a
    /// bias, and `rows` inputs.
    fn two_part_layer(rows: usize, n_in: usize, n_out: usize) -> (Linear, Vec<f32>) {
        let first = n_out / 3;
        let w = |k: usize, n: usize| ((k * 131 + n * 17) % 997) as f32 / 500.0 - 1.0;
        let out_in: Vec<f32> = (0..first * n_in).map(|i| w(i % n_in, i / n_in)).collect();
        let rest = n_out - first;
        let in_out: Vec<f32> = (0..n_in * rest)
            .map(|i| w(i / rest, first + i % rest))
            .collect();
        let parts = vec![
            Weight {
                data: WeightData::F32(F32Data::Owned(out_in)),
                layout: WeightLayout::OutIn,
                n_out: first,
            },
            Weight {
                data: WeightData::F32(F32Data::Owned(in_out)),
                layout: WeightLayout::InOut,
                n_out: rest,
            },
        ];
        let bias = (0..n_out).map(|n| (n % 5) as f32 * 0.1 - 0.2).collect();
        let x = (0..rows * n_in)
            .map(|i| ((i * 7919 % 1000) as f32 / 250.0 - 2.0) * 1.5)
            .collect();
        (Linear::from_parts(parts, bias, n_in), x)
    }

    #[test]
    fn tiles_match_the_bf16x3_reference_or_fall_back_to_f32() {
        // Rows: 1, part of a 32-row block, several blocks and a partial one; k: 1, 31, 33, and
        // 800 (two k blocks: the output is read back and added to); outputs: 1, 17, 50, and 800
        // (two column blocks).
        for (rows, n_in, n_out) in [(1, 1, 1), (5, 31, 17), (97, 33, 50), (40, 800, 800)] {
            let (lin, x) = two_part_layer(rows, n_in, n_out);
            for par in [Par::Seq, Par::rayon(3)] {
                let mut got = vec![f32::NAN; rows * n_out];
                let tiles = Gemm {
                    par,
                    kernel: GemmKernel::Bf16x3,
                };
                lin.forward(&x, &mut got, Epilogue::None, tiles);
                let mut want = vec![0.0; rows * n_out];
                if Bf16x3Weight::available() {
                    lin.packed().unwrap().matmul_reference(&x, &mut want);
                    let (worst, at) = max_relative_error(&got, &want);
                    // The tiles add in f32, the reference in f64: n_in roundings at most.
                    assert!(
                        worst <= n_in as f32 * 1.2e-7,
                        "{rows}×{n_in}×{n_out}: max rel error {worst} at {at}"
                    );
                } else {
                    let f32_gemm = Gemm {
                        par,
                        kernel: GemmKernel::F32,
                    };
                    lin.forward(&x, &mut want, Epilogue::None, f32_gemm);
                    assert_eq!(got, want, "{rows}×{n_in}×{n_out}: no AMX, so f32");
                }
            }
        }
    }

    #[test]
    fn values_the_tiles_cannot_take_run_in_f32() {
        // bf16(3.4e38) is ∞: on the tiles these products were NaN.
        let big = 3.4e38f32;
        let (rows, n_in) = (AUTO_MIN_ROWS, 2);
        for (w, x, want) in [
            (0.5, big, 0.5 * big),
            (big, 0.5, 0.5 * big),
            (-1e-3, f32::MAX, -1e-3 * f32::MAX),
        ] {
            let lin = Linear::new(
                WeightData::F32(F32Data::Owned(vec![w, 0.0])),
                WeightLayout::OutIn,
                vec![0.0],
                n_in,
                1,
            );
            let xs: Vec<f32> = (0..rows).flat_map(|_| [x, 1.0]).collect();
            let mut y = vec![f32::NAN; rows];
            let tiles = Gemm {
                par: Par::Seq,
                kernel: GemmKernel::Bf16x3,
            };
            lin.forward(&xs, &mut y, Epilogue::None, tiles);
            assert!(y.iter().all(|&v| v == want), "{w} · {x}: {:?}", &y[..2]);
        }
    }

    #[test]
    fn tiles_with_bias_and_gelu_match_f32() {
        // Against f32 GEMMs, bf16x3 is off by ≈ 2⁻¹⁶ of Σ|x·w| (≈ 400 here) at most.
        let (rows, n_in, n_out) = (70, 384, 96);
        let (lin, x) = two_part_layer(rows, n_in, n_out);
        for epilogue in [
            Epilogue::Bias,
            Epilogue::BiasActivation(Activation::GeluErf),
            Epilogue::BiasActivation(Activation::GeluTanh),
        ] {
            let run = |kernel| {
                let mut y = vec![f32::NAN; rows * n_out];
                let par = Par::Seq;
                lin.forward(&x, &mut y, epilogue, Gemm { par, kernel });
                y
            };
            let (got, want) = (run(GemmKernel::Bf16x3), run(GemmKernel::F32));
            let worst = got
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0, f32::max);
            assert!(worst < 1e-2, "{epilogue:?}: max abs difference {worst}");
        }
    }

    fn max_relative_error(got: &[f32], want: &[f32]) -> (f32, usize) {
        got.iter()
            .zip(want)
            .enumerate()
            .map(|(i, (g, e))| ((g - e).abs() / e.abs().max(1.0), i))
            .fold(
                (0.0f32, 0),
                |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a },
            )
    }

    #[test]
    fn layernorm_by_hand() {
        // x = [1, 3]: mean 2, var 1 → [-1, 1]/√(1 + eps); γ = [2, 1], β = [0, 1] → [-2, 2] (eps ≈ 0).
        let ln = LayerNorm {
            gamma: vec![2.0, 1.0],
            beta: vec![0.0, 1.0],
            eps: 1e-12,
            rms: false,
        };
        let mut x = [1.0, 3.0];
        ln.apply(&mut x);
        assert!(
            (x[0] + 2.0).abs() < 1e-6 && (x[1] - 2.0).abs() < 1e-6,
            "{x:?}"
        );
    }
}
