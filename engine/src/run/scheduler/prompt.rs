//! What an LLM step (agent or planner) tells its model about the step, written once for both: the agent
//! role's instructions before the system prompt, the expected output, the step's context, and the list of
//! tools with their JSON Schemas.

use minijinja::Value;

use super::context::{Failure, Shared};
use crate::llm::ToolSpec;
use crate::run::render::to_text;
use crate::spec::{AgentDef, Body};

/// `system`, after the agent role's rendered `instructions` when it has them.
pub(super) async fn with_instructions(
    shared: &Shared,
    agent: Option<&AgentDef>,
    ctx: &Value,
    system: String,
) -> Result<String, Failure> {
    let Some(instructions) = agent.and_then(|a| a.instructions.as_ref()) else {
        return Ok(system);
    };
    let text = shared
        .renderer
        .text(&instructions.value, ctx)
        .await
        .map_err(|e| Failure::fixed(format!("agent instructions: {e}")))?;
    Ok(format!("{text}\n\n{system}"))
}

/// The step's rendered `expected_output`, if it has one.
pub(super) async fn expected_output(
    shared: &Shared,
    body: Body<'_>,
    ctx: &Value,
) -> Result<Option<String>, Failure> {
    let Some(expected) = body.expected_output else {
        return Ok(None);
    };
    let text = shared
        .renderer
        .text(&expected.value, ctx)
        .await
        .map_err(|e| Failure::fixed(format!("`expected_output`: {e}")))?;
    Ok(Some(text))
}

/// The step's rendered `context`, as a section to append to the goal (empty without one).
pub(super) async fn context_section(
    shared: &Shared,
    body: Body<'_>,
    ctx: &Value,
) -> Result<String, Failure> {
    let Some(context) = body.context else {
        return Ok(String::new());
    };
    let value = shared
        .renderer
        .value(context, ctx)
        .await
        .map_err(|e| Failure::fixed(format!("`context`: {e}")))?;
    Ok(format!("\n\nContext:\n{}", to_text(&value)))
}

/// One line per tool: its name, description and the JSON Schema of what it takes (`schema_name` says what
/// the prompt calls it).
pub(super) fn tool_lines(tools: &[ToolSpec], schema_name: &str) -> String {
    let mut text = String::new();
    for tool in tools {
        text.push_str(&format!(
            "\n- {}: {} {schema_name} (JSON Schema): {}",
            tool.name, tool.description, tool.parameters
        ));
    }
    text
}
