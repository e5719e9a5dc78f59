//! `attnscope walkthrough`: the "The cat sat" example of `shared/attention-notes.txt`, step by
//! step — embeddings, projections, scores, scaling, softmax, output — with every number computed
//! by `attn-core` (the reference kernel, all weights returned), not by a softmax written here.

use std::path::PathBuf;

use anyhow::{Context, bail, ensure};
use attn_core::causal_matrix;
use attn_core::{
    AttnInput, AttnOptions, AttnShape, Causal, KeyPadding, Weights, WeightsRequest, sdpa_reference,
};
use attn_viz::bars::{display_width, pad_end, pad_start};
use attn_viz::explain::word_key;
use serde_json::Value;

use super::mask::render;

#[derive(clap::Args)]
#[command(after_help = "\
--file FILE.json holds your own example:
  {\"words\": [\"The\", \"cat\", \"sat\"],         (optional; one per row of x)
   \"x\":   [[...], ...],   embeddings       [n_words, d_model]
   \"w_q\": [[...], ...],   query weights    [d_model, d_k]
   \"w_k\": [[...], ...],   key weights      [d_model, d_k]
   \"w_v\": [[...], ...]}   value weights    [d_model, d_v]
Q = X·W_q, K = X·W_k, V = X·W_v, as in the textbook example. Each matrix has 1 to 64 rows and columns.")]
pub struct Args {
    /// Your own words, embeddings and weight matrices (JSON; see below).
    #[arg(long, value_name = "FILE.json")]
    file: Option<PathBuf>,
    /// Show the masked version: `causal` or `padding:N` [default: no mask]
    ///
    /// Show the masked version: `causal` (each word sees itself and the words before it) or
    /// `padding:N` (the last N words are padding that no word attends to) [default: no mask].
    #[arg(long, value_name = "causal|padding:N")]
    mask: Option<String>,
    /// The word whose output is shown as a weighted sum of V rows [default: the second]
    ///
    /// The word whose output is written out as a weighted sum of V rows (default: the second);
    /// any case, and "the#2" for the second "the".
    #[arg(long)]
    word: Option<String>,
}

/// The example's embeddings, from the notes: one row per word, `[3, 4]`.
const NOTES_WORDS: [&str; 3] = ["The", "cat", "sat"];
const NOTES_X: [[f32; 4]; 3] = [
    [0.2, 0.1, 0.5, 0.3],
    [0.5, 0.8, 0.2, 0.1],
    [0.1, 0.3, 0.9, 0.4],
];
/// Illustrative W_q = W_k: the 4×4 Hadamard matrix H. Since H·Hᵀ = 4·I, the scores
/// Q·Kᵀ = X·H·Hᵀ·Xᵀ = 4·X·Xᵀ measure how alike two words' embeddings are.
const HADAMARD: [[f32; 4]; 4] = [
    [1.0, 1.0, 1.0, 1.0],
    [1.0, -1.0, 1.0, -1.0],
    [1.0, 1.0, -1.0, -1.0],
    [1.0, -1.0, -1.0, 1.0],
];
/// Illustrative W_v: each value mixes a word's embedding with half of a neighbouring dimension.
const NOTES_W_V: [[f32; 4]; 4] = [
    [1.0, 0.0, 0.0, 0.5],
    [0.0, 1.0, 0.5, 0.0],
    [0.0, 0.5, 1.0, 0.0],
    [0.5, 0.0, 0.0, 1.0],
];

/// A row-major matrix.
struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    fn from_rows<const C: usize>(rows: &[[f32; C]]) -> Matrix {
        Matrix {
            rows: rows.len(),
            cols: C,
            data: rows.iter().flatten().copied().collect(),
        }
    }

    fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.cols..][..self.cols]
    }

    /// `self · other`; shapes were checked when the example was read.
    fn matmul(&self, other: &Matrix) -> Matrix {
        let mut data = vec![0.0; self.rows * other.cols];
        for i in 0..self.rows {
            for k in 0..self.cols {
                let a = self.data[i * self.cols + k];
                for j in 0..other.cols {
                    data[i * other.cols + j] += a * other.data[k * other.cols + j];
                }
            }
        }
        Matrix {
            rows: self.rows,
            cols: other.cols,
            data,
        }
    }
}

/// The example: words, embeddings and the three weight matrices.
struct Example {
    words: Vec<String>,
    x: Matrix,
    w_q: Matrix,
    w_k: Matrix,
    w_v: Matrix,
    /// Whether the matrices are the built-in illustrative ones.
    builtin: bool,
}

impl Example {
    fn notes() -> Example {
        Example {
            words: NOTES_WORDS.iter().map(|w| w.to_string()).collect(),
            x: Matrix::from_rows(&NOTES_X),
            w_q: Matrix::from_rows(&HADAMARD),
            w_k: Matrix::from_rows(&HADAMARD),
            w_v: Matrix::from_rows(&NOTES_W_V),
            builtin: true,
        }
    }

    fn from_json(text: &str) -> anyhow::Result<Example> {
        let v: Value = serde_json::from_str(text).context("not valid JSON")?;
        let obj = v
            .as_object()
            .context("expected a JSON object with x, w_q, w_k, w_v (and words)")?;
        if let Some(key) = obj
            .keys()
            .find(|k| !["words", "x", "w_q", "w_k", "w_v"].contains(&k.as_str()))
        {
            bail!("unknown field {key:?}; expected words, x, w_q, w_k, w_v");
        }
        let x = matrix(obj, "x")?;
        let (w_q, w_k, w_v) = (
            matrix(obj, "w_q")?,
            matrix(obj, "w_k")?,
            matrix(obj, "w_v")?,
        );
        for (name, w) in [("w_q", &w_q), ("w_k", &w_k), ("w_v", &w_v)] {
            ensure!(
                w.rows == x.cols,
                "{name} is {}×{} but x is {}×{}: {name} needs d_model = {} rows",
                w.rows,
                w.cols,
                x.rows,
                x.cols,
                x.cols
            );
        }
        ensure!(
            w_q.cols == w_k.cols,
            "w_q is {}×{} but w_k is {}×{}: queries and keys need the same width d_k",
            w_q.rows,
            w_q.cols,
            w_k.rows,
            w_k.cols
        );
        let words = match obj.get("words") {
            None => (0..x.rows).map(|i| format!("word{i}")).collect(),
            Some(w) => {
                let words = w
                    .as_array()
                    .context("words: expected a list of strings")?
                    .iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<String>>>()
                    .context("words: expected a list of strings")?;
                ensure!(
                    words.len() == x.rows,
                    "words holds {} words but x has {} rows",
                    words.len(),
                    x.rows
                );
                // Printed as labels: an escape sequence would reach the terminal.
                if let Some((i, word)) = words
                    .iter()
                    .enumerate()
                    .find(|(_, w)| w.chars().any(char::is_control))
                {
                    anyhow::bail!("words[{i}] {word:?} holds a control character");
                }
                words
            }
        };
        Ok(Example {
            words,
            x,
            w_q,
            w_k,
            w_v,
            builtin: false,
        })
    }
}

/// Largest side of a user matrix: this is a teaching aid printed to a terminal.
const MAX_SIDE: usize = 64;

fn matrix(obj: &serde_json::Map<String, Value>, name: &str) -> anyhow::Result<Matrix> {
    let rows = obj
        .get(name)
        .with_context(|| format!("missing field {name}"))?
        .as_array()
        .with_context(|| format!("{name}: expected a list of rows (lists of numbers)"))?;
    ensure!(
        (1..=MAX_SIDE).contains(&rows.len()),
        "{name} has {} rows; expected 1 to {MAX_SIDE}",
        rows.len()
    );
    let mut data = Vec::new();
    let mut cols = None;
    for (i, row) in rows.iter().enumerate() {
        let row = row
            .as_array()
            .with_context(|| format!("{name} row {i}: expected a list of numbers"))?;
        let want = *cols.get_or_insert(row.len());
        ensure!(
            row.len() == want,
            "{name} row {i} has {} values but row 0 has {want}",
            row.len()
        );
        for (j, x) in row.iter().enumerate() {
            let x = x
                .as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite())
                .with_context(|| format!("{name}[{i}][{j}] is {x}; expected a finite number"))?;
            data.push(x);
        }
    }
    let cols = cols.unwrap_or(0);
    ensure!(
        (1..=MAX_SIDE).contains(&cols),
        "{name} has {cols} columns; expected 1 to {MAX_SIDE}"
    );
    Ok(Matrix {
        rows: rows.len(),
        cols,
        data,
    })
}

/// Which mask `--mask` asked for.
enum MaskKind {
    Causal,
    /// The last `n` words are padding.
    Padding(usize),
}

fn parse_mask(spec: &str, n_words: usize) -> anyhow::Result<MaskKind> {
    if spec == "causal" {
        return Ok(MaskKind::Causal);
    }
    let Some(n) = spec.strip_prefix("padding:") else {
        bail!("--mask {spec:?}: expected causal or padding:N");
    };
    let n: usize = n
        .parse()
        .with_context(|| format!("--mask {spec:?}: N must be a whole number of padding words"))?;
    ensure!(
        n <= n_words,
        "--mask {spec:?}: {n} padding words, but the example has only {n_words} words"
    );
    Ok(MaskKind::Padding(n))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ex = match &args.file {
        None => Example::notes(),
        Some(path) => {
            let text = super::attention::read_text_file(path)?;
            Example::from_json(&text).with_context(|| format!("{}", path.display()))?
        }
    };
    let n = ex.words.len();
    let mask = args.mask.as_deref().map(|m| parse_mask(m, n)).transpose()?;
    let focus = match &args.word {
        None => usize::from(n > 1),
        Some(w) => find_word(&ex.words, w)?,
    };
    let text = walkthrough(&ex, mask.as_ref(), focus);
    let text = match &args.file {
        Some(path) => text.with_context(|| format!("{}", path.display()))?,
        None => text?,
    };
    crate::out!("{text}")?;
    Ok(())
}

/// The row of `--word asked`, found as `explain --focus` finds a word ([`word_key`]: in any
/// case, however accents are encoded), and `word#n` for its n-th occurrence (counted alike).
fn find_word(words: &[String], asked: &str) -> anyhow::Result<usize> {
    let (name, occurrence) = match asked.rsplit_once('#') {
        Some((name, n))
            if !name.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) =>
        {
            let n: usize = n
                .parse()
                .with_context(|| format!("--word {asked:?}: the number after '#' is too large"))?;
            (name, n)
        }
        _ => (asked, 1),
    };
    let found: Vec<usize> = (0..words.len())
        .filter(|&i| word_key(&words[i]) == word_key(name))
        .collect();
    match (found.len(), occurrence) {
        (0, _) => bail!(
            "--word {asked:?} is not one of the words: {}",
            words.join(", ")
        ),
        (_, 0) => bail!("--word {asked:?}: occurrences count from 1 ({name}#1 is the first)"),
        (count, n) if n > count => bail!(
            "--word {asked:?}: {name:?} occurs {} in the words; #{n} asks for more",
            if count == 1 {
                "once".to_string()
            } else {
                format!("{count} times")
            }
        ),
        _ => Ok(found[occurrence - 1]),
    }
}

fn walkthrough(ex: &Example, mask: Option<&MaskKind>, focus: usize) -> anyhow::Result<String> {
    let words = &ex.words;
    let n = words.len();
    let (d_model, d_k, d_v) = (ex.x.cols, ex.w_q.cols, ex.w_v.cols);
    let q = ex.x.matmul(&ex.w_q);
    let k = ex.x.matmul(&ex.w_k);
    let v = ex.x.matmul(&ex.w_v);
    // The input's numbers are finite, yet their products can overflow f32.
    for (name, m) in [("q = X·W_q", &q), ("k = X·W_k", &k), ("v = X·W_v", &v)] {
        if let Some(i) = m.data.iter().position(|x| !x.is_finite()) {
            bail!(
                "{name} is {} at row {}, column {}: the products of X and the weights overflow \
                 f32 (largest finite: {:e})",
                m.data[i],
                i / m.cols,
                i % m.cols,
                f32::MAX
            );
        }
    }

    let mut options = AttnOptions {
        weights: WeightsRequest::All,
        ..AttnOptions::default()
    };
    let mask_rows = match mask {
        None => None,
        Some(MaskKind::Causal) => {
            options.causal = Some(Causal::TopLeft);
            Some(causal_matrix(n, n, Causal::TopLeft))
        }
        Some(&MaskKind::Padding(pad)) => {
            let padding = KeyPadding::from_lengths(&[n - pad], n)?;
            let row: Vec<u8> = padding.row(0).iter().map(|&r| u8::from(r)).collect();
            options.key_padding = Some(padding);
            Some(vec![row; n])
        }
    };
    let shape = AttnShape {
        value_dim: d_v,
        ..AttnShape::new(1, 1, n, n, d_k)
    };
    let input = AttnInput::new(&q.data, &k.data, &v.data, shape)?;
    let result = sdpa_reference(&input, &options)?;
    let Some(Weights::All { data: weights, .. }) = &result.weights else {
        bail!("attn-core returned no weights");
    };
    let scale = options.scale_for(&shape);
    let scores = q.matmul(&transpose(&k));
    let scaled: Vec<f32> = scores.data.iter().map(|s| s * scale).collect();

    let dims = |m: &Matrix| format!("{}×{}", m.rows, m.cols);
    let num: Vec<String> = (0..d_model.max(d_k).max(d_v))
        .map(|i| i.to_string())
        .collect();
    let mut s = String::new();
    s += &format!(
        "Attention step by step for \"{}\" ({n} words, d_model = {d_model}, d_k = {d_k}, \
         d_v = {d_v})\n\n",
        words.join(" ")
    );
    s += &format!("1. Embeddings X ({}), one row per word\n", dims(&ex.x));
    s += &table(words, &num[..d_model], &ex.x.data);
    if ex.builtin {
        s += "\n2. Weight matrices. ILLUSTRATIVE values, fixed so the example is reproducible; a \
              trained model learns its own.\n   W_q = W_k = the 4×4 Hadamard matrix H (H·Hᵀ = 4·I, \
              so Q·Kᵀ = 4·X·Xᵀ: words with alike embeddings score high). With W_q = W_k the scores \
              are symmetric (\"The\" scores \"sat\" as \"sat\" scores \"The\"); a trained model's \
              W_q and W_k differ, so it need not be.\n";
    } else {
        s += "\n2. Weight matrices (from the input file)\n";
    }
    for (name, w) in [("W_q", &ex.w_q), ("W_k", &ex.w_k), ("W_v", &ex.w_v)] {
        let rows: Vec<String> = (0..w.rows).map(|i| i.to_string()).collect();
        s += &format!("   {name} ({})\n", dims(w));
        s += &table(&rows, &num[..w.cols], &w.data);
    }
    s += "\n3. Queries, keys and values: Q = X·W_q (what each word looks for), \
          K = X·W_k (what it contains), V = X·W_v (what it passes on)\n";
    for (name, m) in [("Q", &q), ("K", &k), ("V", &v)] {
        s += &format!("   {name} ({})\n", dims(m));
        s += &table(words, &num[..m.cols], &m.data);
    }
    s += &format!(
        "\n4. Scores Q·Kᵀ ({n}×{n}): row = the word looking, column = the word looked at\n"
    );
    s += &table(words, words, &scores.data);
    s += &format!(
        "\n5. Scaled scores Q·Kᵀ / √d_k = Q·Kᵀ / √{d_k} = Q·Kᵀ / {:.3} (keeps the softmax from \
         saturating as d_k grows)\n",
        1.0 / scale
    );
    s += &table(words, words, &scaled);
    if let Some(rows) = &mask_rows {
        let what = match mask {
            Some(MaskKind::Causal) => "causal: each word sees itself and the words before it",
            _ => "padding: no word attends to a padding word",
        };
        s += &format!(
            "\n   Mask ({what}; 1 = may attend, 0 = score set to −∞ before the softmax)\n"
        );
        s += &indent(&render(words, words, rows));
        let masked: Vec<f32> = scaled
            .iter()
            .zip(rows.iter().flatten())
            .map(|(&x, &m)| if m == 1 { x } else { f32::NEG_INFINITY })
            .collect();
        s += "   Masked scaled scores\n";
        s += &table(words, words, &masked);
    }
    // A row whose every key is masked has no softmax: its weights are 0.
    let blind_row = mask_rows
        .as_ref()
        .is_some_and(|rows| rows.iter().any(|row| row.iter().all(|&m| m == 0)));
    s += if blind_row {
        "\n6. Attention weights = softmax of each row (each row that sees a word sums to 1; a row \
         that sees none is 0)\n"
    } else {
        "\n6. Attention weights = softmax of each row (each row sums to 1)\n"
    };
    s += &table(words, words, weights);
    for i in 0..n {
        let visible = mask_rows.as_ref().map(|rows| rows[i].as_slice());
        s += &format!(
            "   {}\n",
            describe_row(words, i, &weights[i * n..][..n], visible)
        );
    }
    if blind_row {
        s += &format!(
            "   (A row that sees no word: attnscope gives it {}. A padding token's own row is \
             thrown away by the model either way.)\n",
            super::mask::BLIND_ROWS
        );
    }
    s += &format!(
        "\n7. Output = weights · V ({n}×{d_v}): each word's new vector is a weighted average of \
         the value rows\n"
    );
    s += &table(words, &num[..d_v], &result.out);
    s += &weighted_sum(words, focus, &weights[focus * n..][..n], &v, &result.out);
    Ok(s)
}

fn transpose(m: &Matrix) -> Matrix {
    let mut data = Vec::with_capacity(m.data.len());
    for j in 0..m.cols {
        for i in 0..m.rows {
            data.push(m.data[i * m.cols + j]);
        }
    }
    Matrix {
        rows: m.cols,
        cols: m.rows,
        data,
    }
}

/// "cat: 15% to The, 60% to itself, 25% to sat".
/// `visible` (1 = may attend) marks masked keys.
fn describe_row(words: &[String], i: usize, row: &[f32], visible: Option<&[u8]>) -> String {
    if row.iter().all(|&w| w == 0.0) {
        return format!(
            "{}: sees no word (every key is masked), so its output is 0",
            words[i]
        );
    }
    let parts: Vec<String> = row
        .iter()
        .enumerate()
        .map(|(j, &w)| {
            let target = if j == i { "itself" } else { words[j].as_str() };
            let masked = if visible.is_some_and(|v| v[j] == 0) {
                " (masked)"
            } else {
                ""
            };
            format!("{:.0}% to {target}{masked}", 100.0 * w)
        })
        .collect();
    format!("{}: {}", words[i], parts.join(", "))
}

/// "output[1] = 0.15·V[0] + 0.60·V[1] + 0.25·V[2]", then with the vectors and the result.
fn weighted_sum(words: &[String], i: usize, row: &[f32], v: &Matrix, out: &[f32]) -> String {
    let vec = |x: &[f32]| {
        let items: Vec<String> = x.iter().map(|a| format!("{a:.3}")).collect();
        format!("[{}]", items.join(", "))
    };
    let symbolic: Vec<String> = row
        .iter()
        .enumerate()
        .map(|(j, w)| format!("{w:.3}·V[{j}]"))
        .collect();
    let numeric: Vec<String> = row
        .iter()
        .enumerate()
        .map(|(j, w)| format!("{w:.3}·{}", vec(v.row(j))))
        .collect();
    let sources: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(j, w)| format!("V[{j}] from \"{w}\""))
        .collect();
    let lead = format!("   output[{i}] = ");
    let pad = " ".repeat(lead.chars().count() - 2);
    format!(
        "\n   For \"{}\" (row {i}):\n{lead}{}\n{pad}= {}\n{pad}= {}\n   ({})\n",
        words[i],
        symbolic.join(" + "),
        numeric.join(" + "),
        vec(&out[i * v.cols..][..v.cols]),
        sources.join(", ")
    )
}

/// A labelled numeric table, three decimals.
fn table(row_labels: &[String], col_labels: &[String], data: &[f32]) -> String {
    let cols = col_labels.len();
    let lw = row_labels
        .iter()
        .map(|l| display_width(l))
        .max()
        .unwrap_or(0);
    let cw = col_labels
        .iter()
        .map(|l| display_width(l))
        .max()
        .unwrap_or(0)
        .max(7);
    let mut s = format!("   {:lw$} ", "");
    for l in col_labels {
        s += &format!(" {}", pad_start(l, cw));
    }
    s.push('\n');
    for (i, label) in row_labels.iter().enumerate() {
        s += &format!("   {} ", pad_end(label, lw));
        for x in &data[i * cols..][..cols] {
            s += &format!(" {x:>cw$.3}");
        }
        s.push('\n');
    }
    s
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("   {l}\n")).collect()
}
