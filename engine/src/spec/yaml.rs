//! YAML to [`Node`] through `serde-saphyr`, keeping the byte span of every value and key.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::budget::{Budget, BudgetBreach};
use serde_saphyr::options::AliasLimits;
use serde_saphyr::{Error as YamlError, Options, Spanned};

use crate::diagnostic::{Diagnostic, codes};
use crate::source::{SourceFile, Span};
use crate::spec::node::{Key, Node, NodeKind};
use crate::spec::parse::Limits;

/// A YAML value as serde-saphyr hands it over, before spans get their file id.
enum Raw {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Located>),
    Map(Vec<(Located, Located)>),
}

/// A value and where it was written. The whole document is read before it is converted into [`Node`]s,
/// and serde-saphyr's `Spanned` (two full locations) would make that tree nearly three times the size
/// of the `Node` tree, so only what the span needs is kept.
struct Located {
    value: Raw,
    at: At,
}

/// Where a value was written: a byte range, or only a line and column if serde-saphyr has no offsets.
#[derive(Clone, Copy)]
enum At {
    Bytes { start: u32, len: u32 },
    LineCol { line: u32, column: u32 },
}

impl At {
    fn of(loc: &serde_saphyr::Location) -> At {
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        let span = loc.span();
        match (span.byte_offset(), span.byte_len()) {
            (Some(start), Some(len)) => At::Bytes {
                start: clamp(start),
                len: clamp(len),
            },
            _ => At::LineCol {
                line: clamp(loc.line()),
                column: clamp(loc.column()),
            },
        }
    }

    fn span(self, file: &SourceFile) -> Span {
        match self {
            At::Bytes { start, len } => {
                Span::new(file.id, start as usize, start as usize + len as usize)
            }
            At::LineCol { line, column } => line_col_span(file, line.into(), column.into()),
        }
    }
}

impl<'de> Deserialize<'de> for Located {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Raw>::deserialize(deserializer)?;
        Ok(Located {
            at: At::of(&spanned.referenced),
            value: spanned.value,
        })
    }
}

impl<'de> Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(RawVisitor)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
        i64::try_from(v).map(Raw::Int).or(Ok(Raw::Float(v as f64)))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Raw, E> {
        i64::try_from(v).map(Raw::Int).or(Ok(Raw::Float(v as f64)))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Raw, E> {
        i64::try_from(v).map(Raw::Int).or(Ok(Raw::Float(v as f64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Raw, E> {
        Ok(Raw::Str(v))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Raw, E> {
        Ok(Raw::Str(String::from_utf8_lossy(v).into_owned()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Raw::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key()? {
            let value = map.next_value()?;
            entries.push((key, value));
        }
        Ok(Raw::Map(entries))
    }
}

pub(super) fn parse(file: &SourceFile, limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
    let mut budget = Budget::default();
    budget.max_depth = limits.max_depth;
    // The file size limit already bounds how many values a document can have; these only need to stay
    // out of the way of large legitimate specs. Alias bombs are stopped by the replay limit below, so the
    // alias-to-anchor ratio heuristic (which rejects one anchor reused by hundreds of steps) is off.
    budget.max_nodes = limits.max_values;
    budget.max_events = 2 * limits.max_values;
    budget.enforce_alias_anchor_ratio = false;
    let mut alias_limits = AliasLimits::default();
    alias_limits.max_total_replayed_events = limits.max_alias_replay_events;
    let mut options = Options::default();
    options.budget = Some(budget);
    options.alias_limits = alias_limits;
    options.with_snippet = false;
    // YAML 1.2: only `true` and `false` are booleans, so `on:` (rules) stays a key.
    options.strict_booleans = true;
    // Duplicate keys are reported by us, with both locations, and do not stop validation.
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::PassThrough;

    if file.text.trim().is_empty() {
        return (
            Some(Node::new(
                Span::new(file.id, 0, 0),
                NodeKind::Map(Vec::new()),
            )),
            Vec::new(),
        );
    }
    match serde_saphyr::from_str_with_options::<Located>(&file.text, options) {
        Ok(raw) => {
            let mut diagnostics = Vec::new();
            let node = convert(raw, file, &mut diagnostics);
            (Some(node), diagnostics)
        }
        Err(err) => (None, vec![error_to_diagnostic(&err, file, limits)]),
    }
}

fn span_of(loc: &serde_saphyr::Location, file: &SourceFile) -> Span {
    At::of(loc).span(file)
}

/// A zero-width span at a 1-based line and column, for errors that only carry those.
fn line_col_span(file: &SourceFile, line: u64, column: u64) -> Span {
    let line_start: usize = file
        .text
        .split_inclusive('\n')
        .take(usize::try_from(line.saturating_sub(1)).unwrap_or(0))
        .map(str::len)
        .sum();
    let rest = &file.text[line_start.min(file.text.len())..];
    let col: usize = rest
        .chars()
        .take(usize::try_from(column.saturating_sub(1)).unwrap_or(0))
        .map(char::len_utf8)
        .sum();
    let at = line_start + col;
    Span::new(file.id, at, at)
}

fn convert(raw: Located, file: &SourceFile, diagnostics: &mut Vec<Diagnostic>) -> Node {
    let span = raw.at.span(file);
    let kind = match raw.value {
        Raw::Null => NodeKind::Null,
        Raw::Bool(b) => NodeKind::Bool(b),
        Raw::Int(i) => NodeKind::Int(i),
        Raw::Float(f) => NodeKind::Float(f),
        Raw::Str(s) => NodeKind::Str(s),
        Raw::Seq(items) => NodeKind::Seq(
            items
                .into_iter()
                .map(|i| convert(i, file, diagnostics))
                .collect(),
        ),
        Raw::Map(entries) => {
            let mut out: Vec<(Key, Node)> = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let key_node = convert(k, file, diagnostics);
                let value = convert(v, file, diagnostics);
                let span = key_node.span;
                let name = match key_name(key_node) {
                    Ok(name) => name,
                    Err(key_node) => {
                        diagnostics.push(Diagnostic::error(
                            codes::WRONG_TYPE,
                            span,
                            format!(
                                "mapping keys must be strings, found {}",
                                key_node.type_name()
                            ),
                        ));
                        continue;
                    }
                };
                let key = Key { name, span };
                if let Some((first, _)) = out.iter().find(|(k, _)| k.name == key.name) {
                    diagnostics.push(duplicate_key(&key, first.span));
                    continue;
                }
                out.push((key, value));
            }
            NodeKind::Map(out)
        }
    };
    let span = match &kind {
        NodeKind::Seq(items) if span.is_empty() || items.len() > 1 => {
            cover(span, items.iter().map(|n| n.span))
        }
        NodeKind::Map(entries) if span.is_empty() || entries.len() > 1 => {
            cover(span, entries.iter().flat_map(|(k, v)| [k.span, v.span]))
        }
        _ => span,
    };
    Node::new(span, kind)
}

/// Widens a collection's span to cover its children (block collections start out empty).
fn cover(span: Span, mut children: impl Iterator<Item = Span>) -> Span {
    let first = if span.is_empty() {
        children.next()
    } else {
        Some(span)
    };
    match first {
        Some(first) => children.fold(first, Span::join),
        None => span,
    }
}

/// The key a scalar names (a string key keeps its allocation), or the node back if it cannot be a key.
fn key_name(node: Node) -> Result<String, Node> {
    match node.kind {
        NodeKind::Str(s) => Ok(s),
        NodeKind::Int(i) => Ok(i.to_string()),
        NodeKind::Bool(b) => Ok(b.to_string()),
        NodeKind::Float(f) => Ok(f.to_string()),
        _ => Err(node),
    }
}

pub(super) fn duplicate_key(key: &Key, first: Span) -> Diagnostic {
    Diagnostic::error(
        codes::DUPLICATE_KEY,
        key.span,
        format!("duplicate key `{}`", key.name),
    )
    .with_label(first, "first defined here")
    .with_hint("each key may appear once in a mapping; remove or rename one of them")
}

fn error_to_diagnostic(err: &YamlError, file: &SourceFile, limits: &Limits) -> Diagnostic {
    let span = err
        .location()
        .map_or(Span::new(file.id, 0, 0), |loc| span_of(&loc, file));
    let span = widen_to_char(span, file);
    match original(err) {
        YamlError::Budget {
            breach: BudgetBreach::Depth { .. },
            ..
        } => Diagnostic::error(
            codes::NESTING_TOO_DEEP,
            span,
            format!(
                "values are nested more than {} levels deep",
                limits.max_depth
            ),
        )
        .with_hint("flatten the data, or move it into a file a tool reads"),
        YamlError::Budget { breach, .. } if is_alias_breach(breach) => alias_budget(span, limits),
        YamlError::AliasReplayLimitExceeded { .. }
        | YamlError::AliasExpansionLimitExceeded { .. }
        | YamlError::AliasReplayStackDepthExceeded { .. }
        | YamlError::AliasReplayCounterOverflow { .. } => alias_budget(span, limits),
        YamlError::Budget {
            breach: BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. },
            ..
        } => super::parse::too_many_values(span, limits),
        YamlError::Budget { breach, .. } => Diagnostic::error(
            codes::FILE_TOO_LARGE,
            span,
            format!(
                "YAML document is too large to read: {}",
                budget_text(breach)
            ),
        )
        .with_hint("split the workflow into sub-workflows (`workflow:` steps)"),
        YamlError::MultipleDocuments { .. } => Diagnostic::error(
            codes::YAML_SYNTAX,
            span,
            "a spec file holds one YAML document, and a second one starts here",
        )
        .with_hint("put each workflow in its own file, or remove the `---` separator"),
        other => {
            let message = other.without_snippet().to_string();
            Diagnostic::error(
                codes::YAML_SYNTAX,
                span,
                lowercase_first(&strip_location(&message)),
            )
        }
    }
}

/// The error itself, without the wrappers that add alias locations or snippets.
fn original(mut err: &YamlError) -> &YamlError {
    while let YamlError::AliasError { error, .. } | YamlError::WithSnippet { error, .. } = err {
        err = error;
    }
    err
}

fn is_alias_breach(breach: &BudgetBreach) -> bool {
    matches!(
        breach,
        BudgetBreach::Aliases { .. } | BudgetBreach::Anchors { .. }
    )
}

fn alias_budget(span: Span, limits: &Limits) -> Diagnostic {
    Diagnostic::error(codes::ALIAS_BUDGET, span, "YAML aliases expand beyond the alias budget")
        .with_hint(format!(
            "aliases may replay at most {} YAML events in one file; write the repeated values out or use fewer nested aliases",
            limits.max_alias_replay_events
        ))
}

fn budget_text(breach: &BudgetBreach) -> String {
    match breach {
        BudgetBreach::Documents { .. } => "more than one YAML document".to_owned(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// serde-saphyr appends " at line X column Y"; the diagnostic already carries the location.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

pub(super) fn lowercase_first(s: &str) -> String {
    let mut chars = s.trim().trim_end_matches('.').chars();
    match chars.next() {
        Some(c) if !s.starts_with("YAML") && !s.starts_with("TOML") => {
            c.to_lowercase().chain(chars).collect()
        }
        Some(c) => std::iter::once(c).chain(chars).collect(),
        None => String::new(),
    }
}

/// An empty span becomes the character it points at, so a caret has something to underline.
pub(super) fn widen_to_char(span: Span, file: &SourceFile) -> Span {
    if !span.is_empty() {
        return span;
    }
    let start = span.start as usize;
    match file.text.get(start..).and_then(|rest| rest.chars().next()) {
        Some(c) if c != '\n' => Span::new(span.file, start, start + c.len_utf8()),
        _ => span,
    }
}
