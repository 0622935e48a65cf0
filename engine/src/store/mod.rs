//! Run state: what a run records as it goes (the [`Journal`]) and where runs are kept (a [`RunStore`]).
//!
//! The scheduler writes through a `Journal`: an attempt is recorded as running, and the record is durable,
//! before the attempt's side effect starts; a step's result is durable before any step that depends on it
//! starts. [`MemoryJournal`] keeps nothing (runs embedded without a store); [`sqlite::SqliteStore`] keeps
//! everything in an embedded SQLite database. docs/durability.md says exactly what is synced when.

#[cfg(test)]
pub(crate) mod conformance;
mod convert;
pub mod postgres;
pub mod sqlite;

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};
use tokio::sync::oneshot;

use crate::report::{RunEvent, StepResult};

/// Where a process keeps its runs: always a state directory (local files: memory, a server's restart
/// file, and the embedded SQLite store), and optionally a server database that holds the runs instead.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoreAt {
    pub state_dir: PathBuf,
    /// A PostgreSQL URL (`--store`, `ARCHON_STORE`): the runs are kept there.
    pub url: Option<String>,
}

/// Shows the URL with its password masked.
impl fmt::Debug for StoreAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreAt")
            .field("state_dir", &self.state_dir)
            .field("url", &self.url.as_deref().map(postgres::masked))
            .finish()
    }
}

impl StoreAt {
    /// The runs kept in the state directory's SQLite store.
    pub fn dir(state_dir: impl Into<PathBuf>) -> Self {
        StoreAt {
            state_dir: state_dir.into(),
            url: None,
        }
    }

    /// How messages name the store: its URL with the password masked, or the state directory.
    pub fn shown(&self) -> String {
        match &self.url {
            Some(url) => postgres::masked(url),
            None => self.state_dir.display().to_string(),
        }
    }

    /// Refuses a URL no store of this archon opens.
    pub fn check(&self) -> Result<(), StoreError> {
        match &self.url {
            Some(url) if !postgres::is_postgres_url(url) => Err(postgres::refused_url(url)),
            _ => Ok(()),
        }
    }
}

/// How many [`sqlite::ServingMark`]s this process holds: while it holds one, it serves several runs at
/// once, and a server store records that with the runs it owns, so that `cancel` from another state
/// directory asks through the store instead of signalling the whole process.
pub(crate) static SERVING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether this process serves several runs at once.
pub(crate) fn serving() -> bool {
    SERVING.load(std::sync::atomic::Ordering::SeqCst) > 0
}

/// Opens (or creates) the run store `at` names.
pub fn open(at: &StoreAt) -> Result<Box<dyn RunStore>, StoreError> {
    at.check()?;
    Ok(match &at.url {
        Some(url) => Box::new(postgres::PostgresStore::open(
            url,
            Some(at.state_dir.clone()),
        )?),
        None => Box::new(sqlite::SqliteStore::open(&at.state_dir)?),
    })
}

/// Opens the run store `at` names when it exists (`Ok(None)` when there is none yet): for a request
/// that only reads or changes existing runs.
pub fn open_existing(at: &StoreAt) -> Result<Option<Box<dyn RunStore>>, StoreError> {
    at.check()?;
    match &at.url {
        Some(url) => Ok(
            postgres::PostgresStore::open_existing(url, Some(at.state_dir.clone()))?
                .map(|s| Box::new(s) as Box<dyn RunStore>),
        ),
        None if !at.state_dir.join(sqlite::DATABASE).exists() => Ok(None),
        None => open(at).map(Some),
    }
}

/// A problem with the run store: it cannot be opened, is damaged, or a write failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    pub message: String,
    pub hint: Option<String>,
    /// The run asked for does not exist (a usage problem, not a store failure).
    pub unknown_run: bool,
    /// Another process took the run over (its lease had lapsed): this one stopped recording it, and the
    /// run goes on there.
    pub taken_over: bool,
}

impl StoreError {
    pub fn new(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
            hint: None,
            unknown_run: false,
            taken_over: false,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

/// One thing a run records.
#[derive(Clone, Debug)]
pub enum Entry {
    /// An attempt of a step (or of one `foreach` item, `step[i]`) is about to call its tool.
    AttemptStarted { step: String, fallback: bool },
    /// That attempt started a command, in process group `pgid` (its leader started at `started`, in clock
    /// ticks since boot, to tell it from a later process with the same id).
    ProcessStarted {
        step: String,
        pgid: u32,
        started: Option<u64>,
    },
    /// That attempt ended.
    AttemptEnded {
        step: String,
        status: crate::report::StepStatus,
        error: Option<String>,
    },
    /// A step (or `foreach` item) has its final result; a resumed run reuses it.
    StepFinished {
        step: String,
        /// Shared with the run, which keeps it too: a large result is not copied to be recorded.
        result: std::sync::Arc<StepResult>,
    },
    /// A call asked for a person's approval and the run pauses for it.
    ApprovalRequested(crate::report::ApprovalRequest),
    /// A decision on a call that asked (made while running: `--yes`, a person at the terminal, a timeout).
    ApprovalDecided {
        key: String,
        decision: crate::report::ApprovalDecision,
    },
    /// Where an LLM step (agent or planner) stands after an iteration, so that a resume continues it
    /// there instead of starting over; the latest replaces the one before.
    Checkpoint { step: String, state: Json },
    /// What a command of the attempt of `step` under way wrote (whole lines, secrets masked); `source`
    /// is the label of the call that ran it (`outer/inner` inside a composite tool).
    Output {
        step: String,
        source: String,
        stream: crate::tools::Stream,
        text: String,
        at_ms: u64,
    },
    /// A progress event, for the event log, stamped (milliseconds since the epoch) when it happened.
    Event { event: RunEvent, at_ms: u64 },
    /// A successful result of a step with `cache`, kept for later runs under `key` (a SHA-256 of what
    /// the result depends on; never the rendered arguments themselves). `source` is the step or item
    /// of this run that produced it; `result` is masked like every recorded result.
    Cached {
        key: String,
        workflow: String,
        step: String,
        source: String,
        result: std::sync::Arc<StepResult>,
        /// How long (milliseconds) from when it is written the result may be reused; `None`: until
        /// cleared.
        ttl_ms: Option<u64>,
    },
    /// The run ended (or was interrupted, when `status` is `interrupted`).
    RunEnded {
        status: RunState,
        outputs: Map<String, Json>,
        error: Option<String>,
    },
}

/// Resolves once everything recorded before it is durable (or failed to be).
#[derive(Debug)]
pub struct Ack(AckState);

#[derive(Debug)]
enum AckState {
    Done,
    Failed(StoreError),
    Pending(oneshot::Receiver<Result<(), StoreError>>),
}

impl Ack {
    /// Already durable, or nothing to wait for.
    pub fn done() -> Self {
        Ack(AckState::Done)
    }

    pub fn failed(error: StoreError) -> Self {
        Ack(AckState::Failed(error))
    }

    pub fn pending(receiver: oneshot::Receiver<Result<(), StoreError>>) -> Self {
        Ack(AckState::Pending(receiver))
    }

    pub async fn wait(self) -> Result<(), StoreError> {
        match self.0 {
            AckState::Done => Ok(()),
            AckState::Failed(error) => Err(error),
            AckState::Pending(receiver) => receiver
                .await
                .unwrap_or_else(|_| Err(StoreError::new("the run store stopped"))),
        }
    }
}

/// Where a run records its progress as it happens. Entries are applied in the order recorded, so when a
/// [`Journal::flush`] resolves, everything recorded before it is durable.
pub trait Journal: Send + Sync + fmt::Debug {
    /// Records `entry`, without waiting.
    fn record(&self, entry: Entry);
    /// Resolves once everything recorded so far is durable.
    fn flush(&self) -> Ack;
    /// Applies everything recorded, then stops recording; the run's owner lets go of it.
    fn close(&self) {}
    /// The write that failed, once one has: nothing recorded after it is kept, and the run must stop
    /// as failed (not as interrupted by a person, although the journal stops it the same way).
    fn failure(&self) -> Option<StoreError> {
        None
    }
}

/// One piece of what a command of a run wrote: whole lines (or part of a long one), secrets masked.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LogChunk {
    /// Its place in the run's output, from 1.
    pub seq: i64,
    /// The run's step (or `foreach` item) whose attempt ran the command.
    pub step: String,
    pub attempt: u32,
    /// The call that ran it: the step itself, or `step/inner` inside a composite tool or sub-workflow.
    pub source: String,
    pub stream: crate::tools::Stream,
    pub text: String,
    pub at_ms: u64,
}

/// The requests of run `id` (loaded as `run`) that a decision at `now` may still answer, those `select` picks:
/// undecided, and not past their rule's timeout (those are decided by the rule's default, not by a
/// late answer). An error when the run does not wait for approval.
pub(crate) fn pending_approvals(
    run: StoredRun,
    id: &str,
    now: u64,
    select: impl Fn(&crate::report::ApprovalRequest) -> bool,
) -> Result<Vec<crate::report::ApprovalRequest>, StoreError> {
    if run.status != RunState::WaitingApproval {
        let mut error = StoreError::new(format!(
            "run `{id}` is not waiting for approval: it is `{}`",
            run.status.as_str()
        ));
        error.unknown_run = true;
        return Err(error);
    }
    Ok(run
        .approvals
        .into_iter()
        .filter(|a| a.decision.is_none())
        .filter(|a| {
            a.request
                .timeout_ms
                .is_none_or(|t| now.saturating_sub(a.requested_at) < t)
        })
        .map(|a| a.request)
        .filter(|r| select(r))
        .collect())
}

/// Whether an approval request was asked by `step` (or by a call inside it: `step/inner`, `step[i]`),
/// or by any step when `step` is `None`: what `RunStore::decide` decides.
pub(crate) fn asked_within(request: &crate::report::ApprovalRequest, step: Option<&str>) -> bool {
    step.is_none_or(|s| {
        request.step == s
            || request.step.starts_with(&format!("{s}/"))
            || request.step.starts_with(&format!("{s}["))
    })
}

/// How much of each stream of each attempt's output a journal has kept: at most
/// [`sqlite::MAX_LOG_BYTES`], with a note where it was cut. Both stores' journals apply it.
#[derive(Clone, Debug, Default)]
pub(crate) struct LogBudget(
    std::collections::HashMap<(String, crate::tools::Stream), (u32, usize)>,
);

impl LogBudget {
    /// What to keep of `text`, written by attempt `attempt` of `step` on `stream`: all of it, its start
    /// and the note once the limit is reached, or nothing after that.
    pub(crate) fn keep(
        &mut self,
        step: &str,
        attempt: u32,
        stream: crate::tools::Stream,
        text: &str,
    ) -> Option<String> {
        use sqlite::MAX_LOG_BYTES;
        let kept = self
            .0
            .entry((step.to_owned(), stream))
            .or_insert((attempt, 0));
        if kept.0 != attempt {
            *kept = (attempt, 0);
        }
        if kept.1 >= MAX_LOG_BYTES {
            return None;
        }
        kept.1 += text.len();
        Some(if kept.1 >= MAX_LOG_BYTES {
            let cut = crate::text::floor_boundary(text, text.len() - (kept.1 - MAX_LOG_BYTES));
            format!(
                "{}\n[archon: the rest of this attempt's {} is not kept: more than {} MiB]\n",
                &text[..cut],
                stream.as_str(),
                MAX_LOG_BYTES / (1024 * 1024)
            )
        } else {
            text.to_owned()
        })
    }
}

/// What kind of trigger fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FiringKind {
    Cron,
    Webhook,
    /// Not a trigger: a run started from `archon serve`'s API or pages that has to wait in the server's
    /// queue, recorded (under [`API_TRIGGER`]) so that it can be seen and cancelled from elsewhere and
    /// the next server starts it.
    Api,
}

/// The trigger name the firings of kind [`FiringKind::Api`] are recorded under.
pub const API_TRIGGER: &str = "(api)";

impl FiringKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FiringKind::Cron => "cron",
            FiringKind::Webhook => "webhook",
            FiringKind::Api => "api",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "cron" => Some(FiringKind::Cron),
            "webhook" => Some(FiringKind::Webhook),
            "api" => Some(FiringKind::Api),
            _ => None,
        }
    }
}

/// What became of a firing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FiringOutcome {
    /// Its run starts now (after the previous one was cancelled, when `reason` says so).
    Started,
    /// Its run starts once the runs the trigger started before it have ended.
    Queued,
    /// No run: the previous run was still going (`overlap: skip`), or too many were queued.
    Skipped,
    /// No run: an authenticated delivery whose body was refused (`reason` says why).
    Refused,
}

impl FiringOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            FiringOutcome::Started => "started",
            FiringOutcome::Queued => "queued",
            FiringOutcome::Skipped => "skipped",
            FiringOutcome::Refused => "refused",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "started" => FiringOutcome::Started,
            "queued" => FiringOutcome::Queued,
            "skipped" => FiringOutcome::Skipped,
            "refused" => FiringOutcome::Refused,
            _ => return None,
        })
    }
}

/// One firing of a trigger, recorded before the run it starts: a restart finds it and neither fires its
/// slot again nor loses its run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Firing {
    pub workflow: String,
    /// The trigger's name (`name:`, or the one derived from its definition).
    pub trigger: String,
    pub kind: FiringKind,
    /// What fired, unique per workflow and trigger: for a cron trigger the scheduled instant in RFC 3339
    /// (UTC, to the second), for a webhook the delivery id.
    pub slot: String,
    /// Milliseconds since the Unix epoch: the scheduled instant, or when the delivery came.
    pub slot_at: u64,
    /// Milliseconds since the Unix epoch: when the firing was recorded.
    pub fired_at: u64,
    /// The run it starts or queues (`started`, `queued`); the run gets this id when it is created.
    pub run_id: Option<String>,
    pub outcome: FiringOutcome,
    /// Why it was skipped or refused, or which run it cancelled.
    pub reason: Option<String>,
    /// The inputs its run starts with (empty in listings, which leave them out).
    pub inputs: Map<String, Json>,
}

/// What the store knows of a trigger between firings: since when a server has watched it, and the last
/// slot it fired (kept when the firings themselves are pruned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TriggerMark {
    /// Milliseconds since the Unix epoch: when a server first watched the trigger.
    pub armed_at: u64,
    /// The scheduled instant of the last slot recorded, if any.
    pub last_slot_at: Option<u64>,
}

/// Which firings a listing shows, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FiringFilter {
    pub workflow: Option<String>,
    pub trigger: Option<String>,
    /// At most this many.
    pub limit: Option<usize>,
}

/// Where runs are kept: what the CLI needs to start, list, show, resume, retry and cancel runs.
/// [`sqlite::SqliteStore`] is the embedded implementation; a server database can implement the same.
pub trait RunStore: Send + Sync + fmt::Debug {
    /// The directory the store keeps its files in, if it has one: file tools refuse it.
    fn location(&self) -> Option<PathBuf> {
        None
    }
    /// Where agents' long-term memory lives when not in files of the state directory: the store's own
    /// database (PostgreSQL), which every host that uses the store shares (`run::memory::MemoryDatabase`).
    fn memory_database(&self) -> Option<postgres::PostgresStore> {
        None
    }
    /// Records a new run, owned by this process, with its spec files and inputs.
    fn create_run(&self, run: &NewRun) -> Result<(), StoreError>;
    /// Takes ownership of a run no live process owns, when it is in one of the `allowed` states (to
    /// resume or retry it); returns the state it was in. Decide what to do with the run after claiming it,
    /// from a fresh [`RunStore::load`], so that no other process can change it in between.
    fn claim(&self, id: &str, allowed: &[RunState]) -> Result<RunState, StoreError>;
    /// Gives up a claimed run without running it, leaving it in `status`.
    fn release(&self, id: &str, status: RunState) -> Result<(), StoreError>;
    /// Starts a new generation of the run, forgetting the final results of `steps` (and their items).
    fn forget_results(&self, id: &str, steps: &[String]) -> Result<u32, StoreError>;
    /// Records a decision on the pending approvals of a run waiting for approval (of `step` only, when
    /// given); returns the requests it decided.
    fn decide(
        &self,
        id: &str,
        step: Option<&str>,
        decision: &crate::report::ApprovalDecision,
    ) -> Result<Vec<crate::report::ApprovalRequest>, StoreError>;
    /// Asks a run to stop for good; returns where it stands.
    fn cancel(&self, id: &str) -> Result<RunState, StoreError>;
    /// The runs, newest first.
    fn list(&self) -> Result<Vec<RunSummary>, StoreError>;
    /// The runs `filter` selects, newest first.
    fn list_where(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
        let mut runs: Vec<RunSummary> = self
            .list()?
            .into_iter()
            .filter(|r| filter.selects(r))
            .collect();
        if let Some(limit) = filter.limit {
            runs.truncate(limit);
        }
        Ok(runs)
    }
    /// The runs whose id starts with `prefix`, in id order (at most `limit` of them), and how many there
    /// are in all.
    fn with_prefix(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<RunSummary>, usize), StoreError> {
        let mut runs: Vec<RunSummary> = self
            .list()?
            .into_iter()
            .filter(|r| r.id.starts_with(prefix))
            .collect();
        runs.sort_by(|a, b| a.id.cmp(&b.id));
        let count = runs.len();
        runs.truncate(limit);
        Ok((runs, count))
    }
    /// Deletes the finished runs (succeeded, failed or cancelled) that ended before `finished_before`
    /// (milliseconds since the epoch), with everything they own, in one transaction; with `dry_run`, only
    /// says what it would delete.
    fn prune(&self, finished_before: u64, dry_run: bool) -> Result<Pruned, StoreError> {
        let _ = (finished_before, dry_run);
        Err(StoreError::new("this run store cannot prune runs"))
    }
    /// One page of the runs `query` selects, newest first, with how many it selects in all.
    fn page(&self, query: &RunQuery) -> Result<RunPage, StoreError> {
        let mut runs: Vec<RunSummary> = self
            .list()?
            .into_iter()
            .filter(|r| query.selects(r))
            .collect();
        let total = runs.len();
        if let Some(after) = &query.after {
            runs.retain(|r| (r.started_at, r.id.as_str()) < (after.started_at, after.id.as_str()));
        }
        let next = (runs.len() > query.limit).then(|| {
            let last = &runs[query.limit - 1];
            RunCursor {
                started_at: last.started_at,
                id: last.id.clone(),
            }
        });
        runs.truncate(query.limit);
        Ok(RunPage { runs, total, next })
    }
    /// The run with exactly this id, as `list` shows it, if there is one.
    fn summary(&self, id: &str) -> Result<Option<RunSummary>, StoreError> {
        Ok(self.with_prefix(id, 1)?.0.into_iter().find(|r| r.id == id))
    }
    /// The runs that may have changed at or after `since` (milliseconds since the epoch): those started
    /// or ended since, and those running or waiting for approval, newest first.
    fn changed_since(&self, since: u64) -> Result<Vec<RunSummary>, StoreError> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|r| {
                r.started_at >= since
                    || r.finished_at.is_some_and(|f| f >= since)
                    || matches!(r.status, RunState::Running | RunState::WaitingApproval)
            })
            .collect())
    }
    /// A number that changes whenever another connection commits a change to the store (cheap enough to
    /// ask many times a second); a store that cannot tell says `None`.
    fn changes(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }
    /// The events of a run's log numbered after `after` (from 1), at most `limit` of them, in order, each
    /// with its number.
    fn events_after(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Json)>, StoreError> {
        Ok((1_i64..)
            .zip(self.events(id)?)
            .skip_while(|(seq, _)| *seq <= after)
            .take(limit)
            .collect())
    }
    /// The number of the last event of a run's log (0 when it has none).
    fn last_event(&self, id: &str) -> Result<i64, StoreError> {
        Ok(self.events(id)?.len() as i64)
    }
    /// What a run's commands wrote after the piece numbered `after`, at most `limit` pieces, in order.
    fn logs_after(&self, id: &str, after: i64, limit: usize) -> Result<Vec<LogChunk>, StoreError> {
        let mut logs = self.logs(id, after)?;
        logs.truncate(limit);
        Ok(logs)
    }
    /// Records a decision on the one pending call of a run waiting for approval whose request has this
    /// `key` (the SHA-256 over run, step, tool and arguments); returns the request, or `None` when no
    /// pending call has that key.
    fn decide_call(
        &self,
        id: &str,
        key: &str,
        decision: &crate::report::ApprovalDecision,
    ) -> Result<Option<crate::report::ApprovalRequest>, StoreError> {
        let _ = (id, key, decision);
        Err(StoreError::new(
            "this run store cannot decide one call by its key",
        ))
    }
    /// Everything about one run.
    fn load(&self, id: &str) -> Result<StoredRun, StoreError>;
    /// One run without the step outputs and texts a store keeps apart because they are large (those
    /// outputs read as null and those texts as empty): what a summary of the run needs.
    fn load_brief(&self, id: &str) -> Result<StoredRun, StoreError> {
        self.load(id)
    }
    /// The spec files a run was started with.
    fn files(&self, id: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// Replaces a run's spec files (continuing with a changed spec).
    fn replace_files(&self, id: &str, files: &[(String, String)]) -> Result<(), StoreError>;
    /// The run's event log, in order.
    fn events(&self, id: &str) -> Result<Vec<Json>, StoreError>;
    /// What the run's commands wrote after the piece numbered `after` (0 for all), in order.
    fn logs(&self, id: &str, after: i64) -> Result<Vec<LogChunk>, StoreError>;
    /// Reads the whole store and says what is wrong with it: damaged pages, and every row that does not
    /// decode. Costs time in proportion to the store's size (opening it does not).
    fn check(&self) -> Result<Vec<String>, StoreError>;
    /// The cached results of steps of `workflows` that have not expired at `now` (milliseconds since the
    /// epoch): what a run may reuse.
    fn cache_entries(&self, workflows: &[String], now: u64) -> Result<Vec<CacheEntry>, StoreError> {
        let _ = (workflows, now);
        Ok(Vec::new())
    }
    /// The cached results one step of a run may reuse, unexpired at `now`: those of step `step` of
    /// workflow `workflow`, and every one of the workflows in `others` (the sub-workflows it may call).
    /// A worker reads these for each step it runs, rather than every entry of the step's workflow.
    fn step_cache_entries(
        &self,
        workflow: &str,
        step: &str,
        others: &[String],
        now: u64,
    ) -> Result<Vec<CacheEntry>, StoreError> {
        let mut names = vec![workflow.to_owned()];
        for name in others {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        let mut entries = self.cache_entries(&names, now)?;
        entries.retain(|e| {
            others.contains(&e.summary.workflow)
                || (e.summary.workflow == workflow && e.summary.step == step)
        });
        Ok(entries)
    }
    /// Every cached result, without its output, newest first.
    fn cache_list(&self) -> Result<Vec<CacheSummary>, StoreError> {
        Ok(Vec::new())
    }
    /// Removes the cached results `filter` selects (expiry judged at `now`); returns how many.
    fn cache_clear(&self, filter: &CacheFilter, now: u64) -> Result<usize, StoreError> {
        let _ = (filter, now);
        Ok(0)
    }
    /// Records a firing of a trigger unless its slot (`workflow`, `trigger`, `slot`) is already recorded;
    /// says whether it was new. Durable when it returns: a firing is recorded before its run starts.
    fn record_firing(&self, firing: &Firing) -> Result<bool, StoreError> {
        let _ = firing;
        Err(StoreError::new(
            "this run store cannot record trigger firings",
        ))
    }
    /// The latest firing of a trigger (by slot time), without its inputs.
    fn last_firing(&self, workflow: &str, trigger: &str) -> Result<Option<Firing>, StoreError> {
        let _ = (workflow, trigger);
        Ok(None)
    }
    /// The firings `filter` selects, newest first, without their inputs.
    fn firings(&self, filter: &FiringFilter) -> Result<Vec<Firing>, StoreError> {
        let _ = filter;
        Ok(Vec::new())
    }
    /// The firings recorded with a run (`started`, `queued`) whose run was never created (a server stopped
    /// in between), oldest first, with their inputs.
    fn unstarted_firings(&self) -> Result<Vec<Firing>, StoreError> {
        Ok(Vec::new())
    }
    /// Records as dropped the firing whose run is `run_id` when that run was never created: its outcome
    /// becomes `skipped`, with `reason`, and it names no run any more, so that no server starts it (a
    /// queued firing an `overlap: cancel_previous` firing replaced before its run started). Says whether a
    /// firing changed: `false` when none names that run, or its run exists. Durable when it returns.
    ///
    /// A store that records firings implements it (one conditional update of the firing, in the same
    /// transaction as the check that the run does not exist); the default refuses, as
    /// [`RunStore::record_firing`]'s does.
    fn skip_unstarted_firing(&self, run_id: &str, reason: &str) -> Result<bool, StoreError> {
        let _ = (run_id, reason);
        Err(StoreError::new(
            "this run store cannot record a firing as skipped",
        ))
    }
    /// Marks a trigger as watched from `now` (milliseconds since the epoch) unless it already is; returns
    /// what the store knows of it.
    fn arm_trigger(
        &self,
        workflow: &str,
        trigger: &str,
        now: u64,
    ) -> Result<TriggerMark, StoreError> {
        let _ = (workflow, trigger, now);
        Err(StoreError::new("this run store cannot keep triggers"))
    }
    /// Starts recording a run this process owns; `cancel` is cancelled when the run is asked to stop.
    fn journal(
        &self,
        id: &str,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<std::sync::Arc<dyn Journal>, StoreError>;

    /// The store's task table, when runs can be submitted to workers (PostgreSQL): `None` otherwise.
    fn tasks(&self) -> Option<&dyn Tasks> {
        None
    }
}

/// One step of a submitted run that a worker claimed: its lease is `token` until it is done or lapses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub run_id: String,
    pub step: String,
    /// The lease's token: the task's journal writes only while the task still carries it.
    pub token: String,
    /// How many times the task has been claimed, this claim included.
    pub claims: u32,
    /// When the claim was sent: the lease it took runs from then.
    pub leased_at: std::time::Instant,
}

/// Where the steps of a run submitted to workers may run, and how many of its workflow's at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routing {
    /// The labels a worker needs to run each step (`runs_on`, with its tools' and sub-workflows'); steps
    /// that need none are left out.
    pub labels: Vec<(String, Vec<String>)>,
    /// Most steps of the run's workflow running at once, across all its runs (its `concurrency`).
    pub workflow_limit: Option<u32>,
}

/// A worker (`archon worker`) as it registers itself in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Unique among workers: its host, process and start.
    pub name: String,
    pub host: String,
    pub pid: u32,
    /// It takes only steps whose labels are all among these.
    pub labels: Vec<String>,
    /// Most steps it runs at once.
    pub concurrency: usize,
    /// Most steps running at once on all workers together, as this worker sees it.
    pub global_limit: Option<u32>,
}

/// A live worker (its registration has not lapsed), as `archon workers` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LiveWorker {
    pub name: String,
    pub host: String,
    pub pid: u32,
    /// It takes only steps whose labels are all among these.
    pub labels: Vec<String>,
    /// Most steps it runs at once.
    pub concurrency: usize,
    /// Most steps running at once on all workers together, as this worker counts (`--global-limit`).
    pub global_limit: Option<u32>,
    /// The steps it holds now: tasks claimed by it whose lease has not lapsed.
    pub steps: usize,
    /// When it registered, in milliseconds since the Unix epoch.
    pub started_at: u64,
    /// When it last renewed its registration (every third of its lease), in milliseconds since the epoch.
    pub last_seen_at: u64,
    /// When its registration lapses unless renewed, in milliseconds since the epoch.
    pub lease_until: u64,
}

/// A ready step of a submitted run that no worker has taken, and why.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Waiting {
    pub step: String,
    pub reason: String,
}

/// What finishing a task did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finished {
    /// The task is done; these dependents became ready.
    Done(Vec<String>),
    /// Every other step of the run is done: the task stays claimed until its worker has ended the run
    /// ([`Tasks::complete`]), so that a worker dying in between leaves it to another.
    Last,
    /// The task no longer carries this worker's token (its lease lapsed and another took it).
    Lost,
}

/// The journal of a worker's task ([`Tasks::task_journal`]), which also ends the task.
pub trait TaskJournal: Journal {
    /// Marks the task done together with everything recorded so far, in one transaction (the step's
    /// last records and its end are kept together, or neither is; unless more records wait than one
    /// transaction takes, when the first are applied before), and in it makes ready each of
    /// `dependents` (a step and the steps it depends on) whose dependencies are all done; `steps` is how
    /// many steps the run has. Makes nothing ready once the run was asked to stop. The journal goes on
    /// recording (the run's end, on the worker that finished its last step). When every other step of the
    /// run is done, the task is not marked done ([`Finished::Last`]).
    fn finish(&self, dependents: &[(String, Vec<String>)], steps: usize) -> StoreFuture<Finished>;
    /// [`Journal::close`] without holding up the caller's thread: ready once everything recorded was
    /// applied (or could not be) and the journal stopped.
    fn end(&self) -> futures_util::future::BoxFuture<'static, ()>;
}

/// A call a worker makes of the store for every step: it runs on the store's own threads, and awaiting
/// it does not hold up the worker's thread (nor hand that thread's other steps to another thread, as a
/// call that blocks must). The call starts when it is made: dropping the future does not stop it (a
/// claim whose future is dropped leaves its tasks claimed until their leases lapse).
pub type StoreFuture<T> = futures_util::future::BoxFuture<'static, Result<T, StoreError>>;

/// The task table of a store that hands a submitted run's steps to workers (`archon worker`): one row per
/// top-level step once it is ready, claimed under a lease, done once its result is recorded.
pub trait Tasks: Send + Sync {
    /// Records a run submitted to workers (nobody owns it; it shows as running until it ends) and
    /// `ready`, its steps without dependencies, as ready tasks.
    /// `routing` says which labels its steps need and its workflow's limit.
    fn submit(&self, run: &NewRun, routing: &Routing, ready: &[String]) -> Result<(), StoreError>;
    /// Registers a worker (or registers it again) and keeps its registration alive, every third of
    /// `lease`, until `stop` is cancelled; a worker whose registration lapses counts as gone.
    fn register_worker(
        &self,
        worker: &WorkerInfo,
        lease: std::time::Duration,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), StoreError>;
    /// Removes a worker's registration (it stopped).
    fn deregister_worker(&self, name: &str) -> Result<(), StoreError>;
    /// The live workers (their registration has not lapsed), oldest first, each with the steps it holds.
    fn workers(&self) -> Result<Vec<LiveWorker>, StoreError>;
    /// The ready steps of a submitted run no worker has taken, each with why it waits.
    fn waiting(&self, run_id: &str) -> Result<Vec<Waiting>, StoreError>;
    /// Claims up to `limit` ready tasks for the registered worker `worker`, leased for `lease`: only
    /// tasks whose labels the worker has, within each run's `max_parallel`, its workflow's limit and
    /// the worker's global limit, the runs' oldest ready tasks first, round-robin across runs.
    fn claim_tasks(
        &self,
        worker: &str,
        limit: usize,
        lease: std::time::Duration,
    ) -> StoreFuture<Vec<Task>>;
    /// Run `id` with the results, attempts and checkpoints of `steps` (and their `foreach` items) only:
    /// what running some of its steps needs (a worker reads once for the steps of a run one claim took,
    /// and gives each its part, [`StoredRun::of_steps`]), however many steps the run has.
    fn load_steps(&self, id: &str, steps: &[String]) -> StoreFuture<StoredRun>;
    /// A journal of the task's run, fenced by the task's token (a worker whose lease lapsed and was taken
    /// over writes nothing), renewing the task's lease every third of `lease`; `cancel` is cancelled when
    /// the run is asked to stop. `stored` is the run as read for the task's step once it was claimed
    /// (its part of a `load_steps`): the journal numbers the step's attempts on from the ones it holds.
    fn task_journal(
        &self,
        task: &Task,
        stored: &StoredRun,
        lease: std::time::Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) -> StoreFuture<std::sync::Arc<dyn TaskJournal>>;
    /// Marks a claimed task done without making anything ready: the run's last once the run's end is
    /// recorded, or one stopped by `archon cancel` or whose run had ended.
    fn complete(&self, task: &Task) -> Result<(), StoreError>;
    /// Gives a claimed task back (ready again at once), when the worker stops before running it.
    fn release_task(&self, task: &Task) -> Result<(), StoreError>;
    /// Returns tasks whose lease lapsed to ready, ends as cancelled the submitted runs asked to stop
    /// that no worker is working on, and makes ready again the waiting steps whose every undecided
    /// approval request is past its rule's `timeout` (its `default` decides it when the step runs again);
    /// returns how many tasks came back.
    fn reap(&self) -> Result<usize, StoreError>;
    /// Ends a submitted run that cannot go on without a person (a step in doubt may not be repeated):
    /// interrupted, its tasks removed, to be resumed or resolved as any interrupted run.
    fn interrupt(&self, task: &Task, error: &str) -> Result<(), StoreError>;
    /// Notified when tasks may have become ready (another process submitted, finished, released or
    /// reaped some), and whenever the connection that listens for that is made again: a hint to look,
    /// never the work itself. Idle workers wait for it (or their next look with backoff).
    fn work_signal(&self) -> std::sync::Arc<tokio::sync::Notify>;
    /// Sets aside a task whose step waits for a person to decide on a call it asked for: `waiting`, until
    /// `archon approve` decides every call the step asked for (or `archon resume` hands the run back).
    /// Once no step of the run is ready or running, the run rests `waiting_approval`.
    fn wait_approval(&self, task: &Task) -> Result<(), StoreError>;
    /// Hands a submitted run that rests `waiting_approval` back to the workers (`archon resume`): its
    /// waiting steps become ready again and ask again for whatever is still undecided. False when the
    /// run is not a submitted run waiting for approval.
    fn hand_back(&self, run_id: &str) -> Result<bool, StoreError>;
    /// The runtime the store's own futures run on (its connections, journals and commits), if it has
    /// one: a worker that runs its steps there too passes each store call within one runtime, not
    /// between two (`archon worker`, docs/scale-out.md).
    fn runtime(&self) -> Option<tokio::runtime::Handle> {
        None
    }
}

/// A journal that keeps nothing: a run without a store.
#[derive(Debug, Default)]
pub struct MemoryJournal;

impl Journal for MemoryJournal {
    fn record(&self, _entry: Entry) {}

    fn flush(&self) -> Ack {
        Ack::done()
    }
}

/// Where a run stands, as the store knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// A live process owns it and is running it.
    Running,
    Succeeded,
    Failed,
    /// Stopped for good by `archon cancel`.
    Cancelled,
    /// Stopped by Ctrl-C, a signal or a crash: it can be resumed.
    Interrupted,
    /// Paused until a person decides on a call (`archon approve`); it can be resumed.
    WaitingApproval,
}

impl RunState {
    /// Every state, in the order a person reads them.
    pub const ALL: [RunState; 6] = [
        RunState::Running,
        RunState::WaitingApproval,
        RunState::Interrupted,
        RunState::Succeeded,
        RunState::Failed,
        RunState::Cancelled,
    ];

    /// Whether the run is over for good: nothing can resume it (`retry` starts it again).
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            RunState::Succeeded | RunState::Failed | RunState::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Cancelled => "cancelled",
            RunState::Interrupted => "interrupted",
            RunState::WaitingApproval => "waiting_approval",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => RunState::Running,
            "succeeded" => RunState::Succeeded,
            "failed" => RunState::Failed,
            "cancelled" => RunState::Cancelled,
            "interrupted" => RunState::Interrupted,
            "waiting_approval" => RunState::WaitingApproval,
            _ => return None,
        })
    }
}

/// A cached step result, as a run reuses it.
#[derive(Clone, Debug)]
pub struct CacheEntry {
    pub summary: CacheSummary,
    pub result: StepResult,
}

/// A cached step result as `archon cache ls` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheSummary {
    /// The SHA-256 (hex) of what the result depends on.
    pub key: String,
    pub workflow: String,
    /// The step's id.
    pub step: String,
    /// The run, and its step or `foreach` item (`step[i]`), that produced the result.
    pub run_id: String,
    pub source: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: u64,
    pub expires_at: Option<u64>,
    /// Bytes of the result's output and text.
    pub size: u64,
}

/// Which cached results `archon cache clear` removes: all, or those of a workflow, of a step, or only
/// the expired ones (the conditions given all hold).
#[derive(Clone, Debug, Default)]
pub struct CacheFilter {
    pub workflow: Option<String>,
    pub step: Option<String>,
    pub expired: bool,
}

/// A run as `archon runs` lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    pub id: String,
    pub workflow: String,
    /// `running` only while its owner is alive: a run whose owner died shows as `interrupted`.
    pub status: RunState,
    /// Milliseconds since the Unix epoch.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    pub duration_ms: Option<u64>,
}

/// Which runs a listing shows. Every condition given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Runs in one of these states (any state when empty), as `archon runs` shows them.
    pub status: Vec<RunState>,
    /// Runs of the workflow with this name.
    pub workflow: Option<String>,
    /// Runs started at or after this time (milliseconds since the epoch).
    pub since: Option<u64>,
    /// At most this many runs, the newest.
    pub limit: Option<usize>,
}

impl RunFilter {
    /// Whether `run` passes the conditions (all but `limit`).
    pub fn selects(&self, run: &RunSummary) -> bool {
        (self.status.is_empty() || self.status.contains(&run.status))
            && self.workflow.as_ref().is_none_or(|w| *w == run.workflow)
            && self.since.is_none_or(|t| run.started_at >= t)
    }
}

/// Which runs a page of the run listing shows, and where it starts. Every condition given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Runs in one of these states (any state when empty), as `archon runs` shows them.
    pub status: Vec<RunState>,
    /// Runs of the workflow with this name.
    pub workflow: Option<String>,
    /// Runs started at or after this time (milliseconds since the epoch).
    pub since: Option<u64>,
    /// Runs started before this time (milliseconds since the epoch).
    pub until: Option<u64>,
    /// The page starts after this run (the `next` of the page before).
    pub after: Option<RunCursor>,
    /// Most runs on the page.
    pub limit: usize,
}

impl RunQuery {
    /// Whether `run` passes the conditions (all but `after` and `limit`).
    pub fn selects(&self, run: &RunSummary) -> bool {
        (self.status.is_empty() || self.status.contains(&run.status))
            && self.workflow.as_ref().is_none_or(|w| *w == run.workflow)
            && self.since.is_none_or(|t| run.started_at >= t)
            && self.until.is_none_or(|t| run.started_at < t)
    }
}

/// Where a page of the run listing ends: its last run's start and id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCursor {
    pub started_at: u64,
    pub id: String,
}

impl RunCursor {
    /// The cursor as text: `STARTED.ID`.
    pub fn to_text(&self) -> String {
        format!("{}.{}", self.started_at, self.id)
    }

    pub fn parse(text: &str) -> Option<RunCursor> {
        let (started_at, id) = text.split_once('.')?;
        Some(RunCursor {
            started_at: started_at.parse().ok()?,
            id: id.to_owned(),
        })
    }
}

/// One page of the run listing.
#[derive(Clone, Debug, PartialEq)]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    /// How many runs the query selects in all pages.
    pub total: usize,
    /// Where the next page starts, when there is one.
    pub next: Option<RunCursor>,
}

/// What `prune` deleted (or, in a dry run, would delete).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pruned {
    /// The runs, oldest first.
    pub runs: Vec<RunSummary>,
    /// The bytes of the records deleted with them: their rows in every table, and the large outputs no
    /// other run shares.
    pub bytes: u64,
    /// How many firings without a run (skipped, refused) were deleted for their age.
    pub firings: u64,
    /// Nothing was deleted: this is what would be.
    pub dry_run: bool,
}

/// What a new run stores before anything runs.
#[derive(Clone, Debug)]
pub struct NewRun {
    pub id: String,
    pub workflow: String,
    /// The spec's path, as the run was started with it (absolute).
    pub spec_path: String,
    /// Every file of the workflow (the spec and its sub-workflows): path and text.
    pub files: Vec<(String, String)>,
    pub inputs: Map<String, Json>,
    pub workdir: String,
    pub max_parallel: usize,
}

/// Everything the store holds about a run.
#[derive(Clone, Debug, Serialize)]
pub struct StoredRun {
    pub id: String,
    pub workflow: String,
    pub spec_path: String,
    pub spec_hash: String,
    pub status: RunState,
    pub inputs: Map<String, Json>,
    pub workdir: String,
    pub max_parallel: usize,
    pub started_at: u64,
    pub finished_at: Option<u64>,
    /// How many times `retry --from` started the run again.
    pub generation: u32,
    pub outputs: Map<String, Json>,
    pub error: Option<String>,
    /// Final results of steps and `foreach` items (`step[i]`), by name.
    pub results: indexmap::IndexMap<String, StepResult>,
    /// Every attempt, in the order they started.
    pub attempts: Vec<AttemptRecord>,
    /// The latest checkpoint of each LLM step of the current generation, by step name (not shown:
    /// the event log tells the same story).
    #[serde(skip)]
    pub checkpoints: std::collections::HashMap<String, Json>,
    /// Every call that asked for approval, with its decision once there is one.
    pub approvals: Vec<ApprovalRecord>,
    /// The process that owns the run, while it is live.
    pub owner: Option<Owner>,
}

impl StoredRun {
    /// The run with the results, attempts and checkpoints of the steps named in `steps` and of their
    /// `foreach` items (`step[i]`) alone, as [`Tasks::load_steps`] reads them for those steps: what one
    /// step needs of a read made for several. Only those records are copied.
    pub fn of_steps(&self, steps: &[String]) -> StoredRun {
        StoredRun {
            results: (self.results.iter())
                .filter(|(name, _)| of_steps(steps, name))
                .map(|(name, result)| (name.clone(), result.clone()))
                .collect(),
            attempts: (self.attempts.iter())
                .filter(|a| of_steps(steps, &a.step))
                .cloned()
                .collect(),
            checkpoints: (self.checkpoints.iter())
                .filter(|(name, _)| of_steps(steps, name))
                .map(|(name, state)| (name.clone(), state.clone()))
                .collect(),
            id: self.id.clone(),
            workflow: self.workflow.clone(),
            spec_path: self.spec_path.clone(),
            spec_hash: self.spec_hash.clone(),
            status: self.status,
            inputs: self.inputs.clone(),
            workdir: self.workdir.clone(),
            max_parallel: self.max_parallel,
            started_at: self.started_at,
            finished_at: self.finished_at,
            generation: self.generation,
            outputs: self.outputs.clone(),
            error: self.error.clone(),
            approvals: self.approvals.clone(),
            owner: self.owner.clone(),
        }
    }

    /// [`StoredRun::of_steps`] in place: the records of other steps are dropped.
    pub fn keep_steps(&mut self, steps: &[String]) {
        self.results.retain(|name, _| of_steps(steps, name));
        self.attempts.retain(|a| of_steps(steps, &a.step));
        self.checkpoints.retain(|name, _| of_steps(steps, name));
    }
}

/// Whether the record of `name` (a step, or a `foreach` item `step[i]`) is one of `steps`'.
fn of_steps(steps: &[String], name: &str) -> bool {
    let step = name.split('[').next().unwrap_or(name);
    steps.iter().any(|s| s == step)
}

/// A call that asked for a person's approval, and the decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApprovalRecord {
    pub request: crate::report::ApprovalRequest,
    pub requested_at: u64,
    pub decision: Option<crate::report::ApprovalDecision>,
    pub decided_at: Option<u64>,
}

/// One recorded attempt.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AttemptRecord {
    pub step: String,
    /// Numbered from 1 per step, across resumes and retries.
    pub attempt: u32,
    /// Which `retry --from` (0 for the first run of the step) made it.
    pub generation: u32,
    pub fallback: bool,
    /// `running` when the attempt never ended.
    pub status: String,
    /// The process group of the last command the attempt started, and when its leader started.
    pub pgid: Option<u32>,
    #[serde(skip)]
    pub pgid_started: Option<u64>,
    pub error: Option<String>,
    pub started_at: u64,
    pub ended_at: Option<u64>,
}

/// The live process that owns a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Owner {
    pub pid: u32,
    pub host: String,
    /// Milliseconds since the Unix epoch after which the lease has lapsed unless renewed.
    pub lease_until: u64,
    /// When the owner process started (clock ticks since boot), to tell it from a later process with
    /// the same id.
    #[serde(skip)]
    pub started: Option<u64>,
}

/// The SHA-256 of a workflow's files, in order: what `resume` compares to detect a changed spec.
pub fn spec_hash(files: &[(String, String)]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for (path, text) in files {
        hasher.update((path.len() as u64).to_le_bytes());
        hasher.update(path.as_bytes());
        hasher.update((text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    epoch_ms(std::time::SystemTime::now())
}

/// `at` in milliseconds since the Unix epoch.
pub fn epoch_ms(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A new run id: `r`, then the start time in seconds, the process id and a suffix, in hex.
///
/// Short enough to type, ordered by start time to the second, and unique without coordination: the
/// process id keeps ids apart between processes started in the same second, and the suffix, a counter
/// from a random start, within one (a server makes many ids a second: random suffixes alone would meet).
pub fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let suffix = NEXT
        .get_or_init(|| AtomicU32::new(fastrand::u32(..)))
        .fetch_add(1, Ordering::Relaxed)
        & 0x00ff_ffff;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("r{secs:x}{:x}{suffix:06x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records read once for several steps claimed together: each step gets those of its own name
    /// and its `foreach` items (`s1[0]`), not those of a name that only starts like it (`s10`), in the
    /// order they were read; the run's approvals are every step's.
    #[test]
    fn each_step_claimed_with_others_gets_the_records_of_its_own_steps() {
        let result = |text: &str| StepResult {
            text: text.to_owned(),
            ..StepResult::ended(crate::report::StepStatus::Succeeded, None)
        };
        let attempt = |step: &str, started_at: u64| AttemptRecord {
            step: step.to_owned(),
            attempt: 1,
            generation: 0,
            fallback: false,
            status: "succeeded".to_owned(),
            pgid: None,
            pgid_started: None,
            error: None,
            started_at,
            ended_at: Some(started_at + 1),
        };
        let approval = ApprovalRecord {
            request: crate::report::ApprovalRequest {
                key: "k".to_owned(),
                step: "x".to_owned(),
                tool: None,
                arguments: serde_json::Value::Null,
                reason: "asked".to_owned(),
                timeout_ms: None,
                approve_on_timeout: false,
            },
            requested_at: 7,
            decision: None,
            decided_at: None,
        };
        let read = StoredRun {
            id: "r".to_owned(),
            workflow: "w".to_owned(),
            spec_path: "w.yaml".to_owned(),
            spec_hash: "h".to_owned(),
            status: RunState::Running,
            inputs: Map::new(),
            workdir: ".".to_owned(),
            max_parallel: 16,
            started_at: 1,
            finished_at: None,
            generation: 0,
            outputs: Map::new(),
            error: None,
            results: ["s10", "m[1]", "s1", "x", "m[0]", "s1[0]"]
                .into_iter()
                .map(|step| (step.to_owned(), result(step)))
                .collect(),
            attempts: vec![
                attempt("m[0]", 1),
                attempt("s10", 2),
                attempt("s1", 3),
                attempt("x", 4),
            ],
            checkpoints: [("s10", 1), ("m[0]", 2)]
                .into_iter()
                .map(|(step, n)| (step.to_owned(), serde_json::json!(n)))
                .collect(),
            approvals: vec![approval.clone()],
            owner: None,
        };
        let own = read.of_steps(&["s1".to_owned(), "m".to_owned()]);
        // In place, the same.
        let mut kept = read.clone();
        kept.keep_steps(&["s1".to_owned(), "m".to_owned()]);
        assert_eq!(
            serde_json::to_value(&kept).expect("serialised"),
            serde_json::to_value(&own).expect("serialised")
        );
        assert_eq!(kept.checkpoints, own.checkpoints);
        assert_eq!(
            own.results
                .values()
                .map(|r| r.text.as_str())
                .collect::<Vec<_>>(),
            ["m[1]", "s1", "m[0]", "s1[0]"]
        );
        assert_eq!(
            own.attempts
                .iter()
                .map(|a| a.step.as_str())
                .collect::<Vec<_>>(),
            ["m[0]", "s1"]
        );
        assert_eq!(own.checkpoints.keys().collect::<Vec<_>>(), ["m[0]"]);
        assert_eq!(own.approvals, [approval]);
        assert_eq!(
            (own.id, own.status, own.generation),
            ("r".to_owned(), RunState::Running, 0)
        );
        let none = read.of_steps(&["s".to_owned()]);
        assert!(none.results.is_empty() && none.attempts.is_empty() && none.checkpoints.is_empty());
    }
}
