//! `archon skills ls [SPEC] [--json]`: the Agent Skills each agent of a workflow would be offered — the
//! catalog its system prompt holds, with its token cost — or, without a spec, the project skills here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use archon_engine::llm::tokens::Estimator;
use archon_engine::skills::{self, Catalog, Skill, Trust};
use archon_engine::spec::Spec;
use archon_engine::validate::validate_file;
use serde_json::json;

use super::Status;
use crate::args::{ColorChoice, SkillsLsArgs};
use crate::output;

/// One agent's view: who, its skills, and its catalog.
struct View {
    agent: Option<String>,
    skills: Vec<Skill>,
    catalog: Catalog,
}

pub fn ls(args: &SkillsLsArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let (views, problems) = match &args.file {
        Some(file) => match of_spec(file, color) {
            Some(views) => (views, Vec::new()),
            None => return Ok(Status::Invalid),
        },
        None => here()?,
    };
    if args.json {
        let agents: Vec<serde_json::Value> = views
            .iter()
            .map(|v| {
                json!({
                    "agent": v.agent,
                    "catalog": v.catalog,
                    "skills": v.skills,
                })
            })
            .collect();
        output::stdout_json(&json!({ "agents": agents, "problems": problems }));
        return Ok(Status::Success);
    }
    let mut text = String::new();
    for problem in &problems {
        let _ = writeln!(text, "warning: {problem}");
    }
    for (i, view) in views.iter().enumerate() {
        if i > 0 {
            text.push('\n');
        }
        let who = view.agent.as_ref().map_or_else(
            || {
                if args.file.is_some() {
                    "LLM steps without an agent".to_owned()
                } else {
                    format!("project skills in `{}`", skills::PROJECT_DIR)
                }
            },
            |a| format!("agent `{a}`"),
        );
        if view.skills.is_empty() {
            let _ = writeln!(text, "{who}: no skills");
            continue;
        }
        let c = &view.catalog;
        let _ = writeln!(
            text,
            "{who}: {} skill(s), catalog {} of {} tokens",
            view.skills.len(),
            c.tokens,
            c.budget
        );
        let width = view.skills.iter().map(|s| s.name.len()).max().unwrap_or(0);
        for skill in &view.skills {
            let mut notes = Vec::new();
            if skill.project {
                notes.push("project".to_owned());
            }
            if c.left_out.contains(&skill.name) {
                notes.push("left out: over budget".to_owned());
            }
            if let Some(allowed) = &skill.allowed_tools {
                notes.push(format!(
                    "allowed-tools: {}",
                    allowed
                        .iter()
                        .map(|p| p.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                ));
            }
            if !skill.rules.is_empty() {
                notes.push(format!("{} rule(s)", skill.rules.len()));
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" [{}]", notes.join("; "))
            };
            let _ = writeln!(
                text,
                "  {:width$}  {}{notes}",
                skill.name,
                first_line(&skill.description)
            );
        }
    }
    output::stdout(&text);
    Ok(Status::Success)
}

/// What each agent of the spec at `file` would see, or `None` (the diagnostics printed) when it is invalid.
fn of_spec(file: &Path, color: ColorChoice) -> Option<Vec<View>> {
    let workflow = super::load::valid(file, validate_file(file), color)?;
    let spec = &workflow.spec;
    let agents = std::iter::once(None).chain(spec.agents.keys().map(|k| Some(k.value.as_str())));
    Some(
        agents
            .map(|agent| {
                let skills = workflow.skills.of(agent).to_vec();
                let def = agent.and_then(|a| spec.agents.get(a));
                let estimator =
                    Estimator::for_model(skills::model_of(spec, def).unwrap_or_default());
                let catalog = skills::catalog(&skills, skills::budget(spec), &estimator);
                View {
                    agent: agent.map(str::to_owned),
                    skills,
                    catalog,
                }
            })
            .collect(),
    )
}

/// The project skills in `.agents/skills/` of the current directory, trusted or not, and what is wrong
/// with any of them.
fn here() -> anyhow::Result<(Vec<View>, Vec<String>)> {
    let cwd = std::env::current_dir()?;
    let dir = cwd.join(skills::PROJECT_DIR);
    let trust = Trust::new([dir.clone()]);
    let found = skills::discover(&Spec::default(), None, &cwd.join("spec"), &trust);
    let problems = found
        .problems
        .iter()
        .map(|p| match &p.at {
            skills::Place::File { path, .. } => {
                format!("{}: {}", relative(path, &cwd).display(), p.message)
            }
            skills::Place::Spec(_) => p.message.clone(),
        })
        .collect();
    let catalog = skills::catalog(
        &found.skills,
        skills::DEFAULT_CATALOG_TOKENS as usize,
        &Estimator::for_model(""),
    );
    Ok((
        vec![View {
            agent: None,
            skills: found.skills,
            catalog,
        }],
        problems,
    ))
}

fn relative(path: &Path, base: &Path) -> PathBuf {
    path.strip_prefix(base).unwrap_or(path).to_path_buf()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}
