//! `archon mcp list FILE`: starts a workflow's MCP servers, lists their tools and keeps the lists in the
//! state directory, where `archon validate` checks MCP calls against them (and `archon tools FILE` shows
//! them). `archon tools FILE --refresh` does the same listing.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use archon_engine::Workflow;
use archon_engine::spec::Limits;
use archon_engine::tools::mcp::{McpTool, cache};
use archon_engine::validate::Validator;
use serde_json::{Value as Json, json};

use super::Status;
use crate::args::{ColorChoice, McpListArgs};
use crate::output;

pub fn list(args: &McpListArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let Some(workflow) = load(&args.file, color) else {
        return Ok(Status::Invalid);
    };
    let listed = refresh(&workflow, &args.file, &args.state.dir())?;
    if args.json {
        let servers: Vec<Json> = listed
            .iter()
            .map(|l| match &l.tools {
                Ok(tools) => json!({ "server": l.server, "key": l.key, "tools": tools }),
                Err(error) => json!({ "server": l.server, "key": l.key, "error": error }),
            })
            .collect();
        output::stdout_json(&json!({ "servers": servers }));
    } else {
        let mut text = String::new();
        if listed.is_empty() {
            let _ = writeln!(text, "`{}` declares no MCP servers", args.file.display());
        }
        for (i, server) in listed.iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            write_server(server, &mut text);
        }
        if listed.iter().any(|l| l.tools.is_ok()) {
            let _ = writeln!(
                text,
                "\nkept in `{}` for `archon validate` and `archon tools`",
                args.state.dir().join("mcp").display()
            );
        }
        output::stdout(&output::printable(&text));
    }
    Ok(status(&listed))
}

/// Exit 1 when a server could not be listed.
pub fn status(listed: &[Listed]) -> Status {
    if listed.iter().any(|l| l.tools.is_err()) {
        Status::Failure
    } else {
        Status::Success
    }
}

/// One server, as listed now.
pub struct Listed {
    pub server: String,
    /// The key of its kept list.
    pub key: String,
    pub tools: Result<Vec<McpTool>, String>,
}

/// Validates `file` (without checking MCP calls against kept lists: a list gone stale must not stop it
/// being listed again); diagnostics on standard error when it is invalid.
pub fn load(file: &Path, color: ColorChoice) -> Option<Workflow> {
    super::load::valid(
        file,
        Validator::new(Limits::default()).validate_path(file),
        color,
    )
}

/// Starts each MCP server of `workflow`, lists its tools and keeps the list in `state_dir`. The servers
/// run in the spec's directory, as `archon run` runs them by default.
pub fn refresh(workflow: &Workflow, file: &Path, state_dir: &Path) -> anyhow::Result<Vec<Listed>> {
    if workflow.mcp.is_empty() {
        return Ok(Vec::new());
    }
    let workdir: PathBuf = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let workdir = std::fs::canonicalize(&workdir)
        .map_err(|e| anyhow::anyhow!("workspace `{}`: {e}", workdir.display()))?;
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Ctrl-C stops the servers started so far rather than leaving them behind.
    let cancel = tokio_util::sync::CancellationToken::new();
    let signals = super::run::cancel_on_signals(cancel.clone())?;
    let found = runtime.block_on(archon_engine::run::mcp::list_servers(
        workflow, &workdir, env, &cancel,
    ));
    signals.close();
    if cancel.is_cancelled() {
        anyhow::bail!(
            "interrupted: the MCP servers started were stopped and no tool list was kept"
        );
    }
    let mut listed = Vec::with_capacity(found.len());
    for server in found {
        let tools = match server.tools {
            Ok(tools) => match cache::write(state_dir, &server.def.key, &server.server, &tools) {
                Ok(_) => Ok(tools),
                Err(e) => Err(format!(
                    "listed, but its tool list could not be kept in `{}`: {}",
                    state_dir.join("mcp").display(),
                    e.to_string().to_lowercase()
                )),
            },
            Err(e) => Err(e),
        };
        listed.push(Listed {
            server: server.server,
            key: server.def.key.clone(),
            tools,
        });
    }
    Ok(listed)
}

/// A server and its tools as a table: name, required arguments, the server's hints, description.
fn write_server(server: &Listed, text: &mut String) {
    let tools = match &server.tools {
        Err(error) => {
            let _ = writeln!(
                text,
                "server `{}`: not listed: {}",
                server.server,
                one_line(error, 400)
            );
            return;
        }
        Ok(tools) => tools,
    };
    let _ = writeln!(
        text,
        "server `{}`: {} tool{} (called as `{}.<tool>`)",
        server.server,
        tools.len(),
        if tools.len() == 1 { "" } else { "s" },
        server.server
    );
    write_tools(tools, "  ", text);
}

/// The tools as a table, each line starting with `indent`.
pub fn write_tools(tools: &[McpTool], indent: &str, text: &mut String) {
    if tools.is_empty() {
        return;
    }
    let rows: Vec<[String; 4]> = tools
        .iter()
        .map(|t| {
            [
                one_line(&t.name, 64),
                required(&t.input_schema).join(", "),
                hints(t.annotations.as_ref()).join(", "),
                first_line(&t.description),
            ]
        })
        .collect();
    let header = ["TOOL", "REQUIRED ARGUMENTS", "HINTS", "DESCRIPTION"];
    // The hints column only when the server gives some.
    let shown: Vec<usize> = if rows.iter().any(|r| !r[2].is_empty()) {
        vec![0, 1, 2, 3]
    } else {
        vec![0, 1, 3]
    };
    let widths: Vec<usize> = (0..4)
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 4], text: &mut String| {
        let mut row = indent.to_owned();
        for (n, &i) in shown.iter().enumerate() {
            if n + 1 == shown.len() {
                row.push_str(cells[i]);
            } else {
                let pad = widths[i].saturating_sub(cells[i].chars().count());
                row.push_str(cells[i]);
                row.push_str(&" ".repeat(pad + 2));
            }
        }
        let _ = writeln!(text, "{}", row.trim_end());
    };
    line(header, text);
    for row in &rows {
        line([&row[0], &row[1], &row[2], &row[3]], text);
    }
}

/// The required arguments of an object schema, in its order.
fn required(schema: &Json) -> Vec<String> {
    schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| {
            r.iter()
                .filter_map(Json::as_str)
                .map(|s| one_line(s, 40))
                .collect()
        })
        .unwrap_or_default()
}

/// What the server says about a tool (hints from the server, not trust): `read-only`, `destructive`,
/// `idempotent`, `open-world`, each only when the server says so.
pub fn hints(annotations: Option<&Json>) -> Vec<&'static str> {
    let said = |key: &str| annotations.and_then(|a| a.get(key)) == Some(&Json::Bool(true));
    [
        ("readOnlyHint", "read-only"),
        ("destructiveHint", "destructive"),
        ("idempotentHint", "idempotent"),
        ("openWorldHint", "open-world"),
    ]
    .into_iter()
    .filter(|(key, _)| said(key))
    .map(|(_, hint)| hint)
    .collect()
}

/// The first line of a description, at most 100 characters.
pub fn first_line(text: &str) -> String {
    one_line(
        text.lines().find(|l| !l.trim().is_empty()).unwrap_or(""),
        100,
    )
}

/// `text` on one line (whitespace runs as one space), cut to `most` characters with `…`.
fn one_line(text: &str, most: usize) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() <= most {
        joined
    } else {
        let mut cut: String = joined.chars().take(most - 1).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(
        name: &str,
        required: &[&str],
        annotations: Option<Json>,
        description: &str,
    ) -> McpTool {
        McpTool {
            name: name.to_owned(),
            description: description.to_owned(),
            input_schema: json!({ "type": "object", "required": required }),
            output_schema: None,
            annotations,
        }
    }

    #[test]
    fn a_table_shows_required_arguments_hints_and_the_first_line_of_descriptions() {
        let tools = [
            tool(
                "get_issue",
                &["owner", "repo"],
                Some(json!({ "readOnlyHint": true, "openWorldHint": true })),
                "\n  Get an issue.\nIt returns its body.",
            ),
            tool(
                "delete_repo",
                &["name"],
                Some(json!({ "readOnlyHint": false, "destructiveHint": true })),
                &"x".repeat(150),
            ),
        ];
        let mut text = String::new();
        write_tools(&tools, "  ", &mut text);
        let long = format!("{}…", "x".repeat(99));
        assert_eq!(
            text,
            format!(
                "  TOOL         REQUIRED ARGUMENTS  HINTS                  DESCRIPTION\n\
                 \x20 get_issue    owner, repo         read-only, open-world  Get an issue.\n\
                 \x20 delete_repo  name                destructive            {long}\n"
            )
        );
        // Without hints from the server, no hints column.
        let mut text = String::new();
        write_tools(&[tool("echo", &["message"], None, "Echo")], "", &mut text);
        assert_eq!(
            text,
            "TOOL  REQUIRED ARGUMENTS  DESCRIPTION\necho  message             Echo\n"
        );
    }
}
