//! Embedding the engine: validate a spec file and print its steps in a runnable order.
//!
//! `cargo run --example validate_spec -- workflows/hello.yaml`
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(path) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: validate_spec SPEC");
        return ExitCode::from(2);
    };
    let validation = archon_engine::validate_file(&path);
    for d in &validation.diagnostics {
        let file = validation
            .sources
            .get(d.span.file)
            .expect("diagnostics point into loaded files");
        let (line, column) = file.line_col(d.span.start as usize);
        eprintln!(
            "{}:{line}:{column}: {}[{}]: {}",
            file.path.display(),
            d.severity.as_str(),
            d.code,
            d.message
        );
    }
    let Some(workflow) = validation.workflow else {
        return ExitCode::from(2);
    };
    println!(
        "workflow `{}`: {} steps",
        workflow.name,
        workflow.spec.steps.len()
    );
    for index in &workflow.order {
        let step = &workflow.spec.steps[*index];
        let needs: Vec<&str> = workflow.dependencies[*index]
            .iter()
            .map(|d| workflow.spec.steps[*d].id.value.as_str())
            .collect();
        println!(
            "  {} (after: {})",
            step.id.value,
            if needs.is_empty() {
                "-".to_owned()
            } else {
                needs.join(", ")
            }
        );
    }
    ExitCode::SUCCESS
}
