//! The run experience of issue 15 ("a daily driver"): the live status line on a terminal, paused while an
//! approval prompt is open; colour on every command; error bodies cut to one line in progress and events,
//! whole in `archon logs`; `archon run --dry-run`; and what `archon show` says of `foreach` steps.

use std::path::Path;

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon};

/// The id of the newest run in `dir`.
fn last_run(dir: &Path) -> String {
    let Output { stdout, .. } = archon(dir, &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    runs[0]["id"].as_str().expect("id").to_owned()
}

/// Durations and run ids made stable for snapshots.
fn stable(text: &str, id: &str) -> String {
    let mut out = text.replace(id, "RUN");
    // `12 ms`, `in 3 ms` and `(12 ms)` become `N ms`.
    let mut cleaned = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(at) = rest.find(" ms") {
        let head = &rest[..at];
        let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            cleaned.push_str(&head[..head.len() - digits]);
            cleaned.push('N');
        } else {
            cleaned.push_str(head);
        }
        cleaned.push_str(" ms");
        rest = &rest[at + 3..];
    }
    cleaned.push_str(rest);
    out = cleaned;
    out
}

const NOISY: &str = r#"name: noisy
steps:
  - id: noisy
    tool: exec
    with: { argv: [sh, -c, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo line $i; echo err $i >&2; done; exit 2"] }
    retry: { attempts: 2, delay: 10ms, jitter: false }
"#;

/// A command's error, whose text holds the last lines it wrote to stderr, is one line in progress and in
/// the event log, with a note saying where the rest is; the attempts and the step's result keep it whole,
/// and `archon logs` prints it after the command's output (issue 15, item 4).
#[test]
fn a_multi_line_error_is_one_line_in_progress_and_events_and_whole_in_logs() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("noisy.yaml"), NOISY).expect("write");
    let run = archon(
        dir.path(),
        &["run", "noisy.yaml", "--events", "events.jsonl"],
    );
    assert_eq!(run.code, 1, "{}", run.stderr);
    let id = last_run(dir.path());
    let full = "`sh` exited with code 2: err 8\nerr 9\nerr 10\nerr 11\nerr 12";
    insta::assert_snapshot!(stable(&run.stderr, &id), @r"
    started   noisy
    retrying  noisy (attempt 2 in N ms): `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    failed    noisy (N ms): `sh` exited with code 2: err 8 (+4 lines, see `archon logs RUN noisy`)
    ");
    let cut = format!("`sh` exited with code 2: err 8 (+4 lines, see `archon logs {id} noisy`)");
    let events: Vec<Json> = std::fs::read_to_string(dir.path().join("events.jsonl"))
        .expect("events")
        .lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    let errors: Vec<(&str, &str)> = events
        .iter()
        .filter_map(|e| Some((e["event"].as_str()?, e["error"].as_str()?)))
        .collect();
    assert_eq!(
        errors,
        [
            ("step_retried", cut.as_str()),
            ("step_finished", cut.as_str())
        ]
    );
    // The stored event log is the same.
    let shown: Json =
        serde_json::from_str(&archon(dir.path(), &["show", &id, "--json", "--events"]).stdout)
            .expect("show");
    let stored: Vec<&str> = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["error"].as_str())
        .collect();
    assert_eq!(stored, [cut.as_str(), cut.as_str()]);
    // The step's result and each attempt keep the whole text.
    assert_eq!(shown["results"]["noisy"]["error"], full);
    let attempts: Vec<&str> = shown["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| a["error"].as_str().expect("error"))
        .collect();
    assert_eq!(attempts, [full, full]);
    // `archon logs` prints it after what the command wrote.
    let logs = archon(dir.path(), &["logs", &id, "noisy"]);
    assert_eq!(logs.code, 0);
    let err: String = (1..=12).map(|i| format!("err {i}\n")).collect();
    assert_eq!(
        logs.stderr,
        format!("{err}archon: attempt 2 of `noisy` failed: {full}\n")
    );
}
