//! Routing and limits of runs submitted to workers, on the real PostgreSQL through the real binary: a step
//! with `runs_on` goes only to a worker with its labels, and waits visibly (`show`, `show --json`) while
//! no live worker has them; a local run refuses steps that need labels it lacks; claims are fair across
//! runs; a run's `max_parallel`, a workflow's `concurrency` and `--global-limit` hold across several
//! workers, measured by a ledger each step appends its start and end to. Each test in a schema of its own.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::postgres::{Db, db};
use crate::support::{Output, archon_with};

/// A worker process with these extra arguments; its standard error goes to `worker-N.err`.
struct Worker {
    child: Child,
    err: std::path::PathBuf,
}

impl Worker {
    /// A worker with a lease long enough that a loaded machine does not lose its steps.
    fn start(db: &Db, n: usize, args: &[&str]) -> Worker {
        Worker::leased(db, n, "3s", args)
    }

    fn leased(db: &Db, n: usize, lease: &str, args: &[&str]) -> Worker {
        let err = db.path().join(format!("worker-{n}.err"));
        let child = Command::new(env!("CARGO_BIN_EXE_archon"))
            .args(["worker", "--lease", lease])
            .args(args)
            .current_dir(db.path())
            .env("NO_COLOR", "1")
            .env("ARCHON_STORE", db.url())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).expect("err file"))
            .spawn()
            .expect("archon worker starts");
        let worker = Worker { child, err };
        until("the worker starts", || {
            worker.said().contains("worker: taking steps")
        });
        worker
    }

    fn said(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, signal).expect("signalled");
    }

    /// Stops it with SIGTERM; it finishes what it runs and exits 0. Returns what it said.
    fn stop(mut self) -> String {
        self.signal(rustix::process::Signal::TERM);
        let status = self.child.wait().expect("exits");
        assert_eq!(status.code(), Some(0), "{}", self.said());
        self.said()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `condition` every 20 ms until it holds, failing after 60 s.
fn until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn submit(db: &Db, args: &[&str]) -> String {
    let mut all = vec!["run", "--submit"];
    all.extend_from_slice(args);
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&all);
    assert_eq!(code, 0, "{stderr}");
    stdout.trim().to_owned()
}

fn ended(db: &Db, id: &str) -> Json {
    let mut run = Json::Null;
    until(&format!("run `{id}` ends"), || {
        run = db.show(id);
        run["status"] != "running"
    });
    run
}

/// The steps of `show` as text: the lines of its step table.
fn step_lines(db: &Db, id: &str) -> Vec<String> {
    let Output { code, stdout, .. } = db.archon(&["show", id]);
    assert_eq!(code, 0);
    stdout
        .lines()
        .skip_while(|l| !l.starts_with("STEP"))
        .map(|l| l.trim_end().to_owned())
        .collect()
}

const ROUTED: &str = r#"name: routed
tools:
  train:
    runs_on: [gpu]
    command: [sh, -c, "echo trained"]
steps:
  - { id: prepare, tool: exec, with: { argv: [echo, prepared] } }
  - { id: fit, needs: [prepare], tool: train }
  - { id: report, needs: [fit], tool: exec, runs_on: [eu], with: { argv: [echo, reported] } }
"#;

#[test]
fn a_step_no_live_worker_can_take_waits_with_the_reason_until_one_can() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("routed.yaml"), ROUTED).expect("write");
    let id = submit(&db, &["routed.yaml"]);
    assert_eq!(
        db.show(&id)["waiting"],
        json!([{ "step": "prepare", "reason": "no live worker" }])
    );
    // A worker without labels takes the step that needs none, and only that one.
    let plain = Worker::start(&db, 0, &[]);
    until("`prepare` ends", || {
        db.show(&id)["results"]["prepare"]["status"] == "succeeded"
    });
    assert_eq!(
        db.show(&id)["waiting"],
        json!([{ "step": "fit", "reason": "no live worker has label `gpu`" }])
    );
    assert_eq!(
        step_lines(&db, &id),
        [
            "STEP     STATUS                                   ATTEMPTS  ERROR",
            "prepare  succeeded                                1",
            "fit      waiting: no live worker has label `gpu`  0",
        ]
    );
    // The tool's label and the step's add up: `report` needs `eu` too, a `gpu` worker alone is not enough.
    let gpu = Worker::start(&db, 1, &["--labels", "gpu"]);
    until("`fit` ends", || {
        db.show(&id)["results"]["fit"]["status"] == "succeeded"
    });
    assert_eq!(
        db.show(&id)["waiting"],
        json!([{ "step": "report", "reason": "no live worker has label `eu`" }])
    );
    let both = Worker::start(&db, 2, &["--labels", "eu,gpu"]);
    let run = ended(&db, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(run.get("waiting").is_none(), "{run}");
    for (worker, said) in [
        (plain, "after 1 step (0 runs ended here"),
        (gpu, "after 1 step (0 runs ended here"),
        (both, "after 1 step (1 run ended here"),
    ] {
        let text = worker.stop();
        assert!(text.contains(said), "{text}");
    }
    // Stopped workers deregistered: nobody is left to take a step.
    let again = submit(&db, &["routed.yaml"]);
    assert_eq!(
        db.show(&again)["waiting"],
        json!([{ "step": "prepare", "reason": "no live worker" }])
    );
}

#[test]
fn a_worker_whose_registration_lapsed_counts_as_gone_until_it_is_back() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("gpu.yaml"),
        "name: gpu\nsteps:\n  - { id: fit, tool: exec, idempotent: true, runs_on: [gpu], with: { argv: [echo, fit] } }\n",
    )
    .expect("write");
    let gpu = Worker::leased(&db, 0, "1s", &["--labels", "gpu"]);
    // Frozen, it renews nothing: once its registration lapses (1 s), no live worker has `gpu`.
    gpu.signal(rustix::process::Signal::STOP);
    let id = submit(&db, &["gpu.yaml"]);
    until("the frozen worker counts as gone", || {
        db.show(&id)["waiting"]
            == json!([{ "step": "fit", "reason": "no live worker has label `gpu`" }])
    });
    // Woken, it registers again and takes the step.
    gpu.signal(rustix::process::Signal::CONT);
    let run = ended(&db, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    gpu.stop();
}

#[test]
fn a_local_run_refuses_steps_that_need_labels_it_lacks_before_any_starts() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("routed.yaml"), ROUTED).expect("write");
    let state = [("ARCHON_STATE_DIR", ".archon")];
    let Output { code, stderr, .. } = archon_with(dir.path(), &["run", "routed.yaml"], &state);
    assert_eq!(
        (code, stderr.as_str()),
        (
            2,
            "error: step `fit` needs a label this process does not have: `gpu` (and 1 more step)\n  hint: pass `--labels eu,gpu` to run it here, or submit the run to workers that have them (`archon run --submit`)\n"
        )
    );
    let Output { code, stderr, .. } = archon_with(
        dir.path(),
        &["run", "routed.yaml", "--labels", "gpu"],
        &state,
    );
    assert_eq!(
        (code, stderr.as_str()),
        (
            2,
            "error: step `report` needs a label this process does not have: `eu`\n  hint: pass `--labels eu` to run it here, or submit the run to workers that have them (`archon run --submit`)\n"
        )
    );
    let Output { code, stdout, .. } = archon_with(dir.path(), &["runs", "--json"], &state);
    assert_eq!(code, 0);
    // Both refused runs are recorded as failed, no step of them started.
    let runs: Json = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        runs.as_array()
            .expect("list")
            .iter()
            .map(|r| r["status"].clone())
            .collect::<Vec<_>>(),
        [json!("failed"), json!("failed")]
    );
    let Output { code, stderr, .. } = archon_with(
        dir.path(),
        &["run", "routed.yaml", "--labels", "eu,gpu", "--json"],
        &state,
    );
    assert_eq!(code, 0, "{stderr}");
    let Output { code, stderr, .. } = archon_with(
        dir.path(),
        &["run", "routed.yaml", "--labels", "GPU"],
        &state,
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains("`GPU` is not a valid label: use lowercase letters, digits, `_` and `-`"),
        "{stderr}"
    );
}

#[test]
fn a_sub_workflow_step_needs_the_labels_of_the_steps_it_runs() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("inner.yaml"),
        "name: inner\nsteps:\n  - { id: fit, tool: exec, runs_on: [gpu], with: { argv: [echo, fit] } }\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("outer.yaml"),
        "name: outer\nsteps:\n  - { id: call, workflow: inner.yaml }\n",
    )
    .expect("write");
    let state = [("ARCHON_STATE_DIR", ".archon")];
    let Output { code, stderr, .. } = archon_with(dir.path(), &["run", "outer.yaml"], &state);
    assert_eq!(
        (code, stderr.as_str()),
        (
            2,
            "error: step `call` needs a label this process does not have: `gpu`\n  hint: pass `--labels gpu` to run it here, or submit the run to workers that have them (`archon run --submit`)\n"
        )
    );
    let Output { code, stderr, .. } = archon_with(
        dir.path(),
        &["run", "outer.yaml", "--labels", "gpu", "--json"],
        &state,
    );
    assert_eq!(code, 0, "{stderr}");
}

/// `n` independent steps; each appends `+ NANOS` when it starts and `- NANOS` when it ends to `ledger`.
fn ledgered(name: &str, n: usize, extra: &str) -> String {
    let mut spec = format!("name: {name}\n{extra}steps:\n");
    for i in 0..n {
        spec.push_str(&format!(
            "  - {{ id: s{i}, tool: exec, with: {{ argv: [sh, -c, \"echo + $(date +%s%N) >> ledger; sleep 0.3; echo - $(date +%s%N) >> ledger\"] }} }}\n"
        ));
    }
    spec
}

/// The most steps the ledger shows running at once.
fn most_at_once(db: &Db) -> usize {
    let text = std::fs::read_to_string(db.path().join("ledger")).expect("ledger");
    let mut marks: Vec<(u128, i32)> = text
        .lines()
        .map(|line| {
            let (sign, at) = line.split_once(' ').expect("a mark");
            let at: u128 = at.parse().expect("nanoseconds");
            (at, if sign == "+" { 1 } else { -1 })
        })
        .collect();
    // An end before a start at the same instant.
    marks.sort();
    let (mut now, mut most) = (0, 0);
    for (_, delta) in marks {
        now += delta;
        most = most.max(now);
    }
    usize::try_from(most).expect("positive")
}

fn workers(db: &Db, n: usize, args: &[&str]) -> Vec<Worker> {
    (0..n).map(|i| Worker::start(db, i, args)).collect()
}

#[test]
fn max_parallel_holds_across_workers() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("wide.yaml"), ledgered("wide", 10, "")).expect("write");
    let id = submit(&db, &["--max-parallel", "2", "wide.yaml"]);
    let running = workers(&db, 3, &["--concurrency", "2"]);
    let run = ended(&db, &id);
    running.into_iter().for_each(|w| {
        w.stop();
    });
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(most_at_once(&db), 2);
}

#[test]
fn a_workflow_concurrency_holds_across_its_runs_and_workers() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("wide.yaml"),
        ledgered("wide", 8, "concurrency: 3\n"),
    )
    .expect("write");
    let ids = [submit(&db, &["wide.yaml"]), submit(&db, &["wide.yaml"])];
    let running = workers(&db, 3, &["--concurrency", "3"]);
    until("a step waits for the workflow's limit", || {
        db.show(&ids[1])["waiting"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w["reason"] == "workflow `wide` has `3` steps running, its `concurrency`")
        }) || db.show(&ids[0])["waiting"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w["reason"] == "workflow `wide` has `3` steps running, its `concurrency`")
        })
    });
    for id in &ids {
        assert_eq!(ended(&db, id)["status"], "succeeded");
    }
    running.into_iter().for_each(|w| {
        w.stop();
    });
    assert_eq!(most_at_once(&db), 3);
}

#[test]
fn a_global_limit_holds_across_workflows_and_workers() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("one.yaml"), ledgered("one", 6, "")).expect("write");
    std::fs::write(db.path().join("two.yaml"), ledgered("two", 6, "")).expect("write");
    let ids = [submit(&db, &["one.yaml"]), submit(&db, &["two.yaml"])];
    let running = workers(&db, 3, &["--concurrency", "3", "--global-limit", "2"]);
    for id in &ids {
        assert_eq!(ended(&db, id)["status"], "succeeded");
    }
    running.into_iter().for_each(|w| {
        w.stop();
    });
    assert_eq!(most_at_once(&db), 2);
}

#[test]
fn a_run_with_thousands_of_ready_steps_does_not_starve_one_submitted_after_it() {
    let Some(db) = db() else { return };
    let mut big = String::from("name: big\ndefaults: { max_parallel: 10000 }\nsteps:\n");
    for i in 0..3000 {
        big.push_str(&format!(
            "  - {{ id: s{i}, tool: exec, with: {{ argv: [\"true\"] }} }}\n"
        ));
    }
    std::fs::write(db.path().join("big.yaml"), big).expect("write");
    std::fs::write(
        db.path().join("small.yaml"),
        "name: small\nsteps:\n  - { id: only, tool: exec, with: { argv: [\"true\"] } }\n",
    )
    .expect("write");
    let a = submit(&db, &["big.yaml"]);
    let running = workers(&db, 2, &["--concurrency", "4"]);
    // A is under way when B comes.
    until("run A has steps done", || {
        db.show(&a)["results"]
            .as_object()
            .is_some_and(|r| !r.is_empty())
    });
    let b = submit(&db, &["small.yaml"]);
    let run_b = ended(&db, &b);
    assert_eq!(run_b["status"], "succeeded", "{run_b}");
    let done = db.show(&a)["results"].as_object().map_or(0, |r| r.len());
    assert!(
        done < 1500,
        "run A had {done} of 3000 steps done when B ended"
    );
    let Output { code, stderr, .. } = db.archon(&["cancel", &a]);
    assert_eq!(code, 0, "{stderr}");
    running.into_iter().for_each(|w| {
        w.stop();
    });
}

/// `archon serve` over the same store shows a waiting step and why, in its API and on the run's page.
#[tokio::test(flavor = "multi_thread")]
async fn serve_shows_a_step_that_waits_for_a_worker_and_why() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("gpu.yaml"),
        "name: gpu\nsteps:\n  - { id: fit, tool: exec, runs_on: [gpu], with: { argv: [echo, fit] } }\n",
    )
    .expect("write");
    let id = submit(&db, &["gpu.yaml"]);
    let plain = Worker::start(&db, 0, &[]);
    let url = db.url();
    let server = crate::support::serve::serve(db.path(), &[], &[("ARCHON_STORE", &url)]);
    let (status, body) = server.get(&format!("/api/v1/runs/{id}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["waiting"],
        json!([{ "step": "fit", "reason": "no live worker has label `gpu`" }])
    );
    let page = server
        .request(reqwest::Method::GET, &format!("/runs/{id}"))
        .send()
        .await
        .expect("the page")
        .text()
        .await
        .expect("its text");
    assert!(
        page.contains(r#"<span class="note">waiting: no live worker has label `gpu`</span>"#),
        "{page}"
    );
    plain.stop();
}

/// Runs `sql` in the test's schema.
fn sql(db: &Db, sql: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&db.url(), tokio_postgres::NoTls)
            .await
            .expect("connected");
        let connection = tokio::spawn(connection);
        client.batch_execute(sql).await.expect("executed");
        drop(client);
        let _ = connection.await;
    });
}

/// A store of the schema before routing (version 3), with a submitted run waiting in it, migrates when a
/// worker opens it, and the worker runs the run.
#[test]
fn a_store_from_before_routing_migrates_and_its_waiting_run_goes_on() {
    let Some(db) = db() else { return };
    std::fs::write(
        db.path().join("plain.yaml"),
        "name: plain\nsteps:\n  - { id: one, tool: exec, with: { argv: [echo, one] } }\n  - { id: two, needs: [one], tool: exec, with: { argv: [echo, two] } }\n",
    )
    .expect("write");
    let id = submit(&db, &["plain.yaml"]);
    // Back to what version 3 had.
    sql(
        &db,
        "DROP FUNCTION archon_fences_hold; DROP INDEX tasks_claimed_by_run; DROP INDEX tasks_waiting; DROP FUNCTION archon_finish; DROP TABLE memories; DROP FUNCTION archon_claim; DROP TABLE workers; DROP TABLE step_labels; DROP INDEX tasks_ready_by_run; DROP INDEX runs_running;
         ALTER TABLE tasks DROP COLUMN labels; ALTER TABLE runs DROP COLUMN workflow_limit;
         DROP TRIGGER tasks_count_done ON tasks; DROP FUNCTION archon_count_done; DROP TABLE run_progress;
         DROP INDEX cache_by_step; CREATE INDEX cache_by_workflow ON cache (workflow);
         UPDATE archon_schema_version SET version = 3;",
    );
    let worker = Worker::start(&db, 0, &[]);
    let run = ended(&db, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    worker.stop();
}

/// `archon serve --labels`: the runs the server starts have its labels, as `archon run --labels` gives a
/// local run its own; without them, a run whose steps need labels fails before any step starts.
#[tokio::test]
async fn a_served_run_has_the_labels_of_the_server() {
    let dir = tempfile::TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("routed.yaml"), ROUTED).expect("write");
    let mut server = served(dir.path(), &[]);
    let id = start_served(&server).await;
    let run = served_end(&server, &id).await;
    assert_eq!(
        (&run["status"], &run["error"], &run["results"]),
        (
            &json!("failed"),
            &json!("step `fit` needs a label this process does not have: `gpu` (and 1 more step)"),
            &json!({})
        )
    );
    server
        .wait_said(&format!(
            "error: run `{id}`: step `fit` needs a label this process does not have: `gpu` (and 1 more step)"
        ))
        .await;
    server
        .wait_said("  hint: pass `--labels eu,gpu` to run it here, or submit the run to workers that have them (`archon run --submit`)")
        .await;
    assert!(server.stop().success(), "{}", server.said());
    let mut server = served(dir.path(), &["--labels", "gpu,eu"]);
    let id = start_served(&server).await;
    let run = served_end(&server, &id).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        ["prepare", "fit", "report"].map(|step| run["results"][step]["status"].clone()),
        ["succeeded", "succeeded", "succeeded"].map(Json::from)
    );
    assert!(server.stop().success(), "{}", server.said());
}

/// `archon serve . ARGS` in `dir`, its requests sent with an operator's token.
fn served(dir: &std::path::Path, args: &[&str]) -> crate::support::serve::Server {
    const TOKEN: &str = "routing-operator-token";
    let mut server = crate::support::serve::serve(dir, args, &[("ARCHON_SERVE_TOKEN", TOKEN)]);
    server.token = Some(TOKEN.to_owned());
    server
}

/// Starts a run of `routed` on `server`; its id.
async fn start_served(server: &crate::support::serve::Server) -> String {
    let (status, body) = server
        .post("/api/v1/workflows/routed/runs", json!({ "inputs": {} }))
        .await;
    assert_eq!(status, 202, "{body}");
    body["run_id"].as_str().expect("an id").to_owned()
}

/// The run `id` on `server` once it has ended.
async fn served_end(server: &crate::support::serve::Server, id: &str) -> Json {
    server
        .poll(&format!("/api/v1/runs/{id}"), |run| {
            run["status"] == "failed" || run["status"] == "succeeded"
        })
        .await
}
