//! Colours for people at a terminal: statuses (of runs, steps, attempts) painted by what they mean. Whether
//! to paint is decided once per stream by `--color` and `NO_COLOR` (`output::use_color`,
//! `output::use_color_stderr`); text is painted only after it was made printable, so that nothing a run
//! produced can bring escape codes of its own.

/// Paints text, or leaves it as it is.
#[derive(Clone, Copy, Debug)]
pub struct Paint {
    on: bool,
}

const GREEN: &str = "32";
const RED: &str = "31";
const YELLOW: &str = "33";
const DIM: &str = "2";
const BOLD: &str = "1";

impl Paint {
    pub fn new(on: bool) -> Paint {
        Paint { on }
    }

    /// `text` painted as the status `status` (a run's, a step's or an attempt's, as `as_str` writes it):
    /// green for success, red for failures, yellow for what waits or goes on, dim for what did not run.
    pub fn status(self, status: &str, text: &str) -> String {
        let code = match status {
            "succeeded" | "approved" | "valid" => GREEN,
            "failed" | "timed_out" | "timed out" | "stuck" | "incomplete" | "denied"
            | "damaged" => RED,
            "retrying" | "running" | "waiting_approval" | "waiting approval" | "interrupted"
            | "in doubt" | "asking" => YELLOW,
            "skipped" | "cancelled" | "reused" => DIM,
            _ => return text.to_owned(),
        };
        self.paint(code, text)
    }

    /// `text` in bold (headings).
    pub fn bold(self, text: &str) -> String {
        self.paint(BOLD, text)
    }

    fn paint(self, code: &str, text: &str) -> String {
        if self.on && !text.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
}

/// How many columns `text` takes on a terminal, its colour codes left out.
pub fn width(text: &str) -> usize {
    let mut width = 0;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // `ESC [ ... m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            width += 1;
        }
    }
    width
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn painted_text_keeps_its_width_and_plain_text_is_left_alone() {
        let on = Paint::new(true);
        assert_eq!(on.status("failed", "failed"), "\x1b[31mfailed\x1b[0m");
        assert_eq!(width(&on.status("failed", "failed  ")), 8);
        assert_eq!(Paint::new(false).status("failed", "failed"), "failed");
        assert_eq!(on.status("unknown", "x"), "x");
    }
}
