//! LLM providers behind one interface, over a canonical message model.
//!
//! A [`ChatRequest`] (system / user / assistant / tool messages, tool definitions, sampling options) goes to
//! a [`Provider`], which answers with a [`ChatResponse`] (text, tool calls, optional reasoning, usage, finish
//! reason). Adapters translate the model to each provider's wire format and back: [`openai`] (Chat
//! Completions, any OpenAI-compatible server), [`anthropic`] (Messages) and [`gemini`] (generateContent).
//! [`client`] adds what every HTTP provider needs: timeouts, retries with backoff that honour `Retry-After`, a
//! concurrency limit and a request rate limit. API keys are held as [`ApiKey`], which never prints.

pub mod anthropic;
pub mod attempts;
pub mod cassette;
pub mod client;
pub mod config;
pub mod gemini;
pub mod mock;
pub mod openai;
pub mod pricing;
pub mod tokens;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json, json};

/// How the note an agent step adds to each request about its progress begins. The note is not part of the
/// conversation: it is written fresh for every request and never kept, and the `mock` provider's `match`
/// does not read it.
pub const STATUS_NOTE: &str = "[run status]";

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    /// The result of a tool call, answering the assistant.
    Tool,
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

impl Message {
    pub fn system(text: impl Into<String>) -> Self {
        Message {
            role: Role::System,
            parts: vec![Part::Text(text.into())],
        }
    }

    pub fn user(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            parts: vec![Part::Text(text.into())],
        }
    }

    pub fn assistant(parts: Vec<Part>) -> Self {
        Message {
            role: Role::Assistant,
            parts,
        }
    }

    /// The result of tool call `id` (named `name`), as the provider will read it.
    pub fn tool_result(
        id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult(ToolResult {
                id: id.into(),
                name: name.into(),
                content: content.into(),
                is_error: false,
            })],
        }
    }

    /// The message's text parts, joined.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("")
    }
}

/// A piece of a message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Part {
    Text(String),
    /// The model's reasoning, when the provider returns it. `signature` is an opaque token some providers
    /// (Anthropic thinking, Gemini thought signatures) need back unchanged in the next request.
    Reasoning {
        text: String,
        signature: Option<String>,
    },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
}

/// A tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call (made up when the provider gives none), echoed by the result.
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: an object when they parse as JSON, else the raw text.
    pub arguments: Json,
    /// Gemini's thought signature for this call, returned unchanged with the call in the next request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// What a tool call returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub id: String,
    pub name: String,
    pub content: String,
    pub is_error: bool,
}

/// A tool the model may call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: Json,
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    /// Some tool.
    Required,
    /// This tool.
    Tool(String),
}

/// One request to a model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    /// Ask for a JSON answer matching this schema, where the provider supports it.
    pub output_schema: Option<Json>,
}

/// Tokens a call used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens served from the provider's cache (part of `input_tokens`).
    pub cached_input_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
    }
}

/// Why the model stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    ToolCalls,
    /// The token limit cut the answer.
    Length,
    ContentFilter,
    /// A reason this version does not know, or none given.
    Other(String),
}

/// The model's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The assistant message: text, reasoning and tool calls, in the provider's order.
    pub message: Message,
    pub usage: Usage,
    /// `false` when the provider reported no usage.
    pub usage_reported: bool,
    pub finish_reason: FinishReason,
    /// The model that answered, as the provider names it.
    pub model: String,
    /// The provider's id for the request or response, for support tickets.
    pub request_id: Option<String>,
}

impl ChatResponse {
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.message.parts.iter().filter_map(|p| match p {
            Part::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    pub fn text(&self) -> String {
        self.message.text()
    }
}

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct LlmError {
    /// `provider \`name\`: ...`, with the HTTP status and the provider's own message when there is one.
    pub message: String,
    pub status: Option<u16>,
    /// Worth another attempt: 429, 5xx, 529, connection problems, timeouts.
    pub retryable: bool,
    /// What the provider asked to wait (`Retry-After`).
    pub retry_after: Option<Duration>,
    /// No connection could be made, or it broke (what `retry.on: [connect]` names).
    pub connect: bool,
}

impl LlmError {
    pub fn fatal(message: impl Into<String>) -> Self {
        LlmError {
            message: message.into(),
            status: None,
            retryable: false,
            retry_after: None,
            connect: false,
        }
    }
}

/// A boxed future, as providers return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Something that answers chat requests.
pub trait Provider: Send + Sync + fmt::Debug {
    /// The provider's name in the spec (for messages).
    fn name(&self) -> &str;
    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>>;
    /// The embeddings of `inputs` from `model`, in order. Only OpenAI-compatible providers have them
    /// (`/embeddings`); the others say so.
    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>> {
        let _ = (model, inputs);
        Box::pin(async move {
            Err(LlmError::fatal(format!(
                "provider `{}` has no embeddings endpoint",
                self.name()
            )))
        })
    }
}

/// An API key. It is never shown: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The property of the object a final answer is wrapped in when its schema's root is not an object.
pub const ANSWER_PROPERTY: &str = "value";

/// The schema sent to a provider for a step's final answer (`ChatRequest::output_schema`). Structured
/// outputs need an object at the root (OpenAI's `response_format` and Anthropic's tool `input_schema`
/// refuse anything else), so any other schema (`{type: string, enum: [feature, fix, chore]}`) is sent as the
/// one required property [`ANSWER_PROPERTY`] of an object; [`answer_value`] takes the answer back out.
pub fn answer_schema(schema: &Json) -> Json {
    if schema.get("type").and_then(Json::as_str) == Some("object") {
        return schema.clone();
    }
    json!({
        "type": "object",
        "properties": { ANSWER_PROPERTY: schema },
        "required": [ANSWER_PROPERTY],
        "additionalProperties": false,
    })
}

/// A final answer's value, for a step whose schema is `schema`, from the `text` the model gave and that
/// text read as JSON (`parsed`): the JSON when `schema` accepts it; else, for a schema sent wrapped
/// ([`answer_schema`]), the wrapped value when `schema` accepts it; else the text itself, trimmed, when
/// `schema` accepts a string (a bare `fix` against an enum of strings). `None` when nothing matches.
pub fn answer_value(
    schema: &Json,
    accepts: impl Fn(&Json) -> bool,
    text: &str,
    parsed: Option<Json>,
) -> Option<Json> {
    if let Some(value) = parsed {
        if accepts(&value) {
            return Some(value);
        }
        let wrapped = answer_schema(schema) != *schema;
        if wrapped
            && let Json::Object(mut map) = value
            && map.len() == 1
            && let Some(inner) = map.remove(ANSWER_PROPERTY)
            && accepts(&inner)
        {
            return Some(inner);
        }
    }
    let bare = Json::String(text.trim().to_owned());
    accepts(&bare).then_some(bare)
}

/// Tool arguments as the model wrote them: parsed when they are JSON text, kept as text otherwise (weak
/// models write broken JSON; the agent layer decides what to do with it).
pub fn arguments_from_text(text: &str) -> Json {
    if text.trim().is_empty() {
        return Json::Object(Map::new());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Json::String(text.to_owned()))
}

/// Tool arguments as JSON text for providers that want a string.
pub fn arguments_to_text(arguments: &Json) -> String {
    match arguments {
        Json::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

/// Most characters of a provider's error message kept (in the report, the trail and the step's error).
pub const PROVIDER_MESSAGE_CHARS: usize = 2000;

/// The provider's own error message from an error body: `error.message`, `message` or `error` as text, or
/// the start of the body; at most [`PROVIDER_MESSAGE_CHARS`] characters of it, with a note of the rest.
pub fn provider_message(body: &str) -> String {
    let parsed: Option<Json> = serde_json::from_str(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .and_then(Json::as_str)
    });
    let Some(message) = found else {
        let shown: String = body.trim().chars().take(200).collect();
        return if shown.is_empty() {
            "no message".to_owned()
        } else {
            shown
        };
    };
    match crate::text::split_at_chars(message, PROVIDER_MESSAGE_CHARS) {
        None => message.to_owned(),
        Some((head, more)) => format!("{head} [... cut: {more} more characters]"),
    }
}

/// What servers without native tool calling answer a request that offers tools: llama.cpp started without
/// `--jinja` (HTTP 500), Ollama with a model that has no tool template, vLLM started without
/// `--enable-auto-tool-choice`, and the like.
const TOOLS_UNSUPPORTED: &[&str] = &[
    "tools param requires --jinja",
    "does not support tools",
    "tool choice requires --enable-auto-tool-choice",
    "does not support function calling",
    "tools are not supported",
    "tool calling is not supported",
    "function calling is not supported",
];

/// Whether a failed call's message (`provider `x`: HTTP 500: ...`) says the server does not take tools:
/// one of the known answers above, whatever the status, or a 400 naming tools that is not about a tool's
/// schema or the context length.
pub fn refuses_tools(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    if TOOLS_UNSUPPORTED
        .iter()
        .any(|known| message.contains(known))
    {
        return true;
    }
    message.contains("http 400")
        && (message.contains("tool") || message.contains("function call"))
        && !["schema", "parameters", "context", "token", "length"]
            .iter()
            .any(|w| message.contains(w))
}

#[cfg(test)]
mod answer_tests {
    use super::*;

    #[test]
    fn an_answer_is_taken_from_json_from_its_wrapping_or_bare() {
        let kinds = json!({ "type": "string", "enum": ["feature", "fix"] });
        let object = json!({ "type": "object", "properties": { "value": { "type": "number" } } });
        assert_eq!(answer_schema(&object), object, "an object is sent as it is");
        assert_eq!(answer_schema(&kinds)["properties"]["value"], kinds);
        let is_kind = |v: &Json| v == "feature" || v == "fix";
        let read =
            |text: &str| answer_value(&kinds, is_kind, text, serde_json::from_str(text).ok());
        assert_eq!(read(r#"{"value": "fix"}"#), Some(json!("fix")));
        assert_eq!(read(r#""fix""#), Some(json!("fix")));
        assert_eq!(read(" fix\n"), Some(json!("fix")));
        assert_eq!(read(r#"{"value": "fix", "more": 1}"#), None);
        assert_eq!(read(r#"{"value": "chore"}"#), None);
        assert_eq!(read("chore"), None);
        // An object schema's answer is never unwrapped: `value` is one of its own properties.
        let is_object = |v: &Json| v.is_object();
        let wrapped = json!({ "value": 1 });
        assert_eq!(
            answer_value(&object, is_object, "", Some(wrapped.clone())),
            Some(wrapped)
        );
        assert_eq!(answer_value(&object, is_object, "ten", None), None);
    }
}
