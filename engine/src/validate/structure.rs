//! The structural check: walks a document tree alongside the workflow JSON Schema and reports every
//! unknown key, missing key, wrong type and invalid enum value, with spans and suggestions.
//!
//! It also returns a pruned copy of the tree, without the values it reported, so that the semantic checks
//! can still run on everything else and the user hears about all problems at once.

use std::borrow::Cow;

use serde_json::Value as Json;

use crate::diagnostic::{Bounded, Diagnostic, codes};
use crate::spec::node::{Key, Node, NodeKind};
use crate::validate::shape::{Additional, Shape, ShapeId, Shapes, Typed};
use crate::validate::suggest;

/// Checks `root` against the workflow schema. Returns the tree without the values it reported (borrowed
/// when nothing was reported), or None if the root itself is unusable. `toml`: the file is TOML, so hints
/// are written in TOML.
pub fn check<'n>(
    root: &'n Node,
    toml: bool,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Cow<'n, Node>> {
    let shapes = Shapes::workflow();
    let cx = Context {
        def: "Spec",
        key: None,
        parent: None,
        list: None,
        named: false,
    };
    let mut found = Bounded::default();
    let checked = Walker {
        shapes,
        diagnostics: Some(&mut found),
        prune: false,
        toml,
    }
    .check(root, shapes.root, &cx);
    let clean = found.is_empty();
    diagnostics.extend(found.into_vec());
    checked?;
    if clean {
        return Some(Cow::Borrowed(root));
    }
    // Something was reported: walk again, this time building the pruned copy (and reporting nothing).
    Walker {
        shapes,
        diagnostics: None,
        prune: true,
        toml,
    }
    .check(root, shapes.root, &cx)
    .map(Cow::Owned)
}

struct Walker<'a> {
    shapes: &'static Shapes,
    /// Where problems go; none on the second walk, which only prunes.
    diagnostics: Option<&'a mut Bounded>,
    /// Build the pruned copy; the first, checking-only walk returns cheap placeholders instead.
    prune: bool,
    /// The file is TOML: hints show TOML.
    toml: bool,
}

/// Where a value sits: the schema definition being checked and the key it was found under.
#[derive(Clone, Copy)]
struct Context<'a> {
    def: &'a str,
    key: Option<&'a str>,
    /// The key of the mapping holding `key` (`retry` for `on`), unless that mapping is a list item.
    parent: Option<&'a str>,
    /// For an item of a list, the key of the list (`key` is then `None`).
    list: Option<&'a str>,
    /// `key` is a name the user chose (a provider's, a tool's), not one of the format's keys.
    named: bool,
}

impl Context<'_> {
    /// How the value is named in messages: "`timeout`" or "the workflow".
    fn subject(&self) -> String {
        match self.key {
            Some(key) => format!("`{key}`"),
            None => format!("the {}", noun(self.def)),
        }
    }

    /// Where a value is, for messages about a value (not a key): "in `retry.on`" for an item of that list,
    /// "for `on_error`" for a value under a key.
    fn place(&self) -> String {
        let (preposition, key) = match (self.key, self.list) {
            (Some(key), _) => ("for", key),
            (None, Some(list)) => ("in", list),
            (None, None) => return format!("for the {}", noun(self.def)),
        };
        match self.parent {
            Some(parent) => format!("{preposition} `{parent}.{key}`"),
            None => format!("{preposition} `{key}`"),
        }
    }
}

/// A readable noun for a schema definition.
fn noun(def: &str) -> &'static str {
    match def {
        "Spec" => "workflow",
        "Step" => "step",
        "Fallback" => "fallback",
        "Retry" => "retry policy",
        "LlmConfig" => "`llm` section",
        "ProviderDef" => "provider",
        "LlmBudget" => "budget",
        "Pricing" => "pricing",
        "MockTurn" => "mock turn",
        "MockToolCall" => "mock tool call",
        "ToolDef" => "tool definition",
        "HttpTool" => "`http` tool",
        "McpServer" => "`mcp` server",
        "AgentDef" => "agent",
        "MemoryConfig" => "`memory` section",
        "Rule" => "rule",
        "RuleMatch" => "rule `match`",
        "Defaults" => "`defaults` section",
        "CacheOptions" => "`cache` setting",
        _ => "value",
    }
}

/// The diagnostic code for a value outside an enum, by the enum's definition.
fn enum_code(def: &str) -> &'static str {
    match def {
        "Trigger" => codes::UNKNOWN_TRIGGER,
        "Action" => codes::UNKNOWN_ACTION,
        "ProviderKind" => codes::UNKNOWN_PROVIDER_KIND,
        _ => codes::INVALID_VALUE,
    }
}

impl Walker<'_> {
    fn report(&mut self, diagnostic: Diagnostic) {
        if let Some(found) = self.diagnostics.as_deref_mut() {
            found.push(diagnostic);
        }
    }

    /// The value itself, when building the pruned copy; a placeholder otherwise.
    fn keep(&self, node: &Node) -> Node {
        if self.prune {
            node.clone()
        } else {
            Node::new(node.span, NodeKind::Null)
        }
    }

    fn check(&mut self, node: &Node, id: ShapeId, cx: &Context<'_>) -> Option<Node> {
        let shapes = self.shapes;
        if let Some(values) = &shapes.enums[id] {
            let def = match &shapes.nodes[id] {
                Shape::Named { def, .. } => def.as_str(),
                _ => cx.def,
            };
            return self.check_enum(node, values, &Context { def, ..*cx });
        }
        match &shapes.nodes[id] {
            Shape::Any => Some(self.keep(node)),
            Shape::Never => {
                self.report(Diagnostic::error(
                    codes::UNKNOWN_KEY,
                    node.span,
                    format!("{} is not allowed here", cx.subject()),
                ));
                None
            }
            Shape::Named { def, inner } => self.check(node, *inner, &Context { def, ..*cx }),
            Shape::Enum(values) => self.check_enum(node, values, cx),
            Shape::Union(branches) => {
                match branches.iter().find(|b| accepts(&shapes.types[**b], node)) {
                    Some(branch) => self.check(node, *branch, cx),
                    None => {
                        let mut expected: Vec<&str> = Vec::new();
                        for t in branches.iter().flat_map(|b| &shapes.types[*b]) {
                            if !expected.contains(t) {
                                expected.push(t);
                            }
                        }
                        self.wrong_type(node, &expected, cx);
                        None
                    }
                }
            }
            Shape::Typed(typed) => {
                if !accepts(&typed.types, node) {
                    self.wrong_type(node, &typed.types, cx);
                    return None;
                }
                match &node.kind {
                    NodeKind::Map(entries) => self.check_object(node, entries, typed, cx),
                    NodeKind::Seq(items) => {
                        let Some(item_shape) = typed.items else {
                            return Some(self.keep(node));
                        };
                        let prune = self.prune;
                        let item_cx = Context {
                            def: cx.def,
                            key: None,
                            parent: cx.parent,
                            list: cx.key,
                            named: false,
                        };
                        let kept: Vec<Node> = items
                            .iter()
                            .filter_map(|item| self.check(item, item_shape, &item_cx))
                            .filter(|_| prune)
                            .collect();
                        Some(Node::new(node.span, NodeKind::Seq(kept)))
                    }
                    NodeKind::Int(i) => self.check_integer(node, *i, typed, cx),
                    _ => Some(self.keep(node)),
                }
            }
        }
    }

    fn check_object(
        &mut self,
        node: &Node,
        entries: &[(Key, Node)],
        typed: &Typed,
        cx: &Context<'_>,
    ) -> Option<Node> {
        let mut kept = Vec::with_capacity(if self.prune { entries.len() } else { 0 });
        let mut broken = false;
        // The keys an unknown key may have meant: those allowed here and not written, found once per
        // mapping (a mapping of many unknown keys was quadratic).
        let mut candidates = None;
        for (key, value) in entries {
            let mut named = false;
            let child = match typed.properties.iter().find(|(name, _)| *name == key.name) {
                Some((_, id)) => *id,
                None => match typed.additional {
                    Additional::Denied => {
                        let candidates = candidates.get_or_insert_with(|| {
                            let present = |name: &str| entries.iter().any(|(k, _)| k.name == name);
                            (typed.properties.iter())
                                .map(|(name, _)| name.as_str())
                                .filter(|k| !present(k))
                                .collect::<Vec<&str>>()
                        });
                        self.unknown_key(key, candidates, cx);
                        continue;
                    }
                    Additional::Schema(id) => {
                        named = true;
                        id
                    }
                    Additional::Allowed => {
                        if self.prune {
                            kept.push((key.clone(), value.clone()));
                        }
                        continue;
                    }
                },
            };
            let child_cx = Context {
                def: cx.def,
                key: Some(&key.name),
                // A list item's keys are named alone (`on_error` in a step, not `steps.on_error`).
                parent: if cx.list.is_some() || cx.named {
                    None
                } else {
                    cx.key
                },
                list: None,
                named,
            };
            match self.check(value, child, &child_cx) {
                Some(v) if self.prune => kept.push((key.clone(), v)),
                Some(_) => {}
                None if typed.required.contains(&key.name) => broken = true,
                None => {}
            }
        }
        for name in &typed.required {
            if !entries.iter().any(|(k, _)| k.name == *name) {
                let at = entries.first().map_or(node.span, |(k, _)| k.span);
                self.report(
                    Diagnostic::error(
                        codes::MISSING_KEY,
                        at,
                        format!(
                            "{} is missing the required key `{name}`",
                            article(noun(cx.def))
                        ),
                    )
                    .with_hint(missing_key_hint(cx.def, name, self.toml)),
                );
                broken = true;
            }
        }
        (!broken).then(|| Node::new(node.span, NodeKind::Map(kept)))
    }

    fn unknown_key(&mut self, key: &Key, candidates: &[&str], cx: &Context<'_>) {
        let mut d = Diagnostic::error(
            codes::UNKNOWN_KEY,
            key.span,
            format!("unknown key `{}` in {}", key.name, article(noun(cx.def))),
        );
        // In TOML, every key after a `[steps.fallback]` header belongs to the fallback, up to the next
        // header: a step's key written there lands in the fallback.
        if self.toml && cx.def == "Fallback" && step_keys().contains(&key.name) {
            self.report(d.with_hint(toml_scope_hint(&key.name)));
            return;
        }
        d = match suggest::did_you_mean(&key.name, candidates.iter().copied()) {
            Some(hint) => d.with_hint(hint),
            None if !candidates.is_empty() && candidates.len() <= 12 => {
                d.with_hint(format!("valid keys here: {}", suggest::list(candidates)))
            }
            None => d.with_hint("see docs/spec.md for the keys this section accepts"),
        };
        self.report(d);
    }

    fn check_enum(&mut self, node: &Node, values: &[Json], cx: &Context<'_>) -> Option<Node> {
        let json = node.to_json();
        if values.contains(&json) {
            return Some(self.keep(node));
        }
        // A value spelled as a number (`429` in `retry.on`) is that value, as YAML would not quote it.
        if let NodeKind::Int(n) = node.kind
            && values.contains(&Json::String(n.to_string()))
        {
            return Some(self.keep(node));
        }
        let names: Vec<&str> = values.iter().filter_map(|v| v.as_str()).collect();
        let what = match cx.def {
            "Trigger" => "trigger",
            "Action" => "action",
            "ProviderKind" => "provider kind",
            _ => "value",
        };
        // A scalar is shown as written (`503`, `true`); a mapping or a list by its type.
        let shown = match &node.kind {
            NodeKind::Str(s) => format!("`{s}`"),
            NodeKind::Map(_) | NodeKind::Seq(_) => format!("a {}", node.type_name()),
            _ => format!("`{}`", node.to_json()),
        };
        let mut d = Diagnostic::error(
            enum_code(cx.def),
            node.span,
            format!("unknown {what} {shown} {}", cx.place()),
        );
        if let Some(s) = node.as_str() {
            d = d.with_hint_opt(suggest::did_you_mean(s, names.iter().copied()));
        }
        self.report(d.with_hint(format!("expected one of {}", suggest::list(&names))));
        None
    }

    fn check_integer(
        &mut self,
        node: &Node,
        value: i64,
        typed: &Typed,
        cx: &Context<'_>,
    ) -> Option<Node> {
        let (min, max) = (typed.min, typed.max);
        if value < min || value > max {
            let range = if max == i64::MAX {
                format!("at least {min}")
            } else {
                format!("between {min} and {max}")
            };
            self.report(Diagnostic::error(
                codes::INVALID_VALUE,
                node.span,
                format!("{} must be {range}, found {value}", cx.subject()),
            ));
            return None;
        }
        Some(self.keep(node))
    }

    fn wrong_type(&mut self, node: &Node, expected: &[&str], cx: &Context<'_>) {
        let expected: Vec<&str> = expected.iter().copied().filter(|t| *t != "null").collect();
        let wanted = match expected.as_slice() {
            [] => "null".to_owned(),
            [one] => article(one),
            many => many
                .iter()
                .map(|t| article(t))
                .collect::<Vec<_>>()
                .join(" or "),
        };
        let mut d = Diagnostic::error(
            codes::WRONG_TYPE,
            node.span,
            format!(
                "{} must be {wanted}, found {}",
                cx.subject(),
                node.type_name()
            ),
        );
        if let Some(hint) = type_hint(cx.key, &expected, node, self.toml) {
            d = d.with_hint(hint);
        }
        self.report(d);
    }
}

/// Whether a value's type is among `types` (empty: any type).
fn accepts(types: &[&str], node: &Node) -> bool {
    types.is_empty() || types.iter().any(|t| type_accepts(t, node))
}

fn type_accepts(ty: &str, node: &Node) -> bool {
    match (ty, &node.kind) {
        ("null", NodeKind::Null)
        | ("boolean", NodeKind::Bool(_))
        | ("integer", NodeKind::Int(_))
        | ("number", NodeKind::Int(_) | NodeKind::Float(_))
        | ("string", NodeKind::Str(_))
        | ("array", NodeKind::Seq(_))
        | ("object", NodeKind::Map(_)) => true,
        ("integer", NodeKind::Float(f)) => f.fract() == 0.0 && f.is_finite(),
        _ => false,
    }
}

fn article(noun: &str) -> String {
    let an = matches!(
        noun.trim_start_matches('`').chars().next(),
        Some('a' | 'e' | 'i' | 'o' | 'u')
    );
    format!("{} {noun}", if an { "an" } else { "a" })
}

fn type_hint(key: Option<&str>, expected: &[&str], node: &Node, toml: bool) -> Option<String> {
    let is_duration = matches!(key, Some("timeout" | "delay" | "max_delay"));
    match (expected, &node.kind) {
        (["string"], NodeKind::Int(_) | NodeKind::Float(_)) if is_duration && toml => {
            Some(format!(
                "durations are strings with a unit, such as `\"{}s\"` or `\"500ms\"`",
                node.to_json()
            ))
        }
        (["string"], NodeKind::Int(_) | NodeKind::Float(_)) if is_duration => Some(format!(
            "durations are strings with a unit, such as `{}s` or `500ms`",
            node.to_json()
        )),
        (["array"], NodeKind::Str(s)) if toml => Some(format!("write a list: `[\"{s}\"]`")),
        (["array"], NodeKind::Str(s)) => Some(format!("write a list: `[{s}]`")),
        (["string"], NodeKind::Map(_)) if toml => None,
        (["string"], NodeKind::Map(_)) if matches!(key, Some("if" | "foreach")) => Some(
            "write the expression as a string; quote it if it starts with `{` or `[`".to_owned(),
        ),
        (["string"], NodeKind::Map(_)) => Some(
            "a template that starts with `{{` must be quoted in YAML: `\"{{ ... }}\"`".to_owned(),
        ),
        _ => None,
    }
}

fn missing_key_hint(def: &str, name: &str, toml: bool) -> String {
    if toml {
        return match (def, name) {
            ("Step", "id") => "give every step a unique `id` such as `id = \"fetch\"`".to_owned(),
            ("Spec", "steps") => "a workflow needs at least one `[[steps]]` table".to_owned(),
            ("Rule", "on") => {
                "say when the rule applies, for example `on = \"before_tool\"`".to_owned()
            }
            ("Rule", "action") => {
                "say what the rule does: `allow`, `deny`, `ask`, `redact` or `log`".to_owned()
            }
            ("ProviderDef", "kind") => {
                "set `kind` to `\"openai\"`, `\"anthropic\"`, `\"gemini\"` or `\"mock\"`".to_owned()
            }
            _ => format!("add `{name}`"),
        };
    }
    match (def, name) {
        ("Step", "id") => "give every step a unique `id` such as `id: fetch`".to_owned(),
        ("Spec", "steps") => "a workflow needs a `steps:` list, even if it has one step".to_owned(),
        ("Rule", "on") => "say when the rule applies, for example `on: before_tool`".to_owned(),
        ("Rule", "action") => {
            "say what the rule does: `allow`, `deny`, `ask`, `redact` or `log`".to_owned()
        }
        ("ProviderDef", "kind") => {
            "set `kind` to `openai`, `anthropic`, `gemini` or `mock`".to_owned()
        }
        _ => format!("add `{name}`"),
    }
}

/// The keys of a step, which a fallback does not have.
fn step_keys() -> &'static [String] {
    static KEYS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let schema = crate::spec::schema::workflow_schema();
        schema["$defs"]["Step"]["properties"]
            .as_object()
            .map(|keys| keys.keys().filter(|k| *k != "fallback").cloned().collect())
            .unwrap_or_default()
    })
}

/// How TOML's tables place a key written after `[steps.fallback]`.
pub fn toml_scope_hint(key: &str) -> String {
    format!(
        "in TOML, every key after a `[steps.fallback]` header belongs to the fallback, up to the next header: `{key}` here is the fallback's, not the step's; move it above the `[steps.fallback]` table"
    )
}
