//! Live events, over server-sent events.
//!
//! The store is the source of truth: one watcher thread asks it, every [`POLL`], whether any connection
//! committed a change (`PRAGMA data_version`), which covers runs of a separate `archon run` process on
//! the same state directory. Runs this server executes also tell each event the moment they record it
//! (before their journal commits it, which may take up to 50 ms), numbered as the store
//! numbers it, so a stream sends it at once and skips it when the store has it.
//!
//! `GET /api/v1/runs/{id}/stream` sends, as they come: `event` (data: `{"seq": N, "event": {...}}`, the
//! event as `GET /api/v1/runs/{id}/events` shows it; SSE id `N`), `log` (data: a log piece as `GET
//! /api/v1/runs/{id}/logs` shows it), and `run` (data: the run's summary, whenever its status changes).
//! `GET /api/v1/runs/stream` sends `run` for each run that started or changed status. Both send a
//! comment every 15 seconds to keep the connection open, and end when the server stops.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use archon_engine::session::{RecordedEvent, RunSummary, Session};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde_json::{Value as Json, json};

use super::app::{ApiError, App, AppState};

/// How often the watcher asks the store whether anything changed.
pub const POLL: Duration = Duration::from_millis(20);
/// Most event streams open at once; one more gets `503`.
pub const MAX_STREAMS: usize = 64;
/// Most events or log pieces read from the store at once for one stream.
const BATCH: usize = 500;
/// How far back (milliseconds) the watcher looks for runs that started or ended since its last look: a
/// run's times are stamped before its commit lands.
const SLACK_MS: u64 = 5_000;

/// The live side of the server: changes seen in the store, events of the runs executed here.
#[derive(Debug)]
pub struct Live {
    /// Bumped whenever the store changed.
    changed: tokio::sync::watch::Sender<u64>,
    /// Events of runs executed here, as they are recorded.
    events: tokio::sync::broadcast::Sender<Arc<RecordedEvent>>,
    /// Runs whose summary changed.
    runs: tokio::sync::broadcast::Sender<Arc<RunSummary>>,
    /// Where runs send their events (forwarded to `events` by a task).
    recorder: tokio::sync::mpsc::UnboundedSender<RecordedEvent>,
    recorded: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<RecordedEvent>>>,
    streams: Arc<tokio::sync::Semaphore>,
}

impl Live {
    pub fn new() -> Live {
        let (recorder, recorded) = tokio::sync::mpsc::unbounded_channel();
        Live {
            changed: tokio::sync::watch::channel(0).0,
            events: tokio::sync::broadcast::channel(4096).0,
            runs: tokio::sync::broadcast::channel(1024).0,
            recorder,
            recorded: std::sync::Mutex::new(Some(recorded)),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        }
    }

    /// Where a run executed here tells its events.
    pub fn recorder(&self) -> tokio::sync::mpsc::UnboundedSender<RecordedEvent> {
        self.recorder.clone()
    }

    /// A place among the open streams, or `503`.
    fn stream_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.streams.clone().try_acquire_owned().map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                format!("{MAX_STREAMS} event streams are open, the most served at once"),
            )
            .with_hint("close a dashboard tab, or try again later")
        })
    }
}

impl Default for Live {
    fn default() -> Self {
        Live::new()
    }
}

/// Starts the watcher (a thread that polls the store) and the task that forwards the events of runs
/// executed here.
pub fn spawn_watcher(app: AppState) {
    if let Some(mut recorded) = app.live.recorded.lock().ok().and_then(|mut r| r.take()) {
        let live = app.clone();
        tokio::spawn(async move {
            while let Some(event) = recorded.recv().await {
                let _ = live.live.events.send(Arc::new(event));
            }
        });
    }
    let spawned = std::thread::Builder::new()
        .name("serve-watcher".to_owned())
        .spawn(move || watch(&app));
    if let Err(e) = spawned {
        crate::output::stderr(&format!(
            "warning: cannot start the store watcher ({e}): live updates are off\n"
        ));
    }
}

/// Polls the store until the server stops, bumping `changed` and sending the runs whose summary changed.
fn watch(app: &App) {
    let Ok(session) = Session::open_at(&app.store) else {
        return;
    };
    let mut executor = app.executor.watch();
    let mut last = session.changes().ok().flatten();
    // The runs last seen running or waiting, or started or ended lately: looked at again until they
    // are none of these.
    let mut known: HashMap<String, RunSummary> = HashMap::new();
    let mut looked = super::app::now_ms();
    if let Ok(runs) = session.changed_since(looked.saturating_sub(SLACK_MS)) {
        for run in runs {
            known.insert(run.id.clone(), run);
        }
    }
    while !app.stopping.is_cancelled() {
        std::thread::sleep(POLL);
        let now = session.changes().ok().flatten();
        let executor_changed = executor.has_changed().unwrap_or(false);
        if executor_changed {
            executor.mark_unchanged();
        }
        if now == last && !executor_changed {
            continue;
        }
        last = now;
        app.live.changed.send_modify(|n| *n = n.wrapping_add(1));
        let at = super::app::now_ms();
        let since = looked.saturating_sub(SLACK_MS);
        looked = at;
        let Ok(runs) = session.changed_since(since) else {
            continue;
        };
        let mut seen = std::collections::HashSet::new();
        for run in runs {
            seen.insert(run.id.clone());
            if known.get(&run.id) != Some(&run) {
                let _ = app.live.runs.send(Arc::new(run.clone()));
                known.insert(run.id.clone(), run);
            }
        }
        // Runs that left the set (a run whose owner stopped, interrupted): looked up one by one.
        let gone: Vec<String> = known
            .keys()
            .filter(|id| !seen.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Ok(Some(run)) = session.summary(&id)
                && known.get(&id) != Some(&run)
            {
                let _ = app.live.runs.send(Arc::new(run));
            }
            known.remove(&id);
        }
    }
}

/// The SSE response of a channel of events, ending when the server stops.
fn sse(
    app: &AppState,
    receiver: tokio::sync::mpsc::Receiver<Event>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>> + use<>> {
    let stopping = app.stopping.clone();
    let stream = futures_util::stream::unfold(
        (receiver, stopping),
        |(mut receiver, stopping)| async move {
            tokio::select! {
                event = receiver.recv() => event.map(|e| (Ok(e), (receiver, stopping))),
                () = stopping.cancelled() => None,
            }
        },
    );
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

/// An SSE event of `kind` whose data is `data` as JSON, the run data among it masked (an `event`'s
/// event, a `log`'s text), as the API masks it.
fn event(app: &App, kind: &str, data: &Json, id: Option<i64>) -> Event {
    let mut data = data.clone();
    match kind {
        "event" => {
            if let Some(event) = data.get_mut("event") {
                app.mask_event(event);
            }
        }
        "log" => {
            if let Some(text) = data.get_mut("text") {
                app.secrets.json(text);
            }
        }
        _ => {}
    }
    let text = serde_json::to_string(&data).unwrap_or_else(|_| "null".to_owned());
    let event = Event::default().event(kind).data(text);
    match id {
        Some(id) => event.id(id.to_string()),
        None => event,
    }
}

/// Where a run's stream starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunCursors {
    /// The last event the client has (0: none).
    pub events_after: i64,
    /// The last log piece the client has (0: none).
    pub logs_after: i64,
}

/// The stream of one run: its events, its logs and its status, from the cursors on.
pub async fn run_stream(
    app: AppState,
    run_id: String,
    from: RunCursors,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    let slot = app.live.stream_slot()?;
    // Asked before the store: a new run leaves `pending` only once it is stored.
    let pending = app.executor.pending(&run_id).is_some();
    let id = run_id.clone();
    let known = app
        .read(move |session| session.summary(&id).map_err(|e| ApiError::store(&e)))
        .await?;
    if known.is_none() && !pending {
        return Err(ApiError::unknown_run(&run_id));
    }
    // Subscribed before the first read of the store: nothing recorded in between is missed.
    let mut live = app.live.events.subscribe();
    let mut runs = app.live.runs.subscribe();
    let mut changed = app.live.changed.subscribe();
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    let task_app = app.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let app = task_app;
        let mut events_after = from.events_after;
        let mut logs_after = from.logs_after;
        let mut status = None;
        // Events told ahead of the store, waiting for the ones before them.
        let mut ahead: std::collections::BTreeMap<i64, Json> = std::collections::BTreeMap::new();
        loop {
            // What the store has that the client does not.
            let (id, ea, la) = (run_id.clone(), events_after, logs_after);
            let read = app
                .read(move |session| {
                    let events = session
                        .events_after(&id, ea, BATCH)
                        .map_err(|e| ApiError::store(&e))?;
                    let logs = session
                        .logs_after(&id, la, BATCH)
                        .map_err(|e| ApiError::store(&e))?;
                    let summary = session.summary(&id).map_err(|e| ApiError::store(&e))?;
                    Ok((events, logs, summary))
                })
                .await;
            let Ok((events, logs, summary)) = read else {
                return;
            };
            let full = events.len() == BATCH || logs.len() == BATCH;
            for (seq, data) in events {
                if seq > events_after {
                    ahead.remove(&seq);
                    events_after = seq;
                    if sender
                        .send(event(
                            &app,
                            "event",
                            &json!({"seq": seq, "event": data}),
                            Some(seq),
                        ))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            if !send_ahead(&app, &sender, &mut ahead, &mut events_after).await {
                return;
            }
            for chunk in logs {
                logs_after = chunk.seq;
                let data = serde_json::to_value(&chunk).unwrap_or(Json::Null);
                if sender.send(event(&app, "log", &data, None)).await.is_err() {
                    return;
                }
            }
            if let Some(summary) = summary
                && status != Some(summary.status)
            {
                status = Some(summary.status);
                let data = serde_json::to_value(&summary).unwrap_or(Json::Null);
                if sender.send(event(&app, "run", &data, None)).await.is_err() {
                    return;
                }
            }
            if full {
                continue;
            }
            // Wait for something new: an event told by a run here, a change of the store.
            loop {
                tokio::select! {
                    told = live.recv() => match told {
                        Ok(told) if told.run_id == run_id => {
                            if told.seq > events_after {
                                ahead.insert(told.seq, told.event.clone());
                            }
                            if !send_ahead(&app, &sender, &mut ahead, &mut events_after).await {
                                return;
                            }
                        }
                        Ok(_) => {}
                        // Missed some: the store has them.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => break,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                    changed_run = runs.recv() => match changed_run {
                        Ok(run) if run.id == run_id => break,
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                    c = changed.changed() => {
                        if c.is_err() {
                            return;
                        }
                        break;
                    }
                    () = sender.closed() => return,
                    () = app.stopping.cancelled() => return,
                }
            }
        }
    });
    Ok(sse(&app, receiver))
}

/// Sends the events told ahead that follow the last one sent, in order; `false` once the client left.
async fn send_ahead(
    app: &App,
    sender: &tokio::sync::mpsc::Sender<Event>,
    ahead: &mut std::collections::BTreeMap<i64, Json>,
    events_after: &mut i64,
) -> bool {
    while let Some(data) = ahead.remove(&(*events_after + 1)) {
        *events_after += 1;
        let seq = *events_after;
        if sender
            .send(event(
                app,
                "event",
                &json!({"seq": seq, "event": data}),
                Some(seq),
            ))
            .await
            .is_err()
        {
            return false;
        }
    }
    ahead.retain(|seq, _| *seq > *events_after);
    true
}

/// The stream of the run list: a `run` event whenever a run starts or its status changes.
pub async fn runs_stream(
    app: AppState,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>> + use<>>, ApiError> {
    let slot = app.live.stream_slot()?;
    let mut runs = app.live.runs.subscribe();
    let mut queue = app.executor.watch();
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    let task_app = app.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let app = task_app;
        loop {
            tokio::select! {
                run = runs.recv() => match run {
                    Ok(run) => {
                        let data = serde_json::to_value(&*run).unwrap_or(Json::Null);
                        if sender.send(event(&app, "run", &data, None)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if sender.send(event(&app, "reload", &Json::Null, None)).await.is_err() {
                            return;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                c = queue.changed() => {
                    if c.is_err() {
                        return;
                    }
                    let data = serde_json::to_value(app.executor.queue()).unwrap_or(Json::Null);
                    if sender.send(event(&app, "queue", &data, None)).await.is_err() {
                        return;
                    }
                }
                () = sender.closed() => return,
                () = app.stopping.cancelled() => return,
            }
        }
    });
    Ok(sse(&app, receiver))
}
