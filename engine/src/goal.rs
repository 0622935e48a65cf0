//! `archon run --goal TEXT`: a workflow of one planner step, written for a goal given on the command line.

use serde_json::json;

/// The built-in tools a goal's planner may use: those that only read.
pub const GOAL_TOOLS: &[&str] = &[
    "read_file",
    "list_files",
    "json",
    "calculator",
    "echo",
    "http",
];

/// The spec (YAML) of a workflow whose one step plans `goal` with the read-only built-in tools and a
/// provider of kind `auto`. The goal is text, never a template: it is written inside `{% raw %}`.
pub fn goal_spec(goal: &str) -> Result<String, String> {
    let goal = goal.trim();
    if goal.is_empty() {
        return Err("the goal is empty".to_owned());
    }
    if goal.contains("endraw") {
        return Err("the goal cannot contain `endraw`".to_owned());
    }
    let summary: String = goal.split_whitespace().collect::<Vec<_>>().join(" ");
    let summary: String = summary.chars().take(200).collect();
    let spec = json!({
        "name": "goal",
        "description": summary,
        "llm": { "providers": { "main": { "kind": "auto" } } },
        "steps": [{
            "id": "goal",
            "plan": format!("{{% raw %}}{goal}{{% endraw %}}"),
            "tools": GOAL_TOOLS,
        }],
        "outputs": { "result": "{{ steps.goal.output }}" },
        // What the planned steps read could leave over HTTP (a query string is enough): a person sees each
        // request first.
        "rules": [{
            "name": "ask-before-http",
            "on": "before_tool",
            "match": { "tool": "http" },
            "action": "ask",
            "reason": "a request carries data out of the workspace",
        }],
    });
    serde_saphyr::to_string(&spec)
        .map(|text| {
            format!("# Written by `archon run --goal`: the LLM planner writes the steps.\n{text}")
        })
        .map_err(|e| format!("the goal's workflow cannot be written: {e}"))
}
