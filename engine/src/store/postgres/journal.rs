//! A run's journal on PostgreSQL: a writer task on the store's runtime applies the entries in order, in
//! batches of one transaction each, with the commit window of the SQLite journal (at once when a flush
//! waits, else when `GATHERED` entries wait or the oldest has waited `WINDOW`). Every transaction first
//! locks the run's row and checks that it still carries this process's owner token: a process that lost
//! the run writes nothing more, and the run stops as failed. The writer renews the run's lease every
//! third of it, and notices `archon cancel`.
//!
//! The statements of a batch are sent together (pipelined on the transaction's connection), so a batch
//! costs a few round trips, not one per entry.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::types::ToSql;
use tokio_util::sync::CancellationToken;

use super::commit::{Fence, Op, Params, Reply, Unit};
use super::queries::{bump, ms};
use super::{Failure, Inner, Result};
use crate::record::{self, FORMAT_VERSION};
use crate::report::StepResult;
use crate::store::sqlite::{
    BATCH, ENCODED_WHERE_RECORDED, GATHERED, INLINE_OUTPUT_BYTES, Measured, WINDOW, json_text,
};
use crate::store::{Ack, Entry, Finished, Journal, StoreError, StoreFuture, TaskJournal, now_ms};

enum Message {
    Entry(Write),
    Flush(oneshot::Sender<Result<(), StoreError>>),
    /// A task's end, applied with everything recorded before it (`TaskJournal::finish`).
    Finish(Finish, oneshot::Sender<Result<Finished, StoreError>>),
}

impl Message {
    /// Whether this records the result of `step` itself (not of one of its `foreach` items).
    fn ends(&self, step: &str) -> bool {
        match self {
            Message::Entry(Write::Result { step: s, .. }) => s == step,
            Message::Entry(Write::Other(entry)) => {
                matches!(&**entry, Entry::StepFinished { step: s, .. } if s == step)
            }
            _ => false,
        }
    }
}

/// A task's end: its dependents (each with the steps it needs), as JSON, and how many steps the run has.
struct Finish {
    dependents: String,
    steps: i64,
}

/// Marks a task done, its dependents ready: `archon_finish` (schema.rs, migration 6, as migration 13
/// rewrote it) checks the task's token, tells whether its step is the run's last, and otherwise marks it
/// done and makes ready the dependents whose dependencies are all done.
const FINISH: &str = "SELECT outcome, made FROM archon_finish($1, $2, $3, $4, $5, $6, $7)";

/// An entry as recorded, or one whose record the recording thread encoded already (events, results
/// with small outputs), so that the writer's work is mostly the server's.
enum Write {
    Event {
        text: String,
        at_ms: u64,
    },
    Result {
        step: String,
        status: &'static str,
        text: String,
    },
    Other(Box<Entry>),
}

impl Write {
    fn of(entry: Entry) -> Self {
        match entry {
            Entry::Event { event, at_ms } => Write::Event {
                text: crate::store::convert::event_text(&event),
                at_ms,
            },
            Entry::StepFinished { step, result }
                if result.text.len() <= ENCODED_WHERE_RECORDED
                    && result.steps.is_empty()
                    && result.plan.is_none() =>
            {
                let text = record::encode(&record::StepResult::from(&*result));
                if text.len() > INLINE_OUTPUT_BYTES {
                    return Write::Other(Box::new(Entry::StepFinished { step, result }));
                }
                Write::Result {
                    step,
                    status: result.status.as_str(),
                    text,
                }
            }
            entry => Write::Other(Box::new(entry)),
        }
    }
}

/// The journal of one run, written by a task of its own.
#[derive(Debug)]
pub struct PgJournal {
    sender: Mutex<Option<mpsc::UnboundedSender<Message>>>,
    /// The write that failed (`Journal::failure`).
    broken: Arc<Mutex<Option<StoreError>>>,
    /// Says when the writer has ended, to a thread that waits for it (`Journal::close`).
    ended_here: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Cancelled once the writer has ended, for a task that waits for it (`TaskJournal::end`).
    ended: CancellationToken,
    /// A task's lease guard, told of the commands its step starts.
    guard: Option<Arc<LeaseGuard>>,
}

impl PgJournal {
    pub(super) fn spawn(
        mut writer: Writer,
        cancel: CancellationToken,
        runtime: &tokio::runtime::Runtime,
    ) -> PgJournal {
        let (sender, receiver) = mpsc::unbounded_channel();
        let (done, ended) = std::sync::mpsc::sync_channel(1);
        let broken = Arc::new(Mutex::new(None));
        writer.cancel = cancel.clone();
        writer.shared = broken.clone();
        let ended_writer = CancellationToken::new();
        let guard = writer.guard.clone();
        if let Some(guard) = writer.guard.clone() {
            let what = writer.what();
            let (shared, ended) = (broken.clone(), ended_writer.clone());
            runtime.spawn(guard.watch(what, cancel, shared, ended));
        }
        let journal = PgJournal {
            sender: Mutex::new(Some(sender)),
            broken,
            ended_here: Mutex::new(Some(ended)),
            ended: ended_writer.clone(),
            guard,
        };
        // Cancelled once the writer ends, however it ends (even should its task never run).
        let ended_guard = ended_writer.drop_guard();
        runtime.spawn(async move {
            let _ended = ended_guard;
            writer.run(receiver).await;
            let _ = done.send(());
        });
        journal
    }

    /// Sends nothing more: the writer ends once it has applied what it was sent.
    fn stop_sending(&self) {
        if let Ok(mut sender) = self.sender.lock() {
            sender.take();
        }
    }

    fn send(&self, message: Message) -> bool {
        self.sender
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(|s| s.send(message).is_ok()))
            .unwrap_or(false)
    }
}

impl Drop for PgJournal {
    fn drop(&mut self) {
        Journal::close(self);
    }
}

impl Journal for PgJournal {
    fn record(&self, entry: Entry) {
        if let (Some(guard), Entry::ProcessStarted { pgid, started, .. }) = (&self.guard, &entry)
            && let Ok(mut commands) = guard.commands.lock()
        {
            commands.push((*pgid, *started));
        }
        self.send(Message::Entry(Write::of(entry)));
    }

    fn flush(&self) -> Ack {
        let (done, wait) = oneshot::channel();
        if self.send(Message::Flush(done)) {
            Ack::pending(wait)
        } else {
            Ack::failed(StoreError::new("the run store stopped"))
        }
    }

    /// Stops the writer after it has applied everything sent so far, and releases the run's lease.
    fn close(&self) {
        self.stop_sending();
        // Once the writer has ended (`TaskJournal::end`), there is nothing to wait for.
        if self.ended.is_cancelled() {
            return;
        }
        if let Some(ended) = self.ended_here.lock().ok().and_then(|mut e| e.take()) {
            let _ = super::blocking(move || ended.recv());
        }
    }

    fn failure(&self) -> Option<StoreError> {
        self.broken.lock().ok().and_then(|b| b.clone())
    }
}

impl TaskJournal for PgJournal {
    fn finish(&self, dependents: &[(String, Vec<String>)], steps: usize) -> StoreFuture<Finished> {
        let dependents: Vec<serde_json::Value> = dependents
            .iter()
            .map(|(step, needs)| serde_json::json!({ "step": step, "needs": needs }))
            .collect();
        let finish = Finish {
            dependents: serde_json::Value::Array(dependents).to_string(),
            steps: i64::try_from(steps).unwrap_or(i64::MAX),
        };
        let (done, outcome) = oneshot::channel();
        let sent = self.send(Message::Finish(finish, done));
        Box::pin(async move {
            if !sent {
                return Err(StoreError::new("the run store stopped"));
            }
            outcome
                .await
                .unwrap_or_else(|_| Err(StoreError::new("the run store stopped")))
        })
    }

    fn end(&self) -> BoxFuture<'static, ()> {
        self.stop_sending();
        let ended = self.ended.clone();
        Box::pin(async move { ended.cancelled().await })
    }
}

/// How long before a task's lease lapses its worker stops the step when it could not renew the lease:
/// a fifth of the lease, so that the step's commands are stopped before another worker may take it.
fn lease_margin(lease: std::time::Duration) -> std::time::Duration {
    lease / 5
}

/// The first wait before a failed write of a task's journal is tried again; it doubles up to
/// [`MOST_RETRY`], for as long as the task's lease lasts.
const LEAST_RETRY: std::time::Duration = std::time::Duration::from_millis(25);
const MOST_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Until when a task's step may go on: the lease as last renewed, less [`lease_margin`]. A task of its
/// own watches it, so that the step stops in time even while a write hangs on a lost connection.
#[derive(Debug)]
pub(super) struct LeaseGuard {
    until: Mutex<Instant>,
    /// The step was stopped: the writer writes nothing more.
    expired: std::sync::atomic::AtomicBool,
    /// The process groups the step's commands started (and their leaders' start times): killed when
    /// the lease is lost, even should the worker be too busy (blocked on the lost database) to drop
    /// the step at once.
    commands: Mutex<Vec<(u32, Option<u64>)>>,
}

impl LeaseGuard {
    fn new(until: Instant) -> Self {
        LeaseGuard {
            until: Mutex::new(until),
            expired: Default::default(),
            commands: Mutex::default(),
        }
    }

    fn until(&self) -> Instant {
        self.until.lock().map_or_else(|_| Instant::now(), |u| *u)
    }

    /// The lease was renewed by a write that started at `started`.
    fn renewed(&self, started: Instant, lease: std::time::Duration) {
        if let Ok(mut until) = self.until.lock() {
            *until = (*until).max(started + lease - lease_margin(lease));
        }
    }

    /// Whether the lease was taken or last renewed more than a third of it ago: a write renews it then.
    fn due(&self, lease: std::time::Duration) -> bool {
        self.until().saturating_duration_since(Instant::now()) + lease / 3
            < lease - lease_margin(lease)
    }

    fn expired(&self) -> bool {
        self.expired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Stops the step (through `cancel`, with the journal's failure) once the lease is about to lapse
    /// unrenewed; returns when the writer has ended first.
    async fn watch(
        self: Arc<Self>,
        what: String,
        cancel: CancellationToken,
        shared: Arc<Mutex<Option<StoreError>>>,
        ended: CancellationToken,
    ) {
        loop {
            let until = self.until();
            tokio::select! {
                () = tokio::time::sleep_until(until.into()) => {
                    if self.until() > Instant::now() {
                        continue;
                    }
                    self.expired.store(true, std::sync::atomic::Ordering::SeqCst);
                    if let Ok(mut shared) = shared.lock()
                        && shared.is_none()
                    {
                        *shared = Some(lease_lost(&what));
                    }
                    cancel.cancel();
                    let commands = self.commands.lock().map(|c| c.clone()).unwrap_or_default();
                    for (pgid, started) in commands {
                        if crate::process::leftover_group(pgid, started) {
                            crate::process::kill_group(pgid);
                        }
                    }
                    return;
                }
                () = ended.cancelled() => return,
            }
        }
    }
}

/// Why a task's journal stopped its step: its lease could not be renewed in time.
fn lease_lost(what: &str) -> StoreError {
    StoreError::new(format!(
        "could not renew the lease on {what}: the step was stopped before the lease lapsed"
    ))
}

use super::commit::retryable;

/// A write applied: whether the run was asked to stop, and the rows of each statement (a task's).
struct Written {
    cancel_requested: bool,
    rows: Vec<Vec<tokio_postgres::Row>>,
}

/// What a write changes in the writer, put back when it failed and is tried again.
struct Saved {
    last_attempt: HashMap<String, u32>,
    open: HashMap<String, u32>,
    logged: crate::store::LogBudget,
    released: bool,
}

/// The state of a journal's writer task.
pub(super) struct Writer {
    inner: Arc<Inner>,
    run: String,
    token: String,
    generation: u32,
    /// The highest attempt number recorded per step.
    last_attempt: HashMap<String, u32>,
    /// The attempt of each step still running.
    open: HashMap<String, u32>,
    /// Bytes of each step's and stream's output kept for its current attempt: (attempt, bytes).
    logged: crate::store::LogBudget,
    cancel: CancellationToken,
    shared: Arc<Mutex<Option<StoreError>>>,
    broken: Option<StoreError>,
    /// The run's end was recorded, which released its lease.
    released: bool,
    /// Notified when `archon cancel` (from any host) asks: the writer reads the request at once.
    cancel_asked: Arc<tokio::sync::Notify>,
    /// The step of a submitted run this journal records, as a worker's task: fenced by the task's token
    /// (not the run's owner token), its lease renewed on the task, and the run's event and log numbers
    /// read in each transaction (other workers record the same run).
    task: Option<String>,
    /// How long a lease lasts unless renewed; renewed every third of it.
    lease: std::time::Duration,
    /// A task's: until when its step may go on unless the lease is renewed.
    guard: Option<Arc<LeaseGuard>>,
    /// The transaction under way has sent its commit: should it fail, whether it was kept is unknown.
    committing: bool,
}

/// Where a run's records stand for a task's step: the run's generation, and the highest attempt of the
/// step and of each of its `foreach` items.
pub(super) struct Known {
    pub generation: u32,
    pub last_attempt: HashMap<String, u32>,
}

/// An attempt as it started (`running`); when its process or its end comes in the same transaction,
/// they go in this row rather than in statements of their own (`ATTEMPT_*` are the places of their
/// parameters).
const INSERT_ATTEMPT: &str =
    "INSERT INTO attempts (run_id, step, attempt, generation, fallback, status, started_at, host, pgid,
    pgid_started, error, ended_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
const ATTEMPT_STATUS: usize = 5;
const ATTEMPT_PGID: usize = 8;
const ATTEMPT_PGID_STARTED: usize = 9;
const ATTEMPT_ERROR: usize = 10;
const ATTEMPT_ENDED_AT: usize = 11;
const PROCESS: &str = "UPDATE attempts SET pgid = $4, pgid_started = $5
    WHERE run_id = $1 AND step = $2 AND attempt = $3";
const ENDED: &str = "UPDATE attempts SET status = $4, error = $5, ended_at = $6
    WHERE run_id = $1 AND step = $2 AND attempt = $3";
/// Numbered by the server, one after the run's last: every writer of a run's events and logs holds its
/// row's lock, so the numbers follow the order of the commits.
const INSERT_EVENT: &str = "INSERT INTO events (run_id, seq, at, event, format)
    SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4 FROM events WHERE run_id = $1";
/// The events of one write, in order, in one statement (`$2` their times, `$3` their records).
const INSERT_EVENTS: &str = "INSERT INTO events (run_id, seq, at, event, format)
    SELECT $1, m.last + e.n, e.at, e.event, $4
    FROM (SELECT COALESCE(MAX(seq), 0) AS last FROM events WHERE run_id = $1) m,
        unnest($2::bigint[], $3::text[]) WITH ORDINALITY AS e (at, event, n)";
const INSERT_RESULT: &str = "INSERT INTO results (run_id, step, generation, status, result,
    output_blob, text_blob, finished_at, format) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
    ON CONFLICT (run_id, step) DO UPDATE SET generation = excluded.generation, status = excluded.status,
    result = excluded.result, output_blob = excluded.output_blob, text_blob = excluded.text_blob,
    finished_at = excluded.finished_at, format = excluded.format, ord = excluded.ord";
const INSERT_LOG: &str =
    "INSERT INTO logs (run_id, seq, step, attempt, source, stream, text, at, format)
    SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5, $6, $7, $8 FROM logs WHERE run_id = $1";
const INSERT_CACHE: &str = "INSERT INTO cache (key, workflow, step, run_id, source, result,
    output_blob, text_blob, size, created_at, expires_at, format)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
    ON CONFLICT (key) DO UPDATE SET workflow = excluded.workflow, step = excluded.step,
    run_id = excluded.run_id, source = excluded.source, result = excluded.result,
    output_blob = excluded.output_blob, text_blob = excluded.text_blob, size = excluded.size,
    created_at = excluded.created_at, expires_at = excluded.expires_at, format = excluded.format";
const INSERT_APPROVAL: &str =
    "INSERT INTO approvals (run_id, key, step, request, requested_at, format)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (run_id, key) DO UPDATE SET request = excluded.request, format = excluded.format";
const DECIDED: &str = "UPDATE approvals SET decision = $3, decided_at = $4, format = $5
    WHERE run_id = $1 AND key = $2";
const CHECKPOINT: &str = "INSERT INTO checkpoints (run_id, step, generation, state, at, format)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (run_id, step) DO UPDATE SET generation = excluded.generation, state = excluded.state,
    at = excluded.at, format = excluded.format";
/// Stopped by `archon cancel`, the run is cancelled for good, not interrupted; only an interrupted run
/// has no end time. The run's end also gives it up: nothing is recorded after it.
const RUN_ENDED: &str = "UPDATE runs SET
    status = CASE WHEN $2::text = 'interrupted' AND cancel_requested THEN 'cancelled' ELSE $2 END,
    outputs = $3, error = $4,
    finished_at = CASE WHEN $2 = 'interrupted' AND NOT cancel_requested THEN NULL ELSE $5::bigint END,
    owner_pid = NULL, owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL,
    format = $6 WHERE id = $1";
const RENEW: &str = "UPDATE runs SET lease_until = $2 WHERE id = $1 AND owner_token = $3";
const GIVE_UP: &str = "UPDATE runs SET owner_pid = NULL, owner_host = NULL, lease_until = NULL,
    owner_started = NULL, owner_token = NULL WHERE id = $1 AND owner_token = $2";

fn boxed<T: ToSql + Sync + Send + 'static>(value: T) -> Box<dyn ToSql + Sync + Send> {
    Box::new(value)
}

impl Writer {
    /// Reads where the run's records stand (its generation, attempts, event and log numbers).
    pub(super) async fn start(inner: Arc<Inner>, run: String, token: String) -> Result<Writer> {
        let lease = inner.options.lease;
        Self::begin(inner, run, token, None, lease).await
    }

    /// The journal of one step of a submitted run, fenced by its task's token. `known` is where the
    /// run's records stand for the step, as the worker read them after it claimed the task (nobody else
    /// records the step meanwhile).
    pub(super) async fn start_task(
        inner: Arc<Inner>,
        task: crate::store::Task,
        lease: std::time::Duration,
        known: Known,
    ) -> Result<Writer> {
        Self::begin(
            inner,
            task.run_id,
            task.token,
            Some((task.step, task.leased_at, known)),
            lease,
        )
        .await
    }

    /// With a task (its step, when its lease was taken, and where its records stand), the journal of
    /// that task.
    async fn begin(
        inner: Arc<Inner>,
        run: String,
        token: String,
        task: Option<(String, Instant, Known)>,
        lease: std::time::Duration,
    ) -> Result<Writer> {
        let started = Instant::now();
        let now = ms(now_ms());
        let until = now.saturating_add(lease.as_millis() as i64);
        let Some((
            step,
            leased_at,
            Known {
                generation,
                last_attempt,
            },
        )) = task
        else {
            // The run's generation, with the highest attempt of each step it recorded; no row when the
            // run is gone.
            let client = inner.client().await?;
            let read = client
                .prepare_cached(
                    "SELECT r.generation, a.step, a.attempt FROM runs r LEFT JOIN LATERAL (
                        SELECT step, MAX(attempt) AS attempt FROM attempts
                        WHERE run_id = r.id GROUP BY step) a ON TRUE
                     WHERE r.id = $1",
                )
                .await?;
            let rows = client.query(&read, &[&run]).await?;
            drop(client);
            let generation: i64 = rows
                .first()
                .ok_or_else(|| Failure::Store(super::queries::unknown_run(&run)))?
                .get(0);
            let last_attempt: HashMap<String, u32> = rows
                .iter()
                .filter_map(|r| {
                    Some((
                        r.get::<_, Option<String>>(1)?,
                        u32::try_from(r.get::<_, Option<i64>>(2)?).unwrap_or(0),
                    ))
                })
                .collect();
            return Ok(Self::new(
                inner,
                run,
                token,
                u32::try_from(generation).unwrap_or(0),
                last_attempt,
                lease,
            )
            .await);
        };
        // A task's lease is renewed now (with the other steps' writes, by the committer) unless it was
        // taken less than a third of it ago: a share of a commit at most. The journal's heartbeat renews
        // it a third of it after it was taken, and every write checks it: a step with side effects
        // records its attempt before it starts any, so a task taken over meanwhile starts nothing.
        let fresh = leased_at.elapsed() < lease / 3;
        if !fresh {
            // Nothing to write: the fence renews the lease.
            let unit = Unit {
                fence: Some(Fence {
                    run: run.clone(),
                    step: step.clone(),
                    token: token.clone(),
                    until: Some(until),
                }),
                run: run.clone(),
                ops: Vec::new(),
            };
            match inner.committer().commit(unit).await {
                Reply::Applied { .. } => {}
                Reply::Fenced => {
                    return Err(Failure::Store(StoreError {
                        taken_over: true,
                        ..StoreError::new(format!(
                            "step `{step}` of run `{run}` was taken over by another worker"
                        ))
                    }));
                }
                Reply::Failed { error, .. } => return Err(Failure::Store(error)),
            }
        }
        // The lease was taken or renewed: the step goes on until it lapses, less a margin, unless
        // renewed again.
        let guard = Arc::new(LeaseGuard::new(
            if fresh { leased_at } else { started } + lease - lease_margin(lease),
        ));
        let mut writer = Self::new(inner, run, token, generation, last_attempt, lease).await;
        writer.task = Some(step);
        writer.guard = Some(guard);
        Ok(writer)
    }

    /// A run's journal (a task's gets its step and lease guard after).
    async fn new(
        inner: Arc<Inner>,
        run: String,
        token: String,
        generation: u32,
        last_attempt: HashMap<String, u32>,
        lease: std::time::Duration,
    ) -> Writer {
        let cancel_asked = inner.watch(&run).await;
        Writer {
            cancel_asked,
            inner,
            run,
            token,
            generation,
            last_attempt,
            open: HashMap::new(),
            logged: Default::default(),
            cancel: CancellationToken::new(),
            shared: Arc::default(),
            broken: None,
            released: false,
            task: None,
            lease,
            guard: None,
            committing: false,
        }
    }

    /// What this journal records, for messages: a task's step, or the run.
    fn what(&self) -> String {
        match &self.task {
            Some(step) => format!("step `{step}` of run `{}`", self.run),
            None => format!("run `{}`", self.run),
        }
    }

    fn save(&self) -> Saved {
        Saved {
            last_attempt: self.last_attempt.clone(),
            open: self.open.clone(),
            logged: self.logged.clone(),
            released: self.released,
        }
    }

    fn restore(&mut self, saved: Saved) {
        self.last_attempt = saved.last_attempt;
        self.open = saved.open;
        self.logged = saved.logged;
        self.released = saved.released;
    }

    /// Applies `entries` in one transaction. A task's journal checks its lease with every write (and
    /// renews it with a `heartbeat`, every third of the lease), and tries a write whose connection failed
    /// again (a new connection from the pool) until its lease is about to lapse; then the guard has
    /// stopped the step and nothing more is written.
    async fn write_while_leased(
        &mut self,
        entries: &[Write],
        heartbeat: bool,
        finish: Option<&Finish>,
    ) -> Result<Option<Written>> {
        let Some(guard) = self.guard.clone() else {
            return self.write(entries, heartbeat, finish).await;
        };
        let mut wait = LEAST_RETRY;
        loop {
            if guard.expired() {
                return Err(Failure::Store(self.shared_failure()));
            }
            let saved = self.save();
            let started = Instant::now();
            // Renewed with a heartbeat, or by any write once a third of the lease has gone by without
            // one (a write that waited for the store, say); not by a task's end, which ends the lease.
            let renew = (heartbeat || guard.due(self.lease)) && finish.is_none();
            match self.write(entries, renew, finish).await {
                Ok(outcome) => {
                    if renew && outcome.is_some() {
                        guard.renewed(started, self.lease);
                    }
                    return Ok(outcome);
                }
                Err(e) if !self.committing && retryable(&e) => {
                    self.restore(saved);
                    let left = guard.until().saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Failure::Store(lease_lost(&self.what())));
                    }
                    tokio::time::sleep(wait.min(left)).await;
                    wait = (wait * 2).min(MOST_RETRY);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The failure the guard recorded when it stopped the step.
    fn shared_failure(&self) -> StoreError {
        self.shared
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .unwrap_or_else(|| lease_lost(&self.what()))
    }

    /// Collects messages and commits them together, renewing the lease every third of it.
    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Message>) {
        let heartbeat = self.lease / 3;
        // A task's lease runs from when it was taken (or renewed at the journal's start).
        let mut last_heartbeat = self
            .guard
            .as_ref()
            .and_then(|g| g.until().checked_sub(self.lease - lease_margin(self.lease)))
            .unwrap_or_else(Instant::now);
        let mut pending: VecDeque<Message> = VecDeque::new();
        let mut since: Option<Instant> = None;
        let mut flush = false;
        let mut closed = false;
        let cancel_asked = self.cancel_asked.clone();
        let mut look = false;
        // A task's step recorded its result: what waits is held for the task's end (`finish`), so that
        // the step's last records and its end are one transaction (a flush or the journal's close applies
        // it too; so does a third of the lease gone by, should the worker take that long to get there).
        let mut held = false;
        let task = self.task.clone();
        let take = |message: Message,
                    pending: &mut VecDeque<Message>,
                    since: &mut Option<Instant>,
                    flush: &mut bool,
                    held: &mut bool| {
            if pending.is_empty() {
                *since = Some(Instant::now());
            }
            *flush |= matches!(message, Message::Flush(_) | Message::Finish(..));
            *held |= task.as_deref().is_some_and(|step| message.ends(step));
            pending.push_back(message);
        };
        loop {
            while !closed {
                match receiver.try_recv() {
                    Ok(message) => take(message, &mut pending, &mut since, &mut flush, &mut held),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => closed = true,
                }
            }
            let heartbeat_due = last_heartbeat.elapsed() >= heartbeat;
            // Held records wait for the task's end, or at most a third of the lease.
            let window = if held { heartbeat } else { WINDOW };
            let due = flush
                || closed
                || (!held && pending.len() >= GATHERED)
                || since.is_some_and(|s| s.elapsed() >= window);
            if due && !pending.is_empty() {
                // A task's end closes its batch: it is applied with what was recorded before it.
                let taken = pending
                    .iter()
                    .position(|m| matches!(m, Message::Finish(..)))
                    .map_or(pending.len(), |at| at + 1)
                    .min(BATCH);
                let batch: Vec<Message> = pending.drain(..taken).collect();
                if pending.is_empty() {
                    since = None;
                    flush = false;
                    held = false;
                }
                if heartbeat_due {
                    last_heartbeat = Instant::now();
                }
                self.apply(batch, heartbeat_due).await;
                continue;
            }
            if closed {
                break;
            }
            if heartbeat_due || std::mem::take(&mut look) {
                last_heartbeat = Instant::now();
                self.apply(Vec::new(), true).await;
                continue;
            }
            let until_heartbeat = heartbeat.saturating_sub(last_heartbeat.elapsed());
            let wait = since.map_or(until_heartbeat, |s| {
                window.saturating_sub(s.elapsed()).min(until_heartbeat)
            });
            tokio::select! {
                message = receiver.recv() => match message {
                    Some(message) => take(message, &mut pending, &mut since, &mut flush, &mut held),
                    None => closed = true,
                },
                () = tokio::time::sleep(wait) => {}
                () = cancel_asked.notified() => look = true,
            }
        }
        self.inner.unwatch(&self.run, &cancel_asked);
        // Everything sent has been applied: give the run up, if its end did not.
        if !self.released
            && self.task.is_none()
            && let Ok(client) = self.inner.client().await
        {
            let _ = client.execute(GIVE_UP, &[&self.run, &self.token]).await;
            bump(&client).await;
        }
    }

    async fn apply(&mut self, batch: Vec<Message>, heartbeat: bool) {
        let mut flushes = Vec::new();
        let mut entries = Vec::new();
        let mut finish = None;
        for message in batch {
            match message {
                Message::Entry(entry) => entries.push(entry),
                Message::Flush(done) => flushes.push(done),
                Message::Finish(end, done) => finish = Some((end, done)),
            }
        }
        // What became of the task's end, once known.
        let mut finished = None;
        // Once the run's end is recorded, the run is no longer this process's: nothing more is written.
        if self.broken.is_none()
            && !self.released
            && (!entries.is_empty() || heartbeat || finish.is_some())
        {
            match self
                .write_while_leased(&entries, heartbeat, finish.as_ref().map(|(end, _)| end))
                .await
            {
                Ok(Some(written)) => {
                    if written.cancel_requested {
                        self.cancel.cancel();
                    }
                    if finish.is_some() {
                        finished = Some(Self::finished(&written.rows));
                    }
                }
                Ok(None) => {
                    self.released = true;
                    self.fail(StoreError {
                        taken_over: true,
                        ..StoreError::new(format!(
                            "run `{}` was taken over by another process; this one stopped recording it",
                            self.run
                        ))
                    });
                    // Nothing of it was applied: the task is another worker's now.
                    finished = Some(Ok(Finished::Lost));
                }
                Err(e) => {
                    let error = self.inner.error(e);
                    self.fail(error);
                }
            }
        }
        drop(entries);
        let outcome = match &self.broken {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        };
        if let Some((_, done)) = finish {
            let finished = finished.unwrap_or_else(|| {
                Err(outcome.clone().err().unwrap_or_else(|| {
                    StoreError::new("the run store did not record the step's end")
                }))
            });
            let _ = done.send(finished);
        }
        for done in flushes {
            let _ = done.send(outcome.clone());
        }
    }

    /// How a task finished, from the rows of its `archon_finish` (the last statement of its unit).
    fn finished(rows: &[Vec<tokio_postgres::Row>]) -> Result<Finished, StoreError> {
        let Some(row) = rows.last().and_then(|rows| rows.first()) else {
            return Err(StoreError::new(
                "the run store did not say how a step finished",
            ));
        };
        Ok(match row.get::<_, &str>(0) {
            "lost" => Finished::Lost,
            "last" => Finished::Last,
            _ => Finished::Done(row.get(1)),
        })
    }

    /// Stops recording after a failed write: the failure is the journal's before the run is stopped, so
    /// that the run ends failed with it rather than interrupted.
    fn fail(&mut self, error: StoreError) {
        if let Ok(mut shared) = self.shared.lock() {
            *shared = Some(error.clone());
        }
        self.broken = Some(error);
        self.cancel.cancel();
    }

    /// Applies entries (and a task's end) in one transaction; returns whether a cancel was requested and
    /// the rows of a task's statements, or `None` when the run (or a task's step) is no longer this
    /// process's. `renew`: a task's lease is renewed too. A task's writes go to the store's committer, which
    /// applies them with the writes of the worker's other steps (`commit.rs`).
    async fn write(
        &mut self,
        entries: &[Write],
        renew: bool,
        finish: Option<&Finish>,
    ) -> Result<Option<Written>> {
        self.committing = false;
        let now = ms(now_ms());
        let mut ops = self.ops(entries, now);
        let run = self.run.clone();
        // A task's lease is checked with every write (by its fence), and renewed when asked.
        if let Some(step) = &self.task {
            // The task's end comes last, in the same transaction as the step's last records.
            if let Some(finish) = finish {
                ops.push(Op {
                    sql: FINISH,
                    params: vec![
                        boxed(run.clone()),
                        boxed(step.clone()),
                        boxed(self.token.clone()),
                        boxed(finish.steps),
                        boxed(finish.dependents.clone()),
                        boxed(now),
                        boxed(super::tasks::WORKERS),
                    ],
                });
            }
            let unit = Unit {
                fence: Some(Fence {
                    run: run.clone(),
                    step: step.clone(),
                    token: self.token.clone(),
                    until: renew.then(|| now.saturating_add(self.lease.as_millis() as i64)),
                }),
                run,
                ops,
            };
            return match self.inner.committer().commit(unit).await {
                Reply::Applied {
                    cancel_requested,
                    rows,
                } => Ok(Some(Written {
                    cancel_requested,
                    rows,
                })),
                Reply::Fenced => Ok(None),
                Reply::Failed {
                    error,
                    retryable,
                    committing,
                } => {
                    self.committing = committing;
                    Err(if retryable {
                        Failure::Transient(error)
                    } else {
                        Failure::Store(error)
                    })
                }
            };
        }
        if finish.is_some() {
            return Err(Failure::Store(StoreError::new(
                "only a task's journal ends a task",
            )));
        }
        if renew {
            let until = now.saturating_add(self.lease.as_millis() as i64);
            ops.push(Op {
                sql: RENEW,
                params: vec![boxed(run.clone()), boxed(until), boxed(self.token.clone())],
            });
        }
        let mut client = self.inner.client().await?;
        let tx = client.transaction().await?;
        let fence = tx
            .prepare_cached(
                "SELECT owner_token, cancel_requested FROM runs WHERE id = $1 FOR UPDATE",
            )
            .await?;
        let row = tx.query_opt(&fence, &[&run]).await?;
        let Some(row) = row else {
            return Ok(None);
        };
        if row.get::<_, Option<&str>>(0) != Some(self.token.as_str()) {
            return Ok(None);
        }
        let cancel_requested = row.get::<_, bool>(1);
        // Each statement prepared once per connection; then all of them sent at once, in order.
        let mut statements = Vec::with_capacity(ops.len());
        for op in &ops {
            statements.push(tx.prepare_cached(op.sql).await?);
        }
        futures_util::future::try_join_all(ops.iter().zip(&statements).map(|(op, statement)| {
            tx.execute_raw(
                statement,
                op.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)),
            )
        }))
        .await?;
        self.committing = true;
        tx.commit().await?;
        self.committing = false;
        bump(&client).await;
        Ok(Some(Written {
            cancel_requested,
            rows: Vec::new(),
        }))
    }

    /// The statements that record `entries`, in one transaction: each in order, but for two things
    /// that save the server statements (a step's no-op records are half a dozen rows): the events go
    /// in one statement, last (numbered in the order they came), and an attempt's process and end go
    /// in the row that starts it, when that row is written in the same transaction.
    fn ops(&mut self, entries: &[Write], now: i64) -> Vec<Op> {
        let run = self.run.clone();
        let generation = i64::from(self.generation);
        let format = i64::from(FORMAT_VERSION);
        let mut ops: Vec<Op> = Vec::with_capacity(entries.len() + 1);
        let push =
            |ops: &mut Vec<Op>, sql: &'static str, params: Params| ops.push(Op { sql, params });
        let (mut event_times, mut event_texts): (Vec<i64>, Vec<String>) = (Vec::new(), Vec::new());
        // The attempts started by these entries: the place of each one's statement.
        let mut starts: HashMap<String, usize> = HashMap::new();
        for write in entries {
            let entry = match write {
                Write::Event { text, at_ms } => {
                    event_times.push(ms(*at_ms));
                    event_texts.push(text.clone());
                    continue;
                }
                Write::Result { step, status, text } => {
                    push(
                        &mut ops,
                        INSERT_RESULT,
                        vec![
                            boxed(run.clone()),
                            boxed(step.clone()),
                            boxed(generation),
                            boxed(*status),
                            boxed(text.clone()),
                            boxed(None::<String>),
                            boxed(None::<String>),
                            boxed(now),
                            boxed(format),
                        ],
                    );
                    continue;
                }
                Write::Other(entry) => &**entry,
            };
            match entry {
                Entry::AttemptStarted { step, fallback } => {
                    let attempt = self.last_attempt.entry(step.clone()).or_insert(0);
                    *attempt += 1;
                    self.open.insert(step.clone(), *attempt);
                    starts.insert(step.clone(), ops.len());
                    push(
                        &mut ops,
                        INSERT_ATTEMPT,
                        vec![
                            boxed(run.clone()),
                            boxed(step.clone()),
                            boxed(i64::from(*attempt)),
                            boxed(generation),
                            boxed(*fallback),
                            boxed("running"),
                            boxed(now),
                            boxed(self.inner.options.host.clone()),
                            boxed(None::<i64>),
                            boxed(None::<i64>),
                            boxed(None::<String>),
                            boxed(None::<i64>),
                        ],
                    );
                }
                Entry::ProcessStarted {
                    step,
                    pgid,
                    started,
                } => {
                    if let Some(&at) = starts.get(step) {
                        let params = &mut ops[at].params;
                        params[ATTEMPT_PGID] = boxed(i64::from(*pgid));
                        params[ATTEMPT_PGID_STARTED] = boxed(started.map(ms));
                    } else if let Some(attempt) = self.open.get(step) {
                        push(
                            &mut ops,
                            PROCESS,
                            vec![
                                boxed(run.clone()),
                                boxed(step.clone()),
                                boxed(i64::from(*attempt)),
                                boxed(i64::from(*pgid)),
                                boxed(started.map(ms)),
                            ],
                        );
                    }
                }
                Entry::AttemptEnded {
                    step,
                    status,
                    error,
                } => {
                    let Some(attempt) = self.open.remove(step) else {
                        continue;
                    };
                    if let Some(at) = starts.remove(step) {
                        let params = &mut ops[at].params;
                        params[ATTEMPT_STATUS] = boxed(status.as_str());
                        params[ATTEMPT_ERROR] = boxed(error.clone());
                        params[ATTEMPT_ENDED_AT] = boxed(now);
                    } else {
                        push(
                            &mut ops,
                            ENDED,
                            vec![
                                boxed(run.clone()),
                                boxed(step.clone()),
                                boxed(i64::from(attempt)),
                                boxed(status.as_str()),
                                boxed(error.clone()),
                                boxed(now),
                            ],
                        );
                    }
                }
                Entry::Output {
                    step,
                    source,
                    stream,
                    text,
                    at_ms,
                } => {
                    let attempt = self.last_attempt.get(step).copied().unwrap_or(0);
                    let Some(text) = self.logged.keep(step, attempt, *stream, text) else {
                        continue;
                    };
                    push(
                        &mut ops,
                        INSERT_LOG,
                        vec![
                            boxed(run.clone()),
                            boxed(step.clone()),
                            boxed(i64::from(attempt)),
                            boxed(source.clone()),
                            boxed(stream.as_str()),
                            boxed(text),
                            boxed(ms(*at_ms)),
                            boxed(format),
                        ],
                    );
                }
                // Never here: `Write::of` gives events a variant of their own.
                Entry::Event { .. } => {}
                Entry::StepFinished { step, result } => {
                    let (text, output_blob, text_blob) =
                        put_result(&mut |sql, params| push(&mut ops, sql, params), result);
                    push(
                        &mut ops,
                        INSERT_RESULT,
                        vec![
                            boxed(run.clone()),
                            boxed(step.clone()),
                            boxed(generation),
                            boxed(result.status.as_str()),
                            boxed(text),
                            boxed(output_blob),
                            boxed(text_blob),
                            boxed(now),
                            boxed(format),
                        ],
                    );
                }
                Entry::Cached {
                    key,
                    workflow,
                    step,
                    source,
                    result,
                    ttl_ms,
                } => {
                    let (record, output_blob, text_blob) =
                        put_result(&mut |sql, params| push(&mut ops, sql, params), result);
                    let size = result.text.len()
                        + match output_blob {
                            Some(_) => 0,
                            None => json_text(&result.output).len(),
                        };
                    push(
                        &mut ops,
                        INSERT_CACHE,
                        vec![
                            boxed(key.clone()),
                            boxed(workflow.clone()),
                            boxed(step.clone()),
                            boxed(run.clone()),
                            boxed(source.clone()),
                            boxed(record),
                            boxed(output_blob),
                            boxed(text_blob),
                            boxed(size as i64),
                            boxed(now),
                            boxed(ttl_ms.map(|ttl| {
                                now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX))
                            })),
                            boxed(format),
                        ],
                    );
                }
                Entry::ApprovalRequested(request) => {
                    let text = record::encode(&record::ApprovalRequest::from(request));
                    push(
                        &mut ops,
                        INSERT_APPROVAL,
                        vec![
                            boxed(run.clone()),
                            boxed(request.key.clone()),
                            boxed(request.step.clone()),
                            boxed(text),
                            boxed(now),
                            boxed(format),
                        ],
                    );
                }
                Entry::ApprovalDecided { key, decision } => {
                    let text = record::encode(&record::ApprovalDecision::from(decision));
                    push(
                        &mut ops,
                        DECIDED,
                        vec![
                            boxed(run.clone()),
                            boxed(key.clone()),
                            boxed(text),
                            boxed(now),
                            boxed(format),
                        ],
                    );
                }
                Entry::Checkpoint { step, state } => {
                    push(
                        &mut ops,
                        CHECKPOINT,
                        vec![
                            boxed(run.clone()),
                            boxed(step.clone()),
                            boxed(generation),
                            boxed(json_text(state)),
                            boxed(now),
                            boxed(format),
                        ],
                    );
                }
                Entry::RunEnded {
                    status,
                    outputs,
                    error,
                } => {
                    // The run's end also gives it up: nothing is recorded after it.
                    self.released = true;
                    push(
                        &mut ops,
                        RUN_ENDED,
                        vec![
                            boxed(run.clone()),
                            boxed(status.as_str()),
                            boxed(record::encode(outputs)),
                            boxed(error.clone()),
                            boxed(now),
                            boxed(format),
                        ],
                    );
                }
            }
        }
        match event_texts.len() {
            0 => {}
            1 => push(
                &mut ops,
                INSERT_EVENT,
                vec![
                    boxed(run),
                    boxed(event_times[0]),
                    boxed(event_texts.swap_remove(0)),
                    boxed(format),
                ],
            ),
            _ => push(
                &mut ops,
                INSERT_EVENTS,
                vec![
                    boxed(run),
                    boxed(event_times),
                    boxed(event_texts),
                    boxed(format),
                ],
            ),
        }
        ops
    }
}

/// Stores `bytes` as a blob when longer than [`INLINE_OUTPUT_BYTES`], named by their SHA-256, once:
/// pushes the statement, and gives the name.
fn put_blob(push: &mut impl FnMut(&'static str, Params), bytes: Vec<u8>) -> Option<String> {
    if bytes.len() <= INLINE_OUTPUT_BYTES {
        return None;
    }
    let mut measured = Measured::default();
    // Writing to a hasher fails never.
    let _ = std::io::Write::write_all(&mut measured, &bytes);
    let name = measured.name();
    push(
        "INSERT INTO blobs (hash, data) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING",
        vec![boxed(name.clone()), boxed(bytes)],
    );
    Some(name)
}

/// A result as a record, its output and text over [`INLINE_OUTPUT_BYTES`] stored in `blobs` and left out
/// of the record: the record and the names of the blobs.
fn put_result(
    push: &mut impl FnMut(&'static str, Params),
    result: &StepResult,
) -> (String, Option<String>, Option<String>) {
    let output = serde_json::to_vec(&result.output).unwrap_or_else(|_| b"null".to_vec());
    let output_blob = put_blob(push, output);
    let text_blob = put_blob(push, result.text.as_bytes().to_vec());
    let record = record::encode(&record::StepResult::of(
        result,
        match output_blob {
            Some(_) => serde_json::Value::Null,
            None => result.output.clone(),
        },
        match text_blob {
            Some(_) => String::new(),
            None => result.text.clone(),
        },
    ));
    (record, output_blob, text_blob)
}
