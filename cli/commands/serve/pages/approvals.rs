//! `/approvals`: every call waiting for a person's decision, in every run that waits, with its exact
//! arguments (masked, as the run recorded them) and the rule that asked. Approving or denying posts to
//! `/runs/{run}/approvals/{key}/approve` (or `deny`), where `key` is the SHA-256 of the run, step, tool and
//! arguments: a decision holds for exactly the call shown, as with `archon approve`.

use std::fmt::Write as _;

use archon_engine::run::ApprovalDecision;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::Response;

use super::super::api::{self, Approval};
use super::super::app::{ApiError, AppState};
use super::super::auth::{Caller, csrf_field};
use super::{Nav, Page, code_spans, duration, encode, error_page, escape, pretty, see_other, time};

/// The longest reason recorded with a decision, in characters (as the API's).
const MAX_REASON: usize = 4096;

/// `GET /approvals`.
pub async fn list(State(app): State<AppState>, caller: Caller) -> Response {
    let waiting = match api::approvals(&app).await {
        Ok(waiting) => waiting,
        Err(error) => return error_page(&caller, &error),
    };
    let mut region = String::new();
    if waiting.is_empty() {
        region.push_str("<p>No call waits for a decision.</p>");
    } else {
        let _ = write!(
            region,
            "<p>{} call{} wait{} for a decision.</p>",
            waiting.len(),
            if waiting.len() == 1 { "" } else { "s" },
            if waiting.len() == 1 { "s" } else { "" }
        );
        for approval in &waiting {
            region.push_str(&card(&caller, approval, "/approvals"));
        }
    }
    let body = format!(
        r#"<h1>Approvals</h1>
<p class="lead">Calls that a rule or the spec holds until a person decides. A decision is bound to the call's exact arguments (its key is their SHA-256); once no call of a run waits, the run goes on here.</p>
<div id="approvals-region" data-live>{region}</div>"#
    );
    Page::new("Approvals", Some(Nav::Approvals), body)
        .data("page", "approvals")
        .response(&caller)
}

/// One call: where it is, what it would do, why it waits, and the forms that decide it (for operators)
/// or its decision.
pub fn card(caller: &Caller, approval: &Approval, return_to: &str) -> String {
    let mut out = String::new();
    let what = match &approval.tool {
        Some(tool) => format!(
            "<code>{}</code> calls <code>{}</code>",
            escape(&approval.step),
            escape(tool)
        ),
        None => format!("step <code>{}</code>", escape(&approval.step)),
    };
    let _ = write!(
        out,
        r#"<article class="approval" aria-label="Call of {step} in run {run}"><h3>{what} <span class="note">in run <a href="/runs/{run_link}"><code>{run}</code></a></span></h3>
<dl class="facts"><dt>Why</dt><dd>{reason}</dd><dt>Asked</dt><dd>{asked}</dd>"#,
        step = escape(&approval.step),
        run = escape(&approval.run_id),
        run_link = encode(&approval.run_id),
        reason = code_spans(&approval.reason),
        asked = time(approval.requested_at),
    );
    if let Some(timeout) = approval.timeout_ms {
        let _ = write!(
            out,
            "<dt>Timeout</dt><dd>{} after it was asked, then it is {}</dd>",
            duration(timeout),
            if approval.approve_on_timeout {
                "approved"
            } else {
                "denied"
            }
        );
    }
    let _ = write!(
        out,
        r#"<dt>Key</dt><dd><code class="key">{}</code></dd></dl>
<p class="label" id="args-{key_id}">Arguments, exactly as the call would send them (secrets masked):</p>
<pre class="arguments" aria-labelledby="args-{key_id}">{}</pre>"#,
        escape(&approval.key),
        escape(&pretty(&approval.arguments)),
        key_id = escape(&approval.key.chars().take(16).collect::<String>()),
    );
    match &approval.decision {
        Some(decision) => {
            let _ = write!(
                out,
                r#"<p>{} by {}{}{}</p>"#,
                if decision.approved {
                    super::badge("succeeded").replace("succeeded</span>", "approved</span>")
                } else {
                    super::badge("failed").replace("failed</span>", "denied</span>")
                },
                escape(&decision.by),
                decision
                    .decided_at
                    .map_or_else(String::new, |at| format!(" at {}", time(at))),
                decision
                    .reason
                    .as_deref()
                    .filter(|r| !r.trim().is_empty())
                    .map_or_else(String::new, |r| format!(": {}", escape(r)))
            );
        }
        None if caller.can_operate() => {
            let action = format!(
                "/runs/{}/approvals/{}",
                encode(&approval.run_id),
                encode(&approval.key)
            );
            let reason_id = format!("reason-{}", escape(&approval.key));
            let _ = write!(
                out,
                r#"<form method="post" class="decide" action="{action}/approve">{csrf}<input type="hidden" name="return_to" value="{back}">
<div class="field"><label for="{reason_id}">Reason <span class="note">(optional, recorded with the decision)</span></label><input type="text" id="{reason_id}" name="reason" maxlength="{MAX_REASON}"></div>
<button type="submit" class="approve">Approve</button> <button type="submit" class="deny" formaction="{action}/deny">Deny</button></form>"#,
                csrf = csrf_field(caller),
                back = escape(return_to),
            );
        }
        None => out.push_str("<p>Waiting for an operator's decision.</p>"),
    }
    out.push_str("</article>\n");
    out
}

/// `POST /runs/{id}/approvals/{key}/{approve|deny}`: decides the call whose key is `key`, then goes back
/// where the form was (the run resumes here once no call waits).
pub async fn decide(
    State(app): State<AppState>,
    caller: Caller,
    Path((id, key, decision)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let approved = match decision.as_str() {
        "approve" => true,
        "deny" => false,
        other => {
            return error_page(
                &caller,
                &ApiError::not_found(format!("`{other}` is not a decision"))
                    .with_hint("`approve` or `deny`"),
            );
        }
    };
    let mut reason = None;
    let mut return_to = None;
    for (name, value) in form_urlencoded::parse(&body) {
        match &*name {
            "reason" if !value.trim().is_empty() => reason = Some(value.into_owned()),
            "return_to" => return_to = Some(value.into_owned()),
            _ => {}
        }
    }
    if reason
        .as_deref()
        .is_some_and(|r| r.chars().count() > MAX_REASON)
    {
        return error_page(
            &caller,
            &ApiError::bad_request(format!("the reason is longer than {MAX_REASON} characters")),
        );
    }
    let decided = app
        .executor
        .decide(
            &app,
            &id,
            &key,
            ApprovalDecision {
                approved,
                by: caller.by.clone(),
                reason,
            },
        )
        .await;
    match decided {
        Ok(_) => see_other(&local(return_to.as_deref(), &id)),
        Err(error) => error_page(&caller, &error),
    }
}

/// Where to go after a decision: a path of this server, else the run's page.
fn local(return_to: Option<&str>, run: &str) -> String {
    match return_to {
        Some(p) if p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') => p.to_owned(),
        _ => format!("/runs/{}", encode(run)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_decision_goes_back_only_to_this_server() {
        assert_eq!(super::local(Some("/approvals"), "r-1"), "/approvals");
        assert_eq!(super::local(Some("//evil.example"), "r-1"), "/runs/r-1");
        assert_eq!(
            super::local(Some("https://evil.example"), "r-1"),
            "/runs/r-1"
        );
        assert_eq!(super::local(None, "r-1"), "/runs/r-1");
    }
}
