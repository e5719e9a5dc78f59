//! The `attnscope` command line as a library: each subcommand's clap arguments and `run`
//! function (`cmd`), and the shared model-running helpers (`maps`). The binary (`main.rs`) only
//! parses the command line and reports errors; the fuzz targets drive the same code directly.

pub mod cmd;
pub mod maps;

/// `println!` for command output that returns the write's error instead of panicking on it:
/// output piped into `head` closes early, and `main` takes that broken pipe for success.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `print!` as [`outln!`] is `println!`.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)
    }};
}

/// `eprintln!` for status lines and warnings, which ignores a closed standard error
/// (`eprintln!` panics on it) and escapes control characters ([`terminal_safe`]): a note may
/// name a file or a word from the user.
#[macro_export]
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{}", $crate::terminal_safe(&format!($($arg)*)));
    }};
}

/// `message` with its control characters but line breaks escaped: a path or text from the
/// command line or a file (`ATTNSCOPE_MODEL=$'m\e[2J'`) cannot move the cursor or clear the
/// terminal.
pub fn terminal_safe(message: &str) -> String {
    let lines: Vec<_> = message.split('\n').map(attn_viz::bars::printable).collect();
    lines.join("\n")
}
