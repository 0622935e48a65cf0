//! `/runs/{id}`: one run. Its facts and error; the actions an operator may take on it (cancel, resume,
//! retry from a step, retry the failed steps); the calls it waits on; its graph by waves with each step's
//! status; a table of its steps with their attempts, durations, LLM usage, outputs (cut, with a link to
//! the whole) and errors; what happened inside steps (delegation trees, a planner's plan, a composite's or
//! sub-workflow's steps); its event trail (Thought / Action / Observation for agents); its logs a page at
//! a time. The script follows the run's event stream from where the page left off: statuses change in
//! place, log pieces are added, and the rest of the page is fetched again when the run moves on.

use std::collections::HashMap;
use std::fmt::Write as _;

use archon_engine::plan::Plan;
use archon_engine::run::{RunEvent, StepResult};
use archon_engine::session::LogChunk;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value as Json;

use super::super::api::{self, RunDetail};
use super::super::app::{ApiError, AppState};
use super::super::auth::{Caller, csrf_field};
use super::super::executor::{How, Options};
use super::runs::status_name;
use super::{
    Nav, Page, badge, data, duration, encode, error_page, escape, pretty, problem, see_other, time,
    truncated,
};

/// Log pieces on a page.
const LOG_PAGE: usize = 500;
/// Events of the trail on the run's page (the trail's own pages show the rest).
const TRAIL_EVENTS: usize = 500;
/// Characters of an output in the steps table.
const OUTPUT_CHARS: usize = 300;
/// Characters of one event's text in the trail.
const EVENT_CHARS: usize = 4000;
/// Characters of an output on a step's page.
const FULL_CHARS: usize = 2_000_000;

#[derive(Debug, Default, Deserialize)]
pub struct RunQuery {
    /// The log page starts after this piece.
    pub logs_after: Option<i64>,
}

/// `GET /runs/{id}`.
pub async fn page(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    query: Result<Query<RunQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let logs_after = query.ok().and_then(|q| q.0.logs_after).unwrap_or(0).max(0);
    match load(&app, &id, logs_after).await {
        Ok(view) => render(&caller, &view, None, StatusCode::OK),
        Err(error) => error_page(&caller, &error),
    }
}

/// What the run's page shows.
struct View {
    detail: RunDetail,
    /// The first events, and whether there are more.
    events: Vec<(i64, Json)>,
    more_events: bool,
    logs: Vec<LogChunk>,
    logs_after: i64,
    plan: Option<Plan>,
    results: Vec<(String, StepResult)>,
}

async fn load(app: &AppState, id: &str, logs_after: i64) -> Result<View, ApiError> {
    // Events and logs are read before the run: whatever the stream sends after them is newer than what
    // the page shows.
    let stored = app.executor.pending(id).is_none();
    let (events, logs) = if stored {
        let mut events = data::events(app, id, 0, TRAIL_EVENTS + 1).await?;
        let more = events.len() > TRAIL_EVENTS;
        events.truncate(TRAIL_EVENTS);
        let logs = data::logs(app, id, logs_after, LOG_PAGE).await?;
        ((events, more), logs)
    } else {
        ((Vec::new(), false), Vec::new())
    };
    let detail = api::run_detail(app, id.to_owned()).await?;
    let plan = data::workflow_of(app, &detail.workflow, &detail.spec_path)
        .await
        .map(|w| Plan::new(&w));
    let results = detail
        .results
        .iter()
        .filter_map(|(name, value)| {
            serde_json::from_value::<StepResult>(value.clone())
                .ok()
                .map(|r| (name.clone(), r))
        })
        .collect();
    Ok(View {
        detail,
        events: events.0,
        more_events: events.1,
        logs,
        logs_after,
        plan,
        results,
    })
}

/// The step a result or attempt name belongs to (`step[3]` is an item of `step`).
fn step_of(name: &str) -> &str {
    archon_engine::resume::step_of(name)
}

impl View {
    fn run_status(&self) -> &'static str {
        status_name(self.detail.status)
    }

    fn result(&self, step: &str) -> Option<&StepResult> {
        self.results
            .iter()
            .find(|(name, _)| name == step)
            .map(|(_, r)| r)
    }

    /// Where a step stands: its result's status, else running (an attempt going on), in doubt (an
    /// attempt that never ended in a run that stopped), waiting (a call of it waits), or not started.
    fn step_status(&self, step: &str) -> String {
        if let Some(result) = self.result(step) {
            return result.status.as_str().to_owned();
        }
        let waiting = self
            .detail
            .approvals
            .iter()
            .any(|a| a.decision.is_none() && step_of(&a.step) == step);
        if waiting && self.run_status() == "waiting_approval" {
            return "waiting_approval".to_owned();
        }
        let open = self
            .detail
            .attempts
            .iter()
            .any(|a| step_of(&a.step) == step && a.status == "running");
        if open {
            return if self.run_status() == "running" {
                "running".to_owned()
            } else {
                "in_doubt".to_owned()
            };
        }
        "pending".to_owned()
    }

    /// The steps in the spec's order (or as the run recorded them when the spec is not known), with
    /// any the run recorded that the spec does not name.
    fn steps(&self) -> Vec<String> {
        let mut steps: Vec<String> = self
            .plan
            .as_ref()
            .map(|p| p.steps.iter().map(|s| s.id.clone()).collect())
            .unwrap_or_default();
        let recorded = self
            .results
            .iter()
            .map(|(n, _)| n.as_str())
            .chain(self.detail.attempts.iter().map(|a| a.step.as_str()));
        for name in recorded {
            let step = step_of(name);
            if !steps.iter().any(|s| s == step) {
                steps.push(step.to_owned());
            }
        }
        steps
    }
}

fn render(caller: &Caller, view: &View, trouble: Option<&ApiError>, code: StatusCode) -> Response {
    let detail = &view.detail;
    let status = view.run_status();
    let id = &detail.id;
    let mut body = format!(
        r#"<h1>Run <code>{}</code> <span id="run-status" data-live-status>{}</span></h1>
"#,
        escape(id),
        badge(status)
    );
    if let Some(error) = trouble {
        body.push_str(&problem(&error.error, error.hint.as_deref()));
    }
    body.push_str(r#"<div id="run-facts" data-live>"#);
    body.push_str(&facts(view));
    body.push_str("</div>\n");
    if caller.can_operate() {
        let _ = writeln!(
            body,
            r#"<section aria-labelledby="actions-h" id="actions" data-live><h2 id="actions-h">Actions</h2>{}</section>"#,
            actions(caller, view)
        );
    }
    let _ = writeln!(
        body,
        r#"<section aria-labelledby="approvals-h" id="run-approvals" data-live>{}</section>"#,
        approvals(caller, view)
    );
    let _ = writeln!(
        body,
        r#"<section aria-labelledby="graph-h" id="graph" data-live><h2 id="graph-h">Graph</h2>{}</section>"#,
        graph(view)
    );
    let _ = writeln!(
        body,
        r#"<section aria-labelledby="steps-h" id="steps" data-live><h2 id="steps-h">Steps</h2>{}</section>"#,
        steps_table(view)
    );
    let inside = inside(view);
    let _ = writeln!(
        body,
        r#"<section aria-labelledby="inside-h" id="inside" data-live>{}</section>"#,
        if inside.is_empty() {
            String::new()
        } else {
            format!(r#"<h2 id="inside-h">Inside the steps</h2>{inside}"#)
        }
    );
    let _ = writeln!(
        body,
        r#"<section aria-labelledby="trail-h" id="trail" data-live><h2 id="trail-h">Event trail</h2>{}</section>"#,
        trail(view)
    );
    body.push_str(&logs(view));
    let events_after = view.events.last().map_or(0, |(seq, _)| *seq);
    let logs_after = view.logs.last().map_or(view.logs_after, |l| l.seq);
    let follow = view.logs.len() < LOG_PAGE;
    let page = Page::new(format!("Run {id}"), Some(Nav::Runs), body)
        .data("page", "run")
        .data("run", id.clone())
        .data("events-after", events_after.to_string())
        .data("logs-after", logs_after.to_string())
        .data("follow", if follow { "yes" } else { "no" })
        .data("status", status);
    (code, page.response(caller)).into_response()
}

fn facts(view: &View) -> String {
    let d = &view.detail;
    let mut out = String::from(r#"<dl class="facts">"#);
    let _ = write!(
        out,
        r#"<dt>Workflow</dt><dd><a href="/runs?workflow={}">{}</a> <span class="note"><code>{}</code></span></dd>"#,
        encode(&d.workflow),
        escape(&d.workflow),
        escape(&d.spec_path)
    );
    let _ = write!(out, "<dt>Started</dt><dd>{}</dd>", time(d.started_at));
    if let Some(finished) = d.finished_at {
        let _ = write!(
            out,
            "<dt>Finished</dt><dd>{} (took {})</dd>",
            time(finished),
            duration(finished.saturating_sub(d.started_at))
        );
    }
    if d.generation > 0 {
        let _ = write!(
            out,
            "<dt>Retried</dt><dd>{} time{}</dd>",
            d.generation,
            if d.generation == 1 { "" } else { "s" }
        );
    }
    if let Some(queued) = &d.queued {
        let _ = write!(
            out,
            "<dt>Queue</dt><dd>place {} on this server, to {}: {}</dd>",
            queued.position,
            escape(&queued.action.replace('_', " ")),
            escape(&queued.reason)
        );
    }
    if let Some(trigger) = &d.trigger {
        let _ = write!(
            out,
            "<dt>Trigger</dt><dd><code>{}</code> <code>{}</code></dd>",
            escape(&trigger.name),
            escape(&trigger.detail.to_string())
        );
    }
    if d.executing_here {
        out.push_str("<dt>Where</dt><dd>this server runs it</dd>");
    } else if let Some(owner) = &d.owner {
        let _ = write!(
            out,
            "<dt>Where</dt><dd>process {} on <code>{}</code></dd>",
            escape(&owner.get("pid").map(Json::to_string).unwrap_or_default()),
            escape(owner.get("host").and_then(Json::as_str).unwrap_or_default())
        );
    }
    let u = &d.usage;
    if u.calls > 0 {
        let cost = if u.unpriced_calls >= u.calls {
            String::new()
        } else {
            format!(", ${:.4}", u.cost_usd)
        };
        let _ = write!(
            out,
            "<dt>LLM usage</dt><dd>{} call{}, {} tokens in ({} cached), {} out{cost}{}</dd>",
            u.calls,
            if u.calls == 1 { "" } else { "s" },
            u.input_tokens,
            u.cached_input_tokens,
            u.output_tokens,
            if u.unpriced_calls > 0 && u.unpriced_calls < u.calls {
                format!(
                    " ({} calls of models without a known price)",
                    u.unpriced_calls
                )
            } else {
                String::new()
            }
        );
    }
    out.push_str("</dl>\n");
    if let Some(error) = &d.error {
        let _ = write!(
            out,
            r#"<p class="problem" role="alert">{}</p>"#,
            escape(error)
        );
    }
    if !d.inputs.is_empty() {
        let _ = write!(
            out,
            r#"<details><summary>Inputs</summary><pre>{}</pre></details>"#,
            escape(&pretty(&Json::Object(d.inputs.clone())))
        );
    }
    if !d.outputs.is_empty() {
        let text = pretty(&Json::Object(d.outputs.clone()));
        let (shown, cut) = truncated(&text, FULL_CHARS);
        let _ = write!(
            out,
            r#"<h2>Outputs</h2><pre class="outputs">{}{}</pre>"#,
            escape(shown),
            if cut {
                "\n[… cut: `archon show --json` has the whole]"
            } else {
                ""
            }
        );
    }
    out
}

fn actions(caller: &Caller, view: &View) -> String {
    let status = view.run_status();
    let id = encode(&view.detail.id);
    let csrf = csrf_field(caller);
    let mut out = String::new();
    let options = |prefix: &str| {
        format!(
            r#"<div class="options"><input type="checkbox" id="{prefix}-doubt" name="rerun_in_doubt" value="yes"> <label for="{prefix}-doubt">run again steps in doubt</label> <input type="checkbox" id="{prefix}-changed" name="allow_changed_spec" value="yes"> <label for="{prefix}-changed">accept a changed spec</label></div>"#
        )
    };
    let waiting_calls = view.detail.approvals.iter().any(|a| a.decision.is_none());
    if status == "interrupted" || (status == "waiting_approval" && !waiting_calls) {
        let _ = write!(
            out,
            r#"<form method="post" action="/runs/{id}/resume" class="action">{csrf}<button type="submit">Resume</button> <span class="note">continues where it stopped; finished steps do not run again</span>{}</form>"#,
            options("resume")
        );
    }
    if matches!(status, "failed" | "interrupted") {
        let _ = write!(
            out,
            r#"<form method="post" action="/runs/{id}/retry" class="action">{csrf}<button type="submit">Retry failed steps</button> <span class="note">the failed steps and those skipped because of them</span>{}</form>"#,
            options("failed")
        );
    }
    if matches!(status, "succeeded" | "failed" | "interrupted") {
        let steps = view.steps();
        if !steps.is_empty() {
            let mut choices = String::new();
            for step in &steps {
                let _ = write!(choices, r#"<option value="{0}">{0}</option>"#, escape(step));
            }
            let _ = write!(
                out,
                r#"<form method="post" action="/runs/{id}/retry" class="action">{csrf}<label for="retry-from">Retry from step</label> <select id="retry-from" name="from">{choices}</select> <button type="submit">Retry from here</button> <span class="note">the step and everything after it</span>{}</form>"#,
                options("from")
            );
        }
    }
    if matches!(
        status,
        "running" | "waiting_approval" | "interrupted" | "queued"
    ) {
        let _ = write!(
            out,
            r#"<form method="post" action="/runs/{id}/cancel" class="action">{csrf}<button type="submit" class="danger">Cancel</button> <span class="note">stops it for good</span></form>"#
        );
    }
    if out.is_empty() {
        out.push_str("<p>Nothing to do: the run ended.</p>");
    }
    out
}

fn approvals(caller: &Caller, view: &View) -> String {
    if view.detail.approvals.is_empty() {
        return String::new();
    }
    let waiting = view
        .detail
        .approvals
        .iter()
        .filter(|a| a.decision.is_none())
        .count();
    let mut out = format!(
        r#"<h2 id="approvals-h">Approvals</h2><p>{} call{} asked for approval; {} wait{}.</p>"#,
        view.detail.approvals.len(),
        if view.detail.approvals.len() == 1 {
            ""
        } else {
            "s"
        },
        waiting,
        if waiting == 1 { "s" } else { "" }
    );
    let back = format!("/runs/{}", encode(&view.detail.id));
    // Waiting ones first.
    for approval in view
        .detail
        .approvals
        .iter()
        .filter(|a| a.decision.is_none())
        .chain(
            view.detail
                .approvals
                .iter()
                .filter(|a| a.decision.is_some()),
        )
    {
        out.push_str(&super::approvals::card(caller, approval, &back));
    }
    out
}

fn graph(view: &View) -> String {
    match &view.plan {
        Some(plan) => super::graph::svg(plan, &|step| view.step_status(step)),
        None => r#"<p class="note">The run's spec is not served and cannot be read now: the steps table lists what it recorded.</p>"#.to_owned(),
    }
}

fn steps_table(view: &View) -> String {
    let steps = view.steps();
    if steps.is_empty() {
        return "<p>No step has started yet.</p>".to_owned();
    }
    let run = &view.detail.id;
    let mut attempts: HashMap<&str, Vec<&api::Attempt>> = HashMap::new();
    for attempt in &view.detail.attempts {
        attempts
            .entry(step_of(&attempt.step))
            .or_default()
            .push(attempt);
    }
    let kinds: HashMap<&str, String> = view
        .plan
        .iter()
        .flat_map(|p| p.steps.iter())
        .map(|s| (s.id.as_str(), s.kind.label()))
        .collect();
    let mut out = String::from(
        r#"<table class="list steps"><thead><tr><th scope="col">Step</th><th scope="col">Status</th><th scope="col">Attempts</th><th scope="col">Took</th><th scope="col">LLM</th><th scope="col">Output or error</th></tr></thead><tbody>
"#,
    );
    for step in &steps {
        let status = view.step_status(step);
        let result = view.result(step);
        let tried = attempts
            .get(step.as_str())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let took = result.map_or_else(String::new, |r| duration(r.duration_ms));
        let llm = result
            .and_then(|r| r.llm.as_ref())
            .map_or_else(String::new, usage);
        let shown = match result {
            Some(r) => match &r.error {
                Some(error) => format!(
                    r#"<span class="error-text">{}</span>"#,
                    escape(
                        &archon_engine::text::error_line(error, run, step)
                            .unwrap_or_else(|| error.clone())
                    )
                ),
                None => output_cell(run, step, r),
            },
            None => match view.detail.waiting.iter().find(|w| &w.step == step) {
                // A step of a submitted run that no worker has taken, and why.
                Some(waiting) => format!(
                    r#"<span class="note">waiting: {}</span>"#,
                    escape(&waiting.reason)
                ),
                None => tried
                    .iter()
                    .rev()
                    .find_map(|a| a.error.as_deref())
                    .map_or_else(String::new, |e| {
                        format!(
                            r#"<span class="error-text">last attempt: {}</span>"#,
                            escape(truncated(e, OUTPUT_CHARS).0)
                        )
                    }),
            },
        };
        let mut notes = Vec::new();
        if let Some(kind) = kinds.get(step.as_str()) {
            notes.push(escape(kind));
        }
        if let Some(r) = result {
            if r.fallback {
                notes.push("fallback".to_owned());
            }
            if let Some(cached) = &r.cached {
                notes.push(format!(
                    "cached from run <a href=\"/runs/{}\"><code>{}</code></a>",
                    encode(&cached.run),
                    escape(&cached.run)
                ));
            }
        }
        let items = view
            .results
            .iter()
            .filter(|(name, _)| {
                name.starts_with(step.as_str()) && step_of(name) == step && name != step
            })
            .count();
        if items > 0 {
            notes.push(format!("{items} item{}", if items == 1 { "" } else { "s" }));
        }
        let _ = writeln!(
            out,
            r#"<tr id="step-{anchor}"><th scope="row"><code>{id}</code><br><span class="note">{notes}</span></th><td class="step-status" data-step="{id}">{badge}</td><td>{attempts}</td><td>{took}</td><td>{llm}</td><td>{shown}</td></tr>"#,
            anchor = encode(step),
            id = escape(step),
            notes = notes.join(", "),
            badge = badge(&status),
            attempts = attempts_cell(tried),
        );
    }
    out.push_str("</tbody></table>\n");
    out
}

/// What LLM calls used, short.
fn usage(llm: &archon_engine::run::LlmUsage) -> String {
    let cost = if llm.unpriced_calls >= llm.calls.saturating_sub(llm.failed_calls) {
        String::new()
    } else {
        format!(", ${:.4}", llm.cost_usd)
    };
    format!(
        "{} call{}, {} tokens in, {} out{cost}",
        llm.calls,
        if llm.calls == 1 { "" } else { "s" },
        llm.input_tokens,
        llm.output_tokens
    )
}

fn output_cell(run: &str, step: &str, result: &StepResult) -> String {
    let text = match &result.output {
        Json::Null => return String::new(),
        Json::String(s) => s.clone(),
        other => other.to_string(),
    };
    let (shown, cut) = truncated(&text, OUTPUT_CHARS);
    let link = format!(r#"/runs/{}/step?name={}"#, encode(run), encode(step));
    format!(
        r#"<code class="output">{}</code>{}"#,
        escape(shown),
        if cut {
            format!(r#"… <a href="{}">the whole output</a>"#, escape(&link))
        } else {
            format!(r#" <a class="more" href="{}">details</a>"#, escape(&link))
        }
    )
}

fn attempts_cell(attempts: &[&api::Attempt]) -> String {
    if attempts.is_empty() {
        return "0".to_owned();
    }
    let mut rows = String::new();
    for a in attempts {
        let took = a.ended_at.map_or_else(String::new, |end| {
            duration(end.saturating_sub(a.started_at))
        });
        let _ = write!(
            rows,
            "<tr><td><code>{}</code> #{}{}</td><td>{}</td><td>{}</td><td>{took}</td><td>{}</td></tr>",
            escape(&a.step),
            a.attempt,
            if a.fallback { " (fallback)" } else { "" },
            if a.generation > 0 {
                format!("retry {}", a.generation)
            } else {
                "first run".to_owned()
            },
            badge(if a.status == "running" {
                "running"
            } else {
                a.status.as_str()
            }),
            escape(
                a.error
                    .as_deref()
                    .map(|e| truncated(e, 500).0)
                    .unwrap_or_default()
            )
        );
    }
    format!(
        r#"<details><summary>{}</summary><table class="attempts"><thead><tr><th scope="col">Attempt</th><th scope="col">Of</th><th scope="col">Status</th><th scope="col">Took</th><th scope="col">Error</th></tr></thead><tbody>{rows}</tbody></table></details>"#,
        attempts.len()
    )
}

/// Delegation trees, planners' plans and nested steps, for each step that has any.
fn inside(view: &View) -> String {
    let mut out = String::new();
    for (name, result) in &view.results {
        if result.steps.is_empty() || name.contains('[') {
            continue;
        }
        let delegations = result.steps.keys().any(|n| n.contains('#'));
        let heading = if result.plan.is_some() {
            "the plan it made and ran"
        } else if delegations {
            "who its agent asked (delegations)"
        } else {
            "its own steps"
        };
        let _ = write!(
            out,
            r#"<h3><code>{}</code>: {heading}</h3><ul class="tree">{}</ul>"#,
            escape(name),
            tree(result)
        );
        if let Some(plan) = &result.plan {
            let _ = write!(
                out,
                r#"<details><summary>The plan as a spec</summary><pre>{}</pre></details>"#,
                escape(&pretty(plan))
            );
        }
    }
    out
}

fn tree(result: &StepResult) -> String {
    let mut out = String::new();
    for (name, nested) in &result.steps {
        let status = nested.status.as_str();
        let _ = write!(
            out,
            r#"<li><code>{}</code> {}{}"#,
            escape(name),
            badge(status),
            nested.llm.as_ref().map_or_else(String::new, |llm| format!(
                r#" <span class="note">{}, {}</span>"#,
                usage(llm),
                duration(nested.duration_ms)
            ))
        );
        if let Some(task) = &nested.task {
            let _ = write!(
                out,
                r#"<div class="task"><span class="label">task</span> {}</div>"#,
                escape(truncated(task.trim(), 500).0)
            );
        }
        match &nested.error {
            Some(error) => {
                let _ = write!(
                    out,
                    r#"<div class="error-text"><span class="label">error</span> {}</div>"#,
                    escape(truncated(error.trim(), 500).0)
                );
            }
            None if nested.task.is_some() => {
                let _ = write!(
                    out,
                    r#"<div><span class="label">answer</span> {}</div>"#,
                    escape(truncated(nested.text.trim(), 500).0)
                );
            }
            None => {}
        }
        if !nested.steps.is_empty() {
            let _ = write!(out, r#"<ul class="tree">{}</ul>"#, tree(nested));
        }
        out.push_str("</li>");
    }
    out
}

/// The trail of `events`, times from the run's start.
fn trail_rows(events: &[(i64, Json)], start: u64) -> String {
    let mut out = String::from(r#"<ol class="trail">"#);
    for (seq, raw) in events {
        let at = raw
            .get("at_ms")
            .and_then(Json::as_u64)
            .map_or_else(String::new, |ms| {
                let ms = ms.saturating_sub(start);
                format!("{}.{:03}s", ms / 1000, ms % 1000)
            });
        let (label, text, depth) = match serde_json::from_value::<RunEvent>(raw.clone()) {
            Ok(event) => {
                let (label, text) = crate::trail::describe(&event);
                let depth = crate::trail::delegation_depth(
                    raw.get("step").and_then(Json::as_str).unwrap_or_default(),
                );
                (label, text, depth)
            }
            Err(_) => ("event", raw.to_string(), 0),
        };
        let (shown, cut) = truncated(&text, EVENT_CHARS);
        let class: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let _ = write!(
            out,
            r#"<li class="ev ev-{class} depth-{depth}" value="{seq}"><span class="at">{at}</span> <span class="label">{label}</span> <span class="text">{}{}</span></li>"#,
            escape(shown),
            if cut {
                format!(
                    " [… {} more characters]",
                    text.chars().count() - EVENT_CHARS
                )
            } else {
                String::new()
            },
            depth = depth.min(9),
            label = escape(label),
        );
    }
    out.push_str("</ol>");
    out
}

fn trail(view: &View) -> String {
    if view.events.is_empty() {
        return "<p>No event yet.</p>".to_owned();
    }
    let mut out = String::from(
        r#"<p class="note">What the run did, as <code>archon show --events</code> tells it: steps starting and ending, and for agents each Thought, Action and Observation.</p>"#,
    );
    out.push_str(&trail_rows(&view.events, view.detail.started_at));
    if view.more_events {
        let last = view.events.last().map_or(0, |(s, _)| *s);
        let _ = write!(
            out,
            r#"<p><a href="/runs/{}/trail?after={last}">Later events »</a></p>"#,
            encode(&view.detail.id)
        );
    }
    out
}

fn logs(view: &View) -> String {
    let id = encode(&view.detail.id);
    let mut out =
        String::from(r#"<section aria-labelledby="logs-h" id="logs"><h2 id="logs-h">Logs</h2>"#);
    let mut nav = Vec::new();
    if view.logs_after > 0 {
        nav.push(format!(
            r##"<a href="/runs/{id}#logs">« From the start</a>"##
        ));
    }
    if view.logs.len() >= LOG_PAGE {
        let last = view.logs.last().map_or(0, |l| l.seq);
        nav.push(format!(
            r##"<a href="/runs/{id}?logs_after={last}#logs" rel="next">Later output »</a>"##
        ));
    }
    let follow = view.logs.len() < LOG_PAGE;
    let _ = write!(
        out,
        r#"<p class="note" id="log-state">{}</p>"#,
        match (view.logs.is_empty(), follow) {
            (true, _) if view.logs_after == 0 => "No command has written anything yet.",
            (true, _) => "Nothing after this point yet.",
            (false, true) => "What the run's commands wrote, oldest first.",
            (false, false) =>
                "What the run's commands wrote, oldest first; later output is on the next page.",
        }
    );
    out.push_str(r#"<div class="log" id="log" role="log" aria-live="off" tabindex="0">"#);
    for piece in &view.logs {
        out.push_str(&log_line(piece));
    }
    out.push_str("</div>");
    if !nav.is_empty() {
        let _ = write!(
            out,
            r#"<nav class="pages" aria-label="Log pages">{}</nav>"#,
            nav.join(" ")
        );
    }
    out.push_str("</section>\n");
    out
}

fn log_line(piece: &LogChunk) -> String {
    let stream = match piece.stream {
        archon_engine::tools::Stream::Stdout => "stdout",
        archon_engine::tools::Stream::Stderr => "stderr",
    };
    format!(
        r#"<div class="log-line stream-{stream}" data-seq="{}"><span class="log-src">{}#{} {stream}</span><span class="log-text">{}</span></div>"#,
        piece.seq,
        escape(&piece.source),
        piece.attempt,
        escape(&piece.text)
    )
}

#[derive(Debug, Default, Deserialize)]
pub struct StepQuery {
    pub name: Option<String>,
}

/// `GET /runs/{id}/step?name=STEP`: a step's (or a `foreach` item's) whole result and its attempts.
pub async fn step_page(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<StepQuery>,
) -> Response {
    let Some(name) = query.name.filter(|n| !n.is_empty()) else {
        return error_page(
            &caller,
            &ApiError::bad_request("`name` is missing").with_hint("the run's page links each step"),
        );
    };
    let detail = match api::run_detail(&app, id.clone()).await {
        Ok(detail) => detail,
        Err(error) => return error_page(&caller, &error),
    };
    let result = detail
        .results
        .get(&name)
        .and_then(|v| serde_json::from_value::<StepResult>(v.clone()).ok());
    let attempts: Vec<&api::Attempt> = detail
        .attempts
        .iter()
        .filter(|a| a.step == name || step_of(&a.step) == name)
        .collect();
    if result.is_none() && attempts.is_empty() {
        return error_page(
            &caller,
            &ApiError::not_found(format!("run `{id}` has no step `{name}`")),
        );
    }
    let mut body = format!(
        r#"<p><a href="/runs/{}#steps">« Run <code>{}</code></a></p><h1>Step <code>{}</code></h1>"#,
        encode(&id),
        escape(&id),
        escape(&name)
    );
    if let Some(result) = &result {
        let _ = write!(
            body,
            r#"<dl class="facts"><dt>Status</dt><dd>{}</dd><dt>Took</dt><dd>{}</dd>{}{}</dl>"#,
            badge(result.status.as_str()),
            duration(result.duration_ms),
            result
                .exit_code
                .map_or_else(String::new, |c| format!("<dt>Exit code</dt><dd>{c}</dd>")),
            result.llm.as_ref().map_or_else(String::new, |l| format!(
                "<dt>LLM</dt><dd>{}</dd>",
                usage(l)
            ))
        );
        if let Some(error) = &result.error {
            let _ = write!(
                body,
                r#"<h2>Error</h2><pre class="error-text">{}</pre>"#,
                escape(truncated(error, FULL_CHARS).0)
            );
        }
        let output = pretty(&result.output);
        let (shown, cut) = truncated(&output, FULL_CHARS);
        let _ = write!(
            body,
            r#"<h2>Output</h2><pre class="outputs">{}{}</pre>"#,
            escape(shown),
            if cut {
                "\n[… cut: `archon show RUN --json` has the whole]"
            } else {
                ""
            }
        );
        if !result.outputs.is_empty() {
            let _ = write!(
                body,
                r#"<h2>Named outputs</h2><pre>{}</pre>"#,
                escape(truncated(&pretty(&Json::Object(result.outputs.clone())), FULL_CHARS).0)
            );
        }
        if !result.text.is_empty() && result.text != shown {
            let _ = write!(
                body,
                r#"<h2>As a model reads it</h2><pre>{}</pre>"#,
                escape(truncated(&result.text, FULL_CHARS).0)
            );
        }
    }
    let _ = write!(body, "<h2>Attempts</h2>{}", attempts_cell(&attempts));
    Page::new(format!("Step {name} of run {id}"), Some(Nav::Runs), body).response(&caller)
}

#[derive(Debug, Default, Deserialize)]
pub struct TrailQuery {
    pub after: Option<i64>,
}

/// `GET /runs/{id}/trail?after=N`: the run's event trail a page at a time.
pub async fn trail_page(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<TrailQuery>,
) -> Response {
    let after = query.after.unwrap_or(0).max(0);
    let mut events = match data::events(&app, &id, after, TRAIL_EVENTS + 1).await {
        Ok(events) => events,
        Err(error) => return error_page(&caller, &error),
    };
    let more = events.len() > TRAIL_EVENTS;
    events.truncate(TRAIL_EVENTS);
    let start = match api::run_detail(&app, id.clone()).await {
        Ok(detail) => detail.started_at,
        Err(error) => return error_page(&caller, &error),
    };
    let mut body = format!(
        r#"<p><a href="/runs/{}#trail">« Run <code>{}</code></a></p><h1>Event trail of <code>{}</code></h1>{}"#,
        encode(&id),
        escape(&id),
        escape(&id),
        trail_rows(&events, start)
    );
    let mut nav = Vec::new();
    if after > 0 {
        nav.push(format!(
            r#"<a href="/runs/{}/trail">« From the start</a>"#,
            encode(&id)
        ));
    }
    if more {
        let last = events.last().map_or(after, |(s, _)| *s);
        nav.push(format!(
            r#"<a href="/runs/{}/trail?after={last}" rel="next">Later events »</a>"#,
            encode(&id)
        ));
    }
    if !nav.is_empty() {
        let _ = write!(
            body,
            r#"<nav class="pages" aria-label="Pages">{}</nav>"#,
            nav.join(" ")
        );
    }
    Page::new(format!("Events of run {id}"), Some(Nav::Runs), body).response(&caller)
}

/// The options of a resume or retry form.
fn form_options(body: &[u8]) -> (Options, Option<String>) {
    let mut options = Options::default();
    let mut from = None;
    for (name, value) in form_urlencoded::parse(body) {
        match &*name {
            "rerun_in_doubt" => options.rerun_in_doubt = true,
            "allow_changed_spec" => options.allow_changed_spec = true,
            "from" if !value.is_empty() => from = Some(value.into_owned()),
            _ => {}
        }
    }
    (options, from)
}

/// After an action: the run's page, or, when it was refused, the page with why.
async fn after_action(
    app: &AppState,
    caller: &Caller,
    id: &str,
    done: Result<(), ApiError>,
) -> Response {
    match done {
        Ok(()) => see_other(&format!("/runs/{}", encode(id))),
        Err(error) => match load(app, id, 0).await {
            Ok(view) => render(caller, &view, Some(&error), error.status_code()),
            Err(_) => error_page(caller, &error),
        },
    }
}

/// `POST /runs/{id}/cancel`.
pub async fn cancel(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Response {
    let done = app.executor.cancel(&app, &id).await.map(|_| ());
    after_action(&app, &caller, &id, done).await
}

/// `POST /runs/{id}/resume`.
pub async fn resume(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (options, _) = form_options(&body);
    let done = app
        .executor
        .continue_run(&app, &id, How::Resume, options)
        .await
        .map(|_| ());
    after_action(&app, &caller, &id, done).await
}

/// `POST /runs/{id}/retry`: from the step `from`, or the failed steps without it.
pub async fn retry(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (options, from) = form_options(&body);
    let how = match from {
        Some(step) => How::From { step },
        None => How::Failed,
    };
    let done = app
        .executor
        .continue_run(&app, &id, how, options)
        .await
        .map(|_| ());
    after_action(&app, &caller, &id, done).await
}

// Shown for the legend's sake in tests: every status a node can take has a word.
#[cfg(test)]
mod tests {
    use super::super::{status_class, status_label, status_symbol};
    use super::*;

    #[test]
    fn every_step_status_reads_as_a_word() {
        for status in [
            "pending",
            "running",
            "in_doubt",
            "waiting_approval",
            "succeeded",
            "failed",
            "timed_out",
            "skipped",
            "cancelled",
            "stuck",
            "incomplete",
        ] {
            assert_ne!(status_label(status), "unknown", "{status}");
            assert_ne!(status_class(status), "status-unknown", "{status}");
            assert!(!status_symbol(status).is_empty());
        }
    }

    #[test]
    fn a_forms_options_are_read() {
        let (options, from) = form_options(b"csrf=x&rerun_in_doubt=yes&from=build");
        assert!(options.rerun_in_doubt);
        assert!(!options.allow_changed_spec);
        assert_eq!(from.as_deref(), Some("build"));
        let (_, from) = form_options(b"csrf=x&from=");
        assert_eq!(from, None);
    }

    #[test]
    fn log_lines_are_escaped() {
        let line = log_line(&LogChunk {
            seq: 3,
            step: "s".to_owned(),
            attempt: 1,
            source: "s".to_owned(),
            stream: archon_engine::tools::Stream::Stderr,
            text: "<b>hi</b>\n".to_owned(),
            at_ms: 0,
        });
        assert_eq!(
            line,
            r#"<div class="log-line stream-stderr" data-seq="3"><span class="log-src">s#1 stderr</span><span class="log-text">&lt;b&gt;hi&lt;/b&gt;
</span></div>"#
        );
    }
    /// A stored result as JSON, with `extra` fields.
    fn result(status: &str, extra: serde_json::Value) -> StepResult {
        let mut value = serde_json::json!({
            "status": status, "output": null, "text": "", "outputs": {}, "error": null,
            "attempts": 1, "exit_code": null, "duration_ms": 1200, "fallback": false,
        });
        if let (Some(base), Some(more)) = (value.as_object_mut(), extra.as_object()) {
            base.extend(more.clone());
        }
        serde_json::from_value(value).expect("a step result")
    }

    #[test]
    fn a_delegation_tree_shows_each_task_answer_error_and_cost_nested() {
        let llm = serde_json::json!({"calls": 2, "input_tokens": 300, "output_tokens": 40,
            "cached_input_tokens": 0, "cost_usd": 0.0021, "unpriced_calls": 0});
        let step = result(
            "succeeded",
            serde_json::json!({
                "llm": llm,
                "steps": {
                    "researcher#1.1": {
                        "status": "succeeded", "output": null, "text": "Paris <b>", "outputs": {},
                        "error": null, "attempts": 1, "exit_code": null, "duration_ms": 800,
                        "fallback": false, "task": "find the capital", "llm": llm,
                        "steps": {
                            "checker#1.1": {
                                "status": "failed", "output": null, "text": "", "outputs": {},
                                "error": "no source", "attempts": 1, "exit_code": null,
                                "duration_ms": 5, "fallback": false, "task": "check it"
                            }
                        }
                    }
                }
            }),
        );
        assert_eq!(
            tree(&step),
            concat!(
                r#"<li><code>researcher#1.1</code> <span class="badge status-succeeded"><span aria-hidden="true">✓</span> succeeded</span> <span class="note">2 calls, 300 tokens in, 40 out, $0.0021, 800 ms</span>"#,
                r#"<div class="task"><span class="label">task</span> find the capital</div><div><span class="label">answer</span> Paris &lt;b&gt;</div>"#,
                r#"<ul class="tree"><li><code>checker#1.1</code> <span class="badge status-failed"><span aria-hidden="true">✗</span> failed</span>"#,
                r#"<div class="task"><span class="label">task</span> check it</div><div class="error-text"><span class="label">error</span> no source</div></li></ul></li>"#,
            )
        );
    }

    #[test]
    fn the_trail_reads_thought_action_observation_from_the_runs_start() {
        let events = vec![
            (
                1,
                serde_json::json!({"event": "agent_thought", "step": "ask", "iteration": 1, "text": "I should add", "at_ms": 1_250}),
            ),
            (
                2,
                serde_json::json!({"event": "agent_action", "step": "ask", "iteration": 1, "tool": "calculator", "arguments": {"expression": "1+1"}, "at_ms": 1_300}),
            ),
            (
                3,
                serde_json::json!({"event": "agent_observation", "step": "ask", "iteration": 1, "tool": "calculator", "text": "<2>", "error": false, "at_ms": 1_400}),
            ),
        ];
        assert_eq!(
            trail_rows(&events, 1_000),
            concat!(
                r#"<ol class="trail">"#,
                r#"<li class="ev ev-thought depth-0" value="1"><span class="at">0.250s</span> <span class="label">thought</span> <span class="text">ask #1: I should add</span></li>"#,
                r#"<li class="ev ev-action depth-0" value="2"><span class="at">0.300s</span> <span class="label">action</span> <span class="text">ask #1: calculator {&quot;expression&quot;:&quot;1+1&quot;}</span></li>"#,
                r#"<li class="ev ev-observed depth-0" value="3"><span class="at">0.400s</span> <span class="label">observed</span> <span class="text">ask #1: calculator -&gt;
&lt;2&gt;</span></li>"#,
                "</ol>"
            )
        );
    }
}
