//! Where rules and approvals stop a call: [`gate`] asks the rules about an event and, when they say
//! `ask`, finds the decision (recorded by `archon approve`, `--yes`, a person at the terminal) or pauses the
//! step until there is one.

use serde_json::Value as Json;

use super::context::Shared;
use super::durable::{PersistError, Record, persist};
use crate::report::{ApprovalDecision, ApprovalRequest, RunEvent};
use crate::run::rules::{self, Event, Verdict};
use crate::spec::{Action, ChosenBy, Trigger};
use crate::store::Entry;

/// What a call may do.
#[derive(Debug)]
pub(super) enum Gate {
    /// Go on; the argument paths to hide in what the run records.
    Go { redact: Vec<String> },
    /// A rule or a person said no: why, and the argument paths to hide where the call is recorded.
    Denied(String, Vec<String>),
    /// Waiting for a person: the run pauses.
    Waiting(String),
    /// The request or decision could not be recorded: the run stops (`durable`), the call fails with this.
    Stopped(PersistError),
}

/// What is being asked about.
pub(super) struct Call<'a> {
    pub on: Trigger,
    pub label: &'a str,
    pub tool: Option<&'a str>,
    pub agent: Option<&'a str>,
    pub chosen_by: ChosenBy,
    pub args: &'a Json,
    /// A sensitive tool chosen by an LLM asks unless a rule allows it.
    pub sensitive: bool,
    /// `approval: required` on the step.
    pub required: bool,
}

/// Asks the rules about `call`, then a person when they say `ask`.
pub(super) async fn gate(shared: &Shared, call: Call<'_>) -> Gate {
    gate_with(shared, call, &[]).await
}

/// [`gate`], with `extra` rules (those of an agent's active skills) after the spec's.
pub(super) async fn gate_with(
    shared: &Shared,
    call: Call<'_>,
    extra: &[crate::spec::Rule],
) -> Gate {
    let run = serde_json::json!({ "id": shared.options.run_id, "workflow": shared.workflow.name });
    let event = Event {
        on: call.on,
        step: Some(call.label),
        tool: call.tool,
        agent: call.agent,
        chosen_by: call.chosen_by,
        args: call.args,
        run: &run,
    };
    let spec_rules = &shared.workflow.spec.rules;
    let joined: Vec<crate::spec::Rule>;
    let all: &[crate::spec::Rule] = if extra.is_empty() {
        spec_rules
    } else {
        joined = spec_rules.iter().chain(extra).cloned().collect();
        &joined
    };
    let mut verdict = rules::evaluate(all, &shared.renderer, &event)
        .await
        .default_for(call.sensitive, call.chosen_by);
    // Asking because of where a request goes rather than what the tool does: say so.
    if verdict.rule.is_none()
        && verdict.decision == Some(Action::Ask)
        && call.chosen_by == ChosenBy::Llm
        && let Some(tool) = call.tool
        && !shared.workflow.tools.sensitive(tool, Some(call.args))
        && let Some(host) = shared.unnamed_host(tool, call.args)
    {
        verdict.reason = Some(format!(
            "a request an LLM chose to `{host}`, a host the spec does not name, needs a person's approval"
        ));
    }
    if call.required && verdict.decision != Some(Action::Deny) {
        verdict.decision = Some(Action::Ask);
        verdict
            .reason
            .get_or_insert_with(|| "the step says `approval: required`".to_owned());
    }
    for rule in &verdict.logged {
        shared.emit(RunEvent::RuleMatched {
            step: Some(call.label.to_owned()),
            tool: call.tool.map(str::to_owned),
            on: call.on,
            rule: rule.clone(),
            action: Action::Log,
        });
    }
    match verdict.decision {
        Some(Action::Deny) => {
            let rule = verdict.rule.clone().unwrap_or_default();
            shared.emit(RunEvent::RuleMatched {
                step: Some(call.label.to_owned()),
                tool: call.tool.map(str::to_owned),
                on: call.on,
                rule: rule.clone(),
                action: Action::Deny,
            });
            Gate::Denied(
                match &verdict.reason {
                    Some(reason) => format!("denied by rule `{rule}`: {reason}"),
                    None => format!("denied by rule `{rule}`"),
                },
                verdict.redact,
            )
        }
        Some(Action::Ask) => ask(shared, &call, verdict).await,
        _ => Gate::Go {
            redact: verdict.redact,
        },
    }
}

/// The decision on a call that asks: recorded, `--yes`, a person, or none yet (the run pauses).
async fn ask(shared: &Shared, call: &Call<'_>, verdict: Verdict) -> Gate {
    // The key binds the decision to the call, with secret values masked: they come from the environment,
    // not from a model, and a hash of them must not be stored where one could guess them back.
    let mut unmasked = call.args.clone();
    shared.redactor.json(&mut unmasked);
    let key = crate::store::spec_hash(&[
        ("run".to_owned(), shared.options.run_id.clone()),
        ("step".to_owned(), call.label.to_owned()),
        ("tool".to_owned(), call.tool.unwrap_or_default().to_owned()),
        ("args".to_owned(), canonical(&unmasked)),
    ]);
    let arguments = rules::redacted_args(&unmasked, &verdict.redact);
    let reason = verdict
        .reason
        .clone()
        .or_else(|| verdict.rule.as_ref().map(|r| format!("rule `{r}` asks")))
        .unwrap_or_else(|| "approval required".to_owned());
    let request = ApprovalRequest {
        key: key.clone(),
        step: call.label.to_owned(),
        tool: call.tool.map(str::to_owned),
        arguments,
        reason,
        timeout_ms: verdict
            .timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        approve_on_timeout: verdict.approve_on_timeout,
    };
    let approvals = &shared.options.approvals;
    let decision = if let Some(decided) = approvals.decided.get(&key) {
        if decided.by == "timeout" {
            // The rule's default, decided on resume: recorded like any decision.
            record(
                shared,
                &request,
                "timeout",
                decided.approved,
                decided.reason.clone(),
            );
        }
        Some(decided.clone())
    } else if approvals.yes {
        Some(record(shared, &request, "--yes", true, None))
    } else if let Some(approver) = &approvals.approver {
        let answer = match verdict.timeout {
            Some(limit) => tokio::time::timeout(limit, approver.ask(&request))
                .await
                .ok()
                .flatten(),
            None => approver.ask(&request).await,
        };
        Some(match answer {
            Some(answer) => record(shared, &request, &answer.by, answer.approved, answer.reason),
            None => {
                let timed_out = ApprovalDecision::timed_out(request.approve_on_timeout);
                record(
                    shared,
                    &request,
                    &timed_out.by,
                    timed_out.approved,
                    timed_out.reason,
                )
            }
        })
    } else {
        None
    };
    // A decision made while running (not one recorded earlier) is durable before the call goes ahead:
    // a crash must not lose what a person said, nor let the call run without its approval on disk.
    let decided_now = decision.is_some() && !approvals.decided.contains_key(&key);
    if decided_now && let Err(e) = persist(shared, Record::ApprovalDecision).await {
        return Gate::Stopped(e);
    }
    match decision {
        Some(d) if d.approved => Gate::Go {
            redact: verdict.redact,
        },
        Some(d) => Gate::Denied(
            match d.reason {
                Some(reason) => format!("denied by {}: {reason}", d.by),
                None => format!("denied by {}", d.by),
            },
            verdict.redact,
        ),
        None => {
            shared.emit(RunEvent::ApprovalRequested {
                step: request.step.clone(),
                tool: request.tool.clone(),
                arguments: request.arguments.clone(),
                reason: request.reason.clone(),
                key: key.clone(),
            });
            let message = format!(
                "waiting for approval: {}{}",
                request
                    .tool
                    .as_deref()
                    .map_or_else(String::new, |t| format!("`{t}`: ")),
                request.reason
            );
            shared
                .options
                .journal
                .record(Entry::ApprovalRequested(request));
            // The request is on disk before the run reports that it waits.
            if let Err(e) = persist(shared, Record::ApprovalRequest).await {
                return Gate::Stopped(e);
            }
            Gate::Waiting(message)
        }
    }
}

/// Records a decision made while running, and says so in the event log.
fn record(
    shared: &Shared,
    request: &ApprovalRequest,
    by: &str,
    approved: bool,
    reason: Option<String>,
) -> ApprovalDecision {
    let decision = ApprovalDecision {
        approved,
        by: by.to_owned(),
        reason,
    };
    shared
        .options
        .journal
        .record(Entry::ApprovalRequested(request.clone()));
    shared.options.journal.record(Entry::ApprovalDecided {
        key: request.key.clone(),
        decision: decision.clone(),
    });
    shared.emit(RunEvent::ApprovalDecided {
        step: request.step.clone(),
        tool: request.tool.clone(),
        approved,
        by: by.to_owned(),
        reason: decision.reason.clone(),
    });
    decision
}

/// JSON text with object keys sorted, so that the same arguments in another order compare equal.
pub(super) fn canonical(value: &Json) -> String {
    match value {
        Json::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Json::String(k.clone()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Json::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}
