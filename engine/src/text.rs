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

/// A step's error cut to its first line, with a note saying how many lines follow and that `archon logs`
/// prints them all; `None` when it is one line. The attempts of nested steps (`outer/inner`) are their
/// top-level step's.
pub fn error_line(error: &str, run_id: &str, step: &str) -> Option<String> {
    let (head, more) = first_line(error)?;
    let top = step.split('/').next().unwrap_or(step);
    Some(format!(
        "{head} (+{more} line{}, see `archon logs {run_id} {top}`)",
        if more == 1 { "" } else { "s" }
    ))
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
}
