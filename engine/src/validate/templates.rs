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
        // Archon's own filters (`run::render::Renderer` registers them), known here by name.
        for name in ARCHON_FILTERS {
            env.add_filter(*name, |value: minijinja::Value| value);
        }
        Analyzer { env }
    }
}

/// The filters Archon adds to minijinja's.
pub const ARCHON_FILTERS: &[&str] = &["shell_quote"];

/// Filter names a misspelled one is compared with (whether a name is a filter is asked of minijinja).
const COMMON_FILTERS: &[&str] = &[
    "abs",
    "attr",
    "batch",
    "bool",
    "capitalize",
    "count",
    "default",
    "dictsort",
    "escape",
    "first",
    "float",
    "format",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "shell_quote",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "urlencode",
];

impl Analyzer {
    /// The filters `text` applies (`| name`) that do not exist, each with its byte range in `text` and a
    /// "did you mean". `expression`: the whole text is one expression, not a template. minijinja looks a
    /// filter up only when it renders, so without this a misspelled one failed its step at run time.
    pub fn unknown_filters(
        &self,
        text: &str,
        expression: bool,
    ) -> Vec<(std::ops::Range<usize>, String, Option<String>)> {
        let bytes = text.as_bytes();
        let codes: Vec<std::ops::Range<usize>> = if expression {
            std::iter::once(0..text.len()).collect()
        } else {
            tags(bytes).collect()
        };
        let mut unknown = Vec::new();
        for code in codes {
            for name in filter_names(bytes, code) {
                let written = &text[name.clone()];
                if !self.is_filter(written) {
                    let hint =
                        super::suggest::did_you_mean(written, COMMON_FILTERS.iter().copied());
                    unknown.push((name, written.to_owned(), hint));
                }
            }
        }
        unknown
    }

    fn is_filter(&self, name: &str) -> bool {
        COMMON_FILTERS.contains(&name)
            || !matches!(
                self.env
                    .render_str(&format!("{{{{ none | {name} }}}}"), ())
                    .map_err(|e| e.kind()),
                Err(minijinja::ErrorKind::UnknownFilter)
            )
    }
}

/// The byte ranges of the names after each `|` in `code` (one tag or expression), string literals left out.
fn filter_names(bytes: &[u8], code: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
    let mut names = Vec::new();
    let mut i = code.start;
    while i < code.end {
        match bytes[i] {
            quote @ (b'"' | b'\'') => {
                i = string_end(&bytes[..code.end], i, quote);
                continue;
            }
            b'|' => {
                let mut start = i + 1;
                while start < code.end && bytes[start].is_ascii_whitespace() {
                    start += 1;
                }
                let len = bytes[start..code.end]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .count();
                if len > 0 && !bytes[start].is_ascii_digit() {
                    names.push(start..start + len);
                }
                i = start + len.max(1);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    names
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

/// Most operators one `{{ }}` or `{% %}` tag, or one expression, may chain (`.`, `[`, `(`, `|`, arithmetic,
/// comparisons, `and`, `or`, `not`, `in`, `is`, `if`, `else`). minijinja builds its syntax tree one level
/// deeper for each and walks it recursively: a chain of 100,000 (`x.a.a.a…`, `1+1+…`) overflowed the
/// stack and aborted archon, from a spec and from a plan a model wrote. Real templates chain a few dozen
/// at most.
pub const MAX_OPERATORS: usize = 256;

/// The byte range of the first tag (the whole text, for an `expression`) that chains more than
/// [`MAX_OPERATORS`] operators, counted without parsing: outside string literals and comments, every
/// operator character and operator word counts, so the count is an upper bound on the depth.
pub fn too_many_operators(text: &str, expression: bool) -> Option<std::ops::Range<usize>> {
    if expression {
        return (operators(text.as_bytes()) > MAX_OPERATORS).then_some(0..text.len());
    }
    let bytes = text.as_bytes();
    tags(bytes).find(|range| operators(&bytes[range.clone()]) > MAX_OPERATORS)
}

/// Most `{{ }}` and `{% %}` tags in one template. minijinja holds a syntax tree of the whole template,
/// a few hundred bytes a tag: one string of 550,000 `{{ x }}` (8 MB) took 240 MB to validate, and a loop
/// around as many 365 MB. Real templates have a few dozen.
pub const MAX_TAGS: usize = 10_000;

/// The byte range of the first tag past [`MAX_TAGS`], found without parsing.
pub fn too_many_tags(text: &str) -> Option<std::ops::Range<usize>> {
    tags(text.as_bytes()).nth(MAX_TAGS)
}

/// The contents of a template's tags whose value is not quoted for a shell: every `{% %}` tag, and every
/// `{{ }}` tag whose last filter is not `shell_quote`.
pub fn unquoted_tags(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    tags(bytes)
        .filter(|range| {
            let quoted = range.start >= 2
                && &bytes[range.start - 2..range.start] == b"{{"
                && text[range.clone()]
                    .trim_matches(|c: char| c.is_whitespace() || c == '-' || c == '+')
                    .rsplit_once('|')
                    .is_some_and(|(_, last)| last.trim() == "shell_quote");
            !quoted
        })
        .map(|range| &text[range])
        .collect()
}

/// Whether `name` appears in `text` as a whole word (not inside a longer identifier).
pub fn mentions(text: &str, name: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    text.match_indices(name).any(|(at, _)| {
        !word(text[..at].chars().next_back()) && !word(text[at + name.len()..].chars().next())
    })
}

/// The byte ranges of the contents of a template's `{{ }}` and `{% %}` tags, in order; comments are
/// skipped. Bytes, not characters: every delimiter is ASCII, and nothing is sliced inside a character.
fn tags(bytes: &[u8]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        while let Some(open) = find(bytes, i, b"{") {
            let close: &[u8] = match bytes.get(open + 1) {
                Some(b'{') => b"}}",
                Some(b'%') => b"%}",
                Some(b'#') => {
                    i = find(bytes, open + 2, b"#}").map_or(bytes.len(), |c| c + 2);
                    continue;
                }
                _ => {
                    i = open + 1;
                    continue;
                }
            };
            let (start, end) = (open + 2, tag_end(bytes, open + 2, close));
            i = end + 2;
            // What a raw block holds is text, not tags: the tags are those that open and close it.
            if close == b"%}" && statement(&bytes[start..end]) == b"raw" {
                i = (open_tags(bytes, i))
                    .find(|&at| {
                        let end = tag_end(bytes, at + 2, b"%}");
                        statement(&bytes[at + 2..end]) == b"endraw"
                    })
                    .unwrap_or(bytes.len());
            }
            return Some(start..end);
        }
        None
    })
}

/// Where each `{%` at or after `from` is.
fn open_tags(bytes: &[u8], from: usize) -> impl Iterator<Item = usize> + '_ {
    let mut i = from;
    std::iter::from_fn(move || {
        let at = find(bytes, i, b"{%")?;
        i = at + 2;
        Some(at)
    })
}

/// A statement tag's contents without the white space and the `-` / `+` markers around them.
fn statement(inside: &[u8]) -> &[u8] {
    let trim = |c: &u8| c.is_ascii_whitespace() || *c == b'-' || *c == b'+';
    let start = inside.iter().position(|c| !trim(c)).unwrap_or(inside.len());
    let end = inside
        .iter()
        .rposition(|c| !trim(c))
        .map_or(start, |p| p + 1);
    &inside[start..end]
}

/// Where `needle` is found at or after `from`.
fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

/// Where a tag opened at `from` closes (`close`, outside string literals), or the end of the text.
fn tag_end(bytes: &[u8], from: usize, close: &[u8]) -> usize {
    let mut i = from;
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'"' | b'\'') => i = string_end(bytes, i, quote),
            _ if bytes[i..].starts_with(close) => return i,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The index after the string literal opened by `quote` at `at` (at most the end of the text).
fn string_end(bytes: &[u8], at: usize, quote: u8) -> usize {
    let mut i = at + 1;
    while i < bytes.len() && bytes[i] != quote {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    (i + 1).min(bytes.len())
}

/// How many operators `code` (one tag's or expression's text) holds, string literals left out.
fn operators(code: &[u8]) -> usize {
    const WORDS: &[&[u8]] = &[b"and", b"or", b"not", b"in", b"is", b"if", b"else"];
    let (mut count, mut i) = (0, 0);
    while i < code.len() {
        match code[i] {
            quote @ (b'"' | b'\'') => {
                i = string_end(code, i, quote);
                continue;
            }
            b'.' | b'[' | b'(' | b'|' | b'+' | b'-' | b'*' | b'/' | b'%' | b'~' | b'<' | b'>'
            | b'=' | b'!' => count += 1,
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let word = code[i..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .count();
                if WORDS.contains(&&code[i..i + word]) {
                    count += 1;
                }
                i += word;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    count
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
        if let Some(range) = too_many_operators(text, false) {
            return Err(chains_too_far(
                codes::TEMPLATE_SYNTAX,
                "template",
                file,
                span,
                text,
                range,
            ));
        }
        if let Some(range) = too_many_tags(text) {
            return Err(Diagnostic::error(
                codes::TEMPLATE_SYNTAX,
                locate(file, span, text, range.start..range.start),
                format!("template has more than {MAX_TAGS} tags (`{{{{ }}}}` and `{{% %}}`)"),
            )
            .with_hint("split it across steps or `outputs`, or build the text with a tool"));
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
                text.replace("${{", "{{")
                    .replace("{{", "")
                    .replace("}}", "")
                    .trim()
            )));
        }
        if let Some(range) = too_many_operators(text, true) {
            return Err(chains_too_far(
                codes::EXPRESSION_SYNTAX,
                "expression",
                file,
                span,
                text,
                range,
            ));
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

/// A tag or expression past [`MAX_OPERATORS`], refused before minijinja reads it.
fn chains_too_far(
    code: &'static str,
    what: &str,
    file: &SourceFile,
    span: Span,
    text: &str,
    range: std::ops::Range<usize>,
) -> Diagnostic {
    let start = range.start;
    Diagnostic::error(
        code,
        locate(file, span, text, start..start),
        format!("{what} chains more than {MAX_OPERATORS} operators in one tag"),
    )
    .with_hint("split it across steps or `outputs`, or compute the value with a tool such as `json` or `calculator`")
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
    } else if detail.contains("comment") && text.contains("{#") {
        "`{#` starts a template comment: to write it as text (such as `${#VAR}` in a shell command), wrap the text in `{% raw %}...{% endraw %}`"
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

    #[test]
    fn operators_are_counted_per_tag_outside_strings_and_comments() {
        let chain = |n: usize| format!("x{}", ".a".repeat(n));
        assert_eq!(
            too_many_operators(&format!("{{{{ {} }}}}", chain(256)), false),
            None
        );
        let text = format!("ab {{{{ {} }}}} cd", chain(257));
        assert_eq!(too_many_operators(&text, false), Some(5..5 + 258 * 2 + 1));
        assert_eq!(too_many_operators(&chain(257), true), Some(0..257 * 2 + 1));
        // Strings, comments and text outside tags are not chains; each tag counts on its own.
        let quiet = format!(
            "{}{{{{ '{}' ~ \"{}\" }}}}{{# {} #}}{{{{ {} }}}}{{% if {} %}}",
            ".".repeat(1000),
            "+".repeat(1000),
            "|\\\"|".repeat(500),
            ".".repeat(1000),
            chain(200),
            chain(200)
        );
        assert_eq!(too_many_operators(&quiet, false), None);
        assert!(too_many_operators(&format!("{{% if {} %}}", chain(300)), false).is_some());
        // Characters of several bytes, escaped or not, open or unclosed, are read as bytes.
        for text in ["{{ '\\é' ~ \"é\" }} é {# é", "é{{ 'é", "{{ \"\\", "{é{%é"] {
            assert_eq!(too_many_operators(text, false), None, "{text}");
        }
        assert!(too_many_operators(&format!("true{}", " and true".repeat(300)), true).is_some());
    }

    /// What a raw block holds is text: its `{{ }}` are neither tags nor chains; the block's own tags are
    /// (`{%- raw %}` and `{% endraw -%}` too), and counting goes on after it.
    #[test]
    fn a_raw_block_holds_no_tags() {
        let many = "{{ x }}".repeat(MAX_TAGS + 1);
        let chained = format!("{{{{ x{} }}}}", ".a".repeat(300));
        for (open, close) in [
            ("{% raw %}", "{% endraw %}"),
            ("{%- raw -%}", "{%+ endraw -%}"),
        ] {
            let text = format!("{open}{many}{chained}{close}");
            assert_eq!(too_many_tags(&text), None, "{open}");
            assert_eq!(too_many_operators(&text, false), None, "{open}");
            assert_eq!(tags(text.as_bytes()).count(), 2, "{open}");
            let after = format!("{text}{{{{ y }}}}");
            assert_eq!(tags(after.as_bytes()).count(), 3, "{open}");
        }
        // A raw block left open holds the rest of the text.
        assert_eq!(tags(format!("{{% raw %}}{many}").as_bytes()).count(), 1);
        // Tags around a raw block are counted as before.
        let text = format!("{many}{{% raw %}}{{% endraw %}}");
        assert_eq!(
            too_many_tags(&text).map(|r| r.start),
            Some(MAX_TAGS * 7 + 2)
        );
    }
}
