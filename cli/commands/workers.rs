//! `archon workers [--json]`: the live workers of a PostgreSQL run store (`archon worker` processes whose
//! registration has not lapsed), each with the steps it holds now. A front end over
//! `session::live_workers`; any other store is refused, as `archon run --submit` refuses it.

use archon_engine::session;

use super::Status;
use super::run::store_error;
use super::runs::{table, timestamp};
use crate::args::WorkersArgs;
use crate::output;

pub fn workers(args: &WorkersArgs) -> anyhow::Result<Status> {
    let workers = match session::live_workers(&args.state.at()) {
        Ok(workers) => workers,
        Err(e) => return Ok(store_error(&e)),
    };
    if args.json {
        output::stdout_json(&workers);
        return Ok(Status::Success);
    }
    if workers.is_empty() {
        output::stdout(&format!("no live workers on `{}`\n", args.state.shown()));
        return Ok(Status::Success);
    }
    let rows: Vec<[String; 7]> = workers
        .iter()
        .map(|w| {
            [
                output::printable(&w.name),
                output::printable(&w.host),
                w.pid.to_string(),
                if w.labels.is_empty() {
                    "-".to_owned()
                } else {
                    output::printable(&w.labels.join(","))
                },
                w.concurrency.to_string(),
                w.steps.to_string(),
                timestamp(w.last_seen_at),
            ]
        })
        .collect();
    output::stdout(&table(
        &[
            "WORKER",
            "HOST",
            "PID",
            "LABELS",
            "CONCURRENCY",
            "STEPS",
            "LAST SEEN",
        ],
        &rows,
    ));
    Ok(Status::Success)
}
