//! `archon prune --older-than AGE [--dry-run]`: delete finished runs that ended longer ago than AGE, with
//! everything they recorded, and say how many and how much.

use std::fmt::Write as _;
use std::time::SystemTime;

use super::Status;
use super::run::{existing_session, store_error};
use super::runs::{table, timestamp};
use crate::args::PruneArgs;
use crate::output;

pub fn prune(args: &PruneArgs) -> anyhow::Result<Status> {
    let session = match existing_session(&args.state) {
        Ok(Some(session)) => session,
        Ok(None) => {
            output::stdout(&format!(
                "no runs in `{}`: nothing to prune\n",
                args.state.shown()
            ));
            return Ok(Status::Success);
        }
        Err(status) => return Ok(status),
    };
    let before = SystemTime::now()
        .checked_sub(args.older_than.duration)
        .unwrap_or(SystemTime::UNIX_EPOCH)
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let pruned = match session.prune(before, args.dry_run) {
        Ok(pruned) => pruned,
        Err(e) => return Ok(store_error(&e)),
    };
    let age = &args.older_than.text;
    let verb = if pruned.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let note = if pruned.dry_run {
        ""
    } else {
        " (the database file keeps its size; new runs reuse the space)"
    };
    // Firings that started no run (skipped, refused) go with age too.
    let firings = match pruned.firings {
        0 => String::new(),
        1 => "1 firing that started no run (skipped or refused)".to_owned(),
        n => format!("{n} firings that started no run (skipped or refused)"),
    };
    if pruned.runs.is_empty() {
        if pruned.firings == 0 {
            output::stdout(&format!("no finished run ended more than {age} ago\n"));
        } else {
            output::stdout(&format!(
                "no finished run ended more than {age} ago; {verb} {firings} recorded before then: {} of records{note}\n",
                size(pruned.bytes)
            ));
        }
        return Ok(Status::Success);
    }
    let rows: Vec<[String; 4]> = pruned
        .runs
        .iter()
        .map(|r| {
            [
                r.id.clone(),
                r.workflow.clone(),
                r.status.as_str().to_owned(),
                r.finished_at.map_or_else(|| "-".to_owned(), timestamp),
            ]
        })
        .collect();
    let mut text = table(&["RUN", "WORKFLOW", "STATUS", "FINISHED"], &rows);
    let runs = pruned.runs.len();
    let _ = writeln!(
        text,
        "{verb} {runs} run{} that ended more than {age} ago{}: {} of records{note}",
        if runs == 1 { "" } else { "s" },
        if firings.is_empty() {
            String::new()
        } else {
            format!(", and {firings} recorded before then")
        },
        size(pruned.bytes),
    );
    output::stdout(&output::printable(&text));
    Ok(Status::Success)
}

/// Bytes as a person reads them: `512 B`, `12.3 KiB`, `4.0 MiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
