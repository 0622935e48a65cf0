//! The file tools: `read_file`, `write_file`, `list_files`, confined to the workspace (no absolute paths,
//! no `..`, no symlink that leads outside).

use std::path::{Component, Path, PathBuf};

use globset::GlobBuilder;
use serde_json::{Value as Json, json};

use super::{ToolError, ToolOutput};

/// Largest file `read_file` returns.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;
/// Most paths `list_files` returns.
pub const MAX_LISTED: usize = 10_000;

/// Resolves `relative` inside `workdir`, refusing anything that would leave it, through `..`, an absolute
/// path or a symbolic link.
pub fn confine(workdir: &Path, relative: &str) -> Result<PathBuf, ToolError> {
    let escape = || ToolError::new(format!("path `{relative}` is outside the workspace"));
    let path = Path::new(relative);
    if path.is_absolute()
        || path.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::Prefix(_) | Component::RootDir
            )
        })
    {
        return Err(escape());
    }
    let root = std::fs::canonicalize(workdir)
        .map_err(|e| ToolError::new(format!("workspace `{}`: {e}", workdir.display())))?;
    let joined = root.join(path);
    // The deepest part that exists must resolve inside the workspace (a symlink may point anywhere). A
    // symbolic link counts as existing even when its target does not: writing through a dangling link
    // would create its target, wherever that is, so it must resolve too.
    let mut existing = joined.as_path();
    while std::fs::symlink_metadata(existing).is_err() {
        existing = match existing.parent() {
            Some(parent) => parent,
            None => break,
        };
    }
    let real = std::fs::canonicalize(existing).map_err(|_| escape())?;
    if !real.starts_with(&root) {
        return Err(escape());
    }
    // `.env` files hold secrets (archon reads them for `secrets:`): no tool reads or writes one, under
    // its name or through a link to it.
    let is_env = |p: &Path| p.file_name().is_some_and(|n| n == ".env");
    if is_env(&joined) || is_env(&real) {
        return Err(ToolError::new(format!(
            "`{relative}` is a `.env` file, which holds secrets: file tools do not touch it"
        )));
    }
    Ok(joined)
}

pub fn read_file(workdir: &Path, args: &Json) -> Result<ToolOutput, ToolError> {
    let relative = args["path"].as_str().unwrap_or_default();
    let path = confine(workdir, relative)?;
    let metadata = std::fs::metadata(&path).map_err(|e| io_error("read", relative, &e))?;
    if metadata.len() > MAX_READ_BYTES {
        return Err(ToolError::new(format!(
            "`{relative}` is {} bytes, more than the {MAX_READ_BYTES} bytes `read_file` returns",
            metadata.len()
        )));
    }
    let bytes = std::fs::read(&path).map_err(|e| io_error("read", relative, &e))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| ToolError::new(format!("`{relative}` is not UTF-8 text")))?;
    Ok(ToolOutput {
        output: Json::String(text.clone()),
        text,
        exit_code: None,
    })
}

pub fn write_file(workdir: &Path, args: &Json) -> Result<ToolOutput, ToolError> {
    let relative = args["path"].as_str().unwrap_or_default();
    let content = args["content"].as_str().unwrap_or_default();
    let path = confine(workdir, relative)?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| io_error("create the folder of", relative, &e))?;
    }
    let result = if args["append"].as_bool().unwrap_or(false) {
        use std::io::Write as _;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(content.as_bytes()))
    } else {
        std::fs::write(&path, content)
    };
    result.map_err(|e| io_error("write", relative, &e))?;
    let output = json!({ "path": relative, "bytes": content.len() });
    Ok(ToolOutput {
        text: output.to_string(),
        output,
        exit_code: None,
    })
}

/// Files under `path` (default the workspace) whose path relative to it matches `pattern` (default all;
/// `*` stays within a folder, `**` crosses folders), as workspace-relative paths, sorted. Hidden entries
/// are skipped.
pub fn list_files(workdir: &Path, args: &Json) -> Result<ToolOutput, ToolError> {
    let relative = args["path"].as_str().unwrap_or(".");
    let base = if relative == "." || relative.is_empty() {
        confine(workdir, "")?
    } else {
        confine(workdir, relative)?
    };
    let pattern = args["pattern"].as_str().unwrap_or("**");
    let matcher = GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| {
            ToolError::new(format!(
                "invalid pattern `{pattern}`: {}",
                e.kind().to_string().to_lowercase()
            ))
        })?
        .compile_matcher();
    let root =
        std::fs::canonicalize(workdir).map_err(|e| ToolError::new(format!("workspace: {e}")))?;
    let mut found = Vec::new();
    let mut pending = vec![base.clone()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| io_error("list", relative, &e))?;
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            // Symbolic links are not followed: they could lead outside the workspace.
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                let under_base = path.strip_prefix(&base).unwrap_or(&path);
                if matcher.is_match(under_base) {
                    let shown = path
                        .strip_prefix(&root)
                        .unwrap_or(&path)
                        .to_string_lossy()
                        .into_owned();
                    found.push(shown);
                    if found.len() > MAX_LISTED {
                        return Err(ToolError::new(format!(
                            "more than {MAX_LISTED} files match `{pattern}`; narrow the pattern"
                        )));
                    }
                }
            }
        }
    }
    found.sort();
    let output = Json::Array(found.into_iter().map(Json::String).collect());
    Ok(ToolOutput {
        text: output.to_string(),
        output,
        exit_code: None,
    })
}

fn io_error(what: &str, path: &str, err: &std::io::Error) -> ToolError {
    let reason = match err.kind() {
        std::io::ErrorKind::NotFound => "no such file or folder".to_owned(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => err.to_string().to_lowercase(),
    };
    ToolError::new(format!("cannot {what} `{path}`: {reason}"))
}
