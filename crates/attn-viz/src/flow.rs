//! Attention flow: Abnar & Zuidema, "Quantifying Attention Flow in Transformers" (ACL 2020,
//! <https://arxiv.org/abs/2005.00928>), as in their `compute_flows` (networkx max-flow).
//!
//! The layers form a graph: node `(l, i)` is token `i` after `l` layers (`l = 0` is the input),
//! and an edge from `(l + 1, i)` to `(l, j)` has the capacity `A'_l[i][j]`, the residual-aware
//! attention of [`crate::select::residual_layers`]. The flow from output token `i` to input token
//! `j` is the maximum flow from `(L, i)` to `(0, j)`. Unlike rollout, flows of one row do not sum
//! to 1: each is at most 1 and they overlap.
//!
//! One max-flow per (query, key) pair over `L·T²` edges: fine for a word's row, slow for whole
//! matrices, so inputs are limited to [`MAX_FLOW_TOKENS`] tokens.

use crate::select::residual_layers;
use crate::{AttentionMaps, VizError};

/// The longest input attention flow accepts.
pub const MAX_FLOW_TOKENS: usize = 64;

/// Capacities below this count as used up (float sums of attention weights never land on 0).
const EPS: f64 = 1e-12;

/// Flow from each of `sources` (output tokens) to every input token.
///
/// `progress(done, total)` is called after each of the `sources.len() · T` max-flows.
///
/// # Shapes
/// `maps.weights: [n_layers, n_heads, T, T]` → `[sources.len(), T]`.
pub fn attention_flow(
    maps: &AttentionMaps,
    sources: &[usize],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<f32>, VizError> {
    let t = maps.seq_len();
    if t > MAX_FLOW_TOKENS {
        return Err(VizError::FlowTooLong {
            seq_len: t,
            max: MAX_FLOW_TOKENS,
        });
    }
    if let Some(&bad) = sources.iter().find(|&&s| s >= t) {
        return Err(VizError::TokenOutOfRange {
            index: bad,
            seq_len: t,
        });
    }
    let layers = residual_layers(maps)?;
    let mut graph = Graph::layered(&layers, t);
    let total = sources.len() * t;
    let mut flows = Vec::with_capacity(total);
    for &source in sources {
        for sink in 0..t {
            graph.reset();
            flows.push(graph.max_flow(layers.len() * t + source, sink) as f32);
            progress(flows.len(), total);
        }
    }
    Ok(flows)
}

/// A flow network in compressed adjacency form; edge `e ^ 1` is the reverse of edge `e`.
struct Graph {
    /// Edges leaving node `v`: `first[v]..first[v + 1]` in `order`.
    first: Vec<usize>,
    order: Vec<usize>,
    to: Vec<usize>,
    capacity: Vec<f64>,
    residual: Vec<f64>,
    level: Vec<i32>,
    next_arc: Vec<usize>,
}

impl Graph {
    /// Nodes `l·T + i` for `l` in `0..=L`; edges `(l + 1, i) → (l, j)` with capacity `A'_l[i][j]`.
    fn layered(layers: &[Vec<f32>], t: usize) -> Graph {
        let n_nodes = (layers.len() + 1) * t;
        let mut from = Vec::new();
        let mut to = Vec::new();
        let mut capacity = Vec::new();
        for (l, a) in layers.iter().enumerate() {
            for i in 0..t {
                for j in 0..t {
                    let c = f64::from(a[i * t + j]);
                    if c > 0.0 {
                        from.extend([(l + 1) * t + i, l * t + j]);
                        to.extend([l * t + j, (l + 1) * t + i]);
                        capacity.extend([c, 0.0]);
                    }
                }
            }
        }
        let mut first = vec![0usize; n_nodes + 1];
        for &v in &from {
            first[v + 1] += 1;
        }
        for v in 0..n_nodes {
            first[v + 1] += first[v];
        }
        let mut fill = first.clone();
        let mut order = vec![0usize; from.len()];
        for (e, &v) in from.iter().enumerate() {
            order[fill[v]] = e;
            fill[v] += 1;
        }
        Graph {
            first,
            order,
            to,
            residual: capacity.clone(),
            capacity,
            level: vec![0; n_nodes],
            next_arc: vec![0; n_nodes],
        }
    }

    fn reset(&mut self) {
        self.residual.copy_from_slice(&self.capacity);
    }

    /// Dinic's algorithm.
    fn max_flow(&mut self, source: usize, sink: usize) -> f64 {
        let mut total = 0.0;
        while self.build_levels(source, sink) {
            self.next_arc
                .copy_from_slice(&self.first[..self.level.len()]);
            loop {
                let pushed = self.push(source, sink, f64::INFINITY);
                if pushed <= EPS {
                    break;
                }
                total += pushed;
            }
        }
        total
    }

    fn build_levels(&mut self, source: usize, sink: usize) -> bool {
        self.level.iter_mut().for_each(|l| *l = -1);
        self.level[source] = 0;
        let mut queue = std::collections::VecDeque::from([source]);
        while let Some(v) = queue.pop_front() {
            for &e in &self.order[self.first[v]..self.first[v + 1]] {
                let w = self.to[e];
                if self.residual[e] > EPS && self.level[w] < 0 {
                    self.level[w] = self.level[v] + 1;
                    queue.push_back(w);
                }
            }
        }
        self.level[sink] >= 0
    }

    fn push(&mut self, v: usize, sink: usize, limit: f64) -> f64 {
        if v == sink {
            return limit;
        }
        while self.next_arc[v] < self.first[v + 1] {
            let e = self.order[self.next_arc[v]];
            let w = self.to[e];
            if self.residual[e] > EPS && self.level[w] == self.level[v] + 1 {
                let pushed = self.push(w, sink, limit.min(self.residual[e]));
                if pushed > EPS {
                    self.residual[e] -= pushed;
                    self.residual[e ^ 1] += pushed;
                    return pushed;
                }
            }
            self.next_arc[v] += 1;
        }
        0.0
    }
}
