//! Attention matrices as pictures (PNG or SVG), drawn with plotters: a heatmap with word labels
//! on both axes, a colour bar and a title (as `seaborn.heatmap` draws it in the notes), and a grid
//! of every layer × head as small multiples.
//!
//! Text uses DejaVu Sans compiled into the binary (the `dejavu` crate), so drawing needs no
//! system fonts and works headless. Images are drawn in memory and written once, so a failed
//! write leaves no half-drawn file and reports the path.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::backend::{BitMapBackend, SVGBackend};
use plotters::coord::Shift;
use plotters::prelude::{DrawingArea, DrawingBackend, IntoDrawingArea, Rectangle};
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{
    Color, FontDesc, FontFamily, FontStyle, FontTransform, RGBColor, TextStyle, WHITE,
};

use crate::VizError;

/// The picture formats, chosen by the file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Svg,
}

impl ImageFormat {
    /// `.png` or `.svg` (any case); anything else is an error naming the path.
    pub fn from_path(path: &Path) -> Result<ImageFormat, VizError> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("png") => Ok(ImageFormat::Png),
            Some("svg") => Ok(ImageFormat::Svg),
            _ => Err(VizError::UnknownImageFormat {
                path: path.to_path_buf(),
            }),
        }
    }
}

/// One matrix with its labels: square (queries and keys the same tokens), or rows over other
/// columns (an encoder-decoder model's target over its source).
#[derive(Debug, Clone, Copy)]
pub struct Heatmap<'a> {
    pub title: &'a str,
    /// Row (query) labels, one per row; the columns' too unless `columns` names them.
    pub labels: &'a [String],
    /// Column (key) labels when they are not the rows'.
    pub columns: Option<&'a [String]>,
    /// `[rows, columns]`, row-major.
    pub matrix: &'a [f32],
    pub marks: Marks,
}

impl Heatmap<'_> {
    fn columns(&self) -> &[String] {
        self.columns.unwrap_or(self.labels)
    }

    /// The marks drawn: a causal mask and a divider between two texts belong to a square
    /// matrix.
    fn marks(&self) -> Marks {
        match self.columns {
            None => self.marks,
            Some(_) => Marks::default(),
        }
    }
}

/// What a picture marks beside the weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// The model is causal: the cells above the diagonal (a query and a later key) are masked,
    /// drawn grey rather than in weight 0's colour, so that "could not attend" does not read as
    /// "chose not to". (Rows and columns are in the input's order, merged or not, so a later
    /// unit's tokens all follow an earlier one's.)
    pub causal: bool,
    /// The first row and column of the pair's text (segment B): a line between the two texts.
    pub divider: Option<usize>,
}

/// The grey of masked cells.
const MASKED: RGBColor = RGBColor(222, 222, 222);

/// One small multiple of a grid.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    /// `[n, n]`, row-major.
    pub matrix: Vec<f32>,
}

/// Writes `heatmap` to `path` (PNG or SVG by extension). The causal and divider marks are
/// drawn on a square matrix only.
///
/// # Shapes
/// `heatmap.matrix: [rows, columns]` with `rows = heatmap.labels.len()` and `columns` the
/// column labels' count.
pub fn write_heatmap(path: &Path, heatmap: &Heatmap<'_>) -> Result<(), VizError> {
    let format = ImageFormat::from_path(path)?;
    check_shape(
        heatmap.matrix,
        heatmap.labels.len(),
        heatmap.columns().len(),
    )?;
    let layout = HeatmapLayout::new(heatmap)?;
    let bytes = render(format, layout.size, &HeatmapDrawing { layout, heatmap })?;
    write(path, &bytes)
}

/// Writes a grid of panels, `columns` per row, all `[n, n]`, sharing one colour scale.
///
/// Panels larger than [`GRID_MAX_CELLS`] rows are max-pooled to that many blocks, each showing
/// the largest weight it covers (the caption says so): a 512-token grid stays a picture of a
/// sane size, and a head that puts all its weight on one key per row stays as bright as it is
/// (averaged, a previous-token head's weights of 1.0 drew as 0.3). A grid of more than
/// [`MAX_PIXELS`] is refused before anything is drawn.
///
/// # Shapes
/// Each `panel.matrix: [n, n]`.
pub fn write_grid(
    path: &Path,
    title: &str,
    n: usize,
    columns: usize,
    panels: &[Panel],
    marks: Marks,
) -> Result<(), VizError> {
    let format = ImageFormat::from_path(path)?;
    if panels.is_empty() || columns == 0 {
        return Err(VizError::NothingToShow {
            what: "the grid has no panels".to_string(),
        });
    }
    for panel in panels {
        check_square(&panel.matrix, n)?;
    }
    let blocks = n.min(GRID_MAX_CELLS);
    let side = (blocks * (GRID_PANEL / blocks).max(1)).max(blocks);
    let rows = panels.len().div_ceil(columns);
    let (cell_w, cell_h) = (side as u64 + 16, side as u64 + 26);
    let width = (columns as u64)
        .saturating_mul(cell_w)
        .saturating_add(130)
        .max(420);
    fonts()?;
    let max_width = i32::try_from(width).unwrap_or(i32::MAX) - 40;
    let title = wrap_title(title, max_width)?;
    let pooled = (blocks < n).then(|| {
        let k = n.div_ceil(blocks);
        format!("{n} rows in {blocks} blocks: each shows the largest weight of its up to {k} × {k}")
    });
    let caption = wrap(&caption(marks, pooled), " · ", CAPTION_FONT, max_width)?;
    let top = 20 + TITLE_LINE * title.len() as i32 + CAPTION_LINE * caption.len() as i32 + 6;
    let height = (rows as u64)
        .saturating_mul(cell_h)
        .saturating_add(top as u64 + 20);
    // Within MAX_PIXELS every coordinate fits an i32.
    let size = check_size(width, height)?;
    let vmax = panels
        .iter()
        .flat_map(|p| p.matrix.iter().copied())
        .fold(0.0f32, f32::max);
    let grid = GridDrawing {
        title,
        caption,
        top,
        n,
        columns,
        panels,
        blocks,
        side,
        cell: (cell_w as i32, cell_h as i32),
        rows,
        vmax,
        marks,
    };
    let bytes = render(format, size, &grid)?;
    write(path, &bytes)
}

/// Title size in pixels.
const TITLE_FONT: f64 = 18.0;

/// The largest picture drawn, in pixels (192 MB as RGB): a 512-token heatmap is about
/// 2000 × 2100, a grid of 48 layers × 25 heads about 3500 × 7100.
pub const MAX_PIXELS: u64 = 64_000_000;

/// `(width, height)` when the picture has at most [`MAX_PIXELS`].
fn check_size(width: u64, height: u64) -> Result<(u32, u32), VizError> {
    if width.saturating_mul(height) > MAX_PIXELS {
        return Err(VizError::TooLarge {
            width,
            height,
            max: MAX_PIXELS,
        });
    }
    // Both are at most MAX_PIXELS (each side is at least 1).
    Ok((width as u32, height as u32))
}

/// Blocks per side of a grid panel at most (see [`write_grid`]).
pub const GRID_MAX_CELLS: usize = 96;
/// Pixels per side of a grid panel, about.
const GRID_PANEL: usize = 120;

fn check_square(matrix: &[f32], n: usize) -> Result<(), VizError> {
    check_shape(matrix, n, n)
}

fn check_shape(matrix: &[f32], rows: usize, columns: usize) -> Result<(), VizError> {
    if rows == 0 || columns == 0 {
        return Err(VizError::NoTokens);
    }
    if matrix.len() != rows * columns {
        return Err(match rows == columns {
            true => VizError::WeightsShape {
                n_layers: 1,
                n_heads: 1,
                seq_len: rows,
                got: matrix.len(),
            },
            false => VizError::RowsShape {
                n_layers: 1,
                n_heads: 1,
                rows,
                seq_len: columns,
                got: matrix.len(),
            },
        });
    }
    Ok(())
}

/// Max-pools an `[n, n]` matrix to `[blocks, blocks]`: each block the largest weight of the
/// rows and columns it covers (identity when `blocks == n`).
fn pool(matrix: &[f32], n: usize, blocks: usize) -> Vec<f32> {
    if blocks == n {
        return matrix.to_vec();
    }
    let mut out = vec![0.0f32; blocks * blocks];
    for i in 0..n {
        let bi = i * blocks / n;
        for j in 0..n {
            let b = &mut out[bi * blocks + j * blocks / n];
            *b = b.max(matrix[i * n + j]);
        }
    }
    out
}

/// The caption under a picture's title: which axis is which, and what else to know.
fn caption(marks: Marks, extra: Option<String>) -> String {
    let mut caption = "rows: query (attending) · columns: key (attended to)".to_string();
    if marks.causal {
        caption.push_str(" · grey: masked (a query cannot see later keys)");
    }
    if marks.divider.is_some() {
        caption.push_str(" · white lines: where the pair's text starts");
    }
    if let Some(extra) = extra {
        caption.push_str(" · ");
        caption.push_str(&extra);
    }
    caption
}

/// Pixel geometry of a single heatmap.
struct HeatmapLayout {
    size: (u32, u32),
    /// Top-left corner of the matrix.
    origin: (i32, i32),
    /// A cell's width and height.
    cell: (f64, f64),
    font: f64,
    /// Draw every `step`-th row and column label (1 up to 128 of them).
    step: (usize, usize),
    vmax: f32,
    /// The title, wrapped at its " — " separators to the picture's width (see [`wrap_title`]).
    title: Vec<String>,
    /// The caption ([`caption`]), wrapped at its " · " separators.
    caption: Vec<String>,
}

impl HeatmapLayout {
    fn new(heatmap: &Heatmap<'_>) -> Result<HeatmapLayout, VizError> {
        let (rows, columns) = (heatmap.labels.len(), heatmap.columns().len());
        let n = rows.max(columns);
        // Up to 128 labels each row gets ≥ 12 px, enough for a 10 px label; past that the
        // matrix stays ~1536 px and only every `step`-th label is written.
        let side = |n: usize| match n <= 128 {
            true => (760.0 / n as f64).clamp(12.0, 56.0),
            false => (1536.0 / n as f64).max(1.0),
        };
        // Square cells, but a few rows over many columns (`heatmap --rows`) get the height
        // their labels need.
        let (across_cell, mut down_cell) = (side(n), side(n));
        if down_cell * (rows as f64) < 240.0 {
            down_cell = (240.0 / rows as f64).clamp(down_cell, 56.0);
        }
        let font = (across_cell.min(down_cell) * 0.7).clamp(10.0, 15.0);
        let step_of = |cell: f64| (12.0 / cell).ceil().max(1.0) as usize;
        let step = (step_of(down_cell), step_of(across_cell));
        fonts()?;
        let desc = FontDesc::new(FontFamily::SansSerif, font, FontStyle::Normal);
        let mut label_w = 0u32;
        let labels = (heatmap.labels.iter().step_by(step.0))
            .chain(heatmap.columns.into_iter().flatten().step_by(step.1));
        for label in labels {
            let (w, _) = desc.box_size(label).map_err(|e| VizError::Draw {
                message: format!("measuring {label:?}: {e}"),
            })?;
            label_w = label_w.max(w);
        }
        let label_w = label_w.min(220);
        let across = (across_cell * columns as f64).ceil() as u64;
        let down = (down_cell * rows as f64).ceil() as u64;
        let width = across.saturating_add(u64::from(label_w) + 134).max(420);
        let max_width = i32::try_from(width).unwrap_or(i32::MAX) - 32;
        let title = wrap_title(heatmap.title, max_width)?;
        let thinned = match step {
            (1, 1) => None,
            (r, c) if r == c && rows == columns => Some(format!(
                "labels: every {} of the {n} rows (128 rows or fewer get one each)",
                ordinal(r)
            )),
            (r, c) => {
                let part = |k: usize, n: usize, what: &str| {
                    (k > 1).then(|| format!("every {} of the {n} {what}", ordinal(k)))
                };
                let parts: Vec<String> = [part(r, rows, "rows"), part(c, columns, "columns")]
                    .into_iter()
                    .flatten()
                    .collect();
                Some(format!(
                    "labels: {} (128 or fewer get one each)",
                    parts.join(", ")
                ))
            }
        };
        let caption = wrap(
            &caption(heatmap.marks(), thinned),
            " · ",
            CAPTION_FONT,
            max_width,
        )?;
        let top = 14 + TITLE_LINE * title.len() as i32 + CAPTION_LINE * caption.len() as i32 + 6;
        // Rotated labels under the matrix; their measured width runs a little short.
        let height = down.saturating_add(top as u64 + u64::from(label_w + label_w / 8 + 30));
        // Within MAX_PIXELS every coordinate fits an i32.
        let size = check_size(width, height)?;
        let origin = (label_w as i32 + 24, top);
        let vmax = heatmap.matrix.iter().copied().fold(0.0f32, f32::max);
        Ok(HeatmapLayout {
            size,
            origin,
            cell: (across_cell, down_cell),
            font,
            step,
            vmax,
            title,
            caption,
        })
    }
}

/// Pixels from one title line to the next.
const TITLE_LINE: i32 = 24;
/// Title lines at most: a longer title (a model name of thousands of characters in a maps
/// file) ends in "…" rather than making the picture grow.
const TITLE_MAX_LINES: usize = 4;

/// Splits `title` at its " — " separators into at most [`TITLE_MAX_LINES`] lines of at most
/// `max_width` pixels (see [`wrap`]).
fn wrap_title(title: &str, max_width: i32) -> Result<Vec<String>, VizError> {
    wrap(title, " — ", TITLE_FONT, max_width)
}

/// Caption size in pixels, and from one caption line to the next.
const CAPTION_FONT: f64 = 11.0;
const CAPTION_LINE: i32 = 15;

/// Splits `text` at its `separator`s into at most [`TITLE_MAX_LINES`] lines of at most
/// `max_width` pixels at `size`; a piece wider than that is split at its spaces too, a word
/// wider than that is cut to fit and ends in "…", as does the last line when the text has
/// more.
fn wrap(text: &str, separator: &str, size: f64, max_width: i32) -> Result<Vec<String>, VizError> {
    let desc = FontDesc::new(FontFamily::SansSerif, size, FontStyle::Normal);
    let width = |text: &str| {
        desc.box_size(text)
            .map(|(w, _)| w as i32)
            .map_err(|e| VizError::Draw {
                message: format!("measuring {text:?}: {e}"),
            })
    };
    // Each word with what joins it to the one before: the separator between pieces, a space
    // inside a piece too wide for a line.
    let mut words: Vec<(&str, &str)> = Vec::new();
    for piece in text.split(separator) {
        match width(piece)? <= max_width {
            true => words.push((separator, piece)),
            false => {
                let mut inside = piece.split(' ');
                words.extend(inside.next().map(|first| (separator, first)));
                words.extend(inside.map(|word| (" ", word)));
            }
        }
    }
    let mut lines: Vec<String> = Vec::new();
    let mut cut = false;
    for (joiner, word) in words {
        let full = lines.len() == TITLE_MAX_LINES;
        match lines.last_mut() {
            Some(line) if width(&format!("{line}{joiner}{word}"))? <= max_width => {
                line.push_str(joiner);
                line.push_str(word);
            }
            _ if full => {
                cut = true;
                break;
            }
            _ => lines.push(word.to_string()),
        }
    }
    if let Some(last) = lines.last_mut().filter(|_| cut) {
        last.push_str(" …");
    }
    for line in &mut lines {
        if width(line)? > max_width {
            // The most characters that fit before "…" (binary search: at least 0 fit).
            let chars: Vec<char> = line.chars().collect();
            let (mut fit, mut over) = (0, chars.len());
            while over - fit > 1 {
                let mid = (fit + over) / 2;
                let cut: String = chars[..mid].iter().chain(['…'].iter()).collect();
                if width(&cut)? <= max_width {
                    fit = mid;
                } else {
                    over = mid;
                }
            }
            *line = chars[..fit].iter().chain(['…'].iter()).collect();
        }
    }
    Ok(lines)
}

/// Something drawn the same way on either backend.
trait Drawing {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

struct HeatmapDrawing<'a> {
    layout: HeatmapLayout,
    heatmap: &'a Heatmap<'a>,
}

impl Drawing for HeatmapDrawing<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        draw_heatmap(root, &self.layout, self.heatmap)
    }
}

struct GridDrawing<'a> {
    /// The title's and the caption's lines, and where the panels start below them.
    title: Vec<String>,
    caption: Vec<String>,
    top: i32,
    n: usize,
    columns: usize,
    panels: &'a [Panel],
    /// Blocks per panel side after pooling, and the side in pixels.
    blocks: usize,
    side: usize,
    /// Pixels from one panel to the next, across and down.
    cell: (i32, i32),
    rows: usize,
    vmax: f32,
    marks: Marks,
}

impl Drawing for GridDrawing<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let (cell_w, cell_h) = self.cell;
        root.fill(&WHITE)?;
        draw_title(root, &self.title, 20)?;
        let caption_top = 14 + TITLE_LINE * self.title.len() as i32;
        draw_lines(
            root,
            &self.caption,
            (20, caption_top),
            CAPTION_FONT,
            CAPTION_LINE,
        )?;
        let pixel = self.side as f64 / self.blocks as f64;
        // The pair's first row in blocks: where its tokens start inside the pooled panel.
        let marks = Marks {
            divider: self.marks.divider.map(|d| d * self.blocks / self.n),
            ..self.marks
        };
        for (k, panel) in self.panels.iter().enumerate() {
            let x = 20 + (k % self.columns) as i32 * cell_w;
            let y = self.top + (k / self.columns) as i32 * cell_h;
            root.draw_text(&panel.title, &text_style(12.0), (x, y))?;
            let pooled = pool(&panel.matrix, self.n, self.blocks);
            draw_cells(
                root,
                &pooled,
                (self.blocks, self.blocks),
                (x, y + 16),
                (pixel, pixel),
                self.vmax,
                marks,
            )?;
        }
        let bar_x = 40 + self.columns as i32 * cell_w - 10;
        let bar_h = (self.rows as i32 * cell_h - 26).max(60);
        draw_colour_bar(root, (bar_x, self.top + 16), bar_h, self.vmax)
    }
}

type DrawResult<DB> =
    Result<(), plotters::drawing::DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The title's lines from `(x, 14)` down, [`TITLE_LINE`] apart.
fn draw_title<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    lines: &[String],
    x: i32,
) -> DrawResult<DB> {
    draw_lines(root, lines, (x, 14), TITLE_FONT, TITLE_LINE)
}

/// Lines of text at `size` from `(x, y)` down, `spacing` apart.
fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    lines: &[String],
    (x, y): (i32, i32),
    size: f64,
    spacing: i32,
) -> DrawResult<DB> {
    for (k, line) in lines.iter().enumerate() {
        root.draw_text(line, &text_style(size), (x, y + spacing * k as i32))?;
    }
    Ok(())
}

fn draw_heatmap<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    layout: &HeatmapLayout,
    heatmap: &Heatmap<'_>,
) -> DrawResult<DB> {
    let (rows, columns) = (heatmap.labels.len(), heatmap.columns().len());
    let (x0, y0) = layout.origin;
    root.fill(&WHITE)?;
    draw_title(root, &layout.title, 16)?;
    let caption_top = 14 + TITLE_LINE * layout.title.len() as i32;
    draw_lines(
        root,
        &layout.caption,
        (16, caption_top),
        CAPTION_FONT,
        CAPTION_LINE,
    )?;
    draw_cells(
        root,
        heatmap.matrix,
        (rows, columns),
        layout.origin,
        layout.cell,
        layout.vmax,
        heatmap.marks(),
    )?;
    let (cell_w, cell_h) = layout.cell;
    let across = (cell_w * columns as f64).ceil() as i32;
    let down = (cell_h * rows as f64).ceil() as i32;
    let row_label = text_style(layout.font).pos(Pos::new(HPos::Right, VPos::Center));
    let col_label = text_style(layout.font)
        .transform(FontTransform::Rotate270)
        .pos(Pos::new(HPos::Right, VPos::Center));
    let mid = |i: usize, cell: f64| ((i as f64 + 0.5) * cell) as i32;
    for (i, label) in heatmap.labels.iter().enumerate().step_by(layout.step.0) {
        root.draw_text(&clip(label), &row_label, (x0 - 6, y0 + mid(i, cell_h)))?;
    }
    for (j, label) in heatmap.columns().iter().enumerate().step_by(layout.step.1) {
        let at = (x0 + mid(j, cell_w), y0 + down + 6);
        root.draw_text(&clip(label), &col_label, at)?;
    }
    draw_colour_bar(root, (x0 + across + 24, y0), down.max(60), layout.vmax)
}

/// "2nd", "3rd", "4th".
fn ordinal(k: usize) -> String {
    let suffix = match (k % 10, k % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{k}{suffix}")
}

/// Long labels end in "…" rather than running off the picture.
fn clip(label: &str) -> String {
    if label.chars().count() > 24 {
        label.chars().take(23).chain(['…']).collect()
    } else {
        label.to_string()
    }
}

fn draw_cells<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    matrix: &[f32],
    (rows, n): (usize, usize),
    origin: (i32, i32),
    (cell_w, cell_h): (f64, f64),
    vmax: f32,
    marks: Marks,
) -> DrawResult<DB> {
    let x = |k: usize| (k as f64 * cell_w).round() as i32;
    let y = |k: usize| (k as f64 * cell_h).round() as i32;
    // Colours come from a 256-step scale (as matplotlib's colormaps do). The matrix is first
    // filled with 0's colour; then each row draws one rectangle per run of equal colour, skipping
    // runs of the background: a 512-token SVG shrinks several-fold and looks the same.
    let colour_of = |k: usize| viridis((scale(matrix[k], vmax) * 255.0).round() / 255.0);
    let background = viridis(0.0);
    root.draw(&Rectangle::new(
        [origin, (origin.0 + x(n), origin.1 + y(rows))],
        background.filled(),
    ))?;
    for i in 0..rows {
        // A causal model's row ends at its own key: the rest is masked.
        let end = if marks.causal { (i + 1).min(n) } else { n };
        if end < n {
            root.draw(&Rectangle::new(
                [
                    (origin.0 + x(end), origin.1 + y(i)),
                    (origin.0 + x(n), origin.1 + y(i + 1)),
                ],
                MASKED.filled(),
            ))?;
        }
        let mut j = 0;
        while j < end {
            let colour = colour_of(i * n + j);
            let start = j;
            while j < end && colour_of(i * n + j) == colour {
                j += 1;
            }
            if colour == background {
                continue;
            }
            root.draw(&Rectangle::new(
                [
                    (origin.0 + x(start), origin.1 + y(i)),
                    (origin.0 + x(j), origin.1 + y(i + 1)),
                ],
                colour.filled(),
            ))?;
        }
    }
    if let Some(d) = marks.divider.filter(|&d| d > 0 && d < n) {
        // A divider belongs to a square matrix: d is a row and a column.
        root.draw(&Rectangle::new(
            [
                (origin.0, origin.1 + y(d) - 1),
                (origin.0 + x(n), origin.1 + y(d) + 1),
            ],
            WHITE.filled(),
        ))?;
        root.draw(&Rectangle::new(
            [
                (origin.0 + x(d) - 1, origin.1),
                (origin.0 + x(d) + 1, origin.1 + y(rows)),
            ],
            WHITE.filled(),
        ))?;
    }
    Ok(())
}

fn draw_colour_bar<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    height: i32,
    vmax: f32,
) -> DrawResult<DB> {
    for k in 0..height {
        let v = 1.0 - k as f32 / (height - 1).max(1) as f32;
        root.draw(&Rectangle::new(
            [(x, y + k), (x + 16, y + k + 1)],
            viridis(v).filled(),
        ))?;
    }
    root.draw_text(
        "weight",
        &text_style(11.0).pos(Pos::new(HPos::Left, VPos::Top)),
        (x - 2, y + height + 6),
    )?;
    let tick = text_style(11.0).pos(Pos::new(HPos::Left, VPos::Center));
    let (step, decimals) = tick_step(vmax);
    let ticks = if step > 0.0 {
        (vmax / step + 1e-4).floor() as usize
    } else {
        0
    };
    let at = |frac: f32| y + ((1.0 - frac) * (height - 1) as f32).round() as i32;
    let mut marks: Vec<(i32, String)> = (0..=ticks)
        .map(|k| {
            let value = k as f32 * step;
            let frac = if vmax > 0.0 { value / vmax } else { 0.0 };
            (at(frac), format!("{value:.decimals$}"))
        })
        .collect();
    // The top of the scale, the largest weight drawn, when no tick is near it (one more
    // decimal than the ticks: 0.297 over ticks 0.0, 0.1, 0.2 reads 0.30).
    let last = marks.last().map_or(i32::MAX, |&(ty, _)| ty);
    if vmax > 0.0 && last - at(1.0) >= 14 {
        marks.push((at(1.0), format!("{vmax:.0$}", decimals + 1)));
    }
    for (ty, label) in marks {
        root.draw(&Rectangle::new(
            [(x + 16, ty), (x + 20, ty + 1)],
            RGBColor(0, 0, 0).filled(),
        ))?;
        root.draw_text(&label, &tick, (x + 23, ty))?;
    }
    Ok(())
}

/// The colour bar's ticks from 0 up to `vmax`: a round step (1, 2 or 5 times a power of ten)
/// that makes 3 to 6 of them, and the decimals it needs (uniform weights over 300 tokens,
/// 0.0033: ticks 0.000, 0.001, 0.002, 0.003).
fn tick_step(vmax: f32) -> (f32, usize) {
    if vmax <= 0.0 || !vmax.is_finite() {
        return (0.0, 0);
    }
    let power = 10f32.powf((vmax / 2.0).log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|&step| vmax / step < 5.0 + 1e-4)
        .unwrap_or(10.0 * power);
    (step, (-step.log10().floor()).max(1.0) as usize)
}

/// The characters of `texts` that DejaVu Sans, the font PNG pictures are drawn in, has no glyph
/// for (CJK, most emoji): a PNG shows them as boxes, while an SVG leaves them to the viewer's
/// fonts. Whitespace and control characters are not counted; each character once, in order.
pub fn missing_glyphs<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<char> {
    use ab_glyph::Font;
    let Ok(font) = ab_glyph::FontRef::try_from_slice(dejavu::sans::regular()) else {
        return Vec::new();
    };
    let mut missing = Vec::new();
    for c in texts.into_iter().flat_map(str::chars) {
        if !c.is_whitespace() && !c.is_control() && font.glyph_id(c).0 == 0 && !missing.contains(&c)
        {
            missing.push(c);
        }
    }
    missing
}

fn text_style(size: f64) -> TextStyle<'static> {
    TextStyle::from(FontDesc::new(
        FontFamily::SansSerif,
        size,
        FontStyle::Normal,
    ))
}

/// `value / vmax` in `0..=1` (0 when everything is 0).
fn scale(value: f32, vmax: f32) -> f32 {
    if vmax > 0.0 {
        (value / vmax).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// matplotlib's viridis, linearly interpolated between five of its colours.
fn viridis(t: f32) -> RGBColor {
    const STOPS: [(f32, f32, f32); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let x = t.clamp(0.0, 1.0) * 4.0;
    let k = (x.floor() as usize).min(3);
    let f = x - k as f32;
    let (a, b) = (STOPS[k], STOPS[k + 1]);
    let mix = |p: f32, q: f32| (p + (q - p) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Registers DejaVu Sans as plotters' "sans-serif" once.
fn fonts() -> Result<(), VizError> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the embedded DejaVu Sans font did not load".to_string())
        })
        .clone()
        .map_err(|message| VizError::Draw { message })
}

/// Draws with `draw` on a `size` canvas and returns the encoded file.
fn render(
    format: ImageFormat,
    size: (u32, u32),
    drawing: &impl Drawing,
) -> Result<Vec<u8>, VizError> {
    fonts()?;
    let failed = |e: &dyn std::fmt::Display| VizError::Draw {
        message: e.to_string(),
    };
    match format {
        ImageFormat::Png => {
            let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut pixels, size).into_drawing_area();
                drawing.draw(&root).map_err(|e| failed(&e))?;
                root.present().map_err(|e| failed(&e))?;
            }
            encode_png(&pixels, size)
        }
        ImageFormat::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
                drawing.draw(&root).map_err(|e| failed(&e))?;
                root.present().map_err(|e| failed(&e))?;
            }
            Ok(svg.into_bytes())
        }
    }
}

fn encode_png(pixels: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>, VizError> {
    let mut out = Vec::new();
    let failed = |e: png::EncodingError| VizError::Draw {
        message: format!("encoding the PNG: {e}"),
    };
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(failed)?;
    writer.write_image_data(pixels).map_err(failed)?;
    writer.finish().map_err(failed)?;
    Ok(out)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), VizError> {
    std::fs::write(path, bytes).map_err(|source| VizError::Write {
        path: PathBuf::from(path),
        source,
    })
}
