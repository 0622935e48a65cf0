//! The `cache` key of a step: `cache: true`, or `cache: { key, ttl }`.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{Duration, Template};

/// Whether a step reuses an earlier successful result: `true` (the key is the step's content), `false`,
/// or the options.
#[derive(Clone, Debug, PartialEq)]
pub enum Cache {
    Flag(bool),
    Options(CacheOptions),
}

/// How a step's results are cached.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheOptions {
    /// A template whose rendered text keys the result instead of the step's content (with the workflow's
    /// name, the step's id and, for a `foreach` step, the item).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<Template>,
    /// How long a result is reused, such as `7d` (default: until `archon cache clear`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
}

impl Cache {
    /// Whether the step's results are cached at all.
    pub fn enabled(&self) -> bool {
        !matches!(self, Cache::Flag(false))
    }

    /// The explicit key template, if any.
    pub fn key(&self) -> Option<&Template> {
        match self {
            Cache::Options(options) => options.key.as_ref(),
            Cache::Flag(_) => None,
        }
    }

    /// How long a result is reused, if limited.
    pub fn ttl(&self) -> Option<&Duration> {
        match self {
            Cache::Options(options) => options.ttl.as_ref(),
            Cache::Flag(_) => None,
        }
    }
}

impl Serialize for Cache {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Cache::Flag(flag) => serializer.serialize_bool(*flag),
            Cache::Options(options) => options.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Cache {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CacheVisitor;

        impl<'de> Visitor<'de> for CacheVisitor {
            type Value = Cache;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`true`, `false` or a mapping of `key` and `ttl`")
            }

            fn visit_bool<E: de::Error>(self, flag: bool) -> Result<Cache, E> {
                Ok(Cache::Flag(flag))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Cache, A::Error> {
                // The map's values keep their spans: they are read by the same deserializer.
                CacheOptions::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(Cache::Options)
            }
        }

        deserializer.deserialize_any(CacheVisitor)
    }
}

impl JsonSchema for Cache {
    fn schema_name() -> Cow<'static, str> {
        "Cache".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let options = generator.subschema_for::<CacheOptions>();
        schemars::json_schema!({
            "description": "`true` reuses an earlier successful result of the same content (tool, rendered arguments, tool definition; for LLM steps provider, model, prompt and tools); or `key` and `ttl`.",
            "anyOf": [{ "type": "boolean" }, options]
        })
    }
}
