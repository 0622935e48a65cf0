//! The built-in tools every workflow can call, with the JSON Schema of their arguments.
//!
//! Validation uses this catalog to check `tool:` names and `with:` arguments; execution comes with the
//! runtime. The schemas are documented in `docs/tools.md`.

use std::sync::OnceLock;

use serde_json::{Value, json};

use super::safety::{Safety, SafetyRule};

/// One built-in tool.
#[derive(Debug)]
pub struct Builtin {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema of the arguments (always an object schema).
    pub parameters: Value,
    /// What its calls may do.
    pub safety: SafetyRule,
}

impl Builtin {
    /// What a call with `args` may do (`None`: arguments not known before the call).
    pub fn safety(&self, args: Option<&Value>) -> Safety {
        self.safety.of(args)
    }
}

/// Every built-in tool, in documentation order.
pub fn all() -> &'static [Builtin] {
    static CATALOG: OnceLock<Vec<Builtin>> = OnceLock::new();
    CATALOG.get_or_init(catalog)
}

pub fn get(name: &str) -> Option<&'static Builtin> {
    all().iter().find(|b| b.name == name)
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

fn catalog() -> Vec<Builtin> {
    let timeout = json!({ "type": "string", "description": "time limit such as `30s`" });
    vec![
        Builtin {
            name: "exec",
            description: "Run a program with arguments (argv, no shell)",
            parameters: object(
                json!({
                    "argv": { "type": "array", "items": { "type": "string" }, "minItems": 1 },
                    "cwd": { "type": "string" },
                    "env": { "type": "object", "additionalProperties": { "type": "string" } },
                    "stdin": { "type": "string" },
                    "output": { "enum": ["text", "json", "lines"] },
                    "ok_exit_codes": { "type": "array", "items": { "type": "integer" } },
                    "timeout": timeout,
                }),
                &["argv"],
            ),
            safety: SafetyRule::Fixed(Safety::SENSITIVE),
        },
        Builtin {
            name: "shell",
            description: "Run a command line through `sh -c` (explicit opt-in to a shell)",
            parameters: object(
                json!({
                    "command": { "type": "string" },
                    "cwd": { "type": "string" },
                    "env": { "type": "object", "additionalProperties": { "type": "string" } },
                    "stdin": { "type": "string" },
                    "output": { "enum": ["text", "json", "lines"] },
                    "ok_exit_codes": { "type": "array", "items": { "type": "integer" } },
                    "timeout": timeout,
                }),
                &["command"],
            ),
            safety: SafetyRule::Fixed(Safety::SENSITIVE),
        },
        Builtin {
            name: "http",
            description: "Make an HTTP request",
            parameters: object(
                json!({
                    "method": { "enum": ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] },
                    "url": { "type": "string" },
                    "headers": { "type": "object", "additionalProperties": { "type": "string" } },
                    "json": {},
                    "body": { "type": "string" },
                    "timeout": timeout,
                }),
                &["url"],
            ),
            safety: SafetyRule::ByMethod,
        },
        Builtin {
            name: "read_file",
            description: "Read a text file inside the workspace",
            parameters: object(json!({ "path": { "type": "string" } }), &["path"]),
            safety: SafetyRule::Fixed(Safety::READ_ONLY),
        },
        Builtin {
            name: "write_file",
            description: "Write a text file inside the workspace",
            parameters: object(
                json!({
                    "path": { "type": "string" },
                    "content": { "type": "string" },
                    "append": { "type": "boolean" },
                }),
                &["path", "content"],
            ),
            safety: SafetyRule::Fixed(Safety::SENSITIVE),
        },
        Builtin {
            name: "list_files",
            description: "List files inside the workspace matching a glob",
            parameters: object(
                json!({
                    "path": { "type": "string" },
                    "pattern": { "type": "string" },
                }),
                &[],
            ),
            safety: SafetyRule::Fixed(Safety::READ_ONLY),
        },
        Builtin {
            name: "json",
            description: "Query or transform JSON with a jq filter",
            parameters: object(
                json!({ "input": {}, "query": { "type": "string" } }),
                &["query"],
            ),
            safety: SafetyRule::Fixed(Safety::READ_ONLY),
        },
        Builtin {
            name: "calculator",
            description: "Evaluate an arithmetic expression",
            parameters: object(
                json!({ "expression": { "type": "string" } }),
                &["expression"],
            ),
            safety: SafetyRule::Fixed(Safety::READ_ONLY),
        },
        Builtin {
            name: "sleep",
            description: "Wait for a duration",
            parameters: object(json!({ "duration": { "type": "string" } }), &["duration"]),
            safety: SafetyRule::Fixed(Safety::READ_ONLY),
        },
        Builtin {
            name: "echo",
            description: "Return its arguments unchanged",
            parameters: json!({ "type": "object" }),
            safety: SafetyRule::Fixed(Safety::READ_ONLY),
        },
    ]
}
