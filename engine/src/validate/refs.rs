//! What templates and expressions may read where, and the step dependencies their references create.

use indexmap::IndexMap;

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use crate::spec::{Node, Spanned, Step};
use crate::validate::Checker;
use crate::validate::suggest;
use crate::validate::templates::Reference;

/// Fields of a step result that templates may read as `steps.<id>.<field>`.
pub const STEP_FIELDS: &[&str] = &[
    "output",
    "outputs",
    "status",
    "text",
    "error",
    "attempts",
    "exit_code",
];
/// Fields of `run`.
pub const RUN_FIELDS: &[&str] = &["id", "workflow", "started_at", "workdir"];
/// What a rule condition (`match.if`) may read.
pub const EVENT_ROOTS: &[&str] = &["args", "step", "tool", "agent", "run", "chosen_by"];

/// The steps a template may refer to: one workflow's steps, or one composite tool's.
#[derive(Debug, Default)]
pub struct StepTable {
    pub entries: IndexMap<String, StepEntry>,
    /// Ids of steps the structural check dropped: references to them are not reported again.
    pub broken: Vec<String>,
}

#[derive(Debug)]
pub struct StepEntry {
    pub index: usize,
    pub outputs: Vec<String>,
}

impl StepTable {
    /// Builds the table; the first of two steps with the same id wins (duplicates are reported elsewhere).
    pub fn new(steps: &[Step], raw_ids: &[String]) -> Self {
        let mut entries = IndexMap::new();
        for (index, step) in steps.iter().enumerate() {
            entries
                .entry(step.id.value.clone())
                .or_insert_with(|| StepEntry {
                    index,
                    outputs: step.outputs.keys().map(|k| k.value.clone()).collect(),
                });
        }
        let broken = raw_ids
            .iter()
            .filter(|id| !entries.contains_key(*id))
            .cloned()
            .collect();
        StepTable { entries, broken }
    }
}

/// A dependency on another step, created by a reference or a `needs` entry, and where it was written.
#[derive(Clone, Copy, Debug)]
pub struct Dep {
    pub step: usize,
    pub span: Span,
}

/// Where a template is evaluated, which decides the names it may read.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'s> {
    /// Steps whose results are readable (`None` where no step results exist yet).
    pub steps: Option<&'s StepTable>,
    /// The step a `outputs:` template belongs to: reading its own result creates no dependency.
    pub own_step: Option<&'s str>,
    /// Inside a `foreach` or `matrix` step: `item` and `index` are defined.
    pub foreach: bool,
    /// Inside a `matrix` step: its names, readable as `matrix.<name>`.
    pub matrix: Option<&'s IndexMap<Spanned<String>, Node>>,
    /// Secrets may be read (tool arguments, headers, command environment).
    pub secrets: bool,
    /// Inside a tool definition: its parameter names, readable bare or as `args.<name>`.
    pub params: Option<&'s [String]>,
    /// A rule condition: only the event's fields are readable.
    pub event: bool,
    /// How the place is named in messages, such as "a prompt".
    pub place: &'static str,
}

impl<'s> Scope<'s> {
    pub fn new(place: &'static str) -> Self {
        Scope {
            steps: None,
            own_step: None,
            foreach: false,
            matrix: None,
            secrets: false,
            params: None,
            event: false,
            place,
        }
    }

    pub fn steps(self, steps: &'s StepTable) -> Self {
        Scope {
            steps: Some(steps),
            ..self
        }
    }

    pub fn secrets(self, allowed: bool) -> Self {
        Scope {
            secrets: allowed,
            ..self
        }
    }

    pub fn foreach(self, foreach: bool) -> Self {
        Scope { foreach, ..self }
    }

    pub fn matrix(self, matrix: Option<&'s IndexMap<Spanned<String>, Node>>) -> Self {
        Scope { matrix, ..self }
    }

    fn roots(&self) -> Vec<&str> {
        if self.event {
            return EVENT_ROOTS.to_vec();
        }
        let mut roots = vec!["inputs", "env", "run"];
        if self.steps.is_some() {
            roots.push("steps");
        }
        if self.secrets {
            roots.push("secrets");
        }
        if self.foreach {
            roots.extend(["item", "index"]);
        }
        if self.matrix.is_some() {
            roots.push("matrix");
        }
        if let Some(params) = self.params {
            roots.push("args");
            roots.extend(params.iter().map(String::as_str));
        }
        roots
    }
}

impl Checker<'_> {
    /// Checks a template string; returns the step dependencies it creates.
    pub fn template(&mut self, text: &Spanned<String>, scope: &Scope<'_>) -> Vec<Dep> {
        self.template_at(&text.value, text.span, scope)
    }

    pub fn template_at(&mut self, text: &str, span: Span, scope: &Scope<'_>) -> Vec<Dep> {
        // GitHub Actions writes `${{ x }}`; here that renders a `$` before the value, without a word.
        if let Some(at) = text.find("${{") {
            let at = crate::validate::templates::locate(self.file, span, text, at..at + 3);
            self.push(
                Diagnostic::warning(
                    codes::DOLLAR_TEMPLATE,
                    at,
                    "`${{` renders a `$` before the value: templates are written `{{ ... }}`",
                )
                .with_hint("drop the `$`; to print a `$` before a value on purpose, write `{{ '$' }}{{ ... }}`"),
            );
        }
        match self.analyzer.template(self.file, span, text) {
            Ok(refs) => {
                self.check_filters(text, span, false);
                self.references(&refs, scope)
            }
            Err(d) => {
                self.push(d);
                Vec::new()
            }
        }
    }

    /// Reports filters that do not exist, which minijinja would find only when it renders.
    fn check_filters(&mut self, text: &str, span: Span, expression: bool) {
        if !text.contains('|') {
            return;
        }
        for (range, name, hint) in self.analyzer.unknown_filters(text, expression) {
            let at = crate::validate::templates::locate(self.file, span, text, range);
            self.push(
                Diagnostic::error(
                    codes::UNKNOWN_FILTER,
                    at,
                    format!("unknown filter `{name}`"),
                )
                .with_hint_opt(hint)
                .with_hint("see the filters in docs/spec.md (templates and expressions)"),
            );
        }
    }

    /// Checks a bare expression; returns the step dependencies it creates.
    pub fn expression(&mut self, text: &Spanned<String>, scope: &Scope<'_>) -> Vec<Dep> {
        self.expression_at(&text.value, text.span, scope)
    }

    pub fn expression_at(&mut self, text: &str, span: Span, scope: &Scope<'_>) -> Vec<Dep> {
        match self.analyzer.expression(self.file, span, text) {
            Ok(refs) => {
                self.check_filters(text, span, true);
                self.references(&refs, scope)
            }
            Err(d) => {
                self.push(d);
                Vec::new()
            }
        }
    }

    /// Checks every string inside a structured value as a template.
    pub fn value(&mut self, node: &Node, scope: &Scope<'_>) -> Vec<Dep> {
        let mut strings = Vec::new();
        node.for_each_str(&mut |s, span| strings.push((s, span)));
        strings
            .into_iter()
            .flat_map(|(s, span)| self.template_at(s, span, scope))
            .collect()
    }

    /// `matrix.<name>`: only in a `matrix` step, and only its names.
    fn matrix_reference(&mut self, r: &Reference, scope: &Scope<'_>) {
        let Some(matrix) = scope.matrix else {
            self.push(
                Diagnostic::error(
                    codes::ITEM_OUTSIDE_FOREACH,
                    r.span_of(1),
                    "`matrix` is only defined in a step with `matrix`",
                )
                .with_hint(self.syntax(
                    "add `matrix:` to this step, or read the value from `steps.<id>.output`",
                    "add `matrix` to this step, or read the value from `steps.<id>.output`",
                )),
            );
            return;
        };
        let Some(name) = r.segments.get(1) else {
            return;
        };
        if !matrix.contains_key(name.as_str()) {
            let known: Vec<&str> = matrix.keys().map(|k| k.value.as_str()).collect();
            self.push(
                Diagnostic::error(
                    codes::UNKNOWN_VARIABLE,
                    r.span_of(2),
                    format!("the step's `matrix` has no `{name}`"),
                )
                .with_hint_opt(suggest::did_you_mean(name, known.iter().copied()))
                .with_hint(format!("its names are {}", suggest::list(&known))),
            );
        }
    }

    fn references(&mut self, refs: &[Reference], scope: &Scope<'_>) -> Vec<Dep> {
        refs.iter()
            .filter_map(|r| self.reference(r, scope))
            .collect()
    }

    fn reference(&mut self, r: &Reference, scope: &Scope<'_>) -> Option<Dep> {
        let seg = |i: usize| r.segments.get(i).map(String::as_str);
        match r.root() {
            root @ ("env" | "secrets") if self.planned && r.span.file == self.file.id => {
                self.push(
                    Diagnostic::error(
                        codes::PLAN_NOT_ALLOWED,
                        r.span,
                        format!("a planned step cannot read `{root}`"),
                    )
                    .with_hint(
                        "planned steps read `inputs`, `run` and the results of other planned steps",
                    ),
                );
                None
            }
            root if scope.event => {
                if !EVENT_ROOTS.contains(&root) {
                    self.unknown_variable(r, scope);
                }
                None
            }
            "inputs" => {
                let name = seg(1)?;
                if !self.spec.inputs.contains_key(name) {
                    let known: Vec<&str> =
                        self.spec.inputs.keys().map(|k| k.value.as_str()).collect();
                    self.push(
                        Diagnostic::error(
                            codes::UNKNOWN_INPUT,
                            r.span_of(2),
                            format!("unknown input `{name}`"),
                        )
                        .with_hint_opt(suggest::did_you_mean(name, known.iter().copied()))
                        .with_hint(if self.file.format == crate::source::Format::Toml {
                            format!("declare it under `[inputs]`, for example `{name} = {{ type = \"string\" }}`")
                        } else {
                            format!("declare it under `inputs:`, for example `{name}: {{ type: string }}`")
                        }),
                    );
                }
                None
            }
            "steps" => self.step_reference(r, scope),
            "secrets" if !scope.secrets => {
                self.push(
                    Diagnostic::error(codes::SECRET_IN_PROMPT, r.span, format!("secrets cannot be used in {}", scope.place))
                        .with_hint("secrets are usable only in tool arguments, HTTP headers and command environments, so that no prompt, log or report ever holds their value"),
                );
                None
            }
            "secrets" => {
                let name = seg(1)?;
                if !self.spec.secrets.iter().any(|s| s.value == name) {
                    let known: Vec<&str> =
                        self.spec.secrets.iter().map(|s| s.value.as_str()).collect();
                    self.push(
                        Diagnostic::error(
                            codes::UNKNOWN_SECRET,
                            r.span_of(2),
                            format!("unknown secret `{name}`"),
                        )
                        .with_hint_opt(suggest::did_you_mean(name, known.iter().copied()))
                        .with_hint(format!(
                            "declare it under `{}` (read from the environment variable `{name}`)",
                            self.syntax("secrets:", "secrets = [...]")
                        )),
                    );
                }
                None
            }
            "env" => None,
            "run" => {
                let field = seg(1)?;
                if !RUN_FIELDS.contains(&field) {
                    self.push(
                        Diagnostic::error(
                            codes::UNKNOWN_VARIABLE,
                            r.span_of(2),
                            format!("`run` has no field `{field}`"),
                        )
                        .with_hint_opt(suggest::did_you_mean(field, RUN_FIELDS.iter().copied()))
                        .with_hint(format!("`run` has {}", suggest::list(RUN_FIELDS))),
                    );
                }
                None
            }
            "item" | "index" if !scope.foreach => {
                self.push(
                    Diagnostic::error(
                        codes::ITEM_OUTSIDE_FOREACH,
                        r.span_of(1),
                        format!("`{}` is only defined in a step with `foreach`", r.root()),
                    )
                    .with_hint(self.syntax(
                        "add `foreach:` to this step, or read the value from `steps.<id>.output`",
                        "add `foreach` to this step, or read the value from `steps.<id>.output`",
                    )),
                );
                None
            }
            "item" | "index" => None,
            "matrix"
                if !scope
                    .params
                    .is_some_and(|p| p.iter().any(|n| n == "matrix")) =>
            {
                self.matrix_reference(r, scope);
                None
            }
            "args" if scope.params.is_some() => {
                let name = seg(1)?;
                let params = scope.params.unwrap_or_default();
                if !params.iter().any(|p| p == name) {
                    self.unknown_parameter(name, r.span_of(2), params);
                }
                None
            }
            root if scope.params.is_some_and(|p| p.iter().any(|n| n == root)) => None,
            root if scope.params.is_some()
                && !["steps", "secrets", "item", "index", "matrix"].contains(&root) =>
            {
                self.unknown_parameter(root, r.span_of(1), scope.params.unwrap_or_default());
                None
            }
            _ => {
                self.unknown_variable(r, scope);
                None
            }
        }
    }

    fn step_reference(&mut self, r: &Reference, scope: &Scope<'_>) -> Option<Dep> {
        let Some(table) = scope.steps else {
            self.push(
                Diagnostic::error(
                    codes::UNKNOWN_VARIABLE,
                    r.span_of(1),
                    format!("step results cannot be read in {}", scope.place),
                )
                .with_hint("pass the value in as an input or argument instead"),
            );
            return None;
        };
        let Some(id) = r.segments.get(1) else {
            self.push(
                Diagnostic::error(codes::DYNAMIC_STEP_REFERENCE, r.span_of(1), "steps must be referred to by name")
                    .with_hint("write `steps.<id>.output`; Archon needs to know every dependency before the run starts"),
            );
            return None;
        };
        let Some(entry) = table.entries.get(id) else {
            if !table.broken.contains(id) {
                let known: Vec<&str> = table.entries.keys().map(String::as_str).collect();
                self.push(
                    Diagnostic::error(
                        codes::UNKNOWN_STEP,
                        r.span_of(2),
                        format!("unknown step `{id}`"),
                    )
                    .with_hint_opt(suggest::did_you_mean(id, known.iter().copied()))
                    .with_hint_opt(
                        known
                            .is_empty()
                            .then(|| "there are no steps to refer to here".to_owned()),
                    ),
                );
            }
            return None;
        };
        if let Some(field) = r.segments.get(2) {
            if !STEP_FIELDS.contains(&field.as_str()) {
                self.push(
                    Diagnostic::error(
                        codes::UNKNOWN_STEP_FIELD,
                        r.span_of(3),
                        format!("step results have no field `{field}`"),
                    )
                    .with_hint_opt(suggest::did_you_mean(field, STEP_FIELDS.iter().copied()))
                    .with_hint(format!("a step result has {}", suggest::list(STEP_FIELDS))),
                );
            } else if field == "outputs"
                && let Some(name) = r.segments.get(3)
                && !entry.outputs.contains(name)
            {
                let known: Vec<&str> = entry.outputs.iter().map(String::as_str).collect();
                let d = Diagnostic::error(
                    codes::UNKNOWN_OUTPUT,
                    r.span_of(4),
                    format!("step `{id}` has no output named `{name}`"),
                )
                .with_hint_opt(suggest::did_you_mean(name, known.iter().copied()));
                let d = if known.is_empty() {
                    d.with_hint(format!(
                        "declare it under `outputs:` of step `{id}`, or read `steps.{id}.output`"
                    ))
                } else {
                    d.with_hint(format!("step `{id}` declares {}", suggest::list(&known)))
                };
                self.push(d);
            }
        }
        if scope.own_step == Some(id.as_str()) {
            return None;
        }
        Some(Dep {
            step: entry.index,
            span: r.span_of(2),
        })
    }

    pub fn unknown_parameter(&mut self, name: &str, span: Span, params: &[String]) {
        let known: Vec<&str> = params.iter().map(String::as_str).collect();
        let d = Diagnostic::error(
            codes::UNKNOWN_PARAMETER,
            span,
            format!("unknown parameter `{name}`"),
        )
        .with_hint_opt(suggest::did_you_mean(name, known.iter().copied()));
        let d = if known.is_empty() {
            d.with_hint("declare the tool's `parameters:` (a JSON Schema object with `properties`)")
        } else {
            d.with_hint(format!(
                "this tool's parameters are {}",
                suggest::list(&known)
            ))
        };
        self.push(d);
    }

    fn unknown_variable(&mut self, r: &Reference, scope: &Scope<'_>) {
        let roots = scope.roots();
        let name = r.root();
        let d = Diagnostic::error(
            codes::UNKNOWN_VARIABLE,
            r.span_of(1),
            format!("unknown variable `{name}`"),
        )
        .with_hint_opt(suggest::did_you_mean(name, roots.iter().copied()))
        .with_hint(format!(
            "in {}, templates can read {}",
            scope.place,
            suggest::list(&roots)
        ));
        self.push(d);
    }
}
