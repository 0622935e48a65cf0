//! Agent Skills (`skills:`, `.agents/skills/`): found and read for each agent, leniently (a wrong name
//! or no description is a warning), with the catalog each agent would be shown checked against its budget.

use crate::diagnostic::{Diagnostic, codes};
use crate::llm::tokens::Estimator;
use crate::skills::{self, Place, ProblemKind, Trust};
use crate::source::Span;
use crate::validate::{Checker, Validator, suggest};

impl Checker<'_> {
    pub(super) fn check_skills(&mut self, validator: &mut Validator) {
        let spec = self.spec;
        let base = self.file.path.parent().unwrap_or(std::path::Path::new(""));
        let any_entry =
            !spec.skills.is_empty() || spec.agents.values().any(|a| !a.skills.is_empty());
        let project = base.join(skills::PROJECT_DIR).is_dir();
        if !any_entry && !project {
            return;
        }
        // The user's config is read only for a spec beside project skills: only they need trust.
        let trust = if project {
            match Trust::from_config() {
                Ok(trust) => trust,
                Err(e) => {
                    self.push(
                        Diagnostic::warning(
                            codes::INVALID_CONFIG,
                            Span::new(self.file.id, 0, 0),
                            format!("{e}; no project skill directory is trusted"),
                        )
                        .with_hint("see docs/skills.md (\"Trusting project skills\")"),
                    );
                    Trust::default()
                }
            }
        } else {
            Trust::default()
        };
        let budget = skills::budget(spec);
        let agents = std::iter::once(None).chain(spec.agents.iter().map(|(n, a)| Some((n, a))));
        let mut reported: Vec<String> = Vec::new();
        for agent in agents {
            let def = agent.map(|(_, a)| a);
            let found = skills::discover(spec, def, &self.file.path, &trust);
            for problem in found.problems {
                let key = format!("{:?}{}", problem.kind, problem.message);
                if reported.contains(&key) {
                    continue;
                }
                reported.push(key);
                let span = span_of(validator, problem.at);
                let (code, error) = match problem.kind {
                    ProblemKind::NotFound => (codes::FILE_NOT_FOUND, true),
                    ProblemKind::FrontMatter => (codes::SKILL_FRONT_MATTER, true),
                    ProblemKind::Rules => (codes::SKILL_RULES, true),
                    ProblemKind::Name => (codes::SKILL_NAME, false),
                    ProblemKind::Description => (codes::SKILL_DESCRIPTION, false),
                };
                let d = if error {
                    Diagnostic::error(code, span, problem.message)
                } else {
                    Diagnostic::warning(code, span, problem.message)
                };
                self.push(d.with_hint_opt(problem.hint));
            }
            // A tool a skill allows that is not here is a warning: skills are shared between
            // workflows, and one may allow tools this workflow does not have.
            for skill in found.skills.iter() {
                let Some(allowed) = &skill.allowed_tools else {
                    continue;
                };
                for (pattern, place) in allowed.iter().zip(&skill.allowed_tools_at) {
                    let Some(names) = self.matches_no_tool(pattern) else {
                        continue;
                    };
                    let message = format!(
                        "`{}` in the `allowed-tools` of skill `{}` matches no tool",
                        pattern.as_str(),
                        skill.name
                    );
                    if reported.contains(&message) {
                        continue;
                    }
                    reported.push(message.clone());
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    self.push(
                        Diagnostic::warning(
                            codes::PATTERN_MATCHES_NOTHING,
                            span_of(validator, place.clone()),
                            message,
                        )
                        .with_hint_opt(suggest::did_you_mean(pattern.as_str(), names.iter().copied()))
                        .with_hint(
                            "while the skill is active, the agent may call no tool of that name; declare it under `tools:`, or correct the skill",
                        ),
                    );
                }
            }
            let estimator = Estimator::for_model(skills::model_of(spec, def).unwrap_or_default());
            let catalog = skills::catalog(&found.skills, budget, &estimator);
            if !catalog.left_out.is_empty() {
                let who = agent.map_or_else(
                    || "LLM steps without an agent".to_owned(),
                    |(n, _)| format!("agent `{}`", n.value),
                );
                let at = spec
                    .defaults
                    .as_ref()
                    .and_then(|d| d.skill_catalog_tokens.as_ref())
                    .map(|t| t.span)
                    .or_else(|| def.and_then(|a| a.skills.first()).map(|s| s.span))
                    .or_else(|| spec.skills.first().map(|s| s.span))
                    .or_else(|| agent.map(|(n, _)| n.span))
                    .unwrap_or(Span::new(self.file.id, 0, 0));
                self.push(
                    Diagnostic::warning(
                        codes::SKILL_CATALOG_OVER_BUDGET,
                        at,
                        format!(
                            "the skill catalog of {who} takes {} tokens, more than its budget of {budget}: {} skill(s) would be left out ({})",
                            catalog.full_tokens,
                            catalog.left_out.len(),
                            catalog.left_out.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                        ),
                    )
                    .with_hint("raise `defaults.skill_catalog_tokens`, shorten descriptions, or give each agent fewer skills"),
                );
            }
            self.skills
                .insert(agent.map(|(n, _)| n.value.as_str()), found.skills);
        }
    }
}

/// A skill problem's place as a span: in the spec, or in a skill's file added to the sources shown.
fn span_of(validator: &mut Validator, place: Place) -> Span {
    match place {
        Place::Spec(span) => span,
        Place::File { path, text, range } => {
            let id = match validator.sources.find(&path) {
                Some(file) => file.id,
                None => validator.sources.add(path, text).id,
            };
            Span::new(id, range.start, range.end)
        }
    }
}
