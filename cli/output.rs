//! The only place the CLI writes to the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{IsTerminal, Write};

use crate::args::ColorChoice;

/// Writes command output to standard output. A closed pipe is not an error worth reporting.
pub fn stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Writes diagnostics and problems to standard error.
pub fn stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Reports a failure of the CLI itself (not a diagnostic) on standard error.
pub fn error(err: &anyhow::Error) {
    eprintln!("error: {err:#}");
}

/// Whether to color standard output.
pub fn use_color(choice: ColorChoice) -> bool {
    color_for(choice, std::io::stdout().is_terminal())
}

/// Whether to color standard error.
pub fn use_color_stderr(choice: ColorChoice) -> bool {
    color_for(choice, std::io::stderr().is_terminal())
}

fn color_for(choice: ColorChoice, terminal: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && terminal,
    }
}
