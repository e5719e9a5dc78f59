//! `attnscope mask causal 4` and `attnscope mask padding "The cat <PAD> <PAD>"`: print the 0/1
//! mask matrices of `shared/attention-notes.txt` (1 = the query in that row may attend to the
//! key in that column), computed by `attn-core`'s mask rules.

use anyhow::ensure;
use attn_core::causal_matrix;
use attn_core::{Causal, KeyPadding};
use attn_viz::bars::{display_width, pad_end, pad_start};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    kind: Kind,
}

#[derive(clap::Subcommand)]
enum Kind {
    /// Causal mask: each token sees itself and the tokens before it.
    Causal {
        /// Number of query tokens (1 to 512).
        seq_q: usize,
        /// Number of key tokens, 1 to 512 (default: as many as queries).
        #[arg(long)]
        seq_kv: Option<usize>,
        /// Where the diagonal sits when the lengths differ: top-left or bottom-right
        ///
        /// Where the diagonal sits when the lengths differ: top-left (PyTorch is_causal) or
        /// bottom-right (FlashAttention, decoding with a cache: the last query sees every key).
        #[arg(long, value_enum, default_value_t = Align::TopLeft)]
        align: Align,
    },
    /// Padding mask of a sentence, from its <PAD> or [PAD] tokens
    ///
    /// Padding mask of a sentence: tokens written <PAD> or [PAD] (any case) are padding no one
    /// attends to.
    Padding {
        /// The tokens, separated by spaces (at most 512).
        text: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Align {
    TopLeft,
    BottomRight,
}

/// The largest matrix side printed: beyond it the matrix would not fit a terminal anyway.
const MAX_TOKENS: usize = 512;

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match args.kind {
        Kind::Causal {
            seq_q,
            seq_kv,
            align,
        } => {
            let seq_kv = seq_kv.unwrap_or(seq_q);
            for (what, n) in [("seq_q", seq_q), ("seq_kv", seq_kv)] {
                ensure!(
                    (1..=MAX_TOKENS).contains(&n),
                    "{what} is {n}; expected 1 to {MAX_TOKENS} tokens"
                );
            }
            let causal = match align {
                Align::TopLeft => Causal::TopLeft,
                Align::BottomRight => Causal::BottomRight,
            };
            let rows = causal_matrix(seq_q, seq_kv, causal);
            let queries: Vec<String> = (0..seq_q).map(|i| i.to_string()).collect();
            let keys: Vec<String> = (0..seq_kv).map(|j| j.to_string()).collect();
            let how = match align {
                Align::TopLeft => "query i sees keys j ≤ i",
                Align::BottomRight => "query i sees keys j ≤ i + seq_kv − seq_q",
            };
            let count = |n: usize, one: &str, many: &str| {
                format!("{n} {}", if n == 1 { one } else { many })
            };
            // The notes' "when predicting word 2, it sees words 0 and 1", on these rows.
            let predicting = if seq_q == seq_kv && seq_q > 2 {
                "In a decoder, row i predicts token i + 1: predicting token 2 is row 1, which sees \
                 tokens 0 and 1.\n"
            } else {
                ""
            };
            format!(
                "Causal mask, {} × {} ({how}; 1 = may attend, rows = queries, columns = keys):\n\
                 {}{}{predicting}",
                count(seq_q, "query", "queries"),
                count(seq_kv, "key", "keys"),
                render(&queries, &keys, &rows),
                blind_rows_note(&rows)
            )
        }
        Kind::Padding { text } => padding(&text)?,
    };
    crate::out!("{text}")?;
    Ok(())
}

/// Whether a token is written as padding: `<PAD>` or `[PAD]`, in any case.
pub fn is_pad(token: &str) -> bool {
    token.eq_ignore_ascii_case("<PAD>") || token.eq_ignore_ascii_case("[PAD]")
}

fn padding(text: &str) -> anyhow::Result<String> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    ensure!(
        !tokens.is_empty(),
        "the text holds no tokens; give them separated by spaces, e.g. \"The cat <PAD> <PAD>\""
    );
    ensure!(
        tokens.len() <= MAX_TOKENS,
        "the text holds {} tokens; at most {MAX_TOKENS} are printed",
        tokens.len()
    );
    let real: Vec<bool> = tokens.iter().map(|t| !is_pad(t)).collect();
    let padding = KeyPadding::from_vec(real, 1, tokens.len())?;
    let key_row: Vec<u8> = padding.row(0).iter().map(|&r| u8::from(r)).collect();
    let labels: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    let flat = format!(
        "[[{}]]",
        key_row
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rows = vec![key_row; tokens.len()];
    Ok(format!(
        "Padding mask for \"{}\" ({} real, {} padding; 1 = a real token anyone may attend to):\n\
         mask = {flat}\n\n\
         As a matrix (rows = queries, columns = keys; every query sees only the real tokens):\n{}{}",
        tokens.join(" "),
        padding.row(0).iter().filter(|&&r| r).count(),
        padding.row(0).iter().filter(|&&r| !r).count(),
        render(&labels, &labels, &rows),
        blind_rows_note(&rows)
    ))
}

/// What a row of the mask without a 1 means, when there is one: its softmax has nothing to
/// weigh.
fn blind_rows_note(rows: &[Vec<u8>]) -> String {
    let blind: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].iter().all(|&m| m == 0))
        .collect();
    let (rows, them) = match blind.as_slice() {
        [] => return String::new(),
        [row] => (format!("Row {row} sees"), "it"),
        [first, .., last] if last - first + 1 == blind.len() => (
            format!("Rows {first} to {last} ({} rows) see", blind.len()),
            "them",
        ),
        _ => (format!("Rows {blind:?} see"), "them"),
    };
    format!("{rows} no key: attnscope gives {them} {BLIND_ROWS}.\n")
}

/// What a row that sees no key gets, here and elsewhere (after "attnscope gives it").
pub const BLIND_ROWS: &str = "output 0 and weights 0, as FlashAttention does (PyTorch's softmax \
     of a row of −∞ gives NaN, and a mask of −1e9, as in the notes' masked_fill, gives even \
     weights)";

/// A 0/1 matrix with row and column labels, one row a line.
pub fn render(row_labels: &[String], col_labels: &[String], rows: &[Vec<u8>]) -> String {
    let width = col_labels
        .iter()
        .map(|l| display_width(l))
        .max()
        .unwrap_or(1)
        .max(1);
    let label_width = row_labels
        .iter()
        .map(|l| display_width(l))
        .max()
        .unwrap_or(0);
    let mut s = format!("{:label_width$}  ", "");
    let header: Vec<String> = col_labels.iter().map(|l| pad_start(l, width)).collect();
    s += &header.join(" ");
    s.push('\n');
    for (label, row) in row_labels.iter().zip(rows) {
        let cells: Vec<String> = row.iter().map(|v| format!("{v:>width$}")).collect();
        s += &format!("{}  {}\n", pad_end(label, label_width), cells.join(" "));
    }
    s
}
