//! `archon run --save-plan FILE`: the workflow written again with every plan its planner steps made frozen
//! into ordinary steps, so that the file validates, can be committed, and re-runs without the planner.
//!
//! A planner step `x` becomes a call of a composite tool `x_plan` whose `steps` are the plan's steps and
//! whose `result` is the plan's `outputs` (or, without them, the last step's output, as for the plan):
//! the planned steps keep their ids and templates, run with the same scheduler one level down, and the
//! step's own fields (`needs`, `if`, `retry`, `outputs`, ...) stay as written. Comments and formatting of
//! the original file are not kept.

use std::path::Path;

use indexmap::IndexMap;
use serde_json::{Map, Value as Json, json};

use crate::plan::{Plan, StepKind};
use crate::run::StepResult;
use crate::source::Format;
use crate::spec::Limits;
use crate::workflow::Workflow;

/// Fields that only LLM steps take: a frozen step calls a tool and drops them.
const LLM_FIELDS: &[&str] = &[
    "plan",
    "goal",
    "tools",
    "max_iterations",
    "agent",
    "provider",
    "expected_output",
    "output_schema",
    "context",
];

/// The spec text of `workflow` with the plans in `steps` (a run's results) frozen, in the format `path`
/// names (TOML for `.toml`, JSON for `.json`, YAML otherwise).
pub fn freeze_plans(
    workflow: &Workflow,
    steps: &IndexMap<String, StepResult>,
    path: &Path,
) -> Result<String, String> {
    // Paths in a spec (sub-workflows, scripts) and its workspace are relative to its directory.
    let here = |p: &Path| {
        let dir = p
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::canonicalize(dir).ok()
    };
    if here(path) != here(&workflow.path) {
        return Err(format!(
            "write it beside `{}`: paths in a spec are relative to its directory",
            workflow.path.display()
        ));
    }
    let file = workflow
        .sources
        .find(&workflow.path)
        .ok_or_else(|| format!("the text of `{}` is not at hand", workflow.path.display()))?;
    let root = crate::spec::parse(file, &Limits::default())
        .0
        .ok_or_else(|| format!("`{}` no longer parses", workflow.path.display()))?;
    let mut document = match root.to_json() {
        Json::Object(map) => map,
        _ => return Err("the workflow is not a mapping".to_owned()),
    };
    let mut tools = match document.remove("tools") {
        Some(Json::Object(tools)) => tools,
        _ => Map::new(),
    };
    let planners: Vec<usize> = Plan::new(workflow)
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.kind, StepKind::Planner { .. }))
        .map(|(i, _)| i)
        .collect();
    if planners.is_empty() {
        return Err("the workflow has no planner steps: there is no plan to save".to_owned());
    }
    let Some(Json::Array(written)) = document.get_mut("steps") else {
        return Err("the workflow has no `steps` list".to_owned());
    };
    for index in planners {
        let step = &workflow.spec.steps[index];
        let id = &step.id.value;
        if step.repeats() {
            return Err(format!(
                "step `{id}` plans once per `foreach` item or `matrix` combination: its plans cannot be frozen into one"
            ));
        }
        let result = steps
            .get(id)
            .ok_or_else(|| format!("step `{id}` did not run"))?;
        // A planner its `if` skipped made no plan: it stays a planner step.
        if result.status == crate::run::StepStatus::Skipped {
            continue;
        }
        let plan = result.plan.as_deref().ok_or_else(|| {
            format!(
                "step `{id}` has no plan to save: it {}",
                result.status.as_str()
            )
        })?;
        let mut name = format!("{id}_plan");
        let mut n = 1;
        while tools.contains_key(&name) || workflow.spec.tools.contains_key(name.as_str()) {
            n += 1;
            name = format!("{id}_plan_{n}");
        }
        let goal = step
            .plan
            .as_deref()
            .or(step.description.as_ref())
            .map_or_else(String::new, |g| g.value.clone());
        let mut tool = Map::new();
        tool.insert(
            "description".into(),
            Json::String(format!("The steps planned by step `{id}`: {}", goal.trim())),
        );
        tool.insert(
            "parameters".into(),
            json!({ "type": "object", "properties": {} }),
        );
        tool.insert(
            "steps".into(),
            plan.get("steps")
                .cloned()
                .unwrap_or(Json::Array(Vec::new())),
        );
        if let Some(outputs) = plan
            .get("outputs")
            .filter(|o| o.as_object().is_some_and(|m| !m.is_empty()))
        {
            tool.insert("result".into(), outputs.clone());
        }
        tools.insert(name.clone(), Json::Object(tool));
        let Some(Json::Object(entry)) = written.get_mut(index) else {
            return Err(format!("step `{id}` is not where the spec lists it"));
        };
        entry.retain(|key, _| !LLM_FIELDS.contains(&key.as_str()));
        // The tool goes right after the id, where a reader looks for what the step does.
        let fields = std::mem::take(entry);
        for (key, value) in fields {
            let is_id = key == "id";
            entry.insert(key, value);
            if is_id {
                entry.insert("tool".into(), Json::String(name.clone()));
            }
        }
        if !entry.contains_key("tool") {
            entry.insert("tool".into(), Json::String(name.clone()));
        }
    }
    // `tools` goes back before `steps`, where a spec usually has it.
    let mut ordered = Map::new();
    for (key, value) in document {
        if key == "steps" {
            ordered.insert("tools".into(), Json::Object(std::mem::take(&mut tools)));
        }
        ordered.insert(key, value);
    }
    let document = Json::Object(ordered);
    let source = workflow
        .path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    match path.extension().and_then(|e| e.to_str()) {
        Some(ext) if ext.eq_ignore_ascii_case("json") => {
            serde_json::to_string_pretty(&document).map_err(|e| e.to_string())
        }
        _ if Format::from_path(path) == Format::Toml => toml::to_string(&without_nulls(document))
            .map(|text| {
                format!("# Written by `archon run --save-plan` from `{source}`: each planner step calls the steps it planned.\n{}\n", text.trim_end())
            })
            .map_err(|e| format!("the plan cannot be written as TOML: {e}")),
        _ => serde_saphyr::to_string(&document)
            .map(|text| {
                format!("# Written by `archon run --save-plan` from `{source}`: each planner step calls the steps it planned.\n{text}")
            })
            .map_err(|e| format!("the plan cannot be written as YAML: {e}")),
    }
}

/// TOML has no null: a `null` value is written as an absent key (which the spec reads the same way).
fn without_nulls(value: Json) -> Json {
    match value {
        Json::Object(map) => Json::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Json::Array(items) => Json::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}
