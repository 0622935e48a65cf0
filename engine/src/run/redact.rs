//! Secret values masked in what a run records and sends: its results, events and LLM requests (the
//! masking itself is [`crate::redact`]).

use std::sync::Arc;

use crate::llm::{BoxFuture, ChatRequest, ChatResponse, LlmError, Part, Provider};
pub use crate::redact::{MASK, Redactor};
use crate::report::{RunEvent, StepResult};

impl Redactor {
    pub fn result(&self, result: &mut StepResult) {
        if self.is_empty() {
            return;
        }
        self.json(&mut result.output);
        self.string(&mut result.text);
        self.map(&mut result.outputs);
        self.option(&mut result.error);
        self.option(&mut result.task);
        result.steps.values_mut().for_each(|r| self.result(r));
        if let Some(plan) = &mut result.plan {
            self.json(plan);
        }
    }

    /// Whether [`Redactor::result`] would change what later steps read of `result` (its output, text,
    /// outputs, error, task, its own steps' results or its plan): the result holds a secret.
    pub fn finds_in_result(&self, result: &StepResult) -> bool {
        if self.is_empty() {
            return false;
        }
        self.finds_in_json(&result.output)
            || self.finds(&result.text)
            || result
                .outputs
                .iter()
                .any(|(k, v)| self.finds(k) || self.finds_in_json(v))
            || result.error.as_deref().is_some_and(|e| self.finds(e))
            || result.task.as_deref().is_some_and(|t| self.finds(t))
            || result.steps.values().any(|r| self.finds_in_result(r))
            || result
                .plan
                .as_deref()
                .is_some_and(|p| self.finds_in_json(p))
    }

    pub fn event(&self, event: &mut RunEvent) {
        if self.is_empty() {
            return;
        }
        match event {
            RunEvent::StepRetried { error, .. } => self.string(error),
            RunEvent::StepFinished { error, .. } => self.option(error),
            RunEvent::StepSkipped { reason, .. } => self.string(reason),
            RunEvent::AgentThought { text, .. } | RunEvent::AgentAnswer { text, .. } => {
                self.string(text);
            }
            RunEvent::LlmCallFailed { error, .. } => self.string(error),
            // The model's name comes from the provider's answer.
            RunEvent::LlmCall { model, .. } => self.string(model),
            RunEvent::AgentAnswerRejected {
                text, correction, ..
            } => {
                self.string(text);
                self.string(correction);
            }
            RunEvent::AgentCompacted { summary, .. } => self.option(summary),
            RunEvent::AgentObservation {
                text, full_text, ..
            } => {
                self.string(text);
                self.option(full_text);
            }
            RunEvent::AgentAction { arguments, .. }
            | RunEvent::ApprovalRequested { arguments, .. } => self.json(arguments),
            RunEvent::ApprovalDecided { reason, .. } | RunEvent::StepResolved { reason, .. } => {
                self.option(reason);
            }
            RunEvent::PlanProposed { text, .. } => self.string(text),
            RunEvent::PlanRejected { problems, .. } => {
                problems.iter_mut().for_each(|p| self.string(p))
            }
            RunEvent::PlanRevising { reason, .. } => self.string(reason),
            RunEvent::Consensus { summary, .. } => self.string(summary),
            RunEvent::StepStarted { .. }
            | RunEvent::PlanAccepted { .. }
            | RunEvent::Resumed { .. }
            | RunEvent::RuleMatched { .. }
            | RunEvent::StepReused { .. }
            | RunEvent::StepCached { .. } => {}
        }
    }

    /// Masks the messages of a request to a model: text, reasoning, tool calls' arguments and tool results.
    /// (Reasoning signatures are opaque tokens the provider needs back unchanged.)
    pub fn request(&self, request: &mut ChatRequest) {
        if self.is_empty() {
            return;
        }
        for part in request.messages.iter_mut().flat_map(|m| m.parts.iter_mut()) {
            match part {
                Part::Text(text) | Part::Reasoning { text, .. } => self.string(text),
                Part::ToolCall(call) => self.json(&mut call.arguments),
                Part::ToolResult(result) => self.string(&mut result.content),
            }
        }
    }
}

/// A provider whose requests are redacted before they leave the run: the model reads `***` where a
/// secret value was, whatever put it into the conversation (a tool's output, a rendered goal).
#[derive(Debug)]
pub struct Redacting {
    inner: Arc<dyn Provider>,
    redactor: Arc<Redactor>,
}

impl Redacting {
    /// `inner` itself when there is nothing to redact.
    pub fn wrap(inner: Arc<dyn Provider>, redactor: Arc<Redactor>) -> Arc<dyn Provider> {
        if redactor.is_empty() {
            inner
        } else {
            Arc::new(Redacting { inner, redactor })
        }
    }
}

impl Provider for Redacting {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let mut request = request.clone();
            self.redactor.request(&mut request);
            self.inner.complete(&request).await
        })
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>> {
        Box::pin(async move {
            let masked: Vec<String> = inputs
                .iter()
                .map(|text| self.redactor.text(text).into_owned())
                .collect();
            self.inner.embed(model, &masked).await
        })
    }
}
