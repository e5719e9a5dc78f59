//! The `attnscope sdpa` case reader on arbitrary bytes: metadata values of every type, masks of
//! every shape and dtype, expected tensors, through the fast path and the reference twin.
//!
//! The reader is the command's own (`attnscope::cmd::sdpa`), driven through its clap arguments.
#![no_main]

use attnscope::cmd::sdpa;
use attnscope_fuzz::{scratch_dir, scratch_file};
use clap::{Args as _, FromArgMatches};
use libfuzzer_sys::fuzz_target;

fn run(case: &str, extra: &[&str]) {
    let out = scratch_dir().join("out.safetensors");
    let out = out.to_str().expect("scratch paths are UTF-8");
    let command = sdpa::Args::augment_args(clap::Command::new("sdpa"));
    let argv = ["sdpa", case, "-o", out]
        .into_iter()
        .chain(extra.iter().copied());
    let matches = command.try_get_matches_from(argv).expect("valid arguments");
    let args = sdpa::Args::from_arg_matches(&matches).expect("valid arguments");
    let _ = sdpa::run(args);
}

fuzz_target!(|data: &[u8]| {
    let case = scratch_file("case.safetensors", data);
    let case = case.to_str().expect("scratch paths are UTF-8");
    run(case, &["--weights"]);
    run(case, &["--reference"]);
});
