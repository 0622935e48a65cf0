//! `ask` and `consensus` on an LLM step: several agents answer the step's goal, and the step says how
//! their answers become its own.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Spanned;

/// How the answers of the agents in `ask` become the step's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Consensus {
    /// `vote`: the most common value of `field` among the valid answers wins (a tie goes to the value an
    /// agent earlier in `ask` gave); `judge`: agent `judge` reads every answer and gives the step's
    /// answer; `first`: the first valid answer wins and the other agents are cancelled.
    pub by: Spanned<ResolveBy>,
    /// For `vote`: the property of the step's `output_schema` whose value the agents vote on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<Spanned<String>>,
    /// For `judge`: the agent (one of `ask` or another) that reads every answer and gives the step's
    /// answer, checked against its `output_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<Spanned<String>>,
}

/// A way to resolve several agents' answers into one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResolveBy {
    /// The most common value of `field` wins; ties go to the earlier agent in `ask`.
    #[default]
    Vote,
    /// A judge agent reads every answer and gives the step's answer.
    Judge,
    /// The first valid answer wins; the other agents are cancelled.
    First,
}

impl ResolveBy {
    /// The name the spec writes.
    pub fn as_str(self) -> &'static str {
        match self {
            ResolveBy::Vote => "vote",
            ResolveBy::Judge => "judge",
            ResolveBy::First => "first",
        }
    }
}
