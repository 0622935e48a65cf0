//! The runs the server executes: started from the API, a page or a trigger, continued (resumed, retried,
//! approved), cancelled. Each run executes on a thread of its own with its own single-threaded runtime
//! and its own session, as under `archon run`; at most `--max-runs` at once, the rest wait in a queue
//! that the API shows. When the server stops, the runs going on are interrupted (and recorded as
//! resumable) and, with the runs still queued, written to `serve/restart.json` in the state directory;
//! the next `archon serve` on that state directory takes them up again.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use archon_engine::run::ApprovalDecision;
use archon_engine::session::{
    self, Attachments, Continue, ContinueOptions, Firing, FiringKind, FiringOutcome, NewRunRequest,
    RecordedEvent, RunState, Session, SessionError, StoreAt,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use super::app::{ApiError, App};
use super::events::Live;
use super::workflows::Served;
use crate::output;

/// The file, under the state directory, of what the server was running or had queued when it stopped.
const RESTART_FILE: &str = "serve/restart.json";

/// What started a run that a trigger started (the trigger's code says what; the server shows it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TriggerInfo {
    /// The trigger's name.
    pub name: String,
    /// What fired it (free-form JSON, shown as it is).
    #[schema(value_type = Object)]
    pub detail: Json,
}

/// How a stored run continues (`archon resume`, `archon retry --from STEP`, `archon retry --failed`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum How {
    Resume,
    From { step: String },
    Failed,
}

impl How {
    fn as_continue(&self) -> Continue<'_> {
        match self {
            How::Resume => Continue::Resume,
            How::From { step } => Continue::From(step),
            How::Failed => Continue::Failed,
        }
    }
}

/// A run waiting for a place among those going on.
#[derive(Clone, Debug)]
struct Job {
    run_id: String,
    workflow: String,
    work: Work,
    trigger: Option<TriggerInfo>,
    queued_at: u64,
    /// A new run whose firing is recorded (a trigger's, or a queued start's of kind `api`): it starts
    /// only while that firing still names it (`archon cancel` may drop it meanwhile).
    recorded: bool,
}

#[derive(Clone, Debug)]
enum Work {
    /// A new run of a served workflow, with its resolved inputs.
    Start {
        served: Arc<Served>,
        inputs: Map<String, Json>,
    },
    /// A stored run, continued.
    Continue { how: How, options: Options },
}

/// What continuing may accept (`--rerun-in-doubt`, `--allow-changed-spec`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    #[serde(default)]
    pub rerun_in_doubt: bool,
    #[serde(default)]
    pub allow_changed_spec: bool,
}

/// A run of the queue, as the API shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct QueuedRun {
    /// The id the run has (a new run gets it now; it is stored once it starts).
    pub run_id: String,
    pub workflow: String,
    /// `start`, `resume`, `retry_from` or `retry_failed`.
    pub action: String,
    /// Its place in the queue, from 1.
    pub position: usize,
    /// Milliseconds since the epoch.
    pub queued_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerInfo>,
    /// Why it waits: `waiting for a free slot` (`--max-runs` runs are going on) or `queued behind run
    /// X` (a cron trigger's `overlap: queue`, until the run before it ends).
    pub reason: String,
}

/// A trigger's run held back until the run before it ends (`overlap: queue`): not in the queue yet.
#[derive(Clone, Debug)]
pub struct Held {
    pub pending: Pending,
    /// The run it waits for.
    pub after: Option<String>,
}

/// The runs triggers hold back, by id. Locked before the executor's own state when both are.
#[derive(Debug, Default)]
pub struct Waiting {
    runs: Mutex<HashMap<String, Held>>,
}

impl Waiting {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A run this server is executing.
#[derive(Debug)]
struct Active {
    cancel: CancellationToken,
    /// Cancelled for good (by a person), not interrupted by the server's end.
    for_good: Arc<AtomicBool>,
    trigger: Option<TriggerInfo>,
    /// A new run whose thread has not recorded it yet: what it starts with.
    starting: Option<Pending>,
}

/// A new run this server accepted and has not recorded yet (queued, or its thread starting).
#[derive(Clone, Debug)]
pub struct Pending {
    pub workflow: String,
    /// Its spec file.
    pub spec_path: String,
    pub inputs: Map<String, Json>,
    /// Milliseconds since the epoch.
    pub queued_at: u64,
    pub trigger: Option<TriggerInfo>,
}

impl Job {
    fn pending(&self) -> Option<Pending> {
        match &self.work {
            Work::Start { served, inputs } => Some(Pending {
                workflow: self.workflow.clone(),
                spec_path: served.path.display().to_string(),
                inputs: inputs.clone(),
                queued_at: self.queued_at,
                trigger: self.trigger.clone(),
            }),
            Work::Continue { .. } => None,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Job>,
    active: HashMap<String, Active>,
    /// Runs interrupted because the server stops, to resume on the next start.
    interrupted: Vec<String>,
    /// Places in the queue held by [`Room`]s: counted as taken.
    held: usize,
}

/// A place in the queue, held for a run whose firing is about to be recorded (a webhook delivery's):
/// taken before the firing is recorded, so that a full queue refuses a delivery without recording it,
/// and a sender that delivers it again gets a run rather than a replay.
#[derive(Debug)]
pub struct Room(Executor);

impl Drop for Room {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.held = state.held.saturating_sub(1);
    }
}

/// The runs the server executes.
#[derive(Clone, Debug)]
pub struct Executor(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    state_dir: PathBuf,
    store: StoreAt,
    max_runs: usize,
    /// Most runs waiting in the queue (`--max-queue`).
    max_queue: usize,
    stopping: CancellationToken,
    state: Mutex<State>,
    /// Runs triggers hold back behind others.
    waiting: Waiting,
    /// How many run threads are alive.
    running: tokio::sync::watch::Sender<usize>,
    /// Where runs tell their events the moment they record them.
    recorded: tokio::sync::mpsc::UnboundedSender<RecordedEvent>,
    /// Woken when a run starts or ends, or the queue changes.
    changed: tokio::sync::watch::Sender<u64>,
    /// `archon` itself, for the helper processes of runs.
    helper: Option<PathBuf>,
    /// The labels this server has (`archon serve --labels`), which every run it executes has.
    labels: archon_engine::workflow::Labels,
}

/// What starting a run did.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Started {
    pub run_id: String,
    /// Whether it waits in the queue (`--max-runs` runs are going on) rather than running now.
    pub queued: bool,
}

impl Executor {
    pub fn new(
        store: &StoreAt,
        max_runs: usize,
        max_queue: usize,
        stopping: CancellationToken,
        live: &Live,
        labels: archon_engine::workflow::Labels,
    ) -> Self {
        Executor(Arc::new(Shared {
            state_dir: store.state_dir.clone(),
            store: store.clone(),
            max_runs: max_runs.max(1),
            max_queue,
            stopping,
            state: Mutex::new(State::default()),
            waiting: Waiting::default(),
            running: tokio::sync::watch::channel(0).0,
            recorded: live.recorder(),
            changed: tokio::sync::watch::channel(0).0,
            helper: std::env::current_exe().ok(),
            labels,
        }))
    }

    /// Starts a new run of the served workflow whose id is `workflow` with `given` inputs (resolved and checked
    /// against the workflow's declarations), now or, when `--max-runs` runs are going on, once one ends.
    /// `trigger` says what started it, when a trigger did. This is what the API's `POST
    /// /api/v1/workflows/{name}/runs`, the dashboard's run form and triggers call.
    /// A run that has to wait in the queue is recorded first, as a firing of kind `api` that names it,
    /// so that `archon runs`, `archon show` and `archon cancel` on the state directory see it and the
    /// next server starts it.
    pub async fn start_run(
        &self,
        app: &Arc<App>,
        workflow: &str,
        given: Map<String, Json>,
        trigger: Option<TriggerInfo>,
    ) -> Result<Started, ApiError> {
        let run_id = session::new_run_id();
        let (served, inputs) = checked(app, workflow, given)?;
        self.refusal(0)?;
        let waits = {
            let state = self.state();
            state.active.len() + state.queue.len() >= self.0.max_runs
        };
        let mut recorded = false;
        if waits && trigger.is_none() {
            let now = super::app::now_ms();
            let firing = Firing {
                workflow: served.id.clone(),
                trigger: session::API_TRIGGER.to_owned(),
                kind: FiringKind::Api,
                slot: run_id.clone(),
                slot_at: now,
                fired_at: now,
                run_id: Some(run_id.clone()),
                outcome: FiringOutcome::Started,
                reason: None,
                inputs: inputs.clone(),
            };
            app.read(move |session| {
                session
                    .record_firing(&firing)
                    .map_err(|e| ApiError::store(&e))
            })
            .await?;
            recorded = true;
        }
        let queued = self.enqueue(Job {
            run_id: run_id.clone(),
            workflow: served.name.clone(),
            work: Work::Start { served, inputs },
            trigger,
            queued_at: super::app::now_ms(),
            recorded,
        });
        Ok(Started { run_id, queued })
    }

    /// [`Executor::start_run`] under a run id given beforehand: a trigger's firing records the id of
    /// the run it starts before the run exists.
    pub fn start_run_as(
        &self,
        app: &App,
        workflow: &str,
        given: Map<String, Json>,
        trigger: Option<TriggerInfo>,
        run_id: String,
        room: Option<Room>,
    ) -> Result<Started, ApiError> {
        let (served, inputs) = checked(app, workflow, given)?;
        self.refusal(usize::from(room.is_some()))?;
        let queued = self.enqueue(Job {
            run_id: run_id.clone(),
            workflow: served.name.clone(),
            work: Work::Start { served, inputs },
            trigger,
            queued_at: super::app::now_ms(),
            recorded: true,
        });
        drop(room);
        Ok(Started { run_id, queued })
    }
}

/// The served workflow `workflow` and `given` inputs resolved against its declarations, or why not.
fn checked(
    app: &App,
    workflow: &str,
    given: Map<String, Json>,
) -> Result<(Arc<Served>, Map<String, Json>), ApiError> {
    let Some(served) = app.catalog.get(workflow).cloned() else {
        return Err(
            ApiError::not_found(format!("no workflow `{workflow}` is served"))
                .with_hint("`GET /api/v1/workflows` lists them"),
        );
    };
    let Some(valid) = &served.workflow else {
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            format!("the workflow `{workflow}` does not validate"),
        )
        .with_hint("its diagnostics say why (`GET /api/v1/workflows/{name}`)"));
    };
    let inputs = archon_engine::inputs::resolve(&valid.spec, given, &[]).map_err(|problems| {
        let mut error = ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            problems
                .iter()
                .map(|p| p.message.clone())
                .collect::<Vec<_>>()
                .join("; "),
        );
        let hints: Vec<String> = problems
            .iter()
            .filter_map(|p| p.hint.clone())
            .filter(|h| !h.contains("--input"))
            .collect();
        if !hints.is_empty() {
            error = error.with_hint(hints.join("; "));
        }
        error
    })?;
    Ok((served, inputs))
}

impl Executor {
    /// Holds a place in the queue, or refuses as [`Executor::start_run_as`] would.
    pub fn reserve(&self) -> Result<Room, ApiError> {
        let mut state = self.state();
        self.refuse(&state, 0)?;
        state.held += 1;
        drop(state);
        Ok(Room(self.clone()))
    }

    /// Continues a stored run as `how` says, after checking that it can be (the same refusals as
    /// `archon resume` and `archon retry`).
    pub async fn continue_run(
        &self,
        app: &Arc<App>,
        run_id: &str,
        how: How,
        options: Options,
    ) -> Result<Started, ApiError> {
        self.refuse_when_stopping()?;
        if self.is_busy(run_id) {
            return Err(ApiError::conflict(format!(
                "run `{run_id}` is already running or queued on this server"
            )));
        }
        // A run submitted to workers that waits for approval goes on there, as `archon resume` hands it.
        if matches!(how, How::Resume) {
            let id = run_id.to_owned();
            let handed = app
                .read(move |session| session.hand_back(&id).map_err(|e| ApiError::session(&e)))
                .await?;
            if handed {
                return Ok(Started {
                    run_id: run_id.to_owned(),
                    queued: false,
                });
            }
        }
        let (id, checked_how, checked_options) = (run_id.to_owned(), how.clone(), options.clone());
        let workflow = app
            .read(move |session| {
                let asked = ContinueOptions {
                    rerun_in_doubt: checked_options.rerun_in_doubt,
                    allow_changed_spec: checked_options.allow_changed_spec,
                    max_parallel: None,
                };
                session
                    .check_continue(&id, checked_how.as_continue(), &asked)
                    .map_err(|e| ApiError::session(&e))?;
                session
                    .summary(&id)
                    .map_err(|e| ApiError::store(&e))?
                    .map(|s| s.workflow)
                    .ok_or_else(|| ApiError::unknown_run(&id))
            })
            .await?;
        let queued = self.enqueue(Job {
            run_id: run_id.to_owned(),
            workflow,
            work: Work::Continue { how, options },
            trigger: None,
            queued_at: super::app::now_ms(),
            recorded: false,
        });
        Ok(Started {
            run_id: run_id.to_owned(),
            queued,
        })
    }

    /// Records a decision on the one call of a paused run whose request has `key`, then, when the run
    /// waits for no other call, resumes it here (what `archon approve` then `archon resume` do).
    pub async fn decide(
        &self,
        app: &Arc<App>,
        run_id: &str,
        key: &str,
        decision: ApprovalDecision,
    ) -> Result<Decided, ApiError> {
        self.refuse_when_stopping()?;
        let (id, key) = (run_id.to_owned(), key.to_owned());
        let (request, pending, on_workers) = app
            .read(move |session| {
                let request = session
                    .decide_call(&id, &key, &decision)
                    .map_err(|e| ApiError::session(&e))?;
                let run = session.load_brief(&id).map_err(|e| ApiError::store(&e))?;
                let pending = run
                    .approvals
                    .iter()
                    .filter(|a| a.decision.is_none())
                    .count();
                // A run submitted to workers goes on there: the decision made its step ready again.
                let on_workers = run.status == RunState::Running
                    && run
                        .owner
                        .as_ref()
                        .is_some_and(|o| o.host == session::WORKERS);
                Ok((request, pending, on_workers))
            })
            .await?;
        let resumed = if pending == 0 && !on_workers {
            Some(
                self.continue_run(app, run_id, How::Resume, Options::default())
                    .await?,
            )
        } else {
            None
        };
        Ok(Decided {
            step: request.step,
            tool: request.tool,
            key: request.key,
            resumed,
            still_waiting: pending,
        })
    }

    /// Stops a run for good: a queued one leaves the queue; one this server runs stops at once; one
    /// another process runs is asked to stop through the store (as `archon cancel` does).
    pub async fn cancel(&self, app: &Arc<App>, run_id: &str) -> Result<Cancelled, ApiError> {
        // A trigger's run held behind another: it leaves, and its firing is recorded as skipped so that
        // no later start of a server starts it.
        let held = self.0.waiting.lock().remove(run_id);
        if held.is_some() {
            self.wake();
            skip_firing(app, run_id).await?;
            return Ok(Cancelled {
                run_id: run_id.to_owned(),
                status: "dequeued".to_owned(),
            });
        }
        let dequeued = {
            let mut state = self.state();
            let before = state.queue.len();
            let removed: Vec<Job> = state
                .queue
                .iter()
                .filter(|j| j.run_id == run_id)
                .cloned()
                .collect();
            state.queue.retain(|j| j.run_id != run_id);
            (before != state.queue.len()).then_some(removed)
        };
        if let Some(removed) = dequeued {
            self.wake();
            // A new run that never started has nothing stored to cancel; a trigger's firing that
            // would start it is recorded as skipped, so that no later start runs it.
            if removed.iter().all(|j| matches!(j.work, Work::Start { .. })) {
                if removed.iter().any(|j| j.recorded) {
                    skip_firing(app, run_id).await?;
                }
                return Ok(Cancelled {
                    run_id: run_id.to_owned(),
                    status: "dequeued".to_owned(),
                });
            }
        }
        // A new run whose thread has not recorded it yet: stopped as it starts, recorded as cancelled.
        {
            let state = self.state();
            if let Some(active) = state.active.get(run_id)
                && active.starting.is_some()
            {
                active.for_good.store(true, Ordering::SeqCst);
                active.cancel.cancel();
                return Ok(Cancelled {
                    run_id: run_id.to_owned(),
                    status: "cancelling".to_owned(),
                });
            }
        }
        let id = run_id.to_owned();
        let outcome = app
            .read(move |session| session.cancel(&id).map_err(|e| ApiError::session(&e)))
            .await?;
        if let Some(active) = self.state().active.get(run_id) {
            active.for_good.store(true, Ordering::SeqCst);
            active.cancel.cancel();
        }
        Ok(Cancelled {
            run_id: run_id.to_owned(),
            status: match outcome {
                session::Cancelled::Now => "cancelled",
                session::Cancelled::Asked => "cancelling",
            }
            .to_owned(),
        })
    }

    /// The runs waiting for a place, in order, then those triggers hold back behind others (oldest
    /// first).
    pub fn queue(&self) -> Vec<QueuedRun> {
        let mut queue: Vec<QueuedRun> = self
            .state()
            .queue
            .iter()
            .enumerate()
            .map(|(i, job)| QueuedRun {
                run_id: job.run_id.clone(),
                workflow: job.workflow.clone(),
                action: match &job.work {
                    Work::Start { .. } => "start",
                    Work::Continue {
                        how: How::Resume, ..
                    } => "resume",
                    Work::Continue {
                        how: How::From { .. },
                        ..
                    } => "retry_from",
                    Work::Continue {
                        how: How::Failed, ..
                    } => "retry_failed",
                }
                .to_owned(),
                position: i + 1,
                queued_at: job.queued_at,
                trigger: job.trigger.clone(),
                reason: "waiting for a free slot".to_owned(),
            })
            .collect();
        let mut held: Vec<(String, Held)> = self
            .0
            .waiting
            .lock()
            .iter()
            .map(|(id, held)| (id.clone(), held.clone()))
            .collect();
        held.sort_by(|a, b| (a.1.pending.queued_at, &a.0).cmp(&(b.1.pending.queued_at, &b.0)));
        // One being started is in both for a moment: shown once.
        held.retain(|(id, _)| !queue.iter().any(|q| &q.run_id == id));
        let before = queue.len();
        queue.extend(
            held.into_iter()
                .enumerate()
                .map(|(i, (run_id, held))| QueuedRun {
                    run_id,
                    workflow: held.pending.workflow,
                    action: "start".to_owned(),
                    position: before + i + 1,
                    queued_at: held.pending.queued_at,
                    trigger: held.pending.trigger,
                    reason: held.after.map_or_else(
                        || "queued behind an earlier run of its trigger".to_owned(),
                        |after| format!("queued behind run {after}"),
                    ),
                }),
        );
        queue
    }

    /// The runs triggers hold back behind others.
    pub fn waiting(&self) -> &Waiting {
        &self.0.waiting
    }

    /// The queued run with this id, if it waits.
    pub fn queued(&self, run_id: &str) -> Option<QueuedRun> {
        self.queue().into_iter().find(|q| q.run_id == run_id)
    }

    /// The trigger that started a run this server is executing, if one did.
    pub fn trigger_of(&self, run_id: &str) -> Option<TriggerInfo> {
        self.state()
            .active
            .get(run_id)
            .and_then(|a| a.trigger.clone())
    }

    /// Whether this server executes the run now.
    pub fn is_active(&self, run_id: &str) -> bool {
        self.state().active.contains_key(run_id)
    }

    /// A new run this server accepted and has not recorded yet (queued, or starting).
    pub fn pending(&self, run_id: &str) -> Option<Pending> {
        {
            let state = self.state();
            if let Some(active) = state.active.get(run_id) {
                return active.starting.clone();
            }
            if let Some(job) = state.queue.iter().find(|j| j.run_id == run_id) {
                return job.pending();
            }
        }
        self.0
            .waiting
            .lock()
            .get(run_id)
            .map(|held| held.pending.clone())
    }

    /// A receiver woken whenever a run starts or ends here or the queue changes.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.0.changed.subscribe()
    }

    /// Waits until no run executes here (once the server stops, each ends interrupted).
    pub async fn wait_idle(&self) {
        let mut running = self.0.running.subscribe();
        let _ = running.wait_for(|n| *n == 0).await;
    }

    /// Writes what the next start takes up: the runs interrupted by this stop, and the queue.
    pub fn remember_for_restart(&self) {
        let state = self.state();
        let mut restart = Restart {
            resume: state.interrupted.clone(),
            queued: Vec::new(),
        };
        for job in &state.queue {
            match &job.work {
                Work::Start { served, inputs } => restart.queued.push(SavedJob::Start {
                    run_id: job.run_id.clone(),
                    workflow: served.id.clone(),
                    inputs: inputs.clone(),
                    trigger: job.trigger.clone(),
                    recorded: job.recorded,
                }),
                Work::Continue { how, options } => restart.queued.push(SavedJob::Continue {
                    run_id: job.run_id.clone(),
                    workflow: job.workflow.clone(),
                    how: how.clone(),
                    options: options.clone(),
                }),
            }
        }
        drop(state);
        if restart.resume.is_empty() && restart.queued.is_empty() {
            return;
        }
        let path = self.0.state_dir.join(RESTART_FILE);
        // Another server on the same state directory may have stopped first: its runs are kept too.
        if let Some(earlier) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str::<Restart>(&text).ok())
        {
            restart.resume.splice(0..0, earlier.resume);
            restart.queued.splice(0..0, earlier.queued);
        }
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let text = serde_json::to_string_pretty(&restart).map_err(std::io::Error::other)?;
                let temporary = path.with_extension("json.tmp");
                std::fs::write(&temporary, text)?;
                std::fs::rename(&temporary, &path)
            });
        match written {
            Ok(()) => output::stderr(&format!(
                "stopped: {} run{} to resume and {} queued, taken up by the next `archon serve`\n",
                restart.resume.len(),
                if restart.resume.len() == 1 { "" } else { "s" },
                restart.queued.len()
            )),
            Err(e) => output::stderr(&format!(
                "error: cannot write `{}`: {}\n  hint: the interrupted runs stay resumable with `archon resume RUN`\n",
                path.display(),
                e.to_string().to_lowercase()
            )),
        }
    }

    /// Takes up what the server was running or had queued when it last stopped on this state directory.
    pub fn resume_after_restart(&self, app: &Arc<App>) {
        let path = self.0.state_dir.join(RESTART_FILE);
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let _ = std::fs::remove_file(&path);
        let restart: Restart = match serde_json::from_str(&text) {
            Ok(restart) => restart,
            Err(e) => {
                output::stderr(&format!(
                    "warning: `{}` does not read ({e}): nothing is resumed\n",
                    path.display()
                ));
                return;
            }
        };
        let now = super::app::now_ms();
        let mut jobs = Vec::new();
        let session = Session::open_at(&self.0.store).ok();
        for run_id in restart.resume {
            let workflow = session
                .as_ref()
                .and_then(|s| s.summary(&run_id).ok().flatten())
                .map(|s| s.workflow)
                .unwrap_or_default();
            jobs.push(Job {
                workflow,
                run_id,
                work: Work::Continue {
                    how: How::Resume,
                    options: Options::default(),
                },
                trigger: None,
                queued_at: now,
                recorded: false,
            });
        }
        for saved in restart.queued {
            match saved {
                SavedJob::Start {
                    run_id,
                    workflow,
                    inputs,
                    trigger,
                    recorded,
                } => match app.catalog.get(&workflow).filter(|s| s.workflow.is_some()) {
                    Some(served) => jobs.push(Job {
                        run_id,
                        workflow,
                        work: Work::Start {
                            served: served.clone(),
                            inputs,
                        },
                        recorded: recorded || trigger.is_some(),
                        trigger,
                        queued_at: now,
                    }),
                    None => output::stderr(&format!(
                        "warning: queued run `{run_id}` of `{workflow}` is dropped: the workflow is not served now\n"
                    )),
                },
                SavedJob::Continue {
                    run_id,
                    workflow,
                    how,
                    options,
                } => jobs.push(Job {
                    run_id,
                    workflow,
                    work: Work::Continue { how, options },
                    trigger: None,
                    queued_at: now,
                    recorded: false,
                }),
            }
        }
        if !jobs.is_empty() {
            output::stderr(&format!(
                "taking up {} run{} from the last stop\n",
                jobs.len(),
                if jobs.len() == 1 { "" } else { "s" }
            ));
        }
        for job in jobs {
            self.enqueue(job);
        }
    }

    /// Refuses a new run or continuation while the server stops, or when the queue is full.
    fn refuse_when_stopping(&self) -> Result<(), ApiError> {
        self.refusal(0)
    }

    /// [`Executor::refuse_when_stopping`] for a caller holding `own` of the held places.
    fn refusal(&self, own: usize) -> Result<(), ApiError> {
        self.refuse(&self.state(), own)
    }

    fn refuse(&self, state: &State, own: usize) -> Result<(), ApiError> {
        if self.0.stopping.is_cancelled() {
            return Err(
                ApiError::unavailable().with_hint("the next `archon serve` takes runs again")
            );
        }
        // Runs going on, waiting, and about to be queued by others: one more must fit in the run
        // slots or the queue.
        let max = self.0.max_queue;
        let taken = state.active.len() + state.queue.len() + state.held.saturating_sub(own);
        if taken >= self.0.max_runs + max {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{max} run{} wait{} in the queue already, the most it holds (`--max-queue`)",
                    if max == 1 { "" } else { "s" },
                    if max == 1 { "s" } else { "" }
                ),
            )
            .with_hint(
                "wait for runs to end, or cancel queued ones (`GET /api/v1/queue` lists them)",
            ));
        }
        Ok(())
    }

    /// Whether the run executes here now or waits in the queue.
    pub fn is_busy(&self, run_id: &str) -> bool {
        let state = self.state();
        state.active.contains_key(run_id) || state.queue.iter().any(|j| j.run_id == run_id)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A thread that panicked while holding the lock leaves consistent data (every change is one
        // statement): go on with it.
        self.0
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes whoever watches the runs and the queue.
    pub fn wake(&self) {
        self.0.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Queues a job and starts what can start; returns whether the job still waits.
    fn enqueue(&self, job: Job) -> bool {
        let run_id = job.run_id.clone();
        self.state().queue.push_back(job);
        self.dispatch();
        let waiting = self.state().queue.iter().any(|j| j.run_id == run_id);
        self.wake();
        waiting
    }

    /// Starts queued jobs while fewer than `--max-runs` run.
    fn dispatch(&self) {
        loop {
            if self.0.stopping.is_cancelled() {
                return;
            }
            let job = {
                let mut state = self.state();
                if state.active.len() >= self.0.max_runs {
                    return;
                }
                let Some(job) = state.queue.pop_front() else {
                    return;
                };
                state.active.insert(
                    job.run_id.clone(),
                    Active {
                        cancel: self.0.stopping.child_token(),
                        for_good: Arc::default(),
                        trigger: job.trigger.clone(),
                        starting: job.pending(),
                    },
                );
                job
            };
            self.spawn(job);
        }
    }

    /// Executes a job on a thread of its own.
    fn spawn(&self, job: Job) {
        let (cancel, for_good) = {
            let state = self.state();
            match state.active.get(&job.run_id) {
                Some(a) => (a.cancel.clone(), a.for_good.clone()),
                None => return,
            }
        };
        self.0.running.send_modify(|n| *n += 1);
        let executor = self.clone();
        let run_id = job.run_id.clone();
        let this_run = run_id.clone();
        let name = format!("run-{run_id}");
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            let ended = executor.execute(job, cancel, &for_good);
            executor.finished(&run_id, ended);
        });
        if let Err(e) = spawned {
            // The run is not started (a new one is not recorded; a stored one stays as it was).
            output::stderr(&format!("error: cannot start a thread for a run: {e}\n"));
            self.state().active.remove(&this_run);
            self.0.running.send_modify(|n| *n = n.saturating_sub(1));
        }
    }

    /// Runs a job on this thread; returns whether the run was interrupted by the server's end (and is
    /// resumable).
    fn execute(&self, job: Job, cancel: CancellationToken, for_good: &AtomicBool) -> bool {
        let complain = |message: &str| {
            output::stderr(&output::printable(&format!(
                "error: run `{}`: {message}\n",
                job.run_id
            )));
        };
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                complain(&format!("cannot start its runtime: {e}"));
                return false;
            }
        };
        let session = match Session::open_at(&self.0.store) {
            Ok(session) => session,
            Err(e) => {
                complain(&e.to_string());
                return false;
            }
        };
        if job.recorded
            && matches!(job.work, Work::Start { .. })
            && session.unstarted_firings().is_ok_and(|firings| {
                !firings
                    .iter()
                    .any(|f| f.run_id.as_deref() == Some(job.run_id.as_str()))
            })
        {
            // Its firing was dropped while it waited (`archon cancel` on the same state directory).
            output::stderr(&output::printable(&format!(
                "run `{}` does not start: it was cancelled before it started\n",
                job.run_id
            )));
            return false;
        }
        let prepared = match &job.work {
            Work::Start { served, inputs } => {
                let workdir = served
                    .path
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), PathBuf::from);
                let Some(workflow) = &served.workflow else {
                    return false;
                };
                session.start(NewRunRequest {
                    id: job.run_id.clone(),
                    workflow: (**workflow).clone(),
                    inputs: inputs.clone(),
                    spec_path: served.path.clone(),
                    workdir: std::fs::canonicalize(&workdir).unwrap_or(workdir),
                    max_parallel: None,
                })
            }
            Work::Continue { how, options } => session.continue_run(
                &job.run_id,
                how.as_continue(),
                &ContinueOptions {
                    rerun_in_doubt: options.rerun_in_doubt,
                    allow_changed_spec: options.allow_changed_spec,
                    max_parallel: None,
                },
            ),
        };
        if let Some(active) = self.state().active.get_mut(&job.run_id) {
            active.starting = None;
        }
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                complain(&session_message(&e));
                return false;
            }
        };
        self.wake();
        let attachments = Attachments {
            cancel,
            helper: self.0.helper.clone(),
            recorded: Some(self.0.recorded.clone()),
            labels: self.0.labels.clone(),
            ..Attachments::default()
        };
        let outcome = runtime.block_on(session.execute(prepared, attachments));
        runtime.shutdown_background();
        match outcome {
            Ok(outcome) => {
                if let Some(error) = outcome.unsaved {
                    complain(&format!("its state could not be saved: {error}"));
                }
                let mut resumable = outcome.resumable;
                if resumable
                    && for_good.load(Ordering::SeqCst)
                    && session.cancel(&job.run_id).is_ok()
                {
                    resumable = false;
                }
                resumable
                    && self.0.stopping.is_cancelled()
                    && session
                        .summary(&job.run_id)
                        .ok()
                        .flatten()
                        .is_some_and(|s| s.status == RunState::Interrupted)
            }
            Err(e) => {
                complain(&session_message(&e));
                false
            }
        }
    }

    /// A run's thread ended: its place goes to the next job.
    fn finished(&self, run_id: &str, interrupted: bool) {
        {
            let mut state = self.state();
            state.active.remove(run_id);
            if interrupted {
                state.interrupted.push(run_id.to_owned());
            }
        }
        self.0.running.send_modify(|n| *n = n.saturating_sub(1));
        self.dispatch();
        self.wake();
    }
}

/// A decision's result.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Decided {
    pub step: String,
    pub tool: Option<String>,
    /// The SHA-256 the decision is bound to.
    pub key: String,
    /// How many calls of the run still wait for a decision.
    pub still_waiting: usize,
    /// The run, resumed once no call waits (absent while some do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resumed: Option<Started>,
}

/// A cancellation's result.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Cancelled {
    pub run_id: String,
    /// `cancelled` (done), `cancelling` (its process was asked to stop) or `dequeued` (it never started).
    pub status: String,
}

/// What `serve/restart.json` holds.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Restart {
    /// Runs interrupted by the stop.
    resume: Vec<String>,
    /// Jobs still queued, in order.
    queued: Vec<SavedJob>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum SavedJob {
    Start {
        run_id: String,
        workflow: String,
        inputs: Map<String, Json>,
        trigger: Option<TriggerInfo>,
        /// Whether a firing names it (absent in files of earlier versions: a trigger's run is).
        #[serde(default)]
        recorded: bool,
    },
    Continue {
        run_id: String,
        workflow: String,
        how: How,
        options: Options,
    },
}

/// A session's refusal as one message, with its hint.
pub fn session_message(error: &SessionError) -> String {
    match error {
        SessionError::Refused { message, hint } => format!("{message}\n  hint: {hint}"),
        SessionError::Store(e) => match &e.hint {
            Some(hint) => format!("{}\n  hint: {hint}", e.message),
            None => e.message.clone(),
        },
        other => other.to_string(),
    }
}

/// Records the firing of a run cancelled before it started as skipped, so that no later start of a
/// server starts it.
async fn skip_firing(app: &Arc<App>, run_id: &str) -> Result<(), ApiError> {
    let id = run_id.to_owned();
    app.read(move |session| {
        session
            .skip_unstarted_firing(&id, "cancelled before its run started")
            .map_err(|e| ApiError::store(&e))
    })
    .await
    .map(|_| ())
    .map_err(|e| e.with_hint("the run left the queue, but the next `archon serve` starts it"))
}
