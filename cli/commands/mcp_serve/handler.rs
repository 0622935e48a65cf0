//! The MCP side of `archon mcp serve`: `tools/list` shows the served workflows, and `tools/call` runs one
//! as a durable run in the state directory, reporting its steps as progress.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use archon_engine::inputs;
use archon_engine::run::{RunEvent, RunReport, RunStatus, StepStatus};
use archon_engine::session::{self, Attachments, NewRunRequest, Session, SessionError, StoreAt};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam,
    ContentBlock, Implementation, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProgressNotificationParam, RequestId, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value as Json, json};
use tokio_util::sync::CancellationToken;

use super::catalog::{Catalog, Served};

/// What every connection shares: the served workflows, where runs are recorded, and the server's life.
#[derive(Debug)]
pub struct Shared {
    pub catalog: Catalog,
    /// Where runs are kept (the state directory, absolute, or a PostgreSQL database).
    pub store: StoreAt,
    /// Cancelled when the server stops: every run is interrupted (and stays resumable).
    pub stopping: CancellationToken,
    /// How many runs are going on: the server waits for none before it exits.
    pub running: tokio::sync::watch::Sender<usize>,
    /// How many calls are being handled: over HTTP, the server waits for none before it closes.
    pub answering: tokio::sync::watch::Sender<usize>,
    /// A permit for each run that may go on at once (`--max-runs`).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// `archon` itself, for the jq filters and templates a run evaluates in a process of its own.
    pub helper: Option<PathBuf>,
    /// The labels this server has (`--labels`), which the run of every call has.
    pub labels: archon_engine::workflow::Labels,
}

/// One connection's handler (an MCP session).
#[derive(Clone, Debug)]
pub struct Handler {
    shared: Arc<Shared>,
    /// Over HTTP, the session's place among those open at once: freed when the session ends.
    _session: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
    /// The calls going on, by request id: what cancels each.
    calls: Arc<Mutex<HashMap<RequestId, Call>>>,
}

/// A call going on.
#[derive(Clone, Debug)]
struct Call {
    /// Stops its run.
    cancel: CancellationToken,
    /// The client cancelled the call: the run ends cancelled, not resumable.
    for_good: Arc<AtomicBool>,
}

impl Handler {
    pub fn new(shared: Arc<Shared>) -> Self {
        Handler {
            shared,
            _session: None,
            calls: Arc::default(),
        }
    }

    /// The handler of an HTTP session that holds `session` while it is open.
    pub fn holding(self, session: tokio::sync::OwnedSemaphorePermit) -> Self {
        Handler {
            _session: Some(Arc::new(session)),
            ..self
        }
    }
}

/// Forgets a call when its handler ends, however it ends.
struct Registered<'a> {
    calls: &'a Mutex<HashMap<RequestId, Call>>,
    id: RequestId,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.remove(&self.id);
        }
    }
}

/// Counts a run or a call as going on for as long as it lives.
struct Counted(tokio::sync::watch::Sender<usize>);

impl Counted {
    fn new(counter: &tokio::sync::watch::Sender<usize>) -> Self {
        counter.send_modify(|n| *n += 1);
        Counted(counter.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("archon", env!("CARGO_PKG_VERSION"))
                    .with_title("Archon workflows"),
            )
            .with_instructions(
                "Each tool runs an Archon workflow to its end as a durable run, recorded in the state \
                 directory (`archon runs` lists them). A run that pauses for a person's approval returns \
                 its run id and the commands that continue it.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.shared
                .catalog
                .tools
                .values()
                .map(|s| s.tool.clone())
                .collect(),
        ))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.shared.catalog.tools.get(name).map(|s| s.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(served) = self
            .shared
            .catalog
            .tools
            .get(request.name.as_ref())
            .cloned()
        else {
            return Err(ErrorData::invalid_params(
                format!("unknown tool `{}`", request.name),
                None,
            ));
        };
        let _answering = Counted::new(&self.shared.answering);
        let given = request.arguments.unwrap_or_default();
        let inputs = match inputs::resolve(&served.workflow.spec, given, &[]) {
            Ok(inputs) => inputs,
            Err(problems) => {
                let mut text = String::from("invalid arguments:\n");
                for problem in problems {
                    let _ = writeln!(text, "- {}", problem.message);
                    // Hints on how to write `--input` do not help a client.
                    if let Some(hint) = problem.hint.filter(|h| !h.contains("--input")) {
                        let _ = writeln!(text, "  hint: {hint}");
                    }
                }
                return Ok(CallToolResult::error(vec![ContentBlock::text(text)]).into());
            }
        };
        if self.shared.stopping.is_cancelled() {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "the server is stopping: no new run starts",
            )])
            .into());
        }
        // Registered before anything awaits: a `notifications/cancelled` for this call finds it.
        let call = Call {
            cancel: self.shared.stopping.child_token(),
            for_good: Arc::default(),
        };
        if let Ok(mut calls) = self.calls.lock() {
            calls.insert(context.id.clone(), call.clone());
        }
        let _registered = Registered {
            calls: &self.calls,
            id: context.id.clone(),
        };
        // A run starts once fewer than `--max-runs` go on.
        let slot = tokio::select! {
            slot = self.shared.slots.clone().acquire_owned() => slot.ok(),
            () = call.cancel.cancelled() => None,
        };
        let Some(slot) = slot.filter(|_| !context.ct.is_cancelled()) else {
            return Ok(CallToolResult::error(vec![ContentBlock::text(
                "the call was cancelled before its run started",
            )])
            .into());
        };
        let progress = context.meta.get_progress_token();
        let ended = execute(
            &self.shared,
            &served,
            inputs,
            &call,
            slot,
            |done, total, message| {
                let peer = context.peer.clone();
                let progress = progress.clone();
                async move {
                    if let Some(token) = progress {
                        let _ = peer
                            .notify_progress(
                                ProgressNotificationParam::new(token, done as f64)
                                    .with_total(total as f64)
                                    .with_message(message),
                            )
                            .await;
                    }
                }
            },
        )
        .await;
        Ok(result(ended).into())
    }

    async fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        _context: NotificationContext<RoleServer>,
    ) {
        let Some(id) = notification.request_id else {
            return;
        };
        let call = self.calls.lock().ok().and_then(|c| c.get(&id).cloned());
        if let Some(call) = call {
            call.for_good.store(true, Ordering::SeqCst);
            call.cancel.cancel();
        }
    }
}

/// How a call's run ended.
enum Ended {
    /// It ran (to its end, or until stopped or paused).
    Ran {
        report: Box<RunReport>,
        /// Stopped by the server's end: `archon resume` continues it.
        resumable: bool,
    },
    /// It could not start, or its state could not be recorded.
    Refused { run_id: String, message: String },
}

/// Runs the workflow as a new durable run on a thread of its own (the run's scheduler has its own
/// single-threaded runtime, as under `archon run`), telling `report` each time a top-level step is done.
async fn execute<F, Fut>(
    shared: &Shared,
    served: &Served,
    inputs: Map<String, Json>,
    call: &Call,
    slot: tokio::sync::OwnedSemaphorePermit,
    report: F,
) -> Ended
where
    F: Fn(usize, usize, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let run_id = session::new_run_id();
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let (sender, mut ended) = tokio::sync::oneshot::channel();
    let workdir = served
        .path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let request = NewRunRequest {
        id: run_id.clone(),
        workflow: served.workflow.clone(),
        inputs,
        spec_path: served.path.clone(),
        workdir: std::fs::canonicalize(&workdir).unwrap_or(workdir),
        max_parallel: None,
    };
    let attachments = Attachments {
        events: Some(events),
        cancel: call.cancel.clone(),
        helper: shared.helper.clone(),
        labels: shared.labels.clone(),
        ..Attachments::default()
    };
    let store = shared.store.clone();
    let for_good = call.for_good.clone();
    let running = Counted::new(&shared.running);
    let id = run_id.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("run-{run_id}"))
        .spawn(move || {
            let _held = (running, slot);
            let _ = sender.send(run_on_this_thread(&store, request, attachments, &for_good));
        });
    if let Err(e) = spawned {
        return Ended::Refused {
            run_id: id,
            message: format!("cannot start a thread for the run: {e}"),
        };
    }
    let steps: HashSet<&str> = served
        .workflow
        .spec
        .steps
        .iter()
        .map(|s| s.id.value.as_str())
        .collect();
    let total = steps.len();
    let mut done: HashSet<String> = HashSet::new();
    let mut events_open = true;
    loop {
        let event = tokio::select! {
            biased;
            event = received.recv(), if events_open => event,
            outcome = &mut ended => {
                // What the run said before it ended is told before its result.
                while let Ok(event) = received.try_recv() {
                    if let Some(message) = newly_done(&event, &steps, &mut done) {
                        report(done.len(), total, message).await;
                    }
                }
                return outcome.unwrap_or_else(|_| Ended::Refused {
                    run_id: id,
                    message: "the run stopped without a result".to_owned(),
                });
            }
        };
        let Some(event) = event else {
            events_open = false;
            continue;
        };
        if let Some(message) = newly_done(&event, &steps, &mut done) {
            report(done.len(), total, message).await;
        }
    }
}

/// What to say when an event tells of a top-level step done for the first time.
fn newly_done(
    event: &RunEvent,
    steps: &HashSet<&str>,
    done: &mut HashSet<String>,
) -> Option<String> {
    let (step, said) = finished(event)?;
    (steps.contains(step) && done.insert(step.to_owned())).then(|| format!("step `{step}` {said}"))
}

/// The step an event says is done, and how.
fn finished(event: &RunEvent) -> Option<(&str, String)> {
    match event {
        RunEvent::StepFinished { step, status, .. }
        | RunEvent::StepReused { step, status }
        | RunEvent::StepResolved { step, status, .. } => {
            // A step paused for approval is not done.
            (*status != StepStatus::WaitingApproval)
                .then(|| (step.as_str(), status.as_str().replace('_', " ")))
        }
        RunEvent::StepSkipped { step, .. } => Some((step.as_str(), "skipped".to_owned())),
        RunEvent::StepCached { step, .. } => {
            Some((step.as_str(), "reused from the cache".to_owned()))
        }
        _ => None,
    }
}

/// Starts and executes one run on the calling thread; a run the client cancelled ends cancelled for good.
fn run_on_this_thread(
    store: &StoreAt,
    request: NewRunRequest,
    attachments: Attachments,
    for_good: &AtomicBool,
) -> Ended {
    let run_id = request.id.clone();
    let refused = |message: String| Ended::Refused {
        run_id: run_id.clone(),
        message,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return refused(format!("cannot start the run: {e}")),
    };
    let session = match Session::open_at(store) {
        Ok(session) => session,
        Err(e) => return refused(e.to_string()),
    };
    let prepared = match session.start(request) {
        Ok(prepared) => prepared,
        Err(e) => return refused(session_message(&e)),
    };
    let outcome = runtime.block_on(session.execute(prepared, attachments));
    runtime.shutdown_background();
    match outcome {
        Ok(outcome) => {
            if let Some(error) = outcome.unsaved {
                return refused(format!(
                    "the run's state could not be saved: {error}\n`archon resume {run_id}` continues it once the state directory can be written"
                ));
            }
            let mut resumable = outcome.resumable;
            // Stopped by the client: cancelled for good, as `archon cancel` would.
            if resumable && for_good.load(Ordering::SeqCst) && session.cancel(&run_id).is_ok() {
                resumable = false;
            }
            Ended::Ran {
                report: Box::new(outcome.report),
                resumable,
            }
        }
        Err(e) => refused(session_message(&e)),
    }
}

/// A session's refusal as one message, with its hint.
fn session_message(error: &SessionError) -> String {
    match error {
        SessionError::Refused { message, hint } => format!("{message}\nhint: {hint}"),
        SessionError::Store(e) => match &e.hint {
            Some(hint) => format!("{}\nhint: {hint}", e.message),
            None => e.message.clone(),
        },
        SessionError::Invalid { path, .. } => {
            format!(
                "the workflow `{}` does not validate: `archon validate` shows why",
                path.display()
            )
        }
        other => other.to_string(),
    }
}

/// The tool result of a call's run.
fn result(ended: Ended) -> CallToolResult {
    let (report, resumable) = match ended {
        Ended::Ran { report, resumable } => (report, resumable),
        Ended::Refused { run_id, message } => {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "run {run_id} did not run: {message}"
            ))])
            .with_meta(Some(meta(&run_id, "failed")));
        }
    };
    let id = &report.run_id;
    let head = format!("run {id} of `{}`", report.workflow);
    match report.status {
        RunStatus::Succeeded => {
            let outputs = Json::Object(report.outputs.clone());
            let text = format!(
                "{head} succeeded in {} ms\noutputs: {}",
                report.duration_ms,
                serde_json::to_string_pretty(&outputs).unwrap_or_default()
            );
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = Some(outputs);
            result.with_meta(Some(meta(id, "succeeded")))
        }
        RunStatus::Failed => {
            let mut text = format!("{head} failed");
            if let Some(error) = &report.error {
                let _ = write!(text, ": {error}");
            }
            if let Some((step, result)) = report.steps.iter().find(|(_, s)| {
                matches!(
                    s.status,
                    StepStatus::Failed | StepStatus::TimedOut | StepStatus::Stuck
                )
            }) {
                let _ = write!(
                    text,
                    "\nstep `{step}` {}: {}",
                    result.status.as_str().replace('_', " "),
                    result.error.as_deref().unwrap_or("no error recorded")
                );
            }
            let _ = write!(
                text,
                "\n`archon show {id}` shows the run; `archon retry {id} --failed` runs the failed steps again"
            );
            CallToolResult::error(vec![ContentBlock::text(text)])
                .with_meta(Some(meta(id, "failed")))
        }
        RunStatus::WaitingApproval => {
            let waiting: Vec<String> = report
                .steps
                .iter()
                .filter(|(name, s)| {
                    s.status == StepStatus::WaitingApproval && !name.contains(['/', '['])
                })
                .map(|(name, _)| format!("`{name}`"))
                .collect();
            let text = format!(
                "{head} is waiting for approval{}\nto continue it: `archon approve {id}` (or `archon approve {id} --deny`), then `archon resume {id}`",
                if waiting.is_empty() {
                    String::new()
                } else {
                    format!(" (steps {})", waiting.join(", "))
                }
            );
            CallToolResult::success(vec![ContentBlock::text(text)])
                .with_meta(Some(meta(id, "waiting_approval")))
        }
        RunStatus::Cancelled if resumable => {
            CallToolResult::error(vec![ContentBlock::text(format!(
                "{head} was interrupted: the server stopped\n`archon resume {id}` continues it"
            ))])
            .with_meta(Some(meta(id, "interrupted")))
        }
        RunStatus::Cancelled => {
            CallToolResult::error(vec![ContentBlock::text(format!("{head} was cancelled"))])
                .with_meta(Some(meta(id, "cancelled")))
        }
    }
}

/// The result's `_meta`: the run's id and status, for clients that follow up on runs.
fn meta(run_id: &str, status: &str) -> MetaObject {
    let mut meta = MetaObject::default();
    meta.0.insert(
        "archon/run".to_owned(),
        json!({ "id": run_id, "status": status }),
    );
    meta
}
