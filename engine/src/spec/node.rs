//! The format-neutral document tree: what YAML and TOML both parse into, with a span on every value and key.

use serde_json::Value as Json;

use crate::source::Span;

/// A value as written in a spec file.
#[derive(Clone, Debug)]
pub struct Node {
    pub span: Span,
    pub kind: NodeKind,
}

#[derive(Clone, Debug)]
pub enum NodeKind {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

/// A mapping key with its own span (keys are always strings in a spec).
#[derive(Clone, Debug)]
pub struct Key {
    pub name: String,
    pub span: Span,
}

/// Equality is about values, not where they were written or in which order a mapping lists its keys: a
/// YAML spec and its TOML twin compare equal.
impl PartialEq for Node {
    fn eq(&self, other: &Self) -> bool {
        match (&self.kind, &other.kind) {
            (NodeKind::Null, NodeKind::Null) => true,
            (NodeKind::Bool(a), NodeKind::Bool(b)) => a == b,
            (NodeKind::Int(a), NodeKind::Int(b)) => a == b,
            (NodeKind::Float(a), NodeKind::Float(b)) => a == b,
            (NodeKind::Str(a), NodeKind::Str(b)) => a == b,
            (NodeKind::Seq(a), NodeKind::Seq(b)) => a == b,
            (NodeKind::Map(a), NodeKind::Map(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(k, v)| b.iter().any(|(k2, v2)| k.name == k2.name && v == v2))
            }
            _ => false,
        }
    }
}

impl Node {
    pub fn new(span: Span, kind: NodeKind) -> Self {
        Node { span, kind }
    }

    /// How the value's type is named in diagnostics.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            NodeKind::Null => "null",
            NodeKind::Bool(_) => "boolean",
            NodeKind::Int(_) => "integer",
            NodeKind::Float(_) => "number",
            NodeKind::Str(_) => "string",
            NodeKind::Seq(_) => "array",
            NodeKind::Map(_) => "object",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Key, Node)]> {
        match &self.kind {
            NodeKind::Map(entries) => Some(entries),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.kind {
            NodeKind::Seq(items) => Some(items),
            _ => None,
        }
    }

    /// The entry named `name` of a mapping, with its key.
    pub fn entry(&self, name: &str) -> Option<(&Key, &Node)> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.name == name)
            .map(|(k, v)| (k, v))
    }

    pub fn get(&self, name: &str) -> Option<&Node> {
        self.entry(name).map(|(_, v)| v)
    }

    /// Visits every string in this value (recursively), in document order.
    pub fn for_each_str<'a>(&'a self, f: &mut impl FnMut(&'a str, Span)) {
        match &self.kind {
            NodeKind::Str(s) => f(s, self.span),
            NodeKind::Seq(items) => items.iter().for_each(|n| n.for_each_str(f)),
            NodeKind::Map(entries) => entries.iter().for_each(|(_, n)| n.for_each_str(f)),
            _ => {}
        }
    }

    /// The value as JSON (spans dropped). Non-finite floats become null, as in JSON.
    pub fn to_json(&self) -> Json {
        match &self.kind {
            NodeKind::Null => Json::Null,
            NodeKind::Bool(b) => Json::Bool(*b),
            NodeKind::Int(i) => Json::from(*i),
            NodeKind::Float(f) => serde_json::Number::from_f64(*f).map_or(Json::Null, Json::Number),
            NodeKind::Str(s) => Json::String(s.clone()),
            NodeKind::Seq(items) => Json::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Map(entries) => Json::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.name.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// Follows a JSON-pointer-like path of keys and indexes.
    pub fn at_path(&self, path: &[PathSegment]) -> Option<&Node> {
        path.iter()
            .try_fold(self, |node, seg| match (seg, &node.kind) {
                (PathSegment::Key(k), NodeKind::Map(_)) => node.get(k),
                (PathSegment::Index(i), NodeKind::Seq(items)) => items.get(*i),
                _ => None,
            })
    }
}

/// One step in a path into a [`Node`] tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathSegment {
    Key(String),
    Index(usize),
}
