//! Reading one skill: the YAML front matter of its `SKILL.md` (leniently: a wrong name is a warning, no
//! description skips the skill) and the rules of its `rules.yaml`.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::{
    MAX_DESCRIPTION_CHARS, MAX_SKILL_FILE_BYTES, Place, Problem, ProblemKind, RULES_FILE,
    SKILL_FILE, Skill, is_name,
};
use crate::source::{FileId, Format, SourceFile};
use crate::spec::{Limits, Node, NodeKind, Pattern, Rule, Trigger};

/// The skill in `dir`, or `None` (with the reason in `problems`) when it cannot be used.
pub(super) fn read(dir: &Path, project: bool, problems: &mut Vec<Problem>) -> Option<Skill> {
    let path = dir.join(SKILL_FILE);
    let text = match read_text(&path) {
        Ok(text) => text,
        Err(reason) => {
            problems.push(problem(
                ProblemKind::FrontMatter,
                &path,
                "",
                0..0,
                format!("cannot read `{}`: {reason}", path.display()),
            ));
            return None;
        }
    };
    let at = |range: std::ops::Range<usize>| (path.as_path(), text.as_str(), range);
    let Some((yaml_end, body_start)) = bounds(&text) else {
        let (p, t, r) = at(0..text.find('\n').unwrap_or(text.len()));
        problems.push(
            problem(
                ProblemKind::FrontMatter,
                p,
                t,
                r,
                format!("`{SKILL_FILE}` has no YAML front matter"),
            )
            .hint("start the file with `---`, then `name:` and `description:`, then `---`"),
        );
        return None;
    };
    // The opening `---` becomes a comment of the same length, so offsets in the front matter are offsets
    // in the file.
    let yaml = format!("#--{}", &text[3..yaml_end]);
    let file = SourceFile::new(FileId(u32::MAX), path.clone(), yaml, Format::Yaml);
    let (root, diagnostics) = crate::spec::parse(&file, &Limits::default());
    if let Some(d) = diagnostics.iter().find(|d| d.is_error()) {
        let (p, t, r) = at(d.span.range());
        problems.push(problem(
            ProblemKind::FrontMatter,
            p,
            t,
            r,
            format!("invalid YAML front matter: {}", d.message),
        ));
        return None;
    }
    let root = root?;
    let Some(_) = root.as_map() else {
        let (p, t, r) = at(root.span.range());
        problems.push(problem(
            ProblemKind::FrontMatter,
            p,
            t,
            r,
            format!(
                "the front matter must be a mapping, found {}",
                root.type_name()
            ),
        ));
        return None;
    };
    let directory = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let string = |key: &str, problems: &mut Vec<Problem>| -> Option<String> {
        let node = root.get(key)?;
        match node.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let (p, t, r) = at(node.span.range());
                problems.push(problem(
                    ProblemKind::FrontMatter,
                    p,
                    t,
                    r,
                    format!("`{key}` must be a string, found {}", node.type_name()),
                ));
                None
            }
        }
    };
    let name_span = root.entry("name").map_or(0..0, |(_, n)| n.span.range());
    let name = match string("name", problems) {
        Some(name) if is_name(&name) => {
            if name != directory {
                let (p, t, r) = at(name_span);
                problems.push(
                    problem(
                        ProblemKind::Name,
                        p,
                        t,
                        r,
                        format!("skill `{name}` is in a directory named `{directory}`"),
                    )
                    .hint("the Agent Skills format asks for a `name` matching its directory; it is used as `name` says"),
                );
            }
            name
        }
        Some(name) => {
            let (p, t, r) = at(name_span);
            problems.push(
                problem(
                    ProblemKind::Name,
                    p,
                    t,
                    r,
                    format!("skill name `{name}` is not 1–64 of `a-z`, `0-9` and `-`: the skill is skipped"),
                )
                .hint(format!("name it `{directory}`, after its directory")),
            );
            return None;
        }
        None if is_name(&directory) => {
            let (p, t, r) = at(0..3);
            problems.push(
                problem(
                    ProblemKind::Name,
                    p,
                    t,
                    r,
                    format!("skill in `{directory}` has no `name`: it is used as `{directory}`"),
                )
                .hint(format!("add `name: {directory}` to its front matter")),
            );
            directory.clone()
        }
        None => {
            let (p, t, r) = at(0..3);
            problems.push(problem(
                ProblemKind::Name,
                p,
                t,
                r,
                format!("skill in `{directory}` has no `name`: the skill is skipped"),
            ));
            return None;
        }
    };
    let description = string("description", problems).unwrap_or_default();
    let description = description.trim();
    let description_span = root
        .entry("description")
        .map_or(0..3, |(k, _)| k.span.range());
    if description.is_empty() {
        let (p, t, r) = at(description_span);
        problems.push(
            problem(
                ProblemKind::Description,
                p,
                t,
                r,
                format!("skill `{name}` has no description: it is skipped"),
            )
            .hint(
                "a model chooses a skill by its `description`: say what it does and when to use it",
            ),
        );
        return None;
    }
    let chars = description.chars().count();
    let description = if chars > MAX_DESCRIPTION_CHARS {
        let (p, t, r) = at(description_span);
        problems.push(problem(
            ProblemKind::Description,
            p,
            t,
            r,
            format!(
                "skill `{name}`'s description is {chars} characters, more than {MAX_DESCRIPTION_CHARS}: the rest is cut"
            ),
        ));
        description.chars().take(MAX_DESCRIPTION_CHARS).collect()
    } else {
        description.to_owned()
    };
    let (allowed_tools, allowed_tools_at) = match allowed_tools(&root, &text, problems, &at) {
        Some((patterns, ranges)) => {
            let places = ranges
                .into_iter()
                .map(|range| Place::File {
                    path: path.clone(),
                    text: text.clone(),
                    range,
                })
                .collect();
            (Some(patterns), places)
        }
        None => (None, Vec::new()),
    };
    let body = text[body_start..].trim().to_owned();
    let rules = read_rules(dir, problems);
    Some(Skill {
        name,
        description,
        license: string("license", problems),
        compatibility: string("compatibility", problems),
        metadata: root.get("metadata").map_or(Json::Null, Node::to_json),
        allowed_tools,
        allowed_tools_at,
        dir: dir.to_path_buf(),
        project,
        body,
        rules,
    })
}

/// `allowed-tools`: a space-separated string (as the format writes it) or a list of globs, each with
/// where it is written in `SKILL.md`.
fn allowed_tools<'a>(
    root: &Node,
    text: &str,
    problems: &mut Vec<Problem>,
    at: &impl Fn(std::ops::Range<usize>) -> (&'a Path, &'a str, std::ops::Range<usize>),
) -> Option<(Vec<Pattern>, Vec<std::ops::Range<usize>>)> {
    let node = root.get("allowed-tools")?;
    let words: Option<Vec<(String, std::ops::Range<usize>)>> = match &node.kind {
        NodeKind::Str(s) => {
            // Each word where it is written (the scalar as written may be quoted or folded).
            let range = node.span.range();
            let written = text.get(range.clone()).unwrap_or_default();
            let mut from = 0;
            Some(
                s.split_whitespace()
                    .map(|word| {
                        let place = match written[from..].find(word) {
                            Some(offset) => {
                                let start = range.start + from + offset;
                                from += offset + word.len();
                                start..start + word.len()
                            }
                            None => range.clone(),
                        };
                        (word.to_owned(), place)
                    })
                    .collect(),
            )
        }
        NodeKind::Seq(items) => items
            .iter()
            .map(|i| i.as_str().map(|s| (s.to_owned(), i.span.range())))
            .collect(),
        _ => None,
    };
    let Some(words) = words else {
        let (p, t, r) = at(node.span.range());
        problems.push(problem(
            ProblemKind::FrontMatter,
            p,
            t,
            r,
            "`allowed-tools` must be a string of tool names or a list of them".to_owned(),
        ));
        return None;
    };
    Some(
        words
            .into_iter()
            .map(|(word, range)| (Pattern::new(word), range))
            .unzip(),
    )
}

/// The rules in `rules.yaml` beside `SKILL.md`, if there is one.
fn read_rules(dir: &Path, problems: &mut Vec<Problem>) -> Vec<Rule> {
    let path = dir.join(RULES_FILE);
    if !path.exists() {
        return Vec::new();
    }
    let text = match read_text(&path) {
        Ok(text) => text,
        Err(reason) => {
            problems.push(problem(
                ProblemKind::Rules,
                &path,
                "",
                0..0,
                format!("cannot read `{}`: {reason}", path.display()),
            ));
            return Vec::new();
        }
    };
    let file = SourceFile::new(FileId(u32::MAX), path.clone(), text.clone(), Format::Yaml);
    let (root, diagnostics) = crate::spec::parse(&file, &Limits::default());
    if let Some(d) = diagnostics.iter().find(|d| d.is_error()) {
        problems.push(problem(
            ProblemKind::Rules,
            &path,
            &text,
            d.span.range(),
            d.message.clone(),
        ));
        return Vec::new();
    }
    let Some(root) = root else {
        return Vec::new();
    };
    let rules: Vec<Rule> = match crate::spec::from_node(&root) {
        Ok(rules) => rules,
        Err(e) => {
            problems.push(
                problem(
                    ProblemKind::Rules,
                    &path,
                    &text,
                    root.span.range(),
                    format!("not a list of rules: {}", e.message),
                )
                .hint("write rules as under the spec's `rules:`, as a list"),
            );
            return Vec::new();
        }
    };
    let mut kept = Vec::new();
    for rule in rules {
        if rule.on.value == Trigger::BeforeTool {
            kept.push(rule);
        } else {
            problems.push(
                problem(
                    ProblemKind::Rules,
                    &path,
                    &text,
                    rule.on.span.range(),
                    "a skill's rule applies to the agent's tool calls: only `on: before_tool` is allowed"
                        .to_owned(),
                ),
            );
        }
    }
    kept
}

/// Where a skill's `name` is, for problems found after it was read.
pub(super) fn name_place(dir: &Path) -> Place {
    let path = dir.join(SKILL_FILE);
    let text = read_text(&path).unwrap_or_default();
    let range = text
        .find("\nname:")
        .map_or(0..0, |at| at + 1..at + 1 + "name".len());
    Place::File { path, text, range }
}

/// Where the front matter ends (the start of the closing `---` line) and the body starts, or `None` when
/// the file does not open with `---`.
fn bounds(text: &str) -> Option<(usize, usize)> {
    let first = text.lines().next()?;
    if first.trim_end() != "---" {
        return None;
    }
    let mut at = first.len() + 1;
    for line in text[at.min(text.len())..].split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Some((at, at + line.len()));
        }
        at += line.len();
    }
    None
}

fn read_text(path: &Path) -> Result<String, String> {
    let bytes = crate::source::read_bounded(path, MAX_SKILL_FILE_BYTES).map_err(|e| e.reason())?;
    String::from_utf8(bytes).map_err(|_| "it is not valid UTF-8".to_owned())
}

fn problem(
    kind: ProblemKind,
    path: &Path,
    text: &str,
    range: std::ops::Range<usize>,
    message: String,
) -> Problem {
    Problem {
        kind,
        message,
        hint: None,
        at: Place::File {
            path: PathBuf::from(path),
            text: text.to_owned(),
            range,
        },
    }
}

impl Problem {
    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}
