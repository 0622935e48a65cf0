//! Conversions between the runtime types a run records and the record types the store persists.

use crate::record;
use crate::report::{
    ApprovalDecision, ApprovalRequest, LlmUsage, RunEvent, StepResult, StepStatus,
};

use super::RunState;

impl From<RunState> for record::RunState {
    fn from(state: RunState) -> Self {
        match state {
            RunState::Running => record::RunState::Running,
            RunState::Succeeded => record::RunState::Succeeded,
            RunState::Failed => record::RunState::Failed,
            RunState::Cancelled => record::RunState::Cancelled,
            RunState::Interrupted => record::RunState::Interrupted,
            RunState::WaitingApproval => record::RunState::WaitingApproval,
        }
    }
}

impl From<record::RunState> for RunState {
    fn from(state: record::RunState) -> Self {
        match state {
            record::RunState::Running => RunState::Running,
            record::RunState::Succeeded => RunState::Succeeded,
            record::RunState::Failed => RunState::Failed,
            record::RunState::Cancelled => RunState::Cancelled,
            record::RunState::Interrupted => RunState::Interrupted,
            record::RunState::WaitingApproval => RunState::WaitingApproval,
        }
    }
}

impl From<StepStatus> for record::StepStatus {
    fn from(status: StepStatus) -> Self {
        match status {
            StepStatus::Succeeded => record::StepStatus::Succeeded,
            StepStatus::Failed => record::StepStatus::Failed,
            StepStatus::TimedOut => record::StepStatus::TimedOut,
            StepStatus::Skipped => record::StepStatus::Skipped,
            StepStatus::Cancelled => record::StepStatus::Cancelled,
            StepStatus::Stuck => record::StepStatus::Stuck,
            StepStatus::Incomplete => record::StepStatus::Incomplete,
            StepStatus::WaitingApproval => record::StepStatus::WaitingApproval,
        }
    }
}

impl From<record::StepStatus> for StepStatus {
    fn from(status: record::StepStatus) -> Self {
        match status {
            record::StepStatus::Succeeded => StepStatus::Succeeded,
            record::StepStatus::Failed => StepStatus::Failed,
            record::StepStatus::TimedOut => StepStatus::TimedOut,
            record::StepStatus::Skipped => StepStatus::Skipped,
            record::StepStatus::Cancelled => StepStatus::Cancelled,
            record::StepStatus::Stuck => StepStatus::Stuck,
            record::StepStatus::Incomplete => StepStatus::Incomplete,
            record::StepStatus::WaitingApproval => StepStatus::WaitingApproval,
        }
    }
}

impl From<&LlmUsage> for record::Usage {
    fn from(usage: &LlmUsage) -> Self {
        record::Usage {
            calls: usage.calls,
            failed_calls: usage.failed_calls,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            cost_usd: usage.cost_usd,
            unpriced_calls: usage.unpriced_calls,
            largest_prompt: usage.largest_prompt,
            context: usage.context.map(|c| record::ContextUse {
                window: c.window,
                compact_at: c.compact_at,
                compactions: c.compactions,
            }),
        }
    }
}

impl From<record::Usage> for LlmUsage {
    fn from(usage: record::Usage) -> Self {
        LlmUsage {
            calls: usage.calls,
            failed_calls: usage.failed_calls,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            cost_usd: usage.cost_usd,
            unpriced_calls: usage.unpriced_calls,
            largest_prompt: usage.largest_prompt,
            context: usage.context.map(|c| crate::report::ContextUse {
                window: c.window,
                compact_at: c.compact_at,
                compactions: c.compactions,
            }),
        }
    }
}

impl record::StepResult {
    /// The record of `result`, with `output` and `text` in their places (the store keeps large ones
    /// apart, and puts a null and an empty text here).
    pub(crate) fn of(result: &StepResult, output: serde_json::Value, text: String) -> Self {
        record::StepResult {
            status: result.status.into(),
            output,
            text,
            outputs: result.outputs.clone(),
            error: result.error.clone(),
            attempts: result.attempts,
            exit_code: result.exit_code,
            duration_ms: result.duration_ms,
            fallback: result.fallback,
            steps: result
                .steps
                .iter()
                .map(|(name, step)| (name.clone(), record::StepResult::from(step)))
                .collect(),
            llm: result.llm.as_ref().map(record::Usage::from),
            item: result.item.clone(),
            plan: result.plan.clone(),
            cached: result.cached.as_ref().map(|c| record::CachedFrom {
                run: c.run.clone(),
                step: c.step.clone(),
                at_ms: c.at_ms,
            }),
            task: result.task.clone(),
        }
    }
}

impl From<&StepResult> for record::StepResult {
    fn from(result: &StepResult) -> Self {
        record::StepResult::of(result, result.output.clone(), result.text.clone())
    }
}

impl From<record::StepResult> for StepResult {
    fn from(record: record::StepResult) -> Self {
        StepResult {
            status: record.status.into(),
            output: record.output,
            text: record.text,
            outputs: record.outputs,
            error: record.error,
            attempts: record.attempts,
            exit_code: record.exit_code,
            duration_ms: record.duration_ms,
            fallback: record.fallback,
            steps: record
                .steps
                .into_iter()
                .map(|(name, step)| (name, StepResult::from(step)))
                .collect(),
            llm: record.llm.map(LlmUsage::from),
            item: record.item,
            plan: record.plan,
            cached: record.cached.map(|c| crate::report::CachedFrom {
                run: c.run,
                step: c.step,
                at_ms: c.at_ms,
            }),
            task: record.task,
        }
    }
}

impl From<&ApprovalRequest> for record::ApprovalRequest {
    fn from(request: &ApprovalRequest) -> Self {
        record::ApprovalRequest {
            key: request.key.clone(),
            step: request.step.clone(),
            tool: request.tool.clone(),
            arguments: request.arguments.clone(),
            reason: request.reason.clone(),
            timeout_ms: request.timeout_ms,
            approve_on_timeout: request.approve_on_timeout,
        }
    }
}

impl From<record::ApprovalRequest> for ApprovalRequest {
    fn from(request: record::ApprovalRequest) -> Self {
        ApprovalRequest {
            key: request.key,
            step: request.step,
            tool: request.tool,
            arguments: request.arguments,
            reason: request.reason,
            timeout_ms: request.timeout_ms,
            approve_on_timeout: request.approve_on_timeout,
        }
    }
}

impl From<&ApprovalDecision> for record::ApprovalDecision {
    fn from(decision: &ApprovalDecision) -> Self {
        record::ApprovalDecision {
            approved: decision.approved,
            by: decision.by.clone(),
            reason: decision.reason.clone(),
        }
    }
}

impl From<record::ApprovalDecision> for ApprovalDecision {
    fn from(decision: record::ApprovalDecision) -> Self {
        ApprovalDecision {
            approved: decision.approved,
            by: decision.by,
            reason: decision.reason,
        }
    }
}

/// The text of an event's record (`record::Event`): the event's kind, then its fields as the run reported
/// them, written straight from the event without a JSON value between (the log is shown as written).
pub(super) fn event_text(event: &RunEvent) -> String {
    record::encode(event)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::StepStatus;

    #[test]
    fn an_events_text_is_its_record() {
        let events = [
            RunEvent::StepStarted { step: "a".into() },
            RunEvent::StepFinished {
                step: "b[2]".into(),
                status: StepStatus::Failed,
                duration_ms: 12,
                error: Some("exit 2: \"quoted\"\nline".into()),
            },
            RunEvent::StepRetried {
                step: "c".into(),
                attempt: 2,
                error: "timed out".into(),
                delay_ms: 1500,
            },
        ];
        for event in events {
            let text = event_text(&event);
            let row = record::Row {
                run: "r",
                table: "events",
                row: "1",
            };
            let decoded: record::Event =
                record::decode(row, record::FORMAT_VERSION.into(), text.as_bytes())
                    .expect("decodes as a record");
            let serde_json::Value::Object(mut fields) =
                serde_json::to_value(&event).expect("a value")
            else {
                panic!("an object");
            };
            let kind = fields.shift_remove("event").expect("a kind");
            assert_eq!(serde_json::Value::String(decoded.event.clone()), kind);
            assert_eq!(decoded.fields, fields, "{text}");
            assert!(text.starts_with(&format!("{{\"event\":{kind}")), "{text}");
        }
    }
}
