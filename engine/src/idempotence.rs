//! Whether a step is safe to repeat after a crash: every tool it can call (its body and its fallback, the
//! steps of the composite tools and sub-workflows it calls, the tools an LLM step may use) is read-only or
//! declared `idempotent: true`. The journal's persist-before-acting rule and resume ask it.

use std::collections::HashSet;

use serde_json::Value as Json;

use crate::spec::{Body, Node};
use crate::tools::{SafetyRule, ToolRef};
use crate::workflow::Workflow;

/// Whether every tool a step can call (its body and its fallback) is safe to repeat.
pub fn step_idempotent(workflow: &Workflow, id: &str) -> bool {
    let Some(step) = workflow.spec.steps.iter().find(|s| s.id.value == id) else {
        return false;
    };
    let mut seen = HashSet::new();
    body_idempotent(workflow, step.body(), &mut seen)
        && step
            .fallback
            .as_ref()
            .is_none_or(|f| body_idempotent(workflow, f.body(), &mut seen))
}

/// Whether every tool a step body can call is safe to repeat.
pub fn body_is_idempotent(workflow: &Workflow, body: Body<'_>) -> bool {
    body_idempotent(workflow, body, &mut HashSet::new())
}

fn body_idempotent(workflow: &Workflow, body: Body<'_>, seen: &mut HashSet<String>) -> bool {
    // The step's own word wins over what its tools say.
    if let Some(said) = body.idempotent {
        return said;
    }
    if let Some(tool) = body.tool {
        if let Some(ToolRef::Builtin(b)) = workflow.tools.get(&tool.value).map(|t| t.kind) {
            // The call as written: an `http` request is safe to repeat when its method only reads. Only
            // such a rule reads the arguments; this runs twice for every step, so others skip converting them.
            return match b.safety {
                SafetyRule::Fixed(safety) => safety.read_only,
                rule => {
                    let args = body.args.map_or(Json::Null, Node::to_json);
                    rule.of(Some(&args)).read_only
                }
            };
        }
        return tool_idempotent(workflow, &tool.value, seen);
    }
    if let Some(path) = body.workflow {
        return workflow_idempotent(workflow, &path.value);
    }
    llm_step_idempotent(workflow, body, seen)
}

fn tool_idempotent(workflow: &Workflow, name: &str, seen: &mut HashSet<String>) -> bool {
    // A tool of an MCP server is a side effect unless the server is declared `idempotent: true`.
    if let Some((server, _)) = workflow.tools.mcp_server_of(name) {
        return workflow
            .spec
            .tools
            .get(server.name.as_str())
            .is_some_and(|d| d.idempotent == Some(true));
    }
    match workflow.spec.tools.get(name) {
        Some(def) if def.idempotent == Some(true) => true,
        Some(def) => match (&def.steps, &def.workflow) {
            (Some(steps), _) => {
                !seen.insert(name.to_owned())
                    || steps.value.iter().all(|s| {
                        body_idempotent(workflow, s.body(), seen)
                            && s.fallback
                                .as_ref()
                                .is_none_or(|f| body_idempotent(workflow, f.body(), seen))
                    })
            }
            (None, Some(path)) => workflow_idempotent(workflow, &path.value),
            _ => false,
        },
        // Arguments an LLM will choose are not known: `http` may change things (with a person's
        // approval), so it is not safe to repeat.
        None => workflow
            .tools
            .get(name)
            .is_some_and(|t| !t.declared() && t.safety.of(None).read_only),
    }
}

/// An agent or planner step is safe to repeat when every tool it may use is: the tools its `tools` globs
/// (or its agent's) allow. A checkpoint spares the iterations it completed in any case.
fn llm_step_idempotent(workflow: &Workflow, body: Body<'_>, seen: &mut HashSet<String>) -> bool {
    // The agents it may delegate to call tools of their own, at every depth.
    let mut delegates: Vec<&str> = workflow
        .spec
        .agent_of(body)
        .map(|a| a.delegates.iter().map(|d| d.name()).collect())
        .unwrap_or_default();
    // So do the agents a step asks (`ask`) and its judge.
    delegates.extend(
        body.ask
            .unwrap_or_default()
            .iter()
            .map(|a| a.value.as_str()),
    );
    delegates.extend(
        body.consensus
            .and_then(|c| c.judge.as_ref())
            .map(|j| j.value.as_str()),
    );
    let mut asked = HashSet::new();
    while let Some(name) = delegates.pop() {
        if !asked.insert(name) {
            continue;
        }
        let Some(agent) = workflow.spec.agents.get(name) else {
            continue;
        };
        if !patterns_idempotent(
            workflow,
            agent.tools.iter().map(|t| &t.value).collect(),
            seen,
        ) {
            return false;
        }
        delegates.extend(agent.delegates.iter().map(|d| d.name()));
    }
    patterns_idempotent(workflow, workflow.spec.tool_patterns(body), seen)
}

/// Whether every tool that `patterns` reach is safe to repeat.
fn patterns_idempotent(
    workflow: &Workflow,
    patterns: Vec<&crate::spec::Pattern>,
    seen: &mut HashSet<String>,
) -> bool {
    let allowed = |name: &str| patterns.iter().any(|p| p.matches(name));
    let usable: Vec<&str> = workflow
        .tools
        .iter()
        .filter(|t| !matches!(t.kind, ToolRef::Mcp) && allowed(&t.name))
        .map(|t| t.name.as_str())
        .collect();
    // The tools of an MCP server its globs may reach count as one: the server's word.
    let servers = workflow.tools.iter().filter(|t| {
        matches!(t.kind, ToolRef::Mcp)
            && patterns
                .iter()
                .any(|p| crate::tools::mcp::could_match(p.as_str(), &t.name))
    });
    servers.into_iter().all(|server| {
        (workflow.spec.tools.get(server.name.as_str())).is_some_and(|d| d.idempotent == Some(true))
    }) && usable
        .iter()
        .all(|name| tool_idempotent(workflow, name, seen))
}

fn workflow_idempotent(workflow: &Workflow, path: &str) -> bool {
    workflow.subworkflows.get(path).is_some_and(|sub| {
        sub.spec
            .steps
            .iter()
            .all(|s| step_idempotent(sub, &s.id.value))
    })
}
