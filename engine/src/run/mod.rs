//! Running a validated workflow: every ready step starts at once (bounded by `max_parallel`), data flows
//! through templates rendered once, and every step ends with a [`StepResult`].
//!
//! Semantics, documented in docs/run.md: a step without `if` runs when all its dependencies succeeded and is
//! skipped otherwise; an explicit `if` replaces that rule. A failed step fails the run unless it has
//! `on_error: continue`; steps that do not depend on it keep running. `retry.attempts` counts every attempt.

mod calculator;
mod files;
pub mod http;
mod jq;
pub mod render;
mod scheduler;
pub mod tools;

use std::collections::BTreeMap;
use std::path::PathBuf;

use indexmap::IndexMap;
use serde::Serialize;
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::spec::{Body, Step};
use crate::tools::builtin;
use crate::workflow::Workflow;

pub use scheduler::run;

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
    /// Receives progress events, if set.
    pub events: Option<tokio::sync::mpsc::UnboundedSender<RunEvent>>,
    /// The process environment, readable as `env` in templates.
    pub env: BTreeMap<String, String>,
}

/// Progress of a run, for displays and event logs.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Succeeded,
    Failed,
    TimedOut,
    Skipped,
    Cancelled,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Succeeded => "succeeded",
            StepStatus::Failed => "failed",
            StepStatus::TimedOut => "timed_out",
            StepStatus::Skipped => "skipped",
            StepStatus::Cancelled => "cancelled",
        }
    }
}

/// How a step ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Succeeded,
    Failed,
    Cancelled,
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
}

/// The built-in tools this version executes.
pub const RUNNABLE_BUILTINS: &[&str] = &[
    "echo",
    "sleep",
    "exec",
    "shell",
    "read_file",
    "write_file",
    "list_files",
    "calculator",
    "json",
    "http",
];

/// A step this version cannot execute, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub step: String,
    pub reason: String,
}

/// The steps (and fallbacks) of a workflow that this version cannot run yet. `archon run` refuses such a
/// workflow before starting rather than failing half-way.
pub fn unsupported_steps(workflow: &Workflow) -> Vec<Unsupported> {
    let mut found = Vec::new();
    for step in &workflow.spec.steps {
        let mut check = |body: Body<'_>, what: &str| {
            if let Some(reason) = unsupported_body(workflow, body) {
                found.push(Unsupported {
                    step: step.id.value.clone(),
                    reason: format!("{what}{reason}"),
                });
            }
        };
        check(step.body(), "");
        if let Some(fallback) = &step.fallback {
            check(fallback.body(), "its fallback: ");
        }
        if step
            .approval
            .as_ref()
            .is_some_and(|a| a.value == crate::spec::Approval::Required)
        {
            found.push(Unsupported {
                step: step.id.value.clone(),
                reason:
                    "`approval: required` is not enforced yet, and a run must not skip the approval"
                        .to_owned(),
            });
        }
    }
    // Running without the rules a spec declares would silently drop its protections.
    if !workflow.spec.rules.is_empty() {
        found.push(Unsupported {
            step: "(rules)".to_owned(),
            reason: "interception rules are not enforced yet, and a run must not ignore them"
                .to_owned(),
        });
    }
    found
}

fn unsupported_body(workflow: &Workflow, body: Body<'_>) -> Option<String> {
    if let Some(tool) = body.tool {
        let name = tool.value.as_str();
        if let Some(def) = workflow.spec.tools.get(name) {
            return (def.command.is_none() && def.http.is_none()).then(|| {
                format!("declared tool `{name}` is neither a `command` nor an `http` tool; composite, workflow and MCP tools cannot run yet")
            });
        }
        return match builtin::get(name) {
            Some(_) if RUNNABLE_BUILTINS.contains(&name) => None,
            Some(_) => Some(format!(
                "built-in tool `{name}` cannot run yet (these can: {})",
                RUNNABLE_BUILTINS.join(", ")
            )),
            None => Some(format!("tool `{name}` cannot run yet")),
        };
    }
    if body.workflow.is_some() {
        return Some("sub-workflows cannot run yet".to_owned());
    }
    Some(
        "LLM steps (goal, plan, description-only) cannot run yet: LLM providers are not built"
            .to_owned(),
    )
}

fn step_ids(steps: &[Step]) -> Vec<String> {
    steps.iter().map(|s| s.id.value.clone()).collect()
}
