//! Reading spec text into a [`Node`] tree, YAML or TOML, within documented resource limits.

use crate::diagnostic::{Diagnostic, codes};
use crate::source::{Format, SourceFile, Span};
use crate::spec::node::Node;

/// Resource limits applied while parsing. The defaults are documented in `docs/spec.md` ("Limits").
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest spec file accepted, in bytes.
    pub max_file_bytes: usize,
    /// Deepest nesting of mappings and sequences.
    pub max_depth: usize,
    /// Most YAML events an alias (`*name`) may replay in one file: bounds "billion laughs" expansion.
    pub max_alias_replay_events: usize,
    /// Most steps in one workflow (composite tool steps included).
    pub max_steps: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 8 * 1024 * 1024,
            max_depth: 64,
            max_alias_replay_events: 20_000,
            max_steps: 50_000,
        }
    }
}

/// Parses a file into a document tree. Returns the tree when the text could be read at all, and every
/// problem found on the way (duplicate keys do not stop parsing; syntax errors and limits do).
pub fn parse(file: &SourceFile, limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
    let whole = Span::new(file.id, 0, 0);
    if file.text.len() > limits.max_file_bytes {
        let d = Diagnostic::error(
            codes::FILE_TOO_LARGE,
            whole,
            format!(
                "spec file is {} bytes, more than the limit of {} bytes",
                file.text.len(),
                limits.max_file_bytes
            ),
        )
        .with_hint("split the workflow into sub-workflows (`workflow:` steps)");
        return (None, vec![d]);
    }
    if let Some(offset) = too_deep(&file.text, limits.max_depth) {
        let d = Diagnostic::error(
            codes::NESTING_TOO_DEEP,
            Span::new(file.id, offset, offset + 1),
            format!(
                "values are nested more than {} levels deep",
                limits.max_depth
            ),
        )
        .with_hint("flatten the data, or move it into a file a tool reads");
        return (None, vec![d]);
    }
    match file.format {
        Format::Yaml => super::yaml::parse(file, limits),
        Format::Toml => super::toml::parse(file),
    }
}

/// A cheap pre-scan for bracket nesting beyond `max_depth` in flow (`[`, `{`) syntax, so that no parser
/// ever recurses that deep. Brackets inside quoted strings and comments are skipped. Returns the offset
/// of the first bracket past the limit.
fn too_deep(text: &str, max_depth: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return Some(i);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            quote @ (b'"' | b'\'') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote && bytes[i] != b'\n' {
                    if bytes[i] == b'\\' && quote == b'"' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}
