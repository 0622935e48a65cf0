//! How a run is carried out: the options a front end gives (`RunOptions`), how calls that ask for approval
//! are decided (`Approvals`, `Approver`) and what happens to LLM calls (`Cassette`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value as Json;
use tokio_util::sync::CancellationToken;

use crate::report::{ApprovalDecision, ApprovalRequest, RunEvent, StepResult};
use crate::store::{CacheEntry, Journal, MemoryJournal};

/// Most composite tools and sub-workflows nested inside each other at run time.
pub const MAX_DEPTH: u32 = 16;

/// How a run is carried out.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Most steps (and `foreach` items of steps without their own limit) running at once.
    pub max_parallel: usize,
    /// The workspace: where commands run and file paths point.
    pub workdir: PathBuf,
    /// Directories file tools refuse (the run store's state directory).
    pub protected: Vec<PathBuf>,
    pub run_id: String,
    /// Cancels the run: in-flight steps are abandoned (their process groups killed).
    pub cancel: CancellationToken,
    /// Receives progress events, if set. Steps inside composite tools and sub-workflows are named
    /// `outer/inner` (`outer[2]/inner` for a `foreach` item).
    pub events: Option<tokio::sync::mpsc::UnboundedSender<RunEvent>>,
    /// The process environment, readable as `env` in templates.
    pub env: BTreeMap<String, String>,
    /// Where the run records attempts, results and events as they happen ([`MemoryJournal`] keeps
    /// nothing).
    pub journal: Arc<dyn Journal>,
    /// Final results of an earlier process running this run (`archon resume`), by step or `step[i]`:
    /// those steps and items are not run again, and their results are reused as they are.
    pub prior: Arc<HashMap<String, StepResult>>,
    /// Record or replay the run's LLM calls.
    pub cassette: Option<Cassette>,
    /// Where an earlier process left LLM steps it did not finish (`archon resume`), by step name: an
    /// agent continues from its last completed iteration, a planner from its last accepted plan.
    /// Each is used once: a retry within the resumed run starts afresh.
    pub checkpoints: Arc<std::sync::Mutex<HashMap<String, Json>>>,
    /// How calls that ask for approval get an answer.
    pub approvals: Approvals,
    /// The `archon` executable, run again as a helper process for work that must be killable by a
    /// step's timeout and must not take the run down with it (jq filters, `archon __jq`). Without it,
    /// `json` steps fail.
    pub helper: Option<PathBuf>,
    /// Results of steps with `cache` the run may reuse.
    pub cache: StepCache,
    /// Where long-term memory files are (`memory.path` is relative to it): the state directory. Without
    /// one (and without a database in `memory`), an agent with `memory` or `notes` fails.
    pub memory_dir: Option<PathBuf>,
    /// The memory files the run opened, shared with its sub-workflows, and the database memory lives in
    /// when the run store is PostgreSQL (then `memory_dir` is not used).
    pub memory: MemoryFiles,
}

/// The memory files a run opened, by path; and the run store's database, when memory lives there.
#[derive(Clone, Debug, Default)]
pub struct MemoryFiles {
    pub(crate) opened:
        Arc<std::sync::Mutex<HashMap<PathBuf, Arc<crate::run::memory::MemoryStore>>>>,
    pub(crate) database: Option<crate::run::memory::MemoryDatabase>,
}

impl MemoryFiles {
    /// Memory in files of `memory_dir` without `database`; in `database` (the run store's,
    /// [`crate::store::RunStore::memory_database`]) with it.
    pub fn new(database: Option<crate::run::memory::MemoryDatabase>) -> MemoryFiles {
        MemoryFiles {
            opened: Arc::default(),
            database,
        }
    }
}

/// The cached results a run may reuse (`cache:` on steps), read from the run store when it starts, and
/// which steps run regardless.
#[derive(Clone, Debug, Default)]
pub struct StepCache {
    /// Unexpired entries of the run's workflows, by key.
    pub entries: Arc<HashMap<String, CacheEntry>>,
    /// Steps that run even when their result is cached (`--no-cache`, `retry --from`); a success
    /// replaces their entry.
    pub refresh: Refresh,
    /// The definitions of tools and sub-workflows, hashed once per run, by workflow and name.
    pub(crate) digests: Arc<std::sync::Mutex<HashMap<String, [u8; 32]>>>,
}

/// Which cached steps run regardless of their entry.
#[derive(Clone, Debug, Default)]
pub enum Refresh {
    #[default]
    None,
    /// Every step (`--no-cache`).
    All,
    /// These steps of the run's workflow, by id (`retry --from`).
    Steps(Arc<HashSet<String>>),
}

impl StepCache {
    /// A cache of `entries`.
    pub fn of(entries: impl IntoIterator<Item = CacheEntry>, refresh: Refresh) -> Self {
        StepCache {
            entries: Arc::new(
                entries
                    .into_iter()
                    .map(|e| (e.summary.key.clone(), e))
                    .collect(),
            ),
            refresh,
            digests: Arc::default(),
        }
    }
}

/// How calls that ask for a person's approval are decided: decisions already recorded (`archon approve`),
/// `--yes`, a person at a terminal, or else the run pauses.
#[derive(Clone, Default)]
pub struct Approvals {
    /// Decisions recorded for this run, by approval key.
    pub decided: Arc<HashMap<String, ApprovalDecision>>,
    /// `--yes`: every call that asks is approved, and each approval is recorded as given by `--yes`.
    pub yes: bool,
    /// Asks a person (at a terminal); `None` when nobody can be asked while the run goes on.
    pub approver: Option<Arc<dyn Approver>>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("decided", &self.decided.len())
            .field("yes", &self.yes)
            .field("approver", &self.approver.is_some())
            .finish()
    }
}

/// Asks a person about a call; `None` when no answer came.
pub trait Approver: Send + Sync {
    fn ask<'a>(
        &'a self,
        request: &'a ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn Future<Output = Option<ApprovalDecision>> + Send + 'a>>;
}

/// What to do with the LLM calls of a run.
#[derive(Clone, Debug)]
pub enum Cassette {
    /// Write every request and response to this open cassette.
    Record(Arc<std::sync::Mutex<std::fs::File>>),
    /// Answer from these recorded exchanges, with no network.
    Replay(Arc<Vec<crate::llm::cassette::Exchange>>),
}

impl RunOptions {
    /// Options for a run in `workdir` with nothing recorded: up to 16 steps at once, the process
    /// environment, a fresh cancellation token.
    pub fn new(workdir: PathBuf, run_id: impl Into<String>) -> Self {
        RunOptions {
            max_parallel: 16,
            workdir,
            protected: Vec::new(),
            run_id: run_id.into(),
            cancel: CancellationToken::new(),
            events: None,
            env: std::env::vars().collect(),
            journal: Arc::new(MemoryJournal),
            prior: Arc::new(HashMap::new()),
            cassette: None,
            checkpoints: Default::default(),
            approvals: Approvals::default(),
            helper: None,
            cache: StepCache::default(),
            memory_dir: None,
            memory: MemoryFiles::default(),
        }
    }
}
