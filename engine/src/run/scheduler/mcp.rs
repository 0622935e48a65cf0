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
pub(super) async fn tools(shared: &Shared, server: &str) -> Result<Arc<[McpTool]>, Failure> {
    let config = config(shared, server).await?;
    shared
        .mcp
        .servers
        .tools(&config)
        .await
        .map_err(tool_failure)
}

/// Calls tool `tool` of MCP server `server` with rendered arguments.
pub(super) async fn call(
    shared: &Shared,
    server: &str,
    tool: &str,
    args: Json,
) -> Result<Called, Failure> {
    let config = config(shared, server).await?;
    shared
        .mcp
        .servers
        .call(&config, tool, args, None, &shared.options.cancel)
        .await
        .map(Called::from)
        .map_err(tool_failure)
}
