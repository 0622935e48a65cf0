//! The embedded run store: one SQLite database (WAL mode, `synchronous=FULL`) in the state directory.
//!
//! Queries use a connection of their own; each running run has a writer thread with another connection that
//! applies journal entries in order, in batches (one transaction each), renews the run's lease and notices
//! `archon cancel`. A damaged or foreign database is reported, never reset.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde_json::{Map, Value as Json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{
    Ack, ApprovalRecord, AttemptRecord, CacheEntry, CacheFilter, CacheSummary, Entry, Firing,
    FiringFilter, FiringKind, FiringOutcome, Journal, LogChunk, NewRun, Owner, Pruned, RunCursor,
    RunFilter, RunPage, RunQuery, RunState, RunStore, RunSummary, StoreError, StoredRun,
    TriggerMark, now_ms, spec_hash,
};
use crate::record::{self, FORMAT_VERSION, RecordError, Row};
use crate::report::{ApprovalDecision, ApprovalRequest, StepResult};

/// The database file inside the state directory.
pub const DATABASE: &str = "state.db";
/// Marks the database as Archon's (`PRAGMA application_id`): "ARCN".
const APPLICATION_ID: i64 = 0x4152_434E;
/// Step outputs whose JSON text is larger than this are stored once, by SHA-256, in `blobs`.
pub const INLINE_OUTPUT_BYTES: usize = 64 * 1024;
/// How long a run's lease lasts unless renewed, and how often its owner renews it.
pub const LEASE: Duration = Duration::from_secs(15);
const HEARTBEAT: Duration = Duration::from_secs(3);
/// How long a connection waits for another process's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// The schema, one migration per version (`PRAGMA user_version` is the number applied).
const MIGRATIONS: &[&str] = &[
    r"
CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    spec_path TEXT NOT NULL,
    spec_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    inputs TEXT NOT NULL,
    workdir TEXT NOT NULL,
    max_parallel INTEGER NOT NULL,
    started_at INTEGER NOT NULL,
    finished_at INTEGER,
    outputs TEXT,
    error TEXT,
    generation INTEGER NOT NULL DEFAULT 0,
    owner_pid INTEGER,
    owner_host TEXT,
    owner_started INTEGER,
    owner_token TEXT,
    lease_until INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE files (
    run_id TEXT NOT NULL REFERENCES runs(id),
    position INTEGER NOT NULL,
    path TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (run_id, position)
);
CREATE TABLE attempts (
    run_id TEXT NOT NULL REFERENCES runs(id),
    step TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    fallback INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    started_at INTEGER NOT NULL,
    ended_at INTEGER,
    pgid INTEGER,
    pgid_started INTEGER,
    PRIMARY KEY (run_id, step, attempt)
);
CREATE TABLE results (
    run_id TEXT NOT NULL REFERENCES runs(id),
    step TEXT NOT NULL,
    generation INTEGER NOT NULL,
    status TEXT NOT NULL,
    result TEXT NOT NULL,
    output_blob TEXT REFERENCES blobs(hash),
    finished_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE blobs (
    hash TEXT PRIMARY KEY,
    data BLOB NOT NULL
);
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    at INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX runs_by_start ON runs(started_at);
",
    r"
CREATE TABLE checkpoints (
    run_id TEXT NOT NULL REFERENCES runs(id),
    step TEXT NOT NULL,
    generation INTEGER NOT NULL,
    state TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (run_id, step)
);
",
    r"
CREATE TABLE approvals (
    run_id TEXT NOT NULL REFERENCES runs(id),
    key TEXT NOT NULL,
    step TEXT NOT NULL,
    request TEXT NOT NULL,
    requested_at INTEGER NOT NULL,
    decision TEXT,
    decided_at INTEGER,
    PRIMARY KEY (run_id, key)
);
",
    // The format of the records each row holds (`record::FORMAT_VERSION`); rows written before are 0.
    r"
ALTER TABLE runs ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
ALTER TABLE approvals ADD COLUMN format INTEGER NOT NULL DEFAULT 0;
",
    // A step's large text (over `INLINE_OUTPUT_BYTES`) is kept apart too, as raw UTF-8; when it is its
    // output's JSON text (a `foreach` step's), both name the same blob.
    r"
ALTER TABLE results ADD COLUMN text_blob TEXT REFERENCES blobs(hash);
",
    // What the commands of each attempt wrote, as they wrote it (`archon logs`).
    r"
CREATE TABLE logs (
    run_id TEXT NOT NULL REFERENCES runs(id),
    seq INTEGER NOT NULL,
    step TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    source TEXT NOT NULL,
    stream TEXT NOT NULL,
    text TEXT NOT NULL,
    at INTEGER NOT NULL,
    format INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX logs_by_step ON logs(run_id, step, attempt);
",
    // Results of steps with `cache`, by the SHA-256 of what they depend on (`archon cache`). Large
    // outputs and texts live in `blobs`, as a run's results do.
    // (Written compactly: the schema's text is read each time the store opens.)
    r"
CREATE TABLE cache (key TEXT PRIMARY KEY, workflow TEXT NOT NULL, step TEXT NOT NULL, run_id TEXT NOT NULL,
source TEXT NOT NULL, result TEXT NOT NULL, output_blob TEXT, text_blob TEXT, size INTEGER NOT NULL,
created_at INTEGER NOT NULL, expires_at INTEGER, format INTEGER NOT NULL);
",
    // Trigger firings (`archon serve`), one per slot, recorded before their run exists (so without a
    // foreign key: `prune` deletes a pruned run's firings itself); and per trigger, since when a server
    // watched it and its last slot, which outlive pruned firings.
    r"
CREATE TABLE firings (workflow TEXT NOT NULL, trigger_name TEXT NOT NULL, slot TEXT NOT NULL, kind TEXT NOT NULL,
slot_at INTEGER NOT NULL, fired_at INTEGER NOT NULL, run_id TEXT, outcome TEXT NOT NULL, reason TEXT,
inputs TEXT NOT NULL, format INTEGER NOT NULL, PRIMARY KEY (workflow, trigger_name, slot));
CREATE INDEX firings_by_run ON firings(run_id);
CREATE TABLE triggers (workflow TEXT NOT NULL, trigger_name TEXT NOT NULL, armed_at INTEGER NOT NULL,
last_slot_at INTEGER, PRIMARY KEY (workflow, trigger_name));
",
];

/// The version of the store's schema this archon writes (`PRAGMA user_version`): one per migration.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// Most bytes of one stream of one attempt's commands kept for `archon logs`; what follows is counted
/// out with a note.
pub const MAX_LOG_BYTES: usize = 1024 * 1024;

/// Runs kept in an SQLite database under a state directory.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// For a store that can only be read where it is (a read-only folder without the `-shm` file SQLite
    /// needs beside a write-ahead log): the store's folder, and the private copy that is read instead.
    read_only: Option<(PathBuf, tempfile::TempDir)>,
    /// The ownership tokens of the runs this process owns, by run id. Every write of a run's journal
    /// checks that the run still carries its token, so a process that lost a run stops writing to it.
    tokens: Mutex<HashMap<String, String>>,
    /// Firings waiting to be recorded, written together (group commit: one synced transaction for all
    /// the firings that came while the one before was written).
    firings: FiringQueue,
}

/// Firings being recorded by several callers at once: whoever finds no write under way takes every
/// firing waiting (its own among them) and writes them in one transaction; the others wait for their
/// result or for their turn to write.
#[derive(Debug, Default)]
struct FiringQueue {
    state: Mutex<QueueState>,
    written: Condvar,
}

#[derive(Debug, Default)]
struct QueueState {
    waiting: Vec<(u64, Firing)>,
    writing: bool,
    results: HashMap<u64, Result<bool, StoreError>>,
    next: u64,
}

/// Most firings one transaction writes.
const FIRINGS_PER_COMMIT: usize = 256;

impl SqliteStore {
    /// Opens (or creates) the store in `dir`, checking that the database is Archon's, of a known version,
    /// and intact.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        match Self::open_in_place(dir) {
            Err(e) if dir.join(DATABASE).is_file() && !writable(dir) => {
                Self::open_copy(dir).map_err(|_| e)
            }
            opened => opened,
        }
    }

    /// Opens a store in a folder this process cannot write, whose database SQLite cannot open there (it
    /// would have to create the `-shm` file of the write-ahead log): the database and its log are copied to
    /// a private folder and read from there, and every change is refused.
    fn open_copy(dir: &Path) -> Result<Self, StoreError> {
        let copy = tempfile::Builder::new()
            .prefix("archon-read-only-")
            .tempdir()
            .map_err(|e| {
                StoreError::new(format!("cannot make a folder to read the store from: {e}"))
            })?;
        for name in [DATABASE.to_owned(), format!("{DATABASE}-wal")] {
            let from = dir.join(&name);
            if from.is_file() {
                std::fs::copy(&from, copy.path().join(&name)).map_err(|e| {
                    StoreError::new(format!("cannot read `{}`: {e}", from.display()))
                })?;
            }
        }
        let mut store = Self::open_in_place(copy.path())?;
        store
            .with(|c| c.execute_batch("PRAGMA query_only = ON;"))
            .map_err(|e| StoreError::new(e.message))?;
        store.read_only = Some((dir.to_path_buf(), copy));
        Ok(store)
    }

    /// Refuses a change to a store that can only be read.
    fn changeable(&self) -> Result<(), StoreError> {
        match &self.read_only {
            None => Ok(()),
            Some((dir, _)) => Err(StoreError::new(format!(
                "the run store `{}` is read-only: its runs can be listed and shown, not changed",
                dir.display()
            ))
            .with_hint("run the command where the state directory can be written, or point `--state-dir` at a copy")),
        }
    }

    fn open_in_place(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::new(format!(
                "cannot create state directory `{}`: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(DATABASE);
        // SQLite takes a log it cannot read for an empty one, and the next write overwrites it: a damaged
        // log is refused before SQLite opens it.
        check_log(&path)?;
        // The file is checked before anything is set on it: a file that is not a sound Archon database
        // is left exactly as it is.
        let mut conn = Connection::open(&path).map_err(|e| sql_error(&path, &e))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| sql_error(&path, &e))?;
        check(&conn, &path)?;
        configure(&conn, &path)?;
        if migrate(&mut conn, &path)? {
            // A new or migrated schema goes into the database file at once, so that the file alone (a copy
            // without its log) is recognised as an Archon store and never taken for a new one. Not waiting
            // for other processes: one that holds an older snapshot leaves the rest to a later checkpoint.
            let _ = checkpoint(&conn, "PASSIVE");
        }
        // This connection creates and claims runs. Its commits go to the log without a sync of their own:
        // the journal's next synced commit, which comes before any side effect of the run (and at its end),
        // puts them on disk with everything else, since the log is one file written in order.
        conn.execute_batch("PRAGMA synchronous = NORMAL;")
            .map_err(|e| sql_error(&path, &e))?;
        Ok(SqliteStore {
            path,
            conn: Mutex::new(conn),
            read_only: None,
            tokens: Mutex::new(HashMap::new()),
            firings: FiringQueue::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn load_with(&self, id: &str, blobs: Blobs) -> Result<StoredRun, StoreError> {
        let mut damage = Vec::new();
        let run = self.with(|conn| {
            // One read transaction: a consistent snapshot even while the run's writer commits.
            let conn = conn.transaction()?;
            load_run(&conn, id, &mut damage, blobs)
        })?;
        if !damage.is_empty() {
            return Err(damaged_rows(&self.path, &damage));
        }
        run.ok_or_else(|| unknown_run(id))
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| StoreError::new("the run store is unusable after an earlier failure"))?;
        f(&mut conn).map_err(|e| sql_error(&self.path, &e))
    }

    /// A fresh ownership token for run `id`, remembered for its journal.
    fn new_token(&self, id: &str) -> String {
        let token = format!(
            "{}-{}-{:016x}",
            std::process::id(),
            now_ms(),
            fastrand::u64(..)
        );
        if let Ok(mut tokens) = self.tokens.lock() {
            tokens.insert(id.to_owned(), token.clone());
        }
        token
    }

    /// Writes firings in one transaction synced to disk; says which were new.
    fn write_firings(&self, firings: &[&Firing]) -> Result<Vec<bool>, StoreError> {
        self.with(|conn| {
            conn.execute_batch("PRAGMA synchronous = FULL;")?;
            let written = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let mut new = Vec::with_capacity(firings.len());
                for f in firings {
                    let inserted = tx.execute(
                        "INSERT OR IGNORE INTO firings (workflow, trigger_name, slot, kind, slot_at,
                            fired_at, run_id, outcome, reason, inputs, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                        params![
                            f.workflow,
                            f.trigger,
                            f.slot,
                            f.kind.as_str(),
                            f.slot_at.min(i64::MAX as u64) as i64,
                            f.fired_at.min(i64::MAX as u64) as i64,
                            f.run_id,
                            f.outcome.as_str(),
                            f.reason,
                            record::encode(&f.inputs),
                            FORMAT_VERSION,
                        ],
                    )? == 1;
                    if inserted && f.kind == FiringKind::Cron {
                        tx.execute(
                            "INSERT INTO triggers (workflow, trigger_name, armed_at, last_slot_at)
                             VALUES (?1, ?2, ?3, ?4)
                             ON CONFLICT (workflow, trigger_name) DO UPDATE
                                SET last_slot_at = max(COALESCE(last_slot_at, 0), excluded.last_slot_at)",
                            params![
                                f.workflow,
                                f.trigger,
                                f.fired_at.min(i64::MAX as u64) as i64,
                                f.slot_at.min(i64::MAX as u64) as i64,
                            ],
                        )?;
                    }
                    new.push(inserted);
                }
                tx.commit()?;
                Ok(new)
            })();
            conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
            written
        })
    }

    fn forget_token(&self, id: &str) -> Option<String> {
        self.tokens.lock().ok().and_then(|mut t| t.remove(id))
    }

    /// Records a decision on the pending calls `select` picks of a run waiting for approval; returns the
    /// requests it decided.
    fn decide_pending(
        &self,
        id: &str,
        select: impl Fn(&ApprovalRequest) -> bool,
        decision: &ApprovalDecision,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        self.changeable()?;
        let now = now_ms();
        let pending = super::pending_approvals(self.load(id)?, id, now, select)?;
        let text = record::encode(&record::ApprovalDecision::from(decision));
        let now = now as i64;
        let still_waiting = self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // A process may have taken the run up since it was read: then its writer owns the trail.
            let status: String =
                tx.query_row("SELECT status FROM runs WHERE id = ?1", [id], |r| r.get(0))?;
            if status != RunState::WaitingApproval.as_str() {
                return Ok(false);
            }
            // The decision is in the run's trail too, after what the run recorded before it paused.
            let mut seq: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1",
                [id],
                |r| r.get(0),
            )?;
            for request in &pending {
                let changed = tx.execute(
                    "UPDATE approvals SET decision = ?3, decided_at = ?4, format = ?5
                     WHERE run_id = ?1 AND key = ?2 AND decision IS NULL",
                    params![id, request.key, text, now, FORMAT_VERSION],
                )?;
                if changed == 0 {
                    continue;
                }
                seq += 1;
                let event = super::convert::event_text(&crate::report::RunEvent::ApprovalDecided {
                    step: request.step.clone(),
                    tool: request.tool.clone(),
                    approved: decision.approved,
                    by: decision.by.clone(),
                    reason: decision.reason.clone(),
                });
                tx.execute(
                    "INSERT INTO events (run_id, seq, at, event, format) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![id, seq, now, event, FORMAT_VERSION],
                )?;
            }
            tx.commit().map(|()| true)
        })?;
        if !still_waiting {
            let mut error = StoreError::new(format!(
                "run `{id}` is no longer waiting for approval: a process took it up"
            ));
            error.unknown_run = true;
            return Err(error);
        }
        Ok(pending)
    }
}

impl RunStore for SqliteStore {
    fn location(&self) -> Option<PathBuf> {
        match &self.read_only {
            Some((dir, _)) => Some(dir.clone()),
            None => self.path.parent().map(Path::to_path_buf),
        }
    }

    /// Records a new run, owned by this process, with its spec files and inputs.
    fn create_run(&self, run: &NewRun) -> Result<(), StoreError> {
        self.changeable()?;
        let hash = spec_hash(&run.files);
        let inputs = record::encode(&run.inputs);
        let now = now_ms();
        let token = self.new_token(&run.id);
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let first: bool = tx.query_row("SELECT NOT EXISTS (SELECT 1 FROM runs)", [], |r| r.get(0))?;
            tx.execute(
                "INSERT INTO runs (id, workflow, spec_path, spec_hash, status, inputs, workdir, max_parallel,
                    started_at, owner_pid, owner_host, lease_until, owner_started, owner_token, format)
                 VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                params![
                    run.id,
                    run.workflow,
                    run.spec_path,
                    hash,
                    inputs,
                    run.workdir,
                    run.max_parallel as i64,
                    now as i64,
                    std::process::id(),
                    host(),
                    (now + LEASE.as_millis() as u64) as i64,
                    my_start_time(),
                    token,
                    FORMAT_VERSION,
                ],
            )?;
            for (position, (path, text)) in run.files.iter().enumerate() {
                tx.execute(
                    "INSERT INTO files (run_id, position, path, text) VALUES (?1, ?2, ?3, ?4)",
                    params![run.id, position as i64, path, text],
                )?;
            }
            tx.commit()?;
            if first {
                // Once the store holds a run, so does its database file: a store whose log was lost is then
                // never taken for a new, empty one. (The run is recorded whether or not this succeeds.)
                let _ = checkpoint(conn, "PASSIVE");
            }
            Ok(())
        })
    }

    fn claim(&self, id: &str, allowed: &[RunState]) -> Result<RunState, StoreError> {
        self.changeable()?;
        let token = self.new_token(id);
        let outcome = self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let row = tx
                .query_row(
                    "SELECT status, owner_pid, owner_host, lease_until, owner_started FROM runs WHERE id = ?1",
                    [id],
                    |r| {
                        Ok((
                            r.get::<_, String>(0)?,
                            owner_of(r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?),
                        ))
                    },
                )
                .optional()?;
            let Some((status, owner)) = row else {
                return Ok(Err(Claim::Unknown));
            };
            if let Some(owner) = owner.filter(is_alive) {
                return Ok(Err(Claim::Owned(owner)));
            }
            let state = effective_state(
                RunState::parse(&status).unwrap_or(RunState::Interrupted),
                None,
            );
            if !allowed.contains(&state) {
                return Ok(Err(Claim::State(state)));
            }
            tx.execute(
                "UPDATE runs SET status = 'running', owner_pid = ?2, owner_host = ?3, lease_until = ?4,
                    owner_started = ?5, owner_token = ?6, finished_at = NULL, cancel_requested = 0
                 WHERE id = ?1",
                params![
                    id,
                    std::process::id(),
                    host(),
                    (now_ms() + LEASE.as_millis() as u64) as i64,
                    my_start_time(),
                    token,
                ],
            )?;
            tx.commit()?;
            Ok(Ok(state))
        })?;
        match outcome {
            Ok(state) => Ok(state),
            Err(claim) => {
                self.forget_token(id);
                Err(match claim {
                    Claim::Unknown => unknown_run(id),
                    Claim::Owned(owner) => StoreError::new(format!(
                        "run `{id}` is being run by process `{}` on `{}`",
                        owner.pid, owner.host
                    ))
                    .with_hint("wait for it to finish, or stop it with `archon cancel`"),
                    Claim::State(state) => {
                        StoreError::new(format!("run `{id}` is `{}`", state.as_str()))
                    }
                })
            }
        }
    }

    fn release(&self, id: &str, status: RunState) -> Result<(), StoreError> {
        let token = self.forget_token(id);
        self.with(|conn| {
            conn.execute(
                "UPDATE runs SET status = ?2, owner_pid = NULL, owner_host = NULL, lease_until = NULL,
                    owner_started = NULL, owner_token = NULL
                 WHERE id = ?1 AND owner_token = ?3",
                params![id, status.as_str(), token],
            )
            .map(drop)
        })
    }

    /// Starts a new generation of a run (for `retry --from`): forgets the final results of `steps`, so
    /// they run again as new attempts; earlier attempts stay.
    fn forget_results(&self, id: &str, steps: &[String]) -> Result<u32, StoreError> {
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "UPDATE runs SET generation = generation + 1, outputs = NULL, error = NULL WHERE id = ?1",
                [id],
            )?;
            for step in steps {
                tx.execute(
                    "DELETE FROM results WHERE run_id = ?1
                        AND (step = ?2 OR substr(step, 1, length(?2) + 1) = ?2 || '[')",
                    params![id, step],
                )?;
            }
            let generation: u32 =
                tx.query_row("SELECT generation FROM runs WHERE id = ?1", [id], |r| {
                    r.get(0)
                })?;
            tx.commit()?;
            Ok(generation)
        })
    }

    /// Records a person's decision on the pending approvals of a paused run (those of `step` only, when
    /// given); returns the requests decided.
    fn decide(
        &self,
        id: &str,
        step: Option<&str>,
        decision: &ApprovalDecision,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        self.decide_pending(id, |r| super::asked_within(r, step), decision)
    }

    fn decide_call(
        &self,
        id: &str,
        key: &str,
        decision: &ApprovalDecision,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        Ok(self
            .decide_pending(id, |r| r.key == key, decision)?
            .into_iter()
            .next())
    }

    /// Asks the run to stop for good: a live owner notices within a few seconds (and is sent SIGTERM when
    /// it runs on this host); a run nobody owns is marked cancelled at once.
    fn cancel(&self, id: &str) -> Result<RunState, StoreError> {
        self.changeable()?;
        let run = self.load(id)?;
        match run.status {
            RunState::Succeeded | RunState::Failed | RunState::Cancelled => Ok(run.status),
            RunState::Running => {
                self.with(|conn| {
                    conn.execute("UPDATE runs SET cancel_requested = 1 WHERE id = ?1", [id])
                })?;
                // A process that serves several runs (`archon mcp serve`) is not signalled: its journal
                // reads the request at its next heartbeat and stops only this run.
                if let Some(owner) = run.owner.filter(|o| o.host == host())
                    && !serving_mark(&self.path, owner.pid).exists()
                {
                    let _ = rustix::process::Pid::from_raw(owner.pid as i32).map(|pid| {
                        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
                    });
                }
                Ok(RunState::Running)
            }
            RunState::Interrupted | RunState::WaitingApproval => {
                // Only if nobody took the run over since it was read.
                let changed = self.with(|conn| {
                    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                    let owner = tx.query_row(
                        "SELECT owner_pid, owner_host, lease_until, owner_started FROM runs WHERE id = ?1",
                        [id],
                        |r| Ok(owner_of(r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                    )?;
                    if owner.as_ref().is_some_and(is_alive) {
                        return Ok(false);
                    }
                    tx.execute(
                        "UPDATE runs SET status = 'cancelled', finished_at = ?2, owner_pid = NULL,
                            owner_host = NULL, lease_until = NULL, owner_started = NULL, owner_token = NULL
                         WHERE id = ?1",
                        params![id, now_ms() as i64],
                    )?;
                    tx.commit()?;
                    Ok(true)
                })?;
                if changed {
                    Ok(RunState::Cancelled)
                } else {
                    self.cancel(id)
                }
            }
        }
    }

    /// The runs in the store, newest first.
    fn list(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.list_where(&RunFilter::default())
    }

    /// The runs `filter` selects, newest first: by start time through the `runs_by_start` index, the
    /// workflow and the state checked row by row, stopping at the limit.
    fn list_where(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {SUMMARY} FROM runs WHERE started_at >= ?1 AND (?2 IS NULL OR workflow = ?2)
                 ORDER BY started_at DESC, id DESC"
            ))?;
            let since = filter.since.map_or(0, |t| t.min(i64::MAX as u64) as i64);
            let mut rows = stmt.query(params![since, filter.workflow])?;
            let mut runs = Vec::new();
            while let Some(row) = rows.next()? {
                if filter.limit.is_some_and(|limit| runs.len() >= limit) {
                    break;
                }
                let run = summary(row)?;
                // The state a person sees (a `running` run whose owner died is interrupted).
                if filter.selects(&run) {
                    runs.push(run);
                }
            }
            Ok(runs)
        })
    }

    /// One page of the runs `query` selects: by start time through the `runs_by_start` index, the
    /// workflow and the stored state checked by SQLite, the state a person sees (a `running` run whose
    /// owner died is interrupted) checked row by row for the few `running` rows. The total is counted
    /// the same way, in the same read transaction.
    fn page(&self, query: &RunQuery) -> Result<RunPage, StoreError> {
        let since = query.since.map_or(0, |t| t.min(i64::MAX as u64) as i64);
        let until = query
            .until
            .map_or(i64::MAX, |t| t.min(i64::MAX as u64) as i64);
        let states = (!query.status.is_empty()).then(|| {
            Json::Array(
                query
                    .status
                    .iter()
                    .map(|s| Json::String(s.as_str().to_owned()))
                    .collect(),
            )
            .to_string()
        });
        let (after_start, after_id) = match &query.after {
            Some(c) => (
                Some(c.started_at.min(i64::MAX as u64) as i64),
                Some(c.id.clone()),
            ),
            None => (None, None),
        };
        self.with(|conn| {
            let tx = conn.transaction()?;
            let settled: i64 = tx
                .prepare_cached(
                    "SELECT COUNT(*) FROM runs WHERE started_at >= ?1 AND started_at < ?2
                     AND (?3 IS NULL OR workflow = ?3) AND status != 'running'
                     AND (?4 IS NULL OR status IN (SELECT value FROM json_each(?4)))",
                )?
                .query_row(params![since, until, query.workflow, states], |r| r.get(0))?;
            let mut running = 0;
            {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {SUMMARY} FROM runs WHERE status = 'running' AND started_at >= ?1
                     AND started_at < ?2 AND (?3 IS NULL OR workflow = ?3)"
                ))?;
                let mut rows = stmt.query(params![since, until, query.workflow])?;
                while let Some(row) = rows.next()? {
                    if query.selects(&summary(row)?) {
                        running += 1;
                    }
                }
            }
            let mut runs = Vec::new();
            let mut next = None;
            {
                let mut stmt = tx.prepare_cached(&format!(
                    "SELECT {SUMMARY} FROM runs WHERE started_at >= ?1 AND started_at < ?2
                     AND (?3 IS NULL OR workflow = ?3)
                     AND (?4 IS NULL OR status = 'running' OR status IN (SELECT value FROM json_each(?4)))
                     AND (?5 IS NULL OR started_at < ?5 OR (started_at = ?5 AND id < ?6))
                     ORDER BY started_at DESC, id DESC"
                ))?;
                let mut rows = stmt.query(params![
                    since,
                    until,
                    query.workflow,
                    states,
                    after_start,
                    after_id
                ])?;
                while let Some(row) = rows.next()? {
                    let run = summary(row)?;
                    if !query.selects(&run) {
                        continue;
                    }
                    if runs.len() == query.limit {
                        next = runs.last().map(|last: &RunSummary| RunCursor {
                            started_at: last.started_at,
                            id: last.id.clone(),
                        });
                        break;
                    }
                    runs.push(run);
                }
            }
            Ok(RunPage {
                runs,
                total: settled as usize + running,
                next,
            })
        })
    }

    fn summary(&self, id: &str) -> Result<Option<RunSummary>, StoreError> {
        self.with(|conn| {
            conn.prepare_cached(&format!("SELECT {SUMMARY} FROM runs WHERE id = ?1"))?
                .query_row([id], summary)
                .optional()
        })
    }

    fn changed_since(&self, since: u64) -> Result<Vec<RunSummary>, StoreError> {
        let since = since.min(i64::MAX as u64) as i64;
        self.with(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {SUMMARY} FROM runs WHERE started_at >= ?1 OR finished_at >= ?1
                 OR status IN ('running', 'waiting_approval')
                 ORDER BY started_at DESC, id DESC"
            ))?
            .query_map([since], summary)?
            .collect()
        })
    }

    /// `PRAGMA data_version`: it changes when another connection commits.
    fn changes(&self) -> Result<Option<u64>, StoreError> {
        self.with(|conn| {
            conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
                .map(|v| Some(v as u64))
        })
    }

    fn last_event(&self, id: &str) -> Result<i64, StoreError> {
        self.with(|conn| {
            conn.prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1")?
                .query_row([id], |r| r.get(0))
        })
    }

    fn logs_after(&self, id: &str, after: i64, limit: usize) -> Result<Vec<LogChunk>, StoreError> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, step, attempt, source, stream, text, at FROM logs
                 WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let rows = stmt.query_map(
                params![id, after, limit.min(i64::MAX as usize) as i64],
                log_chunk,
            )?;
            rows.collect()
        })
    }

    /// The events numbered after `after`, decoded as `events` decodes them. A row that does not decode
    /// fails it, naming every such row.
    fn events_after(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Json)>, StoreError> {
        let mut damage = Vec::new();
        let events = self.with(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, at, format, event FROM events WHERE run_id = ?1 AND seq > ?2
                 ORDER BY seq LIMIT ?3",
            )?;
            let mut rows = stmt.query(params![id, after, limit.min(i64::MAX as usize) as i64])?;
            let mut events = Vec::new();
            while let Some(r) = rows.next()? {
                let seq: i64 = r.get(0)?;
                let at: i64 = r.get(1)?;
                let row = seq.to_string();
                let at_row = Row {
                    run: id,
                    table: "events",
                    row: &row,
                };
                match record::decode::<record::Event>(at_row, r.get(2)?, bytes(r.get_ref(3)?)) {
                    Ok(event) => events.push((seq, event_json(event, at))),
                    Err(e) => damage.push(e),
                }
            }
            Ok(events)
        })?;
        if !damage.is_empty() {
            return Err(damaged_rows(&self.path, &damage));
        }
        Ok(events)
    }

    /// The runs whose id starts with `prefix`: a range of the primary key's index, never a scan.
    fn with_prefix(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<RunSummary>, usize), StoreError> {
        // Every id that starts with `prefix` sorts between it and it followed by the last code point.
        let end = format!("{prefix}\u{10FFFF}");
        self.with(|conn| {
            let count: i64 = conn
                .prepare_cached(PREFIX_COUNT)?
                .query_row(params![prefix, end], |r| r.get(0))?;
            let runs = conn
                .prepare_cached(&format!(
                    "SELECT {SUMMARY} FROM runs WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT ?3"
                ))?
                .query_map(params![prefix, end, limit as i64], summary)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((runs, count as usize))
        })
    }

    /// Deletes finished runs that ended before `finished_before` with every row that belongs to them (in
    /// each table whose foreign key names `runs`) and the blobs only they used, in one transaction.
    fn prune(&self, finished_before: u64, dry_run: bool) -> Result<Pruned, StoreError> {
        self.changeable()?;
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let runs = tx
                .prepare(&format!(
                    "SELECT {SUMMARY} FROM runs
                     WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at < ?1
                     ORDER BY started_at, id"
                ))?
                .query_map([finished_before.min(i64::MAX as u64) as i64], summary)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut bytes = if runs.is_empty() {
                0
            } else {
                prune_runs(&tx, &runs)?
            };
            let (firing_bytes, firings) = prune_firings(&tx, finished_before)?;
            bytes += firing_bytes;
            if bytes == 0 && firings == 0 {
                return Ok(Pruned {
                    runs,
                    bytes: 0,
                    firings: 0,
                    dry_run,
                });
            }
            if dry_run {
                tx.rollback()?;
            } else {
                tx.commit()?;
            }
            Ok(Pruned {
                runs,
                bytes,
                firings,
                dry_run,
            })
        })
    }

    /// Everything about one run. A row that does not decode fails the load, naming every such row.
    fn load(&self, id: &str) -> Result<StoredRun, StoreError> {
        self.load_with(id, Blobs::Read)
    }

    fn load_brief(&self, id: &str) -> Result<StoredRun, StoreError> {
        self.load_with(id, Blobs::Skip)
    }

    /// The spec files a run was started with: path (relative to the spec's directory) and text.
    fn files(&self, id: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.with(|conn| {
            let mut stmt =
                conn.prepare("SELECT path, text FROM files WHERE run_id = ?1 ORDER BY position")?;
            stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
    }

    /// Replaces the spec files of a run (resuming with `--allow-changed-spec`).
    fn replace_files(&self, id: &str, files: &[(String, String)]) -> Result<(), StoreError> {
        let hash = spec_hash(files);
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM files WHERE run_id = ?1", [id])?;
            for (position, (path, text)) in files.iter().enumerate() {
                tx.execute(
                    "INSERT INTO files (run_id, position, path, text) VALUES (?1, ?2, ?3, ?4)",
                    params![id, position as i64, path, text],
                )?;
            }
            tx.execute(
                "UPDATE runs SET spec_hash = ?2 WHERE id = ?1",
                params![id, hash],
            )?;
            tx.commit()
        })
    }

    fn logs(&self, id: &str, after: i64) -> Result<Vec<LogChunk>, StoreError> {
        self.with(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, step, attempt, source, stream, text, at FROM logs
                 WHERE run_id = ?1 AND seq > ?2 ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![id, after], log_chunk)?;
            rows.collect()
        })
    }

    /// The run's event log, in order. A row that does not decode fails it, naming every such row.
    fn events(&self, id: &str) -> Result<Vec<Json>, StoreError> {
        Ok(self
            .events_after(id, 0, usize::MAX)?
            .into_iter()
            .map(|(_, event)| event)
            .collect())
    }

    /// Checks every page (`PRAGMA quick_check`) and decodes every row of every run.
    fn check(&self) -> Result<Vec<String>, StoreError> {
        let mut problems = Vec::new();
        let mut damage = Vec::new();
        self.with(|conn| {
            let conn = conn.transaction()?;
            let mut stmt = conn.prepare("PRAGMA quick_check")?;
            let lines = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>);
            match lines {
                Ok(lines) => problems.extend(lines.into_iter().filter(|l| l != "ok")),
                Err(e) => problems.push(e.to_string().to_lowercase()),
            }
            if !problems.is_empty() {
                // Rows on damaged pages may not read at all: the pages are the news.
                return Ok(());
            }
            let ids = conn
                .prepare("SELECT id FROM runs ORDER BY started_at, id")?
                .query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            // Every cached result decodes too.
            let mut stmt = conn.prepare(
                "SELECT c.run_id, c.key, c.format, c.result, c.output_blob, b.rowid, c.text_blob, t.rowid
                 FROM cache c LEFT JOIN blobs b ON b.hash = c.output_blob
                    LEFT JOIN blobs t ON t.hash = c.text_blob
                 ORDER BY c.created_at, c.key",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let (run, key): (String, String) = (r.get(0)?, r.get(1)?);
                let at = Row {
                    run: &run,
                    table: "cache",
                    row: &key,
                };
                if let Err(e) = decode_result(&conn, at, r, 2)? {
                    damage.push(e);
                }
            }
            drop(rows);
            drop(stmt);
            // And every firing.
            let mut stmt = conn.prepare(&format!(
                "SELECT {FIRING}, inputs FROM firings ORDER BY fired_at, rowid"
            ))?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                if let Err(e) = firing(r, true)? {
                    damage.push(e);
                }
            }
            drop(rows);
            drop(stmt);
            for id in ids {
                load_run(&conn, &id, &mut damage, Blobs::Read)?;
                let mut stmt = conn.prepare_cached(
                    "SELECT seq, format, event FROM events WHERE run_id = ?1 ORDER BY seq",
                )?;
                let mut rows = stmt.query([&id])?;
                while let Some(r) = rows.next()? {
                    let row = r.get::<_, i64>(0)?.to_string();
                    let at = Row {
                        run: &id,
                        table: "events",
                        row: &row,
                    };
                    if let Err(e) =
                        record::decode::<record::Event>(at, r.get(1)?, bytes(r.get_ref(2)?))
                    {
                        damage.push(e);
                    }
                }
            }
            Ok(())
        })?;
        problems.extend(damage.iter().map(ToString::to_string));
        Ok(problems)
    }

    /// The cached results of `workflows` that have not expired at `now`, read in one query.
    fn cache_entries(&self, workflows: &[String], now: u64) -> Result<Vec<CacheEntry>, StoreError> {
        let mut damage = Vec::new();
        let entries = self.with(|conn| {
            let conn = conn.transaction()?;
            let mut entries = Vec::new();
            let mut stmt = conn.prepare_cached(
                "SELECT c.key, c.workflow, c.step, c.run_id, c.source, c.created_at, c.expires_at,
                    c.size, c.format, c.result, c.output_blob, b.rowid, c.text_blob, t.rowid
                 FROM cache c LEFT JOIN blobs b ON b.hash = c.output_blob
                    LEFT JOIN blobs t ON t.hash = c.text_blob
                 WHERE c.workflow = ?1 AND (c.expires_at IS NULL OR c.expires_at > ?2)",
            )?;
            for workflow in workflows {
                let mut rows = stmt.query(params![workflow, now as i64])?;
                while let Some(r) = rows.next()? {
                    let summary = cache_summary(r)?;
                    let at = Row {
                        run: &summary.run_id,
                        table: "cache",
                        row: &summary.key,
                    };
                    match decode_result(&conn, at, r, 8)? {
                        Ok(result) => entries.push(CacheEntry {
                            summary,
                            result: StepResult::from(result),
                        }),
                        Err(e) => damage.push(e),
                    }
                }
            }
            Ok(entries)
        })?;
        if !damage.is_empty() {
            return Err(damaged_rows(&self.path, &damage).with_hint(
                "`archon cache clear` removes the cached results; runs go on without them",
            ));
        }
        Ok(entries)
    }

    fn cache_list(&self) -> Result<Vec<CacheSummary>, StoreError> {
        self.with(|conn| {
            let mut stmt = conn.prepare(
                "SELECT key, workflow, step, run_id, source, created_at, expires_at, size
                 FROM cache ORDER BY created_at DESC, key",
            )?;
            let rows = stmt.query_map([], cache_summary)?;
            rows.collect()
        })
    }

    fn cache_clear(&self, filter: &CacheFilter, now: u64) -> Result<usize, StoreError> {
        self.changeable()?;
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let removed = tx.execute(
                "DELETE FROM cache WHERE (?1 IS NULL OR workflow = ?1) AND (?2 IS NULL OR step = ?2)
                    AND (?3 = 0 OR (expires_at IS NOT NULL AND expires_at <= ?4))",
                params![filter.workflow, filter.step, filter.expired, now as i64],
            )?;
            // Blobs no result or cached result names any more go with them.
            tx.execute(
                "DELETE FROM blobs WHERE hash NOT IN (SELECT output_blob FROM results WHERE output_blob IS NOT NULL)
                    AND hash NOT IN (SELECT text_blob FROM results WHERE text_blob IS NOT NULL)
                    AND hash NOT IN (SELECT output_blob FROM cache WHERE output_blob IS NOT NULL)
                    AND hash NOT IN (SELECT text_blob FROM cache WHERE text_blob IS NOT NULL)",
                [],
            )?;
            tx.commit()?;
            Ok(removed)
        })
    }

    /// Records a firing, synced to disk before it returns, in one transaction with the firings other
    /// threads record at the same time (this connection's other commits are not synced: the run's
    /// journal syncs them before anything acts on them).
    fn record_firing(&self, firing: &Firing) -> Result<bool, StoreError> {
        self.changeable()?;
        let gone = || StoreError::new("the run store is unusable after an earlier failure");
        let queue = &self.firings;
        let mut state = queue.state.lock().map_err(|_| gone())?;
        let ticket = state.next;
        state.next += 1;
        state.waiting.push((ticket, firing.clone()));
        loop {
            if let Some(result) = state.results.remove(&ticket) {
                return result;
            }
            if state.writing {
                state = queue.written.wait(state).map_err(|_| gone())?;
                continue;
            }
            state.writing = true;
            let take = state.waiting.len().min(FIRINGS_PER_COMMIT);
            let batch: Vec<(u64, Firing)> = state.waiting.drain(..take).collect();
            drop(state);
            let firings: Vec<&Firing> = batch.iter().map(|(_, f)| f).collect();
            let written = self.write_firings(&firings);
            state = queue.state.lock().map_err(|_| gone())?;
            state.writing = false;
            for (index, (ticket, _)) in batch.iter().enumerate() {
                let result = match &written {
                    Ok(new) => Ok(new[index]),
                    Err(e) => Err(e.clone()),
                };
                state.results.insert(*ticket, result);
            }
            queue.written.notify_all();
        }
    }

    fn last_firing(&self, workflow: &str, trigger: &str) -> Result<Option<Firing>, StoreError> {
        let found = self.with(|conn| {
            conn.query_row(
                &format!(
                    "SELECT {FIRING} FROM firings WHERE workflow = ?1 AND trigger_name = ?2
                     ORDER BY slot_at DESC, rowid DESC LIMIT 1"
                ),
                params![workflow, trigger],
                |r| firing(r, false),
            )
            .optional()
        })?;
        found
            .transpose()
            .map_err(|e| damaged_rows(&self.path, &[e]))
    }

    fn firings(&self, filter: &FiringFilter) -> Result<Vec<Firing>, StoreError> {
        let rows = self.with(|conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {FIRING} FROM firings
                 WHERE (?1 IS NULL OR workflow = ?1) AND (?2 IS NULL OR trigger_name = ?2)
                 ORDER BY fired_at DESC, rowid DESC LIMIT ?3"
            ))?;
            let limit = filter.limit.map_or(-1, |l| l.min(i64::MAX as usize) as i64);
            stmt.query_map(params![filter.workflow, filter.trigger, limit], |r| {
                firing(r, false)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        collect_firings(&self.path, rows)
    }

    fn unstarted_firings(&self) -> Result<Vec<Firing>, StoreError> {
        let rows = self.with(|conn| {
            let mut stmt = conn.prepare(&format!(
                "SELECT {FIRING}, inputs FROM firings f
                 WHERE f.run_id IS NOT NULL AND f.outcome IN ('started', 'queued')
                    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = f.run_id)
                 ORDER BY f.fired_at, f.rowid"
            ))?;
            stmt.query_map([], |r| firing(r, true))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })?;
        collect_firings(&self.path, rows)
    }

    fn skip_unstarted_firing(&self, run_id: &str, reason: &str) -> Result<bool, StoreError> {
        self.changeable()?;
        self.with(|conn| {
            conn.execute_batch("PRAGMA synchronous = FULL;")?;
            let changed = conn.execute(
                "UPDATE firings SET outcome = 'skipped', reason = ?2, run_id = NULL
                 WHERE run_id = ?1 AND outcome IN ('started', 'queued')
                    AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = ?1)",
                params![run_id, reason],
            );
            conn.execute_batch("PRAGMA synchronous = NORMAL;")?;
            Ok(changed? > 0)
        })
    }

    fn arm_trigger(
        &self,
        workflow: &str,
        trigger: &str,
        now: u64,
    ) -> Result<TriggerMark, StoreError> {
        self.changeable()?;
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT OR IGNORE INTO triggers (workflow, trigger_name, armed_at) VALUES (?1, ?2, ?3)",
                params![workflow, trigger, now.min(i64::MAX as u64) as i64],
            )?;
            let mark = tx.query_row(
                "SELECT armed_at, last_slot_at FROM triggers WHERE workflow = ?1 AND trigger_name = ?2",
                params![workflow, trigger],
                |r| {
                    Ok(TriggerMark {
                        armed_at: r.get::<_, i64>(0)?.max(0) as u64,
                        last_slot_at: r.get::<_, Option<i64>>(1)?.map(|t| t.max(0) as u64),
                    })
                },
            )?;
            tx.commit()?;
            Ok(mark)
        })
    }

    /// Starts the journal of a run this process owns: a writer thread that applies entries in order,
    /// renews the lease, and cancels `cancel` when `archon cancel` asks.
    fn journal(&self, id: &str, cancel: CancellationToken) -> Result<Arc<dyn Journal>, StoreError> {
        let token = self
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(id).cloned())
            .ok_or_else(|| {
                StoreError::new(format!("this process does not own run `{id}`"))
                    .with_hint("a run is recorded by the process that created or claimed it")
            })?;
        let conn = connect(&self.path)?;
        // Every row the writer adds belongs to its run, which exists (each transaction first checks that
        // it still owns it): checking the foreign key of each row again costs a lookup per row.
        conn.execute_batch("PRAGMA foreign_keys = OFF;")
            .map_err(|e| sql_error(&self.path, &e))?;
        let (generation, next_attempt, seq) = self.with(|c| {
            let generation: u32 =
                c.query_row("SELECT generation FROM runs WHERE id = ?1", [id], |r| {
                    r.get(0)
                })?;
            let mut stmt = c.prepare(
                "SELECT step, MAX(attempt) FROM attempts WHERE run_id = ?1 GROUP BY step",
            )?;
            let next: HashMap<String, u32> = stmt
                .query_map([id], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let seq: i64 = c.query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM events WHERE run_id = ?1",
                [id],
                |r| r.get(0),
            )?;
            let log_seq: i64 = c.query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM logs WHERE run_id = ?1",
                [id],
                |r| r.get(0),
            )?;
            Ok((generation, next, (seq, log_seq)))
        })?;
        let (seq, log_seq) = seq;
        let queue = Arc::new(Queue::default());
        let writer = Writer {
            conn,
            path: self.path.clone(),
            run: id.to_owned(),
            token,
            generation,
            last_attempt: next_attempt,
            open: HashMap::new(),
            seq,
            log_seq,
            logged: Default::default(),
            cancel,
            broken: None,
            released: false,
        };
        let thread = {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name("archon-journal".to_owned())
                .spawn(move || writer.run(&queue))
                .map_err(|e| StoreError::new(format!("cannot start the journal writer: {e}")))?
        };
        Ok(Arc::new(SqliteJournal {
            queue,
            thread: Mutex::new(Some(thread)),
        }))
    }
}

/// The journal of one run, written by a thread of its own.
#[derive(Debug)]
pub struct SqliteJournal {
    queue: Arc<Queue>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

enum Message {
    Entry(Write),
    Flush(oneshot::Sender<Result<(), StoreError>>),
}

/// What the writer applies: an entry as recorded, or one whose record the thread that recorded it encoded
/// already (events, and step results of small outputs), so that the writer's work, which every run's end
/// waits for, is mostly SQLite's.
enum Write {
    /// An attempt started.
    Started { step: String, fallback: bool },
    /// Its command started.
    Process {
        step: String,
        pgid: u32,
        started: Option<u64>,
    },
    /// It ended.
    Ended {
        step: String,
        status: crate::report::StepStatus,
        error: Option<String>,
    },
    /// An event's record, and when it happened.
    Event { text: String, at_ms: u64 },
    /// A step's final result and its record.
    Result {
        step: String,
        status: &'static str,
        text: String,
    },
    /// Anything else, as recorded (boxed: the queue holds many of the others).
    Other(Box<Entry>),
}

/// Step results whose text is at most this long are encoded by the thread that records them; larger ones
/// (which may need a blob, and take time to encode) by the writer.
pub(super) const ENCODED_WHERE_RECORDED: usize = 16 * 1024;

impl Write {
    fn of(entry: Entry) -> Self {
        match entry {
            Entry::AttemptStarted { step, fallback } => Write::Started { step, fallback },
            Entry::ProcessStarted {
                step,
                pgid,
                started,
            } => Write::Process {
                step,
                pgid,
                started,
            },
            Entry::AttemptEnded {
                step,
                status,
                error,
            } => Write::Ended {
                step,
                status,
                error,
            },
            Entry::Event { event, at_ms } => Write::Event {
                text: super::convert::event_text(&event),
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

/// What the run recorded and its writer has not taken yet. Recording only pushes under a lock: the writer
/// is woken when something waits for it (a flush), when a batch is full, when the first record of a
/// batch arrives (so that it commits within `WINDOW`), and when the journal closes, never once per record.
#[derive(Debug, Default)]
struct Queue {
    pending: Mutex<Pending>,
    wake: Condvar,
}

#[derive(Default)]
struct Pending {
    messages: std::collections::VecDeque<Message>,
    /// When the oldest of `messages` arrived.
    since: Option<Instant>,
    /// A flush is among `messages`.
    flush: bool,
    /// Nothing more will be recorded.
    closed: bool,
    /// The writer is waiting on `Queue::wake`.
    asleep: bool,
    /// The write that failed (`Journal::failure`).
    broken: Option<StoreError>,
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("messages", &self.messages.len())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl Queue {
    /// Adds a message; false once the journal is closed (or its writer gone).
    fn push(&self, message: Message) -> bool {
        let Ok(mut pending) = self.pending.lock() else {
            return false;
        };
        if pending.closed {
            return false;
        }
        let first = pending.since.is_none();
        if first {
            pending.since = Some(Instant::now());
        }
        let flush = matches!(message, Message::Flush(_));
        pending.flush |= flush;
        pending.messages.push_back(message);
        if pending.asleep && (first || flush || pending.messages.len() == GATHERED) {
            pending.asleep = false;
            self.wake.notify_one();
        }
        true
    }

    fn close(&self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.closed = true;
            self.wake.notify_one();
        }
    }
}

/// What the writer's wait for the queue gave.
enum Taken {
    /// Messages to commit now (at most `BATCH` per transaction), and whether the lease is due.
    Batch(Vec<Message>, bool),
    /// The lease is due and nothing is pending: the run is idle.
    Heartbeat,
    /// The journal closed and everything was taken.
    Closed,
}

impl Drop for SqliteJournal {
    fn drop(&mut self) {
        Journal::close(self);
    }
}

impl Journal for SqliteJournal {
    fn record(&self, entry: Entry) {
        self.queue.push(Message::Entry(Write::of(entry)));
    }

    /// Stops the writer after it has applied everything sent so far, and releases the run's lease.
    fn close(&self) {
        self.queue.close();
        if let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = thread.join();
        }
    }

    fn failure(&self) -> Option<StoreError> {
        self.queue
            .pending
            .lock()
            .ok()
            .and_then(|pending| pending.broken.clone())
    }

    fn flush(&self) -> Ack {
        let (done, wait) = oneshot::channel();
        if self.queue.push(Message::Flush(done)) {
            Ack::pending(wait)
        } else {
            Ack::failed(StoreError::new("the run store stopped"))
        }
    }
}

/// Waits until the queue has something to commit (a flush, a full batch, a batch whose window has
/// passed, the journal closing) or the lease is due, and takes it.
fn take(queue: &Queue, last_heartbeat: &mut Instant) -> Taken {
    let mut pending = queue
        .pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let heartbeat = last_heartbeat.elapsed() >= HEARTBEAT;
        let due = pending.flush
            || pending.closed
            || pending.messages.len() >= GATHERED
            || pending.since.is_some_and(|since| since.elapsed() >= WINDOW);
        if due && !pending.messages.is_empty() {
            // At most `BATCH` go now; the rest stay, due at once.
            let taken = pending.messages.len().min(BATCH);
            let batch: Vec<Message> = pending.messages.drain(..taken).collect();
            if pending.messages.is_empty() {
                pending.since = None;
                pending.flush = false;
            }
            if heartbeat {
                *last_heartbeat = Instant::now();
            }
            return Taken::Batch(batch, heartbeat);
        }
        if pending.closed {
            return Taken::Closed;
        }
        if heartbeat {
            *last_heartbeat = Instant::now();
            return Taken::Heartbeat;
        }
        let until_heartbeat = HEARTBEAT.saturating_sub(last_heartbeat.elapsed());
        let wait = pending.since.map_or(until_heartbeat, |since| {
            WINDOW.saturating_sub(since.elapsed()).min(until_heartbeat)
        });
        pending.asleep = true;
        pending = queue
            .wake
            .wait_timeout(pending, wait)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
        pending.asleep = false;
    }
}

/// Closes the queue when the writer thread ends, however it ends: what is still queued is dropped, so
/// that a flush waiting for it fails instead of waiting forever.
struct Closing<'a>(&'a Queue);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let mut pending = self
            .0
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.closed = true;
        pending.messages.clear();
    }
}

/// The state of a journal writer thread.
struct Writer {
    conn: Connection,
    path: PathBuf,
    run: String,
    /// The run's ownership token: every transaction first checks the run still carries it.
    token: String,
    generation: u32,
    /// The highest attempt number recorded per step.
    last_attempt: HashMap<String, u32>,
    /// The last `seq` of the run's `logs`.
    log_seq: i64,
    /// Bytes of each step's and stream's output kept for its current attempt: (attempt, bytes).
    logged: super::LogBudget,
    /// The attempt of each step still running.
    open: HashMap<String, u32>,
    seq: i64,
    cancel: CancellationToken,
    /// The first write failure: every later flush reports it.
    broken: Option<StoreError>,
    /// The run's end was recorded, which released its lease.
    released: bool,
}

/// How many pages of the log not yet in the database file make the writer checkpoint when idle or done
/// (512 KiB of 4 KiB pages; SQLite's own checkpoint at 1,000 pages still runs during long runs).
const CHECKPOINT_FRAMES: u32 = 128;

/// Most messages applied in one transaction.
pub(super) const BATCH: usize = 4096;
/// Messages that make a batch due without waiting for `WINDOW`.
pub(super) const GATHERED: usize = 256;
/// Longest a record that nothing waits for stays uncommitted: short enough that a process watching the
/// store (`archon serve`, which polls it every 20 ms) shows a run's events within 100 ms.
pub(super) const WINDOW: Duration = Duration::from_millis(50);

impl Writer {
    /// Collects messages and commits them together: at once when something waits for them (a flush), and
    /// otherwise when `BATCH` have gathered or the oldest has waited `WINDOW`, so that a run of steps that
    /// are safe to repeat costs a commit per batch, not per step.
    fn run(mut self, queue: &Queue) {
        // However this thread ends, whoever waits for a flush learns that the store stopped.
        let _closing = Closing(queue);
        let mut last_heartbeat = Instant::now();
        loop {
            match take(queue, &mut last_heartbeat) {
                Taken::Batch(batch, heartbeat) => self.apply(batch, heartbeat, queue),
                Taken::Heartbeat => {
                    self.apply(Vec::new(), true, queue);
                    self.checkpoint_when_due();
                }
                Taken::Closed => break,
            }
        }
        // Everything sent has been applied: give the run up, if its end did not.
        if !self.released {
            let _ = self.conn.execute(
                "UPDATE runs SET owner_pid = NULL, owner_host = NULL, lease_until = NULL, owner_started = NULL,
                    owner_token = NULL
                 WHERE id = ?1 AND owner_token = ?2",
                params![self.run, self.token],
            );
        }
        self.checkpoint_when_due();
    }

    /// Moves the log into the database file once it holds `CHECKPOINT_FRAMES` pages that are not there
    /// yet: from this thread, when the run is idle or over, so that no step waits for it, and so that the
    /// log stays short (opening reads all of it) and the database file holds nearly all of the history.
    ///
    /// `TRUNCATE` empties the log too: a log that was only copied would be read whole again (and counted
    /// as not copied) by the next process that opens the store, and would grow with every run. It does
    /// not wait: when another process is reading or writing, it copies what it can, and a later
    /// checkpoint does the rest.
    fn checkpoint_when_due(&self) {
        if pending_frames(&self.path) >= CHECKPOINT_FRAMES {
            let _ = self.conn.busy_timeout(Duration::ZERO);
            let _ = checkpoint(&self.conn, "TRUNCATE");
            let _ = self.conn.busy_timeout(BUSY_TIMEOUT);
        }
    }

    fn apply(&mut self, batch: Vec<Message>, heartbeat: bool, queue: &Queue) {
        let mut flushes = Vec::new();
        let mut entries = Vec::new();
        for message in batch {
            match message {
                Message::Entry(entry) => entries.push(entry),
                Message::Flush(done) => flushes.push(done),
            }
        }
        // Once the run's end is recorded, the run is no longer this process's: nothing more is written,
        // not even a heartbeat (which would find the lease given up and take that for a takeover).
        if self.broken.is_none() && !self.released {
            let outcome = self.write(&entries, heartbeat);
            match outcome {
                Ok(Some(cancel_requested)) => {
                    if cancel_requested {
                        self.cancel.cancel();
                    }
                }
                Ok(None) => {
                    // Another process took the run over: stop, and write nothing more.
                    self.released = true;
                    self.fail(
                        StoreError {
                            taken_over: true,
                            ..StoreError::new(format!(
                                "run `{}` was taken over by another process; this one stopped recording it",
                                self.run
                            ))
                        },
                        queue,
                    );
                }
                Err(e) => self.fail(sql_error(&self.path, &e), queue),
            }
        }
        // The records let go of the results they share with the run before anyone waiting is told, so
        // that the run takes its results back without a copy.
        drop(entries);
        let outcome = match &self.broken {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        };
        for done in flushes {
            let _ = done.send(outcome.clone());
        }
    }

    /// Stops recording after a failed write: the journal reports the failure (`Journal::failure`) before
    /// the run is stopped, so that the run ends failed with it rather than interrupted.
    fn fail(&mut self, error: StoreError, queue: &Queue) {
        queue
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .broken = Some(error.clone());
        self.broken = Some(error);
        self.cancel.cancel();
    }

    /// Applies entries in one transaction; returns whether a cancel was requested, or `None` when the run
    /// no longer carries this process's token.
    fn write(&mut self, entries: &[Write], heartbeat: bool) -> rusqlite::Result<Option<bool>> {
        let now = now_ms() as i64;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let owner: Option<String> = tx.query_row(
            "SELECT owner_token FROM runs WHERE id = ?1",
            [&self.run],
            |r| r.get(0),
        )?;
        if owner.as_deref() != Some(self.token.as_str()) {
            return Ok(None);
        }
        let merged = merge_attempts(entries);
        let mut insert_attempt = None;
        let mut insert_event = None;
        let mut insert_result = None;
        for (index, write) in entries.iter().enumerate() {
            let entry = match write {
                Write::Other(entry) => &**entry,
                Write::Started { step, fallback } => {
                    let attempt = self.last_attempt.entry(step.clone()).or_insert(0);
                    *attempt += 1;
                    let (process, end) = merged.attempt(index);
                    let (pgid, started) = match process.map(|i| &entries[i]) {
                        Some(Write::Process { pgid, started, .. }) => {
                            (Some(*pgid), started.map(|s| s as i64))
                        }
                        _ => (None, None),
                    };
                    let (status, error, ended) = match end.map(|i| &entries[i]) {
                        Some(Write::Ended { status, error, .. }) => {
                            (status.as_str(), error.as_deref(), Some(now))
                        }
                        _ => {
                            self.open.insert(step.clone(), *attempt);
                            ("running", None, None)
                        }
                    };
                    statement(
                        &tx,
                        &mut insert_attempt,
                        "INSERT INTO attempts (run_id, step, attempt, generation, fallback, status, error,
                            started_at, ended_at, pgid, pgid_started)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    )?
                    .execute(params![
                        self.run,
                        step,
                        *attempt,
                        self.generation,
                        fallback,
                        status,
                        error,
                        now,
                        ended,
                        pgid,
                        started
                    ])?;
                    continue;
                }
                // Written with their attempt, which started in this batch.
                Write::Process { .. } | Write::Ended { .. } if merged.folded(index) => continue,
                Write::Process {
                    step,
                    pgid,
                    started,
                } => {
                    if let Some(attempt) = self.open.get(step) {
                        tx.prepare_cached(
                            "UPDATE attempts SET pgid = ?4, pgid_started = ?5
                             WHERE run_id = ?1 AND step = ?2 AND attempt = ?3",
                        )?
                        .execute(params![
                            self.run,
                            step,
                            attempt,
                            pgid,
                            started.map(|s| s as i64)
                        ])?;
                    }
                    continue;
                }
                Write::Ended {
                    step,
                    status,
                    error,
                } => {
                    if let Some(attempt) = self.open.remove(step) {
                        tx.prepare_cached(
                            "UPDATE attempts SET status = ?4, error = ?5, ended_at = ?6
                             WHERE run_id = ?1 AND step = ?2 AND attempt = ?3",
                        )?
                        .execute(params![
                            self.run,
                            step,
                            attempt,
                            status.as_str(),
                            error,
                            now
                        ])?;
                    }
                    continue;
                }
                Write::Event { text, at_ms } => {
                    self.seq += 1;
                    statement(
                        &tx,
                        &mut insert_event,
                        "INSERT INTO events (run_id, seq, at, event, format) VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?
                    .execute(params![self.run, self.seq, *at_ms as i64, text, FORMAT_VERSION])?;
                    continue;
                }
                Write::Result { step, status, text } => {
                    statement(
                        &tx,
                        &mut insert_result,
                        "INSERT OR REPLACE INTO results (run_id, step, generation, status, result, output_blob,
                            finished_at, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7)",
                    )?
                    .execute(params![
                        self.run,
                        step,
                        self.generation,
                        status,
                        text,
                        now,
                        FORMAT_VERSION
                    ])?;
                    continue;
                }
            };
            match entry {
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
                    self.log_seq += 1;
                    tx.prepare_cached(
                        "INSERT INTO logs (run_id, seq, step, attempt, source, stream, text, at, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )?
                    .execute(params![
                        self.run,
                        self.log_seq,
                        step,
                        attempt,
                        source,
                        stream.as_str(),
                        text,
                        *at_ms as i64,
                        FORMAT_VERSION
                    ])?;
                }
                // Never here: `Write::of` gives each of these a variant of its own.
                Entry::AttemptStarted { .. }
                | Entry::ProcessStarted { .. }
                | Entry::AttemptEnded { .. }
                | Entry::Event { .. } => {}
                Entry::StepFinished { step, result } => {
                    // A large output, and a large text, go to `blobs` once each (the same blob when
                    // the text is the output's JSON), streamed into it from the result.
                    let (text, output_blob, text_blob) = put_result(&tx, result)?;
                    // Rare (large outputs, composite and planned steps): not kept in a slot, whose
                    // statement is the one for results encoded where they were recorded.
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO results (run_id, step, generation, status, result, output_blob,
                            text_blob, finished_at, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )?
                    .execute(params![
                        self.run,
                        step,
                        self.generation,
                        result.status.as_str(),
                        text,
                        output_blob,
                        text_blob,
                        now,
                        FORMAT_VERSION
                    ])?;
                }
                Entry::Cached {
                    key,
                    workflow,
                    step,
                    source,
                    result,
                    ttl_ms,
                } => {
                    let (record, output_blob, text_blob) = put_result(&tx, result)?;
                    let size = result.text.len()
                        + match output_blob {
                            Some(_) => 0,
                            None => json_text(&result.output).len(),
                        };
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO cache (key, workflow, step, run_id, source, result,
                            output_blob, text_blob, size, created_at, expires_at, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    )?
                    .execute(params![
                        key,
                        workflow,
                        step,
                        self.run,
                        source,
                        record,
                        output_blob,
                        text_blob,
                        size as i64,
                        now,
                        ttl_ms
                            .map(|ttl| now.saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX))),
                        FORMAT_VERSION
                    ])?;
                }
                Entry::ApprovalRequested(request) => {
                    let text = record::encode(&record::ApprovalRequest::from(request));
                    tx.prepare_cached(
                        "INSERT INTO approvals (run_id, key, step, request, requested_at, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                         ON CONFLICT (run_id, key) DO UPDATE SET request = excluded.request,
                            format = excluded.format",
                    )?
                    .execute(params![
                        self.run,
                        request.key,
                        request.step,
                        text,
                        now,
                        FORMAT_VERSION
                    ])?;
                }
                Entry::ApprovalDecided { key, decision } => {
                    let text = record::encode(&record::ApprovalDecision::from(decision));
                    tx.prepare_cached(
                        "UPDATE approvals SET decision = ?3, decided_at = ?4, format = ?5
                         WHERE run_id = ?1 AND key = ?2",
                    )?
                    .execute(params![
                        self.run,
                        key,
                        text,
                        now,
                        FORMAT_VERSION
                    ])?;
                }
                Entry::Checkpoint { step, state } => {
                    tx.prepare_cached(
                        "INSERT OR REPLACE INTO checkpoints (run_id, step, generation, state, at, format)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![
                        self.run,
                        step,
                        self.generation,
                        json_text(state),
                        now,
                        FORMAT_VERSION
                    ])?;
                }
                Entry::RunEnded {
                    status,
                    outputs,
                    error,
                } => {
                    // Stopped by `archon cancel`, the run is cancelled for good, not interrupted.
                    let cancel_requested: bool = tx.query_row(
                        "SELECT cancel_requested FROM runs WHERE id = ?1",
                        [&self.run],
                        |r| r.get(0),
                    )?;
                    let status = match status {
                        RunState::Interrupted if cancel_requested => RunState::Cancelled,
                        other => *other,
                    };
                    let finished = (status != RunState::Interrupted).then_some(now);
                    // The run's end also gives it up: nothing is recorded after it.
                    self.released = true;
                    tx.execute(
                        "UPDATE runs SET status = ?2, outputs = ?3, error = ?4, finished_at = ?5,
                            owner_pid = NULL, owner_host = NULL, lease_until = NULL, owner_started = NULL,
                            owner_token = NULL, format = ?6
                         WHERE id = ?1",
                        params![
                            self.run,
                            status.as_str(),
                            record::encode(outputs),
                            error,
                            finished,
                            FORMAT_VERSION
                        ],
                    )?;
                }
            }
        }
        drop((insert_attempt, insert_event, insert_result));
        let mut cancel_requested = false;
        if heartbeat {
            tx.execute(
                "UPDATE runs SET lease_until = ?2 WHERE id = ?1 AND owner_token = ?3",
                params![self.run, now + LEASE.as_millis() as i64, self.token],
            )?;
            cancel_requested = tx.query_row(
                "SELECT cancel_requested FROM runs WHERE id = ?1",
                [&self.run],
                |r| r.get::<_, bool>(0),
            )?;
        }
        tx.commit()?;
        Ok(Some(cancel_requested))
    }
}

/// A statement of the transaction, prepared on its first use and kept for the rest of the batch.
fn statement<'a, 'b>(
    tx: &'a rusqlite::Transaction<'_>,
    slot: &'b mut Option<rusqlite::CachedStatement<'a>>,
    sql: &str,
) -> rusqlite::Result<&'b mut rusqlite::CachedStatement<'a>> {
    if slot.is_none() {
        *slot = Some(tx.prepare_cached(sql)?);
    }
    Ok(slot.as_mut().expect("just prepared"))
}

/// Which records of a batch are written with the attempt they belong to: an attempt that starts and
/// ends (or starts its command) in the same batch is written once, whole, instead of inserted and
/// updated, in the order the attempts started.
struct Merged {
    /// For each entry that starts an attempt: the entry that started its command, and the one that
    /// ended it, in this batch.
    attempts: HashMap<usize, (Option<usize>, Option<usize>)>,
    /// Entries written with their attempt.
    folded: std::collections::HashSet<usize>,
}

impl Merged {
    fn attempt(&self, index: usize) -> (Option<usize>, Option<usize>) {
        self.attempts.get(&index).copied().unwrap_or((None, None))
    }

    fn folded(&self, index: usize) -> bool {
        self.folded.contains(&index)
    }
}

fn merge_attempts(entries: &[Write]) -> Merged {
    let mut merged = Merged {
        attempts: HashMap::new(),
        folded: std::collections::HashSet::new(),
    };
    // The attempt of each step started in this batch and not ended yet.
    let mut started: HashMap<&str, usize> = HashMap::new();
    for (index, write) in entries.iter().enumerate() {
        match write {
            Write::Started { step, .. } => {
                started.insert(step, index);
            }
            Write::Process { step, .. } => {
                if let Some(&start) = started.get(step.as_str()) {
                    merged.attempts.entry(start).or_default().0 = Some(index);
                    merged.folded.insert(index);
                }
            }
            Write::Ended { step, .. } => {
                if let Some(start) = started.remove(step.as_str()) {
                    merged.attempts.entry(start).or_default().1 = Some(index);
                    merged.folded.insert(index);
                }
            }
            _ => {}
        }
    }
    merged
}

fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path).map_err(|e| sql_error(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sql_error(path, &e))?;
    configure(&conn, path)?;
    Ok(conn)
}

/// Write-ahead logging, full syncs, foreign keys, no checkpoint on close.
fn configure(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    // WAL lets readers work while a run writes; `synchronous=FULL` syncs the log at every commit.
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| sql_error(path, &e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(format!(
            "state database `{}` cannot use write-ahead logging (journal mode `{mode}`)",
            path.display()
        )));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
        .map_err(|e| sql_error(path, &e))?;
    // The log is checkpointed as it grows (every 1,000 pages), not by each short-lived process on exit,
    // which would cost every `archon` command several more syncs.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
        true,
    )
    .map_err(|e| sql_error(path, &e))?;
    Ok(())
}

/// Refuses a database that is not Archon's, or is newer than this version.
fn check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    // One read transaction: another process creating the store at the same moment is seen before or after
    // its migration, never half-way.
    let snapshot = conn
        .unchecked_transaction()
        .map_err(|e| sql_error(path, &e))?;
    let read = |sql: &str| -> Result<i64, StoreError> {
        snapshot
            .query_row(sql, [], |r| r.get(0))
            .map_err(|e| sql_error(path, &e))
    };
    let application = read("PRAGMA application_id")?;
    let version = read("PRAGMA user_version")?;
    let tables = read("SELECT COUNT(*) FROM sqlite_master")?;
    if application != APPLICATION_ID && !(application == 0 && version == 0 && tables == 0) {
        return Err(StoreError::new(format!(
            "`{}` is not an Archon state database",
            path.display()
        ))
        .with_hint("point `--state-dir` (or `ARCHON_STATE_DIR`) at another directory; this file was not changed"));
    }
    let latest = MIGRATIONS.len() as i64;
    if version > latest {
        return Err(StoreError::new(format!(
            "state database `{}` has schema version `{version}`, newer than this archon knows (`{latest}`)",
            path.display()
        ))
        .with_hint("use the archon version that wrote it, or a newer one"));
    }
    // Only the header and the schema are read here, so that opening costs the same whatever the store
    // holds; SQLite reports a damaged page when a query meets it, and `archon runs --check` reads them all.
    Ok(())
}

/// Brings the schema up to date; says whether it changed it.
fn migrate(conn: &mut Connection, path: &Path) -> Result<bool, StoreError> {
    let latest = MIGRATIONS.len() as i64;
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| sql_error(path, &e))?;
    if version < latest {
        // Another process may be creating the same store: migrate under the write lock, from the version
        // found once holding it.
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| sql_error(path, &e))?;
        let version: i64 = tx
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| sql_error(path, &e))?;
        for (index, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            tx.execute_batch(migration)
                .map_err(|e| sql_error(path, &e))?;
            tx.execute_batch(&format!(
                "PRAGMA user_version = {}; PRAGMA application_id = {APPLICATION_ID};",
                index + 1
            ))
            .map_err(|e| sql_error(path, &e))?;
        }
        tx.commit().map_err(|e| sql_error(path, &e))?;
        return Ok(true);
    }
    Ok(false)
}

fn damaged(path: &Path, detail: &str) -> StoreError {
    StoreError::new(format!(
        "state database `{}` is damaged: {detail}",
        path.display()
    ))
    .with_hint("nothing was changed; move the file aside to start a new store, or restore it from a backup")
}

fn sql_error(path: &Path, error: &rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => {
            damaged(path, &error.to_string().to_lowercase())
        }
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::new(format!(
            "state database `{}` stayed locked by another process",
            path.display()
        )),
        Some(ErrorCode::DiskFull) => StoreError::new(format!(
            "cannot write state database `{}`: the disk is full",
            path.display()
        )),
        Some(ErrorCode::SystemIoFailure) => {
            let error = StoreError::new(format!(
                "cannot write state database `{}`: {}",
                path.display(),
                error.to_string().to_lowercase()
            ));
            // A write past `ulimit -f` fails with EFBIG, which SQLite reports as an I/O error.
            match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_FSIZE) {
                Ok((limit, _)) if limit != nix::sys::resource::RLIM_INFINITY => error.with_hint(
                    format!("files are limited to {limit} bytes here (`ulimit -f`): the store may have reached that size"),
                ),
                _ => error,
            }
        }
        _ => StoreError::new(format!(
            "state database `{}`: {}",
            path.display(),
            error.to_string().to_lowercase()
        )),
    }
}

fn unknown_run(id: &str) -> StoreError {
    StoreError {
        unknown_run: true,
        ..StoreError::new(format!("no run `{id}` in the state directory"))
            .with_hint("`archon runs` lists the runs it holds")
    }
}

/// A piece of a run's logs from a row of `seq, step, attempt, source, stream, text, at`.
fn log_chunk(r: &rusqlite::Row<'_>) -> rusqlite::Result<LogChunk> {
    Ok(LogChunk {
        seq: r.get(0)?,
        step: r.get(1)?,
        attempt: r.get(2)?,
        source: r.get(3)?,
        stream: if r.get::<_, String>(4)? == "stderr" {
            crate::tools::Stream::Stderr
        } else {
            crate::tools::Stream::Stdout
        },
        text: r.get(5)?,
        at_ms: r.get::<_, i64>(6)? as u64,
    })
}

/// An event as the log shows it: its kind, its fields, and when it happened.
pub(super) fn event_json(record::Event { event, mut fields }: record::Event, at_ms: i64) -> Json {
    let mut map = Map::with_capacity(fields.len() + 2);
    map.insert("event".to_owned(), Json::String(event));
    map.append(&mut fields);
    map.insert("at_ms".to_owned(), Json::from(at_ms));
    Json::Object(map)
}

/// A run's event as its log will show it once it is recorded (`RunStore::events`), from the event
/// itself: the same record, decoded the same way.
pub fn recorded_event(event: &crate::report::RunEvent, at_ms: u64) -> Json {
    let text = super::convert::event_text(event);
    match serde_json::from_str::<record::Event>(&text) {
        Ok(event) => event_json(event, at_ms.min(i64::MAX as u64) as i64),
        Err(_) => Json::Null,
    }
}

/// The columns of a run's summary, as [`summary`] reads them.
const SUMMARY: &str = "id, workflow, status, started_at, finished_at, owner_pid, owner_host, lease_until, owner_started";

/// How many runs have an id in a range of the primary key.
const PREFIX_COUNT: &str = "SELECT COUNT(*) FROM runs WHERE id >= ?1 AND id < ?2";

/// A run's summary from a row of the [`SUMMARY`] columns.
fn summary(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunSummary> {
    let status: String = r.get(2)?;
    let owner = owner_of(r.get(5)?, r.get(6)?, r.get(7)?, r.get(8)?);
    let started_at = r.get::<_, i64>(3)? as u64;
    let finished_at = r.get::<_, Option<i64>>(4)?.map(|t| t as u64);
    // A status this version does not know is listed as interrupted; `show` and `runs --check` report
    // the row.
    let status = RunState::parse(&status).unwrap_or(RunState::Interrupted);
    Ok(RunSummary {
        id: r.get(0)?,
        workflow: r.get(1)?,
        status: effective_state(status, owner.as_ref()),
        started_at,
        finished_at,
        duration_ms: finished_at.map(|f| f.saturating_sub(started_at)),
    })
}

/// An SQL identifier, quoted.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Deletes `runs`, every row of every table whose foreign key names `runs(id)` that belongs to them, and
/// the blobs that only those rows used; returns the bytes those records held. The tables are read from
/// the schema, so a table a later migration adds is pruned with the rest as long as it names its run.
fn prune_runs(tx: &rusqlite::Transaction<'_>, runs: &[RunSummary]) -> rusqlite::Result<u64> {
    // (table, column, the table the column refers to)
    let references = tx
        .prepare(
            "SELECT m.name, f.\"from\", f.\"table\" FROM main.sqlite_master m,
                 pragma_foreign_key_list(m.name) f
             WHERE m.type = 'table' ORDER BY m.name",
        )?
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let owned: Vec<(&str, &str)> = references
        .iter()
        .filter(|(_, _, parent)| parent == "runs")
        .map(|(table, column, _)| (table.as_str(), column.as_str()))
        .collect();
    let to_blobs: Vec<(&str, &str)> = references
        .iter()
        .filter(|(_, _, parent)| parent == "blobs")
        .map(|(table, column, _)| (table.as_str(), column.as_str()))
        .collect();
    tx.execute_batch(
        "CREATE TEMP TABLE archon_pruned (id TEXT PRIMARY KEY);
         CREATE TEMP TABLE archon_pruned_blobs (hash TEXT PRIMARY KEY);",
    )?;
    {
        let mut insert = tx.prepare("INSERT INTO temp.archon_pruned (id) VALUES (?1)")?;
        for run in runs {
            insert.execute([&run.id])?;
        }
    }
    let doomed = "(SELECT id FROM temp.archon_pruned)";
    let mut bytes = 0_u64;
    // Every table a run owns rows in, and the runs themselves.
    let mut tables: Vec<(&str, &str)> = owned.clone();
    tables.push(("runs", "id"));
    for (table, column) in &tables {
        let columns = tx
            .prepare("SELECT name FROM pragma_table_info(?1)")?
            .query_map([table], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let sizes = columns
            .iter()
            .map(|c| format!("COALESCE(length(CAST({} AS BLOB)), 0)", quoted(c)))
            .collect::<Vec<_>>()
            .join(" + ");
        let size: i64 = tx.query_row(
            &format!(
                "SELECT COALESCE(SUM({sizes}), 0) FROM {} WHERE {} IN {doomed}",
                quoted(table),
                quoted(column)
            ),
            [],
            |r| r.get(0),
        )?;
        bytes += size.max(0) as u64;
    }
    // The blobs the pruned rows use: deleted unless a row that stays uses them too.
    for (table, column) in &to_blobs {
        if let Some((_, run_column)) = owned.iter().find(|(t, _)| t == table) {
            tx.execute(
                &format!(
                    "INSERT OR IGNORE INTO temp.archon_pruned_blobs (hash)
                     SELECT {c} FROM {t} WHERE {r} IN {doomed} AND {c} IS NOT NULL",
                    c = quoted(column),
                    t = quoted(table),
                    r = quoted(run_column)
                ),
                [],
            )?;
        }
    }
    for (table, column) in &owned {
        tx.execute(
            &format!(
                "DELETE FROM {} WHERE {} IN {doomed}",
                quoted(table),
                quoted(column)
            ),
            [],
        )?;
    }
    // Firings name their run without a foreign key (they are recorded before it exists): those of the
    // pruned runs go with them.
    let size: i64 = tx.query_row(
        &format!("SELECT COALESCE(SUM({FIRING_BYTES}), 0) FROM firings WHERE run_id IN {doomed}"),
        [],
        |r| r.get(0),
    )?;
    bytes += size.max(0) as u64;
    tx.execute(&format!("DELETE FROM firings WHERE run_id IN {doomed}"), [])?;
    tx.execute(&format!("DELETE FROM runs WHERE id IN {doomed}"), [])?;
    if !to_blobs.is_empty() {
        // A row that stays may hold a blob without declaring the key: the step cache keeps its results'
        // large outputs in `blobs` as runs do, and outlives the runs that produced them. Every column named
        // `*_blob` counts as a use.
        let mut users = tx
            .prepare(
                "SELECT m.name, c.name FROM main.sqlite_master m, pragma_table_info(m.name) c
                 WHERE m.type = 'table' AND m.name != 'blobs' AND c.name GLOB '*_blob'
                 ORDER BY m.name, c.name",
            )?
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for (table, column) in &to_blobs {
            if !users.iter().any(|(t, c)| t == table && c == column) {
                users.push(((*table).to_owned(), (*column).to_owned()));
            }
        }
        let used = users
            .iter()
            .map(|(t, c)| {
                format!(
                    "SELECT {c} FROM {t} WHERE {c} IS NOT NULL",
                    c = quoted(c),
                    t = quoted(t)
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ");
        tx.execute(
            &format!("DELETE FROM temp.archon_pruned_blobs WHERE hash IN ({used})"),
            [],
        )?;
        let size: i64 = tx.query_row(
            "SELECT COALESCE(SUM(length(hash) + length(data)), 0) FROM blobs
             WHERE hash IN (SELECT hash FROM temp.archon_pruned_blobs)",
            [],
            |r| r.get(0),
        )?;
        bytes += size.max(0) as u64;
        tx.execute(
            "DELETE FROM blobs WHERE hash IN (SELECT hash FROM temp.archon_pruned_blobs)",
            [],
        )?;
    }
    tx.execute_batch("DROP TABLE temp.archon_pruned; DROP TABLE temp.archon_pruned_blobs;")?;
    Ok(bytes)
}

/// The bytes a firing row holds (its text columns and eight bytes a number).
const FIRING_BYTES: &str =
    "length(workflow) + length(trigger_name) + length(slot) + length(kind) + length(outcome)
    + COALESCE(length(run_id), 0) + COALESCE(length(reason), 0) + length(inputs) + 24";

/// Deletes the firings without a run (skipped, refused) recorded before `before` (milliseconds since the
/// epoch); returns the bytes they held and how many they were. Each trigger's last slot stays in
/// `triggers`.
fn prune_firings(tx: &rusqlite::Transaction<'_>, before: u64) -> rusqlite::Result<(u64, u64)> {
    let before = before.min(i64::MAX as u64) as i64;
    let size: i64 = tx.query_row(
        &format!(
            "SELECT COALESCE(SUM({FIRING_BYTES}), 0) FROM firings WHERE run_id IS NULL AND fired_at < ?1"
        ),
        [before],
        |r| r.get(0),
    )?;
    let count = tx.execute(
        "DELETE FROM firings WHERE run_id IS NULL AND fired_at < ?1",
        [before],
    )?;
    Ok((size.max(0) as u64, count as u64))
}

/// The columns [`firing`] reads, in its order.
const FIRING: &str =
    "workflow, trigger_name, kind, slot, slot_at, fired_at, run_id, outcome, reason, format";

/// A firing from a row of [`FIRING`] columns (and `inputs` after them when `with_inputs`).
fn firing(
    r: &rusqlite::Row<'_>,
    with_inputs: bool,
) -> rusqlite::Result<Result<Firing, RecordError>> {
    let workflow: String = r.get(0)?;
    let trigger: String = r.get(1)?;
    let slot: String = r.get(3)?;
    let run_id: Option<String> = r.get(6)?;
    let format: i64 = r.get(9)?;
    let name = format!("{workflow}/{trigger}/{slot}");
    let at = Row {
        run: run_id.as_deref().unwrap_or("-"),
        table: "firings",
        row: &name,
    };
    let kind = FiringKind::parse(&r.get::<_, String>(2)?);
    let outcome = FiringOutcome::parse(&r.get::<_, String>(7)?);
    let (Some(kind), Some(outcome)) = (kind, outcome) else {
        return Ok(Err(RecordError::Text {
            run: at.run.to_owned(),
            table: "firings",
            row: name,
            problem: "has an unknown kind or outcome",
        }));
    };
    let inputs = if with_inputs {
        match record::decode::<Map<String, Json>>(at, format, bytes(r.get_ref(10)?)) {
            Ok(inputs) => inputs,
            Err(e) => return Ok(Err(e)),
        }
    } else {
        Map::new()
    };
    Ok(Ok(Firing {
        workflow,
        trigger,
        kind,
        slot,
        slot_at: r.get::<_, i64>(4)?.max(0) as u64,
        fired_at: r.get::<_, i64>(5)?.max(0) as u64,
        run_id,
        outcome,
        reason: r.get(8)?,
        inputs,
    }))
}

/// The firings read, or the store's error naming every row that did not decode.
fn collect_firings(
    path: &Path,
    rows: Vec<Result<Firing, RecordError>>,
) -> Result<Vec<Firing>, StoreError> {
    let mut firings = Vec::with_capacity(rows.len());
    let mut damage = Vec::new();
    for row in rows {
        match row {
            Ok(f) => firings.push(f),
            Err(e) => damage.push(e),
        }
    }
    if damage.is_empty() {
        Ok(firings)
    } else {
        Err(damaged_rows(path, &damage))
    }
}

fn owner_of(
    pid: Option<u32>,
    host: Option<String>,
    lease: Option<i64>,
    started: Option<i64>,
) -> Option<Owner> {
    Some(Owner {
        pid: pid?,
        host: host?,
        lease_until: lease.unwrap_or(0) as u64,
        started: started.map(|s| s as u64),
    })
}

/// A stored `running` run is running only while its owner lives.
fn effective_state(status: RunState, owner: Option<&Owner>) -> RunState {
    match status {
        RunState::Running if owner.is_some_and(is_alive) => RunState::Running,
        RunState::Running => RunState::Interrupted,
        state => state,
    }
}

/// Whether a run's owner is alive. On this host: its process exists and is the same process (same start
/// time), whatever its lease says (a stopped process is alive). On another host, whose processes cannot be
/// checked: its lease has not lapsed.
fn is_alive(owner: &Owner) -> bool {
    if owner.host != host() {
        return owner.lease_until >= now_ms();
    }
    let exists = rustix::process::Pid::from_raw(owner.pid as i32).is_some_and(|pid| {
        rustix::process::test_kill_process(pid).is_ok() && !is_zombie(owner.pid)
    });
    exists
        && owner
            .started
            .is_none_or(|started| crate::process::process_start_time(owner.pid) == Some(started))
}

/// This process's start time, which with its pid identifies it.
pub(super) fn my_start_time() -> Option<i64> {
    crate::process::process_start_time(std::process::id()).map(|t| t as i64)
}

/// Why a claim was refused.
enum Claim {
    Unknown,
    Owned(Owner),
    State(RunState),
}

pub(super) fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// This machine's name, to tell whose process ids are checkable.
/// The file by which process `pid` says it serves several runs at once (beside the database, in
/// `serving/`): `cancel` then asks through the store only, since a signal would stop them all.
pub(super) fn serving_mark(database: &Path, pid: u32) -> PathBuf {
    database.with_file_name("serving").join(pid.to_string())
}

/// Says, for as long as the value lives, that this process serves several runs of the store in
/// `state_dir` at once, so that cancelling one of them does not signal the process.
#[derive(Debug)]
pub struct ServingMark(PathBuf);

impl ServingMark {
    pub fn new(state_dir: &Path) -> std::io::Result<ServingMark> {
        let path = serving_mark(&state_dir.join(DATABASE), std::process::id());
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, b"")?;
        super::SERVING.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(ServingMark(path))
    }
}

impl Drop for ServingMark {
    fn drop(&mut self) {
        super::SERVING.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        let _ = std::fs::remove_file(&self.0);
    }
}

pub(crate) fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

pub(super) fn json_text(value: &Json) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// Stores what `write` writes as a blob when it is longer than `inline` bytes, and names it (`None` for a
/// shorter one, which the caller keeps in its row). It is streamed, never held whole: `write` runs once
/// to measure and name it (`sha256:` and the SHA-256 of its bytes), and, unless a blob of that name is
/// already stored, once more into the blob's own room, so that a 100 MB output costs the writer neither its
/// JSON text nor SQLite's copy of it. (Blobs written before were named by `spec_hash`, bare hex digits: the
/// prefix keeps the two kinds of names apart, so that no text can be taken for an older blob.)
fn put_blob(
    tx: &rusqlite::Transaction<'_>,
    mut write: impl FnMut(&mut dyn std::io::Write) -> std::io::Result<()>,
    inline: usize,
) -> rusqlite::Result<Option<String>> {
    // A failed write into the blob is SQLite's error (a full disk, a file size limit): kept as it is, so that
    // it is reported as any other failed write.
    let io = |e: std::io::Error| match e
        .into_inner()
        .map(|inner| inner.downcast::<rusqlite::Error>())
    {
        Some(Ok(sqlite)) => *sqlite,
        Some(Err(other)) => rusqlite::Error::ToSqlConversionFailure(other),
        None => rusqlite::Error::ToSqlConversionFailure("the blob could not be written".into()),
    };
    let mut measured = Measured::default();
    write(&mut measured).map_err(io)?;
    if measured.length <= inline as u64 {
        return Ok(None);
    }
    let length = measured.length;
    let name = measured.name();
    let stored = tx
        .prepare_cached("INSERT OR IGNORE INTO blobs (hash, data) VALUES (?1, zeroblob(?2))")?
        .execute(params![name, length as i64])?;
    if stored == 1 {
        let mut blob = tx.blob_open("main", "blobs", "data", tx.last_insert_rowid(), false)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 16, &mut blob);
        write(&mut out).map_err(io)?;
        std::io::Write::flush(&mut out).map_err(io)?;
    }
    Ok(Some(name))
}

/// Counts and hashes what is written to it.
#[derive(Default)]
pub(super) struct Measured {
    pub(super) length: u64,
    hasher: sha2::Sha256,
}

impl Measured {
    /// The blob's name: `sha256:` and the SHA-256 of its bytes.
    pub(super) fn name(self) -> String {
        use sha2::Digest;
        let mut name = String::from("sha256:");
        for b in self.hasher.finalize() {
            name.push_str(&format!("{b:02x}"));
        }
        name
    }
}

impl std::io::Write for Measured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        use sha2::Digest;
        self.hasher.update(bytes);
        self.length += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A row of `cache` as listed: its first eight columns.
fn cache_summary(r: &rusqlite::Row<'_>) -> rusqlite::Result<CacheSummary> {
    Ok(CacheSummary {
        key: r.get(0)?,
        workflow: r.get(1)?,
        step: r.get(2)?,
        run_id: r.get(3)?,
        source: r.get(4)?,
        created_at: r.get::<_, i64>(5)? as u64,
        expires_at: r.get::<_, Option<i64>>(6)?.map(|e| e as u64),
        size: r.get::<_, i64>(7)? as u64,
    })
}

/// A result encoded as a record, its output and text over [`INLINE_OUTPUT_BYTES`] streamed into `blobs`
/// and left out of the record: the record and the names of the blobs, for a `results` or a `cache` row.
fn put_result(
    tx: &rusqlite::Transaction<'_>,
    result: &StepResult,
) -> rusqlite::Result<(String, Option<String>, Option<String>)> {
    let output = |out: &mut dyn std::io::Write| {
        serde_json::to_writer(out, &result.output).map_err(std::io::Error::from)
    };
    let output_blob = put_blob(tx, output, INLINE_OUTPUT_BYTES)?;
    let text = |out: &mut dyn std::io::Write| out.write_all(result.text.as_bytes());
    let text_blob = put_blob(tx, text, INLINE_OUTPUT_BYTES)?;
    let record = record::encode(&record::StepResult::of(
        result,
        match output_blob {
            Some(_) => Json::Null,
            None => result.output.clone(),
        },
        match text_blob {
            Some(_) => String::new(),
            None => result.text.clone(),
        },
    ));
    Ok((record, output_blob, text_blob))
}

/// Decodes a stored result from row `r`, whose columns from `first` are its format, its record, its
/// output blob's name and rowid and its text blob's name and rowid; the blobs are read as they are
/// decoded.
fn decode_result(
    conn: &Connection,
    at: Row<'_>,
    r: &rusqlite::Row<'_>,
    first: usize,
) -> rusqlite::Result<Result<record::StepResult, RecordError>> {
    let output_apart = r.get_ref(first + 2)? != rusqlite::types::ValueRef::Null;
    let text_apart = r.get_ref(first + 4)? != rusqlite::types::ValueRef::Null;
    let blob = |rowid: Option<i64>| -> rusqlite::Result<Option<rusqlite::blob::Blob<'_>>> {
        rowid
            .map(|rowid| conn.blob_open("main", "blobs", "data", rowid, true))
            .transpose()
    };
    let output_blob = blob(r.get(first + 3)?)?;
    let text_blob = blob(r.get(first + 5)?)?;
    Ok(
        record::decode::<record::StepResult>(at, r.get(first)?, bytes(r.get_ref(first + 1)?))
            .and_then(|mut result| {
                let at = Row {
                    table: "blobs",
                    ..at
                };
                if output_apart {
                    result.output = match output_blob {
                        Some(blob) => record::decode_from(at, std::io::BufReader::new(blob))?,
                        None => record::decode(at, FORMAT_VERSION.into(), b"")?,
                    };
                }
                if text_apart {
                    let read = text_blob.map(|mut blob| {
                        let mut text = String::with_capacity(blob.len());
                        std::io::Read::read_to_string(&mut blob, &mut text).map(|_| text)
                    });
                    result.text = record::text(at, read)?;
                }
                Ok(result)
            }),
    )
}

/// The bytes of a text or blob column; nothing for another type, which then fails to decode.
fn bytes(value: rusqlite::types::ValueRef<'_>) -> &[u8] {
    match value {
        rusqlite::types::ValueRef::Text(b) | rusqlite::types::ValueRef::Blob(b) => b,
        _ => &[],
    }
}

/// Reads run `id` in the read transaction `conn`; every row that does not decode goes to `damage`
/// (and the run read is then incomplete).
/// Whether a load reads the outputs and texts kept apart in `blobs`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blobs {
    Read,
    /// Leaves them out: those outputs read as null and those texts as empty.
    Skip,
}

fn load_run(
    conn: &Connection,
    id: &str,
    damage: &mut Vec<RecordError>,
    blobs: Blobs,
) -> rusqlite::Result<Option<StoredRun>> {
    let mut stmt = conn.prepare_cached(
        "SELECT id, workflow, spec_path, spec_hash, status, inputs, workdir, max_parallel,
            started_at, finished_at, outputs, error, owner_pid, owner_host, lease_until,
            owner_started, generation, format
         FROM runs WHERE id = ?1",
    )?;
    let mut rows = stmt.query([id])?;
    let Some(r) = rows.next()? else {
        return Ok(None);
    };
    let format: i64 = r.get(17)?;
    let at = |row: &'static str| Row {
        run: id,
        table: "runs",
        row,
    };
    let status = match record::decode_value::<record::RunState>(
        at("status"),
        format,
        Json::String(r.get(4)?),
    ) {
        Ok(status) => RunState::from(status),
        Err(e) => {
            damage.push(e);
            RunState::Interrupted
        }
    };
    let inputs = record::decode::<record::Object>(at("inputs"), format, bytes(r.get_ref(5)?))
        .unwrap_or_else(|e| {
            damage.push(e);
            Map::new()
        });
    let outputs = match r.get_ref(10)? {
        rusqlite::types::ValueRef::Null => Map::new(),
        value => record::decode::<record::Object>(at("outputs"), format, bytes(value))
            .unwrap_or_else(|e| {
                damage.push(e);
                Map::new()
            }),
    };
    let owner = owner_of(r.get(12)?, r.get(13)?, r.get(14)?, r.get(15)?);
    let mut run = StoredRun {
        id: r.get(0)?,
        workflow: r.get(1)?,
        spec_path: r.get(2)?,
        spec_hash: r.get(3)?,
        status: effective_state(status, owner.as_ref()),
        inputs,
        workdir: r.get(6)?,
        max_parallel: r.get::<_, i64>(7)? as usize,
        started_at: r.get::<_, i64>(8)? as u64,
        finished_at: r.get::<_, Option<i64>>(9)?.map(|t| t as u64),
        generation: r.get(16)?,
        outputs,
        error: r.get(11)?,
        results: IndexMap::new(),
        attempts: Vec::new(),
        checkpoints: HashMap::new(),
        approvals: Vec::new(),
        owner: owner.filter(is_alive),
    };
    drop(rows);

    let mut stmt = conn.prepare_cached(match blobs {
        Blobs::Read => {
            "SELECT r.step, r.format, r.result, r.output_blob, b.rowid, r.text_blob, t.rowid
             FROM results r LEFT JOIN blobs b ON b.hash = r.output_blob
                LEFT JOIN blobs t ON t.hash = r.text_blob
             WHERE r.run_id = ?1 ORDER BY r.rowid"
        }
        Blobs::Skip => {
            "SELECT r.step, r.format, r.result, NULL, NULL, NULL, NULL
             FROM results r WHERE r.run_id = ?1 ORDER BY r.rowid"
        }
    })?;
    let mut rows = stmt.query([id])?;
    while let Some(r) = rows.next()? {
        let step: String = r.get(0)?;
        let at = Row {
            run: id,
            table: "results",
            row: &step,
        };
        // Blobs are read as they are decoded, not copied out whole first.
        let result = decode_result(conn, at, r, 1)?;
        match result {
            Ok(result) => {
                run.results.insert(step, StepResult::from(result));
            }
            Err(e) => damage.push(e),
        }
    }
    drop(rows);

    let mut stmt = conn.prepare_cached(
        "SELECT step, attempt, generation, fallback, status, error, started_at, ended_at, pgid,
            pgid_started
         FROM attempts WHERE run_id = ?1 ORDER BY started_at, rowid",
    )?;
    run.attempts = stmt
        .query_map([id], |r| {
            Ok(AttemptRecord {
                step: r.get(0)?,
                attempt: r.get(1)?,
                generation: r.get(2)?,
                fallback: r.get(3)?,
                status: r.get(4)?,
                error: r.get(5)?,
                started_at: r.get::<_, i64>(6)? as u64,
                ended_at: r.get::<_, Option<i64>>(7)?.map(|t| t as u64),
                pgid: r.get(8)?,
                pgid_started: r.get::<_, Option<i64>>(9)?.map(|t| t as u64),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;

    let mut stmt = conn.prepare_cached(
        "SELECT key, format, request, requested_at, decision, decided_at FROM approvals
         WHERE run_id = ?1 ORDER BY requested_at, rowid",
    )?;
    let mut rows = stmt.query([id])?;
    while let Some(r) = rows.next()? {
        let key: String = r.get(0)?;
        let format: i64 = r.get(1)?;
        let at = Row {
            run: id,
            table: "approvals",
            row: &key,
        };
        let request = record::decode::<record::ApprovalRequest>(at, format, bytes(r.get_ref(2)?));
        let decision = match r.get_ref(4)? {
            rusqlite::types::ValueRef::Null => Ok(None),
            value => record::decode::<record::ApprovalDecision>(at, format, bytes(value)).map(Some),
        };
        match (request, decision) {
            (Ok(request), Ok(decision)) => run.approvals.push(ApprovalRecord {
                request: request.into(),
                requested_at: r.get::<_, i64>(3)? as u64,
                decision: decision.map(Into::into),
                decided_at: r.get::<_, Option<i64>>(5)?.map(|t| t as u64),
            }),
            (request, decision) => damage.extend(request.err().into_iter().chain(decision.err())),
        }
    }
    drop(rows);

    let mut stmt = conn.prepare_cached(
        "SELECT step, format, state FROM checkpoints WHERE run_id = ?1 AND generation = ?2",
    )?;
    let mut rows = stmt.query(params![id, run.generation])?;
    while let Some(r) = rows.next()? {
        let step: String = r.get(0)?;
        let at = Row {
            run: id,
            table: "checkpoints",
            row: &step,
        };
        match record::decode::<record::Checkpoint>(at, r.get(1)?, bytes(r.get_ref(2)?)) {
            Ok(state) => {
                run.checkpoints.insert(step, state);
            }
            Err(e) => damage.push(e),
        }
    }
    Ok(Some(run))
}

/// The error of a load that met rows that do not decode.
fn damaged_rows(path: &Path, damage: &[RecordError]) -> StoreError {
    let mut message = format!(
        "state database `{}` has {} damaged row{}:",
        path.display(),
        damage.len(),
        if damage.len() == 1 { "" } else { "s" }
    );
    for error in damage {
        message.push_str("\n  ");
        message.push_str(&error.to_string());
    }
    StoreError::new(message).with_hint(
        "nothing was changed; `archon runs --check` lists every damaged row in the store",
    )
}

/// A checkpoint of the write-ahead log into the database file, in `mode` (`PASSIVE`: as far as it can
/// without waiting for other connections; `TRUNCATE`: everything, leaving an empty log).
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<()> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |_| Ok(()))
}

/// Refuses a write-ahead log that SQLite would take for an empty one and overwrite: a header that is not a
/// log's or does not match its checksum, or a first frame of the current log that does not match its
/// checksum although the frame after it was written too and a commit follows (a first frame cut short
/// by a crash, which SQLite rightly ignores, is followed by nothing of the current log; one a crash left
/// in the middle of a transaction, by no commit).
fn check_log(path: &Path) -> Result<(), StoreError> {
    let log = wal_path(path);
    let read = || -> Result<Vec<u8>, StoreError> {
        read_log_head(&log)
            .map_err(|e| StoreError::new(format!("cannot read `{}`: {e}", log.display())))
    };
    let head = read()?;
    let Some(detail) = wal_damage(&head) else {
        return Ok(());
    };
    // A first frame that no longer matches its checksum, with no commit after it, is what a crash leaves
    // in the middle of a large transaction: SQLite writes its pages to the log before it commits, may
    // write a page again in place, and recomputes the checksums only as it commits. Nothing committed is
    // lost; SQLite ignores the frames, as it should.
    if detail == FIRST_FRAME_DAMAGED
        && !commits_after_first_frame(&log, &head)
            .map_err(|e| StoreError::new(format!("cannot read `{}`: {e}", log.display())))?
    {
        return Ok(());
    }
    // Another process may be writing the start of the log at this moment (it restarts the log after a
    // complete checkpoint): only damage that stays put is damage.
    std::thread::sleep(Duration::from_millis(50));
    let again = read()?;
    if again != head || wal_damage(&again).is_none() {
        return Ok(());
    }
    Err(StoreError::new(format!(
        "the write-ahead log `{}` of the state database is damaged: {detail}",
        log.display()
    ))
    .with_hint(
        "nothing was changed; the runs it holds would be lost: restore it from a backup, or move the \
         state directory aside to start a new store",
    ))
}

/// The log's header and its first two frames (as much of them as there is); nothing when there is no log.
fn read_log_head(log: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let file = match std::fs::File::open(log) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut file = std::io::BufReader::new(file);
    let mut head = Vec::new();
    (&mut file).take(32).read_to_end(&mut head)?;
    if head.len() == 32 {
        let page = u32::from_be_bytes([head[8], head[9], head[10], head[11]]).min(65_536);
        (&mut file)
            .take(2 * (24 + u64::from(page)))
            .read_to_end(&mut head)?;
    }
    Ok(head)
}

/// The pages in the log not yet copied into the database file, read from the wal-index header in the
/// `-shm` file (`mxFrame` less `nBackfill`, in native byte order, as SQLite's file format documents them);
/// 0 when it cannot be read. A stale read only moves a checkpoint earlier or later.
fn pending_frames(path: &Path) -> u32 {
    use std::io::Read as _;
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    let mut head = [0u8; 100];
    let read = std::fs::File::open(PathBuf::from(shm)).and_then(|mut f| f.read_exact(&mut head));
    if read.is_err() {
        return 0;
    }
    let word = |at: usize| u32::from_ne_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    word(16).saturating_sub(word(96))
}

fn wal_path(path: &Path) -> PathBuf {
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    PathBuf::from(log)
}

const FIRST_FRAME_DAMAGED: &str = "its first frame does not match its checksum";

/// Whether a frame of the current log (its salts), the first or one after it, ends a transaction (a
/// commit frame gives the database's size in pages): only then would the frames SQLite ignores from the
/// first on hold committed data. Each frame's header is read, not its page.
fn commits_after_first_frame(log: &Path, head: &[u8]) -> std::io::Result<bool> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let page = u64::from(u32::from_be_bytes([head[8], head[9], head[10], head[11]]));
    let mut file = std::fs::File::open(log)?;
    let mut frame = [0u8; 24];
    for n in 0.. {
        file.seek(SeekFrom::Start(32 + n * (24 + page)))?;
        match file.read_exact(&mut frame) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
        if frame[8..16] != head[16..24] {
            // A frame of an earlier log: the current one ends before it.
            return Ok(false);
        }
        if frame[4..8] != [0; 4] {
            return Ok(true);
        }
    }
    Ok(false)
}

/// What is wrong with the start of a write-ahead log (its header and first frame), if anything.
fn wal_damage(head: &[u8]) -> Option<&'static str> {
    if head.is_empty() {
        return None;
    }
    if head.len() < 32 {
        return Some("its header is cut short");
    }
    let word = |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let magic = word(0);
    if magic & !1 != 0x377f_0682 {
        return Some("it does not start like a write-ahead log");
    }
    let big_endian = magic & 1 == 1;
    let page = word(8) as usize;
    if word(4) != 3_007_000 || !(512..=65_536).contains(&page) || !page.is_power_of_two() {
        return Some("its header is not one SQLite writes");
    }
    let header_sum = wal_checksum((0, 0), &head[..24], big_endian);
    if header_sum != (word(24), word(28)) {
        return Some("its header does not match its checksum");
    }
    let frame = &head[32..];
    let second = frame.get(24 + page..2 * (24 + page));
    let current = |f: &[u8]| f.len() >= 24 + page && f[8..16] == head[16..24];
    if !current(frame) || !second.is_some_and(current) {
        // No frame of the current log, or only one, which a crash may have cut short: SQLite reads what
        // is valid, as it should.
        return None;
    }
    let sum = wal_checksum(header_sum, &frame[..8], big_endian);
    let sum = wal_checksum(sum, &frame[24..24 + page], big_endian);
    if sum != (word(32 + 16), word(32 + 20)) {
        return Some(FIRST_FRAME_DAMAGED);
    }
    None
}

/// SQLite's write-ahead log checksum over `data` (a multiple of 8 bytes), continuing from `sum`.
fn wal_checksum(sum: (u32, u32), data: &[u8], big_endian: bool) -> (u32, u32) {
    let (mut s0, mut s1) = sum;
    for pair in data.chunks_exact(8) {
        let read = |b: &[u8]| {
            let b = [b[0], b[1], b[2], b[3]];
            if big_endian {
                u32::from_be_bytes(b)
            } else {
                u32::from_le_bytes(b)
            }
        };
        s0 = s0.wrapping_add(read(&pair[..4])).wrapping_add(s1);
        s1 = s1.wrapping_add(read(&pair[4..])).wrapping_add(s0);
    }
    (s0, s1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The start of a real log: a table created, then `rows` inserts, each its own transaction.
    fn log_of(rows: usize) -> Vec<u8> {
        let dir = std::env::temp_dir().join(format!(
            "archon-wal-test-{}-{rows}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("t.db");
        let conn = Connection::open(&path).expect("opens");
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (v TEXT);")
            .expect("created");
        for i in 0..rows {
            conn.execute("INSERT INTO t VALUES (?1)", [i.to_string()])
                .expect("inserted");
        }
        let head = read_log_head(&wal_path(&path)).expect("read");
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
        head
    }

    #[test]
    fn a_sound_log_passes_and_each_kind_of_damage_is_named() {
        let head = log_of(3);
        assert_eq!(head.len(), 32 + 2 * (24 + 4096));
        assert_eq!(wal_damage(&head), None);
        assert_eq!(wal_damage(&[]), None, "no log");
        let garbled = |at: usize| {
            let mut bytes = head.clone();
            bytes[at] ^= 0x5a;
            wal_damage(&bytes)
        };
        assert_eq!(garbled(1), Some("it does not start like a write-ahead log"));
        assert_eq!(garbled(9), Some("its header is not one SQLite writes"));
        assert_eq!(garbled(13), Some("its header does not match its checksum"));
        assert_eq!(
            garbled(32 + 24 + 7),
            Some("its first frame does not match its checksum")
        );
        assert_eq!(wal_damage(&head[..20]), Some("its header is cut short"));
    }

    /// A store in a fresh folder with one run this process owns, and that run's journal.
    fn journaled() -> (tempfile::TempDir, SqliteStore, Arc<dyn Journal>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path()).expect("opens");
        store
            .create_run(&NewRun {
                id: "r1".into(),
                workflow: "w".into(),
                spec_path: "/w.yaml".into(),
                files: vec![("/w.yaml".into(), "name: w".into())],
                inputs: Map::new(),
                workdir: "/".into(),
                max_parallel: 4,
            })
            .expect("created");
        let journal = store
            .journal("r1", CancellationToken::new())
            .expect("journal");
        (dir, store, journal)
    }

    fn started(step: &str) -> Entry {
        Entry::AttemptStarted {
            step: step.into(),
            fallback: false,
        }
    }

    fn ended(step: &str, status: crate::report::StepStatus) -> Entry {
        Entry::AttemptEnded {
            step: step.into(),
            status,
            error: None,
        }
    }

    fn attempts(store: &SqliteStore) -> Vec<(String, u32, String, Option<u32>, bool)> {
        store
            .load("r1")
            .expect("loads")
            .attempts
            .into_iter()
            .map(|a| {
                let ended = a.ended_at.is_some();
                (a.step, a.attempt, a.status, a.pgid, ended)
            })
            .collect()
    }

    #[tokio::test]
    async fn attempts_written_whole_or_in_two_batches_read_the_same_in_the_order_they_started() {
        use crate::report::StepStatus::{Failed, Succeeded};
        let (_dir, store, journal) = journaled();
        // One batch: `a` and `b` start, `b` starts a command and ends, `a` ends; `c` starts and stays open.
        journal.record(started("a"));
        journal.record(started("b"));
        journal.record(Entry::ProcessStarted {
            step: "b".into(),
            pgid: 77,
            started: Some(5),
        });
        journal.record(ended("b", Failed));
        journal.record(ended("a", Succeeded));
        journal.record(started("c"));
        journal.flush().wait().await.expect("durable");
        let c_open = attempts(&store);
        assert_eq!(
            c_open,
            vec![
                ("a".into(), 1, "succeeded".into(), None, true),
                ("b".into(), 1, "failed".into(), Some(77), true),
                ("c".into(), 1, "running".into(), None, false),
            ]
        );
        // The next batch: `c` starts its command and ends; `b` is tried again, whole in this batch.
        journal.record(Entry::ProcessStarted {
            step: "c".into(),
            pgid: 88,
            started: None,
        });
        journal.record(ended("c", Succeeded));
        journal.record(started("b"));
        journal.record(ended("b", Succeeded));
        journal.flush().wait().await.expect("durable");
        assert_eq!(
            attempts(&store),
            vec![
                ("a".into(), 1, "succeeded".into(), None, true),
                ("b".into(), 1, "failed".into(), Some(77), true),
                ("c".into(), 1, "succeeded".into(), Some(88), true),
                ("b".into(), 2, "succeeded".into(), None, true),
            ]
        );
        journal.close();
    }

    #[tokio::test]
    async fn results_small_and_large_in_one_batch_are_both_kept() {
        use crate::report::{StepResult, StepStatus};
        let (_dir, store, journal) = journaled();
        let result = |output: Json| {
            let mut result = StepResult::ended(StepStatus::Succeeded, None);
            result.text = output.to_string();
            result.output = output;
            result
        };
        // Encoded where recorded; then one too large for that, whose output goes to a blob.
        let small = result(serde_json::json!({ "v": 1 }));
        let large = result(Json::String("x".repeat(INLINE_OUTPUT_BYTES + 1)));
        for (step, result) in [("small", &small), ("large", &large), ("again", &small)] {
            journal.record(Entry::StepFinished {
                step: step.into(),
                result: Arc::new(result.clone()),
            });
        }
        journal.flush().wait().await.expect("durable");
        let results = store.load("r1").expect("loads").results;
        assert_eq!(
            results.keys().collect::<Vec<_>>(),
            ["small", "large", "again"]
        );
        assert_eq!(results["small"], small);
        assert_eq!(results["large"], large);
        assert_eq!(results["again"], small);
        journal.close();
    }

    #[tokio::test]
    async fn large_outputs_and_texts_are_kept_apart_once_and_read_back_whole() {
        use crate::report::{StepResult, StepStatus};
        let (dir, store, journal) = journaled();
        let big = "é".repeat(INLINE_OUTPUT_BYTES);
        // A command's: its output a string, its text that string (two blobs: the JSON is quoted).
        let mut command = StepResult::ended(StepStatus::Succeeded, None);
        command.output = Json::String(big.clone());
        command.text = big.clone();
        // A `foreach` step's: its text is its output's JSON (one blob for both).
        let mut items = StepResult::ended(StepStatus::Succeeded, None);
        items.output = serde_json::json!([big, "x"]);
        items.text = items.output.to_string();
        for (step, result) in [("command", &command), ("items", &items)] {
            journal.record(Entry::StepFinished {
                step: step.into(),
                result: Arc::new(result.clone()),
            });
        }
        journal.flush().wait().await.expect("durable");
        let results = store.load("r1").expect("loads").results;
        assert_eq!(results["command"], command);
        assert_eq!(results["items"], items);
        let conn = Connection::open(dir.path().join(DATABASE)).expect("opens");
        let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).expect(sql) };
        assert_eq!(count("SELECT COUNT(*) FROM blobs"), 3);
        assert_eq!(
            count("SELECT COUNT(*) FROM results WHERE output_blob = text_blob"),
            1
        );
        // A summary leaves them where they are.
        let brief = store.load_brief("r1").expect("loads").results;
        assert_eq!(brief["items"].output, Json::Null);
        assert_eq!(brief["items"].text, "");
        assert_eq!(brief["items"].status, StepStatus::Succeeded);
        // A text whose blob is gone is reported, not read as empty.
        conn.execute_batch("PRAGMA foreign_keys = OFF;")
            .expect("damage allowed");
        conn.execute(
            "DELETE FROM blobs WHERE hash = (SELECT text_blob FROM results WHERE step = 'command')",
            [],
        )
        .expect("deleted");
        let error = store.load("r1").expect_err("damaged");
        assert!(
            error
                .message
                .ends_with("run `r1`: blobs row `command` is missing"),
            "{}",
            error.message
        );
        journal.close();
    }

    /// Blobs written before were named by `spec_hash`, which hashes the bytes framed by their length: a
    /// text made of that framing and an older blob's bytes hashes, unframed, to the older blob's name.
    /// New names carry a prefix of their own, so it is stored as itself.
    #[tokio::test]
    async fn a_text_is_never_taken_for_an_older_blob() {
        use crate::report::{StepResult, StepStatus};
        let (dir, store, journal) = journaled();
        let older = format!("\"{}\"", "y".repeat(INLINE_OUTPUT_BYTES + 63));
        let conn = Connection::open(dir.path().join(DATABASE)).expect("opens");
        conn.execute(
            "INSERT INTO blobs (hash, data) VALUES (?1, ?2)",
            params![
                spec_hash(&[(String::new(), older.clone())]),
                older.as_bytes()
            ],
        )
        .expect("an older blob");
        let mut framed = Vec::new();
        framed.extend_from_slice(&0u64.to_le_bytes());
        framed.extend_from_slice(&(older.len() as u64).to_le_bytes());
        framed.extend_from_slice(older.as_bytes());
        let mut result = StepResult::ended(StepStatus::Succeeded, None);
        result.text = String::from_utf8(framed).expect("utf-8");
        journal.record(Entry::StepFinished {
            step: "cmd".into(),
            result: Arc::new(result.clone()),
        });
        journal.flush().wait().await.expect("durable");
        assert_eq!(store.load("r1").expect("loads").results["cmd"], result);
        journal.close();
    }

    /// A failed write is the journal's failure, which the run ends with; a run another process took
    /// over says so, since resuming it here is not what to do.
    #[tokio::test]
    async fn a_journal_that_cannot_write_says_why() {
        let (dir, _store, journal) = journaled();
        assert!(journal.failure().is_none());
        let conn = Connection::open(dir.path().join(DATABASE)).expect("opens");
        conn.execute(
            "UPDATE runs SET owner_token = 'another' WHERE id = 'r1'",
            [],
        )
        .expect("taken over");
        journal.record(started("a"));
        let error = journal.flush().wait().await.expect_err("not written");
        let failure = journal.failure().expect("a failure");
        assert_eq!(
            (failure.taken_over, failure.message.as_str()),
            (
                true,
                "run `r1` was taken over by another process; this one stopped recording it"
            )
        );
        assert_eq!(error, failure);
        journal.close();
    }

    #[tokio::test]
    async fn a_record_nothing_waits_for_is_committed_within_the_window() {
        let (_dir, store, journal) = journaled();
        journal.record(Entry::Event {
            event: crate::report::RunEvent::StepStarted { step: "a".into() },
            at_ms: now_ms(),
        });
        // No flush: the writer commits the record once it has waited `WINDOW`.
        let deadline = Instant::now() + WINDOW * 20;
        while store.events("r1").expect("events").is_empty() {
            assert!(
                Instant::now() < deadline,
                "not committed within {:?}",
                WINDOW * 20
            );
            tokio::time::sleep(WINDOW / 4).await;
        }
        assert_eq!(
            store.events("r1").expect("events")[0]["event"],
            "step_started"
        );
        journal.close();
    }

    /// The run's end gives up its lease; what the writer does after it (a heartbeat, a late record) must
    /// not take the given-up lease for another process's takeover: a run that succeeded printed "taken
    /// over by another process" when its last heartbeat fell after its end.
    #[tokio::test]
    async fn nothing_after_the_runs_end_is_taken_for_a_takeover() {
        let (_dir, store, journal) = journaled();
        journal.record(Entry::RunEnded {
            status: RunState::Succeeded,
            outputs: Map::new(),
            error: None,
        });
        journal.flush().wait().await.expect("ended");
        journal.record(started("late"));
        journal
            .flush()
            .wait()
            .await
            .expect("nothing written, nothing failed");
        assert_eq!(journal.failure(), None);
        assert_eq!(store.load("r1").expect("loads").attempts.len(), 0);
        journal.close();
    }

    #[tokio::test]
    async fn a_flush_after_the_journal_closed_fails_instead_of_waiting() {
        let (_dir, _store, journal) = journaled();
        journal.close();
        journal.record(started("a"));
        let error = journal.flush().wait().await.expect_err("closed");
        assert_eq!(error.message, "the run store stopped");
    }

    #[test]
    fn a_first_frame_a_crash_cut_short_is_not_damage() {
        // One frame of the current log, its page not fully written: nothing after it, so SQLite ignores
        // it and no committed data is lost.
        let mut head = log_of(0);
        head.truncate(32 + 24 + 4096);
        head[32 + 24 + 100] ^= 0x5a;
        assert_eq!(wal_damage(&head), None);
        // The same frame followed by one of an earlier log (other salts): also a crash's leftover.
        let mut second = head[32..].to_vec();
        second[8] ^= 0xff;
        head.extend_from_slice(&second);
        assert_eq!(wal_damage(&head), None);
    }
}

/// Whether this process may create files in `dir` (the kernel says: a read-only mount, or a folder without
/// write permission for this user, is not).
fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

#[cfg(test)]
mod lookup_tests {
    use super::*;

    /// A run id prefix is a range of the primary key's index: SQLite searches it, never scans `runs`.
    #[test]
    fn a_prefix_is_looked_up_in_the_primary_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path()).expect("opens");
        let plan = |sql: &str, limit: bool| {
            store
                .with(|conn| {
                    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                    let detail = |r: &rusqlite::Row<'_>| r.get::<_, String>(3);
                    if limit {
                        stmt.query_map(params!["r1", "r1\u{10FFFF}", 5], detail)?
                            .collect::<rusqlite::Result<Vec<_>>>()
                    } else {
                        stmt.query_map(params!["r1", "r1\u{10FFFF}"], detail)?
                            .collect::<rusqlite::Result<Vec<_>>>()
                    }
                })
                .expect("plan")
        };
        let rows =
            format!("SELECT {SUMMARY} FROM runs WHERE id >= ?1 AND id < ?2 ORDER BY id LIMIT ?3");
        for (sql, limit) in [(PREFIX_COUNT, false), (rows.as_str(), true)] {
            let steps = plan(sql, limit);
            assert!(
                steps.len() == 1
                    && steps[0].starts_with("SEARCH runs USING")
                    && steps[0].contains("INDEX sqlite_autoindex_runs_1 (id>? AND id<?)"),
                "{sql}: {steps:?}"
            );
        }
    }
}
