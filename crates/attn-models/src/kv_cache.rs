//! Incremental decoding (GPT-2 and the Llama-style decoders): a per-layer key/value cache that grows as tokens are fed, so
//! each new token costs one row per layer instead of a pass over the whole sequence.
//!
//! Each layer's keys and values live in one buffer allocated when the cache is made,
//! `[n_heads, capacity, head_dim]`, that new rows are written into in place: a step copies only
//! its own rows, never the cache, so a whole generation moves O(T) cached values, not O(T²).
//! Attention runs once per head on that head's filled rows, `[seq_kv, head_dim]`, which are
//! contiguous in this layout.
//!
//! A step that feeds one token multiplies one row by every weight matrix: `matvec` streams
//! each weight once from memory, split over the threads, where a general GEMM would spend most
//! of its time packing the weight for a single row. Feeding several tokens (the prompt) goes
//! through the model's GEMMs.
//!
//! New tokens attend to every cached token and to each other with a bottom-right aligned
//! causal mask ([`Causal::BottomRight`]): the last query sees every key, as in transformers'
//! `GPT2Attention` with `layer_past`
//! (<https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/models/gpt2/modeling_gpt2.py>).
//! The numbers are those of the full masked pass ([`Model::forward`]) up to floating-point
//! summation order.

use attn_core::{AttnError, AttnInput, AttnOptions, AttnShape, Causal, WeightsRequest, Window};
use rayon::prelude::*;

use crate::block::Buffers;
use crate::checkpoint::WeightData;
use crate::model::{FINAL_HIDDEN_STATE, Rotation, parallelism};
use crate::ops::{Epilogue, Gemm, Linear, WeightLayout, gemm_bt_weight};
use crate::{DecoderConfig, Model, ModelError, ModelKind};

/// Keys and values of every layer of one model for the tokens fed so far.
#[derive(Debug, Clone)]
pub struct KvCache<'m> {
    model: &'m Model,
    /// The most tokens the cache holds: its buffers' row count.
    capacity: usize,
    len: usize,
    /// Per layer: `[n_kv_heads, capacity, head_dim]`; rows `..len` of each head are filled.
    keys: Vec<Vec<f32>>,
    /// Per layer: `[n_kv_heads, capacity, head_dim]`; rows `..len` of each head are filled.
    values: Vec<Vec<f32>>,
}

/// What one [`KvCache::feed`] call returns for the tokens it fed.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// `[new, vocab]`: the next-token logits after each fed token.
    pub logits: Vec<f32>,
    /// `[new, cache_len]`: the last layer's attention of each fed token, averaged over the
    /// heads (`cache_len` counts the fed tokens too). Present when asked for.
    pub last_layer_attention: Option<Vec<f32>>,
}

/// [`ModelError::NotADecoder`] unless `model` is a decoder (GPT-2 or a Llama-style one).
pub(crate) fn check_decoder(model: &Model) -> Result<(), ModelError> {
    match model.kind() {
        ModelKind::Gpt2 | ModelKind::Llama => Ok(()),
        ModelKind::Bert => Err(ModelError::NotADecoder {
            model: model.name().to_string(),
            model_type: model.config().model_type.clone(),
        }),
    }
}

impl<'m> KvCache<'m> {
    /// An empty cache for `model`, which must be a decoder (GPT-2, Llama, Mistral, Qwen2,
    /// Qwen3), with room for all of its `max_position_embeddings` tokens.
    pub fn new(model: &'m Model) -> Result<KvCache<'m>, ModelError> {
        KvCache::with_capacity(model, model.max_positions())
    }

    /// An empty cache for `model` with room for `capacity` tokens (allocated now, for every
    /// layer: `2 · capacity · hidden` values each).
    ///
    /// Errors: a model that is not a decoder ([`ModelError::NotADecoder`]), or a
    /// capacity above the model's `n_positions` ([`ModelError::CacheFull`]).
    pub fn with_capacity(model: &'m Model, capacity: usize) -> Result<KvCache<'m>, ModelError> {
        check_decoder(model)?;
        let c = model.config();
        if capacity > c.max_positions {
            return Err(ModelError::CacheFull {
                needed: capacity,
                capacity: c.max_positions,
                n_positions: c.max_positions,
            });
        }
        let per_layer = capacity * c.n_kv_heads() * c.head_dim();
        Ok(KvCache {
            model,
            capacity,
            len: 0,
            keys: vec![vec![0.0; per_layer]; c.n_layers],
            values: vec![vec![0.0; per_layer]; c.n_layers],
        })
    }

    /// How many tokens the cache holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Runs `ids` through the model after the cached tokens (at positions
    /// `len..len + ids.len()`) and appends their keys and values. Feeding the prompt at once and
    /// then one token at a time gives the logits of the full pass over the whole sequence.
    /// `attention` asks for the last layer's head-averaged attention of the fed tokens.
    ///
    /// Errors: no ids, an id outside the vocabulary, more tokens than the cache's capacity
    /// ([`ModelError::CacheFull`]), or weights that make the hidden state NaN or infinite
    /// ([`ModelError::NonFinite`]); the cache is unchanged on error.
    ///
    /// # Shapes
    /// - `ids`: `[new]`; see [`Step`]
    pub fn feed(&mut self, ids: &[u32], attention: bool) -> Result<Step, ModelError> {
        self.feed_rows(ids, attention, true)
    }

    /// [`KvCache::feed`] returning the logits after the last fed token only (`[1, vocab]`):
    /// all a generation reads of a prompt, without a prompt's every row of the head (a third
    /// of a 512-token prefill of a model with Qwen2's 151,936-token vocabulary).
    pub fn feed_last(&mut self, ids: &[u32], attention: bool) -> Result<Step, ModelError> {
        self.feed_rows(ids, attention, false)
    }

    /// [`KvCache::feed`], with the logits of every fed token or (`every` false) the last.
    fn feed_rows(&mut self, ids: &[u32], attention: bool, every: bool) -> Result<Step, ModelError> {
        let model = self.model;
        let c = model.config();
        let (h, n_heads, d) = (c.hidden_size, c.n_heads, c.head_dim());
        let n_kv = c.n_kv_heads();
        if ids.is_empty() {
            return Err(ModelError::NoTokens);
        }
        let (past, new) = (self.len, ids.len());
        let total = past + new;
        if total > self.capacity {
            return Err(ModelError::CacheFull {
                needed: total,
                capacity: self.capacity,
                n_positions: c.max_positions,
            });
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfVocab {
                id,
                vocab_size: c.vocab_size,
            });
        }

        let weights = model.weights();
        let par = parallelism();
        let mut hidden = vec![0.0f32; new * h];
        for (t, (&id, row)) in ids.iter().zip(hidden.chunks_exact_mut(h)).enumerate() {
            let word = weights.word_embeddings.row(id as usize, h);
            model.embedding_row((&word, 1.0), past + t, 0, row);
        }
        let mut normed = vec![0.0f32; new * h];
        let mut qkv = vec![0.0f32; new * c.qkv_width()];
        let mut q = vec![0.0f32; new * c.q_width()];
        let mut context = vec![0.0f32; new * c.q_width()];
        let mut sublayer = vec![0.0f32; new * h];
        let mut intermediate = vec![0.0f32; new * c.ff_width()];
        let n_layers = weights.layers.len();
        let mut last_layer_attention = None;

        // One fed token multiplies one row: each weight is streamed once (`matvec`).
        let gemm = Gemm {
            par,
            kernel: self.model.gemm_kernel(),
        };
        let multiply = |layer: &Linear, x: &[f32], y: &mut [f32], epilogue: Epilogue| {
            if new == 1 {
                matvec(layer, x, y);
                epilogue.apply(y, &layer.bias, 0..layer.n_out);
            } else {
                layer.forward(x, y, epilogue, gemm);
            }
        };
        for (l, layer) in weights.layers.iter().enumerate() {
            let (keys, values) = (&mut self.keys[l], &mut self.values[l]);
            let want_weights = attention && l + 1 == n_layers;
            let last = &mut last_layer_attention;
            let q = &mut q;
            let attend = |qkv: &[f32], context: &mut [f32]| {
                let kv = [&mut keys[..], &mut values[..]];
                scatter_qkv(qkv, (new, (n_heads, n_kv), d), q, kv, (past, self.capacity));
                if let Some((q_norm, k_norm)) = &layer.qk_norm {
                    q_norm.apply(q);
                    for head in keys.chunks_exact_mut(self.capacity * d) {
                        k_norm.apply(&mut head[past * d..total * d]);
                    }
                }
                if let Some(dec) = &c.decoder {
                    let rotation = Rotation::new(&dec.inv_freq, d, past, new);
                    for head in q.chunks_exact_mut(new * d) {
                        rotation.apply(head);
                    }
                    for head in keys.chunks_exact_mut(self.capacity * d) {
                        rotation.apply(&mut head[past * d..total * d]);
                    }
                }
                let window = c.decoder.as_ref().and_then(|dec| dec.window(l));
                let attended = attend_per_head(
                    q,
                    (keys, values),
                    (new, total, self.capacity),
                    (l, n_heads, n_kv, d),
                    (window, c.decoder.as_ref()),
                    want_weights,
                )?;
                for (head, (out, _)) in attended.iter().enumerate() {
                    for (dst, src) in
                        (context.chunks_exact_mut(n_heads * d)).zip(out.chunks_exact(d))
                    {
                        dst[head * d..][..d].copy_from_slice(src);
                    }
                }
                if want_weights {
                    *last = Some(head_average(&attended, new * total));
                }
                Ok(())
            };
            let buffers = Buffers {
                normed: &mut normed,
                qkv: &mut qkv,
                context: &mut context,
                sublayer: &mut sublayer,
                intermediate: &mut intermediate,
            };
            let kind = (c.kind(), c.activation);
            layer.forward(kind, &mut hidden, buffers, &multiply, attend)?;
        }
        if let Some(norm) = &weights.final_norm {
            norm.apply(&mut hidden);
        }
        if let Some(index) = hidden.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::NonFinite {
                state: FINAL_HIDDEN_STATE,
                text: 0,
                token: past + index / h,
                value: hidden[index],
            });
        }
        let rows = if every { new } else { 1 };
        let mut logits = vec![0.0f32; rows * c.vocab_size];
        let head = weights.lm_head();
        let hidden = &hidden[(new - rows) * h..];
        if rows == 1 {
            dot_rows_weight(head, hidden, &mut logits);
        } else {
            gemm_bt_weight(hidden, rows, h, head, c.vocab_size, &mut logits, par);
        }
        crate::model::softcap_logits(c, &mut logits);
        crate::model::check_logits(&logits, c.vocab_size).map_err(|e| match e {
            // Counted from the first fed token, as `feed` counts them.
            ModelError::NonFiniteLogit {
                position,
                token,
                value,
            } => ModelError::NonFiniteLogit {
                position: position + new - rows,
                token,
                value,
            },
            e => e,
        })?;

        // Only now do the rows written past `len` count: an error above left them unread.
        self.len = total;
        Ok(Step {
            logits,
            last_layer_attention,
        })
    }
}

/// Splits `qkv` (`[new, (n_heads + 2·n_kv_heads)·head_dim]`: q | k | v, each head's `head_dim`
/// values side by side) into the queries `q` (`[n_heads, new, head_dim]`) and rows
/// `past..past + new` of each head of the cache buffers `kv` (keys, values: `[n_kv_heads,
/// capacity, head_dim]` each).
fn scatter_qkv(
    qkv: &[f32],
    (new, (n_heads, n_kv), d): (usize, (usize, usize), usize),
    q: &mut [f32],
    kv: [&mut [f32]; 2],
    (past, capacity): (usize, usize),
) {
    let (h, kv_width) = (n_heads * d, n_kv * d);
    for (part, dst) in [q].into_iter().chain(kv).enumerate() {
        // Queries hold `new` rows per head, the cache `capacity` rows from row `past`.
        let (rows, first, start, width) = match part {
            0 => (new, 0, 0, h),
            _ => (capacity, past, h + (part - 1) * kv_width, kv_width),
        };
        for (t, row) in qkv.chunks_exact(h + 2 * kv_width).enumerate() {
            for (head, vals) in row[start..][..width].chunks_exact(d).enumerate() {
                dst[(head * rows + first + t) * d..][..d].copy_from_slice(vals);
            }
        }
    }
}

/// One head's attention output, `[new, head_dim]`, and its weights `[new, seq_kv]` when asked.
type HeadResult = (Vec<f32>, Option<Vec<f32>>);

/// Attention of the fed tokens' queries against the first `seq_kv` cached rows of each head, one
/// call per query head (the heads in parallel, each reading its key/value head): bottom-right
/// causal, so fed token `t` sees the cached tokens and the fed tokens up to itself (within
/// `window` tokens when there is one).
///
/// # Shapes
/// - `q`: `[n_heads, new, head_dim]`
/// - `kv`: keys, values `[n_kv_heads, capacity, head_dim]`, rows `..seq_kv` of each head filled
/// - returns per head `[new, head_dim]` and, when `weights`, `[new, seq_kv]`
///
/// An attention error names `layer` and the head.
fn attend_per_head(
    q: &[f32],
    (keys, values): (&[f32], &[f32]),
    (new, seq_kv, capacity): (usize, usize, usize),
    (layer, n_heads, n_kv, d): (usize, usize, usize, usize),
    (window, decoder): (Option<usize>, Option<&DecoderConfig>),
    weights: bool,
) -> Result<Vec<HeadResult>, ModelError> {
    let options = AttnOptions {
        causal: Some(Causal::BottomRight),
        scale: decoder.and_then(|dec| dec.scale),
        softcap: decoder.and_then(|dec| dec.softcap),
        window: window.map(|w| Window {
            left: Some(w - 1),
            right: None,
        }),
        weights: if weights {
            WeightsRequest::All
        } else {
            WeightsRequest::None
        },
        ..AttnOptions::default()
    };
    let shape = AttnShape::new(1, 1, new, seq_kv, d);
    (0..n_heads)
        .into_par_iter()
        .map(|head| {
            let (at, len) = (head / (n_heads / n_kv) * capacity * d, seq_kv * d);
            let (k, v) = (&keys[at..][..len], &values[at..][..len]);
            // Unchecked: scanning the whole cache for NaN at every step would cost more than
            // the attention itself; `feed` checks the final hidden state, which any non-finite
            // value reaches.
            let input =
                AttnInput::allowing_non_finite(&q[head * new * d..][..new * d], k, v, shape)?;
            let out = attn_core::sdpa(&input, &options).map_err(|error| {
                // Each call holds one head, and the fed tokens' queries after the cached ones:
                // its errors say head 0 and count rows from the first fed token.
                let error = match error {
                    AttnError::ScoreOverflow { batch, row, .. } => AttnError::ScoreOverflow {
                        batch,
                        head,
                        row: row + seq_kv - new,
                    },
                    other => other,
                };
                ModelError::Attention {
                    layer: Some(layer),
                    error,
                }
            })?;
            Ok((out.out, out.weights.map(|w| w.data().to_vec())))
        })
        .collect()
}

/// The heads' weights (each `[len]`) averaged, summed in head order as
/// [`WeightsRequest::HeadAverage`] does.
fn head_average(heads: &[HeadResult], len: usize) -> Vec<f32> {
    let mut avg = vec![0.0f32; len];
    let share = 1.0 / heads.len() as f32;
    for w in heads.iter().filter_map(|(_, w)| w.as_deref()) {
        avg.iter_mut().zip(w).for_each(|(a, &x)| *a += x * share);
    }
    avg
}

/// Rows of an `[n_out, n_in]` weight per parallel task of [`dot_rows`] (256 rows of GPT-2's
/// 768-wide head are 768 KiB: enough to amortise the task, and 200 tasks balance the threads).
const DOT_ROWS_PER_TASK: usize = 256;

/// `y = x·W` for one row: `W` is `linear`'s parts side by side along the output, each streamed
/// once from memory.
///
/// # Shapes
/// - `x`: `[n_in]`, `y`: `[n_out]`
pub(crate) fn matvec(linear: &Linear, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!((x.len(), y.len()), (linear.n_in, linear.n_out));
    let mut col = 0;
    for part in &linear.parts {
        let y = &mut y[col..col + part.n_out];
        match part.layout {
            WeightLayout::InOut => axpy_rows(&part.data.to_f32(), x, y),
            WeightLayout::OutIn => dot_rows_weight(&part.data, x, y),
        }
        col += part.n_out;
    }
}

/// `y = Σᵢ x[i]·W[i, :]` for a row-major `W` `[n_in, n_out]`: each thread sums a contiguous
/// band of rows into its own partial `y`, and the partials are added.
///
/// # Shapes
/// - `w`: `[x.len(), y.len()]`, `x`: `[n_in]`, `y`: `[n_out]`
fn axpy_rows(w: &[f32], x: &[f32], y: &mut [f32]) {
    let n_out = y.len();
    let band = x.len().div_ceil(rayon::current_num_threads()).max(1);
    let sum = w
        .par_chunks(band * n_out)
        .zip(x.par_chunks(band))
        .map(|(w, x)| {
            let mut acc = vec![0.0f32; n_out];
            axpy_band(&mut acc, w, x);
            acc
        })
        .reduce_with(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
            a
        });
    match sum {
        Some(sum) => y.copy_from_slice(&sum),
        None => y.fill(0.0),
    }
}

/// [`dot_rows`] for `W` in its stored dtype: each task widens its band of 16-bit rows first.
///
/// # Shapes
/// - `w`: `[y.len(), x.len()]`, `x`: `[n_in]`, `y`: `[n_out]`
pub(crate) fn dot_rows_weight(w: &WeightData, x: &[f32], y: &mut [f32]) {
    if let Some(w) = w.f32() {
        return dot_rows(w, x, y);
    }
    let n_in = x.len().max(1);
    y.par_chunks_mut(DOT_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, y)| {
            let mut band = vec![0.0f32; y.len() * n_in];
            w.widen(task * DOT_ROWS_PER_TASK * n_in, &mut band);
            dot_band(y, &band, x);
        });
}

/// `y = x·W` for a few rows `xs` (`[rows, n_in]` → `ys` `[rows, n_out]`): each thread's band
/// of an `[n_out, n_in]` part is read from memory once, then from cache for the other rows (a
/// beam search's beams cost one row's traffic, not one per beam); other layouts row by row.
pub(crate) fn matvec_rows(linear: &Linear, xs: &[f32], ys: &mut [f32]) {
    let (n_in, n_out) = (linear.n_in, linear.n_out);
    let rows = xs.len() / n_in.max(1);
    let mut col = 0;
    for part in &linear.parts {
        match (part.layout, part.data.f32()) {
            (WeightLayout::OutIn, Some(w)) => {
                let mut band = vec![0.0f32; rows * part.n_out];
                dot_rows_multi(w, n_in, xs, &mut band);
                for (y, b) in ys
                    .chunks_exact_mut(n_out)
                    .zip(band.chunks_exact(part.n_out))
                {
                    y[col..col + part.n_out].copy_from_slice(b);
                }
            }
            _ => {
                for (x, y) in xs.chunks_exact(n_in).zip(ys.chunks_exact_mut(n_out)) {
                    let y = &mut y[col..col + part.n_out];
                    match part.layout {
                        WeightLayout::InOut => axpy_rows(&part.data.to_f32(), x, y),
                        WeightLayout::OutIn => dot_rows_weight(&part.data, x, y),
                    }
                }
            }
        }
        col += part.n_out;
    }
}

/// `ys[r][j] = W[j, :]·xs[r]` for a row-major `W` `[n_out, n_in]` and a few rows `xs`, each
/// band of `W` read once for all of them.
///
/// # Shapes
/// - `w`: `[n_out, n_in]`, `xs`: `[rows, n_in]`, `ys`: `[rows, n_out]`
pub(crate) fn dot_rows_multi(w: &[f32], n_in: usize, xs: &[f32], ys: &mut [f32]) {
    let n_in = n_in.max(1);
    let (rows, n_out) = (xs.len() / n_in, w.len() / n_in);
    // Transposed, `[n_out, rows]`, so that each task writes one contiguous band.
    let mut yt = vec![0.0f32; n_out * rows];
    yt.par_chunks_mut(DOT_ROWS_PER_TASK * rows)
        .zip(w.par_chunks(DOT_ROWS_PER_TASK * n_in))
        .for_each(|(yt, w)| {
            let mut y = vec![0.0f32; w.len() / n_in];
            for (r, x) in xs.chunks_exact(n_in).enumerate() {
                dot_band(&mut y, w, x);
                for (j, &v) in y.iter().enumerate() {
                    yt[j * rows + r] = v;
                }
            }
        });
    for (j, t) in yt.chunks_exact(rows.max(1)).enumerate() {
        for (r, &v) in t.iter().enumerate() {
            ys[r * n_out + j] = v;
        }
    }
}

/// `y[j] = W[j, :]·x` for a row-major `W` `[n_out, n_in]`, rows split over the threads.
///
/// # Shapes
/// - `w`: `[y.len(), x.len()]`, `x`: `[n_in]`, `y`: `[n_out]`
fn dot_rows(w: &[f32], x: &[f32], y: &mut [f32]) {
    let n_in = x.len().max(1);
    y.par_chunks_mut(DOT_ROWS_PER_TASK)
        .zip(w.par_chunks(DOT_ROWS_PER_TASK * n_in))
        .for_each(|(y, w)| dot_band(y, w, x));
}

/// Whether this CPU runs the AVX-512 builds of the matrix-vector loops.
fn has_avx512() -> bool {
    attn_core::Isa::best().avx512()
}

/// `acc += Σᵢ x[i]·W[i, :]`, on the widest vectors of this CPU.
///
/// # Shapes
/// - `acc`: `[n_out]`, `w`: `[x.len(), n_out]`, `x`: `[rows]`
fn axpy_band(acc: &mut [f32], w: &[f32], x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { axpy_band_avx512(acc, w, x) };
    }
    axpy_band_body(acc, w, x);
}

/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_band_avx512(acc: &mut [f32], w: &[f32], x: &[f32]) {
    axpy_band_body(acc, w, x);
}

/// The loop of [`axpy_band`] (inlined so each ISA build gets its own vector width).
#[inline(always)]
fn axpy_band_body(acc: &mut [f32], w: &[f32], x: &[f32]) {
    for (&xi, row) in x.iter().zip(w.chunks_exact(acc.len())) {
        acc.iter_mut().zip(row).for_each(|(a, &wv)| *a += xi * wv);
    }
}

/// `y[j] = W[j, :]·x`, on the widest vectors of this CPU.
///
/// # Shapes
/// - `y`: `[rows]`, `w`: `[rows, x.len()]`, `x`: `[n_in]`
fn dot_band(y: &mut [f32], w: &[f32], x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has AVX-512F, checked just above.
        return unsafe { dot_band_avx512(y, w, x) };
    }
    dot_band_body(y, w, x);
}

/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_band_avx512(y: &mut [f32], w: &[f32], x: &[f32]) {
    dot_band_body(y, w, x);
}

/// The loop of [`dot_band`]: each row's dot product with 32 independent partial sums, which
/// the compiler keeps in vector registers (inlined so each ISA build gets its own width).
#[inline(always)]
fn dot_band_body(y: &mut [f32], w: &[f32], x: &[f32]) {
    const LANES: usize = 32;
    for (out, row) in y.iter_mut().zip(w.chunks_exact(x.len().max(1))) {
        let mut acc = [0.0f32; LANES];
        let (a, b) = (row.chunks_exact(LANES), x.chunks_exact(LANES));
        let tail: f32 = a
            .remainder()
            .iter()
            .zip(b.remainder())
            .map(|(p, q)| p * q)
            .sum();
        for (a, b) in a.zip(b) {
            for ((s, p), q) in acc.iter_mut().zip(a).zip(b) {
                *s += p * q;
            }
        }
        *out = acc.iter().sum::<f32>() + tail;
    }
}
