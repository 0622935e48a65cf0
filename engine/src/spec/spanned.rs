//! `Spanned<T>`: a spec value together with where it was written.

use std::borrow::Cow;
use std::fmt;
use std::ops::Deref;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::{Serialize, Serializer};

use crate::source::{FileId, Span};

/// Struct name the node deserializer recognises to hand over a span (see `spec::de`).
pub(crate) const SPANNED_MAGIC: &str = "$archon::Spanned";
pub(crate) const SPANNED_FIELDS: &[&str] = &["file", "start", "end", "value"];

/// A value and the span it came from. Serializes (and describes its schema) as the bare value.
#[derive(Clone, Debug, Default)]
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

impl<T> Spanned<T> {
    pub fn new(value: T, span: Span) -> Self {
        Spanned { value, span }
    }
}

impl<T> Deref for Spanned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: PartialEq> PartialEq for Spanned<T> {
    /// Spans do not take part in equality: a YAML spec and its TOML twin compare equal.
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<T: fmt::Display> fmt::Display for Spanned<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: Serialize> Serialize for Spanned<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

impl<T: JsonSchema> JsonSchema for Spanned<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Spanned<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpannedVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for SpannedVisitor<T> {
            type Value = Spanned<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a spanned value")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Spanned<T>, A::Error> {
                let mut next = |name: &'static str| -> Result<u32, A::Error> {
                    let _ = name;
                    match map.next_key::<de::IgnoredAny>()? {
                        Some(_) => map.next_value(),
                        _ => Err(de::Error::custom(
                            "spanned values come only from spec documents",
                        )),
                    }
                };
                let file = FileId(next("file")?);
                let start = next("start")?;
                let end = next("end")?;
                match map.next_key::<de::IgnoredAny>()? {
                    Some(_) => {
                        let value = map.next_value()?;
                        Ok(Spanned {
                            value,
                            span: Span { file, start, end },
                        })
                    }
                    _ => Err(de::Error::custom(
                        "spanned values come only from spec documents",
                    )),
                }
            }
        }

        deserializer.deserialize_struct(
            SPANNED_MAGIC,
            SPANNED_FIELDS,
            SpannedVisitor(std::marker::PhantomData),
        )
    }
}

impl<T: Eq> Eq for Spanned<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Spanned<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.value.hash(state);
    }
}

impl std::borrow::Borrow<str> for Spanned<String> {
    fn borrow(&self) -> &str {
        &self.value
    }
}
