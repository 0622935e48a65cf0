//! Triggers (issue 19): cron firings driven by a paused clock over a real run store — DST in a non-UTC
//! zone, overlap policies, catch-up after a restart — and webhook deliveries: signatures, bearer tokens,
//! replays, bodies that do not match the input's schema, oversized bodies.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use archon_engine::session::{Firing, FiringFilter, FiringOutcome, Session};
use archon_engine::trigger::{
    Decision, Delivery, Due, MAX_BODY_BYTES, ReceiveError, Received, Scheduler, Timestamp, Webhook,
    sign,
};
use archon_engine::workflow::Workflow;
use serde_json::json;

fn at(text: &str) -> Timestamp {
    text.parse().expect("a timestamp")
}

fn workflow(dir: &Path, text: &str) -> Workflow {
    let path = dir.join("triggered.yaml");
    std::fs::write(&path, text).expect("written");
    let validation = archon_engine::validate::validate_file(&path);
    validation
        .workflow
        .unwrap_or_else(|| panic!("valid: {:?}", validation.diagnostics))
}

/// What a due firing says, compactly: slot, decision, and the run it waits for or cancels.
fn summary(due: &[Due]) -> Vec<String> {
    due.iter()
        .map(|d| {
            let mut line = format!("{} {:?}", d.firing.slot, d.decision);
            if let Some(after) = &d.after {
                line.push_str(&format!(" after {}", run_of(due, after)));
            }
            for cancelled in &d.cancel {
                line.push_str(&format!(" cancels {}", run_of(due, cancelled)));
            }
            line
        })
        .collect()
}

/// A run id as the slot of the firing that made it (ids are random).
fn run_of(due: &[Due], run: &str) -> String {
    due.iter()
        .find(|d| d.firing.run_id.as_deref() == Some(run))
        .map_or_else(|| "an earlier run".to_owned(), |d| d.firing.slot.clone())
}

/// Drives a scheduler minute by minute from `from` to `until` (a paused clock), every run it starts
/// staying active: what fired, in order.
fn drive(
    session: &Session,
    scheduler: &mut Scheduler,
    from: &str,
    until: &str,
    active: &dyn Fn(&str) -> bool,
) -> Vec<Due> {
    let (mut now, until) = (at(from), at(until));
    let mut fired = Vec::new();
    while now <= until {
        fired.extend(
            session
                .due_firings(scheduler, now, active)
                .expect("recorded"),
        );
        now = Timestamp::from_second(now.as_second() + 60).expect("in range");
    }
    fired
}

const PARIS: &str = r#"name: paris
triggers:
  - name: night
    cron: "30 2 * * *"
    timezone: Europe/Paris
steps:
  - id: a
    tool: echo
    with: { m: night }
"#;

#[test]
fn a_paris_schedule_fires_once_a_night_across_both_dst_changes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler.add(&workflow(dir.path(), PARIS)).expect("added");
    let nothing_active = |_: &str| false;
    // Spring forward on 2025-03-30: 02:30 does not exist and fires at 03:00 CEST (01:00Z).
    let spring = drive(
        &session,
        &mut scheduler,
        "2025-03-29T00:00:00Z",
        "2025-03-31T03:00:00Z",
        &nothing_active,
    );
    assert_eq!(
        summary(&spring),
        [
            "2025-03-29T01:30:00Z Start",
            "2025-03-30T01:00:00Z Start",
            "2025-03-31T00:30:00Z Start",
        ]
    );
    // Fall back on 2025-10-26: 02:30 happens twice and fires at the first (00:30Z).
    let mut scheduler = Scheduler::new();
    scheduler.add(&workflow(dir.path(), PARIS)).expect("added");
    let fall = drive(
        &session,
        &mut scheduler,
        "2025-10-25T00:00:00Z",
        "2025-10-27T03:00:00Z",
        &nothing_active,
    );
    assert_eq!(
        summary(&fall),
        [
            "2025-10-25T00:30:00Z Start",
            "2025-10-26T00:30:00Z Start",
            "2025-10-27T01:30:00Z Start",
        ]
    );
    // Every firing is recorded, each with a run and the inputs it starts with.
    let recorded = session
        .firings(&FiringFilter {
            workflow: Some("paris".into()),
            ..FiringFilter::default()
        })
        .expect("listed");
    assert_eq!(recorded.len(), 6);
    assert!(
        recorded
            .iter()
            .all(|f| f.outcome == FiringOutcome::Started && f.run_id.is_some())
    );
    assert_eq!(
        session
            .last_firing("paris", "night")
            .expect("read")
            .map(|f| f.slot),
        Some("2025-10-27T01:30:00Z".to_owned())
    );
}

fn overlapping(policy: &str) -> String {
    format!(
        "name: overlap\ntriggers:\n  - name: every-minute\n    cron: \"* * * * *\"\n    overlap: {policy}\nsteps:\n  - id: a\n    tool: echo\n    with: {{ m: tick }}\n"
    )
}

/// Three minutes of a trigger whose runs never end, then the runs end and one more minute passes.
fn overlap_run(policy: &str) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler
        .add(&workflow(dir.path(), &overlapping(policy)))
        .expect("added");
    let running = |_: &str| true;
    let mut due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T09:00:00Z",
        "2025-06-02T09:02:00Z",
        &running,
    );
    let ended = |_: &str| false;
    due.extend(drive(
        &session,
        &mut scheduler,
        "2025-06-02T09:03:00Z",
        "2025-06-02T09:03:00Z",
        &ended,
    ));
    summary(&due)
}

#[test]
fn overlap_skip_records_a_skipped_firing_while_the_previous_run_is_active() {
    assert_eq!(
        overlap_run("skip"),
        [
            "2025-06-02T09:00:00Z Start",
            "2025-06-02T09:01:00Z Skip",
            "2025-06-02T09:02:00Z Skip",
            "2025-06-02T09:03:00Z Start",
        ]
    );
}

#[test]
fn overlap_queue_chains_each_run_after_the_one_before() {
    assert_eq!(
        overlap_run("queue"),
        [
            "2025-06-02T09:00:00Z Start",
            "2025-06-02T09:01:00Z Queue after 2025-06-02T09:00:00Z",
            "2025-06-02T09:02:00Z Queue after 2025-06-02T09:01:00Z",
            "2025-06-02T09:03:00Z Start",
        ]
    );
}

#[test]
fn overlap_cancel_previous_cancels_the_active_run_and_starts() {
    assert_eq!(
        overlap_run("cancel_previous"),
        [
            "2025-06-02T09:00:00Z Start",
            "2025-06-02T09:01:00Z CancelPrevious cancels 2025-06-02T09:00:00Z",
            "2025-06-02T09:02:00Z CancelPrevious cancels 2025-06-02T09:01:00Z",
            "2025-06-02T09:03:00Z Start",
        ]
    );
}

#[test]
fn a_skipped_firing_says_which_run_was_still_going() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler
        .add(&workflow(dir.path(), &overlapping("skip")))
        .expect("added");
    let due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T09:00:00Z",
        "2025-06-02T09:01:00Z",
        &|_: &str| true,
    );
    let first = due[0].firing.run_id.clone().expect("a run");
    let skipped = &session.firings(&FiringFilter::default()).expect("listed")[0];
    assert_eq!(
        (
            skipped.outcome,
            skipped.run_id.as_deref(),
            skipped.reason.clone()
        ),
        (
            FiringOutcome::Skipped,
            None,
            Some(format!("run `{first}` was still running"))
        )
    );
}

const HOURLY_CATCH_UP: &str = r#"name: hourly
inputs:
  label: { type: string }
triggers:
  - name: hourly
    cron: "0 * * * *"
    catch_up: 3h
    inputs: { label: caught }
steps:
  - id: a
    tool: echo
    with: { m: "{{ inputs.label }}" }
"#;

#[test]
fn after_a_restart_each_missed_slot_within_catch_up_fires_once_and_none_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let spec = workflow(dir.path(), HOURLY_CATCH_UP);
    let idle = |_: &str| false;
    {
        // A server watches the trigger from 08:30 and fires 09:00, then stops at 09:10.
        let session = Session::open(&state).expect("store");
        let mut scheduler = Scheduler::new();
        scheduler.add(&spec).expect("added");
        let fired = drive(
            &session,
            &mut scheduler,
            "2025-06-02T08:30:00Z",
            "2025-06-02T09:10:00Z",
            &idle,
        );
        assert_eq!(summary(&fired), ["2025-06-02T09:00:00Z Start"]);
    }
    // Down until 14:20: 10:00 and 11:00 are older than 3h, 12:00 to 14:00 are within it.
    let session = Session::open(&state).expect("store");
    let mut restarted = Scheduler::new();
    restarted.add(&spec).expect("added");
    let caught = session
        .due_firings(&mut restarted, at("2025-06-02T14:20:00Z"), &idle)
        .expect("recorded");
    assert_eq!(
        summary(&caught),
        [
            "2025-06-02T12:00:00Z Start",
            // Caught up together, they run one after another.
            "2025-06-02T13:00:00Z Queue after 2025-06-02T12:00:00Z",
            "2025-06-02T14:00:00Z Queue after 2025-06-02T13:00:00Z",
        ]
    );
    assert!(caught.iter().all(|d| {
        d.firing.inputs
            == json!({ "label": "caught" })
                .as_object()
                .cloned()
                .unwrap_or_default()
    }));
    // The same scheduler called again, and another restart at the same moment, fire nothing more.
    assert_eq!(
        session
            .due_firings(&mut restarted, at("2025-06-02T14:20:00Z"), &idle)
            .expect("recorded"),
        []
    );
    let mut again = Scheduler::new();
    again.add(&spec).expect("added");
    assert_eq!(
        session
            .due_firings(&mut again, at("2025-06-02T14:21:00Z"), &idle)
            .expect("recorded"),
        []
    );
    // Two servers on one store, both watching from 14:59: at 15:00 the slot goes to one of them.
    let (mut one, mut two) = (Scheduler::new(), Scheduler::new());
    one.add(&spec).expect("added");
    two.add(&spec).expect("added");
    for scheduler in [&mut one, &mut two] {
        assert_eq!(
            session
                .due_firings(scheduler, at("2025-06-02T14:59:00Z"), &idle)
                .expect("recorded"),
            []
        );
    }
    let mut first = session
        .due_firings(&mut one, at("2025-06-02T15:00:00Z"), &idle)
        .expect("recorded");
    first.extend(
        session
            .due_firings(&mut two, at("2025-06-02T15:00:00Z"), &idle)
            .expect("recorded"),
    );
    assert_eq!(summary(&first), ["2025-06-02T15:00:00Z Start"]);
    let slots: Vec<String> = session
        .firings(&FiringFilter::default())
        .expect("listed")
        .into_iter()
        .map(|f| f.slot)
        .collect();
    assert_eq!(
        slots,
        [
            "2025-06-02T15:00:00Z",
            "2025-06-02T14:00:00Z",
            "2025-06-02T13:00:00Z",
            "2025-06-02T12:00:00Z",
            "2025-06-02T09:00:00Z",
        ]
    );
}

#[test]
fn without_catch_up_a_restart_fires_no_missed_slot_but_the_next_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let spec = workflow(
        dir.path(),
        &overlapping("skip").replace("* * * * *", "0 * * * *"),
    );
    let idle = |_: &str| false;
    let session = Session::open(&state).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler.add(&spec).expect("added");
    drive(
        &session,
        &mut scheduler,
        "2025-06-02T08:59:00Z",
        "2025-06-02T09:00:00Z",
        &idle,
    );
    let mut restarted = Scheduler::new();
    restarted.add(&spec).expect("added");
    let fired = drive(
        &session,
        &mut restarted,
        "2025-06-02T12:30:00Z",
        "2025-06-02T13:00:00Z",
        &idle,
    );
    assert_eq!(summary(&fired), ["2025-06-02T13:00:00Z Start"]);
    assert_eq!(
        restarted.next_wake(at("2025-06-02T13:00:00Z")),
        Some(at("2025-06-02T14:00:00Z"))
    );
}

#[test]
fn a_firing_whose_run_was_never_created_is_found_and_started_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let spec = workflow(dir.path(), HOURLY_CATCH_UP);
    let session = Session::open(&state).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler.add(&spec).expect("added");
    let due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T08:59:00Z",
        "2025-06-02T09:00:00Z",
        &|_: &str| false,
    );
    // The server stopped before it created the run: a restart finds the firing, with its inputs.
    let unstarted: Vec<Firing> = session.unstarted_firings().expect("read");
    assert_eq!(unstarted, vec![due[0].firing.clone()]);
    let prepared = session
        .start_firing(
            &unstarted[0],
            spec.clone(),
            dir.path().join("triggered.yaml"),
            dir.path().to_path_buf(),
            None,
        )
        .expect("started");
    assert_eq!(Some(prepared.run_id.clone()), due[0].firing.run_id);
    assert_eq!(prepared.inputs, due[0].firing.inputs);
    assert_eq!(session.unstarted_firings().expect("read"), []);
}

/// A queued firing whose run was never created can be recorded as skipped, durably, so that no start
/// finds it; one whose run exists cannot.
#[test]
fn an_unstarted_firing_recorded_as_skipped_is_no_longer_found_to_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let spec = workflow(dir.path(), HOURLY_CATCH_UP);
    {
        let session = Session::open(&state).expect("store");
        let mut scheduler = Scheduler::new();
        scheduler.add(&spec).expect("added");
        drive(
            &session,
            &mut scheduler,
            "2025-06-02T05:30:00Z",
            "2025-06-02T05:31:00Z",
            &|_: &str| false,
        );
    }
    // A restart catches up three slots: the first starts, the others queue behind it.
    let session = Session::open(&state).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler.add(&spec).expect("added");
    let due = session
        .due_firings(&mut scheduler, at("2025-06-02T08:30:00Z"), &|_| false)
        .expect("due");
    assert_eq!(
        summary(&due),
        [
            "2025-06-02T06:00:00Z Start",
            "2025-06-02T07:00:00Z Queue after 2025-06-02T06:00:00Z",
            "2025-06-02T08:00:00Z Queue after 2025-06-02T07:00:00Z",
        ]
    );
    let runs: Vec<String> = due
        .iter()
        .map(|d| d.firing.run_id.clone().expect("a run"))
        .collect();
    // The first one's run is created; the last one is dropped.
    session
        .start_firing(
            &due[0].firing,
            spec.clone(),
            dir.path().join("triggered.yaml"),
            dir.path().to_path_buf(),
            None,
        )
        .expect("started");
    assert_eq!(
        session.skip_unstarted_firing(&runs[0], "replaced"),
        Ok(false)
    );
    assert_eq!(
        session.skip_unstarted_firing(&runs[2], "replaced"),
        Ok(true)
    );
    assert_eq!(
        session.skip_unstarted_firing(&runs[2], "replaced"),
        Ok(false)
    );
    assert_eq!(
        session.skip_unstarted_firing("r-none", "replaced"),
        Ok(false)
    );
    drop(session);

    let session = Session::open(&state).expect("store");
    let unstarted: Vec<String> = session
        .unstarted_firings()
        .expect("read")
        .into_iter()
        .map(|f| f.slot)
        .collect();
    assert_eq!(unstarted, ["2025-06-02T07:00:00Z"]);
    let listed: Vec<(String, FiringOutcome, Option<String>, Option<String>)> = session
        .firings(&FiringFilter::default())
        .expect("read")
        .into_iter()
        .map(|f| (f.slot, f.outcome, f.run_id, f.reason))
        .collect();
    assert_eq!(
        listed,
        [
            (
                "2025-06-02T08:00:00Z".to_owned(),
                FiringOutcome::Skipped,
                None,
                Some("replaced".to_owned())
            ),
            (
                "2025-06-02T07:00:00Z".to_owned(),
                FiringOutcome::Queued,
                Some(runs[1].clone()),
                None
            ),
            (
                "2025-06-02T06:00:00Z".to_owned(),
                FiringOutcome::Started,
                Some(runs[0].clone()),
                None
            ),
        ]
    );
}

/// A run the scheduler is told to follow counts for the next firing's overlap decision, as a run it
/// started itself would, until it ends.
#[test]
fn a_followed_run_counts_as_the_previous_run_until_it_ends() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = workflow(dir.path(), HOURLY_CATCH_UP);
    let session = Session::open(&dir.path().join("state")).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler.add(&spec).expect("added");
    scheduler.follow("hourly", "hourly", "r-taken-up");
    scheduler.follow("hourly", "nope", "r-other");
    let going = Mutex::new(HashSet::from(["r-taken-up".to_owned()]));
    let active = |run: &str| going.lock().expect("lock").contains(run);
    let due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T08:59:00Z",
        "2025-06-02T09:00:00Z",
        &active,
    );
    assert_eq!(summary(&due), ["2025-06-02T09:00:00Z Skip"]);
    assert_eq!(
        due[0].firing.reason.as_deref(),
        Some("run `r-taken-up` was still running")
    );
    going.lock().expect("lock").clear();
    let due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T09:59:00Z",
        "2025-06-02T10:00:00Z",
        &active,
    );
    assert_eq!(summary(&due), ["2025-06-02T10:00:00Z Start"]);
}

#[test]
fn pruning_a_run_forgets_its_firing_but_not_the_slot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    let spec = workflow(dir.path(), HOURLY_CATCH_UP);
    let session = Session::open(&state).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler.add(&spec).expect("added");
    let due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T08:59:00Z",
        "2025-06-02T09:00:00Z",
        &|_: &str| false,
    );
    let prepared = session
        .start_firing(
            &due[0].firing,
            spec.clone(),
            dir.path().join("triggered.yaml"),
            dir.path().to_path_buf(),
            None,
        )
        .expect("started");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = runtime
        .block_on(session.execute(prepared, Default::default()))
        .expect("ran");
    assert_eq!(
        outcome.report.status,
        archon_engine::run::RunStatus::Succeeded
    );
    let pruned = session.prune(u64::MAX, false).expect("pruned");
    assert_eq!(pruned.runs.len(), 1);
    assert_eq!(
        session.firings(&FiringFilter::default()).expect("listed"),
        []
    );
    assert_eq!(session.unstarted_firings().expect("read"), []);
    // A restart within the catch-up window does not fire 09:00 again: the store keeps the last slot.
    let mut restarted = Scheduler::new();
    restarted.add(&spec).expect("added");
    let caught = session
        .due_firings(&mut restarted, at("2025-06-02T10:30:00Z"), &|_: &str| false)
        .expect("recorded");
    assert_eq!(summary(&caught), ["2025-06-02T10:00:00Z Start"]);
}

const HOOKED: &str = r#"name: hooked
inputs:
  payload:
    type: object
    required: [action]
    properties: { action: { type: string } }
  env: { type: string, default: staging }
secrets: [HOOK_SECRET]
triggers:
  - name: github
    webhook: { secret: HOOK_SECRET, input: payload }
    inputs: { env: production }
steps:
  - id: a
    tool: echo
    with: { action: "{{ inputs.payload.action }}" }
"#;

const SECRET: &str = "It's a Secret to Everybody";

fn hook(dir: &Path, text: &str, env: &[(&str, &str)]) -> Webhook {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Webhook::of(&workflow(dir, text), &env)
        .expect("secrets read")
        .expect("a webhook")
}

fn delivery<'a>(body: &'a [u8], signature: Option<&'a str>, id: Option<&'a str>) -> Delivery<'a> {
    Delivery {
        body,
        signature,
        authorization: None,
        id,
    }
}

#[test]
fn a_signed_delivery_fires_once_and_its_replay_is_ignored() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let hook = hook(dir.path(), HOOKED, &[("HOOK_SECRET", SECRET)]);
    let body = br#"{"action":"opened","number":7}"#;
    let signature = sign(SECRET.as_bytes(), body);
    // GitHub's headers, as GitHub sends them.
    let headers: BTreeMap<&str, &str> = [
        ("x-hub-signature-256", signature.as_str()),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ]
    .into();
    let github = Delivery::from_headers(body, |name| headers.get(name).copied());
    let now = at("2025-06-02T09:00:00Z");
    let Received::Fired(firing) = session
        .receive_delivery(&hook, &github, now)
        .expect("received")
    else {
        panic!("a new delivery fires");
    };
    assert_eq!(
        (
            firing.trigger.as_str(),
            firing.slot.as_str(),
            firing.outcome,
            &firing.inputs
        ),
        (
            "github",
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            FiringOutcome::Started,
            json!({ "env": "production", "payload": { "action": "opened", "number": 7 } })
                .as_object()
                .expect("object")
        )
    );
    // The same delivery again (a redelivery, or a replay by someone who saw it): nothing fires.
    assert_eq!(
        session
            .receive_delivery(&hook, &github, now)
            .expect("received"),
        Received::Replayed {
            delivery: "72d3162e-cc78-11e3-81ab-4c9367dc0958".into()
        }
    );
    assert_eq!(
        session
            .firings(&FiringFilter::default())
            .expect("listed")
            .len(),
        1
    );
    // Archon's own headers work the same.
    let own = delivery(body, Some(&signature), Some("delivery-2"));
    assert!(matches!(
        session
            .receive_delivery(&hook, &own, now)
            .expect("received"),
        Received::Fired(_)
    ));
}

/// A refusal, and whether it left a record.
fn refused(session: &Session, hook: &Webhook, d: &Delivery<'_>) -> (u16, String, usize) {
    let error = match session.receive_delivery(hook, d, at("2025-06-02T09:00:00Z")) {
        Err(ReceiveError::Refused(e)) => e,
        other => panic!("refused, got {other:?}"),
    };
    let records = session
        .firings(&FiringFilter::default())
        .expect("listed")
        .len();
    (error.status(), error.to_string(), records)
}

#[test]
fn unsigned_badly_signed_and_oversized_deliveries_are_refused_and_not_recorded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let hook = hook(dir.path(), HOOKED, &[("HOOK_SECRET", SECRET)]);
    let body = br#"{"action":"opened"}"#;
    assert_eq!(
        refused(&session, &hook, &delivery(body, None, Some("d1"))),
        (
            401,
            "the delivery is not signed: send `X-Archon-Signature: sha256=<hex>` (or `X-Hub-Signature-256`)".into(),
            0
        )
    );
    let wrong_key = sign(b"not the secret", body);
    assert_eq!(
        refused(
            &session,
            &hook,
            &delivery(body, Some(&wrong_key), Some("d1"))
        ),
        (401, "the signature does not match the body".into(), 0)
    );
    // A signature of another body, and one that is not hex.
    let other_body = sign(SECRET.as_bytes(), br#"{"action":"closed"}"#);
    assert_eq!(
        refused(
            &session,
            &hook,
            &delivery(body, Some(&other_body), Some("d1"))
        )
        .0,
        401
    );
    assert_eq!(
        refused(
            &session,
            &hook,
            &delivery(body, Some("sha256=zz"), Some("d1"))
        )
        .0,
        401
    );
    // An attacker's refused delivery does not take the id: the real one still fires.
    let good = sign(SECRET.as_bytes(), body);
    assert!(matches!(
        session
            .receive_delivery(
                &hook,
                &delivery(body, Some(&good), Some("d1")),
                at("2025-06-02T09:00:00Z")
            )
            .expect("received"),
        Received::Fired(_)
    ));
    let large = vec![b' '; MAX_BODY_BYTES + 1];
    let signed_large = sign(SECRET.as_bytes(), &large);
    assert_eq!(
        refused(
            &session,
            &hook,
            &delivery(&large, Some(&signed_large), Some("d2"))
        ),
        (413, "the body is larger than 1048576 bytes".into(), 1)
    );
    assert_eq!(
        refused(&session, &hook, &delivery(body, Some(&good), None)),
        (
            400,
            "the delivery has no id: send `X-Archon-Delivery` (or `X-GitHub-Delivery`)".into(),
            1
        )
    );
    assert_eq!(
        refused(&session, &hook, &delivery(body, Some(&good), Some("a b"))).0,
        400
    );
}

#[test]
fn a_signed_body_that_does_not_match_the_input_is_refused_and_recorded_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let hook = hook(dir.path(), HOOKED, &[("HOOK_SECRET", SECRET)]);
    let body = br#"{"number":7}"#;
    let signature = sign(SECRET.as_bytes(), body);
    let d = delivery(body, Some(&signature), Some("d-invalid"));
    assert_eq!(
        refused(&session, &hook, &d),
        (
            422,
            "the body does not match input `payload`: \"action\" is a required property".into(),
            1
        )
    );
    let recorded = &session.firings(&FiringFilter::default()).expect("listed")[0];
    assert_eq!(
        (
            recorded.outcome,
            recorded.run_id.as_deref(),
            recorded.slot.as_str()
        ),
        (FiringOutcome::Refused, None, "d-invalid")
    );
    // Its replay is a replay, not another refusal.
    assert_eq!(
        session
            .receive_delivery(&hook, &d, at("2025-06-02T09:01:00Z"))
            .expect("received"),
        Received::Replayed {
            delivery: "d-invalid".into()
        }
    );
    let not_json = b"action=opened";
    let signature = sign(SECRET.as_bytes(), not_json);
    assert_eq!(
        refused(
            &session,
            &hook,
            &delivery(not_json, Some(&signature), Some("d-text"))
        )
        .0,
        422
    );
}

const TOKENED: &str = r#"name: tokened
secrets: [HOOK_TOKEN]
triggers:
  - webhook: { token: HOOK_TOKEN }
steps:
  - id: a
    tool: echo
    with: { m: hi }
"#;

#[test]
fn a_bearer_token_is_checked_and_the_body_is_not_read_without_an_input() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    // The token comes from `.env` beside the spec when the environment has none.
    std::fs::write(dir.path().join(".env"), "HOOK_TOKEN=s3cret-token\n").expect("written");
    let hook = hook(dir.path(), TOKENED, &[]);
    let mut d = delivery(b"not even json", None, Some("t1"));
    assert_eq!(
        refused(&session, &hook, &d),
        (
            401,
            "the delivery has no bearer token: send `Authorization: Bearer <token>`".into(),
            0
        )
    );
    d.authorization = Some("Bearer s3cret-tokeN");
    assert_eq!(
        refused(&session, &hook, &d),
        (401, "the bearer token is not the webhook's".into(), 0)
    );
    d.authorization = Some("bearer s3cret-token");
    let Received::Fired(firing) = session
        .receive_delivery(&hook, &d, at("2025-06-02T09:00:00Z"))
        .expect("received")
    else {
        panic!("fires");
    };
    assert_eq!(
        (firing.trigger.as_str(), firing.inputs.len()),
        ("webhook", 0)
    );
}

#[test]
fn a_webhook_whose_secret_has_no_value_says_which() {
    let dir = tempfile::tempdir().expect("temp dir");
    let error =
        Webhook::of(&workflow(dir.path(), TOKENED), &BTreeMap::new()).expect_err("no value");
    assert_eq!(
        error.to_string(),
        format!(
            "the webhook of workflow `tokened`: secret `HOOK_TOKEN` is not set: export it as an environment variable or add it to `{}`",
            dir.path().join(".env").display()
        )
    );
}

#[test]
fn deliveries_from_many_threads_each_fire_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let hook = hook(dir.path(), HOOKED, &[("HOOK_SECRET", SECRET)]);
    let fired = Mutex::new(HashSet::new());
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (session, hook, fired) = (&session, &hook, &fired);
            scope.spawn(move || {
                for n in 0..25 {
                    // Every thread delivers the same 25 ids (each delivery sent four times).
                    let body = format!(r#"{{"action":"a{n}"}}"#);
                    let signature = sign(SECRET.as_bytes(), body.as_bytes());
                    let id = format!("d{n}");
                    let d = delivery(body.as_bytes(), Some(&signature), Some(&id));
                    if let Received::Fired(f) = session
                        .receive_delivery(hook, &d, at("2025-06-02T09:00:00Z"))
                        .expect("received")
                    {
                        let fresh = fired.lock().expect("lock").insert(f.slot.clone());
                        assert!(fresh, "delivery {} fired twice (thread {thread})", f.slot);
                    }
                }
            });
        }
    });
    assert_eq!(fired.lock().expect("lock").len(), 25);
    let runs: HashSet<Option<String>> = session
        .firings(&FiringFilter::default())
        .expect("listed")
        .into_iter()
        .map(|f| f.run_id)
        .collect();
    assert_eq!(runs.len(), 25, "each firing has its own run id");
}

#[test]
fn a_queued_trigger_keeps_at_most_max_queued_runs_waiting() {
    let dir = tempfile::tempdir().expect("temp dir");
    let session = Session::open(&dir.path().join("state")).expect("store");
    let mut scheduler = Scheduler::new();
    scheduler
        .add(&workflow(dir.path(), &overlapping("queue")))
        .expect("added");
    let due = drive(
        &session,
        &mut scheduler,
        "2025-06-02T09:00:00Z",
        "2025-06-02T09:20:00Z",
        &|_: &str| true,
    );
    let decisions: Vec<Decision> = due.iter().map(|d| d.decision).collect();
    let queued = archon_engine::trigger::MAX_QUEUED;
    // One started, then the queue fills (the started run counts among those waiting on), then skips.
    assert_eq!(decisions[0], Decision::Start);
    assert!(decisions[1..queued].iter().all(|d| *d == Decision::Queue));
    assert!(decisions[queued..].iter().all(|d| *d == Decision::Skip));
    assert_eq!(
        due[queued].firing.reason.as_deref(),
        Some("16 runs are queued already")
    );
}
