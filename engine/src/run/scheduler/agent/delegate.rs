//! Delegation between agents: an agent with `delegates` is offered one tool per delegate
//! (`delegate.<agent>` to rules and in the trail), and a call runs the delegate as a child agent inside the
//! calling step, under its own label (`<step>/<agent>#<iteration>.<call>`), with its own instructions,
//! provider, tools, memory and trail.
//!
//! A step's delegation tree is bounded by construction: every model turn of every agent in it counts
//! against one budget, the step's `max_iterations`; the tree is at most `defaults.max_delegation_depth`
//! deep and makes at most `defaults.max_delegations` delegations; a delegation to an agent already on the
//! chain is refused and returned to the model as a tool error naming the chain. A finished delegation is
//! recorded, so that a resumed run does not repeat it; a delegate at work resumes from its own checkpoint.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indexmap::IndexMap;
use minijinja::Value;
use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use super::super::context::{Called, Failure, Shared, millis};
use super::super::durable::{Record, durable};
use crate::llm::ToolSpec;
use crate::report::{LlmUsage, StepResult, StepStatus};
use crate::spec::{AgentDef, Body, Delegate, Spanned, Spec};

/// How the rules, the trail and `archon tools` name the tool that delegates to agent `x`: `delegate.x`.
pub(crate) const PREFIX: &str = "delegate.";
/// Levels of delegation unless `defaults.max_delegation_depth` says otherwise.
pub const DEFAULT_MAX_DEPTH: u32 = crate::spec::DEFAULT_MAX_DELEGATION_DEPTH;
/// Delegations of one step unless `defaults.max_delegations` says otherwise.
pub const DEFAULT_MAX_DELEGATIONS: u32 = 10;
/// Longest task or context a delegation may carry, in bytes (the rest is refused, not cut).
const MAX_TASK_BYTES: usize = 32 * 1024;

/// What the agents of one step's delegation tree share.
#[derive(Debug)]
pub(in crate::run::scheduler) struct Tree {
    /// The step's label: every model call in the tree spends its model time.
    pub step: String,
    /// Model turns the whole tree may take: the step's `max_iterations`.
    pub budget: u32,
    /// Model turns taken so far, by agent (the root's under its own name).
    turns: Mutex<IndexMap<String, u32>>,
    used: AtomicU32,
    /// An agent found the budget spent: the step ends.
    exhausted: std::sync::atomic::AtomicBool,
    delegations: AtomicU32,
    max_delegations: u32,
    max_depth: u32,
}

impl Tree {
    pub fn new(shared: &Shared, step: &str, budget: u32) -> Tree {
        let defaults = shared.workflow.spec.defaults.as_ref();
        Tree {
            step: step.to_owned(),
            budget,
            turns: Mutex::default(),
            used: AtomicU32::new(0),
            exhausted: std::sync::atomic::AtomicBool::new(false),
            delegations: AtomicU32::new(0),
            max_delegations: defaults
                .and_then(|d| d.max_delegations.as_ref())
                .map_or(DEFAULT_MAX_DELEGATIONS, |m| m.value),
            max_depth: defaults
                .and_then(|d| d.max_delegation_depth.as_ref())
                .map_or(DEFAULT_MAX_DEPTH, |m| m.value),
        }
    }

    /// Turns and delegations an earlier process spent, as a checkpoint or a finished delegation recorded
    /// them: `turns` of them by `agent`.
    fn restore(&self, agent: &str, turns: u32, delegated: &Spent) {
        let delegated_turns = delegated.turns.load(Ordering::SeqCst);
        self.used
            .fetch_add(turns + delegated_turns, Ordering::SeqCst);
        self.delegations.fetch_add(
            delegated.delegations.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
        if let Ok(mut turns_by) = self.turns.lock() {
            *turns_by.entry(agent.to_owned()).or_default() += turns;
            if delegated_turns > 0 {
                *turns_by.entry("delegates".to_owned()).or_default() += delegated_turns;
            }
        }
    }

    /// Takes one model turn for `agent`, or says that the budget is spent.
    fn take(&self, agent: &str) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.budget).then_some(n + 1)
            })
            .is_ok();
        if !taken {
            self.exhausted.store(true, Ordering::SeqCst);
        } else if let Ok(mut turns) = self.turns.lock() {
            *turns.entry(agent.to_owned()).or_default() += 1;
        }
        taken
    }

    /// Whether an agent found the budget spent.
    pub fn exhausted(&self) -> bool {
        self.exhausted.load(Ordering::SeqCst)
    }

    fn spent(&self) -> String {
        let turns = self.turns.lock().map(|t| t.clone()).unwrap_or_default();
        turns
            .iter()
            .map(|(agent, n)| format!("{agent} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where one agent of a delegation tree stands: the agents that asked it, outermost first, itself last.
#[derive(Debug)]
pub(in crate::run::scheduler) struct Chain<'t> {
    pub tree: &'t Tree,
    pub agents: Vec<String>,
    /// What the part of the tree below each agent on the chain spent (the agent's own turns with its
    /// delegates'), this agent's last: what its checkpoints and finished delegations record, so that a
    /// resumed run counts it again.
    spent: Vec<Arc<Spent>>,
}

/// Model turns and delegations one agent's part of a delegation tree spent.
#[derive(Debug, Default)]
pub(in crate::run::scheduler) struct Spent {
    turns: AtomicU32,
    delegations: AtomicU32,
}

impl Spent {
    pub fn new(turns: u32, delegations: u32) -> Spent {
        Spent {
            turns: AtomicU32::new(turns),
            delegations: AtomicU32::new(delegations),
        }
    }

    pub fn turns(&self) -> u32 {
        self.turns.load(Ordering::SeqCst)
    }

    pub fn delegations(&self) -> u32 {
        self.delegations.load(Ordering::SeqCst)
    }
}

impl<'t> Chain<'t> {
    /// The chain of the step's own agent, which starts the tree.
    pub fn root(tree: &'t Tree, agent: &str) -> Chain<'t> {
        Chain {
            tree,
            agents: vec![agent.to_owned()],
            spent: vec![Arc::default()],
        }
    }

    pub(super) fn child(&self, agent: &str) -> Chain<'t> {
        let mut agents = self.agents.clone();
        agents.push(agent.to_owned());
        let mut spent = self.spent.clone();
        spent.push(Arc::default());
        Chain {
            tree: self.tree,
            agents,
            spent,
        }
    }

    /// Counts again what an earlier process spent here before the checkpoint this agent continues from:
    /// its `own` turns and what its delegates spent.
    pub fn restore(&self, own: u32, delegated: &Spent) {
        self.tree.restore(self.agent(), own, delegated);
        let turns = own + delegated.turns.load(Ordering::SeqCst);
        let delegations = delegated.delegations.load(Ordering::SeqCst);
        for spent in &self.spent {
            spent.turns.fetch_add(turns, Ordering::SeqCst);
            spent.delegations.fetch_add(delegations, Ordering::SeqCst);
        }
    }

    /// What this agent's delegates have spent so far, when it has taken `own` turns itself.
    pub fn delegated(&self, own: u32) -> Spent {
        let here = self.spent.last();
        let load = |n: Option<&AtomicU32>| n.map_or(0, |n| n.load(Ordering::SeqCst));
        Spent::new(
            load(here.map(|s| &s.turns)).saturating_sub(own),
            load(here.map(|s| &s.delegations)),
        )
    }

    /// A delegation this agent made: counted at every level above it.
    fn delegating(&self) {
        for spent in &self.spent {
            spent.delegations.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// How many delegations deep this agent is (0 for the step's own agent).
    pub fn depth(&self) -> u32 {
        u32::try_from(self.agents.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    fn agent(&self) -> &str {
        self.agents.last().map_or("the step", String::as_str)
    }

    fn shown(&self) -> String {
        self.agents.join(" → ")
    }

    /// Takes the model turn the agent is about to take, or fails the step: the tree's budget is spent.
    pub fn turn(&self) -> Result<(), Failure> {
        if self.tree.take(self.agent()) {
            for spent in &self.spent {
                spent.turns.fetch_add(1, Ordering::SeqCst);
            }
            return Ok(());
        }
        let mut failure = Failure::fixed(format!(
            "the step's budget of {} model turns ran out in `{}` (chain `{}`; turns: {})\n  hint: raise the step's `max_iterations`: its delegates spend the same budget",
            self.tree.budget,
            self.agent(),
            self.shown(),
            self.tree.spent()
        ));
        failure.status = StepStatus::Incomplete;
        Err(failure)
    }

    /// The tools that delegate to `agent`'s delegates: none on the last level.
    pub fn tools(&self, shared: &Shared, agent: Option<&AgentDef>) -> Vec<ToolSpec> {
        let Some(agent) = agent else {
            return Vec::new();
        };
        if self.depth() >= self.tree.max_depth {
            return Vec::new();
        }
        let spec = &shared.workflow.spec;
        agent.delegates.iter().map(|d| tool(spec, d)).collect()
    }
}

/// The tool that delegates to `delegate`, as an agent listing it is offered it (`archon tools` shows it
/// too).
pub fn tool(spec: &Spec, delegate: &Spanned<Delegate>) -> ToolSpec {
    let name = delegate.name();
    let about = spec
        .agents
        .get(name)
        .and_then(|a| a.description.as_deref())
        .unwrap_or("another agent of this workflow");
    let description = if delegate.value.hands_off() {
        format!(
            "Hand this whole task over to agent `{name}` ({about}). Its answer becomes the final answer: your turn ends."
        )
    } else {
        format!("Ask agent `{name}` to do a task for you and return its answer: {about}")
    };
    ToolSpec {
        name: format!("{PREFIX}{name}"),
        description,
        parameters: json!({
            "type": "object",
            "properties": {
                "task": { "type": "string", "description": "what the agent should do, self-contained" },
                "context": { "type": "string", "description": "what it needs to know to do it" }
            },
            "required": ["task"],
            "additionalProperties": false
        }),
    }
}

/// The delegate entry of `agent` that tool `tool` (by its real name) calls, if it is a delegation.
pub(super) fn entry<'a>(agent: Option<&'a AgentDef>, tool: &str) -> Option<&'a Spanned<Delegate>> {
    let name = tool.strip_prefix(PREFIX)?;
    agent?.delegates.iter().find(|d| d.name() == name)
}

/// How a delegation ended, as the caller's conversation and record take it.
pub(super) struct Delegated {
    /// What the caller's model reads.
    pub text: String,
    pub is_error: bool,
    /// The delegate's answer, for a handoff.
    pub output: Json,
    /// The delegate's result as the step's record nests it (none when the call was refused).
    pub record: Option<(String, StepResult)>,
}

/// A finished delegation, as the record keeps it under the delegate's label: a resumed run returns it
/// instead of running the delegate again.
#[derive(Serialize, Deserialize)]
struct Finished {
    /// The SHA-256 of the agent and its task: another task at the same place runs afresh.
    delegation: String,
    text: String,
    is_error: bool,
    result: StepResult,
    /// The model turns the delegate and its own delegates took.
    #[serde(default)]
    turns: u32,
    /// The delegations the delegate made, at every depth.
    #[serde(default)]
    delegations: u32,
}

/// What a call of a delegation tool asks for.
pub(super) struct Request<'a> {
    pub label: &'a str,
    pub iteration: u32,
    /// The call's place among the turn's calls.
    pub index: usize,
    pub delegate: &'a Spanned<Delegate>,
    pub arguments: &'a Json,
    /// For a handoff: the step's own `output_schema`.
    pub step_schema: Option<&'a crate::spec::JsonSchemaValue>,
}

/// Runs one delegation: refused when it would re-enter the chain, go past the step's delegations or
/// carry too much; else the delegate runs as a child agent. A child waiting for approval, or one that
/// spent the tree's budget, stops the caller too (`Err`); any other failure is the caller's tool error.
pub(super) async fn call(
    shared: &Shared,
    chain: &Chain<'_>,
    ctx: &Value,
    request: Request<'_>,
) -> Result<Delegated, Failure> {
    let name = request.delegate.name();
    let refused = |text: String| Delegated {
        text,
        is_error: true,
        output: Json::Null,
        record: None,
    };
    if chain.agents.iter().any(|a| a == name) {
        return Ok(refused(format!(
            "this delegation was not made: `{name}` is already working on this task (chain `{} → {name}`); do the work yourself or ask another agent",
            chain.shown()
        )));
    }
    let text_of = |key: &str| {
        request
            .arguments
            .get(key)
            .and_then(Json::as_str)
            .unwrap_or_default()
    };
    let (task, context) = (text_of("task"), text_of("context"));
    if task.trim().is_empty() {
        return Ok(refused(
            "this delegation was not made: `task` is empty".to_owned(),
        ));
    }
    if task.len() + context.len() > MAX_TASK_BYTES {
        return Ok(refused(format!(
            "this delegation was not made: its task and context are {} bytes, more than the {} KiB a delegation may carry",
            task.len() + context.len(),
            MAX_TASK_BYTES / 1024
        )));
    }
    let made = chain.tree.delegations.fetch_add(1, Ordering::SeqCst) + 1;
    if made > chain.tree.max_delegations {
        return Ok(refused(format!(
            "this delegation was not made: the step has made the {} delegations `defaults.max_delegations` allows; finish the task with what you have",
            chain.tree.max_delegations
        )));
    }
    chain.delegating();
    let label = format!(
        "{}/{name}#{}.{}",
        request.label,
        request.iteration,
        request.index + 1
    );
    let mut goal = task.to_owned();
    if !context.trim().is_empty() {
        goal.push_str(&format!("\n\nContext from `{}`:\n{context}", chain.agent()));
    }
    let delegation = crate::store::spec_hash(&[(name.to_owned(), goal.clone())]);
    if let Some(finished) = take_finished(shared, &label, &delegation) {
        // What it spent is spent: the step's budget and its delegations count it again.
        chain
            .child(name)
            .restore(finished.turns, &Spent::new(0, finished.delegations));
        super::super::checkpoint::count_restored(
            shared,
            finished.result.llm.as_ref().unwrap_or(&LlmUsage::default()),
        );
        return Ok(Delegated {
            text: finished.text,
            is_error: finished.is_error,
            output: finished.result.output.clone(),
            record: Some((short(&label), finished.result)),
        });
    }
    let schema = if request.delegate.value.hands_off() {
        request.step_schema
    } else {
        request.delegate.value.output_schema.as_deref()
    };
    let body = Body {
        description: None,
        tool: None,
        goal: None,
        plan: None,
        workflow: None,
        args: None,
        context: None,
        expected_output: None,
        output_schema: schema,
        tools: None,
        max_iterations: None,
        agent: Some(&request.delegate.value.agent),
        provider: None,
        ask: None,
        consensus: None,
        retry: None,
        timeout: None,
        on_error: None,
        idempotent: None,
    };
    let child = chain.child(name);
    shared.llm.delegate(&label, &chain.tree.step);
    let metered = Metered {
        shared,
        label: &label,
    };
    let started = Instant::now();
    let outcome = super::run_as(shared, &label, body, goal, ctx, Some(&child)).await;
    drop(metered);
    let duration_ms = millis(started.elapsed());
    let (text, is_error, result) = match outcome {
        Ok(called) => {
            let text = called.output.text.clone();
            (text, false, nested_result(Ok(called), duration_ms))
        }
        // A person must decide: the caller pauses too, and takes this delegation up again on resume.
        Err(failure) if failure.status == StepStatus::WaitingApproval => return Err(failure),
        // The whole tree is out of turns: the step ends, with the delegate's result in its record.
        Err(mut failure) if chain.tree.exhausted.load(Ordering::SeqCst) => {
            let result = StepResult {
                steps: std::mem::take(&mut failure.steps),
                llm: failure.llm.as_deref().cloned(),
                attempts: 1,
                duration_ms,
                ..StepResult::ended(failure.status, Some(failure.message.clone()))
            };
            failure.steps = IndexMap::from([(short(&label), result)]);
            return Err(failure);
        }
        Err(failure) => {
            let text = format!("agent `{name}` failed: {}", failure.message);
            (text, true, nested_result(Err(failure), duration_ms))
        }
    };
    let result = StepResult {
        task: Some(task.to_owned()),
        ..result
    };
    // Recorded before the caller goes on: a resumed run takes this answer instead of asking again.
    let spent = child.delegated(0);
    let finished = Finished {
        delegation,
        text: text.clone(),
        is_error,
        result: result.clone(),
        turns: spent.turns(),
        delegations: spent.delegations(),
    };
    let saved = super::super::checkpoint::save(shared, &label, &finished);
    durable(shared, saved, Record::AgentCheckpoint).await?;
    Ok(Delegated {
        text,
        is_error,
        output: result.output.clone(),
        record: Some((short(&label), result)),
    })
}

/// While a delegate works its model time is the step's: until it returns, or its step stops (a timeout,
/// a cancelled run) and drops it.
struct Metered<'a> {
    shared: &'a Shared,
    label: &'a str,
}

impl Drop for Metered<'_> {
    fn drop(&mut self) {
        self.shared.llm.undelegate(self.label);
    }
}

/// A child agent's outcome (a delegate's, or an agent a step asked) as its caller's record nests it.
pub(super) fn nested_result(outcome: Result<Called, Failure>, duration_ms: u64) -> StepResult {
    match outcome {
        Ok(Called {
            output, steps, llm, ..
        }) => StepResult {
            status: StepStatus::Succeeded,
            text: output.text,
            output: output.output,
            steps,
            llm,
            attempts: 1,
            duration_ms,
            ..StepResult::ended(StepStatus::Succeeded, None)
        },
        Err(failure) => StepResult {
            steps: failure.steps,
            llm: failure.llm.map(|u| *u),
            attempts: 1,
            duration_ms,
            ..StepResult::ended(failure.status, Some(failure.message))
        },
    }
}

/// The name a delegate's result has among the calling step's nested results: its label after the step's.
fn short(label: &str) -> String {
    label.rsplit('/').next().unwrap_or(label).to_owned()
}

/// The finished delegation an earlier process recorded at `label` for the same delegation, taken.
fn take_finished(shared: &Shared, label: &str, delegation: &str) -> Option<Finished> {
    let mut checkpoints = shared.options.checkpoints.lock().ok()?;
    let finished: Finished = serde_json::from_value(checkpoints.get(label)?.clone()).ok()?;
    checkpoints.remove(label);
    (finished.delegation == delegation).then_some(finished)
}

/// Adds what a delegate used to its caller's usage (the caller's own largest prompt stays its own).
pub(super) fn add_usage(usage: &mut LlmUsage, delegate: Option<&LlmUsage>) {
    if let Some(delegate) = delegate {
        let largest = usage.largest_prompt;
        usage.add(delegate);
        usage.largest_prompt = largest;
    }
}
