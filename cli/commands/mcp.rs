//! `archon mcp list FILE`: starts a workflow's MCP servers, lists their tools and keeps the lists in the
//! state directory, where `archon validate` checks MCP calls against them.

use super::Status;
use crate::args::{ColorChoice, McpListArgs};

pub fn list(_args: &McpListArgs, _color: ColorChoice) -> anyhow::Result<Status> {
    anyhow::bail!("`archon mcp list` is being built")
}
