//! The dashboard's HTML pages, mounted at `/` (see the contract in `serve/mod.rs`). The dashboard's
//! pages are built here; until then, `/` says what the server serves and where its API is.

use axum::Router;
use axum::extract::State;
use axum::response::Html;
use axum::routing::get;

use super::app::AppState;
use super::auth::Caller;

/// The pages' routes.
pub fn router() -> Router<AppState> {
    Router::new().route("/", get(home))
}

async fn home(State(app): State<AppState>, caller: Caller) -> Html<String> {
    let mut items = String::new();
    for served in app.catalog.workflows.values() {
        items.push_str(&format!(
            "<li>{}{}</li>\n",
            escape(&served.name),
            if served.workflow.is_some() {
                ""
            } else {
                " (does not validate)"
            }
        ));
    }
    Html(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Archon</title></head>
<body><main><h1>Archon</h1>
<p>Signed in as {} ({}{}).</p>{}
<h2>Workflows</h2><ul>
{items}</ul>
<p>The JSON API is under <a href="/api/v1/openapi.json">/api/v1</a>.</p>
</main></body></html>
"#,
        escape(&caller.by),
        caller.role.as_str(),
        if caller.can_operate() {
            ": can start and decide runs"
        } else {
            ": can read"
        },
        if caller.via == super::auth::Via::Cookie {
            format!(
                r#"<form method="post" action="/logout">{}<button type="submit">Log out</button></form>"#,
                super::auth::csrf_field(&caller)
            )
        } else {
            String::new()
        }
    ))
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
