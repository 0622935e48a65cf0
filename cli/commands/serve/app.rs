//! What every handler shares ([`App`]), the JSON error of the API ([`ApiError`]) and the router.

use std::sync::{Arc, Mutex};

use archon_engine::redact::Redactor;
use archon_engine::report::RunEvent;
use archon_engine::session::{LogChunk, Session, SessionError, StoreAt, StoreError};
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use super::auth::{self, Tokens};
use super::events::Live;
use super::executor::Executor;
use super::workflows::Catalog;
use super::{api, pages};

/// The state every handler shares.
pub type AppState = Arc<App>;

/// Largest request body read (a run's inputs, a decision, a login form): larger ones get `413`.
pub const MAX_BODY: usize = 256 * 1024;

/// Sessions kept open for reading the store: requests beyond them wait for one.
const READERS: usize = 4;

/// The served workflows, the state directory and everything the server keeps while it runs.
#[derive(Debug)]
pub struct App {
    pub catalog: Catalog,
    /// Where runs are kept (the state directory's store, or a PostgreSQL database).
    pub store: StoreAt,
    /// Who may do what: tokens, cookie sessions, the CSRF token of loopback without tokens.
    pub auth: auth::Auth,
    /// The runs this server executes, and its queue.
    pub executor: Executor,
    /// Live events: the store watcher and the runs' own events.
    pub live: Live,
    /// Cancelled when the server stops.
    pub stopping: CancellationToken,
    /// The values of the secrets the served workflows declare (environment, `.env`): masked out of the run
    /// data every response holds (see [`App::mask_event`] and the API's readers), never out of the
    /// response's own framing.
    pub secrets: Redactor,
    readers: Mutex<Vec<Session>>,
    reader_slots: tokio::sync::Semaphore,
}

impl App {
    pub fn new(
        catalog: Catalog,
        store: StoreAt,
        tokens: Tokens,
        max_runs: usize,
        max_queue: usize,
        stopping: CancellationToken,
        labels: archon_engine::workflow::Labels,
    ) -> anyhow::Result<AppState> {
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            readers.push(Session::open_at(&store).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        let secrets = catalog.secret_values();
        let live = Live::new();
        Ok(Arc::new(App {
            executor: Executor::new(&store, max_runs, max_queue, stopping.clone(), &live, labels),
            live,
            auth: auth::Auth::new(tokens),
            catalog,
            store,
            stopping,
            secrets,
            readers: Mutex::new(readers),
            reader_slots: tokio::sync::Semaphore::new(READERS),
        }))
    }

    /// Runs `read` with one of the server's sessions, on the blocking pool (SQLite calls block).
    pub async fn read<T, F>(self: &Arc<Self>, read: F) -> Result<T, ApiError>
    where
        F: FnOnce(&Session) -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        let _slot = self
            .reader_slots
            .acquire()
            .await
            .map_err(|_| ApiError::unavailable())?;
        let app = self.clone();
        tokio::task::spawn_blocking(move || {
            let session = app
                .readers
                .lock()
                .ok()
                .and_then(|mut r| r.pop())
                .ok_or_else(ApiError::unavailable)?;
            let result = read(&session);
            if let Ok(mut readers) = app.readers.lock() {
                readers.push(session);
            }
            result
        })
        .await
        .map_err(|_| ApiError::internal("a read of the run store stopped unexpectedly"))?
    }

    /// Masks the secret values of the served workflows out of an event of a run's log as the store gives
    /// it (`{"event": KIND, ...fields, "at_ms"}`): the fields that hold run data (errors, texts,
    /// arguments, reasons), as the run itself masks them; not its kind, step, tool or key.
    pub fn mask_event(&self, event: &mut Json) {
        if self.secrets.is_empty() {
            return;
        }
        let Json::Object(fields) = event else {
            self.secrets.json(event);
            return;
        };
        let mut known = fields.clone();
        known.remove("at_ms");
        match serde_json::from_value::<RunEvent>(Json::Object(known)) {
            Ok(mut decoded) => {
                self.secrets.event(&mut decoded);
                let masked = match serde_json::to_value(&decoded) {
                    Ok(Json::Object(masked)) => masked,
                    _ => Map::new(),
                };
                for (key, value) in fields.iter_mut() {
                    match masked.get(key) {
                        Some(masked) => *value = masked.clone(),
                        // A field the event's kind does not know (a newer writer's) is data too.
                        None if key != "at_ms" => self.secrets.json(value),
                        None => {}
                    }
                }
            }
            // An event this build does not know: every value but its kind and step is data.
            Err(_) => {
                for (key, value) in fields.iter_mut() {
                    if !matches!(key.as_str(), "event" | "step" | "at_ms") {
                        self.secrets.json(value);
                    }
                }
            }
        }
    }

    /// Masks a piece of what a run's commands wrote: its text.
    pub fn mask_log(&self, chunk: &mut LogChunk) {
        self.secrets.string(&mut chunk.text);
    }
}

/// The whole application: the API under `/api/v1`, the login routes, the pages at `/`, behind the
/// authentication middleware and a body limit; and, outside them, `POST /hooks/{workflow}`.
/// A webhook delivery has `body_timeout` to send its body.
pub fn router(app: AppState, body_timeout: std::time::Duration) -> Router {
    let authenticated = Router::new()
        .nest(
            "/api/v1",
            api::router().layer(axum::middleware::from_fn(json_errors)),
        )
        .merge(auth::routes())
        .merge(pages::router())
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::middleware,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(app.clone());
    // Webhook deliveries authenticate with their own signature or token, not the server's: that one
    // route is outside the middleware, and everything else goes to the rest, behind it.
    super::triggers::hooks_router(app, body_timeout)
        .layer(axum::middleware::from_fn(json_errors))
        .fallback_service(authenticated)
}

/// Makes every error the API's routes answer with in a shape of their own (axum's plain-text `405`,
/// `413` or rejections) the API's JSON error, with the same status and headers.
async fn json_errors(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let method = request.method().clone();
    let response = next.run(request).await;
    let status = response.status();
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let error = match status {
        StatusCode::METHOD_NOT_ALLOWED => {
            ApiError::new(status, format!("this endpoint does not take `{method}`"))
                .with_hint("`GET /api/v1/openapi.json` describes the API")
        }
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(),
        _ if !text.trim().is_empty() => ApiError::new(status, text),
        _ => ApiError::new(
            status,
            status
                .canonical_reason()
                .unwrap_or("the request failed")
                .to_lowercase(),
        ),
    };
    let mut answer = error.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            answer.headers_mut().insert(name.clone(), value.clone());
        }
    }
    answer
}

/// `text` as the API writes errors: no OS error number, a lowercase first letter (unless it starts an
/// acronym), no trailing period.
pub fn tidy(text: &str) -> String {
    let mut text = text.trim().to_owned();
    while let Some(start) = text.find(" (os error ") {
        let Some(end) = text[start..].find(')') else {
            break;
        };
        text.replace_range(start..start + end + 1, "");
    }
    while text.ends_with('.') && !text.ends_with("..") {
        text.pop();
    }
    let mut chars = text.chars();
    if let (Some(first), Some(second)) = (chars.next(), chars.next())
        && first.is_uppercase()
        && !second.is_uppercase()
        && second.is_alphabetic()
    {
        let rest: String = text.chars().skip(1).collect();
        text = first.to_lowercase().chain(rest.chars()).collect();
    }
    text
}

/// An API error: `{"error": ..., "hint": ...}` with its status code.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ApiError {
    #[serde(skip)]
    pub status: u16,
    /// What went wrong: lowercase, values in backticks.
    pub error: String,
    /// What to do about it, when there is something to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl ApiError {
    /// `404`: no run of that id.
    pub fn unknown_run(id: &str) -> Self {
        ApiError::not_found(format!("no run `{id}` in the state directory"))
    }

    pub fn new(status: StatusCode, error: impl Into<String>) -> Self {
        ApiError {
            status: status.as_u16(),
            error: error.into(),
            hint: None,
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn not_found(error: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, error)
    }

    pub fn bad_request(error: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, error)
    }

    pub fn conflict(error: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, error)
    }

    pub fn internal(error: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error)
    }

    /// `413`: a request body over [`MAX_BODY`].
    pub fn too_large() -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {} KiB", MAX_BODY / 1024),
        )
        .with_hint("send less: inputs, decisions and forms are small")
    }

    pub fn unavailable() -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping")
    }

    /// A store error: an unknown run is `404`, anything else a failure of the store (`500`).
    pub fn store(error: &StoreError) -> Self {
        let status = if error.unknown_run {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        ApiError {
            status: status.as_u16(),
            error: error.message.clone(),
            hint: error.hint.clone(),
        }
    }

    /// A session's refusal (`409`: the run's state does not allow it; `422`: the spec does not
    /// validate), or its store's error.
    pub fn session(error: &SessionError) -> Self {
        match error {
            SessionError::Store(e) => {
                // The store says "not waiting for approval" and the like as an unknown run: a conflict
                // with the run's state when the run exists.
                if e.unknown_run && !e.message.starts_with("no run") {
                    ApiError::conflict(e.message.clone()).with_hint_opt(e.hint.clone())
                } else {
                    ApiError::store(e)
                }
            }
            SessionError::Refused { message, hint } => {
                ApiError::conflict(message.clone()).with_hint(hint.clone())
            }
            SessionError::Invalid { path, .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the workflow `{}` does not validate", path.display()),
            )
            .with_hint("`archon validate` (or the workflow's page) shows why"),
            SessionError::Run(e) => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }

    fn with_hint_opt(mut self, hint: Option<String>) -> Self {
        self.hint = hint;
        self
    }

    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl IntoResponse for ApiError {
    fn into_response(mut self) -> Response {
        // Texts from elsewhere (the OS, axum, serde) written as the API writes its own.
        self.error = tidy(&self.error);
        self.hint = self.hint.as_deref().map(tidy);
        (self.status_code(), axum::Json(self)).into_response()
    }
}

/// Milliseconds since the Unix epoch (the unit of every time the store keeps).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Nothing, when the state directory holds run `id`; else `404`.
pub fn known_run(session: &Session, id: &str) -> Result<(), ApiError> {
    match session.summary(id).map_err(|e| ApiError::store(&e))? {
        Some(_) => Ok(()),
        None => Err(ApiError::unknown_run(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::tidy;

    #[test]
    fn texts_from_elsewhere_are_written_as_the_api_writes_errors() {
        assert_eq!(
            tidy("No such file or directory (os error 2)"),
            "no such file or directory"
        );
        assert_eq!(
            tidy("Failed to buffer the request body."),
            "failed to buffer the request body"
        );
        assert_eq!(tidy("JSON is expected"), "JSON is expected");
        assert_eq!(tidy("`limit` is too large"), "`limit` is too large");
        assert_eq!(tidy("wait..."), "wait...");
    }
}
