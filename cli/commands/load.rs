//! Loading a workflow for `plan` and `run`: validate it and resolve its inputs, reporting every problem
//! on standard error.

use std::fmt::Write as _;

use archon_engine::Workflow;
use archon_engine::inputs::{self, InputProblem};
use archon_engine::validate::validate_file;
use serde_json::{Map, Value as Json};

use super::Status;
use crate::args::{ColorChoice, WorkflowArgs};
use crate::output;
use crate::render::{self, Report};

/// The workflow of `validation` (of `file`) when it has no error; otherwise `None`, its diagnostics shown
/// on standard error.
pub fn valid(
    file: &std::path::Path,
    validation: archon_engine::Validation,
    color: ColorChoice,
) -> Option<Workflow> {
    match validation.workflow {
        Some(workflow) if !validation.has_errors() => Some(workflow),
        _ => {
            let mut report = Report::default();
            report.add(file, validation.diagnostics, &validation.sources);
            output::stderr_with(|err| {
                render::write_text(&report, output::use_color_stderr(color), err)
            });
            None
        }
    }
}

/// A valid workflow and its resolved inputs, or the status to exit with after the problems were shown.
pub fn workflow_and_inputs(
    args: &WorkflowArgs,
    color: ColorChoice,
) -> Result<(Workflow, Map<String, Json>), Status> {
    let file = args.file.as_path();
    let validation = validate_file(file);
    if validation.has_errors() {
        let mut report = Report::default();
        report.add(file, validation.diagnostics, &validation.sources);
        output::stderr_with(|err| {
            render::write_text(&report, output::use_color_stderr(color), err)
        });
        return Err(Status::Invalid);
    }
    let workflow = validation.workflow.ok_or(Status::Invalid)?;
    let from_file = match &args.inputs_file {
        Some(path) => inputs::read_inputs_file(path).map_err(|p| problems(&[p]))?,
        None => Map::new(),
    };
    let resolved =
        inputs::resolve(&workflow.spec, from_file, &args.inputs).map_err(|p| problems(&p))?;
    Ok((workflow, resolved))
}

/// Shows problems as `error:` lines with `hint:` lines; the caller exits with [`Status::Invalid`].
pub fn problems(problems: &[InputProblem]) -> Status {
    let mut text = String::new();
    for problem in problems {
        let _ = writeln!(text, "error: {}", problem.message);
        if let Some(hint) = &problem.hint {
            let _ = writeln!(text, "  hint: {hint}");
        }
    }
    output::stderr(&text);
    Status::Invalid
}
