//! The Google Gemini adapter (`POST {base_url}/v1beta/models/{model}:generateContent`).
//!
//! generateContent differs from the canonical model in ways this file absorbs: system prompts travel in a
//! top-level `systemInstruction`, the assistant is `model`, tool results are `functionResponse` parts of a
//! `user` turn, calls carry no id (one is made up), thought signatures must come back unchanged on the part
//! they came with, and tool parameters accept only a subset of JSON Schema (see [`normalize_schema`]).

use serde_json::{Map, Value as Json, json};

use super::client::{Endpoint, Settings};
use super::{
    ApiKey, BoxFuture, ChatRequest, ChatResponse, FinishReason, LlmError, Message, Part, Provider,
    Role, ToolCall, ToolChoice, ToolResult, Usage, arguments_from_text,
};

/// The public Gemini API, used unless `base_url` says otherwise. It holds no version: the adapter appends
/// `/v1beta/models/{model}:generateContent`.
pub const DEFAULT_BASE_URL: &str = "https://generativelanguage.googleapis.com";

/// How many `$ref`s deep [`normalize_schema`] inlines before it cuts a recursive schema short.
pub const MAX_REF_DEPTH: usize = 8;

/// How many `$ref`s one schema may inline in all, so that a schema referring to large definitions from
/// many places cannot grow without bound.
const MAX_REF_EXPANSIONS: usize = 1000;

/// A generateContent endpoint.
#[derive(Debug)]
pub struct Gemini(Endpoint);

impl Gemini {
    pub fn new(
        name: impl Into<String>,
        base_url: impl Into<String>,
        key: Option<ApiKey>,
        settings: Settings,
    ) -> Result<Self, LlmError> {
        Endpoint::new(name, base_url, key, settings).map(Gemini)
    }
}

impl Provider for Gemini {
    fn name(&self) -> &str {
        self.0.client.name()
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move {
            let body = request_body(request);
            // The key goes in a header, never in the URL (`?key=`), so no error message can show it.
            let mut headers = Vec::new();
            if let Some(key) = &self.0.key {
                headers.push(("x-goog-api-key", key.expose().to_owned()));
            }
            let resource = model_resource(self.name(), &request.model)?;
            let url = format!("{}/v1beta/{resource}:generateContent", self.0.base_url);
            self.0
                .client
                .post_and_read(&url, &headers, &body, |reply| {
                    parse_response(self.name(), &reply.body, reply.request_id)
                })
                .await
        })
    }
}

/// The model's resource name for the URL: `models/{model}`, or the model as written when it already is a
/// resource name (`models/gemini-2.5-flash`, `tunedModels/my-model`). Each segment is percent-encoded, so
/// an odd model name cannot add a query; an empty, `.` or `..` segment (which would move up the path) is
/// refused.
fn model_resource(provider: &str, model: &str) -> Result<String, LlmError> {
    if model.trim().is_empty() {
        return Err(LlmError::fatal(format!(
            "provider `{provider}`: the request names no model"
        )));
    }
    let resource = if model.contains('/') {
        model.to_owned()
    } else {
        format!("models/{model}")
    };
    let mut segments = Vec::new();
    for segment in resource.split('/') {
        if matches!(segment.trim(), "" | "." | "..") {
            return Err(LlmError::fatal(format!(
                "provider `{provider}`: `{model}` is not a model name"
            )));
        }
        let mut out = String::with_capacity(segment.len());
        for byte in segment.bytes() {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                out.push(char::from(byte));
            } else {
                out.push_str(&format!("%{byte:02X}"));
            }
        }
        segments.push(out);
    }
    Ok(segments.join("/"))
}

/// The generateContent request for `request`.
///
/// - System messages, wherever they stand, become the parts of the top-level `systemInstruction`.
/// - `user` and `tool` messages are `user` turns, `assistant` messages `model` turns, and consecutive turns
///   of one side are merged. In a merged `user` turn the `functionResponse` parts come first.
/// - A tool result is a `functionResponse` part: `{name, response}` where `response` is the result's text
///   when it parses as a JSON object, else `{"content": text}`. A failed call's result is sent as
///   `{"error": ...}`, the key Gemini documents for errors.
/// - A tool call is a `functionCall` part `{name, args}`, with its `thoughtSignature` on the same part.
///   Arguments must be an object: raw text (a weak model's broken JSON, kept by the canonical model) is
///   parsed once more, and anything that still is not an object is sent as `{}`. Call ids are not sent:
///   Gemini matches responses to calls by name and order.
/// - Reasoning goes back only when it is signed, as a `thought: true` part with its `thoughtSignature`.
///   Signed reasoning with empty text is how [`parse_response`] keeps the signature of a text part: it goes
///   back on the text part that follows it, or alone on an empty text part when none does. Unsigned
///   reasoning (from another provider, say) is dropped.
/// - Empty text parts are left out, and so is a turn left with no part.
/// - Tools are one `functionDeclarations` list; parameters are normalised by [`normalize_schema`], and left
///   out when they describe an object without properties (Gemini refuses an empty `properties`).
/// - `tool_choice` is `toolConfig.functionCallingConfig.mode` `AUTO`, `NONE` or `ANY`; a named tool is
///   `ANY` with `allowedFunctionNames`.
/// - `output_schema` asks for `responseMimeType` `application/json` with the normalised `responseSchema`.
pub fn request_body(request: &ChatRequest) -> Json {
    let mut system = Vec::new();
    let mut contents: Vec<(&str, Vec<Json>)> = Vec::new();
    for message in &request.messages {
        let role = match message.role {
            Role::System => {
                let text = message.text();
                if !text.is_empty() {
                    system.push(json!({ "text": text }));
                }
                continue;
            }
            Role::User | Role::Tool => "user",
            Role::Assistant => "model",
        };
        let parts = content_parts(&message.parts);
        if parts.is_empty() {
            continue;
        }
        match contents.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(parts),
            _ => contents.push((role, parts)),
        }
    }
    let contents: Vec<Json> = contents
        .into_iter()
        .map(|(role, mut parts)| {
            if role == "user" {
                // A stable sort: responses first, everything else after, each in its order.
                parts.sort_by_key(|part| part.get("functionResponse").is_none());
            }
            json!({ "role": role, "parts": parts })
        })
        .collect();

    let mut body = Map::new();
    if !system.is_empty() {
        body.insert("systemInstruction".into(), json!({ "parts": system }));
    }
    body.insert("contents".into(), Json::Array(contents));

    if !request.tools.is_empty() {
        let declarations: Vec<Json> = request
            .tools
            .iter()
            .map(|t| {
                // The API requires a description: a tool declared without one is described by its name.
                let description = if t.description.trim().is_empty() {
                    &t.name
                } else {
                    &t.description
                };
                let mut declaration = json!({ "name": t.name, "description": description });
                let parameters = normalize_schema(&t.parameters);
                if !is_empty_object(&parameters)
                    && parameters.as_object().is_some_and(|p| !p.is_empty())
                {
                    declaration["parameters"] = parameters;
                }
                declaration
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
        let config = match &request.tool_choice {
            ToolChoice::Auto => json!({ "mode": "AUTO" }),
            ToolChoice::None => json!({ "mode": "NONE" }),
            ToolChoice::Required => json!({ "mode": "ANY" }),
            ToolChoice::Tool(name) => json!({ "mode": "ANY", "allowedFunctionNames": [name] }),
        };
        body.insert(
            "toolConfig".into(),
            json!({ "functionCallingConfig": config }),
        );
    }

    let mut generation = Map::new();
    if let Some(t) = request.temperature {
        generation.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        generation.insert("maxOutputTokens".into(), json!(m));
    }
    if !request.stop.is_empty() {
        generation.insert("stopSequences".into(), json!(request.stop));
    }
    // Gemini refuses a JSON response type together with function calling: with tools, the caller checks
    // the answer against the schema itself.
    if let Some(schema) = request
        .output_schema
        .as_ref()
        .filter(|_| request.tools.is_empty())
    {
        generation.insert("responseMimeType".into(), json!("application/json"));
        let normalized = normalize_schema(schema);
        if !is_empty_object(&normalized) {
            generation.insert("responseSchema".into(), normalized);
        }
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Json::Object(generation));
    }
    Json::Object(body)
}

/// The Gemini parts for one message's canonical parts.
fn content_parts(parts: &[Part]) -> Vec<Json> {
    let mut out = Vec::with_capacity(parts.len());
    let mut iter = parts.iter().peekable();
    while let Some(part) = iter.next() {
        match part {
            Part::Text(text) if text.is_empty() => {}
            Part::Text(text) => out.push(json!({ "text": text })),
            Part::Reasoning {
                signature: None, ..
            } => {}
            // A text part's signature: back on that text part.
            Part::Reasoning {
                text,
                signature: Some(signature),
            } if text.is_empty() => {
                let text = match iter.peek() {
                    Some(Part::Text(next)) if !next.is_empty() => {
                        iter.next();
                        next.as_str()
                    }
                    _ => "",
                };
                out.push(json!({ "text": text, "thoughtSignature": signature }));
            }
            Part::Reasoning {
                text,
                signature: Some(signature),
            } => out.push(json!({ "thought": true, "text": text, "thoughtSignature": signature })),
            Part::ToolCall(call) => {
                let mut part = json!({
                    "functionCall": { "name": call.name, "args": args_object(&call.arguments) },
                });
                if let Some(signature) = &call.signature {
                    part["thoughtSignature"] = json!(signature);
                }
                out.push(part);
            }
            Part::ToolResult(result) => out.push(function_response(result)),
        }
    }
    out
}

/// Tool-call arguments as the object Gemini wants for `args`.
fn args_object(arguments: &Json) -> Json {
    match arguments {
        Json::Object(_) => arguments.clone(),
        Json::String(raw) => match arguments_from_text(raw) {
            parsed @ Json::Object(_) => parsed,
            _ => Json::Object(Map::new()),
        },
        _ => Json::Object(Map::new()),
    }
}

/// A `functionResponse` part for a tool result (see [`request_body`]).
fn function_response(result: &ToolResult) -> Json {
    let parsed = serde_json::from_str::<Json>(&result.content)
        .ok()
        .filter(Json::is_object);
    let response = match parsed {
        Some(object) if !result.is_error => object,
        Some(object) => json!({ "error": object }),
        None if result.is_error => json!({ "error": result.content }),
        None => json!({ "content": result.content }),
    };
    json!({ "functionResponse": { "name": result.name, "response": response } })
}

/// `schema` reduced to the subset of JSON Schema (OpenAPI 3.0 flavoured) that Gemini accepts for tool
/// parameters and `responseSchema`.
///
/// Kept, recursively (every other keyword is dropped):
/// - `type`, when a string; `type: [T, "null"]` becomes `type: T` with `nullable: true`, a list of several
///   non-null types becomes an `anyOf` of one branch per type, and `type: "null"` alone becomes
///   `nullable: true`;
/// - `format`: `enum` and `date-time` for strings, `float` and `double` for numbers, `int32` and `int64`
///   for integers (the formats Gemini knows);
/// - `description` (a string), `nullable` (a boolean);
/// - `enum` (a list; `null` is taken out and makes the schema nullable; a list of strings gets
///   `type: "string"` when the schema has no type), and `const`, which becomes an `enum` of one value;
/// - `properties`, `required` (the names among `properties`), `propertyOrdering` (likewise);
/// - `items` (a list of item schemas, the old tuple form, becomes an `anyOf` of them), `minItems`,
///   `maxItems`, `minimum`, `maximum` (numbers);
/// - `anyOf`, and `oneOf` as `anyOf` (Gemini has no exclusive choice). A `{"type": "null"}` branch is taken
///   out and makes the schema nullable; a choice left with one branch is merged into the schema.
///
/// Resolved rather than kept: a local `$ref` (`#`, `#/$defs/...`, `#/definitions/...`, any JSON pointer into
/// the schema) is replaced by its target, the keywords beside the `$ref` winning over the target's. Past
/// [`MAX_REF_DEPTH`] nested references (a recursive schema), or once one schema has inlined 1000, a
/// reference becomes its target's `type` and `description` alone. A reference that does not resolve
/// (remote, or missing) is dropped, leaving the keywords beside it. The branches of `allOf` are merged into
/// the schema (`properties` and `required` joined; for other keywords the schema's own wins, then the
/// first branch that has one).
///
/// Dropped among others: `$schema`, `$id`, `$defs`, `definitions`, `additionalProperties`, `default`,
/// `examples`, `title`, `pattern`, `minLength`, `maxLength`, `exclusiveMinimum`, `exclusiveMaximum`,
/// `uniqueItems`, `not`. A boolean schema (`true`, `false`) or anything not an object becomes `{}`.
pub fn normalize_schema(schema: &Json) -> Json {
    let mut normalizer = Normalizer {
        root: schema,
        expansions: 0,
    };
    let mut out = Json::Object(normalizer.schema(schema, 0));
    fit_gemini(&mut out);
    out
}

/// What Gemini refuses even in the subset above: an `OBJECT` with no properties below the top (such a
/// property is dropped, and no longer required), and an `enum` of values that are not strings (dropped;
/// the values are listed in the description instead). Types go out in upper case (`STRING`, `OBJECT`),
/// the values of the API's `Type` enum.
fn fit_gemini(schema: &mut Json) {
    let Json::Object(map) = schema else { return };
    if let Some(Json::String(kind)) = map.get_mut("type") {
        kind.make_ascii_uppercase();
    }
    if let Some(Json::Array(values)) = map.get("enum")
        && !values.iter().all(Json::is_string)
    {
        let listed: Vec<String> = values.iter().map(Json::to_string).collect();
        let note = format!("one of: {}", listed.join(", "));
        let description = match map.get("description").and_then(Json::as_str) {
            Some(d) if !d.is_empty() => format!("{d} ({note})"),
            _ => note,
        };
        map.insert("description".into(), Json::String(description));
        map.remove("enum");
    }
    if let Some(Json::Object(properties)) = map.get_mut("properties") {
        let empty: Vec<String> = properties
            .iter()
            .filter(|(_, p)| is_empty_object(p))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &empty {
            properties.remove(name);
        }
        properties.values_mut().for_each(fit_gemini);
        if let Some(Json::Array(required)) = map.get_mut("required") {
            required.retain(|r| r.as_str().is_none_or(|r| !empty.iter().any(|e| e == r)));
        }
    }
    for key in ["items", "anyOf"] {
        match map.get_mut(key) {
            Some(Json::Array(branches)) => branches.iter_mut().for_each(fit_gemini),
            Some(item @ Json::Object(_)) => fit_gemini(item),
            _ => {}
        }
    }
}

/// An object schema with no properties, which Gemini rejects.
fn is_empty_object(schema: &Json) -> bool {
    schema
        .get("type")
        .and_then(Json::as_str)
        .is_some_and(|t| t.eq_ignore_ascii_case("object"))
        && schema
            .get("properties")
            .and_then(Json::as_object)
            .is_none_or(Map::is_empty)
}

/// One [`normalize_schema`] run: the root `$ref`s point into, and how many it has inlined.
struct Normalizer<'a> {
    root: &'a Json,
    expansions: usize,
}

impl Normalizer<'_> {
    /// `schema` normalised, `depth` references deep.
    fn schema(&mut self, schema: &Json, depth: usize) -> Map<String, Json> {
        let Json::Object(map) = schema else {
            return Map::new();
        };
        if let Some(reference) = map.get("$ref").and_then(Json::as_str) {
            return self.reference(map, reference, depth);
        }

        let mut out = Map::new();
        let mut nullable = map.get("nullable").and_then(Json::as_bool) == Some(true);
        let mut choices: Vec<Map<String, Json>> = Vec::new();

        let types: Vec<&str> = match map.get("type") {
            Some(Json::String(t)) => vec![t.as_str()],
            Some(Json::Array(list)) => list.iter().filter_map(Json::as_str).collect(),
            _ => Vec::new(),
        };
        if types.iter().any(|t| t.eq_ignore_ascii_case("null")) {
            nullable = true;
        }
        let types: Vec<&str> = types
            .into_iter()
            .filter(|t| !t.eq_ignore_ascii_case("null"))
            .collect();
        match types.as_slice() {
            [] => {}
            [one] => {
                out.insert("type".into(), json!(one));
            }
            several => {
                choices.extend(several.iter().map(|t| {
                    let mut branch = Map::new();
                    branch.insert("type".into(), json!(t));
                    branch
                }));
            }
        }

        if let Some(description) = map.get("description").filter(|d| d.is_string()) {
            out.insert("description".into(), description.clone());
        }

        let values = match (map.get("enum"), map.get("const")) {
            (Some(Json::Array(values)), _) => Some(values.clone()),
            (_, Some(value)) => Some(vec![value.clone()]),
            _ => None,
        };
        if let Some(mut values) = values {
            if values.iter().any(Json::is_null) {
                nullable = true;
                values.retain(|v| !v.is_null());
            }
            if !out.contains_key("type") && !values.is_empty() && values.iter().all(Json::is_string)
            {
                out.insert("type".into(), json!("string"));
            }
            out.insert("enum".into(), Json::Array(values));
        }

        // After `enum`, which may have settled the type.
        if let Some(format) = map.get("format").and_then(Json::as_str) {
            let kind = out
                .get("type")
                .and_then(Json::as_str)
                .map(str::to_ascii_lowercase);
            let known = match kind.as_deref() {
                Some("string") => ["enum", "date-time"].contains(&format),
                Some("number") => ["float", "double"].contains(&format),
                Some("integer") => ["int32", "int64"].contains(&format),
                _ => false,
            };
            if known {
                out.insert("format".into(), json!(format));
            }
        }

        if let Some(Json::Object(properties)) = map.get("properties") {
            let normalized: Map<String, Json> = properties
                .iter()
                .map(|(name, schema)| (name.clone(), Json::Object(self.schema(schema, depth))))
                .collect();
            out.insert("properties".into(), Json::Object(normalized));
        }
        for key in ["required", "propertyOrdering"] {
            if let Some(Json::Array(names)) = map.get(key) {
                let names = names.iter().filter(|n| n.is_string()).cloned().collect();
                out.insert(key.into(), Json::Array(names));
            }
        }

        match map.get("items") {
            Some(items @ Json::Object(_)) => {
                out.insert("items".into(), Json::Object(self.schema(items, depth)));
            }
            Some(Json::Array(tuple)) if !tuple.is_empty() => {
                let branches: Vec<Json> = tuple
                    .iter()
                    .map(|item| Json::Object(self.schema(item, depth)))
                    .collect();
                let items = if let [one] = branches.as_slice() {
                    one.clone()
                } else {
                    json!({ "anyOf": branches })
                };
                out.insert("items".into(), items);
            }
            _ => {}
        }
        for key in ["minItems", "maxItems", "minimum", "maximum"] {
            if let Some(bound) = map.get(key).filter(|b| b.is_number()) {
                out.insert(key.into(), bound.clone());
            }
        }

        if let Some(Json::Array(all)) = map.get("allOf") {
            for branch in all {
                let branch = self.schema(branch, depth);
                merge_into(&mut out, branch);
            }
        }

        for key in ["anyOf", "oneOf"] {
            if let Some(Json::Array(branches)) = map.get(key) {
                for branch in branches {
                    let branch = self.schema(branch, depth);
                    if is_null_schema(&branch) {
                        nullable = true;
                    } else {
                        choices.push(branch);
                    }
                }
            }
        }
        match choices.len() {
            0 => {}
            1 => {
                if let Some(only) = choices.pop() {
                    merge_into(&mut out, only);
                }
            }
            _ => {
                out.insert(
                    "anyOf".into(),
                    Json::Array(choices.into_iter().map(Json::Object).collect()),
                );
            }
        }

        // Names Gemini would not find among the properties (`allOf` and single choices merged above may
        // have brought some) are taken out.
        for key in ["required", "propertyOrdering"] {
            let Some(Json::Array(names)) = out.get(key) else {
                continue;
            };
            let names: Vec<Json> = names
                .iter()
                .filter(|n| n.as_str().is_some_and(|n| has_property(&out, n)))
                .cloned()
                .collect();
            if names.is_empty() {
                out.remove(key);
            } else {
                out.insert(key.into(), Json::Array(names));
            }
        }
        if nullable {
            out.insert("nullable".into(), json!(true));
        }
        out
    }

    /// A `$ref` and the keywords beside it, normalised.
    fn reference(
        &mut self,
        map: &Map<String, Json>,
        reference: &str,
        depth: usize,
    ) -> Map<String, Json> {
        let target = reference
            .strip_prefix('#')
            .and_then(|pointer| self.root.pointer(pointer))
            .and_then(Json::as_object);
        let mut merged = if let Some(target) = target
            && (depth >= MAX_REF_DEPTH || self.expansions >= MAX_REF_EXPANSIONS)
        {
            // Cut short: the target's kind, without what would recurse.
            target
                .iter()
                .filter(|(key, _)| *key == "type" || *key == "description")
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect()
        } else if let Some(target) = target {
            self.expansions += 1;
            target.clone()
        } else {
            // Remote or missing: only the keywords beside it are left.
            Map::new()
        };
        // The keywords beside the reference win. A target that is itself a reference (an alias) keeps its
        // `$ref` and is followed one level deeper.
        for (key, value) in map {
            if key != "$ref" {
                merged.insert(key.clone(), value.clone());
            }
        }
        self.schema(&Json::Object(merged), depth + 1)
    }
}

/// Whether `schema` declares property `name`.
fn has_property(schema: &Map<String, Json>, name: &str) -> bool {
    schema
        .get("properties")
        .and_then(Json::as_object)
        .is_some_and(|p| p.contains_key(name))
}

/// Whether a normalised schema allows only `null` (`{"type": "null"}` as written).
fn is_null_schema(schema: &Map<String, Json>) -> bool {
    schema.get("nullable") == Some(&json!(true))
        && ["type", "anyOf", "properties", "items", "enum"]
            .iter()
            .all(|key| !schema.contains_key(*key))
}

/// Merges a normalised `branch` into `out`: `properties` and `required` are joined, other keywords fill in
/// only what `out` lacks.
fn merge_into(out: &mut Map<String, Json>, branch: Map<String, Json>) {
    for (key, value) in branch {
        match (key.as_str(), out.get_mut(&key), value) {
            ("properties", Some(Json::Object(existing)), Json::Object(more)) => {
                for (name, schema) in more {
                    existing.entry(name).or_insert(schema);
                }
            }
            ("required" | "propertyOrdering", Some(Json::Array(existing)), Json::Array(more)) => {
                for name in more {
                    if !existing.contains(&name) {
                        existing.push(name);
                    }
                }
            }
            (_, Some(_), _) => {}
            (_, None, value) => {
                out.insert(key, value);
            }
        }
    }
}

/// Reads a generateContent response.
///
/// - Only the first candidate is read. A part with `thought: true` is [`Part::Reasoning`] with its
///   `thoughtSignature`; a `functionCall` part is a [`Part::ToolCall`] with its `thoughtSignature` as
///   `signature` and an id made up as `call_<n>` (the n-th call of the answer, from 0) unless Gemini sent
///   one. A `thoughtSignature` on any other part (a text part, usually the last) is kept as a
///   [`Part::Reasoning`] with empty text placed just before that part's text, so that [`request_body`] can
///   put it back on the same part.
/// - `finishReason` `STOP` is [`FinishReason::ToolCalls`] when the answer calls tools; `SAFETY`,
///   `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII` and `IMAGE_SAFETY` are
///   [`FinishReason::ContentFilter`].
/// - A prompt Gemini blocked (`promptFeedback.blockReason`, no candidate) is an error naming the reason.
/// - Output tokens are `candidatesTokenCount` plus `thoughtsTokenCount` (billed as output); input tokens
///   are `promptTokenCount` plus `toolUsePromptTokenCount`; cached input is `cachedContentTokenCount`.
/// - The model is `modelVersion`; the request id is the response header when there is one, else
///   `responseId`.
pub fn parse_response(
    provider: &str,
    body: &Json,
    request_id: Option<String>,
) -> Result<ChatResponse, LlmError> {
    let bad = |what: &str| LlmError::fatal(format!("provider `{provider}`: {what}"));
    if body.get("error").is_some_and(|e| !e.is_null()) {
        return Err(in_band_error(provider, body));
    }
    let Some(candidate) = body
        .get("candidates")
        .and_then(Json::as_array)
        .and_then(|c| c.first())
    else {
        let feedback = body.get("promptFeedback");
        if let Some(reason) = feedback
            .and_then(|f| f.get("blockReason"))
            .and_then(Json::as_str)
        {
            let mut message = format!("the prompt was blocked: `{reason}`");
            if let Some(detail) = feedback
                .and_then(|f| f.get("blockReasonMessage"))
                .and_then(Json::as_str)
            {
                message.push_str(&format!(": {detail}"));
            }
            return Err(bad(&message));
        }
        return Err(bad("the response has no `candidates`"));
    };

    let mut parts = Vec::new();
    let mut calls = 0;
    let items = candidate
        .pointer("/content/parts")
        .and_then(Json::as_array)
        .map_or(&[][..], Vec::as_slice);
    for item in items {
        let signature = item
            .get("thoughtSignature")
            .and_then(Json::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let text = item.get("text").and_then(Json::as_str);
        if let Some(call) = item.get("functionCall").filter(|c| c.is_object()) {
            let arguments = match call.get("args") {
                Some(Json::String(raw)) => arguments_from_text(raw),
                Some(Json::Null) | None => Json::Object(Map::new()),
                Some(other) => other.clone(),
            };
            let id = call
                .get("id")
                .and_then(Json::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{calls}"), str::to_owned);
            calls += 1;
            parts.push(Part::ToolCall(ToolCall {
                id,
                name: call
                    .get("name")
                    .and_then(Json::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                arguments,
                signature,
            }));
        } else if item.get("thought").and_then(Json::as_bool) == Some(true) {
            parts.push(Part::Reasoning {
                text: text.unwrap_or_default().to_owned(),
                signature,
            });
        } else {
            if signature.is_some() {
                parts.push(Part::Reasoning {
                    text: String::new(),
                    signature,
                });
            }
            if let Some(text) = text.filter(|t| !t.is_empty()) {
                parts.push(Part::Text(text.to_owned()));
            }
        }
    }

    let finish_reason = match candidate
        .get("finishReason")
        .and_then(Json::as_str)
        .filter(|r| !r.is_empty())
    {
        Some("STOP") | None if calls > 0 => FinishReason::ToolCalls,
        Some("STOP") | None => FinishReason::Stop,
        Some("MAX_TOKENS") => FinishReason::Length,
        Some(
            "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY",
        ) => FinishReason::ContentFilter,
        Some(other) => FinishReason::Other(other.to_owned()),
    };

    let usage = body.get("usageMetadata").filter(|u| u.is_object());
    let count = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Json::as_u64)
            .unwrap_or(0)
    };
    Ok(ChatResponse {
        message: Message::assistant(parts),
        usage: Usage {
            input_tokens: count("promptTokenCount")
                .saturating_add(count("toolUsePromptTokenCount")),
            output_tokens: count("candidatesTokenCount")
                .saturating_add(count("thoughtsTokenCount")),
            cached_input_tokens: count("cachedContentTokenCount"),
        },
        usage_reported: usage.is_some(),
        finish_reason,
        model: body
            .get("modelVersion")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_owned(),
        request_id: request_id.or_else(|| {
            body.get("responseId")
                .and_then(Json::as_str)
                .map(str::to_owned)
        }),
    })
}

/// An error Gemini sent with a success status: `{"error": {"code", "message", "status"}}`. Rate-limit and
/// server errors are worth another attempt, as they are when sent with their own status.
fn in_band_error(provider: &str, body: &Json) -> LlmError {
    let error = body.get("error").unwrap_or(&Json::Null);
    let status = error
        .get("status")
        .and_then(Json::as_str)
        .unwrap_or_default();
    let code = error
        .get("code")
        .and_then(Json::as_u64)
        .and_then(|c| u16::try_from(c).ok());
    let message = error
        .get("message")
        .and_then(Json::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("no message");
    let mut text = format!("provider `{provider}`: the response is an error");
    if !status.is_empty() {
        text.push_str(&format!(" `{status}`"));
    }
    text.push_str(&format!(": {message}"));
    LlmError {
        message: text,
        status: code,
        retryable: code.is_some_and(|c| c == 429 || c >= 500)
            || matches!(status, "RESOURCE_EXHAUSTED" | "UNAVAILABLE" | "INTERNAL"),
        retry_after: None,
        connect: false,
    }
}
