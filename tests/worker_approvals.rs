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
    let workers = vec![worker(&db, 0, "10s")];
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
    let workers = vec![worker(&db, 0, "10s")];
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
    let workers = vec![worker(&db, 0, "10s"), worker(&db, 1, "10s")];
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
    let workers = vec![worker(&db, 0, "10s")];
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
    let workers = vec![worker(&db, 0, "10s")];
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

/// `pay` asks under a rule with a `timeout` (its `default` deny unless `allow`); `after` needs it.
fn timed(timeout: &str, default: &str) -> String {
    format!(
        r#"name: timed
rules:
  - {{ name: ask-pay, on: before_tool, match: {{ step: pay }}, action: ask, timeout: {timeout}, default: {default} }}
steps:
  - id: pay
    tool: exec
    with: {{ argv: [sh, -c, "echo paid >> effects.txt"] }}
  - id: after
    needs: [pay]
    tool: echo
    with: {{ done: "{{{{ steps.pay.exit_code }}}}" }}
"#
    )
}

/// What a run recorded of how it ended and of its approvals, without what differs from run to run
/// (times, the run's id and the keys made from it, attempts' numbers).
fn settled(run: &Json) -> Json {
    let step = |id: &str| {
        let r = &run["results"][id];
        serde_json::json!({
            "status": r["status"], "error": r["error"], "output": r["output"],
        })
    };
    let approvals: Vec<Json> = run["approvals"]
        .as_array()
        .expect("approvals")
        .iter()
        .map(|a| {
            let mut request = a["request"].clone();
            request.as_object_mut().expect("a request").remove("key");
            serde_json::json!({ "request": request, "decision": a["decision"] })
        })
        .collect();
    serde_json::json!({
        "status": run["status"], "error": run["error"], "outputs": run["outputs"],
        "pay": step("pay"), "after": step("after"), "approvals": approvals,
    })
}

/// The same spec run here, on a terminal nobody answers: its prompt times out and the rule's default
/// decides. What it recorded, and what its command wrote to `effects.txt`.
fn local_timed_out(db: &Db, spec: &str) -> (Json, String) {
    std::fs::remove_file(db.path().join("effects.txt")).ok();
    let url = db.url();
    let terminal = crate::ux::Terminal::spawn(
        db.path(),
        &["run", spec],
        &[("NO_COLOR", "1"), ("ARCHON_STORE", &url)],
    );
    let (_code, text, _) = terminal.finish();
    let id = db.sql("SELECT id FROM runs ORDER BY started_at DESC LIMIT 1")[0].clone();
    assert!(text.contains("approval needed: step `pay`"), "{text}");
    (db.show(&id), effects(db))
}

/// A submitted run whose call asks under a rule with a timeout, and nobody decides: once the timeout
/// passes, a worker's reaper makes the step ready again and the rule's default decides it when it runs,
/// with no `archon resume`; the run ends recording what a local run records when its prompt times out.
fn a_timed_out_request_of_a_submitted_run_is_decided_by_its_default(default: &str) -> (Json, Json) {
    let Some(db) = db() else {
        return (Json::Null, Json::Null);
    };
    // Long enough to see the run rest `waiting_approval` first, short enough for a test.
    std::fs::write(db.path().join("timed.yaml"), timed("2s", default)).expect("write");
    let workers = vec![worker(&db, 0, "10s")];
    let id = submit(&db, "timed.yaml");
    let run = until(&db, &id, "rested waiting for approval", |r| {
        r["status"] == "waiting_approval"
    });
    assert_eq!(requests(&run), 1, "{run}");
    assert!(run["approvals"][0]["decision"].is_null(), "{run}");
    assert_eq!(
        db.sql("SELECT state FROM tasks"),
        vec!["waiting".to_owned()]
    );
    let Output { code, stdout, .. } = db.archon(&["show", &id]);
    assert_eq!(code, 0);
    assert!(stdout.contains("status    waiting_approval"), "{stdout}");
    // When the rule's default decides it, unless someone does first.
    let due = std::time::UNIX_EPOCH
        + Duration::from_millis(
            run["approvals"][0]["requested_at"]
                .as_u64()
                .expect("a time")
                + 2000,
        );
    let due = humantime::format_rfc3339_seconds(due);
    assert_eq!(
        stdout
            .split_once("waiting for approval:\n")
            .expect(&stdout)
            .1,
        format!(
            "  pay: `exec` {{\"argv\":[\"sh\",\"-c\",\"echo paid >> effects.txt\"]}}\n    \
             its rule's `default` (`{default}`) decides it if nobody has by `{due}`\n  \
             hint: `archon approve {id}` (or `--deny`) decides; then a run submitted to workers goes on by itself, any other with `archon resume {id}`\n"
        )
    );
    let Output { code, stdout, .. } = db.archon(&["runs"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("waiting_approval"), "{stdout}");

    // Nobody decides: the run ends by itself.
    let worked = until(&db, &id, "ended", |r| {
        r["status"] != "waiting_approval" && r["status"] != "running"
    });
    stop(workers);
    let worked_effects = effects(&db);
    let Output { code, stdout, .. } = db.archon(&["show", &id]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("waiting for approval"), "{stdout}");
    let Output { code, stdout, .. } = db.archon(&["runs"]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("waiting_approval"), "{stdout}");
    assert!(
        db.sql("SELECT state FROM tasks WHERE state <> 'done'")
            .is_empty()
    );
    // The decision is in the run's trail, as any decision.
    let decided = decided_events(&db, &id);

    let (local, local_effects) = local_timed_out(&db, "timed.yaml");
    assert_eq!(settled(&worked), settled(&local));
    assert_eq!(worked_effects, local_effects);
    let local_id = local["id"].as_str().expect("an id");
    assert_eq!(decided, decided_events(&db, local_id));
    (settled(&worked), Json::from(decided))
}

/// The decisions in a run's trail (`show --events`), without their times.
fn decided_events(db: &Db, id: &str) -> Vec<String> {
    let Output { code, stdout, .. } = db.archon(&["show", id, "--events"]);
    assert_eq!(code, 0);
    stdout
        .lines()
        .filter_map(|l| {
            let (_at, event) = l.trim_start().split_once(' ')?;
            let event = event.trim_start();
            (event.starts_with("approved ") || event.starts_with("denied "))
                .then(|| event.to_owned())
        })
        .collect()
}

#[test]
fn a_submitted_run_applies_a_deny_default_when_its_request_times_out() {
    let (worked, decided) =
        a_timed_out_request_of_a_submitted_run_is_decided_by_its_default("deny");
    if worked.is_null() {
        return;
    }
    assert_eq!(worked["status"], "failed", "{worked}");
    assert_eq!(worked["pay"]["status"], "failed", "{worked}");
    assert_eq!(
        worked["pay"]["error"], "denied by timeout: nobody decided in time",
        "{worked}"
    );
    assert_eq!(
        worked["approvals"][0]["decision"],
        serde_json::json!({ "approved": false, "by": "timeout", "reason": "nobody decided in time" })
    );
    assert_eq!(
        decided,
        serde_json::json!(["denied    pay exec by timeout: nobody decided in time"])
    );
}

#[test]
fn a_submitted_run_applies_an_allow_default_when_its_request_times_out() {
    let (worked, decided) =
        a_timed_out_request_of_a_submitted_run_is_decided_by_its_default("allow");
    if worked.is_null() {
        return;
    }
    assert_eq!(worked["status"], "succeeded", "{worked}");
    assert_eq!(worked["pay"]["status"], "succeeded", "{worked}");
    assert_eq!(worked["after"]["output"]["done"], 0, "{worked}");
    assert_eq!(
        worked["approvals"][0]["decision"],
        serde_json::json!({ "approved": true, "by": "timeout", "reason": "nobody decided in time" })
    );
    assert_eq!(
        decided,
        serde_json::json!(["approved  pay exec by timeout: nobody decided in time"])
    );
}

/// Three steps that ask: `soon` under a 1 s timeout, `later` under an hour's, `never` with none.
const MIXED: &str = r#"name: mixed
rules:
  - { name: soon, on: before_tool, match: { step: soon }, action: ask, timeout: 1s, default: allow }
  - { name: later, on: before_tool, match: { step: later }, action: ask, timeout: 1h, default: allow }
steps:
  - { id: soon, tool: echo, with: { v: 1 } }
  - { id: later, tool: echo, with: { v: 2 } }
  - { id: never, tool: echo, approval: required, with: { v: 3 } }
"#;

/// The reaper makes ready again only a waiting step whose requests are past their timeouts: not one whose
/// request has no timeout, nor one whose timeout has not passed.
#[test]
fn the_reaper_leaves_a_request_without_a_timeout_or_within_it_waiting() {
    use archon_engine::store::RunStore as _;
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("mixed.yaml"), MIXED).expect("write");
    let workers = vec![worker(&db, 0, "10s")];
    let id = submit(&db, "mixed.yaml");
    // The worker's reaper took `soon` up again once its second passed; the others still wait.
    let run = until(&db, &id, "ran `soon`", |r| {
        r["results"]["soon"]["status"] == "succeeded" && r["status"] == "waiting_approval"
    });
    stop(workers);
    assert_eq!(requests(&run), 3, "{run}");
    let states = "SELECT step || ' ' || state FROM tasks ORDER BY step";
    let waiting = vec![
        "later waiting".to_owned(),
        "never waiting".to_owned(),
        "soon done".to_owned(),
    ];
    assert_eq!(db.sql(states), waiting);
    // The reaper, called here, leaves them be.
    let store =
        archon_engine::store::postgres::PostgresStore::open(&db.url(), None).expect("store");
    let tasks = store.tasks().expect("tasks");
    assert_eq!(tasks.reap().expect("reaped"), 0);
    assert_eq!(db.sql(states), waiting);
    assert_eq!(db.show(&id)["status"], "waiting_approval");
    // An hour later (its request made an hour earlier), `later` is ready again; `never` still waits.
    db.sql("UPDATE approvals SET requested_at = requested_at - 3600000 WHERE step = 'later'");
    assert_eq!(tasks.reap().expect("reaped"), 1);
    assert_eq!(
        db.sql(states),
        vec![
            "later ready".to_owned(),
            "never waiting".to_owned(),
            "soon done".to_owned()
        ]
    );
    assert_eq!(db.show(&id)["status"], "running");
}
