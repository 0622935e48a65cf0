//! The run's MCP servers: each definition is rendered into a [`ServerConfig`] when a step first needs
//! the server (its templates see `inputs`, `env`, `run` and `secrets`, like a declared tool's), and the
//! run's [`Servers`] pool starts it, shares it between every step, agent and sub-workflow of the run, and
//! stops it when the run ends.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value as Json;
use tokio::sync::Mutex as AsyncMutex;

use super::context::{Called, Failure, Shared, tool_failure};
use crate::tools::mcp::{McpTool, ServerConfig, Servers};

tokio::task_local! {
    /// The step (as the journal knows it) whose call is starting an MCP server, if any: the server's
    /// process group is recorded for it, so that a resume after a crash stops a server that outlived it.
    static STARTING_FOR: String;
}

/// Records the process group of an MCP server a step's call started, for the step (see [`STARTING_FOR`]).
pub(super) fn spawned(journal: &Arc<dyn crate::store::Journal>, pgid: u32) {
    if let Ok(step) = STARTING_FOR.try_with(Clone::clone) {
        journal.record(crate::store::Entry::ProcessStarted {
            step,
            pgid,
            started: crate::process::process_start_time(pgid),
        });
        // Committed at once, without waiting for it: the server is already running.
        drop(journal.flush());
    }
}

/// The MCP servers of one run.
pub(crate) struct McpRun {
    pub servers: Servers,
    /// Rendered configurations, by workflow (its address) and server name.
    configs: AsyncMutex<HashMap<(usize, String), Arc<ServerConfig>>>,
}

impl McpRun {
    pub fn new(options: crate::tools::mcp::ServersOptions) -> McpRun {
        McpRun {
            servers: Servers::new(options),
            configs: AsyncMutex::default(),
        }
    }
}

impl std::fmt::Debug for McpRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpRun").finish_non_exhaustive()
    }
}

/// The configuration of MCP server `server` of the step list's workflow, rendered once per run.
async fn config(shared: &Shared, server: &str) -> Result<Arc<ServerConfig>, Failure> {
    let Some(def) = shared.workflow.mcp.get(server) else {
        return Err(Failure::fixed(format!("unknown MCP server `{server}`")));
    };
    let key = (Arc::as_ptr(&shared.workflow) as usize, server.to_owned());
    let mut configs = shared.mcp.configs.lock().await;
    if let Some(config) = configs.get(&key) {
        return Ok(config.clone());
    }
    let ctx = shared.tool_definition_context(&[]);
    let mut rendered = Vec::new();
    for template in crate::run::mcp::templates(def) {
        let text = shared.renderer.text(template, &ctx).await;
        rendered.push(text.map_err(|e| {
            Failure::fixed(format!(
                "MCP server `{server}`: {}",
                shared.redactor.text(&e.message)
            ))
        })?);
    }
    let rendered =
        crate::run::mcp::render_server(def, &shared.options.workdir, &shared.options.env, rendered);
    let config = Arc::new(rendered.map_err(|e| {
        Failure::fixed(format!(
            "MCP server `{server}`: {}",
            shared.redactor.text(&e)
        ))
    })?);
    configs.insert(key, config.clone());
    Ok(config)
}

/// The tools of MCP server `server` (after its `tools` filter), starting it if it is not running.
pub(super) async fn tools(
    shared: &Shared,
    label: &str,
    server: &str,
) -> Result<Arc<[McpTool]>, Failure> {
    let config = config(shared, server).await?;
    let listing = shared.mcp.servers.tools(&config, &shared.options.cancel);
    STARTING_FOR
        .scope(step_of(label), listing)
        .await
        .map_err(tool_failure)
}

/// The run's own step that makes a call labelled `label` (`outer` of `outer/inner`).
fn step_of(label: &str) -> String {
    label.split('/').next().unwrap_or(label).to_owned()
}

/// Calls tool `tool` of MCP server `server` with rendered arguments.
pub(super) async fn call(
    shared: &Shared,
    label: &str,
    server: &str,
    tool: &str,
    args: Json,
) -> Result<Called, Failure> {
    let config = config(shared, server).await?;
    let call = (shared.mcp.servers).call(&config, tool, args, None, &shared.options.cancel);
    STARTING_FOR
        .scope(step_of(label), call)
        .await
        .map(Called::from)
        .map_err(tool_failure)
}
