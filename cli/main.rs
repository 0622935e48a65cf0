//! The `archon` command line: parse arguments, run the subcommand, exit with its status.

mod args;
mod color;
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
