//! The spec as written: every key of the workflow format, with spans, in the shape users write it.
//!
//! These types are deserialized from a [`Node`] tree only after the structural check in
//! `validate::structure` has passed, and their JSON Schema (`schemas/workflow.schema.json`) is generated
//! from them. Nothing here checks meaning; that is `validate`'s job.

mod cache;
mod consensus;
mod de;
mod delegate;
pub mod node;
pub mod parse;
pub mod schema;
mod spanned;
mod toml;
mod trigger;
mod values;
mod yaml;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use cache::{Cache, CacheOptions};
pub use consensus::{Consensus, ResolveBy};
pub use de::from_node;
pub use delegate::{DEFAULT_MAX_DELEGATION_DEPTH, Delegate};
pub use node::{Key, Node, NodeKind, PathSegment};
pub use parse::{Limits, parse};
pub use spanned::Spanned;
pub use trigger::{
    Cron, CronError, CronText, MAX_CATCH_UP, Overlap, TimeZoneText, TriggerDef, WebhookDef,
    time_zones,
};
pub use values::{DurationText, Pattern};

/// A template string (minijinja syntax), rendered once at run time.
pub type Template = Spanned<String>;
/// A bare minijinja expression, as used by `if` and `foreach`.
pub type Expression = Spanned<String>;
/// A duration such as `30s`, `1m30s` or `500ms`.
pub type Duration = Spanned<DurationText>;
/// A JSON Schema, written inline in YAML or TOML.
pub type JsonSchemaValue = Node;

/// A workflow spec file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "Archon workflow",
    description = "An Archon workflow spec (YAML or TOML)"
)]
pub struct Spec {
    /// Editor hint pointing at this schema; ignored by Archon.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// The workflow's name: a slug such as `release-notes`. Defaults to the file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Spanned<String>>,
    /// What the workflow does, for people and for LLM planners.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Typed parameters: one JSON Schema per input. An input without `default` is required.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    #[schemars(schema_with = "inputs_schema")]
    pub inputs: IndexMap<Spanned<String>, JsonSchemaValue>,
    /// Environment variables for command tools (values are templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<Spanned<String>, Template>,
    /// Names of secrets, read from the environment variables of the same name, else from `.env` beside the spec; usable only in tool arguments, never in prompts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<Spanned<String>>,
    /// LLM providers, the default one and budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmConfig>,
    /// Tools this workflow defines.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub tools: IndexMap<Spanned<String>, ToolDef>,
    /// Named roles for LLM steps.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub agents: IndexMap<Spanned<String>, AgentDef>,
    /// Memory settings for agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryConfig>,
    /// Agent Skills every agent may use: a skill directory (with `SKILL.md`) or a directory of them,
    /// relative to this spec, or the bare name of a project skill in `.agents/skills/` beside it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<Spanned<String>>,
    /// The task graph.
    #[serde(deserialize_with = "exact_list")]
    pub steps: Vec<Step>,
    /// Interception rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// The run's outputs, as templates over step results.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub outputs: IndexMap<Spanned<String>, Node>,
    /// Defaults for every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<Defaults>,
    /// Time limit for the whole run, such as `10m`: when it passes, the steps still running are stopped
    /// and the run fails (`run timed out after 10m`). In a sub-workflow, the limit of its call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// What `http` tools may reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// What starts the workflow under `archon serve`: `cron` schedules and a `webhook`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triggers: Vec<Spanned<TriggerDef>>,
    /// Most steps of this workflow running at once, across all its runs on all workers (`archon
    /// worker`); a run in one process runs at most this many of its steps at once too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Spanned<u32>>,
}

/// Network access for `http` tools. Loopback, private, link-local and cloud metadata addresses are refused
/// unless allowed here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// Host names, IP addresses or CIDR ranges (`127.0.0.1`, `10.0.0.0/8`, `intranet.example`) that may be
    /// reached even though they resolve to such addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Spanned<String>>,
}

/// Declares a struct that has every field of a step body (what the step does and how), after its own
/// fields, and a `body()` view over them. Steps and fallbacks share these fields; serde's `flatten` would
/// lose spans, so the fields are written out in each struct instead.
macro_rules! with_step_body {
    (
        $(#[$meta:meta])*
        pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident : $ty:ty,)* }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// A tool to call: built-in, declared in `tools`, composite or MCP (`server.tool`).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub tool: Option<Spanned<String>>,
            /// An LLM agent goal (template): a ReAct loop over the allowed `tools`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub goal: Option<Template>,
            /// A goal for the LLM planner, which writes sub-steps in this same format.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub plan: Option<Box<Template>>,
            /// A sub-workflow file, relative to this spec.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub workflow: Option<Box<Spanned<String>>>,
            /// Arguments for `tool` or inputs for `workflow` (strings inside are templates).
            #[serde(rename = "with", default, skip_serializing_if = "Option::is_none")]
            #[schemars(schema_with = "args_schema")]
            pub args: Option<Node>,
            /// Extra context for an LLM step (template or structured value).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub context: Option<Box<Node>>,
            /// What the final answer should look like (goes into the prompt).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub expected_output: Option<Box<Template>>,
            /// JSON Schema the step's output must match.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schemars(schema_with = "json_schema_schema")]
            pub output_schema: Option<Box<JsonSchemaValue>>,
            /// Tools an LLM step may call (names or globs of built-in and declared tools).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub tools: Option<Vec<Spanned<Pattern>>>,
            /// Most ReAct iterations for an LLM step (default 10).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub max_iterations: Option<Box<Spanned<u32>>>,
            /// A named agent from `agents` to run an LLM step as.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub agent: Option<Box<Spanned<String>>>,
            /// An LLM provider from `llm.providers` for this step.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub provider: Option<Box<Spanned<String>>>,
            /// Agents from `agents` to ask this step's `goal`, each on its own (at least 2, not with
            /// `agent`); `consensus` says how their answers become the step's answer.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub ask: Option<Box<[Spanned<String>]>>,
            /// How the answers of the agents in `ask` become the step's answer: `{ by: vote, field }`,
            /// `{ by: judge, judge }` or `{ by: first }`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub consensus: Option<Box<Consensus>>,
            /// Retry policy; `attempts` counts every attempt.
            // Boxed, as are the fields an LLM step alone uses and the rarer ones: a step of 10,000 keeps
            // 8 bytes for each it does not write, instead of up to 144.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub retry: Option<Box<Retry>>,
            /// Time limit for one attempt, such as `30s`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub timeout: Option<Box<Duration>>,
            /// `fail` (default) fails the run; `continue` lets dependents decide with `if`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub on_error: Option<Spanned<OnError>>,
            /// Whether running this step twice is harmless: `true` lets it start without waiting for its
            /// record to be durable and lets `resume` run it again after a crash; `false` treats it as
            /// unsafe to repeat whatever its tools say. Default: what its tools say.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub idempotent: Option<Spanned<bool>>,
        }

        impl $name {
            /// The fields that say what the step does, shared with fallbacks.
            pub fn body(&self) -> Body<'_> {
                Body {
                    description: self.description.as_ref(),
                    tool: self.tool.as_ref(),
                    goal: self.goal.as_ref(),
                    plan: self.plan.as_deref(),
                    workflow: self.workflow.as_deref(),
                    args: self.args.as_ref(),
                    context: self.context.as_deref(),
                    expected_output: self.expected_output.as_deref(),
                    output_schema: self.output_schema.as_deref(),
                    tools: self.tools.as_deref(),
                    max_iterations: self.max_iterations.as_deref(),
                    agent: self.agent.as_deref(),
                    provider: self.provider.as_deref(),
                    ask: self.ask.as_deref(),
                    consensus: self.consensus.as_deref(),
                    retry: self.retry.as_deref(),
                    timeout: self.timeout.as_deref(),
                    on_error: self.on_error.as_ref(),
                    idempotent: self.idempotent.as_ref().map(|i| i.value),
                }
            }
        }
    };
}

with_step_body! {
    /// One step of the task graph. Exactly one of `tool`, `goal`, `plan` or `workflow`, or only a
    /// `description`, which makes the step unspecified: the engine falls back to `defaults.unspecified`.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Step {
        /// Unique identifier, used as `steps.<id>` in templates: a letter or `_`, then letters, digits, `_`.
        pub id: Spanned<String>,
        /// What the step does. For an unspecified step this is the goal given to the LLM (a template).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub description: Option<Template>,
        /// Steps that must finish first, without passing data.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub needs: Vec<Spanned<String>>,
        /// Run only when this expression is true. Replaces the default "all needs succeeded".
        #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
        pub condition: Option<Expression>,
        /// Run the step once per item of a list: an expression that gives one (`steps.a.output.files`), or a
        /// list written out (`[a, b]`, whose strings are templates); results keep input order.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "items_schema")]
        pub foreach: Option<Node>,
        /// Run the step once per combination of these lists (their cross product, the first name varying
        /// slowest), each a list written out or an expression that gives one; read the combination as
        /// `matrix.<name>`. Results keep that order. Not with `foreach`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(schema_with = "matrix_schema")]
        pub matrix: Option<Box<IndexMap<Spanned<String>, Node>>>,
        /// Most items of a `foreach` (or combinations of a `matrix`) running at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub max_parallel: Option<Spanned<u32>>,
        /// Named values shaped from the step's result (templates over `steps.<this id>`).
        #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
        pub outputs: IndexMap<Spanned<String>, Node>,
        /// A step body tried after the last attempt fails.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub fallback: Option<Box<Fallback>>,
        /// `required` pauses for a human before the step runs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub approval: Option<Spanned<Approval>>,
        /// Reuse an earlier successful result: `true` (keyed by the step's content) or `{ key, ttl }`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cache: Option<Box<Spanned<Cache>>>,
        /// Labels a worker (`archon worker --labels`) or a local run (`archon run --labels`) must have to
        /// run this step, such as `[gpu]`; with those of the tools and sub-workflows it calls.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub runs_on: Vec<Spanned<String>>,
    }
}

with_step_body! {
    /// A step body tried after the last attempt of a step fails.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct Fallback {
        /// What the fallback does; for a fallback with no kind, the goal given to the LLM.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub description: Option<Template>,
    }
}

impl Spec {
    /// The agent role an LLM step plays: its own `agent`, else `defaults.agent`.
    pub fn agent_name<'a>(&'a self, body: Body<'a>) -> Option<&'a str> {
        body.agent
            .or_else(|| self.defaults.as_ref().and_then(|d| d.agent.as_ref()))
            .map(|a| a.value.as_str())
    }

    /// The declared agent an LLM step plays, if any.
    pub fn agent_of<'a>(&'a self, body: Body<'a>) -> Option<&'a AgentDef> {
        self.agent_name(body).and_then(|name| self.agents.get(name))
    }

    /// The tool names or globs an LLM step may use: its own `tools`, else its agent's.
    pub fn tool_patterns<'a>(&'a self, body: Body<'a>) -> Vec<&'a Pattern> {
        match body.tools {
            Some(tools) => tools.iter().map(|t| &t.value).collect(),
            None => self
                .agent_of(body)
                .map(|a| a.tools.iter().map(|t| &t.value).collect())
                .unwrap_or_default(),
        }
    }
}

impl Step {
    /// Whether the step runs once per item (`foreach`) or combination (`matrix`).
    pub fn repeats(&self) -> bool {
        self.foreach.is_some() || self.matrix.is_some()
    }
}

/// A borrowed view of the fields a step and a fallback share.
#[derive(Clone, Copy, Debug)]
pub struct Body<'a> {
    pub description: Option<&'a Template>,
    pub tool: Option<&'a Spanned<String>>,
    pub goal: Option<&'a Template>,
    pub plan: Option<&'a Template>,
    pub workflow: Option<&'a Spanned<String>>,
    pub args: Option<&'a Node>,
    pub context: Option<&'a Node>,
    pub expected_output: Option<&'a Template>,
    pub output_schema: Option<&'a JsonSchemaValue>,
    pub tools: Option<&'a [Spanned<Pattern>]>,
    pub max_iterations: Option<&'a Spanned<u32>>,
    pub agent: Option<&'a Spanned<String>>,
    pub provider: Option<&'a Spanned<String>>,
    pub ask: Option<&'a [Spanned<String>]>,
    pub consensus: Option<&'a Consensus>,
    pub retry: Option<&'a Retry>,
    pub timeout: Option<&'a Duration>,
    pub on_error: Option<&'a Spanned<OnError>>,
    pub idempotent: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    Fail,
    Continue,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Approval {
    /// Pause for a human before the step runs.
    Required,
    /// Never ask (rules may still ask).
    Never,
}

/// Retry policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Total attempts, the first included (at least 1).
    pub attempts: Spanned<u32>,
    /// `fixed` or `exponential` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Spanned<Backoff>>,
    /// Delay before the second attempt, such as `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Duration>,
    /// Upper bound for exponential delays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<Duration>,
    /// Randomise delays (full jitter). Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<bool>,
    /// What to retry on: `error`, `timeout` (default both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<Spanned<RetryOn>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    Fixed,
    Exponential,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(transform = rate_limited_as_a_number)]
pub enum RetryOn {
    /// Any failure that is not permanent (the default, with `timeout`).
    Error,
    /// The attempt ran out of time.
    Timeout,
    /// An HTTP status in 5xx.
    #[serde(rename = "5xx")]
    ServerError,
    /// An HTTP status in 4xx other than 408 and 429 (never retried unless named).
    #[serde(rename = "4xx")]
    ClientError,
    /// HTTP 429 or 408: the server asks to come back later.
    #[serde(rename = "429")]
    RateLimited,
    /// A connection that could not be made, or broke.
    Connect,
}

/// `429` in `retry.on` may be written unquoted, as YAML and TOML users write a status: the schema says so
/// too, so that an editor does not flag what `validate` accepts.
fn rate_limited_as_a_number(schema: &mut schemars::Schema) {
    let Some(branches) = schema.get_mut("oneOf").and_then(|b| b.as_array_mut()) else {
        return;
    };
    let Some(quoted) = branches
        .iter()
        .position(|b| b.get("const").and_then(|c| c.as_str()) == Some("429"))
    else {
        return;
    };
    let mut number = branches[quoted].clone();
    if let Some(object) = number.as_object_mut() {
        object.insert("type".to_owned(), "integer".into());
        object.insert("const".to_owned(), 429.into());
    }
    branches.insert(quoted + 1, number);
}

/// LLM configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmConfig {
    /// The provider LLM steps use unless they name another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Spanned<String>>,
    /// Named providers.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub providers: IndexMap<Spanned<String>, ProviderDef>,
    /// Limits for the whole run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<LlmBudget>,
}

/// One LLM provider.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderDef {
    /// `openai` (any OpenAI-compatible server), `anthropic`, `gemini` or `mock`.
    pub kind: Spanned<ProviderKind>,
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// API base URL (for OpenAI-compatible servers such as llama.cpp, Ollama or vLLM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<Spanned<String>>,
    /// Environment variable holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Time limit for one request, such as `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// How tools are offered to the model: `native`, `text` or `auto` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_mode: Option<Spanned<ToolMode>>,
    /// For `openai`: the request field the token limit always goes in, `max_completion_tokens` or
    /// `max_tokens`. Without it: `max_completion_tokens` for OpenAI's reasoning models (`o1`, `o3`, `o4`,
    /// `gpt-5`), `max_tokens` for other models, and the other field once a server refuses one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_param: Option<Spanned<MaxTokensParam>>,
    /// Most requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Most requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// The model's context window in tokens (default: a built-in table of well-known models, else 8192).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<Spanned<u32>>,
    /// The share of the context window at which an agent step compacts its earlier turns into a summary:
    /// a number above 0 and at most 1 (default 0.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compact_at: Option<Spanned<f64>>,
    /// Prices in USD per million tokens, overriding the built-in table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
    /// For `mock`: scripted assistant turns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turns: Vec<MockTurn>,
    /// For `mock`: a YAML or JSON file of scripted turns, relative to the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Spanned<String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    Gemini,
    Mock,
    /// Whichever of `openai`, `anthropic` and `gemini` the environment configures: `ARCHON_PROVIDER`, else
    /// the first with a key (or, for `openai`, a base URL) set.
    Auto,
}

/// The field of a Chat Completions request that carries the token limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensParam {
    MaxCompletionTokens,
    MaxTokens,
}

impl MaxTokensParam {
    /// The request field.
    pub fn name(self) -> &'static str {
        match self {
            MaxTokensParam::MaxCompletionTokens => "max_completion_tokens",
            MaxTokensParam::MaxTokens => "max_tokens",
        }
    }

    /// The other field.
    pub fn other(self) -> Self {
        match self {
            MaxTokensParam::MaxCompletionTokens => MaxTokensParam::MaxTokens,
            MaxTokensParam::MaxTokens => MaxTokensParam::MaxCompletionTokens,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolMode {
    Native,
    Text,
    Auto,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pricing {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<f64>,
}

/// One scripted assistant turn of the `mock` provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MockTurn {
    /// Use this turn only when the last user message contains this text.
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The assistant's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Tool calls the assistant makes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<MockToolCall>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MockToolCall {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Node>,
}

/// Run-wide LLM limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LlmBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_llm_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
}

/// A tool defined by the workflow. Exactly one of `command`, `http`, `steps`, `workflow` or `mcp`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDef {
    /// What the tool does (shown to LLMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the tool's arguments (an object schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_schema_schema")]
    pub parameters: Option<JsonSchemaValue>,
    /// Run a program: argv as a list of templates; never a shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Spanned<Vec<Template>>>,
    /// Make an HTTP request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<Spanned<HttpTool>>,
    /// A composite tool: a small DAG of steps over the tool's arguments (`args.<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Spanned<Vec<Step>>>,
    /// For a composite tool: the result, as a template over its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Node>,
    /// A sub-workflow used as a tool (its inputs are the arguments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<Spanned<String>>,
    /// An MCP server whose tools are called as `<name>.<tool>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Spanned<McpServer>>,
    /// How to read a command's standard output: `text` (default), `json` or `lines`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Spanned<OutputFormat>>,
    /// Extra environment for a command (values are templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<Spanned<String>, Template>,
    /// Working directory for a command, relative to the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<Template>,
    /// Standard input for a command (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<Template>,
    /// Exit codes that count as success (default `[0]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok_exit_codes: Option<Vec<i32>>,
    /// Default time limit for one call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Safe to repeat: a call in doubt after a crash may be re-run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// Calls chosen by an LLM ask for approval unless a rule allows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sensitive: Option<bool>,
    /// Labels the worker (or local run) must have to run a step that calls this tool, such as `[gpu]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs_on: Vec<Spanned<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpTool {
    /// HTTP method (default `GET`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Spanned<HttpMethod>>,
    /// URL (template).
    pub url: Template,
    /// Request headers (values are templates).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<Spanned<String>, Template>,
    /// JSON body (strings inside are templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<Node>,
    /// Raw body (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Template>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
}

/// An MCP server: started as a child process (`command`), reached over streamable HTTP (`url`), or read
/// from an `mcpServers` JSON file users already have (`from`). Its tools are called as `<name>.<tool>`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// Start a local server speaking MCP on its standard input and output: argv (templates), never a shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<Template>>,
    /// Environment of the server process (values are templates and may use `secrets`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub env: IndexMap<Spanned<String>, Template>,
    /// Working directory of the server process, relative to the workspace (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<Template>,
    /// Or connect to a server over streamable HTTP (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Template>,
    /// Headers of every HTTP request to the server (values are templates and may use `secrets`).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub headers: IndexMap<Spanned<String>, Template>,
    /// Or take the server from an `mcpServers` JSON file (`.mcp.json`, Claude Desktop or Code, Cursor),
    /// relative to the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Spanned<String>>,
    /// The entry of `from`'s `mcpServers` to use (default: this tool's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<Spanned<String>>,
    /// Only expose the server's tools whose names match these globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Spanned<Pattern>>>,
    /// Most time the server may take to start and answer `initialize` (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout: Option<Duration>,
    /// Most time one call may take without news from the server (default 60s; a step's `timeout` bounds
    /// it too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout: Option<Duration>,
    /// Most time one call may take when the server keeps reporting progress (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_call_timeout: Option<Duration>,
    /// How many times a server that exits during a run is started again (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<Spanned<u32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    Text,
    Json,
    Lines,
}

/// A named role for LLM steps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// System instructions (template over `inputs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<Template>,
    /// Provider from `llm.providers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Spanned<String>>,
    /// Tools this agent may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Spanned<Pattern>>,
    /// Other agents this one may delegate to, each offered as a tool (`delegate.<agent>` to rules): a
    /// name, or `{ agent, handoff, output_schema }`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delegates: Vec<Spanned<Delegate>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<Spanned<u32>>,
    /// Long-term memory across runs (see top-level `memory`): the `remember`, `recall`, `forget`, `note`
    /// and `notes` tools, and relevant memories recalled into the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
    /// Session notes without long-term memory: the `note` and `notes` tools, kept for the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<bool>,
    /// Agent Skills this agent may use besides the top-level `skills` (same forms).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<Spanned<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_mode: Option<Spanned<ToolMode>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
}

/// Long-term memory of the workflow's agents with `memory: true`, and where their notes are kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// The memory file, relative to the state directory (default `memory.db`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Spanned<String>>,
    /// Separates memories by namespace (template over `inputs` and `env`; default the workflow name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<Template>,
    /// Most memories recalled into an agent's prompt when its step starts (default 5; 0 for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recall: Option<Spanned<u32>>,
    /// Opt-in semantic retrieval: an OpenAI-compatible `/embeddings` endpoint, fused with BM25.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<Spanned<EmbeddingsConfig>>,
}

/// Which embedding model memories are embedded with.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmbeddingsConfig {
    /// A provider of `llm.providers` of kind `openai` (any OpenAI-compatible server).
    pub provider: Spanned<String>,
    /// The embedding model.
    pub model: String,
}

/// An interception rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<Spanned<String>>,
    /// When the rule is checked.
    pub on: Spanned<Trigger>,
    /// Which events it applies to (all when absent).
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<RuleMatch>,
    /// What to do.
    pub action: Spanned<Action>,
    /// Shown to the human or the LLM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `ask`: how long to wait for a human.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// For `ask`: the decision when the timeout passes (default `deny`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Spanned<Decision>>,
    /// For `redact`: argument paths or patterns to hide.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    BeforeRun,
    BeforeStep,
    BeforeTool,
    AfterStep,
    OnError,
    OnPlan,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Allow,
    Deny,
    Ask,
    Redact,
    Log,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Deny,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChosenBy {
    Llm,
    Spec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleMatch {
    /// Glob over tool names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Spanned<Pattern>>,
    /// Glob over step ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Spanned<Pattern>>,
    /// Glob over agent names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Spanned<Pattern>>,
    /// Who chose the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen_by: Option<Spanned<ChosenBy>>,
    /// An expression over the event: `args`, `step`, `tool`, `agent`, `run`.
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<Expression>,
}

/// Defaults for every step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// Most steps running at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<Spanned<u32>>,
    /// What a step with only a description becomes: `agent` (default) or `plan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unspecified: Option<Spanned<Unspecified>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iterations: Option<Spanned<u32>>,
    /// The agent LLM steps run as unless they name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Spanned<String>>,
    /// How many times in a run the planner may revise a plan after a planned step fails (default 2;
    /// `0` turns revisions off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replans: Option<Spanned<u32>>,
    /// Most tokens the skill catalog (each available skill's name and description) may take in an agent's
    /// system prompt (default 2000); skills past it are left out of the catalog with a note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_catalog_tokens: Option<Spanned<u32>>,
    /// How deep agents may delegate to agents that delegate in turn (default 3): an agent on the last
    /// level is not offered its delegates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delegation_depth: Option<Spanned<u32>>,
    /// Most delegations one agent step may make in all, at every depth (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delegations: Option<Spanned<u32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Unspecified {
    Agent,
    Plan,
}

pub(crate) fn json_schema_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "description": "A JSON Schema", "type": ["object", "boolean"] })
}

fn inputs_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": { "description": "A JSON Schema", "type": ["object", "boolean"] }
    })
}

fn items_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "description": "An expression that gives a list, or a list written out",
        "type": ["string", "array"]
    })
}

fn matrix_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {
            "description": "A list written out, or an expression that gives one",
            "type": ["string", "array"]
        }
    })
}

fn args_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object", "additionalProperties": true })
}

/// A list read into a vector of exactly its length. serde's own reserves at most 1 MiB and then doubles,
/// which left the steps of a 10,000-step spec in room for 19,776 (8 MB unused for as long as the
/// workflow lives). The length comes from the spec's own tree, whose size the parser bounds; it is capped
/// all the same for any other deserializer.
fn exact_list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Exact<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Exact<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let most = Limits::default().max_steps;
            let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(most));
            while let Some(item) = seq.next_element()? {
                items.push(item);
            }
            Ok(items)
        }
    }

    deserializer.deserialize_seq(Exact(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_steps_of_a_large_spec_take_the_room_they_need_and_no_more() {
        let mut text = String::from("name: wide\nsteps:\n");
        for i in 0..3000 {
            text.push_str(&format!(
                "  - {{ id: s{i}, tool: echo, with: {{ v: {i} }} }}\n"
            ));
        }
        let validation = crate::validate::validate_source("wide.yaml", text);
        let workflow = validation.workflow.expect("valid");
        // serde's own list would have reserved at most 1 MiB of steps and then doubled.
        assert_eq!(workflow.spec.steps.len(), 3000);
        assert_eq!(workflow.spec.steps.capacity(), 3000);
    }
}
