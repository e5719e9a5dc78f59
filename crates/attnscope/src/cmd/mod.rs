//! One module per subcommand: its flags (`Args`) and its `run`.

pub mod answer;
pub mod attention;
pub mod attribute;
pub mod bench;
pub mod classify;
pub mod embed;
pub mod explain;
pub mod generate;
pub mod heads;
pub mod heatmap;
pub mod html;
pub mod lookup;
pub mod mask;
pub mod predict;
pub mod sdpa;
pub mod serve;
pub mod task;
pub mod translate;
pub mod walkthrough;

/// A layer's or head's index for clap: a whole number from 0, and for `-1` (Python's last) a
/// message that says indices count from 0 and none counts from the end.
pub fn index(value: &str) -> Result<usize, String> {
    value.parse().map_err(|_| {
        if value.starts_with('-') && value[1..].parse::<u64>().is_ok() {
            "indices count from 0 (0 is the first) and none counts from the end".to_string()
        } else {
            "expected a whole number from 0".to_string()
        }
    })
}

/// `--rows START..END` (of `heatmap` and `html`): the ends as given, `None` where left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRange {
    start: Option<i64>,
    end: Option<i64>,
}

impl RowRange {
    /// The range over `n` rows (`what`: which rows they are, for the message), or why it
    /// selects none.
    pub fn resolve(self, n: usize, what: &str) -> Result<std::ops::Range<usize>, String> {
        let at = |x: i64| match x < 0 {
            true => n.saturating_sub(x.unsigned_abs() as usize),
            false => (x as usize).min(n),
        };
        let (start, end) = (self.start.map_or(0, at), self.end.map_or(n, at));
        match start < end {
            true => Ok(start..end),
            false => Err(format!(
                "--rows {}..{} selects no row of the {n} {what}",
                self.start.map_or(String::new(), |x| x.to_string()),
                self.end.map_or(String::new(), |x| x.to_string())
            )),
        }
    }
}

/// `--rows` for clap: START..END, either end left out or negative.
pub fn parse_rows(text: &str) -> Result<RowRange, String> {
    let (start, end) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?}: expected START..END, such as 0..10, -8.. or ..5"))?;
    let end_of = |x: &str, which: &str| match x.trim() {
        "" => Ok(None),
        x => x
            .parse::<i64>()
            .map(Some)
            .map_err(|_| format!("{text:?}: {which} {x:?} is not a whole number")),
    };
    Ok(RowRange {
        start: end_of(start, "START")?,
        end: end_of(end, "END")?,
    })
}
