//! `archon validate PATH...`: check spec files and report every diagnostic.

use std::path::{Path, PathBuf};

use archon_engine::validate::{Validation, validate_file};

use super::Status;
use crate::args::{ColorChoice, Format, ValidateArgs};
use crate::output;
use crate::render::{self, Report};

pub fn run(args: &ValidateArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let files = collect(&args.paths)?;
    let mut report = Report::default();
    for file in &files {
        let validation: Validation = validate_file(file);
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

/// Expands directories into the spec files under them (sorted, hidden entries skipped).
fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut files)?;
        } else {
            // A missing file is reported as a diagnostic by the validator.
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
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
            walk(&path, files)?;
        } else if is_spec(&path) {
            files.push(path);
        }
    }
    Ok(())
}

fn is_spec(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "toml")
    )
}
