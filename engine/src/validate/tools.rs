//! Tool checks: declared tools, calls to tools (names and arguments), sub-workflow calls and recursion
//! through composite tools.

use std::borrow::Cow;

use serde_json::Value as Json;

use crate::diagnostic::{Diagnostic, codes};
use crate::source::Span;
use crate::spec::{Node, Pattern, Spanned, ToolDef};
use crate::tools::mcp::cache::CachedTools;
use crate::tools::{Registry, ToolRef, builtin};
use crate::validate::patterns::PatternKind;
use crate::validate::refs::{Dep, Scope, StepTable};
use crate::validate::steps::StepListScope;
use crate::validate::templates::is_template;
use crate::validate::{Checker, Validator, suggest};

impl Checker<'_> {
    pub(super) fn check_tools(&mut self, validator: &mut Validator) {
        for (name, def) in &self.spec.tools {
            self.check_tool_def(name, def, validator);
        }
        self.check_tool_recursion();
    }

    fn check_tool_def(&mut self, name: &Spanned<String>, def: &ToolDef, validator: &mut Validator) {
        let valid_name = name.value.len() <= 64
            && name.value.starts_with(|c: char| c.is_ascii_alphabetic())
            && name
                .value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            self.push(
                Diagnostic::error(codes::INVALID_NAME, name.span, format!("tool name `{}` is not valid", name.value))
                    .with_hint("tool names start with a letter and use letters, digits, `_` and `-` (at most 64), as LLM providers require"),
            );
        }
        self.check_labels(&def.runs_on);
        if builtin::get(&name.value).is_some() {
            self.push(
                Diagnostic::error(
                    codes::SHADOWED_BUILTIN,
                    name.span,
                    format!("tool `{}` has the name of a built-in tool", name.value),
                )
                .with_hint(format!("choose another name, such as `my_{}`", name.value)),
            );
        }
        let kinds: Vec<(&str, Span)> = [
            ("command", def.command.as_ref().map(|c| c.span)),
            ("http", def.http.as_ref().map(|h| h.span)),
            ("steps", def.steps.as_ref().map(|s| s.span)),
            ("workflow", def.workflow.as_ref().map(|w| w.span)),
            ("mcp", def.mcp.as_ref().map(|m| m.span)),
        ]
        .into_iter()
        .filter_map(|(k, s)| s.map(|s| (k, s)))
        .collect();
        match kinds.as_slice() {
            [] => self.push(
                Diagnostic::error(
                    codes::MISSING_TOOL_KIND,
                    name.span,
                    format!("tool `{}` does not say what it runs", name.value),
                )
                .with_hint("add one of `command`, `http`, `steps`, `workflow` or `mcp`"),
            ),
            [(first, first_span), (second, span), ..] => self.push(
                Diagnostic::error(
                    codes::CONFLICTING_TOOL_KINDS,
                    *span,
                    format!("tool `{}` has both `{first}` and `{second}`", name.value),
                )
                .with_label(*first_span, format!("`{first}` given here"))
                .with_hint(
                    "a tool is exactly one of `command`, `http`, `steps`, `workflow` or `mcp`",
                ),
            ),
            _ => {}
        }
        let params: Vec<String> = match &def.parameters {
            Some(schema) => {
                self.check_json_schema(schema, "tool `parameters`");
                if schema.get("type").and_then(Node::as_str) != Some("object") {
                    self.push(
                        Diagnostic::error(
                            codes::INVALID_JSON_SCHEMA,
                            schema.span,
                            "tool `parameters` must be an object schema",
                        )
                        .with_hint(self.syntax(
                            "write `type: object` with `properties:` for each argument",
                            "write `type = \"object\"` with a `properties` table for each argument",
                        )),
                    );
                }
                schema
                    .get("properties")
                    .and_then(Node::as_map)
                    .map(|p| p.iter().map(|(k, _)| k.name.clone()).collect())
                    .unwrap_or_default()
            }
            None => Vec::new(),
        };
        let scope = Scope {
            params: Some(&params),
            ..Scope::new("a tool definition")
        }
        .secrets(true);
        if let Some(command) = &def.command {
            if command.value.is_empty() {
                self.push(Diagnostic::error(
                    codes::INVALID_VALUE,
                    command.span,
                    "`command` needs at least the program to run",
                ));
            }
            for arg in &command.value {
                self.template(arg, &scope);
            }
        }
        if let Some(http) = &def.http {
            self.template(&http.url, &scope);
            for value in http.headers.values() {
                self.template(value, &scope);
            }
            if let Some(json) = &http.json {
                self.value(json, &scope);
            }
            if let Some(body) = &http.body {
                self.template(body, &scope);
            }
        }
        for value in def.env.values() {
            self.template(value, &scope);
        }
        for t in [&def.cwd, &def.stdin].into_iter().flatten() {
            self.template(t, &scope);
        }
        if def.command.is_none() {
            let command_only = [
                ("output", def.output.as_ref().map(|o| o.span)),
                ("cwd", def.cwd.as_ref().map(|c| c.span)),
                ("stdin", def.stdin.as_ref().map(|s| s.span)),
                ("env", def.env.keys().next().map(|k| k.span)),
                // Not spanned: the tool's name stands for it.
                (
                    "ok_exit_codes",
                    def.ok_exit_codes.as_ref().map(|_| name.span),
                ),
            ];
            for (field, span) in command_only.iter().filter_map(|(f, s)| s.map(|s| (*f, s))) {
                let inside_mcp = def.mcp.is_some() && matches!(field, "env" | "cwd");
                self.push(
                    Diagnostic::warning(
                        codes::INEFFECTIVE_FIELD,
                        span,
                        format!("`{field}` applies only to `command` tools"),
                    )
                    .with_hint_opt(inside_mcp.then(|| {
                        format!("an MCP server's `{field}` goes inside `mcp`, beside its `command`")
                    })),
                );
            }
        }
        if let (Some(_), Some(parameters)) = (&def.mcp, &def.parameters) {
            self.push(
                Diagnostic::warning(
                    codes::INEFFECTIVE_FIELD,
                    parameters.span,
                    "`parameters` has no effect on an MCP server",
                )
                .with_hint(
                    "each of the server's tools brings its own input schema, from `tools/list`",
                ),
            );
        }
        if let Some(steps) = &def.steps {
            let list = StepListScope {
                params: Some(&params),
                raw_ids: &[],
            };
            let graph = self.check_step_list(&steps.value, list, validator);
            self.composites.insert(
                name.value.clone(),
                crate::workflow::StepGraph {
                    dependencies: graph.dependencies,
                    order: graph.order,
                },
            );
            if let Some(result) = &def.result {
                let table = StepTable::new(&steps.value, &[]);
                // The result becomes step output that prompts and reports can see: no secrets in it.
                let result_scope = Scope {
                    place: "a tool result",
                    ..scope
                }
                .steps(&table)
                .secrets(false);
                self.value(result, &result_scope);
            }
        } else if let Some(result) = &def.result {
            self.push(Diagnostic::warning(
                codes::INEFFECTIVE_FIELD,
                result.span,
                "`result` applies only to composite tools (`steps`)",
            ));
        }
        if let Some(workflow) = &def.workflow {
            self.load_sub_workflow(workflow, validator);
        }
        if let Some(timeout) = &def.timeout {
            self.check_duration(timeout);
        }
    }

    /// A composite tool may not call itself, directly or through other composite tools.
    fn check_tool_recursion(&mut self) {
        let names: Vec<&str> = self.spec.tools.keys().map(|k| k.value.as_str()).collect();
        let calls: Vec<Vec<(usize, Span)>> = self
            .spec
            .tools
            .values()
            .map(|def| {
                def.steps
                    .iter()
                    .flat_map(|s| s.value.iter())
                    .flat_map(|step| {
                        step.tool
                            .iter()
                            .chain(step.fallback.iter().flat_map(|f| f.tool.iter()))
                    })
                    .filter_map(|t| {
                        names
                            .iter()
                            .position(|n| *n == t.value)
                            .map(|i| (i, t.span))
                    })
                    .collect()
            })
            .collect();
        let mut reported = vec![false; names.len()];
        for start in 0..names.len() {
            if reported[start] {
                continue;
            }
            if let Some(path) = tool_cycle(start, &calls) {
                for &(i, _) in &path {
                    reported[i] = true;
                }
                let chain: Vec<String> = path
                    .iter()
                    .map(|(i, _)| format!("`{}`", names[*i]))
                    .chain(std::iter::once(format!("`{}`", names[start])))
                    .collect();
                let (_, closing) = path[path.len() - 1];
                self.push(
                    Diagnostic::error(
                        codes::RECURSIVE_TOOL,
                        closing,
                        format!(
                            "composite tool `{}` includes itself: {}",
                            names[start],
                            chain.join(" → ")
                        ),
                    )
                    .with_hint(
                        "a composite tool cannot call itself, directly or through other tools",
                    ),
                );
            }
        }
    }

    /// Checks a `tool:` call and its `with:` arguments; returns the dependencies of the arguments.
    pub(super) fn check_tool_call(
        &mut self,
        tool: &Spanned<String>,
        args: Option<&Node>,
        scope: &Scope<'_>,
    ) -> Vec<Dep> {
        let name = tool.value.as_str();
        let tools = self.tools;
        let schema: Option<Cow<'_, Json>> = if let Some(entry) = tools.get(name) {
            if self.spec.tools.get(name).is_some_and(|d| d.mcp.is_some()) {
                self.push(
                    Diagnostic::error(
                        codes::UNKNOWN_TOOL,
                        tool.span,
                        format!("`{name}` is an MCP server, not a tool"),
                    )
                    .with_hint(format!("call one of its tools as `{name}.<tool>`")),
                );
            }
            (!matches!(entry.kind, ToolRef::Mcp)).then_some(Cow::Borrowed(&entry.parameters))
        } else if let Some((server, tool_name, def)) = name
            .split_once('.')
            .and_then(|(server, tool_name)| Some((server, tool_name, self.spec.tools.get(server)?)))
            .filter(|(_, _, d)| d.mcp.is_some())
        {
            let exposed = def.mcp.as_ref().and_then(|m| m.tools.as_ref());
            if let Some(exposed) =
                exposed.filter(|list| !list.iter().any(|t| t.value.matches(tool_name)))
            {
                let known: Vec<&str> = exposed.iter().map(|t| t.value.as_str()).collect();
                self.push(
                    Diagnostic::error(
                        codes::UNKNOWN_TOOL,
                        tool.span,
                        format!("MCP tool `{tool_name}` is not in the server's `tools` list"),
                    )
                    .with_hint_opt(suggest::did_you_mean(tool_name, known.iter().copied())),
                );
                None
            } else if let Some(listed) = self.mcp_listed(server) {
                match listed.tools.iter().find(|t| t.name == tool_name) {
                    Some(found) => Some(Cow::Owned(found.input_schema.clone())),
                    None => {
                        self.unlisted_mcp_tool(tool.span, server, tool_name, &listed);
                        None
                    }
                }
            } else {
                None
            }
        } else {
            let names = tool_names(tools);
            self.push(
                Diagnostic::error(
                    codes::UNKNOWN_TOOL,
                    tool.span,
                    format!("unknown tool `{name}`"),
                )
                .with_hint_opt(suggest::did_you_mean(name, names.iter().copied()))
                .with_hint(self.syntax("declare it under `tools:`, or use a built-in tool (see docs/tools.md)", "declare it in a `[tools.<name>]` table, or use a built-in tool (see docs/tools.md)")),
            );
            None
        };
        if let Some(schema) = schema {
            self.check_arguments(tool, args, &schema);
        }
        if let (Some(ToolRef::Builtin(builtin)), Some(args)) =
            (tools.get(name).map(|t| t.kind), args)
        {
            for value in builtin.durations.iter().filter_map(|key| args.get(key)) {
                if let Some(text) = value.as_str().filter(|t| !is_template(t)) {
                    self.check_duration_text(text, value.span);
                }
            }
        }
        if name == "shell" {
            self.check_shell_command(args);
        }
        args.map(|a| self.value(a, scope)).unwrap_or_default()
    }

    /// Warns about a `shell` command line built from values the spec does not fix (inputs, step outputs,
    /// items, tool arguments): the shell parses whatever they hold, so `; rm -rf ~` in an input runs.
    fn check_shell_command(&mut self, args: Option<&Node>) {
        let Some(command) = args.and_then(|a| a.get("command")) else {
            return;
        };
        let Some(text) = command.as_str() else {
            return;
        };
        let Ok(references) = self.analyzer.template(self.file, command.span, text) else {
            return;
        };
        // Values the spec's author or the machine's owner fixed; anything else may come from outside.
        let fixed = ["run", "env", "secrets", "index", "loop"];
        // A value quoted by `| shell_quote` is one word whatever it holds.
        let unquoted = crate::validate::templates::unquoted_tags(text);
        let Some(first) = references.iter().find(|r| {
            !fixed.contains(&r.root())
                && unquoted
                    .iter()
                    .any(|tag| crate::validate::templates::mentions(tag, r.root()))
        }) else {
            return;
        };
        let path = first.segments.join(".");
        self.push(
            Diagnostic::warning(
                codes::SHELL_TEMPLATE,
                first.span,
                format!("`{path}` is pasted into a shell command line, where the shell parses whatever it holds"),
            )
            .with_hint(if self.file.format == crate::source::Format::Toml {
                format!(
                    "quote it as one word: `{{{{ {path} | shell_quote }}}}`, or pass it as an argument: `tool = \"exec\"` with `argv = [\"sh\", \"-c\", 'your command \"$1\"', \"sh\", \"{{{{ {path} }}}}\"]`"
                )
            } else {
                format!(
                    "quote it as one word: `{{{{ {path} | shell_quote }}}}`, or pass it as an argument: `tool: exec` with `argv: [sh, -c, 'your command \"$1\"', sh, \"{{{{ {path} }}}}\"]`"
                )
            }),
        );
    }

    fn check_arguments(&mut self, tool: &Spanned<String>, args: Option<&Node>, schema: &Json) {
        let Some(properties) = schema.get("properties").and_then(Json::as_object) else {
            return;
        };
        let strict = !matches!(
            schema.get("additionalProperties"),
            Some(Json::Bool(true) | Json::Object(_))
        );
        let entries = args.and_then(Node::as_map).unwrap_or_default();
        for (key, value) in entries {
            match properties.get(&key.name) {
                Some(prop) => self.check_literal_argument(&tool.value, &key.name, value, prop),
                None if strict => {
                    let names: Vec<&str> = properties.keys().map(String::as_str).collect();
                    self.push(
                        Diagnostic::error(
                            codes::UNKNOWN_ARGUMENT,
                            key.span,
                            format!("tool `{}` has no argument `{}`", tool.value, key.name),
                        )
                        .with_hint_opt(suggest::did_you_mean(&key.name, names.iter().copied()))
                        .with_hint(format!("its arguments are {}", suggest::list(&names))),
                    );
                }
                None => {}
            }
        }
        let required = schema
            .get("required")
            .and_then(Json::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for name in required.iter().filter_map(Json::as_str) {
            if !entries.iter().any(|(k, _)| k.name == name) {
                self.push(
                    Diagnostic::error(
                        codes::MISSING_ARGUMENT,
                        tool.span,
                        format!("tool `{}` needs the argument `{name}`", tool.value),
                    )
                    .with_hint(format!(
                        "add it under `with:`, for example `with: {{ {name}: ... }}`"
                    )),
                );
            }
        }
    }

    /// Arguments written without templates are checked against their schema now rather than at run time.
    fn check_literal_argument(&mut self, tool: &str, name: &str, value: &Node, schema: &Json) {
        let mut templated = false;
        value.for_each_str(&mut |s, _| templated |= is_template(s));
        if templated {
            return;
        }
        let key = (tool.to_owned(), name.to_owned());
        let validator = self
            .argument_validators
            .entry(key)
            .or_insert_with(|| jsonschema::validator_for(schema).ok());
        let Some(validator) = validator else {
            return;
        };
        let instance = value.to_json();
        let error = validator
            .iter_errors(&instance)
            .next()
            .map(|e| (e.instance_path().to_string(), e.masked().to_string()));
        if let Some((path, error)) = error {
            let at = value
                .at_path(&pointer_segments(&path))
                .map_or(value.span, |n| n.span);
            let location = if path.is_empty() {
                format!("`{name}`")
            } else {
                format!("`{name}{}`", path.replace('/', "."))
            };
            self.push(Diagnostic::error(
                codes::INVALID_ARGUMENT,
                at,
                format!("argument {location} of tool `{tool}` is invalid: {error}"),
            ));
        }
    }

    /// Checks a `workflow:` call: the file, recursion and the inputs passed in `with:`.
    pub(super) fn check_workflow_call(
        &mut self,
        workflow: &Spanned<String>,
        args: Option<&Node>,
        scope: &Scope<'_>,
        validator: &mut Validator,
    ) -> Vec<Dep> {
        if let Some(sub) = self.load_sub_workflow(workflow, validator) {
            let entries = args.and_then(Node::as_map).unwrap_or_default();
            let names: Vec<&str> = sub.inputs.iter().map(|(n, _)| n.as_str()).collect();
            for (key, _) in entries {
                if !names.contains(&key.name.as_str()) {
                    self.push(
                        Diagnostic::error(
                            codes::UNKNOWN_ARGUMENT,
                            key.span,
                            format!(
                                "sub-workflow `{}` has no input `{}`",
                                workflow.value, key.name
                            ),
                        )
                        .with_hint_opt(suggest::did_you_mean(&key.name, names.iter().copied()))
                        .with_hint_opt(
                            (!names.is_empty())
                                .then(|| format!("its inputs are {}", suggest::list(&names))),
                        ),
                    );
                }
            }
            for (name, required) in &sub.inputs {
                if *required && !entries.iter().any(|(k, _)| k.name == *name) {
                    self.push(
                        Diagnostic::error(
                            codes::MISSING_INPUT,
                            workflow.span,
                            format!("sub-workflow `{}` needs the input `{name}`", workflow.value),
                        )
                        .with_hint(format!(
                            "pass it under `with:`, for example `with: {{ {name}: ... }}`"
                        )),
                    );
                }
            }
        }
        args.map(|a| self.value(a, scope)).unwrap_or_default()
    }

    /// Checks a tool name or glob in an LLM step's, agent's or rule's `tools`.
    pub(super) fn check_tool_pattern(&mut self, pattern: &Spanned<Pattern>) {
        self.check_tool_pattern_with(pattern, &[]);
    }

    /// A rule's `match.tool`: it may also name the tools that delegate to an agent (`delegate.<agent>`).
    pub(super) fn check_rule_tool_pattern(&mut self, pattern: &Spanned<Pattern>) {
        let delegations: Vec<String> = (self.spec.agents.values())
            .flat_map(|a| a.delegates.iter())
            .map(|d| format!("delegate.{}", d.name()))
            .collect();
        self.check_tool_pattern_with(pattern, &delegations);
    }

    /// Every tool name a pattern may match here (with `extra`), and whether an MCP server without a
    /// kept list has more.
    fn known_tool_names(&self, extra: &[String]) -> (Vec<String>, bool) {
        // MCP servers list their tools when they run: `server.tool` names and globs are checked against
        // the lists `archon mcp list` kept, and cannot be checked for a server with no list.
        let (listed, some_unlisted) = self.mcp_listed_names();
        let mut names: Vec<String> = tool_names(self.tools)
            .into_iter()
            .map(str::to_owned)
            .collect();
        names.extend(extra.iter().cloned());
        names.extend(listed);
        // The tools memory gives agents with `memory` (all of them) or `notes` (`note` and `notes`).
        let agents = self.spec.agents.values();
        if agents.clone().any(|a| a.memory == Some(true)) {
            names.extend(crate::tools::MEMORY_TOOLS.iter().map(|n| (*n).to_owned()));
        } else if agents.clone().any(|a| a.notes == Some(true)) {
            names.extend(crate::tools::NOTE_TOOLS.iter().map(|n| (*n).to_owned()));
        }
        // The skill tools agents are offered when they have skills (rules may match them).
        if self.skills.any() {
            names.extend(crate::skills::TOOL_NAMES.iter().map(|n| (*n).to_owned()));
        }
        (names, some_unlisted)
    }

    /// Whether `pattern` names a tool of an MCP server whose tools are not known until it runs.
    fn unlisted_mcp_tool_name(&self, pattern: &str) -> bool {
        pattern.split_once('.').is_some_and(|(server, _)| {
            self.spec.tools.get(server).is_some_and(|d| d.mcp.is_some())
                && self.mcp_listed(server).is_none()
        })
    }

    /// The tool names here when `pattern` (a name or glob in a skill's `allowed-tools`) matches none
    /// of them; `None` when it matches one, or may match a tool only known at run time.
    pub(super) fn matches_no_tool(&self, pattern: &Pattern) -> Option<Vec<String>> {
        let (names, some_unlisted) = self.known_tool_names(&[]);
        let written = pattern.as_str();
        if self.unlisted_mcp_tool_name(written)
            || (some_unlisted && crate::validate::patterns::is_glob(written))
            || names.iter().any(|n| pattern.matches(n))
        {
            return None;
        }
        Some(names)
    }

    fn check_tool_pattern_with(&mut self, pattern: &Spanned<Pattern>, extra: &[String]) {
        let (known, some_unlisted) = self.known_tool_names(extra);
        let names: Vec<&str> = known.iter().map(String::as_str).collect();
        let mcp_tool = self.unlisted_mcp_tool_name(pattern.value.as_str());
        if let Some((server, tool_name)) = pattern.value.as_str().split_once('.')
            && !crate::validate::patterns::is_glob(tool_name)
            && let Some(listed) = self.mcp_listed(server)
            && !listed.tools.iter().any(|t| t.name == tool_name)
        {
            self.unlisted_mcp_tool(pattern.span, server, tool_name, &listed);
            return;
        }
        let kind = PatternKind {
            what: "tool",
            code: codes::UNKNOWN_TOOL,
            known_elsewhere: mcp_tool,
            open_ended: some_unlisted,
            hint: Some(self.syntax("declare it under `tools:`, or use a built-in tool (see docs/tools.md)", "declare it in a `[tools.<name>]` table, or use a built-in tool (see docs/tools.md)")),
        };
        self.check_name_pattern(pattern, &names, &kind);
    }
}

impl Checker<'_> {
    /// `server.tool` names a tool the server's kept list does not have.
    fn unlisted_mcp_tool(&mut self, at: Span, server: &str, tool: &str, listed: &CachedTools) {
        let names: Vec<&str> = listed.tools.iter().map(|t| t.name.as_str()).collect();
        self.push(
            Diagnostic::error(
                codes::UNKNOWN_TOOL,
                at,
                format!("MCP server `{server}` has no tool `{tool}`"),
            )
            .with_hint_opt(suggest::did_you_mean(tool, names.iter().copied()))
            .with_hint(format!(
                "checked against the tools it listed {}; run `archon mcp list {}` again if it changed",
                crate::tools::mcp::cache::listed_when(listed.listed_at),
                self.file.path.display()
            )),
        );
    }
}

/// Every tool name a step may call: built-ins, then declared tools.
fn tool_names(tools: &Registry) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

/// A cycle of composite tool calls through `start`: the calls along it, each with where it is written.
fn tool_cycle(start: usize, calls: &[Vec<(usize, Span)>]) -> Option<Vec<(usize, Span)>> {
    let mut path: Vec<(usize, Span)> = Vec::new();
    let mut visited = vec![false; calls.len()];
    let mut stack = vec![(start, calls[start].iter())];
    visited[start] = true;
    while let Some((from, iter)) = stack.last_mut() {
        let from = *from;
        match iter.next() {
            Some(&(next, span)) => {
                if next == start {
                    path.push((from, span));
                    return Some(path);
                }
                if !visited[next] {
                    visited[next] = true;
                    path.push((from, span));
                    stack.push((next, calls[next].iter()));
                }
            }
            None => {
                stack.pop();
                path.pop();
            }
        }
    }
    None
}

/// "/a/0/b" -> [Key(a), Index(0), Key(b)]
pub(super) fn pointer_segments(pointer: &str) -> Vec<crate::spec::PathSegment> {
    use crate::spec::PathSegment;
    pointer
        .split('/')
        .skip(1)
        .map(|s| {
            let s = s.replace("~1", "/").replace("~0", "~");
            match s.parse::<usize>() {
                Ok(i) => PathSegment::Index(i),
                Err(_) => PathSegment::Key(s),
            }
        })
        .collect()
}
