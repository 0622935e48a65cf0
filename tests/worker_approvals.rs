//! Approvals on runs submitted to workers, on the real PostgreSQL with real worker processes: a step that
//! asks rests `waiting` in the task table, the run rests `waiting_approval` once nothing else can run
//! (`run --submit --wait` exits 3), and `archon approve` makes the step ready again in the decision's
//! transaction, so the run continues on the workers; a denied call fails the step as in a local run.

use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::postgres::{Db, attempts, db};
use crate::support::Output;
use crate::workers::{ended, stop, submit, worker};

/// `pay` asks before it runs (its command appends to `effects.txt`); `after` needs it.
const PAY: &str = r#"name: pay
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: [sh, -c, "echo paid 42 >> effects.txt"] }
  - id: after
    tool: echo
    with: { done: "{{ steps.pay.exit_code }}" }
"#;

/// Two steps that ask, independent of each other, and one that runs until `go` exists.
const TWO: &str = r#"name: two
steps:
  - id: a1
    tool: exec
    approval: required
    with: { argv: [sh, -c, "echo a1 >> effects.txt"] }
  - id: a2
    tool: exec
    approval: required
    with: { argv: [sh, -c, "echo a2 >> effects.txt"] }
  - id: slow
    tool: exec
    with: { argv: [sh, -c, "while [ ! -f go ]; do sleep 0.02; done; echo slow >> effects.txt"] }
"#;

fn effects(db: &Db) -> String {
    std::fs::read_to_string(db.path().join("effects.txt")).unwrap_or_default()
}

/// Polls the run until `done` holds for it, with a deadline.
fn until(db: &Db, id: &str, what: &str, done: impl Fn(&Json) -> bool) -> Json {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let run = db.show(id);
        if done(&run) {
            return run;
        }
        assert!(Instant::now() < deadline, "run `{id}` never {what}: {run}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn requests(run: &Json) -> usize {
    run["approvals"].as_array().map_or(0, Vec::len)
}

fn submit_and_wait(db: &Db, spec: &str) -> (String, Output) {
    let out = db.archon(&["run", "--submit", "--wait", spec]);
    let id = db.sql("SELECT id FROM runs ORDER BY started_at DESC LIMIT 1")[0].clone();
    (id, out)
}

#[test]
fn an_approved_call_of_a_submitted_run_runs_once_on_a_worker() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("pay.yaml"), PAY).expect("write");
    let workers = vec![worker(&db, 0, "2s")];
    let (
        id,
        Output {
            code,
            stdout,
            stderr,
        },
    ) = submit_and_wait(&db, "pay.yaml");
    assert_eq!(
        code, 3,
        "waiting for approval, as a local run: {stdout}{stderr}"
    );
    assert!(stdout.contains("status    waiting_approval"), "{stdout}");
    assert_eq!(effects(&db), "", "nothing ran before the decision");
    let run = db.show(&id);
    assert_eq!(run["status"], "waiting_approval", "{run}");
    assert_eq!(requests(&run), 1, "{run}");
    // The waiting step left no result to be reused: it asks again until a person decides.
    assert!(run["results"].get("pay").is_none_or(Json::is_null), "{run}");
    assert_eq!(
        db.sql("SELECT step || ' ' || state FROM tasks ORDER BY step"),
        vec!["pay waiting".to_owned()]
    );
    let Output { code, stdout, .. } = db.archon(&["runs"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("waiting_approval"), "{stdout}");

    let Output { code, stdout, .. } = db.archon(&["show", &id]);
    assert_eq!(code, 0);
    let waits = stdout
        .split_once("waiting for approval:\n")
        .expect(&stdout)
        .1;
    assert_eq!(
        waits,
        format!(
            "  pay: `exec` {{\"with\":{{\"argv\":[\"sh\",\"-c\",\"echo paid 42 >> effects.txt\"]}}}}\n  \
             hint: `archon approve {id}` (or `--deny`) decides; then a run submitted to workers goes on by itself, any other with `archon resume {id}`\n"
        )
    );

    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["approve", &id, "--reason", "checked"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout.lines().last(),
        Some(
            format!(
                "  hint: the workers continue the run: `archon show {id}` shows where it stands"
            )
            .as_str()
        )
    );
    let run = ended(&db, &id);
    stop(workers);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        effects(&db),
        "paid 42\n",
        "the approved call ran exactly once"
    );
    let tried = attempts(&run, "pay");
    assert_eq!(
        tried.last().expect("an attempt")["status"],
        "succeeded",
        "{tried:?}"
    );
    assert_eq!(run["approvals"][0]["decision"]["approved"], true);
    assert_eq!(run["approvals"][0]["decision"]["reason"], "checked");
    assert_eq!(run["results"]["after"]["output"]["done"], 0, "{run}");
    assert!(
        db.sql("SELECT step FROM tasks WHERE state <> 'done'")
            .is_empty()
    );
}

#[test]
fn a_denied_call_of_a_submitted_run_fails_its_step_on_a_worker() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("pay.yaml"), PAY).expect("write");
    let workers = vec![worker(&db, 0, "2s")];
    let (id, Output { code, .. }) = submit_and_wait(&db, "pay.yaml");
    assert_eq!(code, 3);
    let Output { code, stderr, .. } =
        db.archon(&["approve", &id, "--deny", "--reason", "not today"]);
    assert_eq!(code, 0, "{stderr}");
    let run = ended(&db, &id);
    stop(workers);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["results"]["pay"]["status"], "failed", "{run}");
    let error = run["results"]["pay"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("not today"), "{error}");
    assert_eq!(effects(&db), "", "a denied call never runs");
    assert!(
        run["results"]
            .get("after")
            .is_none_or(|a| a["status"] != "succeeded"),
        "{run}"
    );
}

#[test]
fn two_asking_steps_of_a_submitted_run_wait_together_and_go_on_when_decided() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("two.yaml"), TWO).expect("write");
    std::fs::write(db.path().join("go"), "").expect("write");
    let workers = vec![worker(&db, 0, "2s"), worker(&db, 1, "2s")];
    let (id, Output { code, stdout, .. }) = submit_and_wait(&db, "two.yaml");
    assert_eq!(code, 3, "{stdout}");
    let run = db.show(&id);
    assert_eq!(run["status"], "waiting_approval");
    assert_eq!(requests(&run), 2, "{run}");
    assert_eq!(effects(&db), "slow\n");
    // One decided: its step goes on, the run waits for the other.
    let Output { code, stderr, .. } = db.archon(&["approve", &id, "--step", "a2"]);
    assert_eq!(code, 0, "{stderr}");
    until(&db, &id, "ran `a2`", |r| {
        r["status"] == "waiting_approval" && r["results"]["a2"]["status"] == "succeeded"
    });
    assert_eq!(effects(&db), "slow\na2\n");
    let Output { code, stderr, .. } = db.archon(&["approve", &id]);
    assert_eq!(code, 0, "{stderr}");
    let run = ended(&db, &id);
    let run = if run["status"] == "waiting_approval" {
        until(&db, &id, "ended", |r| {
            r["status"] != "waiting_approval" && r["status"] != "running"
        })
    } else {
        run
    };
    stop(workers);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(effects(&db), "slow\na2\na1\n");
}

#[test]
fn a_decision_made_while_a_worker_runs_other_steps_lets_the_step_go_on() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("two.yaml"), TWO).expect("write");
    let workers = vec![worker(&db, 0, "2s")];
    let id = submit(&db, "two.yaml");
    // Both calls asked while `slow` still runs: the run goes on, and takes decisions.
    let run = until(&db, &id, "asked twice", |r| requests(r) == 2);
    assert_eq!(run["status"], "running", "{run}");
    let Output { code, stderr, .. } = db.archon(&["approve", &id, "--step", "a1"]);
    assert_eq!(code, 0, "{stderr}");
    until(&db, &id, "ran `a1`", |r| {
        r["results"]["a1"]["status"] == "succeeded"
    });
    let Output { code, stderr, .. } = db.archon(&["approve", &id, "--step", "a2"]);
    assert_eq!(code, 0, "{stderr}");
    until(&db, &id, "ran `a2`", |r| {
        r["results"]["a2"]["status"] == "succeeded"
    });
    assert_eq!(db.show(&id)["status"], "running");
    std::fs::write(db.path().join("go"), "").expect("write");
    let run = ended(&db, &id);
    stop(workers);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(effects(&db), "a1\na2\nslow\n");
}

#[test]
fn resume_hands_a_submitted_run_waiting_for_approval_back_to_the_workers() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("pay.yaml"), PAY).expect("write");
    let workers = vec![worker(&db, 0, "2s")];
    let (id, Output { code, .. }) = submit_and_wait(&db, "pay.yaml");
    assert_eq!(code, 3);
    // Nothing decided: the workers take the step up, it asks again and rests again; nothing runs here.
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["resume", &id]);
    assert_eq!((code, stderr.as_str()), (0, ""));
    assert_eq!(
        stdout,
        format!(
            "run `{id}` goes on on the workers\n  hint: `archon show {id}` shows where it stands\n"
        )
    );
    until(&db, &id, "rested again", |r| {
        r["status"] == "waiting_approval"
            && db.sql("SELECT state FROM tasks") == vec!["waiting".to_owned()]
    });
    assert_eq!(requests(&db.show(&id)), 1, "the same call, asked once");
    let Output { code, .. } = db.archon(&["approve", &id]);
    assert_eq!(code, 0);
    let run = ended(&db, &id);
    stop(workers);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(effects(&db), "paid 42\n");
}
