//! `archon cache ls` and `archon cache clear`: the cached results of steps with `cache`, through the
//! engine's `Session`.

use archon_engine::session::CacheFilter;

use super::Status;
use super::run::{existing_session, store_error};
use super::runs::{table, timestamp};
use crate::args::{CacheClearArgs, CacheLsArgs};
use crate::output;

/// How many hex digits of a key `cache ls` shows.
const KEY_PREFIX: usize = 12;

pub fn ls(args: &CacheLsArgs) -> anyhow::Result<Status> {
    let session = match existing_session(&args.state) {
        Ok(session) => session,
        Err(status) => return Ok(status),
    };
    let entries = match session.as_ref().map(|s| s.cache_list()) {
        Some(Ok(entries)) => entries,
        Some(Err(e)) => return Ok(store_error(&e)),
        None => Vec::new(),
    };
    if args.json {
        let mut text = serde_json::to_string_pretty(&entries)?;
        text.push('\n');
        output::stdout(&text);
        return Ok(Status::Success);
    }
    if entries.is_empty() {
        output::stdout(&format!("no cached results in `{}`\n", args.state.shown()));
        return Ok(Status::Success);
    }
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            [
                e.key.chars().take(KEY_PREFIX).collect(),
                e.workflow.clone(),
                e.step.clone(),
                timestamp(e.created_at),
                e.expires_at.map_or_else(|| "never".to_owned(), timestamp),
                size(e.size),
                format!("{} ({})", e.run_id, e.source),
            ]
        })
        .collect();
    output::stdout(&output::printable(&table(
        &[
            "KEY", "WORKFLOW", "STEP", "CREATED", "EXPIRES", "SIZE", "SOURCE",
        ],
        &rows,
    )));
    Ok(Status::Success)
}

pub fn clear(args: &CacheClearArgs) -> anyhow::Result<Status> {
    let session = match existing_session(&args.state) {
        Ok(session) => session,
        Err(status) => return Ok(status),
    };
    let filter = CacheFilter {
        workflow: args.workflow.clone(),
        step: args.step.clone(),
        expired: args.expired,
    };
    let removed = match session.as_ref().map(|s| s.cache_clear(&filter)) {
        Some(Ok(removed)) => removed,
        Some(Err(e)) => return Ok(store_error(&e)),
        None => 0,
    };
    output::stdout(&format!(
        "removed {removed} cached result{}\n",
        if removed == 1 { "" } else { "s" }
    ));
    Ok(Status::Success)
}

/// `812 B`, `4.2 KiB`, `1.0 MiB`.
fn size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else {
        format!("{:.1} MiB", b / (KIB * KIB))
    }
}
