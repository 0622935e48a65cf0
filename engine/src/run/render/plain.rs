//! Which templates are plain: those that can build no value much larger than the data they read, so that
//! they render in archon's own process. Every other template renders in the helper process, under its
//! memory and CPU limits (`super::helper`).
//!
//! A template is plain when it has no statement (`{% … %}`: no loop, no `set`, no macro) and its
//! expressions use no operator that concatenates or repeats (`~`, `+`, `*`), call no function but
//! `range` (bounded by minijinja) and no method, and use only filters whose result is no larger than
//! their input, or that check the size of what they build (`tojson`, `shell_quote`). The scan is conservative: text it
//! cannot read as plain (a quote it cannot close, an operator inside a string literal it misreads) goes
//! to the helper, which is always safe, only slower.

/// Filters whose result is at most about as large as their input (or, for `tojson` and `shell_quote`,
/// checked against the output limit before it is built). Not here, so run in the helper: `replace`, `join`, `indent`,
/// `format`, `string`, `list`, `split`, `lines`, `map`, `escape`, `urlencode`, `pprint`, `batch`,
/// `slice`, `chain`, `zip`, `groupby`, and any filter added later.
const FILTERS: &[&str] = &[
    "abs",
    "attr",
    "bool",
    "capitalize",
    "count",
    "d",
    "default",
    "dictsort",
    "first",
    "float",
    "int",
    "items",
    "last",
    "length",
    "lower",
    "max",
    "min",
    "reject",
    "rejectattr",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "shell_quote",
    "sort",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
];

/// Functions a plain template may call: `range` refuses more than 100,000 items and builds none.
const FUNCTIONS: &[&str] = &["range"];

/// Whether `template` is plain (see the module's documentation). `expression` says that the whole text
/// is one expression (a condition, a `foreach`), not a template with `{{ … }}` in it.
pub fn is_plain(text: &str, expression: bool) -> bool {
    // A chain minijinja could not compile without overflowing a stack, or a syntax tree of too many
    // tags, is compiled in the helper, where overflowing one ends only the helper.
    if crate::validate::templates::too_many_operators(text, expression).is_some()
        || (!expression && crate::validate::templates::too_many_tags(text).is_some())
    {
        return false;
    }
    if expression {
        return expression_is_plain(text).is_some_and(|rest| rest.trim().is_empty());
    }
    if text.contains("{%") {
        return false;
    }
    let mut rest = text;
    while let Some(at) = rest.find("{{") {
        match expression_is_plain(&rest[at + 2..]) {
            Some(after) => match after.strip_prefix("}}") {
                Some(after) => rest = after,
                None => return false,
            },
            None => return false,
        }
    }
    true
}

/// What a token scanned so far was, as far as the next one cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    /// Nothing that a `(` could call.
    Other,
    /// `|`: the next name is a filter.
    Pipe,
    /// `is` (or `is not`): the next name is a test.
    Is,
    /// `.`: the next name is an attribute.
    Dot,
    /// A name that a `(` may follow: an allowed filter, a test or an allowed function.
    Callable,
    /// Any other name (a variable, an attribute), or `)` or `]`: a `(` after it would call something.
    Name,
}

/// Words after which `(` opens a group, not a call.
const KEYWORDS: &[&str] = &["and", "or", "not", "in", "if", "else"];

/// Scans one expression up to `}}` (or the end of the text); returns the text from `}}` on when every
/// token in it is allowed, `None` otherwise.
fn expression_is_plain(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut last = Last::Other;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'}' if bytes.get(i + 1) == Some(&b'}') => return Some(&text[i..]),
            b'-' if bytes.get(i + 1..i + 3) == Some(b"}}") => return Some(&text[i + 1..]),
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'\'' | b'"' => {
                i = string_end(bytes, i)?;
                last = Last::Other;
                continue;
            }
            b'~' | b'+' | b'*' | b'{' | b'%' | b'#' => return None,
            b'(' => {
                if matches!(last, Last::Name | Last::Dot | Last::Pipe | Last::Is) {
                    return None;
                }
                last = Last::Other;
            }
            b')' | b']' => last = Last::Name,
            b'|' => last = Last::Pipe,
            b'.' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) && last == Last::Other => {
                // A number such as `.5`.
                last = Last::Other;
            }
            b'.' => last = Last::Dot,
            b if b.is_ascii_alphabetic() || b == b'_' => {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let name = &text[start..i];
                last = match (last, name) {
                    (Last::Pipe, filter) if FILTERS.contains(&filter) => Last::Callable,
                    (Last::Pipe, _) => return None,
                    (Last::Is, "not") => Last::Is,
                    (Last::Is, _) => Last::Callable,
                    (Last::Dot, _) => Last::Name,
                    (_, "is") => Last::Is,
                    (_, function) if FUNCTIONS.contains(&function) => Last::Callable,
                    (_, keyword) if KEYWORDS.contains(&keyword) => Last::Other,
                    _ => Last::Name,
                };
                continue;
            }
            _ => last = Last::Other,
        }
        i += 1;
    }
    Some(&text[i..])
}

/// The index just past the string literal that starts at `start`, or `None` when it does not end.
fn string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let quote = bytes[start];
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == quote => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::is_plain;

    #[test]
    fn templates_that_only_read_are_plain() {
        for template in [
            "no template at all",
            "{{ inputs.who }}",
            "hello, {{ inputs.who }}!",
            "{{ steps.a.output | tojson }}",
            "{{ steps.a.output.items | length }} items",
            "{{- inputs.x -}}",
            "{{ inputs.x | default('none') | upper }}",
            "{{ inputs.x if inputs.y else 'z' }}",
            "{{ inputs.n is divisibleby(3) }}",
            "{{ inputs.n is not defined }}",
            "{{ steps['a'].output[0] }}",
            "{{ \"a }} b\" }}",
            "{{ [1, 2, .5] }}",
            "{{ inputs.a == 'x' and not inputs.b }}",
            "{{ (inputs.a or inputs.b) and not (inputs.c) }}",
        ] {
            assert!(is_plain(template, false), "{template}");
        }
        for expression in ["inputs.items", "range(10)", "steps.a.status == 'failed'"] {
            assert!(is_plain(expression, true), "{expression}");
        }
    }

    #[test]
    fn templates_that_could_build_large_values_are_not() {
        for template in [
            "{% for i in range(3) %}x{% endfor %}",
            "{{ a ~ a }}",
            "{{ a + a }}",
            "{{ 'x' * 100 }}",
            "{{ a | replace('x', a) }}",
            "{{ a | join(a) }}",
            "{{ a | indent(100000000) }}",
            "{{ a | string }}",
            "{{ a | map('list') }}",
            "{{ a.upper() }}",
            "{{ namespace() }}",
            "{{ lipsum(1000) }}",
            "{{ 'unclosed }}",
            "{{ a | tojson }",
            "{{ { 'a': 1 } }}",
            "{{ a | d(b ~ c) }}",
            "{{ a[0]('x') }}",
            "{{ (a)(1) }}",
        ] {
            assert!(!is_plain(template, false), "{template}");
        }
        for expression in ["a ~ a", "range(3) | join(',')", "a }} b"] {
            assert!(!is_plain(expression, true), "{expression}");
        }
    }
}
