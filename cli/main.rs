//! The `archon` command line: parse arguments, run the subcommand, exit with its status.

mod args;
mod commands;
mod output;
mod render;
mod trail;

use std::process::ExitCode;

use clap::Parser;

// Parsing and validation allocate many small values; mimalloc makes that markedly cheaper than glibc's malloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = args::Cli::parse();
    match commands::run(args) {
        Ok(status) => status.into(),
        Err(err) => {
            output::error(&err);
            commands::Status::Failure.into()
        }
    }
}
