//! `mcpServers` JSON files as users already have them: `.mcp.json` (Claude Code), Claude Desktop's
//! `claude_desktop_config.json`, Cursor's `.cursor/mcp.json`, and VS Code's `.vscode/mcp.json` (whose
//! top-level key is `servers`). A spec names one with `mcp: { from: FILE, server: ENTRY }`.
//!
//! An entry is `command` + `args` (+ `env`, `cwd`) for a child process, or `url` (+ `headers`) for
//! streamable HTTP; `type` says which when given (`stdio`, `http`, `streamable-http`; `sse`, the
//! deprecated transport, is refused). Values are literals in which `${VAR}` and `${VAR:-default}` name
//! variables of archon's environment, as other MCP clients read them: [`expand`] substitutes them when
//! a run starts the server, never at validation.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Map, Value as Json};

use super::{DefValue, TransportDef};

/// The largest `mcpServers` file read.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Why an entry could not be imported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportError {
    /// The file does not exist.
    NotFound,
    /// The file exists but cannot be read (too large, not a regular file, permissions).
    Unreadable(String),
    /// The file, or its entry, is not what an `mcpServers` file holds.
    Invalid {
        message: String,
        hint: Option<String>,
    },
    /// The file has no entry of that name: the names it has.
    NoEntry { names: Vec<String> },
}

impl ImportError {
    fn invalid(message: impl Into<String>) -> Self {
        ImportError::Invalid {
            message: message.into(),
            hint: None,
        }
    }

    fn invalid_with(message: impl Into<String>, hint: impl Into<String>) -> Self {
        ImportError::Invalid {
            message: message.into(),
            hint: Some(hint.into()),
        }
    }
}

/// Reads `path` and returns its entry `entry` as a transport whose values are [`DefValue::Literal`].
pub fn import(path: &Path, entry: &str) -> Result<TransportDef, ImportError> {
    let bytes = match crate::source::read_bounded(path, MAX_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(crate::source::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ImportError::NotFound);
        }
        Err(e) => return Err(ImportError::Unreadable(e.reason())),
    };
    let text = String::from_utf8(bytes)
        .map_err(|_| ImportError::Unreadable("it is not valid UTF-8".to_owned()))?;
    parse(&text, entry)
}

/// The entry `entry` of an `mcpServers` document.
pub fn parse(text: &str, entry: &str) -> Result<TransportDef, ImportError> {
    let document: Json = serde_json::from_str(text).map_err(|e| {
        ImportError::invalid(format!(
            "invalid JSON at line {}, column {}: {}",
            e.line(),
            e.column(),
            json_error(&e)
        ))
    })?;
    let Some(document) = document.as_object() else {
        return Err(ImportError::invalid(
            "the file is not a JSON object with `mcpServers`",
        ));
    };
    let (key, servers) = match (document.get("mcpServers"), document.get("servers")) {
        (Some(servers), _) => ("mcpServers", servers),
        (None, Some(servers)) => ("servers", servers),
        (None, None) => {
            return Err(ImportError::invalid_with(
                "the file has no `mcpServers`",
                "an MCP client's configuration holds its servers under `mcpServers` (VS Code: `servers`)",
            ));
        }
    };
    let Some(servers) = servers.as_object() else {
        return Err(ImportError::invalid(format!(
            "`{key}` is {}, not an object of servers by name",
            type_name(servers)
        )));
    };
    let Some(server) = servers.get(entry) else {
        return Err(ImportError::NoEntry {
            names: servers.keys().cloned().collect(),
        });
    };
    let Some(server) = server.as_object() else {
        return Err(ImportError::invalid(format!(
            "`{key}.{entry}` is {}, not an object",
            type_name(server)
        )));
    };
    entry_transport(server, &format!("{key}.{entry}"))
}

fn entry_transport(server: &Map<String, Json>, at: &str) -> Result<TransportDef, ImportError> {
    let string = |field: &str| -> Result<Option<String>, ImportError> {
        match server.get(field) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => literal(s, &format!("{at}.{field}")).map(Some),
            Some(other) => Err(ImportError::invalid(format!(
                "`{at}.{field}` is {}, not a string",
                type_name(other)
            ))),
        }
    };
    let map = |field: &str| -> Result<Vec<(String, DefValue)>, ImportError> {
        match server.get(field) {
            None | Some(Json::Null) => Ok(Vec::new()),
            Some(Json::Object(entries)) => entries
                .iter()
                .map(|(name, value)| match value {
                    Json::String(s) => Ok((
                        name.clone(),
                        DefValue::Literal(literal(s, &format!("{at}.{field}.{name}"))?),
                    )),
                    other => Err(ImportError::invalid(format!(
                        "`{at}.{field}.{name}` is {}, not a string",
                        type_name(other)
                    ))),
                })
                .collect(),
            Some(other) => Err(ImportError::invalid(format!(
                "`{at}.{field}` is {}, not an object of strings",
                type_name(other)
            ))),
        }
    };
    let kind = string("type")?;
    let command = string("command")?;
    let url = string("url")?;
    if server.contains_key("envFile") {
        return Err(ImportError::invalid_with(
            format!("`{at}.envFile` is not supported"),
            "write the variables under `env`, or set them in archon's environment and name them as `${VAR}`",
        ));
    }
    let stdio = match kind.as_deref() {
        Some("stdio") => true,
        Some("http" | "streamable-http" | "streamableHttp") => false,
        Some("sse") => {
            return Err(ImportError::invalid_with(
                format!(
                    "`{at}` uses the `sse` transport, which MCP deprecated and archon does not support"
                ),
                "if the server also speaks streamable HTTP (most do, often at `/mcp` instead of `/sse`), set `\"type\": \"http\"` and its URL",
            ));
        }
        Some(other) => {
            return Err(ImportError::invalid_with(
                format!("`{at}.type` is `{other}`, which archon does not support"),
                "`type` is `stdio` (with `command`) or `http` (with `url`)",
            ));
        }
        None => match (&command, &url) {
            (Some(_), Some(_)) => {
                return Err(ImportError::invalid_with(
                    format!("`{at}` has both `command` and `url`"),
                    "give `command` for a local server or `url` for one reached over HTTP",
                ));
            }
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => {
                return Err(ImportError::invalid_with(
                    format!("`{at}` has neither `command` nor `url`"),
                    "give `command` for a local server or `url` for one reached over HTTP",
                ));
            }
        },
    };
    if stdio {
        let Some(command) = command else {
            return Err(ImportError::invalid(format!(
                "`{at}` is a `stdio` server without `command`"
            )));
        };
        if command.is_empty() {
            return Err(ImportError::invalid(format!("`{at}.command` is empty")));
        }
        for field in ["url", "headers"] {
            if server.contains_key(field) {
                return Err(ImportError::invalid(format!(
                    "`{at}` starts a local server: `{field}` does not apply to it"
                )));
            }
        }
        let mut argv = vec![DefValue::Literal(command)];
        match server.get("args") {
            None | Some(Json::Null) => {}
            Some(Json::Array(args)) => {
                for (i, arg) in args.iter().enumerate() {
                    match arg {
                        Json::String(s) => {
                            argv.push(DefValue::Literal(literal(s, &format!("{at}.args[{i}]"))?))
                        }
                        other => {
                            return Err(ImportError::invalid(format!(
                                "`{at}.args[{i}]` is {}, not a string",
                                type_name(other)
                            )));
                        }
                    }
                }
            }
            Some(other) => {
                return Err(ImportError::invalid(format!(
                    "`{at}.args` is {}, not a list of strings",
                    type_name(other)
                )));
            }
        }
        Ok(TransportDef::Stdio {
            argv,
            env: map("env")?,
            cwd: string("cwd")?.map(DefValue::Literal),
        })
    } else {
        let Some(url) = url else {
            return Err(ImportError::invalid(format!(
                "`{at}` is an `http` server without `url`"
            )));
        };
        for field in ["command", "args", "env", "cwd"] {
            if server.contains_key(field) {
                return Err(ImportError::invalid(format!(
                    "`{at}` is reached over HTTP: `{field}` does not apply to it"
                )));
            }
        }
        Ok(TransportDef::Http {
            url: DefValue::Literal(url),
            headers: map("headers")?,
        })
    }
}

/// A value as written, once its `${...}` references are known to be well formed.
fn literal(text: &str, at: &str) -> Result<String, ImportError> {
    references(text).map_err(|e| {
        ImportError::invalid_with(
            format!("`{at}`: {e}"),
            "write `${VAR}` or `${VAR:-default}` to read a variable of archon's environment",
        )
    })?;
    Ok(text.to_owned())
}

/// One piece of a literal: text as it is, or a variable with its default.
enum Piece<'t> {
    Text(&'t str),
    Var(&'t str, Option<&'t str>),
}

fn pieces(text: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push(Piece::Text(&rest[..start]));
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("`${` is not closed by `}`".to_owned());
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        // VS Code writes `${env:VAR}`.
        let name = name.strip_prefix("env:").unwrap_or(name);
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "`${{{inner}}}` does not name an environment variable"
            ));
        }
        if default.is_some_and(|d| d.contains("${")) {
            // `${A:-${B}}` would be cut at the first `}` and pass `${B}` on as text.
            return Err(format!(
                "`${{{inner}}}`: a default cannot name another variable"
            ));
        }
        out.push(Piece::Var(name, default));
        rest = &after[end + 1..];
    }
    out.push(Piece::Text(rest));
    Ok(out)
}

/// The variables a literal reads, each with whether it has a default.
pub fn references(text: &str) -> Result<Vec<(String, bool)>, String> {
    Ok(pieces(text)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Var(name, default) => Some((name.to_owned(), default.is_some())),
            Piece::Text(_) => None,
        })
        .collect())
}

/// A literal with its `${VAR}` and `${VAR:-default}` replaced from `env`: a variable that is unset (or
/// empty, for one with a default) takes its default; one without a default must be set.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    for piece in pieces(text)? {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Var(name, default) => match (env.get(name), default) {
                (Some(value), Some(default)) if value.is_empty() => out.push_str(default),
                (Some(value), _) => out.push_str(value),
                (None, Some(default)) => out.push_str(default),
                (None, None) => {
                    return Err(format!("environment variable `{name}` is not set"));
                }
            },
        }
    }
    Ok(out)
}

fn type_name(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// serde_json's message without its own " at line L column C".
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn lit(s: &str) -> DefValue {
        DefValue::Literal(s.to_owned())
    }

    #[test]
    fn expands_variables_and_defaults() {
        let vars = env(&[("TOKEN", "abc"), ("EMPTY", "")]);
        assert_eq!(
            expand("Bearer ${TOKEN}", &vars).as_deref(),
            Ok("Bearer abc")
        );
        assert_eq!(expand("${MISSING:-x}/y", &vars).as_deref(), Ok("x/y"));
        assert_eq!(expand("${EMPTY:-d}", &vars).as_deref(), Ok("d"));
        assert_eq!(expand("${EMPTY}", &vars).as_deref(), Ok(""));
        assert_eq!(expand("${env:TOKEN}", &vars).as_deref(), Ok("abc"));
        assert_eq!(expand("$HOME and $", &vars).as_deref(), Ok("$HOME and $"));
        assert_eq!(
            expand("${MISSING}", &vars),
            Err("environment variable `MISSING` is not set".to_owned())
        );
        assert_eq!(
            expand("${A", &vars),
            Err("`${` is not closed by `}`".to_owned())
        );
        assert_eq!(
            expand("${MISSING:-${TOKEN}}", &vars),
            Err("`${MISSING:-${TOKEN}`: a default cannot name another variable".to_owned())
        );
        assert_eq!(
            expand("${input:token}", &vars),
            Err("`${input:token}` does not name an environment variable".to_owned())
        );
    }

    #[test]
    fn reads_a_claude_desktop_stdio_entry() {
        let text = r#"{"mcpServers": {"github": {"command": "npx", "args": ["-y", "server-github"],
            "env": {"GITHUB_TOKEN": "${GITHUB_TOKEN}"}, "cwd": "/srv"}, "other": {"url": "http://x"}}}"#;
        assert_eq!(
            parse(text, "github"),
            Ok(TransportDef::Stdio {
                argv: vec![lit("npx"), lit("-y"), lit("server-github")],
                env: vec![("GITHUB_TOKEN".to_owned(), lit("${GITHUB_TOKEN}"))],
                cwd: Some(lit("/srv")),
            })
        );
    }

    #[test]
    fn reads_http_entries_with_or_without_type_and_vs_code_servers() {
        let text = r#"{"mcpServers": {"a": {"type": "http", "url": "https://h/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN}"}}, "b": {"url": "https://b/mcp"},
            "c": {"type": "streamable-http", "url": "https://c/mcp"}}}"#;
        assert_eq!(
            parse(text, "a"),
            Ok(TransportDef::Http {
                url: lit("https://h/mcp"),
                headers: vec![("Authorization".to_owned(), lit("Bearer ${TOKEN}"))],
            })
        );
        assert!(matches!(parse(text, "b"), Ok(TransportDef::Http { .. })));
        assert!(matches!(parse(text, "c"), Ok(TransportDef::Http { .. })));
        let vscode =
            r#"{"servers": {"fs": {"type": "stdio", "command": "fs-server"}}, "inputs": []}"#;
        assert_eq!(
            parse(vscode, "fs"),
            Ok(TransportDef::Stdio {
                argv: vec![lit("fs-server")],
                env: Vec::new(),
                cwd: None
            })
        );
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let message = |text: &str, entry: &str| match parse(text, entry) {
            Err(ImportError::Invalid { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(
                r#"{"mcpServers": {"a": {"type": "sse", "url": "http://h/sse"}}}"#,
                "a"
            ),
            "`mcpServers.a` uses the `sse` transport, which MCP deprecated and archon does not support"
        );
        assert_eq!(
            message(r#"{"mcpServers": {"a": {"type": "stdio"}}}"#, "a"),
            "`mcpServers.a` is a `stdio` server without `command`"
        );
        assert_eq!(
            message(r#"{"mcpServers": {"a": {"type": "http"}}}"#, "a"),
            "`mcpServers.a` is an `http` server without `url`"
        );
        assert_eq!(
            message(r#"{"mcpServers": {"a": {"args": ["x"]}}}"#, "a"),
            "`mcpServers.a` has neither `command` nor `url`"
        );
        assert_eq!(
            message(
                r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#,
                "a"
            ),
            "`mcpServers.a.args[0]` is a number, not a string"
        );
        assert_eq!(
            message(
                r#"{"mcpServers": {"a": {"url": "http://h", "env": {}}}}"#,
                "a"
            ),
            "`mcpServers.a` is reached over HTTP: `env` does not apply to it"
        );
        assert_eq!(
            message("{\n  \"mcpServers\": {,}\n}", "a"),
            "invalid JSON at line 2, column 18: key must be a string"
        );
        assert_eq!(
            message(r#"{"other": {}}"#, "a"),
            "the file has no `mcpServers`"
        );
        assert_eq!(
            parse(
                r#"{"mcpServers": {"b": {"command": "x"}, "c": {"command": "y"}}}"#,
                "a"
            ),
            Err(ImportError::NoEntry {
                names: vec!["b".to_owned(), "c".to_owned()]
            })
        );
    }
}
