//! Why an LLM step (an agent, or a planner's model calls) failed: one enum, so that each cause is named
//! once, with its words, its status (`failed`, `stuck`, `incomplete`) and whether a retry may help.

use crate::llm::LlmError;
use crate::report::StepStatus;
use crate::run::scheduler::context::Failure;
use crate::tools::ErrorClass;

#[derive(Debug, thiserror::Error)]
pub(in crate::run::scheduler) enum AgentError {
    #[error("no LLM provider is configured: add one under `llm.providers`")]
    NoProvider,
    #[error("no LLM provider `{0}`")]
    UnknownProvider(String),
    /// The provider's settings do not build (a missing key, a bad base URL).
    #[error("{}", .0.message)]
    Provider(#[source] LlmError),
    #[error("LLM budget exceeded: {0}")]
    Budget(String),
    /// The step's model calls reached [`super::model::MODEL_TIME`] (no `timeout` bounds the attempt).
    #[error(
        "the model calls of this attempt reached their time limit of `{}`: a `timeout` on the step replaces it",
        humantime::format_duration(*.0)
    )]
    ModelTime(std::time::Duration),
    #[error("the run is over")]
    RunOver,
    /// A model call failed after the provider's own retries.
    #[error("{}", .0.message)]
    Call(#[source] LlmError),
    #[error("`output_schema` is not a valid JSON Schema: {0}")]
    Schema(#[source] Box<jsonschema::ValidationError<'static>>),
    /// The answer reached the token limit: the provider's name and its `max_tokens`, if set.
    #[error("the answer was cut off at the token limit{}: raise `max_tokens` of provider `{}`", limit_of(.1), .0)]
    CutOff(String, Option<u32>),
    /// A refusal or a safety filter, with what the model said, if anything.
    #[error("the model refused or the provider filtered the answer{}", said(.0))]
    Filtered(String),
    #[error("the final answer does not match `output_schema` after {0} corrections")]
    Mismatch(usize),
    #[error("the agent called `{tool}` with the same arguments {times} times")]
    Repeating { tool: String, times: usize },
    #[error(
        "the model made only invalid tool calls {turns} turns in a row; the last problem: {problem}"
    )]
    InvalidTurns { turns: usize, problem: String },
    #[error("no final answer within {iterations} iterations{}", best_answer(best))]
    NoAnswer { iterations: u32, best: String },
    #[error("the model gave an empty summary of the earlier turns")]
    EmptySummary,
    #[error(
        "the prompt needs about `{tokens}` tokens, more than the `{window}`-token context window of `{model}` allows{reserved}, {why}"
    )]
    TooLarge {
        tokens: usize,
        window: usize,
        model: String,
        /// ` with `N` kept for the answer`, or nothing.
        reserved: String,
        why: &'static str,
    },
}

impl AgentError {
    /// The status of the step it ends.
    fn status(&self) -> StepStatus {
        match self {
            AgentError::Repeating { .. } | AgentError::InvalidTurns { .. } => StepStatus::Stuck,
            AgentError::NoAnswer { .. } => StepStatus::Incomplete,
            AgentError::ModelTime(_) => StepStatus::TimedOut,
            _ => StepStatus::Failed,
        }
    }

    /// What `retry.on` may name of it: a model call that failed is classed by the provider's last HTTP
    /// status, or as a connection that could not be made.
    fn class(&self) -> ErrorClass {
        match self {
            AgentError::Call(e) if e.connect => ErrorClass::Connect,
            AgentError::Call(LlmError {
                status: Some(status),
                ..
            }) => ErrorClass::of_status(*status),
            _ => ErrorClass::Other,
        }
    }

    /// Whether the step's `retry` may help: what the provider's own retries could not fix.
    /// A client error the provider would not repeat is tried again only when `retry.on` names `4xx`, as
    /// for `http`.
    fn retryable(&self) -> bool {
        matches!(self, AgentError::Call(e) if e.retryable)
            || matches!(self, AgentError::ModelTime(_))
            || self.class() == ErrorClass::ClientError
    }
}

impl From<AgentError> for Failure {
    fn from(error: AgentError) -> Self {
        Failure {
            status: error.status(),
            retryable: error.retryable(),
            class: error.class(),
            ..Failure::fixed(error.to_string())
        }
    }
}

/// `; best answer: …` after [`AgentError::NoAnswer`]'s message, when the model gave one.
/// ` of `N` tokens`, or nothing.
pub(in crate::run::scheduler) fn limit_of(limit: &Option<u32>) -> String {
    limit.map_or_else(String::new, |n| format!(" of `{n}` tokens"))
}

/// `: what the model said` (its first 500 characters, with a note of the rest), or nothing.
pub(in crate::run::scheduler) fn said(text: &str) -> String {
    let text = text.trim();
    match crate::text::split_at_chars(text, 500) {
        _ if text.is_empty() => String::new(),
        None => format!(": {text}"),
        Some((head, more)) => format!(": {head} [... {more} more characters]"),
    }
}

fn best_answer(best: &str) -> String {
    let best = best.trim();
    if best.is_empty() {
        String::new()
    } else {
        format!("; best answer: {best}")
    }
}
