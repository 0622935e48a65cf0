//! The workflows `archon mcp serve` offers: every valid spec under the paths given, one MCP tool each.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use archon_engine::Workflow;
use archon_engine::validate::validate_file;
use rmcp::model::{Tool, ToolAnnotations};

use crate::output;
use crate::render::{self, Report};

/// The longest tool name MCP clients and model providers accept.
const MAX_NAME: usize = 64;

/// One served workflow.
#[derive(Debug)]
pub struct Served {
    pub workflow: Workflow,
    /// The spec file it was read from.
    pub path: PathBuf,
    /// What `tools/list` shows for it.
    pub tool: Tool,
}

/// The served workflows, by tool name.
#[derive(Debug, Default)]
pub struct Catalog {
    pub tools: BTreeMap<String, Arc<Served>>,
}

/// Why serving cannot start.
#[derive(Debug)]
pub struct Refusal {
    pub message: String,
    pub hint: Option<String>,
}

/// Validates the specs under `paths` (files, or directories walked as `archon validate` walks them) and
/// makes a tool of each valid one. Invalid specs, and workflows this version cannot run, are reported on
/// standard error and left out; how many were served and left out is said there too. Two workflows whose
/// names map to one tool name are refused, naming both files.
pub fn load(paths: &[PathBuf]) -> anyhow::Result<Result<Catalog, Refusal>> {
    let found = super::super::validate::collect(paths)?;
    let mut catalog = Catalog::default();
    let mut left_out = 0;
    for file in &found.files {
        let validation = validate_file(file);
        let workflow = match validation.workflow {
            Some(workflow) if !validation.has_errors() => workflow,
            _ => {
                let mut report = Report::default();
                report.add(file, validation.diagnostics, &validation.sources);
                output::stderr_with(|err| render::write_text(&report, false, err));
                output::stderr(&output::printable(&format!(
                    "not serving `{}`: it does not validate\n",
                    file.display()
                )));
                left_out += 1;
                continue;
            }
        };
        let name = tool_name(&workflow.name);
        if let Some(other) = catalog.tools.get(&name) {
            return Ok(Err(Refusal {
                message: format!(
                    "workflows `{}` (in `{}`) and `{}` (in `{}`) would both be served as tool `{name}`",
                    other.workflow.name,
                    other.path.display(),
                    workflow.name,
                    file.display()
                ),
                hint: Some(
                    "rename one of them (`name:`), or serve them from separate `archon mcp serve` commands"
                        .to_owned(),
                ),
            }));
        }
        let tool = tool(&name, &workflow);
        catalog.tools.insert(
            name,
            Arc::new(Served {
                workflow,
                path: file.clone(),
                tool,
            }),
        );
    }
    let mut text = format!(
        "serving {} workflow{} as MCP tools",
        catalog.tools.len(),
        if catalog.tools.len() == 1 { "" } else { "s" }
    );
    if left_out > 0 {
        let _ = write!(text, "; {left_out} left out (see above)");
    }
    if found.skipped > 0 {
        let _ = write!(
            text,
            "; {} spec file{} without `steps` skipped",
            found.skipped,
            if found.skipped == 1 { "" } else { "s" }
        );
    }
    text.push('\n');
    output::stderr(&output::printable(&text));
    if catalog.tools.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| format!("`{}`", p.display())).collect();
        return Ok(Err(Refusal {
            message: format!("no workflow to serve in {}", shown.join(", ")),
            hint: Some("`archon validate PATH` shows what is wrong with a spec".to_owned()),
        }));
    }
    Ok(Ok(catalog))
}

/// The MCP tool name of a workflow: its name with every character outside `[A-Za-z0-9_-]` made `_`, and a
/// name longer than 64 characters cut and ended with a hash of the whole name, so that it stays stable and
/// distinct.
pub fn tool_name(workflow: &str) -> String {
    let mapped: String = workflow
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if mapped.is_empty() {
        return "workflow".to_owned();
    }
    if mapped.len() <= MAX_NAME {
        return mapped;
    }
    let hash = format!("{:016x}", fnv1a(workflow.as_bytes()));
    format!("{}_{}", &mapped[..MAX_NAME - 17], hash)
}

/// FNV-1a, 64 bits: a stable hash (the same in every build and on every machine).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The tool that runs `workflow`.
fn tool(name: &str, workflow: &Workflow) -> Tool {
    let description = workflow
        .spec
        .description
        .clone()
        .unwrap_or_else(|| format!("Runs the Archon workflow `{}`", workflow.name));
    let mut annotations = ToolAnnotations::with_title(workflow.name.clone());
    // Every call records a run in the state directory, so no workflow is read-only; it is safe to call
    // again only when every step is.
    if workflow
        .spec
        .steps
        .iter()
        .all(|s| archon_engine::idempotence::step_idempotent(workflow, &s.id.value))
    {
        annotations = annotations.idempotent(true);
    }
    Tool::new(
        name.to_owned(),
        description,
        Arc::new(crate::commands::serving::input_schema(workflow)),
    )
    .with_annotations(annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_what_clients_accept_and_stay_distinct() {
        assert_eq!(tool_name("release-notes_2"), "release-notes_2");
        assert_eq!(tool_name("pay.invoice"), "pay_invoice");
        let long = "a".repeat(80);
        let longer = format!("{long}b");
        let (one, two) = (tool_name(&long), tool_name(&longer));
        assert_eq!(one.len(), 64);
        assert_eq!(two.len(), 64);
        assert_ne!(one, two);
        assert_eq!(one, tool_name(&long), "stable");
        assert_eq!(
            one,
            format!("{}_{:016x}", "a".repeat(47), fnv1a(long.as_bytes()))
        );
    }
}
