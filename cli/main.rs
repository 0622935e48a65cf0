//! The `archon` command line: parse arguments, run the subcommand, exit with its status.

mod args;
mod color;
mod commands;
mod output;
mod render;
mod trail;

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser};

// Parsing and validation allocate many small values; mimalloc makes that markedly cheaper than glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = match args::Cli::try_parse() {
        Ok(args) => args,
        Err(err) => match bad_value(&err) {
            Some(text) => {
                output::stderr(&output::printable(&text));
                return commands::Status::Invalid.into();
            }
            // Help, versions and the other usage errors, as clap writes them.
            None => err.exit(),
        },
    };
    // Orphans of the commands a run starts are reparented to archon rather than to init, so that a step
    // that ends can find and kill what it left behind, even in another session. Best effort: without it,
    // only process groups are killed.
    let _ = archon_engine::process::become_subreaper();
    // A file size limit (`ulimit -f`) makes the kernel send SIGXFSZ on a write past it, which would kill
    // archon without a word; with the signal caught, the write fails (EFBIG) and archon says so.
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    match commands::run(args) {
        Ok(status) => status.into(),
        Err(err) => {
            output::error(&err);
            commands::Status::Failure.into()
        }
    }
}

/// A value an option (or an argument) does not take, said as archon says its errors: lowercase, values in
/// backticks, what it takes on a hint line. `None` for every other parse error.
fn bad_value(err: &clap::Error) -> Option<String> {
    let text = |kind| match err.get(kind) {
        Some(ContextValue::String(text)) => Some(text.clone()),
        _ => None,
    };
    // `--status <STATE>` is `--status`, `<SHELL>` is `SHELL`.
    let arg = text(ContextKind::InvalidArg)?;
    let arg = arg.split_whitespace().next().unwrap_or(&arg);
    let arg = arg.trim_start_matches('<').trim_end_matches('>');
    // No value at all (`--spec` last on the line) is clap's own `a value is required` error.
    let value = text(ContextKind::InvalidValue).filter(|v| !v.is_empty())?;
    match err.kind() {
        ErrorKind::InvalidValue => {
            let Some(ContextValue::Strings(takes)) = err.get(ContextKind::ValidValue) else {
                return None;
            };
            if takes.is_empty() {
                return None;
            }
            let takes = takes
                .iter()
                .map(|v| format!("`{v}`"))
                .collect::<Vec<_>>()
                .join(", ");
            let mut out = format!("error: `{value}` is not a value of `{arg}`\n");
            if let Some(suggested) = text(ContextKind::SuggestedValue) {
                out.push_str(&format!("  hint: did you mean `{suggested}`?\n"));
            }
            out.push_str(&format!("  hint: `{arg}` takes {takes}\n"));
            Some(out)
        }
        ErrorKind::ValueValidation => {
            let why = std::error::Error::source(err).map(ToString::to_string)?;
            // Messages of archon's own parsers name the value already; others (a number's) do not.
            let why = if why.contains(&format!("`{value}`")) {
                why
            } else {
                format!("`{value}` is not a value of `{arg}`: {why}")
            };
            let command = args::Cli::command();
            let subcommand = std::env::args()
                .skip(1)
                .find(|a| command.get_subcommands().any(|s| s.get_name() == a));
            let help = match subcommand {
                Some(name) => format!("archon {name} --help"),
                None => "archon --help".to_owned(),
            };
            Some(format!(
                "error: {why}\n  hint: `{help}` says what `{arg}` takes\n"
            ))
        }
        _ => None,
    }
}
