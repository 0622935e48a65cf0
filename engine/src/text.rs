//! Cutting text that a person or a model reads to a length, at a character boundary: each caller writes
//! its own note of what was left out.

/// `text` split after its first `chars` characters: the head, and how many characters follow; `None` when
/// it is not longer than that.
pub fn split_at_chars(text: &str, chars: usize) -> Option<(&str, usize)> {
    let (end, _) = text.char_indices().nth(chars)?;
    Some((&text[..end], text[end..].chars().count()))
}

/// The largest character boundary of `text` at or before byte `at` (`str::floor_char_boundary`, which is
/// newer than the Rust version this crate supports).
pub fn floor_boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The first line of `text` and how many lines follow it; `None` when it is one line (a final newline
/// aside).
pub fn first_line(text: &str) -> Option<(&str, usize)> {
    let (head, tail) = text.trim_end_matches('\n').split_once('\n')?;
    Some((head.trim_end_matches('\r'), tail.lines().count()))
}

/// Most characters of an error's first line that progress, events and `archon show` keep.
pub const ERROR_LINE_CHARS: usize = 300;

/// A step's error cut to its first line, and that line to [`ERROR_LINE_CHARS`] characters, with a note
/// saying what was left out and that `archon logs` prints it all; `None` when it is one line short enough.
/// The attempts of nested steps (`outer/inner`) are their top-level step's.
pub fn error_line(error: &str, run_id: &str, step: &str) -> Option<String> {
    let (head, lines) = first_line(error).unwrap_or((error.trim_end_matches(['\n', '\r']), 0));
    let (head, chars) = split_at_chars(head, ERROR_LINE_CHARS).unwrap_or((head, 0));
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let left = match (chars, lines) {
        (0, 0) => return None,
        (0, lines) => format!("+{lines} line{}", plural(lines)),
        (chars, 0) => format!("...+{chars} character{}", plural(chars)),
        (chars, lines) => format!(
            "...+{chars} character{}, +{lines} line{}",
            plural(chars),
            plural(lines)
        ),
    };
    let top = step.split('/').next().unwrap_or(step);
    Some(format!("{head} ({left}, see `archon logs {run_id} {top}`)"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn splits_after_the_characters_not_the_bytes() {
        assert_eq!(super::split_at_chars("héllo", 2), Some(("hé", 3)));
        assert_eq!(super::split_at_chars("héllo", 5), None);
        assert_eq!(super::split_at_chars("", 0), None);
        assert_eq!(super::floor_boundary("héllo", 2), 1);
        assert_eq!(super::floor_boundary("héllo", 99), 6);
    }

    #[test]
    fn the_first_line_says_how_many_follow() {
        assert_eq!(super::first_line("one"), None);
        assert_eq!(super::first_line("one\n"), None);
        assert_eq!(super::first_line("one\r\ntwo\nthree\n"), Some(("one", 2)));
    }

    #[test]
    fn an_error_line_is_its_first_line_cut_to_a_length() {
        let long = "x".repeat(super::ERROR_LINE_CHARS + 5);
        let head = "x".repeat(super::ERROR_LINE_CHARS);
        assert_eq!(super::error_line("short\n", "r1", "a"), None);
        assert_eq!(
            super::error_line("one\ntwo", "r1", "a/b").as_deref(),
            Some("one (+1 line, see `archon logs r1 a`)")
        );
        assert_eq!(
            super::error_line(&long, "r1", "a"),
            Some(format!("{head} (...+5 characters, see `archon logs r1 a`)"))
        );
        assert_eq!(
            super::error_line(&format!("{long}\nmore\nlines"), "r1", "a"),
            Some(format!(
                "{head} (...+5 characters, +2 lines, see `archon logs r1 a`)"
            ))
        );
    }
}
