//! `archon worker`: runs the steps of submitted runs from a PostgreSQL store until stopped. A front end
//! over `Session::work`, which claims, runs and finishes the steps.
//!
//! The first SIGTERM (SIGINT, SIGHUP) stops the worker claiming steps and lets the running ones go on
//! for up to `--drain`; then, or at a second signal, they are stopped and handed back to other workers.

use std::sync::Arc;

use archon_engine::session::{Say, Session, WorkerOptions};
use tokio_util::sync::CancellationToken;

use super::Status;
use super::run::{session_error, store_error};
use crate::args::{ColorChoice, WorkerArgs};
use crate::output;

pub fn work(args: &WorkerArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let session = match Session::open_at(&args.state.at()) {
        Ok(session) => session,
        Err(e) => return Ok(store_error(&e)),
    };
    let stop = CancellationToken::new();
    let halt = CancellationToken::new();
    let options = WorkerOptions {
        concurrency: args.concurrency as usize,
        lease: args.lease,
        helper: std::env::current_exe().ok(),
        stop: stop.clone(),
        drain: args.drain,
        halt: halt.clone(),
        say: Say(Arc::new(|line: &str| output::stderr(&format!("{line}\n")))),
        labels: args.labels.clone(),
        global_limit: args.global_limit,
    };
    // The store's runtime when it has one (PostgreSQL's): steps and their store calls on the same threads.
    let mut own = None;
    let handle = match session.store_runtime() {
        Some(handle) => handle,
        None => own
            .insert(
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?,
            )
            .handle()
            .clone(),
    };
    let signal_handle = stop_on_signals(stop, halt)?;
    let labels = if options.labels.is_empty() {
        String::new()
    } else {
        format!(", labels `{}`", options.labels.join(","))
    };
    output::stderr(&format!(
        "worker: taking steps from `{}` ({} at once{labels})\n",
        args.state.shown(),
        options.concurrency
    ));
    let worked = handle.block_on(Arc::new(session).work(&options));
    signal_handle.close();
    if let Some(runtime) = own {
        runtime.shutdown_background();
    }
    match worked {
        Ok(worked) => {
            if worked.released > 0 {
                output::stderr(&format!(
                    "worker: handed {} back to the other workers\n",
                    output::plural(worked.released, "step")
                ));
            }
            output::stderr(&format!(
                "worker: stopped after {} ({} ended here, {} taken over by others)\n",
                output::plural(worked.steps, "step"),
                output::plural(worked.runs, "run"),
                output::plural(worked.lost, "step")
            ));
            Ok(Status::Success)
        }
        Err(e) => Ok(session_error(&e, color)),
    }
}

/// The first signal cancels `stop`, the next ones `halt`.
fn stop_on_signals(
    stop: CancellationToken,
    halt: CancellationToken,
) -> std::io::Result<signal_hook::iterator::Handle> {
    super::run::on_signals(move || {
        if stop.is_cancelled() {
            halt.cancel();
        } else {
            stop.cancel();
        }
    })
}
