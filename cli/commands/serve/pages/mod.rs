//! The dashboard's HTML pages, mounted at `/` (see the contract in `serve/mod.rs`).
//!
//! Every page is rendered here, on the server, as plain HTML that reads without JavaScript: the layout
//! and its navigation (this file), the workflows and their run forms (`workflows.rs`, `form.rs`), the run
//! list (`runs.rs`), a run with its graph (`run.rs`, `graph.rs`), the calls waiting for a decision
//! (`approvals.rs`). What the API module does not read already is read in `data.rs`. The one stylesheet
//! and the one script (`assets/`) are embedded in the binary and served under their content's hash; the
//! script only adds live updates (server-sent events) to what the page shows already.
//!
//! Everything from a spec, a run or a request is escaped ([`escape`]); pages send a strict
//! Content-Security-Policy (no inline script or style, scripts from this server only).

mod approvals;
mod assets;
mod data;
mod form;
mod graph;
mod run;
mod runs;
mod workflows;

use std::fmt::Write as _;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};

use super::app::{ApiError, AppState};
use super::auth::{Caller, Via};

/// The pages' routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/workflows", get(workflows::list))
        .route(
            "/workflows/{*id}",
            get(workflows::page).post(workflows::start),
        )
        .route("/runs", get(runs::list))
        .route("/runs/{id}", get(run::page))
        .route("/runs/{id}/step", get(run::step_page))
        .route("/runs/{id}/trail", get(run::trail_page))
        .route("/runs/{id}/cancel", post(run::cancel))
        .route("/runs/{id}/resume", post(run::resume))
        .route("/runs/{id}/retry", post(run::retry))
        .route(
            "/runs/{id}/approvals/{key}/{decision}",
            post(approvals::decide),
        )
        .route("/approvals", get(approvals::list))
        .route("/assets/{file}", get(assets::serve))
        .layer(axum::middleware::map_response(secure_headers))
        .layer(axum::middleware::from_fn(timing))
}

/// Says in `Server-Timing` how long the page took to make (what `benches/serve.rs` reports).
async fn timing(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let started = std::time::Instant::now();
    let mut response = next.run(request).await;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    if let Ok(value) = HeaderValue::from_str(&format!("page;dur={took:.2}")) {
        response.headers_mut().insert("server-timing", value);
    }
    response
}

/// The Content-Security-Policy of every page: nothing inline, nothing from elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Headers every response of the pages carries: the CSP, no sniffing, no framing; pages (not assets)
/// are not cached.
async fn secure_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// Which entry of the navigation a page belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nav {
    Runs,
    Workflows,
    Approvals,
}

/// A page to lay out: its title, its place in the navigation, what the script needs to know (as `data-`
/// attributes of `<main>`), and its content.
#[derive(Debug)]
pub struct Page {
    pub title: String,
    pub nav: Option<Nav>,
    /// `(name, value)`: written as `data-name="value"` on `<main>`, escaped.
    pub data: Vec<(&'static str, String)>,
    pub body: String,
}

impl Page {
    pub fn new(title: impl Into<String>, nav: Option<Nav>, body: String) -> Page {
        Page {
            title: title.into(),
            nav,
            data: Vec::new(),
            body,
        }
    }

    pub fn data(mut self, name: &'static str, value: impl Into<String>) -> Page {
        self.data.push((name, value.into()));
        self
    }

    /// The whole document, for `caller`.
    pub fn render(&self, caller: &Caller) -> String {
        let mut nav = String::new();
        for (entry, href, label) in [
            (Nav::Runs, "/runs", "Runs"),
            (Nav::Workflows, "/workflows", "Workflows"),
            (Nav::Approvals, "/approvals", "Approvals"),
        ] {
            let current = if self.nav == Some(entry) {
                r#" aria-current="page""#
            } else {
                ""
            };
            let _ = write!(nav, r#"<li><a href="{href}"{current}>{label}</a></li>"#);
        }
        let logout = if caller.via == Via::Cookie {
            format!(
                r#"<form method="post" action="/logout" class="inline">{}<button type="submit" class="link">Log out</button></form>"#,
                super::auth::csrf_field(caller)
            )
        } else {
            String::new()
        };
        let mut data = String::new();
        for (name, value) in &self.data {
            let _ = write!(data, r#" data-{name}="{}""#, escape(value));
        }
        format!(
            r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Archon</title>
<link rel="icon" href="{icon}" type="image/svg+xml">
<link rel="stylesheet" href="{css}">
<script src="{js}" defer></script>
</head>
<body>
<a class="skip" href="#main">Skip to the content</a>
<header class="top">
<a class="brand" href="/runs">Archon</a>
<nav aria-label="Main"><ul>{nav}</ul></nav>
<p class="who">{by} <span class="role">({role})</span> {logout}</p>
</header>
<main id="main"{data}>
{body}
</main>
</body>
</html>
"##,
            title = escape(&self.title),
            css = assets::CSS.url(),
            icon = assets::ICON.url(),
            js = assets::JS.url(),
            by = escape(&caller.by),
            role = caller.role.as_str(),
            body = self.body,
        )
    }

    pub fn response(&self, caller: &Caller) -> Response {
        Html(self.render(caller)).into_response()
    }
}

/// An error as a page (what went wrong, and what to do), with its status code.
pub fn error_page(caller: &Caller, error: &ApiError) -> Response {
    let status = error.status_code();
    let title = status.canonical_reason().unwrap_or("Error");
    let body = format!(
        "<h1>{}</h1>\n{}",
        escape(title),
        problem(&error.error, error.hint.as_deref())
    );
    (status, Page::new(title, None, body).response(caller)).into_response()
}

/// A problem as a paragraph (`role="alert"`), with its hint.
pub fn problem(message: &str, hint: Option<&str>) -> String {
    let hint = hint.map_or_else(String::new, |h| {
        format!(r#"<br><span class="hint">hint: {}</span>"#, code_spans(h))
    });
    format!(
        r#"<p class="problem" role="alert">{}{hint}</p>"#,
        code_spans(message)
    )
}

/// `text` escaped, with the values it names in backticks set as `<code>`.
pub fn code_spans(text: &str) -> String {
    let mut out = String::new();
    for (index, part) in text.split('`').enumerate() {
        if index % 2 == 1 {
            let _ = write!(out, "<code>{}</code>", escape(part));
        } else {
            out.push_str(&escape(part));
        }
    }
    // An odd number of backticks: the last one was not a pair.
    if text.split('`').count().is_multiple_of(2) {
        return escape(text);
    }
    out
}

/// A 303 to `path` (after a form that changed something).
pub fn see_other(path: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, path.to_owned())]).into_response()
}

/// A time as `2026-11-27 04:20:18 UTC`, in a `<time>` element.
pub fn time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let text = humantime::format_rfc3339_seconds(at).to_string();
    format!(
        r#"<time datetime="{text}">{} UTC</time>"#,
        text.trim_end_matches('Z').replace('T', " ")
    )
}

/// A duration as `850 ms`, `12.3 s`, `4 min 5 s` or `2 h 3 min`.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// A status as a word anyone reads (colour only adds to it).
pub fn status_label(status: &str) -> &'static str {
    match status {
        "running" => "running",
        "waiting_approval" => "waiting for approval",
        "interrupted" => "interrupted",
        "succeeded" => "succeeded",
        "failed" => "failed",
        "cancelled" => "cancelled",
        "queued" => "queued",
        "pending" => "not started",
        "skipped" => "skipped",
        "timed_out" => "timed out",
        "stuck" => "stuck",
        "incomplete" => "incomplete",
        "retrying" => "retrying",
        "in_doubt" => "in doubt",
        _ => "unknown",
    }
}

/// The symbol shown before a status's word.
pub fn status_symbol(status: &str) -> &'static str {
    match status {
        "running" | "retrying" => "▶",
        "waiting_approval" => "◷",
        "interrupted" | "in_doubt" => "‖",
        "succeeded" => "✓",
        "failed" | "timed_out" | "stuck" | "incomplete" => "✗",
        "cancelled" => "⊘",
        "queued" => "…",
        "skipped" => "↷",
        _ => "○",
    }
}

/// The CSS class of a status: `status-` and the status, restricted to `[a-z_]`.
pub fn status_class(status: &str) -> String {
    let known = status_label(status);
    let name = if known == "unknown" {
        "unknown"
    } else {
        status
    };
    format!("status-{name}")
}

/// A status as a badge: symbol, word and colour.
pub fn badge(status: &str) -> String {
    format!(
        r#"<span class="badge {}"><span aria-hidden="true">{}</span> {}</span>"#,
        status_class(status),
        status_symbol(status),
        status_label(status)
    )
}

/// `text` cut to `max` characters, and whether it was.
pub fn truncated(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}

/// A query string value, percent-encoded.
pub fn encode(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// A path segment, percent-encoded (a workflow id may hold `/`, kept as it is).
pub fn encode_path(value: &str) -> String {
    value
        .split('/')
        .map(encode)
        .collect::<Vec<_>>()
        .join("/")
        .replace('+', "%20")
}

/// `text` made safe inside HTML text and quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON as indented text.
pub fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_text_and_attributes() {
        assert_eq!(
            escape(r#"<a href="x" onclick='y'>&</a>"#),
            "&lt;a href=&quot;x&quot; onclick=&#39;y&#39;&gt;&amp;&lt;/a&gt;"
        );
    }

    #[test]
    fn backticked_values_become_code_and_stay_escaped() {
        assert_eq!(
            code_spans("input `<n>` is invalid"),
            "input <code>&lt;n&gt;</code> is invalid"
        );
        assert_eq!(code_spans("a ` b"), "a ` b");
    }

    #[test]
    fn durations_read_at_every_scale() {
        assert_eq!(
            [850, 12_345, 245_000, 7_380_000].map(duration),
            ["850 ms", "12.3 s", "4 min 5 s", "2 h 3 min"]
        );
    }

    #[test]
    fn an_unknown_status_gets_no_class_of_its_own() {
        assert_eq!(status_class("failed"), "status-failed");
        assert_eq!(status_class("x\" onmouseover=\"y"), "status-unknown");
    }

    #[test]
    fn times_are_utc_and_machine_readable() {
        assert_eq!(
            time(1_790_000_000_123),
            r#"<time datetime="2026-09-21T14:13:20Z">2026-09-21 14:13:20 UTC</time>"#
        );
    }
}
