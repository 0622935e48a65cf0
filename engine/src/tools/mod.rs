//! Tools: the built-in catalog (names, argument schemas, safety flags).

pub mod builtin;

use std::collections::HashSet;

use serde_json::Value as Json;

use crate::spec::{HttpMethod, Node, Spec, Step};

/// Whether a call of `tool` with `args` is sensitive: it needs a person's approval when an LLM chose it.
/// Built-in `exec`, `shell` and `write_file` are, and `http` with a method that changes things; a declared
/// tool is when it says `sensitive: true` (and is not when it says `false`), else when it is an `http`
/// tool with such a method, an MCP tool, a sub-workflow, or a composite tool one of whose steps (or
/// fallbacks) calls a sensitive tool.
pub fn sensitive(spec: &Spec, tool: &str, args: &Json) -> bool {
    sensitive_tool(spec, tool, Some(args), &mut HashSet::new())
}

fn sensitive_tool(
    spec: &Spec,
    tool: &str,
    args: Option<&Json>,
    seen: &mut HashSet<String>,
) -> bool {
    if let Some(b) = builtin::get(tool) {
        if tool == "http" {
            // A method not known before the call (a template, or no arguments at hand) counts as one
            // that changes things.
            return args.is_none_or(|a| {
                a.get("method")
                    .map_or(Some("GET"), Json::as_str)
                    .is_none_or(|m| m.contains("{{") || !reads_only(m))
            });
        }
        return b.sensitive;
    }
    let Some(def) = spec.tools.get(tool) else {
        return false;
    };
    // The spec's author may say either way; otherwise it follows from what the tool does.
    if let Some(sensitive) = def.sensitive {
        return sensitive;
    }
    if def.workflow.is_some() || def.mcp.is_some() {
        return true;
    }
    if let Some(http) = &def.http {
        return http.method.as_ref().is_some_and(|m| {
            !matches!(
                m.value,
                HttpMethod::Get | HttpMethod::Head | HttpMethod::Options
            )
        });
    }
    if let Some(steps) = &def.steps {
        if !seen.insert(tool.to_owned()) {
            return false;
        }
        return steps.value.iter().any(|s| step_sensitive(spec, s, seen));
    }
    false
}

/// Whether a step (or its fallback) calls a sensitive tool, as written.
fn step_sensitive(spec: &Spec, step: &Step, seen: &mut HashSet<String>) -> bool {
    let body_sensitive = |tool: Option<&crate::spec::Spanned<String>>,
                          args: Option<&Node>,
                          seen: &mut HashSet<String>| {
        tool.is_some_and(|t| {
            let args = args.map_or(Json::Object(serde_json::Map::new()), Node::to_json);
            sensitive_tool(spec, &t.value, Some(&args), seen)
        })
    };
    let body = step.body();
    body.workflow.is_some()
        || body_sensitive(body.tool, body.args, seen)
        || step.fallback.as_ref().is_some_and(|f| {
            let fb = f.body();
            fb.workflow.is_some() || body_sensitive(fb.tool, fb.args, seen)
        })
}

/// Whether an HTTP method only reads.
pub fn reads_only(method: &str) -> bool {
    matches!(
        method.to_ascii_uppercase().as_str(),
        "GET" | "HEAD" | "OPTIONS"
    )
}
