//! Reading spec text into a [`Node`] tree, YAML or TOML, within documented resource limits.

use crate::diagnostic::{Diagnostic, codes};
use crate::source::{Format, SourceFile, Span};
use crate::spec::node::Node;

/// The default of [`Limits::max_values`].
pub const MAX_VALUES: usize = 500_000;

/// Resource limits applied while parsing. The defaults are documented in `docs/spec.md` ("Limits").
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest spec file accepted, in bytes.
    pub max_file_bytes: usize,
    /// Largest TOML spec file accepted, in bytes: the TOML parser holds every token of a file, and then
    /// the whole document, at up to about 150 bytes of memory per byte of text.
    pub max_toml_bytes: usize,
    /// Deepest nesting of mappings and sequences.
    pub max_depth: usize,
    /// Most YAML events an alias (`*name`) may replay in one file: bounds "billion laughs" expansion.
    pub max_alias_replay_events: usize,
    /// Most steps in one workflow (composite tool steps included).
    pub max_steps: usize,
    /// Most values (scalars, lists and mappings) in one file: bounds the memory a file can make the
    /// parser use, whatever its shape, before the whole tree is built.
    pub max_values: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 8 * 1024 * 1024,
            max_toml_bytes: 512 * 1024,
            max_depth: 64,
            max_alias_replay_events: 20_000,
            max_steps: 20_000,
            max_values: MAX_VALUES,
        }
    }
}

/// Parses a file into a document tree. Returns the tree when the text could be read at all, and every
/// problem found on the way (duplicate keys do not stop parsing; syntax errors and limits do).
pub fn parse(file: &SourceFile, limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
    let whole = Span::new(file.id, 0, 0);
    let (most, what, hint) = match file.format {
        Format::Toml if limits.max_toml_bytes < limits.max_file_bytes => (
            limits.max_toml_bytes,
            ("TOML spec file", " for TOML"),
            "write a workflow this large in YAML (up to 8 MiB), or split it into sub-workflows (`workflow:` steps)",
        ),
        _ => (
            limits.max_file_bytes,
            ("spec file", ""),
            "split the workflow into sub-workflows (`workflow:` steps)",
        ),
    };
    if file.text.len() > most {
        let d = Diagnostic::error(
            codes::FILE_TOO_LARGE,
            whole,
            format!(
                "{} is {} bytes, more than the limit of {most} bytes{}",
                what.0,
                file.text.len(),
                what.1
            ),
        )
        .with_hint(hint);
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
        Format::Toml => {
            // The TOML parser builds the whole document before anything can be counted, at several
            // hundred bytes a value: count first, from the text.
            if let Some(refusal) = toml_too_large(file, limits) {
                return (None, vec![refusal]);
            }
            super::toml::parse(file)
        }
    }
}

/// What a cheap pass over TOML text finds: at least how many values it holds, and its `[[...steps]]`
/// table headers (a step each), with the offset of the first header past `max_steps`.
fn toml_too_large(file: &SourceFile, limits: &Limits) -> Option<Diagnostic> {
    let bytes = file.text.as_bytes();
    let (mut values, mut steps, mut i) = (0usize, 0usize, 0usize);
    let mut line_start = true;
    while i < bytes.len() {
        let b = bytes[i];
        if line_start && b == b'[' && bytes.get(i + 1) == Some(&b'[') {
            // An array-of-tables header: a step when its key path ends with `steps`.
            let end = file.text[i..].find(']').map_or(bytes.len(), |e| i + e);
            let key = file.text[i + 2..end].trim().trim_matches(['"', '\'']);
            if key == "steps" || key.ends_with(".steps") || key.ends_with(".\"steps") {
                steps += 1;
                if steps > limits.max_steps {
                    return Some(
                        Diagnostic::error(
                            codes::TOO_MANY_STEPS,
                            Span::new(file.id, i, end.min(bytes.len())),
                            format!(
                                "workflow has more than {} steps, the limit",
                                limits.max_steps
                            ),
                        )
                        .with_hint("split the workflow into sub-workflows (`workflow:` steps)"),
                    );
                }
            }
        }
        match b {
            b'=' | b',' | b'[' | b'{' => {
                values += 1;
                if values > limits.max_values {
                    return Some(too_many_values(Span::new(file.id, i, i + 1), limits));
                }
            }
            b'#' => i = skip_to(bytes, i, |c| c == b'\n').saturating_sub(1),
            quote @ (b'"' | b'\'') => {
                let triple = bytes.get(i + 1) == Some(&quote) && bytes.get(i + 2) == Some(&quote);
                i = if triple {
                    let closing = [quote; 3];
                    file.text[i + 3..]
                        .find(std::str::from_utf8(&closing).unwrap_or("\"\"\""))
                        .map_or(bytes.len(), |e| i + 3 + e + 2)
                } else {
                    let mut j = i + 1;
                    while j < bytes.len() && bytes[j] != quote && bytes[j] != b'\n' {
                        if bytes[j] == b'\\' && quote == b'"' {
                            j += 1;
                        }
                        j += 1;
                    }
                    j
                };
            }
            _ => {}
        }
        line_start = b == b'\n' || (line_start && (b == b' ' || b == b'\t'));
        i += 1;
    }
    None
}

/// The offset of the first byte at or after `from` for which `stop` holds (or the end).
fn skip_to(bytes: &[u8], from: usize, stop: impl Fn(u8) -> bool) -> usize {
    bytes[from..]
        .iter()
        .position(|&c| stop(c))
        .map_or(bytes.len(), |p| from + p)
}

/// A file with more values than [`Limits::max_values`].
pub(super) fn too_many_values(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::error(
        codes::FILE_TOO_LARGE,
        span,
        format!(
            "spec file holds more than {} values, the limit",
            limits.max_values
        ),
    )
    .with_hint("split the workflow into sub-workflows (`workflow:` steps), or move data into a file a tool reads")
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
