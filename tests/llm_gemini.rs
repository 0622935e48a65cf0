//! The `gemini` provider adapter against a local HTTP server (wiremock) with payloads shaped like the
//! provider's documented responses.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use archon_engine::llm::client::Settings;
use archon_engine::llm::gemini::{Gemini, normalize_schema, parse_response, request_body};
use archon_engine::llm::{
    ApiKey, ChatRequest, FinishReason, Message, Part, Provider, ToolChoice, ToolResult, ToolSpec,
};
use serde_json::{Value as Json, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::llm_settings;

const KEY: &str = "AIzaSy-secret-test-key";
const ENDPOINT: &str = "/v1beta/models/gemini-test:generateContent";

fn provider(server: &MockServer) -> Gemini {
    Gemini::new(
        "google",
        server.uri(),
        Some(ApiKey::new(KEY)),
        llm_settings(),
    )
    .expect("provider")
}

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "weather".into(),
        description: "current weather for a city".into(),
        parameters: json!({ "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }),
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "gemini-test".into(),
        messages: vec![
            Message::system("you are terse"),
            Message::user("what is the weather in Paris?"),
        ],
        tools: vec![weather_tool()],
        ..ChatRequest::default()
    }
}

/// A generateContent response whose first candidate holds `parts`, as Gemini documents it.
fn candidate(parts: Json, finish: &str, usage: Option<Json>) -> Json {
    let mut body = json!({
        "candidates": [{
            "content": { "parts": parts, "role": "model" },
            "finishReason": finish,
            "index": 0,
            "safetyRatings": [
                { "category": "HARM_CATEGORY_HATE_SPEECH", "probability": "NEGLIGIBLE" },
                { "category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "NEGLIGIBLE" }
            ]
        }],
        "modelVersion": "gemini-test-001",
        "responseId": "mJ8kaO2xL9mUz7IPq7-uwQk"
    });
    if let Some(usage) = usage {
        body["usageMetadata"] = usage;
    }
    body
}

fn usage() -> Json {
    json!({
        "promptTokenCount": 82,
        "candidatesTokenCount": 17,
        "totalTokenCount": 139,
        "cachedContentTokenCount": 64,
        "promptTokensDetails": [{ "modality": "TEXT", "tokenCount": 82 }],
        "thoughtsTokenCount": 40
    })
}

async fn mount(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path(ENDPOINT))
        .and(header("x-goog-api-key", KEY))
        .respond_with(response)
        .mount(server)
        .await;
}

async fn sent(server: &MockServer, index: usize) -> Json {
    server.received_requests().await.expect("recorded")[index]
        .body_json()
        .expect("json")
}

#[tokio::test]
async fn plain_text_with_usage() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([{ "text": "Sunny, " }, { "text": "21 °C." }]),
            "STOP",
            Some(usage()),
        )),
    )
    .await;
    let response = provider(&server)
        .complete(&request())
        .await
        .expect("answer");
    assert_eq!(response.text(), "Sunny, 21 °C.");
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert_eq!(
        (
            response.usage.input_tokens,
            response.usage.output_tokens,
            response.usage.cached_input_tokens
        ),
        (82, 17 + 40, 64),
        "thinking tokens are output"
    );
    assert!(response.usage_reported);
    assert_eq!(response.model, "gemini-test-001");
    assert_eq!(
        response.request_id.as_deref(),
        Some("mJ8kaO2xL9mUz7IPq7-uwQk"),
        "without a header the response id stands in"
    );
}

#[tokio::test]
async fn the_request_on_the_wire() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200)
            .insert_header("x-goog-request-id", "goog-req-1")
            .set_body_json(candidate(json!([{ "text": "ok" }]), "STOP", Some(usage()))),
    )
    .await;
    let mut chat = request();
    chat.messages.push(Message::user("and in Lyon?"));
    chat.temperature = Some(0.2);
    chat.max_tokens = Some(256);
    chat.stop = vec!["END".into()];
    let response = provider(&server).complete(&chat).await.expect("answer");
    assert_eq!(response.request_id.as_deref(), Some("goog-req-1"));

    let received = &server.received_requests().await.expect("recorded")[0];
    assert_eq!(received.url.path(), ENDPOINT);
    assert_eq!(received.url.query(), None, "the key never goes in the URL");
    assert_eq!(
        received
            .headers
            .get("x-goog-api-key")
            .and_then(|v| v.to_str().ok()),
        Some(KEY)
    );
    let body: Json = received.body_json().expect("json");
    assert_eq!(
        body,
        json!({
            "systemInstruction": { "parts": [{ "text": "you are terse" }] },
            "contents": [
                // Two user messages in a row: one turn.
                { "role": "user", "parts": [{ "text": "what is the weather in Paris?" }, { "text": "and in Lyon?" }] }
            ],
            "tools": [{ "functionDeclarations": [{
                "name": "weather",
                "description": "current weather for a city",
                "parameters": { "type": "OBJECT", "properties": { "city": { "type": "STRING" } }, "required": ["city"] }
            }] }],
            "toolConfig": { "functionCallingConfig": { "mode": "AUTO" } },
            "generationConfig": { "temperature": 0.2, "maxOutputTokens": 256, "stopSequences": ["END"] }
        })
    );

    // A model written as a resource name is not prefixed twice.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.5-flash:generateContent"))
        .respond_with(ResponseTemplate::new(200).set_body_json(candidate(
            json!([{ "text": "ok" }]),
            "STOP",
            None,
        )))
        .mount(&server)
        .await;
    let mut chat = request();
    chat.model = "models/gemini-2.5-flash".into();
    chat.tools.clear();
    provider(&server).complete(&chat).await.expect("answer");
    let body = sent(&server, 0).await;
    assert!(body.get("tools").is_none() && body.get("toolConfig").is_none());
    assert!(body.get("generationConfig").is_none());

    // A model name that would move up the path is refused before any request.
    for model in ["models/../../v1/files", "gemini/.", "models//x"] {
        chat.model = model.into();
        let err = provider(&server)
            .complete(&chat)
            .await
            .expect_err("refused");
        assert_eq!(
            err.message,
            format!("provider `google`: `{model}` is not a model name")
        );
    }
    chat.model = " ".into();
    let err = provider(&server)
        .complete(&chat)
        .await
        .expect_err("refused");
    assert_eq!(err.message, "provider `google`: the request names no model");
    assert_eq!(server.received_requests().await.expect("recorded").len(), 1);
}

#[tokio::test]
async fn one_function_call() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([{ "functionCall": { "name": "weather", "args": { "city": "Paris" } } }]),
            "STOP",
            Some(usage()),
        )),
    )
    .await;
    let response = provider(&server)
        .complete(&request())
        .await
        .expect("answer");
    let calls: Vec<_> = response.tool_calls().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (
            calls[0].id.as_str(),
            calls[0].name.as_str(),
            calls[0].arguments.clone()
        ),
        ("call_0", "weather", json!({ "city": "Paris" }))
    );
    assert_eq!(calls[0].signature, None);
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(response.text(), "");
}

#[tokio::test]
async fn several_function_calls_and_the_follow_up_request() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([
                { "text": "Checking both cities." },
                { "functionCall": { "name": "weather", "args": { "city": "Paris" } } },
                { "functionCall": { "name": "weather", "args": { "city": "Lyon" } } },
                { "functionCall": { "name": "time", "args": {} } }
            ]),
            "STOP",
            Some(usage()),
        )),
    )
    .await;
    let gemini = provider(&server);
    let response = gemini.complete(&request()).await.expect("answer");
    let calls: Vec<_> = response.tool_calls().collect();
    let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["call_0", "call_1", "call_2"]);
    assert_eq!(calls[1].arguments, json!({ "city": "Lyon" }));
    assert_eq!(calls[2].name, "time");
    assert_eq!(response.text(), "Checking both cities.");
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);

    // One result per call: text, a JSON object, and a failure; then the user speaks again.
    let mut follow_up = request();
    follow_up.messages.push(response.message.clone());
    follow_up
        .messages
        .push(Message::tool_result("call_0", "weather", "sunny"));
    follow_up.messages.push(Message::tool_result(
        "call_1",
        "weather",
        r#"{"sky": "rain", "celsius": 12}"#,
    ));
    follow_up.messages.push(Message {
        role: archon_engine::llm::Role::Tool,
        parts: vec![Part::ToolResult(ToolResult {
            id: "call_2".into(),
            name: "time".into(),
            content: "clock unavailable".into(),
            is_error: true,
        })],
    });
    follow_up.tool_choice = ToolChoice::Tool("weather".into());
    gemini.complete(&follow_up).await.expect("answer");
    let body = sent(&server, 1).await;
    let contents = body["contents"].as_array().expect("contents");
    assert_eq!(contents.len(), 3, "{contents:#?}");
    assert_eq!(
        contents[1],
        json!({ "role": "model", "parts": [
            { "text": "Checking both cities." },
            { "functionCall": { "name": "weather", "args": { "city": "Paris" } } },
            { "functionCall": { "name": "weather", "args": { "city": "Lyon" } } },
            { "functionCall": { "name": "time", "args": {} } }
        ] })
    );
    assert_eq!(
        contents[2],
        json!({ "role": "user", "parts": [
            { "functionResponse": { "name": "weather", "response": { "content": "sunny" } } },
            { "functionResponse": { "name": "weather", "response": { "sky": "rain", "celsius": 12 } } },
            { "functionResponse": { "name": "time", "response": { "error": "clock unavailable" } } }
        ] })
    );
    assert_eq!(
        body["toolConfig"],
        json!({ "functionCallingConfig": { "mode": "ANY", "allowedFunctionNames": ["weather"] } })
    );

    for (choice, mode) in [(ToolChoice::None, "NONE"), (ToolChoice::Required, "ANY")] {
        let mut chat = request();
        chat.tool_choice = choice;
        assert_eq!(
            request_body(&chat)["toolConfig"],
            json!({ "functionCallingConfig": { "mode": mode } })
        );
    }
}

#[tokio::test]
async fn thought_signatures_round_trip() {
    let server = MockServer::start().await;
    // Gemini 3 with thought summaries on: the signature rides on the first function call only.
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([
                { "text": "**Planning** I need the weather for both cities.", "thought": true },
                {
                    "functionCall": { "name": "weather", "args": { "city": "Paris" } },
                    "thoughtSignature": "CiQBVKhc7/sig+A=="
                },
                { "functionCall": { "name": "weather", "args": { "city": "Lyon" } } }
            ]),
            "STOP",
            Some(usage()),
        )),
    )
    .await;
    let gemini = provider(&server);
    let response = gemini.complete(&request()).await.expect("answer");
    assert_eq!(
        response.message.parts[0],
        Part::Reasoning {
            text: "**Planning** I need the weather for both cities.".into(),
            signature: None
        }
    );
    let calls: Vec<_> = response.tool_calls().collect();
    assert_eq!(calls[0].signature.as_deref(), Some("CiQBVKhc7/sig+A=="));
    assert_eq!(calls[1].signature, None);

    let mut follow_up = request();
    follow_up.messages.push(response.message.clone());
    follow_up
        .messages
        .push(Message::tool_result("call_0", "weather", "sunny"));
    follow_up
        .messages
        .push(Message::tool_result("call_1", "weather", "rain"));
    gemini.complete(&follow_up).await.expect("answer");
    let body = sent(&server, 1).await;
    assert_eq!(
        body["contents"][1]["parts"],
        json!([
            // Unsigned thought summaries are not sent back; the signature stays on its call.
            {
                "functionCall": { "name": "weather", "args": { "city": "Paris" } },
                "thoughtSignature": "CiQBVKhc7/sig+A=="
            },
            { "functionCall": { "name": "weather", "args": { "city": "Lyon" } } }
        ])
    );
}

#[test]
fn signatures_on_text_and_thought_parts_go_back_on_their_part() {
    let body = candidate(
        json!([
            { "text": "thinking it over", "thought": true, "thoughtSignature": "sig-thought" },
            { "text": "Paris is sunny." , "thoughtSignature": "sig-text" },
            { "text": "", "thoughtSignature": "sig-empty" }
        ]),
        "STOP",
        None,
    );
    let response = parse_response("google", &body, None).expect("parsed");
    assert_eq!(response.text(), "Paris is sunny.");
    assert_eq!(
        response.message.parts,
        [
            Part::Reasoning {
                text: "thinking it over".into(),
                signature: Some("sig-thought".into())
            },
            Part::Reasoning {
                text: String::new(),
                signature: Some("sig-text".into())
            },
            Part::Text("Paris is sunny.".into()),
            Part::Reasoning {
                text: String::new(),
                signature: Some("sig-empty".into())
            },
        ]
    );
    let mut chat = request();
    chat.messages.push(response.message);
    assert_eq!(
        request_body(&chat)["contents"][1],
        json!({ "role": "model", "parts": [
            { "thought": true, "text": "thinking it over", "thoughtSignature": "sig-thought" },
            { "text": "Paris is sunny.", "thoughtSignature": "sig-text" },
            { "text": "", "thoughtSignature": "sig-empty" }
        ] })
    );
}

#[tokio::test]
async fn tool_schemas_arrive_normalised() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([{ "text": "ok" }]),
            "STOP",
            None,
        )),
    )
    .await;
    let mut chat = request();
    // What schemars or pydantic write.
    chat.tools = vec![ToolSpec {
        name: "book".into(),
        description: "book a trip".into(),
        parameters: json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://example.com/book.json",
            "title": "Booking",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "traveller": { "$ref": "#/$defs/Person", "description": "who travels" },
                "note": { "type": ["string", "null"], "default": null, "maxLength": 200 },
                "when": { "type": "string", "format": "date-time", "examples": ["2026-01-01T09:00:00Z"] },
                "site": { "type": "string", "format": "uri" },
                "kind": { "const": "trip" },
                "seats": { "type": "integer", "minimum": 1, "maximum": 9, "exclusiveMaximum": 10 },
                "legs": { "type": "array", "items": { "$ref": "#/$defs/Leg" }, "minItems": 1, "maxItems": 4 },
                "pay": { "oneOf": [{ "type": "string", "enum": ["card", "cash"] }, { "type": "integer" }] },
                "agent": { "anyOf": [{ "$ref": "#/$defs/Person" }, { "type": "null" }] }
            },
            "required": ["traveller", "legs"],
            "$defs": {
                "Person": {
                    "title": "Person",
                    "type": "object",
                    "additionalProperties": false,
                    "properties": { "name": { "type": "string", "title": "Name" } },
                    "required": ["name"]
                },
                "Leg": {
                    "type": "object",
                    "properties": { "to": { "type": "string" } },
                    "required": ["to"],
                    "additionalProperties": { "type": "string" }
                }
            }
        }),
    }];
    provider(&server).complete(&chat).await.expect("answer");
    let body = sent(&server, 0).await;
    let person = json!({ "type": "OBJECT", "properties": { "name": { "type": "STRING" } }, "required": ["name"] });
    assert_eq!(
        body["tools"][0]["functionDeclarations"][0]["parameters"],
        json!({
            "type": "OBJECT",
            "properties": {
                "traveller": {
                    "type": "OBJECT",
                    "description": "who travels",
                    "properties": { "name": { "type": "STRING" } },
                    "required": ["name"]
                },
                "note": { "type": "STRING", "nullable": true },
                "when": { "type": "STRING", "format": "date-time" },
                "site": { "type": "STRING" },
                "kind": { "type": "STRING", "enum": ["trip"] },
                "seats": { "type": "INTEGER", "minimum": 1, "maximum": 9 },
                "legs": {
                    "type": "ARRAY",
                    "items": { "type": "OBJECT", "properties": { "to": { "type": "STRING" } }, "required": ["to"] },
                    "minItems": 1,
                    "maxItems": 4
                },
                "pay": { "anyOf": [{ "type": "STRING", "enum": ["card", "cash"] }, { "type": "INTEGER" }] },
                "agent": { "type": "OBJECT", "properties": person["properties"], "required": ["name"], "nullable": true }
            },
            "required": ["traveller", "legs"]
        })
    );
}

#[test]
fn schema_normalisation_edge_cases() {
    // A recursive schema is cut at the depth limit instead of looping.
    let tree = json!({
        "$ref": "#/definitions/Node",
        "definitions": {
            "Node": {
                "type": "object",
                "properties": { "children": { "type": "array", "items": { "$ref": "#/definitions/Node" } } }
            }
        }
    });
    let normalized = normalize_schema(&tree);
    let mut depth = 0;
    let mut node = &normalized;
    while let Some(next) = node.pointer("/properties/children/items") {
        depth += 1;
        node = next;
    }
    assert_eq!(
        depth,
        archon_engine::llm::gemini::MAX_REF_DEPTH,
        "{normalized:#}"
    );
    assert_eq!(node, &json!({ "type": "OBJECT" }));

    // A schema that refers to itself from the root.
    let list = json!({ "type": "object", "properties": { "next": { "$ref": "#" } } });
    assert!(
        normalize_schema(&list)
            .pointer("/properties/next/properties/next")
            .is_some()
    );

    // Odd input never panics and keeps nothing it does not understand.
    for odd in [
        json!(true),
        json!(null),
        json!(5),
        json!("string"),
        json!({ "type": 7, "properties": [], "required": "a", "items": "x", "enum": {} }),
        json!({ "$ref": "https://example.com/remote.json" }),
        json!({ "$ref": "#/$defs/missing" }),
        json!({ "anyOf": [] }),
    ] {
        assert_eq!(normalize_schema(&odd), json!({}), "{odd}");
    }

    // A missing reference leaves the keywords beside it; `allOf` is merged; several types are a choice.
    assert_eq!(
        normalize_schema(&json!({ "$ref": "#/$defs/missing", "description": "kept" })),
        json!({ "description": "kept" })
    );
    assert_eq!(
        normalize_schema(&json!({
            "allOf": [
                { "type": "object", "properties": { "a": { "type": "string" } }, "required": ["a"] },
                { "properties": { "b": { "type": "number", "format": "double" } }, "required": ["b"] }
            ],
            "required": ["c"]
        })),
        json!({
            "properties": { "a": { "type": "STRING" }, "b": { "type": "NUMBER", "format": "double" } },
            "required": ["a", "b"],
            "type": "OBJECT"
        })
    );
    assert_eq!(
        normalize_schema(&json!({ "type": ["string", "integer", "null"] })),
        json!({ "anyOf": [{ "type": "STRING" }, { "type": "INTEGER" }], "nullable": true })
    );
    assert_eq!(
        normalize_schema(&json!({ "type": "string", "enum": ["a", null] })),
        json!({ "type": "STRING", "enum": ["a"], "nullable": true })
    );
}

#[tokio::test]
async fn structured_output() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([{ "text": "{\"city\": \"Paris\", \"celsius\": 21}" }]),
            "STOP",
            Some(usage()),
        )),
    )
    .await;
    let mut chat = request();
    chat.tools.clear();
    chat.output_schema = Some(json!({
        "type": "object",
        "additionalProperties": false,
        "properties": { "city": { "type": "string" }, "celsius": { "type": ["number", "null"] } },
        "required": ["city", "celsius"]
    }));
    let response = provider(&server).complete(&chat).await.expect("answer");
    let answer: Json = serde_json::from_str(&response.text()).expect("json answer");
    assert_eq!(answer["celsius"], 21);
    let body = sent(&server, 0).await;
    assert_eq!(
        body["generationConfig"],
        json!({
            "responseMimeType": "application/json",
            "responseSchema": {
                "type": "OBJECT",
                "properties": { "city": { "type": "STRING" }, "celsius": { "type": "NUMBER", "nullable": true } },
                "required": ["city", "celsius"]
            }
        })
    );
}

#[tokio::test]
async fn missing_usage_metadata() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(candidate(
            json!([{ "text": "ok" }]),
            "STOP",
            None,
        )),
    )
    .await;
    let response = provider(&server)
        .complete(&request())
        .await
        .expect("answer");
    assert!(!response.usage_reported);
    assert_eq!(response.usage.total(), 0);
    assert_eq!(response.text(), "ok");
}

#[tokio::test]
async fn a_blocked_prompt_is_an_error_naming_the_reason() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(json!({
            "promptFeedback": {
                "blockReason": "SAFETY",
                "safetyRatings": [
                    { "category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": true }
                ]
            },
            "usageMetadata": { "promptTokenCount": 7, "totalTokenCount": 7 },
            "modelVersion": "gemini-test-001",
            "responseId": "blocked-1"
        })),
    )
    .await;
    let err = provider(&server)
        .complete(&request())
        .await
        .expect_err("blocked");
    assert_eq!(
        err.message,
        "provider `google`: the prompt was blocked: `SAFETY`"
    );
    assert!(!err.retryable);
    assert_eq!(server.received_requests().await.expect("recorded").len(), 1);
}

#[test]
fn finish_reasons() {
    for (finish, parts, expected) in [
        (
            "MAX_TOKENS",
            json!([{ "text": "Sunny and" }]),
            FinishReason::Length,
        ),
        ("SAFETY", json!([]), FinishReason::ContentFilter),
        ("RECITATION", json!([]), FinishReason::ContentFilter),
        ("BLOCKLIST", json!([]), FinishReason::ContentFilter),
        ("PROHIBITED_CONTENT", json!([]), FinishReason::ContentFilter),
        ("SPII", json!([]), FinishReason::ContentFilter),
        (
            "MALFORMED_FUNCTION_CALL",
            json!([]),
            FinishReason::Other("MALFORMED_FUNCTION_CALL".into()),
        ),
        ("OTHER", json!([]), FinishReason::Other("OTHER".into())),
        ("", json!([{ "text": "ok" }]), FinishReason::Stop),
    ] {
        let body = candidate(parts, finish, None);
        let response = parse_response("google", &body, None).expect("parsed");
        assert_eq!(response.finish_reason, expected, "{finish}");
    }
    // A candidate cut by safety may come without content at all.
    let body = json!({ "candidates": [{ "finishReason": "SAFETY", "index": 0 }] });
    let response = parse_response("google", &body, None).expect("parsed");
    assert_eq!(response.finish_reason, FinishReason::ContentFilter);
    assert!(response.message.parts.is_empty());
}

#[test]
fn odd_bodies_never_panic() {
    for body in [
        json!(null),
        json!([]),
        json!("text"),
        json!({ "candidates": {} }),
        json!({ "candidates": [] }),
        json!({ "candidates": [null] }),
        json!({ "candidates": [{ "content": null }] }),
        json!({ "candidates": [{ "content": { "parts": "x" } }], "usageMetadata": { "promptTokenCount": "7" } }),
        json!({ "candidates": [{ "content": { "parts": [null, 3, { "functionCall": "x" }, { "functionCall": { "args": "{\"a\":1}" } }, { "thought": "yes", "text": 5 }] } }] }),
        json!({ "error": "quota" }),
        json!({ "error": { "code": 99999 } }),
        json!({ "promptFeedback": { "blockReason": 3 } }),
    ] {
        match parse_response("google", &body, None) {
            Ok(response) => assert!(response.tool_calls().all(|c| c.id.starts_with("call_"))),
            Err(err) => assert!(
                err.message.starts_with("provider `google`: "),
                "{}",
                err.message
            ),
        }
    }
    let body = json!({ "candidates": [{ "content": { "parts": [{ "functionCall": { "args": "{\"a\":1}" } }] } }] });
    let response = parse_response("google", &body, None).expect("parsed");
    let call = response.tool_calls().next().expect("a call");
    assert_eq!(
        (call.name.as_str(), call.arguments.clone()),
        ("", json!({ "a": 1 }))
    );
}

#[test]
fn an_error_body_with_a_success_status_is_an_error() {
    let body = json!({ "error": {
        "code": 429,
        "message": "Resource has been exhausted (e.g. check quota).",
        "status": "RESOURCE_EXHAUSTED"
    } });
    let err = parse_response("google", &body, None).expect_err("an error");
    assert_eq!(
        err.message,
        "provider `google`: the response is an error `RESOURCE_EXHAUSTED`: Resource has been exhausted (e.g. check quota)."
    );
    assert_eq!(err.status, Some(429));
    assert!(err.retryable);
}

/// Answers with the given responses in order, then repeats the last.
struct Sequence(Vec<ResponseTemplate>, AtomicUsize);

impl Respond for Sequence {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.1.fetch_add(1, Ordering::SeqCst);
        self.0[n.min(self.0.len() - 1)].clone()
    }
}

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(candidate(
        json!([{ "text": "ok" }]),
        "STOP",
        Some(usage()),
    ))
}

/// An error as Gemini sends it (google.rpc.Status).
fn error(code: u16, status: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(code).set_body_json(json!({
        "error": { "code": code, "message": message, "status": status, "details": [] }
    }))
}

async fn sequence(responses: Vec<ResponseTemplate>, settings: Settings) -> (MockServer, Gemini) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(ENDPOINT))
        .and(header("x-goog-api-key", KEY))
        .respond_with(Sequence(responses, 0.into()))
        .mount(&server)
        .await;
    let gemini =
        Gemini::new("google", server.uri(), Some(ApiKey::new(KEY)), settings).expect("provider");
    (server, gemini)
}

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.expect("recorded").len()
}

#[tokio::test]
async fn client_errors_are_not_retried_and_never_show_the_key() {
    for (code, status, message) in [
        (
            400,
            "INVALID_ARGUMENT",
            "* GenerateContentRequest.contents: contents is not specified",
        ),
        (
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials.",
        ),
        (
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity).",
        ),
    ] {
        let (server, gemini) =
            sequence(vec![error(code, status, message), ok()], llm_settings()).await;
        let err = gemini.complete(&request()).await.expect_err("fails");
        assert_eq!(requests(&server).await, 1, "{code} is not retried");
        assert_eq!(err.status, Some(code));
        assert!(!err.retryable);
        assert_eq!(
            err.message,
            format!("provider `google`: HTTP {code}: {message}")
        );
        assert!(!err.message.contains(KEY));
    }
}

#[tokio::test]
async fn rate_limits_wait_for_retry_after() {
    let (server, gemini) = sequence(
        vec![
            error(
                429,
                "RESOURCE_EXHAUSTED",
                "You exceeded your current quota.",
            )
            .insert_header("retry-after", "1"),
            ok(),
        ],
        llm_settings(),
    )
    .await;
    let started = Instant::now();
    let response = gemini
        .complete(&request())
        .await
        .expect("answer after a retry");
    let waited = started.elapsed();
    assert_eq!(response.text(), "ok");
    assert_eq!(requests(&server).await, 2);
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(5),
        "Retry-After is honoured: waited {waited:?}"
    );
}

#[tokio::test]
async fn server_errors_are_retried() {
    for (code, status, message) in [
        (500, "INTERNAL", "An internal error has occurred."),
        (
            503,
            "UNAVAILABLE",
            "The model is overloaded. Please try again later.",
        ),
    ] {
        let (server, gemini) =
            sequence(vec![error(code, status, message), ok()], llm_settings()).await;
        let response = gemini
            .complete(&request())
            .await
            .expect("answer after a retry");
        assert_eq!(response.text(), "ok");
        assert_eq!(requests(&server).await, 2, "{code}");
    }

    // Retries are bounded: the first attempt and `retries` more.
    let (server, gemini) = sequence(
        vec![error(503, "UNAVAILABLE", "The model is overloaded.")],
        llm_settings(),
    )
    .await;
    let err = gemini.complete(&request()).await.expect_err("gives up");
    assert_eq!(requests(&server).await, 3);
    assert_eq!(
        err.message,
        "provider `google`: HTTP 503: The model is overloaded."
    );
}

#[tokio::test]
async fn malformed_json_is_a_clear_error() {
    let (_server, gemini) = sequence(
        vec![ResponseTemplate::new(200).set_body_string("{\"candidates\": [{\"content\": oops")],
        llm_settings(),
    )
    .await;
    let err = gemini.complete(&request()).await.expect_err("malformed");
    assert!(
        err.message
            .starts_with("provider `google`: the response is not valid JSON"),
        "{}",
        err.message
    );

    let (_server, gemini) = sequence(
        vec![
            ResponseTemplate::new(200).set_body_json(json!({ "modelVersion": "gemini-test-001" })),
        ],
        llm_settings(),
    )
    .await;
    let err = gemini
        .complete(&request())
        .await
        .expect_err("no candidates");
    assert_eq!(
        err.message,
        "provider `google`: the response has no `candidates`"
    );
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let settings = Settings {
        retries: 1,
        ..llm_settings()
    };
    let (server, gemini) = sequence(vec![ok().set_delay(Duration::from_secs(2))], settings).await;
    let err = gemini.complete(&request()).await.expect_err("times out");
    assert!(
        err.message
            .starts_with("provider `google`: no answer within 500ms"),
        "{}",
        err.message
    );
    assert!(err.retryable);
    assert_eq!(requests(&server).await, 2);
}

#[tokio::test]
async fn a_truncated_body_is_an_error() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let served = std::sync::Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(3) {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            // Promises 500 bytes, sends fewer and hangs up.
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json; charset=UTF-8\r\ncontent-length: 500\r\nconnection: close\r\n\r\n{\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Sun",
            );
        }
    });
    let gemini = Gemini::new(
        "google",
        format!("http://127.0.0.1:{port}"),
        Some(ApiKey::new(KEY)),
        llm_settings(),
    )
    .expect("provider");
    let err = gemini.complete(&request()).await.expect_err("truncated");
    assert!(err.message.contains("cut off"), "{}", err.message);
    assert!(err.message.starts_with("provider `google`: "));
    assert!(err.retryable);
    assert!(!err.message.contains(KEY));
    assert_eq!(served.load(Ordering::SeqCst), 3, "retried");
}

/// Review findings: what Gemini rejects is never sent.
#[test]
fn empty_objects_non_string_enums_and_json_mode_with_tools_are_left_out() {
    use archon_engine::llm::gemini::{normalize_schema, request_body};
    let schema = json!({
        "type": "object",
        "properties": {
            "url": { "type": "string" },
            "headers": { "type": "object", "additionalProperties": { "type": "string" } },
            "level": { "type": "integer", "enum": [1, 2, 3], "description": "how loud" }
        },
        "required": ["url", "headers"]
    });
    let normalized = normalize_schema(&schema);
    assert!(
        normalized["properties"].get("headers").is_none(),
        "{normalized}"
    );
    assert_eq!(normalized["required"], json!(["url"]));
    assert!(normalized["properties"]["level"].get("enum").is_none());
    assert_eq!(
        normalized["properties"]["level"]["description"],
        "how loud (one of: 1, 2, 3)"
    );

    let mut request = ChatRequest {
        model: "gemini-2.5-flash".into(),
        messages: vec![Message::user("hi")],
        output_schema: Some(
            json!({ "type": "object", "properties": { "a": { "type": "string" } } }),
        ),
        ..Default::default()
    };
    assert_eq!(
        request_body(&request)["generationConfig"]["responseMimeType"],
        "application/json"
    );
    request.tools.push(ToolSpec {
        name: "t".into(),
        description: "a tool".into(),
        parameters: json!({ "type": "object", "properties": { "x": { "type": "string" } } }),
    });
    let body = request_body(&request);
    assert!(
        body.get("generationConfig")
            .is_none_or(|g| g.get("responseMimeType").is_none()),
        "{body}"
    );
}
