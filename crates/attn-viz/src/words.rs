//! Subword tokens merged back into the words of the input.
//!
//! A word is a run of tokens of one segment whose byte spans touch (nothing but invisible
//! characters between them, see below) and join two letters or digits: `e ##iff ##el` (spans
//! 4..5, 5..8, 8..10 of "The Eiffel") is "Eiffel", while `paris ,` stays two words ("Paris" and
//! ","). GPT-2's `Ġcat` carries its leading space in its span under some tokenizers: a space is
//! not a letter, so it starts a new word either way; a token that is only a space (`Ġ` before
//! `un ##believ ##ably`) joins the word after it. GPT-2's byte-level pieces of one character
//! (the four bytes of 🐱, the two of é) all carry that character's span, so a token whose span
//! starts before the previous one ends is part of the same word. A CJK ideograph is a word of
//! its own, as BERT's `BasicTokenizer` splits them (`_is_chinese_char` in
//! <https://github.com/huggingface/transformers/blob/v4.44.0/src/transformers/models/bert/tokenization_bert.py>):
//! "我爱北京" is four words, not one run of letters. Combining marks (the U+0301 of "cafe\u{301}",
//! written decomposed) belong to the letter before them: a piece that starts with one continues
//! the word, and a word's label takes the marks right after its last token, which BERT's
//! accent stripping leaves out of every span. Nor does a word end inside one user-perceived
//! character (an extended grapheme cluster of UAX #29, <https://www.unicode.org/reports/tr29/>:
//! GPT-2's pieces of 👍🏽, or of 👨‍👩‍👧 with its zero-width joiners).
//!
//! Invisible format characters (Unicode category Cf) that a tokenizer deletes (BERT deletes them
//! all) leave the tokens around them touching: "zero\u{200b}width" is one word to BERT, as
//! Hugging Face's `word_ids` counts it. A token of only invisible characters (GPT-2 keeps them)
//! belongs to the word before it, and a zero-width space among them also ends that word, as Thai
//! and Khmer use it. Special tokens are words of their own.
//!
//! Merging a `[T, T]` matrix into words: the weight TO a word is the sum over its tokens (the
//! share of attention it received), the weight FROM a word is the mean over its tokens (so each
//! merged row still sums to 1). This is bertviz's and Clark et al. (2019)'s convention.

use unicode_categories::UnicodeCategories;

use crate::{AttentionMaps, VizError};

/// A word (or a raw token) as shown: its label and the tokens it covers.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unit {
    /// The word as written in the input ("Eiffel"), or the raw token (`##iff`, `[CLS]`).
    pub label: String,
    /// Indices into [`AttentionMaps::tokens`], ascending.
    pub tokens: Vec<usize>,
    pub segment: usize,
    pub special: bool,
}

/// Words of the input, merged from tokens by their spans (see the module docs).
pub fn words(maps: &AttentionMaps) -> Result<Vec<Unit>, VizError> {
    let mut units: Vec<Unit> = Vec::new();
    // (segment, end byte) of the previous token when it may continue into the next.
    let mut open: Option<(usize, usize)> = None;
    for (index, token) in maps.tokens.iter().enumerate() {
        let span = match (token.special, token.span) {
            (false, Some(span)) => span,
            _ => {
                units.push(raw_unit(index, token));
                open = None;
                continue;
            }
        };
        let (text, piece) = maps.token_text(index)?;
        let piece = piece.unwrap_or_default();
        // A unit that is only a space so far (GPT-2's lone "Ġ") is the next word's leading space.
        let blank_so_far = units
            .last()
            .is_some_and(|u| !u.special && u.tokens.iter().all(|&t| blank(maps, t)));
        // Tokens touch when nothing but invisible format characters lies between them: ones
        // the tokenizer deleted (BERT deletes them all, so "zero\u{200b}width" is one word to
        // it, as its `word_ids` say).
        let (touches, overlaps) = match open {
            Some((segment, end)) if segment == token.segment => (
                text.get(end..span.0)
                    .is_some_and(|gap| gap.chars().all(invisible)),
                span.0 < end,
            ),
            _ => (false, false),
        };
        // The character a word would continue from: the previous token's last, past the
        // invisible ones a byte-level model keeps as tokens of their own, but for a zero-width
        // space, which separates words (Thai and Khmer write it between words).
        let before = open
            .filter(|&(segment, _)| segment == token.segment)
            .and_then(|(_, end)| {
                text[..end]
                    .trim_end_matches(|c| invisible(c) && c != ZERO_WIDTH_SPACE)
                    .chars()
                    .next_back()
            });
        let joins = overlaps
            || touches
                && (blank_so_far
                    || piece.chars().all(invisible)
                    || open.is_some_and(|(_, end)| inside_character(text, end))
                    || inside_character(text, span.0)
                    || before.is_some_and(word_char)
                        && piece.chars().next().is_some_and(word_char));
        let end = with_marks(
            text,
            match open {
                Some((_, end)) if overlaps => end.max(span.1),
                _ => span.1,
            },
        );
        match units.last_mut() {
            Some(last) if joins => {
                last.tokens.push(index);
                let first = maps.tokens[last.tokens[0]].span.map_or(span.0, |s| s.0);
                last.label = label_of(&text[first..end], token);
            }
            _ => units.push(Unit {
                label: label_of(&text[span.0..end], token),
                tokens: vec![index],
                segment: token.segment,
                special: false,
            }),
        }
        open = Some((token.segment, end));
    }
    Ok(units)
}

/// Whether `c` may continue a word into the next token: a letter, a digit or a combining mark,
/// but not a CJK ideograph, which is a word of its own.
fn word_char(c: char) -> bool {
    (c.is_alphanumeric() || c.is_mark()) && !cjk(c)
}

/// An invisible format character (Unicode category Cf: zero-width space and joiners, soft
/// hyphen, direction marks, word joiner, byte-order mark). A token of nothing else belongs to
/// the word before it; only the zero-width space also ends that word.
pub(crate) fn invisible(c: char) -> bool {
    c.is_other_format()
}

const ZERO_WIDTH_SPACE: char = '\u{200b}';

/// Invisible characters that change nothing a label shows, so labels and `--focus` leave them
/// out: the zero-width space, word joiner, byte-order mark, soft hyphen and direction marks.
/// Joiners stay (U+200D holds 👨‍👩‍👧 together, U+200C keeps Persian letters apart), as do
/// emoji tags (🏴 with tags is England's flag).
fn hidden_in_labels(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{061c}'
            | '\u{180e}'
            | ZERO_WIDTH_SPACE
            | '\u{200e}'
            | '\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

/// `text` without the invisible characters that change nothing a label shows (zero-width space,
/// word joiner, byte-order mark, soft hyphen, direction marks), which labels leave out.
pub fn without_hidden(text: &str) -> String {
    text.chars().filter(|&c| !hidden_in_labels(c)).collect()
}

/// Whether byte `at` of `text` falls inside one user-perceived character (an extended grapheme
/// cluster: 👍🏽, 👨‍👩‍👧, a flag's two letters), which a word boundary never splits.
fn inside_character(text: &str, at: usize) -> bool {
    let mut cursor = unicode_segmentation::GraphemeCursor::new(at, text.len(), true);
    cursor.is_boundary(text, 0).is_ok_and(|boundary| !boundary)
}

/// `end` moved past the combining marks that follow it in `text`.
fn with_marks(text: &str, end: usize) -> usize {
    end + text[end..]
        .chars()
        .take_while(|c| c.is_mark())
        .map(char::len_utf8)
        .sum::<usize>()
}

/// The code points BERT's `_is_chinese_char` counts as CJK ideographs.
fn cjk(c: char) -> bool {
    matches!(
        u32::from(c),
        0x4E00..=0x9FFF
            | 0x3400..=0x4DBF
            | 0x20000..=0x2A6DF
            | 0x2A700..=0x2B73F
            | 0x2B740..=0x2B81F
            | 0x2B820..=0x2CEAF
            | 0xF900..=0xFAFF
            | 0x2F800..=0x2FA1F
    )
}

/// Whether token `t`'s span covers only whitespace and invisible format characters.
fn blank(maps: &AttentionMaps, t: usize) -> bool {
    let token = &maps.tokens[t];
    match (token.span, maps.segment_text(token.segment)) {
        (Some((a, b)), Some(text)) => text
            .get(a..b)
            .is_some_and(|p| p.chars().all(|c| c.is_whitespace() || invisible(c))),
        _ => false,
    }
}

/// Every token a unit of its own, labelled as the tokenizer writes it, except that a
/// byte-level BPE token's bytes read as text ([`token_label`]: `Ã©` is "é", a byte that
/// completes no character `<0xC3>`), with its leading spaces kept as the tokenizer's `Ġ`
/// ("Ġcat"), which a padded label would hide.
pub fn tokens(maps: &AttentionMaps) -> Vec<Unit> {
    maps.tokens
        .iter()
        .enumerate()
        .map(|(index, token)| {
            let mut unit = raw_unit(index, token);
            if let Ok(label) = token_label(maps, index) {
                let text = label.trim_start_matches(' ');
                unit.label = "Ġ".repeat(label.len() - text.len()) + text;
            }
            unit
        })
        .collect()
}

fn raw_unit(index: usize, token: &crate::Token) -> Unit {
    Unit {
        label: token.text.clone(),
        tokens: vec![index],
        segment: token.segment,
        special: token.special,
    }
}

/// Token `index` as a person reads it, for views that show every token: a byte-level BPE
/// token (GPT-2's, RoBERTa's) decoded from the letters its tokenizer writes bytes as (`Ġcat`
/// is " cat", `Ã©` is "é"), where a token's decoded bytes are its own span's text (or a piece
/// of one character there); bytes that do not complete a character read `<0xF0>`; control
/// characters read `\n`, `\t` or `<0x1B>`. Other tokens (`##iff`, `▁cat`, `[CLS]`) read as
/// the tokenizer writes them.
pub fn token_label(maps: &AttentionMaps, index: usize) -> Result<String, VizError> {
    let token = &maps.tokens[index];
    let (_, piece) = maps.token_text(index)?;
    let decoded = piece.filter(|_| !token.special).and_then(|piece| {
        let bytes = byte_level_bytes(&token.text)?;
        // The span may leave out the leading space the token carries.
        let own = piece.as_bytes();
        let matches = bytes.ends_with(own)
            && bytes[..bytes.len() - own.len()].iter().all(|b| *b == b' ')
            || std::str::from_utf8(&bytes).is_err()
                && !bytes.is_empty()
                && own.windows(bytes.len()).any(|w| w == bytes);
        matches.then_some(bytes)
    });
    Ok(match decoded {
        Some(bytes) => byte_label(&bytes),
        None => token.text.clone(),
    })
}

/// The bytes a byte-level BPE token (GPT-2's, RoBERTa's) stands for: `Ġcat` is " cat", `Ã©`
/// the two bytes of "é"; `None` when a character is not one of the byte letters.
pub fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(byte_of).collect()
}

/// `bytes` as a person reads them: UTF-8 as text, a byte that does not complete a character
/// as `<0xF0>`, control characters as `\n`, `\t`, `\r` or `<0x1B>`.
pub fn byte_label(bytes: &[u8]) -> String {
    let mut label = String::new();
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => label.push_str("\\n"),
                '\t' => label.push_str("\\t"),
                '\r' => label.push_str("\\r"),
                c if c.is_control() => label.extend(c.to_string().bytes().map(hex_byte)),
                c => label.push(c),
            }
        }
        label.extend(chunk.invalid().iter().copied().map(hex_byte));
    }
    label
}

fn hex_byte(b: u8) -> String {
    format!("<0x{b:02X}>")
}

/// The byte GPT-2's byte-level BPE writes as `c` (`bytes_to_unicode` in
/// <https://github.com/openai/gpt-2/blob/master/src/encoder.py>): the printable bytes
/// `!`..`~`, `¡`..`¬` and `®`..`ÿ` as themselves, the other 68, in order, as U+0100 onwards
/// (the space as `Ġ`, the newline as `Ċ`).
fn byte_of(c: char) -> Option<u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
    match u32::from(c) {
        n @ 0..=0xff if printable(n as u8) => Some(n as u8),
        n @ 0x100..=0x143 => (0..=255u8)
            .filter(|&b| !printable(b))
            .nth(n as usize - 0x100),
        _ => None,
    }
}

/// The input's own spelling without [`hidden_in_labels`] characters; the token when its span
/// covers only spaces, the code points when it covers only invisible characters.
fn label_of(piece: &str, token: &crate::Token) -> String {
    let label = without_hidden(piece);
    // Joiners stay inside a label, not at its ends, where they join nothing and would keep a
    // space in it.
    let label =
        label.trim_matches(|c: char| c.is_whitespace() || matches!(c, '\u{200c}' | '\u{200d}'));
    if !label.is_empty() {
        label.to_string()
    } else if piece.chars().all(char::is_whitespace) {
        token.text.clone()
    } else {
        // Nothing visible: the code points, not a byte-level token's letters.
        piece
            .chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| format!("U+{:04X}", u32::from(c)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The labels of the special units, each once, joined by "/" as the model writes them
/// (`"[CLS]/[SEP]"`, `"<|endoftext|>"`); empty when there are none.
pub fn special_labels(units: &[Unit]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for unit in units.iter().filter(|u| u.special) {
        if !names.contains(&unit.label.as_str()) {
            names.push(&unit.label);
        }
    }
    names.join("/")
}

/// Sums a token-level row into units: entry `u` is the weight to unit `u`'s tokens together.
///
/// # Shapes
/// `row: [T]` → `[units.len()]`.
pub fn row_to_units(row: &[f32], units: &[Unit]) -> Vec<f32> {
    units
        .iter()
        .map(|unit| unit.tokens.iter().map(|&j| row[j]).sum())
        .collect()
}

/// Merges a token matrix into units: weights TO a unit summed over its tokens, FROM a unit
/// averaged over its tokens.
///
/// # Shapes
/// `matrix: [T, T]` (row = query) → `[U, U]` with `U = units.len()`.
pub fn merge_matrix(matrix: &[f32], seq_len: usize, units: &[Unit]) -> Vec<f32> {
    debug_assert_eq!(matrix.len(), seq_len * seq_len);
    let mut merged = Vec::with_capacity(units.len() * units.len());
    for from in units {
        let mut row = vec![0.0f32; seq_len];
        let share = 1.0 / from.tokens.len() as f32;
        for &i in &from.tokens {
            for (acc, w) in row.iter_mut().zip(&matrix[i * seq_len..(i + 1) * seq_len]) {
                *acc += share * w;
            }
        }
        merged.extend(row_to_units(&row, units));
    }
    merged
}

/// Keeps the columns and rows of `shown` units and renormalises each row to sum to 1 (a row
/// whose shown weights are all 0 stays 0).
///
/// # Shapes
/// `matrix: [U, U]` → `[S, S]` with `S = shown.len()`.
pub fn keep_and_renormalise(matrix: &[f32], n_units: usize, shown: &[usize]) -> Vec<f32> {
    let mut kept = Vec::with_capacity(shown.len() * shown.len());
    for &i in shown {
        let row: Vec<f32> = shown.iter().map(|&j| matrix[i * n_units + j]).collect();
        kept.extend(renormalised(&row));
    }
    kept
}

/// `row / sum(row)`, or zeros when the sum is 0.
///
/// # Shapes
/// `row: [n]` → `[n]`.
pub fn renormalised(row: &[f32]) -> Vec<f32> {
    let sum: f32 = row.iter().sum();
    if sum > 0.0 {
        row.iter().map(|w| w / sum).collect()
    } else {
        vec![0.0; row.len()]
    }
}
