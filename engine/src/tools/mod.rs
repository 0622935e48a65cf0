//! Tools: what a step or an LLM can call. Every tool is one [`Tool`]: its name, the JSON Schema of its
//! arguments, what its calls may do ([`SafetyRule`]) and how it is called. The built-ins live one per file in
//! `builtin/`; a workflow's [`Registry`] holds them together with the tools its spec declares (commands,
//! HTTP requests, composite tools, sub-workflows; later MCP tools), resolved once by validation, and
//! validation, planning, agents, rules and the scheduler all ask it.

/// The tools memory gives an agent with `memory: true` (not in any registry: the agent loop answers them).
pub const MEMORY_TOOLS: [&str; 5] = ["remember", "recall", "forget", "note", "notes"];
/// The tools an agent with `notes: true` (and no `memory`) is given.
pub const NOTE_TOOLS: [&str; 2] = ["note", "notes"];

pub mod builtin;
pub mod mcp;
mod registry;
mod safety;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value as Json;

pub use registry::{Registry, RegistryEntry, ToolRef};
pub use safety::{Safety, SafetyRule, reads_only, sensitive};

use crate::network::NetworkPolicy;
use crate::redact::Redactor;

/// A future a tool call returns.
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send + 'a>>;

/// A tool archon can call. Arguments reach [`Tool::call`] already checked against
/// [`Tool::parameters`].
pub trait Tool: Send + Sync {
    fn name(&self) -> &'static str;
    /// One line for people and models.
    fn description(&self) -> &'static str;
    /// JSON Schema of the arguments (always an object schema).
    fn parameters(&self) -> Json;
    /// What its calls may do.
    fn safety(&self) -> SafetyRule;
    /// Whether a call runs a command: such calls count against the run's limit on commands and LLM calls
    /// running at once (`max_parallel`).
    fn runs_commands(&self) -> bool {
        false
    }
    /// Arguments that hold a duration (`30s`): `validate` checks those written as they are.
    fn durations(&self) -> &'static [&'static str] {
        &[]
    }
    /// Calls the tool with rendered, checked arguments, which it owns: a large value can be moved to
    /// another thread without a copy on the run's.
    fn call<'a>(&'a self, args: Json, cx: &'a ToolContext, on_spawn: Watcher<'a>)
    -> CallFuture<'a>;
}

/// What a tool call produced.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    pub output: Json,
    pub text: String,
    pub exit_code: Option<i32>,
}

impl ToolOutput {
    /// An output whose text is its JSON.
    pub fn json(output: Json) -> Self {
        ToolOutput {
            text: output.to_string(),
            output,
            exit_code: None,
        }
    }
}

/// Why a tool call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub message: String,
    pub exit_code: Option<i32>,
    /// What kind of failure it is, for `retry.on`.
    pub class: ErrorClass,
}

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        ToolError {
            message: message.into(),
            exit_code: None,
            class: ErrorClass::Other,
        }
    }

    /// A failure that the same call would meet again: retrying cannot help.
    pub fn permanent(message: impl Into<String>) -> Self {
        ToolError::new(message).of(ErrorClass::Permanent)
    }

    #[must_use]
    pub fn of(mut self, class: ErrorClass) -> Self {
        self.class = class;
        self
    }
}

/// What kind of failure a call met, which decides whether `retry` tries it again: by default every
/// failure but a permanent one; `retry.on` names the kinds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorClass {
    /// A tool's own failure, such as a command's exit code.
    #[default]
    Other,
    /// Repeating the same call cannot help: invalid arguments, an address the network policy refuses, a
    /// file outside the workspace, an HTTP status in 4xx other than 408 and 429.
    Permanent,
    /// An HTTP status in 4xx that is not permanent in every case (retried only when `retry.on` says
    /// `4xx`): kept apart so that a 404 a step polls for can be waited for.
    ClientError,
    /// An HTTP status in 5xx.
    ServerError,
    /// HTTP 429 (and 408): the server asks to come back later.
    RateLimited,
    /// A connection that could not be made, or broke.
    Connect,
}

impl ErrorClass {
    /// The class of an HTTP status that is not a success.
    pub fn of_status(status: u16) -> ErrorClass {
        match status {
            408 | 429 => ErrorClass::RateLimited,
            code if code >= 500 => ErrorClass::ServerError,
            code if code >= 400 => ErrorClass::ClientError,
            _ => ErrorClass::Other,
        }
    }
}

/// Where tools run.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// File tools and commands are confined to this directory.
    pub workdir: PathBuf,
    /// Directories file tools refuse, wherever they are (archon's state directory).
    pub protected: Vec<PathBuf>,
    /// The spec's `env`, rendered, for commands.
    pub env: Vec<(String, String)>,
    /// Variables a command does not inherit from archon's environment: the declared secrets, which
    /// reach a command only through an `env` that passes them, wherever their value was read from.
    pub withheld: Vec<String>,
    /// What `http` may reach.
    pub network: Arc<NetworkPolicy>,
    /// Secret values, masked in the excerpts errors quote before they are cut (a cut secret would no
    /// longer be recognised).
    pub redactor: Arc<Redactor>,
    /// The `archon` executable, run again for work that must be killable (jq filters).
    pub helper: Option<PathBuf>,
}

/// What a call tells its caller as it goes: the process group of each command it starts, as soon as it
/// starts, and what its commands write, as they write it.
pub trait Watch: Sync {
    /// A command started, in process group `pgid`.
    fn spawned(&self, pgid: u32);
    /// A command wrote `text` (whole lines, or a long line's part; secrets masked) to `stream`.
    fn output(&self, stream: Stream, text: &str);
}

/// Most bytes of one stream of one command passed on to its watcher; a note says the rest is not.
pub const MAX_WATCHED_BYTES: usize = 1024 * 1024;

/// The watcher of a call, if anyone watches it.
pub type Watcher<'a> = Option<&'a dyn Watch>;

/// A command's output stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Runs blocking `work` on a thread of its own, so that the scheduler's thread never waits for it: a file
/// that never answers (a FIFO nobody writes, a hung network file system) holds that thread, not the run,
/// and the step's timeout and Ctrl-C still end the call. Not `spawn_blocking`: the runtime waits for its
/// blocking tasks when it shuts down, so one stuck read would keep archon from exiting.
pub async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ToolError> {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("archon-io".into())
        .spawn(move || {
            let _ = sender.send(work());
        })
        .map_err(|e| ToolError::new(format!("cannot start a thread for a tool: {e}")))?;
    receiver
        .await
        .map_err(|_| ToolError::new("a tool's thread stopped without an answer"))
}
