//! Maps that hold some weight rows only (`AttentionMaps::rows`, what `explain --focus` asks a
//! model for on a long prompt): `explain` and `head_grid` on them equal the same views of the
//! whole maps, the views that need every row refuse them, and bad rows are clear errors.

mod common;

use attn_viz::explain::{ExplainOptions, Explanation, Method, explain, head_grid, query_rows};
use attn_viz::select::{Selection, select};
use attn_viz::{AttentionMaps, VizError};
use common::{assert_close, hand_maps, tok};

/// "the cat sat on the mat" between [CLS] and [SEP], "mat" split in two: 2 layers × 3 heads of
/// uneven rows from a fixed LCG; under `causal` each row spread over the keys up to itself.
fn maps(causal: bool) -> AttentionMaps {
    let text = "the cat sat on the mat";
    let mut tokens = vec![tok("[CLS]", None, 0)];
    for (a, b) in [(0, 3), (4, 7), (8, 11), (12, 14), (15, 18), (19, 21)] {
        tokens.push(tok(&text[a..b], Some((a, b)), 0));
    }
    tokens.push(tok("##t", Some((21, 22)), 0));
    tokens.push(tok("[SEP]", None, 0));
    let t = tokens.len();
    let mut state = 7u64;
    let mut weights = Vec::new();
    for _ in 0..2 * 3 {
        for i in 0..t {
            let seen = if causal { i + 1 } else { t };
            let mut row: Vec<f32> = (0..t)
                .map(|j| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    if j < seen {
                        0.05 + (state >> 40) as f32 / (1u64 << 24) as f32
                    } else {
                        0.0
                    }
                })
                .collect();
            let sum: f32 = row.iter().sum();
            row.iter_mut().for_each(|w| *w /= sum);
            weights.extend(row);
        }
    }
    hand_maps(text, None, tokens, 2, 3, weights)
}

/// `maps` keeping only the rows `rows`.
fn only_rows(maps: &AttentionMaps, rows: &[usize]) -> AttentionMaps {
    let t = maps.seq_len();
    let weights = (maps.weights.chunks_exact(t * t))
        .flat_map(|head| rows.iter().flat_map(move |&i| &head[i * t..(i + 1) * t]))
        .copied()
        .collect();
    AttentionMaps {
        weights,
        rows: Some(rows.to_vec()),
        ..maps.clone()
    }
}

fn options(focus: Option<&str>, selection: Selection) -> ExplainOptions {
    ExplainOptions {
        method: Method::Attention { selection },
        focus: focus.map(str::to_string),
        ..ExplainOptions::default()
    }
}

fn assert_same(a: &Explanation, b: &Explanation, what: &str) {
    assert_eq!(a.rows.len(), b.rows.len(), "{what}: rows");
    for (x, y) in a.rows.iter().zip(&b.rows) {
        assert_eq!(
            (&x.word, x.masked, x.heavy),
            (&y.word, y.masked, y.heavy),
            "{what}"
        );
        for (p, q) in [(x.weight, y.weight), (x.raw, y.raw), (x.even, y.even)] {
            assert!((p - q).abs() <= 1e-6, "{what}: {} {p} against {q}", x.word);
        }
    }
    assert_eq!(
        (a.causal, &a.focuses_on, &a.notes),
        (b.causal, &b.focuses_on, &b.notes),
        "{what}"
    );
    assert!(
        (a.hidden_share - b.hidden_share).abs() <= 1e-6,
        "{what}: hidden share"
    );
}

#[test]
fn explain_from_the_rows_it_reads_equals_explain_from_every_row() {
    let selections = [
        Selection::All,
        Selection::Layer { layer: 1 },
        Selection::Head { layer: 0, head: 2 },
    ];
    for causal in [false, true] {
        let whole = maps(causal);
        for focus in ["cat", "mat", "the#2", "on"] {
            for selection in selections {
                let o = options(Some(focus), selection);
                let rows = query_rows(&whole, &o).unwrap();
                let what = format!("causal {causal}, --focus {focus}, {selection:?}");
                // "mat" is two tokens: both rows, nothing else.
                assert_eq!(rows.len(), if focus == "mat" { 2 } else { 1 }, "{what}");
                let part = only_rows(&whole, &rows);
                let a = explain(&part, &o, |_, _| {}).unwrap();
                assert_same(&a, &explain(&whole, &o, |_, _| {}).unwrap(), &what);
            }
            let o = options(Some(focus), Selection::All);
            let part = only_rows(&whole, &query_rows(&whole, &o).unwrap());
            let (a, b) = (
                head_grid(&part, &o, "sat").unwrap(),
                head_grid(&whole, &o, "sat").unwrap(),
            );
            assert_close(&a.weights.concat(), &b.weights.concat(), 1e-6);
        }
    }
}

#[test]
fn rows_only_maps_say_whether_the_model_is_causal_from_the_rows_they_hold() {
    // A bidirectional model's rows of "cat" see keys after it; a causal model's do not.
    for causal in [false, true] {
        let whole = maps(causal);
        let o = options(Some("cat"), Selection::All);
        let part = only_rows(&whole, &query_rows(&whole, &o).unwrap());
        assert_eq!(explain(&part, &o, |_, _| {}).unwrap().causal, causal);
    }
}

#[test]
fn views_that_need_every_row_refuse_rows_only_maps() {
    let whole = maps(false);
    let part = only_rows(&whole, &[2, 5]);
    assert!(part.validate_rows().is_ok());
    let err = part.validate().unwrap_err();
    assert!(
        matches!(
            err,
            VizError::RowsOnly {
                held: 2,
                seq_len: 9
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("2 of the 9 query tokens"), "{err}");
    assert!(matches!(
        select(&part, Selection::All),
        Err(VizError::RowsOnly { .. })
    ));
    let rollout = options(Some("cat"), Selection::Rollout);
    assert_eq!(
        query_rows(&whole, &rollout).unwrap(),
        (0..9).collect::<Vec<_>>()
    );
    let err = explain(&part, &rollout, |_, _| {}).unwrap_err();
    assert!(matches!(err, VizError::RowsOnly { .. }), "{err:?}");
    // A row the view looks from that the maps do not hold.
    let err = explain(&part, &options(Some("sat"), Selection::All), |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("do not hold row 3"), "{err}");
}

#[test]
fn bad_rows_are_clear_errors() {
    let whole = maps(false);
    let mut part = only_rows(&whole, &[2, 5]);
    part.rows = Some(vec![5, 2]);
    let err = part.validate_rows().unwrap_err().to_string();
    assert!(err.contains("row 2 follows row 5"), "{err}");
    part.rows = Some(vec![2, 9]);
    let err = part.validate_rows().unwrap_err().to_string();
    assert!(err.contains("row 9 is past the 9 tokens"), "{err}");
    part.rows = Some(vec![2]);
    let err = part.validate_rows().unwrap_err().to_string();
    assert!(err.contains("× 1 rows × 9 tokens need 54"), "{err}");
    let mut bad = only_rows(&whole, &[2, 5]);
    bad.weights[9 + 3] = -1.0;
    let err = bad.validate_rows().unwrap_err();
    assert!(
        matches!(
            err,
            VizError::BadWeight {
                layer: 0,
                head: 0,
                row: 5,
                col: 3,
                ..
            }
        ),
        "{err:?}"
    );
}
