//! Runs submitted to workers (`archon run --submit`, `archon worker`) on the real PostgreSQL, through the
//! real binary: a DAG run by 1, 2 and 4 worker processes runs every step exactly once (in the record and in
//! a ledger each step appends to); a worker killed with SIGKILL mid-step has its step taken over once its
//! lease lapses; a worker whose lease was taken over records nothing more; `runs`, `show`, `logs` and
//! `cancel` work on submitted runs. Each test in a schema of its own (see `postgres.rs`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::postgres::{Db, attempts, db};
use crate::support::Output;

/// Seven steps: one, a fan-out of four, a fan-in, and one after it; each appends its id to `ledger`.
pub(crate) const DAG: &str = r#"name: dag
steps:
  - { id: first, tool: exec, with: { argv: [sh, -c, "sleep 0.05; echo first >> ledger"] } }
  - { id: b1, needs: [first], tool: exec, with: { argv: [sh, -c, "sleep 0.1; echo b1 >> ledger"] } }
  - { id: b2, needs: [first], tool: exec, with: { argv: [sh, -c, "sleep 0.1; echo b2 >> ledger"] } }
  - { id: b3, needs: [first], tool: exec, with: { argv: [sh, -c, "sleep 0.1; echo b3 >> ledger"] } }
  - { id: b4, needs: [first], tool: exec, with: { argv: [sh, -c, "sleep 0.1; echo b4 >> ledger; echo said b4"] } }
  - id: join
    needs: [b1, b2, b3, b4]
    tool: exec
    with: { argv: [sh, -c, "echo join >> ledger; echo {{ steps.b4.output }}"] }
  - { id: last, needs: [join], tool: exec, with: { argv: [sh, -c, "echo last >> ledger"] } }
outputs:
  joined: "{{ steps.join.output }}"
"#;

pub(crate) const STEPS: [&str; 7] = ["first", "b1", "b2", "b3", "b4", "join", "last"];

pub(crate) fn submit(db: &Db, spec: &str) -> String {
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["run", "--submit", spec]);
    assert_eq!(code, 0, "{stderr}");
    let id = stdout.trim().to_owned();
    assert!(id.starts_with('r') && !id.contains('\n'), "{stdout}");
    id
}

/// A worker process; its standard error goes to `worker-N.err` in the test's directory.
pub(crate) struct Worker {
    pub(crate) child: Child,
    pub(crate) err: std::path::PathBuf,
}

impl Worker {
    /// What it said on standard error.
    pub(crate) fn said(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits until it has said that it takes steps (its signal handlers are in place then).
    pub(crate) fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.said().contains("worker: taking steps") {
            assert!(
                Instant::now() < deadline,
                "the worker never started: {}",
                self.said()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A worker the test left running (it failed) is not left behind.
impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn worker(db: &Db, n: usize, lease: &str) -> Worker {
    worker_with(db, n, &db.url(), &["--lease", lease])
}

/// A worker of the store at `store` (the test's, through a proxy, say), with `args` (`--concurrency 2`
/// unless they say).
pub(crate) fn worker_with(db: &Db, n: usize, store: &str, args: &[&str]) -> Worker {
    let path = db.path().join(format!("worker-{n}.err"));
    let err = std::fs::File::create(&path).expect("err file");
    let concurrency: &[&str] = if args.contains(&"--concurrency") {
        &[]
    } else {
        &["--concurrency", "2"]
    };
    let child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .arg("worker")
        .args(concurrency)
        .args(args)
        .current_dir(db.path())
        .env("NO_COLOR", "1")
        .env("ARCHON_STORE", store)
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("archon worker starts");
    Worker { child, err: path }
}

pub(crate) fn signal(worker: &Worker, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_child(&worker.child);
    rustix::process::kill_process(pid, signal).expect("signalled");
}

/// Stops workers with SIGTERM; each finishes what it runs and exits 0.
pub(crate) fn stop(workers: Vec<Worker>) {
    for w in &workers {
        w.wait_ready();
        signal(w, rustix::process::Signal::TERM);
    }
    for mut w in workers {
        let status = w.child.wait().expect("exits");
        assert_eq!(status.code(), Some(0), "{}", w.said());
    }
}

/// The run once it has ended (no longer `running`).
pub(crate) fn ended(db: &Db, id: &str) -> Json {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = db.show(id);
        if run["status"] != "running" {
            return run;
        }
        assert!(Instant::now() < deadline, "run `{id}` never ended: {run}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn ledger(db: &Db) -> Vec<String> {
    let mut lines: Vec<String> = std::fs::read_to_string(db.path().join("ledger"))
        .expect("ledger")
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort();
    lines
}

pub(crate) fn sorted(names: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    names.sort();
    names
}

fn dag_runs_once_with(workers: usize) {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("dag.yaml"), DAG).expect("write");
    let id = submit(&db, "dag.yaml");
    assert_eq!(db.show(&id)["status"], "running");
    // Leases long enough that a loaded machine does not lose a step (nothing is killed here).
    let children: Vec<Worker> = (0..workers).map(|n| worker(&db, n, "10s")).collect();
    let run = ended(&db, &id);
    stop(children);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["outputs"]["joined"], "said b4");
    assert_eq!(ledger(&db), sorted(&STEPS));
    for step in STEPS {
        let tried = attempts(&run, step);
        assert_eq!(tried.len(), 1, "{step}: {tried:?}");
        assert_eq!(tried[0]["status"], "succeeded", "{step}");
    }
    let Output { code, stdout, .. } = db.archon(&["runs"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains(&format!("{id}  dag       succeeded")),
        "{stdout}"
    );
    let Output { code, stdout, .. } = db.archon(&["logs", &id, "b4"]);
    assert_eq!((code, stdout.as_str()), (0, "said b4\n"));
}

#[test]
fn a_submitted_dag_runs_each_step_once_on_one_worker() {
    dag_runs_once_with(1);
}

#[test]
fn a_submitted_dag_runs_each_step_once_on_two_workers() {
    dag_runs_once_with(2);
}

#[test]
fn a_submitted_dag_runs_each_step_once_on_four_workers() {
    dag_runs_once_with(4);
}

/// A step's last records (its attempt's end, its result, its events) and its task's end are one
/// transaction: a worker stopped between the two leaves neither a result whose task is still claimed
/// nor a task done without its result. A step that is not safe to repeat has its result made durable
/// first, as soon as it has one (as in a local run: a worker stopped before the task's end then leaves
/// a result the next worker reuses, not a step in doubt), then the task's end in a transaction of its
/// own. The run's last task stays claimed until the run's end is recorded.
#[test]
fn a_steps_last_records_and_its_tasks_end_are_one_transaction() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("mixed.yaml"),
        r#"name: mixed
steps:
  - { id: pure, tool: echo, with: { text: one } }
  - { id: repeatable, idempotent: true, tool: exec, with: { argv: [sh, -c, "sleep 0.06; echo two"] } }
  - { id: effect, tool: exec, with: { argv: [sh, -c, "echo three >> ledger"] } }
  - { id: last, needs: [pure, repeatable, effect], tool: echo, with: { text: end } }
"#,
    )
    .expect("write");
    let id = submit(&db, "mixed.yaml");
    let children: Vec<Worker> = (0..2).map(|n| worker(&db, n, "10s")).collect();
    let run = ended(&db, &id);
    stop(children);
    assert_eq!(run["status"], "succeeded", "{run}");
    // Whether the task's end was written by the transaction that wrote the step's result and ended
    // its attempt.
    let rows = db.sql(&format!(
        "SELECT t.step || ' ' || t.state || ' ' || (t.xmin = r.xmin) || ' ' || (r.xmin = a.xmin)
         FROM tasks t
         JOIN results r ON r.run_id = t.run_id AND r.step = t.step
         JOIN attempts a ON a.run_id = t.run_id AND a.step = t.step
         WHERE t.run_id = '{id}' ORDER BY t.step"
    ));
    assert_eq!(
        rows,
        [
            "effect done false true",
            "last done false true",
            "pure done true true",
            "repeatable done true true"
        ]
    );
}

/// `slow` marks each attempt's start (`started.PID`) and waits for `go` before its effect.
pub(crate) const SLOW: &str = r#"name: slow
steps:
  - { id: first, tool: exec, with: { argv: [sh, -c, "echo first >> ledger"] } }
  - id: slow
    needs: [first]
    idempotent: true
    tool: exec
    with: { argv: [sh, -c, "touch started.$$; while [ ! -f go ]; do sleep 0.02; done; echo slow >> ledger"] }
  - { id: after, needs: [slow], tool: exec, with: { argv: [sh, -c, "echo after >> ledger"] } }
"#;

/// How many attempts of `slow` have started (their marks).
pub(crate) fn starts(db: &Db) -> usize {
    std::fs::read_dir(db.path())
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("started."))
        .count()
}

pub(crate) fn wait_starts(db: &Db, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while starts(db) < n {
        assert!(
            Instant::now() < deadline,
            "attempt {n} of `slow` never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_worker_killed_mid_step_loses_its_step_to_another_after_its_lease() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let id = submit(&db, "slow.yaml");
    let mut first = worker(&db, 0, "1s");
    wait_starts(&db, 1);
    wait_pgid(&db, &id);
    first.child.kill().expect("killed");
    first.child.wait().expect("reaped");
    // The step's lease lapses; another worker takes it over (it is idempotent: it runs again, the
    // command the dead worker left behind stopped first).
    let second = worker(&db, 1, "1s");
    wait_starts(&db, 2);
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    stop(vec![second]);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(ledger(&db), sorted(&["first", "slow", "after"]));
    let tried: Vec<Json> = attempts(&run, "slow")
        .iter()
        .map(|a| a["status"].clone())
        .collect();
    assert_eq!(tried.last(), Some(&Json::from("succeeded")), "{tried:?}");
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert_eq!(attempts(&run, "first").len(), 1);
    assert_eq!(attempts(&run, "after").len(), 1);
}

/// Waits until the store holds the process group of `slow`'s attempt under way, so that whoever takes
/// the step over can tell whether its command is still running.
pub(crate) fn wait_pgid(db: &Db, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !attempts(&db.show(id), "slow")
        .iter()
        .any(|a| a["status"] == "running" && !a["pgid"].is_null())
    {
        assert!(
            Instant::now() < deadline,
            "the process group was never recorded"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_step_in_doubt_that_is_not_safe_to_repeat_stops_the_run_interrupted() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("slow.yaml"),
        SLOW.replace("    idempotent: true\n", ""),
    )
    .expect("write");
    let id = submit(&db, "slow.yaml");
    let mut first = worker(&db, 0, "1s");
    wait_starts(&db, 1);
    wait_pgid(&db, &id);
    first.child.kill().expect("killed");
    first.child.wait().expect("reaped");
    let second = worker(&db, 1, "1s");
    let run = ended(&db, &id);
    stop(vec![second]);
    assert_eq!(run["status"], "interrupted", "{run}");
    assert_eq!(
        run["error"],
        "step `slow` is in doubt: its worker stopped while it ran, and repeating it is not known to be safe"
    );
    // Nothing ran it again; a person decides, as for any run in doubt.
    assert_eq!(starts(&db), 1);
    let Output { code, stderr, .. } = db.archon(&["resume", &id]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("`slow`"), "{stderr}");
    // The command the killed worker left behind ends.
    std::fs::write(db.path().join("go"), "").expect("go");
}

#[test]
fn a_worker_whose_lease_was_taken_over_records_nothing_more() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let id = submit(&db, "slow.yaml");
    let first = worker(&db, 0, "1s");
    wait_starts(&db, 1);
    // Frozen, it renews nothing: its lease lapses and another worker takes the step and ends the run.
    signal(&first, rustix::process::Signal::STOP);
    let second = worker(&db, 1, "1s");
    wait_starts(&db, 2);
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    stop(vec![second]);
    assert_eq!(run["status"], "succeeded", "{run}");
    let events = db.archon(&["show", &id, "--events"]).stdout;
    // Woken, the first worker finds its step taken: it records nothing and stops when asked.
    signal(&first, rustix::process::Signal::CONT);
    let err = db.path().join("worker-0.err");
    stop(vec![first]);
    let said = std::fs::read_to_string(&err).expect("stderr");
    // It ran `first`; `slow` was taken from it.
    assert!(
        said.ends_with(
            "worker: stopped after 1 step (0 runs ended here, 1 step taken over by others)\n"
        ),
        "{said}"
    );
    assert_eq!(db.show(&id), run);
    assert_eq!(db.archon(&["show", &id, "--events"]).stdout, events);
}

#[test]
fn a_submitted_run_is_cancelled_at_once_when_no_worker_has_it() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("dag.yaml"), DAG).expect("write");
    let id = submit(&db, "dag.yaml");
    let Output { code, stderr, .. } = db.archon(&["cancel", &id]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(db.show(&id)["status"], "cancelled");
    // A worker finds nothing to do.
    let w = worker(&db, 0, "1s");
    stop(vec![w]);
    assert!(!db.path().join("ledger").exists());
}

#[test]
fn submitting_needs_a_postgresql_store() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("dag.yaml"), DAG).expect("write");
    let Output { code, stderr, .. } = crate::support::archon_with(
        dir.path(),
        &["run", "--submit", "dag.yaml"],
        &[("ARCHON_STATE_DIR", ".archon")],
    );
    assert_eq!(
        (code, stderr.as_str()),
        (
            1,
            "error: runs can be submitted to workers only on a PostgreSQL run store\n  hint: pass `--store postgres://...` (or set `ARCHON_STORE`)\n"
        )
    );
}

#[test]
fn run_submit_wait_follows_the_run_to_its_end_and_exits_with_its_status() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("dag.yaml"), DAG).expect("write");
    // docs/scale-out.md: three workers, and a run submitted and followed.
    let workers: Vec<Worker> = (0..3).map(|n| worker(&db, n, "10s")).collect();
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["run", "--submit", "--wait", "dag.yaml"]);
    stop(workers);
    assert_eq!(code, 0, "{stderr}");
    let id = stdout.lines().next().expect("the run id").to_owned();
    assert!(
        stdout.starts_with(&format!("{id}\nrun       {id}\nworkflow  dag (")),
        "{stdout}"
    );
    assert!(stdout.contains("\nstatus    succeeded\n"), "{stdout}");
    assert!(
        stdout.ends_with("outputs:\n  joined: said b4\n"),
        "{stdout}"
    );
    // Each step started once and succeeded once, as the workers recorded it (the time column aside).
    let events: Vec<(String, String)> = stderr
        .lines()
        .map(|line| {
            let rest = line.get(11..).unwrap_or_default();
            let (label, body) = rest.split_once(' ').unwrap_or((rest, ""));
            let step = body.trim_start().split(' ').next().unwrap_or_default();
            (label.to_owned(), step.to_owned())
        })
        .collect();
    for step in STEPS {
        for label in ["started", "succeeded"] {
            let seen = events
                .iter()
                .filter(|(l, s)| l == label && s == step)
                .count();
            assert_eq!(seen, 1, "{label} {step}: {stderr}");
        }
    }
}

/// A worker runs its steps on the store's threads (`Session::store_runtime`), beside the journals that
/// renew their leases: with every place running a step that outlives its lease twice over and streams
/// output to its journal all the while (13 kB every 0.1 s, below the 1 MiB a step's output is watched and
/// kept up to), every lease is still renewed in time. No step is stopped or taken over, and each ran once.
#[test]
fn a_worker_busy_in_every_place_still_renews_every_lease() {
    let Some(db) = db() else { return };
    let mut spec = String::from("name: busy\nsteps:\n");
    let names: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    for name in &names {
        spec.push_str(&format!(
            "  - {{ id: {name}, tool: exec, with: {{ argv: [sh, -c, \"for n in $(seq 60); do yes | head -c 13000; sleep 0.1; done; echo {name} >> ledger\"] }} }}\n"
        ));
    }
    std::fs::write(db.path().join("busy.yaml"), spec).expect("write");
    let id = submit(&db, "busy.yaml");
    let w = worker_with(&db, 0, &db.url(), &["--lease", "3s", "--concurrency", "8"]);
    let run = ended(&db, &id);
    let said = w.said();
    stop(vec![w]);
    assert_eq!(run["status"], "succeeded", "{run}\n{said}");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(ledger(&db), sorted(&names));
    for name in &names {
        let tried = attempts(&run, name);
        assert_eq!(tried.len(), 1, "{name}: {tried:?}");
        assert_eq!(tried[0]["status"], "succeeded", "{name}: {tried:?}");
    }
    // Nothing befell its leases: it said only that it works.
    assert_eq!(said.lines().count(), 1, "{said}");
}

#[test]
fn cancel_stops_a_submitted_run_a_worker_is_running_for_good() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let id = submit(&db, "slow.yaml");
    let w = worker(&db, 0, "1s");
    wait_starts(&db, 1);
    let Output { code, stderr, .. } = db.archon(&["cancel", &id]);
    assert_eq!(code, 0, "{stderr}");
    let run = ended(&db, &id);
    stop(vec![w]);
    assert_eq!(run["status"], "cancelled", "{run}");
    let tried: Vec<Json> = attempts(&run, "slow")
        .iter()
        .map(|a| a["status"].clone())
        .collect();
    assert_eq!(tried, vec![Json::from("cancelled")]);
    assert!(attempts(&run, "after").is_empty());
    // The step's command was stopped: it never reached its effect.
    std::fs::write(db.path().join("go"), "").expect("go");
    assert_eq!(ledger(&db), sorted(&["first"]));
}

/// Two steps of one run on one worker: `archon cancel` reaches both at once, not one of them at its next
/// heartbeat (a third of the lease, 20 s here).
#[test]
fn cancel_reaches_every_step_of_the_run_a_worker_is_running() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("pair.yaml"),
        r#"name: pair
steps:
  - { id: left, tool: exec, with: { argv: [sh, -c, "touch started.$$; while [ ! -f go ]; do sleep 0.02; done"] } }
  - { id: right, tool: exec, with: { argv: [sh, -c, "touch started.$$; while [ ! -f go ]; do sleep 0.02; done"] } }
"#,
    )
    .expect("write");
    let id = submit(&db, "pair.yaml");
    let w = worker(&db, 0, "60s");
    wait_starts(&db, 2);
    let asked = Instant::now();
    let Output { code, stderr, .. } = db.archon(&["cancel", &id]);
    assert_eq!(code, 0, "{stderr}");
    let run = ended(&db, &id);
    let took = asked.elapsed();
    stop(vec![w]);
    assert_eq!(run["status"], "cancelled", "{run}");
    for step in ["left", "right"] {
        let tried: Vec<Json> = attempts(&run, step)
            .iter()
            .map(|a| a["status"].clone())
            .collect();
        assert_eq!(tried, vec![Json::from("cancelled")], "{step}");
    }
    assert!(
        took < Duration::from_secs(15),
        "the cancel took {took:?}: a step heard of it only at its heartbeat"
    );
}

/// `slow` of [`SLOW`] needs the label `gpu`: only a worker with it takes that step.
const SLOW_ON_GPU: &str = r#"name: slow
steps:
  - { id: first, tool: exec, with: { argv: [sh, -c, "echo first >> ledger"] } }
  - id: slow
    needs: [first]
    runs_on: [gpu]
    tool: exec
    with: { argv: [sh, -c, "touch started.$$; while [ ! -f go ]; do sleep 0.02; done; echo slow >> ledger"] }
"#;

/// `archon workers --json`, parsed.
fn listed(db: &Db) -> Vec<Json> {
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["workers", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str::<Json>(&stdout)
        .expect("JSON")
        .as_array()
        .expect("an array")
        .clone()
}

/// Polls `archon workers --json` until `done` holds of the list (30 s at most); returns it.
fn listed_until(db: &Db, what: &str, done: impl Fn(&[Json]) -> bool) -> Vec<Json> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let workers = listed(db);
        if done(&workers) {
            return workers;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting: {what}: {workers:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The host name workers register with (the engine reads the same file).
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

#[test]
fn workers_lists_the_live_workers_with_the_steps_they_hold() {
    let Some(db) = db() else { return };
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let Output { code, stdout, .. } = db.archon(&["workers"]);
    assert_eq!(
        (code, stdout),
        (0, format!("no live workers on `{}`\n", db.url()))
    );
    // One worker without labels, then one with `gpu` and `eu` and a global limit: listed oldest first.
    let plain = worker_with(&db, 0, &db.url(), &["--lease", "3s"]);
    listed_until(&db, "the first worker registers", |w| w.len() == 1);
    let gpu = worker_with(
        &db,
        1,
        &db.url(),
        &["--lease", "3s", "--labels", "gpu,eu", "--global-limit", "5"],
    );
    listed_until(&db, "the second worker registers", |w| w.len() == 2);
    // `slow` needs `gpu`: the second worker holds it until `go`.
    std::fs::write(db.path().join("slow.yaml"), SLOW_ON_GPU).expect("write");
    let id = submit(&db, "slow.yaml");
    wait_starts(&db, 1);
    let workers = listed_until(&db, "the second worker holds `slow`", |w| {
        w.len() == 2 && w[1]["steps"] == 1
    });
    let host = host();
    let pids = [plain.child.id(), gpu.child.id()];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    for (worker, pid) in workers.iter().zip(pids) {
        let name = worker["name"].as_str().expect("a name");
        assert!(name.starts_with(&format!("{host}-{pid}-")), "{name}");
        let seen = worker["last_seen_at"].as_u64().expect("last seen");
        let (since, until) = (
            worker["started_at"].as_u64().expect("started"),
            worker["lease_until"].as_u64().expect("lease"),
        );
        assert!(
            started <= since && since <= seen && seen <= now && seen < until,
            "{worker}"
        );
    }
    let shape = |w: &Json| {
        json!({
            "host": w["host"], "pid": w["pid"], "labels": w["labels"], "concurrency": w["concurrency"],
            "global_limit": w["global_limit"], "steps": w["steps"],
        })
    };
    assert_eq!(
        workers.iter().map(shape).collect::<Vec<_>>(),
        [
            json!({ "host": host, "pid": pids[0], "labels": [], "concurrency": 2,
                    "global_limit": null, "steps": 0 }),
            json!({ "host": host, "pid": pids[1], "labels": ["gpu", "eu"], "concurrency": 2,
                    "global_limit": 5, "steps": 1 }),
        ]
    );
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["workers"]);
    assert_eq!(code, 0, "{stderr}");
    // The names (host, process, start, a random part), the host, the processes and the times change
    // from run to run; the columns are padded to the widest name.
    insta::with_settings!({ filters => vec![
        (r"\S+-\d+-\d{13}-[0-9a-f]{8}", "[NAME]"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "[TIME]"),
        (format!(r"\b{}\b", host.replace('.', r"\.")).as_str(), "[HOST]"),
        (format!(r"\b{}\b", pids[0]).as_str(), "[PID 0]"),
        (format!(r"\b{}\b", pids[1]).as_str(), "[PID 1]"),
        (r" {2,}", "  "),
    ]}, {
        insta::assert_snapshot!("workers", stdout);
    });
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    listed_until(&db, "no step is held once the run ended", |w| {
        w.len() == 2 && w.iter().all(|w| w["steps"] == 0)
    });
    // A worker that is frozen stops renewing its registration: once it lapses, it is not listed.
    signal(&plain, rustix::process::Signal::STOP);
    let left = listed_until(&db, "the frozen worker lapses", |w| w.len() == 1);
    assert_eq!(left[0]["pid"], pids[1]);
    signal(&plain, rustix::process::Signal::CONT);
    listed_until(&db, "the woken worker is back", |w| w.len() == 2);
    // Stopped workers are gone at once.
    stop(vec![plain, gpu]);
    let Output { code, stdout, .. } = db.archon(&["workers"]);
    assert_eq!(
        (code, stdout),
        (0, format!("no live workers on `{}`\n", db.url()))
    );
    let Output { code, stdout, .. } = db.archon(&["workers", "--json"]);
    assert_eq!((code, stdout.as_str()), (0, "[]\n"));
}

#[test]
fn workers_need_a_postgresql_store() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    for args in [&["workers"][..], &["workers", "--json"]] {
        let Output {
            code,
            stdout,
            stderr,
        } = crate::support::archon_with(dir.path(), args, &[("ARCHON_STATE_DIR", ".archon")]);
        assert_eq!(
            (code, stdout.as_str(), stderr.as_str()),
            (
                1,
                "",
                "error: workers exist only on a PostgreSQL run store\n  hint: pass `--store postgres://...` (or set `ARCHON_STORE`)\n"
            )
        );
    }
    // Nothing was created.
    assert!(!dir.path().join(".archon").exists());
}

#[test]
fn a_worker_reuses_the_cached_results_of_its_step_and_of_the_sub_workflows_it_calls() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("sub.yaml"),
        r#"name: sub
steps:
  - { id: x, tool: exec, cache: { key: x }, with: { argv: [sh, -c, "echo x >> ledger; echo from-x"] } }
outputs:
  said: "{{ steps.x.output }}"
"#,
    )
    .expect("write");
    std::fs::write(
        db.path().join("cached.yaml"),
        r#"name: cached
steps:
  - { id: a, tool: exec, cache: { key: a }, with: { argv: [sh, -c, "echo a >> ledger; echo from-a"] } }
  - { id: b, tool: exec, with: { argv: [sh, -c, "echo b >> ledger"] } }
  - { id: c, tool: exec, cache: { key: c }, with: { argv: [sh, -c, "echo c >> ledger"] } }
  - { id: s, workflow: sub.yaml }
outputs:
  a: "{{ steps.a.output }}"
  x: "{{ steps.s.output.said }}"
"#,
    )
    .expect("write");
    let workers = vec![worker(&db, 0, "10s")];
    let first = submit(&db, "cached.yaml");
    assert_eq!(ended(&db, &first)["status"], "succeeded");
    let second = submit(&db, "cached.yaml");
    let run = ended(&db, &second);
    stop(workers);
    assert_eq!(run["status"], "succeeded", "{run}");
    // The cached steps ran once, in the first run; the step without `cache` ran in both.
    assert_eq!(ledger(&db), sorted(&["a", "b", "b", "c", "x"]));
    assert_eq!(
        run["outputs"],
        json!({ "a": "from-a", "x": "from-x" }),
        "{run}"
    );
    let from = |result: &Json| result["cached"]["run"].clone();
    let results = &run["results"];
    assert_eq!(
        [
            from(&results["a"]),
            from(&results["b"]),
            from(&results["c"]),
            from(&results["s"]["steps"]["x"])
        ],
        [json!(first), Json::Null, json!(first), json!(first)],
        "{run}"
    );
}
