//! The file tools: `read_file`, `write_file`, `list_files`, confined to the workspace. Paths are resolved
//! beneath the workspace by the kernel as they are opened (cap-std: `openat2` with `RESOLVE_BENEATH` where
//! Linux has it), so no `..`, absolute path or symbolic link leads outside, even one swapped in while a
//! call runs. `.env` files and the directories archon keeps its own state in (the run store) are refused.

use std::io::{Read as _, Write as _};
use std::path::{Component, Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};

use globset::GlobBuilder;
use serde_json::{Value as Json, json};

use super::{ToolError, ToolOutput};

/// Largest file `read_file` returns.
pub const MAX_READ_BYTES: u64 = 16 * 1024 * 1024;
/// Most paths `list_files` returns.
pub const MAX_LISTED: usize = 10_000;

/// Resolves `relative` inside `workdir` as a path, refusing anything that would leave it, through `..`,
/// an absolute path or a symbolic link (for a command's working directory: the command itself may go
/// anywhere, so a check is enough there; file tools open beneath the workspace instead).
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

/// The workspace, opened, and where file tools may not go inside it.
pub struct Workspace<'a> {
    dir: Dir,
    root: PathBuf,
    /// Directories no file tool touches (the state directory), as given.
    protected: &'a [PathBuf],
}

impl<'a> Workspace<'a> {
    pub fn open(workdir: &Path, protected: &'a [PathBuf]) -> Result<Self, ToolError> {
        let failed = |e: std::io::Error| {
            ToolError::new(format!(
                "workspace `{}`: {}",
                workdir.display(),
                e.to_string().to_lowercase()
            ))
        };
        let root = std::fs::canonicalize(workdir).map_err(failed)?;
        let dir = Dir::open_ambient_dir(&root, ambient_authority()).map_err(failed)?;
        Ok(Workspace {
            dir,
            root,
            protected,
        })
    }

    /// `relative` as the file tools take it: refused when absolute or when it names (itself, or through
    /// a link) a `.env` file or something inside a protected directory. Whether it stays inside the
    /// workspace is for the kernel to say when it is opened.
    fn path<'p>(&self, relative: &'p str) -> Result<&'p Path, ToolError> {
        let path = Path::new(relative);
        if path.is_absolute() || path.components().any(|c| matches!(c, Component::Prefix(_))) {
            return Err(outside(relative));
        }
        // Where it leads now, inside the workspace (for a file not written yet, its folder).
        let resolved = self
            .dir
            .canonicalize(path)
            .or_else(|_| {
                let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
                let folder = match parent {
                    Some(parent) => self.dir.canonicalize(parent)?,
                    None => PathBuf::new(),
                };
                Ok::<_, std::io::Error>(folder.join(path.file_name().unwrap_or_default()))
            })
            .ok();
        let is_env = |p: &Path| p.file_name().is_some_and(|n| n == ".env");
        if is_env(path) || resolved.as_deref().is_some_and(is_env) {
            return Err(ToolError::new(format!(
                "`{relative}` is a `.env` file, which holds secrets: file tools do not touch it"
            )));
        }
        for protected in self.protected {
            let Ok(protected) = std::fs::canonicalize(protected) else {
                continue;
            };
            let Ok(inside) = protected.strip_prefix(&self.root) else {
                continue;
            };
            let within = |p: &Path| p.starts_with(inside);
            if within(&lexical(path)) || resolved.as_deref().is_some_and(within) {
                return Err(ToolError::new(format!(
                    "`{relative}` is in archon's state directory `{}`, which file tools do not touch",
                    inside.display()
                )));
            }
        }
        Ok(path)
    }
}

/// `path` with `.` and `name/..` pairs taken out, as written (no links followed).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn outside(relative: &str) -> ToolError {
    ToolError::permanent(format!("path `{relative}` is outside the workspace"))
}

impl Workspace<'_> {
    /// Why opening `relative` beneath the workspace failed: when the path leads outside it (which the
    /// kernel refused), that is what the message says.
    fn refused(&self, what: &str, relative: &str, err: &std::io::Error) -> ToolError {
        match confine(&self.root, relative) {
            Err(outside) => outside,
            Ok(_) => io_error(what, relative, err),
        }
    }
}

pub fn read_file(
    workdir: &Path,
    protected: &[PathBuf],
    args: &Json,
) -> Result<ToolOutput, ToolError> {
    let relative = args["path"].as_str().unwrap_or_default();
    let workspace = Workspace::open(workdir, protected)?;
    let path = workspace.path(relative)?;
    let file = workspace
        .dir
        .open(path)
        .map_err(|e| workspace.refused("read", relative, &e))?;
    let metadata = file
        .metadata()
        .map_err(|e| io_error("read", relative, &e))?;
    if !metadata.is_file() {
        return Err(ToolError::new(format!("`{relative}` is not a file")));
    }
    if metadata.len() > MAX_READ_BYTES {
        return Err(ToolError::new(format!(
            "`{relative}` is {} bytes, more than the {MAX_READ_BYTES} bytes `read_file` returns",
            metadata.len()
        )));
    }
    let mut bytes = Vec::new();
    file.into_std()
        .take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error("read", relative, &e))?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(ToolError::new(format!(
            "`{relative}` is more than the {MAX_READ_BYTES} bytes `read_file` returns"
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| ToolError::new(format!("`{relative}` is not UTF-8 text")))?;
    Ok(ToolOutput {
        output: Json::String(text.clone()),
        text,
        exit_code: None,
    })
}

pub fn write_file(
    workdir: &Path,
    protected: &[PathBuf],
    args: &Json,
) -> Result<ToolOutput, ToolError> {
    let relative = args["path"].as_str().unwrap_or_default();
    let content = args["content"].as_str().unwrap_or_default();
    let workspace = Workspace::open(workdir, protected)?;
    let path = workspace.path(relative)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        workspace
            .dir
            .create_dir_all(parent)
            .map_err(|e| workspace.refused("create the folder of", relative, &e))?;
    }
    let mut options = OpenOptions::new();
    options.write(true).create(true);
    if args["append"].as_bool().unwrap_or(false) {
        options.append(true);
    } else {
        options.truncate(true);
    }
    workspace
        .dir
        .open_with(path, &options)
        .map_err(|e| workspace.refused("write", relative, &e))?
        .into_std()
        .write_all(content.as_bytes())
        .map_err(|e| io_error("write", relative, &e))?;
    let output = json!({ "path": relative, "bytes": content.len() });
    Ok(ToolOutput {
        text: output.to_string(),
        output,
        exit_code: None,
    })
}

/// Files under `path` (default the workspace) whose path relative to it matches `pattern` (default all;
/// `*` stays within a folder, `**` crosses folders), as workspace-relative paths, sorted. Hidden entries
/// and symbolic links are skipped.
pub fn list_files(
    workdir: &Path,
    protected: &[PathBuf],
    args: &Json,
) -> Result<ToolOutput, ToolError> {
    let relative = args["path"].as_str().unwrap_or(".");
    let relative = if relative.is_empty() { "." } else { relative };
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
    let workspace = Workspace::open(workdir, protected)?;
    let base_path = workspace.path(relative)?;
    let base = workspace
        .dir
        .open_dir(base_path)
        .map_err(|e| workspace.refused("list", relative, &e))?;
    // Shown relative to the workspace: the base as it resolves inside it.
    let shown_base: PathBuf = workspace
        .dir
        .canonicalize(base_path)
        .map_err(|e| workspace.refused("list", relative, &e))?
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    let mut found = Vec::new();
    let mut pending = vec![(base, PathBuf::new())];
    while let Some((dir, under)) = pending.pop() {
        let entries = dir.entries().map_err(|e| io_error("list", relative, &e))?;
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = under.join(&name);
            // Symbolic links are not followed: they could lead outside the workspace.
            if kind.is_dir() {
                if let Ok(sub) = entry.open_dir() {
                    pending.push((sub, path));
                }
            } else if kind.is_file() && matcher.is_match(&path) {
                found.push(shown_base.join(&path).to_string_lossy().into_owned());
                if found.len() > MAX_LISTED {
                    return Err(ToolError::new(format!(
                        "more than {MAX_LISTED} files match `{pattern}`; narrow the pattern"
                    )));
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
