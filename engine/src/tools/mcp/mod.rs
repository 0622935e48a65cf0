//! MCP servers as tool sources. A workflow declares servers under `tools:` (`mcp:`); validation resolves
//! each to a [`ServerDef`] (its `from` file read, nothing rendered, nothing started). A run renders a
//! definition into a [`ServerConfig`] when a step first needs it and asks the run's [`Servers`] for its
//! tools or a call: the server starts then, is shared by every step and agent of the run, and stops with
//! the run.
//!
//! - `client.rs`: one connection (rmcp): a child process in its own process group or streamable HTTP,
//!   `initialize` within `startup_timeout`, `tools/list` (every page), calls with progress and
//!   cancellation.
//! - `pool.rs`: [`Servers`], the run's servers by configuration: started on first use, restarted with
//!   backoff a bounded number of times, shut down (process group included) when the run ends.
//! - `result.rs`: a `CallToolResult` as a step's output.
//! - `names.rs`: the names models see (`^[A-Za-z0-9_-]{1,64}$`) and back.
//! - `cache.rs`: tool lists kept in the state directory, keyed by a server's definition, for `validate`.
//! - `import.rs`: `mcpServers` JSON files (`.mcp.json`, Claude Desktop or Code, Cursor).

pub mod cache;
mod client;
pub mod import;
pub mod names;
mod pool;
mod result;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::network::NetworkPolicy;
use crate::redact::Redactor;
use crate::spec::Pattern;

pub use client::MAX_MESSAGE_BYTES;
pub use pool::Servers;

/// One value of a server's definition: a spec template, or a literal read from an `mcpServers` file
/// (where `${VAR}` and `${VAR:-default}` name variables of archon's environment, as other MCP clients
/// read them).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DefValue {
    Template(String),
    Literal(String),
}

/// How a server is reached, as defined (nothing rendered).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TransportDef {
    /// A child process speaking MCP on its standard input and output.
    Stdio {
        argv: Vec<DefValue>,
        env: Vec<(String, DefValue)>,
        cwd: Option<DefValue>,
    },
    /// Streamable HTTP.
    Http {
        url: DefValue,
        headers: Vec<(String, DefValue)>,
    },
}

/// An MCP server as validation resolved it.
#[derive(Clone, Debug)]
pub struct ServerDef {
    /// The tool name it is declared under: its tools are `<name>.<tool>`.
    pub name: String,
    pub transport: TransportDef,
    /// Only the tools whose names match (`None`: every tool).
    pub tools: Option<Vec<Pattern>>,
    pub limits: Limits,
    /// A digest of the definition (transport and filters, as written): the key of its cached tool list.
    pub key: String,
}

/// How long a server may take and how often it is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limits {
    pub startup_timeout: Duration,
    /// Most time a call may go without news (a result or progress).
    pub call_timeout: Duration,
    /// Most time a call may take in all, progress or not.
    pub max_call_timeout: Duration,
    /// How many times a server that exited is started again within one run.
    pub restarts: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            startup_timeout: Duration::from_secs(30),
            call_timeout: Duration::from_secs(60),
            max_call_timeout: Duration::from_secs(600),
            restarts: 3,
        }
    }
}

/// A server's definition rendered for one run: what the pool starts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    pub tools: Option<Vec<String>>,
    pub limits: Limits,
}

/// How a server is reached, rendered.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Stdio {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        /// Absolute: the workspace, or a directory inside it.
        cwd: PathBuf,
    },
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
}

/// One tool a server lists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct McpTool {
    /// Its name on the server (without the `<server>.` prefix).
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    pub input_schema: Json,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Json>,
    /// What the server says about it (`readOnlyHint` and the like): hints, not trust.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Json>,
}

/// What a run's [`Servers`] need to know about the run.
#[derive(Clone)]
pub struct ServersOptions {
    /// Told the process group of every server process started, as soon as it starts, on the task that
    /// started it (a run records it for the step whose call started the server, so that a resume after a
    /// crash stops a server that outlived it when that step is in doubt).
    pub on_spawn: Arc<dyn Fn(u32) + Send + Sync>,
    /// Variables a server process does not inherit from archon's environment (the declared secrets:
    /// they reach a server only through its `env`).
    pub withheld: Vec<String>,
    /// Secret values, masked in results and in the standard error errors quote.
    pub redactor: Arc<Redactor>,
    /// What a streamable HTTP server's URL may reach.
    pub network: Arc<NetworkPolicy>,
}

impl Default for ServersOptions {
    fn default() -> Self {
        ServersOptions {
            on_spawn: Arc::new(|_| {}),
            withheld: Vec::new(),
            redactor: Arc::new(Redactor::default()),
            network: Arc::new(NetworkPolicy::default()),
        }
    }
}

impl std::fmt::Debug for ServersOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServersOptions")
            .field("withheld", &self.withheld)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

/// Whether a tool name or glob could match a tool of MCP server `server` (`<server>.<tool>`): whether the
/// literal start of the glob, before its first wildcard, and `<server>.` agree. An over-approximation, for
/// deciding which servers an agent's tool globs may reach before they are listed.
pub fn could_match(pattern: &str, server: &str) -> bool {
    let literal = pattern
        .find(['*', '?', '[', '{'])
        .map_or(pattern, |at| &pattern[..at]);
    let prefix = format!("{server}.");
    if pattern.len() == literal.len() {
        return literal.len() > prefix.len() && literal.starts_with(&prefix);
    }
    literal.starts_with(&prefix) || prefix.starts_with(literal)
}

#[cfg(test)]
mod tests {
    use super::could_match;

    #[test]
    fn globs_reach_the_servers_their_literal_start_allows() {
        assert!(could_match("github.list_issues", "github"));
        assert!(could_match("github.*", "github"));
        assert!(could_match("*", "github"));
        assert!(could_match("git*", "github"));
        assert!(!could_match("github", "github"));
        assert!(!could_match("github.", "github"));
        assert!(!could_match("gitlab.*", "github"));
        assert!(!could_match("read_*", "github"));
        assert!(!could_match("read_file", "github"));
    }
}
