//! Who may do what.
//!
//! Tokens have one of two roles: a **viewer** reads everything; an **operator** also starts, approves,
//! denies, cancels, resumes and retries runs. `ARCHON_SERVE_TOKEN` holds one operator token; `--token-file
//! FILE` holds lines `operator TOKEN [NAME]` or `viewer TOKEN [NAME]` (blank lines and `#` comments
//! skipped; NAME is who decisions are recorded as, else the role). Without any token the server listens
//! only on loopback, and everyone who reaches it is an operator.
//!
//! API clients send `Authorization: Bearer TOKEN`. Browsers log in with a token at `/login`, which sets an
//! `HttpOnly`, `SameSite=Strict` session cookie. Every request that changes something is a POST; a POST
//! is refused (`403`) when it comes from another site (`Origin` other than the server's own,
//! `Sec-Fetch-Site` other than `same-origin` or `none`), when it is not a bearer-token request and does
//! not carry the session's CSRF token (form field `csrf` or header `X-CSRF-Token`), and when the caller
//! is a viewer. Without tokens, requests whose `Host` is not a loopback name are refused too (DNS
//! rebinding).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::Refusal;
use super::app::{ApiError, AppState, MAX_BODY};
use crate::commands::serving;

/// The name of the session cookie.
pub const COOKIE: &str = "archon_session";
/// The header a script sends the CSRF token in (a form sends the field `csrf`).
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a browser session lasts.
const SESSION_LIFE: Duration = Duration::from_secs(12 * 60 * 60);
/// Most browser sessions kept at once: the oldest is forgotten to make room.
const MAX_SESSIONS: usize = 1024;

/// What a caller may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reads everything; changes nothing.
    Viewer,
    /// Also starts, approves, denies, cancels, resumes and retries runs.
    Operator,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// How a caller proved who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Via {
    /// `Authorization: Bearer TOKEN`.
    Bearer,
    /// The session cookie set by `/login`.
    Cookie,
    /// Nothing: the server has no token and listens on loopback only.
    Open,
}

/// The caller of a request that passed authentication (an extractor for handlers).
#[derive(Clone, Debug)]
pub struct Caller {
    pub role: Role,
    pub via: Via,
    /// The CSRF token forms must carry (`None` for bearer-token clients, which need none).
    pub csrf: Option<String>,
    /// Who decisions are recorded as.
    pub by: String,
}

impl Caller {
    pub fn can_operate(&self) -> bool {
        self.role == Role::Operator
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, "authentication is required"))
    }
}

/// One token and what it may do.
#[derive(Clone)]
struct Token {
    role: Role,
    secret: String,
    name: Option<String>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("role", &self.role)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The tokens the server accepts.
#[derive(Clone, Debug, Default)]
pub struct Tokens(Vec<Token>);

/// The fewest characters a token may have.
const MIN_TOKEN: usize = 16;

impl Tokens {
    /// The tokens of `--token-file`, else the operator token in `ARCHON_SERVE_TOKEN`, else none.
    pub fn load(file: Option<&Path>) -> Result<Tokens, Refusal> {
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|e| Refusal {
                message: format!(
                    "cannot read token file `{}`: {}",
                    path.display(),
                    super::app::tidy(&e.to_string())
                ),
                hint: "each line is `operator TOKEN` or `viewer TOKEN`".to_owned(),
            })?;
            return Tokens::parse(&text).map_err(|message| Refusal {
                message: format!("token file `{}`: {message}", path.display()),
                hint: "each line is `operator TOKEN [NAME]` or `viewer TOKEN [NAME]`; `#` starts a comment"
                    .to_owned(),
            });
        }
        match std::env::var("ARCHON_SERVE_TOKEN") {
            Ok(token) if token.trim().is_empty() => Err(Refusal {
                message: "`ARCHON_SERVE_TOKEN` is empty".to_owned(),
                hint: "set it to the operator token, or unset it".to_owned(),
            }),
            Ok(token) if token.trim().len() < MIN_TOKEN => Err(Refusal {
                message: format!("`ARCHON_SERVE_TOKEN` needs at least {MIN_TOKEN} characters"),
                hint: "use a long random value, such as the output of `openssl rand -hex 32`"
                    .to_owned(),
            }),
            Ok(token) => Ok(Tokens(vec![Token {
                role: Role::Operator,
                secret: token.trim().to_owned(),
                name: None,
            }])),
            Err(_) => Ok(Tokens::default()),
        }
    }

    /// Reads the lines of a token file.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut tokens = Vec::new();
        let mut lines: HashMap<&str, usize> = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let role = match words.next() {
                Some("operator") => Role::Operator,
                Some("viewer") => Role::Viewer,
                Some(other) => {
                    return Err(format!(
                        "line {}: `{}` is not a role: `operator` or `viewer`",
                        n + 1,
                        other.escape_debug()
                    ));
                }
                None => continue,
            };
            let Some(secret) = words.next() else {
                return Err(format!("line {}: the token is missing", n + 1));
            };
            if secret.len() < MIN_TOKEN {
                return Err(format!(
                    "line {}: a token needs at least {MIN_TOKEN} characters",
                    n + 1
                ));
            }
            // The same token twice would hold whichever role came first: say so instead.
            if let Some(before) = lines.get(secret) {
                return Err(format!("line {}: the token of line {before} again", n + 1));
            }
            lines.insert(secret, n + 1);
            let name: Vec<&str> = words.collect();
            tokens.push(Token {
                role,
                secret: secret.to_owned(),
                name: (!name.is_empty()).then(|| name.join(" ")),
            });
        }
        if tokens.is_empty() {
            return Err("no token in it".to_owned());
        }
        Ok(Tokens(tokens))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token `given` is, compared in constant time against each.
    fn find(&self, given: &str) -> Option<&Token> {
        let mut found = None;
        for token in &self.0 {
            if serving::same(given.as_bytes(), token.secret.as_bytes()) && found.is_none() {
                found = Some(token);
            }
        }
        found
    }
}

/// A browser's session.
#[derive(Clone, Debug)]
struct BrowserSession {
    role: Role,
    by: String,
    csrf: String,
    until: Instant,
}

/// The server's authentication state.
#[derive(Debug)]
pub struct Auth {
    tokens: Tokens,
    sessions: Mutex<HashMap<String, BrowserSession>>,
    /// Without tokens: the CSRF token every page's forms carry (there is no session to hold one).
    open_csrf: String,
    /// Without tokens: who decisions are recorded as (the user running the server).
    open_by: String,
}

impl Auth {
    pub fn new(tokens: Tokens) -> Auth {
        Auth {
            tokens,
            sessions: Mutex::new(HashMap::new()),
            open_csrf: random_token(),
            open_by: archon_engine::session::person(None),
        }
    }

    /// Whether the server runs without tokens (loopback only; everyone is an operator).
    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The caller a request's credentials name, or why they are refused (`Ok(None)`: no credentials).
    fn caller(&self, headers: &HeaderMap) -> Result<Option<Caller>, ApiError> {
        if let Some(given) = serving::bearer(headers) {
            return match self.tokens.find(given) {
                Some(token) => Ok(Some(Caller {
                    role: token.role,
                    via: Via::Bearer,
                    csrf: None,
                    by: token
                        .name
                        .clone()
                        .unwrap_or_else(|| token.role.as_str().to_owned()),
                })),
                None => Err(unauthorized("the bearer token is not valid")),
            };
        }
        if let Some(id) = cookie(headers, COOKIE)
            && let Some(session) = self.session(id)
        {
            return Ok(Some(Caller {
                role: session.role,
                via: Via::Cookie,
                csrf: Some(session.csrf),
                by: session.by,
            }));
        }
        if self.is_open() {
            return Ok(Some(Caller {
                role: Role::Operator,
                via: Via::Open,
                csrf: Some(self.open_csrf.clone()),
                by: self.open_by.clone(),
            }));
        }
        Ok(None)
    }

    fn session(&self, id: &str) -> Option<BrowserSession> {
        let mut sessions = self.sessions.lock().ok()?;
        let now = Instant::now();
        match sessions.get(id) {
            Some(s) if s.until > now => Some(s.clone()),
            Some(_) => {
                sessions.remove(id);
                None
            }
            None => None,
        }
    }

    /// Opens a browser session for the holder of `token`; returns its id.
    fn login(&self, token: &str) -> Option<String> {
        let token = self.tokens.find(token)?.clone();
        let id = random_token();
        let mut sessions = self.sessions.lock().ok()?;
        let now = Instant::now();
        sessions.retain(|_, s| s.until > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, s)| s.until)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            id.clone(),
            BrowserSession {
                role: token.role,
                by: token
                    .name
                    .clone()
                    .unwrap_or_else(|| token.role.as_str().to_owned()),
                csrf: random_token(),
                until: now + SESSION_LIFE,
            },
        );
        Some(id)
    }

    fn logout(&self, id: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.remove(id);
        }
    }
}

/// 32 random bytes, in hex.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    // Without the system's randomness no token can be made safely: better to stop than to guess.
    #[allow(clippy::expect_used)]
    getrandom::fill(&mut bytes).expect("the system's random number generator is unavailable");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, message)
        .with_hint("send `Authorization: Bearer TOKEN`, or log in at `/login`")
}

fn forbidden(message: &str) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, message)
}

/// Paths anyone may read without credentials.
fn public(path: &str) -> bool {
    matches!(path, "/login" | "/logout" | "/api/v1/openapi.json")
}

/// Authenticates every request and refuses what the caller may not do. (Secret values are masked out of
/// the run data handlers read, not here: masking a whole response would corrupt its JSON and links.)
pub async fn middleware(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_owned();
    let api = path.starts_with("/api/");
    if app.auth.is_open() && !host_is_loopback(&parts.headers) {
        return forbidden("requests for this host name are refused")
            .with_hint("open the server as `localhost` or by its loopback address")
            .into_response();
    }
    let caller = match app.auth.caller(&parts.headers) {
        Ok(caller) => caller,
        Err(e) => return with_challenge(e.into_response()),
    };
    let changes = !matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
    if changes && let Some(refusal) = cross_site(&parts.headers) {
        return refusal.into_response();
    }
    let mut request = Request::from_parts(parts, body);
    match &caller {
        None if public(&path) => {}
        None if api => {
            return with_challenge(unauthorized("authentication is required").into_response());
        }
        None => {
            let next = request
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_owned();
            let target = format!(
                "/login?next={}",
                form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
            );
            return Redirect::to(&target).into_response();
        }
        Some(caller) => {
            if changes && !matches!(path.as_str(), "/login" | "/logout") {
                if caller.role != Role::Operator {
                    return forbidden("a viewer cannot change anything")
                        .with_hint("log in with an operator token")
                        .into_response();
                }
                if let Some(expected) = &caller.csrf {
                    match csrf_checked(request, expected).await {
                        Ok(checked) => request = checked,
                        Err(refusal) => return refusal.into_response(),
                    }
                }
            }
            request.extensions_mut().insert(caller.clone());
        }
    }
    next.run(request).await
}

/// Adds `WWW-Authenticate: Bearer` to a `401`.
fn with_challenge(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Whether the request's `Host` is a loopback name (or absent: HTTP/1.0 clients).
fn host_is_loopback(headers: &HeaderMap) -> bool {
    headers
        .get(header::HOST)
        .is_none_or(|h| h.to_str().is_ok_and(serving::loopback_host))
}

/// The refusal of a request from another site, if it is one: its `Sec-Fetch-Site` is other than
/// `same-origin` or `none`, or its `Origin` is not the server's own (scheme, host and port of `Host`).
fn cross_site(headers: &HeaderMap) -> Option<ApiError> {
    let refused = || {
        Some(
            forbidden("cross-site requests are refused").with_hint(
                "change things from the dashboard's own pages, or from a script (not a page of another site) with `Authorization: Bearer TOKEN`",
            ),
        )
    };
    if let Some(site) = headers.get("sec-fetch-site")
        && !matches!(site.to_str(), Ok("same-origin" | "none"))
    {
        return refused();
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let same = match (origin.to_str().ok(), host) {
            (Some(origin), Some(host)) => origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|rest| rest.eq_ignore_ascii_case(host)),
            _ => false,
        };
        if !same {
            return refused();
        }
    }
    None
}

/// Checks the CSRF token of a POST from a browser session: the `X-CSRF-Token` header, else the `csrf`
/// field of a form body (which is read, and put back for the handler).
async fn csrf_checked(request: Request, expected: &str) -> Result<Request, ApiError> {
    let missing = || {
        forbidden("the CSRF token is missing or wrong").with_hint(
            "send the `csrf` field the page's form holds, or the `X-CSRF-Token` header (`GET /api/v1/session` gives it)",
        )
    };
    if let Some(given) = request.headers().get(CSRF_HEADER) {
        return if serving::same(given.as_bytes(), expected.as_bytes()) {
            Ok(request)
        } else {
            Err(missing())
        };
    }
    let form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !form {
        return Err(missing());
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::too_large())?;
    let given = form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == "csrf")
        .map(|(_, v)| v.into_owned());
    match given {
        Some(given) if serving::same(given.as_bytes(), expected.as_bytes()) => {
            Ok(Request::from_parts(parts, Body::from(bytes)))
        }
        _ => Err(missing()),
    }
}

/// The hidden form field that carries the CSRF token, for a page's forms (empty for bearer callers).
pub fn csrf_field(caller: &Caller) -> String {
    match &caller.csrf {
        Some(token) => format!(r#"<input type="hidden" name="csrf" value="{token}">"#),
        None => String::new(),
    }
}

/// `/login` and `/logout`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    next: Option<String>,
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

/// Where a login sends the browser next: a path of this server, else `/`. Only visible ASCII is
/// kept, because browsers drop tabs and newlines from a URL (`/<TAB>/evil` becomes `//evil`, another
/// host) and read a backslash as `/`.
fn local_target(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n.to_owned()
        }
        _ => "/".to_owned(),
    }
}

async fn login_form(
    State(app): State<AppState>,
    axum::extract::Query(query): axum::extract::Query<LoginQuery>,
) -> Response {
    if app.auth.is_open() {
        return Redirect::to(&local_target(query.next.as_deref())).into_response();
    }
    Html(login_page(&local_target(query.next.as_deref()), None)).into_response()
}

async fn login(
    State(app): State<AppState>,
    axum::extract::Form(form): axum::extract::Form<LoginForm>,
) -> Response {
    let target = local_target(form.next.as_deref());
    match app.auth.login(form.token.trim()) {
        Some(id) => {
            let mut response = Redirect::to(&target).into_response();
            let cookie = format!(
                "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                SESSION_LIFE.as_secs()
            );
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
        }
        None => (
            StatusCode::UNAUTHORIZED,
            Html(login_page(&target, Some("that token is not valid"))),
        )
            .into_response(),
    }
}

async fn logout(State(app): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers, COOKIE) {
        app.auth.logout(id);
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("archon_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    response
}

/// The login page: one field for the token.
fn login_page(next: &str, problem: Option<&str>) -> String {
    let problem = problem.map_or_else(String::new, |p| {
        format!(r#"<p class="problem">{}</p>"#, super::pages::escape(p))
    });
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Log in · Archon</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>Archon</h1>{problem}
<form method="post" action="/login">
<label>Token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
<input type="hidden" name="next" value="{}">
<button type="submit">Log in</button>
</form></main></body></html>
"#,
        super::pages::escape(next)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_name_roles_and_refuse_what_is_not_one() {
        let tokens = Tokens::parse(
            "# who may do what\noperator 0123456789abcdef ana\n\nviewer fedcba9876543210\n",
        )
        .expect("reads");
        let ana = tokens.find("0123456789abcdef").expect("found");
        assert_eq!(
            (ana.role, ana.name.as_deref()),
            (Role::Operator, Some("ana"))
        );
        assert_eq!(
            tokens.find("fedcba9876543210").map(|t| t.role),
            Some(Role::Viewer)
        );
        assert!(tokens.find("0123456789abcdeX").is_none());
        assert_eq!(
            Tokens::parse("admin 0123456789abcdef").map(|_| ()),
            Err("line 1: `admin` is not a role: `operator` or `viewer`".to_owned())
        );
        assert_eq!(
            Tokens::parse("viewer short").map(|_| ()),
            Err("line 1: a token needs at least 16 characters".to_owned())
        );
        assert_eq!(
            Tokens::parse("viewer 0123456789abcdef\noperator 0123456789abcdef\n").map(|_| ()),
            Err("line 2: the token of line 1 again".to_owned())
        );
        assert_eq!(
            Tokens::parse("# nothing\n").map(|_| ()),
            Err("no token in it".to_owned())
        );
    }

    #[test]
    fn cross_site_requests_are_told_apart() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.insert(*k, HeaderValue::from_static(v));
            }
            map
        };
        assert!(cross_site(&headers(&[("host", "127.0.0.1:8700")])).is_none());
        assert!(
            cross_site(&headers(&[
                ("host", "127.0.0.1:8700"),
                ("origin", "http://127.0.0.1:8700"),
                ("sec-fetch-site", "same-origin"),
            ]))
            .is_none()
        );
        assert!(
            cross_site(&headers(&[
                ("host", "127.0.0.1:8700"),
                ("origin", "http://evil.example"),
            ]))
            .is_some()
        );
        assert!(
            cross_site(&headers(&[
                ("host", "127.0.0.1:8700"),
                ("origin", "http://127.0.0.1:8701"),
            ]))
            .is_some()
        );
        assert!(
            cross_site(&headers(&[
                ("host", "127.0.0.1:8700"),
                ("sec-fetch-site", "cross-site"),
            ]))
            .is_some()
        );
        assert!(cross_site(&headers(&[("origin", "null")])).is_some());
    }

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(
            local_target(Some("/runs?status=failed")),
            "/runs?status=failed"
        );
        assert_eq!(local_target(Some("//evil.example/")), "/");
        assert_eq!(local_target(Some("https://evil.example/")), "/");
        assert_eq!(local_target(Some("/\\evil.example")), "/");
        assert_eq!(local_target(Some("/\t/evil.example")), "/");
        assert_eq!(local_target(Some("/\n/evil.example")), "/");
        assert_eq!(local_target(Some("/ /evil.example")), "/");
        assert_eq!(local_target(Some("/runs/é")), "/");
        assert_eq!(local_target(None), "/");
    }
}
