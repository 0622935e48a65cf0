//! What every handler shares ([`App`]), the JSON error of the API ([`ApiError`]) and the router.

use std::sync::{Arc, Mutex};

use archon_engine::redact::Redactor;
use archon_engine::session::{Session, SessionError, StoreAt, StoreError};
use axum::Json;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
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
    /// The values of the secrets the served workflows declare (environment, `.env`): masked out of every
    /// response, whatever it holds.
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
    ) -> anyhow::Result<AppState> {
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            readers.push(Session::open_at(&store).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        let secrets = catalog.secret_values();
        let live = Live::new();
        Ok(Arc::new(App {
            executor: Executor::new(&store, max_runs, max_queue, stopping.clone(), &live),
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

    /// `text` with every secret value of the served workflows masked.
    pub fn mask<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        self.secrets.text(text)
    }
}

/// The whole application: the API under `/api/v1`, the login routes, the pages at `/`, behind the
/// authentication middleware and a body limit; and, outside them, `POST /hooks/{workflow}`.
/// A webhook delivery has `body_timeout` to send its body.
pub fn router(app: AppState, body_timeout: std::time::Duration) -> Router {
    let authenticated = Router::new()
        .nest("/api/v1", api::router())
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
    super::triggers::hooks_router(app, body_timeout).fallback_service(authenticated)
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
    fn into_response(self) -> Response {
        (self.status_code(), Json(self)).into_response()
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
