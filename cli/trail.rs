//! `archon show RUN --events`: the event log as a readable trail. Agent steps read as Thought / Action /
//! Observation per iteration, planner steps as proposals, verdicts and accepted plans; each line starts
//! with the time since the run's first event.

use std::fmt::Write as _;

use archon_engine::run::RunEvent;
use serde_json::Value as Json;

/// Most lines of one thought, observation or plan shown; the rest is counted.
const SHOWN_LINES: usize = 12;
/// Most characters of one line shown; the rest is counted.
const SHOWN_LINE_CHARS: usize = 2000;

/// The trail of a stored event log (events as the store returns them, with `at_ms`).
pub fn render(events: &[Json]) -> String {
    let start = events
        .iter()
        .find_map(|e| e.get("at_ms").and_then(Json::as_u64))
        .unwrap_or(0);
    let mut text = String::new();
    for raw in events {
        let at = raw
            .get("at_ms")
            .and_then(Json::as_u64)
            .map_or_else(String::new, |ms| clock(ms.saturating_sub(start)));
        let Ok(event) = serde_json::from_value::<RunEvent>(raw.clone()) else {
            // An event this version does not know: shown as it is stored.
            let _ = writeln!(text, "{at:>9}  {}", shown(&raw.to_string()));
            continue;
        };
        let (label, body) = describe(&event);
        // What a delegate did is set in by its depth: two spaces a level.
        let indent = "  ".repeat(delegation_depth(
            raw.get("step").and_then(Json::as_str).unwrap_or_default(),
        ));
        let mut lines = body.lines();
        // A label as long as the column (`incomplete`, `waiting_approval`) still has a space after it.
        let _ = writeln!(
            text,
            "{at:>9}  {label:<9} {indent}{}",
            shown(lines.next().unwrap_or_default())
        );
        let rest: Vec<&str> = lines.collect();
        for line in rest.iter().take(SHOWN_LINES) {
            let _ = writeln!(text, "{:>9}  {:<10}{indent}{}", "", "", shown(line));
        }
        if rest.len() > SHOWN_LINES {
            let _ = writeln!(
                text,
                "{:>9}  {:<10}{indent}[... {} more lines]",
                "",
                "",
                rest.len() - SHOWN_LINES
            );
        }
    }
    crate::output::printable(&text)
}

/// How many delegations deep the agent of `step` works: the parts of its label that name a delegate
/// (`<agent>#<iteration>.<call>`; a step id has no `#`), as in `quiz/researcher#1.1/checker#1.1`.
pub(crate) fn delegation_depth(step: &str) -> usize {
    step.split('/').filter(|part| part.contains('#')).count()
}

/// `line`, or its first [`SHOWN_LINE_CHARS`] characters and a count of the rest.
fn shown(line: &str) -> std::borrow::Cow<'_, str> {
    match archon_engine::text::split_at_chars(line, SHOWN_LINE_CHARS) {
        None => line.into(),
        Some((head, more)) => format!("{head} [... {more} more characters]").into(),
    }
}

/// `12.345s`: time since the run's first event.
pub(crate) fn clock(ms: u64) -> String {
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

/// The label and the (possibly multi-line) text of an event.
pub(crate) fn describe(event: &RunEvent) -> (&'static str, String) {
    match event {
        RunEvent::StepStarted { step } => ("started", step.clone()),
        RunEvent::StepRetried {
            step,
            attempt,
            error,
            delay_ms,
        } => (
            "retrying",
            format!("{step}: attempt {attempt} in {delay_ms} ms after: {error}"),
        ),
        RunEvent::StepFinished {
            step,
            status,
            duration_ms,
            error,
        } => (
            status.as_str(),
            match error {
                Some(error) => format!("{step} ({duration_ms} ms): {error}"),
                None => format!("{step} ({duration_ms} ms)"),
            },
        ),
        RunEvent::StepSkipped { step, reason } => ("skipped", format!("{step}: {reason}")),
        RunEvent::StepResolved {
            step,
            status,
            by,
            reason,
        } => (
            "resolved",
            format!(
                "{step} as {} by {by}{}",
                status.as_str(),
                reason
                    .as_deref()
                    .filter(|r| !r.trim().is_empty())
                    .map_or_else(String::new, |r| format!(": {r}"))
            ),
        ),
        RunEvent::StepCached { step, run, from } => (
            "cached",
            format!("{step} (result of `{from}` in run {run})"),
        ),
        RunEvent::StepReused { step, status } => (
            "reused",
            format!("{step} ({} by an earlier process)", status.as_str()),
        ),
        RunEvent::LlmCall {
            step,
            provider,
            model,
            input_tokens,
            output_tokens,
            cost_usd,
            duration_ms,
        } => {
            let cost = cost_usd.map_or_else(String::new, |c| format!(", ${c:.4}"));
            (
                "llm",
                format!(
                    "{step}: `{provider}` ({model}) {input_tokens} in, {output_tokens} out{cost}, {duration_ms} ms"
                ),
            )
        }
        RunEvent::LlmCallFailed {
            step,
            provider,
            model,
            attempt,
            error,
            retrying,
            duration_ms,
        } => (
            "llm!",
            format!(
                "{step}: `{provider}` ({model}) request {attempt} failed after {duration_ms} ms{}: {}",
                if *retrying { ", retrying" } else { "" },
                // The error names the provider already.
                error
                    .strip_prefix(&format!("provider `{provider}`: "))
                    .unwrap_or(error)
            ),
        ),
        RunEvent::AgentThought {
            step,
            iteration,
            text,
        } => ("thought", format!("{step} #{iteration}: {}", text.trim())),
        RunEvent::AgentAction {
            step,
            iteration,
            tool,
            arguments,
        } => ("action", format!("{step} #{iteration}: {tool} {arguments}")),
        RunEvent::AgentObservation {
            step,
            iteration,
            tool,
            text,
            error,
            ..
        } => (
            if *error { "observed!" } else { "observed" },
            format!("{step} #{iteration}: {tool} ->\n{}", text.trim_end()),
        ),
        RunEvent::AgentCompacted {
            step,
            iteration,
            turns,
            tokens_before,
            tokens_after,
            summary,
        } => (
            "compacted",
            format!(
                "{step} #{iteration}: {turns} earlier turns summarised, about {tokens_before} -> {tokens_after} tokens{}",
                summary
                    .as_deref()
                    .map_or_else(String::new, |s| format!(":\n{}", s.trim_end()))
            ),
        ),
        RunEvent::AgentAnswerRejected {
            step,
            iteration,
            text,
            correction,
        } => (
            "rejected",
            format!(
                "{step} #{iteration}: {}\n-> {}",
                text.trim(),
                correction.trim()
            ),
        ),
        RunEvent::AgentAnswer {
            step,
            iteration,
            text,
        } => ("answer", format!("{step} #{iteration}: {}", text.trim())),
        RunEvent::PlanProposed {
            step,
            replan,
            attempt,
            text,
        } => (
            "proposed",
            format!(
                "{step}{} (proposal {attempt}):\n{}",
                revision(*replan),
                serde_json::from_str::<Json>(text)
                    .ok()
                    .and_then(|plan| serde_json::to_string_pretty(&plan).ok())
                    .unwrap_or_else(|| text.trim_end().to_owned())
            ),
        ),
        RunEvent::PlanRejected {
            step,
            replan,
            attempt,
            problems,
        } => (
            "rejected",
            format!(
                "{step}{} (proposal {attempt}):\n- {}",
                revision(*replan),
                problems.join("\n- ")
            ),
        ),
        RunEvent::PlanAccepted {
            step,
            replan,
            steps,
            kept,
        } => {
            let kept = if kept.is_empty() {
                String::new()
            } else {
                format!("; kept from before: {}", kept.join(", "))
            };
            (
                "planned",
                format!("{step}{}: {}{kept}", revision(*replan), steps.join(", ")),
            )
        }
        RunEvent::PlanRevising {
            step,
            replan,
            reason,
        } => ("replan", format!("{step} (revision {replan}): {reason}")),
        RunEvent::Resumed { step, from } => ("resumed", format!("{step} {from}")),
        RunEvent::Consensus { step, summary, .. } => ("consensus", format!("{step}: {summary}")),
        RunEvent::RuleMatched {
            step,
            tool,
            on,
            rule,
            action,
        } => (
            "rule",
            format!(
                "{}{}: `{rule}` {} on {}",
                step.as_deref().filter(|s| !s.is_empty()).unwrap_or("run"),
                tool.as_deref()
                    .map_or_else(String::new, |t| format!(" {t}")),
                name(serde_json::to_value(action)),
                name(serde_json::to_value(on))
            ),
        ),
        RunEvent::ApprovalRequested {
            step,
            tool,
            arguments,
            reason,
            ..
        } => (
            "asking",
            format!(
                "{step}{}: {reason}\n{}",
                tool.as_deref()
                    .map_or_else(String::new, |t| format!(" {t}")),
                serde_json::to_string_pretty(arguments).unwrap_or_default()
            ),
        ),
        RunEvent::ApprovalDecided {
            step,
            tool,
            approved,
            by,
            reason,
        } => (
            if *approved { "approved" } else { "denied" },
            format!(
                "{step}{} by {by}{}",
                tool.as_deref()
                    .map_or_else(String::new, |t| format!(" {t}")),
                reason
                    .as_deref()
                    .filter(|r| !r.trim().is_empty())
                    .map_or_else(String::new, |r| format!(": {r}"))
            ),
        ),
    }
}

/// A spec enum's name as written in specs (`before_tool`, `deny`), from its JSON form.
fn name(value: serde_json::Result<Json>) -> String {
    value
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn revision(replan: u32) -> String {
    if replan == 0 {
        String::new()
    } else {
        format!(" revision {replan}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Statuses as long as the label column or longer ran into the step's name (`incompleteagent`).
    #[test]
    fn a_long_status_is_set_apart_from_the_step() {
        let finished = |status: &str| json!({ "event": "step_finished", "step": "agent", "status": status, "duration_ms": 5, "at_ms": 1000 });
        let events = [
            finished("succeeded"),
            finished("incomplete"),
            finished("waiting_approval"),
        ];
        assert_eq!(
            super::render(&events),
            "   0.000s  succeeded agent (5 ms)\n   0.000s  incomplete agent (5 ms)\n   0.000s  waiting_approval agent (5 ms)\n"
        );
    }

    /// A 10 MB error is one line of 2,000 characters and a count, not 10 MB on the terminal (issue 14,
    /// item 10).
    #[test]
    fn a_huge_line_is_cut() {
        let error = "e".repeat(10_000_000);
        let events = [
            json!({ "event": "step_finished", "step": "s", "status": "failed", "duration_ms": 5, "error": error, "at_ms": 1000 }),
        ];
        let shown = super::render(&events);
        assert_eq!(shown.len(), 2052, "{}", &shown[..100]);
        assert!(
            shown.ends_with("eee [... 9998010 more characters]\n"),
            "{}",
            &shown[shown.len() - 100..]
        );
        assert!(shown.starts_with("   0.000s  failed    s (5 ms): eee"));
    }
}
