//! Names and globs that refer to tools, steps or agents (rules' `match`, `tools:` lists): a glob must
//! parse and should match something; a plain name must exist.

use globset::Glob;

use crate::diagnostic::{Diagnostic, codes};
use crate::spec::{Pattern, Spanned};
use crate::validate::{Checker, suggest};

/// What a pattern refers to, and how to report it.
pub struct PatternKind {
    /// "tool", "step" or "agent".
    pub what: &'static str,
    /// The code for a plain name that does not exist.
    pub code: &'static str,
    /// The name is known by other means (an MCP tool, a step the structural check dropped).
    pub known_elsewhere: bool,
    /// Names not listed may exist at run time, so a glob matching none of the listed ones is fine.
    pub open_ended: bool,
    pub hint: Option<&'static str>,
}

impl PatternKind {
    pub fn named(what: &'static str, code: &'static str) -> Self {
        PatternKind {
            what,
            code,
            known_elsewhere: false,
            open_ended: false,
            hint: None,
        }
    }
}

/// Whether a pattern uses glob syntax.
pub fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '[', '{'])
}

impl Checker<'_> {
    pub(super) fn check_name_pattern(
        &mut self,
        pattern: &Spanned<Pattern>,
        names: &[&str],
        kind: &PatternKind,
    ) {
        let what = kind.what;
        let written = pattern.value.as_str();
        if !is_glob(written) {
            if !names.contains(&written) && !kind.known_elsewhere {
                self.push(
                    Diagnostic::error(
                        kind.code,
                        pattern.span,
                        format!("unknown {what} `{written}`"),
                    )
                    .with_hint_opt(suggest::did_you_mean(written, names.iter().copied()))
                    .with_hint_opt(kind.hint.map(str::to_owned)),
                );
            }
            return;
        }
        match Glob::new(written) {
            Err(err) => self.push(Diagnostic::error(
                codes::INVALID_GLOB,
                pattern.span,
                format!(
                    "invalid glob `{}`: {}",
                    pattern.value,
                    err.kind().to_string().to_lowercase()
                ),
            )),
            Ok(glob) => {
                let matcher = glob.compile_matcher();
                if !kind.open_ended && !names.iter().any(|n| matcher.is_match(n)) {
                    self.push(
                        Diagnostic::warning(
                            codes::PATTERN_MATCHES_NOTHING,
                            pattern.span,
                            format!("`{written}` matches no {what}"),
                        )
                        .with_hint_opt(
                            (!names.is_empty())
                                .then(|| format!("{what}s here: {}", suggest::list(names))),
                        ),
                    );
                }
            }
        }
    }
}
