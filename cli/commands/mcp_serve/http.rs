//! Streamable HTTP for `archon mcp serve --http ADDR`: the MCP endpoint at `/mcp`, behind a bearer token
//! when one is given (required for any address but loopback), and refusing browser pages from other
//! origins when none is (DNS rebinding).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::handler::{Handler, Shared};
use crate::commands::serving::{self, loopback_origin};

/// Most MCP sessions open at once: each holds memory until it is closed or has been idle for 5
/// minutes, and a client that opens sessions without end must not exhaust it.
pub const MAX_SESSIONS: usize = 256;

/// Who may call.
#[derive(Clone, Debug)]
struct Guard {
    /// The bearer token every request must carry, if any.
    token: Option<Arc<str>>,
}

/// Serves MCP at `http://ADDR/mcp` (`listener` is already bound). Once `draining` is cancelled no
/// connection is accepted and the server ends when the open ones have; `closing` ends the MCP sessions
/// (and with them the streams a client keeps open).
pub async fn serve(
    listener: tokio::net::TcpListener,
    address: SocketAddr,
    token: Option<String>,
    shared: Arc<Shared>,
    draining: tokio_util::sync::CancellationToken,
    closing: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let handlers = shared.clone();
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(closing.child_token());
    if !address.ip().is_loopback() {
        // The token guards it; clients name the host as they reach it.
        config = config.disable_allowed_hosts();
    }
    let sessions = Arc::new(tokio::sync::Semaphore::new(MAX_SESSIONS));
    let service = StreamableHttpService::new(
        move || {
            let session = sessions.clone().try_acquire_owned().map_err(|_| {
                std::io::Error::other(format!(
                    "{MAX_SESSIONS} MCP sessions are open, the most served at once: close one (HTTP `DELETE` with its `mcp-session-id`) or wait for one to go idle"
                ))
            })?;
            Ok(Handler::new(handlers.clone()).holding(session))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let guard = Guard {
        token: token.map(Arc::from),
    };
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(guard, check));
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { draining.cancelled_owned().await })
        .await
}

/// Lets a request through only with the bearer token (when there is one), and without one only from a
/// loopback origin (or none: a client that is not a browser).
async fn check(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    match &guard.token {
        Some(token) => {
            if !bearer_matches(headers, token) {
                let mut response = (
                    StatusCode::UNAUTHORIZED,
                    "a valid bearer token is required\n",
                )
                    .into_response();
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return response;
            }
        }
        None => {
            if let Some(origin) = headers.get(header::ORIGIN)
                && !origin.to_str().is_ok_and(loopback_origin)
            {
                return (
                    StatusCode::FORBIDDEN,
                    "requests from this origin are refused\n",
                )
                    .into_response();
            }
        }
    }
    next.run(request).await
}

/// Whether the request's `Authorization` header is `Bearer TOKEN`, compared in constant time.
fn bearer_matches(headers: &HeaderMap, token: &str) -> bool {
    serving::bearer(headers).is_some_and(|given| serving::same(given.as_bytes(), token.as_bytes()))
}
