//! One module per subcommand: its flags (`Args`) and its `run`.

pub mod attention;
pub mod bench;
pub mod embed;
pub mod explain;
pub mod generate;
pub mod heads;
pub mod heatmap;
pub mod html;
pub mod lookup;
pub mod mask;
pub mod sdpa;
pub mod serve;
pub mod walkthrough;
