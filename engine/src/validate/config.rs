//! Checks of the workflow-level sections: name, inputs, env and secrets, LLM providers, agents, memory,
//! defaults, rules and outputs; and of the values they share (durations, JSON Schemas, retry policies).

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use std::path::Path;

use crate::spec::{Action, Duration, Node, ProviderKind, Retry, Spanned, Trigger};
use crate::validate::patterns::PatternKind;
use crate::validate::refs::{Scope, StepTable};
use crate::validate::tools::pointer_segments;
use crate::validate::{Checker, suggest};

impl Checker<'_> {
    pub(super) fn check_name(&mut self) {
        let Some(name) = &self.spec.name else { return };
        let valid = name
            .value
            .starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name
                .value
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
        if !valid {
            let slug: String = name
                .value
                .to_lowercase()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect::<String>()
                .split('-')
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("-");
            self.push(
                Diagnostic::error(
                    codes::INVALID_NAME,
                    name.span,
                    format!("workflow name `{}` is not a slug", name.value),
                )
                .with_hint(format!(
                    "use lowercase letters, digits, `-` and `_`, such as `{slug}`"
                )),
            );
        }
    }

    pub(super) fn check_inputs(&mut self) {
        for (name, schema) in &self.spec.inputs {
            self.check_identifier_name(name, "input name");
            if !self.check_json_schema(schema, "input schema") {
                continue;
            }
            let Some(default) = schema.get("default") else {
                continue;
            };
            let json = schema.to_json();
            if let Ok(validator) = jsonschema::validator_for(&json)
                && let Some(error) = validator.iter_errors(&default.to_json()).next()
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_DEFAULT,
                        default.span,
                        format!(
                            "default of input `{}` does not match its schema: {}",
                            name.value,
                            error.masked()
                        ),
                    )
                    .with_hint("change the default or the schema so that they agree"),
                );
            }
        }
    }

    pub(super) fn check_env_and_secrets(&mut self) {
        let scope = Scope::new("the environment").secrets(true);
        for (name, value) in &self.spec.env {
            if name.value.is_empty() || name.value.contains(['=', '\0']) {
                self.push(Diagnostic::error(
                    codes::INVALID_NAME,
                    name.span,
                    format!("`{}` is not a valid environment variable name", name.value),
                ));
            }
            self.template(value, &scope);
        }
        for (index, secret) in self.spec.secrets.iter().enumerate() {
            let valid = secret
                .value
                .starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && secret
                    .value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                self.push(
                    Diagnostic::error(codes::INVALID_NAME, secret.span, format!("secret name `{}` is not a valid environment variable name", secret.value))
                        .with_hint("secrets are read from the environment variable of the same name: use letters, digits and `_`"),
                );
            }
            if let Some(first) = self.spec.secrets[..index]
                .iter()
                .find(|s| s.value == secret.value)
            {
                self.push(
                    Diagnostic::warning(
                        codes::DUPLICATE_KEY,
                        secret.span,
                        format!("secret `{}` is declared twice", secret.value),
                    )
                    .with_label(first.span, "first declared here"),
                );
            }
        }
    }

    pub(super) fn check_network(&mut self) {
        let Some(network) = &self.spec.network else {
            return;
        };
        for entry in &network.allow {
            if entry.value.contains('/') && crate::network::parse_range(&entry.value).is_none() {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        entry.span,
                        format!("`{}` is not a valid CIDR range", entry.value),
                    )
                    .with_hint(
                        "write an address and a prefix length, such as `10.0.0.0/8` or `fd00::/8`",
                    ),
                );
            }
        }
    }

    pub(super) fn check_llm(&mut self) {
        let Some(llm) = &self.spec.llm else { return };
        if let Some(default) = &llm.default {
            self.check_provider_ref(default);
        }
        for (name, provider) in &llm.providers {
            if let Some(timeout) = &provider.timeout {
                self.check_duration(timeout);
            }
            if let Some(base_url) = &provider.base_url
                && !(base_url.value.starts_with("http://")
                    || base_url.value.starts_with("https://"))
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        base_url.span,
                        format!(
                            "`base_url` of provider `{}` must be an http:// or https:// URL",
                            name.value
                        ),
                    )
                    .with_hint("for example `http://127.0.0.1:8080/v1`"),
                );
            }
            if let Some(window) = &provider.context_window
                && window.value == 0
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        window.span,
                        format!(
                            "`context_window` of provider `{}` must be at least 1 token",
                            name.value
                        ),
                    )
                    .with_hint("leave it out to use the built-in table of well-known models"),
                );
            }
            if let Some(share) = &provider.compact_at
                && !(share.value > 0.0 && share.value <= 1.0)
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        share.span,
                        format!(
                            "`compact_at` of provider `{}` must be above 0 and at most 1, not `{}`",
                            name.value, share.value
                        ),
                    )
                    .with_hint("it is a share of the context window, such as `0.8` for 80%"),
                );
            }
            if let Some(param) = &provider.max_tokens_param
                && provider.kind.value != ProviderKind::Openai
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        param.span,
                        format!(
                            "`max_tokens_param` applies only to `openai` providers, and `{}` is not one",
                            name.value
                        ),
                    )
                    .with_hint(
                        "remove it: other APIs have one token limit field, and `auto` may become one of them",
                    ),
                );
            }
            let is_mock = provider.kind.value == ProviderKind::Mock;
            if !is_mock && (!provider.turns.is_empty() || provider.script.is_some()) {
                self.push(Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    provider.kind.span,
                    format!(
                        "`turns` and `script` apply only to `mock` providers, and `{}` is not one",
                        name.value
                    ),
                ));
            }
            if let Some(script) = &provider.script {
                let path = self
                    .file
                    .path
                    .parent()
                    .unwrap_or(Path::new(""))
                    .join(&script.value);
                if !path.is_file() {
                    self.push(
                        Diagnostic::error(
                            codes::FILE_NOT_FOUND,
                            script.span,
                            format!("mock script `{}` does not exist", script.value),
                        )
                        .with_hint(format!(
                            "paths are relative to this spec's directory; looked for `{}`",
                            path.display()
                        )),
                    );
                }
            }
        }
    }

    pub(super) fn check_provider_ref(&mut self, provider: &Spanned<String>) {
        let providers: Vec<&str> = self
            .spec
            .llm
            .iter()
            .flat_map(|l| l.providers.keys().map(|k| k.value.as_str()))
            .collect();
        if !providers.contains(&provider.value.as_str()) {
            let d = Diagnostic::error(
                codes::UNKNOWN_PROVIDER,
                provider.span,
                format!("unknown LLM provider `{}`", provider.value),
            )
            .with_hint_opt(suggest::did_you_mean(
                &provider.value,
                providers.iter().copied(),
            ));
            let d = if providers.is_empty() {
                d.with_hint(self.syntax("declare it under `llm.providers:`, for example `{ kind: openai, model: gpt-4o-mini }`", "declare it in a `[llm.providers.<name>]` table, for example `kind = \"openai\"` and `model = \"gpt-4o-mini\"`"))
            } else {
                d.with_hint(format!("providers declared: {}", suggest::list(&providers)))
            };
            self.push(d);
        }
    }

    pub(super) fn check_agents(&mut self) {
        for (name, agent) in &self.spec.agents {
            if let Some(instructions) = &agent.instructions {
                self.template(instructions, &Scope::new("agent instructions"));
            }
            if let Some(provider) = &agent.provider {
                self.check_provider_ref(provider);
            }
            for tool in &agent.tools {
                self.check_tool_pattern(tool);
            }
            let mut seen = std::collections::HashSet::new();
            for delegate in &agent.delegates {
                let delegate_name = delegate.agent();
                if delegate_name.value == name.value {
                    self.push(Diagnostic::error(
                        codes::INVALID_VALUE,
                        delegate_name.span,
                        format!("agent `{}` cannot delegate to itself", name.value),
                    ));
                } else if !seen.insert(delegate_name.value.clone()) {
                    self.push(Diagnostic::error(
                        codes::DUPLICATE_KEY,
                        delegate_name.span,
                        format!(
                            "agent `{}` lists delegate `{}` twice",
                            name.value, delegate_name.value
                        ),
                    ));
                } else {
                    self.check_agent_ref(&delegate_name);
                }
                if let Some(schema) = &delegate.value.output_schema {
                    if delegate.value.hands_off() {
                        self.push(
                            Diagnostic::error(
                                codes::INVALID_VALUE,
                                schema.span,
                                "a delegate that takes the step over answers with the step's `output_schema`, not its own".to_owned(),
                            )
                            .with_hint("remove `output_schema` here, or `handoff: true`"),
                        );
                    } else {
                        self.check_json_schema(schema, "`output_schema`");
                    }
                }
            }
            if let Some(n) = &agent.max_iterations {
                self.check_positive(n, "max_iterations");
            }
        }
    }

    pub(super) fn check_agent_ref(&mut self, agent: &Spanned<String>) {
        if !self.spec.agents.contains_key(agent.value.as_str()) {
            let names: Vec<&str> = self.spec.agents.keys().map(|k| k.value.as_str()).collect();
            self.push(
                Diagnostic::error(
                    codes::UNKNOWN_AGENT,
                    agent.span,
                    format!("unknown agent `{}`", agent.value),
                )
                .with_hint_opt(suggest::did_you_mean(&agent.value, names.iter().copied()))
                .with_hint(self.syntax(
                    "declare it under `agents:`",
                    "declare it in an `[agents.<name>]` table",
                )),
            );
        }
    }

    pub(super) fn check_memory(&mut self) {
        const MAX_RECALL: u32 = 50;
        // A declared tool may not take the name of a tool memory gives an agent.
        for (agent, def) in &self.spec.agents {
            let given: &[&str] = match (def.memory, def.notes) {
                (Some(true), _) => &crate::tools::MEMORY_TOOLS,
                (_, Some(true)) => &crate::tools::NOTE_TOOLS,
                _ => continue,
            };
            for name in self
                .spec
                .tools
                .keys()
                .filter(|k| given.contains(&k.value.as_str()))
            {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_NAME,
                        name.span,
                        format!(
                            "tool `{}` has the name of a tool memory gives agent `{}`",
                            name.value, agent.value
                        ),
                    )
                    .with_hint(format!("choose another name, such as `my_{}`", name.value)),
                );
            }
        }
        let Some(memory) = &self.spec.memory else {
            return;
        };
        if let Some(namespace) = &memory.namespace {
            self.template(namespace, &Scope::new("the memory namespace"));
        }
        if let Some(path) = &memory.path {
            let relative = Path::new(&path.value);
            let escapes = relative.is_absolute()
                || relative.as_os_str().is_empty()
                || relative
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)));
            // The run store's own file (`store::sqlite::DATABASE`) and its journal files.
            let store_file = relative.components().count() == 1
                && relative
                    .to_str()
                    .is_some_and(|name| name.starts_with("state.db"));
            if store_file {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        path.span,
                        format!("memory `path` `{}` is the run store's file", path.value),
                    )
                    .with_hint("choose a file of its own, such as `memory.db`"),
                );
            }
            if escapes {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        path.span,
                        format!("memory `path` `{}` is not inside the state directory", path.value),
                    )
                    .with_hint("write a relative path without `..`, such as `memory.db` or `memory/team.db`"),
                );
            }
        }
        if let Some(recall) = &memory.recall
            && recall.value > MAX_RECALL
        {
            self.push(Diagnostic::error(
                codes::INVALID_VALUE,
                recall.span,
                format!(
                    "memory `recall` is {}, more than the {MAX_RECALL} a prompt may hold",
                    recall.value
                ),
            ));
        }
        if let Some(embeddings) = &memory.embeddings {
            let provider = &embeddings.value.provider;
            self.check_provider_ref(provider);
            let kind = self
                .spec
                .llm
                .as_ref()
                .and_then(|l| l.providers.get(provider.value.as_str()))
                .map(|p| p.kind.value);
            if let Some(kind) = kind.filter(|k| *k != ProviderKind::Openai) {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        provider.span,
                        format!(
                            "provider `{}` is of kind `{}`, and embeddings come only from an OpenAI-compatible `/embeddings` endpoint",
                            provider.value,
                            serde_json::to_value(kind)
                                .ok()
                                .and_then(|k| k.as_str().map(str::to_owned))
                                .unwrap_or_default()
                        ),
                    )
                    .with_hint("declare a provider of kind `openai` whose `base_url` serves `/embeddings`"),
                );
            }
        }
        let used = self
            .spec
            .agents
            .values()
            .any(|a| a.memory == Some(true) || a.notes == Some(true));
        let written = [
            memory.path.as_ref().map(|p| p.span),
            memory.namespace.as_ref().map(|n| n.span),
            memory.recall.as_ref().map(|r| r.span),
            memory.embeddings.as_ref().map(|e| e.span),
        ];
        if !used && let Some(key) = written.into_iter().flatten().next() {
            self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    key,
                    "`memory` has no effect: no agent has `memory: true` or `notes: true`",
                )
                .with_hint("give an agent `memory: true` to remember across runs"),
            );
        }
    }

    pub(super) fn check_defaults(&mut self) {
        if let Some(timeout) = &self.spec.timeout {
            self.check_duration(timeout);
        }
        if let Some(n) = &self.spec.concurrency {
            self.check_positive(n, "concurrency");
        }
        let Some(defaults) = &self.spec.defaults else {
            return;
        };
        if let Some(timeout) = &defaults.timeout {
            self.check_duration(timeout);
        }
        if let Some(retry) = &defaults.retry {
            self.check_retry(retry);
        }
        if let Some(n) = &defaults.max_parallel {
            self.check_positive(n, "max_parallel");
        }
        if let Some(n) = &defaults.max_iterations {
            self.check_positive(n, "max_iterations");
        }
        for (n, field, most) in [
            (&defaults.max_delegation_depth, "max_delegation_depth", 10),
            (&defaults.max_delegations, "max_delegations", 1000),
        ] {
            if let Some(n) = n {
                self.check_positive(n, field);
                if n.value > most {
                    self.push(Diagnostic::error(
                        codes::INVALID_VALUE,
                        n.span,
                        format!("`{field}` must be at most {most}"),
                    ));
                }
            }
        }
        if let Some(agent) = &defaults.agent {
            self.check_agent_ref(agent);
        }
    }

    pub(super) fn check_retry(&mut self, retry: &Retry) {
        self.check_positive(&retry.attempts, "attempts");
        for d in [&retry.delay, &retry.max_delay].into_iter().flatten() {
            self.check_duration(d);
        }
    }

    /// Checks a duration such as `30s`; returns whether it is valid.
    pub(super) fn check_duration(&mut self, duration: &Duration) -> bool {
        duration.value.get().is_some()
            || self.check_duration_text(&duration.value.text, duration.span)
    }

    /// Checks a duration written at `span`; returns whether it is valid.
    pub(super) fn check_duration_text(&mut self, text: &str, span: Span) -> bool {
        match humantime::parse_duration(text.trim()) {
            Ok(_) => true,
            Err(_) => {
                self.push(
                    Diagnostic::error(
                        codes::INVALID_DURATION,
                        span,
                        format!("invalid duration `{text}`"),
                    )
                    .with_hint(
                        "write a number and a unit, such as `500ms`, `30s`, `5m` or `1h30m`",
                    ),
                );
                false
            }
        }
    }

    /// Checks that a value is a valid JSON Schema; returns whether it is.
    pub(super) fn check_json_schema(&mut self, schema: &Node, what: &str) -> bool {
        let json = schema.to_json();
        let key = json.to_string();
        if self.valid_schemas.contains(&key) {
            return true;
        }
        let error = match jsonschema::meta::validate(&json) {
            Err(e) => Some((e.instance_path().to_string(), e.to_string())),
            Ok(()) => jsonschema::validator_for(&json)
                .err()
                .map(|e| (e.instance_path().to_string(), e.to_string())),
        };
        let Some((path, message)) = error else {
            self.valid_schemas.insert(key);
            return true;
        };
        let node = schema.at_path(&pointer_segments(&path));
        let at = node.map_or(schema.span, |n| n.span);
        if path.ends_with("/type")
            && let Some(name) = node.and_then(Node::as_str)
        {
            const TYPES: &[&str] = &[
                "string", "number", "integer", "boolean", "object", "array", "null",
            ];
            self.push(
                Diagnostic::error(
                    codes::INVALID_JSON_SCHEMA,
                    at,
                    format!("unknown JSON Schema type `{name}` in {what}"),
                )
                .with_hint_opt(suggest::did_you_mean(name, TYPES.iter().copied()))
                .with_hint(format!("types are {}", suggest::list(TYPES))),
            );
            return false;
        }
        let location = if path.is_empty() {
            String::new()
        } else {
            format!(" at `{path}`")
        };
        self.push(
            Diagnostic::error(codes::INVALID_JSON_SCHEMA, at, format!("invalid {what}{location}: {}", first_line(&message)))
                .with_hint(self.syntax("schemas follow JSON Schema draft 2020-12, for example `{ type: string, enum: [a, b] }`", "schemas follow JSON Schema draft 2020-12, for example `{ type = \"string\", enum = [\"a\", \"b\"] }`")),
        );
        false
    }

    pub(super) fn check_rules(&mut self) {
        let steps = StepTable::new(&self.spec.steps, &self.raw_step_ids);
        for rule in &self.spec.rules {
            let trigger = rule.on.value;
            if let Some(matcher) = &rule.matcher {
                if let Some(tool) = &matcher.tool {
                    if matches!(trigger, Trigger::BeforeRun | Trigger::OnPlan) {
                        self.ineffective(tool.span, "`match.tool`", trigger);
                    }
                    self.check_rule_tool_pattern(tool);
                }
                if let Some(step) = &matcher.step {
                    if trigger == Trigger::BeforeRun {
                        self.ineffective(step.span, "`match.step`", trigger);
                    }
                    let ids: Vec<&str> = steps.entries.keys().map(String::as_str).collect();
                    let kind = PatternKind {
                        known_elsewhere: self
                            .raw_step_ids
                            .iter()
                            .any(|id| id == step.value.as_str()),
                        ..PatternKind::named("step", codes::UNKNOWN_STEP)
                    };
                    self.check_name_pattern(step, &ids, &kind);
                }
                if let Some(agent) = &matcher.agent {
                    let names: Vec<&str> =
                        self.spec.agents.keys().map(|k| k.value.as_str()).collect();
                    self.check_name_pattern(
                        agent,
                        &names,
                        &PatternKind::named("agent", codes::UNKNOWN_AGENT),
                    );
                }
                if let Some(chosen_by) = &matcher.chosen_by
                    && trigger != Trigger::BeforeTool
                {
                    self.ineffective(chosen_by.span, "`match.chosen_by`", trigger);
                }
                if let Some(condition) = &matcher.condition {
                    let scope = Scope {
                        event: true,
                        ..Scope::new("a rule condition")
                    };
                    self.expression(condition, &scope);
                }
            }
            let ask = rule.action.value == Action::Ask;
            if let Some(timeout) = &rule.timeout {
                self.check_duration(timeout);
                if !ask {
                    self.push(Diagnostic::warning(
                        codes::INEFFECTIVE_FIELD,
                        timeout.span,
                        "`timeout` applies only to `ask` rules",
                    ));
                }
            }
            if let (Some(default), false) = (&rule.default, ask) {
                self.push(Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    default.span,
                    "`default` applies only to `ask` rules",
                ));
            }
            if rule.action.value == Action::Redact && rule.redact.is_empty() {
                self.push(
                    Diagnostic::error(codes::MISSING_KEY, rule.action.span, "a `redact` rule needs a `redact:` list")
                        .with_hint(self.syntax("list the argument paths to hide, such as `redact: [password, headers.authorization, argv.1]`", "list the argument paths to hide, such as `redact = [\"password\", \"headers.authorization\", \"argv.1\"]`")),
                );
            }
            // After a step has run there is nothing left to ask about, and after it failed, nothing to allow.
            let effective = match rule.action.value {
                Action::Ask => !matches!(trigger, Trigger::AfterStep | Trigger::OnError),
                Action::Allow | Action::Deny => trigger != Trigger::OnError,
                Action::Log | Action::Redact => true,
            };
            if !effective {
                let name = |v: serde_json::Result<serde_json::Value>| {
                    v.ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default()
                };
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        rule.action.span,
                        format!(
                            "`{}` has no effect `on: {}`",
                            name(serde_json::to_value(rule.action.value)),
                            name(serde_json::to_value(trigger))
                        ),
                    )
                    .with_hint(
                        "`after_step` rules can deny a result or log it; `on_error` rules can log",
                    ),
                );
            }
        }
    }

    fn ineffective(&mut self, span: Span, field: &str, trigger: Trigger) {
        let name = serde_json::to_value(trigger)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        self.push(Diagnostic::warning(
            codes::INEFFECTIVE_FIELD,
            span,
            format!("{field} never matches on `{name}`"),
        ));
    }

    pub(super) fn check_workflow_outputs(&mut self) {
        let steps = StepTable::new(&self.spec.steps, &self.raw_step_ids);
        let scope = Scope::new("workflow outputs").steps(&steps);
        for (name, value) in &self.spec.outputs {
            self.check_identifier_name(name, "output name");
            self.value(value, &scope);
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s).trim_end_matches('.')
}
