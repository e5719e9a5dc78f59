//! Weights as bars in a terminal, in the notes' format:
//!
//! ```text
//!   The      [0.05]  ▁
//!   Eiffel   [0.30]  ████████
//! ```
//!
//! A bar's length is its weight relative to the largest weight shown (the largest gets the full
//! width), in whole blocks, rounded; a weight that rounds to no block gets `▁`, so every row shows
//! something and a reader can tell "small" from "missing".
//!
//! Labels line up by the columns a terminal gives them ([`display_width`]): a CJK ideograph
//! takes two, a combining mark none.

use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_width::UnicodeWidthStr;

/// The columns `text` takes in a terminal (East Asian wide characters two, combining marks
/// none), which padding by `char`s gets wrong: "北京" is 2 chars and 4 columns, "cafe\u{301}" 5
/// and 4.
pub fn display_width(text: &str) -> usize {
    text.width()
}

/// `text` with its control characters (escape, newlines, tabs, delete and the C1 range) written
/// as escapes (`\u{1b}`, `\n`), so that a label cannot move the cursor, recolour or clear the
/// terminal it is printed to.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A word in double quotes for a sentence of the output, as written: `{:?}` of a string escapes
/// a combining mark (`"e\u{301}cole"` for a decomposed "école"), this escapes only `"`, `\` and
/// control characters.
#[derive(Clone, Copy)]
pub struct Quoted<'a>(pub &'a str);

impl std::fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        f.write_char('"')?;
        for c in self.0.chars() {
            match c {
                '"' | '\\' => write!(f, "\\{c}")?,
                c if c.is_control() => write!(f, "{}", c.escape_debug())?,
                c => f.write_char(c)?,
            }
        }
        f.write_char('"')
    }
}

/// `text` followed by spaces up to `width` columns.
pub fn pad_end(text: &str, width: usize) -> String {
    format!(
        "{text}{}",
        " ".repeat(width.saturating_sub(display_width(text)))
    )
}

/// Spaces up to `width` columns, then `text`.
pub fn pad_start(text: &str, width: usize) -> String {
    format!(
        "{}{text}",
        " ".repeat(width.saturating_sub(display_width(text)))
    )
}

/// The longest start of `text` that takes at most `width` columns.
pub fn truncate_to_width(text: &str, width: usize) -> &str {
    let mut end = 0;
    for (at, c) in text.char_indices() {
        if display_width(&text[..at + c.len_utf8()]) > width {
            break;
        }
        end = at + c.len_utf8();
    }
    &text[..end]
}

/// How to draw bars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BarStyle {
    /// Blocks of the largest bar.
    pub width: usize,
    /// ANSI colours (for a terminal; never when piped).
    pub colour: bool,
}

impl Default for BarStyle {
    fn default() -> Self {
        BarStyle {
            width: 20,
            colour: false,
        }
    }
}

const BOLD: &str = "\x1b[1m";
const CYAN: &str = "\x1b[36m";
const YELLOW: &str = "\x1b[33m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

/// The bar of one weight: `round(weight / max · width)` full blocks, or `▁` when that is 0.
pub fn bar(weight: f32, max: f32, width: usize) -> String {
    let blocks = if max > 0.0 && weight > 0.0 {
        ((weight / max).min(1.0) * width as f32).round() as usize
    } else {
        0
    };
    if blocks == 0 {
        "▁".to_string()
    } else {
        "█".repeat(blocks)
    }
}

/// One line per `(label, weight)`: `"  label [0.30]  ████"`. Labels are padded to the longest
/// label (at least 8 characters, as in the notes); `highlight` rows are emphasised in colour.
pub fn render_bars(rows: &[(String, f32)], highlight: &[usize], style: BarStyle) -> String {
    render_bars_masked(rows, highlight, &[], style)
}

/// [`render_bars`] with the rows of `masked` (keys a causal model's query cannot see) shown
/// as masked rather than as weight 0.
pub fn render_bars_masked(
    rows: &[(String, f32)],
    highlight: &[usize],
    masked: &[usize],
    style: BarStyle,
) -> String {
    let label_width = rows
        .iter()
        .map(|(label, _)| display_width(label))
        .max()
        .unwrap_or(0)
        .max(8);
    let max = rows.iter().map(|(_, w)| *w).fold(0.0f32, f32::max);
    let decimals = decimals_for(max);
    let mut out = String::new();
    for (index, (label, weight)) in rows.iter().enumerate() {
        let pad = " ".repeat(label_width - display_width(label));
        let bar = bar(*weight, max, style.width);
        if masked.contains(&index) {
            let dashes = "-".repeat(decimals + 2);
            let line = format!("  {label}{pad} [{dashes}]  masked");
            let _ = writeln!(out, "{}", dim(&line, style.colour));
            continue;
        }
        let line = if style.colour {
            let (label, colour) = if highlight.contains(&index) {
                (format!("{BOLD}{label}{RESET}"), YELLOW)
            } else {
                (label.clone(), CYAN)
            };
            format!("  {label}{pad} [{weight:.decimals$}]  {colour}{bar}{RESET}")
        } else {
            format!("  {label}{pad} [{weight:.decimals$}]  {bar}")
        };
        let _ = writeln!(out, "{line}");
    }
    out
}

/// Two decimals as in the notes, more when even the largest weight is small (long inputs), so
/// that it shows two significant digits: 0.0037, not 0.00.
pub fn decimals_for(max: f32) -> usize {
    if max >= 0.1 || max <= 0.0 {
        2
    } else {
        (-max.log10()).ceil() as usize + 1
    }
}

/// The rows a reader should look at first: weights at least half the largest, largest first,
/// at most three (the notes name two or three words).
///
/// # Shapes
/// `weights: [n]` → indices into it.
pub fn heavy(weights: &[f32]) -> Vec<usize> {
    let max = weights.iter().copied().fold(0.0f32, f32::max);
    if max <= 0.0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    order
        .into_iter()
        .take_while(|&i| weights[i] >= 0.5 * max)
        .take(3)
        .collect()
}

/// `text` in bold yellow on a terminal (as the heavy words' bars), as is otherwise.
pub fn emphasised(text: &str, colour: bool) -> String {
    if colour {
        format!("{BOLD}{YELLOW}{text}{RESET}")
    } else {
        text.to_string()
    }
}

/// `text` dimmed on a terminal, as is otherwise.
pub fn dim(text: &str, colour: bool) -> String {
    if colour {
        format!("{DIM}{text}{RESET}")
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn control_characters_are_printed_as_escapes() {
        assert_eq!(super::printable("Paris, 北京"), "Paris, 北京");
        assert_eq!(
            super::printable("k\u{1b}[31m=\tv\n\u{9b}"),
            "k\\u{1b}[31m=\\tv\\n\\u{9b}"
        );
    }
}
