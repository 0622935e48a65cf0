//! `archon worker`: runs the steps of submitted runs from a PostgreSQL store until stopped. A front end
//! over `Session::work`, which claims, runs and finishes the steps.

use archon_engine::session::{Session, WorkerOptions};
use tokio_util::sync::CancellationToken;

use super::Status;
use super::run::{cancel_on_signals, session_error, store_error};
use crate::args::{ColorChoice, WorkerArgs};
use crate::output;

pub fn work(args: &WorkerArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let session = match Session::open_at(&args.state.at()) {
        Ok(session) => session,
        Err(e) => return Ok(store_error(&e)),
    };
    let stop = CancellationToken::new();
    let options = WorkerOptions {
        concurrency: args.concurrency as usize,
        lease: args.lease,
        helper: std::env::current_exe().ok(),
        stop: stop.clone(),
        labels: args.labels.clone(),
        global_limit: args.global_limit,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let signal_handle = cancel_on_signals(stop)?;
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
    let worked = runtime.block_on(session.work(&options));
    signal_handle.close();
    runtime.shutdown_background();
    match worked {
        Ok(worked) => {
            output::stderr(&format!(
                "worker: stopped after {} steps ({} runs ended here, {} steps taken over by others)\n",
                worked.steps, worked.runs, worked.lost
            ));
            Ok(Status::Success)
        }
        Err(e) => Ok(session_error(&e, color)),
    }
}
