//! Running a validated workflow: every ready step starts at once (bounded by `max_parallel`), data flows
//! through templates rendered once, and every step ends with a [`StepResult`].
//!
//! Semantics, documented in docs/run.md: a step without `if` runs when all its dependencies succeeded and is
//! skipped otherwise; an explicit `if` replaces that rule. A failed step fails the run unless it has
//! `on_error: continue`; steps that do not depend on it keep running. `retry.attempts` counts every attempt.

mod calculator;
mod files;
pub mod http;
pub mod jq;
pub mod redact;
pub mod render;
pub mod rules;
mod scheduler;
pub mod secrets;
pub mod tools;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::spec::{Body, Step};
use crate::store::{Journal, MemoryJournal};
use crate::tools::builtin;
use crate::workflow::Workflow;

pub use scheduler::{RunError, run};

/// Most composite tools and sub-workflows nested inside each other at run time.
pub const MAX_DEPTH: u32 = 16;

/// Version of the run report format (documented in docs/run.md).
pub const REPORT_VERSION: u32 = 1;

/// How a run is carried out.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Most steps (and `foreach` items of steps without their own limit) running at once.
    pub max_parallel: usize,
    /// The workspace: where commands run and file paths point.
    pub workdir: PathBuf,
    pub run_id: String,
    /// Cancels the run: in-flight steps are abandoned (their process groups killed).
    pub cancel: CancellationToken,
    /// Receives progress events, if set. Steps inside composite tools and sub-workflows are named
    /// `outer/inner` (`outer[2]/inner` for a `foreach` item).
    pub events: Option<tokio::sync::mpsc::UnboundedSender<RunEvent>>,
    /// The process environment, readable as `env` in templates.
    pub env: BTreeMap<String, String>,
    /// Where the run records attempts, results and events as they happen ([`MemoryJournal`] keeps
    /// nothing).
    pub journal: Arc<dyn Journal>,
    /// Final results of an earlier process running this run (`archon resume`), by step or `step[i]`:
    /// those steps and items are not run again, and their results are reused as they are.
    pub prior: Arc<HashMap<String, StepResult>>,
    /// Record or replay the run's LLM calls.
    pub cassette: Option<Cassette>,
    /// Where an earlier process left LLM steps it did not finish (`archon resume`), by step name: an
    /// agent continues from its last completed iteration, a planner from its last accepted plan.
    /// Each is used once: a retry within the resumed run starts afresh.
    pub checkpoints: Arc<std::sync::Mutex<HashMap<String, Json>>>,
    /// How calls that ask for approval get an answer.
    pub approvals: Approvals,
    /// The `archon` executable, run again as a helper process for work that must be killable by a
    /// step's timeout and must not take the run down with it (jq filters, `archon __jq`). Without it,
    /// `json` steps fail.
    pub helper: Option<PathBuf>,
}

/// How calls that ask for a person's approval are decided: decisions already recorded (`archon approve`),
/// `--yes`, a person at a terminal, or else the run pauses.
#[derive(Clone, Default)]
pub struct Approvals {
    /// Decisions recorded for this run, by approval key.
    pub decided: Arc<HashMap<String, ApprovalDecision>>,
    /// `--yes`: every call that asks is approved, and each approval is recorded as given by `--yes`.
    pub yes: bool,
    /// Asks a person (at a terminal); `None` when nobody can be asked while the run goes on.
    pub approver: Option<Arc<dyn Approver>>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("decided", &self.decided.len())
            .field("yes", &self.yes)
            .field("approver", &self.approver.is_some())
            .finish()
    }
}

/// A decision on a call that asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    pub approved: bool,
    /// Who decided: a user name, `--yes`, `timeout`.
    pub by: String,
    pub reason: Option<String>,
}

/// A call waiting for a person's decision, as shown to them and recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// SHA-256 over run, step, tool and the rendered arguments: a decision holds for this exact call.
    pub key: String,
    pub step: String,
    pub tool: Option<String>,
    /// The rendered arguments, secrets redacted.
    pub arguments: Json,
    pub reason: String,
    /// How long a person may take, and the decision after that.
    pub timeout_ms: Option<u64>,
    pub approve_on_timeout: bool,
}

/// Asks a person about a call; `None` when no answer came.
pub trait Approver: Send + Sync {
    fn ask<'a>(
        &'a self,
        request: &'a ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn Future<Output = Option<ApprovalDecision>> + Send + 'a>>;
}

/// What to do with the LLM calls of a run.
#[derive(Clone, Debug)]
pub enum Cassette {
    /// Write every request and response to this open cassette.
    Record(Arc<std::sync::Mutex<std::fs::File>>),
    /// Answer from these recorded exchanges, with no network.
    Replay(Arc<Vec<crate::llm::cassette::Exchange>>),
}

impl RunOptions {
    /// Options for a run in `workdir` with nothing recorded: up to 16 steps at once, the process
    /// environment, a fresh cancellation token.
    pub fn new(workdir: PathBuf, run_id: impl Into<String>) -> Self {
        RunOptions {
            max_parallel: 16,
            workdir,
            run_id: run_id.into(),
            cancel: CancellationToken::new(),
            events: None,
            env: std::env::vars().collect(),
            journal: Arc::new(MemoryJournal),
            prior: Arc::new(HashMap::new()),
            cassette: None,
            checkpoints: Default::default(),
            approvals: Approvals::default(),
            helper: None,
        }
    }
}

/// Progress of a run, for displays and event logs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    StepStarted {
        step: String,
    },
    StepRetried {
        step: String,
        attempt: u32,
        error: String,
        delay_ms: u64,
    },
    StepFinished {
        step: String,
        status: StepStatus,
        duration_ms: u64,
        error: Option<String>,
    },
    StepSkipped {
        step: String,
        reason: String,
    },
    /// A resumed run reuses the result an earlier process recorded.
    StepReused {
        step: String,
        status: StepStatus,
    },
    /// An agent step called its model.
    LlmCall {
        step: String,
        provider: String,
        model: String,
        input_tokens: u64,
        output_tokens: u64,
        /// `None` when the model's price is unknown.
        cost_usd: Option<f64>,
        duration_ms: u64,
    },
    /// What the model said before acting (its text or reasoning).
    AgentThought {
        step: String,
        iteration: u32,
        text: String,
    },
    /// A tool call the model asked for.
    AgentAction {
        step: String,
        iteration: u32,
        tool: String,
        arguments: Json,
    },
    /// What the tool call returned, as the model reads it (cut when long).
    AgentObservation {
        step: String,
        iteration: u32,
        tool: String,
        text: String,
        error: bool,
        /// The whole output, when `text` is cut.
        #[serde(skip_serializing_if = "Option::is_none")]
        full_text: Option<String>,
    },
    /// The conversation neared the model's context window: earlier turns were replaced by a summary.
    AgentCompacted {
        step: String,
        iteration: u32,
        /// The assistant turns summarised.
        turns: u32,
        /// The prompt's estimated tokens before and after.
        tokens_before: u64,
        tokens_after: u64,
    },
    /// The agent's final answer (cut when long).
    AgentAnswer {
        step: String,
        iteration: u32,
        text: String,
    },
    /// The planner's model proposed a plan (its text, cut when long). `replan` counts the revisions
    /// before it (0 for the first plan); `attempt` counts the proposals for the same revision.
    PlanProposed {
        step: String,
        replan: u32,
        attempt: u32,
        text: String,
    },
    /// The validator rejected a proposed plan; the problems go back to the model.
    PlanRejected {
        step: String,
        replan: u32,
        attempt: u32,
        problems: Vec<String>,
    },
    /// A plan passed the validator and its steps are scheduled. `kept` are steps of the previous plan
    /// whose results are reused.
    PlanAccepted {
        step: String,
        replan: u32,
        steps: Vec<String>,
        kept: Vec<String>,
    },
    /// An LLM step continues where an earlier process left it (`archon resume`): `from` says where.
    Resumed {
        step: String,
        from: String,
    },
    /// A rule matched: `log` (and `redact`) rules say so; `deny` says why a call did not run.
    RuleMatched {
        step: Option<String>,
        tool: Option<String>,
        on: crate::spec::Trigger,
        rule: String,
        action: crate::spec::Action,
    },
    /// A call needs a person's approval (`key` binds it to the tool, arguments, run and step).
    ApprovalRequested {
        step: String,
        tool: Option<String>,
        arguments: Json,
        reason: String,
        key: String,
    },
    /// Someone (or `--yes`, or a timeout) decided on a call that asked.
    ApprovalDecided {
        step: String,
        tool: Option<String>,
        approved: bool,
        by: String,
        reason: Option<String>,
    },
    /// A planned step failed after its retries: the planner revises the rest of the plan.
    PlanRevising {
        step: String,
        replan: u32,
        reason: String,
    },
}

/// What LLM calls used: per step, and for the whole run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LlmUsage {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    /// The cost of the calls whose model has a known price, in USD.
    pub cost_usd: f64,
    /// Calls whose model has no known price (not in `cost_usd`).
    pub unpriced_calls: u64,
}

impl LlmUsage {
    /// One call's usage and cost.
    pub fn one(usage: &crate::llm::Usage, cost: Option<f64>) -> Self {
        LlmUsage {
            calls: 1,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            cost_usd: cost.unwrap_or(0.0),
            unpriced_calls: u64::from(cost.is_none()),
        }
    }

    pub fn add(&mut self, other: &LlmUsage) {
        // Counts come from providers: a nonsense value must not overflow.
        self.calls = self.calls.saturating_add(other.calls);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
        self.cost_usd += other.cost_usd;
        self.unpriced_calls = self.unpriced_calls.saturating_add(other.unpriced_calls);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Succeeded,
    Failed,
    TimedOut,
    Skipped,
    Cancelled,
    /// An agent kept making the same call.
    Stuck,
    /// An agent gave no final answer within its iterations.
    Incomplete,
    /// A call asked for a person's approval, which the run could not get while running: the run pauses
    /// (`archon approve`, then `archon resume`). Steps that depend on it wait too.
    WaitingApproval,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::TimedOut => "timed_out",
            StepStatus::Skipped => "skipped",
            StepStatus::Cancelled => "cancelled",
            StepStatus::Stuck => "stuck",
            StepStatus::Incomplete => "incomplete",
            StepStatus::WaitingApproval => "waiting_approval",
        }
    }

    /// Whether the step failed to do its job (and fails the run unless `on_error: continue`).
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            StepStatus::Failed | StepStatus::TimedOut | StepStatus::Stuck | StepStatus::Incomplete
        )
    }
}

/// How a step ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub status: StepStatus,
    /// The step's output as JSON (a list, in input order, for `foreach` steps).
    pub output: Json,
    /// The output as an LLM would read it.
    pub text: String,
    /// Named outputs (`outputs:`).
    pub outputs: Map<String, Json>,
    pub error: Option<String>,
    /// Attempts made, the first included (summed over items for `foreach`).
    pub attempts: u32,
    pub exit_code: Option<i32>,
    pub duration_ms: u64,
    /// The fallback produced the result.
    pub fallback: bool,
    /// For a composite tool or sub-workflow call, the results of its own steps (not kept for `foreach`
    /// items).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub steps: IndexMap<String, StepResult>,
    /// What the step's LLM calls used (agent steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmUsage>,
    /// For one item of a `foreach` step: the SHA-256 of the item, so that a resumed run reuses the result
    /// only for the same item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// For a planner step: the plan whose steps ran (the last revision), as a document of `steps` and
    /// `outputs` in the spec's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Box<Json>>,
}

impl StepResult {
    fn ended(status: StepStatus, error: Option<String>) -> Self {
        StepResult {
            status,
            output: Json::Null,
            text: String::new(),
            outputs: Map::new(),
            error,
            attempts: 0,
            exit_code: None,
            duration_ms: 0,
            fallback: false,
            steps: IndexMap::new(),
            llm: None,
            item: None,
            plan: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Succeeded,
    Failed,
    Cancelled,
    /// Paused until a person decides on a call (`archon approve`); exit code 3.
    WaitingApproval,
}

/// The final report of a run (`archon run --json`).
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub version: u32,
    pub run_id: String,
    pub workflow: String,
    pub status: RunStatus,
    pub inputs: Map<String, Json>,
    pub steps: IndexMap<String, StepResult>,
    pub outputs: Map<String, Json>,
    pub error: Option<String>,
    pub duration_ms: u64,
    /// What the run's LLM calls used, when it made any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmUsage>,
}

/// A step this version cannot execute, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub step: String,
    pub reason: String,
}

/// The steps (and fallbacks) of a workflow that this version cannot run yet, including those inside the
/// composite tools and sub-workflows it calls (named `outer/inner`). `archon run` refuses such a workflow
/// before starting rather than failing half-way.
pub fn unsupported_steps(workflow: &Workflow) -> Vec<Unsupported> {
    let mut walk = Walk {
        found: Vec::new(),
        seen: std::collections::HashSet::new(),
    };
    walk.workflow(workflow, "");
    walk.found
}

struct Walk {
    found: Vec<Unsupported>,
    /// Composite tools (by workflow address and name) and sub-workflows already checked.
    seen: std::collections::HashSet<(usize, String)>,
}

impl Walk {
    fn workflow(&mut self, workflow: &Workflow, prefix: &str) {
        self.steps(workflow, &workflow.spec.steps, prefix);
    }

    fn steps(&mut self, workflow: &Workflow, steps: &[Step], prefix: &str) {
        for step in steps {
            let name = format!("{prefix}{}", step.id.value);
            self.body(workflow, step.body(), &name, "");
            if let Some(fallback) = &step.fallback {
                self.body(workflow, fallback.body(), &name, "its fallback: ");
            }
        }
    }

    fn body(&mut self, workflow: &Workflow, body: Body<'_>, step: &str, what: &str) {
        let mut refuse = |reason: String| {
            self.found.push(Unsupported {
                step: step.to_owned(),
                reason: format!("{what}{reason}"),
            });
        };
        if let Some(tool) = body.tool {
            let name = tool.value.as_str();
            if let Some(def) = workflow.spec.tools.get(name) {
                if def.mcp.is_some() {
                    refuse(format!("MCP tool `{name}` cannot run yet"));
                } else if let Some(steps) = &def.steps {
                    let key = (std::ptr::from_ref(workflow) as usize, name.to_owned());
                    if self.seen.insert(key) {
                        self.steps(workflow, &steps.value, &format!("{step}/"));
                    }
                } else if let Some(path) = &def.workflow {
                    self.sub_workflow(workflow, &path.value, step);
                }
                return;
            }
            // Every built-in tool runs.
            if builtin::get(name).is_none() {
                refuse(format!("tool `{name}` cannot run yet"));
            }
            return;
        }
        if let Some(path) = body.workflow {
            self.sub_workflow(workflow, &path.value, step);
            return;
        }
        // An agent or planner step: its agent role must be one this version can play.
        if let Some(agent) = workflow.spec.agent_of(body) {
            if !agent.delegates.is_empty() {
                refuse("agent delegation (`delegates`) cannot run yet".to_owned());
            } else if agent.memory == Some(true) {
                refuse("agent memory (`memory: true`) cannot run yet".to_owned());
            }
        }
    }

    fn sub_workflow(&mut self, workflow: &Workflow, path: &str, step: &str) {
        if let Some(sub) = workflow.subworkflows.get(path) {
            let key = (Arc::as_ptr(sub) as usize, String::new());
            if self.seen.insert(key) {
                self.workflow(sub, &format!("{step}/"));
            }
        }
    }
}
