//! Agent Skills (the open format: a directory with `SKILL.md` and optional `scripts/`, `references/`,
//! `assets/`): where a spec's skills are found, what each declares, and the catalog an agent is shown.
//!
//! Validation reports the [`Problem`]s found here as diagnostics; the agent loop offers the skills found
//! (`run::scheduler::agent::skills`). Nothing here runs anything a skill holds: its scripts are text,
//! run only as tools the workflow declares.

mod front;
pub mod trust;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value as Json;

use crate::llm::tokens::Estimator;
use crate::source::Span;
use crate::spec::{AgentDef, Pattern, Rule, Spanned, Spec};
pub use trust::Trust;

/// The file that makes a directory a skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// Where project skills live, beside the spec.
pub const PROJECT_DIR: &str = ".agents/skills";
/// The file beside `SKILL.md` holding the rules a skill adds while it is active (the spec's `rules:` format).
pub const RULES_FILE: &str = "rules.yaml";
/// The folders of a skill whose files the model may read, one level deep.
pub const RESOURCE_DIRS: [&str; 3] = ["references", "assets", "scripts"];
/// The tools an agent with skills is offered: the instructions of a skill, then its files.
pub const TOOL_NAMES: [&str; 2] = ["activate_skill", "read_skill_file"];
/// Longest `description`, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
/// Longest `name`.
pub const MAX_NAME_CHARS: usize = 64;
/// Largest `SKILL.md` (or `rules.yaml`) read.
pub const MAX_SKILL_FILE_BYTES: u64 = 256 * 1024;
/// Tokens the catalog may take in the system prompt unless `defaults.skill_catalog_tokens` says otherwise.
pub const DEFAULT_CATALOG_TOKENS: u32 = 2000;

/// One skill, as its `SKILL.md` declares it.
#[derive(Clone, Debug, Serialize)]
pub struct Skill {
    /// `name` from the front matter (1–64 of `a-z`, `0-9`, `-`).
    pub name: String,
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<String>,
    #[serde(skip_serializing_if = "Json::is_null")]
    pub metadata: Json,
    /// Globs over tool names: while the skill is active, the agent may call only the tools they match
    /// (its own, and the workflow's declared tools). `None`: the skill changes nothing.
    #[serde(rename = "allowed_tools", skip_serializing_if = "Option::is_none")]
    pub allowed_tools: Option<Vec<Pattern>>,
    /// Where each of `allowed_tools` is written in `SKILL.md`, for validation to point at.
    #[serde(skip)]
    pub allowed_tools_at: Vec<Place>,
    /// The skill's directory.
    pub dir: PathBuf,
    /// Whether it came from `.agents/skills/` beside the spec.
    pub project: bool,
    /// The instructions: `SKILL.md` after its front matter.
    #[serde(skip)]
    pub body: String,
    /// Rules added while the skill is active (`rules.yaml`, `before_tool` only).
    #[serde(skip)]
    pub rules: Vec<Rule>,
}

/// The skills each agent of a workflow may use, found by validation: by agent name, and under `None` for
/// LLM steps that name no agent.
#[derive(Clone, Debug, Default)]
pub struct Skills {
    by_agent: std::collections::BTreeMap<Option<String>, std::sync::Arc<[Skill]>>,
}

impl Skills {
    /// Records the skills of `agent`.
    pub fn insert(&mut self, agent: Option<&str>, skills: Vec<Skill>) {
        self.by_agent
            .insert(agent.map(str::to_owned), skills.into());
    }

    /// The skills `agent` (`None`: no named agent) may use.
    pub fn of(&self, agent: Option<&str>) -> std::sync::Arc<[Skill]> {
        self.by_agent
            .get(&agent.map(str::to_owned))
            .or_else(|| self.by_agent.get(&None))
            .cloned()
            .unwrap_or_else(|| Vec::new().into())
    }

    /// Whether any agent has a skill.
    pub fn any(&self) -> bool {
        self.by_agent.values().any(|s| !s.is_empty())
    }
}

/// Something wrong with a skill or a `skills:` entry, for validation to report.
#[derive(Clone, Debug)]
pub struct Problem {
    pub kind: ProblemKind,
    pub message: String,
    pub hint: Option<String>,
    /// Where: a span in the spec, or a byte range in a skill's file (whose text is kept to show it).
    pub at: Place,
}

/// What kind of problem, which decides its code and severity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    /// A `skills:` entry names nothing (an error).
    NotFound,
    /// `SKILL.md` has no front matter, or it is not YAML, or not a mapping (an error).
    FrontMatter,
    /// The name does not match the directory, is not a valid name, or is taken (a warning).
    Name,
    /// No description (the skill is skipped) or one too long (a warning).
    Description,
    /// `rules.yaml` is not a list of `before_tool` rules (an error).
    Rules,
}

/// Where a problem is.
#[derive(Clone, Debug)]
pub enum Place {
    Spec(Span),
    File {
        path: PathBuf,
        text: String,
        range: std::ops::Range<usize>,
    },
}

/// The skills one agent may use, and what was wrong on the way.
#[derive(Clone, Debug, Default)]
pub struct Found {
    pub skills: Vec<Skill>,
    pub problems: Vec<Problem>,
}

/// Finds the skills an agent may use: the top-level `skills`, the agent's own, and the project skills
/// (`.agents/skills/` beside the spec at `spec_path`) when `trust` trusts that directory. The first skill
/// of a name wins; later ones are problems.
pub fn discover(spec: &Spec, agent: Option<&AgentDef>, spec_path: &Path, trust: &Trust) -> Found {
    let base = spec_path.parent().unwrap_or(Path::new("")).to_path_buf();
    let mut found = Found::default();
    let entries = spec
        .skills
        .iter()
        .chain(agent.into_iter().flat_map(|a| a.skills.iter()));
    let mut dirs: Vec<(PathBuf, bool)> = Vec::new();
    for entry in entries {
        match resolve(&base, entry) {
            Ok(mut more) => dirs.append(&mut more),
            Err(problem) => found.problems.push(problem),
        }
    }
    let project = base.join(PROJECT_DIR);
    if project.is_dir() && trust.trusts(&project) {
        dirs.extend(skill_dirs(&project).into_iter().map(|d| (d, true)));
    }
    for (dir, project) in dirs {
        if found.skills.iter().any(|s| s.dir == dir) {
            continue;
        }
        let Some(skill) = front::read(&dir, project, &mut found.problems) else {
            continue;
        };
        if let Some(first) = found.skills.iter().find(|s| s.name == skill.name) {
            found.problems.push(Problem {
                kind: ProblemKind::Name,
                message: format!(
                    "two skills are named `{}`: `{}` is skipped",
                    skill.name,
                    dir.display()
                ),
                hint: Some(format!("the first is `{}`", first.dir.display())),
                at: front::name_place(&dir),
            });
        } else {
            found.skills.push(skill);
        }
    }
    found
}

/// The skill directories a `skills:` entry names: a bare name is a project skill, anything else a path
/// relative to the spec, to a skill or to a directory of skills.
fn resolve(base: &Path, entry: &Spanned<String>) -> Result<Vec<(PathBuf, bool)>, Problem> {
    let written = entry.value.as_str();
    // A bare name is a project skill when there is one of that name; anything else is a path.
    let project = base.join(PROJECT_DIR).join(written);
    if is_name(written) && project.join(SKILL_FILE).is_file() {
        return Ok(vec![(project, true)]);
    }
    let dir = base.join(written);
    if dir.join(SKILL_FILE).is_file() {
        return Ok(vec![(dir, false)]);
    }
    if dir.is_dir() {
        let inside = skill_dirs(&dir);
        if !inside.is_empty() {
            return Ok(inside.into_iter().map(|d| (d, false)).collect());
        }
    }
    let mut looked = vec![format!("`{}`", dir.display())];
    if is_name(written) {
        looked.insert(0, format!("`{}`", project.display()));
    }
    Err(Problem {
        kind: ProblemKind::NotFound,
        message: format!("no skill found at `{written}`"),
        hint: Some(format!(
            "give a project skill's name, a skill directory (with `{SKILL_FILE}`) or a directory of them, relative to this spec; looked in {}",
            looked.join(" and ")
        )),
        at: Place::Spec(entry.span),
    })
}

/// The directories directly inside `dir` that hold a `SKILL.md`, by name.
fn skill_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join(SKILL_FILE).is_file())
        .collect();
    dirs.sort();
    dirs
}

/// Whether `name` is a valid skill name: 1–64 of `a-z`, `0-9` and `-`.
pub fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The catalog of level 1: each skill's name and description, as the system prompt shows them.
#[derive(Clone, Debug, Serialize)]
pub struct Catalog {
    /// The text added to the system prompt (empty when no skill is listed).
    pub text: String,
    /// The skills listed, in order.
    pub listed: Vec<String>,
    /// The skills left out because the budget was spent.
    pub left_out: Vec<String>,
    /// Tokens of `text`, and the budget.
    pub tokens: usize,
    pub budget: usize,
    /// Tokens the whole catalog would take, every skill listed.
    pub full_tokens: usize,
}

/// The catalog's opening lines.
const CATALOG_HEAD: &str = "\n\nSkills: packs of instructions for particular tasks. When a task fits one's description, \
    load its instructions with `activate_skill`; then read the files they mention with `read_skill_file`.\n";

/// One catalog line.
fn line(skill: &Skill) -> String {
    format!("- `{}`: {}\n", skill.name, skill.description)
}

/// The catalog of `skills` within `budget` tokens as `estimator` counts them: skills are listed in order
/// until the next would pass the budget; the rest are left out, with a note saying so.
pub fn catalog(skills: &[Skill], budget: usize, estimator: &Estimator) -> Catalog {
    if skills.is_empty() {
        return Catalog {
            text: String::new(),
            listed: Vec::new(),
            left_out: Vec::new(),
            tokens: 0,
            budget,
            full_tokens: 0,
        };
    }
    let full: String = std::iter::once(CATALOG_HEAD.to_owned())
        .chain(skills.iter().map(line))
        .collect();
    let full_tokens = estimator.text(&full);
    let mut text = CATALOG_HEAD.to_owned();
    let mut listed = Vec::new();
    let mut left_out = Vec::new();
    if full_tokens <= budget {
        text = full;
        listed = skills.iter().map(|s| s.name.clone()).collect();
    } else {
        // Room kept for the note.
        let room = budget.saturating_sub(estimator.text(&note(skills.len(), budget)));
        let mut used = estimator.text(&text);
        for skill in skills {
            let line = line(skill);
            let cost = estimator.text(&line);
            if left_out.is_empty() && used + cost <= room {
                used += cost;
                text.push_str(&line);
                listed.push(skill.name.clone());
            } else {
                left_out.push(skill.name.clone());
            }
        }
        if listed.is_empty() {
            text.clear();
        }
        text.push_str(&note(left_out.len(), budget));
    }
    Catalog {
        tokens: estimator.text(&text),
        text,
        listed,
        left_out,
        budget,
        full_tokens,
    }
}

/// The note ending a catalog that had to leave skills out.
fn note(left_out: usize, budget: usize) -> String {
    format!(
        "[archon: {left_out} more skill(s) left out of this catalog: it may take at most {budget} tokens]\n"
    )
}

/// The catalog budget a spec sets (`defaults.skill_catalog_tokens`), or the default.
pub fn budget(spec: &Spec) -> usize {
    spec.defaults
        .as_ref()
        .and_then(|d| d.skill_catalog_tokens.as_ref())
        .map_or(DEFAULT_CATALOG_TOKENS, |t| t.value) as usize
}

/// The model an agent's provider names (`agent`: `None` for steps without one), for counting tokens as
/// it would.
pub fn model_of<'a>(spec: &'a Spec, agent: Option<&'a AgentDef>) -> Option<&'a str> {
    let llm = spec.llm.as_ref()?;
    let provider = agent
        .and_then(|a| a.provider.as_ref())
        .or(llm.default.as_ref())
        .map(|p| p.value.as_str())
        .or_else(|| llm.providers.keys().next().map(|k| k.value.as_str()))?;
    llm.providers.get(provider)?.model.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skill(name: &str, description: &str) -> Skill {
        Skill {
            name: name.to_owned(),
            description: description.to_owned(),
            license: None,
            compatibility: None,
            metadata: Json::Null,
            allowed_tools: None,
            allowed_tools_at: Vec::new(),
            dir: PathBuf::from(name),
            project: false,
            body: String::new(),
            rules: Vec::new(),
        }
    }

    #[test]
    fn names_are_lowercase_digits_and_dashes() {
        assert!(is_name("pdf-forms2"));
        assert!(!is_name("PDF"));
        assert!(!is_name(""));
        assert!(!is_name(&"a".repeat(65)));
        assert!(!is_name("a/b"));
    }

    #[test]
    fn a_catalog_over_budget_lists_what_fits_and_says_what_it_left_out() {
        let estimator = Estimator::for_model("gpt-4o");
        let skills: Vec<Skill> = (0..5)
            .map(|i| {
                skill(
                    &format!("s{i}"),
                    "does one thing well, at length and in detail",
                )
            })
            .collect();
        let whole = catalog(&skills, 10_000, &estimator);
        assert_eq!(whole.left_out, Vec::<String>::new());
        assert_eq!(whole.tokens, whole.full_tokens);
        let cut = catalog(&skills, whole.full_tokens - 1, &estimator);
        assert!(cut.tokens <= cut.budget, "{cut:?}");
        assert_eq!(cut.listed.len() + cut.left_out.len(), 5);
        assert!(!cut.left_out.is_empty());
        assert!(
            cut.text.ends_with(&note(cut.left_out.len(), cut.budget)),
            "{}",
            cut.text
        );
    }
}
