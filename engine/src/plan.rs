//! The execution plan of a validated workflow: each step's kind and the waves of steps that can run
//! together (a step's wave is one more than the latest wave among its dependencies).

use serde::Serialize;

use crate::spec::{Step, Unspecified};
use crate::workflow::Workflow;

/// How a step will be executed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepKind {
    /// A deterministic tool call.
    Tool { tool: String },
    /// An LLM agent (ReAct loop); `unspecified` when the step only had a description.
    Agent { unspecified: bool },
    /// The LLM planner, which adds steps at run time.
    Planner { unspecified: bool },
    /// A sub-workflow.
    Workflow { path: String },
}

impl StepKind {
    fn of(step: &Step, unspecified: Unspecified) -> StepKind {
        if let Some(tool) = &step.tool {
            StepKind::Tool {
                tool: tool.value.clone(),
            }
        } else if step.goal.is_some() {
            StepKind::Agent { unspecified: false }
        } else if step.plan.is_some() {
            StepKind::Planner { unspecified: false }
        } else if let Some(path) = &step.workflow {
            StepKind::Workflow {
                path: path.value.clone(),
            }
        } else if unspecified == Unspecified::Plan {
            StepKind::Planner { unspecified: true }
        } else {
            StepKind::Agent { unspecified: true }
        }
    }

    /// A short label: `tool echo`, `agent`, `planner`, `workflow sub.yaml`.
    pub fn label(&self) -> String {
        match self {
            StepKind::Tool { tool } => format!("tool {tool}"),
            StepKind::Agent { unspecified: false } => "LLM agent".to_owned(),
            StepKind::Agent { unspecified: true } => "LLM agent (unspecified step)".to_owned(),
            StepKind::Planner { unspecified: false } => "LLM planner".to_owned(),
            StepKind::Planner { unspecified: true } => "LLM planner (unspecified step)".to_owned(),
            StepKind::Workflow { path } => format!("workflow {path}"),
        }
    }
}

/// One step in the plan.
#[derive(Clone, Debug, Serialize)]
pub struct PlannedStep {
    pub id: String,
    #[serde(flatten)]
    pub kind: StepKind,
    /// Ids of the steps this one depends on (`needs` and references).
    pub depends_on: Vec<String>,
    /// 1-based: wave 1 holds the steps with no dependencies.
    pub wave: usize,
    /// Runs once per item of a list.
    pub foreach: bool,
    /// Has an `if` condition.
    pub conditional: bool,
}

/// The plan: steps in document order, and the waves (the first is wave 1) as lists of step indexes.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub workflow: String,
    pub steps: Vec<PlannedStep>,
    pub waves: Vec<Vec<usize>>,
}

impl Plan {
    pub fn new(workflow: &Workflow) -> Plan {
        let spec = &workflow.spec;
        let unspecified = spec
            .defaults
            .as_ref()
            .and_then(|d| d.unspecified.as_ref())
            .map_or(Unspecified::Agent, |u| u.value);
        let mut wave = vec![0usize; spec.steps.len()];
        for &index in &workflow.order {
            wave[index] = workflow.dependencies[index]
                .iter()
                .map(|d| wave[*d] + 1)
                .max()
                .unwrap_or(0);
        }
        let mut waves: Vec<Vec<usize>> = vec![Vec::new(); wave.iter().max().map_or(0, |w| w + 1)];
        for (index, w) in wave.iter().enumerate() {
            waves[*w].push(index);
        }
        let steps = spec
            .steps
            .iter()
            .enumerate()
            .map(|(index, step)| PlannedStep {
                id: step.id.value.clone(),
                kind: StepKind::of(step, unspecified),
                depends_on: workflow.dependencies[index]
                    .iter()
                    .map(|d| spec.steps[*d].id.value.clone())
                    .collect(),
                wave: wave[index] + 1,
                foreach: step.repeats(),
                conditional: step.condition.is_some(),
            })
            .collect();
        Plan {
            workflow: workflow.name.clone(),
            steps,
            waves,
        }
    }
}
