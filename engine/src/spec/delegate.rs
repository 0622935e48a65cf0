//! An entry of an agent's `delegates`: an agent's name, or `{ agent, handoff, output_schema }`.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::{JsonSchemaValue, Spanned};

/// Levels of delegation unless `defaults.max_delegation_depth` says otherwise: the step's own agent is
/// level 0, and an agent on the last level is not offered its delegates.
pub const DEFAULT_MAX_DELEGATION_DEPTH: u32 = 3;

/// An agent another agent may hand work to, and on what terms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delegate {
    /// The delegate's name in `agents`.
    pub agent: Spanned<String>,
    /// The delegate takes the whole step over: the caller's turn ends and the delegate's answer is the
    /// step's.
    pub handoff: Option<bool>,
    /// What the delegate's answer must match before it goes back to the caller.
    pub output_schema: Option<Box<JsonSchemaValue>>,
}

/// The mapping form of an entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DelegateOptions {
    /// The agent to delegate to.
    agent: Spanned<String>,
    /// Hand the whole step to this agent: the caller's turn ends, and the delegate's answer (checked
    /// against the step's `output_schema`) is the step's final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    handoff: Option<bool>,
    /// JSON Schema the delegate's answer must match before it returns to the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::json_schema_schema")]
    output_schema: Option<Box<JsonSchemaValue>>,
}

impl Delegate {
    /// Whether the delegate takes the whole step over.
    pub fn hands_off(&self) -> bool {
        self.handoff == Some(true)
    }
}

impl super::Spec {
    /// How many levels deep the agents of one step may delegate (`defaults.max_delegation_depth`).
    pub fn max_delegation_depth(&self) -> u32 {
        self.defaults
            .as_ref()
            .and_then(|d| d.max_delegation_depth.as_ref())
            .map_or(DEFAULT_MAX_DELEGATION_DEPTH, |m| m.value)
    }
}

impl Spanned<Delegate> {
    /// The delegate's name, spanned where it is written (the whole entry for the short form).
    pub fn agent(&self) -> Spanned<String> {
        let span = if self.value.agent.span == crate::source::Span::default() {
            self.span
        } else {
            self.value.agent.span
        };
        Spanned::new(self.value.agent.value.clone(), span)
    }

    /// The delegate's name.
    pub fn name(&self) -> &str {
        &self.value.agent.value
    }
}

impl Serialize for Delegate {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.handoff.is_none() && self.output_schema.is_none() {
            return self.agent.serialize(serializer);
        }
        DelegateOptions {
            agent: self.agent.clone(),
            handoff: self.handoff,
            output_schema: self.output_schema.clone(),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Delegate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DelegateVisitor;

        impl<'de> Visitor<'de> for DelegateVisitor {
            type Value = Delegate;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an agent's name or a mapping of `agent`, `handoff` and `output_schema`",
                )
            }

            fn visit_str<E: de::Error>(self, name: &str) -> Result<Delegate, E> {
                // The entry's span is given to it by the `Spanned` around it.
                Ok(Delegate {
                    agent: Spanned::new(name.to_owned(), crate::source::Span::default()),
                    ..Delegate::default()
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Delegate, A::Error> {
                let options =
                    DelegateOptions::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Delegate {
                    agent: options.agent,
                    handoff: options.handoff,
                    output_schema: options.output_schema,
                })
            }
        }

        deserializer.deserialize_any(DelegateVisitor)
    }
}

impl JsonSchema for Delegate {
    fn schema_name() -> Cow<'static, str> {
        "Delegate".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let options = generator.subschema_for::<DelegateOptions>();
        schemars::json_schema!({
            "description": "An agent this one may delegate to: its name, or `agent` with `handoff` and `output_schema`.",
            "anyOf": [{ "type": "string" }, options]
        })
    }
}
