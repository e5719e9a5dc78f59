//! Which attention to look at: one head, one layer's heads averaged, every layer and head
//! averaged, or attention rollout.
//!
//! Rollout follows Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020,
//! <https://arxiv.org/abs/2005.00928>): per layer the heads are averaged, the residual connection
//! is added as `A' = 0.5·A + 0.5·I`, rows are renormalised, and the layers are multiplied from the
//! input up: `R = A'_{L-1} · … · A'_1 · A'_0`. Row `i` of `R` is how much output token `i` draws
//! from each input token.

use rayon::prelude::*;

use crate::{AttentionMaps, VizError};

/// The attention a view shows, reduced to one `[T, T]` matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Selection {
    /// Every layer and head averaged.
    All,
    /// One layer, its heads averaged.
    Layer { layer: usize },
    /// One head of one layer.
    Head { layer: usize, head: usize },
    /// Attention rollout across all layers.
    Rollout,
}

impl Selection {
    /// The selection that `--layer`, `--head` and `--rollout` name: a head needs its layer,
    /// and rollout, which goes through every layer, takes neither.
    pub fn from_flags(
        layer: Option<usize>,
        head: Option<usize>,
        rollout: bool,
    ) -> Result<Selection, VizError> {
        match (layer, head, rollout) {
            (Some(layer), Some(head), false) => Ok(Selection::Head { layer, head }),
            (Some(layer), None, false) => Ok(Selection::Layer { layer }),
            (None, None, true) => Ok(Selection::Rollout),
            (None, None, false) => Ok(Selection::All),
            (None, Some(_), _) => Err(VizError::BadSelection {
                reason: "head needs a layer",
            }),
            (Some(_), _, true) => Err(VizError::BadSelection {
                reason: "rollout goes through every layer: give layer or rollout, not both",
            }),
        }
    }

    /// What the selection is, in words, for titles and footers.
    pub fn describe(&self, maps: &AttentionMaps) -> String {
        match *self {
            Selection::All => format!(
                "all {} layers × {} heads averaged",
                maps.n_layers, maps.n_heads
            ),
            Selection::Layer { layer } => format!("layer {layer}, {} heads averaged", maps.n_heads),
            Selection::Head { layer, head } => format!("layer {layer}, head {head}"),
            Selection::Rollout => format!("attention rollout over {} layers", maps.n_layers),
        }
    }

    /// The `(layer, head)`s the selection averages (rollout goes through every one).
    pub fn heads(&self, maps: &AttentionMaps) -> Vec<(usize, usize)> {
        match *self {
            Selection::Head { layer, head } => vec![(layer, head)],
            Selection::Layer { layer } => (0..maps.n_heads).map(|h| (layer, h)).collect(),
            Selection::All | Selection::Rollout => (0..maps.n_layers)
                .flat_map(|l| (0..maps.n_heads).map(move |h| (l, h)))
                .collect(),
        }
    }

    /// Checks that the layer and head exist in `maps`.
    pub fn check(&self, maps: &AttentionMaps) -> Result<(), VizError> {
        match *self {
            Selection::Layer { layer } => maps.check_layer(layer),
            Selection::Head { layer, head } => {
                maps.check_layer(layer)?;
                maps.check_head(head)
            }
            Selection::All | Selection::Rollout => Ok(()),
        }
    }
}

/// The selected attention as one matrix.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `[T, T]` (row = query, column = key).
pub fn select(maps: &AttentionMaps, selection: Selection) -> Result<Vec<f32>, VizError> {
    maps.validate()?;
    selection.check(maps)?;
    Ok(match selection {
        Selection::All => {
            let layers: Vec<Vec<f32>> = (0..maps.n_layers)
                .map(|layer| layer_mean(maps, layer))
                .collect();
            mean_of(&layers)
        }
        Selection::Layer { layer } => layer_mean(maps, layer),
        Selection::Head { layer, head } => maps.head(layer, head)?.to_vec(),
        Selection::Rollout => rollout(maps)?,
    })
}

/// One layer's heads averaged.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `[T, T]`. `maps` must be valid and `layer` in
/// range (see [`select`], which checks both).
pub fn layer_mean(maps: &AttentionMaps, layer: usize) -> Vec<f32> {
    let per_head = maps.seq_len() * maps.seq_len();
    let start = layer * maps.n_heads * per_head;
    let heads: Vec<&[f32]> = maps.weights[start..start + maps.n_heads * per_head]
        .chunks_exact(per_head)
        .collect();
    mean_of(&heads)
}

fn mean_of<M: AsRef<[f32]>>(matrices: &[M]) -> Vec<f32> {
    let mut mean = vec![0.0f32; matrices[0].as_ref().len()];
    let share = 1.0 / matrices.len() as f32;
    for m in matrices {
        for (acc, w) in mean.iter_mut().zip(m.as_ref()) {
            *acc += share * w;
        }
    }
    mean
}

/// Per layer: heads averaged, `0.5·A + 0.5·I`, rows renormalised (the residual-aware attention
/// graph that rollout and flow walk through).
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `n_layers` matrices of `[T, T]`.
pub fn residual_layers(maps: &AttentionMaps) -> Result<Vec<Vec<f32>>, VizError> {
    maps.validate()?;
    let t = maps.seq_len();
    Ok((0..maps.n_layers)
        .map(|layer| {
            let mut a = layer_mean(maps, layer);
            for i in 0..t {
                a[i * t + i] += 1.0;
                let row = &mut a[i * t..(i + 1) * t];
                let sum: f32 = row.iter().sum();
                // sum ≥ 1 thanks to the identity, so the division is safe.
                row.iter_mut().for_each(|w| *w /= sum);
            }
            a
        })
        .collect())
}

/// Attention rollout (see the module docs).
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `[T, T]`.
pub fn rollout(maps: &AttentionMaps) -> Result<Vec<f32>, VizError> {
    let t = maps.seq_len();
    let layers = residual_layers(maps)?;
    let mut rolled = layers[0].clone();
    for a in &layers[1..] {
        rolled = matmul(a, &rolled, t);
    }
    Ok(rolled)
}

/// The product `C_L ··· C_1` of per-layer contribution matrices (ALTI's rollout: their rows
/// already hold each token's own share, so no identity is added).
///
/// # Shapes
/// `per_layer: [n_layers, T, T]` → `[T, T]`.
pub fn rolled_out(per_layer: &[f32], t: usize) -> Vec<f32> {
    let mut layers = per_layer.chunks_exact((t * t).max(1));
    let Some(first) = layers.next() else {
        return Vec::new();
    };
    layers.fold(first.to_vec(), |rolled, c| matmul(c, &rolled, t))
}

/// `a · b` for two `[n, n]` row-major matrices, accumulated in f64, rows in parallel. Zeros of
/// `a` are skipped, and each row of `b` is read up to its last nonzero: a causal model's
/// matrices are lower-triangular, which leaves about a third of the work (a rollout of
/// 1024 GPT-2 tokens multiplies eleven of them).
fn matmul(a: &[f32], b: &[f32], n: usize) -> Vec<f32> {
    let reach: Vec<usize> = b
        .chunks_exact(n.max(1))
        .map(|row| row.iter().rposition(|&x| x != 0.0).map_or(0, |j| j + 1))
        .collect();
    let mut out = vec![0.0f32; n * n];
    out.par_chunks_mut(n.max(1))
        .zip(a.par_chunks(n.max(1)))
        .for_each(|(out_row, a_row)| {
            let mut acc = vec![0.0f64; n];
            for (k, &aik) in a_row.iter().enumerate() {
                if aik == 0.0 {
                    continue;
                }
                let aik = f64::from(aik);
                let b_row = &b[k * n..][..reach[k]];
                for (x, &bkj) in acc.iter_mut().zip(b_row) {
                    *x += aik * f64::from(bkj);
                }
            }
            for (o, x) in out_row.iter_mut().zip(&acc) {
                *o = *x as f32;
            }
        });
    out
}
