//! `ask` and `consensus` on a step: the agents asked, and how their answers are resolved.

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use crate::spec::{Body, ResolveBy};
use crate::validate::{Checker, suggest};

impl Checker<'_> {
    /// Checks a body's `ask` and `consensus` (`anchor`: the step's id, for a problem with no place of
    /// its own).
    pub(super) fn check_consensus(&mut self, body: Body<'_>, anchor: Span) {
        let Some(ask) = body.ask else {
            if let Some(consensus) = body.consensus {
                self.push(
                    Diagnostic::error(
                        codes::MISSING_KEY,
                        consensus.by.span,
                        "`consensus` needs `ask`, the agents whose answers it resolves",
                    )
                    .with_hint(self.syntax(
                        "add `ask: [<agent>, <agent>]`, or remove `consensus`",
                        "add `ask = [\"<agent>\", \"<agent>\"]`, or remove `consensus`",
                    )),
                );
            }
            return;
        };
        let at = ask.first().map_or(anchor, |a| a.span);
        if body.goal.is_none() {
            self.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    at,
                    "`ask` works only on a `goal` step",
                )
                .with_hint("the agents in `ask` each answer the step's `goal`"),
            );
        }
        if let Some(agent) = body.agent {
            self.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    agent.span,
                    "`agent` and `ask` cannot be used together: the agents in `ask` answer the step",
                )
                .with_hint(self.syntax(
                    "remove `agent`; to have an agent decide between the answers, use `consensus: { by: judge, judge: <agent> }`",
                    "remove `agent`; to have an agent decide between the answers, use `consensus = { by = \"judge\", judge = \"<agent>\" }`",
                )),
            );
        }
        if ask.len() < 2 {
            self.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    at,
                    format!(
                        "`ask` names {} agent{}; asking needs at least 2",
                        ask.len(),
                        if ask.len() == 1 { "" } else { "s" }
                    ),
                )
                .with_hint("to ask one agent, name it in `agent`"),
            );
        }
        for (index, agent) in ask.iter().enumerate() {
            if ask[..index].iter().any(|a| a.value == agent.value) {
                self.push(Diagnostic::error(
                    codes::INVALID_VALUE,
                    agent.span,
                    format!("agent `{}` is asked twice", agent.value),
                ));
            } else {
                self.check_agent_ref(agent);
            }
        }
        let Some(consensus) = body.consensus else {
            self.push(
                Diagnostic::error(
                    codes::MISSING_KEY,
                    at,
                    "`ask` needs a `consensus` block saying how the answers are resolved",
                )
                .with_hint(self.syntax(
                    "add `consensus: { by: vote, field: <name> }`, `consensus: { by: judge, judge: <agent> }` or `consensus: { by: first }`",
                    "add `consensus = { by = \"vote\", field = \"<name>\" }`, `{ by = \"judge\", judge = \"<agent>\" }` or `{ by = \"first\" }`",
                )),
            );
            return;
        };
        let by = consensus.by.value;
        match (by, &consensus.field) {
            (ResolveBy::Vote, None) => self.push(
                Diagnostic::error(
                    codes::MISSING_KEY,
                    consensus.by.span,
                    "a vote needs `field`, the property of `output_schema` the agents vote on",
                )
                .with_hint(self.syntax(
                    "add `field: <name>` to `consensus`",
                    "add `field = \"<name>\"` to `consensus`",
                )),
            ),
            (ResolveBy::Vote, Some(field)) => {
                let properties = body
                    .output_schema
                    .and_then(|s| s.get("properties"))
                    .and_then(|p| p.as_map())
                    .map(|entries| {
                        entries
                            .iter()
                            .map(|(k, _)| k.name.as_str())
                            .collect::<Vec<_>>()
                    });
                match properties {
                    None => self.push(
                        Diagnostic::error(
                            codes::MISSING_KEY,
                            field.span,
                            format!(
                                "a vote on `{}` needs the step's `output_schema`, with `{}` among its `properties`",
                                field.value, field.value
                            ),
                        )
                        .with_hint("the agents vote with the value of this property in their answers"),
                    ),
                    Some(names) if !names.contains(&field.value.as_str()) => self.push(
                        Diagnostic::error(
                            codes::INVALID_VALUE,
                            field.span,
                            format!(
                                "`{}` is not a property of the step's `output_schema`",
                                field.value
                            ),
                        )
                        .with_hint_opt(suggest::did_you_mean(&field.value, names.iter().copied()))
                        .with_hint(format!("its properties are {}", suggest::list(&names))),
                    ),
                    Some(_) => {}
                }
            }
            (_, Some(field)) => self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    field.span,
                    format!("`field` has no effect with `by: {}`", by.as_str()),
                )
                .with_hint("only a vote reads a field of the answers"),
            ),
            (_, None) => {}
        }
        match (by, &consensus.judge) {
            (ResolveBy::Judge, None) => self.push(
                Diagnostic::error(
                    codes::MISSING_KEY,
                    consensus.by.span,
                    "`by: judge` needs `judge`, the agent that reads every answer and gives the step's answer",
                )
                .with_hint(self.syntax(
                    "add `judge: <agent>` to `consensus`",
                    "add `judge = \"<agent>\"` to `consensus`",
                )),
            ),
            (ResolveBy::Judge, Some(judge)) => self.check_agent_ref(judge),
            (_, Some(judge)) => self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    judge.span,
                    format!("`judge` has no effect with `by: {}`", by.as_str()),
                )
                .with_hint("only `by: judge` asks a judge"),
            ),
            (_, None) => {}
        }
    }
}
