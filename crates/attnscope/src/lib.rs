//! The `attnscope` command line as a library: each subcommand's clap arguments and `run`
//! function (`cmd`), and the shared model-running helpers (`maps`). The binary (`main.rs`) only
//! parses the command line and reports errors; the fuzz targets drive the same code directly.

pub mod cmd;
pub mod maps;
