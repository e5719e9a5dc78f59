//! Hand-made attention maps for small cases, and a comparison that names the worst error.

use attn_viz::{AttentionMaps, Token};

/// A hand-made token; specials have no span.
pub fn tok(text: &str, span: Option<(usize, usize)>, segment: usize) -> Token {
    Token {
        text: text.to_string(),
        id: 0,
        span,
        segment,
        special: span.is_none(),
    }
}

/// Hand-made maps.
pub fn hand_maps(
    text: &str,
    pair: Option<&str>,
    tokens: Vec<Token>,
    n_layers: usize,
    n_heads: usize,
    weights: Vec<f32>,
) -> AttentionMaps {
    AttentionMaps {
        model: "hand".to_string(),
        text: text.to_string(),
        pair: pair.map(str::to_string),
        tokens,
        n_layers,
        n_heads,
        weights,
        rows: None,
    }
}

/// Asserts two slices agree to `tol`, naming the worst index.
pub fn assert_close(got: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(got.len(), expected.len(), "lengths differ");
    let (worst, err) = got
        .iter()
        .zip(expected)
        .map(|(g, e)| (g - e).abs())
        .enumerate()
        .fold(
            (0, 0.0f32),
            |acc, (i, e)| if e > acc.1 { (i, e) } else { acc },
        );
    assert!(
        err <= tol,
        "max abs error {err} at index {worst}: got {}, expected {}",
        got[worst],
        expected[worst]
    );
}

/// "a b c", one token a word.
#[allow(dead_code)] // for explain.rs and analysis.rs, not every test file
pub fn abc_tokens() -> Vec<Token> {
    vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("c", Some((4, 5)), 0),
    ]
}

/// Three causal queries, each spreading its weight evenly over itself and the keys before it.
#[allow(dead_code)] // for explain.rs and analysis.rs, not every test file
pub const EVEN_CAUSAL_3: [f32; 9] = [
    1.0,
    0.0,
    0.0,
    0.5,
    0.5,
    0.0,
    1.0 / 3.0,
    1.0 / 3.0,
    1.0 / 3.0,
];
