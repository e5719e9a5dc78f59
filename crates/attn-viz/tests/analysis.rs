//! Hand-derived small cases for word merging, selections, rollout, flow, statistics, lookup and
//! bars; each expected value is worked out in a comment.

mod common;

use attn_viz::VizError;
use attn_viz::bars::{
    BarStyle, bar, decimals_for, display_width, heavy, pad_start, render_bars, truncate_to_width,
};
use attn_viz::flow::attention_flow;
use attn_viz::lookup::soft_lookup;
use attn_viz::select::{Selection, residual_layers, rollout, select};
use attn_viz::stats::{Leading, has_special_tokens, head_stats, notable_heads, uniform_shares};
use attn_viz::words::{self, keep_and_renormalise, merge_matrix};
use common::{EVEN_CAUSAL_3, abc_tokens, assert_close, hand_maps, tok};

fn labels(units: &[words::Unit]) -> Vec<&str> {
    units.iter().map(|u| u.label.as_str()).collect()
}

#[test]
fn subwords_merge_into_the_words_of_the_input() {
    // "The Eiffel": the 0..3, e 4..5, ##iff 5..8, ##el 8..10.
    let tokens = vec![
        tok("[CLS]", None, 0),
        tok("the", Some((0, 3)), 0),
        tok("e", Some((4, 5)), 0),
        tok("##iff", Some((5, 8)), 0),
        tok("##el", Some((8, 10)), 0),
        tok("[SEP]", None, 0),
    ];
    let maps = hand_maps("The Eiffel", None, tokens, 1, 1, vec![0.0; 36]);
    let units = words::words(&maps).unwrap();
    assert_eq!(labels(&units), ["[CLS]", "The", "Eiffel", "[SEP]"]);
    assert_eq!(units[2].tokens, [2, 3, 4]);
    assert!(units[0].special && !units[2].special);
}

#[test]
fn punctuation_touching_a_word_stays_its_own_word() {
    // "Paris, France": paris 0..5, "," 5..6 (touches, but "," is not a letter), france 7..13.
    let tokens = vec![
        tok("paris", Some((0, 5)), 0),
        tok(",", Some((5, 6)), 0),
        tok("france", Some((7, 13)), 0),
    ];
    let maps = hand_maps("Paris, France", None, tokens, 1, 1, vec![0.0; 9]);
    assert_eq!(
        labels(&words::words(&maps).unwrap()),
        ["Paris", ",", "France"]
    );
}

#[test]
fn byte_level_tokens_with_leading_spaces_start_new_words() {
    // GPT-2 style: "The" 0..3, "Ġcat" 3..7 (its span holds the space), "s" 7..8 continues "cat".
    let tokens = vec![
        tok("The", Some((0, 3)), 0),
        tok("Ġcat", Some((3, 7)), 0),
        tok("s", Some((7, 8)), 0),
    ];
    let maps = hand_maps("The cats", None, tokens, 1, 1, vec![0.0; 9]);
    let units = words::words(&maps).unwrap();
    assert_eq!(labels(&units), ["The", "cats"]);
    assert_eq!(units[1].tokens, [1, 2]);
}

#[test]
fn pair_tokens_take_their_text_from_the_pair() {
    let tokens = vec![tok("q", Some((0, 1)), 0), tok("x", Some((2, 3)), 1)];
    let maps = hand_maps("q", Some("a x"), tokens, 1, 1, vec![0.0; 4]);
    assert_eq!(labels(&words::words(&maps).unwrap()), ["q", "x"]);
    // GPT-2 puts no token between the texts: the pair's first token came right after the first
    // text's last, whose end (11) lies past the pair's text ("on mat" is 6 bytes), and every
    // word view of a GPT-2 pair panicked.
    let tokens = vec![
        tok("The", Some((0, 3)), 0),
        tok("Ġcat", Some((3, 7)), 0),
        tok("Ġsat", Some((7, 11)), 0),
        tok("on", Some((0, 2)), 1),
        tok("Ġmat", Some((2, 6)), 1),
    ];
    let maps = hand_maps("The cat sat", Some("on mat"), tokens, 1, 1, vec![0.2; 25]);
    assert_eq!(
        labels(&words::words(&maps).unwrap()),
        ["The", "cat", "sat", "on", "mat"]
    );
}

#[test]
fn bad_spans_and_segments_are_errors() {
    let maps = hand_maps("ab", None, vec![tok("x", Some((1, 5)), 0)], 1, 1, vec![0.0]);
    assert!(matches!(
        words::words(&maps),
        Err(VizError::BadSpan {
            index: 0,
            span: (1, 5),
            text_len: 2
        })
    ));
    // "é" is two bytes: a span ending inside it is not a character range.
    let maps = hand_maps("é", None, vec![tok("x", Some((0, 1)), 0)], 1, 1, vec![0.0]);
    assert!(matches!(words::words(&maps), Err(VizError::BadSpan { .. })));
    let maps = hand_maps("ab", None, vec![tok("x", Some((0, 1)), 1)], 1, 1, vec![0.0]);
    let err = words::words(&maps).unwrap_err();
    assert!(matches!(
        err,
        VizError::BadSegment {
            index: 0,
            segment: 1
        }
    ));
    assert!(err.to_string().contains("segment 1"));
}

#[test]
fn merging_sums_weights_to_a_word_and_averages_weights_from_it() {
    // Units A = {0}, B = {1, 2}.
    // A's row: to A 0.5, to B 0.25 + 0.25 = 0.5.
    // B's row: mean of rows 1 and 2: to A (0.2 + 0.6) / 2 = 0.4, to B (0.8 + 0.4) / 2 = 0.6.
    let m = [0.5, 0.25, 0.25, 0.2, 0.4, 0.4, 0.6, 0.2, 0.2];
    let units = vec![
        words::Unit {
            label: "A".into(),
            tokens: vec![0],
            segment: 0,
            special: false,
        },
        words::Unit {
            label: "B".into(),
            tokens: vec![1, 2],
            segment: 0,
            special: false,
        },
    ];
    let merged = merge_matrix(&m, 3, &units);
    assert_close(&merged, &[0.5, 0.5, 0.4, 0.6], 1e-6);
    // Keeping only B: its row is [0.6] → renormalised to [1].
    assert_close(&keep_and_renormalise(&merged, 2, &[1]), &[1.0], 1e-6);
}

/// 2 layers × 2 heads over 2 tokens:
/// L0: H0 = [[1,0],[1,0]], H1 = [[0,1],[0,1]] → mean [[.5,.5],[.5,.5]]
/// L1: H0 = H1 = [[0,1],[0,1]]               → mean [[0,1],[0,1]]
fn two_layer_maps() -> attn_viz::AttentionMaps {
    let weights = vec![
        1.0, 0.0, 1.0, 0.0, // L0 H0
        0.0, 1.0, 0.0, 1.0, // L0 H1
        0.0, 1.0, 0.0, 1.0, // L1 H0
        0.0, 1.0, 0.0, 1.0, // L1 H1
    ];
    let tokens = vec![tok("a", Some((0, 1)), 0), tok("b", Some((2, 3)), 0)];
    hand_maps("a b", None, tokens, 2, 2, weights)
}

#[test]
fn selections_average_the_right_heads() {
    let maps = two_layer_maps();
    let sel = |s| select(&maps, s).unwrap();
    assert_close(
        &sel(Selection::Head { layer: 0, head: 1 }),
        &[0.0, 1.0, 0.0, 1.0],
        0.0,
    );
    assert_close(
        &sel(Selection::Layer { layer: 0 }),
        &[0.5, 0.5, 0.5, 0.5],
        1e-7,
    );
    // All = mean of the layer means: ([.5,.5] + [0,1]) / 2 = [.25,.75] in each row.
    assert_close(&sel(Selection::All), &[0.25, 0.75, 0.25, 0.75], 1e-7);
}

#[test]
fn rollout_multiplies_residual_layers_from_the_input_up() {
    // A'0 = .5·[[.5,.5],[.5,.5]] + .5·I = [[.75,.25],[.25,.75]]
    // A'1 = .5·[[0,1],[0,1]]     + .5·I = [[.5,.5],[0,1]]
    // R = A'1 · A'0 = [[.5·.75+.5·.25, .5·.25+.5·.75], [.25, .75]] = [[.5,.5],[.25,.75]]
    // (the other order, A'0 · A'1, would give [[.375,.625],[.125,.875]]).
    let maps = two_layer_maps();
    let layers = residual_layers(&maps).unwrap();
    assert_close(&layers[0], &[0.75, 0.25, 0.25, 0.75], 1e-7);
    assert_close(&layers[1], &[0.5, 0.5, 0.0, 1.0], 1e-7);
    assert_close(&rollout(&maps).unwrap(), &[0.5, 0.5, 0.25, 0.75], 1e-7);
    assert_close(
        &select(&maps, Selection::Rollout).unwrap(),
        &[0.5, 0.5, 0.25, 0.75],
        1e-7,
    );
}

#[test]
fn attention_flow_is_the_max_flow_through_the_layers() {
    // Capacities (A'1 from layer 2 to 1, A'0 from layer 1 to 0, see the rollout test):
    // from (2,0) to (0,0): via (1,0) min(.5, .75) = .5, via (1,1) min(.5, .25) = .25 → .75
    // from (2,0) to (0,1): via (1,0) min(.5, .25) = .25, via (1,1) min(.5, .75) = .5 → .75
    // from (2,1): its only edge goes to (1,1) (capacity 1), then .25 to (0,0) and .75 to (0,1).
    let maps = two_layer_maps();
    let mut calls = 0;
    let flows = attention_flow(&maps, &[0, 1], |done, total| {
        calls += 1;
        assert_eq!((done, total), (calls, 4));
    })
    .unwrap();
    assert_close(&flows, &[0.75, 0.75, 0.25, 0.75], 1e-6);
    assert_eq!(calls, 4);
}

#[test]
fn attention_flow_refuses_long_inputs_and_bad_sources() {
    let maps = two_layer_maps();
    let err = attention_flow(&maps, &[2], |_, _| {}).unwrap_err();
    assert!(matches!(
        err,
        VizError::TokenOutOfRange {
            index: 2,
            seq_len: 2
        }
    ));
    let t = 65;
    let tokens = (0..t).map(|_| tok("[X]", None, 0)).collect();
    let long = hand_maps("", None, tokens, 1, 1, vec![1.0 / t as f32; t * t]);
    let err = attention_flow(&long, &[0], |_, _| {}).unwrap_err();
    assert!(matches!(
        err,
        VizError::FlowTooLong {
            seq_len: 65,
            max: 64
        }
    ));
    assert!(err.to_string().contains("64 tokens"));
}

#[test]
fn layer_and_head_out_of_range_name_the_valid_range() {
    let maps = two_layer_maps();
    let err = select(&maps, Selection::Layer { layer: 2 }).unwrap_err();
    assert!(matches!(
        err,
        VizError::LayerOutOfRange {
            layer: 2,
            n_layers: 2
        }
    ));
    assert!(err.to_string().contains("layers are 0..=1"), "{err}");
    let err = select(&maps, Selection::Head { layer: 1, head: 5 }).unwrap_err();
    assert!(matches!(
        err,
        VizError::HeadOutOfRange {
            head: 5,
            n_heads: 2
        }
    ));
    assert!(err.to_string().contains("heads are 0..=1"), "{err}");
}

#[test]
fn malformed_maps_are_refused() {
    let mut maps = two_layer_maps();
    maps.weights.pop();
    let err = maps.validate().unwrap_err();
    assert!(matches!(
        err,
        VizError::WeightsShape {
            got: 15,
            seq_len: 2,
            ..
        }
    ));
    assert!(err.to_string().contains("need 16"), "{err}");
    let mut maps = two_layer_maps();
    maps.weights[13] = f32::NAN; // L1 H1, row 0, column 1
    assert!(matches!(
        maps.validate(),
        Err(VizError::BadWeight {
            layer: 1,
            head: 1,
            row: 0,
            col: 1,
            ..
        })
    ));
    let mut maps = two_layer_maps();
    maps.weights[2] = -0.5;
    assert!(matches!(maps.validate(), Err(VizError::BadWeight { .. })));
    // Rows that are no softmax: 2.0 everywhere made `heads` print an entropy of −27.7.
    let mut maps = two_layer_maps();
    maps.weights.iter_mut().for_each(|w| *w = 2.0);
    let err = maps.validate().unwrap_err();
    assert!(
        matches!(
            err,
            VizError::RowSum {
                layer: 0,
                head: 0,
                row: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("sum to 4; each row of a softmax sums to 1"),
        "{err}"
    );
    let mut maps = two_layer_maps();
    maps.weights[13] += 0.005; // L1 H1, row 0: within the tolerance
    maps.validate().unwrap();
    maps.weights[13] += 0.01;
    assert!(matches!(
        maps.validate(),
        Err(VizError::RowSum {
            layer: 1,
            head: 1,
            row: 0,
            ..
        })
    ));
    let mut maps = two_layer_maps();
    maps.tokens.clear();
    assert!(matches!(maps.validate(), Err(VizError::NoTokens)));
    let mut maps = two_layer_maps();
    maps.n_heads = 0;
    assert!(matches!(maps.validate(), Err(VizError::NoHeads { .. })));
}

#[test]
fn head_statistics_of_a_hand_made_head() {
    // Tokens [CLS] a [SEP]; rows [1,0,0], [.5,0,.5], [0,0,1].
    // entropy: (0 + ln 2 + 0) / 3; [CLS]: (1 + .5 + 0) / 3 = .5; [SEP]: (0 + .5 + 1) / 3 = .5
    // same: (1 + 0 + 1) / 3; previous (queries 1, 2): (.5 + 0) / 2; next (queries 0, 1): (0 + .5) / 2
    // distance leaves [CLS]/[SEP] out: no query gives "a" anything, so 0 (with them it was
    // (0 + (.5·1 + .5·1) + 0) / 3 = 1/3, a head that parks on [CLS] and [SEP] "reaching")
    let tokens = vec![
        tok("[CLS]", None, 0),
        tok("a", Some((0, 1)), 0),
        tok("[SEP]", None, 0),
    ];
    let w = vec![1.0, 0.0, 0.0, 0.5, 0.0, 0.5, 0.0, 0.0, 1.0];
    let maps = hand_maps("a", None, tokens, 1, 1, w);
    let s = &head_stats(&maps).unwrap()[0].shares;
    let got = [
        s.entropy, s.cls, s.sep, s.same, s.previous, s.next, s.distance,
    ];
    let ln2 = std::f32::consts::LN_2;
    assert_close(
        &got,
        &[ln2 / 3.0, 0.5, 0.5, 2.0 / 3.0, 0.25, 0.25, 0.0],
        1e-6,
    );
    // Without special tokens (GPT-2) the [CLS] figure is the first token's: rows [1,0,0],
    // [.5,.5,0], [.2,.3,.5] give it (1 + .5 + .2) / 3; the distance leaves it out too:
    // (0 + 0 + .3·1) / 3.
    let gpt2 = hand_maps(
        "a b c",
        None,
        vec![
            tok("a", Some((0, 1)), 0),
            tok("b", Some((2, 3)), 0),
            tok("c", Some((4, 5)), 0),
        ],
        1,
        1,
        vec![1.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.2, 0.3, 0.5],
    );
    assert!(!has_special_tokens(&gpt2) && has_special_tokens(&maps));
    let g = &head_stats(&gpt2).unwrap()[0].shares;
    assert_close(&[g.cls, g.sep, g.distance], &[1.7 / 3.0, 0.0, 0.1], 1e-6);
    // A head that parks 98% on [CLS] and gives the farthest word the rest reaches 0.02 · its
    // distance, not the distance: [CLS] a b c d e [SEP], every row [.98 0 0 0 0 .02 0].
    let parked_tokens: Vec<_> = ["[CLS]", "a", "b", "c", "d", "e", "[SEP]"]
        .iter()
        .enumerate()
        .map(|(k, t)| match *t {
            "[CLS]" | "[SEP]" => tok(t, None, 0),
            _ => tok(t, Some((2 * (k - 1), 2 * (k - 1) + 1)), 0),
        })
        .collect();
    let row = [0.98, 0.0, 0.0, 0.0, 0.0, 0.02, 0.0];
    let parked = hand_maps("a b c d e", None, parked_tokens, 1, 1, row.repeat(7));
    let p = &head_stats(&parked).unwrap()[0].shares;
    // Query i reaches |i − 5| tokens with .02: (5 + 4 + 3 + 2 + 1 + 0 + 1) · .02 / 7.
    assert_close(&[p.distance], &[16.0 * 0.02 / 7.0], 1e-6);
    let uniform = uniform_shares(&maps).unwrap();
    let notable = notable_heads(&head_stats(&maps).unwrap(), &uniform, Leading::Cls);
    let roles: Vec<&str> = notable.iter().map(|n| n.role.as_str()).collect();
    // One head: no comparison with other heads (it was named both the broadest and the most
    // focused); against even attention (ln 3 nats) its ln 2 / 3 is the most focused.
    assert!(
        !roles
            .iter()
            .any(|r| r.contains("broadest") || r.contains("distance")),
        "{roles:?}"
    );
    assert!(roles.contains(&"is the most focused"), "{roles:?}");
    // previous/next (.25) are under the 0.3 floor; [CLS], [SEP] and self (≥ .5) are named.
    assert!(roles.contains(&"attends to [CLS]") && roles.contains(&"attends to the token itself"));
    assert!(
        !roles
            .iter()
            .any(|r| r.contains("previous") || r.contains("next")),
        "{roles:?}"
    );
}

/// On a causal model a query sees only itself and the tokens before it: even attention over
/// three tokens gives self shares (1 + 1/2 + 1/3)/3 and previous-token shares (1/2 + 1/3)/2.
/// Heads that attend evenly are not notable (a tiny GPT-2's were all named); a head that
/// puts 0.9 on the previous token is.
#[test]
fn heads_are_notable_against_even_attention_over_the_keys_they_see() {
    let (tokens, even) = (abc_tokens(), EVEN_CAUSAL_3);
    let previous = [1.0, 0.0, 0.0, 0.9, 0.1, 0.0, 0.05, 0.9, 0.05];
    let two_even = hand_maps("a b c", None, tokens.clone(), 1, 2, [even, even].concat());
    let uniform = uniform_shares(&two_even).unwrap();
    // ln 1, ln 2, ln 3; the distance leaves out the first token (no special tokens here):
    // (0 + 0 + 1/3 · 1) / 3.
    let entropy = (2f32.ln() + 3f32.ln()) / 3.0;
    assert_close(
        &[
            uniform.entropy,
            uniform.same,
            uniform.previous,
            uniform.next,
            uniform.distance,
        ],
        &[
            entropy,
            (1.0 + 0.5 + 1.0 / 3.0) / 3.0,
            (0.5 + 1.0 / 3.0) / 2.0,
            0.0,
            1.0 / 9.0,
        ],
        1e-6,
    );
    assert_eq!(
        notable_heads(
            &head_stats(&two_even).unwrap(),
            &uniform,
            Leading::of(&two_even)
        ),
        []
    );

    let with_previous = hand_maps(
        "a b c",
        None,
        tokens.clone(),
        1,
        2,
        [even, previous].concat(),
    );
    let uniform = uniform_shares(&with_previous).unwrap();
    let notable = notable_heads(
        &head_stats(&with_previous).unwrap(),
        &uniform,
        Leading::of(&with_previous),
    );
    let roles: Vec<(usize, &str)> = notable.iter().map(|n| (n.head, n.role.as_str())).collect();
    assert!(
        roles.contains(&(1, "attends to the previous token")),
        "{roles:?}"
    );
    assert!(roles.contains(&(1, "is the most focused")), "{roles:?}");

    // One weight past the diagonal: not causal, even over all three keys.
    let mut open = even;
    open[1] = 0.25;
    open[0] = 0.75;
    let maps = hand_maps("a b c", None, tokens, 1, 1, open.to_vec());
    let uniform = uniform_shares(&maps).unwrap();
    assert_close(
        &[uniform.entropy, uniform.same],
        &[3f32.ln(), 1.0 / 3.0],
        1e-6,
    );
}

#[test]
fn soft_lookup_is_a_softmax_of_scaled_cosines() {
    // cosines 1, 0, -1 (the first key is [2, 0]: length does not matter).
    // T = 1: softmax(1, 0, -1) = (e, 1, 1/e) / (e + 1 + 1/e) = (.665241, .244728, .090031)
    let keys = [vec![2.0, 0.0], vec![0.0, 3.0], vec![-1.0, 0.0]];
    let l = soft_lookup(&[1.0, 0.0], &keys, 1.0).unwrap();
    assert_close(&l.cosine, &[1.0, 0.0, -1.0], 1e-6);
    assert_close(&l.weights, &[0.665_241, 0.244_728, 0.090_031], 1e-6);
    // T = 0.5 doubles the scores: softmax(2, 0, -2) = (e², 1, e⁻²) / (7.389056 + 1 + .135335)
    //   = (.866813, .117310, .015876)
    let l = soft_lookup(&[1.0, 0.0], &keys, 0.5).unwrap();
    assert_close(&l.scaled, &[2.0, 0.0, -2.0], 1e-6);
    assert_close(&l.weights, &[0.866_813, 0.117_310, 0.015_876], 1e-6);
}

#[test]
fn soft_lookup_errors() {
    let none: [Vec<f32>; 0] = [];
    assert!(matches!(
        soft_lookup(&[1.0], &none, 1.0),
        Err(VizError::NoEntries)
    ));
    for t in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            soft_lookup(&[1.0], &[vec![1.0]], t),
            Err(VizError::BadTemperature { .. })
        ));
    }
    // Below f32's smallest normal number, cosines 1 and 0.71 scale to inf and inf: the softmax
    // would be inf - inf = NaN. At that number they are 8.5e37 and 6.0e37: weights 1 and 0.
    let keys = [vec![1.0, 0.0], vec![1.0, 1.0]];
    let err = soft_lookup(&[1.0, 0.0], &keys, 1e-39).unwrap_err();
    assert!(matches!(err, VizError::BadTemperature { .. }), "{err}");
    assert!(err.to_string().contains("1.1754944e-38"), "{err}");
    let l = soft_lookup(&[1.0, 0.0], &keys, f32::MIN_POSITIVE).unwrap();
    assert_eq!(l.weights, [1.0, 0.0]);
    let err = soft_lookup(&[1.0, 0.0], &[vec![1.0, 0.0], vec![1.0]], 1.0).unwrap_err();
    assert!(matches!(
        err,
        VizError::EmbeddingSize {
            index: 1,
            expected: 2,
            got: 1
        }
    ));
    let err = soft_lookup(&[1.0, 0.0], &[vec![1.0, 0.0], vec![0.0, 0.0]], 1.0).unwrap_err();
    assert!(err.to_string().contains("key 1"), "{err}");
    let err = soft_lookup(&[0.0, 0.0], &[vec![1.0, 0.0]], 1.0).unwrap_err();
    assert!(err.to_string().contains("the query"), "{err}");
}

#[test]
fn bars_scale_to_the_largest_weight() {
    // 0.30 of max 0.30 → 8 of 8 blocks; 0.25 → 8·0.25/0.30 = 6.67 → 7; 0.02 → 0.53 → 1;
    // 0.01 → 0.27 → 0 blocks, shown as "▁"; 0 → "▁".
    assert_eq!(bar(0.30, 0.30, 8), "████████");
    assert_eq!(bar(0.25, 0.30, 8), "███████");
    assert_eq!(bar(0.02, 0.30, 8), "█");
    assert_eq!(bar(0.01, 0.30, 8), "▁");
    assert_eq!(bar(0.0, 0.30, 8), "▁");
}

#[test]
fn bar_lines_look_like_the_notes() {
    let rows = vec![("The".to_string(), 0.05), ("Eiffel".to_string(), 0.30)];
    let plain = render_bars(
        &rows,
        &[1],
        BarStyle {
            width: 8,
            colour: false,
        },
    );
    // 0.05 / 0.30 · 8 = 1.33 → 1 block.
    assert_eq!(plain, "  The      [0.05]  █\n  Eiffel   [0.30]  ████████\n");
    let coloured = render_bars(
        &rows,
        &[1],
        BarStyle {
            width: 8,
            colour: true,
        },
    );
    assert!(coloured.contains("\x1b[") && !plain.contains('\x1b'));
    // Labels longer than 8 widen the column for every row.
    let rows = vec![("architecture".to_string(), 0.2), ("by".to_string(), 0.1)];
    let lines = render_bars(
        &rows,
        &[],
        BarStyle {
            width: 4,
            colour: false,
        },
    );
    assert_eq!(
        lines,
        "  architecture [0.20]  ████\n  by           [0.10]  ██\n"
    );
}

#[test]
fn heavy_words_are_those_at_least_half_the_largest() {
    assert_eq!(heavy(&[0.30, 0.25, 0.05, 0.25]), [0, 1, 3]);
    assert_eq!(heavy(&[0.5, 0.1]), [0]);
    // At most three.
    assert_eq!(heavy(&[0.2, 0.2, 0.2, 0.2, 0.2]), [0, 1, 2]);
    assert!(heavy(&[0.0, 0.0]).is_empty());
}

#[test]
fn small_weights_get_more_decimals() {
    // Largest ≥ 0.1: the notes' two decimals. 0.05 → -log10 = 1.3 → 3 decimals ("0.050");
    // 0.0037 → 2.43 → 4 decimals ("0.0037").
    assert_eq!(decimals_for(0.30), 2);
    assert_eq!(decimals_for(0.05), 3);
    assert_eq!(decimals_for(0.0037), 4);
    assert_eq!(decimals_for(0.0), 2);
    let rows = vec![("a".to_string(), 0.0037), ("b".to_string(), 0.001)];
    let lines = render_bars(
        &rows,
        &[],
        BarStyle {
            width: 4,
            colour: false,
        },
    );
    assert_eq!(lines, "  a        [0.0037]  ████\n  b        [0.0010]  █\n");
}

#[test]
fn a_lone_space_token_joins_the_word_after_it() {
    // "a unb": "a" 0..1, "Ġ" 1..2 (only the space), "un" 2..4, "b" 4..5 → "a", "unb".
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("Ġ", Some((1, 2)), 0),
        tok("un", Some((2, 4)), 0),
        tok("b", Some((4, 5)), 0),
    ];
    let maps = hand_maps("a unb", None, tokens, 1, 1, vec![0.25; 16]);
    let units = words::words(&maps).unwrap();
    assert_eq!(labels(&units), ["a", "unb"]);
    assert_eq!(units[1].tokens, [1, 2, 3]);
}

#[test]
fn cjk_ideographs_are_words_of_their_own() {
    // "我爱北京": one token per ideograph, 3 bytes each (0..3, 3..6, 6..9, 9..12); their spans
    // touch and each is a letter, yet BERT splits CJK ideographs into words of their own.
    let tokens = vec![
        tok("我", Some((0, 3)), 0),
        tok("爱", Some((3, 6)), 0),
        tok("北", Some((6, 9)), 0),
        tok("京", Some((9, 12)), 0),
    ];
    let maps = hand_maps("我爱北京", None, tokens, 1, 1, vec![0.25; 16]);
    assert_eq!(
        labels(&words::words(&maps).unwrap()),
        ["我", "爱", "北", "京"]
    );
}

/// Text written decomposed: "cafe\u{301}" (the accent a combining mark after the "e") and
/// "nai\u{308}ve". BERT strips the accents, so no token covers the marks and the word was
/// labelled "cafe" (`--focus` of the written word failed); GPT-2 gives the mark tokens of their
/// own, which began new "words" ("nai", "\u{308}", "ve").
#[test]
fn combining_marks_stay_with_their_letters() {
    let bert = vec![
        tok("[CLS]", None, 0),
        tok("the", Some((0, 3)), 0),
        tok("cafe", Some((4, 8)), 0),
        tok("is", Some((11, 13)), 0),
        tok("[SEP]", None, 0),
    ];
    let maps = hand_maps("the cafe\u{301} is", None, bert, 1, 1, vec![0.2; 25]);
    assert_eq!(
        labels(&words::words(&maps).unwrap()),
        ["[CLS]", "the", "cafe\u{301}", "is", "[SEP]"]
    );
    // "nai\u{308}ve art": the mark is bytes 3..5, in two byte-level tokens.
    let gpt2 = vec![
        tok("na", Some((0, 2)), 0),
        tok("i", Some((2, 3)), 0),
        tok("Ì", Some((3, 5)), 0),
        tok("Ī", Some((3, 5)), 0),
        tok("ve", Some((5, 7)), 0),
        tok("Ġart", Some((7, 11)), 0),
    ];
    let maps = hand_maps("nai\u{308}ve art", None, gpt2, 1, 1, vec![1.0 / 6.0; 36]);
    assert_eq!(
        labels(&words::words(&maps).unwrap()),
        ["nai\u{308}ve", "art"]
    );
}

#[test]
fn byte_level_pieces_of_one_character_are_one_word() {
    // GPT-2 on "I love 🐱 cats": 🐱 (bytes 7..11) is three byte-level tokens, each with the
    // character's span (the first with its space, 6..11); "café": é (3..5) is two tokens.
    let tokens = vec![
        tok("I", Some((0, 1)), 0),
        tok("Ġlove", Some((1, 6)), 0),
        tok("ĠðŁ", Some((6, 11)), 0),
        tok("Ĳ", Some((7, 11)), 0),
        tok("±", Some((7, 11)), 0),
        tok("Ġcats", Some((11, 16)), 0),
    ];
    let maps = hand_maps("I love 🐱 cats", None, tokens, 1, 1, vec![1.0 / 6.0; 36]);
    let units = words::words(&maps).unwrap();
    assert_eq!(labels(&units), ["I", "love", "🐱", "cats"]);
    assert_eq!(units[2].tokens, [2, 3, 4]);
    let tokens = vec![
        tok("caf", Some((0, 3)), 0),
        tok("Ã", Some((3, 5)), 0),
        tok("©", Some((3, 5)), 0),
    ];
    let maps = hand_maps("café", None, tokens, 1, 1, vec![1.0 / 3.0; 9]);
    assert_eq!(labels(&words::words(&maps).unwrap()), ["café"]);
}

/// A zero-width space split a word that BERT reads as one (it deletes the space: "zero",
/// "##wi", … with a gap of 3 bytes), leaving a word that began with a `##` piece; GPT-2's
/// pieces of 👍🏽 and of 👨‍👩‍👧 (with its zero-width joiners, shown as invisible rows) were words
/// of their own.
#[test]
fn invisible_characters_and_emoji_sequences_do_not_split_words() {
    let bert = vec![
        tok("[CLS]", None, 0),
        tok("zero", Some((0, 4)), 0),
        tok("##wi", Some((7, 9)), 0),
        tok("##dt", Some((9, 11)), 0),
        tok("##h", Some((11, 12)), 0),
        tok("joiner", Some((13, 19)), 0),
        tok("[SEP]", None, 0),
    ];
    let maps = hand_maps(
        "zero\u{200b}width joiner",
        None,
        bert,
        1,
        1,
        vec![1.0 / 7.0; 49],
    );
    let units = words::words(&maps).unwrap();
    assert_eq!(labels(&units), ["[CLS]", "zerowidth", "joiner", "[SEP]"]);
    assert_eq!(units[1].tokens, [1, 2, 3, 4]);
    // GPT-2 on "a 👍🏽 👨‍👩‍👧 b": two pieces per emoji (the first with its space), one per
    // joiner (bytes 15..18 and 22..25).
    let gpt2 = vec![
        tok("a", Some((0, 1)), 0),
        tok("ĠðŁ", Some((1, 6)), 0),
        tok("ĳį", Some((2, 6)), 0),
        tok("ðŁ", Some((6, 10)), 0),
        tok("ı½", Some((6, 10)), 0),
        tok("ĠðŁ", Some((10, 15)), 0),
        tok("ĳ¨", Some((11, 15)), 0),
        tok("âĢį", Some((15, 18)), 0),
        tok("ðŁĳ©", Some((18, 22)), 0),
        tok("âĢį", Some((22, 25)), 0),
        tok("ðŁĳ§", Some((25, 29)), 0),
        tok("Ġb", Some((29, 31)), 0),
    ];
    let text = "a \u{1F44D}\u{1F3FD} \u{1F468}\u{200d}\u{1F469}\u{200d}\u{1F467} b";
    let maps = hand_maps(text, None, gpt2, 1, 1, vec![1.0 / 12.0; 144]);
    let units = words::words(&maps).unwrap();
    assert_eq!(
        labels(&units),
        [
            "a",
            "\u{1F44D}\u{1F3FD}",
            "\u{1F468}\u{200d}\u{1F469}\u{200d}\u{1F467}",
            "b"
        ]
    );
    assert_eq!(units[2].tokens, [5, 6, 7, 8, 9, 10]);
    // GPT-2 keeps invisible characters as tokens. A space and a zero-width space before a
    // word gave the label " b" (`trim` keeps U+200B); a zero-width space separates words (Thai
    // and Khmer write it between words); a zero-width non-joiner stays in its word and label,
    // as do emoji tags (England's flag); a token of nothing visible shows its code points.
    type Case<'a> = (&'a str, Vec<(usize, usize)>, Vec<&'a str>);
    let cases: [Case; 5] = [
        ("a \u{200b} b", vec![(0, 1), (1, 5), (5, 7)], vec!["a", "b"]),
        (
            "hello\u{200b}world",
            vec![(0, 5), (5, 8), (8, 13)],
            vec!["hello", "world"],
        ),
        (
            "mi\u{200c}x",
            vec![(0, 2), (2, 5), (5, 6)],
            vec!["mi\u{200c}x"],
        ),
        (
            "go \u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F} team",
            vec![(0, 2), (2, 7), (7, 11), (11, 31), (31, 36)],
            vec![
                "go",
                "\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}",
                "team",
            ],
        ),
        (
            "\u{200b}\u{200b}",
            vec![(0, 3), (3, 6)],
            vec!["U+200B U+200B"],
        ),
    ];
    for (text, spans, want) in cases {
        let n = spans.len();
        let tokens = spans.into_iter().map(|s| tok("x", Some(s), 0)).collect();
        let maps = hand_maps(text, None, tokens, 1, 1, vec![1.0 / n as f32; n * n]);
        assert_eq!(labels(&words::words(&maps).unwrap()), want, "{text:?}");
    }
    // Which tokens: the zero-width space token joins the word before it, not the one after
    // (its label alone cannot tell); a joiner before a space neither hides the space nor makes
    // a word of its own.
    let tokens = [(0, 5), (5, 8), (8, 13)]
        .map(|s| tok("x", Some(s), 0))
        .to_vec();
    let maps = hand_maps("hello\u{200b}world", None, tokens, 1, 1, vec![1.0 / 3.0; 9]);
    let units = words::words(&maps).unwrap();
    assert_eq!(
        units.iter().map(|u| u.tokens.clone()).collect::<Vec<_>>(),
        [vec![0, 1], vec![2]]
    );
    let tokens = [(0, 1), (1, 5), (5, 7), (7, 9)]
        .map(|s| tok("x", Some(s), 0))
        .to_vec();
    let maps = hand_maps("a \u{200d} b c", None, tokens, 1, 1, vec![0.25; 16]);
    assert_eq!(labels(&words::words(&maps).unwrap()), ["a", "b", "c"]);
    // Two flags, each a pair of regional indicators, one token per letter: 🇫🇷 and 🇩🇪.
    let flags = (0..4)
        .map(|i| tok("x", Some((4 * i, 4 * i + 4)), 0))
        .collect();
    let text = "\u{1F1EB}\u{1F1F7}\u{1F1E9}\u{1F1EA}";
    let maps = hand_maps(text, None, flags, 1, 1, vec![0.25; 16]);
    assert_eq!(
        labels(&words::words(&maps).unwrap()),
        ["\u{1F1EB}\u{1F1F7}", "\u{1F1E9}\u{1F1EA}"]
    );
}

/// Labels are padded by the columns a terminal gives them: "北京" (2 chars, 4 columns) and
/// "cafe\u{301}" (5 chars, 4 columns) put their weights one column off when padded by chars.
#[test]
fn bars_line_up_by_display_columns() {
    let rows = vec![
        ("the".to_string(), 0.2),
        ("北京".to_string(), 0.5),
        ("cafe\u{301}".to_string(), 0.3),
    ];
    let out = render_bars(&rows, &[], BarStyle::default());
    let columns: Vec<usize> = out
        .lines()
        .map(|line| display_width(&line[..line.find('[').unwrap()]))
        .collect();
    assert_eq!(columns, [11, 11, 11], "{out}");
    assert_eq!(pad_start("北京", 6), "  北京");
    assert_eq!(truncate_to_width("北京天安门", 5), "北京");
    assert_eq!(truncate_to_width("cafe\u{301}s", 4), "cafe\u{301}");
}
