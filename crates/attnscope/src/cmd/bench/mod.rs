//! `attnscope bench …`: one module per benchmark.

mod sdpa;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Time one attention call (fused kernel): ms and GFLOP/s.
    Sdpa(sdpa::Args),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Sdpa(args) => sdpa::run(args),
    }
}
