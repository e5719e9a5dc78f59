//! The backward pass of scaled dot-product attention: gradients of `sum(out · dout)` with
//! respect to `q`, `k` and `v`, for every option the forward pass supports.
//!
//! [`sdpa_backward`] is the fast path, FlashAttention-2's backward (Dao 2023,
//! <https://arxiv.org/abs/2307.08691>, Algorithm 2): the `seq_q × seq_kv` matrices are never
//! materialised. For one block of keys and one block of queries it recomputes the scores `S`
//! from `q`, `k` and the saved log-sum-exp, so `P = e^(S − lse)` needs no second softmax; with
//! `D = rowsum(dout ∘ out)` (one value per query row) and the dropout factors `Z` (`0` or
//! `1/(1 − p)`, replayed from [`crate::Dropout::keep`]):
//! - `dV += (P ∘ Z)ᵀ · dO`
//! - `dP = (dO · Vᵀ) ∘ Z`
//! - `dS = P ∘ (dP − D)`, times `1 − tanh²(s/c)` under a softcap `c` (the chain rule through
//!   `c · tanh(s/c)`)
//! - `dK += scale · dSᵀ · Q`, `dQ += scale · dS · K`.
//!
//! ALiBi slopes and float masks are additive constants, so they change `P` but add no term;
//! hidden keys have `P = 0` and get no gradient. Under grouped-query attention `dK` and `dV`
//! sum over the query heads sharing a key/value head.
//!
//! Work is split over `batch × n_kv_heads`: a task owns its head's `dK`, `dV` and the `dQ` of
//! the query heads that read it, and writes them in place, so nothing is shared between
//! threads. When that gives rayon too few tasks, each head is split further into interleaved
//! chunks of key blocks, each chunk with its own sums, added up at the end. Block products go
//! through faer's GEMM; the elementwise steps are written so the compiler vectorises them,
//! compiled a second time for AVX-512 where the CPU has it.
//!
//! [`sdpa_backward_reference`] is the plain twin: one query row at a time, its own softmax, no
//! saved state.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

use crate::fused::Isa;
use crate::mask::{diagonal_offset, key_range};
use crate::shape::check_len;
use crate::{AttnError, AttnInput, AttnOptions, AttnShape};

/// Query rows per block.
const BLOCK_Q: usize = 128;
/// Keys per block.
const BLOCK_KV: usize = 128;
/// Tasks per rayon thread that the split over key blocks aims for.
const TASKS_PER_THREAD: usize = 4;

/// Gradients of `sum(out · dout)` with respect to the inputs of an attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    /// `[batch, n_heads, seq_q, head_dim]`
    pub dq: Vec<f32>,
    /// `[batch, n_kv_heads, seq_kv, head_dim]`, summed over the query heads of each group.
    pub dk: Vec<f32>,
    /// `[batch, n_kv_heads, seq_kv, value_dim]`, summed over the query heads of each group.
    pub dv: Vec<f32>,
}

/// Checks the saved forward results and the incoming gradient against the call's shape.
fn validate(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    saved: Option<(&[f32], &[f32])>,
    dout: &[f32],
) -> Result<(), AttnError> {
    let sh = input.shape;
    options.validate(&sh)?;
    check_len("q", &sh.q_dims(), input.q.len())?;
    check_len("k", &sh.k_dims(), input.k.len())?;
    check_len("v", &sh.v_dims(), input.v.len())?;
    check_len("dout", &sh.out_dims(), dout.len())?;
    let mut finite = vec![("dout", dout)];
    if let Some((out, lse)) = saved {
        check_len("out", &sh.out_dims(), out.len())?;
        check_len("lse", &sh.out_dims()[..3], lse.len())?;
        finite.push(("out", out));
        // −∞ is a row that saw no key; NaN and +∞ cannot come from a forward pass.
        if let Some((index, &value)) =
            (lse.iter().enumerate()).find(|(_, x)| x.is_nan() || **x == f32::INFINITY)
        {
            return Err(AttnError::NonFinite {
                tensor: "lse",
                index,
                value,
            });
        }
    }
    for (tensor, data) in finite {
        // x·0 is 0 for finite x and NaN otherwise: one vectorisable pass, searched only on NaN.
        if data.iter().fold(0.0f32, |acc, &x| acc + x * 0.0) == 0.0 {
            continue;
        }
        if let Some((index, &value)) = data.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(AttnError::NonFinite {
                tensor,
                index,
                value,
            });
        }
    }
    Ok(())
}

/// Gradients of `sum(out · dout)` with respect to `q`, `k` and `v`: the fast path.
///
/// `out` and `lse` are what the forward pass ([`crate::sdpa`] or [`crate::sdpa_reference`])
/// returned for the same `input` and `options`; `options.weights` is ignored.
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - `out`, `dout`: `[batch, n_heads, seq_q, value_dim]`; `lse`: `[batch, n_heads, seq_q]`
/// - returns `dq`, `dk`, `dv` shaped like `q`, `k`, `v`.
///
/// # Errors
/// Whatever [`AttnOptions::validate`] rejects, a tensor of the wrong length, and a non-finite
/// `dout` or `out`, or a NaN or `+∞` in `lse`.
pub fn sdpa_backward(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> Result<Grads, AttnError> {
    sdpa_backward_with(Isa::best(), input, options, out, lse, dout)
}

/// [`sdpa_backward`] with the elementwise steps built for `isa` (tests force
/// [`Isa::Portable`] to check the fallback on a machine that has AVX-512).
///
/// # Shapes
/// As [`sdpa_backward`].
///
/// # Errors
/// As [`sdpa_backward`], and an `isa` this CPU lacks.
pub fn sdpa_backward_with(
    isa: Isa,
    input: &AttnInput<'_>,
    options: &AttnOptions,
    out: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> Result<Grads, AttnError> {
    validate(input, options, Some((out, lse)), dout)?;
    if !isa.is_available() {
        return Err(AttnError::InvalidOption {
            option: "isa",
            reason: format!("{isa:?} kernels need CPU features this machine lacks"),
        });
    }
    let sh = input.shape;
    let (d, dv) = (sh.head_dim, sh.value_dim);
    let scale = options.scale_for(&sh);
    // D = rowsum(dout ∘ out), [batch, n_heads, seq_q]
    let delta: Vec<f32> = if dv == 0 {
        vec![0.0; lse.len()]
    } else {
        dout.par_chunks(dv)
            .zip(out.par_chunks(dv))
            .map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).sum())
            .collect()
    };
    let plan = Plan {
        sh,
        opt: options,
        offset: diagonal_offset(options.causal, sh.seq_q, sh.seq_kv),
        extras: options.alibi.is_some()
            || options.float_mask.is_some()
            || options.bool_mask.is_some()
            || options.key_padding.is_some(),
        simd: isa == Isa::Avx512,
        scale,
        q: input.q,
        k: input.k,
        v: input.v,
        dout,
        lse,
        delta: &delta,
    };

    let mut grads = Grads {
        dq: vec![0.0; input.q.len()],
        dk: vec![0.0; input.k.len()],
        dv: vec![0.0; input.v.len()],
    };
    let heads = sh.batch * sh.n_kv_heads;
    let key_blocks = sh.seq_kv.div_ceil(BLOCK_KV);
    if heads == 0 || key_blocks == 0 || sh.seq_q == 0 {
        return Ok(grads);
    }
    let wanted = TASKS_PER_THREAD * rayon::current_num_threads();
    let chunks = wanted.div_ceil(heads).clamp(1, key_blocks);
    // Every (b, kv head) owns a contiguous run of query heads, [group, seq_q, head_dim], and
    // its own key/value rows, [seq_kv, head_dim] and [seq_kv, value_dim].
    let lens = (
        sh.group_size() * sh.seq_q * d,
        sh.seq_kv * d,
        sh.seq_kv * dv,
    );
    if chunks == 1 && lens.0 > 0 && lens.1 > 0 && lens.2 > 0 {
        // One task per head, writing straight into the results.
        (grads.dq.par_chunks_mut(lens.0))
            .zip(grads.dk.par_chunks_mut(lens.1))
            .zip(grads.dv.par_chunks_mut(lens.2))
            .enumerate()
            .for_each(|(bkv, ((dq, dk), dv))| plan.task(bkv, (0, 1), (dq, dk, dv)));
    } else {
        // Several tasks per head, each with its own sums, added up afterwards.
        let parts: Vec<Grads> = (0..heads * chunks)
            .into_par_iter()
            .map(|t| {
                let mut g = Grads {
                    dq: vec![0.0; lens.0],
                    dk: vec![0.0; lens.1],
                    dv: vec![0.0; lens.2],
                };
                plan.task(
                    t / chunks,
                    (t % chunks, chunks),
                    (&mut g.dq, &mut g.dk, &mut g.dv),
                );
                g
            })
            .collect();
        for (t, part) in parts.iter().enumerate() {
            let bkv = t / chunks;
            for (dst, src, len) in [
                (&mut grads.dq, &part.dq, lens.0),
                (&mut grads.dk, &part.dk, lens.1),
                (&mut grads.dv, &part.dv, lens.2),
            ] {
                let dst = &mut dst[bkv * len..][..len];
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += b);
            }
        }
    }
    // dQ = scale·Σ dS·K and dK = scale·Σ dSᵀ·Q: the scale is applied once, here.
    for g in [&mut grads.dq, &mut grads.dk] {
        g.par_chunks_mut(4096)
            .for_each(|c| c.iter_mut().for_each(|x| *x *= scale));
    }
    Ok(grads)
}

/// Everything a task reads.
struct Plan<'a> {
    sh: AttnShape,
    opt: &'a AttnOptions,
    offset: isize,
    /// Whether ALiBi, a float mask, a boolean mask or key padding applies (the per-key lane).
    extras: bool,
    /// Whether the elementwise steps run their AVX-512 build.
    simd: bool,
    scale: f32,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    dout: &'a [f32],
    lse: &'a [f32],
    /// `rowsum(dout ∘ out)`, `[batch, n_heads, seq_q]`.
    delta: &'a [f32],
}

/// Per-task tiles, `[rows, keys]` each, reused across blocks.
#[derive(Default)]
struct Tiles {
    /// Scores, then probabilities `P`.
    p: Vec<f32>,
    /// `dO·Vᵀ`, then `dS`.
    ds: Vec<f32>,
    /// `P ∘ Z` under dropout.
    pz: Vec<f32>,
    /// The dropout factors `Z`.
    z: Vec<f32>,
    /// `1 − tanh²(s/c)` under a softcap.
    dcap: Vec<f32>,
}

/// `C (+)= alpha · A · B` through faer, single-threaded (the tasks are the parallelism).
fn gemm(
    c: MatMut<'_, f32>,
    (accumulate, alpha): (bool, f32),
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
) {
    let accum = if accumulate {
        Accum::Add
    } else {
        Accum::Replace
    };
    matmul(c, accum, a, b, alpha, Par::Seq);
}

/// A row-major `[rows, cols]` view.
fn view(x: &[f32], rows: usize, cols: usize) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice(&x[..rows * cols], rows, cols)
}

/// A row-major `[rows, cols]` mutable view.
fn view_mut(x: &mut [f32], rows: usize, cols: usize) -> MatMut<'_, f32> {
    MatMut::from_row_major_slice_mut(&mut x[..rows * cols], rows, cols)
}

impl Plan<'_> {
    /// Task `chunk` of `chunks` for batch × key/value head `bkv`: key blocks
    /// `chunk, chunk + chunks, …` (interleaved, so causal work spreads evenly). Adds the
    /// unscaled `dS·K` of the group's query heads to `dq` (`[group, seq_q, head_dim]`) and the
    /// unscaled `dSᵀ·Q` and `dV` of its key blocks to `dk` (`[seq_kv, head_dim]`) and `dv`
    /// (`[seq_kv, value_dim]`).
    fn task(
        &self,
        bkv: usize,
        (chunk, chunks): (usize, usize),
        (dq, dk, dv_out): (&mut [f32], &mut [f32], &mut [f32]),
    ) {
        let sh = self.sh;
        let (d, dv, s_n, l_n) = (sh.head_dim, sh.value_dim, sh.seq_kv, sh.seq_q);
        let group = sh.group_size();
        let (b, kvh) = (bkv / sh.n_kv_heads, bkv % sh.n_kv_heads);
        let mut t = Tiles::default();
        for jb in (chunk..s_n.div_ceil(BLOCK_KV)).step_by(chunks) {
            let j0 = jb * BLOCK_KV;
            let keys = (s_n - j0).min(BLOCK_KV);
            let k_blk = &self.k[(bkv * s_n + j0) * d..][..keys * d];
            let v_blk = &self.v[(bkv * s_n + j0) * dv..][..keys * dv];
            let dk_blk = &mut dk[j0 * d..][..keys * d];
            let dv_blk = &mut dv_out[j0 * dv..][..keys * dv];
            for g in 0..group {
                let h = kvh * group + g;
                let dq_head = &mut dq[g * l_n * d..][..l_n * d];
                for i0 in (0..l_n).step_by(BLOCK_Q) {
                    let rows = (l_n - i0).min(BLOCK_Q);
                    if !self.block_visible(i0, rows, j0, keys) {
                        continue;
                    }
                    let blk = Block {
                        b,
                        h,
                        i0,
                        rows,
                        j0,
                        keys,
                    };
                    let dq_blk = &mut dq_head[i0 * d..][..rows * d];
                    self.block(&blk, (k_blk, v_blk), (dk_blk, dv_blk, dq_blk), &mut t);
                }
            }
        }
    }

    /// Whether any query of rows `i0..i0 + rows` may see a key of `j0..j0 + keys` under the
    /// causal and window rules (whose visible ranges only move right as the row grows).
    fn block_visible(&self, i0: usize, rows: usize, j0: usize, keys: usize) -> bool {
        let (causal, window, s_n) = (self.opt.causal, self.opt.window, self.sh.seq_kv);
        let (lo, _) = key_range(causal, window, self.offset, i0, s_n);
        let (_, hi) = key_range(causal, window, self.offset, i0 + rows - 1, s_n);
        lo < hi && lo < j0 + keys && hi > j0
    }

    /// One query block against one key block: adds to `dk`, `dv` (`[keys, …]`) and the
    /// unscaled `dq` (`[rows, head_dim]`).
    fn block(
        &self,
        blk: &Block,
        (k_blk, v_blk): (&[f32], &[f32]),
        (dk, dv_acc, dq): (&mut [f32], &mut [f32], &mut [f32]),
        t: &mut Tiles,
    ) {
        let sh = self.sh;
        let (d, dv) = (sh.head_dim, sh.value_dim);
        let Block {
            b,
            h,
            i0,
            rows,
            j0,
            keys,
        } = *blk;
        let row0 = (b * sh.n_heads + h) * sh.seq_q + i0;
        let q_blk = &self.q[row0 * d..][..rows * d];
        let do_blk = &self.dout[row0 * dv..][..rows * dv];
        let n = rows * keys;
        t.p.resize(n, 0.0);
        t.ds.resize(n, 0.0);

        // S = scale·Q·Kᵀ, then every rule of the forward pass, then P = e^(S − lse).
        gemm(
            view_mut(&mut t.p, rows, keys),
            (false, self.scale),
            view(q_blk, rows, d),
            view(k_blk, keys, d).transpose(),
        );
        if let Some(c) = self.opt.softcap {
            t.dcap.resize(n, 0.0);
            softcap(&mut t.p, &mut t.dcap, c);
        }
        for (r, row) in t.p.chunks_exact_mut(keys).enumerate() {
            let i = i0 + r;
            self.mask_row((b, h, i), j0, row);
            let lse = self.lse[row0 + r];
            if lse == f32::NEG_INFINITY {
                row.fill(0.0);
            } else {
                self.exp_sub(row, lse);
            }
        }

        // dP = dO·Vᵀ
        gemm(
            view_mut(&mut t.ds, rows, keys),
            (false, 1.0),
            view(do_blk, rows, dv),
            view(v_blk, keys, dv).transpose(),
        );
        let p_drop = match self.opt.dropout {
            Some(drop) => {
                t.z.resize(n, 0.0);
                t.pz.resize(n, 0.0);
                let kept = drop.scale();
                for (r, z_row) in t.z.chunks_exact_mut(keys).enumerate() {
                    for (j, z) in (j0..).zip(z_row.iter_mut()) {
                        *z = if drop.keep(b, h, i0 + r, j) {
                            kept
                        } else {
                            0.0
                        };
                    }
                }
                for ((pz, &p), (ds, &z)) in
                    (t.pz.iter_mut().zip(&t.p)).zip(t.ds.iter_mut().zip(&t.z))
                {
                    *pz = p * z;
                    *ds *= z;
                }
                &t.pz
            }
            None => &t.p,
        };
        // dV += (P∘Z)ᵀ·dO
        gemm(
            view_mut(dv_acc, keys, dv),
            (true, 1.0),
            view(p_drop, rows, keys).transpose(),
            view(do_blk, rows, dv),
        );
        // dS = P ∘ (dP − D) [∘ (1 − tanh²)]
        for (r, (ds, p)) in (t.ds.chunks_exact_mut(keys))
            .zip(t.p.chunks_exact(keys))
            .enumerate()
        {
            self.grad_scores(ds, p, self.delta[row0 + r]);
        }
        if self.opt.softcap.is_some() {
            t.ds.iter_mut().zip(&t.dcap).for_each(|(g, &c)| *g *= c);
        }
        // dK += dSᵀ·Q;  dQ += dS·K (both times the scale, once at the end)
        gemm(
            view_mut(dk, keys, d),
            (true, 1.0),
            view(&t.ds, rows, keys).transpose(),
            view(q_blk, rows, d),
        );
        gemm(
            view_mut(dq, rows, d),
            (true, 1.0),
            view(&t.ds, rows, keys),
            view(k_blk, keys, d),
        );
    }

    /// Steps 3–5 of the forward pass on the (soft-capped) scores of query `i` against keys
    /// `j0..`: ALiBi, float mask, and every visibility rule; hidden keys become `−∞`.
    fn mask_row(&self, (b, h, i): (usize, usize, usize), j0: usize, row: &mut [f32]) {
        let opt = self.opt;
        if self.extras {
            let float_mask = opt.float_mask.as_ref().map(|m| (m.data(), m.row(b, h, i)));
            let bool_mask = opt.bool_mask.as_ref().map(|m| (m.data(), m.row(b, h, i)));
            let padding = opt.key_padding.as_ref().map(|kp| kp.row(b));
            let slope = opt.alibi.as_ref().map(|s| s[h]);
            for (j, x) in (j0..).zip(row.iter_mut()) {
                if let Some(slope) = slope {
                    let dist = (i as isize + self.offset - j as isize).unsigned_abs();
                    *x -= slope * dist as f32;
                }
                if let Some((data, (off, stride))) = float_mask {
                    *x += data[off + j * stride];
                }
                let visible = bool_mask.is_none_or(|(data, (off, stride))| data[off + j * stride])
                    && padding.is_none_or(|real| real[j]);
                if !visible {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        let (lo, hi) = key_range(opt.causal, opt.window, self.offset, i, self.sh.seq_kv);
        let end = j0 + row.len();
        let (lo, hi) = (lo.clamp(j0, end) - j0, hi.clamp(j0, end) - j0);
        row[..lo].fill(f32::NEG_INFINITY);
        row[hi.max(lo)..].fill(f32::NEG_INFINITY);
    }

    /// `x = e^(x − m)`.
    fn exp_sub(&self, x: &mut [f32], m: f32) {
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: `simd` is only set when the CPU has AVX-512F (`Isa::best`).
            return unsafe { simd::exp_sub(x, m) };
        }
        exp_sub_body(x, m);
    }

    /// `dS = P ∘ (dP − D)` in place of `dP`.
    fn grad_scores(&self, dp: &mut [f32], p: &[f32], delta: f32) {
        #[cfg(target_arch = "x86_64")]
        if self.simd {
            // SAFETY: see `exp_sub`.
            return unsafe { simd::grad_scores(dp, p, delta) };
        }
        grad_scores_body(dp, p, delta);
    }
}

/// One query block against one key block of head `(b, h)`.
struct Block {
    b: usize,
    h: usize,
    i0: usize,
    rows: usize,
    j0: usize,
    keys: usize,
}

/// Soft-caps raw scores in place, `s ← c·tanh(s/c)`, keeping the derivative `1 − tanh²(s/c)`.
fn softcap(s: &mut [f32], dcap: &mut [f32], c: f32) {
    for (x, g) in s.iter_mut().zip(dcap.iter_mut()) {
        let t = (*x / c).tanh();
        *x = c * t;
        *g = 1.0 - t * t;
    }
}

/// `e^x` without a branch or a call, so loops over it vectorise: `e^x = 2^n · 2^f` with
/// `x·log₂e = n + f`, `|f| ≤ ½`, `2^f` from Cephes' `exp2f` polynomial
/// (<https://netlib.org/cephes/>, `exp2f.c`, relative error 1.7e-7), `2^n` built in the exponent
/// bits. Below `2^-126` (and for `−∞`) it returns 0.
#[inline(always)]
fn exp_approx(x: f32) -> f32 {
    // 1.5·2²³: adding it rounds to an integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let t = x * std::f32::consts::LOG2_E;
    let underflow = t < -126.0;
    let t = if underflow { -126.0 } else { t.min(127.0) };
    let big = t + ROUND;
    let n = big - ROUND;
    let f = t - n;
    let mut p = 1.535_336_2e-4f32;
    for c in [
        1.339_887_4e-3,
        9.618_437e-3,
        5.550_332_5e-2,
        2.402_264_8e-1,
        6.931_472e-1,
    ] {
        p = p * f + c;
    }
    let p = p * f + 1.0;
    let n_int = big.to_bits().wrapping_sub(ROUND.to_bits());
    let pow2 = f32::from_bits(n_int.wrapping_add(127) << 23);
    if underflow { 0.0 } else { p * pow2 }
}

#[inline(always)]
fn exp_sub_body(x: &mut [f32], m: f32) {
    x.iter_mut().for_each(|v| *v = exp_approx(*v - m));
}

#[inline(always)]
fn grad_scores_body(dp: &mut [f32], p: &[f32], delta: f32) {
    dp.iter_mut()
        .zip(p)
        .for_each(|(g, &p)| *g = p * (*g - delta));
}

/// The elementwise steps compiled for AVX-512: the same bodies, vectorised 16 lanes wide.
#[cfg(target_arch = "x86_64")]
mod simd {
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_sub(x: &mut [f32], m: f32) {
        super::exp_sub_body(x, m);
    }

    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn grad_scores(dp: &mut [f32], p: &[f32], delta: f32) {
        super::grad_scores_body(dp, p, delta);
    }
}

/// Gradients of `sum(out · dout)` computed the plain way: one query row at a time, with its
/// own softmax (no saved `out` or `lse`), every rule of `shared/golden/README.md` in order.
///
/// # Shapes
/// - `input.q`: `[batch, n_heads, seq_q, head_dim]`
/// - `input.k`: `[batch, n_kv_heads, seq_kv, head_dim]`
/// - `input.v`: `[batch, n_kv_heads, seq_kv, value_dim]`
/// - `dout`: `[batch, n_heads, seq_q, value_dim]`
/// - returns `dq`, `dk`, `dv` shaped like `q`, `k`, `v`.
///
/// # Errors
/// As [`sdpa_backward`].
pub fn sdpa_backward_reference(
    input: &AttnInput<'_>,
    options: &AttnOptions,
    dout: &[f32],
) -> Result<Grads, AttnError> {
    validate(input, options, None, dout)?;
    let sh = input.shape;
    let (s_n, d, dv) = (sh.seq_kv, sh.head_dim, sh.value_dim);
    let scale = options.scale_for(&sh);
    let offset = diagonal_offset(options.causal, sh.seq_q, s_n);
    let mut g = Grads {
        dq: vec![0.0; input.q.len()],
        dk: vec![0.0; input.k.len()],
        dv: vec![0.0; input.v.len()],
    };
    // Per key of one row: score, visibility, d(capped)/d(raw), P, dropout factor Z, dP.
    let (mut s, mut vis, mut dcap) = (vec![0.0f32; s_n], vec![false; s_n], vec![1.0f32; s_n]);
    let (mut p, mut z, mut dp) = (vec![0.0f32; s_n], vec![1.0f32; s_n], vec![0.0f32; s_n]);
    for b in 0..sh.batch {
        for h in 0..sh.n_heads {
            let kv = b * sh.n_kv_heads + sh.kv_head(h);
            for i in 0..sh.seq_q {
                let row = (b * sh.n_heads + h) * sh.seq_q + i;
                let q_row = &input.q[row * d..][..d];
                let do_row = &dout[row * dv..][..dv];
                let (lo, hi) = key_range(options.causal, options.window, offset, i, s_n);
                for j in 0..s_n {
                    let k_row = &input.k[(kv * s_n + j) * d..][..d];
                    let mut x = scale * dot(q_row, k_row);
                    if let Some(c) = options.softcap {
                        let t = (x / c).tanh();
                        x = c * t;
                        dcap[j] = 1.0 - t * t;
                    }
                    if let Some(slopes) = &options.alibi {
                        let dist = (i as isize + offset - j as isize).unsigned_abs();
                        x -= slopes[h] * dist as f32;
                    }
                    if let Some(m) = &options.float_mask {
                        x += m.at(b, h, i, j);
                    }
                    s[j] = x;
                    vis[j] = j >= lo
                        && j < hi
                        && options.bool_mask.as_ref().is_none_or(|m| m.at(b, h, i, j))
                        && (options.key_padding.as_ref()).is_none_or(|kp| kp.is_real(b, j));
                    z[j] = match options.dropout {
                        Some(drop) if drop.keep(b, h, i, j) => drop.scale(),
                        Some(_) => 0.0,
                        None => 1.0,
                    };
                }
                let max = (0..s_n)
                    .filter(|&j| vis[j])
                    .map(|j| s[j])
                    .fold(f32::NEG_INFINITY, f32::max);
                if max == f32::NEG_INFINITY {
                    continue; // nothing visible: the output is 0 whatever the inputs
                }
                let sum: f32 = (0..s_n)
                    .filter(|&j| vis[j])
                    .map(|j| (s[j] - max).exp())
                    .sum();
                for j in 0..s_n {
                    p[j] = if vis[j] {
                        (s[j] - max).exp() / sum
                    } else {
                        0.0
                    };
                    // out = Σ_j P_j·Z_j·v_j, so ∂/∂P_j = Z_j·(dout·v_j)
                    dp[j] = z[j] * dot(do_row, &input.v[(kv * s_n + j) * dv..][..dv]);
                }
                // Softmax backward: dS_j = P_j·(dP_j − Σ_k P_k·dP_k)
                let delta: f32 = (0..s_n).map(|j| p[j] * dp[j]).sum();
                for j in 0..s_n {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let ds = p[j] * (dp[j] - delta) * dcap[j] * scale;
                    let k_at = (kv * s_n + j) * d;
                    let k_row = &input.k[k_at..][..d];
                    for (dq, &kx) in g.dq[row * d..][..d].iter_mut().zip(k_row) {
                        *dq += ds * kx;
                    }
                    for (dk, &qx) in g.dk[k_at..][..d].iter_mut().zip(q_row) {
                        *dk += ds * qx;
                    }
                    let w = p[j] * z[j];
                    for (dvx, &o) in g.dv[(kv * s_n + j) * dv..][..dv].iter_mut().zip(do_row) {
                        *dvx += w * o;
                    }
                }
            }
        }
    }
    Ok(g)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_approx_matches_exp() {
        // The polynomial's own error is 1.7e-7 relative, rounding adds a few ulps, and
        // rounding t = x·log₂e to f32 moves 2^t by up to |t|·2⁻²⁴·ln 2 < 1e-7·|x| relative
        // (large |x| only arise for probabilities far below any that matter).
        for i in -2000..=200 {
            let x = i as f32 * 0.05;
            let (got, want) = (exp_approx(x), x.exp());
            // Below 2^-126 the result may flush to 0.
            let tol = (4e-7 + 1e-7 * x.abs()) * want + f32::MIN_POSITIVE;
            assert!((got - want).abs() <= tol, "e^{x}: got {got}, want {want}");
        }
        assert_eq!(exp_approx(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_approx(-100.0), 0.0);
    }
}
