//! Processes a run starts: runaway jq filters end as step errors, Ctrl-C works while one runs, and a
//! command that ends, times out or is interrupted leaves nothing running, even in another session.

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use archon_engine::run::{self, RunOptions, StepStatus};
use serde_json::{Map, Value as Json};
use tempfile::TempDir;

use crate::support::{archon, wait_until};

/// Writes `yaml` as `spec.yaml` in `dir`.
fn write_spec(dir: &Path, yaml: &str) {
    std::fs::write(dir.join("spec.yaml"), yaml).expect("write spec");
}

/// The JSON report of an `archon run --json`.
fn report(stdout: &str) -> Json {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Whether process `pid` is alive (a zombie has finished).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The pid a command of the run wrote to `file` in `dir`.
fn pid_in(dir: &Path, file: &str) -> u32 {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}: `{text}`"))
}

/// Asserts that `pid` is gone (killed, it may take a moment to vanish); kills it if not, so that a failing
/// test leaves nothing behind.
fn assert_gone(pid: u32) {
    if !wait_until(Duration::from_secs(5), || !alive(pid)) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        panic!("process {pid} outlived the step that started it");
    }
}

/// Starts `archon run spec.yaml --json --events events.jsonl` in `dir`.
fn start_run(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "spec.yaml", "--json", "--events", "events.jsonl"])
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("archon starts")
}

/// Waits until the events file in `dir` says that `step` started.
fn wait_for_start(dir: &Path, step: &str) {
    let started = wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(dir.join("events.jsonl")).is_ok_and(|events| {
            events.lines().any(|line| {
                serde_json::from_str::<Json>(line)
                    .is_ok_and(|event| event["event"] == "step_started" && event["step"] == step)
            })
        })
    });
    assert!(started, "step `{step}` never started");
}

/// Sends SIGINT to `child` and waits (boundedly) for it to exit; returns its status, stdout and how long
/// it took to exit.
fn interrupt(mut child: Child) -> (ExitStatus, String, Duration) {
    let sent = Instant::now();
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exited = wait_until(Duration::from_secs(10), || {
        child.try_wait().expect("try_wait").is_some()
    });
    if !exited {
        let _ = child.kill();
        panic!("archon did not stop after SIGINT");
    }
    let took = sent.elapsed();
    let output = child.wait_with_output().expect("output");
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        took,
    )
}

#[test]
fn runaway_jq_filters_end_as_step_errors_within_their_timeout() {
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        r#"name: runaway
steps:
  - { id: spin, tool: json, timeout: 1s, with: { input: 1, query: "last(range(1e12))" } }
  - { id: deep, tool: json, timeout: 1s, with: { input: 1, query: "def f: [f]; f" } }
  - { id: after, tool: json, needs: [deep], with: { input: { a: [1, 2] }, query: ".a | add" } }
"#,
    );
    let started = Instant::now();
    let out = archon(dir.path(), &["run", "spec.yaml", "--json"]);
    let took = started.elapsed();
    // 1: the run failed; not 134 (an abort) and not a run that ran on for minutes.
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let report = report(&out.stdout);
    let steps = &report["steps"];
    assert_eq!(steps["spin"]["status"], "timed_out");
    assert_eq!(steps["spin"]["error"], "timed out after 1s");
    assert_eq!(steps["deep"]["status"], "failed");
    assert_eq!(
        steps["deep"]["error"],
        "jq filter `def f: [f]; f` recursed too deeply"
    );
    assert_eq!(steps["after"]["status"], "skipped");
}

#[test]
fn ctrl_c_interrupts_a_run_stuck_in_jq() {
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        r#"name: stuck
steps:
  - { id: spin, tool: json, with: { input: 1, query: "last(range(1e12))" } }
"#,
    );
    let child = start_run(dir.path());
    wait_for_start(dir.path(), "spin");
    let (status, stdout, took) = interrupt(child);
    assert_eq!(status.code(), Some(130));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let report = report(&stdout);
    assert_eq!(report["status"], "cancelled");
    assert_eq!(report["steps"]["spin"]["status"], "cancelled");
}

/// A command that starts `sleep` in a new session from a subshell that exits, so that the sleep is
/// reparented, out of the command's process group and session. The sleep writes its pid to `file` once
/// in its session, and the command goes on only then.
fn escape(file: &str) -> String {
    format!(
        "(setsid sh -c 'echo $$ > {file}.tmp; mv {file}.tmp {file}; exec sleep 300' >/dev/null 2>&1 &); \
         while [ ! -s {file} ]; do sleep 0.01; done"
    )
}

#[test]
fn a_process_in_a_new_session_dies_when_its_step_succeeds() {
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        &format!(
            "name: escape\nsteps:\n  - {{ id: a, tool: shell, with: {{ command: \"{}; echo done\" }} }}\n",
            escape("escaped.pid")
        ),
    );
    let out = archon(dir.path(), &["run", "spec.yaml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report = report(&out.stdout);
    assert_eq!(report["steps"]["a"]["output"], "done");
    assert_gone(pid_in(dir.path(), "escaped.pid"));
}

#[test]
fn a_process_in_a_new_session_dies_when_its_step_times_out() {
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        &format!(
            "name: escape\nsteps:\n  - {{ id: a, tool: shell, timeout: 1s, with: {{ command: \"{}; sleep 100\" }} }}\n",
            escape("escaped.pid")
        ),
    );
    let out = archon(dir.path(), &["run", "spec.yaml", "--json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let report = report(&out.stdout);
    assert_eq!(report["steps"]["a"]["status"], "timed_out");
    assert_gone(pid_in(dir.path(), "escaped.pid"));
}

#[test]
fn a_process_in_a_new_session_dies_when_the_run_is_interrupted() {
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        &format!(
            "name: escape\nsteps:\n  - {{ id: a, tool: shell, with: {{ command: \"{}; echo $$ > leader.pid; sleep 100\" }} }}\n",
            escape("escaped.pid")
        ),
    );
    let child = start_run(dir.path());
    // The leader writes its pid after the escaped process wrote its own.
    assert!(
        wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(dir.path().join("leader.pid")).is_ok_and(|t| t.ends_with('\n'))
        }),
        "the command never started"
    );
    let escaped = pid_in(dir.path(), "escaped.pid");
    let leader = pid_in(dir.path(), "leader.pid");
    assert!(alive(escaped));
    let (status, stdout, _) = interrupt(child);
    assert_eq!(status.code(), Some(130));
    assert_eq!(report(&stdout)["status"], "cancelled");
    assert_gone(escaped);
    assert_gone(leader);
}

#[test]
fn a_step_ends_when_its_command_exits_not_when_its_background_children_do() {
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        r#"name: background
steps:
  - { id: bg, tool: shell, timeout: 10s, with: { command: "(sleep 15 & echo $! > sleep.pid); echo done" } }
"#,
    );
    let started = Instant::now();
    let out = archon(dir.path(), &["run", "spec.yaml", "--json"]);
    let took = started.elapsed();
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let report = report(&out.stdout);
    assert_eq!(report["steps"]["bg"]["status"], "succeeded");
    assert_eq!(report["steps"]["bg"]["output"], "done");
    assert_gone(pid_in(dir.path(), "sleep.pid"));
}

#[test]
fn output_written_before_a_command_exits_is_kept_whole() {
    // Kept after the command exits: what it wrote is still read from the pipe to its end.
    let dir = TempDir::new().expect("tempdir");
    write_spec(
        dir.path(),
        r#"name: output
steps:
  - { id: big, tool: shell, with: { command: "head -c 300000 /dev/zero | tr '\\0' x; (sleep 15 &)" } }
"#,
    );
    let out = archon(dir.path(), &["run", "spec.yaml", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let report = report(&out.stdout);
    assert_eq!(report["steps"]["big"]["output"], "x".repeat(300_000));
}

#[test]
fn a_file_that_never_answers_does_not_hold_the_run() {
    // Reading a FIFO nobody writes blocks until someone does: the step's timeout must still end it.
    let dir = TempDir::new().expect("tempdir");
    let made = Command::new("mkfifo")
        .arg(dir.path().join("pipe"))
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    write_spec(
        dir.path(),
        r#"name: fifo
steps:
  - { id: read, tool: read_file, timeout: 1s, with: { path: pipe } }
"#,
    );
    let mut child = start_run(dir.path());
    let exited = wait_until(Duration::from_secs(20), || {
        child.try_wait().expect("try_wait").is_some()
    });
    if !exited {
        let _ = child.kill();
        panic!("the run did not end after the step's timeout");
    }
    let output = child.wait_with_output().expect("output");
    assert_eq!(output.status.code(), Some(1));
    let report = report(&String::from_utf8_lossy(&output.stdout));
    assert_eq!(report["steps"]["read"]["status"], "timed_out");
}

#[tokio::test]
async fn the_library_without_a_helper_runs_only_plain_paths_and_refuses_other_filters() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - { id: path, tool: json, with: { input: { a: [1, 2] }, query: ".a[1]" } }
  - { id: q, tool: json, with: { input: { a: 1 }, query: ".a + 1" } }
"#;
    let validation = archon_engine::validate_source("t.yaml", yaml);
    let workflow = validation.workflow.expect("valid");
    let options = RunOptions::new(dir.path().to_path_buf(), "nohelper");
    assert_eq!(options.helper, None);
    let report = run::run(Arc::new(workflow), Map::new(), options)
        .await
        .expect("the run ends");
    // A plain path runs in place; anything else needs the helper.
    assert_eq!(report.steps["path"].status, StepStatus::Succeeded);
    assert_eq!(report.steps["path"].output, serde_json::json!(2));
    let q = &report.steps["q"];
    assert_eq!(q.status, StepStatus::Failed);
    assert_eq!(
        q.error.as_deref(),
        Some(
            "cannot run a jq filter: no helper executable is configured\n  hint: set `RunOptions::helper` to the `archon` executable"
        )
    );
}
