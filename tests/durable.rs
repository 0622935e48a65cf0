//! Durable runs with real processes and real kills: the crash harness, resume and its refusals, retry from
//! a step, cancel, a damaged store, and many processes sharing one store.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::{Output, archon};

fn spawn(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("archon starts")
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn runs(dir: &Path) -> Vec<Json> {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir, &["runs", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    match serde_json::from_str(&stdout).expect("runs as JSON") {
        Json::Array(runs) => runs,
        other => panic!("not a list: {other}"),
    }
}

fn show(dir: &Path, id: &str) -> Json {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir, &["show", id, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("run as JSON")
}

/// Waits until the store holds the process group of `step`'s running attempt: from then on a resume after a
/// kill knows the command it left behind.
fn wait_for_group(dir: &Path, step: &str) {
    let started = Instant::now();
    loop {
        let recorded = runs(dir)
            .first()
            .and_then(|r| r["id"].as_str().map(str::to_owned))
            .is_some_and(|id| {
                attempts(&show(dir, &id), step)
                    .iter()
                    .any(|a| a["status"] == "running" && !a["pgid"].is_null())
            });
        if recorded {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the process group of `{step}` was never recorded"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs archon (a resume) and writes `go` in `dir` as soon as it prints its first line: by then it has
/// stopped the command the killed run left behind, which waits for `go` too, so that only the resumed
/// attempt gets to its effect.
fn resume_then_go(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("archon starts");
    let stderr = child.stderr.take().expect("piped");
    let go = dir.join("go");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.expect("utf-8");
            if text.is_empty() {
                std::fs::write(&go, "").expect("write");
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout)
        .expect("utf-8");
    let status = child.wait().expect("exits");
    Output {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr: reader.join().expect("joined"),
    }
}

/// Waits until `path` exists (a step wrote it), or panics after `limit`.
fn wait_for(path: &Path, limit: Duration) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < limit,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The crash harness's workflow: side-effecting appends (not safe to repeat) and idempotent ones, in
/// parallel, in a chain and per `foreach` item, each writing `run step` to the ledger.
const LEDGER: &str = r#"name: ledger
tools:
  append:
    description: Appends a line to the ledger; repeating it would write the line twice
    parameters: { type: object, properties: { line: { type: string } }, required: [line] }
    command: [sh, -c, 'sleep 0.0$(( $$ % 4 )); printf "%s\n" "$1" >> ledger.txt', sh, "{{ line }}"]
  touch:
    description: Appends a line too, but is declared safe to repeat
    idempotent: true
    parameters: { type: object, properties: { line: { type: string } }, required: [line] }
    command: [sh, -c, 'sleep 0.0$(( $$ % 3 )); printf "%s\n" "$1" >> ledger.txt', sh, "{{ line }}"]
steps:
  - { id: a, tool: append, with: { line: "{{ run.id }} a" } }
  - { id: b, tool: append, with: { line: "{{ run.id }} b" } }
  - { id: c, tool: touch, with: { line: "{{ run.id }} c" } }
  - { id: d, needs: [a, b], tool: append, with: { line: "{{ run.id }} d" } }
  - id: items
    needs: [c]
    foreach: "[1, 2, 3, 4]"
    max_parallel: 2
    tool: append
    with: { line: "{{ run.id }} items[{{ index }}]" }
  - { id: e, needs: [d, items], tool: touch, with: { line: "{{ run.id }} e" } }
  - { id: f, needs: [e], tool: append, with: { line: "{{ run.id }} f" } }
"#;

const NOT_IDEMPOTENT: &[&str] = &[
    "a", "b", "d", "items[0]", "items[1]", "items[2]", "items[3]", "f",
];
const IDEMPOTENT: &[&str] = &["c", "e"];

/// One trial: run, SIGKILL at a random moment, resume (maybe killed again) until the run ends, then
/// check the store and the ledger.
fn crash_trial(trial: usize) {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("ledger.yaml"), LEDGER).expect("write");
    let mut child = spawn(dir.path(), &["run", "ledger.yaml"]);
    std::thread::sleep(Duration::from_millis(fastrand::u64(0..400)));
    kill(&mut child);
    let mut reran_in_doubt = false;
    let mut id = None;
    for round in 0.. {
        assert!(round < 30, "trial {trial}: the run never ended");
        let Some(run) = runs(dir.path()).into_iter().next() else {
            // Killed before the run was recorded: start again.
            let mut child = spawn(dir.path(), &["run", "ledger.yaml"]);
            std::thread::sleep(Duration::from_millis(fastrand::u64(0..400)));
            kill(&mut child);
            continue;
        };
        let run_id = run["id"].as_str().expect("id").to_owned();
        id = Some(run_id.clone());
        if run["status"] == "succeeded" {
            break;
        }
        assert_eq!(run["status"], "interrupted", "trial {trial}: {run}");
        let mut args = vec!["resume", run_id.as_str()];
        if reran_in_doubt {
            args.push("--rerun-in-doubt");
        }
        if fastrand::bool() {
            let mut child = spawn(dir.path(), &args);
            std::thread::sleep(Duration::from_millis(fastrand::u64(0..300)));
            kill(&mut child);
            continue;
        }
        let Output { code, stderr, .. } = archon(dir.path(), &args);
        match code {
            0 => break,
            2 if stderr.contains("may have had") => {
                assert!(!reran_in_doubt, "trial {trial}: {stderr}");
                reran_in_doubt = true;
            }
            _ => panic!("trial {trial}: resume exited {code}: {stderr}"),
        }
    }
    let id = id.expect("a run");
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "succeeded", "trial {trial}: {run}");
    for step in NOT_IDEMPOTENT.iter().chain(IDEMPOTENT) {
        let result = &run["results"][*step];
        assert_eq!(
            result["status"], "succeeded",
            "trial {trial}: {step}: {run}"
        );
    }
    let ledger = std::fs::read_to_string(dir.path().join("ledger.txt")).unwrap_or_default();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for line in ledger.lines() {
        let (run_id, step) = line.split_once(' ').expect("run and step");
        assert_eq!(run_id, id, "trial {trial}");
        *count.entry(step).or_default() += 1;
    }
    for step in IDEMPOTENT {
        assert!(
            count.get(step).copied().unwrap_or(0) >= 1,
            "trial {trial}: {step} lost: {ledger}"
        );
    }
    for step in NOT_IDEMPOTENT {
        let n = count.get(step).copied().unwrap_or(0);
        if reran_in_doubt {
            assert!(n >= 1, "trial {trial}: {step} lost: {ledger}");
        } else {
            assert_eq!(n, 1, "trial {trial}: {step} ran {n} times: {ledger}");
        }
    }
}

/// The crash harness: `ARCHON_CRASH_TRIALS` trials (50 by default; `scripts/crash-harness.sh` runs 1,000).
#[test]
fn crash_harness_loses_nothing_and_repeats_no_side_effect_unasked() {
    let trials = std::env::var("ARCHON_CRASH_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(50);
    for trial in 0..trials {
        crash_trial(trial);
    }
}

const SLOW: &str = r#"name: slow
tools:
  watch:
    description: Waits for the `go` file; safe to repeat
    idempotent: true
    parameters: { type: object, properties: {} }
    command: [sh, -c, "while [ ! -f go ]; do sleep 0.02; done"]
steps:
  - { id: first, tool: write_file, with: { path: first.txt, content: done } }
  - id: wait
    needs: [first]
    tool: exec
    with: { argv: [sh, -c, "touch started; while [ ! -f go ]; do sleep 0.02; done; echo ran >> effects.txt"] }
  - { id: cheap, needs: [first], tool: watch }
  - { id: last, needs: [wait, cheap], tool: write_file, with: { path: last.txt, content: "{{ steps.first.output.bytes }} bytes" } }
"#;

fn attempts(run: &Json, step: &str) -> Vec<Json> {
    run["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .filter(|a| a["step"] == step)
        .cloned()
        .collect()
}

#[test]
fn resume_reuses_finished_steps_and_asks_about_steps_in_doubt() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("slow.yaml"), SLOW).expect("write");
    let mut child = spawn(dir.path(), &["run", "slow.yaml"]);
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    wait_for_group(dir.path(), "wait");
    // While the owner lives, nobody else may resume the run.
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is being run by process"), "{stderr}");
    kill(&mut child);

    assert_eq!(runs(dir.path())[0]["status"], "interrupted");
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`wait`") && !stderr.contains("`cheap`"),
        "only the step that is not safe to repeat is in doubt: {stderr}"
    );
    assert!(stderr.contains("--rerun-in-doubt"), "{stderr}");
    // The killed archon left its command running; the store knows its process group.
    assert!(stderr.contains("its command is still running"), "{stderr}");

    // `go` appears only once the resumed run is under way, after the leftover was stopped.
    let Output { code, stderr, .. } =
        resume_then_go(dir.path(), &["resume", &id, "--rerun-in-doubt"], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("reused    first"), "{stderr}");
    assert!(stderr.contains("stopped process group"), "{stderr}");
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(
        attempts(&run, "first").len(),
        1,
        "finished steps do not run again"
    );
    assert_eq!(attempts(&run, "wait").len(), 2);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("written"),
        "ran\n",
        "the killed attempt never got to its effect"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("last.txt")).expect("written"),
        "4 bytes",
        "the reused output flows downstream"
    );
}

#[test]
fn interrupting_checkpoints_the_run_and_resume_finishes_it() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("slow.yaml"), SLOW).expect("write");
    let mut child = spawn(dir.path(), &["run", "slow.yaml"]);
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(130));
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "interrupted", "{run}");
    assert!(run["owner"].is_null(), "the lease is released: {run}");
    assert_eq!(
        attempts(&run, "wait")[0]["status"],
        "cancelled",
        "the interrupted attempt says so"
    );
    std::fs::write(dir.path().join("go"), "").expect("write");
    // A command archon stopped itself (its process group killed, the stop recorded) is not in doubt: the
    // resume runs it again, without `--rerun-in-doubt` (issue 15, item 2).
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id]);
    assert_eq!(code, 0, "{stderr}");
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(attempts(&run, "wait").len(), 2, "{run}");
}

#[test]
fn retry_from_a_step_reruns_it_and_what_follows_as_new_attempts() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: chain
steps:
  - { id: a, tool: exec, with: { argv: [sh, -c, "echo a >> log.txt; echo 1"], output: json } }
  - { id: b, tool: exec, with: { argv: [sh, -c, "echo b >> log.txt; test -f fixed && echo 2"], output: json } }
  - { id: c, tool: exec, with: { argv: [sh, -c, "echo c >> log.txt; echo $1", sh, "{{ (steps.a.output + steps.b.output) | string }}"], output: json } }
outputs:
  total: "{{ steps.c.output }}"
"#;
    std::fs::write(dir.path().join("chain.yaml"), spec).expect("write");
    let Output { code, .. } = archon(dir.path(), &["run", "chain.yaml"]);
    assert_eq!(code, 1);
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id]);
    assert_eq!(code, 2, "a finished run is not resumed: {stderr}");
    assert!(stderr.contains("archon retry"), "{stderr}");
    let Output { code, stderr, .. } = archon(dir.path(), &["retry", &id, "--from", "x"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("no step `x`"), "{stderr}");

    std::fs::write(dir.path().join("fixed"), "").expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["retry", &id, "--from", "b", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert_eq!(report["outputs"]["total"], 3);
    // `a` and `b` first ran in parallel, so only the counts are fixed.
    let log = std::fs::read_to_string(dir.path().join("log.txt")).expect("written");
    let mut lines: Vec<&str> = log.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        ["a", "b", "b", "c"],
        "a is reused, b runs again, c runs for the first time"
    );
    let run = show(dir.path(), &id);
    let b = attempts(&run, "b");
    assert_eq!(b.len(), 2, "the first attempt stays inspectable");
    assert_eq!(b[0]["status"], "failed");
    assert_eq!(
        (b[0]["generation"].clone(), b[1]["generation"].clone()),
        (Json::from(0), Json::from(1))
    );
    assert_eq!(b[1]["attempt"], 2);
}

#[test]
fn a_changed_spec_is_detected_and_named() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("slow.yaml"), SLOW).expect("write");
    let mut child = spawn(dir.path(), &["run", "slow.yaml"]);
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    kill(&mut child);
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    std::fs::write(
        dir.path().join("slow.yaml"),
        SLOW.replace("content: done", "content: changed"),
    )
    .expect("write");
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id, "--rerun-in-doubt"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("changed: `first`"), "{stderr}");
    std::fs::write(dir.path().join("go"), "").expect("write");
    let Output { code, stderr, .. } = archon(
        dir.path(),
        &["resume", &id, "--rerun-in-doubt", "--allow-changed-spec"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("last.txt")).expect("written"),
        "7 bytes",
        "the changed step and everything after it ran again"
    );
}

#[test]
fn cancel_stops_a_live_run_for_good() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("slow.yaml"), SLOW).expect("write");
    let mut child = spawn(dir.path(), &["run", "slow.yaml"]);
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    let Output { code, stdout, .. } = archon(dir.path(), &["cancel", &id]);
    assert_eq!(code, 0);
    assert!(stdout.contains("asked the process"), "{stdout}");
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(130));
    assert_eq!(runs(dir.path())[0]["status"], "cancelled");
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id]);
    assert_eq!(code, 2);
    assert!(stderr.contains("was cancelled"), "{stderr}");
}

#[test]
fn a_damaged_store_is_reported_and_left_alone() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("hello.yaml"),
        "name: hello\nsteps:\n  - { id: a, tool: echo, with: { text: hi } }\n",
    )
    .expect("write");
    for _ in 0..20 {
        assert_eq!(archon(dir.path(), &["run", "hello.yaml"]).code, 0);
    }
    let db = dir.path().join(".archon/state.db");
    // Move everything from the write-ahead log into the database file, as SQLite does as the log grows.
    let conn = rusqlite::Connection::open(&db).expect("opens");
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .expect("checkpoint");
    drop(conn);
    // Truncated: the file loses its second half.
    let bytes = std::fs::read(&db).expect("read");
    assert!(bytes.len() > 16 * 1024, "{} bytes", bytes.len());
    std::fs::write(&db, &bytes[..bytes.len() / 2]).expect("truncate");
    for args in [&["runs"][..], &["run", "hello.yaml"][..]] {
        let Output { code, stderr, .. } = archon(dir.path(), args);
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(stderr.contains("is damaged"), "{args:?}: {stderr}");
        assert!(stderr.contains("nothing was changed"), "{stderr}");
    }
    assert_eq!(
        std::fs::read(&db).expect("read").len(),
        bytes.len() / 2,
        "never reset"
    );

    // Not a database at all.
    std::fs::write(&db, "these are my notes, not a database\n".repeat(200)).expect("write");
    let Output { code, stderr, .. } = archon(dir.path(), &["runs"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("damaged") || stderr.contains("not an Archon"),
        "{stderr}"
    );
    assert!(
        std::fs::read_to_string(&db)
            .expect("read")
            .starts_with("these are my notes")
    );

    // Someone else's SQLite database: refused, and not even switched to write-ahead logging.
    std::fs::remove_file(&db).expect("remove");
    let foreign = rusqlite::Connection::open(&db).expect("opens");
    foreign
        .execute_batch("CREATE TABLE notes (text TEXT); INSERT INTO notes VALUES ('mine');")
        .expect("written");
    drop(foreign);
    let before = std::fs::read(&db).expect("read");
    let Output { code, stderr, .. } = archon(dir.path(), &["runs"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("is not an Archon state database"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&db).expect("read"),
        before,
        "left exactly as it was"
    );
    assert!(!dir.path().join(".archon/state.db-wal").exists());
}

#[test]
fn fifty_processes_share_one_store() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("hello.yaml"),
        "name: hello\nsteps:\n  - { id: a, tool: echo, with: { text: hi } }\n  - { id: b, tool: exec, with: { argv: [\"true\"] } }\n",
    )
    .expect("write");
    let children: Vec<Child> = (0..50)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_archon"))
                .args(["run", "hello.yaml"])
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("archon starts")
        })
        .collect();
    for child in children {
        let output = child.wait_with_output().expect("exits");
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let runs = runs(dir.path());
    assert_eq!(runs.len(), 50);
    assert!(runs.iter().all(|r| r["status"] == "succeeded"), "{runs:?}");
    let first = show(dir.path(), runs[0]["id"].as_str().expect("id"));
    assert_eq!(first["results"]["b"]["status"], "succeeded");
}

#[test]
fn large_outputs_are_stored_by_reference_and_reused_byte_identical() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: big
steps:
  - { id: big, tool: exec, with: { argv: [sh, -c, "head -c 100000 /dev/zero | tr '\\0' a; echo; date +%N"] } }
  - id: wait
    needs: [big]
    tool: exec
    with: { argv: [sh, -c, "touch started; while [ ! -f go ]; do sleep 0.02; done"] }
  - { id: size, needs: [wait], tool: echo, with: { length: "{{ steps.big.output | length }}" } }
"#;
    std::fs::write(dir.path().join("big.yaml"), spec).expect("write");
    let mut child = spawn(dir.path(), &["run", "big.yaml"]);
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    kill(&mut child);
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    let before = show(dir.path(), &id)["results"]["big"]["output"].clone();
    assert!(
        before.as_str().is_some_and(|s| s.len() > 100_000),
        "{before}"
    );
    std::fs::write(dir.path().join("go"), "").expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["resume", &id, "--rerun-in-doubt", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    // `date +%N` makes every real run of `big` different: equality means it was not run again.
    assert_eq!(report["steps"]["big"]["output"], before);
    assert_eq!(
        report["steps"]["size"]["output"]["length"],
        before.as_str().map_or(0, str::len)
    );
    assert_eq!(show(dir.path(), &id)["results"]["big"]["output"], before);
}

#[test]
fn secret_values_reach_neither_the_store_nor_the_report() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: secretive
secrets: [DEPLOY_TOKEN]
steps:
  - { id: leak, tool: exec, with: { argv: [sh, -c, "echo token=$0; echo also $0 >&2; exit 3", "{{ secrets.DEPLOY_TOKEN }}"] }, on_error: continue }
  - { id: shout, tool: echo, with: { said: "{{ steps.leak.error }}" } }
outputs:
  error: "{{ steps.leak.error }}"
"#;
    std::fs::write(dir.path().join("secretive.yaml"), spec).expect("write");
    let output = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args([
            "run",
            "secretive.yaml",
            "--json",
            "--events",
            "events.jsonl",
        ])
        .current_dir(dir.path())
        .env("DEPLOY_TOKEN", "tok-9f8e7d6c")
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("also ***"),
        "the report shows where the secret was: {stdout}"
    );
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    let stored = archon(dir.path(), &["show", &id, "--json", "--events"]).stdout;
    let events = std::fs::read_to_string(dir.path().join("events.jsonl")).expect("events");
    for (what, text) in [
        ("report", stdout.as_ref()),
        ("store", stored.as_str()),
        ("events", events.as_str()),
    ] {
        assert!(
            !text.contains("tok-9f8e7d6c"),
            "the secret reached the {what}: {text}"
        );
    }
    let db = std::fs::read(dir.path().join(".archon/state.db")).expect("db");
    let wal = std::fs::read(dir.path().join(".archon/state.db-wal")).unwrap_or_default();
    let needle = b"tok-9f8e7d6c";
    assert!(
        !db.windows(needle.len())
            .chain(wal.windows(needle.len()))
            .any(|w| w == needle),
        "the secret is in the database file"
    );
}

/// Review finding: `foreach` items are reused by value, not by position, when the list changes between runs.
#[test]
fn foreach_items_are_reused_for_the_same_item_only() {
    let dir = TempDir::new().expect("tempdir");
    // Item `w` waits for `go` before it writes; the run is killed while it waits.
    let spec = r#"name: items
steps:
  - id: each
    foreach: "env.ITEMS | split(',')"
    max_parallel: 1
    tool: exec
    with: { argv: [sh, -c, "if [ $0 = w ]; then touch started; while [ ! -f go ]; do sleep 0.02; done; fi; echo $0 >> ledger.txt; echo done-$0", "{{ item }}"] }
"#;
    std::fs::write(dir.path().join("items.yaml"), spec).expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "items.yaml"])
        .current_dir(dir.path())
        .env("ITEMS", "a,w")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    wait_for_group(dir.path(), "each[1]");
    kill(&mut child);
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    // `go` appears only once the resume has stopped the killed run's leftover command.
    // The list changed order and grew: `a` is reused where it now is, `w` and `c` run.
    let Output {
        code,
        stdout,
        stderr,
    } = resume_then_go(
        dir.path(),
        &["resume", &id, "--rerun-in-doubt", "--json"],
        &[("ITEMS", "w,a,c")],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("stopped process group"), "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert_eq!(
        report["steps"]["each"]["output"],
        json!(["done-w", "done-a", "done-c"])
    );
    let ledger = std::fs::read_to_string(dir.path().join("ledger.txt")).expect("ledger");
    let mut lines: Vec<&str> = ledger.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        ["a", "c", "w"],
        "each item's effect happened once, whatever its position"
    );
}

/// An OpenAI-compatible answer: a text, or one call of `tool` with no arguments.
fn chat_answer(text: Option<&str>, tool: Option<&str>) -> Json {
    let message = match tool {
        Some(name) => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_{name}"),
                "type": "function",
                "function": { "name": name, "arguments": "{}" }
            }]
        }),
        None => json!({ "role": "assistant", "content": text }),
    };
    json!({
        "id": "chatcmpl-resume",
        "object": "chat.completion",
        "created": 1_763_900_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": if tool.is_some() { "tool_calls" } else { "stop" }
        }],
        "usage": { "prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132 }
    })
}

/// Runs `spec` in `dir` with `env` until its slow tool has started, kills it, and makes the tool fast for
/// the resume (it removes `slow`); returns the run's id.
fn run_until_started_then_kill(dir: &Path, spec: &str, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", spec])
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("archon starts");
    wait_for(&dir.join("started"), Duration::from_secs(20));
    // What was recorded before the slow tool started is committed by now.
    std::thread::sleep(Duration::from_millis(400));
    kill(&mut child);
    std::fs::remove_file(dir.join("slow")).expect("remove");
    runs(dir)[0]["id"].as_str().expect("id").to_owned()
}

const AGENT: &str = r#"name: resumable
llm:
  providers:
    main: { kind: openai, model: gpt-4o-mini }
tools:
  count:
    description: Counts a visit
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo visit >> visits.txt; echo counted"]
  wait:
    description: Waits for the world
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "touch started; if test -f slow; then sleep 30; fi; echo waited"]
steps:
  - id: answer
    goal: Count a visit, then wait, then say done.
    tools: [count, wait]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_step_resumes_after_its_last_iteration() {
    use wiremock::matchers::{body_string_contains, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    let answers = [
        ("waited", chat_answer(Some("done"), None)),
        ("counted", chat_answer(None, Some("wait"))),
        ("", chat_answer(None, Some("count"))),
    ];
    for (priority, (seen, answer)) in (1u8..).zip(answers) {
        Mock::given(method("POST"))
            .and(body_string_contains(seen))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer))
            .with_priority(priority)
            .mount(&server)
            .await;
    }
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("agent.yaml"), AGENT).expect("write");
    std::fs::write(dir.path().join("slow"), "").expect("write");
    let base = format!("{}/v1", server.uri());
    let env = [("OPENAI_BASE_URL", base.as_str())];
    // The first iteration's checkpoint was committed when the second began.
    let id = run_until_started_then_kill(dir.path(), "agent.yaml", &env);

    // `count` changes things: the step is in doubt until the user says to go on.
    let Output { code, stderr, .. } =
        crate::support::archon_with(dir.path(), &["resume", &id], &env);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`answer`"), "{stderr}");
    let Output { code, stderr, .. } =
        crate::support::archon_with(dir.path(), &["resume", &id, "--rerun-in-doubt"], &env);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("resumed   answer after iteration 1"),
        "{stderr}"
    );
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["results"]["answer"]["output"], "done");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("visits.txt")).expect("written"),
        "visit\n",
        "the completed tool call is not made again"
    );
    let requests = server.received_requests().await.expect("recorded");
    let last: Json =
        serde_json::from_slice(&requests.last().expect("requests").body).expect("JSON");
    let calls = last["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    assert_eq!(
        calls, 2,
        "the resumed conversation holds each call once: {last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_planner_step_resumes_with_the_plan_it_accepted() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    let plan = json!({
        "steps": [
            { "id": "first", "tool": "wait", "with": {} },
            { "id": "then", "tool": "echo", "with": { "after": "{{ steps.first.output }}" } }
        ]
    });
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(chat_answer(Some(&plan.to_string()), None)),
        )
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let spec = AGENT.replace(
        "  - id: answer\n    goal: Count a visit, then wait, then say done.\n    tools: [count, wait]\n",
        "  - id: answer\n    plan: Wait, then say so.\n    tools: [wait, echo]\n",
    );
    std::fs::write(dir.path().join("planner.yaml"), spec).expect("write");
    std::fs::write(dir.path().join("slow"), "").expect("write");
    let base = format!("{}/v1", server.uri());
    let env = [("OPENAI_BASE_URL", base.as_str())];
    let id = run_until_started_then_kill(dir.path(), "planner.yaml", &env);
    let Output { code, stderr, .. } =
        crate::support::archon_with(dir.path(), &["resume", &id, "--rerun-in-doubt"], &env);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("resumed   answer with the plan accepted before"),
        "{stderr}"
    );
    let run = show(dir.path(), &id);
    assert_eq!(
        run["results"]["answer"]["output"],
        json!({ "after": "waited" })
    );
    // `expect(1)`: the model was asked for a plan once, by the first process.
    server.verify().await;
}

#[test]
fn http_steps_are_safe_to_repeat_only_when_they_read() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("http.yaml"),
        "name: http\nsteps:\n  - { id: get, tool: http, with: { url: \"http://example.invalid/\" } }\n  - { id: head, tool: http, with: { url: \"http://example.invalid/\", method: HEAD } }\n  - { id: charge, tool: http, with: { url: \"http://example.invalid/\", method: POST } }\n  - { id: chosen, tool: http, with: { url: \"http://example.invalid/\", method: \"{{ 'GE' ~ 'T' }}\" } }\n",
    )
    .expect("write");
    let workflow = archon_engine::validate_file(&dir.path().join("http.yaml"))
        .workflow
        .expect("valid");
    let safe = |id: &str| archon_engine::resume::step_idempotent(&workflow, id);
    assert!(safe("get") && safe("head"));
    assert!(
        !safe("charge"),
        "a POST is recorded before it is sent, and in doubt after a crash"
    );
    assert!(
        !safe("chosen"),
        "a method known only at run time counts as one that changes things"
    );
}

/// `idempotent: true` on a step (a built-in tool has no definition to mark) makes a step that a crash left
/// running safe to run again: `resume` does so without `--rerun-in-doubt` (issue 15, item 2).
#[test]
fn a_step_marked_idempotent_is_rerun_after_a_crash() {
    let dir = TempDir::new().expect("tempdir");
    let spec = SLOW.replace(
        "  - id: wait\n    needs: [first]\n    tool: exec\n",
        "  - id: wait\n    needs: [first]\n    idempotent: true\n    tool: exec\n",
    );
    assert_ne!(spec, SLOW);
    std::fs::write(dir.path().join("slow.yaml"), spec).expect("write");
    let mut child = spawn(dir.path(), &["run", "slow.yaml"]);
    wait_for(&dir.path().join("started"), Duration::from_secs(10));
    wait_for_group(dir.path(), "wait");
    kill(&mut child);
    let id = runs(dir.path())[0]["id"].as_str().expect("id").to_owned();
    assert_eq!(runs(dir.path())[0]["status"], "interrupted");
    let Output { code, stderr, .. } = resume_then_go(dir.path(), &["resume", &id], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(show(dir.path(), &id)["status"], "succeeded");
}
