//! Rendering diagnostics for people (source snippets with carets) and for machines (JSON).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet};
use archon_engine::source::{SourceFile, Sources, Span};
use archon_engine::{Diagnostic, Severity};
use serde_json::{Value, json};

/// Version of the JSON output format (documented in `docs/cli.md`).
pub const JSON_VERSION: u32 = 1;

/// Diagnostics from one or more validated files, deduplicated.
#[derive(Default)]
pub struct Report {
    files: Vec<(PathBuf, usize, usize)>,
    /// Spec files found in directories and skipped: their top level has no `steps` key.
    pub skipped: usize,
    /// Each diagnostic, with the index of its files in `sources`.
    entries: Vec<(Diagnostic, usize)>,
    sources: Vec<Sources>,
    /// The entries by the hash of their identity (file, span, code, message), to find one reported already.
    seen: HashMap<u64, Vec<usize>>,
    hasher: std::hash::RandomState,
}

impl Report {
    /// Adds a file's diagnostics, skipping any already reported (a sub-workflow shared by two specs).
    pub fn add(&mut self, path: &Path, mut diagnostics: Vec<Diagnostic>, sources: &Sources) {
        use std::hash::BuildHasher as _;
        diagnostics.sort_by_key(|d| (d.span.file, d.span.start));
        let here = self.sources.len();
        self.sources.push(sources.clone());
        let mut errors = 0;
        let mut warnings = 0;
        for d in diagnostics {
            match d.severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
            let hash = self.hasher.hash_one(identity(&d, sources));
            // The entries of the same hash are (almost always) the same diagnostic: compared in full.
            let same = self.seen.entry(hash).or_default();
            let reported = same.iter().any(|&i| {
                let (e, at) = &self.entries[i];
                identity(e, &self.sources[*at]) == identity(&d, sources)
            });
            if !reported {
                same.push(self.entries.len());
                self.entries.push((d, here));
            }
        }
        self.files.push((path.to_path_buf(), errors, warnings));
    }

    pub fn errors(&self) -> usize {
        self.entries
            .iter()
            .filter(|(d, _)| d.severity == Severity::Error)
            .count()
    }

    pub fn warnings(&self) -> usize {
        self.entries
            .iter()
            .filter(|(d, _)| d.severity == Severity::Warning)
            .count()
    }
}

/// What makes two diagnostics the same: their file, span, code and message (borrowed, not copied).
fn identity<'a>(
    d: &'a Diagnostic,
    sources: &'a Sources,
) -> (Option<&'a Path>, u32, u32, &'static str, &'a str) {
    let file = sources.get(d.span.file).map(|f| f.path.as_path());
    (file, d.span.start, d.span.end, d.code, d.message.as_str())
}

/// Human-readable output: every diagnostic with its snippet, then a summary line, written as each is
/// laid out (a file may have 100,000 diagnostics).
pub fn write_text(report: &Report, color: bool, out: &mut dyn Write) -> std::io::Result<()> {
    let renderer = if color {
        Renderer::styled()
    } else {
        Renderer::plain()
    };
    for (diagnostic, sources) in &report.entries {
        let sources = &report.sources[*sources];
        out.write_all(renderer.render(&groups(diagnostic, sources)).as_bytes())?;
        out.write_all(b"\n\n")?;
    }
    let files = report.files.len();
    let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let summary = match (report.errors(), report.warnings()) {
        (0, 0) => format!("{} valid", plural(files, "file")),
        (0, w) => format!("{} valid, {}", plural(files, "file"), plural(w, "warning")),
        (e, w) => {
            let invalid = report.files.iter().filter(|(_, e, _)| *e > 0).count();
            let mut s = format!(
                "{} of {} invalid: {}",
                invalid,
                plural(files, "file"),
                plural(e, "error")
            );
            if w > 0 {
                s.push_str(&format!(", {}", plural(w, "warning")));
            }
            s
        }
    };
    if report.skipped > 0 {
        writeln!(
            out,
            "{summary}, {} skipped (no top-level `steps` key)",
            report.skipped
        )
    } else {
        writeln!(out, "{summary}")
    }
}

fn groups<'a>(d: &'a Diagnostic, sources: &'a Sources) -> Vec<Group<'a>> {
    let level = match d.severity {
        Severity::Error => Level::ERROR,
        Severity::Warning => Level::WARNING,
    };
    let mut group = Group::with_title(level.primary_title(d.message.as_str()).id(d.code));
    let primary = sources.get(d.span.file);
    if let Some(file) = primary {
        // The primary span and the labels in the same file, in file order; spans close together share a
        // snippet, and those far apart get one each, so that no snippet holds the lines between them.
        let mut spans: Vec<(Span, Option<&str>)> = std::iter::once((d.span, None))
            .chain(
                d.labels
                    .iter()
                    .filter(|l| l.span.file == d.span.file)
                    .map(|l| (l.span, Some(l.message.as_str()))),
            )
            .collect();
        spans.sort_by_key(|(span, _)| span.start);
        let mut start = 0;
        while start < spans.len() {
            let mut end = start + 1;
            let mut reach = spans[start].0.end;
            while end < spans.len() && spans[end].0.start <= reach.saturating_add(NEARBY) {
                reach = reach.max(spans[end].0.end);
                end += 1;
            }
            let near = &spans[start..end];
            let window = Window::around(file, near.iter().map(|(span, _)| *span));
            let mut snippet = window.snippet(file);
            for (span, label) in near {
                snippet = snippet.annotation(match label {
                    None => AnnotationKind::Primary.span(window.range(file, *span)),
                    Some(label) => AnnotationKind::Context
                        .span(window.range(file, *span))
                        .label(*label),
                });
            }
            group = group.element(snippet);
            start = end;
        }
    }
    for label in d.labels.iter().filter(|l| l.span.file != d.span.file) {
        if let Some(file) = sources.get(label.span.file) {
            let window = Window::around(file, std::iter::once(label.span));
            group = group.element(
                window.snippet(file).annotation(
                    AnnotationKind::Context
                        .span(window.range(file, label.span))
                        .label(label.message.as_str()),
                ),
            );
        }
    }
    for hint in &d.hints {
        group = group.element(Level::HELP.with_name(Some("hint")).message(hint.as_str()));
    }
    vec![group]
}

/// Spans of one diagnostic at most this many bytes apart are shown in one snippet.
const NEARBY: u32 = 16 * 1024;

/// The whole lines of a file that a diagnostic's spans touch: only they are given to the snippet renderer,
/// which lays out every line it is given (8 MB of blank lines once made it use 450 MB to show one).
struct Window {
    start: usize,
    end: usize,
}

impl Window {
    fn around(file: &SourceFile, spans: impl Iterator<Item = Span>) -> Window {
        let text = file.text.as_bytes();
        let (mut first, mut last) = (text.len(), 0);
        for span in spans {
            let range = clamp(file, span);
            first = first.min(range.start);
            last = last.max(range.end);
        }
        if first > last {
            (first, last) = (0, 0);
        }
        let start = text[..first]
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let end = text[last..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |i| last + i);
        Window { start, end }
    }

    fn snippet<'a>(&self, file: &'a SourceFile) -> Snippet<'a, annotate_snippets::Annotation<'a>> {
        Snippet::source(&file.text[self.start..self.end])
            // A file's name may hold escape codes (a hostile repository's): shown printable.
            .path(crate::output::printable(&display_path(&file.path)))
            .line_start(file.line_col(self.start).0)
            .fold(true)
    }

    /// `span` within the window.
    fn range(&self, file: &SourceFile, span: Span) -> std::ops::Range<usize> {
        let range = clamp(file, span);
        let inside = |at: usize| at.clamp(self.start, self.end) - self.start;
        inside(range.start)..inside(range.end)
    }
}

fn clamp(file: &SourceFile, span: Span) -> std::ops::Range<usize> {
    let len = file.text.len();
    let start = (span.start as usize).min(len);
    start..(span.end as usize).clamp(start, len)
}

fn display_path(path: &Path) -> String {
    path.display().to_string()
}

/// Machine-readable output (schema in `docs/cli.md`).
/// The diagnostics as one JSON document, written as each is serialized.
pub fn write_json(report: &Report, out: &mut dyn Write) -> std::io::Result<()> {
    /// The diagnostics, each made into a JSON value only as it is written.
    struct Diagnostics<'a>(&'a Report);
    impl serde::Serialize for Diagnostics<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_seq(
                self.0
                    .entries
                    .iter()
                    .map(|(d, at)| diagnostic(d, &self.0.sources[*at])),
            )
        }
    }
    #[derive(serde::Serialize)]
    struct Document<'a> {
        version: u32,
        files: Vec<Value>,
        diagnostics: Diagnostics<'a>,
        summary: Value,
    }
    let files = report
        .files
        .iter()
        .map(|(path, errors, warnings)| json!({ "path": display_path(path), "valid": *errors == 0, "errors": errors, "warnings": warnings }))
        .collect();
    let document = Document {
        version: JSON_VERSION,
        files,
        diagnostics: Diagnostics(report),
        summary: json!({ "files": report.files.len(), "skipped": report.skipped, "errors": report.errors(), "warnings": report.warnings() }),
    };
    serde_json::to_writer_pretty(&mut *out, &document)?;
    out.write_all(b"\n")
}

fn diagnostic(d: &Diagnostic, sources: &Sources) -> Value {
    let mut value = location(sources, d.span);
    let object = value.as_object_mut().expect("location is an object");
    object.insert("code".into(), json!(d.code));
    object.insert("severity".into(), json!(d.severity.as_str()));
    object.insert("message".into(), json!(d.message));
    object.insert("hints".into(), json!(d.hints));
    let labels: Vec<Value> = d
        .labels
        .iter()
        .map(|l| {
            let mut v = location(sources, l.span);
            v.as_object_mut()
                .expect("location is an object")
                .insert("message".into(), json!(l.message));
            v
        })
        .collect();
    object.insert("labels".into(), json!(labels));
    value
}

/// File, 1-based line and column of the start, and the exclusive end.
fn location(sources: &Sources, span: Span) -> Value {
    match sources.get(span.file) {
        Some(file) => {
            let (line, column) = file.line_col(span.start as usize);
            let (end_line, end_column) = file.line_col(span.end as usize);
            json!({ "file": display_path(&file.path), "line": line, "column": column, "end_line": end_line, "end_column": end_column })
        }
        None => json!({ "file": null, "line": 1, "column": 1, "end_line": 1, "end_column": 1 }),
    }
}

#[cfg(test)]
mod tests {
    use archon_engine::diagnostic::Label;
    use archon_engine::source::{FileId, Format};

    use super::*;

    /// Only the lines a diagnostic's spans touch are laid out, and they show as the whole file would.
    #[test]
    fn a_snippet_shows_the_lines_of_its_spans_as_the_whole_file_would() {
        let text = format!(
            "name: x\n{}steps:\n  - id: a\n    tool: nope\n{}  - id: b\n    tool: echo\n{}",
            "\n".repeat(1000),
            "# between\n".repeat(50),
            "\n".repeat(1000)
        );
        let file = SourceFile::new(FileId(0), "w.yaml".into(), text.clone(), Format::Yaml);
        let at = |needle: &str| {
            let start = text.find(needle).expect(needle);
            Span::new(FileId(0), start, start + needle.len())
        };
        let mut diagnostic = Diagnostic::error("archon::unknown_tool", at("nope"), "unknown tool");
        diagnostic.labels.push(Label {
            span: at("id: b"),
            message: "and here".into(),
        });
        let window = Window::around(&file, [diagnostic.span, at("id: b")].into_iter());
        assert!(
            window.end - window.start < 1000,
            "the window is the lines between the spans"
        );
        let windowed = window
            .snippet(&file)
            .annotation(AnnotationKind::Primary.span(window.range(&file, at("nope"))))
            .annotation(
                AnnotationKind::Context
                    .span(window.range(&file, at("id: b")))
                    .label("and here"),
            );
        let whole = Snippet::source(text.as_str())
            .path("w.yaml")
            .line_start(1)
            .fold(true)
            .annotation(AnnotationKind::Primary.span(clamp(&file, at("nope"))))
            .annotation(
                AnnotationKind::Context
                    .span(clamp(&file, at("id: b")))
                    .label("and here"),
            );
        let render = |snippet| {
            Renderer::plain()
                .render(&[
                    Group::with_title(Level::ERROR.primary_title("unknown tool")).element(snippet),
                ])
        };
        let shown = render(windowed);
        assert_eq!(shown, render(whole));
        assert!(shown.contains("1004 |     tool: nope"), "{shown}");
    }

    /// Spans far apart each get a snippet of their own lines: one window over both would lay out every
    /// line between them (8 MB of blank lines between two duplicate ids took 957 MB).
    #[test]
    fn spans_far_apart_are_shown_in_snippets_of_their_own() {
        let text = format!("steps:\n  - id: a\n{}  - id: a\n", "\n".repeat(100_000));
        let mut sources = Sources::default();
        let file = sources.add("w.yaml".into(), text.clone());
        let first = text.find("id: a").expect("first") + 4;
        let second = text.rfind("id: a").expect("second") + 4;
        let mut diagnostic = Diagnostic::error(
            "archon::duplicate_step",
            Span::new(file.id, second, second + 1),
            "duplicate step id `a`",
        );
        diagnostic.labels.push(Label {
            span: Span::new(file.id, first, first + 1),
            message: "first used here".into(),
        });
        let shown = Renderer::plain().render(&groups(&diagnostic, &sources));
        assert_eq!(
            shown,
            "error[archon::duplicate_step]: duplicate step id `a`\n      --> w.yaml:2:9\n       |\n     2 |   - id: a\n       |         - first used here\n       |\n      ::: w.yaml:100003:9\n       |\n100003 |   - id: a\n       |         ^"
        );
    }
}
