//! Tool calls an agent's model asks for: which tools it is offered, and one call run and turned into the
//! observation the model reads (unknown tools and invalid arguments answered without running anything).

use std::collections::HashMap;

use serde_json::Value as Json;

use crate::llm::ToolSpec;
use crate::report::StepStatus;
use crate::run::render::to_text;
use crate::run::scheduler::context::Shared;
use crate::spec::Pattern;
use crate::tools::ToolOutput;
use crate::tools::{Registry, ToolRef};

/// Runs one tool call the model asked for (`name` as the model wrote it, `tool` the tool's own name);
/// returns the observation, whether it is an error, and whether the
/// tool wrote it (its output or failure, shown to the model as data) rather than archon.
pub(super) async fn observe(
    shared: &Shared,
    label: &str,
    tools: &[ToolSpec],
    validators: &HashMap<String, jsonschema::Validator>,
    (name, tool): (&str, &str),
    arguments: &Json,
) -> Result<(String, bool, bool), String> {
    if !tools.iter().any(|t| t.name == name) {
        let names: Vec<String> = tools.iter().map(|t| format!("`{}`", t.name)).collect();
        let text = if names.is_empty() {
            format!("unknown tool `{name}`; you have no tools: give your final answer")
        } else {
            format!("unknown tool `{name}`; the tools are {}", names.join(", "))
        };
        return Ok((text, true, false));
    }
    if let Some(problem) = invalid(validators, name, arguments) {
        return Ok((problem, true, false));
    }
    let call_label = format!("{label}/{tool}");
    let outcome = shared
        .nested
        .tool(shared, &call_label, tool, arguments.clone(), true)
        .await;
    match outcome {
        Ok(called) => {
            let ToolOutput { output, text, .. } = called.output;
            let shown = if text.is_empty() {
                to_text(&output)
            } else {
                text
            };
            let redacted = match shared.redactor.text(&shown) {
                std::borrow::Cow::Owned(redacted) => Some(redacted),
                std::borrow::Cow::Borrowed(_) => None,
            };
            Ok((redacted.unwrap_or(shown), false, true))
        }
        // A composite tool or sub-workflow one of whose steps waits for approval: the agent waits too.
        Err(failure) if failure.status == StepStatus::WaitingApproval => Err(failure.message),
        Err(failure) => Ok((
            format!("error: {}", shared.redactor.text(&failure.message)),
            true,
            true,
        )),
    }
}

/// What is wrong with a call's arguments, by the tool's schema.
pub(super) fn invalid(
    validators: &HashMap<String, jsonschema::Validator>,
    name: &str,
    arguments: &Json,
) -> Option<String> {
    let error = validators.get(name)?.iter_errors(arguments).next()?;
    let path = error.instance_path().to_string();
    let at = if path.is_empty() {
        "the arguments".to_owned()
    } else {
        format!("`{path}`")
    };
    Some(format!("invalid arguments for `{name}` at {at}: {error}"))
}

/// The tools an agent may call: the registry's tools (built-ins and declared tools) whose names match
/// `patterns` (globs); the tools of MCP servers are added by [`mcp_tools`]. Sensitive ones are offered
/// too: each call of one asks for a person's approval unless a rule allows it.
pub(in crate::run::scheduler) fn offered_tools(
    tools: &Registry,
    patterns: &[&Pattern],
) -> Vec<ToolSpec> {
    tools
        .iter()
        .filter(|t| !matches!(t.kind, ToolRef::Mcp) && patterns.iter().any(|p| p.matches(&t.name)))
        .map(|t| ToolSpec {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t.parameters.clone(),
        })
        .collect()
}

/// The tools of the workflow's MCP servers whose `<server>.<tool>` names match `patterns`: each server the
/// globs may reach is started (if it is not running) and listed.
pub(in crate::run::scheduler) async fn mcp_tools(
    shared: &Shared,
    label: &str,
    patterns: &[&Pattern],
) -> Result<Vec<ToolSpec>, crate::run::scheduler::context::Failure> {
    let mut offered = Vec::new();
    for server in shared.workflow.mcp.keys() {
        if !patterns
            .iter()
            .any(|p| crate::tools::mcp::could_match(p.as_str(), server))
        {
            continue;
        }
        let listed = crate::run::scheduler::mcp::tools(shared, label, server).await?;
        for tool in listed.iter() {
            let name = format!("{server}.{}", tool.name);
            if patterns.iter().any(|p| p.matches(&name)) {
                offered.push(ToolSpec {
                    name,
                    description: tool.description.clone(),
                    parameters: tool.input_schema.clone(),
                });
            }
        }
    }
    Ok(offered)
}

/// The tools as models see them: each name a provider accepts (`tools::mcp::names`), and the map back to
/// the tool's own name for those that changed; two tools under one name are an error.
pub(in crate::run::scheduler) fn as_offered(
    mut tools: Vec<ToolSpec>,
) -> Result<(Vec<ToolSpec>, HashMap<String, String>), String> {
    let (names, back) =
        crate::tools::mcp::names::model_names(tools.iter().map(|t| t.name.as_str()))?;
    for (tool, name) in tools.iter_mut().zip(names) {
        tool.name = name;
    }
    Ok((tools, back))
}
