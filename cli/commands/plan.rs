//! `archon plan FILE`: validate a workflow and its inputs, then show its steps, their kinds and the waves
//! of steps that can run together, as text, Graphviz DOT, Mermaid or JSON.

use std::fmt::Write as _;

use archon_engine::plan::{Plan, StepKind};
use serde_json::json;

use super::{Status, load};
use crate::args::{ColorChoice, PlanArgs, PlanFormat};
use crate::color::Paint;
use crate::output;

pub fn run(args: &PlanArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let (workflow, resolved) = match load::workflow_and_inputs(&args.workflow, color) {
        Ok(loaded) => loaded,
        Err(status) => return Ok(status),
    };
    let plan = Plan::new(&workflow);
    let text = match args.format {
        PlanFormat::Text => text(&plan, Paint::new(output::use_color(color))),
        PlanFormat::Dot => dot(&plan),
        PlanFormat::Mermaid => mermaid(&plan),
        PlanFormat::Json => {
            let value = json!({ "version": 1, "inputs": resolved, "plan": plan });
            let mut text = serde_json::to_string_pretty(&value)?;
            text.push('\n');
            text
        }
    };
    output::stdout(&text);
    Ok(Status::Success)
}

fn plural(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// Human-readable: one block per wave, one line per step.
fn text(plan: &Plan, paint: Paint) -> String {
    let mut out = format!(
        "plan for `{}`: {} in {}\n",
        plan.workflow,
        plural(plan.steps.len(), "step"),
        plural(plan.waves.len(), "wave")
    );
    let width = plan.steps.iter().map(|s| s.id.len()).max().unwrap_or(0);
    for (number, wave) in plan.waves.iter().enumerate() {
        let _ = writeln!(out, "\n{}", paint.bold(&format!("wave {}", number + 1)));
        for &index in wave {
            let step = &plan.steps[index];
            let mut line = format!("  {:width$}  {}", step.id, step.kind.label());
            if step.foreach {
                line.push_str(", for each item");
            }
            if step.conditional {
                line.push_str(", conditional");
            }
            if !step.depends_on.is_empty() {
                let _ = write!(line, "  (after {})", step.depends_on.join(", "));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

fn quoted(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    )
}

/// Graphviz DOT: one node per step (labelled with its kind), edges from dependency to dependent.
fn dot(plan: &Plan) -> String {
    let mut out = format!(
        "digraph {} {{\n  rankdir=LR;\n  node [shape=box];\n",
        quoted(&plan.workflow)
    );
    for step in &plan.steps {
        let shape = match step.kind {
            StepKind::Tool { .. } => "box",
            StepKind::Agent { .. } | StepKind::Planner { .. } => "ellipse",
            StepKind::Workflow { .. } => "box3d",
        };
        let _ = writeln!(
            out,
            "  {} [label={}, shape={shape}];",
            quoted(&step.id),
            quoted(&format!("{}\n{}", step.id, step.kind.label()))
        );
    }
    for step in &plan.steps {
        for dep in &step.depends_on {
            let _ = writeln!(out, "  {} -> {};", quoted(dep), quoted(&step.id));
        }
    }
    out.push_str("}\n");
    out
}

/// Mermaid flowchart, for Markdown that renders it.
fn mermaid(plan: &Plan) -> String {
    let mut out = String::from("flowchart LR\n");
    for step in &plan.steps {
        let label = format!("{}<br/>{}", step.id, step.kind.label()).replace('"', "#quot;");
        let _ = match step.kind {
            StepKind::Tool { .. } | StepKind::Workflow { .. } => {
                writeln!(out, "  {}[\"{label}\"]", step.id)
            }
            StepKind::Agent { .. } | StepKind::Planner { .. } => {
                writeln!(out, "  {}([\"{label}\"])", step.id)
            }
        };
    }
    for step in &plan.steps {
        for dep in &step.depends_on {
            let _ = writeln!(out, "  {dep} --> {}", step.id);
        }
    }
    out
}
