//! `archon tools [FILE] [--json]`: the tools a step or an agent can call — the built-ins, and with a spec
//! its declared tools — each with its kind, what its calls may do, and its arguments.

use std::collections::HashMap;
use std::fmt::Write as _;

use archon_engine::llm::ToolSpec;
use archon_engine::run::delegation_tool;
use archon_engine::spec::Spec;
use archon_engine::tools::builtin;
use archon_engine::tools::mcp::McpTool;
use archon_engine::tools::mcp::cache::{self, CachedTools};
use archon_engine::tools::{RegistryEntry, SafetyRule, ToolRef};
use archon_engine::validate::validate_file;
use serde_json::{Value as Json, json};

use super::Status;
use crate::args::{ColorChoice, ToolsArgs};
use crate::output;

/// The tools an MCP server may expose, by the server's name (`None`: whatever it lists).
type Servers = HashMap<String, Option<Vec<String>>>;

/// What is known of an MCP server's tools: listed now (`--refresh`), kept from an earlier listing, or
/// nothing yet.
enum Known {
    Listed(Vec<McpTool>),
    Kept(CachedTools),
    Failed(String),
    NotListed,
}

pub fn tools(args: &ToolsArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let mut servers = Servers::new();
    let mut known: HashMap<String, Known> = HashMap::new();
    let mut status = Status::Success;
    let mut delegations = Vec::new();
    let entries: Vec<RegistryEntry> = match &args.file {
        None => builtin::all()
            .iter()
            .map(|b| RegistryEntry {
                name: b.name.to_owned(),
                description: b.description.to_owned(),
                parameters: b.parameters.clone(),
                kind: ToolRef::Builtin(b),
                safety: b.safety,
            })
            .collect(),
        Some(file) => {
            let Some(workflow) = super::load::valid(file, validate_file(file), color) else {
                return Ok(Status::Invalid);
            };
            if args.refresh {
                let listed = super::mcp::refresh(&workflow, file, &args.state.dir())?;
                status = super::mcp::status(&listed);
                for l in listed {
                    let state = match l.tools {
                        Ok(tools) => Known::Listed(tools),
                        Err(e) => Known::Failed(e),
                    };
                    known.insert(l.server, state);
                }
            } else {
                for (name, def) in &workflow.mcp {
                    let state = cache::read(&args.state.dir(), &def.key)
                        .map_or(Known::NotListed, Known::Kept);
                    known.insert(name.clone(), state);
                }
            }
            for (name, def) in &workflow.spec.tools {
                if let Some(server) = &def.mcp {
                    let only = server
                        .tools
                        .as_ref()
                        .map(|tools| tools.iter().map(|t| t.value.as_str().to_owned()).collect());
                    servers.insert(name.value.clone(), only);
                }
            }
            delegations = Delegation::of(&workflow.spec);
            workflow.tools.iter().cloned().collect()
        }
    };
    if args.json {
        let tools: Vec<Json> = entries
            .iter()
            .map(|e| to_json(e, &servers, known.get(&e.name)))
            .chain(delegations.iter().map(Delegation::to_json))
            .collect();
        output::stdout_json(&tools);
        return Ok(status);
    }
    let mut text = String::new();
    let (builtins, declared): (Vec<_>, Vec<_>) = entries.iter().partition(|e| !e.declared());
    let _ = writeln!(
        text,
        "built-in tools ({}; * marks a required argument):",
        builtins.len()
    );
    for entry in builtins {
        describe(entry, &mut text);
    }
    if let Some(file) = &args.file {
        text.push('\n');
        if declared.is_empty() {
            let _ = writeln!(text, "`{}` declares no tools", file.display());
        } else {
            let _ = writeln!(
                text,
                "tools `{}` declares ({}):",
                file.display(),
                declared.len()
            );
            for entry in declared {
                describe(entry, &mut text);
                if let Some(only) = servers.get(&entry.name) {
                    describe_server(
                        &entry.name,
                        only.as_deref(),
                        known.get(&entry.name).unwrap_or(&Known::NotListed),
                        file,
                        &mut text,
                    );
                }
            }
        }
        if !delegations.is_empty() {
            let _ = writeln!(
                text,
                "\ndelegation tools ({}), one per agent another agent lists in `delegates`:",
                delegations.len()
            );
            for delegation in &delegations {
                let heading = format!("delegation, offered to {}", delegation.agents.join(", "));
                write_tool(
                    &delegation.tool.name,
                    &heading,
                    &delegation.tool.description,
                    Some(&delegation.tool.parameters),
                    &mut text,
                );
            }
        }
    }
    output::stdout(&output::printable(&text));
    Ok(status)
}

/// An MCP server's tools: the table of those listed or kept, or why there is none.
fn describe_server(
    name: &str,
    only: Option<&[String]>,
    known: &Known,
    file: &std::path::Path,
    text: &mut String,
) {
    let again = format!("`archon tools {} --refresh`", file.display());
    match known {
        Known::Listed(tools) => {
            let _ = writeln!(
                text,
                "  tools `{name}.<tool>` ({}, listed now):",
                tools.len()
            );
            super::mcp::write_tools(tools, "    ", text);
        }
        Known::Kept(kept) => {
            let _ = writeln!(
                text,
                "  tools `{name}.<tool>` ({}, as listed {}; {again} lists them again):",
                kept.tools.len(),
                cache::listed_when(kept.listed_at)
            );
            super::mcp::write_tools(&kept.tools, "    ", text);
        }
        Known::Failed(error) => {
            let _ = writeln!(text, "  {}", server_tools(name, only));
            let _ = writeln!(
                text,
                "  not listed: {}",
                error.split_whitespace().collect::<Vec<_>>().join(" ")
            );
        }
        Known::NotListed => {
            let _ = writeln!(text, "  {}", server_tools(name, only));
            let _ = writeln!(
                text,
                "  not listed yet: {again} (or `archon mcp list {}`) starts it and lists them",
                file.display()
            );
        }
    }
}

/// What a tool is, as a person reads it.
fn kind(entry: &RegistryEntry) -> &'static str {
    match entry.kind {
        ToolRef::Builtin(_) => "built-in",
        ToolRef::Command => "command",
        ToolRef::Http => "http",
        ToolRef::Composite => "composite",
        ToolRef::Workflow => "sub-workflow",
        ToolRef::Mcp => "mcp",
    }
}

/// What its calls may do.
fn safety(entry: &RegistryEntry) -> &'static str {
    match entry.safety {
        SafetyRule::ByMethod => "sensitive unless its method only reads",
        SafetyRule::Fixed(s) if s.sensitive => "sensitive",
        SafetyRule::Fixed(s) if s.read_only && entry.declared() => "idempotent",
        SafetyRule::Fixed(s) if s.read_only => "read-only",
        SafetyRule::Fixed(_) => "has effects",
    }
}

/// What an MCP server's entry offers: tools the server describes when it starts.
fn server_tools(name: &str, only: Option<&[String]>) -> String {
    match only {
        Some(tools) => format!(
            "tools `{name}.<tool>` matching {} (the server describes them when it starts)",
            tools
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => {
            format!("tools `{name}.<tool>`, as the server lists and describes them when it starts")
        }
    }
}

fn describe(entry: &RegistryEntry, text: &mut String) {
    write_tool(
        &entry.name,
        &format!("{}, {}", kind(entry), safety(entry)),
        &entry.description,
        (!matches!(entry.kind, ToolRef::Mcp)).then_some(&entry.parameters),
        text,
    );
}

/// A tool's name and what it is, its description and its arguments (`parameters`, when they are known).
fn write_tool(
    name: &str,
    heading: &str,
    description: &str,
    parameters: Option<&Json>,
    text: &mut String,
) {
    let _ = writeln!(text, "\n{name}  {heading}");
    if !description.is_empty() {
        let _ = writeln!(text, "  {}", one_line(description));
    }
    let Some(parameters) = parameters else {
        return;
    };
    let arguments = arguments(parameters);
    if arguments.is_empty() {
        let closed = parameters.get("additionalProperties") == Some(&Json::Bool(false));
        let _ = writeln!(
            text,
            "  {}",
            if closed {
                "no arguments"
            } else {
                "arguments: any"
            }
        );
        return;
    }
    let _ = writeln!(text, "  arguments:");
    let name_width = arguments.iter().map(|a| a.0.len() + 1).max().unwrap_or(0);
    let type_width = arguments.iter().map(|a| a.1.len()).max().unwrap_or(0);
    for (name, kind, required, description) in arguments {
        let name = if required { format!("{name}*") } else { name };
        let line = format!("    {name:<name_width$}  {kind:<type_width$}  {description}");
        let _ = writeln!(text, "{}", line.trim_end());
    }
}

/// Each argument of an object schema: name, type, whether required, description.
fn arguments(schema: &Json) -> Vec<(String, String, bool, String)> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Json::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .map(|(name, property)| {
            (
                name.clone(),
                type_of(property),
                required.contains(&name.as_str()),
                property
                    .get("description")
                    .and_then(Json::as_str)
                    .map(one_line)
                    .unwrap_or_default(),
            )
        })
        .collect()
}

/// A property's type in a few words: `string`, `integer`, `list of strings`, `one of GET, POST`.
fn type_of(schema: &Json) -> String {
    if let Some(values) = schema.get("enum").and_then(Json::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect();
        return format!("one of {}", values.join(", "));
    }
    if let Some(choices) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Json::as_array)
    {
        return choices.iter().map(type_of).collect::<Vec<_>>().join(" or ");
    }
    let one = |t: &str| -> String {
        match t {
            "array" => match schema.get("items") {
                Some(items) => {
                    let inner = type_of(items);
                    if inner == "any" {
                        "list".to_owned()
                    } else {
                        format!("list of {}", plural(&inner))
                    }
                }
                None => "list".to_owned(),
            },
            "object" => match schema.get("additionalProperties") {
                Some(values @ Json::Object(_)) => format!("map of {}", plural(&type_of(values))),
                _ => "object".to_owned(),
            },
            other => other.to_owned(),
        }
    };
    match schema.get("type") {
        Some(Json::String(t)) => one(t),
        Some(Json::Array(types)) => types
            .iter()
            .filter_map(Json::as_str)
            .map(one)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".to_owned(),
    }
}

/// `strings` for `string`; a type of several words stays as it is.
fn plural(kind: &str) -> String {
    if kind.contains(' ') {
        kind.to_owned()
    } else {
        format!("{kind}s")
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn to_json(entry: &RegistryEntry, servers: &Servers, known: Option<&Known>) -> Json {
    let safety = match entry.safety {
        SafetyRule::ByMethod => json!("by_method"),
        SafetyRule::Fixed(s) => json!({ "read_only": s.read_only, "sensitive": s.sensitive }),
    };
    let mut tool = json!({
        "name": entry.name,
        "kind": kind(entry),
        // Kept for scripts written when MCP servers could not run: every tool runs now.
        "runnable": true,
        "description": entry.description,
        "safety": safety,
        "parameters": entry.parameters,
    });
    if let Some(only) = servers.get(&entry.name) {
        // The server's tools are known once it runs; the spec may name the only ones it exposes.
        tool["server_tools"] = json!(only);
        let (tools, listed_at, error) = match known {
            Some(Known::Listed(tools)) => (json!(tools), json!(null), json!(null)),
            Some(Known::Kept(kept)) => (json!(kept.tools), json!(kept.listed_at), json!(null)),
            Some(Known::Failed(e)) => (json!(null), json!(null), json!(e)),
            Some(Known::NotListed) | None => (json!(null), json!(null), json!(null)),
        };
        tool["tools"] = tools;
        tool["listed_at"] = listed_at;
        tool["error"] = error;
    }
    tool
}

/// A tool that delegates to an agent, and the agents offered it (each that lists the agent in
/// `delegates`, in the spec's order).
struct Delegation {
    tool: ToolSpec,
    agents: Vec<String>,
}

impl Delegation {
    /// The delegation tools of a spec's agents: one per delegate and way of delegating (a handoff is
    /// described as one).
    fn of(spec: &Spec) -> Vec<Delegation> {
        let mut found: Vec<Delegation> = Vec::new();
        for (agent, def) in &spec.agents {
            for delegate in &def.delegates {
                let tool = delegation_tool(spec, delegate);
                match found.iter_mut().find(|d| d.tool == tool) {
                    Some(same) => same.agents.push(agent.value.clone()),
                    None => found.push(Delegation {
                        tool,
                        agents: vec![agent.value.clone()],
                    }),
                }
            }
        }
        found
    }

    fn to_json(&self) -> Json {
        json!({
            "name": self.tool.name,
            "kind": "delegation",
            "runnable": true,
            "description": self.tool.description,
            "agents": self.agents,
            "parameters": self.tool.parameters,
        })
    }
}
