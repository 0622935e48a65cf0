//! The Anthropic Messages adapter (`POST {base_url}/v1/messages`).
//!
//! The Messages API differs from the canonical model in ways this file absorbs: system prompts are a
//! top-level `system` string, roles must alternate (so consecutive messages of one side are merged and tool
//! results travel in a `user` message), `max_tokens` is required, thinking blocks must come back signed and
//! unchanged, there is no JSON-schema answer format (a forced `output` tool stands in for it), and usage
//! counts cached input apart from `input_tokens`.

use serde_json::{Map, Value as Json, json};

use super::client::{Endpoint, Settings};
use super::{
    ApiKey, BoxFuture, ChatRequest, ChatResponse, FinishReason, LlmError, Message, Part, Provider,
    Role, ToolCall, ToolChoice, Usage, arguments_from_text,
};

/// The public Anthropic API, used unless `base_url` says otherwise. Like the official SDKs' base URL, it
/// holds no `/v1`: the adapter appends `/v1/messages`.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";

/// The `anthropic-version` header this adapter speaks.
pub const API_VERSION: &str = "2023-06-01";

/// `max_tokens` when the request sets none: Anthropic requires one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The tool that carries a structured answer (see [`request_body`]).
pub const OUTPUT_TOOL: &str = "archon_final_answer";

/// A Messages endpoint.
#[derive(Debug)]
pub struct Anthropic(Endpoint);

impl Anthropic {
    pub fn new(
        name: impl Into<String>,
        base_url: impl Into<String>,
        key: Option<ApiKey>,
        settings: Settings,
    ) -> Result<Self, LlmError> {
        Endpoint::new(name, base_url, key, settings).map(Anthropic)
    }
}

impl Provider for Anthropic {
    fn name(&self) -> &str {
        self.0.client.name()
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let body = request_body(request);
            let mut headers = vec![("anthropic-version", API_VERSION.to_owned())];
            if let Some(key) = &self.0.key {
                headers.push(("x-api-key", key.expose().to_owned()));
            }
            let url = format!("{}/v1/messages", self.0.base_url);
            self.0
                .client
                .post_and_read(&url, &headers, &body, |reply| {
                    parse_response(self.name(), &reply.body, reply.request_id)
                })
                .await
        })
    }
}

/// The Messages request for `request`.
///
/// - System messages, wherever they stand, are joined (blank line between) into the top-level `system`.
/// - Tool results become `tool_result` blocks of a `user` message, and consecutive messages of one side are
///   merged, since Anthropic wants `user` and `assistant` to alternate. In a merged `user` message the
///   `tool_result` blocks come first, as Anthropic requires.
/// - Reasoning goes back only when it is signed: as a `thinking` block, or as `redacted_thinking` when its
///   text is empty (that is how [`parse_response`] keeps redacted thinking). Unsigned reasoning (from
///   another provider, say) is dropped: Anthropic would refuse it.
/// - Tool-call arguments must be an object: raw text (a weak model's broken JSON, kept by the canonical
///   model) is parsed once more, and anything that still is not an object is sent as `{}`, so the
///   conversation stays valid; the tool's result tells the model what went wrong.
/// - Empty text blocks are left out (Anthropic refuses them), and so is a message left with no block.
/// - Structured output: Anthropic has no JSON-schema answer format, so when `output_schema` is set the
///   request offers one more tool, [`OUTPUT_TOOL`], whose `input_schema` is the schema, and makes the model
///   call it (`tool_choice` `{type: tool, name: output}`); [`parse_response`] turns that call back into the
///   answer's text. When the request also offers tools the model may use them (`tool_choice` `any`: some
///   tool, `output` included), unless the request names one tool or forbids tools. The schema must describe
///   an object, as every tool input does.
pub fn request_body(request: &ChatRequest) -> Json {
    let mut system = Vec::new();
    let mut messages: Vec<(&str, Vec<Json>)> = Vec::new();
    for message in &request.messages {
        let role = match message.role {
            Role::System => {
                let text = message.text();
                if !text.is_empty() {
                    system.push(text);
                }
                continue;
            }
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        };
        let blocks: Vec<Json> = message.parts.iter().filter_map(content_block).collect();
        if blocks.is_empty() {
            continue;
        }
        match messages.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let messages: Vec<Json> = messages
        .into_iter()
        .map(|(role, mut content)| {
            if role == "user" {
                // A stable sort: results first, everything else after, each in its order.
                content.sort_by_key(|block| block["type"] != "tool_result");
            }
            json!({ "role": role, "content": content })
        })
        .collect();

    let mut body = Map::new();
    body.insert("model".into(), Json::String(request.model.clone()));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !system.is_empty() {
        body.insert("system".into(), Json::String(system.join("\n\n")));
    }
    body.insert("messages".into(), Json::Array(messages));

    let mut tools: Vec<Json> = request
        .tools
        .iter()
        .map(|t| tool(&t.name, &t.description, &t.parameters))
        .collect();
    let mut tool_choice = match &request.tool_choice {
        ToolChoice::Auto => json!({ "type": "auto" }),
        ToolChoice::None => json!({ "type": "none" }),
        ToolChoice::Required => json!({ "type": "any" }),
        ToolChoice::Tool(name) => json!({ "type": "tool", "name": name }),
    };
    if let Some(schema) = &request.output_schema {
        let keep_tools = !tools.is_empty() && request.tool_choice != ToolChoice::None;
        tool_choice = match &request.tool_choice {
            ToolChoice::Tool(_) if keep_tools => tool_choice,
            _ if keep_tools => json!({ "type": "any" }),
            _ => {
                tools.clear();
                json!({ "type": "tool", "name": OUTPUT_TOOL })
            }
        };
        tools.push(tool(
            OUTPUT_TOOL,
            "Give the final answer: call this tool with the answer as its input.",
            schema,
        ));
    }
    if !tools.is_empty() {
        body.insert("tools".into(), Json::Array(tools));
        body.insert("tool_choice".into(), tool_choice);
    }

    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if !request.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(request.stop));
    }
    Json::Object(body)
}

/// The content block for one canonical part, if Anthropic can take it.
fn content_block(part: &Part) -> Option<Json> {
    match part {
        Part::Text(text) if text.is_empty() => None,
        Part::Text(text) => Some(json!({ "type": "text", "text": text })),
        Part::Reasoning {
            signature: None, ..
        } => None,
        Part::Reasoning {
            text,
            signature: Some(data),
        } if text.is_empty() => Some(json!({ "type": "redacted_thinking", "data": data })),
        Part::Reasoning {
            text,
            signature: Some(signature),
        } => Some(json!({ "type": "thinking", "thinking": text, "signature": signature })),
        Part::ToolCall(call) => Some(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.name,
            "input": input_object(&call.arguments),
        })),
        Part::ToolResult(result) => Some(json!({
            "type": "tool_result",
            "tool_use_id": result.id,
            "content": result.content,
            "is_error": result.is_error,
        })),
    }
}

/// Tool-call arguments as the object Anthropic wants for `input`.
fn input_object(arguments: &Json) -> Json {
    match arguments {
        Json::Object(_) => arguments.clone(),
        Json::String(raw) => match arguments_from_text(raw) {
            parsed @ Json::Object(_) => parsed,
            _ => Json::Object(Map::new()),
        },
        _ => Json::Object(Map::new()),
    }
}

/// A tool definition; a missing schema becomes the empty object schema Anthropic insists on.
fn tool(name: &str, description: &str, schema: &Json) -> Json {
    let mut out = json!({ "name": name });
    if !description.is_empty() {
        out["description"] = json!(description);
    }
    out["input_schema"] = if schema.is_object() {
        schema.clone()
    } else {
        json!({ "type": "object", "properties": {} })
    };
    out
}

/// Reads a Messages response.
///
/// - `thinking` blocks become [`Part::Reasoning`] with their signature; `redacted_thinking` blocks too, with
///   empty text and the encrypted `data` as the signature, so that [`request_body`] can return both.
/// - A call to [`OUTPUT_TOOL`] is the structured answer: its input becomes the answer's text (as JSON), it
///   replaces any other text, and the answer finishes with [`FinishReason::Stop`]. The name is therefore
///   reserved: a request's own tool named `output` would be read as the answer.
/// - `usage.input_tokens` here means all input tokens: Anthropic's `input_tokens` leaves out tokens read
///   from the cache (`cache_read_input_tokens`) and written to it (`cache_creation_input_tokens`), so they
///   are added; `cached_input_tokens` is the cache reads.
/// - The request id is the `request-id` header when there is one, else the message `id`.
pub fn parse_response(
    provider: &str,
    body: &Json,
    request_id: Option<String>,
) -> Result<ChatResponse, LlmError> {
    let bad = |what: &str| LlmError::fatal(format!("provider `{provider}`: {what}"));
    let is_error = body.get("type").and_then(Json::as_str) == Some("error")
        || body.get("error").is_some_and(|e| !e.is_null());
    if is_error {
        return Err(in_band_error(provider, body));
    }
    let content = body
        .get("content")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("the response has no `content`"))?;
    let mut parts = Vec::new();
    let mut output = None;
    for (index, block) in content.iter().enumerate() {
        let text = |key: &str| block.get(key).and_then(Json::as_str).unwrap_or_default();
        match block.get("type").and_then(Json::as_str) {
            Some("text") if !text("text").is_empty() => {
                parts.push(Part::Text(text("text").to_owned()))
            }
            Some("thinking") => parts.push(Part::Reasoning {
                text: text("thinking").to_owned(),
                signature: block
                    .get("signature")
                    .and_then(Json::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            }),
            Some("redacted_thinking") => parts.push(Part::Reasoning {
                text: String::new(),
                signature: Some(text("data").to_owned()),
            }),
            Some("tool_use") => {
                let input = match block.get("input") {
                    Some(Json::String(raw)) => arguments_from_text(raw),
                    Some(Json::Null) | None => Json::Object(Map::new()),
                    Some(other) => other.clone(),
                };
                let name = text("name");
                if name == OUTPUT_TOOL {
                    // Forced, it comes once; should a second come, the first answer stands.
                    output.get_or_insert_with(|| input.to_string());
                    continue;
                }
                let id = Some(text("id"))
                    .filter(|id| !id.is_empty())
                    .map_or_else(|| format!("toolu_{index}"), str::to_owned);
                parts.push(Part::ToolCall(ToolCall {
                    id,
                    name: name.to_owned(),
                    arguments: input,
                    signature: None,
                }));
            }
            // Server tools' blocks, citations and whatever comes next: nothing the canonical model holds.
            _ => {}
        }
    }
    if let Some(answer) = &output {
        parts.retain(|p| !matches!(p, Part::Text(_)));
        parts.push(Part::Text(answer.clone()));
    }
    let has_calls = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
    let finish_reason = match body.get("stop_reason").and_then(Json::as_str) {
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        Some("tool_use") if has_calls => FinishReason::ToolCalls,
        // Only the structured answer was called for: it is the answer.
        Some("tool_use") => FinishReason::Stop,
        Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        // Missing or unknown: what the message holds says more.
        _ if has_calls => FinishReason::ToolCalls,
        Some(other) if !other.is_empty() => FinishReason::Other(other.to_owned()),
        _ => FinishReason::Stop,
    };
    let usage = body.get("usage").filter(|u| u.is_object());
    let count = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Json::as_u64)
            .unwrap_or(0)
    };
    let cache_read = count("cache_read_input_tokens");
    Ok(ChatResponse {
        message: Message::assistant(parts),
        usage: Usage {
            input_tokens: count("input_tokens")
                .saturating_add(cache_read)
                .saturating_add(count("cache_creation_input_tokens")),
            output_tokens: count("output_tokens"),
            cached_input_tokens: cache_read,
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

/// An error Anthropic sent with a success status: `{"type": "error", "error": {"type", "message"}}`.
/// Overload, rate-limit and server errors are worth another attempt, as they are when sent with their
/// own status.
fn in_band_error(provider: &str, body: &Json) -> LlmError {
    let error = body.get("error").unwrap_or(&Json::Null);
    let kind = error.get("type").and_then(Json::as_str).unwrap_or_default();
    let message = error
        .get("message")
        .and_then(Json::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("no message");
    let mut text = format!("provider `{provider}`: the response is an error");
    if !kind.is_empty() {
        text.push_str(&format!(" `{kind}`"));
    }
    text.push_str(&format!(": {message}"));
    if let Some(id) = body.get("request_id").and_then(Json::as_str) {
        text.push_str(&format!(" (request `{id}`)"));
    }
    LlmError {
        message: text,
        status: None,
        retryable: matches!(
            kind,
            "overloaded_error" | "rate_limit_error" | "api_error" | "timeout_error"
        ),
        retry_after: None,
        connect: false,
    }
}
