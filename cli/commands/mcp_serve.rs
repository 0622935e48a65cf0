//! `archon mcp serve [PATH...]`: the workflows under PATH as MCP tools.

use super::Status;
use crate::args::McpServeArgs;

pub fn serve(_args: &McpServeArgs) -> anyhow::Result<Status> {
    anyhow::bail!("`archon mcp serve` is being built")
}
