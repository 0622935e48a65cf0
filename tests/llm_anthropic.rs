//! The `anthropic` provider adapter against a local HTTP server (wiremock) with payloads shaped like the
//! provider's documented responses.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use archon_engine::llm::anthropic::{self, API_VERSION, Anthropic, DEFAULT_MAX_TOKENS};
use archon_engine::llm::client::Settings;
use archon_engine::llm::{
    ApiKey, ChatRequest, FinishReason, Message, Part, Provider, Role, ToolCall, ToolChoice,
    ToolSpec,
};
use serde_json::{Value as Json, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::llm_settings;

const KEY: &str = "sk-ant-api03-secret-key";

fn provider(server: &MockServer, settings: Settings) -> Anthropic {
    Anthropic::new("claude", server.uri(), Some(ApiKey::new(KEY)), settings).expect("provider")
}

fn weather() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "Get the current weather in a given location".into(),
        parameters: json!({
            "type": "object",
            "properties": { "location": { "type": "string", "description": "The city and state, e.g. San Francisco, CA" } },
            "required": ["location"]
        }),
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "claude-sonnet-4-5".into(),
        messages: vec![
            Message::system("You are terse."),
            Message::user("What is the weather like in San Francisco?"),
        ],
        tools: vec![weather()],
        ..ChatRequest::default()
    }
}

/// A Messages response holding `content`, as the API documents it.
fn message(content: Json, stop_reason: &str) -> Json {
    json!({
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": null,
        "usage": {
            "input_tokens": 2095,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 1800,
            "output_tokens": 503,
            "service_tier": "standard"
        }
    })
}

fn text_message(text: &str) -> Json {
    message(json!([{ "type": "text", "text": text }]), "end_turn")
}

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200)
        .insert_header("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
        .set_body_json(text_message("Hello!"))
}

/// An error response as Anthropic sends it.
fn error(status: u16, kind: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "type": "error",
        "error": { "type": kind, "message": message },
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"
    }))
}

/// Answers with the given responses in order, then repeats the last.
struct Sequence(Vec<ResponseTemplate>, AtomicUsize);

impl Respond for Sequence {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.1.fetch_add(1, Ordering::SeqCst);
        self.0[n.min(self.0.len() - 1)].clone()
    }
}

/// A server answering `/v1/messages` (only with the key and version headers) with `responses` in order.
async fn sequence(responses: Vec<ResponseTemplate>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", KEY))
        .and(header("anthropic-version", API_VERSION))
        .respond_with(Sequence(responses, 0.into()))
        .mount(&server)
        .await;
    server
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.expect("recorded")
}

async fn sent(server: &MockServer, index: usize) -> Json {
    requests(server).await[index].body_json().expect("json")
}

#[tokio::test]
async fn plain_text_with_usage() {
    let server = sequence(vec![ok()]).await;
    let response = provider(&server, llm_settings())
        .complete(&request())
        .await
        .expect("answer");
    assert_eq!(response.text(), "Hello!");
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert!(response.usage_reported);
    // `input_tokens` counts every input token: Anthropic's own plus cache reads and writes.
    assert_eq!(response.usage.input_tokens, 2095 + 1800 + 100);
    assert_eq!(response.usage.cached_input_tokens, 1800);
    assert_eq!(response.usage.output_tokens, 503);
    assert_eq!(response.model, "claude-sonnet-4-5-20250929");
    assert_eq!(
        response.request_id.as_deref(),
        Some("req_011CSHoEeqs5C35K2UUqR7Fy")
    );

    let received = &requests(&server).await[0];
    assert_eq!(received.headers.get("x-api-key").expect("key"), KEY);
    assert_eq!(
        received.headers.get("anthropic-version").expect("version"),
        "2023-06-01"
    );
    let sent: Json = received.body_json().expect("json");
    assert_eq!(
        sent,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": DEFAULT_MAX_TOKENS,
            "system": "You are terse.",
            "messages": [
                { "role": "user", "content": [{ "type": "text", "text": "What is the weather like in San Francisco?" }] }
            ],
            "tools": [{
                "name": "get_weather",
                "description": "Get the current weather in a given location",
                "input_schema": weather().parameters
            }],
            "tool_choice": { "type": "auto" }
        })
    );
}

#[tokio::test]
async fn one_tool_call() {
    let body = message(
        json!([
            { "type": "text", "text": "I'll check the current weather in San Francisco for you." },
            { "type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "get_weather", "input": { "location": "San Francisco, CA" } }
        ]),
        "tool_use",
    );
    // No `request-id` header: the message id stands in.
    let server = sequence(vec![ResponseTemplate::new(200).set_body_json(body)]).await;
    let response = provider(&server, llm_settings())
        .complete(&request())
        .await
        .expect("answer");
    assert_eq!(
        response.message.parts,
        vec![
            Part::Text("I'll check the current weather in San Francisco for you.".into()),
            Part::ToolCall(ToolCall {
                id: "toolu_01A09q90qw90lq917835lq9".into(),
                name: "get_weather".into(),
                arguments: json!({ "location": "San Francisco, CA" }),
                signature: None,
            }),
        ]
    );
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        response.request_id.as_deref(),
        Some("msg_01XFDUDYJgAACzvnptvVoYEL")
    );
}

#[tokio::test]
async fn several_tool_calls_and_the_follow_up_request() {
    let server = sequence(vec![
        ResponseTemplate::new(200).set_body_json(message(
            json!([
                { "type": "text", "text": "Checking both cities." },
                { "type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": { "location": "San Francisco, CA" } },
                { "type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": { "location": "New York, NY" } }
            ]),
            "tool_use",
        )),
        ok(),
    ])
    .await;
    let claude = provider(&server, llm_settings());
    let response = claude.complete(&request()).await.expect("answer");
    let calls: Vec<_> = response.tool_calls().collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[1].id.as_str(), &calls[1].arguments),
        ("toolu_02", &json!({ "location": "New York, NY" }))
    );
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);

    // The results go back, one of them an error, followed by a user remark and a late system message.
    let mut follow_up = request();
    follow_up.messages.push(response.message.clone());
    follow_up.messages.push(Message::tool_result(
        "toolu_01",
        "get_weather",
        "15 degrees",
    ));
    let mut failed = Message::tool_result("toolu_02", "get_weather", "service unavailable");
    if let Part::ToolResult(result) = &mut failed.parts[0] {
        result.is_error = true;
    }
    follow_up.messages.push(failed);
    follow_up.messages.push(Message::user("Answer in Celsius."));
    follow_up
        .messages
        .push(Message::system("Never mention the tools."));
    follow_up.tool_choice = ToolChoice::Tool("get_weather".into());
    follow_up.max_tokens = Some(512);
    follow_up.temperature = Some(0.2);
    follow_up.stop = vec!["\n\nHuman:".into()];
    claude.complete(&follow_up).await.expect("answer");

    let received = &requests(&server).await[1];
    assert_eq!(received.headers.get("x-api-key").expect("key"), KEY);
    assert_eq!(
        received.headers.get("anthropic-version").expect("version"),
        API_VERSION
    );
    let sent: Json = received.body_json().expect("json");
    assert_eq!(sent["system"], "You are terse.\n\nNever mention the tools.");
    assert_eq!(
        sent["messages"],
        json!([
            { "role": "user", "content": [{ "type": "text", "text": "What is the weather like in San Francisco?" }] },
            { "role": "assistant", "content": [
                { "type": "text", "text": "Checking both cities." },
                { "type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": { "location": "San Francisco, CA" } },
                { "type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": { "location": "New York, NY" } }
            ] },
            // The two tool messages and the user message become one `user` message, results first.
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "toolu_01", "content": "15 degrees", "is_error": false },
                { "type": "tool_result", "tool_use_id": "toolu_02", "content": "service unavailable", "is_error": true },
                { "type": "text", "text": "Answer in Celsius." }
            ] }
        ])
    );
    assert_eq!(
        sent["tool_choice"],
        json!({ "type": "tool", "name": "get_weather" })
    );
    assert_eq!(sent["max_tokens"], 512);
    assert_eq!(sent["temperature"], 0.2);
    assert_eq!(sent["stop_sequences"], json!(["\n\nHuman:"]));
}

#[tokio::test]
async fn thinking_blocks_round_trip_unchanged() {
    let signature =
        "WaUjzkypQ2mUEVM36O2TxuC06KN8xyfbJwyem2dw3URve/op91XWHOEBLLqIOMfFG/UvLEczmEsUjavL==";
    let redacted = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP";
    let server = sequence(vec![
        ResponseTemplate::new(200).set_body_json(message(
            json!([
                { "type": "thinking", "thinking": "The user wants the weather; I should call the tool.", "signature": signature },
                { "type": "redacted_thinking", "data": redacted },
                { "type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": { "location": "San Francisco, CA" } }
            ]),
            "tool_use",
        )),
        ok(),
    ])
    .await;
    let claude = provider(&server, llm_settings());
    let response = claude.complete(&request()).await.expect("answer");
    assert_eq!(
        response.message.parts[..2],
        [
            Part::Reasoning {
                text: "The user wants the weather; I should call the tool.".into(),
                signature: Some(signature.into()),
            },
            Part::Reasoning {
                text: String::new(),
                signature: Some(redacted.into()),
            },
        ]
    );

    let mut follow_up = request();
    follow_up.messages.push(response.message.clone());
    follow_up.messages.push(Message::tool_result(
        "toolu_01",
        "get_weather",
        "15 degrees",
    ));
    claude.complete(&follow_up).await.expect("answer");
    let sent = sent(&server, 1).await;
    assert_eq!(
        sent["messages"][1]["content"],
        json!([
            { "type": "thinking", "thinking": "The user wants the weather; I should call the tool.", "signature": signature },
            { "type": "redacted_thinking", "data": redacted },
            { "type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": { "location": "San Francisco, CA" } }
        ])
    );
}

#[tokio::test]
async fn structured_output_goes_through_a_forced_output_tool() {
    let schema = json!({
        "type": "object",
        "properties": { "city": { "type": "string" }, "celsius": { "type": "number" } },
        "required": ["city", "celsius"]
    });
    let server = sequence(vec![ResponseTemplate::new(200).set_body_json(message(
        json!([
            { "type": "tool_use", "id": "toolu_01", "name": "archon_final_answer", "input": { "city": "San Francisco", "celsius": 15 } }
        ]),
        "tool_use",
    ))])
    .await;
    let mut structured = request();
    structured.tools.clear();
    structured.output_schema = Some(schema.clone());
    let response = provider(&server, llm_settings())
        .complete(&structured)
        .await
        .expect("answer");
    let answer: Json = serde_json::from_str(&response.text()).expect("the text is JSON");
    assert_eq!(answer, json!({ "city": "San Francisco", "celsius": 15 }));
    assert_eq!(response.tool_calls().count(), 0);
    assert_eq!(response.finish_reason, FinishReason::Stop);

    let sent = sent(&server, 0).await;
    assert_eq!(sent["tools"][0]["name"], "archon_final_answer");
    assert_eq!(sent["tools"][0]["input_schema"], schema);
    assert_eq!(
        sent["tool_choice"],
        json!({ "type": "tool", "name": "archon_final_answer" })
    );
    assert_eq!(
        sent["system"], "You are terse.",
        "the schema is not in the prompt"
    );
}

#[test]
fn structured_output_leaves_other_tools_usable() {
    let mut structured = request();
    structured.output_schema = Some(json!({ "type": "object" }));
    let body = anthropic::request_body(&structured);
    let names: Vec<_> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].clone())
        .collect();
    assert_eq!(names, [json!("get_weather"), json!("archon_final_answer")]);
    assert_eq!(body["tool_choice"], json!({ "type": "any" }));

    // Tools forbidden: only the answer tool is offered.
    structured.tool_choice = ToolChoice::None;
    let body = anthropic::request_body(&structured);
    assert_eq!(body["tools"].as_array().expect("tools").len(), 1);
    assert_eq!(
        body["tool_choice"],
        json!({ "type": "tool", "name": "archon_final_answer" })
    );
}

#[tokio::test]
async fn missing_usage_and_stop_reason() {
    let server = sequence(vec![ResponseTemplate::new(200).set_body_json(json!({
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [{ "type": "text", "text": "Hi" }]
    }))])
    .await;
    let response = provider(&server, llm_settings())
        .complete(&request())
        .await
        .expect("answer");
    assert_eq!(response.text(), "Hi");
    assert!(!response.usage_reported);
    assert_eq!(response.usage.total(), 0);
    assert_eq!(response.finish_reason, FinishReason::Stop);
}

#[test]
fn stop_reasons() {
    for (reason, expected) in [
        ("end_turn", FinishReason::Stop),
        ("stop_sequence", FinishReason::Stop),
        ("max_tokens", FinishReason::Length),
        ("model_context_window_exceeded", FinishReason::Length),
        ("refusal", FinishReason::ContentFilter),
        ("pause_turn", FinishReason::Other("pause_turn".into())),
    ] {
        let response =
            anthropic::parse_response("claude", &text_message_with(reason), None).expect("answer");
        assert_eq!(response.finish_reason, expected, "{reason}");
    }
}

fn text_message_with(stop_reason: &str) -> Json {
    message(json!([{ "type": "text", "text": "Hi" }]), stop_reason)
}

#[test]
fn odd_responses_are_errors_or_tolerated_never_panics() {
    let err = anthropic::parse_response(
        "claude",
        &json!({
            "type": "error",
            "error": { "type": "overloaded_error", "message": "Overloaded" },
            "request_id": "req_01"
        }),
        None,
    )
    .expect_err("an error body");
    assert_eq!(
        err.message,
        "provider `claude`: the response is an error `overloaded_error`: Overloaded (request `req_01`)"
    );
    assert!(err.retryable);

    let err = anthropic::parse_response("claude", &json!({ "id": "msg_01" }), None)
        .expect_err("no content");
    assert_eq!(
        err.message,
        "provider `claude`: the response has no `content`"
    );

    // Blocks of unknown or odd shapes are skipped or given defaults.
    let response = anthropic::parse_response(
        "claude",
        &json!({
            "content": [
                42,
                { "type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {} },
                { "type": "text", "text": "" },
                { "type": "text", "text": 7 },
                { "type": "tool_use", "name": "get_weather", "input": "{\"location\": \"Paris\"}" },
                { "type": "thinking" }
            ],
            "stop_reason": null,
            "usage": { "input_tokens": "many", "output_tokens": 3 }
        }),
        None,
    )
    .expect("tolerated");
    let call = response.tool_calls().next().expect("a call");
    assert_eq!(
        (call.id.as_str(), &call.arguments),
        ("toolu_4", &json!({ "location": "Paris" }))
    );
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (0, 3)
    );
    assert_eq!(response.request_id, None);
}

#[test]
fn request_edge_cases() {
    let mut odd = request();
    odd.tool_choice = ToolChoice::Required;
    odd.tools[0].parameters = Json::Null;
    odd.messages.push(Message::assistant(vec![
        // Reasoning from another provider has no signature: Anthropic would refuse it.
        Part::Reasoning {
            text: "hmm".into(),
            signature: None,
        },
        Part::Text(String::new()),
        Part::ToolCall(ToolCall {
            id: "toolu_a".into(),
            name: "get_weather".into(),
            arguments: json!("{\"location\": \"Oslo\"}"),
            signature: None,
        }),
        Part::ToolCall(ToolCall {
            id: "toolu_b".into(),
            name: "get_weather".into(),
            arguments: json!("{location: Oslo"),
            signature: None,
        }),
    ]));
    let body = anthropic::request_body(&odd);
    assert_eq!(body["tool_choice"], json!({ "type": "any" }));
    assert_eq!(
        body["tools"][0]["input_schema"],
        json!({ "type": "object", "properties": {} })
    );
    assert_eq!(
        body["messages"][1]["content"],
        json!([
            { "type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": { "location": "Oslo" } },
            { "type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {} }
        ])
    );

    odd.tool_choice = ToolChoice::None;
    odd.tools.clear();
    odd.messages.retain(|m| m.role != Role::System);
    let body = anthropic::request_body(&odd);
    assert!(body.get("system").is_none());
    assert!(body.get("tools").is_none());
    assert!(body.get("tool_choice").is_none());
}

#[tokio::test]
async fn client_errors_are_not_retried_and_never_show_the_key() {
    for (status, kind, message) in [
        (
            400,
            "invalid_request_error",
            "messages: roles must alternate between \"user\" and \"assistant\"",
        ),
        (401, "authentication_error", "invalid x-api-key"),
    ] {
        let server = sequence(vec![error(status, kind, message), ok()]).await;
        let err = provider(&server, llm_settings())
            .complete(&request())
            .await
            .expect_err("fails");
        assert_eq!(requests(&server).await.len(), 1, "{status} is not retried");
        assert_eq!(err.status, Some(status));
        assert!(!err.retryable);
        assert_eq!(
            err.message,
            format!("provider `claude`: HTTP {status}: {message}")
        );
        assert!(!err.message.contains(KEY));
        assert!(!format!("{err:?}").contains(KEY));
    }
}

#[tokio::test]
async fn rate_limits_honour_retry_after() {
    let server = sequence(vec![
        error(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
        )
        .insert_header("retry-after", "1"),
        ok(),
    ])
    .await;
    let started = Instant::now();
    let response = provider(&server, llm_settings())
        .complete(&request())
        .await
        .expect("answer after a retry");
    let waited = started.elapsed();
    assert_eq!(response.text(), "Hello!");
    assert_eq!(requests(&server).await.len(), 2);
    assert!(waited >= Duration::from_millis(950), "waited {waited:?}");
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
}

#[tokio::test]
async fn server_errors_and_overload_are_retried() {
    for (status, kind, message) in [
        (500, "api_error", "Internal server error"),
        (529, "overloaded_error", "Overloaded"),
    ] {
        let server = sequence(vec![error(status, kind, message), ok()]).await;
        let response = provider(&server, llm_settings())
            .complete(&request())
            .await
            .expect("answer after a retry");
        assert_eq!(response.text(), "Hello!", "{status}");
        assert_eq!(requests(&server).await.len(), 2, "{status}");
    }

    // Retries are bounded: the first attempt and `retries` more.
    let server = sequence(vec![error(529, "overloaded_error", "Overloaded")]).await;
    let err = provider(&server, llm_settings())
        .complete(&request())
        .await
        .expect_err("gives up");
    assert_eq!(requests(&server).await.len(), 3);
    assert_eq!(err.message, "provider `claude`: HTTP 529: Overloaded");
    assert!(err.retryable);
}

#[tokio::test]
async fn a_malformed_body_is_an_error() {
    let server = sequence(vec![
        ResponseTemplate::new(200).set_body_string("<html><body>Bad Gateway</body></html>"),
    ])
    .await;
    let err = provider(&server, llm_settings())
        .complete(&request())
        .await
        .expect_err("malformed");
    assert!(
        err.message
            .starts_with("provider `claude`: the response is not valid JSON"),
        "{}",
        err.message
    );
    assert_eq!(
        requests(&server).await.len(),
        1,
        "a whole non-JSON body is not retried"
    );
}

#[tokio::test]
async fn a_slow_answer_times_out_and_is_retried() {
    let server = sequence(vec![ok().set_delay(Duration::from_secs(2))]).await;
    let err = provider(
        &server,
        Settings {
            retries: 1,
            ..llm_settings()
        },
    )
    .complete(&request())
    .await
    .expect_err("times out");
    assert!(
        err.message
            .starts_with("provider `claude`: no answer within 500ms"),
        "{}",
        err.message
    );
    assert!(err.retryable);
    assert_eq!(requests(&server).await.len(), 2);
}

/// A raw HTTP server that promises 500 bytes of body, sends fewer and hangs up; it counts the requests.
fn truncating_server() -> (u16, Arc<AtomicUsize>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            // Read the whole request first, so that hanging up never cuts the client's own sending.
            let mut length = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let _ = reader.read_exact(&mut vec![0; length]);
            seen.fetch_add(1, Ordering::SeqCst);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\nconnection: close\r\n\r\n{\"id\":\"msg_01\",\"type\":\"message\",\"content\":[{\"type\":\"text\",",
            );
        }
    });
    (port, count)
}

#[tokio::test]
async fn a_truncated_body_is_an_error_and_retried() {
    let (port, count) = truncating_server();
    let claude = Anthropic::new(
        "claude",
        format!("http://127.0.0.1:{port}/"),
        None,
        llm_settings(),
    )
    .expect("provider");
    let err = claude.complete(&request()).await.expect_err("truncated");
    assert!(
        err.message
            .starts_with("provider `claude`: the response was cut off"),
        "{}",
        err.message
    );
    assert!(err.retryable);
    assert_eq!(count.load(Ordering::SeqCst), 3);
}
