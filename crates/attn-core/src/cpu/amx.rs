//! Intel AMX (Advanced Matrix Extensions) for bf16 matrix products: detection, the Linux
//! permission to use the tile registers, the tile configuration, and a packed bf16 GEMM
//! `C += A·B` with f32 accumulation.
//!
//! One `TDPBF16PS` multiplies a 16 × 32 bf16 tile by a 32 × 16 bf16 tile into a 16 × 16 f32
//! tile (8192 multiply-adds), many times the work of an AVX-512 FMA per cycle. Intel's
//! reference: *Intel 64 and IA-32 Architectures Software Developer's Manual*, vol. 1 ch. 18
//! ("Programming with Intel AMX") and vol. 2 (`LDTILECFG`, `TILELOADD`, `TDPBF16PS`); the Linux
//! side is `Documentation/arch/x86/xstate.rst` (the `ARCH_REQ_XCOMP_PERM` request, without which
//! the first tile instruction faults).
//!
//! The B operand of `TDPBF16PS` is in the "VNNI" layout: row `p` of a B tile holds, for each of
//! its 16 columns `n`, the pair `(B[2p][n], B[2p + 1][n])`. [`PackedB`] holds a whole matrix in
//! that layout, padded with zeros to whole tiles, so it is packed once and multiplied many times.
//!
//! Products of two bf16 values are exact in f32; the sums are f32 sums in the hardware's order,
//! with bf16/f32 subnormals flushed to zero (as `TDPBF16PS` specifies). On CPUs without AMX
//! but with AVX512_BF16, the same packed operands multiply in `VDPBF16PS` dot products
//! (`crate::cpu::bf16dot`).
//!
//! The AMX intrinsics are unstable in Rust, so the instructions are written with `asm!`.

use std::cell::Cell;
use std::marker::PhantomData;

use half::bf16;

use super::aligned::Aligned;
use super::bf16dot::{self, Bf16Dot};
use super::isa::{Features, Isa};

/// Rows of a tile, and bf16 pairs (= B rows) of a B tile.
const TILE_ROWS: usize = 16;
/// bf16 values in one row of an A tile: the depth of one `TDPBF16PS`.
const TILE_K: usize = 32;
/// f32 columns of a C tile (= B tile columns).
const TILE_N: usize = 16;
/// bf16 values in one tile (1 KiB).
const TILE_ELEMS: usize = TILE_ROWS * TILE_K;
/// Rows and columns of the 2 × 2 tile block the kernel computes at a time.
pub(crate) const BLOCK: usize = 32;

thread_local! {
    /// How many [`Tiles`] guards are alive on this thread: only the outermost configures the
    /// tiles and releases them, so guards nest safely.
    static TILE_USERS: Cell<usize> = const { Cell::new(0) };
}

/// Proof that this thread's tile registers are configured: all eight tiles as 16 rows × 64
/// bytes. Dropping the last guard of a thread releases the tiles (`TILERELEASE`), so the OS
/// stops saving 8 KiB of tile data on each context switch.
pub(crate) struct Tiles {
    /// Tile configuration is per thread: the guard must not move to another one.
    _this_thread: PhantomData<*const ()>,
}

impl Tiles {
    /// Configures this thread's tiles, or `None` where AMX is not available
    /// ([`Features::amx`]).
    pub(crate) fn configure() -> Option<Tiles> {
        if !Features::get().amx {
            return None;
        }
        if TILE_USERS.get() == 0 {
            // Palette 1; bytes 16..32: bytes per row of each tile; bytes 48..56: rows.
            let mut cfg = [0u8; 64];
            cfg[0] = 1;
            for t in 0..8 {
                cfg[16 + 2 * t..][..2].copy_from_slice(&64u16.to_le_bytes());
                cfg[48 + t] = TILE_ROWS as u8;
            }
            // SAFETY: AMX is available and permitted (checked above); `cfg` is a valid
            // 64-byte palette-1 configuration.
            unsafe { ldtilecfg(&cfg) };
        }
        TILE_USERS.set(TILE_USERS.get() + 1);
        Some(Tiles {
            _this_thread: PhantomData,
        })
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        let users = TILE_USERS.get() - 1;
        TILE_USERS.set(users);
        if users == 0 {
            // SAFETY: AMX is available (a guard exists); TILERELEASE touches no memory.
            unsafe { tilerelease() };
        }
    }
}

/// # Safety
/// AMX must be available and permitted.
#[cfg(target_arch = "x86_64")]
unsafe fn ldtilecfg(cfg: &[u8; 64]) {
    // SAFETY: the caller guarantees AMX; `cfg` is 64 readable bytes.
    unsafe {
        std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly));
    }
}

/// # Safety
/// AMX must be available and permitted.
#[cfg(target_arch = "x86_64")]
unsafe fn tilerelease() {
    // SAFETY: the caller guarantees AMX.
    unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn ldtilecfg(_: &[u8; 64]) {
    unreachable!("AMX is never available off x86-64")
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tilerelease() {
    unreachable!("AMX is never available off x86-64")
}

/// Loads the 32 × 32 f32 block at `c` (rows `ldc` bytes apart) into tiles 0–3, or zeroes
/// them unless `accumulate`.
///
/// # Safety
/// A live [`Tiles`] guard on this thread; with `accumulate`, the block readable.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn start_2x2(c: *const f32, ldc: usize, accumulate: bool) {
    use std::arch::asm;
    // SAFETY: the caller guarantees the tiles and the memory.
    unsafe {
        if accumulate {
            asm!(
                "tileloadd tmm0, [{c} + {ldc}*1]",
                "tileloadd tmm1, [{c} + {ldc}*1 + 64]",
                "tileloadd tmm2, [{c1} + {ldc}*1]",
                "tileloadd tmm3, [{c1} + {ldc}*1 + 64]",
                c = in(reg) c, c1 = in(reg) c.byte_add(TILE_ROWS * ldc), ldc = in(reg) ldc,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
    }
}

/// Stores tiles 0–3 into the 32 × 32 f32 block at `c` (rows `ldc` bytes apart).
///
/// # Safety
/// A live [`Tiles`] guard on this thread; the block writable.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn finish_2x2(c: *mut f32, ldc: usize) {
    // SAFETY: the caller guarantees the tiles and the memory.
    unsafe {
        std::arch::asm!(
            "tilestored [{c} + {ldc}*1], tmm0",
            "tilestored [{c} + {ldc}*1 + 64], tmm1",
            "tilestored [{c1} + {ldc}*1], tmm2",
            "tilestored [{c1} + {ldc}*1 + 64], tmm3",
            c = in(reg) c, c1 = in(reg) c.byte_add(TILE_ROWS * ldc), ldc = in(reg) ldc,
            options(nostack),
        );
    }
}

/// `asm!` for a loop over `$chunks ≥ 1` depth chunks of a 2 × 2 tile block (tiles 0–3 hold C,
/// 4–5 the two 16-row halves of A, 6–7 the two 16-column halves of B): each pass runs the
/// template lines, which address A's halves at `{a0}` and `{a1}` (rows `{lda}` bytes apart) and
/// B's column groups at `{b0}` and `{b1}` (tile rows `{s64}` bytes apart), then moves A on by
/// `$a_step` bytes and B by `$b_step`.
macro_rules! chunk_loop {
    ($chunks:expr, $a:expr, $lda:expr, ($b0:expr, $b1:expr), ($a_step:expr, $b_step:expr),
     $($line:literal),* $(,)?) => {
        std::arch::asm!(
            "2:",
            $($line,)*
            "add {a0}, {a_step}",
            "add {a1}, {a_step}",
            "add {b0}, {b_step}",
            "add {b1}, {b_step}",
            "dec {n}",
            "jnz 2b",
            a0 = inout(reg) $a => _,
            a1 = inout(reg) $a.byte_add(16 * $lda) => _,
            b0 = inout(reg) $b0 => _,
            b1 = inout(reg) $b1 => _,
            n = inout(reg) $chunks => _,
            lda = in(reg) $lda,
            a_step = in(reg) $a_step,
            b_step = in(reg) $b_step,
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}
pub(crate) use chunk_loop;

/// One 32 × 32 block `C (+)= A·B` over `k_chunks` depth chunks of 32: tiles 0–3 hold C, 4–5
/// the two 16-row halves of A, 6–7 the two 16-column halves of B.
///
/// `a` points at A's first row (rows `lda` bytes apart, 32 rows, `32·k_chunks` bf16 each);
/// `b0`/`b1` at the first B tile of C's left/right 16 columns, the next depth chunk's tiles
/// `ldb` bytes further; `c` at C's first row (rows `ldc` bytes apart, 32 rows of 32 f32).
///
/// # Safety
/// A live [`Tiles`] guard on this thread; `k_chunks ≥ 1`; every address above readable
/// (writable for `c`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn block_2x2(
    k_chunks: usize,
    a: *const bf16,
    lda: usize,
    b0: *const bf16,
    b1: *const bf16,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    // SAFETY (whole body): the caller guarantees the tiles, the chunk count and the memory.
    unsafe {
        start_2x2(c, ldc, accumulate);
        chunk_loop!(
            k_chunks,
            a,
            lda,
            (b0, b1),
            (64usize, ldb),
            // Each product right after the loads it needs, so it starts while the next loads
            // are in flight.
            "tileloadd tmm4, [{a0} + {lda}*1]",
            "tileloadd tmm6, [{b0} + {s64}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {s64}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {lda}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
        );
        finish_2x2(c, ldc);
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
unsafe fn block_2x2(
    _: usize,
    _: *const bf16,
    _: usize,
    _: *const bf16,
    _: *const bf16,
    _: usize,
    _: *mut f32,
    _: usize,
    _: bool,
) {
    unreachable!("AMX is never available off x86-64")
}

/// A bf16 matrix `B` (`[k, n]`) in the VNNI tile layout `TDPBF16PS` reads, padded with zeros
/// to whole tiles: `k` up to a multiple of 32, `n` up to a multiple of 32.
///
/// Tile `(kc, ng)` (depth rows `32·kc..`, columns `16·ng..`) is 512 consecutive values at
/// `(ng·k_chunks + kc)·512`; in it, `B[32·kc + 2p + e][16·ng + j]` sits at `32p + 2j + e`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PackedB {
    k: usize,
    n: usize,
    k_chunks: usize,
    /// On a cache line: off it, each 64-byte tile row would span two lines, and every
    /// `TILELOADD` of it would be much slower.
    data: Aligned<bf16>,
}

impl PackedB {
    /// An all-zero packed `[k, n]` matrix.
    fn zeros(k: usize, n: usize) -> PackedB {
        let k_chunks = k.div_ceil(TILE_K);
        let n_groups = n.div_ceil(BLOCK) * (BLOCK / TILE_N);
        // A fresh buffer grows with zeros (`Aligned::get`).
        let mut data = Aligned::default();
        data.get(n_groups * k_chunks * TILE_ELEMS);
        PackedB {
            k,
            n,
            k_chunks,
            data,
        }
    }

    /// The packed `[k, n]` matrix `b` (row-major, length checked by the caller), packed on
    /// `isa`: with AVX-512 registers on the bf16 products' ISAs.
    pub(crate) fn from_rows(b: &[bf16], (k, n): (usize, usize), isa: Isa) -> PackedB {
        let mut packed = PackedB::zeros(k, n);
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Amx | Isa::Avx512Bf16) {
            // SAFETY: those ISAs have AVX-512F and AVX512BW, and only run where available.
            unsafe { pack_rows_avx512(b, &mut packed) };
            return packed;
        }
        packed.fill_from_rows(b);
        packed
    }

    /// What [`PackedB::from_rows`] writes, one value at a time (into zeros).
    fn fill_from_rows(&mut self, b: &[bf16]) {
        let (n, group) = (self.n, self.k_chunks * TILE_ELEMS);
        if n == 0 {
            return;
        }
        // Rows 2p and 2p + 1 interleave into row p of their column group's tiles (tile
        // (kc, ng) starts at ng·group + kc·512 and its row p' at 32p': together 32p from the
        // group's start).
        for (p, pair) in b.chunks(2 * n).enumerate() {
            for (e, row) in pair.chunks_exact(n).enumerate() {
                for (ng, cols) in row.chunks(TILE_N).enumerate() {
                    let dst = &mut self.data.all_mut()[ng * group + p * 2 * TILE_N + e..];
                    for (j, &x) in cols.iter().enumerate() {
                        dst[2 * j] = x;
                    }
                }
            }
        }
    }

    /// The packed `[k, n]` matrix `btᵀ` (`bt` row-major `[n, k]`, length checked by the caller),
    /// packed on `isa` as [`PackedB::from_rows`].
    pub(crate) fn from_transposed(bt: &[bf16], (n, k): (usize, usize), isa: Isa) -> PackedB {
        let mut packed = PackedB::zeros(k, n);
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Amx | Isa::Avx512Bf16) {
            // SAFETY: those ISAs have AVX-512F and AVX512BW, and only run where available.
            unsafe { pack_transposed_avx512(bt, &mut packed) };
            return packed;
        }
        packed.fill_from_transposed(bt);
        packed
    }

    /// What [`PackedB::from_transposed`] writes, one pair at a time (into zeros).
    fn fill_from_transposed(&mut self, bt: &[bf16]) {
        let (k, group) = (self.k, self.k_chunks * TILE_ELEMS);
        if k == 0 {
            return;
        }
        // Column nn of B is row nn of `bt`: its pairs go 32 values apart (see
        // `fill_from_rows`), each pair two adjacent values of the row.
        for (nn, col) in bt.chunks_exact(k).enumerate() {
            let dst = &mut self.data.all_mut()[(nn / TILE_N) * group + (nn % TILE_N) * 2..];
            let mut pairs = col.chunks_exact(2);
            for (row, pair) in dst.chunks_mut(2 * TILE_N).zip(&mut pairs) {
                row[..2].copy_from_slice(pair);
            }
            if let [last] = pairs.remainder() {
                dst[(k / 2) * 2 * TILE_N] = *last;
            }
        }
    }

    /// The column count `n` of `B`.
    pub(crate) fn n(&self) -> usize {
        self.n
    }
}

/// The mask of the first `n` (at most 32) of 32 lanes.
#[cfg(target_arch = "x86_64")]
fn first_lanes(n: usize) -> u32 {
    u32::MAX.checked_shr(32 - n.min(32) as u32).unwrap_or(0)
}

/// [`PackedB::from_rows`] a tile row at a time: rows `2p` and `2p + 1` of 32 columns, loaded
/// whole (zeros past `k` and `n`), interleave into row `p` of the two 16-column tiles, so this
/// stores every value of `packed`, padding included, once.
///
/// # Safety
/// AVX-512F and AVX512BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_rows_avx512(b: &[bf16], packed: &mut PackedB) {
    use std::arch::x86_64::*;
    let (k, n, k_chunks) = (packed.k, packed.n, packed.k_chunks);
    assert_eq!(b.len(), k * n);
    let dst = packed.data.all_mut();
    // Lane `2j` takes value `j` of the even row, lane `2j + 1` value `j` of the odd one (its
    // index is 32 further): columns 0..16 for `lo`, 16..32 for `hi`.
    let lo: [u16; 32] = std::array::from_fn(|x| (x / 2 + 32 * (x % 2)) as u16);
    let hi = lo.map(|i| i + 16);
    // SAFETY: each array holds 32 u16, 512 bits.
    let (lo, hi) = unsafe {
        (
            _mm512_loadu_si512(lo.as_ptr().cast()),
            _mm512_loadu_si512(hi.as_ptr().cast()),
        )
    };
    for c in 0..n.div_ceil(BLOCK) {
        let cols = first_lanes(n - BLOCK * c);
        // Row `r`'s 32 columns from `BLOCK·c` (zeros past `k`).
        let row = |r: usize| {
            if r < k {
                // SAFETY: the lanes of `cols` lie inside row `r` of `b` (checked above).
                unsafe { _mm512_maskz_loadu_epi16(cols, b.as_ptr().add(r * n + BLOCK * c).cast()) }
            } else {
                _mm512_setzero_si512()
            }
        };
        for kc in 0..k_chunks {
            for p in 0..TILE_ROWS {
                let r = TILE_K * kc + 2 * p;
                let (even, odd) = (row(r), row(r + 1));
                let at = (2 * c * k_chunks + kc) * TILE_ELEMS + 2 * TILE_N * p;
                let next_group = k_chunks * TILE_ELEMS;
                // SAFETY: row `p` of tile `(kc, 2c)` and of tile `(kc, 2c + 1)` lie inside the
                // padded matrix.
                unsafe {
                    let out = dst[at..][..next_group + 32].as_mut_ptr();
                    _mm512_storeu_si512(out.cast(), _mm512_permutex2var_epi16(even, lo, odd));
                    let out = out.add(next_group);
                    _mm512_storeu_si512(out.cast(), _mm512_permutex2var_epi16(even, hi, odd));
                }
            }
        }
    }
}

/// [`PackedB::from_transposed`] a tile at a time: a tile's rows are depth pairs, and its 16
/// columns 16 rows of `bt`, so the tile is the 16 × 16 dword transpose of 16 rows' 32 values
/// (zeros past `n` and `k`), so this stores every value of `packed`, padding included, once.
///
/// # Safety
/// AVX-512F and AVX512BW must be available.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack_transposed_avx512(bt: &[bf16], packed: &mut PackedB) {
    use std::arch::x86_64::*;
    let (k, n, k_chunks) = (packed.k, packed.n, packed.k_chunks);
    assert_eq!(bt.len(), n * k);
    let dst = packed.data.all_mut();
    for ng in 0..n.div_ceil(BLOCK) * (BLOCK / TILE_N) {
        for kc in 0..k_chunks {
            let depth = first_lanes(k - TILE_K * kc);
            let rows: [__m512i; TILE_N] = std::array::from_fn(|j| {
                let nn = TILE_N * ng + j;
                if nn < n {
                    // SAFETY: the lanes of `depth` lie inside row `nn` of `bt` (checked above).
                    unsafe {
                        _mm512_maskz_loadu_epi16(
                            depth,
                            bt.as_ptr().add(nn * k + TILE_K * kc).cast(),
                        )
                    }
                } else {
                    _mm512_setzero_si512()
                }
            });
            let tile = &mut dst[(ng * k_chunks + kc) * TILE_ELEMS..][..TILE_ELEMS];
            for (p, row) in super::avx512::transpose_16x16(rows).into_iter().enumerate() {
                // SAFETY: row `p` of the tile lies inside `tile`.
                unsafe { _mm512_storeu_si512(tile.as_mut_ptr().add(2 * TILE_N * p).cast(), row) };
            }
        }
    }
}

/// A rectangle of a [`PackedB`]'s tiles: depth chunks `kc0..kc0 + k_chunks`, column groups
/// `ng0..ng0 + 2·n_blocks` (whole 32-column blocks).
#[derive(Clone, Copy)]
pub(crate) struct BView<'a> {
    b: &'a PackedB,
    kc0: usize,
    k_chunks: usize,
    ng0: usize,
    n_blocks: usize,
}

impl PackedB {
    /// All of `B`.
    #[cfg(test)]
    fn whole(&self) -> BView<'_> {
        BView {
            b: self,
            kc0: 0,
            k_chunks: self.k_chunks,
            ng0: 0,
            n_blocks: self.n.div_ceil(BLOCK),
        }
    }

    /// Depth rows `k0..k0 + k` and columns `n0..n0 + n` (`k0` a multiple of 32, `n0` of 32;
    /// `k` and `n` rounded up to whole tiles, inside the padding).
    pub(crate) fn view(&self, (k0, k): (usize, usize), (n0, n): (usize, usize)) -> BView<'_> {
        debug_assert!(k0.is_multiple_of(TILE_K) && n0.is_multiple_of(BLOCK));
        let view = BView {
            b: self,
            kc0: k0 / TILE_K,
            k_chunks: k.div_ceil(TILE_K),
            ng0: n0 / TILE_N,
            n_blocks: n.div_ceil(BLOCK),
        };
        assert!(
            view.kc0 + view.k_chunks <= self.k_chunks
                && view.ng0 + 2 * view.n_blocks <= self.n.div_ceil(BLOCK) * 2,
            "PackedB view out of range"
        );
        view
    }
}

impl BView<'_> {
    /// The depth of this view, padded to whole tiles.
    pub(crate) fn k_padded(&self) -> usize {
        self.k_chunks * TILE_K
    }

    /// The columns of this view, padded to whole 32-column blocks.
    pub(crate) fn n_padded(&self) -> usize {
        self.n_blocks * BLOCK
    }
}

/// What multiplies the blocks of [`gemm_blocks`]: this thread's AMX tiles, or AVX512_BF16 dot
/// products on CPUs without AMX ([`crate::cpu::bf16dot`]), on the same packed operands.
pub(crate) enum Products {
    Tiles(Tiles),
    Dot(Bf16Dot),
}

impl Products {
    /// What the fused kernels' `isa` multiplies on: the tiles on [`Isa::Amx`], the dot products
    /// on [`Isa::Avx512Bf16`]; `None` for the other ISAs, or where the CPU lacks what `isa`
    /// needs.
    ///
    pub(crate) fn for_isa(isa: Isa) -> Option<Products> {
        match isa {
            Isa::Amx => Tiles::configure().map(Products::Tiles),
            Isa::Avx512Bf16 => Bf16Dot::detect().map(Products::Dot),
            _ => None,
        }
    }

    /// The tiles, for the products only they run (f32 in bf16 parts, [`crate::cpu::bf16x`]).
    pub(crate) fn tiles(&self) -> Option<&Tiles> {
        match self {
            Products::Tiles(tiles) => Some(tiles),
            Products::Dot(_) => None,
        }
    }
}

/// `C (+)= A·B` on whole blocks: `A` is `[m, b.k_padded()]` (rows `lda` apart, `m` a multiple
/// of 32), `C` is `[m, b.n_padded()]` (rows `ldc` apart, the last one no longer than needed);
/// `accumulate` adds to `C`, else overwrites it.
///
/// # Shapes
/// - `a`: `[m, lda]`, `c`: `[m, ldc]`, with `m = a.len() / lda`
pub(crate) fn gemm_blocks(
    products: &Products,
    a: &[bf16],
    lda: usize,
    b: BView<'_>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let m = a.len() / lda;
    // The kernel reads and writes through raw pointers: these checks keep this safe.
    assert!(
        m.is_multiple_of(BLOCK)
            && b.k_padded() <= lda
            && b.n_padded() <= ldc
            && (m == 0 || c.len() >= (m - 1) * ldc + b.n_padded()),
        "gemm_blocks: A, B and C disagree"
    );
    if b.k_chunks == 0 {
        if !accumulate {
            c.fill(0.0);
        }
        return;
    }
    let ldb = b.b.k_chunks * TILE_ELEMS;
    for nb in 0..b.n_blocks {
        let ng = b.ng0 + 2 * nb;
        let b0 = &b.b.data.all()[ng * ldb + b.kc0 * TILE_ELEMS..];
        let b1 = &b.b.data.all()[(ng + 1) * ldb + b.kc0 * TILE_ELEMS..];
        for mb in (0..m).step_by(BLOCK) {
            let (a, c) = (&a[mb * lda..], &mut c[mb * ldc + nb * BLOCK..]);
            let (a, b0, b1, c) = (a.as_ptr(), b0.as_ptr(), b1.as_ptr(), c.as_mut_ptr());
            let (lda, ldb, ldc) = (lda * 2, TILE_ELEMS * 2, ldc * 4);
            // SAFETY: a live `Tiles` guard, or a `Bf16Dot` (the CPU has what it runs);
            // `k_chunks ≥ 1`; the 32 rows of A and C and the `k_chunks` tiles of each B column
            // group lie inside the slices (checked above and by the view's construction).
            unsafe {
                match products {
                    Products::Tiles(_) => {
                        block_2x2(b.k_chunks, a, lda, b0, b1, ldb, c, ldc, accumulate)
                    }
                    Products::Dot(dot) => {
                        let chunks = b.k_chunks;
                        bf16dot::block_2x2(*dot, chunks, a, lda, (b0, b1), ldb, c, ldc, accumulate)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 packers write, bit for bit, what the one-value-at-a-time ones write into
    /// zeros, padding included: every size around a tile's 16 columns and 32-deep chunks.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_packers_match_the_scalar_ones() {
        let Some(isa) = [Isa::Amx, Isa::Avx512Bf16]
            .into_iter()
            .find(|isa| isa.is_available())
        else {
            crate::cpu::not_on_this_cpu("the AVX-512 packers");
            return;
        };
        let bits = |p: &PackedB| p.data.all().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for k in [1, 2, 15, 31, 32, 33, 64, 65, 100] {
            for n in [1, 15, 16, 17, 31, 32, 33, 80] {
                // Distinct bit patterns, none zero, NaNs included: any misplaced value shows.
                let b: Vec<bf16> = (1..=k * n).map(|i| bf16::from_bits(i as u16)).collect();
                let mut want = PackedB::zeros(k, n);
                want.fill_from_rows(&b);
                assert_eq!(
                    bits(&PackedB::from_rows(&b, (k, n), isa)),
                    bits(&want),
                    "rows {k}×{n}"
                );
                let mut want = PackedB::zeros(k, n);
                want.fill_from_transposed(&b);
                let got = PackedB::from_transposed(&b, (n, k), isa);
                assert_eq!(bits(&got), bits(&want), "transposed {n}×{k}");
            }
        }
    }

    /// The 32 × 32 block products of `gemm_blocks` on the tiles and in AVX512_BF16 dot products
    /// against f64 on awkward sizes, overwriting and accumulating: products of bf16 values are
    /// exact, so the only error is f32 summation, at most `(k + 1)·2^-24·(|c₀| + Σ|a·b|)`
    /// whatever the order.
    #[test]
    fn block_products_match_f64() {
        for isa in [Isa::Amx, Isa::Avx512Bf16] {
            match Products::for_isa(isa) {
                Some(products) => products_match_f64(isa, &products),
                None => crate::cpu::not_on_this_cpu(&format!("{isa:?}'s block products")),
            }
        }
    }

    fn products_match_f64(isa: Isa, products: &Products) {
        let value = |i: usize, m: usize, off: f32| bf16::from_f32((i % m) as f32 * 0.37 - off);
        for (m, k, n) in [
            (1usize, 1usize, 1usize),
            (5, 37, 19),
            (32, 32, 32),
            (33, 64, 17),
            (70, 129, 65),
        ] {
            let (m_pad, k_pad, n_pad) = (
                m.next_multiple_of(BLOCK),
                k.next_multiple_of(TILE_K),
                n.next_multiple_of(BLOCK),
            );
            let a: Vec<bf16> = (0..m * k).map(|i| value(i, 13, 2.0)).collect();
            let b_rows: Vec<bf16> = (0..k * n).map(|i| value(i, 7, 1.1)).collect();
            let b = PackedB::from_rows(&b_rows, (k, n), isa);
            let mut a_pad = vec![bf16::ZERO; m_pad * k_pad];
            for (src, dst) in a.chunks_exact(k).zip(a_pad.chunks_exact_mut(k_pad)) {
                dst[..k].copy_from_slice(src);
            }
            for accumulate in [false, true] {
                let c0 = |i: usize, j: usize| {
                    if accumulate {
                        (i * n + j) as f32 * 0.01 - 1.0
                    } else {
                        0.0
                    }
                };
                // Past the columns of C, values the products overwrite.
                let mut c: Vec<f32> = (0..m_pad * n_pad)
                    .map(|x| c0(x / n_pad, x % n_pad))
                    .collect();
                gemm_blocks(
                    products,
                    &a_pad,
                    k_pad,
                    b.whole(),
                    &mut c,
                    n_pad,
                    accumulate,
                );
                for i in 0..m {
                    for j in 0..n {
                        let c0 = f64::from(c0(i, j));
                        let (mut want, mut mag) = (c0, c0.abs());
                        for p in 0..k {
                            let x = f64::from(a[i * k + p].to_f32())
                                * f64::from(b_rows[p * n + j].to_f32());
                            want += x;
                            mag += x.abs();
                        }
                        let tol = (k + 1) as f64 * 2f64.powi(-24) * mag;
                        let got = f64::from(c[i * n_pad + j]);
                        assert!(
                            (got - want).abs() <= tol,
                            "({m}, {k}, {n}) {accumulate} at ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
        // A view inside the padding's bounds, as the fused path takes key blocks and chunks:
        // depth rows 32..96 and columns 32..64 of a 129 × 65 matrix, against 32 rows of A.
        let (k, n) = (129, 65);
        let b_rows: Vec<bf16> = (0..k * n).map(|i| value(i, 11, 1.3)).collect();
        let b = PackedB::from_rows(&b_rows, (k, n), isa);
        let a: Vec<bf16> = (0..32 * 64).map(|i| value(i, 5, 0.7)).collect();
        let mut c = vec![0.0f32; 32 * 32];
        let view = b.view((32, 64), (32, 32));
        gemm_blocks(products, &a, 64, view, &mut c, 32, false);
        for i in 0..32 {
            for j in 0..32 {
                let (mut want, mut mag) = (0.0f64, 0.0f64);
                for p in 0..64 {
                    let x = f64::from(a[i * 64 + p].to_f32())
                        * f64::from(b_rows[(32 + p) * n + 32 + j].to_f32());
                    want += x;
                    mag += x.abs();
                }
                let got = f64::from(c[i * 32 + j]);
                let tol = 65.0 * 2f64.powi(-24) * mag;
                assert!(
                    (got - want).abs() <= tol,
                    "view at ({i}, {j}): {got} vs {want}"
                );
            }
        }
    }

    /// The kernel lists `amx_tile` and `amx_bf16` among the CPU flags exactly when CPUID reports
    /// them and the kernel supports the tile state; the permission request then succeeds.
    #[test]
    #[cfg(target_os = "linux")]
    fn detection_agrees_with_cpuinfo() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags: Vec<&str> = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let listed = flags.contains(&"amx_tile") && flags.contains(&"amx_bf16");
        assert_eq!(super::super::isa::amx_available(), listed);
    }
}
