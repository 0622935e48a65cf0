//! One registry of the tools a workflow can call: the built-ins and the tools its spec declares, each
//! resolved once (when the workflow is validated) to what it is, the schema of its arguments and what its
//! calls may do. Validation, planning, agents, rules and the scheduler ask it. An MCP server is one
//! entry here (its safety is every one of its tools'); its tools are known only when it runs
//! (`tools::mcp`), and [`Registry::mcp_server_of`] finds the server of a `<server>.<tool>` name.

use indexmap::IndexMap;
use serde_json::{Value as Json, json};

use super::builtin::{self, Builtin};
use super::safety::{self, Safety, SafetyRule};
use crate::spec::{Node, Spec, ToolDef};

/// What a tool name refers to.
#[derive(Clone, Copy, Debug)]
pub enum ToolRef {
    /// A built-in tool.
    Builtin(&'static Builtin),
    /// A declared `command` tool: runs as `exec` with its templates rendered.
    Command,
    /// A declared `http` tool: runs as `http` with its templates rendered.
    Http,
    /// A composite tool: its steps run with the same scheduler.
    Composite,
    /// A sub-workflow used as a tool.
    Workflow,
    /// An MCP server: its tools are `<server>.<tool>`, listed when the server first runs.
    Mcp,
}

/// One tool of a workflow.
#[derive(Clone, Debug)]
pub struct RegistryEntry {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: Json,
    pub kind: ToolRef,
    /// What its calls may do: a built-in's rule; for a declared tool, what the spec says or what follows
    /// from what it does (see [`super::sensitive`]). Whether a declared tool is safe to repeat after a
    /// crash depends on the sub-workflows it calls, so that is for the idempotence module to say.
    pub safety: SafetyRule,
}

impl RegistryEntry {
    /// A declared tool (not a built-in).
    pub fn declared(&self) -> bool {
        !matches!(self.kind, ToolRef::Builtin(_))
    }
}

/// The tools of one workflow, by name: the built-ins first, then the declared tools in spec order.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    tools: IndexMap<String, RegistryEntry>,
}

impl Registry {
    /// Registers the built-ins and every tool `spec` declares. A declared tool with the name of a
    /// built-in (an error validation reports) does not replace the built-in.
    pub fn new(spec: &Spec) -> Registry {
        let mut tools: IndexMap<String, RegistryEntry> = builtin::all()
            .iter()
            .map(|b| {
                let entry = RegistryEntry {
                    name: b.name.to_owned(),
                    description: b.description.to_owned(),
                    parameters: b.parameters.clone(),
                    kind: ToolRef::Builtin(b),
                    safety: b.safety,
                };
                (b.name.to_owned(), entry)
            })
            .collect();
        for (name, def) in &spec.tools {
            if tools.contains_key(&name.value) {
                continue;
            }
            let entry = RegistryEntry {
                name: name.value.clone(),
                description: def.description.clone().unwrap_or_default(),
                parameters: def
                    .parameters
                    .as_ref()
                    .map_or_else(|| json!({ "type": "object" }), Node::to_json),
                kind: kind(def),
                safety: SafetyRule::Fixed(Safety {
                    read_only: def.idempotent == Some(true),
                    sensitive: safety::sensitive(spec, &name.value, &Json::Null),
                }),
            };
            tools.insert(name.value.clone(), entry);
        }
        Registry { tools }
    }

    pub fn get(&self, name: &str) -> Option<&RegistryEntry> {
        self.tools.get(name)
    }

    /// Every tool, built-ins first.
    pub fn iter(&self) -> impl Iterator<Item = &RegistryEntry> {
        self.tools.values()
    }

    /// Whether a call of `name` with `args` needs a person's approval when an LLM chose it (`None`
    /// arguments: not known before the call). An MCP tool (`<server>.<tool>`) is as its server's entry
    /// says: sensitive unless the spec says `sensitive: false`. An unknown name is not sensitive: it
    /// cannot run.
    pub fn sensitive(&self, name: &str, args: Option<&Json>) -> bool {
        self.get(name)
            .or_else(|| self.mcp_server_of(name).map(|(server, _)| server))
            .is_some_and(|t| t.safety.of(args).sensitive)
    }

    /// For a tool of a declared MCP server (`<server>.<tool>`): the server's entry and the tool's name on
    /// the server.
    pub fn mcp_server_of<'a>(&self, name: &'a str) -> Option<(&RegistryEntry, &'a str)> {
        let (server, tool) = name.split_once('.')?;
        let entry = self
            .get(server)
            .filter(|e| matches!(e.kind, ToolRef::Mcp))?;
        (!tool.is_empty()).then_some((entry, tool))
    }
}

fn kind(def: &ToolDef) -> ToolRef {
    if def.command.is_some() {
        ToolRef::Command
    } else if def.http.is_some() {
        ToolRef::Http
    } else if def.steps.is_some() {
        ToolRef::Composite
    } else if def.workflow.is_some() {
        ToolRef::Workflow
    } else {
        ToolRef::Mcp
    }
}
