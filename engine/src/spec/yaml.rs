//! YAML to [`Node`], keeping the byte span of every value and key.
//!
//! Two readers give the same tree. The common case (no anchors, aliases, merge keys or tags, and scalars
//! whose type is plain to see) is read event by event from the YAML parser itself, `granit-parser`, into
//! `Node`s at once. Anything else, and every document with an error, is read again through `serde-saphyr`,
//! which resolves the rest of YAML and words the errors; the event reader declines rather than guess, so
//! the two agree wherever both read (checked over every spec in the repository by a test).

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::budget::{Budget, BudgetBreach};
use serde_saphyr::options::AliasLimits;
use serde_saphyr::{Error as YamlError, Options, Spanned};

use crate::diagnostic::{Bounded, Diagnostic, codes};
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
    if file.text.trim().is_empty() {
        return (
            Some(Node::new(
                Span::new(file.id, 0, 0),
                NodeKind::Map(Vec::new()),
            )),
            Vec::new(),
        );
    }
    if let Some(read) = events::read(file, limits) {
        return read;
    }
    with_serde(file, limits)
}

/// Reads `file` through serde-saphyr, which resolves all of YAML and words the errors.
fn with_serde(file: &SourceFile, limits: &Limits) -> (Option<Node>, Vec<Diagnostic>) {
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
    match serde_saphyr::from_str_with_options::<Located>(&file.text, options) {
        Ok(raw) => {
            let mut diagnostics = Bounded::default();
            let node = convert(raw, file, &mut diagnostics);
            (Some(node), diagnostics.into_vec())
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

/// How one scalar reads when its text is all there is to go by: through serde-saphyr, as a document of
/// its own (for the few plain scalars the event reader does not decide itself: numbers other than plain
/// integers, and words a float parser might take).
fn resolve_alone(text: &str) -> Option<NodeKind> {
    let mut options = Options::default();
    options.strict_booleans = true;
    options.with_snippet = false;
    let raw: Located = serde_saphyr::from_str_with_options(text, options).ok()?;
    match raw.value {
        Raw::Null => Some(NodeKind::Null),
        Raw::Bool(b) => Some(NodeKind::Bool(b)),
        Raw::Int(i) => Some(NodeKind::Int(i)),
        Raw::Float(f) => Some(NodeKind::Float(f)),
        Raw::Str(s) => Some(NodeKind::Str(s)),
        Raw::Seq(_) | Raw::Map(_) => None,
    }
}

fn convert(raw: Located, file: &SourceFile, diagnostics: &mut Bounded) -> Node {
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
            let mut out = Entries::with_capacity(entries.len());
            for (k, v) in entries {
                let key_node = convert(k, file, diagnostics);
                let value = convert(v, file, diagnostics);
                let span = key_node.span;
                let name = match key_name(key_node) {
                    Ok(name) => name,
                    Err(key_node) => {
                        // `text: {{ x }}` unquoted: YAML reads a mapping inside a mapping.
                        let template = file
                            .text
                            .get(span.start as usize..)
                            .is_some_and(|t| t.starts_with('{'))
                            && matches!(key_node.kind, NodeKind::Map(_));
                        diagnostics.push(
                            Diagnostic::error(
                                codes::WRONG_TYPE,
                                span,
                                format!(
                                    "mapping keys must be strings, found {}",
                                    key_node.type_name()
                                ),
                            )
                            .with_hint_opt(template.then(|| {
                                "a value that starts with a template is quoted in YAML: `text: \"{{ x }}\"`".to_owned()
                            })),
                        );
                        continue;
                    }
                };
                out.insert(Key { name, span }, value, diagnostics);
            }
            NodeKind::Map(out.into_list())
        }
    };
    collection(span, kind)
}

/// A mapping's entries as they are read, each key once: a key written twice is reported (the first one
/// stays). Once the mapping is no longer small, its keys' hashes point at their entries, so that a key is
/// found, or known new, without a search: a mapping of many keys is read in linear time.
#[derive(Default)]
struct Entries {
    list: Vec<(Key, Node)>,
    /// The entry of each key's hash; another key of the same hash (a collision) is searched for.
    index: std::collections::HashMap<u64, usize>,
    hasher: std::hash::RandomState,
}

impl Entries {
    /// Past this many entries, keys are indexed.
    const SMALL: usize = 16;

    fn with_capacity(capacity: usize) -> Self {
        Entries {
            list: Vec::with_capacity(capacity),
            ..Entries::default()
        }
    }

    fn insert(&mut self, key: Key, value: Node, diagnostics: &mut Bounded) {
        use std::hash::BuildHasher as _;
        let hash = |name: &str| self.hasher.hash_one(name);
        let first = if self.list.len() < Self::SMALL {
            self.list.iter().position(|(k, _)| k.name == key.name)
        } else {
            if self.index.is_empty() {
                for (i, (k, _)) in self.list.iter().enumerate() {
                    self.index.entry(hash(&k.name)).or_insert(i);
                }
            }
            match self.index.get(&hash(&key.name)) {
                None => None,
                Some(&i) if self.list[i].0.name == key.name => Some(i),
                Some(_) => self.list.iter().position(|(k, _)| k.name == key.name),
            }
        };
        if let Some(first) = first {
            diagnostics.push(duplicate_key(&key, self.list[first].0.span));
            return;
        }
        if !self.index.is_empty() {
            self.index.entry(hash(&key.name)).or_insert(self.list.len());
        }
        self.list.push((key, value));
    }

    /// The entries, taking no more room than they need.
    fn into_list(self) -> Vec<(Key, Node)> {
        let mut list = self.list;
        list.shrink_to_fit();
        list
    }
}

/// A node whose span, for a collection, covers its children.
fn collection(span: Span, kind: NodeKind) -> Node {
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

/// The event reader: the YAML parser's events straight into `Node`s, for documents that need nothing
/// beyond the parser (see the module documentation). `read` gives `None` to hand a document to serde-saphyr.
mod events {
    use granit_parser::{Event, Parser, ScalarStyle, Span as At};

    use super::{Bounded, Diagnostic, Key, Limits, Node, NodeKind, SourceFile, Span};

    /// A collection being read.
    enum Open {
        Seq(Span, Vec<Node>),
        /// The entries so far, and the key read whose value comes next.
        Map(Span, super::Entries, Option<Key>),
    }

    pub(super) fn read(
        file: &SourceFile,
        limits: &Limits,
    ) -> Option<(Option<Node>, Vec<Diagnostic>)> {
        let mut diagnostics = Bounded::default();
        let mut stack: Vec<Open> = Vec::new();
        let mut root: Option<Node> = None;
        let mut documents = 0;
        let (mut values, mut events) = (0usize, 0usize);
        // serde-saphyr's limits: it counts values as nodes, and every event (a collection's end too)
        // against twice as many.
        let most_depth = limits.max_depth.saturating_sub(2);
        let (most_values, most_events) = (limits.max_values, 2 * limits.max_values);
        for event in Parser::new_from_str(&file.text) {
            let (event, at) = event.ok()?;
            events += 1;
            if events > most_events {
                return too_many(file, &at, limits);
            }
            let sequence = matches!(event, Event::SequenceStart(..));
            let node = match event {
                Event::StreamStart | Event::DocumentEnd => continue,
                Event::StreamEnd => break,
                Event::DocumentStart(..) => {
                    documents += 1;
                    if documents > 1 {
                        return None;
                    }
                    continue;
                }
                Event::Scalar(text, style, anchor, tag) => {
                    if anchor != 0 || tag.is_some() {
                        return None;
                    }
                    values += 1;
                    if values > most_values {
                        return too_many(file, &at, limits);
                    }
                    let kind = scalar(text.into_owned(), style)?;
                    Node::new(span(file, &at)?, kind)
                }
                Event::SequenceStart(_, anchor, tag) | Event::MappingStart(_, anchor, tag) => {
                    if anchor != 0 || tag.is_some() || stack.len() >= most_depth {
                        return None;
                    }
                    values += 1;
                    if values > most_values {
                        return too_many(file, &at, limits);
                    }
                    let start = span(file, &at)?;
                    stack.push(if sequence {
                        Open::Seq(start, Vec::new())
                    } else {
                        Open::Map(start, super::Entries::default(), None)
                    });
                    continue;
                }
                Event::SequenceEnd => match stack.pop()? {
                    Open::Seq(start, mut items) => {
                        items.shrink_to_fit();
                        super::collection(start, NodeKind::Seq(items))
                    }
                    Open::Map(..) => return None,
                },
                Event::MappingEnd => match stack.pop()? {
                    Open::Map(start, entries, None) => {
                        super::collection(start, NodeKind::Map(entries.into_list()))
                    }
                    _ => return None,
                },
                // Aliases, and anything this reader does not expect.
                _ => return None,
            };
            match stack.last_mut() {
                None if root.is_none() => root = Some(node),
                None => return None,
                Some(Open::Seq(_, items)) => items.push(node),
                Some(Open::Map(_, entries, key)) => match key.take() {
                    Some(key) => entries.insert(key, node, &mut diagnostics),
                    None => *key = Some(self::key(node)?),
                },
            }
        }
        if !stack.is_empty() || documents != 1 {
            return None;
        }
        Some((Some(root?), diagnostics.into_vec()))
    }

    /// A document past the value limit, refused where serde-saphyr refuses it (its budget counts values
    /// and events as this reader does), before the rest is read.
    fn too_many(
        file: &SourceFile,
        at: &At,
        limits: &Limits,
    ) -> Option<(Option<Node>, Vec<Diagnostic>)> {
        Some((
            None,
            vec![crate::spec::parse::too_many_values(span(file, at)?, limits)],
        ))
    }

    /// A key as serde-saphyr names it; merge keys and keys that are not scalars are its to read.
    fn key(node: Node) -> Option<Key> {
        let name = match node.kind {
            NodeKind::Str(s) if s == "<<" => return None,
            NodeKind::Str(s) => s,
            NodeKind::Int(i) => i.to_string(),
            NodeKind::Bool(b) => b.to_string(),
            _ => return None,
        };
        Some(Key {
            name,
            span: node.span,
        })
    }

    fn span(file: &SourceFile, at: &At) -> Option<Span> {
        Some(Span::new(
            file.id,
            at.start.byte_offset()?,
            at.end.byte_offset()?,
        ))
    }

    /// What an untagged scalar is: quoted and block scalars are strings; a plain scalar is null, a
    /// boolean (YAML 1.2: `true` and `false` in three spellings), a plain integer, or else a string, except
    /// that anything a number parser might read (a sign, a digit or a dot first, or a word such as `inf`)
    /// is resolved by serde-saphyr.
    fn scalar(text: String, style: ScalarStyle) -> Option<NodeKind> {
        if style != ScalarStyle::Plain {
            return Some(NodeKind::Str(text));
        }
        Some(match text.as_str() {
            "" | "~" | "null" | "Null" | "NULL" => NodeKind::Null,
            "true" | "True" | "TRUE" => NodeKind::Bool(true),
            "false" | "False" | "FALSE" => NodeKind::Bool(false),
            t if plain_integer(t) => NodeKind::Int(t.parse().ok()?),
            t if t.starts_with(|c: char| c.is_ascii_digit() || matches!(c, '-' | '+' | '.'))
                || t.parse::<f64>().is_ok() =>
            {
                if t.starts_with("--") || t == "-" || t.starts_with("- ") {
                    return Some(NodeKind::Str(text));
                }
                super::resolve_alone(t)?
            }
            _ => NodeKind::Str(text),
        })
    }

    /// `0`, or up to 18 digits with an optional minus and no leading zero: an `i64` in every spelling.
    fn plain_integer(t: &str) -> bool {
        let digits = t.strip_prefix('-').unwrap_or(t);
        t == "0"
            || (!digits.is_empty()
                && digits.len() <= 18
                && !digits.starts_with('0')
                && digits.bytes().all(|b| b.is_ascii_digit()))
    }
}

#[cfg(test)]
mod parity {
    use std::path::{Path, PathBuf};

    use super::{Limits, with_serde as read_with_serde};
    use crate::source::{FileId, Format, SourceFile};

    fn file(text: &str) -> SourceFile {
        SourceFile::new(
            FileId(0),
            PathBuf::from("t.yaml"),
            text.to_owned(),
            Format::Yaml,
        )
    }

    /// Whether the event reader read `text`, and then whether it read it as serde-saphyr does: the same
    /// values with the same spans, and the same diagnostics.
    fn agrees(text: &str) -> Option<Result<(), String>> {
        agrees_within(text, &Limits::default())
    }

    fn agrees_within(text: &str, limits: &Limits) -> Option<Result<(), String>> {
        let file = file(text);
        let fast = super::events::read(&file, limits)?;
        let slow = read_with_serde(&file, limits);
        let shown = |(node, diagnostics): &(Option<super::Node>, Vec<super::Diagnostic>)| {
            format!("{node:#?}\n{diagnostics:#?}")
        };
        Some(if shown(&fast) == shown(&slow) {
            Ok(())
        } else {
            Err(format!(
                "{text}\nevents:\n{}\nserde-saphyr:\n{}",
                shown(&fast),
                shown(&slow)
            ))
        })
    }

    #[test]
    fn scalars_read_as_serde_saphyr_reads_them() {
        let scalars = [
            "x",
            "0",
            "-0",
            "7",
            "-12",
            "+1",
            "007",
            "0x1F",
            "0o17",
            "0b101",
            "1_000",
            "1.5",
            "-1.5",
            ".5",
            "1.",
            "1e3",
            "1E-3",
            "inf",
            "-inf",
            ".inf",
            "-.Inf",
            ".nan",
            "NaN",
            "nan",
            "yes",
            "no",
            "on",
            "off",
            "y",
            "n",
            "true",
            "True",
            "TRUE",
            "tRUE",
            "false",
            "~",
            "null",
            "Null",
            "NULL",
            "nULL",
            "12345678901234567890",
            "-9223372036854775808",
            "9223372036854775807",
            "123456789012345678",
            "1.2.3",
            "v1",
            "1a",
            "- a",
            "'7'",
            "\"true\"",
            "'~'",
            "a b  c",
            "{{ steps.a.output }}",
            "-x",
            "+x",
            ".x",
            "2026-11-23",
            "1:30",
            "0.0.0.0/0",
            "\"\\u00e9\"",
            "|\n  block\n",
            ">\n  folded\n  text\n",
        ];
        let mut read = 0;
        for scalar in scalars {
            for text in [
                format!("k: {scalar}\n"),
                format!("- {scalar}\n"),
                format!("[{scalar}]\n"),
            ] {
                if let Some(outcome) = agrees(&text) {
                    read += 1;
                    outcome.unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
        // Most of these are the event reader's to read.
        assert!(read > 150, "{read}");
    }

    /// The event reader refuses a document past the value limit where serde-saphyr does, with the same
    /// diagnostic, whether the value past it is a scalar or a collection, or the events (a collection's
    /// end too) run out first; a document at the limit is read by both.
    #[test]
    fn the_value_limit_is_where_serde_saphyr_puts_it() {
        let limits = Limits {
            max_values: 12,
            ..Limits::default()
        };
        let refused = |text: &str| {
            let read = super::events::read(&file(text), &limits).expect("read");
            (read.0.is_none() && read.1.len() == 1).then(|| read.1[0].message.clone())
        };
        for (text, within) in [
            // 12 values: the mapping, 5 keys, 5 scalars, the list.
            ("a: 1\nb: 2\nc: 3\nd: 4\ne: []\n", true),
            ("a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: 6\n", false),
            ("a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: []\n", false),
            ("a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nf: [x]\n", false),
            // 24 events: the stream's, the document's and the list's starts and ends, 9 empty lists.
            ("[[], [], [], [], [], [], [], [], []]\n", true),
            // 11 values, but 26 events.
            ("[[], [], [], [], [], [], [], [], [], []]\n", false),
        ] {
            agrees_within(text, &limits)
                .expect("the event reader's to read")
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                refused(text),
                (!within).then(|| "spec file holds more than 12 values, the limit".to_owned()),
                "{text}"
            );
        }
    }

    /// A key written twice is found in a mapping of any size (past 16 keys, through their hashes), at
    /// both of its places, and the first stays.
    #[test]
    fn a_key_written_twice_is_reported_in_a_mapping_of_any_size() {
        let text: String = (0..40)
            .chain([3, 30, 30])
            .map(|i| format!("k{i}: {i}\n"))
            .collect();
        agrees(&text)
            .expect("the event reader's to read")
            .unwrap_or_else(|e| panic!("{e}"));
        let (node, diagnostics) =
            super::events::read(&file(&text), &Limits::default()).expect("read");
        let line = |n: usize| text.lines().take(n).map(|l| l.len() + 1).sum::<usize>();
        let found: Vec<_> = diagnostics
            .iter()
            .map(|d| {
                (
                    d.message.as_str(),
                    d.span.start as usize,
                    d.labels[0].span.start as usize,
                )
            })
            .collect();
        assert_eq!(
            found,
            [
                ("duplicate key `k3`", line(40), line(3)),
                ("duplicate key `k30`", line(41), line(30)),
                ("duplicate key `k30`", line(42), line(30)),
            ]
        );
        let super::NodeKind::Map(entries) = node.expect("a node").kind else {
            panic!("a mapping")
        };
        assert_eq!(entries.len(), 40);
        assert_eq!(entries[30].1.to_json(), serde_json::json!(30));
    }

    #[test]
    fn documents_read_as_serde_saphyr_reads_them() {
        for text in [
            "name: t\nsteps:\n  - id: a\n    tool: echo\n    with: { v: 1, w: [1, 2, {x: y}] }\n",
            "a:\nb: 1\n",
            "a: 1\na: 2\n",
            "1: one\ntrue: yes\n",
            "? complex\n: value\n",
            "outer:\n  - - nested\n    - [a, b]\n  - {}\n  - []\n",
            "# only a comment\nkey: value # trailing\n",
            "text: |\n  line one\n  line two\nnext: >-\n  folded\n",
            "key: 'single ''quoted'''\nother: \"double \\\"quoted\\\"\"\n",
            "plain: multi\n  line\n  plain\n",
            "a: [1,\n  2,\n  3]\n",
            "--- \nname: explicit start\n...\n",
            "é: ü\n\"k\": v\n",
        ] {
            if let Some(outcome) = agrees(text) {
                outcome.unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    /// Every YAML file in the repository: examples, workflows, fixtures, whichever reader takes it.
    #[test]
    fn every_spec_in_the_repository_reads_the_same() {
        fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    collect(&path, out);
                } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    out.push(path);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["workflows", "examples", "tests/fixtures"] {
            collect(&root.join(dir), &mut files);
        }
        let mut read = 0;
        for path in &files {
            let text = std::fs::read_to_string(path).expect("readable");
            if let Some(outcome) = agrees(&text) {
                read += 1;
                outcome.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
        assert!(
            files.len() > 50 && read * 2 > files.len(),
            "{read} of {}",
            files.len()
        );
    }
}
