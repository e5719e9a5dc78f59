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
