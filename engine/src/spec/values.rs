//! Values the spec writes as strings and the runtime uses typed: durations (`30s`) and name patterns
//! (`read_*`). Each is read once, when the spec is read; a text that does not read has no value, and
//! validation reports it (`archon::invalid_duration`, `archon::invalid_glob`), so a validated workflow's
//! values are all there and nothing at run time parses them again.

use std::borrow::Cow;
use std::fmt;

use globset::{Glob, GlobMatcher};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration as written (`30s`, `1m30s`, `500ms`) and its value.
#[derive(Clone, Debug, Default)]
pub struct DurationText {
    pub text: String,
    value: Option<std::time::Duration>,
}

impl DurationText {
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let value = humantime::parse_duration(text.trim()).ok();
        DurationText { text, value }
    }

    /// The duration; `None` only for a text validation refused.
    pub fn get(&self) -> Option<std::time::Duration> {
        self.value
    }
}

/// A name or a glob over names (tools, steps, agents) as written, compiled.
#[derive(Clone, Debug, Default)]
pub struct Pattern {
    pub text: String,
    matcher: Option<GlobMatcher>,
}

impl Pattern {
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let matcher = Glob::new(&text).ok().map(|g| g.compile_matcher());
        Pattern { text, matcher }
    }

    /// Whether `name` matches (never, for a glob validation refused).
    pub fn matches(&self, name: &str) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.is_match(name))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// A type with a `text` field compares, prints, serializes and describes its schema as that text
/// (durations, patterns, and the cron expressions and time zones of triggers).
macro_rules! as_text {
    ($ty:ty) => {
        impl PartialEq for $ty {
            fn eq(&self, other: &Self) -> bool {
                self.text == other.text
            }
        }

        impl Eq for $ty {}

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.text)
            }
        }

        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                self.text.serialize(serializer)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                String::deserialize(deserializer).map(<$ty>::new)
            }
        }

        impl JsonSchema for $ty {
            fn inline_schema() -> bool {
                String::inline_schema()
            }
            fn schema_name() -> Cow<'static, str> {
                String::schema_name()
            }
            fn schema_id() -> Cow<'static, str> {
                String::schema_id()
            }
            fn json_schema(generator: &mut SchemaGenerator) -> Schema {
                String::json_schema(generator)
            }
        }
    };
}

pub(crate) use as_text;

as_text!(DurationText);
as_text!(Pattern);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_once_and_absent_when_they_do_not_read() {
        assert_eq!(
            DurationText::new(" 1m30s ").get(),
            Some(std::time::Duration::from_secs(90))
        );
        assert_eq!(DurationText::new("soon").get(), None);
        let pattern = Pattern::new("read_*");
        assert!(pattern.matches("read_file") && !pattern.matches("write_file"));
        assert!(!Pattern::new("[").matches("["));
    }
}
