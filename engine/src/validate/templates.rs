//! Template and expression analysis: syntax errors and the variables a template reads, each located
//! precisely inside the YAML or TOML string it was written in.

use minijinja::Environment;

use crate::diagnostic::{Diagnostic, codes};
use crate::source::{SourceFile, Span};

/// A variable path a template reads, such as `steps.fetch.output`, and where it is written.
#[derive(Clone, Debug)]
pub struct Reference {
    pub segments: Vec<String>,
    pub span: Span,
    /// Spans of each prefix of `segments` (`steps`, `steps.fetch`, ...), same length as `segments`.
    pub prefix_spans: Vec<Span>,
}

impl Reference {
    pub fn root(&self) -> &str {
        &self.segments[0]
    }

    /// The span of the first `n` segments.
    pub fn span_of(&self, n: usize) -> Span {
        self.prefix_spans
            .get(n.saturating_sub(1))
            .copied()
            .unwrap_or(self.span)
    }
}

/// Global functions minijinja provides; reading them is not a reference to workflow data.
const GLOBALS: &[&str] = &[
    "range",
    "dict",
    "namespace",
    "debug",
    "lipsum",
    "cycler",
    "joiner",
    "loop",
    "self",
    "super",
    "varargs",
    "kwargs",
    "caller",
];

/// Parses templates and expressions with one minijinja environment.
pub struct Analyzer {
    env: Environment<'static>,
}

impl Default for Analyzer {
    fn default() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        Analyzer { env }
    }
}

impl std::fmt::Debug for Analyzer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Analyzer")
    }
}

/// Whether a string holds template syntax at all; plain strings need no parsing.
pub fn is_template(text: &str) -> bool {
    text.contains("{{") || text.contains("{%") || text.contains("{#")
}

/// Names that mean something else than a variable at the start of an expression: literals and the
/// words of operators.
const NOT_VARIABLES: &[&str] = &[
    "true", "True", "false", "False", "none", "None", "not", "and", "or", "in", "is", "if", "else",
];

/// The most common expression, `steps.fetch.output`: ASCII names joined by dots and nothing else (spaces
/// around it aside). Its meaning needs no parser: it reads that variable path, as minijinja would
/// (`undeclared_variables` names it whole, and evaluating it looks each name up in turn), so validation
/// and rendering take it as it is instead of compiling it.
pub fn simple_path(expression: &str) -> Option<&str> {
    // minijinja skips ASCII white space only: any other is a syntax error it must report.
    let path = expression.trim_matches(|c: char| c.is_ascii_whitespace());
    let mut names = path.split('.');
    let first = names.next()?;
    let name = |n: &str| {
        n.bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    (name(first) && !NOT_VARIABLES.contains(&first) && names.all(name)).then_some(path)
}

/// The expression of a template that is exactly `{{ expression }}` (no whitespace control).
pub fn sole_path(template: &str) -> Option<&str> {
    let inner = template
        .trim_matches(|c: char| c.is_ascii_whitespace())
        .strip_prefix("{{")?
        .strip_suffix("}}")?;
    simple_path(inner)
}

impl Analyzer {
    /// Analyzes a template string written at `span` in `file`.
    pub fn template(
        &self,
        file: &SourceFile,
        span: Span,
        text: &str,
    ) -> Result<Vec<Reference>, Diagnostic> {
        if !is_template(text) {
            return Ok(Vec::new());
        }
        if let Some(path) = sole_path(text) {
            return Ok(self.references(file, span, text, [path.to_owned()].into()));
        }
        match self.env.template_from_str(text) {
            Ok(template) => {
                Ok(self.references(file, span, text, template.undeclared_variables(true)))
            }
            Err(err) => Err(syntax_error(
                codes::TEMPLATE_SYNTAX,
                "template",
                file,
                span,
                text,
                &err,
            )),
        }
    }

    /// Analyzes a bare expression (`if`, `foreach`, rule conditions).
    pub fn expression(
        &self,
        file: &SourceFile,
        span: Span,
        text: &str,
    ) -> Result<Vec<Reference>, Diagnostic> {
        if text.contains("{{") || text.contains("{%") {
            let at = locate(
                file,
                span,
                text,
                text.find('{').unwrap_or(0)..text.find('{').unwrap_or(0) + 2,
            );
            return Err(Diagnostic::error(
                codes::EXPRESSION_SYNTAX,
                at,
                "expressions are written without `{{ }}`",
            )
            .with_hint(format!(
                "write `{}`",
                text.replace("{{", "").replace("}}", "").trim()
            )));
        }
        if let Some(path) = simple_path(text) {
            return Ok(self.references(file, span, text, [path.to_owned()].into()));
        }
        match self.env.compile_expression(text) {
            Ok(expr) => Ok(self.references(file, span, text, expr.undeclared_variables(true))),
            Err(err) => Err(syntax_error(
                codes::EXPRESSION_SYNTAX,
                "expression",
                file,
                span,
                text,
                &err,
            )),
        }
    }

    fn references(
        &self,
        file: &SourceFile,
        span: Span,
        text: &str,
        names: std::collections::HashSet<String>,
    ) -> Vec<Reference> {
        let mut names: Vec<String> = names.into_iter().collect();
        names.sort();
        names
            .into_iter()
            .filter(|n| !GLOBALS.contains(&n.split('.').next().unwrap_or("")))
            .map(|name| {
                let segments: Vec<String> = name.split('.').map(str::to_owned).collect();
                let prefix_spans = (1..=segments.len())
                    .map(|n| {
                        let prefix = segments[..n].join(".");
                        match find_word(text, &prefix) {
                            Some(at) => locate(file, span, text, at..at + prefix.len()),
                            None => span,
                        }
                    })
                    .collect::<Vec<_>>();
                let whole = *prefix_spans.last().unwrap_or(&span);
                Reference {
                    segments,
                    span: whole,
                    prefix_spans,
                }
            })
            .collect()
    }
}

fn syntax_error(
    code: &'static str,
    what: &str,
    file: &SourceFile,
    span: Span,
    text: &str,
    err: &minijinja::Error,
) -> Diagnostic {
    let detail = err.detail().unwrap_or("invalid syntax");
    let at = match err.range() {
        Some(range) if range.end <= text.len() => locate(file, span, text, range),
        _ => span,
    };
    let hint = if code == codes::EXPRESSION_SYNTAX {
        "expressions are bare minijinja (Jinja2) expressions without `{{ }}`, such as `steps.a.status == 'succeeded'`; see docs/spec.md#templates"
    } else {
        "templates use minijinja (Jinja2) syntax: `{{ expression }}`, `{% if ... %}`; see docs/spec.md#templates"
    };
    Diagnostic::error(code, at, format!("{what} syntax error: {detail}")).with_hint(hint)
}

/// The first occurrence of `needle` in `text` that is not part of a longer identifier.
fn find_word(text: &str, needle: &str) -> Option<usize> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(pos) = text[from..].find(needle) {
        let at = from + pos;
        let before = text[..at].chars().next_back();
        let after = text[at + needle.len()..].chars().next();
        let boundary_before = !before.is_some_and(|c| is_ident(c) || c == '.');
        let boundary_after = !after.is_some_and(is_ident);
        if boundary_before && boundary_after {
            return Some(at);
        }
        from = at + needle.len().max(1);
    }
    None
}

/// Maps a byte range of a string's value to the source span that wrote it. Handles plain, quoted and
/// block scalars; falls back to searching for the text, then to the whole value.
pub fn locate(file: &SourceFile, span: Span, value: &str, range: std::ops::Range<usize>) -> Span {
    let range = char_range(value, range);
    let raw = file.slice(span);
    if raw == value {
        return span.within(range);
    }
    for quote in ["\"\"\"", "'''", "\"", "'"] {
        if raw.len() >= 2 * quote.len()
            && raw.starts_with(quote)
            && raw.ends_with(quote)
            && &raw[quote.len()..raw.len() - quote.len()] == value
        {
            return span.within(range.start + quote.len()..range.end + quote.len());
        }
    }
    if let Some(at) = locate_by_lines(raw, value, range.start) {
        let len = value[range.clone()].find('\n').unwrap_or(range.len());
        return span.within(at..at + len);
    }
    let needle = &value[range];
    match (raw.find(needle), raw.rfind(needle)) {
        (Some(a), Some(b)) if a == b && !needle.is_empty() => span.within(a..a + needle.len()),
        _ => span,
    }
}

/// The range clamped to the value and widened to whole characters (parsers report byte offsets that can
/// fall inside a multi-byte character).
fn char_range(value: &str, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    let mut start = range.start.min(value.len());
    while !value.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = range.end.clamp(start, value.len());
    while !value.is_char_boundary(end) {
        end += 1;
    }
    start..end
}

/// For multi-line scalars: finds each line of the value in the raw text, in order, and maps `offset`.
fn locate_by_lines(raw: &str, value: &str, offset: usize) -> Option<usize> {
    let mut cursor = 0;
    let mut line_start = 0;
    for line in value.split('\n') {
        let line_end = line_start + line.len();
        let found = if line.is_empty() {
            cursor
        } else {
            cursor + raw.get(cursor..)?.find(line)?
        };
        if offset >= line_start && offset <= line_end {
            return Some(found + (offset - line_start));
        }
        cursor = found + line.len();
        line_start = line_end + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What minijinja itself says a template or expression reads.
    fn parsed(text: &str, expression: bool) -> Option<Vec<String>> {
        let env = Analyzer::default().env;
        let mut names: Vec<String> = if expression {
            env.compile_expression(text)
                .ok()?
                .undeclared_variables(true)
        } else {
            env.template_from_str(text).ok()?.undeclared_variables(true)
        }
        .into_iter()
        .collect();
        names.sort();
        Some(names)
    }

    #[test]
    fn a_simple_path_reads_what_minijinja_says_it_reads() {
        let expressions = [
            "steps.fetch.output",
            " steps.s0.output.v ",
            "inputs.who",
            "x",
            "_a1._b2",
            "steps.a.output.if",
            "loop.index",
            "range",
        ];
        for text in expressions {
            let path = simple_path(text).expect(text);
            assert_eq!(parsed(text, true), Some(vec![path.to_owned()]), "{text}");
            let template = format!("{{{{{text}}}}}");
            assert_eq!(sole_path(&template), Some(path), "{template}");
            assert_eq!(
                parsed(&template, false),
                Some(vec![path.to_owned()]),
                "{template}"
            );
        }
        // Not simple paths: minijinja decides what they read, or that they are wrong.
        for text in [
            "true",
            "None",
            "not",
            "not x",
            "none.x",
            "a.",
            ".a",
            "a..b",
            "a.0",
            "a[0]",
            "a | upper",
            "a.b()",
            "é.a",
            "a b",
            "1a",
            "",
            "a\u{a0}",
            "\u{3000}a.b",
            "a\u{2028}",
            "a\u{b}",
        ] {
            assert_eq!(simple_path(text), None, "{text}");
        }
        for template in [
            "{{- a -}}",
            "{{ a }} {{ b }}",
            "x {{ a }}",
            "{% if a %}{{ a }}{% endif %}",
        ] {
            assert_eq!(sole_path(template), None, "{template}");
        }
        // White space minijinja does not skip is a syntax error for it, and no path here.
        for text in [
            "a\u{a0}",
            "\u{a0}a",
            "a\u{b}",
            "a\u{2003}",
            "a\u{3000}",
            "a\u{85}",
            "a\u{2028}",
        ] {
            assert_eq!(parsed(text, true), None, "{text:?}");
            assert_eq!(simple_path(text), None, "{text:?}");
            let template = format!("{{{{{text}}}}}");
            assert_eq!(parsed(&template, false), None, "{template:?}");
            assert_eq!(sole_path(&template), None, "{template:?}");
        }
    }
}
