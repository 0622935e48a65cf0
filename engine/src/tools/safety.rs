//! What a call may do: the safety of built-in tools (fixed, or decided by the arguments) and whether a call
//! is sensitive. Whether a step is safe to repeat after a crash is for the idempotence module to say.

use std::collections::HashSet;

use serde_json::Value as Json;

use super::builtin;
use crate::spec::{HttpMethod, Node, Spec, Step};

/// What a call may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Safety {
    /// Has no side effect: a call in doubt after a crash may be repeated.
    pub read_only: bool,
    /// Asks for a person's approval when an LLM chose it, unless a rule allows it.
    pub sensitive: bool,
}

impl Safety {
    pub const READ_ONLY: Safety = Safety {
        read_only: true,
        sensitive: false,
    };
    /// Has effects, but none that needs a person's approval.
    pub const CHANGES: Safety = Safety {
        read_only: false,
        sensitive: false,
    };
    pub const SENSITIVE: Safety = Safety {
        read_only: false,
        sensitive: true,
    };
}

/// How a tool's safety follows from a call's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SafetyRule {
    /// The same for every call.
    Fixed(Safety),
    /// An HTTP request: read-only when its `method` (default `GET`) only reads and is written as is;
    /// sensitive otherwise, and when the method is not known before the call.
    ByMethod,
}

impl SafetyRule {
    /// The safety of a call with `args` (`None`: the arguments are not known before the call).
    pub fn of(self, args: Option<&Json>) -> Safety {
        match self {
            SafetyRule::Fixed(safety) => safety,
            SafetyRule::ByMethod => {
                let reads = args.is_some_and(|a| {
                    a.get("method")
                        .map_or(Some("GET"), Json::as_str)
                        .is_some_and(|m| !m.contains("{{") && reads_only(m))
                });
                if reads {
                    Safety::READ_ONLY
                } else {
                    Safety::SENSITIVE
                }
            }
        }
    }

    /// Whether some calls are not sensitive (a plan may use the tool, call by call).
    pub fn may_be_harmless(self) -> bool {
        match self {
            SafetyRule::Fixed(safety) => !safety.sensitive,
            SafetyRule::ByMethod => true,
        }
    }
}

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
        return b.safety(args).sensitive;
    }
    let Some(def) = spec.tools.get(tool).or_else(|| {
        // A tool of an MCP server is as sensitive as the server says, and is unless it says otherwise.
        let (server, _) = tool.split_once('.')?;
        spec.tools.get(server).filter(|d| d.mcp.is_some())
    }) else {
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
