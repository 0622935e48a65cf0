//! The JSON API under `/api/v1`: what the dashboard shows and does, for scripts. Every handler is
//! annotated for the OpenAPI document (`openapi.rs`); the functions that read (`list_runs`,
//! `run_detail`, `workflows`, `approvals`, ...) are what the pages call too.

// The OpenAPI macros name parameter types by their path.
#![allow(unused_qualifications)]

use std::sync::Arc;

use archon_engine::redact::Redactor;
use archon_engine::run::{ApprovalDecision, LlmUsage, StepResult};
use archon_engine::session::{RunCursor, RunQuery, RunState, RunSummary, StoredRun};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::app::{ApiError, App, AppState};
use super::auth::{Caller, Role, Via};
use super::events::{self, RunCursors};
use super::executor::{Cancelled, Decided, How, Options, QueuedRun, Started, TriggerInfo};

/// Most runs on one page of the listing.
pub const MAX_PAGE: usize = 200;
/// Runs on a page when the request does not say.
pub const DEFAULT_PAGE: usize = 50;
/// Most events or log pieces in one response.
pub const MAX_ITEMS: usize = 1000;

/// The API's routes, with their OpenAPI description.
pub fn openapi_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(session))
        .routes(routes!(list_workflows))
        .routes(routes!(get_workflow))
        .routes(routes!(start_run))
        .routes(routes!(get_runs))
        .routes(routes!(runs_stream))
        .routes(routes!(get_run))
        .routes(routes!(get_events))
        .routes(routes!(get_logs))
        .routes(routes!(run_stream))
        .routes(routes!(get_run_approvals))
        .routes(routes!(get_approvals))
        .routes(routes!(approve))
        .routes(routes!(deny))
        .routes(routes!(cancel))
        .routes(routes!(resume))
        .routes(routes!(retry))
        .routes(routes!(get_queue))
        .routes(routes!(super::triggers::get_triggers))
        .routes(routes!(super::triggers::get_firings))
}

/// The API's routes for the server, the OpenAPI document at `/openapi.json` among them.
pub fn router() -> axum::Router<AppState> {
    let (router, _) = openapi_router().split_for_parts();
    router
        .route(
            "/openapi.json",
            axum::routing::get(|| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    super::openapi::document_text(),
                )
            }),
        )
        .fallback(|| async {
            ApiError::not_found("no such API endpoint")
                .with_hint("`GET /api/v1/openapi.json` describes the API")
        })
}

// Extractors whose rejections are the API's JSON errors.

/// Query parameters.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct Query<T>(pub T);

/// Path parameters.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// A JSON body that may be left out (empty, or `null`).
pub struct Optional<T>(pub Option<T>);

impl<T, S> FromRequest<S> for Optional<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let json = request
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or_default().trim().to_owned());
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(),
                status => ApiError::new(status, e.body_text()),
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Optional(None));
        }
        if json.as_deref() != Some("application/json") {
            return Err(
                ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "the body is not JSON")
                    .with_hint(
                        "send a JSON object with `Content-Type: application/json`, or no body",
                    ),
            );
        }
        let hint = "`GET /api/v1/openapi.json` describes what each request takes";
        let value: Json = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(format!("the body is not JSON: {e}")).with_hint(hint)
        })?;
        match value {
            Json::Null => Ok(Optional(None)),
            Json::Object(_) => serde_json::from_value::<T>(value)
                .map(|v| Optional(Some(v)))
                .map_err(|e| {
                    ApiError::bad_request(format!("the body does not read: {e}")).with_hint(hint)
                }),
            other => Err(ApiError::bad_request(format!(
                "the body is {}, not a JSON object",
                json_kind(&other)
            ))
            .with_hint(hint)),
        }
    }
}

/// What kind of JSON value `value` is, for an error.
pub fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "`null`",
        Json::Bool(true) => "`true`",
        Json::Bool(false) => "`false`",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// A query string that does not read, as the API's error: the parameter named, in backticks.
pub fn query_error(rejection: &QueryRejection) -> ApiError {
    let text = rejection.body_text();
    let detail = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(&text);
    let message = match detail.split_once(": ") {
        Some((name, why))
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') =>
        {
            format!("the query parameter `{name}` does not read: {why}")
        }
        _ => format!("the query string does not read: {detail}"),
    };
    ApiError::bad_request(message)
        .with_hint("`GET /api/v1/openapi.json` describes the parameters each request takes")
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        query_error(&rejection)
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::bad_request(format!(
            "the path does not read: {}",
            super::app::tidy(&rejection.body_text())
        ))
    }
}

// ---------------------------------------------------------------------------------------------------
// The caller

/// Who the caller is, and the CSRF token its POSTs carry (browser sessions; bearer clients need none).
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionInfo {
    pub role: Role,
    pub via: Via,
    /// Send it as `X-CSRF-Token` (or the form field `csrf`) with every POST of a browser session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub csrf: Option<String>,
    /// Who decisions are recorded as.
    pub by: String,
}

/// Who you are.
#[utoipa::path(get, path = "/session", tag = "session",
    responses((status = 200, description = "Done", body = SessionInfo), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn session(caller: Caller) -> axum::Json<SessionInfo> {
    axum::Json(SessionInfo {
        role: caller.role,
        via: caller.via,
        csrf: caller.csrf,
        by: caller.by,
    })
}

// ---------------------------------------------------------------------------------------------------
// Workflows

/// A served workflow in the listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowSummary {
    /// How the API names it: its name, or its file's path under DIR when several files there have
    /// the same name.
    pub id: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The spec file.
    pub path: String,
    /// Whether it validates without error (only such a workflow runs).
    pub valid: bool,
    pub errors: usize,
    pub warnings: usize,
}

/// One step of a workflow's graph.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepNode {
    pub id: String,
    /// The steps it depends on (`needs` and every `steps.X` it reads).
    pub needs: Vec<String>,
}

/// A served workflow.
#[derive(Debug, Serialize, ToSchema)]
pub struct WorkflowDetail {
    #[serde(flatten)]
    pub summary: WorkflowSummary,
    /// Its diagnostics as `archon validate` writes them (empty when there is none).
    pub diagnostics: String,
    /// Its inputs as one JSON Schema object (what a run form is made from).
    #[schema(value_type = Object)]
    pub input_schema: Json,
    /// Its steps in order, with what each depends on (empty when it does not validate).
    pub steps: Vec<StepNode>,
}

/// The served workflows, by name.
pub fn workflows(app: &App) -> Vec<WorkflowSummary> {
    app.catalog
        .workflows
        .values()
        .map(|s| summary_of(s))
        .collect()
}

fn summary_of(served: &super::workflows::Served) -> WorkflowSummary {
    WorkflowSummary {
        id: served.id.clone(),
        name: served.name.clone(),
        description: served.description.clone(),
        path: served.path.display().to_string(),
        valid: served.workflow.is_some(),
        errors: served.errors,
        warnings: served.warnings,
    }
}

/// One served workflow, by id, or `404`.
pub fn workflow(app: &App, name: &str) -> Result<WorkflowDetail, ApiError> {
    let served = app.catalog.get(name).ok_or_else(|| {
        ApiError::not_found(format!("no workflow `{name}` is served"))
            .with_hint("`GET /api/v1/workflows` lists them")
    })?;
    let steps = served.workflow.as_ref().map_or_else(Vec::new, |w| {
        w.spec
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| StepNode {
                id: step.id.value.clone(),
                needs: w
                    .dependencies
                    .get(i)
                    .map(|deps| {
                        deps.iter()
                            .filter_map(|d| w.spec.steps.get(*d))
                            .map(|s| s.id.value.clone())
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    });
    Ok(WorkflowDetail {
        summary: summary_of(served),
        diagnostics: served.diagnostics.clone(),
        input_schema: served.input_schema.clone(),
        steps,
    })
}

/// The served workflows.
#[utoipa::path(get, path = "/workflows", tag = "workflows",
    responses((status = 200, description = "Done", body = [WorkflowSummary]), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn list_workflows(State(app): State<AppState>) -> axum::Json<Vec<WorkflowSummary>> {
    axum::Json(workflows(&app))
}

/// One served workflow: diagnostics, input schema, steps.
#[utoipa::path(get, path = "/workflows/{id}", tag = "workflows",
    params(("id" = String, Path, description = "The workflow's id")),
    responses((status = 200, description = "Done", body = WorkflowDetail), (status = 404, description = "Not found", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_workflow(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<axum::Json<WorkflowDetail>, ApiError> {
    workflow(&app, &name).map(axum::Json)
}

/// A new run's inputs.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The inputs, by name, as the workflow's input schema describes them.
    #[serde(default, deserialize_with = "object")]
    #[schema(value_type = Object)]
    pub inputs: Map<String, Json>,
}

/// `inputs`: a JSON object, and nothing else.
fn object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Map<String, Json>, D::Error> {
    match Json::deserialize(d)? {
        Json::Object(map) => Ok(map),
        other => Err(serde::de::Error::custom(format!(
            "`inputs` is a JSON object of the inputs by name, not {}",
            json_kind(&other)
        ))),
    }
}

/// Starts a run of a workflow (queued when `--max-runs` runs are going on).
#[utoipa::path(post, path = "/workflows/{id}/runs", tag = "workflows",
    params(("id" = String, Path, description = "The workflow's id")),
    request_body(content = Option<StartRequest>, description = "May be left out: no inputs"),
    responses((status = 202, description = "Started, or queued", body = Started), (status = 404, description = "Not found", body = ApiError),
        (status = 422, description = "The workflow or its inputs do not validate", body = ApiError), (status = 400, description = "The request does not read", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError),
        (status = 415, description = "The body is not JSON", body = ApiError), (status = 403, description = "Refused: a viewer, a cross-site request, or a missing CSRF token", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError), (status = 503, description = "The server is stopping, or too busy", body = ApiError)))]
async fn start_run(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Optional(request): Optional<StartRequest>,
) -> Result<(StatusCode, axum::Json<Started>), ApiError> {
    let inputs = request.map(|r| r.inputs).unwrap_or_default();
    let started = app.executor.start_run(&app, &name, inputs, None).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(started)))
}

// ---------------------------------------------------------------------------------------------------
// Runs

/// Which runs to list.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunsParams {
    /// Only runs of this workflow.
    pub workflow: Option<String>,
    /// Only runs in these states, comma-separated (`running`, `waiting_approval`, `interrupted`,
    /// `succeeded`, `failed`, `cancelled`).
    pub status: Option<String>,
    /// Only runs started at or after this time (milliseconds since the epoch).
    pub since: Option<u64>,
    /// Only runs started before this time (milliseconds since the epoch).
    pub until: Option<u64>,
    /// The `next` of the page before.
    pub cursor: Option<String>,
    /// Runs on the page (default 50, at most 200).
    pub limit: Option<usize>,
}

/// A run in a listing.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunItem {
    pub id: String,
    pub workflow: String,
    pub status: Status,
    /// Milliseconds since the epoch.
    pub started_at: u64,
    pub finished_at: Option<u64>,
    pub duration_ms: Option<u64>,
}

impl From<RunSummary> for RunItem {
    fn from(run: RunSummary) -> Self {
        RunItem {
            id: run.id,
            workflow: run.workflow,
            status: run.status.into(),
            started_at: run.started_at,
            finished_at: run.finished_at,
            duration_ms: run.duration_ms,
        }
    }
}

/// Where a run stands.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Running,
    WaitingApproval,
    Interrupted,
    Succeeded,
    Failed,
    Cancelled,
    /// Accepted by this server and not recorded yet: waiting in its queue for a place among the runs
    /// going on, or starting.
    Queued,
}

impl From<RunState> for Status {
    fn from(state: RunState) -> Self {
        match state {
            RunState::Running => Status::Running,
            RunState::WaitingApproval => Status::WaitingApproval,
            RunState::Interrupted => Status::Interrupted,
            RunState::Succeeded => Status::Succeeded,
            RunState::Failed => Status::Failed,
            RunState::Cancelled => Status::Cancelled,
        }
    }
}

/// One page of runs.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunsPage {
    /// Newest first.
    pub runs: Vec<RunItem>,
    /// How many runs the filters select, on all pages.
    pub total: usize,
    /// Pass as `cursor` for the next page; absent on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Runs waiting in this server's queue (not stored yet, or waiting to continue).
    pub queued: Vec<QueuedRun>,
}

/// The page of runs `params` asks for.
pub async fn list_runs(app: &Arc<App>, params: RunsParams) -> Result<RunsPage, ApiError> {
    let mut status = Vec::new();
    for name in params
        .status
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let state = RunState::parse(name).ok_or_else(|| {
            ApiError::bad_request(format!("`{name}` is not a run status")).with_hint(
                "`running`, `waiting_approval`, `interrupted`, `succeeded`, `failed` or `cancelled`",
            )
        })?;
        status.push(state);
    }
    let after = match params.cursor.as_deref() {
        Some(text) => Some(RunCursor::parse(text).ok_or_else(|| {
            ApiError::bad_request(format!("`{text}` is not a cursor"))
                .with_hint("pass the `next` of the page before, as it is")
        })?),
        None => None,
    };
    let limit = params.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "`limit` is between 1 and {MAX_PAGE}, not {limit}"
        )));
    }
    let query = RunQuery {
        status,
        workflow: params.workflow,
        since: params.since,
        until: params.until,
        after,
        limit,
    };
    let page = app
        .read(move |session| session.page(&query).map_err(|e| ApiError::store(&e)))
        .await?;
    Ok(RunsPage {
        runs: page.runs.into_iter().map(RunItem::from).collect(),
        total: page.total,
        next: page.next.map(|c| c.to_text()),
        queued: app.executor.queue(),
    })
}

/// The runs, newest first, a page at a time.
#[utoipa::path(get, path = "/runs", tag = "runs", params(RunsParams),
    responses((status = 200, description = "Done", body = RunsPage), (status = 400, description = "The request does not read", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_runs(
    State(app): State<AppState>,
    Query(params): Query<RunsParams>,
) -> Result<axum::Json<RunsPage>, ApiError> {
    list_runs(&app, params).await.map(axum::Json)
}

/// One recorded attempt of a step.
#[derive(Debug, Serialize, ToSchema)]
pub struct Attempt {
    pub step: String,
    /// From 1 per step, across resumes and retries.
    pub attempt: u32,
    /// Which retry (0 for the first run of the step) made it.
    pub generation: u32,
    pub fallback: bool,
    /// `running` when the attempt never ended.
    pub status: String,
    pub error: Option<String>,
    pub started_at: u64,
    pub ended_at: Option<u64>,
}

/// What the LLM calls of a run used, summed over its steps.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Usage {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    /// USD, for the calls whose model has a known price.
    pub cost_usd: f64,
    /// Calls whose model has no known price.
    pub unpriced_calls: u64,
}

/// A call that asked for approval, and its decision once there is one.
#[derive(Debug, Serialize, ToSchema)]
pub struct Approval {
    pub run_id: String,
    /// The SHA-256 over run, step, tool and arguments: approve or deny names it, and a decision holds
    /// for exactly this call.
    pub key: String,
    pub step: String,
    pub tool: Option<String>,
    /// The rendered arguments, secrets masked.
    #[schema(value_type = Object)]
    pub arguments: Json,
    /// The rule that asked, and why.
    pub reason: String,
    pub requested_at: u64,
    /// How long a person may take (milliseconds), then `approve_on_timeout` decides.
    pub timeout_ms: Option<u64>,
    pub approve_on_timeout: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

/// A decision on a call.
#[derive(Debug, Serialize, ToSchema)]
pub struct Decision {
    pub approved: bool,
    pub by: String,
    pub reason: Option<String>,
    pub decided_at: Option<u64>,
}

/// A run, whole: what `archon show --json` shows, plus where it stands on this server.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunDetail {
    pub id: String,
    pub workflow: String,
    pub status: Status,
    pub spec_path: String,
    /// The SHA-256 of the spec files it runs with.
    pub spec_hash: String,
    #[schema(value_type = Object)]
    pub inputs: Map<String, Json>,
    pub workdir: String,
    pub max_parallel: usize,
    pub started_at: u64,
    pub finished_at: Option<u64>,
    /// How many times a retry started it again.
    pub generation: u32,
    #[schema(value_type = Object)]
    pub outputs: Map<String, Json>,
    pub error: Option<String>,
    /// Final results of steps and `foreach` items, by name: status, output, text, error, attempts,
    /// duration, LLM usage, the nested results of composite tools, sub-workflows and delegations (each
    /// with its `task`), a planner's `plan`; as `archon show --json` shows them.
    #[schema(value_type = Object)]
    pub results: Map<String, Json>,
    pub attempts: Vec<Attempt>,
    pub approvals: Vec<Approval>,
    /// The LLM usage of its steps.
    pub usage: Usage,
    /// The process running it, while one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub owner: Option<Json>,
    /// Whether this server runs it now.
    pub executing_here: bool,
    /// What started it, when a trigger of this server did (while it runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trigger: Option<TriggerInfo>,
    /// Its place in this server's queue, when it waits there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued: Option<QueuedRun>,
    /// The steps of a run submitted to workers that are ready but that no worker has taken, with why
    /// (`no live worker has label `gpu``); as `archon show --json` shows them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingStep>,
}

/// A ready step of a run submitted to workers that no worker has taken.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaitingStep {
    pub step: String,
    pub reason: String,
}

/// Sums the LLM usage of results: a result's own usage, else its nested steps'.
fn add_usage<'a>(total: &mut LlmUsage, results: impl Iterator<Item = &'a StepResult>) {
    for result in results {
        match &result.llm {
            Some(llm) => total.add(llm),
            None => add_usage(total, result.steps.values()),
        }
    }
}

/// An approval as the API shows it, the run data among it (arguments, reasons) masked.
fn approval_of(
    secrets: &Redactor,
    run_id: &str,
    record: &archon_engine::session::ApprovalRecord,
) -> Approval {
    let mut arguments = record.request.arguments.clone();
    secrets.json(&mut arguments);
    let masked = |text: &str| secrets.text(text).into_owned();
    Approval {
        run_id: run_id.to_owned(),
        key: record.request.key.clone(),
        step: record.request.step.clone(),
        tool: record.request.tool.clone(),
        arguments,
        reason: masked(&record.request.reason),
        requested_at: record.requested_at,
        timeout_ms: record.request.timeout_ms,
        approve_on_timeout: record.request.approve_on_timeout,
        decision: record.decision.as_ref().map(|d| Decision {
            approved: d.approved,
            by: d.by.clone(),
            reason: d.reason.as_deref().map(masked),
            decided_at: record.decided_at,
        }),
    }
}

fn detail_of(app: &App, mut run: StoredRun) -> RunDetail {
    // Run data is masked before it is serialised: its ids and the response's framing are not.
    let secrets = &app.secrets;
    run.results.values_mut().for_each(|r| secrets.result(r));
    // Their names come from the spec: only the values are data.
    run.inputs.values_mut().for_each(|v| secrets.json(v));
    run.outputs.values_mut().for_each(|v| secrets.json(v));
    secrets.option(&mut run.error);
    let mut total = LlmUsage::default();
    add_usage(&mut total, run.results.values());
    let executing_here =
        app.executor.trigger_of(&run.id).is_some() || app.executor.is_active(&run.id);
    RunDetail {
        status: run.status.into(),
        results: run
            .results
            .iter()
            .map(|(name, result)| {
                (
                    name.clone(),
                    serde_json::to_value(result).unwrap_or(Json::Null),
                )
            })
            .collect(),
        attempts: run
            .attempts
            .iter()
            .map(|a| Attempt {
                step: a.step.clone(),
                attempt: a.attempt,
                generation: a.generation,
                fallback: a.fallback,
                status: a.status.clone(),
                error: a.error.as_deref().map(|e| secrets.text(e).into_owned()),
                started_at: a.started_at,
                ended_at: a.ended_at,
            })
            .collect(),
        approvals: run
            .approvals
            .iter()
            .map(|a| approval_of(secrets, &run.id, a))
            .collect(),
        usage: Usage {
            calls: total.calls,
            input_tokens: total.input_tokens,
            output_tokens: total.output_tokens,
            cached_input_tokens: total.cached_input_tokens,
            cost_usd: total.cost_usd,
            unpriced_calls: total.unpriced_calls,
        },
        owner: run
            .owner
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok()),
        executing_here,
        trigger: app.executor.trigger_of(&run.id),
        queued: app.executor.queued(&run.id),
        waiting: Vec::new(),
        id: run.id,
        workflow: run.workflow,
        spec_path: run.spec_path,
        spec_hash: run.spec_hash,
        inputs: run.inputs,
        workdir: run.workdir,
        max_parallel: run.max_parallel,
        started_at: run.started_at,
        finished_at: run.finished_at,
        generation: run.generation,
        outputs: run.outputs,
        error: run.error,
    }
}

/// One run, or `404` (a run queued here and not stored yet shows as `queued`).
pub async fn run_detail(app: &Arc<App>, id: String) -> Result<RunDetail, ApiError> {
    if let Some(mut pending) = app.executor.pending(&id) {
        pending
            .inputs
            .values_mut()
            .for_each(|v| app.secrets.json(v));
        return Ok(RunDetail {
            id: id.clone(),
            workflow: pending.workflow,
            status: Status::Queued,
            spec_path: pending.spec_path,
            spec_hash: String::new(),
            inputs: pending.inputs,
            workdir: String::new(),
            max_parallel: 0,
            started_at: pending.queued_at,
            finished_at: None,
            generation: 0,
            outputs: Map::new(),
            error: None,
            results: Map::new(),
            attempts: Vec::new(),
            approvals: Vec::new(),
            usage: Usage::default(),
            owner: None,
            executing_here: app.executor.is_active(&id),
            trigger: pending.trigger,
            queued: app.executor.queued(&id),
            waiting: Vec::new(),
        });
    }
    let (run, waiting) = app
        .read(move |session| {
            let run = session.load(&id).map_err(|e| ApiError::store(&e))?;
            let waiting = if run.status == RunState::Running {
                session.waiting(&id).map_err(|e| ApiError::store(&e))?
            } else {
                Vec::new()
            };
            Ok((run, waiting))
        })
        .await?;
    let mut detail = detail_of(app, run);
    detail.waiting = waiting
        .into_iter()
        .map(|w| WaitingStep {
            step: w.step,
            reason: w.reason,
        })
        .collect();
    Ok(detail)
}

/// One run: steps, attempts, outputs, approvals, usage.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses((status = 200, description = "Done", body = RunDetail), (status = 404, description = "Not found", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<RunDetail>, ApiError> {
    run_detail(&app, id).await.map(axum::Json)
}

/// Where a listing of events or logs starts.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AfterParams {
    /// Items numbered after this one (default 0: from the first).
    pub after: Option<i64>,
    /// Most items (default and most 1000).
    pub limit: Option<usize>,
}

fn items_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    match limit {
        None => Ok(MAX_ITEMS),
        Some(n) if (1..=MAX_ITEMS).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::bad_request(format!(
            "`limit` is between 1 and {MAX_ITEMS}, not {n}"
        ))),
    }
}

/// An event of a run's log, numbered.
#[derive(Debug, Serialize, ToSchema)]
pub struct NumberedEvent {
    pub seq: i64,
    /// The event: `event` (its kind), its fields, `at_ms`.
    #[schema(value_type = Object)]
    pub event: Json,
}

/// A page of a run's events.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<NumberedEvent>,
    /// Pass as `after` for the next page (the last `seq`, or the `after` given when there is none).
    pub after: i64,
}

/// A run's event log (the agent trail among it), a page at a time.
#[utoipa::path(get, path = "/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = "The run's id"), AfterParams),
    responses((status = 200, description = "Done", body = EventsPage), (status = 404, description = "Not found", body = ApiError),
        (status = 400, description = "The request does not read", body = ApiError), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_events(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<AfterParams>,
) -> Result<axum::Json<EventsPage>, ApiError> {
    let limit = items_limit(params.limit)?;
    let after = params.after.unwrap_or(0).max(0);
    let events = app
        .read(move |session| {
            super::app::known_run(session, &id)?;
            session
                .events_after(&id, after, limit)
                .map_err(|e| ApiError::store(&e))
        })
        .await?;
    let last = events.last().map_or(after, |(seq, _)| *seq);
    Ok(axum::Json(EventsPage {
        events: events
            .into_iter()
            .map(|(seq, mut event)| {
                app.mask_event(&mut event);
                NumberedEvent { seq, event }
            })
            .collect(),
        after: last,
    }))
}

/// A piece of what a run's commands wrote.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogPiece {
    /// Its place in the run's output, from 1.
    pub seq: i64,
    pub step: String,
    pub attempt: u32,
    /// The call that ran it: the step, or `step/inner` inside a composite tool or sub-workflow.
    pub source: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    pub text: String,
    pub at_ms: u64,
}

/// A page of a run's logs.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogsPage {
    pub logs: Vec<LogPiece>,
    /// Pass as `after` for the next page.
    pub after: i64,
}

/// What a run's commands wrote, a page at a time.
#[utoipa::path(get, path = "/runs/{id}/logs", tag = "runs",
    params(("id" = String, Path, description = "The run's id"), AfterParams),
    responses((status = 200, description = "Done", body = LogsPage), (status = 404, description = "Not found", body = ApiError),
        (status = 400, description = "The request does not read", body = ApiError), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_logs(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<AfterParams>,
) -> Result<axum::Json<LogsPage>, ApiError> {
    let limit = items_limit(params.limit)?;
    let after = params.after.unwrap_or(0).max(0);
    let logs = app
        .read(move |session| {
            super::app::known_run(session, &id)?;
            session
                .logs_after(&id, after, limit)
                .map_err(|e| ApiError::store(&e))
        })
        .await?;
    let last = logs.last().map_or(after, |l| l.seq);
    Ok(axum::Json(LogsPage {
        logs: logs
            .into_iter()
            .map(|mut l| {
                app.mask_log(&mut l);
                l
            })
            .map(|l| LogPiece {
                seq: l.seq,
                step: l.step,
                attempt: l.attempt,
                source: l.source,
                stream: match l.stream {
                    archon_engine::tools::Stream::Stdout => "stdout",
                    archon_engine::tools::Stream::Stderr => "stderr",
                }
                .to_owned(),
                text: l.text,
                at_ms: l.at_ms,
            })
            .collect(),
        after: last,
    }))
}

/// Where a run's live stream starts.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamParams {
    /// Events numbered after this one (default 0: all).
    pub events_after: Option<i64>,
    /// Log pieces numbered after this one (default 0: all).
    pub logs_after: Option<i64>,
}

/// A run's events, logs and status as they happen (server-sent events `event`, `log`, `run`).
#[utoipa::path(get, path = "/runs/{id}/stream", tag = "runs",
    params(("id" = String, Path, description = "The run's id"), StreamParams),
    responses((status = 200, content_type = "text/event-stream", body = String,
            description = "Server-sent events: `event`, `log`, `run`"),
        (status = 404, description = "Not found", body = ApiError), (status = 503, description = "The server is stopping, or too busy", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
async fn run_stream(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(params): Query<StreamParams>,
) -> Result<Response, ApiError> {
    let from = RunCursors {
        events_after: params.events_after.unwrap_or(0).max(0),
        logs_after: params.logs_after.unwrap_or(0).max(0),
    };
    Ok(events::run_stream(app, id, from).await?.into_response())
}

/// Runs as they start and change status (server-sent events `run`, `queue`, `reload`).
#[utoipa::path(get, path = "/runs/stream", tag = "runs",
    responses((status = 200, content_type = "text/event-stream", body = String,
            description = "Server-sent events: `run`, `queue`, `reload`"),
        (status = 503, description = "The server is stopping, or too busy", body = ApiError), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn runs_stream(State(app): State<AppState>) -> Result<Response, ApiError> {
    Ok(events::runs_stream(app).await?.into_response())
}

// ---------------------------------------------------------------------------------------------------
// Approvals

/// Every call that asked for approval in a run, decided or not.
#[utoipa::path(get, path = "/runs/{id}/approvals", tag = "approvals",
    params(("id" = String, Path, description = "The run's id")),
    responses((status = 200, description = "Done", body = [Approval]), (status = 404, description = "Not found", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_run_approvals(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Vec<Approval>>, ApiError> {
    let run = app
        .read(move |session| session.load_brief(&id).map_err(|e| ApiError::store(&e)))
        .await?;
    Ok(axum::Json(
        run.approvals
            .iter()
            .map(|a| approval_of(&app.secrets, &run.id, a))
            .collect(),
    ))
}

/// Most runs waiting for approval whose calls `GET /approvals` lists.
const MAX_WAITING: usize = 200;

/// The calls waiting for a decision, in every run waiting for approval (newest runs first).
pub async fn approvals(app: &Arc<App>) -> Result<Vec<Approval>, ApiError> {
    let app2 = app.clone();
    app.read(move |session| {
        let page = session
            .page(&RunQuery {
                status: vec![RunState::WaitingApproval],
                limit: MAX_WAITING,
                ..RunQuery::default()
            })
            .map_err(|e| ApiError::store(&e))?;
        let mut waiting = Vec::new();
        for run in page.runs {
            let stored = match session.load_brief(&run.id) {
                Ok(stored) => stored,
                Err(e) if e.unknown_run => continue,
                Err(e) => return Err(ApiError::store(&e)),
            };
            waiting.extend(
                stored
                    .approvals
                    .iter()
                    .filter(|a| a.decision.is_none())
                    .map(|a| approval_of(&app2.secrets, &stored.id, a)),
            );
        }
        Ok(waiting)
    })
    .await
}

/// The calls waiting for a decision, across runs.
#[utoipa::path(get, path = "/approvals", tag = "approvals",
    responses((status = 200, description = "Done", body = [Approval]), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_approvals(State(app): State<AppState>) -> Result<axum::Json<Vec<Approval>>, ApiError> {
    approvals(&app).await.map(axum::Json)
}

/// The longest `reason` recorded with a decision, in characters.
const MAX_REASON: usize = 4096;

/// Why, recorded with a decision.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    #[schema(max_length = 4096)]
    pub reason: Option<String>,
}

async fn decide(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    key: &str,
    approved: bool,
    reason: Option<String>,
) -> Result<Decided, ApiError> {
    if let Some(reason) = &reason
        && reason.chars().count() > MAX_REASON
    {
        return Err(ApiError::bad_request(format!(
            "`reason` is longer than {MAX_REASON} characters"
        )));
    }
    app.executor
        .decide(
            app,
            id,
            key,
            ApprovalDecision {
                approved,
                by: caller.by.clone(),
                reason,
            },
        )
        .await
}

/// Approves the call with this key (the SHA-256 of its exact arguments); once no call waits, the run
/// resumes here.
#[utoipa::path(post, path = "/runs/{id}/approvals/{key}/approve", tag = "approvals",
    params(("id" = String, Path, description = "The run's id"),
        ("key" = String, Path, description = "The call's key, as the approval shows it")),
    request_body(content = Option<DecisionRequest>, description = "May be left out"),
    responses((status = 200, description = "Done", body = Decided), (status = 404, description = "Not found", body = ApiError),
        (status = 409, description = "The run's state does not allow it", body = ApiError), (status = 400, description = "The request does not read", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError),
        (status = 415, description = "The body is not JSON", body = ApiError), (status = 403, description = "Refused: a viewer, a cross-site request, or a missing CSRF token", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError), (status = 503, description = "The server is stopping, or too busy", body = ApiError)))]
async fn approve(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, key)): Path<(String, String)>,
    Optional(body): Optional<DecisionRequest>,
) -> Result<axum::Json<Decided>, ApiError> {
    let reason = body.and_then(|b| b.reason);
    decide(&app, &caller, &id, &key, true, reason)
        .await
        .map(axum::Json)
}

/// Denies the call with this key; once no call waits, the run resumes here (a denied call fails its
/// step, or is told to its agent).
#[utoipa::path(post, path = "/runs/{id}/approvals/{key}/deny", tag = "approvals",
    params(("id" = String, Path, description = "The run's id"),
        ("key" = String, Path, description = "The call's key, as the approval shows it")),
    request_body(content = Option<DecisionRequest>, description = "May be left out"),
    responses((status = 200, description = "Done", body = Decided), (status = 404, description = "Not found", body = ApiError),
        (status = 409, description = "The run's state does not allow it", body = ApiError), (status = 400, description = "The request does not read", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError),
        (status = 415, description = "The body is not JSON", body = ApiError), (status = 403, description = "Refused: a viewer, a cross-site request, or a missing CSRF token", body = ApiError),
        (status = 401, description = "No valid credentials", body = ApiError), (status = 503, description = "The server is stopping, or too busy", body = ApiError)))]
async fn deny(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, key)): Path<(String, String)>,
    Optional(body): Optional<DecisionRequest>,
) -> Result<axum::Json<Decided>, ApiError> {
    let reason = body.and_then(|b| b.reason);
    decide(&app, &caller, &id, &key, false, reason)
        .await
        .map(axum::Json)
}

// ---------------------------------------------------------------------------------------------------
// Actions

/// Stops a run for good (`archon cancel`); a run queued here leaves the queue.
#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    responses((status = 200, description = "Done", body = Cancelled), (status = 404, description = "Not found", body = ApiError),
        (status = 409, description = "The run's state does not allow it", body = ApiError), (status = 403, description = "Refused: a viewer, a cross-site request, or a missing CSRF token", body = ApiError), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn cancel(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Cancelled>, ApiError> {
    app.executor.cancel(&app, &id).await.map(axum::Json)
}

/// What continuing a run may accept.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContinueRequest {
    /// Run again steps in doubt (running when the run stopped) even when repeating them is not known
    /// to be safe.
    #[serde(default)]
    pub rerun_in_doubt: bool,
    /// Continue with the spec as it is now although it changed since the run started.
    #[serde(default)]
    pub allow_changed_spec: bool,
}

/// Resumes an interrupted run, or one whose calls were decided (`archon resume`).
#[utoipa::path(post, path = "/runs/{id}/resume", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    request_body(content = Option<ContinueRequest>, description = "May be left out"),
    responses((status = 202, description = "Started, or queued", body = Started), (status = 404, description = "Not found", body = ApiError),
        (status = 409, description = "The run's state does not allow it", body = ApiError), (status = 422, description = "The workflow or its inputs do not validate", body = ApiError), (status = 400, description = "The request does not read", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError),
        (status = 415, description = "The body is not JSON", body = ApiError),
        (status = 403, description = "Refused: a viewer, a cross-site request, or a missing CSRF token", body = ApiError), (status = 401, description = "No valid credentials", body = ApiError), (status = 503, description = "The server is stopping, or too busy", body = ApiError)))]
async fn resume(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Optional(body): Optional<ContinueRequest>,
) -> Result<(StatusCode, axum::Json<Started>), ApiError> {
    let request = body.unwrap_or_default();
    let started = app
        .executor
        .continue_run(
            &app,
            &id,
            How::Resume,
            Options {
                rerun_in_doubt: request.rerun_in_doubt,
                allow_changed_spec: request.allow_changed_spec,
            },
        )
        .await?;
    Ok((StatusCode::ACCEPTED, axum::Json(started)))
}

/// Which steps run again.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    /// Run this step and everything downstream of it again (`archon retry --from STEP`); without it,
    /// the failed steps and those skipped because of them (`archon retry --failed`).
    pub from: Option<String>,
    #[serde(default)]
    pub rerun_in_doubt: bool,
    #[serde(default)]
    pub allow_changed_spec: bool,
}

/// Runs steps of an ended run again: from a step, or the failed ones.
#[utoipa::path(post, path = "/runs/{id}/retry", tag = "runs",
    params(("id" = String, Path, description = "The run's id")),
    request_body(content = Option<RetryRequest>, description = "May be left out"),
    responses((status = 202, description = "Started, or queued", body = Started), (status = 404, description = "Not found", body = ApiError),
        (status = 409, description = "The run's state does not allow it", body = ApiError), (status = 422, description = "The workflow or its inputs do not validate", body = ApiError), (status = 400, description = "The request does not read", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError),
        (status = 415, description = "The body is not JSON", body = ApiError),
        (status = 403, description = "Refused: a viewer, a cross-site request, or a missing CSRF token", body = ApiError), (status = 401, description = "No valid credentials", body = ApiError), (status = 503, description = "The server is stopping, or too busy", body = ApiError)))]
async fn retry(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Optional(body): Optional<RetryRequest>,
) -> Result<(StatusCode, axum::Json<Started>), ApiError> {
    let request = body.unwrap_or_default();
    let how = match request.from {
        Some(step) => How::From { step },
        None => How::Failed,
    };
    let started = app
        .executor
        .continue_run(
            &app,
            &id,
            how,
            Options {
                rerun_in_doubt: request.rerun_in_doubt,
                allow_changed_spec: request.allow_changed_spec,
            },
        )
        .await?;
    Ok((StatusCode::ACCEPTED, axum::Json(started)))
}

/// The runs waiting in this server's queue for a place among those going on (`--max-runs`).
#[utoipa::path(get, path = "/queue", tag = "runs",
    responses((status = 200, description = "Done", body = [QueuedRun]), (status = 401, description = "No valid credentials", body = ApiError)))]
async fn get_queue(State(app): State<AppState>) -> axum::Json<Vec<QueuedRun>> {
    axum::Json(app.executor.queue())
}
