//! The steps of a workflow this version cannot run yet, found before a run starts.

use std::sync::Arc;

use crate::spec::{Body, Step};
use crate::tools::ToolRef;
use crate::workflow::Workflow;

/// A step this version cannot execute, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    pub step: String,
    pub reason: String,
}

/// The steps (and fallbacks) of a workflow that this version cannot run yet, including those inside the
/// composite tools and sub-workflows it calls (named `outer/inner`). `archon run` refuses such a workflow
/// before starting rather than failing half-way.
pub fn unsupported_steps(workflow: &Workflow) -> Vec<Unsupported> {
    let mut walk = Walk {
        found: Vec::new(),
        seen: std::collections::HashSet::new(),
    };
    walk.workflow(workflow, "");
    walk.found
}

struct Walk {
    found: Vec<Unsupported>,
    /// Composite tools (by workflow address and name) and sub-workflows already checked.
    seen: std::collections::HashSet<(usize, String)>,
}

impl Walk {
    fn workflow(&mut self, workflow: &Workflow, prefix: &str) {
        self.steps(workflow, &workflow.spec.steps, prefix);
    }

    fn steps(&mut self, workflow: &Workflow, steps: &[Step], prefix: &str) {
        for step in steps {
            let name = format!("{prefix}{}", step.id.value);
            self.body(workflow, step.body(), &name, "");
            if let Some(fallback) = &step.fallback {
                self.body(workflow, fallback.body(), &name, "its fallback: ");
            }
        }
    }

    fn body(&mut self, workflow: &Workflow, body: Body<'_>, step: &str, what: &str) {
        let mut refuse = |reason: String| {
            self.found.push(Unsupported {
                step: step.to_owned(),
                reason: format!("{what}{reason}"),
            });
        };
        if let Some(tool) = body.tool {
            let name = tool.value.as_str();
            let def = workflow.spec.tools.get(name);
            if workflow.tools.mcp_server_of(name).is_some() {
                // A tool of a declared MCP server: found when the server runs.
                return;
            }
            match workflow.tools.get(name).map(|t| t.kind) {
                // Built-ins, commands and requests run.
                Some(ToolRef::Builtin(_) | ToolRef::Command | ToolRef::Http) => {}
                Some(ToolRef::Composite) => {
                    if let Some(steps) = def.and_then(|d| d.steps.as_ref()) {
                        let key = (std::ptr::from_ref(workflow) as usize, name.to_owned());
                        if self.seen.insert(key) {
                            self.steps(workflow, &steps.value, &format!("{step}/"));
                        }
                    }
                }
                Some(ToolRef::Workflow) => {
                    if let Some(path) = def.and_then(|d| d.workflow.as_ref()) {
                        self.sub_workflow(workflow, &path.value, step);
                    }
                }
                // An MCP server called as a tool: `validate` refuses it.
                Some(ToolRef::Mcp) => {}
                None => refuse(format!("tool `{name}` cannot run yet")),
            }
            return;
        }
        if let Some(path) = body.workflow {
            self.sub_workflow(workflow, &path.value, step);
            return;
        }
        // An agent or planner step: its agent role must be one this version can play.
        if let Some(agent) = workflow.spec.agent_of(body)
            && !agent.delegates.is_empty()
        {
            refuse("agent delegation (`delegates`) cannot run yet".to_owned());
        }
    }

    fn sub_workflow(&mut self, workflow: &Workflow, path: &str, step: &str) {
        if let Some(sub) = workflow.subworkflows.get(path) {
            let key = (Arc::as_ptr(sub) as usize, String::new());
            if self.seen.insert(key) {
                self.workflow(sub, &format!("{step}/"));
            }
        }
    }
}
