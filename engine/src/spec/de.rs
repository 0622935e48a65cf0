//! A serde `Deserializer` over a [`Node`] tree, so that spec types can carry spans ([`Spanned`]) and
//! free-form values keep theirs ([`Node`] fields).
//!
//! It runs only after the structural check, so its errors are a safety net rather than the way users
//! learn about mistakes.

use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::value::StrDeserializer;
use serde::de::{
    self, Deserialize, DeserializeOwned, Deserializer, IntoDeserializer, MapAccess, SeqAccess,
    Visitor,
};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use crate::source::{FileId, Span};
use crate::spec::node::{Key, Node, NodeKind};
use crate::spec::spanned::{SPANNED_FIELDS, SPANNED_MAGIC};

const NODE_MAGIC: &str = "$archon::Node";
const NODE_FIELDS: &[&str] = &["file", "start", "end", "kind"];

/// Deserializes a spec type from a document tree.
pub fn from_node<T: DeserializeOwned>(node: &Node) -> Result<T, DeError> {
    T::deserialize(NodeDeserializer {
        node,
        mode: Mode::Value,
    })
}

/// A deserialization failure; the structural check normally reports these first, with spans.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct DeError {
    pub message: String,
}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            message: msg.to_string(),
        }
    }
}

#[derive(Clone, Copy)]
enum Mode {
    /// Deserialize the value itself.
    Value,
    /// Deserialize the value without going through the span magic again (the `value` of a Spanned).
    Inner,
}

#[derive(Clone, Copy)]
struct NodeDeserializer<'a> {
    node: &'a Node,
    mode: Mode,
}

impl<'de> Deserializer<'de> for NodeDeserializer<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Null => visitor.visit_unit(),
            NodeKind::Bool(b) => visitor.visit_bool(*b),
            NodeKind::Int(i) => visitor.visit_i64(*i),
            NodeKind::Float(f) => visitor.visit_f64(*f),
            NodeKind::Str(s) => visitor.visit_str(s),
            NodeKind::Seq(items) => visitor.visit_seq(Items { iter: items.iter() }),
            NodeKind::Map(entries) => visitor.visit_map(Entries {
                iter: entries.iter(),
                value: None,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match self.node.kind {
            NodeKind::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match (name, self.mode) {
            (SPANNED_MAGIC, Mode::Value) => {
                visitor.visit_map(SpanAccess::new(self.node.span, SPANNED_FIELDS, self.node))
            }
            (NODE_MAGIC, Mode::Value) => {
                visitor.visit_map(SpanAccess::new(self.node.span, NODE_FIELDS, self.node))
            }
            _ => {
                let _ = fields;
                self.deserialize_any(visitor)
            }
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Str(s) => {
                visitor.visit_enum(IntoDeserializer::<DeError>::into_deserializer(s.as_str()))
            }
            // A value spelled as a number (`429`), which the structural check accepted as the string.
            NodeKind::Int(n) => visitor.visit_enum(IntoDeserializer::<DeError>::into_deserializer(
                n.to_string(),
            )),
            _ => Err(de::Error::custom(format!(
                "expected a string, found {}",
                self.node.type_name()
            ))),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

struct Items<'a> {
    iter: std::slice::Iter<'a, Node>,
}

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = DeError;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        self.iter
            .next()
            .map(|node| {
                seed.deserialize(NodeDeserializer {
                    node,
                    mode: Mode::Value,
                })
            })
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct Entries<'a> {
    iter: std::slice::Iter<'a, (Key, Node)>,
    value: Option<&'a Node>,
}

impl<'de> MapAccess<'de> for Entries<'_> {
    type Error = DeError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.iter.next() {
            Some((key, value)) => {
                self.value = Some(value);
                seed.deserialize(KeyDeserializer { key }).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DeError> {
        let node = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("value requested before key"))?;
        seed.deserialize(NodeDeserializer {
            node,
            mode: Mode::Value,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

/// Mapping keys: plain strings, or `Spanned<String>` with the key's own span.
struct KeyDeserializer<'a> {
    key: &'a Key,
}

impl<'de> Deserializer<'de> for KeyDeserializer<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_str(&self.key.name)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == SPANNED_MAGIC {
            visitor.visit_map(KeySpanAccess {
                key: self.key,
                field: 0,
            })
        } else {
            self.deserialize_any(visitor)
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_enum(IntoDeserializer::<DeError>::into_deserializer(
            self.key.name.as_str(),
        ))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// Hands a span and then the value itself to `Spanned<T>` or `Node`.
struct SpanAccess<'a> {
    span: Span,
    fields: &'static [&'static str],
    node: &'a Node,
    field: usize,
}

impl<'a> SpanAccess<'a> {
    fn new(span: Span, fields: &'static [&'static str], node: &'a Node) -> Self {
        SpanAccess {
            span,
            fields,
            node,
            field: 0,
        }
    }
}

impl<'de> MapAccess<'de> for SpanAccess<'_> {
    type Error = DeError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.fields.get(self.field) {
            Some(name) => seed
                .deserialize(StrDeserializer::<DeError>::new(name))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DeError> {
        let field = self.field;
        self.field += 1;
        match field {
            0 => seed.deserialize(self.span.file.0.into_deserializer()),
            1 => seed.deserialize(self.span.start.into_deserializer()),
            2 => seed.deserialize(self.span.end.into_deserializer()),
            _ => seed.deserialize(NodeDeserializer {
                node: self.node,
                mode: Mode::Inner,
            }),
        }
    }
}

struct KeySpanAccess<'a> {
    key: &'a Key,
    field: usize,
}

impl<'de> MapAccess<'de> for KeySpanAccess<'_> {
    type Error = DeError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match SPANNED_FIELDS.get(self.field) {
            Some(name) => seed
                .deserialize(StrDeserializer::<DeError>::new(name))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DeError> {
        let field = self.field;
        self.field += 1;
        let span = self.key.span;
        match field {
            0 => seed.deserialize(span.file.0.into_deserializer()),
            1 => seed.deserialize(span.start.into_deserializer()),
            2 => seed.deserialize(span.end.into_deserializer()),
            _ => seed.deserialize(StrDeserializer::<DeError>::new(&self.key.name)),
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;

        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a spec value")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut next = |name: &'static str| -> Result<u32, A::Error> {
                    let _ = name;
                    match map.next_key::<de::IgnoredAny>()? {
                        Some(_) => map.next_value(),
                        _ => Err(de::Error::custom(
                            "spec values come only from spec documents",
                        )),
                    }
                };
                let file = FileId(next("file")?);
                let start = next("start")?;
                let end = next("end")?;
                match map.next_key::<de::IgnoredAny>()? {
                    Some(_) => {
                        let KindOf(kind) = map.next_value()?;
                        Ok(Node {
                            span: Span { file, start, end },
                            kind,
                        })
                    }
                    _ => Err(de::Error::custom(
                        "spec values come only from spec documents",
                    )),
                }
            }
        }

        deserializer.deserialize_struct(NODE_MAGIC, NODE_FIELDS, NodeVisitor)
    }
}

/// The kind of a node, whose children are nodes again (with their spans).
struct KindOf(NodeKind);

impl<'de> Deserialize<'de> for KindOf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KindVisitor;

        impl<'de> Visitor<'de> for KindVisitor {
            type Value = KindOf;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a spec value")
            }
            fn visit_unit<E>(self) -> Result<KindOf, E> {
                Ok(KindOf(NodeKind::Null))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KindOf, E> {
                Ok(KindOf(NodeKind::Bool(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KindOf, E> {
                Ok(KindOf(NodeKind::Int(v)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KindOf, E> {
                Ok(KindOf(NodeKind::Float(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<KindOf, E> {
                Ok(KindOf(NodeKind::Str(v.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KindOf, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(item) = seq.next_element::<Node>()? {
                    items.push(item);
                }
                Ok(KindOf(NodeKind::Seq(items)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KindOf, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(key) = map.next_key::<super::Spanned<String>>()? {
                    let value = map.next_value::<Node>()?;
                    entries.push((
                        Key {
                            name: key.value,
                            span: key.span,
                        },
                        value,
                    ));
                }
                Ok(KindOf(NodeKind::Map(entries)))
            }
        }

        deserializer.deserialize_any(KindVisitor)
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.kind {
            NodeKind::Null => serializer.serialize_unit(),
            NodeKind::Bool(b) => serializer.serialize_bool(*b),
            NodeKind::Int(i) => serializer.serialize_i64(*i),
            NodeKind::Float(f) => serializer.serialize_f64(*f),
            NodeKind::Str(s) => serializer.serialize_str(s),
            NodeKind::Seq(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            NodeKind::Map(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(&k.name, v)?;
                }
                map.end()
            }
        }
    }
}

impl JsonSchema for Node {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AnyValue".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        Schema::from(true)
    }
}
