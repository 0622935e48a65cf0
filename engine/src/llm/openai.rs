//! The OpenAI Chat Completions adapter. It also serves every OpenAI-compatible server (llama.cpp, Ollama,
//! vLLM) through `base_url`, and so tolerates their quirks: an empty or unknown `finish_reason`, no
//! `usage`, tool arguments as a JSON string or as an object, content as a string or a list of parts,
//! reasoning in `reasoning_content`, tool calls without an id.

use std::sync::atomic::{AtomicU8, Ordering};

use serde_json::{Map, Value as Json, json};

use super::client::{Endpoint, Settings};
use super::{
    ApiKey, BoxFuture, ChatRequest, ChatResponse, FinishReason, LlmError, Message, Part, Provider,
    Role, ToolCall, ToolChoice, Usage, arguments_from_text, arguments_to_text,
};
use crate::spec::MaxTokensParam;

/// The public OpenAI API, used unless `base_url` (or `OPENAI_BASE_URL`) says otherwise.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// A Chat Completions endpoint.
#[derive(Debug)]
pub struct OpenAi {
    endpoint: Endpoint,
    /// Which field carries the token limit: [`BY_MODEL`], or a [`MaxTokensParam`] as [`code`] gives it.
    limit_field: AtomicU8,
    /// Set by the spec (`max_tokens_param`): kept even when a server refuses it.
    pinned: bool,
}

/// The token limit goes as the model's family needs, until a server says otherwise.
const BY_MODEL: u8 = 0;

/// How `limit_field` holds a chosen field (read back in `OpenAi::limit_field`).
fn code(param: MaxTokensParam) -> u8 {
    match param {
        MaxTokensParam::MaxCompletionTokens => 1,
        MaxTokensParam::MaxTokens => 2,
    }
}

impl OpenAi {
    pub fn new(
        name: impl Into<String>,
        base_url: impl Into<String>,
        key: Option<ApiKey>,
        settings: Settings,
    ) -> Result<Self, LlmError> {
        Ok(OpenAi {
            endpoint: Endpoint::new(name, base_url, key, settings)?,
            limit_field: AtomicU8::new(BY_MODEL),
            pinned: false,
        })
    }

    /// Which field carries the token limit, whatever the model and the server say.
    #[must_use]
    pub fn with_max_tokens_param(mut self, param: MaxTokensParam) -> Self {
        self.limit_field.store(code(param), Ordering::Relaxed);
        self.pinned = true;
        self
    }

    /// The field the token limit of a request for `model` goes in.
    fn limit_field(&self, model: &str) -> MaxTokensParam {
        match self.limit_field.load(Ordering::Relaxed) {
            1 => MaxTokensParam::MaxCompletionTokens,
            2 => MaxTokensParam::MaxTokens,
            _ if is_reasoning_model(model) => MaxTokensParam::MaxCompletionTokens,
            _ => MaxTokensParam::MaxTokens,
        }
    }

    async fn send(
        &self,
        body: &Json,
        resends: impl Fn(&LlmError) -> bool,
    ) -> Result<ChatResponse, LlmError> {
        let mut headers = Vec::new();
        if let Some(key) = &self.endpoint.key {
            headers.push(("authorization", format!("Bearer {}", key.expose())));
        }
        let url = format!("{}/chat/completions", self.endpoint.base_url);
        self.endpoint
            .client
            .post_and_read_resending(
                &url,
                &headers,
                body,
                |reply| parse_response(self.name(), &reply.body, reply.request_id),
                resends,
            )
            .await
    }
}

impl Provider for OpenAi {
    fn name(&self) -> &str {
        self.endpoint.client.name()
    }

    fn embed<'a>(
        &'a self,
        model: &'a str,
        inputs: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, LlmError>> {
        Box::pin(async move {
            let mut headers = Vec::new();
            if let Some(key) = &self.endpoint.key {
                headers.push(("authorization", format!("Bearer {}", key.expose())));
            }
            let url = format!("{}/embeddings", self.endpoint.base_url);
            let body = serde_json::json!({ "model": model, "input": inputs });
            self.endpoint
                .client
                .post_and_read(&url, &headers, &body, |reply| {
                    parse_embeddings(self.name(), &reply.body, inputs.len())
                })
                .await
        })
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let mut body = request_body(request);
            // `max_tokens` is what every compatible server knows (one that does not know a field ignores
            // it, and the limit would be lost without a word); OpenAI's reasoning models refuse it and
            // want `max_completion_tokens`. A server that refuses the field it was sent, naming it, is
            // sent the other one at once, and from then on.
            let field = self.limit_field(&request.model);
            let other = field.other();
            let limited = rename(&mut body, "max_tokens", field.name());
            let switches = |e: &LlmError| {
                limited && !self.pinned && refuses_field(e, field.name(), other.name())
            };
            match self.send(&body, switches).await {
                Err(e) if switches(&e) => {
                    self.limit_field.store(code(other), Ordering::Relaxed);
                    rename(&mut body, field.name(), other.name());
                    self.send(&body, |_| false).await
                }
                answered => answered,
            }
        })
    }
}

/// OpenAI's reasoning models (`o1`, `o3`, `o4`, `gpt-5` and their variants, with or without a `vendor/`
/// prefix), which refuse `max_tokens`.
pub fn is_reasoning_model(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model);
    ["o1", "o3", "o4", "gpt-5"].iter().any(|family| {
        name.strip_prefix(family)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['-', '.', ':']))
    })
}

/// Moves `body[from]` to `body[to]`; whether there was one.
fn rename(body: &mut Json, from: &str, to: &str) -> bool {
    let Some(object) = body.as_object_mut() else {
        return false;
    };
    match object.remove(from) {
        Some(value) => {
            object.insert(to.to_owned(), value);
            true
        }
        None => false,
    }
}

/// Whether a server refused the request because it does not take the field `sent` (a 400 or 422 saying
/// so, naming it before `other` when it names both, as OpenAI's "Unsupported parameter: 'max_tokens' ...
/// Use 'max_completion_tokens' instead" does). A limit too large for the context is not that.
fn refuses_field(e: &LlmError, sent: &str, other: &str) -> bool {
    let message = e.message.to_ascii_lowercase();
    let Some(at) = message.find(sent) else {
        return false;
    };
    matches!(e.status, Some(400 | 422))
        && [
            "unsupported",
            "not supported",
            "unrecognized",
            "unknown",
            "not permitted",
            "not allowed",
            "extra inputs",
        ]
        .iter()
        .any(|w| message.contains(w))
        && message.find(other).is_none_or(|o| at < o)
}

/// The Chat Completions request for `request`, its token limit as `max_tokens` (see [`OpenAi`]).
pub fn request_body(request: &ChatRequest) -> Json {
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        match message.role {
            Role::System => messages.push(json!({ "role": "system", "content": message.text() })),
            Role::User => messages.push(json!({ "role": "user", "content": message.text() })),
            Role::Assistant => {
                let calls: Vec<Json> = message
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall(call) => Some(json!({
                            "id": call.id,
                            "type": "function",
                            "function": { "name": call.name, "arguments": arguments_to_text(&call.arguments) },
                        })),
                        _ => None,
                    })
                    .collect();
                let text = message.text();
                let mut out = json!({
                    "role": "assistant",
                    "content": if text.is_empty() && !calls.is_empty() { Json::Null } else { Json::String(text) },
                });
                if !calls.is_empty() {
                    out["tool_calls"] = Json::Array(calls);
                }
                messages.push(out);
            }
            // One `tool` message per result.
            Role::Tool => {
                for part in &message.parts {
                    if let Part::ToolResult(result) = part {
                        messages.push(json!({
                            "role": "tool",
                            "tool_call_id": result.id,
                            "content": result.content,
                        }));
                    }
                }
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), Json::String(request.model.clone()));
    body.insert("messages".into(), Json::Array(messages));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": { "name": t.name, "description": t.description, "parameters": t.parameters },
                })
            })
            .collect();
        body.insert("tools".into(), Json::Array(tools));
        body.insert(
            "tool_choice".into(),
            match &request.tool_choice {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Tool(name) => {
                    json!({ "type": "function", "function": { "name": name } })
                }
            },
        );
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    if !request.stop.is_empty() {
        body.insert("stop".into(), json!(request.stop));
    }
    if let Some(schema) = &request.output_schema {
        body.insert(
            "response_format".into(),
            json!({ "type": "json_schema", "json_schema": { "name": "output", "schema": schema } }),
        );
    }
    Json::Object(body)
}

/// Reads a Chat Completions response.
pub fn parse_response(
    provider: &str,
    body: &Json,
    request_id: Option<String>,
) -> Result<ChatResponse, LlmError> {
    let bad = |what: &str| LlmError::fatal(format!("provider `{provider}`: {what}"));
    if let Some(message) = body.pointer("/error/message").and_then(Json::as_str) {
        return Err(bad(&format!("the response is an error: {message}")));
    }
    let choice = body
        .get("choices")
        .and_then(Json::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| bad("the response has no `choices`"))?;
    let message = choice.get("message").unwrap_or(&Json::Null);
    let mut parts = Vec::new();
    for key in ["reasoning_content", "reasoning"] {
        if let Some(text) = message
            .get(key)
            .and_then(Json::as_str)
            .filter(|t| !t.is_empty())
        {
            parts.push(Part::Reasoning {
                text: text.to_owned(),
                signature: None,
            });
            break;
        }
    }
    let refusal = message
        .get("refusal")
        .and_then(Json::as_str)
        .filter(|r| !r.is_empty());
    match message.get("content") {
        Some(Json::String(text)) if !text.is_empty() => parts.push(Part::Text(text.clone())),
        Some(Json::Array(items)) => {
            let text: String = items
                .iter()
                .filter_map(|i| i.get("text").and_then(Json::as_str))
                .collect();
            if !text.is_empty() {
                parts.push(Part::Text(text));
            }
        }
        _ => {}
    }
    let calls = message.get("tool_calls").and_then(Json::as_array);
    for (index, call) in calls.into_iter().flatten().enumerate() {
        let function = call.get("function").unwrap_or(&Json::Null);
        let name = function
            .get("name")
            .and_then(Json::as_str)
            .unwrap_or_default();
        let arguments = match function.get("arguments") {
            Some(Json::String(text)) => arguments_from_text(text),
            Some(Json::Null) | None => Json::Object(Map::new()),
            Some(other) => other.clone(),
        };
        let id = call
            .get("id")
            .and_then(Json::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| format!("call_{index}"), str::to_owned);
        parts.push(Part::ToolCall(ToolCall {
            id,
            name: name.to_owned(),
            arguments,
            signature: None,
        }));
    }
    // A refusal is what the model said, whatever content came with it.
    if let Some(refusal) = refusal {
        parts.retain(|p| !matches!(p, Part::Text(_)));
        parts.push(Part::Text(refusal.to_owned()));
    }
    let has_calls = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
    let finish_reason = match choice.get("finish_reason").and_then(Json::as_str) {
        // A refusal comes with `finish_reason: stop`: it is no answer all the same.
        _ if refusal.is_some() => FinishReason::ContentFilter,
        Some("stop") => FinishReason::Stop,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        // Empty or unknown: what the message holds says more.
        _ if has_calls => FinishReason::ToolCalls,
        Some(other) if !other.is_empty() => FinishReason::Other(other.to_owned()),
        _ => FinishReason::Stop,
    };
    let usage = body.get("usage").filter(|u| u.is_object());
    let count = |pointer: &str| {
        usage
            .and_then(|u| u.pointer(pointer))
            .and_then(Json::as_u64)
            .unwrap_or(0)
    };
    Ok(ChatResponse {
        message: Message::assistant(parts),
        usage: Usage {
            input_tokens: count("/prompt_tokens"),
            output_tokens: count("/completion_tokens"),
            cached_input_tokens: count("/prompt_tokens_details/cached_tokens"),
        },
        usage_reported: usage.is_some(),
        finish_reason,
        model: body
            .get("model")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned(),
        request_id: request_id.or_else(|| body.get("id").and_then(Json::as_str).map(str::to_owned)),
    })
}

/// The vectors of an `/embeddings` response, in the order of the inputs (by each item's `index`).
pub fn parse_embeddings(
    provider: &str,
    body: &Json,
    expected: usize,
) -> Result<Vec<Vec<f32>>, LlmError> {
    let wrong = |what: &str| {
        LlmError::fatal(format!(
            "provider `{provider}` answered `/embeddings` with {what}"
        ))
    };
    let Some(items) = body.get("data").and_then(Json::as_array) else {
        return Err(wrong("no `data` list"));
    };
    if items.len() != expected {
        return Err(wrong(&format!(
            "{} embeddings for {expected} inputs",
            items.len()
        )));
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (position, item) in items.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Json::as_u64)
            .map_or(position, |i| usize::try_from(i).unwrap_or(usize::MAX));
        let Some(values) = item.get("embedding").and_then(Json::as_array) else {
            return Err(wrong("an item without an `embedding` list"));
        };
        #[allow(clippy::cast_possible_truncation)]
        let vector: Option<Vec<f32>> = values
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect();
        let Some(vector) = vector.filter(|v| !v.is_empty()) else {
            return Err(wrong("an embedding that is not a list of numbers"));
        };
        match vectors.get_mut(index) {
            Some(slot @ None) => *slot = Some(vector),
            _ => return Err(wrong(&format!("an unexpected `index` {index}"))),
        }
    }
    Ok(vectors.into_iter().flatten().collect())
}
