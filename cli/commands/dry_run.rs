//! `archon run --dry-run FILE`: each wave of a validated workflow and each step's rendered arguments
//! (secrets masked), from the engine's `run::dry_run`; nothing runs and nothing is recorded.

use std::fmt::Write as _;

use archon_engine::Workflow;
use archon_engine::run::{Decision, DryRun, DryStep, dry_run};
use serde_json::{Map, Value as Json};

use super::Status;
use crate::args::ColorChoice;
use crate::color::Paint;
use crate::output;

/// Renders what a run of `workflow` with `inputs` would do: text, or JSON with `json`.
pub fn show(
    workflow: &Workflow,
    inputs: Map<String, Json>,
    workdir: &std::path::Path,
    json: bool,
    color: ColorChoice,
) -> anyhow::Result<Status> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let env = std::env::vars().collect();
    let dry = runtime.block_on(dry_run(
        workflow,
        inputs,
        &env,
        workdir,
        std::env::current_exe().ok(),
    ));
    let dry = match dry {
        Ok(dry) => dry,
        Err(message) => {
            output::stderr(&output::printable(&format!("error: {message}\n")));
            return Ok(Status::Failure);
        }
    };
    if json {
        output::stdout_json(&dry);
    } else {
        output::stdout(&text(&dry, Paint::new(output::use_color(color))));
    }
    Ok(Status::Success)
}

/// One block per wave, each step with what it would run; values made printable before anything is painted.
fn text(dry: &DryRun, paint: Paint) -> String {
    let steps = dry.waves.iter().map(Vec::len).sum();
    let mut out = format!(
        "dry run of `{}`: {} in {}; nothing is run\n",
        output::printable(&dry.workflow),
        output::plural(steps, "step"),
        output::plural(dry.waves.len(), "wave")
    );
    for (number, wave) in dry.waves.iter().enumerate() {
        let _ = writeln!(out, "\n{}", paint.bold(&format!("wave {}", number + 1)));
        for step in wave {
            step_text(step, &mut out);
        }
    }
    out
}

fn step_text(step: &DryStep, out: &mut String) {
    let mut line = format!("  {}  {}", step.id, step.kind.label());
    if !step.depends_on.is_empty() {
        let _ = write!(line, "  (after {})", step.depends_on.join(", "));
    }
    if step.approval {
        line.push_str("  (asks for approval)");
    }
    let _ = writeln!(out, "{}", output::printable(&line));
    let mut field = |name: &str, value: &str| {
        let value = value.replace('\n', "\n      ");
        let _ = writeln!(out, "    {name}: {}", output::printable(&value));
    };
    if let Some(decision) = &step.condition {
        field("if", &decided(decision, true));
    }
    if let Some(decision) = &step.foreach {
        field("foreach", &decided(decision, false));
    }
    for (name, decision) in &step.matrix {
        field(&format!("matrix.{name}"), &decided(decision, false));
    }
    if let Some(line) = combinations(step) {
        field("matrix", &line);
    }
    if let Some(arguments) = &step.arguments {
        field("with", &arguments.to_string());
    }
    if let Some(goal) = &step.goal {
        field("goal", goal);
    }
    if !step.tools.is_empty() {
        field("tools", &step.tools.join(", "));
    }
}

/// An `if:` or `foreach:` and what can be said of it before the run.
fn decided(decision: &Decision, condition: bool) -> String {
    match decision {
        Decision::Now { expression, value } if condition => format!(
            "`{expression}` is {value}: {}",
            if value == &Json::Bool(true) {
                "it runs"
            } else {
                "it is skipped"
            }
        ),
        Decision::Now { expression, value } => match value {
            Json::Array(items) => {
                format!("`{expression}`: {}", output::plural(items.len(), "item"))
            }
            other => format!("`{expression}` is {other}, not a list: the step fails"),
        },
        Decision::AtRunTime { expression, reads } => format!(
            "`{expression}`: decided at run time (reads {})",
            reads
                .iter()
                .map(|r| format!("`{r}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Decision::Fails { expression, error } => {
            format!("`{expression}` fails: {error}")
        }
    }
}

/// How many combinations a `matrix` step runs, when all its lists are known before the run, and whether a
/// run takes that many.
fn combinations(step: &DryStep) -> Option<String> {
    if step.matrix.is_empty() {
        return None;
    }
    let mut total: Option<usize> = Some(1);
    for decision in step.matrix.values() {
        let Decision::Now {
            value: Json::Array(items),
            ..
        } = decision
        else {
            return None;
        };
        total = total.and_then(|t| t.checked_mul(items.len()));
    }
    let most = archon_engine::validate::MAX_COMBINATIONS;
    Some(match total {
        Some(n) if n <= most => output::plural(n, "combination"),
        Some(n) => format!("{n} combinations, more than {most}: the step fails"),
        None => format!("more than {most} combinations: the step fails"),
    })
}
