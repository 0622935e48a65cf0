//! An agent's Agent Skills in its loop, disclosed in stages: the catalog in the system prompt (level 1),
//! `activate_skill` for a skill's instructions (level 2), `read_skill_file` for its files, one level deep
//! and read through the skill's directory opened with cap-std (level 3). An active skill's
//! `allowed-tools` narrows or extends what the agent may call (extending only to the workflow's declared
//! tools), and its `rules.yaml` adds rules. Nothing in a skill runs: its scripts are text to read.

use std::io::Read as _;
use std::sync::{Arc, Mutex};

use serde_json::{Value as Json, json};

use crate::llm::tokens::Estimator;
use crate::llm::{Message, Part, ToolSpec};
use crate::run::scheduler::context::Shared;
use crate::skills::{self, Catalog, RESOURCE_DIRS, Skill};
use crate::spec::Rule;

/// Largest file `read_skill_file` returns whole; the rest of a longer one is cut with a note.
pub const MAX_RESOURCE_BYTES: u64 = 64 * 1024;
/// Most files of a skill listed when it is activated.
const MAX_LISTED_FILES: usize = 100;

const ACTIVATE: &str = skills::TOOL_NAMES[0];
const READ: &str = skills::TOOL_NAMES[1];

/// The skills of one agent step.
pub(super) struct Session {
    /// The skills in the catalog, the only ones the tools accept.
    skills: Vec<Skill>,
    catalog: Catalog,
    /// Names of the activated skills, in order.
    active: Mutex<Vec<String>>,
    /// The tools the agent may call with no skill narrowing them (their own names).
    own: Vec<String>,
    /// The workflow's declared tools, which an active skill's `allowed-tools` may extend to.
    declared: Vec<String>,
}

impl Session {
    /// The skills of the step's agent (`agent`: its name), with the catalog counted as `model` counts.
    /// `own` is the list of tools the agent is offered without skills.
    pub(super) fn new(shared: &Shared, agent: Option<&str>, model: &str, own: &[ToolSpec]) -> Self {
        let all: Arc<[Skill]> = shared.workflow.skills.of(agent);
        let catalog = skills::catalog(
            &all,
            skills::budget(&shared.workflow.spec),
            &Estimator::for_model(model),
        );
        let skills = all
            .iter()
            .filter(|s| catalog.listed.contains(&s.name))
            .cloned()
            .collect();
        Session {
            skills,
            catalog,
            active: Mutex::new(Vec::new()),
            own: own.iter().map(|t| t.name.clone()).collect(),
            declared: shared
                .workflow
                .spec
                .tools
                .iter()
                .filter(|(_, d)| d.mcp.is_none())
                .map(|(n, _)| n.value.clone())
                .collect(),
        }
    }

    /// The catalog for the system prompt (empty without skills, with a note when some were left out).
    pub(super) fn prompt(&self) -> &str {
        &self.catalog.text
    }

    /// The tools to add to the agent's: the skill tools and the declared tools an active skill could
    /// extend it to (offered only while such a skill is active). None without skills.
    pub(super) fn tools(&self, shared: &Shared) -> Vec<ToolSpec> {
        if self.skills.is_empty() {
            return Vec::new();
        }
        let names: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
        let mut tools = vec![
            ToolSpec {
                name: ACTIVATE.to_owned(),
                description:
                    "Loads a skill's instructions (from the skills listed in the system prompt). \
                    Activate a skill when the task fits its description, before doing the task."
                        .to_owned(),
                parameters: json!({
                    "type": "object",
                    "properties": {"name": {"type": "string", "enum": names, "description": "The skill"}},
                    "required": ["name"],
                    "additionalProperties": false
                }),
            },
            ToolSpec {
                name: READ.to_owned(),
                description: "Reads one file of an activated skill, as text: `references/<file>`, \
                    `assets/<file>` or `scripts/<file>`. Scripts are not run by reading them."
                    .to_owned(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "skill": {"type": "string", "enum": names},
                        "path": {"type": "string", "description": "such as `references/guide.md`"}
                    },
                    "required": ["skill", "path"],
                    "additionalProperties": false
                }),
            },
        ];
        let extra: Vec<&str> = self
            .declared
            .iter()
            .filter(|d| !self.own.contains(d))
            .filter(|d| {
                self.skills
                    .iter()
                    .filter_map(|s| s.allowed_tools.as_ref())
                    .flatten()
                    .any(|p| p.matches(d))
            })
            .map(String::as_str)
            .collect();
        tools.extend(
            shared
                .workflow
                .tools
                .iter()
                .filter(|t| extra.contains(&t.name.as_str()))
                .map(|t| ToolSpec {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.parameters.clone(),
                }),
        );
        tools
    }

    /// Whether `name` is a skill tool.
    pub(super) fn handles(&self, name: &str) -> bool {
        !self.skills.is_empty() && skills::TOOL_NAMES.contains(&name)
    }

    /// Whether the agent may call `tool` (its own name, as the spec writes it) now: the skill tools
    /// always; with no active skill that has `allowed-tools`, its own tools; otherwise the tools (its own
    /// and the workflow's declared ones) that one of those skills allows.
    pub(super) fn permits(&self, tool: &str) -> bool {
        // Without skills nothing changes what the agent may call.
        if self.skills.is_empty() || self.handles(tool) {
            return true;
        }
        let active = self.active.lock().map(|a| a.clone()).unwrap_or_default();
        let mut limits = self
            .skills
            .iter()
            .filter(|s| active.contains(&s.name))
            .filter_map(|s| s.allowed_tools.as_ref())
            .peekable();
        if limits.peek().is_none() {
            return self.own.iter().any(|o| o == tool);
        }
        let reachable =
            self.own.iter().any(|o| o == tool) || self.declared.iter().any(|d| d == tool);
        reachable && limits.flatten().any(|p| p.matches(tool))
    }

    /// Why `tool` may not be called now.
    pub(super) fn refusal(&self, tool: &str) -> String {
        let active = self.active.lock().map(|a| a.clone()).unwrap_or_default();
        if active.is_empty() {
            return format!("unknown tool `{tool}`");
        }
        format!(
            "this call was not made: `{tool}` is not among the tools the active skill(s) {} allow",
            active
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }

    /// `offered` (under the names models accept; `real` gives a tool's own name) as the model may call it
    /// now.
    pub(super) fn offered(
        &self,
        offered: &[ToolSpec],
        real: &dyn Fn(&str) -> String,
    ) -> Vec<ToolSpec> {
        if self.skills.is_empty() {
            return offered.to_vec();
        }
        offered
            .iter()
            .filter(|t| self.permits(&real(&t.name)))
            .cloned()
            .collect()
    }

    /// The rules of the active skills.
    pub(super) fn rules(&self) -> Vec<Rule> {
        let active = self.active.lock().map(|a| a.clone()).unwrap_or_default();
        self.skills
            .iter()
            .filter(|s| active.contains(&s.name))
            .flat_map(|s| s.rules.iter().cloned())
            .collect()
    }

    /// The skills a resumed conversation had activated, active again.
    pub(super) fn restore(&self, messages: &[Message]) {
        let mut calls = std::collections::HashMap::new();
        for message in messages {
            for part in &message.parts {
                match part {
                    Part::ToolCall(call) if call.name == ACTIVATE => {
                        calls.insert(call.id.clone(), call.arguments.clone());
                    }
                    Part::ToolResult(result) if result.name == ACTIVATE && !result.is_error => {
                        if let Some(name) = calls
                            .get(&result.id)
                            .and_then(|a| a.get("name"))
                            .and_then(Json::as_str)
                        {
                            self.activate(name);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// The skills active now, by name.
    pub(super) fn active(&self) -> Vec<String> {
        self.active.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Activates the skills `names` names (those it has).
    pub(super) fn activate_all(&self, names: &[String]) {
        for name in names {
            if self.skills.iter().any(|s| &s.name == name) {
                self.activate(name);
            }
        }
    }

    fn activate(&self, name: &str) {
        if let Ok(mut active) = self.active.lock()
            && !active.iter().any(|a| a == name)
        {
            active.push(name.to_owned());
        }
    }

    /// Runs a skill tool: the observation, whether it is an error, and whether it is data (a file's text)
    /// rather than archon's.
    pub(super) fn call(&self, name: &str, arguments: &Json) -> (String, bool, bool) {
        let skill_named = |key: &str| -> Result<&Skill, String> {
            let wanted = arguments
                .get(key)
                .and_then(Json::as_str)
                .unwrap_or_default();
            self.skills
                .iter()
                .find(|s| s.name == wanted)
                .ok_or_else(|| {
                    format!(
                        "unknown skill `{wanted}`; the skills are {}",
                        self.skills
                            .iter()
                            .map(|s| format!("`{}`", s.name))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        };
        if name == ACTIVATE {
            return match skill_named("name") {
                Ok(skill) => {
                    self.activate(&skill.name);
                    (instructions(skill), false, false)
                }
                Err(e) => (e, true, false),
            };
        }
        let skill = match skill_named("skill") {
            Ok(skill) => skill,
            Err(e) => return (e, true, false),
        };
        let active = self.active.lock().map(|a| a.clone()).unwrap_or_default();
        if !active.contains(&skill.name) {
            return (
                format!(
                    "skill `{}` is not active: activate it with `{ACTIVATE}` first",
                    skill.name
                ),
                true,
                false,
            );
        }
        let path = arguments
            .get("path")
            .and_then(Json::as_str)
            .unwrap_or_default();
        match read_resource(skill, path) {
            Ok(text) => (text, false, true),
            Err(e) => (e, true, false),
        }
    }
}

/// What `activate_skill` answers: the body of `SKILL.md`, its files, and what it changes.
fn instructions(skill: &Skill) -> String {
    let mut text = format!(
        "Skill `{}` is active. Its instructions:\n\n{}\n",
        skill.name, skill.body
    );
    let files = resource_files(skill);
    if !files.is_empty() {
        text.push_str(&format!(
            "\nIts files (read them with `{READ}`): {}\n",
            files.join(", ")
        ));
    }
    if let Some(allowed) = &skill.allowed_tools {
        text.push_str(&format!(
            "\nWhile it is active you may call only these tools (and the skill tools): {}\n",
            allowed
                .iter()
                .map(|p| format!("`{}`", p.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    text
}

/// Each file of a skill's resource folders a model may read, by path, as the read tool gives it.
pub(crate) fn resources(skill: &Skill) -> Vec<(String, Result<String, String>)> {
    resource_files(skill)
        .into_iter()
        .map(|path| {
            let read = read_resource(skill, &path);
            (path, read)
        })
        .collect()
}

/// The files of a skill's resource folders, one level deep, by path.
fn resource_files(skill: &Skill) -> Vec<String> {
    let mut files = Vec::new();
    let Ok(dir) = cap_std::fs::Dir::open_ambient_dir(&skill.dir, cap_std::ambient_authority())
    else {
        return files;
    };
    for folder in RESOURCE_DIRS {
        let Ok(sub) = dir.open_dir(folder) else {
            continue;
        };
        let Ok(entries) = sub.entries() else {
            continue;
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| format!("{folder}/{}", e.file_name().to_string_lossy()))
            .collect();
        names.sort();
        files.extend(names);
    }
    files.truncate(MAX_LISTED_FILES);
    files
}

/// One file of a skill, `folder/file` with `folder` a resource folder: opened under the skill's
/// directory by the kernel (cap-std refuses `..`, absolute paths and links that leave it), read as text
/// up to [`MAX_RESOURCE_BYTES`].
fn read_resource(skill: &Skill, path: &str) -> Result<String, String> {
    let refused = || {
        format!(
            "`{path}` is not a file this skill holds: give `references/<file>`, `assets/<file>` or `scripts/<file>`"
        )
    };
    let Some((folder, file)) = path.split_once('/') else {
        return Err(refused());
    };
    if !RESOURCE_DIRS.contains(&folder)
        || file.is_empty()
        || file.contains(['/', '\\'])
        || file == ".."
        || file == "."
    {
        return Err(refused());
    }
    // A FIFO or a device could block the read forever: only a regular file is opened.
    let open = || -> std::io::Result<Option<cap_std::fs::File>> {
        let dir = cap_std::fs::Dir::open_ambient_dir(&skill.dir, cap_std::ambient_authority())?;
        let sub = dir.open_dir(folder)?;
        if !sub.metadata(file)?.is_file() {
            return Ok(None);
        }
        sub.open(file).map(Some)
    };
    let file_handle = open()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("skill `{}` has no file `{path}`", skill.name),
            _ => format!(
                "cannot read `{path}` of skill `{}`: {}",
                skill.name,
                e.to_string().to_lowercase()
            ),
        })?
        .ok_or_else(refused)?;
    let mut bytes = Vec::new();
    file_handle
        .take(MAX_RESOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read `{path}`: {}", e.to_string().to_lowercase()))?;
    let cut = bytes.len() as u64 > MAX_RESOURCE_BYTES;
    bytes.truncate(MAX_RESOURCE_BYTES as usize);
    let mut text = match String::from_utf8(bytes) {
        Ok(text) => text,
        // Cut inside a character: keep what is whole.
        Err(e) if cut && e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut bytes = e.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
        Err(_) => return Err(format!("`{path}` is not text (UTF-8)")),
    };
    if cut {
        text.push_str(&format!(
            "\n[archon: the file is longer than {} KiB; the rest was cut]",
            MAX_RESOURCE_BYTES / 1024
        ));
    }
    Ok(text)
}
