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

/// Runs one tool call the model asked for; returns the observation, whether it is an error, and whether the
/// tool wrote it (its output or failure, shown to the model as data) rather than archon.
pub(super) async fn observe(
    shared: &Shared,
    label: &str,
    tools: &[ToolSpec],
    validators: &HashMap<String, jsonschema::Validator>,
    name: &str,
    arguments: &Json,
) -> Result<(String, bool, bool), String> {
    if !tools.iter().any(|t| t.name == name) {
        let names: Vec<String> = tools.iter().map(|t| format!("`{}`", t.name)).collect();
        return Ok((
            format!(
                "unknown tool `{name}`; the tools are {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
            true,
            false,
        ));
    }
    if let Some(validator) = validators.get(name)
        && let Some(error) = validator.iter_errors(arguments).next()
    {
        let path = error.instance_path().to_string();
        let at = if path.is_empty() {
            "the arguments".to_owned()
        } else {
            format!("`{path}`")
        };
        return Ok((
            format!("invalid arguments for `{name}` at {at}: {error}"),
            true,
            false,
        ));
    }
    let call_label = format!("{label}/{name}");
    let outcome = shared
        .nested
        .tool(shared, &call_label, name, arguments.clone(), true)
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

/// The tools an agent may call: the registry's tools (built-ins and declared tools) whose names match
/// `patterns` (globs), except MCP tools, which cannot run yet. Sensitive ones are offered too: each call of
/// one asks for a person's approval unless a rule allows it.
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
