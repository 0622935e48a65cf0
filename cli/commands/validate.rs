//! `archon validate PATH...`: check spec files and report every diagnostic.

use std::path::{Path, PathBuf};

use archon_engine::validate::{Validation, validate_file};

use super::Status;
use crate::args::{ColorChoice, Format, ValidateArgs};
use crate::output;
use crate::render::{self, Report};

pub fn run(args: &ValidateArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let files = collect(&args.paths)?;
    let mut report = Report::default();
    for file in &files {
        let validation: Validation = validate_file(file);
        let mut diagnostics = validation.diagnostics;
        if let Some(workflow) = &validation.workflow {
            diagnostics.extend(cannot_run_yet(workflow));
        }
        report.add(file, diagnostics, &validation.sources);
    }
    output::stdout_with(|out| match args.format {
        Format::Json => render::write_json(&report, out),
        Format::Text => render::write_text(&report, output::use_color(color), out),
    });
    Ok(if report.errors() > 0 {
        Status::Invalid
    } else {
        Status::Success
    })
}

/// A warning for each step of a valid workflow that `archon run` would refuse: what this version cannot
/// run yet (MCP tools, agent delegation or memory), so that "valid" does not promise a run.
fn cannot_run_yet(workflow: &archon_engine::Workflow) -> Vec<archon_engine::Diagnostic> {
    archon_engine::run::unsupported_steps(workflow)
        .into_iter()
        .filter_map(|u| {
            let outer = u.step.split('/').next().unwrap_or(&u.step);
            let step = workflow.spec.steps.iter().find(|s| s.id.value == outer)?;
            Some(
                archon_engine::Diagnostic::warning(
                    archon_engine::diagnostic::codes::CANNOT_RUN_YET,
                    step.id.span,
                    format!("step `{}` cannot run in this version: {}", u.step, u.reason),
                )
                .with_hint("`archon run` refuses the workflow until it can"),
            )
        })
        .collect()
}

/// Expands directories into the spec files under them (sorted, hidden entries skipped).
fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files)?;
        } else {
            // A missing file is reported as a diagnostic by the validator.
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read directory `{}`: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, files)?;
        } else if is_spec(&path) && looks_like_a_workflow(&path) {
            files.push(path);
        }
    }
    Ok(())
}

/// Whether a file found in a directory is a workflow spec: its top level has a `steps` key (a spec without
/// steps is an error anyway, and `Cargo.toml`, a CI file or a compose file has none). A file named on the
/// command line is always checked.
fn looks_like_a_workflow(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        // Unreadable: the validator says why.
        return true;
    };
    text.lines().any(|line| {
        let line = line.trim_end();
        line.starts_with("steps:")
            || line.starts_with("steps =")
            || line.starts_with("steps=")
            || line.starts_with("[[steps]]")
            || line.starts_with("\"steps\":")
            || line.starts_with("{")
    })
}

fn is_spec(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "toml")
    )
}
