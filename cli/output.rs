//! The only place the CLI writes to the terminal.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{IsTerminal, Write};

use crate::args::ColorChoice;

/// Writes command output to standard output. A closed pipe is not an error worth reporting.
pub fn stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// Writes a value to standard output as indented JSON and a newline, as it is serialized.
pub fn stdout_json(value: &impl serde::Serialize) {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let _ = serde_json::to_writer_pretty(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
}

/// Standard output, buffered, for `write` to write to as it goes; an error writing (a closed pipe) stops it.
pub fn stdout_with(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let _ = write(&mut out).and_then(|()| out.flush());
}

/// Standard error, buffered, for `write` to write to as it goes.
pub fn stderr_with(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) {
    let mut err = std::io::BufWriter::new(std::io::stderr().lock());
    let _ = write(&mut err).and_then(|()| err.flush());
}

/// Writes diagnostics and problems to standard error.
pub fn stderr(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
}

/// Text a run produced (tool output, errors, outputs, step names), made safe to show: control characters
/// (escape sequences that set the window title, move the cursor or overwrite a line with `\r`) and the
/// characters that reorder text (bidirectional overrides and isolates) are shown as `\u{..}` escapes;
/// newlines and tabs are kept. Whatever a tool or a model wrote must not drive the terminal.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let reorders = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if (c.is_control() && c != '\n' && c != '\t') || reorders {
            out.push_str(&format!("\\u{{{:04x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Reports a failure of the CLI itself (not a diagnostic) on standard error, made printable (it may name
/// a path as it was given).
pub fn error(err: &anyhow::Error) {
    eprintln!("error: {}", printable(&format!("{err:#}")));
}

/// Whether to color standard output.
pub fn use_color(choice: ColorChoice) -> bool {
    color_for(choice, capable(std::io::stdout().is_terminal()))
}

/// Whether to color standard error.
pub fn use_color_stderr(choice: ColorChoice) -> bool {
    color_for(choice, capable(std::io::stderr().is_terminal()))
}

/// Whether standard error is a terminal that takes escape codes (moving the cursor, clearing a line,
/// colours): a terminal whose `TERM` is not `dumb` (Emacs' shell, some CI logs).
pub fn stderr_is_capable_terminal() -> bool {
    capable(std::io::stderr().is_terminal())
}

fn capable(terminal: bool) -> bool {
    terminal && std::env::var_os("TERM").is_none_or(|term| term != "dumb")
}

fn color_for(choice: ColorChoice, terminal: bool) -> bool {
    match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()) && terminal,
    }
}

/// `n` and the noun `what`, in the plural unless `n` is 1: `1 step`, `2 steps`.
pub fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}
