//! Step checks: ids, kinds, fields that fit the kind, references, `needs`, and the step graph.

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use indexmap::IndexMap;

use crate::source::Format;
use crate::spec::{Approval, Body, Cache, Fallback, Node, Spanned, Step};
use crate::validate::graph::{self, Graph};
use crate::validate::refs::{Dep, Scope, StepTable};
use crate::validate::{Checker, MAX_COMBINATIONS, Validator, suggest};

/// Whether `id` can be read as `steps.<id>` in a template.
pub fn is_identifier(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `label` can be a `runs_on` label (and one of `archon worker --labels`).
pub fn is_label(label: &str) -> bool {
    label.len() <= 64
        && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && label
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Where a step list lives: the workflow itself, or a composite tool with parameters.
#[derive(Clone, Copy)]
pub struct StepListScope<'s> {
    pub params: Option<&'s [String]>,
    pub raw_ids: &'s [String],
}

impl Checker<'_> {
    pub(super) fn check_steps(&mut self, validator: &mut Validator) -> Graph {
        if self.spec.steps.is_empty() && self.raw_step_count == 0 {
            let at = self.steps_key.unwrap_or(Span::new(self.file.id, 0, 0));
            self.push(
                Diagnostic::error(codes::EMPTY_WORKFLOW, at, "workflow has no steps").with_hint(
                    self.syntax(
                        "add at least one step under `steps:`",
                        "add at least one `[[steps]]` table",
                    ),
                ),
            );
        }
        let raw_ids = std::mem::take(&mut self.raw_step_ids);
        let scope = StepListScope {
            params: None,
            raw_ids: &raw_ids,
        };
        let graph = self.check_step_list(&self.spec.steps, scope, validator);
        self.raw_step_ids = raw_ids;
        graph
    }

    /// Checks a list of steps (a workflow's or a composite tool's) and builds its graph.
    pub(super) fn check_step_list(
        &mut self,
        steps: &[Step],
        list: StepListScope<'_>,
        validator: &mut Validator,
    ) -> Graph {
        let table = StepTable::new(steps, list.raw_ids);
        let mut all_deps = Vec::with_capacity(steps.len());
        for (index, step) in steps.iter().enumerate() {
            self.check_step_id(steps, index, &table);
            all_deps.push(self.check_step(step, &table, list, validator));
        }
        graph::build(steps, &all_deps, &mut self.diagnostics)
    }

    fn check_step_id(&mut self, steps: &[Step], index: usize, table: &StepTable) {
        let id = &steps[index].id;
        if !is_identifier(&id.value) {
            let fixed: String = id
                .value
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let fixed = if fixed.starts_with(|c: char| c.is_ascii_digit()) {
                format!("_{fixed}")
            } else {
                fixed
            };
            self.push(
                Diagnostic::error(codes::INVALID_NAME, id.span, format!("step id `{}` is not a valid identifier", id.value))
                    .with_hint(format!("ids are read as `steps.<id>` in templates, so use letters, digits and `_`: `{fixed}`")),
            );
        }
        let first_index = table.entries.get(&id.value).map_or(index, |e| e.index);
        if let Some(first) = (first_index != index).then(|| &steps[first_index]) {
            self.push(
                Diagnostic::error(
                    codes::DUPLICATE_STEP,
                    id.span,
                    format!("duplicate step id `{}`", id.value),
                )
                .with_label(first.id.span, "first used here")
                .with_hint("every step needs its own id; rename one of them"),
            );
        }
    }

    fn check_step(
        &mut self,
        step: &Step,
        table: &StepTable,
        list: StepListScope<'_>,
        validator: &mut Validator,
    ) -> Vec<Dep> {
        // A step whose `foreach` or `matrix` the structural check dropped still repeats: its `item` is
        // not reported again.
        let foreach = step.repeats() || self.raw_repeating.contains(&step.id.span);
        let matrix = step.matrix.as_deref();
        let base = Scope {
            params: list.params,
            ..Scope::new("a step")
        }
        .steps(table);
        let mut deps = Vec::new();

        for need in &step.needs {
            match table.entries.get(&need.value) {
                Some(entry) => deps.push(Dep {
                    step: entry.index,
                    span: need.span,
                }),
                None if table.broken.contains(&need.value) => {}
                None => {
                    let known: Vec<&str> = table.entries.keys().map(String::as_str).collect();
                    self.push(
                        Diagnostic::error(
                            codes::UNKNOWN_STEP,
                            need.span,
                            format!("`needs` refers to unknown step `{}`", need.value),
                        )
                        .with_hint_opt(suggest::did_you_mean(&need.value, known.iter().copied())),
                    );
                }
            }
        }
        if let Some(condition) = &step.condition {
            deps.extend(self.expression(
                condition,
                &Scope {
                    place: "an `if` condition",
                    ..base
                },
            ));
        }
        if let Some(list) = &step.foreach {
            deps.extend(self.list_or_expression(list, "a `foreach` expression", &base));
        }
        if let Some(matrix) = matrix {
            deps.extend(self.check_matrix(step, matrix, &base));
        }
        match (&step.max_parallel, foreach) {
            (Some(n), false) => self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    n.span,
                    "`max_parallel` has no effect without `foreach` or `matrix`",
                )
                .with_hint(self.syntax(
                    "remove it, or add `foreach:`; the run-wide limit is `defaults.max_parallel`",
                    "remove it, or add `foreach`; the run-wide limit is `max_parallel` in `[defaults]`",
                )),
            ),
            (Some(n), true) if n.value == 0 => self.push(Diagnostic::error(
                codes::INVALID_VALUE,
                n.span,
                "`max_parallel` must be at least 1",
            )),
            _ => {}
        }
        self.check_labels(&step.runs_on);
        let inside = base.foreach(foreach).matrix(matrix);
        deps.extend(self.check_body(step.body(), step.id.span, &inside, validator));
        let own = Scope {
            own_step: Some(step.id.value.as_str()),
            place: "step outputs",
            ..inside
        };
        for (name, value) in &step.outputs {
            self.check_identifier_name(name, "output name");
            deps.extend(self.value(value, &own));
        }
        if let Some(fallback) = &step.fallback {
            let scoped = self.check_toml_scope(step, fallback);
            if let Some(on_error) = fallback
                .on_error
                .as_ref()
                .filter(|_| !scoped.contains(&"on_error"))
            {
                self.push(
                    Diagnostic::warning(
                        codes::INEFFECTIVE_FIELD,
                        on_error.span,
                        "`on_error` has no effect in a fallback",
                    )
                    .with_hint("the step's own `on_error` decides what its failure does"),
                );
            }
            deps.extend(self.check_body(fallback.body(), step.id.span, &inside, validator));
        }
        if let Some(cache) = &step.cache {
            deps.extend(self.check_cache(step, cache, list, &inside));
        }
        deps
    }

    /// In TOML, the keys a step and its fallback share, written after a `[steps.fallback]` header, are
    /// the fallback's: a `retry` meant for the step, written below the header, silently retried only the
    /// fallback. Warns about each one the step does not also set; returns the keys it warned about.
    fn check_toml_scope(&mut self, step: &Step, fallback: &Fallback) -> Vec<&'static str> {
        if self.file.format != Format::Toml {
            return Vec::new();
        }
        let shared: [(&str, Option<Span>, bool); 4] = [
            (
                "retry",
                fallback.retry.as_ref().map(|r| r.attempts.span),
                step.retry.is_some(),
            ),
            (
                "timeout",
                fallback.timeout.as_ref().map(|t| t.span),
                step.timeout.is_some(),
            ),
            (
                "on_error",
                fallback.on_error.as_ref().map(|o| o.span),
                step.on_error.is_some(),
            ),
            (
                "idempotent",
                fallback.idempotent.as_ref().map(|i| i.span),
                step.idempotent.is_some(),
            ),
        ];
        let mut warned = Vec::new();
        for (key, span, step_sets) in shared {
            let Some(span) =
                span.filter(|s| !step_sets && under_fallback_header(&self.file.text, s.start))
            else {
                continue;
            };
            self.push(
                Diagnostic::warning(
                    codes::TOML_TABLE_SCOPE,
                    span,
                    format!("`{key}` here belongs to `[steps.fallback]`, not to the step"),
                )
                .with_hint(crate::validate::structure::toml_scope_hint(key))
                .with_hint(if key == "on_error" {
                    "in a fallback it has no effect: the step's own `on_error` decides what its failure does".to_owned()
                } else {
                    format!("to give the fallback its own `{key}`, write the fallback inline: `fallback = {{ tool = \"...\", {key} = ... }}`")
                }),
            );
            warned.push(key);
        }
        warned
    }

    /// A `foreach` list or a `matrix` value: an expression, or a list written out whose strings are
    /// templates.
    fn list_or_expression(
        &mut self,
        list: &Node,
        place: &'static str,
        base: &Scope<'_>,
    ) -> Vec<Dep> {
        let scope = Scope { place, ..*base };
        match list.as_str() {
            Some(expr) => self.expression_at(expr, list.span, &scope),
            None => self.value(list, &scope),
        }
    }

    /// A step's `matrix`: not with `foreach`, at least one name, names read in templates, each value a
    /// list or an expression, and at most [`MAX_COMBINATIONS`] combinations of the lists written out.
    fn check_matrix(
        &mut self,
        step: &Step,
        matrix: &IndexMap<Spanned<String>, Node>,
        base: &Scope<'_>,
    ) -> Vec<Dep> {
        let anchor = matrix.keys().next().map_or(step.id.span, |k| k.span);
        if let Some(foreach) = &step.foreach {
            self.push(
                Diagnostic::error(
                    codes::CONFLICTING_LOOPS,
                    anchor,
                    "a step has either `foreach` or `matrix`, not both",
                )
                .with_label(foreach.span, "`foreach` given here")
                .with_hint(
                    "add the `foreach` list to the `matrix` as one more name, or split the step",
                ),
            );
        }
        if matrix.is_empty() {
            self.push(
                Diagnostic::error(codes::INVALID_VALUE, step.id.span, "`matrix` has no lists")
                    .with_hint(self.syntax(
                        "give each name a list, such as `matrix: { os: [linux, mac] }`",
                        "give each name a list, such as `matrix = { os = [\"linux\", \"mac\"] }`",
                    )),
            );
        }
        let mut deps = Vec::new();
        for (name, list) in matrix {
            self.check_identifier_name(name, "matrix name");
            deps.extend(self.list_or_expression(list, "a `matrix` expression", base));
        }
        let sizes: Option<Vec<usize>> = matrix
            .values()
            .map(|l| l.as_seq().map(<[Node]>::len))
            .collect();
        if let Some(sizes) = sizes {
            let count = sizes.iter().fold(1usize, |n, s| n.saturating_mul(*s));
            if count > MAX_COMBINATIONS {
                let shown: Vec<String> = sizes.iter().map(usize::to_string).collect();
                self.push(
                    Diagnostic::error(
                        codes::INVALID_VALUE,
                        anchor,
                        format!(
                            "`matrix` makes {count} combinations ({}), more than {MAX_COMBINATIONS}",
                            shown.join(" × ")
                        ),
                    )
                    .with_hint("split the step, or run the combinations that matter with `foreach` over a list of them"),
                );
            }
        }
        deps
    }

    /// Checks a step's `cache`: where it may be, what it may not be combined with, its key and its
    /// `ttl`. The key's references are dependencies like any other template's.
    fn check_cache(
        &mut self,
        step: &Step,
        cache: &Spanned<Cache>,
        list: StepListScope<'_>,
        scope: &Scope<'_>,
    ) -> Vec<Dep> {
        let mut deps = Vec::new();
        if let Some(key) = cache.value.key() {
            // A key holding a secret would be hashed with it masked: the secret cannot tell results apart.
            deps.extend(
                self.template(
                    key,
                    &Scope {
                        place: "a cache key",
                        ..*scope
                    }
                    .secrets(false),
                ),
            );
        }
        if let Some(ttl) = cache.value.ttl()
            && self.check_duration(ttl)
            && ttl.value.get().is_some_and(|t| t.is_zero())
        {
            // An entry that expires as it is written is never reused: the step would only write it.
            self.push(
                Diagnostic::error(
                    codes::INVALID_VALUE,
                    ttl.span,
                    format!("cache `ttl` `{}` is zero, so no result would ever be reused", ttl.value.text),
                )
                .with_hint(self.syntax(
                    "write a longer `ttl` such as `1h`, leave `ttl` out to reuse until `archon cache clear`, or remove `cache`",
                    "write a longer `ttl` such as `\"1h\"`, leave `ttl` out to reuse until `archon cache clear`, or remove `cache`",
                )),
            );
        }
        if !cache.value.enabled() {
            return deps;
        }
        if list.params.is_some() || self.planned || step.ask.is_some() {
            let (what, hint) = if step.ask.is_some() {
                (
                    "a step that asks several agents",
                    "its answer depends on every asked agent's instructions and tools, which its key does not cover; cache the steps it reads instead",
                )
            } else if self.planned {
                (
                    "a planned step",
                    "a plan's steps run once; cache the planner step itself instead",
                )
            } else {
                (
                    "a step of a composite tool",
                    "cache the step that calls the tool instead",
                )
            };
            self.push(
                Diagnostic::error(
                    codes::CACHE_UNSUPPORTED,
                    cache.span,
                    format!("`cache` is not supported on {what}"),
                )
                .with_hint(hint),
            );
            return deps;
        }
        if let Some(approval) = &step.approval
            && approval.value == Approval::Required
        {
            self.push(
                Diagnostic::error(
                    codes::CACHE_WITH_APPROVAL,
                    cache.span,
                    format!(
                        "step `{}` asks for approval, so its result is never reused",
                        step.id.value
                    ),
                )
                .with_label(
                    approval.span,
                    self.syntax(
                        "`approval: required` given here",
                        "`approval = \"required\"` given here",
                    ),
                )
                .with_hint(self.syntax(
                    "remove `cache`, or remove `approval: required`",
                    "remove `cache`, or remove `approval = \"required\"`",
                )),
            );
        }
        if cache.value.key().is_none()
            && let Some(why) = self.sensitive_step(step)
        {
            self.push(
                Diagnostic::error(
                    codes::CACHE_SENSITIVE,
                    cache.span,
                    format!(
                        "step `{}` {why}, so a result cached by the step's content could skip an effect someone wanted",
                        step.id.value
                    ),
                )
                .with_hint(self.syntax(
                    "write the key yourself (`cache: { key: \"{{ ... }}\" }`) to say which calls give the same result",
                    "write the key yourself (`cache = { key = \"{{ ... }}\" }`) to say which calls give the same result",
                )),
            );
        }
        deps
    }

    /// Why a step's call is sensitive (its tool, a tool an LLM step may call, a sub-workflow), if it is.
    fn sensitive_step(&self, step: &Step) -> Option<String> {
        let body = step.body();
        if let Some(path) = body.workflow {
            return Some(format!("calls sub-workflow `{}`", path.value));
        }
        if let Some(tool) = body.tool {
            let args = body
                .args
                .map_or(serde_json::Value::Object(Default::default()), Node::to_json);
            return crate::tools::sensitive(self.spec, &tool.value, &args)
                .then(|| format!("calls sensitive tool `{}`", tool.value));
        }
        let patterns = self.spec.tool_patterns(body);
        self.tools
            .iter()
            .find(|t| patterns.iter().any(|p| p.matches(&t.name)) && t.safety.of(None).sensitive)
            .map(|t| format!("may call sensitive tool `{}`", t.name))
    }

    /// Checks what a step or fallback does. `anchor` is where to report a problem with the body as a whole.
    pub(super) fn check_body(
        &mut self,
        body: Body<'_>,
        anchor: Span,
        scope: &Scope<'_>,
        validator: &mut Validator,
    ) -> Vec<Dep> {
        let mut deps = Vec::new();
        let kinds: Vec<(&str, Span)> = [
            ("tool", body.tool.map(|t| t.span)),
            ("goal", body.goal.map(|t| t.span)),
            ("plan", body.plan.map(|t| t.span)),
            ("workflow", body.workflow.map(|t| t.span)),
        ]
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect();
        let prompt = Scope {
            place: "a prompt",
            ..*scope
        }
        .secrets(false);
        let args_scope = Scope {
            place: "tool arguments",
            ..*scope
        }
        .secrets(true);
        match kinds.as_slice() {
            [] if body.description.is_none() => self.push(
                Diagnostic::error(codes::MISSING_STEP_KIND, anchor, "step does not say what to do")
                    .with_hint(self.syntax("add `tool:` (with `with:`), `goal:`, `plan:` or `workflow:`, or a `description:` for the LLM to act on", "add `tool = \"...\"` (with `with = { ... }`), `goal`, `plan` or `workflow`, or a `description` for the LLM to act on")),
            ),
            [_, second, ..] => {
                let names: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
                let mut d = Diagnostic::error(
                    codes::CONFLICTING_STEP_KINDS,
                    second.1,
                    format!("step has more than one kind: {}", suggest::list(&names)),
                )
                .with_hint("a step is exactly one of `tool`, `goal`, `plan` or `workflow`; split it into several steps");
                for (kind, span) in kinds.iter().filter(|(k, _)| *k != second.0) {
                    d = d.with_label(*span, format!("`{kind}` given here"));
                }
                self.push(d);
            }
            _ => {}
        }
        let llm_step = body.goal.is_some() || body.plan.is_some() || kinds.is_empty();
        if let Some(description) = body.description {
            deps.extend(self.template(description, &prompt));
        }
        if let Some(tool) = body.tool {
            deps.extend(self.check_tool_call(tool, body.args, &args_scope));
        }
        if let Some(goal) = body.goal.or(body.plan) {
            deps.extend(self.template(goal, &prompt));
        }
        // A planner writes a plan; it does not delegate (the agent steps of its plan may).
        let plans = body.plan.is_some()
            || (kinds.is_empty()
                && self
                    .spec
                    .defaults
                    .as_ref()
                    .and_then(|d| d.unspecified.as_ref())
                    .map(|u| u.value)
                    == Some(crate::spec::Unspecified::Plan));
        if plans
            && let Some(agent) = body
                .agent
                .or_else(|| self.spec.defaults.as_ref().and_then(|d| d.agent.as_ref()))
            && self
                .spec
                .agents
                .get(agent.value.as_str())
                .is_some_and(|a| !a.delegates.is_empty())
        {
            self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    agent.span,
                    format!(
                        "the `delegates` of agent `{}` have no effect on a planner step",
                        agent.value
                    ),
                )
                .with_hint("a planner writes a plan; the agent steps of its plan may delegate"),
            );
        }
        if let Some(workflow) = body.workflow {
            deps.extend(self.check_workflow_call(
                workflow,
                body.args,
                &Scope {
                    place: "sub-workflow inputs",
                    ..prompt
                },
                validator,
            ));
        }
        if let Some(args) = body.args
            && body.tool.is_none()
            && body.workflow.is_none()
        {
            self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    args.span,
                    "`with` has no effect on an LLM step",
                )
                .with_hint("pass data to an LLM step in `goal` or `context`"),
            );
            deps.extend(self.value(args, &prompt));
        }
        if let Some(context) = body.context {
            deps.extend(self.value(context, &prompt));
        }
        if let Some(expected) = body.expected_output {
            deps.extend(self.template(expected, &prompt));
        }
        if let Some(schema) = body.output_schema {
            self.check_json_schema(schema, "`output_schema`");
        }
        if !llm_step {
            let llm_only: [(&str, Option<Span>); 6] = [
                ("tools", body.tools.and_then(|t| t.first().map(|t| t.span))),
                ("max_iterations", body.max_iterations.map(|m| m.span)),
                ("agent", body.agent.map(|a| a.span)),
                ("provider", body.provider.map(|p| p.span)),
                ("expected_output", body.expected_output.map(|e| e.span)),
                ("context", body.context.map(|c| c.span)),
            ];
            for (field, span) in llm_only.iter().filter_map(|(f, s)| s.map(|s| (*f, s))) {
                self.push(
                    Diagnostic::warning(
                        codes::INEFFECTIVE_FIELD,
                        span,
                        format!("`{field}` has no effect on a `{}` step", kinds[0].0),
                    )
                    .with_hint(
                        "it applies to LLM steps (`goal`, `plan` or description-only steps)",
                    ),
                );
            }
        }
        for tool in body.tools.unwrap_or_default() {
            self.check_tool_pattern(tool);
        }
        if let Some(agent) = body.agent {
            self.check_agent_ref(agent);
        }
        if let Some(provider) = body.provider {
            self.check_provider_ref(provider);
        }
        if let Some(n) = body.max_iterations {
            self.check_positive(n, "max_iterations");
        }
        self.check_consensus(body, anchor);
        if let Some(retry) = body.retry {
            self.check_retry(retry);
        }
        if let Some(timeout) = body.timeout {
            self.check_duration(timeout);
        }
        deps
    }

    pub(super) fn check_positive(&mut self, n: &Spanned<u32>, field: &str) {
        if n.value == 0 {
            self.push(Diagnostic::error(
                codes::INVALID_VALUE,
                n.span,
                format!("`{field}` must be at least 1"),
            ));
        }
    }

    /// Checks the labels of a `runs_on`: short words of lowercase letters, digits, `_` and `-`.
    pub(super) fn check_labels(&mut self, labels: &[Spanned<String>]) {
        for label in labels {
            if !is_label(&label.value) {
                self.push(
                    Diagnostic::error(codes::INVALID_LABEL, label.span, format!("label `{}` is not valid", label.value))
                        .with_hint("labels are lowercase letters, digits, `_` and `-`, starting with a letter or digit (at most 64), such as `gpu` or `eu-west`"),
                );
            }
        }
    }

    pub(super) fn check_identifier_name(&mut self, name: &Spanned<String>, what: &str) {
        if !is_identifier(&name.value) {
            self.push(
                Diagnostic::error(codes::INVALID_NAME, name.span, format!("{what} `{}` is not a valid identifier", name.value))
                    .with_hint("names read in templates use letters, digits and `_`, and do not start with a digit"),
            );
        }
    }
}

/// Whether the nearest table header before `at` in a TOML text is `[steps.fallback]` (or a composite
/// tool's `[tools.<name>.steps.fallback]`): a key there was written under that header, not inline.
fn under_fallback_header(text: &str, at: u32) -> bool {
    let before = text.get(..at as usize).unwrap_or_default();
    before
        .lines()
        .rev()
        .map(str::trim_start)
        .find(|line| line.starts_with('['))
        .is_some_and(|header| {
            let name = header
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or_default();
            let parts: Vec<&str> = name.split('.').map(str::trim).collect();
            parts.ends_with(&["steps", "fallback"])
        })
}
