//! Plans written by the LLM planner: a document of `steps` (and `outputs`) in the spec's own format, checked
//! by the same validator as a hand-written spec, with the declarations of the workflow that planned it
//! (inputs, tools, providers, agents, defaults) and a few rules of its own: planned steps call tools or
//! pursue goals, use only the tools the planning step allows and never a sensitive one, and read neither
//! `env` nor `secrets`.

use std::path::PathBuf;

use super::{Checker, Validation, Validator};
use crate::diagnostic::{Diagnostic, codes};
use crate::spec::{Body, Node, Pattern, Spec, Step};
use crate::tools::{Registry, SafetyRule};
use crate::workflow::Workflow;

/// What the steps of a plan may do.
#[derive(Clone, Debug, Default)]
pub struct PlanPolicy {
    /// Globs over tool names: the planning step's `tools` (or its agent's).
    pub tools: Vec<Pattern>,
}

impl PlanPolicy {
    /// Whether a planned step may call `name`: allowed by a glob, and not sensitive (a composite tool
    /// counts as sensitive when one of its steps calls a sensitive tool; `http` is checked per call).
    pub fn allows(&self, tools: &Registry, name: &str) -> bool {
        let wanted = self.tools.iter().any(|p| p.matches(name));
        let entry = tools
            .get(name)
            .or_else(|| tools.mcp_server_of(name).map(|(server, _)| server));
        wanted && entry.is_some_and(|t| t.safety.may_be_harmless())
    }

    /// The tools a planned step may call, in the order the planner is told about them.
    pub fn allowed(&self, tools: &Registry) -> Vec<String> {
        tools
            .iter()
            .filter(|t| self.allows(tools, &t.name))
            .map(|t| t.name.clone())
            .collect()
    }
}

impl Validator {
    /// Validates a plan proposed for a step of `parent`: `text` is a YAML (or JSON) document with `steps`
    /// and optionally `outputs`, read as if from `path`. The planned workflow has `parent`'s declarations.
    pub fn validate_plan(
        mut self,
        parent: &Workflow,
        path: PathBuf,
        text: String,
        policy: &PlanPolicy,
    ) -> Validation {
        self.sources = parent.sources.clone();
        self.preloaded = parent
            .subworkflows
            .iter()
            .map(|(path, workflow)| {
                let inputs = workflow
                    .spec
                    .inputs
                    .iter()
                    .map(|(name, schema)| (name.value.clone(), schema.get("default").is_none()))
                    .collect();
                let sub = super::SubWorkflow {
                    inputs,
                    workflow: Some(workflow.clone()),
                };
                (path.clone(), sub)
            })
            .collect();
        let file = self.sources.add(path, text);
        let mut diagnostics = Vec::new();
        let checked = self.check_file(&file, &mut diagnostics, Some((parent, policy)));
        // The workflow's own declarations were checked with it: only the plan's problems count.
        diagnostics.retain(|d| d.span.file == file.id);
        let workflow = match checked {
            Some(checked) if !diagnostics.iter().any(Diagnostic::is_error) => {
                let mut workflow = checked.into_workflow(&file.path, self.sources.clone());
                // The URLs in a plan are the model's: only the planning workflow's hosts are named.
                workflow.hosts = parent.hosts.clone();
                Some(workflow)
            }
            _ => None,
        };
        Validation {
            workflow,
            diagnostics,
            sources: self.sources,
        }
    }
}

/// The plan's errors as short lines for the model: where (line and column in its own document), what,
/// and the hints.
pub fn problems(validation: &Validation) -> Vec<String> {
    validation
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| {
            let at = validation
                .sources
                .get(d.span.file)
                .map(|f| {
                    let (line, column) = f.line_col(d.span.start as usize);
                    format!("line {line}, column {column}: ")
                })
                .unwrap_or_default();
            let mut text = format!("{at}{}", d.message);
            for hint in &d.hints {
                text.push_str(&format!(" (hint: {hint})"));
            }
            text
        })
        .collect()
}

/// Whether the document holds only what a plan may: `steps` and `outputs`.
pub(super) fn only_plan_keys(root: &Node, diagnostics: &mut Vec<Diagnostic>) -> bool {
    let mut only = true;
    for (key, _) in root.as_map().unwrap_or_default() {
        if !matches!(key.name.as_str(), "steps" | "outputs") {
            only = false;
            diagnostics.push(
                Diagnostic::error(
                    codes::PLAN_NOT_ALLOWED,
                    key.span,
                    format!("a plan holds only `steps` and `outputs`, not `{}`", key.name),
                )
                .with_hint("tools, providers, inputs and rules come from the workflow; use the tools you were given"),
            );
        }
    }
    only
}

/// Gives a plan the declarations of the workflow that planned it.
pub(super) fn adopt(plan: &mut Spec, parent: &Spec) {
    plan.name.clone_from(&parent.name);
    plan.inputs.clone_from(&parent.inputs);
    plan.env.clone_from(&parent.env);
    plan.secrets.clone_from(&parent.secrets);
    plan.llm.clone_from(&parent.llm);
    plan.tools.clone_from(&parent.tools);
    plan.agents.clone_from(&parent.agents);
    plan.memory.clone_from(&parent.memory);
    plan.defaults.clone_from(&parent.defaults);
    plan.network.clone_from(&parent.network);
    // The workflow's rules govern its plans' steps as they govern its own.
    plan.rules.clone_from(&parent.rules);
}

impl Checker<'_> {
    /// What planned steps may not do, beyond what any spec may not.
    pub(super) fn check_plan_policy(&mut self, policy: &PlanPolicy) {
        let allowed = policy.allowed(self.tools);
        let listed = if allowed.is_empty() {
            "no tools are allowed: write `goal` steps only".to_owned()
        } else {
            format!(
                "the tools you may use are {}",
                allowed
                    .iter()
                    .map(|t| format!("`{t}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        for step in &self.spec.steps {
            self.check_planned_body(step, step.body(), policy, &listed);
            if let Some(fallback) = &step.fallback {
                self.check_planned_body(step, fallback.body(), policy, &listed);
            }
        }
    }

    fn check_planned_body(
        &mut self,
        step: &Step,
        body: Body<'_>,
        policy: &PlanPolicy,
        listed: &str,
    ) {
        let refuse = |span, message: String, hint: &str| {
            Diagnostic::error(codes::PLAN_NOT_ALLOWED, span, message).with_hint(hint.to_owned())
        };
        if let Some(plan) = body.plan {
            self.push(refuse(
                plan.span,
                format!("planned step `{}` cannot plan again", step.id.value),
                "write the sub-steps into this plan, or make it a `goal` step",
            ));
        } else if let Some(workflow) = body.workflow {
            self.push(refuse(
                workflow.span,
                format!("planned step `{}` cannot run a sub-workflow", step.id.value),
                listed,
            ));
        } else if body.tool.is_none() && body.goal.is_none() && body.description.is_some() {
            self.push(refuse(
                step.id.span,
                format!(
                    "planned step `{}` says neither `tool` nor `goal`",
                    step.id.value
                ),
                "give every planned step a `tool` (with `with`) or a `goal`",
            ));
        }
        if let Some(tool) = body.tool {
            if !policy.allows(self.tools, &tool.value) {
                self.push(refuse(
                    tool.span,
                    format!(
                        "planned step `{}` may not call `{}`",
                        step.id.value, tool.value
                    ),
                    listed,
                ));
            } else if let Some(entry) = self.tools.get(&tool.value)
                && entry.safety == SafetyRule::ByMethod
            {
                // A planned request may read, not change things: those need a person's approval.
                let args = body.args.map_or(serde_json::Value::Null, Node::to_json);
                if let Some(method) = body.args.and_then(|a| a.get("method"))
                    && entry.safety.of(Some(&args)).sensitive
                {
                    self.push(refuse(
                        method.span,
                        format!("planned step `{}` may only read with `http`", step.id.value),
                        "use `method: GET`, `HEAD` or `OPTIONS`, written as is",
                    ));
                }
            }
        }
        if body.goal.is_some() {
            // A planned agent gets exactly the tools the plan gives it, within the planner's allowance.
            if let Some(agent) = body.agent {
                self.push(refuse(
                    agent.span,
                    format!("planned step `{}` cannot name an agent", step.id.value),
                    "give the step its `tools` instead",
                ));
            }
            // The agents it would ask bring tools of their own, past the planner's allowance.
            if let Some(asked) = body.ask.and_then(|a| a.first()) {
                self.push(refuse(
                    asked.span,
                    format!("planned step `{}` cannot ask agents", step.id.value),
                    "give the step its `tools` instead",
                ));
            }
            if body.tools.is_none() {
                self.push(refuse(
                    step.id.span,
                    format!(
                        "planned goal step `{}` does not list its `tools`",
                        step.id.value
                    ),
                    &format!("write `tools: []` for none; {listed}"),
                ));
            }
        }
        for pattern in body.tools.unwrap_or_default() {
            if !policy.allows(self.tools, pattern.value.as_str()) {
                self.push(refuse(
                    pattern.span,
                    format!(
                        "planned step `{}` may not give its agent `{}`",
                        step.id.value, pattern.value
                    ),
                    &format!("name tools one by one; {listed}"),
                ));
            }
        }
    }
}
