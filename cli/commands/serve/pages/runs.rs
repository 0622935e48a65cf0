//! `/runs`: the runs, newest first, a page at a time, filtered by workflow, status and start time in the
//! query string (`?workflow=hello&status=failed&since=2026-11-01T00:00&until=...`); the runs queued on
//! this server above them. The script updates a run's status as it changes, and adds new runs to the
//! first page.

use std::fmt::Write as _;

use archon_engine::session::RunState;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::super::api::{self, RunsParams};
use super::super::app::{ApiError, AppState};
use super::super::auth::Caller;
use super::{Nav, Page, badge, duration, encode, error_page, escape, time};

/// Runs on a page.
const PAGE: usize = 50;

/// The query string of `/runs`.
#[derive(Debug, Default, Deserialize)]
pub struct Filters {
    pub workflow: Option<String>,
    /// A status, or several separated by commas.
    pub status: Option<String>,
    /// `2026-11-27T04:20`, `2026-11-27T04:20:18`, `2026-11-27` (UTC) or milliseconds since the epoch.
    pub since: Option<String>,
    pub until: Option<String>,
    pub cursor: Option<String>,
    /// The page's number, for showing where it is (the cursor says where it starts).
    pub page: Option<usize>,
}

/// `GET /runs`.
pub async fn list(
    State(app): State<AppState>,
    caller: Caller,
    query: Result<Query<Filters>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let filters = match query {
        Ok(Query(filters)) => filters,
        Err(rejection) => {
            return error_page(&caller, &api::query_error(&rejection));
        }
    };
    let workflow = filters.workflow.clone().filter(|w| !w.is_empty());
    let status = filters.status.clone().filter(|s| !s.is_empty());
    let mut problems = Vec::new();
    let since = match time_filter(filters.since.as_deref(), "since") {
        Ok(t) => t,
        Err(e) => {
            problems.push(e);
            None
        }
    };
    let until = match time_filter(filters.until.as_deref(), "until") {
        Ok(t) => t,
        Err(e) => {
            problems.push(e);
            None
        }
    };
    let page_number = filters.page.unwrap_or(1).max(1);
    let listed = if problems.is_empty() {
        api::list_runs(
            &app,
            RunsParams {
                workflow: workflow.clone(),
                status: status.clone(),
                since,
                until,
                cursor: filters.cursor.clone().filter(|c| !c.is_empty()),
                limit: Some(PAGE),
            },
        )
        .await
        .map_err(|e| problems.push(e))
        .ok()
    } else {
        None
    };
    let mut body = String::from("<h1>Runs</h1>\n");
    body.push_str(&filter_form(&app, &filters));
    for problem in &problems {
        body.push_str(&super::problem(&problem.error, problem.hint.as_deref()));
    }
    let mut region = String::new();
    if let Some(page) = &listed {
        if !page.queued.is_empty() {
            let _ = write!(
                region,
                r#"<h2>Queued on this server</h2><table class="list"><thead><tr><th scope="col">Run</th><th scope="col">Workflow</th><th scope="col">To</th><th scope="col">Why it waits</th><th scope="col">Place</th><th scope="col">Queued</th></tr></thead><tbody>"#
            );
            for q in &page.queued {
                let _ = write!(
                    region,
                    r#"<tr><td><a href="/runs/{}"><code>{}</code></a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
                    encode(&q.run_id),
                    escape(&q.run_id),
                    escape(&q.workflow),
                    escape(&q.action.replace('_', " ")),
                    escape(&q.reason),
                    q.position,
                    time(q.queued_at)
                );
            }
            region.push_str("</tbody></table>\n");
        }
        let first = (page_number - 1) * PAGE + 1;
        let last = first + page.runs.len() - usize::from(!page.runs.is_empty());
        let _ = writeln!(
            region,
            r#"<p class="count">{}</p>"#,
            if page.runs.is_empty() {
                if page.total == 0 {
                    "No run matches.".to_owned()
                } else {
                    format!("No run on this page; {} in all.", page.total)
                }
            } else {
                format!("Runs {first}–{last} of {}, newest first.", page.total)
            }
        );
        if !page.runs.is_empty() {
            region.push_str(r#"<table class="list runs"><thead><tr><th scope="col">Run</th><th scope="col">Workflow</th><th scope="col">Status</th><th scope="col">Started</th><th scope="col">Took</th></tr></thead><tbody>"#);
            for run in &page.runs {
                let status = status_name(run.status);
                let took = run.duration_ms.map_or_else(|| "—".to_owned(), duration);
                let _ = write!(
                    region,
                    r#"<tr data-run="{id}"><td><a href="/runs/{link}"><code>{id}</code></a></td><td><a href="/runs?workflow={wf_link}">{wf}</a></td><td class="run-status">{badge}</td><td>{started}</td><td>{took}</td></tr>"#,
                    id = escape(&run.id),
                    link = encode(&run.id),
                    wf_link = encode(&run.workflow),
                    wf = escape(&run.workflow),
                    badge = badge(status),
                    started = time(run.started_at),
                );
                region.push('\n');
            }
            region.push_str("</tbody></table>\n");
        }
        let mut links = Vec::new();
        if filters.cursor.as_deref().is_some_and(|c| !c.is_empty()) {
            links.push(format!(
                r#"<a href="{}">« Newest</a>"#,
                escape(&link(&filters, None, 1))
            ));
        }
        if let Some(next) = &page.next {
            links.push(format!(
                r#"<a href="{}" rel="next">Older runs »</a>"#,
                escape(&link(&filters, Some(next), page_number + 1))
            ));
        }
        if !links.is_empty() {
            let _ = writeln!(
                region,
                r#"<nav class="pages" aria-label="Pages">{}</nav>"#,
                links.join(" ")
            );
        }
    }
    let _ = write!(body, r#"<div id="runs-region" data-live>{region}</div>"#);
    let first_page = filters.cursor.as_deref().is_none_or(str::is_empty);
    let status_code = match problems.first() {
        Some(problem) => problem.status_code(),
        None => StatusCode::OK,
    };
    let page = Page::new("Runs", Some(Nav::Runs), body)
        .data("page", "runs")
        .data("first", if first_page { "yes" } else { "no" });
    (status_code, page.response(&caller)).into_response()
}

/// A run's status as the pages name it.
pub fn status_name(status: api::Status) -> &'static str {
    match status {
        api::Status::Running => "running",
        api::Status::WaitingApproval => "waiting_approval",
        api::Status::Interrupted => "interrupted",
        api::Status::Succeeded => "succeeded",
        api::Status::Failed => "failed",
        api::Status::Cancelled => "cancelled",
        api::Status::Queued => "queued",
    }
}

/// The link to a page of the listing with the same filters.
fn link(filters: &Filters, cursor: Option<&String>, page: usize) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (key, value) in [
        ("workflow", &filters.workflow),
        ("status", &filters.status),
        ("since", &filters.since),
        ("until", &filters.until),
    ] {
        if let Some(value) = value.as_deref().filter(|v| !v.is_empty()) {
            query.append_pair(key, value);
        }
    }
    if let Some(cursor) = cursor {
        query.append_pair("cursor", cursor);
        query.append_pair("page", &page.to_string());
    }
    let query = query.finish();
    if query.is_empty() {
        "/runs".to_owned()
    } else {
        format!("/runs?{query}")
    }
}

/// The filters' form (a GET: the filters stay in the address).
fn filter_form(app: &AppState, filters: &Filters) -> String {
    let mut workflows = String::from(r#"<option value="">any</option>"#);
    let mut names: Vec<&str> = app
        .catalog
        .workflows
        .values()
        .map(|s| s.name.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let chosen = filters.workflow.as_deref().unwrap_or_default();
    if !chosen.is_empty() && !names.contains(&chosen) {
        names.push(chosen);
    }
    for name in names {
        let _ = write!(
            workflows,
            r#"<option value="{0}"{1}>{0}</option>"#,
            escape(name),
            if name == chosen { " selected" } else { "" }
        );
    }
    let mut statuses = String::from(r#"<option value="">any</option>"#);
    let status = filters.status.as_deref().unwrap_or_default();
    let mut known = false;
    for state in RunState::ALL {
        let name = state.as_str();
        known |= name == status;
        let _ = write!(
            statuses,
            r#"<option value="{name}"{}>{}</option>"#,
            if name == status { " selected" } else { "" },
            super::status_label(name)
        );
    }
    if !status.is_empty() && !known {
        let _ = write!(
            statuses,
            r#"<option value="{0}" selected>{0}</option>"#,
            escape(status)
        );
    }
    format!(
        r#"<form method="get" action="/runs" class="filters" role="search" aria-label="Filter the runs">
<div class="field"><label for="f-workflow">Workflow</label><select id="f-workflow" name="workflow">{workflows}</select></div>
<div class="field"><label for="f-status">Status</label><select id="f-status" name="status">{statuses}</select></div>
<div class="field"><label for="f-since">Started from <span class="note">(UTC)</span></label><input type="datetime-local" id="f-since" name="since" value="{since}"></div>
<div class="field"><label for="f-until">Started before <span class="note">(UTC)</span></label><input type="datetime-local" id="f-until" name="until" value="{until}"></div>
<div class="field actions"><button type="submit">Filter</button> <a href="/runs">Clear</a></div>
</form>
"#,
        since = escape(filters.since.as_deref().unwrap_or_default()),
        until = escape(filters.until.as_deref().unwrap_or_default()),
    )
}

/// A time filter: milliseconds since the epoch, or a UTC date and time as a `datetime-local` field
/// sends it (`2026-11-27T04:20`, seconds optional), or a date (its midnight).
pub fn time_filter(text: Option<&str>, name: &str) -> Result<Option<u64>, ApiError> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Some).map_err(|_| refused(text, name));
    }
    let mut full = text.replace(' ', "T");
    match full.len() {
        10 => full.push_str("T00:00:00"),
        16 => full.push_str(":00"),
        _ => {}
    }
    let parsed = humantime::parse_rfc3339(&format!("{}Z", full.trim_end_matches('Z')))
        .map_err(|_| refused(text, name))?;
    let ms = parsed
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| refused(text, name))?
        .as_millis();
    Ok(Some(u64::try_from(ms).unwrap_or(u64::MAX)))
}

fn refused(text: &str, name: &str) -> ApiError {
    ApiError::bad_request(format!("`{name}` is not a time: `{text}`"))
        .with_hint("write `2026-11-27T04:20` (UTC), `2026-11-27`, or milliseconds since the epoch")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_filters_read_dates_times_and_milliseconds() {
        let read = |t: &str| time_filter(Some(t), "since").map_err(|e| e.error);
        assert_eq!(read("1790000000000"), Ok(Some(1_790_000_000_000)));
        assert_eq!(read("2026-09-21T14:13"), Ok(Some(1_789_999_980_000)));
        assert_eq!(read("2026-09-21T14:13:20"), Ok(Some(1_790_000_000_000)));
        assert_eq!(read("2026-09-21"), Ok(Some(1_789_948_800_000)));
        assert_eq!(read("  "), Ok(None));
        assert_eq!(
            read("yesterday"),
            Err("`since` is not a time: `yesterday`".to_owned())
        );
    }

    #[test]
    fn page_links_keep_the_filters() {
        let filters = Filters {
            workflow: Some("a b".to_owned()),
            status: Some("failed".to_owned()),
            ..Filters::default()
        };
        assert_eq!(
            link(&filters, Some(&"17.r-1".to_owned()), 2),
            "/runs?workflow=a+b&status=failed&cursor=17.r-1&page=2"
        );
        assert_eq!(link(&Filters::default(), None, 1), "/runs");
    }
}
