//! Triggers under `archon serve` (docs/spec.md#triggers, docs/serve.md#triggers): the cron loop, the
//! webhook endpoint `POST /hooks/{workflow}`, and what the API shows of triggers and their firings. The
//! engine decides (`archon_engine::trigger`: schedules, overlap, verification) and records every firing
//! before its run exists; this module owns the timer and the HTTP side, and starts each firing's run
//! through the server's executor under the id the firing recorded, as a run started from the API.
//!
//! - On start: the firings recorded whose run was never created (the server stopped in between) start,
//!   unless this server took their run up already from `serve/restart.json`; then the first pass of the
//!   scheduler catches up the missed slots within each trigger's `catch_up`.
//! - The loop sleeps until the scheduler's next wake-up (at most [`RECHECK`], so a clock that jumps is
//!   noticed), takes the firings due, and applies each one's decision: start, skip (recorded so), queue
//!   (its run starts once the run it follows has ended) or cancel the previous runs then start.
//! - `POST /hooks/{workflow}` is outside the server's authentication: the webhook's own signature or
//!   token authenticates it, and it sets no cookie, so it has no CSRF check either.

// The OpenAPI macros name parameter types by their path.
#![allow(unused_qualifications)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use archon_engine::session::{Firing, FiringFilter, FiringKind, Session};
use archon_engine::trigger::{
    CronSchedule, Decision, Delivery, Due, MAX_BODY_BYTES, ReceiveError, Received, Scheduler,
    Timestamp, Webhook, WebhookError,
};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::api::{Path, Query};
use super::app::{ApiError, App, AppState};
use super::executor::{Held, Pending, TriggerInfo};
use crate::output;

/// The longest the loop sleeps before it looks at the clock again.
const RECHECK: Duration = Duration::from_secs(60);
/// Most firings in one page of `GET /api/v1/firings`.
const MAX_FIRINGS_PAGE: usize = 200;
/// Firings in a page when the request does not say.
const DEFAULT_FIRINGS_PAGE: usize = 50;
/// How deep `offset` may go into the firings.
const MAX_FIRINGS_OFFSET: usize = 10_000;

/// The webhooks of the served workflows, read once when the server starts (their secrets' values
/// included), by workflow id.
#[derive(Debug)]
pub struct Hooks {
    hooks: BTreeMap<String, Result<Arc<Webhook>, String>>,
    /// Bodies being read at once: each holds up to `MAX_BODY_BYTES` before its signature is checked.
    reading: Arc<tokio::sync::Semaphore>,
    /// How long a delivery has to send its body once it is being read: a stalled one gives its place
    /// back then.
    body_timeout: Duration,
}

/// Most delivery bodies read at once (so at most this many times `MAX_BODY_BYTES` in memory); one more
/// is answered `503`.
const MAX_BODIES_READ: usize = 32;

impl Hooks {
    /// The webhook of every valid served workflow that has one; one whose secret has no value is kept
    /// as the reason it cannot take deliveries (said on standard error, answered with `503`).
    pub fn load(app: &App, body_timeout: Duration) -> Hooks {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let mut hooks = BTreeMap::new();
        for (id, served) in &app.catalog.workflows {
            let Some(workflow) = &served.workflow else {
                continue;
            };
            match Webhook::of(workflow, &env) {
                Ok(Some(hook)) => {
                    hooks.insert(id.clone(), Ok(Arc::new(hook)));
                }
                Ok(None) => {}
                Err(e) => {
                    output::stderr(&output::printable(&format!(
                        "warning: {e}: its webhook refuses deliveries\n"
                    )));
                    hooks.insert(id.clone(), Err(e.to_string()));
                }
            }
        }
        Hooks {
            hooks,
            reading: Arc::new(tokio::sync::Semaphore::new(MAX_BODIES_READ)),
            body_timeout,
        }
    }
}

/// The route `POST /hooks/{workflow}`, with its own state: it is merged outside the authentication
/// middleware.
pub fn hooks_router(app: AppState, body_timeout: Duration) -> Router {
    let hooks = Arc::new(Hooks::load(&app, body_timeout));
    Router::new()
        .route("/hooks/{workflow}", axum::routing::post(deliver))
        .with_state((app, hooks))
}

/// What a new delivery started.
#[derive(Debug, Serialize)]
struct Accepted {
    run_id: String,
    delivery: String,
    queued: bool,
}

/// Takes a delivery: `202` with the run it starts, `200` for a replay, `401` unauthenticated, `400` a
/// body or delivery id refused, `404` no such webhook, `413` too large, `503` stopping or unconfigured.
async fn deliver(
    State((app, hooks)): State<(AppState, Arc<Hooks>)>,
    axum::extract::Path(workflow): axum::extract::Path<String>,
    request: Request,
) -> Response {
    let Some(hook) = hooks.hooks.get(&workflow) else {
        return unread(
            ApiError::not_found(format!("no webhook for workflow `{workflow}`"))
                .with_hint(
                    "a served workflow takes deliveries when one of its `triggers` is a `webhook`",
                )
                .into_response(),
        );
    };
    let hook = match hook {
        Ok(hook) => hook.clone(),
        Err(reason) => {
            return unread(
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, reason.clone())
                    .with_hint("set the secret's value and start the server again")
                    .into_response(),
            );
        }
    };
    let too_large = || {
        unread(
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                WebhookError::TooLarge {
                    limit: MAX_BODY_BYTES,
                }
                .to_string(),
            )
            .into_response(),
        )
    };
    let (parts, body) = request.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let signature = archon_engine::trigger::SIGNATURE_HEADERS
        .iter()
        .find_map(|h| header(h));
    // A delivery id that is not text (bytes beyond ASCII) is still one: refused as malformed, not as
    // missing.
    let delivery_id = archon_engine::trigger::DELIVERY_HEADERS
        .iter()
        .find_map(|h| {
            parts
                .headers
                .get(*h)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        });
    let authorization = header("authorization");
    // What the headers alone decide comes before the body is read, and only so many bodies are read at
    // once: a sender without the token or a signature costs no memory.
    let in_headers = Delivery {
        body: &[],
        signature: signature.as_deref(),
        authorization: authorization.as_deref(),
        id: delivery_id.as_deref(),
    };
    if let Err(refused) = hook.verify_headers(&in_headers) {
        return unread(refusal(refused).into_response());
    }
    let Ok(_reading) = hooks.reading.clone().try_acquire_owned() else {
        return unread(
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{MAX_BODIES_READ} deliveries are being read already, the most at once"),
            )
            .with_hint("deliver it again in a moment")
            .into_response(),
        );
    };
    let declared = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    // Read at most the limit: a longer body stops being read there; a body that does not come in time
    // stops being waited for.
    let read = tokio::time::timeout(
        hooks.body_timeout,
        axum::body::to_bytes(body, MAX_BODY_BYTES),
    );
    let body = match read.await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => return too_large(),
        Err(_) => {
            return unread(
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the delivery's body did not come within {:?}",
                        hooks.body_timeout
                    ),
                )
                .with_hint("send the whole body at once")
                .into_response(),
            );
        }
    };
    // A place in the queue first: a delivery the server cannot take now is refused unrecorded, so that
    // the sender's next attempt runs instead of being a replay.
    let room = match app.executor.reserve() {
        Ok(room) => room,
        Err(e) => {
            return e
                .with_hint("the delivery is not recorded: deliver it again later")
                .into_response();
        }
    };
    let received = app
        .read(move |session| {
            let delivery = Delivery {
                body: &body,
                signature: signature.as_deref(),
                authorization: authorization.as_deref(),
                id: delivery_id.as_deref(),
            };
            Ok(session.receive_delivery(&hook, &delivery, Timestamp::now()))
        })
        .await;
    let received = match received {
        Ok(received) => received,
        Err(e) => return e.into_response(),
    };
    match received {
        Ok(Received::Fired(firing)) => {
            let delivery = firing.slot.clone();
            match start_in(&app, &firing, Some(room)) {
                Ok(started) => (
                    StatusCode::ACCEPTED,
                    axum::Json(Accepted {
                        run_id: started.run_id,
                        delivery,
                        queued: started.queued,
                    }),
                )
                    .into_response(),
                Err(e) => e
                    .with_hint(
                        "the delivery is recorded: its run starts when the server next starts",
                    )
                    .into_response(),
            }
        }
        Ok(Received::Replayed { delivery }) => (
            StatusCode::OK,
            axum::Json(json!({"delivery": delivery, "replayed": true})),
        )
            .into_response(),
        Err(ReceiveError::Refused(refused)) => refusal(refused).into_response(),
        Err(ReceiveError::Store(e)) => ApiError::store(&e)
            .with_hint("the delivery is not recorded: deliver it again")
            .into_response(),
    }
}

/// An answer given without reading the request's body: the connection closes, and says so, so that
/// a client does not send its next request on it.
fn unread(mut response: Response) -> Response {
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
}

/// The answer to a refused delivery.
fn refusal(refused: WebhookError) -> ApiError {
    let status = match refused {
        WebhookError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        WebhookError::MissingSignature
        | WebhookError::BadSignature
        | WebhookError::MissingToken
        | WebhookError::BadToken => StatusCode::UNAUTHORIZED,
        WebhookError::MissingDelivery
        | WebhookError::BadDelivery
        | WebhookError::NotJson(_)
        | WebhookError::Invalid { .. } => StatusCode::BAD_REQUEST,
    };
    // The engine's message says what to send after a colon: the API says it as the hint.
    let (message, hint) = match refused {
        WebhookError::MissingSignature => (
            "the delivery is not signed".to_owned(),
            Some("send `X-Archon-Signature: sha256=<hex>` (or `X-Hub-Signature-256`)".to_owned()),
        ),
        WebhookError::MissingToken => (
            "the delivery has no bearer token".to_owned(),
            Some("send `Authorization: Bearer <token>`".to_owned()),
        ),
        WebhookError::MissingDelivery => (
            "the delivery has no id".to_owned(),
            Some("send `X-Archon-Delivery` (or `X-GitHub-Delivery`)".to_owned()),
        ),
        WebhookError::BadDelivery => (
            format!(
                "the delivery id is not 1 to {} visible ASCII characters",
                archon_engine::trigger::MAX_DELIVERY_ID_BYTES
            ),
            Some(
                "send `X-Archon-Delivery` as letters, digits and punctuation, without spaces"
                    .to_owned(),
            ),
        ),
        other => (other.to_string(), None),
    };
    let error = ApiError::new(status, message);
    match hint {
        Some(hint) => error.with_hint(hint),
        None => error,
    }
}

/// Starts a firing's run through the executor, under the run id the firing recorded.
fn start(app: &App, firing: &Firing) -> Result<super::executor::Started, ApiError> {
    start_in(app, firing, None)
}

/// [`start`] in the place `room` holds in the queue, if given.
fn start_in(
    app: &App,
    firing: &Firing,
    room: Option<super::executor::Room>,
) -> Result<super::executor::Started, ApiError> {
    let Some(run_id) = firing.run_id.clone() else {
        return Err(ApiError::internal(format!(
            "the firing `{}` of trigger `{}` starts no run",
            firing.slot, firing.trigger
        )));
    };
    app.executor.start_run_as(
        app,
        &firing.workflow,
        firing.inputs.clone(),
        trigger_info(firing),
        run_id,
        room,
    )
}

/// What started a firing's run, as the API shows it: none for a start from the API that waited.
fn trigger_info(firing: &Firing) -> Option<TriggerInfo> {
    let detail = match firing.kind {
        FiringKind::Cron => json!({"kind": "cron", "slot": firing.slot}),
        FiringKind::Webhook => json!({"kind": "webhook", "delivery": firing.slot}),
        FiringKind::Api => return None,
    };
    Some(TriggerInfo {
        name: firing.trigger.clone(),
        detail,
    })
}

// ---------------------------------------------------------------------------------------------------
// The loop

/// Whether a run a trigger started is still going here: executing, in the executor's queue, or
/// waiting for the run before it (held in [`super::executor::Waiting`], where the API sees it).
fn active(app: &App, run_id: &str) -> bool {
    app.executor.is_busy(run_id) || app.executor.waiting().lock().contains_key(run_id)
}

/// Starts the trigger loop: the unstarted firings, the catch-up, then each slot as it comes, until the
/// server stops. Call it after the executor took up what the last stop left.
pub fn spawn(app: AppState) {
    let mut scheduler = Scheduler::new();
    let mut count = 0;
    for served in app.catalog.workflows.values() {
        let Some(workflow) = &served.workflow else {
            continue;
        };
        // A valid workflow's id is its name: two of the same name are both invalid (`workflows.rs`).
        match scheduler.add(workflow) {
            Ok(n) => count += n,
            Err(e) => output::stderr(&output::printable(&format!(
                "warning: {e}: its cron triggers do not run\n"
            ))),
        }
    }
    tokio::spawn(run_loop(app, scheduler, count));
}

async fn run_loop(app: AppState, mut scheduler: Scheduler, count: usize) {
    let session = match Session::open_at(&app.store) {
        Ok(session) => session,
        Err(e) => {
            output::stderr(&format!("error: triggers do not run: {e}\n"));
            return;
        }
    };
    let session = Arc::new(Mutex::new(session));
    let watched: Vec<(String, String)> = scheduler
        .triggers()
        .into_iter()
        .map(|(w, t)| (w.to_owned(), t.to_owned()))
        .collect();
    for (workflow, trigger, run) in start_unstarted(&app, &session, watched).await {
        scheduler.follow(&workflow, &trigger, &run);
    }
    if count == 0 {
        return;
    }
    let scheduler = Arc::new(Mutex::new(scheduler));
    let mut first = true;
    loop {
        let (due, wake) = {
            let (app2, session, scheduler) = (app.clone(), session.clone(), scheduler.clone());
            let pass = tokio::task::spawn_blocking(move || {
                let now = Timestamp::now();
                let session = session
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let mut scheduler = scheduler
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let is_active = |run: &str| active(&app2, run);
                let due = session.due_firings(&mut scheduler, now, &is_active);
                (due, scheduler.next_wake(Timestamp::now()))
            })
            .await;
            match pass {
                Ok(pass) => pass,
                Err(_) => return,
            }
        };
        match due {
            Ok(due) => {
                if first {
                    // What a person (and a test) reads to know the catch-up is done.
                    let fired = due.iter().filter(|d| d.firing.run_id.is_some()).count();
                    output::stderr(&format!(
                        "cron triggers: {count} watched, {fired} missed slot{} fired\n",
                        if fired == 1 { "" } else { "s" }
                    ));
                }
                for one in due {
                    act(&app, one).await;
                }
            }
            Err(e) => output::stderr(&output::printable(&format!(
                "error: the cron triggers cannot record their firings: {e}\n  hint: they try again in a minute\n"
            ))),
        }
        first = false;
        let sleep = wake.map_or(RECHECK, |at| {
            let left = at.duration_since(Timestamp::now());
            Duration::try_from(left)
                .unwrap_or(Duration::ZERO)
                .min(RECHECK)
        });
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = app.stopping.cancelled() => return,
        }
    }
}

/// How many of a cron trigger's latest firings are looked through for the runs this server took up from
/// its last stop: a trigger has at most [`archon_engine::trigger::MAX_QUEUED`] runs waiting behind the
/// one going, so those still going are among its latest firings.
const TAKEN_UP_LOOKBACK: usize = 4 * archon_engine::trigger::MAX_QUEUED;

/// A cron trigger: its workflow's name and its own.
type TriggerKey = (String, String);

/// Takes up the firings recorded whose run was never created (a server stopped in between), oldest
/// first, leaving those whose run this server has already (taken up from `serve/restart.json`) and those
/// of workflows it does not serve. A webhook's run starts at once, as a delivery's does. A cron
/// trigger's runs go one after another, as its queued firings do: the first behind the newest run of
/// that trigger this server took up from its last stop while that one is still going, each other behind
/// the one before. Returns, for each cron trigger among `watched` or the firings, its runs that may
/// still be going (taken up or just queued), oldest first: what the scheduler follows.
async fn start_unstarted(
    app: &AppState,
    session: &Arc<Mutex<Session>>,
    watched: Vec<TriggerKey>,
) -> Vec<(String, String, String)> {
    let (session, app2) = (session.clone(), app.clone());
    let read = tokio::task::spawn_blocking(move || {
        let session = session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let unstarted = session.unstarted_firings()?;
        let mut keys = watched;
        keys.extend(
            unstarted
                .iter()
                .filter(|f| f.kind == FiringKind::Cron)
                .map(|f| (f.workflow.clone(), f.trigger.clone())),
        );
        let mut going: BTreeMap<TriggerKey, Vec<String>> = BTreeMap::new();
        for key in keys {
            if going.contains_key(&key) {
                continue;
            }
            let recent = session.firings(&FiringFilter {
                workflow: Some(key.0.clone()),
                trigger: Some(key.1.clone()),
                limit: Some(TAKEN_UP_LOOKBACK),
            })?;
            // Newest first: turned around.
            let runs: Vec<String> = recent
                .into_iter()
                .rev()
                .filter_map(|f| f.run_id)
                .filter(|run| app2.executor.is_busy(run))
                .collect();
            going.insert(key, runs);
        }
        Ok::<_, archon_engine::session::StoreError>((unstarted, going))
    })
    .await;
    let (firings, going) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => {
            output::stderr(&output::printable(&format!(
                "error: the firings whose run never started cannot be read: {e}\n"
            )));
            return Vec::new();
        }
        Err(_) => return Vec::new(),
    };
    let mut followed = Vec::new();
    let mut last: BTreeMap<TriggerKey, String> = BTreeMap::new();
    for ((workflow, trigger), runs) in going {
        for run in &runs {
            followed.push((workflow.clone(), trigger.clone(), run.clone()));
        }
        if let Some(run) = runs.last() {
            last.insert((workflow, trigger), run.clone());
        }
    }
    for firing in firings {
        let Some(run) = firing.run_id.clone() else {
            continue;
        };
        if app.executor.is_busy(&run) || app.catalog.get(&firing.workflow).is_none() {
            continue;
        }
        if firing.kind != FiringKind::Cron {
            if let Err(e) = start(app, &firing) {
                complain(&firing, &e);
            }
            continue;
        }
        let key = (firing.workflow.clone(), firing.trigger.clone());
        let after = last.insert(key.clone(), run.clone());
        followed.push((key.0, key.1, run));
        queue_behind(app, firing, after);
    }
    followed
}

/// Starts the firing's run once the run `after` (of the same trigger) is no longer going: at once when
/// it is not, else from a task that waits for it. Meanwhile the firing's run counts as going (so that
/// a firing queued behind it waits too), and a `cancel_previous` firing may drop it.
fn queue_behind(app: &AppState, firing: Firing, after: Option<String>) {
    let Some(run) = firing.run_id.clone() else {
        return;
    };
    if !after.as_deref().is_some_and(|before| active(app, before)) {
        if let Err(e) = start(app, &firing) {
            complain(&firing, &e);
        }
        return;
    }
    let held = Held {
        pending: Pending {
            workflow: firing.workflow.clone(),
            spec_path: app
                .catalog
                .get(&firing.workflow)
                .map(|served| served.path.display().to_string())
                .unwrap_or_default(),
            inputs: firing.inputs.clone(),
            queued_at: super::app::now_ms(),
            trigger: trigger_info(&firing),
        },
        after: after.clone(),
    };
    app.executor.waiting().lock().insert(run.clone(), held);
    app.executor.wake();
    let app = app.clone();
    tokio::spawn(async move {
        let mut changed = app.executor.watch();
        loop {
            {
                // Decided and started under the lock, so that a `cancel_previous` firing either drops
                // this one before it starts or finds its run started (and cancels that).
                let mut held = app.executor.waiting().lock();
                if !held.contains_key(&run) {
                    // Dropped while it waited.
                    return;
                }
                let before_going = after.as_deref().is_some_and(|before| {
                    app.executor.is_busy(before) || held.contains_key(before)
                });
                if !before_going {
                    // Started while still counted as waiting, so that the one queued behind it sees
                    // it going throughout.
                    if let Err(e) = start(&app, &firing) {
                        complain(&firing, &e);
                    }
                    held.remove(&run);
                    return;
                }
            }
            tokio::select! {
                changed = changed.changed() => if changed.is_err() { return },
                () = app.stopping.cancelled() => return,
            }
        }
    });
}

/// Applies a due firing's decision.
async fn act(app: &AppState, due: Due) {
    match due.decision {
        Decision::Skip => {}
        Decision::Start => {
            if let Err(e) = start(app, &due.firing) {
                complain(&due.firing, &e);
            }
        }
        Decision::CancelPrevious => {
            // The queued ones leave the queue first, all at once: a run cancelled below that ends
            // must not let the one queued behind it start.
            let (dropped, going): (Vec<String>, Vec<String>) = {
                let mut held = app.executor.waiting().lock();
                due.cancel
                    .iter()
                    .cloned()
                    .partition(|run| held.remove(run).is_some())
            };
            for run in &going {
                if let Err(e) = app.executor.cancel(app, run).await {
                    output::stderr(&output::printable(&format!(
                        "warning: trigger `{}` cannot cancel run `{run}`: {}\n",
                        due.firing.trigger, e.error
                    )));
                }
            }
            if !dropped.is_empty() {
                drop_firings(app, &due.firing, dropped).await;
            }
            if let Err(e) = start(app, &due.firing) {
                complain(&due.firing, &e);
            }
        }
        Decision::Queue => queue_behind(app, due.firing, due.after),
    }
}

/// Records as skipped the firings whose runs (`runs`, queued, never started) the `cancel_previous`
/// firing `by` replaced, so that no later start of a server starts them.
async fn drop_firings(app: &AppState, by: &Firing, runs: Vec<String>) {
    let reason = format!(
        "dropped from the queue before its run started: firing `{}` replaced it (overlap `cancel_previous`)",
        by.slot
    );
    let trigger = by.trigger.clone();
    let recorded = app
        .read(move |session| {
            for run in &runs {
                session
                    .skip_unstarted_firing(run, &reason)
                    .map_err(|e| ApiError::store(&e))?;
            }
            Ok(())
        })
        .await;
    if let Err(e) = recorded {
        output::stderr(&output::printable(&format!(
            "warning: trigger `{trigger}` cannot record the queued firings it dropped: {}\n  hint: the next `archon serve` starts them\n",
            e.error
        )));
    }
}

fn complain(firing: &Firing, error: &ApiError) {
    output::stderr(&output::printable(&format!(
        "error: the run of trigger `{}` of `{}` ({}) does not start: {}\n",
        firing.trigger, firing.workflow, firing.slot, error.error
    )));
}

// ---------------------------------------------------------------------------------------------------
// The API

/// A trigger of a served workflow.
#[derive(Debug, Serialize, ToSchema)]
pub struct TriggerView {
    /// Its name: what its firings are recorded under.
    pub name: String,
    /// `cron` or `webhook`.
    pub kind: String,
    /// The cron expression.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone the schedule reads in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// `skip`, `queue` or `cancel_previous` (cron).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap: Option<String>,
    /// How far back missed slots fire when a server starts (cron), as the spec writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
    /// When it fires next (cron): RFC 3339 in its time zone, with the offset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_fire: Option<String>,
    /// Where deliveries go (webhook): `/hooks/<workflow>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Whether deliveries are signed (`X-Archon-Signature`) and carry a bearer token (webhook).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<bool>,
}

/// The triggers of the served workflow `id` (empty when it does not validate), or `404`: what the
/// workflows page shows.
pub fn triggers(app: &App, id: &str) -> Result<Vec<TriggerView>, ApiError> {
    let served = app.catalog.get(id).ok_or_else(|| {
        ApiError::not_found(format!("no workflow `{id}` is served"))
            .with_hint("`GET /api/v1/workflows` lists them")
    })?;
    Ok(views(served))
}

/// The triggers of a served workflow, each with when it fires next (empty when it does not validate).
pub fn views(served: &super::workflows::Served) -> Vec<TriggerView> {
    let Some(workflow) = &served.workflow else {
        return Vec::new();
    };
    let now = Timestamp::now();
    workflow
        .spec
        .triggers
        .iter()
        .map(|def| {
            let schedule = def
                .cron
                .as_ref()
                .and_then(|c| c.value.get())
                .map(|cron| CronSchedule::new(*cron, def.time_zone()));
            let zone = def.time_zone();
            let next_fire = schedule.as_ref().and_then(|s| s.next_after(now)).map(|at| {
                at.to_zoned(zone.clone())
                    .strftime("%Y-%m-%dT%H:%M:%S%:z")
                    .to_string()
            });
            let hook = def.webhook.as_ref().map(|h| &h.value);
            TriggerView {
                name: def.name(),
                kind: if def.cron.is_some() {
                    "cron"
                } else {
                    "webhook"
                }
                .to_owned(),
                cron: def.cron.as_ref().map(|c| c.value.text.trim().to_owned()),
                timezone: def.cron.as_ref().map(|_| {
                    def.timezone
                        .as_ref()
                        .map_or_else(|| "UTC".to_owned(), |tz| tz.value.text.clone())
                }),
                overlap: def.cron.as_ref().map(|_| def.overlap().as_str().to_owned()),
                catch_up: def.catch_up.as_ref().map(|c| c.value.text.clone()),
                next_fire,
                endpoint: hook.map(|_| format!("/hooks/{}", served.id)),
                signed: hook.map(|h| h.secret.is_some()),
                token: hook.map(|h| h.token.is_some()),
            }
        })
        .collect()
}

/// A workflow's triggers, with when each cron trigger fires next.
#[utoipa::path(get, path = "/workflows/{id}/triggers", tag = "triggers",
    params(("id" = String, Path, description = "The workflow's id")),
    responses((status = 200, description = "Done", body = [TriggerView]), (status = 404, description = "Not found", body = ApiError),
        (status = 400, description = "The request does not read", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
pub async fn get_triggers(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<TriggerView>>, ApiError> {
    triggers(&app, &id).map(axum::Json)
}

/// Which firings to list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FiringsParams {
    /// Only firings of this workflow (its name).
    pub workflow: Option<String>,
    /// Only firings of this trigger (its name).
    pub trigger: Option<String>,
    /// Firings on the page (default 50, at most 200).
    pub limit: Option<usize>,
    /// How many of the newest to pass over (the `next_offset` of the page before; at most 10000).
    pub offset: Option<usize>,
}

/// One firing of a trigger.
#[derive(Debug, Serialize, ToSchema)]
pub struct FiringView {
    pub workflow: String,
    pub trigger: String,
    /// `cron`, `webhook` or `api` (a run started from the API or a page that had to wait in the queue).
    pub kind: String,
    /// The scheduled instant (cron, RFC 3339 in UTC) or the delivery id (webhook).
    pub slot: String,
    /// Milliseconds since the epoch: the scheduled instant, or when the delivery came.
    pub slot_at: u64,
    /// Milliseconds since the epoch: when it was recorded.
    pub fired_at: u64,
    /// `started`, `queued`, `skipped` or `refused`.
    pub outcome: String,
    /// The run it started or queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// Why it was skipped or refused, or which run it cancelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A page of firings, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct FiringsPage {
    pub firings: Vec<FiringView>,
    /// The `offset` of the next page, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<usize>,
}

/// A page of firings as `params` selects them.
pub async fn firings(app: &AppState, params: FiringsParams) -> Result<FiringsPage, ApiError> {
    let limit = params.limit.unwrap_or(DEFAULT_FIRINGS_PAGE);
    if limit == 0 || limit > MAX_FIRINGS_PAGE {
        return Err(ApiError::bad_request(format!(
            "`limit` is between 1 and {MAX_FIRINGS_PAGE}, not {limit}"
        )));
    }
    let offset = params.offset.unwrap_or(0);
    if offset > MAX_FIRINGS_OFFSET {
        return Err(
            ApiError::bad_request(format!("`offset` is at most {MAX_FIRINGS_OFFSET}"))
                .with_hint("filter by `workflow` or `trigger` to reach older firings"),
        );
    }
    let filter = FiringFilter {
        workflow: params.workflow,
        trigger: params.trigger,
        limit: Some(offset + limit + 1),
    };
    let found = app
        .read(move |session| session.firings(&filter).map_err(|e| ApiError::store(&e)))
        .await?;
    let more = found.len() > offset + limit;
    let firings = found
        .into_iter()
        .skip(offset)
        .take(limit)
        .map(|f| FiringView {
            workflow: f.workflow,
            trigger: f.trigger,
            kind: f.kind.as_str().to_owned(),
            slot: f.slot,
            slot_at: f.slot_at,
            fired_at: f.fired_at,
            outcome: f.outcome.as_str().to_owned(),
            run_id: f.run_id,
            // A refused delivery's reason may quote its body.
            reason: f.reason.map(|r| app.secrets.text(&r).into_owned()),
        })
        .collect();
    Ok(FiringsPage {
        firings,
        next_offset: more.then_some(offset + limit),
    })
}

/// The firings of the triggers, newest first: cron slots fired, skipped or queued, webhook deliveries
/// started or refused.
#[utoipa::path(get, path = "/firings", tag = "triggers",
    params(FiringsParams),
    responses((status = 200, description = "Done", body = FiringsPage), (status = 400, description = "The request does not read", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
pub async fn get_firings(
    State(app): State<AppState>,
    Query(params): Query<FiringsParams>,
) -> Result<axum::Json<FiringsPage>, ApiError> {
    firings(&app, params).await.map(axum::Json)
}
