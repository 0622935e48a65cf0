//! The run lifecycle over a run store: start, resume, retry, approve, deny, cancel and inspect runs.
//!
//! This is what a front end calls: the CLI today, a server and workers later. A front end parses its
//! request, calls a [`Session`] and renders what comes back; it never talks to the store itself. Starting or
//! continuing a run is two calls: [`Session::start`] or [`Session::continue_run`] claims the run and decides
//! what it continues with (a [`Prepared`] run), then [`Session::execute`] runs it to its end, recording it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::resume;
use crate::run::{
    self, ApprovalDecision, ApprovalRequest, Approver, Cassette, RunError, RunEvent, RunOptions,
    RunReport, RunStatus, StepResult, StepStatus,
};
pub use crate::store::sqlite::ServingMark;
use crate::store::sqlite::{DATABASE, SqliteStore};
use crate::store::{Entry, NewRun, RunStore, spec_hash};
use crate::validate::{Validation, validate_file, validate_source};
use crate::workflow::Workflow;

mod worker;
pub use worker::{DEFAULT_DRAIN, DEFAULT_LEASE, Say, Worked, WorkerOptions};

use crate::trigger::{Delivery, Due, ReceiveError, Received, Scheduler, Timestamp, Webhook};

pub use crate::store::StoreAt;
pub use crate::store::new_run_id;
pub use crate::store::{
    API_TRIGGER, ApprovalRecord, AttemptRecord, CacheFilter, CacheSummary, Firing, FiringFilter,
    FiringKind, FiringOutcome, LiveWorker, LogChunk, Owner, Pruned, RunCursor, RunFilter, RunPage,
    RunQuery, RunState, RunSummary, StoreError, StoredRun, Waiting,
};

/// The version of the run store's schema this build writes (what a bug report names): the SQLite store's.
pub const STORE_SCHEMA_VERSION: usize = crate::store::sqlite::SCHEMA_VERSION;

/// The version of the PostgreSQL run store's schema this build writes (and migrates older ones to).
pub const POSTGRES_STORE_SCHEMA_VERSION: usize = crate::store::postgres::SCHEMA_VERSION;

/// How many runs an ambiguous prefix names at most in its error.
const CANDIDATES_SHOWN: usize = 5;

/// A run as a person names it on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunRef<'a> {
    /// Its id, or a prefix of it that no other run's id starts with.
    Id(&'a str),
    /// The newest run (of this workflow, when given).
    Last { workflow: Option<&'a str> },
}

/// The owner's host a run submitted to workers names: no process owns it, the workers do.
pub use crate::store::postgres::WORKERS;

/// The memory kept under `file` (the spec's `memory.path`) in the PostgreSQL run store at `at`: `None`
/// when that store does not exist yet, unless `create`.
pub fn stored_memory(
    at: &StoreAt,
    file: &str,
    create: bool,
) -> Result<Option<run::memory::MemoryStore>, StoreError> {
    let runs = if create {
        Some(crate::store::open(at)?)
    } else {
        crate::store::open_existing(at)?
    };
    let Some(runs) = runs else {
        return Ok(None);
    };
    let Some(database) = run::memory::MemoryDatabase::of(&*runs) else {
        return Err(StoreError::new(format!(
            "run store `{}` keeps no memory",
            at.shown()
        )));
    };
    database
        .open(file)
        .map(Some)
        .map_err(|e| StoreError::new(e.to_string()))
}

/// The live workers (`archon worker`) of the PostgreSQL run store at `at`, oldest first, each with the
/// steps it holds (none when that store does not exist yet). Workers exist only on a PostgreSQL store:
/// any other is refused, and nothing is created.
pub fn live_workers(at: &StoreAt) -> Result<Vec<LiveWorker>, StoreError> {
    at.check()?;
    if at.url.is_none() {
        return Err(
            StoreError::new("workers exist only on a PostgreSQL run store")
                .with_hint("pass `--store postgres://...` (or set `ARCHON_STORE`)"),
        );
    }
    let Some(runs) = crate::store::open_existing(at)? else {
        return Ok(Vec::new());
    };
    match runs.tasks() {
        Some(tasks) => tasks.workers(),
        None => Ok(Vec::new()),
    }
}

/// The database file of the run store in `state_dir`.
pub fn database_path(state_dir: &Path) -> PathBuf {
    state_dir.join(DATABASE)
}

/// Why a session refused or failed a request.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The run store cannot be opened, is damaged, or a write failed (or the run does not exist).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The request cannot be carried out as asked: a usage problem, with what to do instead.
    #[error("{message}")]
    Refused { message: String, hint: String },
    /// The spec the run continues with does not validate (today's file on disk).
    #[error("the workflow `{}` does not validate", path.display())]
    Invalid {
        path: PathBuf,
        validation: Box<Validation>,
    },
    /// The run could not start: a problem found before any step started. It is recorded as failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A goal (`run --goal`) that makes no workflow.
    #[error("{0}")]
    Goal(String),
    /// A file the session writes (a goal's workflow) could not be written.
    #[error("cannot write `{}`", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SessionError {
    fn refused(message: impl Into<String>, hint: impl Into<String>) -> Self {
        SessionError::Refused {
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// Whether the problem is the request's (exit 2) rather than a failure (exit 1).
    pub fn is_usage(&self) -> bool {
        match self {
            SessionError::Store(e) => e.unknown_run,
            SessionError::Refused { .. }
            | SessionError::Invalid { .. }
            | SessionError::Run(_)
            | SessionError::Goal(_) => true,
            SessionError::Write { .. } => false,
        }
    }
}

/// The run store of one state directory, and the lifecycle operations over it.
#[derive(Debug)]
pub struct Session {
    store: Box<dyn RunStore>,
}

/// A new run to start.
#[derive(Debug)]
pub struct NewRunRequest {
    /// The id the run gets ([`new_run_id`] makes one).
    pub id: String,
    pub workflow: Workflow,
    pub inputs: Map<String, Json>,
    /// The spec file the workflow was read from.
    pub spec_path: PathBuf,
    /// The workspace: where commands run and file paths point.
    pub workdir: PathBuf,
    /// Most steps, and most commands and LLM calls, running at once: given (`--max-parallel`), else the
    /// spec's `defaults.max_parallel`, else [`DEFAULT_MAX_PARALLEL`].
    pub max_parallel: Option<usize>,
}

impl NewRunRequest {
    /// The spec's canonical path, and the most steps running at once (the request's, else the spec's
    /// `defaults.max_parallel`, else the default).
    fn settled(&self) -> Result<(PathBuf, usize), SessionError> {
        let spec_path = std::fs::canonicalize(&self.spec_path).map_err(|e| {
            StoreError::new(format!(
                "cannot read `{}`: {}",
                self.spec_path.display(),
                e.to_string().to_lowercase()
            ))
        })?;
        let max_parallel = self
            .max_parallel
            .or_else(|| {
                let defaults = self.workflow.spec.defaults.as_ref()?;
                defaults.max_parallel.as_ref().map(|m| m.value as usize)
            })
            .unwrap_or(DEFAULT_MAX_PARALLEL)
            .max(1);
        Ok((spec_path, max_parallel))
    }
}

/// The refusal of a run some of whose steps need labels this process lacks (`None` when none does).
fn missing_labels_error(missing: &[(String, crate::workflow::Labels)]) -> Option<SessionError> {
    let ticked = |labels: &crate::workflow::Labels| {
        labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (step, labels) = missing.first()?;
    let more = match missing.len() {
        1 => String::new(),
        2 => " (and 1 more step)".to_owned(),
        n => format!(" (and {} more steps)", n - 1),
    };
    let all: crate::workflow::Labels = missing
        .iter()
        .flat_map(|(_, l)| l.iter().cloned())
        .collect();
    Some(SessionError::refused(
        format!(
            "step `{step}` needs {} this process does not have: {}{more}",
            if labels.len() == 1 {
                "a label"
            } else {
                "labels"
            },
            ticked(labels),
        ),
        format!(
            "pass `--labels {}` to run it here, or submit the run to workers that have them (`archon run --submit`)",
            all.iter().cloned().collect::<Vec<_>>().join(",")
        ),
    ))
}

/// The limit on steps, commands and LLM calls running at once when neither the request nor the spec says.
pub const DEFAULT_MAX_PARALLEL: usize = 16;

/// Which steps of a stored run run again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continue<'a> {
    /// Continue where it stopped: finished steps are reused.
    Resume,
    /// Run this step and everything downstream of it again.
    From(&'a str),
    /// Run again the steps that failed and the steps skipped because of them.
    Failed,
}

/// What continuing a run may accept.
#[derive(Clone, Debug, Default)]
pub struct ContinueOptions {
    /// Run again steps whose last attempt was in flight when the run stopped, even when repeating them
    /// is not known to be safe.
    pub rerun_in_doubt: bool,
    /// Continue with the spec as it is now although it changed since the run started.
    pub allow_changed_spec: bool,
    /// Most steps at once (default: what the run was started with).
    pub max_parallel: Option<usize>,
}

/// A claimed run, with everything it continues with decided: what [`Session::execute`] runs.
#[derive(Debug)]
pub struct Prepared {
    pub run_id: String,
    pub workflow: Workflow,
    pub inputs: Map<String, Json>,
    pub workdir: PathBuf,
    pub max_parallel: usize,
    /// Results to reuse, by step or `step[i]`.
    prior: HashMap<String, StepResult>,
    /// Where LLM steps the earlier process did not finish stood.
    checkpoints: HashMap<String, Json>,
    /// Decisions on calls that asked for approval, by key.
    decided: HashMap<String, ApprovalDecision>,
    /// Process groups left running by the process that ran the run before, stopped before continuing:
    /// the step (or item) that started each, and the group.
    pub stopped: Vec<(String, u32)>,
    /// Steps that run again even when their result is cached (`retry --from` reruns them afresh).
    refresh: std::collections::HashSet<String>,
}

/// How a run being executed reaches the outside world.
#[derive(Default)]
pub struct Attachments {
    /// Receives progress events.
    pub events: Option<tokio::sync::mpsc::UnboundedSender<RunEvent>>,
    /// Stops the run (Ctrl-C, a signal): it stays resumable.
    pub cancel: CancellationToken,
    /// Approve every call that asks (`--yes`).
    pub yes: bool,
    /// Asks a person about calls that ask; without one the run pauses for `approve`.
    pub approver: Option<Arc<dyn Approver>>,
    /// Record or replay the run's LLM calls.
    pub cassette: Option<Cassette>,
    /// The executable that evaluates jq filters and renders templates that are not plain in a process
    /// of its own (`archon __jq`, `archon __render`).
    pub helper: Option<PathBuf>,
    /// Run every step even when its result is cached (`--no-cache`); results of steps with `cache` that
    /// succeed replace their entries.
    pub no_cache: bool,
    /// Receives each event the moment the run records it, numbered and shaped as the run's log will show
    /// it ([`Session::events_after`]): what a server streams before the store has committed it.
    pub recorded: Option<tokio::sync::mpsc::UnboundedSender<RecordedEvent>>,
    /// The labels this process has (`archon run --labels`): a step whose `runs_on` (or whose tools')
    /// needs one it lacks fails the run before any step starts.
    pub labels: crate::workflow::Labels,
}

/// An event a run being executed recorded, as its log shows it once committed.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedEvent {
    pub run_id: String,
    /// Its number in the run's log.
    pub seq: i64,
    /// The event as [`Session::events`] returns it.
    pub event: Json,
}

/// A journal that also tells each event it records to a [`RecordedEvent`] receiver, numbered as the
/// store numbers it (the run's owner is the only writer of its log while it runs).
#[derive(Debug)]
struct Told {
    inner: Arc<dyn crate::store::Journal>,
    run_id: String,
    last: std::sync::atomic::AtomicI64,
    to: tokio::sync::mpsc::UnboundedSender<RecordedEvent>,
}

impl crate::store::Journal for Told {
    fn record(&self, entry: Entry) {
        if let Entry::Event { event, at_ms } = &entry {
            let seq = self.last.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            let _ = self.to.send(RecordedEvent {
                run_id: self.run_id.clone(),
                seq,
                event: crate::store::sqlite::recorded_event(event, *at_ms),
            });
        }
        self.inner.record(entry);
    }

    fn flush(&self) -> crate::store::Ack {
        self.inner.flush()
    }

    fn close(&self) {
        self.inner.close();
    }

    fn failure(&self) -> Option<StoreError> {
        self.inner.failure()
    }
}

impl std::fmt::Debug for Attachments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachments")
            .field("events", &self.events.is_some())
            .field("yes", &self.yes)
            .field("approver", &self.approver.is_some())
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

/// How an executed run ended.
#[derive(Debug)]
pub struct Outcome {
    pub report: RunReport,
    /// The run was stopped (Ctrl-C, a signal) and can be resumed, rather than cancelled for good.
    pub resumable: bool,
    /// The write of the run's state that failed and stopped it (a full disk, a lost store): the store
    /// keeps the run as it was last saved, which `resume` continues once the store can be written.
    pub unsaved: Option<StoreError>,
}

/// What a person says became of a step in doubt ([`Session::resolve`]).
#[derive(Clone, Debug)]
pub struct Resolution {
    pub outcome: Resolved,
    /// Who says so.
    pub by: String,
    /// Why, recorded with the result.
    pub reason: Option<String>,
}

/// The outcome of a step in doubt, as a person found it.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    /// It had its effect; this is its output.
    Succeeded(Json),
    /// It did not: it failed, and `retry --failed` runs it again.
    Failed,
}

/// What `cancel` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The run was not running: it is cancelled now.
    Now,
    /// A live process runs it: it was asked to stop, and records the run as cancelled.
    Asked,
}

impl Session {
    /// Opens the run store in `state_dir`, creating it when needed.
    pub fn open(state_dir: &Path) -> Result<Session, StoreError> {
        Ok(Session::over(Box::new(SqliteStore::open(state_dir)?)))
    }

    /// Opens the run store `at` names (the state directory's, or a PostgreSQL database), creating it
    /// when needed.
    pub fn open_at(at: &StoreAt) -> Result<Session, StoreError> {
        Ok(Session::over(crate::store::open(at)?))
    }

    /// Opens the run store `at` names for a request that only reads or changes existing runs: a missing
    /// store is not created, and `Ok(None)` says there is none.
    pub fn open_existing_at(at: &StoreAt) -> Result<Option<Session>, StoreError> {
        Ok(crate::store::open_existing(at)?.map(Session::over))
    }

    /// Opens the run store in `state_dir` for a request that only reads or changes existing runs: a
    /// missing store is not created, and `Ok(None)` says there is none.
    pub fn open_existing(state_dir: &Path) -> Result<Option<Session>, StoreError> {
        if !state_dir.join(DATABASE).exists() {
            return Ok(None);
        }
        Session::open(state_dir).map(Some)
    }

    /// A session over any run store.
    pub fn over(store: Box<dyn RunStore>) -> Session {
        Session { store }
    }

    /// The runs, newest first.
    pub fn list(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.store.list()
    }

    /// The runs `filter` selects, newest first.
    pub fn list_where(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        self.store.list_where(filter)
    }

    /// The id of the run `run` names: an id, a prefix of exactly one run's id (an id that is also the
    /// prefix of others names itself), or the newest run. An unknown or ambiguous name is a usage error
    /// (`unknown_run`) that lists the candidates.
    pub fn find(&self, run: RunRef<'_>) -> Result<String, StoreError> {
        let prefix = match run {
            RunRef::Last { workflow } => {
                let filter = RunFilter {
                    workflow: workflow.map(str::to_owned),
                    limit: Some(1),
                    ..RunFilter::default()
                };
                return match self.store.list_where(&filter)?.pop() {
                    Some(newest) => Ok(newest.id),
                    None => Err(unknown(
                        match workflow {
                            Some(w) => format!("no run of workflow `{w}` in the state directory"),
                            None => "no runs in the state directory".to_owned(),
                        },
                        "`archon runs` lists the runs it holds",
                    )),
                };
            }
            RunRef::Id(prefix) => prefix,
        };
        if prefix.is_empty() {
            return Err(unknown(
                "an empty run id names no run",
                "`archon runs` lists the runs it holds",
            ));
        }
        let (mut runs, count) = self.store.with_prefix(prefix, CANDIDATES_SHOWN)?;
        if let Some(exact) = runs.iter().position(|r| r.id == prefix) {
            return Ok(runs.swap_remove(exact).id);
        }
        match runs.len() {
            0 => Err(unknown(
                format!("no run `{prefix}` in the state directory"),
                "`archon runs` lists the runs it holds",
            )),
            1 => Ok(runs.remove(0).id),
            _ => {
                let mut message = format!("`{prefix}` is the start of {count} run ids, not one:");
                let width = runs.iter().map(|r| r.workflow.chars().count()).max();
                for run in &runs {
                    let started =
                        std::time::UNIX_EPOCH + std::time::Duration::from_millis(run.started_at);
                    message.push_str(&format!(
                        "\n  {}  {:<width$}  started {}",
                        run.id,
                        run.workflow,
                        humantime::format_rfc3339_seconds(started),
                        width = width.unwrap_or(0)
                    ));
                }
                if count > runs.len() {
                    message.push_str(&format!("\n  ... and {} more", count - runs.len()));
                }
                Err(unknown(
                    message,
                    "type more of the id; `archon runs` lists the runs it holds",
                ))
            }
        }
    }

    /// Deletes the finished runs (succeeded, failed, cancelled) that ended before `finished_before`
    /// (milliseconds since the epoch), with everything they own, in one transaction; a running, waiting
    /// or interrupted run is never deleted. With `dry_run`, only says what it would delete.
    pub fn prune(&self, finished_before: u64, dry_run: bool) -> Result<Pruned, StoreError> {
        self.store.prune(finished_before, dry_run)
    }

    /// Everything stored about one run.
    pub fn load(&self, id: &str) -> Result<StoredRun, StoreError> {
        self.store.load(id)
    }

    /// One run without the large step outputs and texts its store keeps apart (those outputs read as
    /// null, those texts as empty): what a summary of it needs, in memory that does not grow with them.
    pub fn load_brief(&self, id: &str) -> Result<StoredRun, StoreError> {
        self.store.load_brief(id)
    }

    /// Reads the whole store and says what is wrong with it: damaged pages and every row that does not
    /// decode (in time proportional to its size).
    pub fn check(&self) -> Result<Vec<String>, StoreError> {
        self.store.check()
    }

    /// A run's event log, in order.
    pub fn events(&self, id: &str) -> Result<Vec<Json>, StoreError> {
        self.store.events(id)
    }

    /// One page of the runs `query` selects, newest first, and how many it selects in all.
    pub fn page(&self, query: &RunQuery) -> Result<RunPage, StoreError> {
        self.store.page(query)
    }

    /// The run with exactly this id, as `list` shows it, if there is one.
    pub fn summary(&self, id: &str) -> Result<Option<RunSummary>, StoreError> {
        self.store.summary(id)
    }

    /// The runs that may have changed at or after `since` (milliseconds since the epoch): started or
    /// ended since, or running, or waiting for approval.
    pub fn changed_since(&self, since: u64) -> Result<Vec<RunSummary>, StoreError> {
        self.store.changed_since(since)
    }

    /// A number that changes whenever another connection (another session, another process) commits a
    /// change to the store; `None` from a store that cannot tell.
    pub fn changes(&self) -> Result<Option<u64>, StoreError> {
        self.store.changes()
    }

    /// The events of a run's log numbered after `after`, at most `limit`, each with its number.
    pub fn events_after(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Json)>, StoreError> {
        self.store.events_after(id, after, limit)
    }

    /// What a run's commands wrote after the piece numbered `after`, at most `limit` pieces.
    pub fn logs_after(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LogChunk>, StoreError> {
        self.store.logs_after(id, after, limit)
    }

    /// What a run's commands wrote after the piece numbered `after` (0 for all), in order.
    pub fn logs(&self, id: &str, after: i64) -> Result<Vec<LogChunk>, StoreError> {
        self.store.logs(id, after)
    }

    /// Every cached step result, newest first (`archon cache ls`).
    pub fn cache_list(&self) -> Result<Vec<CacheSummary>, StoreError> {
        self.store.cache_list()
    }

    /// Removes the cached results `filter` selects (`archon cache clear`); returns how many.
    pub fn cache_clear(&self, filter: &CacheFilter) -> Result<usize, StoreError> {
        self.store.cache_clear(filter, crate::store::now_ms())
    }

    /// The cron firings due at `now`, each recorded before it is returned ([`Scheduler::due`]); `active`
    /// says whether a run the scheduler returned earlier is still running or queued.
    pub fn due_firings(
        &self,
        scheduler: &mut Scheduler,
        now: Timestamp,
        active: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Due>, StoreError> {
        scheduler.due(self.store.as_ref(), now, active)
    }

    /// Checks a webhook delivery and records its firing before its run exists
    /// ([`crate::trigger::receive`]): a new delivery is [`Received::Fired`], one whose id was recorded
    /// before is [`Received::Replayed`].
    pub fn receive_delivery(
        &self,
        hook: &Webhook,
        delivery: &Delivery<'_>,
        now: Timestamp,
    ) -> Result<Received, ReceiveError> {
        crate::trigger::receive(self.store.as_ref(), hook, delivery, now)
    }

    /// Records a firing unless its slot is already recorded; says whether it was new.
    pub fn record_firing(&self, firing: &Firing) -> Result<bool, StoreError> {
        self.store.record_firing(firing)
    }

    /// The firings `filter` selects, newest first, without their inputs.
    pub fn firings(&self, filter: &FiringFilter) -> Result<Vec<Firing>, StoreError> {
        self.store.firings(filter)
    }

    /// The latest firing of a trigger, by slot time.
    pub fn last_firing(&self, workflow: &str, trigger: &str) -> Result<Option<Firing>, StoreError> {
        self.store.last_firing(workflow, trigger)
    }

    /// The firings recorded with a run that was never created (a server stopped in between), oldest
    /// first, with their inputs: what a server starts (or queues) when it starts again.
    pub fn unstarted_firings(&self) -> Result<Vec<Firing>, StoreError> {
        self.store.unstarted_firings()
    }

    /// Records as skipped, with `reason`, the firing whose run `run_id` was never created (a queued firing
    /// a later one replaced); says whether one changed ([`crate::store::RunStore::skip_unstarted_firing`]).
    pub fn skip_unstarted_firing(&self, run_id: &str, reason: &str) -> Result<bool, StoreError> {
        self.store.skip_unstarted_firing(run_id, reason)
    }

    /// Records the run of a firing (under the id the firing carries, with its inputs) and prepares it
    /// to execute.
    pub fn start_firing(
        &self,
        firing: &Firing,
        workflow: Workflow,
        spec_path: PathBuf,
        workdir: PathBuf,
        max_parallel: Option<usize>,
    ) -> Result<Prepared, SessionError> {
        let Some(id) = firing.run_id.clone() else {
            return Err(SessionError::refused(
                format!(
                    "the {} firing `{}` of trigger `{}` starts no run",
                    firing.outcome.as_str(),
                    firing.slot,
                    firing.trigger
                ),
                "only a started or queued firing has a run",
            ));
        };
        self.start(NewRunRequest {
            id,
            workflow,
            inputs: firing.inputs.clone(),
            spec_path,
            workdir,
            max_parallel,
        })
    }

    /// Records a new run, owned by this process, and prepares it to execute.
    pub fn start(&self, request: NewRunRequest) -> Result<Prepared, SessionError> {
        let (spec_path, max_parallel) = request.settled()?;
        self.store.create_run(&NewRun {
            id: request.id.clone(),
            workflow: request.workflow.name.clone(),
            spec_path: spec_path.display().to_string(),
            files: spec_files(&request.workflow, &spec_path),
            inputs: request.inputs.clone(),
            workdir: request.workdir.display().to_string(),
            max_parallel,
        })?;
        Ok(Prepared {
            run_id: request.id,
            workflow: request.workflow,
            inputs: request.inputs,
            workdir: request.workdir,
            max_parallel,
            prior: HashMap::new(),
            checkpoints: HashMap::new(),
            decided: HashMap::new(),
            stopped: Vec::new(),
            refresh: Default::default(),
        })
    }

    /// Claims a stored run to resume it or run some of its steps again, with the spec as it is on disk
    /// now, and decides what it continues with.
    pub fn continue_run(
        &self,
        id: &str,
        how: Continue<'_>,
        options: &ContinueOptions,
    ) -> Result<Prepared, SessionError> {
        let stored = self.store.load(id)?;
        refuse_state(&stored, how)?;
        // Claim the run, then decide from what the store holds now: nothing can change it in between.
        let allowed: &[RunState] = match how {
            Continue::Resume => &[RunState::Interrupted, RunState::WaitingApproval],
            Continue::From(_) => &[RunState::Interrupted, RunState::Succeeded, RunState::Failed],
            Continue::Failed => &[RunState::Interrupted, RunState::Failed],
        };
        let previous = match self.store.claim(id, allowed) {
            Ok(previous) => previous,
            // Another process claimed it (or ended it) since it was loaded: the same refusal, worded and
            // exited as when this process comes second by a wider margin.
            Err(e) => {
                if let Ok(now) = self.store.load(id) {
                    refuse_state(&now, how)?;
                }
                return Err(e.into());
            }
        };
        let plan = match self.plan_continuation(id, how, options) {
            Ok(plan) => plan,
            Err(e) => {
                self.store.release(id, previous)?;
                return Err(e);
            }
        };
        let Continuation {
            workflow,
            stored,
            rerun,
            in_doubt,
        } = plan;
        let files = spec_files(&workflow, Path::new(&stored.spec_path));
        if !rerun.is_empty() || how != Continue::Resume {
            self.store.forget_results(id, &rerun)?;
        }
        if spec_hash(&files) != stored.spec_hash {
            self.store.replace_files(id, &files)?;
        }
        // A command that outlived the crashed process would race its own rerun: stop it first.
        let mut stopped = Vec::new();
        for d in in_doubt {
            if let Some(pgid) = d.leftover {
                crate::process::kill_group(pgid);
                stopped.push((d.name, pgid));
            }
        }
        let reruns = |name: &str| rerun.iter().any(|r| r == resume::step_of(name));
        let prior = stored
            .results
            .iter()
            .filter(|(name, _)| !reruns(name))
            .map(|(name, result)| (name.clone(), result.clone()))
            .collect();
        let (checkpoints, decided) = match how {
            // A step that runs again because its definition changed starts afresh.
            Continue::Resume => (
                stored
                    .checkpoints
                    .iter()
                    .filter(|(name, _)| !reruns(name))
                    .map(|(name, state)| (name.clone(), state.clone()))
                    .collect(),
                decisions(&stored),
            ),
            // A retried step starts afresh and asks again: decisions were for the attempts they were
            // given for.
            Continue::From(_) | Continue::Failed => (HashMap::new(), HashMap::new()),
        };
        Ok(Prepared {
            run_id: id.to_owned(),
            workflow,
            max_parallel: options.max_parallel.unwrap_or(stored.max_parallel),
            workdir: PathBuf::from(&stored.workdir),
            inputs: stored.inputs,
            prior,
            checkpoints,
            decided,
            stopped,
            // The steps `retry --from` runs again run afresh: a cached result would only repeat itself.
            refresh: match how {
                Continue::From(_) => rerun.iter().cloned().collect(),
                Continue::Resume | Continue::Failed => Default::default(),
            },
        })
    }

    /// Runs a prepared run to its end (or until it is stopped or waits for approval), recording it.
    pub async fn execute(
        &self,
        prepared: Prepared,
        attachments: Attachments,
    ) -> Result<Outcome, SessionError> {
        let mut journal = self
            .store
            .journal(&prepared.run_id, attachments.cancel.clone())?;
        // A step that needs labels this process lacks could not run here: the run fails before any
        // step starts (steps whose results it reuses run nowhere).
        let missing: Vec<(String, crate::workflow::Labels)> = prepared
            .workflow
            .missing_labels(&attachments.labels)
            .into_iter()
            .filter(|(step, _)| !prepared.prior.contains_key(step))
            .collect();
        if let Some(refused) = missing_labels_error(&missing) {
            journal.record(Entry::RunEnded {
                status: RunState::Failed,
                outputs: Map::new(),
                error: Some(refused.to_string()),
            });
            journal.close();
            return Err(refused);
        }
        if let Some(to) = attachments.recorded.clone() {
            journal = Arc::new(Told {
                last: std::sync::atomic::AtomicI64::new(self.store.last_event(&prepared.run_id)?),
                inner: journal,
                run_id: prepared.run_id.clone(),
                to,
            });
        }
        let refresh = if attachments.no_cache {
            run::Refresh::All
        } else if prepared.refresh.is_empty() {
            run::Refresh::None
        } else {
            run::Refresh::Steps(Arc::new(prepared.refresh))
        };
        // The entries of every workflow of the run are read once, before it starts: a step's lookup is a
        // hash of its call and a map's.
        let cache = match &prepared.workflow.cached {
            names if names.is_empty() || attachments.no_cache => run::StepCache::of([], refresh),
            names => match self.store.cache_entries(names, crate::store::now_ms()) {
                Ok(entries) => run::StepCache::of(entries, refresh),
                Err(e) => {
                    journal.record(Entry::RunEnded {
                        status: RunState::Failed,
                        outputs: Map::new(),
                        error: Some(e.to_string()),
                    });
                    journal.close();
                    return Err(e.into());
                }
            },
        };
        // `concurrency` bounds the workflow's steps across its runs on workers; in one process, its run's.
        let max_parallel = match &prepared.workflow.spec.concurrency {
            Some(n) => prepared.max_parallel.min(n.value.max(1) as usize),
            None => prepared.max_parallel,
        };
        let options = RunOptions {
            max_parallel,
            workdir: prepared.workdir,
            protected: self.store.location().into_iter().collect(),
            run_id: prepared.run_id.clone(),
            cancel: attachments.cancel,
            events: attachments.events,
            env: std::env::vars().collect(),
            journal: journal.clone(),
            prior: Arc::new(prepared.prior),
            cassette: attachments.cassette,
            checkpoints: Arc::new(std::sync::Mutex::new(prepared.checkpoints)),
            approvals: run::Approvals {
                decided: Arc::new(prepared.decided),
                yes: attachments.yes,
                approver: attachments.approver,
            },
            helper: attachments.helper,
            cache,
            memory_dir: self.store.location(),
            memory: run::MemoryFiles::new(run::memory::MemoryDatabase::of(&*self.store)),
        };
        let report = run::run(Arc::new(prepared.workflow), prepared.inputs, options).await;
        let report = match report {
            Ok(report) => report,
            Err(err) => {
                // Nothing ran: the run ends failed, not resumable.
                journal.record(Entry::RunEnded {
                    status: RunState::Failed,
                    outputs: Map::new(),
                    error: Some(err.to_string()),
                });
                journal.close();
                return Err(err.into());
            }
        };
        // Everything recorded is applied before the caller goes on; the run's lease is released.
        journal.close();
        let unsaved = journal.failure();
        // Ctrl-C leaves the run resumable; `cancel` ends it for good.
        let resumable = report.status == RunStatus::Cancelled
            && self
                .store
                .load(&report.run_id)
                .is_ok_and(|r| r.status == RunState::Interrupted);
        Ok(Outcome {
            report,
            resumable,
            unsaved,
        })
    }

    /// Whether the run could be continued as asked now, without claiming it: what `continue_run` would
    /// refuse, if anything (the spec on disk is validated; nothing is written).
    pub fn check_continue(
        &self,
        id: &str,
        how: Continue<'_>,
        options: &ContinueOptions,
    ) -> Result<(), SessionError> {
        refuse_state(&self.store.load(id)?, how)?;
        self.plan_continuation(id, how, options).map(|_| ())
    }

    /// Records a decision on the calls a paused run waits for (those of `step` only, when given); returns
    /// the requests it decided.
    pub fn decide(
        &self,
        id: &str,
        step: Option<&str>,
        decision: &ApprovalDecision,
    ) -> Result<Vec<ApprovalRequest>, SessionError> {
        let decided = self.store.decide(id, step, decision)?;
        if decided.is_empty() {
            return Err(SessionError::refused(
                format!(
                    "run `{id}` has no call waiting for approval{}",
                    step.map_or_else(String::new, |s| format!(" in step `{s}`"))
                ),
                format!("`archon show {id}` shows where the run stands"),
            ));
        }
        Ok(decided)
    }

    /// Records a decision on exactly one call a paused run waits for: the one whose request has this
    /// `key` (the SHA-256 over run, step, tool and rendered arguments that `archon show` and the server
    /// show with it), so that a decision never applies to arguments the person did not see.
    pub fn decide_call(
        &self,
        id: &str,
        key: &str,
        decision: &ApprovalDecision,
    ) -> Result<ApprovalRequest, SessionError> {
        match self.store.decide_call(id, key, decision)? {
            Some(request) => Ok(request),
            None => Err(SessionError::refused(
                format!("run `{id}` has no call waiting for approval with key `{key}`"),
                format!(
                    "the call was decided already, or its arguments changed: `archon show {id}` shows what it waits for"
                ),
            )),
        }
    }

    /// Records what a person says became of a step in doubt (`archon resolve`): the result of its last
    /// attempt, which was running when the run stopped and left no record. `resume` then reuses it like
    /// any finished step instead of refusing. Only an interrupted run's steps in doubt can be resolved,
    /// and not while a command the step started is still running.
    pub async fn resolve(
        &self,
        id: &str,
        name: &str,
        resolution: &Resolution,
    ) -> Result<(), SessionError> {
        let stored = self.store.load(id)?;
        if stored.status != RunState::Interrupted {
            return Err(SessionError::refused(
                format!(
                    "run `{id}` has no step in doubt: it is `{}`",
                    stored.status.as_str()
                ),
                format!("`archon show {id}` shows where the run stands"),
            ));
        }
        let workflow = current_workflow(Path::new(&stored.spec_path))?;
        let in_doubt = resume::in_doubt(&workflow, &stored);
        let Some(doubt) = in_doubt.iter().find(|d| d.name == name) else {
            let names: Vec<String> = in_doubt.iter().map(|d| format!("`{}`", d.name)).collect();
            return Err(SessionError::refused(
                format!("step `{name}` of run `{id}` is not in doubt"),
                if names.is_empty() {
                    format!("no step of run `{id}` is in doubt: `archon resume {id}` continues it")
                } else {
                    format!("in doubt: {}", names.join(", "))
                },
            ));
        };
        if let Some(pgid) = doubt.leftover {
            return Err(SessionError::refused(
                format!(
                    "step `{name}` of run `{id}` is still running a command (process group `{pgid}`)"
                ),
                format!(
                    "wait for it to end, or stop it with `kill -- -{pgid}`, then resolve the step"
                ),
            ));
        }
        let previous = self.store.claim(id, &[RunState::Interrupted])?;
        let recorded = async {
            let journal = self.store.journal(id, CancellationToken::new())?;
            let (status, output, error) = match &resolution.outcome {
                Resolved::Succeeded(output) => (StepStatus::Succeeded, output.clone(), None),
                Resolved::Failed => (
                    StepStatus::Failed,
                    Json::Null,
                    Some(format!("resolved as failed by {}", resolution.by)),
                ),
            };
            let mut result = StepResult::ended(status, error);
            result.text = run::render::to_text(&output);
            result.output = output;
            journal.record(Entry::StepFinished {
                step: name.to_owned(),
                result: Arc::new(result),
            });
            journal.record(Entry::Event {
                event: RunEvent::StepResolved {
                    step: name.to_owned(),
                    status,
                    by: resolution.by.clone(),
                    reason: resolution.reason.clone(),
                },
                at_ms: crate::store::now_ms(),
            });
            let flushed = journal.flush().wait().await;
            journal.close();
            flushed
        }
        .await;
        // The run goes back to where it was (interrupted), whatever became of the record.
        self.store.release(id, previous)?;
        recorded?;
        Ok(())
    }

    /// Stops a run for good.
    pub fn cancel(&self, id: &str) -> Result<Cancelled, SessionError> {
        match self.store.cancel(id)? {
            RunState::Cancelled => Ok(Cancelled::Now),
            RunState::Running => Ok(Cancelled::Asked),
            state => Err(SessionError::refused(
                format!("run `{id}` already ended: `{}`", state.as_str()),
                "`archon retry` runs steps of an ended run again",
            )),
        }
    }

    /// The workflow a claimed run continues with, the steps that run again, and the steps in doubt;
    /// refuses when steps in doubt may not be repeated or the spec changed unasked.
    fn plan_continuation(
        &self,
        id: &str,
        how: Continue<'_>,
        options: &ContinueOptions,
    ) -> Result<Continuation, SessionError> {
        let stored = self.store.load(id)?;
        let spec_path = PathBuf::from(&stored.spec_path);
        let workflow = current_workflow(&spec_path)?;
        let files = spec_files(&workflow, &spec_path);
        let mut rerun: Vec<String> = Vec::new();
        if spec_hash(&files) != stored.spec_hash {
            let old = self.store.files(id)?;
            let changed = changed_steps(&spec_path, &old, &workflow);
            if !options.allow_changed_spec {
                return Err(SessionError::refused(
                    format!(
                        "the spec changed since run `{id}` started: {}",
                        if changed.is_empty() {
                            "a sub-workflow or the formatting changed".to_owned()
                        } else {
                            format!("changed: {}", quoted(&changed))
                        }
                    ),
                    "`--allow-changed-spec` continues with the spec as it is now; changed steps run again",
                ));
            }
            // A change outside the steps (tools, inputs, a sub-workflow) may affect any step: all run again.
            let steps = step_ids(&workflow);
            if changed.is_empty() || changed.iter().any(|c| !steps.contains(&c.as_str())) {
                rerun.extend(steps.iter().map(|s| (*s).to_owned()));
            } else {
                for step in &changed {
                    rerun.extend(resume::downstream(&workflow, step));
                }
            }
        }
        match how {
            Continue::Resume => {}
            Continue::From(step) => {
                if !workflow.spec.steps.iter().any(|s| s.id.value == step) {
                    return Err(SessionError::refused(
                        format!("workflow `{}` has no step `{step}`", workflow.name),
                        format!("its steps are {}", quoted(&step_ids(&workflow))),
                    ));
                }
                rerun.extend(resume::downstream(&workflow, step));
            }
            Continue::Failed => {
                let failed = resume::failed_steps(&workflow, &stored);
                // Steps the run never finished (it timed out, or was interrupted) run again too, being
                // without a result to reuse.
                let unfinished = workflow
                    .spec
                    .steps
                    .iter()
                    .any(|s| !stored.results.contains_key(s.id.value.as_str()));
                if failed.is_empty() && !unfinished {
                    return Err(SessionError::refused(
                        format!("run `{id}` has no failed step"),
                        format!(
                            "`archon retry {id} --from STEP` runs a step and everything after it again"
                        ),
                    ));
                }
                rerun.extend(failed);
            }
        }
        let in_doubt = resume::in_doubt(&workflow, &stored);
        let doubtful: Vec<&resume::InDoubt> = in_doubt
            .iter()
            .filter(|d| !d.idempotent && !rerun.contains(&d.step))
            .collect();
        if !doubtful.is_empty() && !options.rerun_in_doubt {
            return Err(in_doubt_refusal(id, &doubtful));
        }
        Ok(Continuation {
            workflow,
            stored,
            rerun,
            in_doubt,
        })
    }
}

/// What a claimed run continues with, before its results are forgotten.
struct Continuation {
    workflow: Workflow,
    stored: StoredRun,
    /// Steps to run again whatever they recorded.
    rerun: Vec<String>,
    in_doubt: Vec<resume::InDoubt>,
}

/// Refuses, before claiming it, a run whose state does not allow what is asked.
fn refuse_state(stored: &StoredRun, how: Continue<'_>) -> Result<(), SessionError> {
    let id = &stored.id;
    match (stored.status, how) {
        (RunState::Running, _) => {
            let owner = stored.owner.as_ref().map_or_else(String::new, |o| {
                format!(" by process `{}` on `{}`", o.pid, o.host)
            });
            Err(SessionError::refused(
                format!("run `{id}` is being run{owner}"),
                "wait for it to finish, or stop it with `archon cancel`",
            ))
        }
        (RunState::Cancelled, _) => Err(SessionError::refused(
            format!("run `{id}` was cancelled"),
            "start a new run with `archon run`",
        )),
        (RunState::Succeeded | RunState::Failed, Continue::Resume) => Err(SessionError::refused(
            format!("run `{id}` already ended: `{}`", stored.status.as_str()),
            format!("`archon retry {id} --from STEP` runs a step and everything after it again"),
        )),
        (RunState::Succeeded, Continue::Failed) => Err(SessionError::refused(
            format!("run `{id}` has no failed step: it succeeded"),
            format!("`archon retry {id} --from STEP` runs a step and everything after it again"),
        )),
        (RunState::WaitingApproval, Continue::From(_) | Continue::Failed) => {
            Err(SessionError::refused(
                format!("run `{id}` is waiting for approval"),
                format!("`archon approve {id}` (or `--deny`), then `archon resume {id}`"),
            ))
        }
        _ => Ok(()),
    }
}

/// The refusal to continue a run whose steps in doubt may not be repeated.
fn in_doubt_refusal(id: &str, doubtful: &[&resume::InDoubt]) -> SessionError {
    let names: Vec<String> = doubtful
        .iter()
        .map(|d| match d.leftover {
            Some(pgid) => format!(
                "`{}` (its command is still running: process group `{pgid}`)",
                d.name
            ),
            None => format!("`{}`", d.name),
        })
        .collect();
    let one = names.len() == 1;
    SessionError::refused(
        format!(
            "run `{id}` stopped while {} running, and {} may have had {} effect: {}",
            if one { "a step was" } else { "steps were" },
            if one { "it" } else { "they" },
            if one { "its" } else { "their" },
            names.join(", ")
        ),
        format!(
            "check what it did, then `archon resolve {id} STEP --succeeded` (or `--failed`) records it; \
             `--rerun-in-doubt` runs it again anyway (a step that is safe to repeat says so with \
             `idempotent: true`, on the step or on its tool)"
        ),
    )
}

/// The spec as it is now on disk, validated.
fn current_workflow(path: &Path) -> Result<Workflow, SessionError> {
    let mut validation = validate_file(path);
    match validation.workflow.take() {
        Some(workflow) if !validation.has_errors() => Ok(workflow),
        _ => Err(SessionError::Invalid {
            path: path.to_path_buf(),
            validation: Box::new(validation),
        }),
    }
}

/// The steps that differ between the spec a run started with (its stored main file) and `now`.
fn changed_steps(path: &Path, old: &[(String, String)], now: &Workflow) -> Vec<String> {
    let Some((_, text)) = old.first() else {
        return Vec::new();
    };
    match validate_source(path, text.clone()).workflow {
        Some(before) => resume::changed_steps(&before.spec, &now.spec),
        None => vec!["(workflow)".to_owned()],
    }
}

/// The decisions on a run's calls that asked: recorded ones, and the rule's default for requests whose
/// timeout passed while nobody decided.
fn decisions(run: &StoredRun) -> HashMap<String, ApprovalDecision> {
    let now = crate::store::now_ms();
    run.approvals
        .iter()
        .filter_map(|a| {
            let decision = a.decision.clone().or_else(|| {
                let limit = a.request.timeout_ms?;
                (now.saturating_sub(a.requested_at) >= limit)
                    .then(|| ApprovalDecision::timed_out(a.request.approve_on_timeout))
            })?;
            Some((a.request.key.clone(), decision))
        })
        .collect()
}

/// The workflow's files as a run stores them: paths relative to the spec's directory, and text.
fn spec_files(workflow: &Workflow, spec_path: &Path) -> Vec<(String, String)> {
    let base = spec_path.parent().unwrap_or(Path::new(""));
    workflow
        .sources
        .iter()
        .map(|file| {
            let path = std::fs::canonicalize(&file.path).unwrap_or_else(|_| file.path.clone());
            let shown = path.strip_prefix(base).unwrap_or(&path);
            (shown.display().to_string(), file.text.clone())
        })
        .collect()
}

fn step_ids(workflow: &Workflow) -> Vec<&str> {
    workflow
        .spec
        .steps
        .iter()
        .map(|s| s.id.value.as_str())
        .collect()
}

fn quoted(names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A usage error about which run was meant (exit 2).
fn unknown(message: impl Into<String>, hint: &str) -> StoreError {
    StoreError {
        unknown_run: true,
        ..StoreError::new(message).with_hint(hint)
    }
}

/// Writes the one-step workflow of a goal (`archon run --goal`) into the state directory, where a resume
/// finds it again; returns its path.
pub fn write_goal_workflow(
    state_dir: &Path,
    goal: &str,
    id: &str,
) -> Result<PathBuf, SessionError> {
    let text = crate::goal::goal_spec(goal).map_err(SessionError::Goal)?;
    let dir = state_dir.join("goals");
    let path = dir.join(format!("{id}.yaml"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, text)) {
        Ok(()) => Ok(path),
        Err(source) => Err(SessionError::Write { path, source }),
    }
}

/// Writes `workflow` with the plans its run made frozen into composite tools (`--save-plan`), after
/// checking that the result validates.
pub fn save_plan(workflow: &Workflow, report: &RunReport, path: &Path) -> Result<(), String> {
    let text = crate::freeze::freeze_plans(workflow, &report.steps, path)?;
    let check = validate_source(path, text.clone());
    if let Some(problem) = check.diagnostics.iter().find(|d| d.is_error()) {
        return Err(format!(
            "the frozen workflow does not validate: {}",
            problem.message
        ));
    }
    std::fs::write(path, text).map_err(|e| {
        format!(
            "cannot write `{}`: {}",
            path.display(),
            e.to_string().to_lowercase()
        )
    })
}

/// Who a person's decision (`archon approve`, `archon resolve`) is recorded as: the name given (`--as`),
/// else the user running the command (`$USER`, else the name the system gives its user id), else the
/// user id.
pub fn person(given: Option<&str>) -> String {
    if let Some(name) = given.map(str::trim).filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    if let Some(user) = std::env::var("USER").ok().filter(|u| !u.trim().is_empty()) {
        return user;
    }
    let uid = nix::unistd::getuid();
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}
