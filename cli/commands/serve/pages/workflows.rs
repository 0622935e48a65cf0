//! `/workflows`: the served workflows with their validation status; `/workflows/{id}`: one workflow's
//! diagnostics (as `archon validate` writes them), its steps by wave, its triggers and their latest
//! firings, and its run form;
//! posting the form starts a run, or shows the form again with each problem next to its input.

use std::fmt::Write as _;

use archon_engine::plan::Plan;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::super::api;
use super::super::app::AppState;
use super::super::auth::Caller;
use super::super::workflows::Served;
use super::form::{self, Given, Problems};
use super::{Nav, Page, encode_path, error_page, escape, problem, see_other};

/// `GET /workflows`.
pub async fn list(State(app): State<AppState>, caller: Caller) -> Response {
    let workflows = api::workflows(&app);
    let mut rows = String::new();
    for w in &workflows {
        let status = if w.valid {
            if w.warnings > 0 {
                format!(
                    r#"<span class="badge status-succeeded"><span aria-hidden="true">✓</span> valid</span> <span class="note">{} warning{}</span>"#,
                    w.warnings,
                    plural(w.warnings)
                )
            } else {
                r#"<span class="badge status-succeeded"><span aria-hidden="true">✓</span> valid</span>"#.to_owned()
            }
        } else {
            format!(
                r#"<span class="badge status-failed"><span aria-hidden="true">✗</span> {} error{}</span>"#,
                w.errors,
                plural(w.errors)
            )
        };
        let _ = writeln!(
            rows,
            r#"<tr><td><a href="/workflows/{}">{}</a></td><td>{}</td><td>{status}</td><td><code>{}</code></td><td><a href="/runs?workflow={}">runs</a></td></tr>"#,
            encode_path(&w.id),
            escape(&w.id),
            escape(w.description.as_deref().unwrap_or_default()),
            escape(&w.path),
            super::encode(&w.name),
        );
    }
    let body = format!(
        r#"<h1>Workflows</h1>
<p>{} workflow{} served.</p>
<table class="list">
<thead><tr><th scope="col">Workflow</th><th scope="col">Description</th><th scope="col">Validation</th><th scope="col">File</th><th scope="col"><span class="visually-hidden">Runs</span></th></tr></thead>
<tbody>
{rows}</tbody>
</table>"#,
        workflows.len(),
        plural(workflows.len())
    );
    Page::new("Workflows", Some(Nav::Workflows), body).response(&caller)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `GET /workflows/{id}`.
pub async fn page(State(app): State<AppState>, caller: Caller, Path(id): Path<String>) -> Response {
    match app.catalog.get(&id) {
        Some(served) => {
            let firings = firings(&app, served).await;
            render(
                &caller,
                served,
                &firings,
                None,
                &Problems::default(),
                StatusCode::OK,
            )
        }
        None => error_page(&caller, &unknown(&id)),
    }
}

fn unknown(id: &str) -> super::super::app::ApiError {
    super::super::app::ApiError::not_found(format!("no workflow `{id}` is served"))
        .with_hint("the workflows page lists them")
}

/// `POST /workflows/{id}`: starts a run with the form's inputs, then shows it; or shows the form again.
pub async fn start(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let Some(served) = app.catalog.get(&id).cloned() else {
        return error_page(&caller, &unknown(&id));
    };
    let given = form::given(&body);
    let firings = firings(&app, &served).await;
    let mut problems = Problems::default();
    let values = form::read(&served.input_schema, &given, &mut problems);
    let Some(workflow) = &served.workflow else {
        problems.general.push(format!(
            "the workflow `{id}` does not validate: it cannot run"
        ));
        return render(
            &caller,
            &served,
            &firings,
            Some(&given),
            &problems,
            StatusCode::UNPROCESSABLE_ENTITY,
        );
    };
    if problems.is_empty() {
        // The engine's checks of the inputs, as for `archon run --input`.
        if let Err(found) = archon_engine::inputs::resolve(&workflow.spec, values.clone(), &[]) {
            problems.attribute(&served.input_schema, found.into_iter().map(|p| p.message));
        }
    }
    if !problems.is_empty() {
        return render(
            &caller,
            &served,
            &firings,
            Some(&given),
            &problems,
            StatusCode::UNPROCESSABLE_ENTITY,
        );
    }
    match app.executor.start_run(&app, &id, values, None).await {
        Ok(started) => see_other(&format!("/runs/{}", super::encode(&started.run_id))),
        Err(error) => {
            let status = error.status_code();
            let mut problems = Problems::default();
            problems.general.push(match &error.hint {
                Some(hint) => format!("{}\nhint: {hint}", error.error),
                None => error.error.clone(),
            });
            render(&caller, &served, &firings, Some(&given), &problems, status)
        }
    }
}

/// The workflow's page, with the form's values and problems when it was posted.
fn render(
    caller: &Caller,
    served: &Served,
    firings: &str,
    given: Option<&Given>,
    problems: &Problems,
    status: StatusCode,
) -> Response {
    let mut body = format!("<h1>Workflow <code>{}</code></h1>\n", escape(&served.id));
    if let Some(description) = &served.description {
        let _ = writeln!(body, r#"<p class="lead">{}</p>"#, escape(description));
    }
    let _ = writeln!(
        body,
        r#"<dl class="facts"><dt>File</dt><dd><code>{}</code></dd><dt>Runs</dt><dd><a href="/runs?workflow={}">its runs</a></dd></dl>"#,
        escape(&served.path.display().to_string()),
        super::encode(&served.name)
    );
    // Validation, as `archon validate` writes it.
    body.push_str(r#"<section aria-labelledby="validation"><h2 id="validation">Validation</h2>"#);
    if served.diagnostics.is_empty() {
        body.push_str(
            r#"<p><span class="badge status-succeeded"><span aria-hidden="true">✓</span> valid</span> no problem found.</p>"#,
        );
    } else {
        let _ = write!(
            body,
            r#"<p>{}</p><pre class="diagnostics">{}</pre>"#,
            if served.errors > 0 {
                format!(
                    r#"<span class="badge status-failed"><span aria-hidden="true">✗</span> {} error{}</span> It cannot run until they are fixed.{}"#,
                    served.errors,
                    plural(served.errors),
                    if served.warnings > 0 {
                        format!(" {} warning{}.", served.warnings, plural(served.warnings))
                    } else {
                        String::new()
                    }
                )
            } else {
                format!(
                    r#"<span class="badge status-succeeded"><span aria-hidden="true">✓</span> valid</span> {} warning{}."#,
                    served.warnings,
                    plural(served.warnings)
                )
            },
            escape(&served.diagnostics)
        );
    }
    body.push_str("</section>\n");
    // Steps by wave, as `archon plan` shows them.
    if let Some(workflow) = &served.workflow {
        let plan = Plan::new(workflow);
        let _ = write!(
            body,
            r#"<section aria-labelledby="steps"><h2 id="steps">Steps</h2><p>{} step{} in {} wave{}: the steps of a wave can run together.</p>"#,
            plan.steps.len(),
            plural(plan.steps.len()),
            plan.waves.len(),
            plural(plan.waves.len())
        );
        body.push_str(&super::graph::svg(&plan, &|_| "pending".to_owned()));
        body.push_str(r#"<ol class="waves">"#);
        for (number, wave) in plan.waves.iter().enumerate() {
            let _ = write!(body, "<li>wave {}<ul>", number + 1);
            for &index in wave {
                let step = &plan.steps[index];
                let mut notes = vec![step.kind.label()];
                if step.foreach {
                    notes.push("for each item".to_owned());
                }
                if step.conditional {
                    notes.push("conditional".to_owned());
                }
                if !step.depends_on.is_empty() {
                    notes.push(format!("after {}", step.depends_on.join(", ")));
                }
                let _ = write!(
                    body,
                    "<li><code>{}</code> {}</li>",
                    escape(&step.id),
                    escape(&notes.join(", "))
                );
            }
            body.push_str("</ul></li>");
        }
        body.push_str("</ol></section>\n");
    }
    body.push_str(&triggers(served));
    body.push_str(firings);
    // The run form.
    body.push_str(r#"<section aria-labelledby="run"><h2 id="run">Run it</h2>"#);
    if served.workflow.is_none() {
        body.push_str(
            "<p>It does not validate: fix its errors (above), then restart the server.</p>",
        );
    } else if !caller.can_operate() {
        body.push_str("<p>Viewers cannot start runs: log in with an operator token to run it.</p>");
    } else {
        let mut general = String::new();
        for message in &problems.general {
            let (message, hint) = match message.split_once("\nhint: ") {
                Some((m, h)) => (m, Some(h)),
                None => (message.as_str(), None),
            };
            general.push_str(&problem(message, hint));
        }
        if !problems.by_input.is_empty() {
            let _ = write!(
                general,
                r#"<p class="problem" role="alert">The run did not start: {} input{} {} a problem, shown next to {}.</p>"#,
                problems.by_input.len(),
                plural(problems.by_input.len()),
                if problems.by_input.len() == 1 {
                    "has"
                } else {
                    "have"
                },
                if problems.by_input.len() == 1 {
                    "it"
                } else {
                    "each"
                }
            );
        }
        let fields = form::fields(&served.input_schema, given, problems);
        let _ = write!(
            body,
            r#"{general}<form method="post" action="/workflows/{}" class="run-form" novalidate>{}
{}<p>{}</p><button type="submit">Start a run</button></form>"#,
            encode_path(&served.id),
            super::super::auth::csrf_field(caller),
            fields,
            if fields.is_empty() {
                "It takes no inputs."
            } else {
                "An empty field takes the input's default."
            }
        );
    }
    body.push_str("</section>\n");
    let title = format!("Workflow {}", served.id);
    (
        status,
        Page::new(title, Some(Nav::Workflows), body).response(caller),
    )
        .into_response()
}

/// The workflow's triggers: each cron schedule with when it fires next, each webhook with its endpoint
/// and how deliveries are authenticated.
fn triggers(served: &Served) -> String {
    let views = super::super::triggers::views(served);
    let mut body =
        String::from(r#"<section aria-labelledby="triggers"><h2 id="triggers">Triggers</h2>"#);
    if views.is_empty() {
        body.push_str(
            "<p>No trigger: it runs when started from here, the API or <code>archon run</code>.</p></section>
",
        );
        return body;
    }
    body.push_str(
        "<table><thead><tr><th>name</th><th>kind</th><th>when</th><th>next</th></tr></thead><tbody>",
    );
    for view in &views {
        let (when, next) = match (&view.cron, &view.endpoint) {
            (Some(cron), _) => {
                let mut when = format!(
                    "<code>{}</code> in {}, overlap <code>{}</code>",
                    escape(cron),
                    escape(view.timezone.as_deref().unwrap_or("UTC")),
                    escape(view.overlap.as_deref().unwrap_or("skip"))
                );
                if let Some(window) = &view.catch_up {
                    let _ = write!(when, ", missed slots within {} caught up", escape(window));
                }
                let next = view.next_fire.as_deref().map_or_else(
                    || "never".to_owned(),
                    |at| format!("<time datetime=\"{0}\">{0}</time>", escape(at)),
                );
                (when, next)
            }
            (None, Some(endpoint)) => {
                let auth: Vec<&str> = [
                    (view.signed == Some(true)).then_some("signed"),
                    (view.token == Some(true)).then_some("bearer token"),
                ]
                .into_iter()
                .flatten()
                .collect();
                (
                    format!(
                        "<code>POST {}</code> ({})",
                        escape(endpoint),
                        escape(&auth.join(", "))
                    ),
                    "on delivery".to_owned(),
                )
            }
            (None, None) => (String::new(), String::new()),
        };
        let _ = write!(
            body,
            "<tr><td><code>{}</code></td><td>{}</td><td>{when}</td><td>{next}</td></tr>",
            escape(&view.name),
            escape(&view.kind)
        );
    }
    body.push_str("</tbody></table></section>\n");
    body
}

/// Most firings a workflow's page shows.
const FIRINGS_SHOWN: usize = 20;

/// The latest firings of the workflow's triggers, newest first, as a section of its page (none when it
/// has no trigger): what each fired, what became of it, its run, why it was skipped or refused.
async fn firings(app: &AppState, served: &Served) -> String {
    if super::super::triggers::views(served).is_empty() {
        return String::new();
    }
    let mut body =
        String::from(r#"<section aria-labelledby="firings"><h2 id="firings">Firings</h2>"#);
    let params = super::super::triggers::FiringsParams {
        workflow: Some(served.name.clone()),
        limit: Some(FIRINGS_SHOWN),
        ..Default::default()
    };
    match super::super::triggers::firings(app, params).await {
        Err(e) => {
            let _ = write!(body, "<p>{}</p>", escape(&e.error));
        }
        Ok(page) if page.firings.is_empty() => body.push_str("<p>None yet.</p>"),
        Ok(page) => {
            let _ = write!(
                body,
                "<p>The latest {FIRINGS_SHOWN} at most, newest first (<code>GET /api/v1/firings?workflow={}</code> has them all).</p>",
                escape(&super::encode(&served.name))
            );
            body.push_str(
                "<table><thead><tr><th>trigger</th><th>slot or delivery</th><th>outcome</th><th>run</th><th>why</th></tr></thead><tbody>",
            );
            for firing in &page.firings {
                let run = firing.run_id.as_deref().map_or_else(
                    || "—".to_owned(),
                    |run| {
                        format!(
                            r#"<a href="/runs/{}"><code>{}</code></a>"#,
                            super::encode(run),
                            escape(run)
                        )
                    },
                );
                let _ = write!(
                    body,
                    "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{run}</td><td>{}</td></tr>",
                    escape(&firing.trigger),
                    escape(&firing.slot),
                    escape(&firing.outcome),
                    escape(firing.reason.as_deref().unwrap_or(""))
                );
            }
            body.push_str("</tbody></table>");
        }
    }
    body.push_str("</section>\n");
    body
}
