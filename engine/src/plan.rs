//! The execution plan of a validated workflow: each step's kind and the waves of steps that can run
//! together (a step's wave is one more than the latest wave among its dependencies), and for an agent
//! step, the agents it may reach by delegation.

use serde::Serialize;

use crate::spec::{Spec, Step, Unspecified};
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
    /// For an agent step: the declared agent it plays (its own `agent`, else `defaults.agent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The agents that agent may reach by delegation, nearest first (see [`reach`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reaches: Vec<Reach>,
}

/// An agent a step's agent may reach by delegation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reach {
    pub agent: String,
    /// Delegations on the shortest way there: 1 for the step's agent's own delegates.
    pub depth: u32,
    /// The agents one level up that list it in `delegates` (the first asked it first in the spec).
    pub from: Vec<String>,
    /// Its own delegates it is not offered: it is on the last level `defaults.max_delegation_depth`
    /// allows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub beyond_depth: Vec<String>,
}

/// The agents `agent` may reach by delegation, level by level, each at the least depth it can be reached
/// at, down to `defaults.max_delegation_depth` levels. An agent already on a chain cannot be asked again
/// (the run refuses such a delegation), so the agent itself is never reached.
pub fn reach(spec: &Spec, agent: &str) -> Vec<Reach> {
    let max_depth = spec.max_delegation_depth();
    let delegates = |name: &str| -> Vec<&str> {
        spec.agents
            .get(name)
            .map(|a| a.delegates.iter().map(|d| d.name()).collect())
            .unwrap_or_default()
    };
    let mut reached: Vec<Reach> = Vec::new();
    let mut level = vec![agent.to_owned()];
    for depth in 1..=max_depth {
        let mut next = Vec::new();
        for asker in &level {
            for delegate in delegates(asker) {
                if delegate == agent {
                    continue;
                }
                match reached.iter_mut().find(|r| r.agent == delegate) {
                    Some(found) if found.depth == depth => {
                        if !found.from.contains(asker) {
                            found.from.push(asker.clone());
                        }
                    }
                    Some(_) => {}
                    None => {
                        reached.push(Reach {
                            agent: delegate.to_owned(),
                            depth,
                            from: vec![asker.clone()],
                            beyond_depth: if depth == max_depth {
                                delegates(delegate).into_iter().map(str::to_owned).collect()
                            } else {
                                Vec::new()
                            },
                        });
                        next.push(delegate.to_owned());
                    }
                }
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    reached
}

/// The plan: steps in document order, and the waves (the first is wave 1) as lists of step indexes.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub workflow: String,
    pub steps: Vec<PlannedStep>,
    pub waves: Vec<Vec<usize>>,
    /// `defaults.max_delegation_depth` (or its default), when a step's agent may delegate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_delegation_depth: Option<u32>,
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
                agent: agent(spec, step, unspecified),
                reaches: agent(spec, step, unspecified)
                    .map(|a| reach(spec, &a))
                    .unwrap_or_default(),
            })
            .collect::<Vec<PlannedStep>>();
        Plan {
            workflow: workflow.name.clone(),
            max_delegation_depth: steps
                .iter()
                .any(|s| !s.reaches.is_empty())
                .then(|| spec.max_delegation_depth()),
            steps,
            waves,
        }
    }
}

/// The declared agent an agent step plays.
fn agent(spec: &Spec, step: &Step, unspecified: Unspecified) -> Option<String> {
    matches!(StepKind::of(step, unspecified), StepKind::Agent { .. })
        .then(|| spec.agent_name(step.body()))
        .flatten()
        .filter(|name| spec.agents.contains_key(*name))
        .map(str::to_owned)
}
