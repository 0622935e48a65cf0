//! `archon validate PATH...`: check spec files and report every diagnostic.

use std::path::{Path, PathBuf};

use archon_engine::spec::Limits;
use archon_engine::validate::{Validation, Validator};

use super::Status;
use crate::args::{ColorChoice, Format, ValidateArgs};
use crate::output;
use crate::render::{self, Report};

pub fn run(args: &ValidateArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let Found { files, skipped } = collect(&args.paths)?;
    if files.is_empty() {
        // Zero files are not "valid": the directories held no workflow (only directories can be empty).
        let dirs: Vec<String> = args
            .paths
            .iter()
            .map(|p| format!("`{}`", p.display()))
            .collect();
        output::stderr(&output::printable(&format!(
            "error: no workflow files found in {}\n  hint: a `.yaml`, `.yml` or `.toml` file whose top level has no \
             `steps` key is skipped ({skipped} here); name a file to check it anyway\n",
            dirs.join(", ")
        )));
        return Ok(Status::Invalid);
    }
    let mut report = Report::default();
    report.skipped = skipped;
    for file in &files {
        let validation: Validation = Validator::new(Limits::default())
            .mcp_cache(args.state.dir())
            .validate_path(file);
        report.add(file, validation.diagnostics, &validation.sources);
    }
    output::stdout_with(|out| match args.format {
        Format::Json => render::write_json(&report, out),
        Format::Text => render::write_text(&report, output::use_color(color), out),
    });
    Ok(if report.errors() > 0 {
        Status::Invalid
    } else {
        Status::Success
    })
}

/// The files to check, and how many spec files the directories held that are not workflows.
#[derive(Default)]
pub(super) struct Found {
    pub(super) files: Vec<PathBuf>,
    pub(super) skipped: usize,
}

/// Expands directories into the spec files under them (sorted, hidden entries skipped).
pub(super) fn collect(paths: &[PathBuf]) -> anyhow::Result<Found> {
    let mut found = Found::default();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut found)?;
        } else {
            // A missing file is reported as a diagnostic by the validator.
            found.files.push(path.clone());
        }
    }
    Ok(found)
}

fn walk(dir: &Path, found: &mut Found) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("cannot read directory `{}`: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, found)?;
        } else if is_spec(&path) {
            if looks_like_a_workflow(&path) {
                found.files.push(path);
            } else {
                found.skipped += 1;
            }
        }
    }
    Ok(())
}

/// The top-level keys of a workflow spec.
const WORKFLOW_KEYS: &[&str] = &[
    "$schema",
    "name",
    "description",
    "inputs",
    "env",
    "secrets",
    "llm",
    "tools",
    "agents",
    "memory",
    "steps",
    "rules",
    "outputs",
    "defaults",
    "timeout",
    "network",
];

/// Whether a file found in a directory is a workflow spec, checked rather than skipped: its top level has a
/// `steps` key or one misspelled (`stpes`, `[[step]]`), or a `name` and only keys a workflow has (a spec
/// without steps is an error anyway). `Cargo.toml`, a CI file or a compose file has none of these and is
/// skipped. A file named on the command line is always checked.
fn looks_like_a_workflow(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        // Unreadable: the validator says why.
        return true;
    };
    if text.trim_start().starts_with('{') {
        return true;
    }
    let keys: Vec<&str> = text.lines().filter_map(top_level_key).collect();
    let steps_like = |key: &&str| one_edit_from(&key.to_lowercase(), "steps");
    keys.iter().any(steps_like)
        || (keys.contains(&"name")
            && keys.len() > 1
            && keys.iter().all(|k| WORKFLOW_KEYS.contains(k)))
}

/// Whether `a` is `b` or one typo away from it: a letter inserted, deleted or changed, or two adjacent letters
/// swapped (`stpes`, `step`). A looser match would take a CI file's `stages`, or `setup`, for `steps`.
fn one_edit_from(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let same = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[same..], &b[same..]);
    let swapped =
        matches!((a, b), ([x, y, ra @ ..], [p, q, rb @ ..]) if x == q && y == p && ra == rb);
    (a.is_empty() && b.is_empty())
        || swapped
        || (!a.is_empty() && a.get(1..) == b.get(1..))
        || a.get(1..) == Some(b)
        || Some(a) == b.get(1..)
}

/// The key a line starts at the top level, in YAML (`key:`) or TOML (`key =`, `[key]`, `[[key.sub]]`).
fn top_level_key(line: &str) -> Option<&str> {
    if line.starts_with([' ', '\t', '#', '-']) {
        return None;
    }
    let key = if let Some(table) = line.strip_prefix('[') {
        let table = table.trim_start_matches('[');
        table.split([']', '.']).next()?
    } else {
        let end = line.find([':', '='])?;
        &line[..end]
    };
    let key = key.trim().trim_matches(['"', '\'']);
    (!key.is_empty()).then_some(key)
}

fn is_spec(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "toml")
    )
}
