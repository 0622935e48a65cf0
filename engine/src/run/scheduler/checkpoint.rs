//! Checkpoints of LLM steps: after each completed iteration an agent records its conversation (and a
//! planner its accepted plan), so that `archon resume` continues the step there instead of starting over,
//! and repeats no tool call whose result the conversation already holds.
//!
//! A checkpoint is used only by the same step asking the same thing: its first messages (instructions and
//! goal, as rendered now) must equal the recorded ones, so a changed spec or input starts afresh.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Shared;
use crate::llm::Message;
use crate::run::LlmUsage;
use crate::store::Entry;

/// Where an agent step stands after a completed iteration.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct AgentState {
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
}

/// Where a planner step stands: the plan the validator accepted last, and the conversation that led to it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct PlannerState {
    pub replan: u32,
    pub messages: Vec<Message>,
    pub usage: LlmUsage,
    pub plan: String,
}

/// Records `state` as the latest checkpoint of step `label` (the run's own steps only: nested steps are
/// part of their caller's attempt). Committed without waiting: losing the latest one repeats an iteration.
pub(super) fn save(shared: &Shared, label: &str, state: &impl Serialize) {
    if shared.depth != 0 {
        return;
    }
    let Ok(mut state) = serde_json::to_value(state) else {
        return;
    };
    shared.redactor.json(&mut state);
    shared.options.journal.record(Entry::Checkpoint {
        step: label.to_owned(),
        state,
    });
    drop(shared.options.journal.flush());
}

/// The checkpoint an earlier process recorded for step `label`, if it began with `start`.
pub(super) fn restore<T: for<'de> Deserialize<'de> + HasMessages>(
    shared: &Shared,
    label: &str,
    start: &[Message],
) -> Option<T> {
    if shared.depth != 0 {
        return None;
    }
    let state: T = serde_json::from_value(shared.options.checkpoints.get(label)?.clone()).ok()?;
    state.messages().starts_with(start).then_some(state)
}

pub(super) trait HasMessages {
    fn messages(&self) -> &[Message];
}

impl HasMessages for AgentState {
    fn messages(&self) -> &[Message] {
        &self.messages
    }
}

impl HasMessages for PlannerState {
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
