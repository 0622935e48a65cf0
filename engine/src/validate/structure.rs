//! The structural check: walks a document tree alongside the workflow JSON Schema and reports every
//! unknown key, missing key, wrong type and invalid enum value, with spans and suggestions.
//!
//! It also returns a pruned copy of the tree, without the values it reported, so that the semantic checks
//! can still run on everything else and the user hears about all problems at once.

use std::borrow::Cow;

use serde_json::{Map, Value as Json};

use crate::diagnostic::{Diagnostic, codes};
use crate::spec::node::{Key, Node, NodeKind};
use crate::spec::schema::workflow_schema;
use crate::validate::suggest;

/// Checks `root` against the workflow schema. Returns the tree without the values it reported (borrowed
/// when nothing was reported), or None if the root itself is unusable.
pub fn check<'n>(root: &'n Node, diagnostics: &mut Vec<Diagnostic>) -> Option<Cow<'n, Node>> {
    let schema = workflow_schema();
    let defs = schema.get("$defs").and_then(Json::as_object);
    let before = diagnostics.len();
    let mut walker = Walker {
        defs,
        diagnostics,
        prune: false,
    };
    walker.check(
        root,
        schema,
        &Context {
            def: "Spec",
            key: None,
        },
    )?;
    if diagnostics.len() == before {
        return Some(Cow::Borrowed(root));
    }
    // Something was reported: walk again, this time building the pruned copy.
    let mut again = Vec::new();
    let mut walker = Walker {
        defs,
        diagnostics: &mut again,
        prune: true,
    };
    walker
        .check(
            root,
            schema,
            &Context {
                def: "Spec",
                key: None,
            },
        )
        .map(Cow::Owned)
}

struct Walker<'a> {
    defs: Option<&'a Map<String, Json>>,
    diagnostics: &'a mut Vec<Diagnostic>,
    /// Build the pruned copy; the first, checking-only walk returns cheap placeholders instead.
    prune: bool,
}

/// Where a value sits: the schema definition being checked and the key it was found under.
#[derive(Clone, Copy)]
struct Context<'a> {
    def: &'a str,
    key: Option<&'a str>,
}

impl Context<'_> {
    /// How the value is named in messages: "`timeout`" or "the workflow".
    fn subject(&self) -> String {
        match self.key {
            Some(key) => format!("`{key}`"),
            None => format!("the {}", noun(self.def)),
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

impl<'a> Walker<'a> {
    fn resolve(&self, schema: &'a Json) -> Option<(&'a Json, Option<&'a str>)> {
        let reference = schema.get("$ref")?.as_str()?;
        let name = reference.strip_prefix("#/$defs/")?;
        let def = self.defs?.get(name)?;
        Some((def, Some(name)))
    }

    /// The value itself, when building the pruned copy; a placeholder otherwise.
    fn keep(&self, node: &Node) -> Node {
        if self.prune {
            node.clone()
        } else {
            Node::new(node.span, NodeKind::Null)
        }
    }

    fn check(&mut self, node: &Node, schema: &'a Json, cx: &Context<'_>) -> Option<Node> {
        let schema = match schema {
            Json::Bool(true) => return Some(self.keep(node)),
            Json::Bool(false) => {
                self.diagnostics.push(Diagnostic::error(
                    codes::UNKNOWN_KEY,
                    node.span,
                    format!("{} is not allowed here", cx.subject()),
                ));
                return None;
            }
            other => other,
        };
        if let Some((def, name)) = self.resolve(schema) {
            let cx = Context {
                def: name.unwrap_or(cx.def),
                key: cx.key,
            };
            return self.check(node, def, &cx);
        }
        if let Some(values) = enum_values(schema, self) {
            return self.check_enum(node, &values, cx);
        }
        if let Some(branches) = schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Json::as_array)
        {
            let chosen = branches.iter().find(|b| self.accepts_type(b, node));
            return match chosen {
                Some(branch) => self.check(node, branch, cx),
                None => {
                    let mut expected: Vec<&str> = Vec::new();
                    for b in branches {
                        for t in self.types_of(b) {
                            if !expected.contains(&t) {
                                expected.push(t);
                            }
                        }
                    }
                    self.wrong_type(node, &expected, cx);
                    None
                }
            };
        }
        let types = self.types_of(schema);
        if !types.is_empty() && !types.iter().any(|t| type_accepts(t, node)) {
            self.wrong_type(node, &types, cx);
            return None;
        }
        match &node.kind {
            NodeKind::Map(entries) => self.check_object(node, entries, schema, cx),
            NodeKind::Seq(items) => {
                let Some(item_schema) = schema.get("items") else {
                    return Some(self.keep(node));
                };
                let prune = self.prune;
                let kept: Vec<Node> = items
                    .iter()
                    .filter_map(|item| {
                        self.check(
                            item,
                            item_schema,
                            &Context {
                                def: cx.def,
                                key: None,
                            },
                        )
                    })
                    .filter(|_| prune)
                    .collect();
                Some(Node::new(node.span, NodeKind::Seq(kept)))
            }
            NodeKind::Int(i) => self.check_integer(node, *i, schema, cx),
            _ => Some(self.keep(node)),
        }
    }

    fn check_object(
        &mut self,
        node: &Node,
        entries: &[(Key, Node)],
        schema: &'a Json,
        cx: &Context<'_>,
    ) -> Option<Node> {
        let properties = schema.get("properties").and_then(Json::as_object);
        let additional = schema.get("additionalProperties");
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Json::as_array)
            .map(|r| r.iter().filter_map(Json::as_str).collect())
            .unwrap_or_default();
        let mut kept = Vec::with_capacity(entries.len());
        let mut broken = false;
        for (key, value) in entries {
            let child_schema = match properties.and_then(|p| p.get(&key.name)) {
                Some(s) => s,
                None => match additional {
                    Some(Json::Bool(false)) => {
                        self.unknown_key(key, properties, entries, cx);
                        continue;
                    }
                    Some(s) => s,
                    None => &Json::Bool(true),
                },
            };
            let child_cx = Context {
                def: cx.def,
                key: Some(&key.name),
            };
            match self.check(value, child_schema, &child_cx) {
                Some(v) if self.prune => kept.push((key.clone(), v)),
                Some(_) => {}
                None if required.contains(&key.name.as_str()) => broken = true,
                None => {}
            }
        }
        for name in &required {
            if !entries.iter().any(|(k, _)| k.name == *name) {
                let at = entries.first().map_or(node.span, |(k, _)| k.span);
                self.diagnostics.push(
                    Diagnostic::error(
                        codes::MISSING_KEY,
                        at,
                        format!(
                            "{} is missing the required key `{name}`",
                            article(noun(cx.def))
                        ),
                    )
                    .with_hint(missing_key_hint(cx.def, name)),
                );
                broken = true;
            }
        }
        (!broken).then(|| Node::new(node.span, NodeKind::Map(kept)))
    }

    fn unknown_key(
        &mut self,
        key: &Key,
        properties: Option<&Map<String, Json>>,
        entries: &[(Key, Node)],
        cx: &Context<'_>,
    ) {
        let present = |name: &str| entries.iter().any(|(k, _)| k.name == name);
        let candidates: Vec<&str> = properties
            .map(|p| {
                p.keys()
                    .map(String::as_str)
                    .filter(|k| !present(k))
                    .collect()
            })
            .unwrap_or_default();
        let mut d = Diagnostic::error(
            codes::UNKNOWN_KEY,
            key.span,
            format!("unknown key `{}` in {}", key.name, article(noun(cx.def))),
        );
        d = match suggest::did_you_mean(&key.name, candidates.iter().copied()) {
            Some(hint) => d.with_hint(hint),
            None if !candidates.is_empty() && candidates.len() <= 12 => {
                d.with_hint(format!("valid keys here: {}", suggest::list(&candidates)))
            }
            None => d.with_hint("see docs/spec.md for the keys this section accepts"),
        };
        self.diagnostics.push(d);
    }

    fn check_enum(&mut self, node: &Node, values: &[&'a Json], cx: &Context<'_>) -> Option<Node> {
        let json = node.to_json();
        if values.iter().any(|v| **v == json) {
            return Some(self.keep(node));
        }
        let names: Vec<&str> = values.iter().filter_map(|v| v.as_str()).collect();
        let what = match cx.def {
            "Trigger" => "trigger",
            "Action" => "action",
            "ProviderKind" => "provider kind",
            _ => "value",
        };
        let shown = match &node.kind {
            NodeKind::Str(s) => format!("`{s}`"),
            _ => format!("a {}", node.type_name()),
        };
        let mut d = Diagnostic::error(
            enum_code(cx.def),
            node.span,
            format!("unknown {what} {shown} for {}", cx.subject()),
        );
        if let Some(s) = node.as_str() {
            d = d.with_hint_opt(suggest::did_you_mean(s, names.iter().copied()));
        }
        self.diagnostics
            .push(d.with_hint(format!("expected one of {}", suggest::list(&names))));
        None
    }

    fn check_integer(
        &mut self,
        node: &Node,
        value: i64,
        schema: &Json,
        cx: &Context<'_>,
    ) -> Option<Node> {
        let (format_min, format_max) = match schema.get("format").and_then(Json::as_str) {
            Some("uint8") => (0, i64::from(u8::MAX)),
            Some("uint16") => (0, i64::from(u16::MAX)),
            Some("uint32") => (0, i64::from(u32::MAX)),
            Some("uint64" | "uint") => (0, i64::MAX),
            Some("int32") => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => (i64::MIN, i64::MAX),
        };
        let min = schema
            .get("minimum")
            .and_then(Json::as_i64)
            .unwrap_or(i64::MIN)
            .max(format_min);
        let max = schema
            .get("maximum")
            .and_then(Json::as_i64)
            .unwrap_or(i64::MAX)
            .min(format_max);
        if value < min || value > max {
            let range = if max == i64::MAX {
                format!("at least {min}")
            } else {
                format!("between {min} and {max}")
            };
            self.diagnostics.push(Diagnostic::error(
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
        if let Some(hint) = type_hint(cx.key, &expected, node) {
            d = d.with_hint(hint);
        }
        self.diagnostics.push(d);
    }

    /// The JSON types a schema admits (following `$ref` and unions), or empty for "anything".
    fn types_of(&self, schema: &'a Json) -> Vec<&'a str> {
        if let Some((def, _)) = self.resolve(schema) {
            return self.types_of(def);
        }
        if let Some(branches) = schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Json::as_array)
        {
            return branches.iter().flat_map(|b| self.types_of(b)).collect();
        }
        if let Some(values) = enum_values(schema, self) {
            let mut types: Vec<&str> = values.iter().map(|v| json_type(v)).collect();
            types.dedup();
            return types;
        }
        match schema.get("type") {
            Some(Json::String(t)) => vec![t.as_str()],
            Some(Json::Array(ts)) => ts.iter().filter_map(Json::as_str).collect(),
            _ => Vec::new(),
        }
    }

    fn accepts_type(&self, schema: &'a Json, node: &Node) -> bool {
        let types = self.types_of(schema);
        types.is_empty() || types.iter().any(|t| type_accepts(t, node))
    }
}

/// Every allowed value when the schema is an enumeration (`enum`, `const`, or a union of them).
fn enum_values<'a>(schema: &'a Json, walker: &Walker<'a>) -> Option<Vec<&'a Json>> {
    if let Some((def, _)) = walker.resolve(schema) {
        return enum_values(def, walker);
    }
    if let Some(values) = schema.get("enum").and_then(Json::as_array) {
        return Some(values.iter().collect());
    }
    if let Some(value) = schema.get("const") {
        return Some(vec![value]);
    }
    let branches = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))?
        .as_array()?;
    let mut all = Vec::new();
    for branch in branches {
        all.extend(enum_values(branch, walker)?);
    }
    Some(all)
}

fn json_type(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
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

fn type_hint(key: Option<&str>, expected: &[&str], node: &Node) -> Option<String> {
    let is_duration = matches!(key, Some("timeout" | "delay" | "max_delay"));
    match (expected, &node.kind) {
        (["string"], NodeKind::Int(_) | NodeKind::Float(_)) if is_duration => Some(format!(
            "durations are strings with a unit, such as `{}s` or `500ms`",
            node.to_json()
        )),
        (["array"], NodeKind::Str(s)) => Some(format!("write a list: `[{s}]`")),
        (["string"], NodeKind::Map(_)) if matches!(key, Some("if" | "foreach")) => Some(
            "write the expression as a string; quote it if it starts with `{` or `[`".to_owned(),
        ),
        (["string"], NodeKind::Map(_)) => Some(
            "a template that starts with `{{` must be quoted in YAML: `\"{{ ... }}\"`".to_owned(),
        ),
        _ => None,
    }
}

fn missing_key_hint(def: &str, name: &str) -> String {
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
