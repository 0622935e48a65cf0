//! Tool lists kept in the state directory for `archon validate`, which checks MCP calls without starting
//! any server: `<state>/mcp/<key>.json`, where `key` is [`ServerDef::key`](super::ServerDef::key), a
//! digest of the server's definition as written. `archon mcp list` (and `archon tools --refresh`) writes
//! them; a file that is missing, too large or not what this module wrote is no list.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use serde_json::{Value as Json, json};

use super::{DefValue, McpTool, TransportDef};
use crate::spec::Pattern;

/// The largest cached list read back.
pub const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// One server's tools as last listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CachedTools {
    /// The name the server was declared under when listed.
    pub server: String,
    /// When, in milliseconds since the Unix epoch.
    pub listed_at: u64,
    pub tools: Vec<McpTool>,
}

/// The key of a server's list: the SHA-256 (hex) of a canonical JSON of its definition as written —
/// its transport, templates unrendered and literals as the `mcpServers` file has them, and its `tools`
/// globs. No value is rendered, so no secret goes into it; a changed definition is another server.
pub fn key(transport: &TransportDef, tools: Option<&[Pattern]>) -> String {
    use sha2::{Digest, Sha256};
    fn value(v: &DefValue) -> Json {
        match v {
            DefValue::Template(t) => json!({ "template": t }),
            DefValue::Literal(l) => json!({ "literal": l }),
        }
    }
    fn pairs(list: &[(String, DefValue)]) -> Json {
        Json::Array(list.iter().map(|(k, v)| json!([k, value(v)])).collect())
    }
    let transport = match transport {
        TransportDef::Stdio { argv, env, cwd } => json!({ "stdio": {
            "argv": argv.iter().map(value).collect::<Vec<_>>(),
            "env": pairs(env),
            "cwd": cwd.as_ref().map(value),
        }}),
        TransportDef::Http { url, headers } => json!({ "http": {
            "url": value(url),
            "headers": pairs(headers),
        }}),
    };
    let tools = tools.map(|t| t.iter().map(Pattern::as_str).collect::<Vec<_>>());
    // serde_json's maps are sorted by key: the same definition always gives the same text.
    let canonical = json!({ "transport": transport, "tools": tools }).to_string();
    Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Where the list of the server with `key` is kept; `None` for a key that is not a digest.
pub fn path(state_dir: &Path, key: &str) -> Option<PathBuf> {
    let digest = !key.is_empty() && key.len() <= 128 && key.chars().all(|c| c.is_ascii_hexdigit());
    digest.then(|| state_dir.join("mcp").join(format!("{key}.json")))
}

/// The list kept for `key`, if there is a readable one.
pub fn read(state_dir: &Path, key: &str) -> Option<CachedTools> {
    let path = path(state_dir, key)?;
    let bytes = crate::source::read_bounded(&path, MAX_FILE_BYTES).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Keeps `tools` as the list of the server with `key`, replacing any earlier one at once (written to a
/// temporary file in the same directory, then renamed).
pub fn write(
    state_dir: &Path,
    key: &str,
    server: &str,
    tools: &[McpTool],
) -> std::io::Result<PathBuf> {
    let path = path(state_dir, key).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("`{key}` is not a server key"),
        )
    })?;
    let dir = state_dir.join("mcp");
    std::fs::create_dir_all(&dir)?;
    let cached = CachedTools {
        server: server.to_owned(),
        listed_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        tools: tools.to_vec(),
    };
    let mut text = serde_json::to_vec_pretty(&cached)?;
    text.push(b'\n');
    if text.len() as u64 > MAX_FILE_BYTES {
        // A list that could not be read back is not kept, nor is an earlier one left to stand for it.
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(e);
        }
        return Err(std::io::Error::new(
            std::io::ErrorKind::FileTooLarge,
            format!(
                "the list takes {} bytes, more than the {MAX_FILE_BYTES} kept (its `tools` globs can keep fewer tools)",
                text.len()
            ),
        ));
    }
    let mut file = tempfile::NamedTempFile::new_in(&dir)?;
    file.write_all(&text)?;
    file.as_file().sync_all()?;
    file.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

/// When a list was kept, as a person reads it: "on 2026-11-26 at 18:30 UTC".
pub fn listed_when(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let text = humantime::format_rfc3339_seconds(at).to_string();
    match text.split_once('T') {
        Some((day, time)) => format!("on {day} at {} UTC", time.get(..5).unwrap_or(time)),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> McpTool {
        McpTool {
            name: name.to_owned(),
            description: "d".to_owned(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            annotations: Some(serde_json::json!({"readOnlyHint": true})),
        }
    }

    #[test]
    fn a_listing_time_reads_as_a_day_and_a_minute() {
        assert_eq!(listed_when(1_764_180_000_000), "on 2025-11-26 at 18:00 UTC");
    }

    #[test]
    fn the_key_follows_the_definition_as_written() {
        let stdio = |arg: &str| TransportDef::Stdio {
            argv: vec![
                DefValue::Literal("srv".into()),
                DefValue::Template(arg.into()),
            ],
            env: vec![("T".into(), DefValue::Template("{{ secrets.t }}".into()))],
            cwd: None,
        };
        let a = key(&stdio("x"), None);
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, key(&stdio("x"), None));
        assert_ne!(a, key(&stdio("y"), None));
        assert_ne!(a, key(&stdio("x"), Some(&[Pattern::new("get_*")])));
        let literal = TransportDef::Stdio {
            argv: vec![
                DefValue::Literal("srv".into()),
                DefValue::Literal("x".into()),
            ],
            env: vec![("T".into(), DefValue::Template("{{ secrets.t }}".into()))],
            cwd: None,
        };
        assert_ne!(a, key(&literal, None));
    }

    #[test]
    fn a_written_list_reads_back_and_replaces_the_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        assert_eq!(read(dir.path(), "ab12"), None);
        write(dir.path(), "ab12", "fs", &[tool("a")]).expect("written");
        let path = write(dir.path(), "ab12", "fs", &[tool("b"), tool("c")]).expect("written");
        assert_eq!(path, dir.path().join("mcp/ab12.json"));
        let cached = read(dir.path(), "ab12").expect("kept");
        assert_eq!(cached.server, "fs");
        assert_eq!(cached.tools, vec![tool("b"), tool("c")]);
        assert!(cached.listed_at > 0);
        // Nothing but the list is left in the directory.
        assert_eq!(
            std::fs::read_dir(dir.path().join("mcp"))
                .expect("dir")
                .count(),
            1
        );
    }

    #[test]
    fn a_list_too_large_to_read_back_is_not_kept_and_replaces_the_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        write(dir.path(), "ab12", "fs", &[tool("a")]).expect("written");
        let mut big = tool("big");
        big.description = "d".repeat(MAX_FILE_BYTES as usize);
        let error = write(dir.path(), "ab12", "fs", &[big]).expect_err("too large");
        assert_eq!(
            error.to_string(),
            "the list takes 16777461 bytes, more than the 16777216 kept (its `tools` globs can keep fewer tools)"
        );
        assert_eq!(read(dir.path(), "ab12"), None);
        assert_eq!(
            std::fs::read_dir(dir.path().join("mcp"))
                .expect("dir")
                .count(),
            0
        );
    }

    #[test]
    fn a_corrupt_file_or_a_key_that_is_not_a_digest_is_no_list() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("mcp")).expect("dir");
        std::fs::write(dir.path().join("mcp/cd34.json"), "{\"server\": ").expect("written");
        assert_eq!(read(dir.path(), "cd34"), None);
        assert_eq!(path(dir.path(), "../x"), None);
        assert!(write(dir.path(), "../x", "fs", &[]).is_err());
    }
}
