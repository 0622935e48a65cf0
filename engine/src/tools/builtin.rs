//! The built-in tools every workflow can call, with the JSON Schema of their arguments.
//!
//! Validation uses this catalog to check `tool:` names and `with:` arguments; execution comes with the
//! runtime. The schemas are documented in `docs/tools.md`.

use std::sync::OnceLock;

use serde_json::{Value, json};

/// One built-in tool.
#[derive(Debug)]
pub struct Builtin {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema of the arguments (always an object schema).
    pub parameters: Value,
    /// Calls chosen by an LLM ask for approval unless a rule allows them.
    pub sensitive: bool,
    /// Has no side effect, so a call in doubt after a crash may be repeated.
    pub read_only: bool,
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
            sensitive: true,
            read_only: false,
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
            sensitive: true,
            read_only: false,
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
            // Only non-GET methods are sensitive; the runtime refines this per call.
            sensitive: false,
            read_only: false,
        },
        Builtin {
            name: "read_file",
            description: "Read a text file inside the workspace",
            parameters: object(json!({ "path": { "type": "string" } }), &["path"]),
            sensitive: false,
            read_only: true,
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
            sensitive: true,
            read_only: false,
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
            sensitive: false,
            read_only: true,
        },
        Builtin {
            name: "json",
            description: "Query or transform JSON with a jq filter",
            parameters: object(
                json!({ "input": {}, "query": { "type": "string" } }),
                &["query"],
            ),
            sensitive: false,
            read_only: true,
        },
        Builtin {
            name: "calculator",
            description: "Evaluate an arithmetic expression",
            parameters: object(
                json!({ "expression": { "type": "string" } }),
                &["expression"],
            ),
            sensitive: false,
            read_only: true,
        },
        Builtin {
            name: "sleep",
            description: "Wait for a duration",
            parameters: object(json!({ "duration": { "type": "string" } }), &["duration"]),
            sensitive: false,
            read_only: true,
        },
        Builtin {
            name: "echo",
            description: "Return its arguments unchanged",
            parameters: json!({ "type": "object" }),
            sensitive: false,
            read_only: true,
        },
    ]
}
