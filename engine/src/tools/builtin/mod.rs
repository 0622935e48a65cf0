//! The built-in tools every workflow can call, one file each. A built-in is a [`Tool`]: adding one is its
//! file, a line in [`TOOLS`] and its section in `docs/tools.md`; validation, planning, agents, rules and the
//! scheduler find it through the catalog.

mod calculator;
mod echo;
mod exec;
mod files;
mod http;
pub mod jq;
mod json;
mod list_files;
mod read_file;
mod shell;
mod sleep;
mod write_file;

use std::sync::OnceLock;

use serde_json::{Value, json};

use super::safety::{Safety, SafetyRule};
use super::{Tool, ToolContext, ToolError, ToolOutput, Watcher};

pub use exec::MAX_CAPTURE_BYTES;
pub use files::confine;
pub use http::MAX_BODY_BYTES;

/// Every built-in tool, in documentation order.
const TOOLS: &[&dyn Tool] = &[
    &exec::Exec,
    &shell::Shell,
    &http::Http,
    &read_file::ReadFile,
    &write_file::WriteFile,
    &list_files::ListFiles,
    &json::JsonQuery,
    &calculator::Calculator,
    &sleep::Sleep,
    &echo::Echo,
];

/// One built-in tool in the catalog: the tool, with its schema built once and checked before each call.
pub struct Builtin {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema of the arguments (always an object schema).
    pub parameters: Value,
    /// What its calls may do.
    pub safety: SafetyRule,
    /// Arguments that hold a duration.
    pub durations: &'static [&'static str],
    /// Its calls run commands (and count against the run's limit of them).
    pub runs_commands: bool,
    tool: &'static dyn Tool,
    /// Compiled on the first call.
    validator: OnceLock<Option<jsonschema::Validator>>,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builtin")
            .field("name", &self.name)
            .field("safety", &self.safety)
            .finish_non_exhaustive()
    }
}

impl Builtin {
    /// What a call with `args` may do (`None`: arguments not known before the call).
    pub fn safety(&self, args: Option<&Value>) -> Safety {
        self.safety.of(args)
    }

    /// Checks `args` against the tool's schema, then calls it.
    pub async fn call(
        &self,
        args: Value,
        cx: &ToolContext,
        on_spawn: Watcher<'_>,
    ) -> Result<ToolOutput, ToolError> {
        self.check(&args)?;
        self.tool.call(args, cx, on_spawn).await
    }

    /// A violation of the schema names the argument's path.
    fn check(&self, args: &Value) -> Result<(), ToolError> {
        let validator = self
            .validator
            .get_or_init(|| jsonschema::validator_for(&self.parameters).ok());
        let Some(error) = validator.as_ref().and_then(|v| v.iter_errors(args).next()) else {
            return Ok(());
        };
        let path = error.instance_path().to_string();
        let at = if path.is_empty() {
            "arguments".to_owned()
        } else {
            format!(
                "argument `{}`",
                path.trim_start_matches('/').replace('/', ".")
            )
        };
        Err(ToolError::new(format!(
            "{at} of tool `{}` is invalid: {}",
            self.name,
            error.masked()
        )))
    }
}

/// Every built-in tool, in documentation order.
pub fn all() -> &'static [Builtin] {
    static CATALOG: OnceLock<Vec<Builtin>> = OnceLock::new();
    CATALOG.get_or_init(|| {
        TOOLS
            .iter()
            .map(|&tool| Builtin {
                name: tool.name(),
                description: tool.description(),
                parameters: tool.parameters(),
                safety: tool.safety(),
                durations: tool.durations(),
                runs_commands: tool.runs_commands(),
                tool,
                validator: OnceLock::new(),
            })
            .collect()
    })
}

pub fn get(name: &str) -> Option<&'static Builtin> {
    all().iter().find(|b| b.name == name)
}

/// An object schema with these properties, of which `required` must be given, and no others.
fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

/// The schema of a `timeout` argument.
fn timeout() -> Value {
    json!({ "type": "string", "description": "time limit such as `30s`" })
}

/// Safety of tools that only read.
const READ_ONLY: SafetyRule = SafetyRule::Fixed(Safety::READ_ONLY);
/// Safety of tools whose calls need a person's approval when an LLM chose them.
const SENSITIVE: SafetyRule = SafetyRule::Fixed(Safety::SENSITIVE);
