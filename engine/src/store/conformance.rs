//! One suite over `&dyn RunStore`, run against every store: the embedded SQLite store (in a temporary
//! directory) and the PostgreSQL store (in a schema of its own per test, dropped afterwards).
//!
//! PostgreSQL is `ARCHON_TEST_POSTGRES` (default `postgres://postgres@127.0.0.1:5432/test`). When it cannot
//! be reached, the PostgreSQL half is skipped with the reason printed, unless `CI=true`: then it fails.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value as Json, json};
use tokio_util::sync::CancellationToken;

use super::postgres::{Options, PostgresStore};
use super::sqlite::SqliteStore;
use super::*;
use crate::report::{ApprovalDecision, ApprovalRequest, RunEvent, StepResult, StepStatus};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn base_url() -> String {
    std::env::var("ARCHON_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// Runs `sql` on a connection of its own (in a thread with its own runtime, whatever the caller runs in).
fn admin(sql: String) -> Result<(), String> {
    let url = base_url();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            })?;
            tokio::spawn(connection);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the admin thread panicked".to_owned()))
}

/// Whether the PostgreSQL half runs: `None` (with the reason printed) when the server cannot be reached
/// outside CI; a failure in CI.
// The reason a test skips is for the person running it.
#[allow(clippy::print_stderr)]
pub(crate) fn postgres_reachable() -> bool {
    match admin("SELECT 1".to_owned()) {
        Ok(()) => true,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!(
                "PostgreSQL at `{}` is needed in CI: {e}",
                postgres::masked(&base_url())
            )
        }
        Err(e) => {
            eprintln!(
                "skipped the PostgreSQL store: `{}` cannot be reached: {e}",
                postgres::masked(&base_url())
            );
            false
        }
    }
}

/// A store under test, and what tests do to it behind its back.
trait Backend {
    fn name(&self) -> &'static str;
    /// A new handle on the store, as another process on this host opens it.
    fn open(&self) -> Box<dyn RunStore>;
    /// Runs SQL on the store's database directly.
    fn exec(&self, sql: &str);
}

struct Sqlite(tempfile::TempDir, #[allow(dead_code)] sqlite::ServingMark);

impl Backend for Sqlite {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn open(&self) -> Box<dyn RunStore> {
        Box::new(SqliteStore::open(self.0.path()).expect("sqlite store opens"))
    }

    fn exec(&self, sql: &str) {
        rusqlite::Connection::open(self.0.path().join(sqlite::DATABASE))
            .and_then(|c| c.execute_batch(sql))
            .expect("sql runs");
    }
}

/// A schema of its own in the test database, dropped with the value.
pub(crate) struct Schema {
    pub name: String,
}

impl Schema {
    pub fn new() -> Schema {
        let name = format!(
            "archon_test_{}_{:08x}",
            std::process::id(),
            fastrand::u32(..)
        );
        admin(format!("CREATE SCHEMA {name}")).expect("schema created");
        Schema { name }
    }

    /// The test database's URL with this schema as the connection's `search_path`.
    pub fn url(&self) -> String {
        let base = base_url();
        let glue = if base.contains('?') { '&' } else { '?' };
        format!("{base}{glue}options=-c%20search_path%3D{}", self.name)
    }

    pub fn exec(&self, sql: &str) {
        admin(format!("SET search_path TO {}; {sql}", self.name)).expect("sql runs");
    }

    /// A store in this schema as a process on `host` sees it.
    pub fn store(&self, host: &str, lease: Duration) -> PostgresStore {
        let store = PostgresStore::connect(
            &self.url(),
            None,
            Options {
                host: host.to_owned(),
                lease,
            },
        )
        .expect("connects");
        store.migrate().expect("migrates");
        store
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = admin(format!("DROP SCHEMA {} CASCADE", self.name));
    }
}

struct Postgres(Schema);

impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn open(&self) -> Box<dyn RunStore> {
        Box::new(self.0.store(&sqlite::host(), postgres::LEASE))
    }

    fn exec(&self, sql: &str) {
        self.0.exec(sql);
    }
}

fn backends() -> Vec<Box<dyn Backend>> {
    let dir = tempfile::tempdir().expect("tempdir");
    // This process serves the test's runs: `cancel` asks through the store instead of signalling it.
    let mark = sqlite::ServingMark::new(dir.path()).expect("mark");
    let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(Sqlite(dir, mark))];
    if postgres_reachable() {
        backends.push(Box::new(Postgres(Schema::new())));
    }
    backends
}

/// An attempt as the tests compare it: step, number, status, process group, error.
type AttemptRow<'a> = (&'a str, u32, &'a str, Option<u32>, Option<&'a str>);

fn new_run(id: &str, workflow: &str) -> NewRun {
    let mut inputs = Map::new();
    inputs.insert("who".into(), json!("ann"));
    NewRun {
        id: id.into(),
        workflow: workflow.into(),
        spec_path: "/w/flow.yaml".into(),
        files: vec![
            ("flow.yaml".into(), format!("name: {workflow}\n")),
            ("sub.yaml".into(), "name: sub\n".into()),
        ],
        inputs,
        workdir: "/w".into(),
        max_parallel: 4,
    }
}

fn started(step: &str) -> Entry {
    Entry::AttemptStarted {
        step: step.into(),
        fallback: false,
    }
}

fn succeeded(step: &str, output: Json) -> Entry {
    let mut result = StepResult::ended(StepStatus::Succeeded, None);
    result.output = output;
    Entry::StepFinished {
        step: step.into(),
        result: Arc::new(result),
    }
}

fn ended(status: RunState) -> Entry {
    Entry::RunEnded {
        status,
        outputs: Map::new(),
        error: None,
    }
}

fn request(key: &str, step: &str) -> ApprovalRequest {
    ApprovalRequest {
        key: key.into(),
        step: step.into(),
        tool: Some("shell".into()),
        arguments: json!({"command": "rm -rf build"}),
        reason: "it deletes files".into(),
        timeout_ms: None,
        approve_on_timeout: false,
    }
}

/// Records `entries` in run `id` (which `store` owns) and waits until they are durable.
async fn record(store: &dyn RunStore, id: &str, entries: Vec<Entry>) {
    let journal = store
        .journal(id, CancellationToken::new())
        .expect("journal");
    for entry in entries {
        journal.record(entry);
    }
    journal.flush().wait().await.expect("durable");
    journal.close();
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_are_created_listed_paged_and_loaded() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        for (id, workflow) in [("r1", "alpha"), ("r2", "beta"), ("r3", "alpha")] {
            store.create_run(&new_run(id, workflow)).expect("created");
            // Distinct start times, so that the order is the order created.
            std::thread::sleep(Duration::from_millis(3));
        }
        let ids = |runs: Vec<RunSummary>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(store.list().expect("list")),
            ["r3", "r2", "r1"],
            "{name}"
        );
        let alpha = RunFilter {
            workflow: Some("alpha".into()),
            ..RunFilter::default()
        };
        assert_eq!(
            ids(store.list_where(&alpha).expect("list")),
            ["r3", "r1"],
            "{name}"
        );
        let first = store
            .page(&RunQuery {
                limit: 2,
                ..RunQuery::default()
            })
            .expect("page");
        assert_eq!(
            (ids(first.runs), first.total),
            (vec!["r3".to_owned(), "r2".to_owned()], 3),
            "{name}"
        );
        let second = store
            .page(&RunQuery {
                limit: 2,
                after: first.next.clone(),
                ..RunQuery::default()
            })
            .expect("page");
        assert_eq!(
            (ids(second.runs), second.next),
            (vec!["r1".to_owned()], None),
            "{name}"
        );
        let running = store
            .page(&RunQuery {
                status: vec![RunState::Running],
                workflow: Some("beta".into()),
                limit: 10,
                ..RunQuery::default()
            })
            .expect("page");
        assert_eq!(
            (ids(running.runs), running.total),
            (vec!["r2".to_owned()], 1),
            "{name}"
        );
        let (found, count) = store.with_prefix("r", 2).expect("prefix");
        assert_eq!(
            (ids(found), count),
            (vec!["r1".to_owned(), "r2".to_owned()], 3),
            "{name}"
        );
        assert_eq!(store.with_prefix("r2", 5).expect("prefix").1, 1, "{name}");
        assert_eq!(store.with_prefix("x", 5).expect("prefix").1, 0, "{name}");
        let summary = store.summary("r2").expect("summary").expect("there");
        assert_eq!(
            (summary.workflow.as_str(), summary.status),
            ("beta", RunState::Running),
            "{name}"
        );
        assert_eq!(store.summary("nope").expect("summary"), None, "{name}");
        assert_eq!(
            ids(store.changed_since(u64::MAX).expect("changed")),
            ["r3", "r2", "r1"],
            "{name}"
        );

        let run = store.load("r1").expect("loads");
        assert_eq!(
            (
                run.workflow.as_str(),
                run.spec_path.as_str(),
                run.status,
                run.inputs.get("who"),
                run.workdir.as_str(),
                run.max_parallel,
                run.generation,
            ),
            (
                "alpha",
                "/w/flow.yaml",
                RunState::Running,
                Some(&json!("ann")),
                "/w",
                4,
                0
            ),
            "{name}"
        );
        assert_eq!(
            run.spec_hash,
            spec_hash(&new_run("r1", "alpha").files),
            "{name}"
        );
        assert_eq!(
            run.owner.as_ref().map(|o| o.pid),
            Some(std::process::id()),
            "{name}"
        );
        assert_eq!(
            store.files("r1").expect("files"),
            new_run("r1", "alpha").files,
            "{name}"
        );
        let changed = vec![("flow.yaml".to_owned(), "name: changed\n".to_owned())];
        store.replace_files("r1", &changed).expect("replaced");
        assert_eq!(store.files("r1").expect("files"), changed, "{name}");
        assert_eq!(
            store.load("r1").expect("loads").spec_hash,
            spec_hash(&changed),
            "{name}"
        );
        let missing = store.load("nope").expect_err("no such run");
        assert!(missing.unknown_run, "{name}");
        assert_eq!(
            store.check().expect("checked"),
            Vec::<String>::new(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_journal_records_loads_back() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        // Over the inline limit: kept apart, and read back byte for byte.
        let large = json!({"text": "x".repeat(sqlite::INLINE_OUTPUT_BYTES + 10)});
        let mut long = StepResult::ended(StepStatus::Succeeded, None);
        long.text = "é".repeat(sqlite::INLINE_OUTPUT_BYTES);
        record(
            &*store,
            "r1",
            vec![
                Entry::Event {
                    event: RunEvent::StepStarted { step: "a".into() },
                    at_ms: 1_000,
                },
                started("a"),
                Entry::ProcessStarted {
                    step: "a".into(),
                    pgid: 4242,
                    started: Some(77),
                },
                Entry::Output {
                    step: "a".into(),
                    source: "a".into(),
                    stream: crate::tools::Stream::Stdout,
                    text: "hello\n".into(),
                    at_ms: 1_001,
                },
                Entry::Output {
                    step: "a".into(),
                    source: "a".into(),
                    stream: crate::tools::Stream::Stderr,
                    text: "oops\n".into(),
                    at_ms: 1_002,
                },
                Entry::AttemptEnded {
                    step: "a".into(),
                    status: StepStatus::Succeeded,
                    error: None,
                },
                succeeded("a", json!({"n": 1})),
                started("b"),
                Entry::Checkpoint {
                    step: "b".into(),
                    state: json!({"iteration": 3}),
                },
                Entry::AttemptEnded {
                    step: "b".into(),
                    status: StepStatus::Failed,
                    error: Some("boom".into()),
                },
                started("b"),
                Entry::AttemptEnded {
                    step: "b".into(),
                    status: StepStatus::Succeeded,
                    error: None,
                },
                succeeded("b", large.clone()),
                Entry::StepFinished {
                    step: "c".into(),
                    result: Arc::new(long.clone()),
                },
                Entry::Event {
                    event: RunEvent::StepStarted { step: "b".into() },
                    at_ms: 1_003,
                },
            ],
        )
        .await;
        let run = store.load("r1").expect("loads");
        let attempts: Vec<AttemptRow<'_>> = run
            .attempts
            .iter()
            .map(|a| {
                (
                    a.step.as_str(),
                    a.attempt,
                    a.status.as_str(),
                    a.pgid,
                    a.error.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            attempts,
            [
                ("a", 1, "succeeded", Some(4242), None),
                ("b", 1, "failed", None, Some("boom")),
                ("b", 2, "succeeded", None, None),
            ],
            "{name}"
        );
        // The process's start too (on PostgreSQL, written in the attempt's row when the two are
        // recorded together).
        assert_eq!(run.attempts[0].pgid_started, Some(77), "{name}");
        // An attempt whose start was made durable before its process and its end (as a step with side
        // effects makes it): they are recorded in its row after.
        store.create_run(&new_run("r2", "w")).expect("created");
        let journal = store
            .journal("r2", CancellationToken::new())
            .expect("journal");
        journal.record(started("x"));
        journal.flush().wait().await.expect("durable");
        journal.record(Entry::ProcessStarted {
            step: "x".into(),
            pgid: 4343,
            started: Some(78),
        });
        journal.record(Entry::AttemptEnded {
            step: "x".into(),
            status: StepStatus::Failed,
            error: Some("bang".into()),
        });
        journal.flush().wait().await.expect("durable");
        journal.close();
        let x = &store.load("r2").expect("loads").attempts[0];
        assert_eq!(
            (
                x.status.as_str(),
                x.pgid,
                x.pgid_started,
                x.error.as_deref()
            ),
            ("failed", Some(4343), Some(78), Some("bang")),
            "{name}"
        );
        assert_eq!(
            run.results.keys().collect::<Vec<_>>(),
            ["a", "b", "c"],
            "{name}"
        );
        assert_eq!(run.results["a"].output, json!({"n": 1}), "{name}");
        assert_eq!(run.results["b"].output, large, "{name}");
        assert_eq!(run.results["c"], long, "{name}");
        assert_eq!(run.checkpoints["b"], json!({"iteration": 3}), "{name}");
        // A brief load leaves what is kept apart out.
        let brief = store.load_brief("r1").expect("loads");
        assert_eq!(
            (
                brief.results["b"].output.clone(),
                brief.results["a"].output.clone()
            ),
            (Json::Null, json!({"n": 1})),
            "{name}"
        );
        let events = store.events("r1").expect("events");
        assert_eq!(
            events,
            [
                json!({"event": "step_started", "step": "a", "at_ms": 1_000}),
                json!({"event": "step_started", "step": "b", "at_ms": 1_003}),
            ],
            "{name}"
        );
        assert_eq!(store.last_event("r1").expect("last"), 2, "{name}");
        assert_eq!(
            store.events_after("r1", 1, 10).expect("events"),
            [(
                2,
                json!({"event": "step_started", "step": "b", "at_ms": 1_003})
            )],
            "{name}"
        );
        let logs = store.logs("r1", 0).expect("logs");
        assert_eq!(
            logs.iter()
                .map(|l| (
                    l.seq,
                    l.step.as_str(),
                    l.attempt,
                    l.stream,
                    l.text.as_str(),
                    l.at_ms
                ))
                .collect::<Vec<_>>(),
            [
                (1, "a", 1, crate::tools::Stream::Stdout, "hello\n", 1_001),
                (2, "a", 1, crate::tools::Stream::Stderr, "oops\n", 1_002),
            ],
            "{name}"
        );
        assert_eq!(
            store.logs_after("r1", 1, 5).expect("logs"),
            logs[1..],
            "{name}"
        );
        assert_eq!(
            store.logs_after("r1", 0, 1).expect("logs"),
            logs[..1],
            "{name}"
        );

        // The run's end: its outputs, its state, and no owner. (The journal above closed and gave the
        // run up: it is claimed again first.)
        assert_eq!(
            store.summary("r1").expect("summary").expect("there").status,
            RunState::Interrupted,
            "{name}"
        );
        store
            .claim("r1", &[RunState::Interrupted])
            .expect("claimed");
        let journal = store
            .journal("r1", CancellationToken::new())
            .expect("journal");
        let mut outputs = Map::new();
        outputs.insert("greeting".into(), json!("hi"));
        journal.record(Entry::RunEnded {
            status: RunState::Succeeded,
            outputs: outputs.clone(),
            error: None,
        });
        journal.flush().wait().await.expect("durable");
        journal.close();
        let run = store.load("r1").expect("loads");
        assert_eq!(
            (
                run.status,
                run.outputs,
                run.owner,
                run.finished_at.is_some()
            ),
            (RunState::Succeeded, outputs, None, true),
            "{name}"
        );
        assert_eq!(
            store.check().expect("checked"),
            Vec::<String>::new(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flushed_record_is_there_for_another_process_and_an_unflushed_one_soon() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        let journal = store
            .journal("r1", CancellationToken::new())
            .expect("journal");
        journal.record(started("a"));
        journal.record(succeeded("a", json!(1)));
        journal.flush().wait().await.expect("durable");
        // Another handle (another process's connection) sees it at once.
        let other = backend.open();
        assert_eq!(
            other.load("r1").expect("loads").results["a"].output,
            json!(1),
            "{name}"
        );
        let before = other.changes().expect("changes");
        // Not flushed: committed within the commit window all the same.
        journal.record(Entry::Event {
            event: RunEvent::StepStarted { step: "b".into() },
            at_ms: 5,
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while other.events("r1").expect("events").is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "{name}: not committed within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_ne!(
            other.changes().expect("changes"),
            before,
            "{name}: a commit is a change"
        );
        journal.close();
        let error = journal.flush().wait().await.expect_err("closed");
        assert_eq!(error.message, "the run store stopped", "{name}");
        // Closing gave the run up: it is interrupted, and can be claimed to resume it.
        assert_eq!(
            other.summary("r1").expect("summary").expect("there").status,
            RunState::Interrupted,
            "{name}"
        );
        assert_eq!(
            other
                .claim("r1", &[RunState::Interrupted])
                .expect("claimed"),
            RunState::Interrupted,
            "{name}"
        );
        let refused = store
            .claim("r1", &[RunState::Interrupted])
            .expect_err("owned");
        assert!(
            refused
                .message
                .starts_with("run `r1` is being run by process"),
            "{name}: {}",
            refused.message
        );
        other
            .release("r1", RunState::Interrupted)
            .expect("released");
        let state = store
            .claim("r1", &[RunState::Succeeded])
            .expect_err("wrong state");
        assert_eq!(state.message, "run `r1` is `interrupted`", "{name}");
    }
}

/// A process whose run was taken over writes nothing more, and its run stops as failed.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_taken_over_is_fenced_off() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        let cancel = CancellationToken::new();
        let journal = store.journal("r1", cancel.clone()).expect("journal");
        journal.record(started("a"));
        journal.flush().wait().await.expect("durable");
        // Another process took the run (its token replaced this one's).
        backend.exec("UPDATE runs SET owner_token = 'another' WHERE id = 'r1'");
        journal.record(succeeded("a", json!(1)));
        let error = journal.flush().wait().await.expect_err("fenced");
        assert_eq!(
            (error.taken_over, error.message.as_str()),
            (
                true,
                "run `r1` was taken over by another process; this one stopped recording it"
            ),
            "{name}"
        );
        assert_eq!(journal.failure(), Some(error), "{name}");
        assert!(cancel.is_cancelled(), "{name}: the run is stopped");
        journal.close();
        assert!(
            store.load("r1").expect("loads").results.is_empty(),
            "{name}"
        );
    }
}

/// Across hosts: a host cut off keeps its process alive but its lease lapses; another host claims the
/// run, and the first host's writes are refused.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_lapsed_lease_lets_another_host_claim_and_fences_the_first() {
    if !postgres_reachable() {
        return;
    }
    let schema = Schema::new();
    let first = schema.store("host-a", Duration::from_secs(60));
    let second = schema.store("host-b", Duration::from_secs(60));
    first.create_run(&new_run("r1", "w")).expect("created");
    let cancel = CancellationToken::new();
    let journal = first.journal("r1", cancel.clone()).expect("journal");
    journal.record(started("a"));
    journal.record(Entry::ProcessStarted {
        step: "a".into(),
        pgid: 4242,
        started: Some(7),
    });
    journal.flush().wait().await.expect("durable");
    // Its lease is good: the other host may not take the run.
    let refused = second
        .claim("r1", &[RunState::Interrupted])
        .expect_err("owned");
    assert_eq!(
        refused.message,
        format!(
            "run `r1` is being run by process `{}` on `host-a`",
            std::process::id()
        )
    );
    assert_eq!(
        second
            .summary("r1")
            .expect("summary")
            .expect("there")
            .status,
        RunState::Running
    );
    // Its heartbeats stop reaching the database: the lease lapses.
    schema.exec("UPDATE runs SET lease_until = 1 WHERE id = 'r1'");
    assert_eq!(
        second
            .summary("r1")
            .expect("summary")
            .expect("there")
            .status,
        RunState::Interrupted
    );
    assert_eq!(
        second
            .claim("r1", &[RunState::Interrupted])
            .expect("claimed"),
        RunState::Interrupted
    );
    let taken = second
        .journal("r1", CancellationToken::new())
        .expect("journal");
    journal.record(succeeded("a", json!("from host a")));
    let error = journal.flush().wait().await.expect_err("fenced");
    assert!(error.taken_over);
    assert!(cancel.is_cancelled());
    taken.record(started("a"));
    taken.record(succeeded("a", json!("from host b")));
    taken.flush().wait().await.expect("durable");
    let run = second.load("r1").expect("loads");
    assert_eq!(run.results["a"].output, json!("from host b"));
    assert_eq!(run.attempts.len(), 2);
    // The process group host A recorded is no process group of host B's: not there to be stopped.
    let pgids = |s: &PostgresStore| {
        s.load("r1")
            .expect("loads")
            .attempts
            .iter()
            .map(|a| a.pgid)
            .collect::<Vec<_>>()
    };
    assert_eq!(pgids(&first), [Some(4242), None]);
    assert_eq!(pgids(&second), [None, None]);
    assert_eq!(run.owner.map(|o| o.host), Some("host-b".to_owned()));
    journal.close();
    taken.close();
}

/// `archon cancel` from another host reaches an idle run at once (a notification), not at its next
/// heartbeat.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_cancel_from_another_host_reaches_an_idle_run_at_once() {
    if !postgres_reachable() {
        return;
    }
    let schema = Schema::new();
    // A heartbeat every 100 s: only the notification can make the journal look before the timeout.
    let owner = schema.store("host-a", Duration::from_secs(300));
    let other = schema.store("host-b", Duration::from_secs(300));
    owner.create_run(&new_run("r1", "w")).expect("created");
    let cancel = CancellationToken::new();
    let journal = owner.journal("r1", cancel.clone()).expect("journal");
    journal.record(started("a"));
    journal.flush().wait().await.expect("durable");
    assert_eq!(other.cancel("r1").expect("asked"), RunState::Running);
    tokio::time::timeout(Duration::from_secs(20), cancel.cancelled())
        .await
        .expect("the journal heard of the cancel");
    journal.record(ended(RunState::Interrupted));
    journal.flush().wait().await.expect("durable");
    journal.close();
    assert_eq!(other.load("r1").expect("loads").status, RunState::Cancelled);
}

/// The lease is renewed every third of it while the run is idle.
#[tokio::test(flavor = "multi_thread")]
async fn postgres_an_idle_run_renews_its_lease() {
    if !postgres_reachable() {
        return;
    }
    let schema = Schema::new();
    let store = schema.store("host-a", Duration::from_millis(600));
    let other = schema.store("host-b", Duration::from_millis(600));
    store.create_run(&new_run("r1", "w")).expect("created");
    let journal = store
        .journal("r1", CancellationToken::new())
        .expect("journal");
    let lease = || {
        other
            .load("r1")
            .expect("loads")
            .owner
            .map_or(0, |o| o.lease_until)
    };
    let granted = lease();
    assert!(granted > 0);
    // Wait for the renewal itself, not for a time.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while lease() <= granted {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease was never renewed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Long after the first lease lapsed, the run is still its owner's.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while now_ms() <= granted + 600 {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        other.summary("r1").expect("summary").expect("there").status,
        RunState::Running
    );
    journal.close();
    assert_eq!(
        other.summary("r1").expect("summary").expect("there").status,
        RunState::Interrupted
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_are_decided_by_step_and_by_call() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        let refused = store
            .decide(
                "r1",
                None,
                &ApprovalDecision {
                    approved: true,
                    by: "ann".into(),
                    reason: None,
                },
            )
            .expect_err("running");
        assert_eq!(
            (refused.unknown_run, refused.message.as_str()),
            (
                true,
                "run `r1` is not waiting for approval: it is `running`"
            ),
            "{name}"
        );
        record(
            &*store,
            "r1",
            vec![
                Entry::ApprovalRequested(request("k1", "deploy")),
                Entry::ApprovalRequested(request("k2", "clean")),
                Entry::ApprovalRequested(request("k3", "clean[1]")),
                ended(RunState::WaitingApproval),
            ],
        )
        .await;
        assert_eq!(
            store.summary("r1").expect("summary").expect("there").status,
            RunState::WaitingApproval,
            "{name}"
        );
        let yes = ApprovalDecision {
            approved: true,
            by: "ann".into(),
            reason: Some("fine".into()),
        };
        let decided = store.decide("r1", Some("clean"), &yes).expect("decided");
        assert_eq!(
            decided.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["k2", "k3"],
            "{name}"
        );
        let no = ApprovalDecision {
            approved: false,
            by: "bob".into(),
            reason: None,
        };
        assert_eq!(
            store
                .decide_call("r1", "k1", &no)
                .expect("decided")
                .map(|r| r.key),
            Some("k1".to_owned()),
            "{name}"
        );
        assert_eq!(
            store.decide_call("r1", "k1", &no).expect("nothing pending"),
            None,
            "{name}"
        );
        let run = store.load("r1").expect("loads");
        let approvals: Vec<(&str, Option<bool>, Option<&str>)> = run
            .approvals
            .iter()
            .map(|a| {
                (
                    a.request.key.as_str(),
                    a.decision.as_ref().map(|d| d.approved),
                    a.decision.as_ref().map(|d| d.by.as_str()),
                )
            })
            .collect();
        assert_eq!(
            approvals,
            [
                ("k1", Some(false), Some("bob")),
                ("k2", Some(true), Some("ann")),
                ("k3", Some(true), Some("ann"))
            ],
            "{name}"
        );
        assert_eq!(run.approvals[0].request, request("k1", "deploy"), "{name}");
        let kinds: Vec<(String, String)> = store
            .events("r1")
            .expect("events")
            .iter()
            .map(|e| {
                (
                    e["event"].as_str().unwrap_or("").to_owned(),
                    e["step"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        assert_eq!(
            kinds,
            [
                ("approval_decided".to_owned(), "clean".to_owned()),
                ("approval_decided".to_owned(), "clean[1]".to_owned()),
                ("approval_decided".to_owned(), "deploy".to_owned()),
            ],
            "{name}"
        );
        // Claimed to resume: no longer waiting, so a late decision is refused.
        store
            .claim("r1", &[RunState::WaitingApproval])
            .expect("claimed");
        let late = store.decide("r1", None, &yes).expect_err("running");
        assert!(late.unknown_run, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_ends_idle_runs_at_once_and_asks_live_ones() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        // A run nobody runs: cancelled at once.
        store.create_run(&new_run("idle", "w")).expect("created");
        record(&*store, "idle", vec![ended(RunState::Interrupted)]).await;
        assert_eq!(
            store.cancel("idle").expect("cancelled"),
            RunState::Cancelled,
            "{name}"
        );
        let run = store.load("idle").expect("loads");
        assert_eq!(
            (run.status, run.finished_at.is_some()),
            (RunState::Cancelled, true),
            "{name}"
        );
        // A finished run stays as it ended.
        assert_eq!(
            store.cancel("idle").expect("finished"),
            RunState::Cancelled,
            "{name}"
        );
        // A live run is asked; its journal notices, and its end is `cancelled`.
        store.create_run(&new_run("live", "w")).expect("created");
        let cancel = CancellationToken::new();
        let journal = store.journal("live", cancel.clone()).expect("journal");
        let other = backend.open();
        assert_eq!(
            other.cancel("live").expect("asked"),
            RunState::Running,
            "{name}"
        );
        journal.record(started("a"));
        journal.flush().wait().await.expect("durable");
        tokio::time::timeout(Duration::from_secs(20), cancel.cancelled())
            .await
            .unwrap_or_else(|_| panic!("{name}: the journal never noticed the cancel"));
        journal.record(ended(RunState::Interrupted));
        journal.flush().wait().await.expect("durable");
        journal.close();
        assert_eq!(
            other.load("live").expect("loads").status,
            RunState::Cancelled,
            "{name}"
        );
        assert!(
            store.cancel("nope").expect_err("unknown").unknown_run,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn forgetting_results_starts_a_new_generation() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        record(
            &*store,
            "r1",
            vec![
                succeeded("a", json!(1)),
                succeeded("a[0]", json!(2)),
                succeeded("ab", json!(3)),
                succeeded("b", json!(4)),
                ended(RunState::Failed),
            ],
        )
        .await;
        store.claim("r1", &[RunState::Failed]).expect("claimed");
        assert_eq!(
            store
                .forget_results("r1", &["a".to_owned()])
                .expect("forgot"),
            1,
            "{name}"
        );
        let run = store.load("r1").expect("loads");
        assert_eq!(
            (
                run.generation,
                run.results.keys().map(String::as_str).collect::<Vec<_>>()
            ),
            (1, vec!["ab", "b"]),
            "{name}"
        );
        record(&*store, "r1", vec![started("a"), succeeded("a", json!(5))]).await;
        let run = store.load("r1").expect("loads");
        assert_eq!(
            (run.attempts[0].generation, run.results["a"].output.clone()),
            (1, json!(5)),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_steps_cached_results_are_its_own_and_those_of_the_sub_workflows_it_may_call() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        let cached = |key: &str, workflow: &str, step: &str, ttl_ms: Option<u64>| Entry::Cached {
            key: key.into(),
            workflow: workflow.into(),
            step: step.into(),
            source: step.into(),
            result: Arc::new(StepResult::ended(StepStatus::Succeeded, None)),
            ttl_ms,
        };
        record(
            &*store,
            "r1",
            vec![
                cached("wa", "w", "a", None),
                cached("wb", "w", "b", Some(1)),
                cached("sx", "sub", "x", None),
                cached("sy", "sub", "y", Some(1)),
                cached("oz", "other", "z", None),
            ],
        )
        .await;
        let keys_at = |workflow: &str, step: &str, others: &[&str], now: u64| {
            let others: Vec<String> = others.iter().map(|o| (*o).to_owned()).collect();
            let mut keys: Vec<String> = store
                .step_cache_entries(workflow, step, &others, now)
                .expect("entries")
                .into_iter()
                .map(|e| e.summary.key)
                .collect();
            keys.sort_unstable();
            keys
        };
        let keys = |workflow: &str, step: &str, others: &[&str]| keys_at(workflow, step, others, 0);
        assert_eq!(keys("w", "a", &["sub"]), ["sx", "sy", "wa"], "{name}");
        assert_eq!(
            keys("w", "a", &["sub", "sub"]),
            ["sx", "sy", "wa"],
            "{name}"
        );
        assert_eq!(keys("w", "b", &[]), ["wb"], "{name}");
        assert_eq!(keys("w", "c", &[]), Vec::<String>::new(), "{name}");
        // A sub-workflow of the same name as the run's: every entry of that name may be its.
        assert_eq!(keys("w", "a", &["w"]), ["wa", "wb"], "{name}");
        // Expired ones (a one-millisecond lifetime) are not reused.
        let later = now_ms() + 60_000;
        assert_eq!(keys_at("w", "b", &["sub"], later), ["sx"], "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cached_results_are_kept_listed_and_cleared() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        let cached = |key: &str, step: &str, output: Json, ttl_ms: Option<u64>| {
            let mut result = StepResult::ended(StepStatus::Succeeded, None);
            result.output = output;
            Entry::Cached {
                key: key.into(),
                workflow: "w".into(),
                step: step.into(),
                source: step.into(),
                result: Arc::new(result),
                ttl_ms,
            }
        };
        let large = json!("y".repeat(sqlite::INLINE_OUTPUT_BYTES * 2));
        record(
            &*store,
            "r1",
            vec![
                cached("k1", "a", json!({"n": 1}), None),
                cached("k2", "b", large.clone(), Some(1)),
            ],
        )
        .await;
        let mut entries = store
            .cache_entries(&["w".to_owned()], now_ms() - 60_000)
            .expect("entries");
        entries.sort_by(|x, y| x.summary.key.cmp(&y.summary.key));
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.summary.key.as_str(), e.result.output.clone()))
                .collect::<Vec<_>>(),
            [("k1", json!({"n": 1})), ("k2", large)],
            "{name}"
        );
        assert_eq!(
            store
                .cache_entries(&["other".to_owned()], 0)
                .expect("entries")
                .len(),
            0,
            "{name}"
        );
        // Expired by now (a one-millisecond lifetime).
        let later = now_ms() + 60_000;
        assert_eq!(
            store
                .cache_entries(&["w".to_owned()], later)
                .expect("entries")
                .iter()
                .map(|e| e.summary.key.as_str())
                .collect::<Vec<_>>(),
            ["k1"],
            "{name}"
        );
        assert_eq!(store.cache_list().expect("list").len(), 2, "{name}");
        let expired = CacheFilter {
            expired: true,
            ..CacheFilter::default()
        };
        assert_eq!(
            store.cache_clear(&expired, later).expect("cleared"),
            1,
            "{name}"
        );
        assert_eq!(
            store
                .cache_list()
                .expect("list")
                .iter()
                .map(|c| c.key.as_str())
                .collect::<Vec<_>>(),
            ["k1"],
            "{name}"
        );
        assert_eq!(
            store
                .cache_clear(&CacheFilter::default(), later)
                .expect("cleared"),
            1,
            "{name}"
        );
        assert_eq!(store.cache_list().expect("list"), Vec::new(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trigger_slot_is_recorded_once() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        let firing = |slot: &str, slot_at: u64, run: Option<&str>, outcome: FiringOutcome| Firing {
            workflow: "w".into(),
            trigger: "nightly".into(),
            kind: FiringKind::Cron,
            slot: slot.into(),
            slot_at,
            fired_at: slot_at + 5,
            run_id: run.map(str::to_owned),
            outcome,
            reason: None,
            inputs: {
                let mut inputs = Map::new();
                inputs.insert("day".into(), json!(slot));
                inputs
            },
        };
        let mark = store.arm_trigger("w", "nightly", 100).expect("armed");
        assert_eq!(
            mark,
            TriggerMark {
                armed_at: 100,
                last_slot_at: None
            },
            "{name}"
        );
        assert_eq!(
            store
                .arm_trigger("w", "nightly", 200)
                .expect("armed")
                .armed_at,
            100,
            "{name}"
        );
        let one = firing(
            "2026-01-01T00:00:00Z",
            1_000,
            Some("rA"),
            FiringOutcome::Started,
        );
        assert!(store.record_firing(&one).expect("recorded"), "{name}");
        // A second server, or a replay: the slot is taken.
        assert!(
            !backend.open().record_firing(&one).expect("recorded"),
            "{name}"
        );
        let two = firing("2026-01-02T00:00:00Z", 2_000, None, FiringOutcome::Skipped);
        assert!(store.record_firing(&two).expect("recorded"), "{name}");
        assert_eq!(
            store
                .arm_trigger("w", "nightly", 300)
                .expect("armed")
                .last_slot_at,
            Some(2_000),
            "{name}"
        );
        let last = store
            .last_firing("w", "nightly")
            .expect("last")
            .expect("there");
        assert_eq!(
            (last.slot.as_str(), last.inputs.len()),
            ("2026-01-02T00:00:00Z", 0),
            "{name}"
        );
        let listed = store
            .firings(&FiringFilter {
                limit: Some(1),
                ..FiringFilter::default()
            })
            .expect("firings");
        assert_eq!(
            listed.iter().map(|f| f.slot.as_str()).collect::<Vec<_>>(),
            ["2026-01-02T00:00:00Z"],
            "{name}"
        );
        assert_eq!(
            store
                .firings(&FiringFilter::default())
                .expect("firings")
                .len(),
            2,
            "{name}"
        );
        // Its run was never created: a restart starts it, with its inputs.
        let unstarted = store.unstarted_firings().expect("unstarted");
        assert_eq!(unstarted, std::slice::from_ref(&one), "{name}");
        // A queued firing dropped before its run started is skipped for good, without a run.
        let three = firing(
            "2026-01-03T00:00:00Z",
            3_000,
            Some("rC"),
            FiringOutcome::Queued,
        );
        assert!(store.record_firing(&three).expect("recorded"), "{name}");
        assert!(
            store
                .skip_unstarted_firing("rC", "replaced")
                .expect("skipped"),
            "{name}"
        );
        assert!(
            !store
                .skip_unstarted_firing("rC", "replaced")
                .expect("skipped"),
            "{name}: once"
        );
        let skipped = store
            .last_firing("w", "nightly")
            .expect("last")
            .expect("there");
        assert_eq!(
            (skipped.outcome, skipped.run_id, skipped.reason.as_deref()),
            (FiringOutcome::Skipped, None, Some("replaced")),
            "{name}"
        );
        assert_eq!(
            store.unstarted_firings().expect("unstarted"),
            std::slice::from_ref(&one),
            "{name}"
        );
        store.create_run(&new_run("rA", "w")).expect("created");
        // A firing whose run exists is not skipped.
        assert!(
            !store
                .skip_unstarted_firing("rA", "replaced")
                .expect("skipped"),
            "{name}"
        );
        assert_eq!(
            store.unstarted_firings().expect("unstarted"),
            Vec::new(),
            "{name}"
        );
        assert_eq!(
            store.check().expect("checked"),
            Vec::<String>::new(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_deletes_finished_runs_with_everything_they_own() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        let large = json!("z".repeat(sqlite::INLINE_OUTPUT_BYTES * 2));
        for id in ["old", "kept"] {
            store.create_run(&new_run(id, "w")).expect("created");
            record(
                &*store,
                id,
                vec![
                    started("a"),
                    succeeded("a", large.clone()),
                    Entry::Event {
                        event: RunEvent::StepStarted { step: "a".into() },
                        at_ms: 1,
                    },
                    ended(RunState::Succeeded),
                ],
            )
            .await;
        }
        store.create_run(&new_run("live", "w")).expect("created");
        backend.exec("UPDATE runs SET finished_at = 10 WHERE id = 'old'");
        let dry = store.prune(1_000, true).expect("dry run");
        assert_eq!(
            (
                dry.runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
                dry.dry_run
            ),
            (vec!["old"], true),
            "{name}"
        );
        assert!(dry.bytes > 0, "{name}");
        assert!(
            store.load("old").is_ok(),
            "{name}: a dry run deletes nothing"
        );
        let pruned = store.prune(1_000, false).expect("pruned");
        assert_eq!(
            pruned
                .runs
                .iter()
                .map(|r| r.id.as_str())
                .collect::<Vec<_>>(),
            ["old"],
            "{name}"
        );
        assert!(store.load("old").expect_err("gone").unknown_run, "{name}");
        // The blob both runs used stays for the one kept.
        assert_eq!(
            store.load("kept").expect("loads").results["a"].output,
            large,
            "{name}"
        );
        assert_eq!(store.list().expect("list").len(), 2, "{name}");
        assert_eq!(
            store.prune(1_000, false).expect("pruned").runs,
            Vec::new(),
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_that_does_not_decode_is_reported() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        store.create_run(&new_run("r1", "w")).expect("created");
        record(
            &*store,
            "r1",
            vec![Entry::Event {
                event: RunEvent::StepStarted { step: "a".into() },
                at_ms: 1,
            }],
        )
        .await;
        backend.exec("UPDATE events SET event = '{not json' WHERE run_id = 'r1'");
        let problems = store.check().expect("checked");
        assert_eq!(problems.len(), 1, "{name}: {problems:?}");
        assert!(
            problems[0].starts_with("run `r1`: events row `1` does not decode"),
            "{name}: {problems:?}"
        );
        let error = store.events("r1").expect_err("damaged");
        let lines: Vec<&str> = error.message.lines().collect();
        assert_eq!(lines.len(), 2, "{name}: {}", error.message);
        assert!(
            lines[0].ends_with("has 1 damaged row:"),
            "{name}: {}",
            error.message
        );
        assert!(
            lines[1].starts_with("  run `r1`: events row `1` does not decode: "),
            "{name}: {}",
            error.message
        );
    }
}

#[test]
fn postgres_migrations_are_idempotent_and_safe_when_processes_start_together() {
    if !postgres_reachable() {
        return;
    }
    let schema = Schema::new();
    let url = schema.url();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let store = PostgresStore::connect(
                    &url,
                    None,
                    Options {
                        host: format!("h{i}"),
                        lease: postgres::LEASE,
                    },
                )?;
                store.migrate()
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("joined").expect("migrated");
    }
    // Again: nothing to do.
    schema.store("h", postgres::LEASE);
    schema.exec("DO $$ BEGIN IF (SELECT COUNT(*) FROM archon_schema_version) != 1 THEN RAISE 'not one version row'; END IF; END $$");
    // A newer schema is refused, and left alone.
    schema.exec("UPDATE archon_schema_version SET version = 99");
    let store = PostgresStore::connect(&url, None, Options::default()).expect("connects");
    let error = store.migrate().expect_err("newer");
    assert_eq!(
        (error.message, error.hint),
        (
            format!(
                "run store `{}` has schema version `99`, newer than this archon knows (`{}`)",
                postgres::masked(&url),
                postgres::SCHEMA_VERSION
            ),
            Some("use the archon version that wrote it, or a newer one".to_owned())
        )
    );
}

#[test]
fn a_store_url_is_checked_and_its_password_never_shown() {
    assert_eq!(
        postgres::masked(
            "postgres://ann:s3cret@db.example:5432/runs?sslmode=disable&password=other"
        ),
        "postgres://ann:***@db.example:5432/runs?sslmode=disable&password=***"
    );
    assert_eq!(
        postgres::masked("postgresql://ann@db/runs"),
        "postgresql://ann@db/runs"
    );
    // tokio-postgres takes the credentials up to the first `@`: a raw `/`, `?` or `#` of a password is
    // masked with the rest of it.
    assert_eq!(
        postgres::masked("postgres://ann:Sec/ret@%2Fvar%2Frun%2Fpostgresql/runs"),
        "postgres://ann:***@%2Fvar%2Frun%2Fpostgresql/runs"
    );
    assert_eq!(
        postgres::masked("postgres://ann:a#b?c@db/runs?sslmode=disable"),
        "postgres://ann:***@db/runs?sslmode=disable"
    );
    let at = StoreAt {
        state_dir: "/tmp".into(),
        url: Some("mysql://ann:s3cret@db/runs".into()),
    };
    let error = open(&at).expect_err("refused");
    assert_eq!(
        (error.message.as_str(), error.hint.as_deref()),
        (
            "unsupported run store `mysql://ann:***@db/runs`: only PostgreSQL URLs (`postgres://` or `postgresql://`) are supported",
            Some("leave `--store` (and `ARCHON_STORE`) out to keep runs in the state directory")
        )
    );
    // Nothing listens on port 1: the error names the store without its password.
    let at = StoreAt {
        state_dir: "/tmp".into(),
        url: Some("postgres://ann:s3cret@127.0.0.1:1/runs".into()),
    };
    let error = open(&at).expect_err("unreachable");
    assert_eq!(
        (error.message.as_str(), error.hint.as_deref()),
        (
            "cannot reach the run store `postgres://ann:***@127.0.0.1:1/runs`: error connecting to server: connection refused (os error 111)",
            Some("check that the PostgreSQL server is up and reachable from here")
        )
    );
}

/// Pages walk every run once, in order, however many of the stored `running` runs turn out to be
/// interrupted (their owner gone), which only the reader can tell.
#[tokio::test(flavor = "multi_thread")]
async fn pages_walk_every_run_once_whatever_their_owners() {
    for backend in backends() {
        let name = backend.name();
        let store = backend.open();
        for i in 0..40 {
            store
                .create_run(&new_run(&format!("r{i:02}"), "w"))
                .expect("created");
        }
        // Half of them were owned by a process on another host whose lease lapsed.
        backend.exec(
            "UPDATE runs SET owner_pid = 999999, owner_host = 'gone.example', lease_until = 1
             WHERE CAST(substr(id, 2) AS INTEGER) % 2 = 1",
        );
        let all = store.list().expect("list");
        assert_eq!(all.len(), 40, "{name}");
        for (state, limit) in [
            (RunState::Interrupted, 7),
            (RunState::Running, 3),
            (RunState::Running, 50),
        ] {
            let expected: Vec<String> = all
                .iter()
                .filter(|r| r.status == state)
                .map(|r| r.id.clone())
                .collect();
            assert_eq!(expected.len(), 20, "{name}");
            let mut walked = Vec::new();
            let mut after = None;
            loop {
                let page = store
                    .page(&RunQuery {
                        status: vec![state],
                        after: after.clone(),
                        limit,
                        ..RunQuery::default()
                    })
                    .expect("page");
                assert_eq!(page.total, 20, "{name}");
                assert!(page.runs.len() <= limit, "{name}");
                walked.extend(page.runs.into_iter().map(|r| r.id));
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            assert_eq!(walked, expected, "{name}: {state:?} by {limit}");
            let listed = store
                .list_where(&RunFilter {
                    status: vec![state],
                    limit: Some(limit),
                    ..RunFilter::default()
                })
                .expect("list");
            assert_eq!(
                listed.into_iter().map(|r| r.id).collect::<Vec<_>>(),
                expected[..limit.min(20)],
                "{name}"
            );
        }
    }
}

#[test]
fn a_store_never_shows_its_password_when_debugged() {
    let url = "postgres://ann:s3cret@127.0.0.1:1/runs";
    let at = StoreAt {
        state_dir: "/tmp".into(),
        url: Some(url.into()),
    };
    assert_eq!(
        format!("{at:?}"),
        r#"StoreAt { state_dir: "/tmp", url: Some("postgres://ann:***@127.0.0.1:1/runs") }"#
    );
    // Connecting is lazy: the store exists, unconnected, and says nothing of the password.
    let store = PostgresStore::connect(url, None, Options::default()).expect("configured");
    let shown = format!("{store:?}");
    assert!(
        shown.contains("postgres://ann:***@127.0.0.1:1/runs"),
        "{shown}"
    );
    assert!(!shown.contains("s3cret"), "{shown}");
}
