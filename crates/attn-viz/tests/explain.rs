//! `explain` on hand-made maps: focus rows, word merging, hiding and renormalising special
//! tokens, question/context pairs, top-K and the errors. Expected values are derived in comments.

mod common;

use attn_viz::VizError;
use attn_viz::bars::BarStyle;
use attn_viz::explain::{
    ExplainOptions, Explanation, Level, Method, compare_grids, explain, head_grid, render,
    render_comparison, render_grid,
};
use attn_viz::select::Selection;
use common::{EVEN_CAUSAL_3, abc_tokens, assert_close, hand_maps, tok};

/// "a bc": [CLS] a b ##c [SEP], one layer, one head. Rows (query → key):
///   [CLS] [.2 .2 .2 .2 .2]
///   a     [.5 .1 .2 .1 .1]   → words: [CLS] .5, a .1, bc .3, [SEP] .1
///   b     [.4 .2 .1 .1 .2]
///   ##c   [.2 .2 .3 .1 .2]   → bc = mean(b, ##c) = [.3 .2 .2 .1 .2] → [CLS] .3, a .2, bc .3, [SEP] .2
///   [SEP] [.2 .2 .2 .2 .2]
fn maps() -> attn_viz::AttentionMaps {
    let tokens = vec![
        tok("[CLS]", None, 0),
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("##c", Some((3, 4)), 0),
        tok("[SEP]", None, 0),
    ];
    #[rustfmt::skip]
    let w = vec![
        0.2, 0.2, 0.2, 0.2, 0.2,
        0.5, 0.1, 0.2, 0.1, 0.1,
        0.4, 0.2, 0.1, 0.1, 0.2,
        0.2, 0.2, 0.3, 0.1, 0.2,
        0.2, 0.2, 0.2, 0.2, 0.2,
    ];
    hand_maps("a bc", None, tokens, 1, 1, w)
}

fn options(focus: Option<&str>) -> ExplainOptions {
    ExplainOptions {
        focus: focus.map(str::to_string),
        ..ExplainOptions::default()
    }
}

fn run(maps: &attn_viz::AttentionMaps, options: &ExplainOptions) -> Explanation {
    explain(maps, options, |_, _| {}).unwrap()
}

fn words_and_weights(e: &Explanation) -> (Vec<&str>, Vec<f32>) {
    (
        e.rows.iter().map(|r| r.word.as_str()).collect(),
        e.rows.iter().map(|r| r.weight).collect(),
    )
}

#[test]
fn a_focus_word_row_is_renormalised_over_the_words_shown() {
    // a → a .1, bc .3 (of 1; [CLS] and [SEP] took .6) → .25, .75.
    let e = run(&maps(), &options(Some("a")));
    let (words, weights) = words_and_weights(&e);
    assert_eq!(words, ["a", "bc"]);
    assert_close(&weights, &[0.25, 0.75], 1e-6);
    assert_close(&[e.hidden_share], &[0.6], 1e-6);
    // Even attention over the three tokens of the two words gives a 1/3 and bc 2/3: bc's .75
    // is under 1.5 times that, and no word stands out.
    let even: Vec<f32> = e.rows.iter().map(|r| r.even).collect();
    assert_close(&even, &[1.0 / 3.0, 2.0 / 3.0], 1e-6);
    assert!(e.focuses_on.is_empty() && e.spread);
    assert_eq!(e.rows[1].tokens, 2);
    assert!(!e.focus_is_default);
    assert!(e.notes.iter().any(|n| n.contains("60%")), "{:?}", e.notes);
}

#[test]
fn a_multi_token_focus_word_averages_its_tokens() {
    // bc → a .2, bc .3 → .4, .6; hidden .5. Case is ignored.
    let e = run(&maps(), &options(Some("BC")));
    assert_close(&words_and_weights(&e).1, &[0.4, 0.6], 1e-6);
    assert_close(&[e.hidden_share], &[0.5], 1e-6);
}

#[test]
fn without_a_focus_every_word_counts_once() {
    // mean(a's row, bc's row) = [CLS] .4, a .15, bc .3, [SEP] .15 → a 1/3, bc 2/3.
    let e = run(&maps(), &options(None));
    assert!(e.focus_is_default);
    assert_close(&words_and_weights(&e).1, &[1.0 / 3.0, 2.0 / 3.0], 1e-6);
    assert!(
        e.notes.iter().any(|n| n.contains("no --focus")),
        "{:?}",
        e.notes
    );
}

#[test]
fn special_tokens_shown_on_request_without_renormalising() {
    let mut o = options(Some("a"));
    o.special = true;
    let e = run(&maps(), &o);
    let (words, weights) = words_and_weights(&e);
    assert_eq!(words, ["[CLS]", "a", "bc", "[SEP]"]);
    assert_close(&weights, &[0.5, 0.1, 0.3, 0.1], 1e-6);
    assert_close(&[e.hidden_share], &[0.0], 1e-6);
}

#[test]
fn raw_tokens_on_request() {
    // ##c's row: a .2, b .3, ##c .1 (sum .6) → 1/3, 1/2, 1/6.
    let mut o = options(Some("##c"));
    o.level = Level::Tokens;
    let e = run(&maps(), &o);
    let (words, weights) = words_and_weights(&e);
    assert_eq!(words, ["a", "b", "##c"]);
    assert_close(&weights, &[1.0 / 3.0, 0.5, 1.0 / 6.0], 1e-6);
}

#[test]
fn top_k_keeps_the_heaviest_first() {
    let mut o = options(Some("a"));
    o.top = Some(1);
    let e = run(&maps(), &o);
    assert_eq!(words_and_weights(&e).0, ["bc"]);
    // a (.25 of the renormalised weight) is left out, and a note says so; [CLS]/[SEP] shown,
    // a .1 of 1 is left out: 10%.
    let left_out = |e: &Explanation| e.notes.iter().find(|n| n.contains("heaviest of")).cloned();
    assert_eq!(
        left_out(&e).as_deref(),
        Some("showing the 1 heaviest of 2 words: the other 1 holds 25% of the weight")
    );
    o.special = true;
    let e = run(&maps(), &o);
    assert_eq!(words_and_weights(&e).0, ["[CLS]"]);
    assert_eq!(
        left_out(&e).as_deref(),
        Some("showing the 1 heaviest of 4 words: the other 3 hold 50% of the weight")
    );
    // Room for every word: no note, and the renormalising note does not speak of a top.
    o.special = false;
    o.top = Some(5);
    let e = run(&maps(), &o);
    assert_eq!(left_out(&e), None, "{:?}", e.notes);
    assert!(
        e.notes.iter().all(|n| !n.contains("heaviest")),
        "{:?}",
        e.notes
    );
}

#[test]
fn an_unknown_focus_lists_the_words() {
    let err = explain(&maps(), &options(Some("zzz")), |_, _| {}).unwrap_err();
    match &err {
        VizError::UnknownFocus {
            word, available, ..
        } => {
            assert_eq!(word, "zzz");
            assert_eq!(available, &["a", "bc"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string().contains(r#"the words are: "a", "bc""#),
        "{err}"
    );
}

#[test]
fn repeated_words_are_picked_by_number() {
    // "a a": [a a], rows [.9 .1] and [.3 .7].
    let tokens = vec![tok("a", Some((0, 1)), 0), tok("a", Some((2, 3)), 0)];
    let maps = hand_maps("a a", None, tokens, 1, 1, vec![0.9, 0.1, 0.3, 0.7]);
    let first = run(&maps, &options(Some("a")));
    assert_close(&words_and_weights(&first).1, &[0.9, 0.1], 1e-6);
    assert!(first.notes.iter().any(|n| n.contains("occurs 2 times")));
    let second = run(&maps, &options(Some("a#2")));
    assert_close(&words_and_weights(&second).1, &[0.3, 0.7], 1e-6);
    let err = explain(&maps, &options(Some("a#3")), |_, _| {}).unwrap_err();
    assert!(matches!(
        err,
        VizError::FocusOccurrence {
            count: 2,
            occurrence: 3,
            ..
        }
    ));
    // One occurrence is "once".
    let err = explain(&self::maps(), &options(Some("a#2")), |_, _| {}).unwrap_err();
    assert!(
        err.to_string().contains("\"a\" occurs once in the input"),
        "{err}"
    );
    // #0 said "occurs 2 times; #0 asks for more".
    let err = explain(&maps, &options(Some("a#0")), |_, _| {}).unwrap_err();
    assert!(matches!(err, VizError::FocusZero { .. }), "{err:?}");
    assert!(err.to_string().contains("count from 1"), "{err}");
}

/// Question "q" and context "x y": [CLS] q [SEP] | x y [SEP]; q's row is
/// [.1 .2 .1 .3 .1 .2] → context words x .3, y .1 → .75, .25 (the rest, .6, hidden).
fn pair_maps() -> attn_viz::AttentionMaps {
    let tokens = vec![
        tok("[CLS]", None, 0),
        tok("q", Some((0, 1)), 0),
        tok("[SEP]", None, 0),
        tok("x", Some((0, 1)), 1),
        tok("y", Some((2, 3)), 1),
        tok("[SEP]", None, 1),
    ];
    let mut w = vec![1.0 / 6.0; 36];
    w[6..12].copy_from_slice(&[0.1, 0.2, 0.1, 0.3, 0.1, 0.2]);
    hand_maps("q", Some("x y"), tokens, 1, 1, w)
}

#[test]
fn questions_attend_to_the_context() {
    let mut o = options(None);
    o.question = true;
    let e = run(&pair_maps(), &o);
    let (words, weights) = words_and_weights(&e);
    assert_eq!(words, ["x", "y"]);
    assert_close(&weights, &[0.75, 0.25], 1e-6);
    assert_eq!(e.focus, "the question's words (averaged)");
    // A focus must be a question word.
    o.focus = Some("x".into());
    let err = explain(&pair_maps(), &o, |_, _| {}).unwrap_err();
    assert!(matches!(err, VizError::UnknownFocus { ref available, .. } if available == &["q"]));
    // ... and the message says the focus is looked for in the question.
    assert!(
        err.to_string()
            .starts_with("no word \"x\" in the question (--focus picks one of its words"),
        "{err}"
    );
}

#[test]
fn special_tokens_of_either_text_are_shown_with_special() {
    // With --special, q's row [.1 .2 .1 .3 .1 .2] shows [CLS] .1, [SEP] .1 (the question's),
    // x .3, y .1 and [SEP] .2 (the context's): .8 of it, renormalised; q's own .2 is the
    // hidden share. The rows stay the question's words: [CLS] and [SEP] are not averaged in.
    let mut o = options(None);
    o.question = true;
    o.special = true;
    let e = run(&pair_maps(), &o);
    let (words, weights) = words_and_weights(&e);
    assert_eq!(words, ["[CLS]", "[SEP]", "x", "y", "[SEP]"]);
    assert_close(&weights, &[0.125, 0.125, 0.375, 0.125, 0.25], 1e-6);
    assert_close(&[e.hidden_share], &[0.2], 1e-6);
    // Across from the context's "x" (row [1/6; 6]): [CLS], q, [SEP], [SEP]; x and y hidden.
    o.question = false;
    o.across = true;
    o.focus = Some("x".into());
    let e = run(&pair_maps(), &o);
    assert_eq!(words_and_weights(&e).0, ["[CLS]", "q", "[SEP]", "[SEP]"]);
    // Across without a focus reads from the first text, which is no question here.
    o.focus = None;
    o.special = false;
    assert_eq!(
        run(&pair_maps(), &o).focus,
        "the first text's words (averaged)"
    );
}

#[test]
fn a_question_needs_a_pair() {
    let mut o = options(None);
    o.question = true;
    assert!(matches!(
        explain(&maps(), &o, |_, _| {}),
        Err(VizError::NoPair)
    ));
}

#[test]
fn only_special_tokens_is_nothing_to_show() {
    let tokens = vec![tok("[CLS]", None, 0), tok("[SEP]", None, 0)];
    let maps = hand_maps("", None, tokens, 1, 1, vec![0.5; 4]);
    let err = explain(&maps, &options(None), |_, _| {}).unwrap_err();
    assert!(matches!(err, VizError::NothingToShow { .. }));
}

#[test]
fn out_of_range_selections_are_refused_before_anything_else() {
    let mut o = options(Some("a"));
    o.method = Method::Attention {
        selection: Selection::Head { layer: 0, head: 3 },
    };
    let err = explain(&maps(), &o, |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("heads are 0..=0"), "{err}");
}

#[test]
fn flow_rows_are_scaled_to_sum_to_one() {
    // One layer: the flow from a to each input token is A'[a][j] (a single edge each), where
    // A' = .5·A + .5·I: a's row [.25 .55 .1 .05 .05] → words a .55, bc .15 → .55/.7, .15/.7.
    let mut o = options(Some("a"));
    o.method = Method::Flow;
    let e = run(&maps(), &o);
    assert_close(&words_and_weights(&e).1, &[0.55 / 0.7, 0.15 / 0.7], 1e-6);
}

#[test]
fn rendering_follows_the_notes() {
    let e = run(&maps(), &options(Some("a")));
    let text = render(
        &e,
        BarStyle {
            width: 8,
            colour: false,
        },
    );
    // .25 / .75 · 8 = 2.67 → 3 blocks.
    assert!(
        text.contains("\n  a        [0.25]  ███\n  bc       [0.75]  ████████\n"),
        "{text}"
    );
    // [CLS]/[SEP] took 60%: the summary speaks of the rest; "bc" has two tokens, which even
    // attention gives two shares.
    assert!(
        text.contains(
            "No word stands out (among the words, which got 40% of this attention): the \
             heaviest, \"bc\" (2 tokens), weighs 0.75, under 1.5 × the 0.67 even attention would \
             give it\n"
        ),
        "{text}"
    );
    assert!(text.starts_with("Attention weights from \"a\""), "{text}");
    assert!(!text.contains('\x1b'));
    assert!(
        render(
            &e,
            BarStyle {
                width: 8,
                colour: true
            }
        )
        .contains('\x1b')
    );
}

#[test]
fn rollout_is_measured_against_the_rollout_of_even_attention() {
    // "a b c", causal, one layer of even attention. Rollout from "c": 0.5·[1/3 1/3 1/3] +
    // 0.5·[0 0 1] = [1/6 1/6 2/3]; that is also what rollout makes of even attention, so no
    // word stands out (against even attention's 1/3, "c" at 2/3 was named "heavily" focused).
    let maps = hand_maps("a b c", None, abc_tokens(), 1, 1, EVEN_CAUSAL_3.to_vec());
    let mut o = options(Some("c"));
    o.method = Method::Attention {
        selection: Selection::Rollout,
    };
    let e = run(&maps, &o);
    let expected = [1.0 / 6.0, 1.0 / 6.0, 2.0 / 3.0];
    assert_close(&words_and_weights(&e).1, &expected, 1e-6);
    let even: Vec<f32> = e.rows.iter().map(|r| r.even).collect();
    assert_close(&even, &expected, 1e-6);
    assert!(e.focuses_on.is_empty() && e.spread, "{:?}", e.focuses_on);
    assert!(
        e.notes
            .iter()
            .any(|n| n.starts_with("even attention here is the rollout of even")),
        "{:?}",
        e.notes
    );
}

#[test]
fn words_are_quoted_as_written() {
    // A decomposed "école" (e + U+0301): `{:?}` wrote "e\u{301}cole" in the title and summary
    // beside "école" on its bar. Quotes, backslashes and control characters are still escaped.
    let decomposed = "e\u{301}cole";
    let tokens = vec![
        tok(decomposed, Some((0, decomposed.len())), 0),
        tok("b", Some((decomposed.len() + 1, decomposed.len() + 2)), 0),
    ];
    let text = format!("{decomposed} b");
    let maps = hand_maps(&text, None, tokens, 1, 1, vec![0.9, 0.1, 0.5, 0.5]);
    let shown = render(&run(&maps, &options(Some(decomposed))), BarStyle::default());
    assert!(
        shown.starts_with(&format!("Attention weights from \"{decomposed}\"")),
        "{shown}"
    );
    assert!(!shown.contains("\\u{301}"), "{shown}");
    let quoted = format!("{:?}", attn_viz::bars::Quoted("a\"b\\c\u{1b}d"));
    assert_eq!(quoted, r#""a\"b\\c\u{1b}d""#);
}

#[test]
fn a_longest_bar_that_is_not_named_is_explained() {
    // "a bc d", one head; the row of "a" is [0 .4 .25 .25 .1 0]: a .4, bc .5 (two tokens),
    // d .1. Even attention over the four tokens gives a .25 and bc .5: "a" stands out (.4 ≥
    // .375) and is named, "bc" has the longest bar but not 1.5 × its .5, and the summary says
    // why.
    let tokens = vec![
        tok("[CLS]", None, 0),
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("##c", Some((3, 4)), 0),
        tok("d", Some((5, 6)), 0),
        tok("[SEP]", None, 0),
    ];
    let mut w = [1.0 / 6.0; 36].to_vec();
    w[6..12].copy_from_slice(&[0.0, 0.4, 0.25, 0.25, 0.1, 0.0]);
    let maps = hand_maps("a bc d", None, tokens, 1, 1, w);
    let e = run(&maps, &options(Some("a")));
    assert_eq!(words_and_weights(&e).0, ["a", "bc", "d"]);
    assert_close(&words_and_weights(&e).1, &[0.4, 0.5, 0.1], 1e-6);
    assert_eq!(e.focuses_on, ["a"]);
    let text = render(&e, BarStyle::default());
    let why = "\"bc\" (2 tokens) has the longest bar, 0.50, but that is under 1.5 × the 0.50 even \
               attention would give it\n";
    assert!(text.contains(why), "{text}");
    // From "bc" (uniform rows) no word stands out, and the usual line says so.
    let e = run(&maps, &options(Some("bc")));
    assert!(!render(&e, BarStyle::default()).contains("has the longest bar"));
}

#[test]
fn punctuation_is_shown_but_not_named_as_a_focus() {
    // "a .": both rows [.3 .7]; "." has the larger bar, but only "a" is named.
    let tokens = vec![tok("a", Some((0, 1)), 0), tok(".", Some((2, 3)), 0)];
    let maps = hand_maps("a .", None, tokens, 1, 1, vec![0.3, 0.7, 0.3, 0.7]);
    let e = run(&maps, &options(Some("a")));
    assert_eq!(words_and_weights(&e).0, ["a", "."]);
    // .3 is under 1.5 × an even share (.5): "a" does not stand out either.
    assert!(e.focuses_on.is_empty() && e.spread, "{:?}", e.focuses_on);
    // "a b .", rows [.6 .05 .35]: "a" stands out (.6 against .33), "." (.35) is not named.
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok(".", Some((4, 5)), 0),
    ];
    let maps = hand_maps("a b .", None, tokens, 1, 1, [0.6, 0.05, 0.35].repeat(3));
    let e = run(&maps, &options(Some("a")));
    assert_eq!(e.focuses_on, ["a"]);
}

#[test]
fn no_word_is_named_when_none_stands_out() {
    // [.4 .35 .25] against an even .33: .4 is under 1.5 × .33, so no word is named and the
    // summary says so; at [.55 .3 .15], "a" stands out (.5 is 1.5 × .33), "b" does not.
    let e = run(&three_words_with([0.4, 0.35, 0.25]), &options(Some("b")));
    assert!(e.focuses_on.is_empty() && e.spread);
    assert!(e.rows.iter().all(|r| !r.heavy));
    let text = render(&e, BarStyle::default());
    assert!(
        text.contains(
            "No word stands out: the heaviest, \"a\", weighs 0.40, under 1.5 × the 0.33 even \
             attention would give it"
        ),
        "{text}"
    );
    assert!(!text.contains("focuses heavily"), "{text}");
    let e = run(&three_words_with([0.55, 0.3, 0.15]), &options(Some("b")));
    assert_eq!(e.focuses_on, ["a"]);
    assert!(!e.spread);
}

#[test]
fn raw_token_focus_ignores_the_tokenizers_marks() {
    // GPT-2 tokens "The" "Ġcat": --tokens --focus cat finds "Ġcat" (row [.4 .6]).
    let tokens = vec![tok("The", Some((0, 3)), 0), tok("Ġcat", Some((3, 7)), 0)];
    let maps = hand_maps("The cat", None, tokens, 1, 1, vec![1.0, 0.0, 0.4, 0.6]);
    let mut o = options(Some("cat"));
    o.level = Level::Tokens;
    let e = run(&maps, &o);
    assert_eq!(e.focus, "Ġcat");
    assert_close(&words_and_weights(&e).1, &[0.4, 0.6], 1e-6);
}

#[test]
fn across_a_pair_shows_the_other_texts_words() {
    // Pair maps: [CLS] q [SEP] | x y [SEP]. From "y" (row 4, all 1/6) across: only "q" is in
    // the other text → weight 1. From "q" across: x, y as in the question view (.75, .25).
    let mut o = options(Some("y"));
    o.across = true;
    let e = run(&pair_maps(), &o);
    let (words, weights) = words_and_weights(&e);
    assert_eq!(words, ["q"]);
    assert_close(&weights, &[1.0], 1e-6);
    o.focus = Some("q".into());
    let e = run(&pair_maps(), &o);
    assert_eq!(words_and_weights(&e).0, ["x", "y"]);
    assert_close(&words_and_weights(&e).1, &[0.75, 0.25], 1e-6);
    // Without a pair there is no other text.
    assert!(matches!(
        explain(&maps(), &o, |_, _| {}),
        Err(VizError::NoPair)
    ));
}

/// A causal model's first text cannot see its pair: across, every weight was 0 under a footer
/// saying the weights shown were renormalised to sum to 1.
#[test]
fn across_to_words_that_got_nothing_says_so() {
    let mut maps = pair_maps();
    // Row 1 ("q") sees only [CLS] and itself, as a causal model's row would.
    maps.weights[6..12].copy_from_slice(&[0.4, 0.6, 0.0, 0.0, 0.0, 0.0]);
    let mut o = options(Some("q"));
    o.across = true;
    let e = run(&maps, &o);
    assert_eq!(words_and_weights(&e), (vec!["x", "y"], vec![0.0, 0.0]));
    assert!(
        e.notes
            .iter()
            .any(|n| n.contains("took all of this attention: the words shown got none")),
        "{:?}",
        e.notes
    );
    assert!(
        !e.notes.iter().any(|n| n.contains("renormalised")),
        "{:?}",
        e.notes
    );
}

/// "a b c" without special tokens, every row `row`.
fn three_words_with(row: [f32; 3]) -> attn_viz::AttentionMaps {
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("c", Some((4, 5)), 0),
    ];
    hand_maps("a b c", None, tokens, 1, 1, row.repeat(3))
}

/// "a b c", every row [.6 .3 .1].
fn three_words() -> attn_viz::AttentionMaps {
    three_words_with([0.6, 0.3, 0.1])
}

#[test]
fn top_k_names_only_the_words_it_shows() {
    // "a b c d", every row [.5 .4 .1 0]: "a" and "b" stand out from an even 1/4 (at least
    // .375), so both are named, heaviest first; --top 1 shows only "a", and only "a" is named.
    let tokens = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, w)| tok(w, Some((2 * i, 2 * i + 1)), 0))
        .collect();
    let two = hand_maps(
        "a b c d",
        None,
        tokens,
        1,
        1,
        [0.5, 0.4, 0.1, 0.0].repeat(4),
    );
    let e = run(&two, &options(Some("b")));
    assert_eq!(e.focuses_on, ["a", "b"]);
    let mut o = options(Some("b"));
    o.top = Some(1);
    let e = run(&two, &o);
    assert_eq!(words_and_weights(&e).0, ["a"]);
    assert_eq!(e.focuses_on, ["a"]);
    let text = render(&e, BarStyle::default());
    assert!(text.contains("Model focuses heavily on: \"a\"\n"), "{text}");
}

#[test]
fn highlighting_follows_rows_not_labels() {
    // "a b a", every row [.6 .35 .05]: from "b", the first "a" (.6) stands out from an even
    // 1/3 (at least .5) and is heavy; the second "a" (.05) is not, though it is spelled as the
    // first.
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("a", Some((4, 5)), 0),
    ];
    let maps = hand_maps("a b a", None, tokens, 1, 1, [0.6, 0.35, 0.05].repeat(3));
    let e = run(&maps, &options(Some("b")));
    let heavy: Vec<bool> = e.rows.iter().map(|r| r.heavy).collect();
    assert_eq!(heavy, [true, false, false]);
    let text = render(
        &e,
        BarStyle {
            width: 8,
            colour: true,
        },
    );
    let lines: Vec<&str> = text.lines().collect();
    // Bold yellow for the heavy rows, plain cyan for the rest.
    assert!(lines[1].contains("\x1b[1ma\x1b[0m"), "{:?}", lines[1]);
    assert!(
        lines[3].starts_with("  a ") && lines[3].contains("\x1b[36m"),
        "{:?}",
        lines[3]
    );
}

#[test]
fn only_punctuation_is_said_in_words() {
    // "...": three words "." that are not named as a focus; the line says why none is.
    let tokens = vec![
        tok(".", Some((0, 1)), 0),
        tok(".", Some((1, 2)), 0),
        tok(".", Some((2, 3)), 0),
    ];
    let maps = hand_maps("...", None, tokens, 1, 1, vec![1.0 / 3.0; 9]);
    let e = run(&maps, &options(None));
    assert!(e.focuses_on.is_empty());
    let text = render(&e, BarStyle::default());
    assert!(!text.contains("heavily on:"), "{text}");
    assert!(
        text.contains("\nModel focuses on no word: the attention shown went to punctuation"),
        "{text}"
    );
}

#[test]
fn the_footer_names_the_models_own_special_tokens() {
    // GPT-2 style: <|endoftext|> a b, every row [.5 .25 .25]: the hidden token took 50%.
    let tokens = vec![
        tok("<|endoftext|>", None, 0),
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
    ];
    let gpt2 = hand_maps("a b", None, tokens, 1, 1, [0.5, 0.25, 0.25].repeat(3));
    let e = run(&gpt2, &options(Some("a")));
    let note = e.notes.iter().find(|n| n.contains("took")).unwrap();
    assert!(
        note.starts_with("<|endoftext|> took 50% of this attention")
            && note.ends_with("(--special shows <|endoftext|>)"),
        "{note}"
    );
    assert!(!note.contains("[CLS]"), "{note}");
    // BERT's own are named as before.
    let e = run(&maps(), &options(Some("a")));
    assert!(
        e.notes.iter().any(|n| n.starts_with("[CLS]/[SEP] took 60%")
            && n.ends_with("(--special shows [CLS]/[SEP])")),
        "{:?}",
        e.notes
    );
}

#[test]
fn an_occurrence_past_any_number_is_an_error() {
    // 20 digits do not fit a usize: an error, not the first "a".
    let err = explain(
        &three_words(),
        &options(Some("a#99999999999999999999")),
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, VizError::FocusNumber { .. }), "{err}");
    assert!(err.to_string().contains("too large"), "{err}");
}

/// The word "cafe\u{301}" (written decomposed) is found as typed on a keyboard ("café",
/// precomposed), in capitals, and without its accent, as BERT's uncased tokenizers read it:
/// labels keep the mark, and comparing them as strings refused all three.
#[test]
fn focus_finds_a_word_however_its_accent_is_written() {
    let tokens = vec![
        tok("the", Some((0, 3)), 0),
        tok("cafe", Some((4, 8)), 0),
        tok("is", Some((11, 13)), 0),
    ];
    let maps = hand_maps(
        "the cafe\u{301} is",
        None,
        tokens,
        1,
        1,
        vec![0.1, 0.8, 0.1, 0.2, 0.3, 0.5, 0.6, 0.2, 0.2],
    );
    for asked in ["cafe\u{301}", "caf\u{e9}", "CAF\u{c9}", "cafe"] {
        let e = run(&maps, &options(Some(asked)));
        assert_eq!(e.focus, "cafe\u{301}", "{asked}");
        assert_close(&words_and_weights(&e).1, &[0.2, 0.3, 0.5], 1e-6);
    }
}

/// A word holding an invisible character was found only as its label spells it: not as typed
/// ("zero\u{200b}width", whose label drops the space) nor as the terminal shows it
/// ("andjoiner", whose label keeps the joiner).
#[test]
fn focus_ignores_invisible_characters() {
    // BERT deletes the zero-width space (no token covers bytes 4..7); GPT-2-like pieces keep
    // the joiner (bytes 12..15) as a token of its own.
    let tokens = vec![
        tok("zero", Some((0, 4)), 0),
        tok("##width", Some((7, 12)), 0),
        tok("and", Some((13, 16)), 0),
        tok("x", Some((16, 19)), 0),
        tok("joiner", Some((19, 25)), 0),
    ];
    let maps = hand_maps(
        "zero\u{200b}width and\u{200d}joiner",
        None,
        tokens,
        1,
        1,
        vec![0.2; 25],
    );
    for (asked, label) in [
        ("zero\u{200b}width", "zerowidth"),
        ("zerowidth", "zerowidth"),
        ("andjoiner", "and\u{200d}joiner"),
        ("and\u{200d}joiner", "and\u{200d}joiner"),
    ] {
        let e = run(&maps, &options(Some(asked)));
        assert_eq!(e.focus, label, "{asked:?}");
    }
}

#[test]
fn a_causal_models_later_words_are_masked_not_ignored() {
    // "a b c" with causal rows: from "b", "c" is masked (after it), "a" and "b" are seen.
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("c", Some((4, 5)), 0),
    ];
    let weights = vec![1.0, 0.0, 0.0, 0.2, 0.8, 0.0, 0.3, 0.3, 0.4];
    let maps = hand_maps("a b c", None, tokens.clone(), 1, 1, weights);
    let e = run(&maps, &options(Some("b")));
    let masked: Vec<bool> = e.rows.iter().map(|r| r.masked).collect();
    assert_eq!(masked, [false, false, true]);
    // .8 against an even share of the two words "b" sees (.5): named.
    assert_eq!(e.focuses_on, ["b"]);
    assert!(
        e.notes
            .iter()
            .any(|n| n.starts_with("masked: the model is causal, so \"b\""))
    );
    let text = render(&e, BarStyle::default());
    assert!(text.contains("\n  c        [----]  masked\n"), "{text}");
    // From "c" nothing is masked; a model that sees every key masks nothing.
    let e = run(&maps, &options(Some("c")));
    assert!(e.rows.iter().all(|r| !r.masked));
    let both_ways = hand_maps("a b c", None, tokens, 1, 1, [0.2, 0.5, 0.3].repeat(3));
    let e = run(&both_ways, &options(Some("a")));
    assert!(e.rows.iter().all(|r| !r.masked));
    assert!(!e.notes.iter().any(|n| n.starts_with("masked")));
}

#[test]
fn standing_out_is_measured_against_even_attention_under_the_mask() {
    // "a b c", causal, every query spreading its weight evenly over what it sees: averaged over
    // the three queries "a" gets (1 + 1/2 + 1/3) / 3 = .61, yet that is even attention's own
    // figure, so no word stands out (against 1/3 "a" was named).
    let maps = hand_maps("a b c", None, abc_tokens(), 1, 1, EVEN_CAUSAL_3.to_vec());
    let e = run(&maps, &options(None));
    assert_close(
        &[e.rows[0].weight, e.rows[0].even],
        &[11.0 / 18.0, 11.0 / 18.0],
        1e-6,
    );
    assert!(e.focuses_on.is_empty() && e.spread, "{:?}", e.focuses_on);
    // From "a", the one word it sees gets everything by the mask: not named as a focus (it was
    // "Model focuses heavily on: "a""), and said to be the only word it sees.
    let e = run(&maps, &options(Some("a")));
    assert!(e.focuses_on.is_empty() && !e.spread);
    assert_eq!((e.sees_only.as_deref(), e.causal), (Some("a"), true));
    let text = render(&e, BarStyle::default());
    assert!(
        text.contains(
            "\n\"a\" is the only word shown that \"a\" sees: the model is causal, so all of \
             this attention is on it by the mask, not by choice\n"
        ),
        "{text}"
    );
    assert!(!text.contains("focuses heavily"), "{text}");
    // --top 2 from "b" lists the words it sees before the masked one.
    let mut o = options(Some("b"));
    o.top = Some(2);
    let e = run(&maps, &o);
    assert_eq!(words_and_weights(&e).0, ["a", "b"]);
    assert!(e.rows.iter().all(|r| !r.masked));
}

/// "a bc" of [`maps`] in 2 layers × 2 heads; only the rows of "a" (token 1) differ from even.
/// "a" → words a, bc ([CLS]/[SEP] hidden, the rest renormalised):
///   (0, 0) [.4 .05 .3 .15 .1]:   a .05, bc .45 (words' share .5)  → a .1,   bc .9
///   (0, 1) [.85 .05 .04 .01 .05]: a .05, bc .05 (share .1)        → a .5,   bc .5
///   (1, 0) [.1 .1 .7 .05 .05]:   a .1,  bc .75 (share .85)       → a .118, bc .882
///   (1, 1) [.2 .6 .1 .05 .05]:   a .6,  bc .15 (share .75)       → a .8,   bc .2
/// Even attention over the three tokens gives a 1/3 and bc 2/3: standing out takes .5 for "a"
/// and 1.0 for "bc".
fn grid_maps() -> attn_viz::AttentionMaps {
    let rows_of_a: [[f32; 5]; 4] = [
        [0.4, 0.05, 0.3, 0.15, 0.1],
        [0.85, 0.05, 0.04, 0.01, 0.05],
        [0.1, 0.1, 0.7, 0.05, 0.05],
        [0.2, 0.6, 0.1, 0.05, 0.05],
    ];
    let mut w = Vec::new();
    for row_of_a in rows_of_a {
        for query in 0..5 {
            w.extend(if query == 1 { row_of_a } else { [0.2; 5] });
        }
    }
    let tokens = maps().tokens;
    hand_maps("a bc", None, tokens, 2, 2, w)
}

#[test]
fn the_head_grid_holds_what_explain_shows_for_each_head() {
    let maps = grid_maps();
    let grid = head_grid(&maps, &options(Some("a")), "a").unwrap();
    assert_eq!((grid.focus.as_str(), grid.to.as_str()), ("a", "a"));
    let expected = [[0.1, 0.5], [0.1 / 0.85, 0.8]];
    let shares = [[0.5, 0.1], [0.85, 0.75]];
    for (layer, expected) in expected.iter().enumerate() {
        assert_close(&grid.weights[layer], expected, 1e-6);
        assert_close(&grid.shares[layer], &shares[layer], 1e-6);
        for head in 0..2 {
            let one = ExplainOptions {
                method: Method::Attention {
                    selection: Selection::Head { layer, head },
                },
                ..options(Some("a"))
            };
            let bars = run(&maps, &one);
            assert_eq!(bars.rows[0].word, "a");
            assert_eq!(grid.weights[layer][head], bars.rows[0].weight);
        }
    }
    assert_close(&[grid.even], &[1.0 / 3.0], 1e-6);
    assert!(!grid.masked);
    // (0, 1) gives "a" .5 but its words got a tenth of its attention: starred, not named.
    let named: Vec<(usize, usize)> = grid.stand_out.iter().map(|h| (h.layer, h.head)).collect();
    assert_eq!(named, [(1, 1)]);
    assert_eq!(grid.standing_out, 1);
    let text = render_grid(&grid, BarStyle::default());
    assert!(text.contains("  layer 0  0.10  0.50*\n"), "{text}");
    assert!(text.contains("  layer 1  0.12  0.80\n"), "{text}");
    assert!(
        text.contains(
            "One head gives \"a\" at least 0.50 (1.5 × the 0.33 of even attention): layer 1 head 1 (0.80)"
        ),
        "{text}"
    );
    assert!(
        text.contains("* marks a head whose words got under 25% of its attention (not named here)"),
        "{text}"
    );
    // "bc" has two of the three tokens: even attention gives it 2/3, and no head reaches 1.0.
    let grid = head_grid(&maps, &options(Some("a")), "bc").unwrap();
    assert_close(&[grid.even], &[2.0 / 3.0], 1e-6);
    assert!(grid.stand_out.is_empty());
}

#[test]
fn the_head_grid_names_no_head_without_one_and_says_when_the_mask_hides_the_word() {
    let maps = hand_maps("a b c", None, abc_tokens(), 1, 1, EVEN_CAUSAL_3.to_vec());
    // "c" sees a, b, c evenly: a gets the even 1/3.
    let grid = head_grid(&maps, &options(Some("c")), "a").unwrap();
    assert!(grid.stand_out.is_empty() && !grid.masked);
    assert!(render_grid(&grid, BarStyle::default()).contains("No head stands out"));
    // "a" cannot see "c".
    let grid = head_grid(&maps, &options(Some("a")), "c").unwrap();
    assert!(grid.masked && grid.stand_out.is_empty());
    assert_eq!(grid.weights, [[0.0]]);
    assert!(render_grid(&grid, BarStyle::default()).contains("every head gives it 0 by the mask"));
}

#[test]
fn the_head_grid_names_an_unknown_word_and_lists_the_words() {
    let err = head_grid(&grid_maps(), &options(Some("a")), "dog").unwrap_err();
    assert!(matches!(err, VizError::UnknownFocus { .. }), "{err:?}");
    assert!(err.to_string().contains("\"a\", \"bc\""), "{err}");
}

/// "a bc" of three tokens (a, b, ##c) without special tokens, one causal head, each query
/// spreading its weight evenly over itself and the tokens before it.
fn causal_a_bc() -> attn_viz::AttentionMaps {
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("##c", Some((3, 4)), 0),
    ];
    hand_maps("a bc", None, tokens, 1, 1, EVEN_CAUSAL_3.to_vec())
}

/// On a causal model each query token spreads even attention over the tokens it sees: from
/// "bc", token b sees a and b (a 1/2, bc 1/2), token c sees all three (a 1/3, bc 2/3), so a
/// gets (1/2 + 1/3)/2 = 5/12 and bc 7/12, which is what the even row itself gives.
#[test]
fn even_attention_on_a_causal_model_counts_the_tokens_each_query_sees() {
    let e = run(&causal_a_bc(), &options(Some("bc")));
    let even: Vec<f32> = e.rows.iter().map(|r| r.even).collect();
    assert_close(&even, &[5.0 / 12.0, 7.0 / 12.0], 1e-6);
    assert_close(&words_and_weights(&e).1, &even, 1e-6);
    assert!(e.spread && e.focuses_on.is_empty());
}

#[test]
fn the_head_grid_says_when_the_word_is_the_only_one_seen_or_masked() {
    // "a" sees only itself: every head gives it everything, which names no head.
    let grid = head_grid(&causal_a_bc(), &options(Some("a")), "a").unwrap();
    assert!(grid.only_word && grid.stand_out.is_empty());
    assert!(
        render_grid(&grid, BarStyle::default())
            .contains("\"a\" is the only word shown that \"a\" sees: every head gives it all")
    );
    // Across a causal pair from its first text: every weight to the second is 0 by the mask,
    // without stars or a note about renormalising (the word's own text took everything).
    let tokens = vec![
        tok("q", Some((0, 1)), 0),
        tok("x", Some((0, 1)), 1),
        tok("y", Some((2, 3)), 1),
    ];
    let maps = hand_maps("q", Some("x y"), tokens, 1, 1, EVEN_CAUSAL_3.to_vec());
    let mut o = options(Some("q"));
    o.question = true;
    // As a question, refused: the causal model's question cannot see its context at all.
    let err = head_grid(&maps, &o, "x").unwrap_err();
    assert!(matches!(err, VizError::CausalQuestion { .. }), "{err}");
    assert!(
        err.to_string().contains("cannot see the context after it"),
        "{err}"
    );
    o.question = false;
    o.across = true;
    let grid = head_grid(&maps, &o, "x").unwrap();
    assert!(grid.masked && grid.stand_out.is_empty());
    let text = render_grid(&grid, BarStyle::default());
    assert!(text.contains("every head gives it 0 by the mask"), "{text}");
    assert!(
        !text.contains('*') && !text.contains("renormalised"),
        "{text}"
    );
}

/// One layer of heads over [`maps`]'s tokens, "a"'s row in head h being `rows[h]` (the other
/// rows even).
fn heads_over_a_bc(rows: &[[f32; 5]]) -> attn_viz::AttentionMaps {
    let mut w = Vec::new();
    for row_of_a in rows {
        for query in 0..5 {
            w.extend(if query == 1 { *row_of_a } else { [0.2; 5] });
        }
    }
    hand_maps("a bc", None, maps().tokens, 1, rows.len(), w)
}

#[test]
fn the_head_grid_counts_the_heads_it_does_not_name() {
    // Head 0 gives "a" .05 / .1 = .5 (1.5 × its even 1/3) but its words got a tenth of its
    // attention: starred, and counted as such; head 1 is even (a .2/.6 = 1/3).
    let maps = heads_over_a_bc(&[[0.85, 0.05, 0.04, 0.01, 0.05], [0.2; 5]]);
    let grid = head_grid(&maps, &options(Some("a")), "a").unwrap();
    assert_eq!((grid.standing_out, grid.parked), (0, 1));
    let text = render_grid(&grid, BarStyle::default());
    assert!(
        text.contains(
            "No head stands out: none gives \"a\" 0.50 (1.5 × the 0.33 even attention would give \
             it); one starred head does"
        ),
        "{text}"
    );
    // Six heads giving "a" .8/.9: five are named, of six.
    let maps = heads_over_a_bc(&[[0.1, 0.8, 0.05, 0.03, 0.02]; 6]);
    let grid = head_grid(&maps, &options(Some("a")), "a").unwrap();
    assert_eq!((grid.standing_out, grid.stand_out.len()), (6, 5));
    let text = render_grid(&grid, BarStyle::default());
    assert!(
        text.contains("The 5 heaviest of 6 heads give \"a\" at least 0.50"),
        "{text}"
    );
}

#[test]
fn the_comparison_names_the_heads_that_prefer_each_word() {
    // From "a" in `grid_maps` (its docs give each head's weights to "a" and "bc").
    let maps = grid_maps();
    let a = head_grid(&maps, &options(Some("a")), "a").unwrap();
    let bc = head_grid(&maps, &options(Some("a")), "bc").unwrap();
    let c = compare_grids(&a, &bc).unwrap();
    let expected = [[0.1 - 0.9, 0.5 - 0.5], [(0.1 - 0.75) / 0.85, 0.8 - 0.2]];
    for (layer, expected) in expected.iter().enumerate() {
        assert_close(&c.difference[layer], expected, 1e-6);
    }
    assert_eq!(c.starred, [[false, true], [false, false]]);
    // Only (1, 1) prefers "a": .8 ≥ 1.5 × .2 and ≥ .5 (1.5 × its even 1/3); (0, 1) is starred.
    // No head gives "bc" 1.0 (1.5 × its even 2/3).
    assert_eq!([c.preferring(0), c.preferring(1)], [1, 0]);
    assert_eq!((c.prefer[0][0].layer, c.prefer[0][0].head), (1, 1));
    assert_close(&c.prefer[0][0].weights, &[0.8, 0.2], 1e-6);
    assert!(c.prefer[1].is_empty());
    assert_eq!(c.preference, [[None, None], [None, Some(0)]]);
    let text = render_comparison(&c, BarStyle::default());
    for line in [
        "  layer 0  -0.80   0.00*\n",
        "  layer 1  -0.76  +0.60•\n",
        "One head prefers \"a\" (it gives it at least 1.5 × what it gives \"bc\", and at least \
         0.50: 1.5 × the 0.33 of even attention): layer 1 head 1 (0.80 against 0.20)\n",
        "No head prefers \"bc\": none gives it at least 1.5 × what it gives \"a\", and at least \
         1.00: 1.5 × the 0.67 of even attention\n",
    ] {
        assert!(text.contains(line), "{line}\nnot in\n{text}");
    }
    // The other way round, the mirror image.
    let back = compare_grids(&bc, &a).unwrap();
    for (row, mirrored) in back.difference.iter().zip(&c.difference) {
        let negated: Vec<f32> = mirrored.iter().map(|d| -d).collect();
        assert_close(row, &negated, 1e-6);
    }
    assert_eq!([back.preferring(0), back.preferring(1)], [0, 1]);
    assert_close(&back.prefer[1][0].weights, &[0.2, 0.8], 1e-6);
    // Grids from another focus are not compared.
    let other = head_grid(&maps, &options(Some("bc")), "a").unwrap();
    let err = compare_grids(&a, &other).unwrap_err();
    assert!(
        matches!(err, VizError::GridsDiffer { what: "focus" }),
        "{err}"
    );
}

#[test]
fn the_comparison_says_when_the_mask_hides_a_word() {
    // Causal "a bc": from "a", "bc" comes after it; no head can prefer it, and the line says
    // so instead of a rule about its even share of 0.
    let maps = causal_a_bc();
    let a = head_grid(&maps, &options(Some("a")), "a").unwrap();
    let bc = head_grid(&maps, &options(Some("a")), "bc").unwrap();
    let c = compare_grids(&a, &bc).unwrap();
    assert_eq!(c.masked, [false, true]);
    let text = render_comparison(&c, BarStyle::default());
    assert!(
        text.contains("\"bc\" comes after \"a\": the model is causal, so no head can prefer it\n"),
        "{text}"
    );
    assert!(!text.contains("No head prefers \"bc\""), "{text}");
}

#[test]
fn the_comparison_names_the_widest_gaps_first() {
    // Head h gives "a" .5 + .05h and "bc" .1 of the raw row: renormalised over the words shown,
    // "a" (.5 + .05h)/(.6 + .05h) against .1/(.6 + .05h), a gap that grows with h. All six
    // prefer "a"; the five widest are heads 5 to 1. Head 6 gives "a" .5/.9 = .56, past 1.5 × its
    // even 1/3, but not 1.5 × the .44 it gives "bc": it prefers neither.
    let mut rows: Vec<[f32; 5]> = (0..6)
        .map(|h| {
            let h = h as f32;
            [0.4 - 0.05 * h, 0.5 + 0.05 * h, 0.05, 0.05, 0.0]
        })
        .collect();
    rows.push([0.1, 0.5, 0.2, 0.2, 0.0]);
    let maps = heads_over_a_bc(&rows);
    let a = head_grid(&maps, &options(Some("a")), "a").unwrap();
    let bc = head_grid(&maps, &options(Some("a")), "bc").unwrap();
    let c = compare_grids(&a, &bc).unwrap();
    assert_eq!([c.preferring(0), c.preferring(1)], [6, 0]);
    let heads: Vec<usize> = c.prefer[0].iter().map(|p| p.head).collect();
    assert_eq!(heads, [5, 4, 3, 2, 1]);
    // All six are marked in the table, not only the five named; head 6 is not.
    let marked: Vec<Option<usize>> = c.preference[0].clone();
    assert_eq!(
        marked,
        [Some(0), Some(0), Some(0), Some(0), Some(0), Some(0), None]
    );
    let text = render_comparison(&c, BarStyle::default());
    let widest = "6 heads prefer \"a\" (each gives it at least 1.5 × what it gives \"bc\", and at \
                  least 0.50: 1.5 × the 0.33 of even attention); the 5 widest gaps: layer 0 head \
                  5 (0.88 against 0.12)";
    assert!(text.contains(widest), "{text}");
}

#[test]
fn the_head_grid_names_a_repeated_word_by_its_occurrence() {
    // "a b a": --to a#2 is the second "a", and the table says so.
    let tokens = vec![
        tok("a", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("a", Some((4, 5)), 0),
    ];
    let maps = hand_maps("a b a", None, tokens, 1, 1, [0.2, 0.3, 0.5].repeat(3));
    let grid = head_grid(&maps, &options(Some("b")), "a#2").unwrap();
    assert_eq!(grid.to, "a#2");
    assert_close(&[grid.weights[0][0]], &[0.5], 1e-6);
    assert!(render_grid(&grid, BarStyle::default()).starts_with("Attention from \"b\" to \"a#2\""));
    // Counted in any case, as --to counts them: in "A b a" the second is "a#2", the first
    // "A#1" (it was "a", whose --to a would name "A").
    let tokens = vec![
        tok("A", Some((0, 1)), 0),
        tok("b", Some((2, 3)), 0),
        tok("a", Some((4, 5)), 0),
    ];
    let maps = hand_maps("A b a", None, tokens, 1, 1, [0.2, 0.3, 0.5].repeat(3));
    for (asked, label) in [("a#2", "a#2"), ("a", "A#1")] {
        assert_eq!(
            head_grid(&maps, &options(Some("b")), asked).unwrap().to,
            label
        );
    }
    // Counted as --to matches them, however an accent is encoded: in "café b cafe\u{301}" the
    // second is "cafe\u{301}#2" (it was "cafe\u{301}", though --to café#2 finds it).
    let text = "café b cafe\u{301}";
    let tokens = vec![
        tok("café", Some((0, 5)), 0),
        tok("b", Some((6, 7)), 0),
        tok("cafe\u{301}", Some((8, 14)), 0),
    ];
    assert_eq!(&text[8..14], "cafe\u{301}");
    let maps = hand_maps(text, None, tokens, 1, 1, [0.2, 0.3, 0.5].repeat(3));
    for (asked, label) in [("café#2", "cafe\u{301}#2"), ("cafe\u{301}", "café#1")] {
        let grid = head_grid(&maps, &options(Some("b")), asked).unwrap();
        assert_eq!(grid.to, label);
    }
}

/// Raw GPT-2 tokens read as the bytes they stand for, the leading space kept as `Ġ`: "é é" as
/// "Ã©" (the whole "é"), "ĠÃ" (a space and the first byte of the second "é") and "©" (its
/// second byte). They read "Ã©", "ĠÃ" and "©", letters that are not in the text.
#[test]
fn raw_byte_level_tokens_read_as_their_bytes() {
    let tokens = vec![
        tok("Ã©", Some((0, 2)), 0),
        tok("ĠÃ", Some((2, 5)), 0),
        tok("©", Some((3, 5)), 0),
    ];
    let maps = hand_maps("é é", None, tokens, 1, 1, [0.5, 0.25, 0.25].repeat(3));
    let mut o = options(Some("é"));
    o.level = Level::Tokens;
    let e = run(&maps, &o);
    assert_eq!(words_and_weights(&e).0, ["é", "Ġ<0xC3>", "<0xA9>"]);
    assert_eq!(e.focus, "é");
}
