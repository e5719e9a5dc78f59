//! Views of real attention (tests/data/minilm, made by Hugging Face transformers) checked
//! against independent brute-force sums, plus pictures written and read back.

mod common;
mod golden;

use attn_viz::VizError;
use attn_viz::explain::{ExplainOptions, explain};
use attn_viz::flow::attention_flow;
use attn_viz::heatmap::{Heatmap, Marks, Panel, missing_glyphs, write_grid, write_heatmap};
use attn_viz::select::{Selection, residual_layers, select};
use attn_viz::stats::head_stats;
use attn_viz::words;
use common::{assert_close, hand_maps, tok};
use golden::golden_maps;

#[test]
fn eiffel_is_one_word_and_punctuation_stays_apart() {
    let maps = golden_maps("text01");
    let units = words::words(&maps).unwrap();
    let context: Vec<&str> = units
        .iter()
        .filter(|u| u.segment == 1 && !u.special)
        .map(|u| u.label.as_str())
        .collect();
    assert_eq!(
        context,
        [
            "The", "Eiffel", "Tower", "is", "located", "in", "Paris", ",", "France", "."
        ]
    );
    let eiffel = units.iter().find(|u| u.label == "Eiffel" && u.segment == 1);
    assert_eq!(eiffel.unwrap().tokens.len(), 3); // e ##iff ##el
}

/// The question → context row, summed straight from the raw `[L, H, T, T]` weights: mean over
/// layers and heads, over each question word's tokens, then over the question's words; summed
/// over each context word's tokens; renormalised over the context's words.
fn brute_force_question_row(maps: &attn_viz::AttentionMaps) -> Vec<f32> {
    let units = words::words(maps).unwrap();
    let t = maps.seq_len();
    let (l, h) = (maps.n_layers, maps.n_heads);
    let at = |layer: usize, head: usize, i: usize, j: usize| {
        f64::from(maps.weights[((layer * h + head) * t + i) * t + j])
    };
    let question: Vec<_> = units
        .iter()
        .filter(|u| u.segment == 0 && !u.special)
        .collect();
    let context: Vec<_> = units
        .iter()
        .filter(|u| u.segment == 1 && !u.special)
        .collect();
    let mut row = Vec::new();
    for c in &context {
        let mut total = 0.0f64;
        for q in &question {
            let mut word = 0.0f64;
            for &i in &q.tokens {
                for &j in &c.tokens {
                    for layer in 0..l {
                        for head in 0..h {
                            word += at(layer, head, i, j);
                        }
                    }
                }
            }
            total += word / (l * h * q.tokens.len()) as f64;
        }
        row.push(total / question.len() as f64);
    }
    let sum: f64 = row.iter().sum();
    row.iter().map(|x| (x / sum) as f32).collect()
}

#[test]
fn the_eiffel_question_matches_a_brute_force_sum() {
    let maps = golden_maps("text01");
    let options = ExplainOptions {
        question: true,
        ..ExplainOptions::default()
    };
    let e = explain(&maps, &options, |_, _| {}).unwrap();
    let got: Vec<f32> = e.rows.iter().map(|r| r.weight).collect();
    assert_close(&got, &brute_force_question_row(&maps), 1e-5);
    assert_close(&[got.iter().sum::<f32>()], &[1.0], 1e-5);
}

#[test]
fn rollout_rows_sum_to_one_on_real_attention() {
    let maps = golden_maps("text00");
    let t = maps.seq_len();
    let r = select(&maps, Selection::Rollout).unwrap();
    let sums: Vec<f32> = r.chunks_exact(t).map(|row| row.iter().sum()).collect();
    assert_close(&sums, &vec![1.0; t], 1e-4);
}

#[test]
fn one_layer_flow_is_the_residual_attention() {
    // With one layer every (query, key) pair is joined by one edge: its capacity is the flow.
    let mut maps = golden_maps("text02");
    let t = maps.seq_len();
    maps.n_layers = 1;
    maps.weights.truncate(maps.n_heads * t * t);
    let all: Vec<usize> = (0..t).collect();
    let flows = attention_flow(&maps, &all, |_, _| {}).unwrap();
    assert_close(&flows, &residual_layers(&maps).unwrap()[0], 1e-6);
}

#[test]
fn head_statistics_of_real_heads_are_in_range() {
    let maps = golden_maps("text00");
    let stats = head_stats(&maps).unwrap();
    assert_eq!(stats.len(), 6 * 12);
    let ln_t = (maps.seq_len() as f32).ln();
    for s in stats.iter().map(|s| &s.shares) {
        assert!(s.entropy >= 0.0 && s.entropy <= ln_t + 1e-5, "{s:?}");
        for share in [s.cls, s.sep, s.previous, s.next, s.same] {
            assert!((0.0..=1.0 + 1e-5).contains(&share), "{s:?}");
        }
        assert!(s.cls + s.sep <= 1.0 + 1e-5, "{s:?}");
        assert!(
            s.distance >= 0.0 && s.distance <= maps.seq_len() as f32,
            "{s:?}"
        );
    }
}

fn png_size(path: &std::path::Path) -> (u32, u32) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let reader = decoder.read_info().unwrap();
    let info = reader.info();
    (info.width, info.height)
}

fn merged_all(maps: &attn_viz::AttentionMaps) -> (Vec<String>, Vec<f32>) {
    let units = words::words(maps).unwrap();
    let m = select(maps, Selection::All).unwrap();
    let merged = words::merge_matrix(&m, maps.seq_len(), &units);
    (units.iter().map(|u| u.label.clone()).collect(), merged)
}

#[test]
fn heatmaps_of_real_attention_are_written_as_png_and_svg() {
    let maps = golden_maps("text01");
    let (labels, matrix) = merged_all(&maps);
    let dir = tempfile::tempdir().unwrap();
    let heatmap = Heatmap {
        title: "Eiffel",
        labels: &labels,
        columns: None,
        matrix: &matrix,
        marks: Marks::default(),
    };
    let png = dir.path().join("a.PNG");
    write_heatmap(&png, &heatmap).unwrap();
    let (w, h) = png_size(&png);
    // 19 words at 40 px a cell (760 / 19) make a 760 px matrix, plus labels and the colour bar.
    assert!(w > 760 && h > 760, "{w}×{h}");
    let svg = dir.path().join("a.svg");
    write_heatmap(&svg, &heatmap).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.starts_with("<svg") && text.contains("\nEiffel\n"),
        "{}",
        &text[..200]
    );
}

#[test]
fn grids_hold_every_head() {
    let maps = golden_maps("text02");
    let t = maps.seq_len();
    let panels: Vec<Panel> = (0..maps.n_layers * maps.n_heads)
        .map(|k| Panel {
            title: format!("L{} H{}", k / maps.n_heads, k % maps.n_heads),
            matrix: maps.weights[k * t * t..(k + 1) * t * t].to_vec(),
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("grid.png");
    write_grid(&png, "grid", t, maps.n_heads, &panels, Marks::default()).unwrap();
    let (w, h) = png_size(&png);
    assert!(w > 12 * 100 && h > 6 * 100, "{w}×{h}");
    let svg = dir.path().join("grid.svg");
    write_grid(&svg, "grid", t, maps.n_heads, &panels, Marks::default()).unwrap();
    assert!(
        std::fs::read_to_string(&svg)
            .unwrap()
            .contains("\nL5 H11\n")
    );
}

#[test]
fn a_128_token_heatmap_keeps_12_pixels_a_row() {
    let n = 128;
    let labels: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    let matrix = vec![1.0 / n as f32; n * n];
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("long.png");
    let heatmap = Heatmap {
        title: "long",
        labels: &labels,
        columns: None,
        matrix: &matrix,
        marks: Marks::default(),
    };
    write_heatmap(&png, &heatmap).unwrap();
    let (w, h) = png_size(&png);
    assert!(w >= 128 * 12 && h >= 128 * 12, "{w}×{h}");
}

#[test]
fn a_cross_attention_heatmap_is_as_tall_as_its_rows_and_as_wide_as_its_columns() {
    let rows: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    let columns: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    let matrix = vec![0.25f32; 40 * 4];
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("cross.png");
    let heatmap = Heatmap {
        title: "cross",
        labels: &rows,
        columns: Some(&columns),
        matrix: &matrix,
        marks: Marks {
            causal: true,
            divider: Some(2),
        },
    };
    write_heatmap(&png, &heatmap).unwrap();
    let (w, h) = png_size(&png);
    // 40 rows of 19 px (760 / 40) down, 4 such columns across.
    assert!(h >= 40 * 19 && w < 4 * 19 + 400, "{w}×{h}");
    let svg = dir.path().join("cross.svg");
    write_heatmap(&svg, &heatmap).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("\ns3\n") && text.contains("\nt39\n"),
        "every label drawn"
    );
    assert!(!text.contains("masked"), "no causal mark on a rectangle");
}

#[test]
fn picture_errors_name_the_problem() {
    let labels = vec!["a".to_string(), "b".to_string()];
    let matrix = vec![0.5; 4];
    let heatmap = Heatmap {
        title: "t",
        labels: &labels,
        columns: None,
        matrix: &matrix,
        marks: Marks::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    for name in ["a.jpg", "noextension"] {
        let err = write_heatmap(&dir.path().join(name), &heatmap).unwrap_err();
        assert!(matches!(err, VizError::UnknownImageFormat { .. }), "{err}");
        assert!(err.to_string().contains(".png or .svg"), "{err}");
    }
    let missing = dir.path().join("no/such/folder/a.png");
    let err = write_heatmap(&missing, &heatmap).unwrap_err();
    assert!(matches!(err, VizError::Write { .. }));
    assert!(err.to_string().contains("no/such/folder/a.png"), "{err}");
    assert!(!missing.exists());
    let short = vec![0.5; 3];
    let bad = Heatmap {
        matrix: &short,
        ..heatmap
    };
    let err = write_heatmap(&dir.path().join("a.png"), &bad).unwrap_err();
    assert!(matches!(err, VizError::WeightsShape { got: 3, .. }));
    // Rows over other columns: the matrix must have rows × columns values.
    let columns: Vec<String> = ["x", "y", "z"].map(String::from).to_vec();
    let wide = Heatmap {
        columns: Some(&columns),
        ..bad
    };
    let err = write_heatmap(&dir.path().join("a.png"), &wide).unwrap_err();
    assert!(err.to_string().contains("rows × 3 tokens need"), "{err}");
    let err = write_grid(&dir.path().join("g.png"), "g", 2, 4, &[], Marks::default()).unwrap_err();
    assert!(matches!(err, VizError::NothingToShow { .. }));
}

#[test]
fn merged_rows_of_real_attention_still_sum_to_one() {
    let maps = golden_maps("text06");
    let (labels, merged) = merged_all(&maps);
    let n = labels.len();
    let sums: Vec<f32> = merged.chunks_exact(n).map(|r| r.iter().sum()).collect();
    assert_close(&sums, &vec![1.0; n], 1e-4);
    assert!(labels.contains(&"Vaswani".to_string()), "{labels:?}");
    // A hand-made token keeps its segment's spelling.
    let maps = hand_maps(
        "Ab",
        None,
        vec![tok("ab", Some((0, 2)), 0)],
        1,
        1,
        vec![1.0],
    );
    assert_eq!(words::words(&maps).unwrap()[0].label, "Ab");
}

#[test]
fn long_titles_are_cut_not_drawn_wider() {
    // A maps file's 20,000-character model name made a 266,955-pixel-wide picture; the title is
    // cut to the picture's width (at most 4 lines) and the picture keeps its size.
    let labels = vec!["a".to_string(), "b".to_string()];
    let matrix = vec![0.5; 4];
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("t.png");
    let short = Heatmap {
        title: "t",
        labels: &labels,
        columns: None,
        matrix: &matrix,
        marks: Marks::default(),
    };
    write_heatmap(&png, &short).unwrap();
    let (w, h) = png_size(&png);
    for title in [
        format!("\"a b\" — all heads — {}", "m".repeat(20_000)),
        vec!["piece"; 5_000].join(" — "),
    ] {
        let long = Heatmap {
            title: &title,
            labels: &labels,
            columns: None,
            matrix: &matrix,
            marks: Marks::default(),
        };
        write_heatmap(&png, &long).unwrap();
        let (long_w, long_h) = png_size(&png);
        assert_eq!(long_w, w, "{}", &title[..20]);
        assert!(long_h <= h + 3 * 24, "{long_w}×{long_h} against {w}×{h}");
        let svg = dir.path().join("t.svg");
        write_heatmap(&svg, &long).unwrap();
        assert!(std::fs::read_to_string(&svg).unwrap().contains('…'));
    }
}

#[test]
fn a_title_piece_wider_than_the_picture_wraps_at_its_spaces() {
    // Two 2-word columns make the narrowest picture (420 px): the last piece, wider than that,
    // was cut with "…" ("rows renorma…"); now it goes on at the next line.
    let labels = vec!["a".to_string(), "b".to_string()];
    let matrix = vec![0.3, 0.7, 0.6, 0.4];
    let title =
        "\"a b\" — all heads — words, [CLS]/[SEP] hidden (they took 80%), rows renormalised";
    let heatmap = Heatmap {
        title,
        labels: &labels,
        columns: None,
        matrix: &matrix,
        marks: Marks::default(),
    };
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    write_heatmap(&svg, &heatmap).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(!text.contains('…'), "{text}");
    assert!(text.contains("renormalised\n"), "{text}");
}

#[test]
fn the_colour_bar_names_its_top() {
    // Largest weight .297: ticks 0.0, 0.1, 0.2 and the top, 0.30 (as it did not say, the scale
    // read as ending at 0.2). At .2 the last tick is the top: no second label.
    let labels = vec!["a".to_string(), "b".to_string()];
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    for (max, top) in [(0.297f32, Some("0.30")), (0.2, None)] {
        let matrix = vec![max, 0.1, 0.05, 0.1];
        let heatmap = Heatmap {
            title: "t",
            labels: &labels,
            columns: None,
            matrix: &matrix,
            marks: Marks::default(),
        };
        write_heatmap(&svg, &heatmap).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        for tick in ["\n0.0\n", "\n0.1\n", "\n0.2\n"] {
            assert!(text.contains(tick), "{tick} in {max}");
        }
        let labels = text.matches("\n0.").count();
        match top {
            Some(top) => {
                assert!(text.contains(&format!("\n{top}\n")), "{max}");
                assert_eq!(labels, 4, "{max}");
            }
            None => assert_eq!(labels, 3, "{max}"),
        }
    }
}

#[test]
fn pictures_past_the_pixel_limit_are_refused_before_drawing() {
    // 60 × 60 one-token panels: 60 · 136 + 130 = 8290 px wide, 20 + 24 (title) + 15 (caption) +
    // 6 + 60 · 146 + 20 = 8845 high, 73.3 million pixels (220 MB of RGB) against a limit of 64
    // million.
    let panels: Vec<Panel> = (0..3600)
        .map(|k| Panel {
            title: format!("L{} H{}", k / 60, k % 60),
            matrix: vec![1.0],
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("g.png");
    let err = write_grid(&png, "g", 1, 60, &panels, Marks::default()).unwrap_err();
    assert!(
        matches!(
            err,
            VizError::TooLarge {
                width: 8290,
                height: 8845,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("64 million"), "{err}");
    assert!(!png.exists());
    // A column count whose pixels overflow an i32 (and a u64) is refused the same way.
    let err = write_grid(&png, "g", 1, usize::MAX, &panels[..1], Marks::default()).unwrap_err();
    assert!(matches!(err, VizError::TooLarge { .. }), "{err}");
}

#[test]
fn colour_bar_ticks_show_small_weights() {
    // 300 tokens, uniform: every weight is 1/300 = 0.0033, so the ticks are 0.0033, 0.0017 and
    // 0.0000 (with two decimals all three were 0.00).
    let n = 300;
    let labels: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    let matrix = vec![1.0 / n as f32; n * n];
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("u.svg");
    let heatmap = Heatmap {
        title: "uniform",
        labels: &labels,
        columns: None,
        matrix: &matrix,
        marks: Marks::default(),
    };
    write_heatmap(&svg, &heatmap).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    for tick in ["\n0.000\n", "\n0.001\n", "\n0.002\n", "\n0.003\n"] {
        assert!(text.contains(tick), "no tick {tick:?}");
    }
    assert!(!text.contains("\n0.004\n"));
}

#[test]
fn colour_bar_ticks_are_round_steps() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("t.svg");
    let labels = vec!["a".to_string(), "b".to_string()];
    // (largest weight, the ticks it gets, the first tick it must not get)
    let cases = [
        (0.297, &["0.0", "0.1", "0.2"][..], "0.3"),
        (1.0, &["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"][..], "1.2"),
        (0.46, &["0.0", "0.1", "0.2", "0.3", "0.4"][..], "0.5"),
        (0.07, &["0.00", "0.02", "0.04", "0.06"][..], "0.08"),
    ];
    for (max, ticks, beyond) in cases {
        let matrix = [max, 1.0 - max, 1.0 - max, max].map(|w: f32| w.min(max));
        let heatmap = Heatmap {
            title: "ticks",
            labels: &labels,
            columns: None,
            matrix: &matrix,
            marks: Marks::default(),
        };
        write_heatmap(&svg, &heatmap).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        for tick in ticks {
            assert!(
                text.contains(&format!("\n{tick}\n")),
                "{max}: no tick {tick}"
            );
        }
        assert!(
            !text.contains(&format!("\n{beyond}\n")),
            "{max}: tick {beyond}"
        );
    }
}

#[test]
fn masked_cells_are_grey_and_grids_keep_their_peaks() {
    // A previous-token head over 200 tokens: weight 1 just below the diagonal (row 0 on
    // itself), 0 elsewhere, causal.
    let n = 200;
    let mut matrix = vec![0.0f32; n * n];
    for i in 0..n {
        matrix[i * n + i.saturating_sub(1)] = 1.0;
    }
    let labels: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("c.svg");
    let causal = Marks {
        causal: true,
        divider: None,
    };
    let grey = "fill=\"#DEDEDE\"";
    for marks in [Marks::default(), causal] {
        let heatmap = Heatmap {
            title: "previous token",
            labels: &labels,
            columns: None,
            matrix: &matrix,
            marks,
        };
        write_heatmap(&svg, &heatmap).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        // One grey run per row but the last (nothing after its own key).
        assert_eq!(
            text.matches(grey).count(),
            if marks.causal { n - 1 } else { 0 }
        );
        assert_eq!(text.contains("grey: masked"), marks.causal);
        // 200 labels at 7.7 px a row: every 2nd is written, and the caption says so.
        assert!(
            text.contains("labels: every 2nd of the 200 rows"),
            "{}",
            &text[..600]
        );
    }
    // Pooled to 96 blocks, the largest weight (1.0, viridis' yellow) survives in every block
    // on the diagonal; averaged, a block of 2 × 2 or 3 × 3 cells held 0.5 or 0.33 at most.
    let panels = [Panel {
        title: "L0 H0".into(),
        matrix,
    }];
    write_grid(&svg, "grid", n, 1, &panels, causal).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    let yellow = text.matches("fill=\"#FDE725\"").count();
    assert!(yellow >= 90, "{yellow} blocks at full weight");
    assert!(
        text.contains("each shows the largest weight"),
        "{}",
        &text[..800]
    );
}

#[test]
fn glyphs_the_png_font_lacks_are_named() {
    assert_eq!(
        missing_glyphs(["Crème brûlée — naïve café", "Zürich 12€"]),
        []
    );
    assert_eq!(
        missing_glyphs(["東京の猫", "東 🎉"]),
        ['東', '京', 'の', '猫', '🎉']
    );
}
