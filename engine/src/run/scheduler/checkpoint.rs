//! Checkpoints of LLM steps: after each completed iteration an agent records its conversation (and a
//! planner its accepted plan), so that `archon resume` continues the step there instead of starting over,
//! and repeats no tool call whose result the conversation already holds.
//!
//! A checkpoint is used only by the same step asking the same thing: its fingerprint (provider, model,
//! tools, tool mode, limits) and its first messages (instructions and goal, as rendered now) must equal the
//! recorded ones, so a changed spec or input starts afresh. It is used once: a retry starts afresh.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::context::{Failure, Shared};
use crate::llm::Message;
use indexmap::IndexMap;

use crate::report::{LlmUsage, StepResult};
use crate::store::{Ack, Entry};

/// Where an agent step stands after a completed iteration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct AgentState {
    #[serde(default)]
    pub fingerprint: String,
    /// The step had changed to text mode (its provider refused native tool calling).
    #[serde(default)]
    pub text_mode: bool,
    pub iteration: u32,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tool_calls: usize,
    pub usage: LlmUsage,
    pub seen_calls: HashMap<String, usize>,
    pub schema_retries: usize,
    /// A turn whose calls wait for a person's approval: a resume takes it up instead of asking the model.
    #[serde(default)]
    pub pending: Option<crate::llm::ChatResponse>,
    /// Model turns the agent's delegates took, at every depth.
    #[serde(default)]
    pub delegated_turns: u32,
    /// Delegations the agent and its delegates made.
    #[serde(default)]
    pub delegations_made: u32,
    /// The results of the delegations the agent made, by name.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub delegations: IndexMap<String, StepResult>,
    /// The skills it had activated (in text mode the conversation has no tool calls to find them in).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
}

/// An [`AgentState`] as borrowed from the running loop: serialised the same way, without copying the
/// conversation each iteration to record it.
#[derive(Serialize)]
pub(super) struct AgentStateRef<'a> {
    pub fingerprint: &'a str,
    pub text_mode: bool,
    pub iteration: u32,
    pub messages: &'a [Message],
    pub tool_calls: usize,
    pub usage: &'a LlmUsage,
    pub seen_calls: &'a HashMap<String, usize>,
    pub schema_retries: usize,
    pub pending: Option<&'a crate::llm::ChatResponse>,
    pub delegated_turns: u32,
    pub delegations_made: u32,
    #[serde(skip_serializing_if = "IndexMap::is_empty")]
    pub delegations: &'a IndexMap<String, StepResult>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    pub skills: &'a [String],
}

/// Where a planner step stands: the plan the validator accepted last, and the conversation that led to it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct PlannerState {
    #[serde(default)]
    pub fingerprint: String,
    pub replan: u32,
    pub messages: Vec<Message>,
    pub usage: LlmUsage,
    pub plan: String,
}

/// Records `state` as the latest checkpoint of step `label` (a nested step by its full `outer/inner` name). The returned acknowledgement resolves once it is durable: a step whose
/// tools are not safe to repeat waits for it before calling more.
pub(super) fn save(shared: &Shared, label: &str, state: &impl Serialize) -> Ack {
    let Ok(mut state) = serde_json::to_value(state) else {
        return Ack::done();
    };
    shared.redactor.json(&mut state);
    shared.options.journal.record(Entry::Checkpoint {
        step: label.to_owned(),
        state,
    });
    shared.options.journal.flush()
}

/// The checkpoint an earlier process recorded for step `label`, if it has `fingerprint` and began with
/// `start`. Taken: later attempts of the step in this run do not see it.
pub(super) fn restore<T: for<'de> Deserialize<'de> + Checkpointed>(
    shared: &Shared,
    label: &str,
    fingerprint: &str,
    start: &[Message],
) -> Option<T> {
    let mut checkpoints = shared.options.checkpoints.lock().ok()?;
    let state: T = serde_json::from_value(checkpoints.get(label)?.clone()).ok()?;
    if state.fingerprint() != fingerprint || !state.messages().starts_with(start) {
        return None;
    }
    checkpoints.remove(label);
    Some(state)
}

/// A failure when an earlier process left step `label` a checkpoint this version cannot read (written by
/// another version of archon, or damaged): starting the step afresh would repeat the tool calls it
/// records, so the step fails instead, saying how to start it afresh on purpose.
pub(super) fn refuse_unreadable<T: for<'de> Deserialize<'de>>(
    shared: &Shared,
    label: &str,
) -> Result<(), Failure> {
    let Ok(checkpoints) = shared.options.checkpoints.lock() else {
        return Ok(());
    };
    match checkpoints.get(label).map(|state| T::deserialize(state)) {
        Some(Err(e)) => Err(Failure::fixed(format!(
            "the checkpoint of step `{label}` cannot be read by this version of archon ({e}), and continuing without it would repeat the tool calls it records: `archon retry {} --from {}` runs the step again from the start",
            shared.options.run_id,
            label.split('/').next().unwrap_or(label)
        ))),
        _ => Ok(()),
    }
}

/// The fingerprint of what an LLM step asks with: any change makes its checkpoint useless.
pub(super) fn fingerprint(parts: &[&str]) -> String {
    crate::store::spec_hash(
        &parts
            .iter()
            .map(|p| (String::new(), (*p).to_owned()))
            .collect::<Vec<_>>(),
    )
}

pub(super) trait Checkpointed {
    fn fingerprint(&self) -> &str;
    fn messages(&self) -> &[Message];
}

impl Checkpointed for AgentState {
    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    fn messages(&self) -> &[Message] {
        &self.messages
    }
}

impl Checkpointed for PlannerState {
    fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
    fn messages(&self) -> &[Message] {
        &self.messages
    }
}

/// Adds what a restored step had used to the run's totals, so that budgets count it.
pub(super) fn count_restored(shared: &Shared, usage: &LlmUsage) {
    if let Ok(mut totals) = shared.llm.totals.lock() {
        totals.add(usage);
    }
}
