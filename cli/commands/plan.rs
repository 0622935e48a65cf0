//! `archon plan FILE`: validate a workflow and its inputs, then show its steps, their kinds and the waves
//! of steps that can run together, as text, Graphviz DOT, Mermaid or JSON.

use std::fmt::Write as _;

use archon_engine::plan::{Plan, Reach, StepKind};
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

/// Human-readable: one block per wave, one line per step.
fn text(plan: &Plan, paint: Paint) -> String {
    let mut out = format!(
        "plan for `{}`: {} in {}\n",
        plan.workflow,
        output::plural(plan.steps.len(), "step"),
        output::plural(plan.waves.len(), "wave")
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
    delegation(plan, &mut out);
    out
}

/// The agents each agent step may reach by delegation, as a tree under the step's agent: each agent under
/// the first agent that may ask it, at the least depth it can be reached at.
fn delegation(plan: &Plan, out: &mut String) {
    let steps: Vec<_> = plan
        .steps
        .iter()
        .filter(|s| !s.reaches.is_empty())
        .collect();
    let Some(max_depth) = plan.max_delegation_depth else {
        return;
    };
    if steps.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nagents each step may reach by delegation (at most {} deep, `defaults.max_delegation_depth`):",
        output::plural(max_depth as usize, "level")
    );
    let width = steps.iter().map(|s| s.id.len()).max().unwrap_or(0);
    for step in steps {
        let agent = step.agent.as_deref().unwrap_or_default();
        let _ = writeln!(out, "  {:width$}  {agent}", step.id);
        let indent = " ".repeat(width + 4);
        branch(&step.reaches, agent, &indent, out);
    }
}

/// The agents `parent` is the first to ask, each on a line of the tree, and theirs below them.
fn branch(reaches: &[Reach], parent: &str, prefix: &str, out: &mut String) {
    let children: Vec<&Reach> = reaches
        .iter()
        .filter(|r| r.from.first().map(String::as_str) == Some(parent))
        .collect();
    for (index, reach) in children.iter().enumerate() {
        let last = index + 1 == children.len();
        let mut line = format!(
            "{prefix}{}{}",
            if last { "└─ " } else { "├─ " },
            reach.agent
        );
        let mut notes = Vec::new();
        if reach.from.len() > 1 {
            notes.push(format!("also asked by {}", reach.from[1..].join(", ")));
        }
        if !reach.beyond_depth.is_empty() {
            notes.push(format!(
                "last level: not offered {}",
                reach
                    .beyond_depth
                    .iter()
                    .map(|d| format!("`delegate.{d}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !notes.is_empty() {
            let _ = write!(line, " ({})", notes.join("; "));
        }
        out.push_str(&line);
        out.push('\n');
        let deeper = format!("{prefix}{}", if last { "   " } else { "│  " });
        branch(reaches, &reach.agent, &deeper, out);
    }
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
