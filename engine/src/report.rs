//! What a run reports: its events as they happen, each step's result, the final report, and the calls that
//! ask a person. Plain data, shared by the runtime that produces it, the store that keeps it (through its
//! records) and the front ends that show it.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// Version of the run report format (documented in docs/run.md).
pub const REPORT_VERSION: u32 = 1;

/// A decision on a call that asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    pub approved: bool,
    /// Who decided: a user name, `--yes`, `timeout`.
    pub by: String,
    pub reason: Option<String>,
}

impl ApprovalDecision {
    /// What a rule's `default` decides on a request whose `timeout` passed with nobody deciding: recorded
    /// alike whether a prompt at the terminal timed out, a resume found the request past its timeout, or a
    /// worker took up a step the reaper made ready again once its requests' timeouts passed.
    pub fn timed_out(approved: bool) -> Self {
        ApprovalDecision {
            approved,
            by: "timeout".to_owned(),
            reason: Some("nobody decided in time".to_owned()),
        }
    }
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
    /// A person recorded what became of a step in doubt (`archon resolve`).
    StepResolved {
        step: String,
        status: StepStatus,
        by: String,
        reason: Option<String>,
    },
    /// A step (or `foreach` item) with `cache` reuses the result step `from` of run `run` produced.
    StepCached {
        step: String,
        run: String,
        from: String,
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
    /// One request of a model call that failed (a timeout, an HTTP error, a broken body), as it fails:
    /// the provider tries again when `retrying`, else the call fails with the same error.
    LlmCallFailed {
        step: String,
        provider: String,
        model: String,
        /// 1 for the call's first request.
        attempt: u32,
        error: String,
        retrying: bool,
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
        /// The summary that replaced them (cut when long).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
    },
    /// A final answer that did not match `output_schema`, and the correction sent back to the model.
    AgentAnswerRejected {
        step: String,
        iteration: u32,
        /// The answer (cut when long).
        text: String,
        correction: String,
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
    /// A step that asked several agents (`ask`) resolved their answers (`by`: `vote`, `judge` or
    /// `first`): `winner` is the agent whose answer became the step's (none when a judge gave it), and
    /// `summary` says how (the votes, the judge, the answers cancelled). The step's nested result
    /// `consensus` holds the same resolution as data.
    Consensus {
        step: String,
        by: String,
        winner: Option<String>,
        summary: String,
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
    /// Requests sent to a model, failed ones included.
    pub calls: u64,
    /// Of those, the ones that failed (a timeout, an HTTP error), which reported no usage.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    /// The cost of the calls whose model has a known price, in USD.
    pub cost_usd: f64,
    /// Calls whose model has no known price (not in `cost_usd`).
    pub unpriced_calls: u64,
    /// The largest prompt one call sent, in tokens (as the provider counted it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub largest_prompt: u64,
    /// An agent step's working memory: its model's context window, where earlier turns are compacted,
    /// and how many times they were. Only a step's own usage has it, not a sum over steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextUse>,
}

/// The limits of an agent step's working memory, and how often it reached them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextUse {
    /// The model's context window, in tokens.
    pub window: u64,
    /// The prompt size, in tokens, past which earlier turns are summarised.
    pub compact_at: u64,
    /// How many times they were.
    pub compactions: u32,
}

impl LlmUsage {
    /// One request that failed: it counts as a call, with no usage known.
    pub fn failed() -> Self {
        LlmUsage {
            calls: 1,
            failed_calls: 1,
            ..LlmUsage::default()
        }
    }

    /// One call's usage and cost.
    pub fn one(usage: &crate::llm::Usage, cost: Option<f64>) -> Self {
        LlmUsage {
            calls: 1,
            failed_calls: 0,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            cost_usd: cost.unwrap_or(0.0),
            unpriced_calls: u64::from(cost.is_none()),
            largest_prompt: usage.input_tokens,
            context: None,
        }
    }

    pub fn add(&mut self, other: &LlmUsage) {
        // Counts come from providers: a nonsense value must not overflow.
        self.calls = self.calls.saturating_add(other.calls);
        self.failed_calls = self.failed_calls.saturating_add(other.failed_calls);
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
        self.cost_usd += other.cost_usd;
        self.unpriced_calls = self.unpriced_calls.saturating_add(other.unpriced_calls);
        self.largest_prompt = self.largest_prompt.max(other.largest_prompt);
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
    /// Attempts made, the first and the fallback's included (summed over items for `foreach`), as many
    /// as the run recorded for the step in its last run.
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
    /// The result was not produced by this run: it was reused from the cache (`cache:` on the step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached: Option<CachedFrom>,
    /// For a delegation (a result nested in an agent step's, under `<agent>#<iteration>.<call>`): the task
    /// the calling agent gave the delegate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
}

/// Where a reused result came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedFrom {
    /// The run, and its step or `foreach` item, that produced it.
    pub run: String,
    pub step: String,
    /// When it was produced (milliseconds since the Unix epoch).
    pub at_ms: u64,
}

impl StepResult {
    pub(crate) fn ended(status: StepStatus, error: Option<String>) -> Self {
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
            cached: None,
            task: None,
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

fn is_zero(n: &u64) -> bool {
    *n == 0
}
