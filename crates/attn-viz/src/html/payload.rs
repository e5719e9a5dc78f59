//! The data the explorer page receives, and how it is packed small enough for 512-token inputs.
//!
//! Weights are quantised to 3 decimals (integers 0..=1000) and written as LEB128 varints of
//! tokens — `2v` for a weight of v thousandths (v > 0), `2r + 1` for a run of r zeros — then
//! zlib-compressed and base64-encoded. Queries and keys for the neuron view are IEEE half
//! floats, zlib-compressed and base64-encoded, for as many layers as a byte budget allows.
//! The page unpacks both with the browser's own `DecompressionStream("deflate")`, so nothing
//! but the page itself is needed.
//!
//! Size: 3-decimal weights carry about 2.2 bits each on real text (order-0 entropy measured on
//! MiniLM at 512 tokens: 18.9 M weights, 6 MB packed), more than a 5 MB file can hold. When a
//! size budget is set and the exact weights would exceed it, the smallest weights are stored as
//! 0: the payload's `weight_floor` (in thousandths) says below which (0.003 on that input);
//! every weight at or above it is still exact to 3 decimals. Such weights are invisible in
//! every view (a line's opacity is its weight).
//!
//! The attention rollout ([`crate::select::rollout`], `[T, T]`) and every layer's and head's
//! weights averaged are packed the same way, always exact to 3 decimals, for the heatmap, and
//! so is each [`Measure`] (norms, ALTI, attention × gradient, flow), its rows as shares of
//! their sums.

use std::io::Write;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use flate2::Compression;
use flate2::write::ZlibEncoder;
use serde::Serialize;

use crate::select::{Selection, rollout, select};
use crate::stats::sees_only_earlier_keys;
use crate::words::token_label;
use crate::{AttentionMaps, VizError};

/// Weights are sent as `round(weight * WEIGHT_SCALE)`: 3 decimals.
pub const WEIGHT_SCALE: u16 = 1000;

/// Version of the payload layout; the page refuses any other.
pub const FORMAT: u32 = 5;

/// Queries and keys after projection, for the neuron view.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryKeys {
    pub head_dim: usize,
    /// The factor applied to q·k before the softmax (1/√head_dim for BERT and GPT-2).
    pub scale: f32,
    /// True when query i sees only keys j ≤ i (GPT-2); false when it sees every key (BERT).
    pub causal: bool,
    /// `[n_layers, n_heads, T, head_dim]`
    pub q: Vec<f32>,
    /// `[n_layers, n_heads, T, head_dim]`
    pub k: Vec<f32>,
}

/// A measure of what each token contributes, other than raw weights (`attnscope attribute`'s
/// matrices), for the heatmap's Method select.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    /// The method as the command line names it (`norm`, `alti`, …).
    pub name: String,
    /// What the page calls it.
    pub label: String,
    /// How many `[T, T]` matrices `values` holds: one per layer (the layer select picks one),
    /// or 1.
    pub layers: usize,
    /// `[layers, T, T]`, finite and not negative; row i says how much each token j gives to
    /// token i. The page shows each row as shares of its sum.
    pub values: Vec<f32>,
}

/// What goes into the page besides the attention itself.
#[derive(Debug, Clone, PartialEq)]
pub struct PageOptions {
    /// The neuron view's first layer: its queries and keys are always included.
    pub neuron_layer: Option<usize>,
    /// How many bytes of packed queries and keys (before compression) may be included; layers
    /// after the first are added, nearest first, while they fit.
    pub qk_budget_bytes: usize,
    /// Largest payload (bytes of JSON) wanted; weights below a floor are stored as 0 when that
    /// is what it takes (see the module docs). `None`: always exact.
    pub size_budget_bytes: Option<usize>,
}

impl Default for PageOptions {
    /// Budgets for a file under 5 MB at 512 tokens: queries and keys of one MiniLM layer
    /// (12 heads × 512 tokens × 32 dims × 2 tensors × 2 bytes = 786 KB), 4.5 MB in all.
    fn default() -> Self {
        Self {
            neuron_layer: None,
            qk_budget_bytes: 1 << 20,
            size_budget_bytes: Some(4_500_000),
        }
    }
}

#[derive(Serialize)]
struct Payload<'a> {
    format: u32,
    model: &'a str,
    text: &'a str,
    pair: Option<&'a str>,
    tokens: Vec<PayloadToken>,
    /// `[n_layers, n_heads, T, T]`.
    #[serde(flatten)]
    packed: PackedWeights,
    /// Attention rollout ([`crate::select::rollout`]), packed `[T, T]`, exact to 3 decimals.
    rollout: String,
    measures: Vec<PayloadMeasure>,
    neuron: Option<Neuron>,
}

/// One kind's weights as the page reads them: their shape, their packed values and what the
/// packing hid, and every layer's and head's average.
#[derive(Serialize)]
struct PackedWeights {
    n_layers: usize,
    n_heads: usize,
    /// Every head gives each query's later keys exactly 0 ([`sees_only_earlier_keys`]): the
    /// heatmap greys those cells and the empty A → B view says why.
    causal: bool,
    weight_scale: u16,
    /// Weights below this many thousandths are stored as 0 (0: every weight is exact).
    weight_floor: u16,
    /// The share of a row's attention that weights stored as 0 hide (below the floor, or
    /// under half a thousandth, which rounds to 0), on average over the rows and at most.
    zero_hidden_mean: f32,
    zero_hidden_max: f32,
    /// Packed `[n_layers, n_heads, queries, keys]`.
    weights: String,
    /// Every layer's and head's weights averaged, packed `[queries, keys]`, exact to 3
    /// decimals (the mean of the 3-decimal weights was up to 0.001 off).
    all_layers: String,
}

impl PackedWeights {
    /// The weights of `maps`' shape before they are packed ([`PackedWeights::pack`]), with
    /// their average `all_layers` (`[queries, keys]`).
    fn unpacked(maps: &AttentionMaps, causal: bool, all_layers: &[f32]) -> Result<Self, VizError> {
        Ok(PackedWeights {
            n_layers: maps.n_layers,
            n_heads: maps.n_heads,
            causal,
            weight_scale: WEIGHT_SCALE,
            weight_floor: 0,
            zero_hidden_mean: 0.0,
            zero_hidden_max: 0.0,
            weights: String::new(),
            all_layers: pack_floored(&quantise(all_layers), 0)?,
        })
    }

    /// Packs `quantised`, the weights `exact` rounded (`[n_layers, n_heads, queries, keys]`),
    /// in at most `budget` bytes where one is given, and says what its zeros hide.
    fn pack(
        &mut self,
        (exact, quantised): (&[f32], &[u16]),
        (queries, keys): (usize, usize),
        budget: Option<usize>,
    ) -> Result<(), VizError> {
        (self.weight_floor, self.weights) = pack_weights(quantised, queries * keys, budget)?;
        (self.zero_hidden_mean, self.zero_hidden_max) =
            hidden_by_zeros(exact, quantised, keys, self.weight_floor);
        Ok(())
    }
}

#[derive(Serialize)]
struct PayloadMeasure {
    name: String,
    label: String,
    layers: usize,
    /// Packed `[layers, T, T]`, each row as shares of its sum, exact to 3 decimals.
    matrix: String,
}

#[derive(Serialize)]
struct PayloadToken {
    /// The token as a person reads it ([`token_label`]).
    label: String,
    segment: usize,
    special: bool,
}

#[derive(Serialize)]
struct Neuron {
    head_dim: usize,
    scale: f32,
    causal: bool,
    /// The layers whose queries and keys are included, in the order they are packed.
    layers: Vec<usize>,
    /// Packed half floats, `[layers.len(), n_heads, T, head_dim]`.
    q: String,
    /// Packed half floats, `[layers.len(), n_heads, T, head_dim]`.
    k: String,
}

/// The JSON the page renders: tokens, packed weights, the measures and, when given, packed
/// queries and keys.
///
/// # Shapes
/// - `maps.weights`: `[n_layers, n_heads, T, T]`
/// - `qk.q`, `qk.k`: `[n_layers, n_heads, T, head_dim]`
/// - each `measures[m].values`: `[measures[m].layers, T, T]`
pub fn payload_json(
    maps: &AttentionMaps,
    qk: Option<&QueryKeys>,
    measures: &[Measure],
    options: &PageOptions,
) -> Result<String, VizError> {
    maps.validate()?;
    let n_tokens = maps.seq_len();
    let neuron = match qk {
        Some(qk) => Some(pack_neuron(maps, n_tokens, qk, options)?),
        None => None,
    };
    let mut payload = Payload {
        format: FORMAT,
        model: &maps.model,
        text: &maps.text,
        pair: maps.pair.as_deref(),
        tokens: (maps.tokens.iter().enumerate())
            .map(|(i, t)| {
                Ok(PayloadToken {
                    label: token_label(maps, i)?,
                    segment: t.segment,
                    special: t.special,
                })
            })
            .collect::<Result<_, VizError>>()?,
        packed: PackedWeights::unpacked(
            maps,
            maps.seq_len() > 1 && sees_only_earlier_keys(maps),
            &select(maps, Selection::All)?,
        )?,
        rollout: pack_floored(&quantise(&rollout(maps)?), 0)?,
        measures: (measures.iter())
            .map(|m| pack_measure(m, n_tokens))
            .collect::<Result<_, _>>()?,
        neuron,
    };
    let quantised = quantise(&maps.weights);
    let rest = to_json(&payload)?.len();
    let weights_budget = options
        .size_budget_bytes
        .map(|budget| budget.saturating_sub(rest));
    (payload.packed).pack(
        (&maps.weights, &quantised),
        (n_tokens, n_tokens),
        weights_budget,
    )?;
    to_json(&payload)
}

fn to_json(payload: &impl Serialize) -> Result<String, VizError> {
    serde_json::to_string(payload).map_err(|source| VizError::Encode {
        what: "payload JSON",
        source: source.into(),
    })
}

/// An encoder-decoder model's three kinds of attention on one source and target, for the
/// page's Encoder / Decoder / Cross selector.
#[derive(Debug, Clone, PartialEq)]
pub struct Seq2SeqMaps {
    /// The target the decoder read (given, or the model's own translation).
    pub target: String,
    /// The encoder's self-attention over the source, every row: `[L_enc, H_enc, S, S]`.
    pub encoder: AttentionMaps,
    /// The decoder's causal self-attention over what it reads (the start token, then the
    /// target's tokens but the last), every row: `[L_dec, H_dec, T, T]`.
    pub decoder: AttentionMaps,
    /// The cross-attention: the source's tokens (segment 0) then the target's (segment 1),
    /// holding the target's rows alone (`rows`), each over the source's columns (the target's
    /// columns 0): `[L_dec, H_dec, T, S + T]`.
    pub cross: AttentionMaps,
}

#[derive(Serialize)]
struct Seq2SeqPayload<'a> {
    format: u32,
    model: &'a str,
    /// The source.
    text: &'a str,
    pair: Option<&'a str>,
    target: &'a str,
    /// The kind shown first.
    kind: &'static str,
    kinds: Vec<KindPayload>,
    measures: Vec<PayloadMeasure>,
    neuron: Option<Neuron>,
}

/// One kind of an encoder-decoder model's attention, packed as [`Payload`]'s weights are, its
/// rows the query tokens (`tokens`) and its columns the keys (`key_tokens`, or the queries).
#[derive(Serialize)]
struct KindPayload {
    name: &'static str,
    label: String,
    /// What the rows and columns are, for the page to say.
    about: String,
    /// The head view's headings of the queries' and the keys' columns.
    queries: &'static str,
    keys: &'static str,
    tokens: Vec<PayloadToken>,
    key_tokens: Option<Vec<PayloadToken>>,
    /// Each query's position among the keys, where it is not its row's index: a causal
    /// model's query cannot see the keys after it, which the page greys.
    #[serde(skip_serializing_if = "Option::is_none")]
    positions: Option<Vec<usize>>,
    #[serde(flatten)]
    packed: PackedWeights,
    /// Packed `[queries, queries]`, for the kinds whose keys are the queries.
    rollout: Option<String>,
}

/// A kind before its weights are packed: the payload less its weights, and their quantised
/// values `[n_layers, n_heads, queries, keys]` with the exact ones they round.
struct Kind {
    payload: KindPayload,
    exact: Vec<f32>,
    quantised: Vec<u16>,
}

/// The JSON the page renders for an encoder-decoder model: the three kinds of `maps`, cross
/// first, and no queries and keys (the neuron view says it is not available) or measures.
/// With a size budget each kind's weights get the share of it that their number is of all.
pub fn seq2seq_payload_json(maps: &Seq2SeqMaps, options: &PageOptions) -> Result<String, VizError> {
    let kinds = [
        cross_kind(&maps.cross)?,
        square_kind(&maps.encoder, "encoder")?,
        square_kind(&maps.decoder, "decoder")?,
    ];
    let total: usize = kinds.iter().map(|k| k.quantised.len()).sum();
    let (values, kinds): (Vec<_>, Vec<_>) = (kinds.into_iter())
        .map(|k| ((k.exact, k.quantised), k.payload))
        .unzip();
    let mut payload = Seq2SeqPayload {
        format: FORMAT,
        model: &maps.encoder.model,
        text: &maps.encoder.text,
        pair: None,
        target: &maps.target,
        kind: "cross",
        kinds,
        measures: Vec::new(),
        neuron: None,
    };
    let rest = to_json(&payload)?.len();
    for (kind, (exact, quantised)) in payload.kinds.iter_mut().zip(&values) {
        let budget = options.size_budget_bytes.map(|budget| {
            let share = quantised.len() as f64 / total.max(1) as f64;
            (budget.saturating_sub(rest) as f64 * share) as usize
        });
        let keys = kind.key_tokens.as_ref().map_or(kind.tokens.len(), Vec::len);
        (kind.packed).pack((exact, quantised), (kind.tokens.len(), keys), budget)?;
    }
    to_json(&payload)
}

/// The page of some rows of one text's self-attention: one kind, those rows' tokens as queries
/// over every token as keys.
#[derive(Serialize)]
struct RowsPayload<'a> {
    format: u32,
    model: &'a str,
    text: &'a str,
    pair: Option<&'a str>,
    /// Tells the page that its one kind is chosen rows, not an encoder-decoder model's.
    rows: bool,
    kind: &'static str,
    kinds: Vec<KindPayload>,
    measures: Vec<PayloadMeasure>,
    neuron: Option<Neuron>,
}

/// The JSON the page renders for the rows `rows` (token positions, ascending, each held by
/// `maps`) of `maps`, each over every token: one rectangular kind, packed as [`payload_json`]
/// packs its weights, with no queries and keys (the neuron view says it is not available) or
/// measures. `alone`: the model computed these rows' weights alone (else they are taken from
/// a pass over every row: saved maps, or a range of every token), which the page says.
///
/// # Shapes
/// - `maps.weights`: `[n_layers, n_heads, held rows, T]` ([`AttentionMaps::rows`]) or
///   `[n_layers, n_heads, T, T]`
/// - the packed weights: `[n_layers, n_heads, rows.len(), T]`
pub fn rows_payload_json(
    maps: &AttentionMaps,
    rows: &[usize],
    alone: bool,
    options: &PageOptions,
) -> Result<String, VizError> {
    maps.validate_rows()?;
    let t = maps.seq_len();
    if rows.is_empty() || rows.windows(2).any(|w| w[0] >= w[1]) {
        return Err(VizError::BadRows {
            reason: "the rows to show must be at least one, ascending".into(),
        });
    }
    let mut exact = Vec::with_capacity(maps.n_layers * maps.n_heads * rows.len() * t);
    for layer in 0..maps.n_layers {
        for head in 0..maps.n_heads {
            for &row in rows {
                exact.extend_from_slice(maps.row(layer, head, row).ok_or_else(|| {
                    VizError::BadRows {
                        reason: format!("the maps hold no row for token {row}"),
                    }
                })?);
            }
        }
    }
    let n = rows.len();
    let blocks = (maps.n_layers * maps.n_heads) as f32;
    let mut mean = vec![0.0f32; n * t];
    for block in exact.chunks_exact(n * t) {
        for (m, &w) in mean.iter_mut().zip(block) {
            *m += w / blocks;
        }
    }
    let (first, last) = (rows[0], rows[n - 1] + 1);
    let span = match last - first == n {
        true => format!("Rows {}..{}", thousands(first), thousands(last)),
        false => format!("{} rows", thousands(n)),
    };
    let about = format!(
        "{span} of the {} tokens (queries, left; heatmap rows), each over every token (keys, \
         right; columns): {}.",
        thousands(t),
        match alone {
            true => "the model computed these rows' weights alone",
            false => "taken from a pass over every row",
        }
    );
    let quantised = quantise(&exact);
    let mut payload = RowsPayload {
        format: FORMAT,
        model: &maps.model,
        text: &maps.text,
        pair: maps.pair.as_deref(),
        rows: true,
        kind: "rows",
        kinds: vec![KindPayload {
            name: "rows",
            label: span.to_lowercase(),
            about,
            queries: "chosen token (query)",
            keys: "token (key)",
            tokens: payload_tokens(maps, rows.iter().copied())?,
            key_tokens: Some(payload_tokens(maps, 0..t)?),
            positions: Some(rows.to_vec()),
            packed: PackedWeights::unpacked(maps, t > 1 && sees_only_earlier_keys(maps), &mean)?,
            rollout: None,
        }],
        measures: Vec::new(),
        neuron: None,
    };
    let rest = to_json(&payload)?.len();
    let budget = options
        .size_budget_bytes
        .map(|budget| budget.saturating_sub(rest));
    (payload.kinds[0].packed).pack((&exact, &quantised), (n, t), budget)?;
    to_json(&payload)
}

/// `n` with a comma between groups of three digits (8,192), as the page writes counts.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The payload's tokens `indices` of `maps`.
fn payload_tokens(
    maps: &AttentionMaps,
    indices: impl Iterator<Item = usize>,
) -> Result<Vec<PayloadToken>, VizError> {
    indices
        .map(|i| {
            Ok(PayloadToken {
                label: token_label(maps, i)?,
                segment: maps.tokens[i].segment,
                special: maps.tokens[i].special,
            })
        })
        .collect()
}

/// The encoder's or the decoder's self-attention, every row of `maps`.
fn square_kind(maps: &AttentionMaps, name: &'static str) -> Result<Kind, VizError> {
    maps.validate()?;
    let (label, about, queries) = match name {
        "encoder" => (
            "Encoder",
            "Encoder: the source's self-attention, every source token (query) over every source token (key).",
            "source token (query)",
        ),
        _ => (
            "Decoder",
            "Decoder: its causal self-attention over what it reads, the start token then the target's tokens; each row attends to itself and the tokens before it.",
            "decoder input (query)",
        ),
    };
    let keys = match name {
        "encoder" => "source token (key)",
        _ => "decoder input (key)",
    };
    Ok(Kind {
        payload: KindPayload {
            name,
            label: label.into(),
            about: about.into(),
            queries,
            keys,
            tokens: payload_tokens(maps, 0..maps.seq_len())?,
            key_tokens: None,
            positions: None,
            packed: PackedWeights::unpacked(
                maps,
                maps.seq_len() > 1 && sees_only_earlier_keys(maps),
                &select(maps, Selection::All)?,
            )?,
            rollout: Some(pack_floored(&quantise(&rollout(maps)?), 0)?),
        },
        quantised: quantise(&maps.weights),
        exact: maps.weights.clone(),
    })
}

/// The cross-attention: the target's rows (queries) over the source's columns (keys).
fn cross_kind(maps: &AttentionMaps) -> Result<Kind, VizError> {
    maps.validate_rows()?;
    let t = maps.seq_len();
    let sources: Vec<usize> = (0..t).filter(|&i| maps.tokens[i].segment == 0).collect();
    let s = sources.len();
    let rows = maps.rows.clone().unwrap_or_default();
    if s == 0
        || rows.is_empty()
        || sources != (0..s).collect::<Vec<_>>()
        || rows != (s..t).collect::<Vec<_>>()
    {
        return Err(VizError::BadRows {
            reason: "cross-attention holds the rows of the tokens after the source's, the \
                     target's, over the source's tokens first"
                .into(),
        });
    }
    let n = rows.len();
    let exact: Vec<f32> = (maps.weights.chunks_exact(t))
        .flat_map(|row| row[..s].iter().copied())
        .collect();
    let blocks = (maps.n_layers * maps.n_heads) as f32;
    let mut mean = vec![0.0f32; n * s];
    for block in exact.chunks_exact(n * s) {
        for (m, &w) in mean.iter_mut().zip(block) {
            *m += w / blocks;
        }
    }
    Ok(Kind {
        payload: KindPayload {
            name: "cross",
            label: "Cross".into(),
            about: "Cross: each target token (query, left) is the decoder row that predicts it, reading the source's tokens (keys, right) from the encoder.".into(),
            queries: "target token (query)",
            keys: "source token (key)",
            tokens: payload_tokens(maps, rows.into_iter())?,
            key_tokens: Some(payload_tokens(maps, sources.into_iter())?),
            positions: None,
            packed: PackedWeights::unpacked(maps, false, &mean)?,
            rollout: None,
        },
        quantised: quantise(&exact),
        exact,
    })
}

/// The share of each row's attention (rows of `n` weights) that is stored as 0, below `floor`
/// or rounded to 0 (on a real 506-token text up to 11% of a row, 3.3% on average; all of it on
/// 3,000 tokens of even attention): the mean over the rows and the largest.
fn hidden_by_zeros(weights: &[f32], quantised: &[u16], n: usize, floor: u16) -> (f32, f32) {
    if n == 0 {
        return (0.0, 0.0);
    }
    let (mut total, mut max, mut rows) = (0.0f64, 0.0f64, 0usize);
    for (row, q) in weights.chunks_exact(n).zip(quantised.chunks_exact(n)) {
        let sum: f64 = row.iter().map(|&w| f64::from(w)).sum();
        let hidden: f64 = row
            .iter()
            .zip(q)
            .filter(|&(_, &q)| q == 0 || q < floor)
            .map(|(&w, _)| f64::from(w))
            .sum();
        let share = if sum > 0.0 { hidden / sum } else { 0.0 };
        total += share;
        max = max.max(share);
        rows += 1;
    }
    ((total / rows.max(1) as f64) as f32, max as f32)
}

/// `round(w * 1000)` for weights validated finite and not negative; rows sum to 1, and the
/// clamp keeps rounding excess (1.0000001) at 1000.
fn quantise(weights: &[f32]) -> Vec<u16> {
    let scale = f32::from(WEIGHT_SCALE);
    weights
        .iter()
        .map(|&w| (w * scale).round().min(scale) as u16)
        .collect()
}

/// Floors tried, in thousandths, when the exact weights are over budget.
const FLOORS: [u16; 8] = [0, 2, 3, 5, 10, 20, 50, 100];

/// Packs quantised weights; returns the floor used and the packed text: the smallest of
/// [`FLOORS`] that fits the budget, as far as the sizes fall with the floor. A sample of the
/// heads (every k-th `[T, T]` block, about an eighth of the weights) predicts each floor's
/// packed size; the smallest floor predicted to fit (with 5 % to spare) is packed in full,
/// higher floors follow only if that is still over budget. A sample can compress worse than
/// the whole (on a 512-token page floor 3 was predicted at 3.62 MB and packed in 3.04, so
/// floor 5 was used for a room of 3.51), so once the predicted floor fits, the lower floors'
/// predictions are scaled by what its full packing measured against its own prediction; from
/// the lowest that then fits (within 3 %), floors are packed in full up to the first that
/// fits. One or two full compressions are the usual cost.
fn pack_weights(
    quantised: &[u16],
    block: usize,
    budget: Option<usize>,
) -> Result<(u16, String), VizError> {
    let Some(budget) = budget else {
        return Ok((0, pack_floored(quantised, 0)?));
    };
    let blocks: Vec<&[u16]> = quantised.chunks(block.max(1)).collect();
    let stride = (blocks.len() / 8).max(1);
    let sample: Vec<u16> = blocks
        .iter()
        .step_by(stride)
        .flat_map(|b| b.iter().copied())
        .collect();
    let scale = quantised.len() as f64 / sample.len().max(1) as f64;
    // Each floor's predicted size, up to the first predicted to fit.
    let mut predicted = Vec::with_capacity(FLOORS.len());
    for &floor in &FLOORS {
        predicted.push(pack_floored(&sample, floor)?.len() as f64 * scale);
        if predicted[predicted.len() - 1] * 1.05 <= budget as f64 {
            break;
        }
    }
    let start = predicted.len() - 1;
    let mut packed = (0, String::new());
    for &floor in &FLOORS[start..] {
        packed = (floor, pack_floored(quantised, floor)?);
        if packed.1.len() <= budget {
            break;
        }
    }
    if packed.1.len() > budget || packed.0 != FLOORS[start] {
        return Ok(packed);
    }
    // The lowest floor whose corrected prediction fits (within the correction's own error
    // across floors, well under 3 %), then up from it to the first that fits in full.
    let measured = packed.1.len() as f64 / predicted[start].max(1.0);
    let lowest = (0..start)
        .take_while(|&i| predicted[i] * measured > budget as f64 * 1.03)
        .count();
    for &floor in &FLOORS[lowest..start] {
        let lower = pack_floored(quantised, floor)?;
        if lower.len() <= budget {
            return Ok((floor, lower));
        }
    }
    Ok(packed)
}

fn pack_floored(quantised: &[u16], floor: u16) -> Result<String, VizError> {
    deflate_base64(&encode_weights(quantised, floor), "weights")
}

/// The token stream of the module docs, with weights below `floor` written as zeros.
fn encode_weights(quantised: &[u16], floor: u16) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(quantised.len() / 2);
    let mut zeros: u64 = 0;
    for &q in quantised {
        if q == 0 || q < floor {
            zeros += 1;
            continue;
        }
        if zeros > 0 {
            push_varint(&mut bytes, zeros << 1 | 1);
            zeros = 0;
        }
        push_varint(&mut bytes, u64::from(q) << 1);
    }
    if zeros > 0 {
        push_varint(&mut bytes, zeros << 1 | 1);
    }
    bytes
}

/// LEB128: 7 bits at a time, low bits first, the high bit set when another byte follows.
fn push_varint(bytes: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        bytes.push(value as u8 | 0x80);
        value >>= 7;
    }
    bytes.push(value as u8);
}

fn deflate_base64(bytes: &[u8], what: &'static str) -> Result<String, VizError> {
    let mut encoder = ZlibEncoder::new(Vec::new(), Compression::default());
    encoder
        .write_all(bytes)
        .map_err(|source| VizError::Encode { what, source })?;
    let compressed = encoder
        .finish()
        .map_err(|source| VizError::Encode { what, source })?;
    Ok(BASE64.encode(compressed))
}

/// Checks a measure's shape and values, and packs its rows as shares of their sums (a row of
/// zeros stays zeros).
fn pack_measure(measure: &Measure, n_tokens: usize) -> Result<PayloadMeasure, VizError> {
    let expected = (n_tokens * n_tokens).checked_mul(measure.layers);
    if measure.layers == 0 || expected != Some(measure.values.len()) {
        return Err(VizError::MeasureShape {
            name: measure.name.clone(),
            layers: measure.layers,
            seq_len: n_tokens,
            got: measure.values.len(),
        });
    }
    if let Some(index) = (measure.values.iter()).position(|v| !(v.is_finite() && *v >= 0.0)) {
        let per_layer = n_tokens * n_tokens;
        return Err(VizError::BadMeasure {
            name: measure.name.clone(),
            layer: index / per_layer,
            row: index % per_layer / n_tokens,
            col: index % n_tokens,
            value: measure.values[index],
        });
    }
    let mut shares = measure.values.clone();
    for row in shares.chunks_exact_mut(n_tokens) {
        let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
        if sum > 0.0 {
            for v in row {
                *v = (f64::from(*v) / sum) as f32;
            }
        }
    }
    Ok(PayloadMeasure {
        name: measure.name.clone(),
        label: measure.label.clone(),
        layers: measure.layers,
        matrix: pack_floored(&quantise(&shares), 0)?,
    })
}

/// The layers whose queries and keys fit the budget: `first` always, then its neighbours,
/// nearest first (below before above), while the packed bytes stay within the budget.
fn neuron_layers(n_layers: usize, first: usize, layer_bytes: usize, budget: usize) -> Vec<usize> {
    let mut layers = vec![first];
    let mut used = layer_bytes;
    for distance in 1..n_layers {
        for layer in [first.checked_sub(distance), first.checked_add(distance)]
            .into_iter()
            .flatten()
            .filter(|&l| l < n_layers)
        {
            if used.saturating_add(layer_bytes) > budget {
                return layers;
            }
            used += layer_bytes;
            layers.push(layer);
        }
    }
    layers
}

fn pack_neuron(
    maps: &AttentionMaps,
    n_tokens: usize,
    qk: &QueryKeys,
    options: &PageOptions,
) -> Result<Neuron, VizError> {
    let per_layer = maps
        .n_heads
        .checked_mul(n_tokens)
        .and_then(|n| n.checked_mul(qk.head_dim));
    let expected = per_layer.and_then(|n| n.checked_mul(maps.n_layers));
    for (tensor, got) in [("q", qk.q.len()), ("k", qk.k.len())] {
        if qk.head_dim == 0 || expected != Some(got) {
            return Err(VizError::QueryKeysShape {
                tensor,
                n_layers: maps.n_layers,
                n_heads: maps.n_heads,
                n_tokens,
                head_dim: qk.head_dim,
                got,
            });
        }
    }
    if !(qk.scale.is_finite() && qk.scale > 0.0) {
        return Err(VizError::BadScale { scale: qk.scale });
    }
    for (tensor, values) in [("q", &qk.q), ("k", &qk.k)] {
        if let Some(index) = values.iter().position(|v| !v.is_finite()) {
            return Err(VizError::NonFiniteQueryKey {
                tensor,
                index,
                value: values[index],
            });
        }
    }
    let first = options.neuron_layer.unwrap_or(maps.n_layers - 1);
    maps.check_layer(first)?;
    // Validated above: the product exists, so the unwrap_or is never taken.
    let per_layer = per_layer.unwrap_or(0);
    let layers = neuron_layers(
        maps.n_layers,
        first,
        per_layer.saturating_mul(4),
        options.qk_budget_bytes,
    );
    let pack = |values: &[f32], what| {
        let mut bytes = Vec::with_capacity(layers.len() * per_layer * 2);
        for &layer in &layers {
            for &v in &values[layer * per_layer..(layer + 1) * per_layer] {
                bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        deflate_base64(&bytes, what)
    };
    Ok(Neuron {
        head_dim: qk.head_dim,
        scale: qk.scale,
        causal: qk.causal,
        q: pack(&qk.q, "queries")?,
        k: pack(&qk.k, "keys")?,
        layers,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use flate2::read::ZlibDecoder;
    use serde_json::json;

    use super::*;
    use crate::{Token, VizError};

    fn token(text: &str, segment: usize) -> Token {
        Token {
            text: text.to_string(),
            id: 0,
            span: None,
            segment,
            special: false,
        }
    }

    /// 2 layers, 1 head, 2 tokens.
    fn maps() -> AttentionMaps {
        AttentionMaps {
            model: "hand-made".into(),
            text: "a b".into(),
            pair: None,
            tokens: vec![token("a", 0), token("b", 0)],
            n_layers: 2,
            n_heads: 1,
            weights: vec![1.0, 0.0, 0.25, 0.75, 0.1234, 0.8766, 0.5, 0.5],
            rows: None,
        }
    }

    fn unpack(b64: &str) -> Vec<u8> {
        let compressed = BASE64.decode(b64).unwrap();
        let mut out = Vec::new();
        ZlibDecoder::new(&compressed[..])
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    /// The page's decoder (explorer.js `decodeWeights`), written again.
    fn decode_weights(bytes: &[u8]) -> Vec<u16> {
        let mut values = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let (mut token, mut shift) = (0u64, 0);
            loop {
                let byte = bytes[i];
                i += 1;
                token |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    break;
                }
            }
            if token & 1 == 1 {
                values.extend(std::iter::repeat_n(0, (token >> 1) as usize));
            } else {
                values.push((token >> 1) as u16);
            }
        }
        values
    }

    #[test]
    fn weights_round_trip_to_three_decimals() {
        let json: serde_json::Value = serde_json::from_str(
            &payload_json(&maps(), None, &[], &PageOptions::default()).unwrap(),
        )
        .unwrap();
        let values = decode_weights(&unpack(json["weights"].as_str().unwrap()));
        // round(w * 1000): 1.0 -> 1000, 0.1234 -> 123, 0.8766 -> 877.
        assert_eq!(values, [1000, 0, 250, 750, 123, 877, 500, 500]);
        assert_eq!(json["format"], FORMAT);
        assert_eq!(json["weight_scale"], 1000);
        assert_eq!(json["weight_floor"], 0);
        assert_eq!(json["tokens"][1]["label"], "b");
        // The second head gives query 0 a later key .877: not causal.
        assert_eq!(json["causal"], false);
        assert!(json["neuron"].is_null());
    }

    /// The rollout the heatmap offers, worked by hand: `A' = 0.5·A + 0.5·I` per layer, then
    /// `A'₁·A'₀` = [[0.5617, 0.4383], [0.25, 0.75]] · [[1, 0], [0.125, 0.875]].
    #[test]
    fn the_rollout_is_packed_to_three_decimals() {
        let json: serde_json::Value = serde_json::from_str(
            &payload_json(&maps(), None, &[], &PageOptions::default()).unwrap(),
        )
        .unwrap();
        let values = decode_weights(&unpack(json["rollout"].as_str().unwrap()));
        // 0.6164875, 0.3835125, 0.34375, 0.65625.
        assert_eq!(values, [616, 384, 344, 656]);
        // Both layers' one head averaged: (1 + 0.1234) / 2, (0 + 0.8766) / 2, (0.25 + 0.5) / 2,
        // (0.75 + 0.5) / 2.
        let all = decode_weights(&unpack(json["all_layers"].as_str().unwrap()));
        assert_eq!(all, [562, 438, 375, 625]);
    }

    #[test]
    fn over_budget_weights_get_a_floor_and_stay_exact_above_it() {
        // 1 layer, 1 head, 40 tokens; row i puts 0.001 * (k % 7) on key k and the rest on key i.
        let t = 40;
        let mut weights = vec![0.0f32; t * t];
        for i in 0..t {
            let row = &mut weights[i * t..(i + 1) * t];
            for (k, w) in row.iter_mut().enumerate() {
                *w = 0.001 * (k % 7) as f32;
            }
            let rest: f32 = row.iter().sum::<f32>() - row[i];
            row[i] = 1.0 - rest;
        }
        let exact = quantise(&weights);
        let (floor, _) = pack_weights(&exact, t * t, None).unwrap();
        assert_eq!(floor, 0);
        let (floor, packed) = pack_weights(&exact, t * t, Some(8)).unwrap();
        assert_eq!(
            floor, 100,
            "nothing fits 8 bytes: the largest floor is used"
        );
        let (floor, packed_mid) = pack_weights(&exact, t * t, Some(packed.len() + 40)).unwrap();
        assert!(floor > 0 && floor < 100, "floor {floor}");
        let got = decode_weights(&unpack(&packed_mid));
        for (g, e) in got.iter().zip(&exact) {
            assert_eq!(*g, if *e < floor { 0 } else { *e });
        }
    }

    /// A page whose floor hides weights says how much of each row's attention they held: the
    /// 3.98 MB page of 506 tokens hid up to 84% of a diffuse row, and its notice did not say.
    #[test]
    fn the_payload_says_how_much_attention_its_floor_hides() {
        // 40 tokens; row i puts 0.001 * (k % 7) on each other key k, the rest on key i; row 0
        // also puts exactly the floor to come, 0.1, on key 39, which the floor keeps.
        let t = 40;
        let mut weights = vec![0.0f32; t * t];
        for i in 0..t {
            for k in (0..t).filter(|&k| k != i) {
                weights[i * t + k] = 0.001 * (k % 7) as f32;
            }
            if i == 0 {
                weights[t - 1] = 0.1;
            }
            let rest: f32 = weights[i * t..(i + 1) * t].iter().sum();
            weights[i * t + i] = 1.0 - rest;
        }
        let maps = AttentionMaps {
            tokens: (0..t).map(|_| token("x", 0)).collect(),
            n_layers: 1,
            weights,
            ..maps()
        };
        let page = |budget| {
            let options = PageOptions {
                size_budget_bytes: budget,
                ..PageOptions::default()
            };
            let json = payload_json(&maps, None, &[], &options).unwrap();
            serde_json::from_str::<serde_json::Value>(&json).unwrap()
        };
        let exact = page(None);
        assert_eq!(exact["weight_floor"], 0);
        // Every weight is 0 or at least 0.001: nothing rounds to 0.
        assert_eq!(exact["zero_hidden_mean"], 0.0);
        // Nothing fits 100 bytes: floor 0.1 hides every weight but the diagonal. Row i hides
        // 0.001 · (Σ_k (k % 7) − i % 7), Σ_k (k % 7) = 5 · 21 + (0 + 1 + 2 + 3 + 4) = 115.
        let floored = page(Some(100));
        assert_eq!(floored["weight_floor"], 100);
        let mut hidden: Vec<f64> = (0..t).map(|i| 0.001 * (115 - i % 7) as f64).collect();
        hidden[0] -= 0.001 * (39 % 7) as f64;
        let mean = hidden.iter().sum::<f64>() / t as f64;
        let max = hidden.iter().copied().fold(0.0, f64::max);
        let got = |field: &str| floored[field].as_f64().unwrap();
        assert!(
            (got("zero_hidden_mean") - mean).abs() < 1e-5,
            "{}",
            got("zero_hidden_mean")
        );
        assert!(
            (got("zero_hidden_max") - max).abs() < 1e-5,
            "{}",
            got("zero_hidden_max")
        );
    }

    /// Weights under half a thousandth round to 0 without any floor: 3,000 tokens of even
    /// attention showed an empty page with no notice. Here row 1 puts 0.0004 on each of 10 keys
    /// (0.004 hidden), row 0 nothing under 0.001.
    #[test]
    fn the_payload_says_how_much_attention_rounds_to_zero() {
        let t = 12;
        let mut weights = vec![0.0f32; t * t];
        for i in 0..t {
            weights[i * t + i] = 1.0;
        }
        for k in 2..12 {
            weights[t + k] = 0.0004;
        }
        weights[t + 1] = 1.0 - 0.004;
        let maps = AttentionMaps {
            tokens: (0..t).map(|_| token("x", 0)).collect(),
            n_layers: 1,
            weights,
            ..maps()
        };
        let json = payload_json(&maps, None, &[], &PageOptions::default()).unwrap();
        let page: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(page["weight_floor"], 0);
        let got = |field: &str| page[field].as_f64().unwrap();
        assert!((got("zero_hidden_max") - 0.004).abs() < 1e-6, "{page}");
        assert!(
            (got("zero_hidden_mean") - 0.004 / t as f64).abs() < 1e-6,
            "{page}"
        );
    }

    /// The sample (every k-th head) can compress worse than the whole: here the sampled heads
    /// are noise and the others near-empty, so every floor's prediction is several times its
    /// real size. A budget that floor 0 fits got a floor of 100 from the predictions alone;
    /// the full packing's own size now corrects them, and floor 0 is used.
    #[test]
    fn a_sample_that_compresses_worse_than_the_whole_does_not_raise_the_floor() {
        let (t, heads) = (32, 16);
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut noise = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as u16 % 200
        };
        let mut exact = Vec::with_capacity(heads * t * t);
        for head in 0..heads {
            for _ in 0..t * t {
                // `pack_weights` samples every second of 16 heads, from the first.
                exact.push(if head % 2 == 0 { noise() } else { 0 });
            }
        }
        let fits = pack_floored(&exact, 0).unwrap().len();
        let (floor, packed) = pack_weights(&exact, t * t, Some(fits)).unwrap();
        assert_eq!((floor, packed.len()), (0, fits));
        // Just under floor 0's size, the smallest floor that fits, found by packing them all.
        let budget = fits - 1;
        let smallest = FLOORS
            .iter()
            .copied()
            .find(|&f| pack_floored(&exact, f).unwrap().len() <= budget)
            .unwrap();
        assert_eq!(
            pack_weights(&exact, t * t, Some(budget)).unwrap().0,
            smallest
        );
    }

    #[test]
    fn token_stream_covers_every_value_and_long_runs() {
        let mut all: Vec<u16> = (0..=WEIGHT_SCALE).collect();
        all.extend(std::iter::repeat_n(0, 70_000));
        all.extend([7, 0, 0, 1000]);
        let bytes = encode_weights(&all, 0);
        assert_eq!(decode_weights(&bytes), all);
        // 1000 -> token 2000 = 0b111_1101_0000: low 7 bits 0x50 with the high bit, then 0x0F.
        let mut one = Vec::new();
        push_varint(&mut one, 2000);
        assert_eq!(one, [0xD0, 0x0F]);
        // Three zeros -> token 7; 0.005 -> token 10.
        assert_eq!(encode_weights(&[0, 0, 0, 5], 0), [7, 10]);
        // With floor 5, the 4 joins the zero run: tokens 2*2+1 and 2*5.
        assert_eq!(encode_weights(&[0, 4, 5], 5), [5, 10]);
    }

    fn qk(maps: &AttentionMaps, head_dim: usize) -> QueryKeys {
        let n = maps.n_layers * maps.n_heads * maps.tokens.len() * head_dim;
        QueryKeys {
            head_dim,
            scale: 0.5,
            causal: false,
            q: (0..n).map(|i| i as f32 * 0.5).collect(),
            k: (0..n).map(|i| -(i as f32)).collect(),
        }
    }

    #[test]
    fn neuron_layers_follow_the_budget() {
        // One layer costs 1 head * 2 tokens * 3 dims * (2 bytes q + 2 bytes k) = 24 bytes.
        let maps = maps();
        let qk = qk(&maps, 3);
        let options = PageOptions {
            neuron_layer: Some(1),
            qk_budget_bytes: 24,
            size_budget_bytes: None,
        };
        let json: serde_json::Value =
            serde_json::from_str(&payload_json(&maps, Some(&qk), &[], &options).unwrap()).unwrap();
        assert_eq!(json["neuron"]["layers"], serde_json::json!([1]));
        let q = unpack(json["neuron"]["q"].as_str().unwrap());
        let q: Vec<f32> = q
            .chunks(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect();
        // Layer 1 holds elements 6..12 of q, i.e. 3.0, 3.5, ..., 5.5 (exact in f16).
        assert_eq!(q, [3.0, 3.5, 4.0, 4.5, 5.0, 5.5]);

        let all = PageOptions {
            neuron_layer: Some(1),
            qk_budget_bytes: 48,
            size_budget_bytes: None,
        };
        let json: serde_json::Value =
            serde_json::from_str(&payload_json(&maps, Some(&qk), &[], &all).unwrap()).unwrap();
        assert_eq!(json["neuron"]["layers"], serde_json::json!([1, 0]));
    }

    #[test]
    fn neuron_layer_order_is_nearest_first() {
        assert_eq!(neuron_layers(6, 2, 10, 40), [2, 1, 3, 0]);
        assert_eq!(neuron_layers(6, 5, 10, 1000), [5, 4, 3, 2, 1, 0]);
        // The first layer is included even when it alone exceeds the budget.
        assert_eq!(neuron_layers(6, 0, 10, 5), [0]);
    }

    #[test]
    fn measures_are_packed_as_shares_of_each_row() {
        // Two layers of 2 × 2: rows (3, 1), (0, 0), (0.2, 0.6) and (5, 0).
        let norm = Measure {
            name: "norm".into(),
            label: "Norms".into(),
            layers: 2,
            values: vec![3.0, 1.0, 0.0, 0.0, 0.2, 0.6, 5.0, 0.0],
        };
        let json: serde_json::Value = serde_json::from_str(
            &payload_json(&maps(), None, &[norm], &PageOptions::default()).unwrap(),
        )
        .unwrap();
        let measure = &json["measures"][0];
        assert_eq!(
            (&measure["name"], &measure["label"], &measure["layers"]),
            (&json!("norm"), &json!("Norms"), &json!(2))
        );
        let values = decode_weights(&unpack(measure["matrix"].as_str().unwrap()));
        assert_eq!(values, [750, 250, 0, 0, 250, 750, 1000, 0]);
    }

    #[test]
    fn rejects_measures_of_the_wrong_shape_or_with_bad_values() {
        let measure = |layers, values: Vec<f32>| Measure {
            name: "alti".into(),
            label: "ALTI".into(),
            layers,
            values,
        };
        for bad in [measure(1, vec![0.5; 3]), measure(0, vec![])] {
            let err = payload_json(&maps(), None, &[bad], &PageOptions::default()).unwrap_err();
            assert!(matches!(err, VizError::MeasureShape { .. }), "{err}");
        }
        for value in [f32::NAN, -1.0, f32::INFINITY] {
            let mut values = vec![0.5; 8];
            values[6] = value;
            let err = payload_json(
                &maps(),
                None,
                &[measure(2, values)],
                &PageOptions::default(),
            )
            .unwrap_err();
            assert!(
                matches!(
                    err,
                    VizError::BadMeasure {
                        layer: 1,
                        row: 1,
                        col: 0,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(
                err.to_string()
                    .starts_with("the alti value at matrix 1, row 1, column 0")
            );
        }
    }

    #[test]
    fn rejects_no_tokens() {
        let mut maps = maps();
        maps.tokens.clear();
        let err = payload_json(&maps, None, &[], &PageOptions::default()).unwrap_err();
        assert!(matches!(err, VizError::NoTokens), "{err}");
    }

    #[test]
    fn rejects_wrong_weight_count() {
        let mut maps = maps();
        maps.weights.pop();
        let err = payload_json(&maps, None, &[], &PageOptions::default()).unwrap_err();
        assert!(
            matches!(err, VizError::WeightsShape { got: 7, .. }),
            "{err}"
        );
    }

    #[test]
    fn rejects_nan_and_negative_weights_naming_the_position() {
        for bad in [f32::NAN, -0.5, f32::INFINITY] {
            let mut maps = maps();
            maps.weights[6] = bad;
            let err = payload_json(&maps, None, &[], &PageOptions::default()).unwrap_err();
            assert!(
                matches!(
                    err,
                    VizError::BadWeight {
                        layer: 1,
                        head: 0,
                        row: 1,
                        col: 0,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn rejects_wrong_query_key_shapes_and_values() {
        let maps = maps();
        let options = PageOptions::default();
        let mut bad = qk(&maps, 3);
        bad.k.pop();
        let err = payload_json(&maps, Some(&bad), &[], &options).unwrap_err();
        assert!(
            matches!(err, VizError::QueryKeysShape { tensor: "k", .. }),
            "{err}"
        );

        let mut bad = qk(&maps, 3);
        bad.q[4] = f32::INFINITY;
        let err = payload_json(&maps, Some(&bad), &[], &options).unwrap_err();
        assert!(
            matches!(
                err,
                VizError::NonFiniteQueryKey {
                    tensor: "q",
                    index: 4,
                    ..
                }
            ),
            "{err}"
        );

        let mut bad = qk(&maps, 3);
        bad.scale = 0.0;
        let err = payload_json(&maps, Some(&bad), &[], &options).unwrap_err();
        assert!(matches!(err, VizError::BadScale { .. }), "{err}");

        let out_of_range = PageOptions {
            neuron_layer: Some(2),
            ..PageOptions::default()
        };
        let err = payload_json(&maps, Some(&qk(&maps, 3)), &[], &out_of_range).unwrap_err();
        assert!(
            matches!(
                err,
                VizError::LayerOutOfRange {
                    layer: 2,
                    n_layers: 2
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("0..=1"), "{err}");
    }

    /// A source of 2 tokens ("a b") and a target of 3 ("x y z"): the encoder's 1 layer × 1
    /// head, the decoder's and the cross-attention's 1 layer × 2 heads.
    fn seq2seq() -> Seq2SeqMaps {
        let source = |tokens: Vec<Token>| AttentionMaps {
            tokens,
            n_layers: 1,
            ..maps()
        };
        let encoder = AttentionMaps {
            weights: vec![0.5, 0.5, 0.25, 0.75],
            ..source(vec![token("a", 0), token("b", 0)])
        };
        // Causal: each row over itself and the tokens before it.
        let decoder = AttentionMaps {
            text: "x y z".into(),
            tokens: vec![token("<s>", 0), token("x", 0), token("y", 0)],
            n_heads: 2,
            weights: vec![
                1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.2, 0.3, 0.5, //
                1.0, 0.0, 0.0, 0.9, 0.1, 0.0, 0.0, 0.0, 1.0,
            ],
            ..encoder.clone()
        };
        // The target's 3 rows over the source's 2 columns, the target's columns 0.
        let cross = AttentionMaps {
            pair: Some("x y z".into()),
            tokens: vec![
                token("a", 0),
                token("b", 0),
                token("x", 1),
                token("y", 1),
                token("z", 1),
            ],
            n_heads: 2,
            weights: [
                [0.1, 0.9],
                [0.6, 0.4],
                [0.0, 1.0],
                [0.3, 0.7],
                [0.5, 0.5],
                [1.0, 0.0],
            ]
            .iter()
            .flat_map(|row| [row[0], row[1], 0.0, 0.0, 0.0])
            .collect(),
            rows: Some(vec![2, 3, 4]),
            ..encoder.clone()
        };
        Seq2SeqMaps {
            target: "x y z".into(),
            encoder,
            decoder,
            cross,
        }
    }

    #[test]
    fn a_seq2seq_payload_holds_three_kinds_cross_rectangular() {
        let json: serde_json::Value = serde_json::from_str(
            &seq2seq_payload_json(&seq2seq(), &PageOptions::default()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (&json["kind"], &json["target"]),
            (&json!("cross"), &json!("x y z"))
        );
        assert!(json["neuron"].is_null());
        let kind = |i: usize| &json["kinds"][i];
        let labels = |list: &serde_json::Value| -> Vec<String> {
            (list.as_array().unwrap().iter())
                .map(|t| t["label"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(kind(0)["name"], "cross");
        assert_eq!(labels(&kind(0)["tokens"]), ["x", "y", "z"]);
        assert_eq!(labels(&kind(0)["key_tokens"]), ["a", "b"]);
        assert_eq!(
            decode_weights(&unpack(kind(0)["weights"].as_str().unwrap())),
            [100, 900, 600, 400, 0, 1000, 300, 700, 500, 500, 1000, 0]
        );
        // Both heads averaged: (0.1 + 0.3) / 2, (0.9 + 0.7) / 2, ...
        assert_eq!(
            decode_weights(&unpack(kind(0)["all_layers"].as_str().unwrap())),
            [200, 800, 550, 450, 500, 500]
        );
        assert!(kind(0)["rollout"].is_null());
        assert_eq!(kind(0)["causal"], false);
        assert_eq!(kind(1)["name"], "encoder");
        assert!(kind(1)["key_tokens"].is_null());
        assert_eq!(
            decode_weights(&unpack(kind(1)["weights"].as_str().unwrap())),
            [500, 500, 250, 750]
        );
        assert_eq!(
            (&kind(1)["causal"], &kind(2)["causal"]),
            (&json!(false), &json!(true))
        );
        assert_eq!(labels(&kind(2)["tokens"]), ["<s>", "x", "y"]);
        assert_eq!(
            (&kind(2)["n_layers"], &kind(2)["n_heads"]),
            (&json!(1), &json!(2))
        );
        assert!(kind(2)["rollout"].is_string());
    }

    #[test]
    fn a_seq2seq_payload_refuses_cross_attention_that_is_not_target_over_source() {
        let mut maps = seq2seq();
        maps.cross.rows = Some(vec![0, 3, 4]);
        let err = seq2seq_payload_json(&maps, &PageOptions::default()).unwrap_err();
        assert!(matches!(err, VizError::BadRows { .. }), "{err}");
        let mut maps = seq2seq();
        maps.cross.rows = None;
        maps.cross.weights = vec![0.2; 2 * 5 * 5];
        let err = seq2seq_payload_json(&maps, &PageOptions::default()).unwrap_err();
        assert!(matches!(err, VizError::BadRows { .. }), "{err}");
    }

    /// A rows page holds the rows asked for (of those the maps hold) over every token, each
    /// query's position for the causal mask, and says which rows they are.
    #[test]
    fn a_rows_payload_holds_the_rows_asked_for_over_every_token() {
        let maps = AttentionMaps {
            tokens: vec![token("a", 0), token("b", 0), token("c", 0)],
            text: "a b c".into(),
            n_heads: 2,
            n_layers: 1,
            // [1 layer, 2 heads, rows 1 and 2, 3 keys], causal.
            weights: vec![
                0.4, 0.6, 0.0, 0.2, 0.3, 0.5, //
                1.0, 0.0, 0.0, 0.1, 0.1, 0.8,
            ],
            rows: Some(vec![1, 2]),
            ..maps()
        };
        let json: serde_json::Value = serde_json::from_str(
            &rows_payload_json(&maps, &[2], true, &PageOptions::default()).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (&json["rows"], &json["kind"]),
            (&json!(true), &json!("rows"))
        );
        assert!(json["neuron"].is_null() && json["kinds"].as_array().unwrap().len() == 1);
        let kind = &json["kinds"][0];
        assert_eq!(kind["tokens"].as_array().unwrap().len(), 1);
        assert_eq!(kind["key_tokens"].as_array().unwrap().len(), 3);
        assert_eq!(
            (&kind["positions"], &kind["causal"]),
            (&json!([2]), &json!(true))
        );
        assert_eq!(kind["label"], "rows 2..3");
        assert_eq!(
            kind["about"],
            "Rows 2..3 of the 3 tokens (queries, left; heatmap rows), each over every token \
             (keys, right; columns): the model computed these rows' weights alone."
        );
        assert_eq!(
            decode_weights(&unpack(kind["weights"].as_str().unwrap())),
            [200, 300, 500, 100, 100, 800]
        );
        assert_eq!(
            decode_weights(&unpack(kind["all_layers"].as_str().unwrap())),
            [150, 200, 650]
        );
        let refused = rows_payload_json(&maps, &[0, 2], false, &PageOptions::default());
        assert!(
            matches!(&refused, Err(VizError::BadRows { reason }) if reason.contains("token 0")),
            "{refused:?}"
        );
        assert!(rows_payload_json(&maps, &[], false, &PageOptions::default()).is_err());
    }

    #[test]
    fn thousands_are_grouped_by_commas() {
        assert_eq!(
            [0, 999, 1000, 8192, 1_234_567].map(thousands),
            ["0", "999", "1,000", "8,192", "1,234,567"]
        );
    }
}
