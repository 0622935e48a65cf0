//! The `openai` provider adapter against a local HTTP server (wiremock) with payloads shaped like the
//! provider's documented responses.

use std::time::{Duration, Instant};

use archon_engine::llm::client::Settings;
use archon_engine::llm::openai::OpenAi;
use archon_engine::llm::{
    ApiKey, ChatRequest, FinishReason, Message, Part, Provider, ToolChoice, ToolSpec,
};
use serde_json::{Value as Json, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::support::llm_settings;

fn provider(server: &MockServer) -> OpenAi {
    OpenAi::new(
        "local",
        format!("{}/v1", server.uri()),
        Some(ApiKey::new("sk-secret-key")),
        llm_settings(),
    )
    .expect("provider")
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "gpt-test".into(),
        messages: vec![
            Message::system("you are terse"),
            Message::user("what is the weather in Paris?"),
        ],
        tools: vec![ToolSpec {
            name: "weather".into(),
            description: "current weather for a city".into(),
            parameters: json!({ "type": "object", "properties": { "city": { "type": "string" } }, "required": ["city"] }),
        }],
        ..ChatRequest::default()
    }
}

/// A Chat Completions response with `message` as the first choice's message.
fn completion(message: Json, finish: Json, usage: Option<Json>) -> Json {
    let mut body = json!({
        "id": "chatcmpl-123",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test-2026",
        "choices": [{ "index": 0, "message": message, "logprobs": null, "finish_reason": finish }],
    });
    if let Some(usage) = usage {
        body["usage"] = usage;
    }
    body
}

fn usage() -> Json {
    json!({
        "prompt_tokens": 82,
        "completion_tokens": 17,
        "total_tokens": 99,
        "prompt_tokens_details": { "cached_tokens": 64 },
        "completion_tokens_details": { "reasoning_tokens": 0 }
    })
}

async fn mount(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(response)
        .mount(server)
        .await;
}

#[tokio::test]
async fn plain_text_with_usage() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200)
            .insert_header("x-request-id", "req_abc")
            .set_body_json(completion(
                json!({ "role": "assistant", "content": "Sunny, 21 °C.", "refusal": null }),
                json!("stop"),
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
        (82, 17, 64)
    );
    assert!(response.usage_reported);
    assert_eq!(response.model, "gpt-test-2026");
    assert_eq!(response.request_id.as_deref(), Some("req_abc"));

    let sent: Json = server.received_requests().await.expect("recorded")[0]
        .body_json()
        .expect("json");
    assert_eq!(sent["model"], "gpt-test");
    assert_eq!(
        sent["messages"][0],
        json!({ "role": "system", "content": "you are terse" })
    );
    assert_eq!(sent["tools"][0]["function"]["name"], "weather");
    assert_eq!(sent["tool_choice"], "auto");
}

#[tokio::test]
async fn tool_calls_and_the_follow_up_request() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(completion(
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    { "id": "call_a", "type": "function", "function": { "name": "weather", "arguments": "{\"city\":\"Paris\"}" } },
                    { "id": "call_b", "type": "function", "function": { "name": "weather", "arguments": "{\"city\":\"Lyon\"}" } }
                ]
            }),
            json!("tool_calls"),
            Some(usage()),
        )),
    )
    .await;
    let openai = provider(&server);
    let response = openai.complete(&request()).await.expect("answer");
    let calls: Vec<_> = response.tool_calls().collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].id.as_str(), calls[0].arguments.clone()),
        ("call_a", json!({ "city": "Paris" }))
    );
    assert_eq!(calls[1].arguments, json!({ "city": "Lyon" }));
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);

    // The conversation goes on with the assistant's calls and one result per call.
    let mut follow_up = request();
    follow_up.messages.push(response.message.clone());
    follow_up
        .messages
        .push(Message::tool_result("call_a", "weather", "sunny"));
    follow_up
        .messages
        .push(Message::tool_result("call_b", "weather", "rain"));
    follow_up.tool_choice = ToolChoice::Tool("weather".into());
    openai.complete(&follow_up).await.expect("answer");
    let sent: Json = server.received_requests().await.expect("recorded")[1]
        .body_json()
        .expect("json");
    let messages = sent["messages"].as_array().expect("messages");
    assert_eq!(messages[2]["role"], "assistant");
    assert_eq!(messages[2]["content"], Json::Null);
    assert_eq!(
        messages[2]["tool_calls"][1]["function"]["arguments"],
        "{\"city\":\"Lyon\"}"
    );
    assert_eq!(
        messages[3],
        json!({ "role": "tool", "tool_call_id": "call_a", "content": "sunny" })
    );
    assert_eq!(messages[4]["tool_call_id"], "call_b");
    assert_eq!(
        sent["tool_choice"],
        json!({ "type": "function", "function": { "name": "weather" } })
    );
}

#[tokio::test]
async fn quirks_of_compatible_servers_are_tolerated() {
    let cases = [
        // llama.cpp and others: arguments as an object, no usage, no finish_reason, no call id.
        (
            json!({ "role": "assistant", "content": "", "tool_calls": [{ "type": "function", "function": { "name": "weather", "arguments": { "city": "Oslo" } } }] }),
            json!(null),
            None,
        ),
        // An unknown finish_reason and content as a list of parts.
        (
            json!({ "role": "assistant", "content": [{ "type": "text", "text": "Hi" }, { "type": "text", "text": " there" }] }),
            json!("eos_token"),
            Some(usage()),
        ),
        // Empty finish_reason, reasoning, arguments that are not JSON, and an empty function name.
        (
            json!({ "role": "assistant", "reasoning_content": "thinking...", "content": "ok", "tool_calls": [{ "id": "", "type": "function", "function": { "name": "", "arguments": "{city: Oslo" } }] }),
            json!(""),
            None,
        ),
        // A weak model that writes its tool call as plain text: kept as text for the agent layer.
        (
            json!({ "role": "assistant", "content": "<tool_call>{\"name\": \"weather\"}</tool_call>" }),
            json!("stop"),
            None,
        ),
    ];
    for (index, (message, finish, usage)) in cases.into_iter().enumerate() {
        let server = MockServer::start().await;
        mount(
            &server,
            ResponseTemplate::new(200).set_body_json(completion(message, finish, usage)),
        )
        .await;
        let response = provider(&server)
            .complete(&request())
            .await
            .expect("answer");
        match index {
            0 => {
                let call = response.tool_calls().next().expect("a call");
                assert_eq!(
                    (call.id.as_str(), call.arguments.clone()),
                    ("call_0", json!({ "city": "Oslo" }))
                );
                assert_eq!(response.finish_reason, FinishReason::ToolCalls);
                assert!(!response.usage_reported);
            }
            1 => {
                assert_eq!(response.text(), "Hi there");
                assert_eq!(
                    response.finish_reason,
                    FinishReason::Other("eos_token".into())
                );
            }
            2 => {
                assert!(
                    matches!(&response.message.parts[0], Part::Reasoning { text, .. } if text == "thinking...")
                );
                let call = response.tool_calls().next().expect("a call");
                assert_eq!(call.name, "");
                assert_eq!(call.arguments, json!("{city: Oslo"));
                assert_eq!(response.finish_reason, FinishReason::ToolCalls);
            }
            _ => {
                assert_eq!(response.tool_calls().count(), 0);
                assert!(response.text().contains("<tool_call>"));
            }
        }
    }
}

/// Answers with the given responses in order, then repeats the last.
struct Sequence(Vec<ResponseTemplate>, std::sync::atomic::AtomicUsize);

impl Respond for Sequence {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0[n.min(self.0.len() - 1)].clone()
    }
}

fn ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(completion(
        json!({ "role": "assistant", "content": "ok" }),
        json!("stop"),
        Some(usage()),
    ))
}

fn error(status: u16, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "error": { "message": message, "type": "invalid_request_error", "param": null, "code": null }
    }))
}

async fn sequence(responses: Vec<ResponseTemplate>) -> (MockServer, OpenAi) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header("authorization", "Bearer sk-secret-key"))
        .respond_with(Sequence(responses, 0.into()))
        .mount(&server)
        .await;
    let openai = provider(&server);
    (server, openai)
}

async fn requests(server: &MockServer) -> usize {
    server.received_requests().await.expect("recorded").len()
}

#[tokio::test]
async fn client_errors_are_not_retried_and_never_show_the_key() {
    for (status, message) in [
        (400, "messages: field required"),
        (401, "Incorrect API key provided: sk-secr***"),
    ] {
        let (server, openai) = sequence(vec![error(status, message), ok()]).await;
        let err = openai.complete(&request()).await.expect_err("fails");
        assert_eq!(requests(&server).await, 1, "{status} is not retried");
        assert_eq!(err.status, Some(status));
        assert!(!err.retryable);
        assert_eq!(
            err.message,
            format!("provider `local`: HTTP {status}: {message}")
        );
        assert!(!err.message.contains("sk-secret-key"));
    }
    // A gateway that echoes the key it was sent: masked in the error, and so in events and the store.
    let (_server, openai) = sequence(vec![error(
        401,
        "key sk-secret-key is not valid for this route",
    )])
    .await;
    let err = openai.complete(&request()).await.expect_err("fails");
    assert_eq!(
        err.message,
        "provider `local`: HTTP 401: key *** is not valid for this route"
    );
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried() {
    let (server, openai) = sequence(vec![
        error(429, "Rate limit reached").insert_header("retry-after", "1"),
        ok(),
    ])
    .await;
    let started = Instant::now();
    let response = openai
        .complete(&request())
        .await
        .expect("answer after a retry");
    assert_eq!(response.text(), "ok");
    assert_eq!(requests(&server).await, 2);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "Retry-After is honoured"
    );

    for status in [500, 502, 503, 529] {
        let (server, openai) = sequence(vec![error(status, "overloaded"), ok()]).await;
        openai
            .complete(&request())
            .await
            .expect("answer after a retry");
        assert_eq!(requests(&server).await, 2, "{status}");
    }

    // Retries are bounded: the first attempt and `retries` more.
    let (server, openai) = sequence(vec![error(503, "down")]).await;
    let err = openai.complete(&request()).await.expect_err("gives up");
    assert_eq!(requests(&server).await, 3);
    assert_eq!(err.message, "provider `local`: HTTP 503: down");
}

#[tokio::test]
async fn broken_responses_are_clear_errors() {
    let (_server, openai) = sequence(vec![
        ResponseTemplate::new(200).set_body_string("{\"choices\": ["),
    ])
    .await;
    let err = openai.complete(&request()).await.expect_err("malformed");
    assert!(
        err.message
            .starts_with("provider `local`: the response is not valid JSON"),
        "{}",
        err.message
    );

    let (_server, openai) = sequence(vec![
        ResponseTemplate::new(200).set_body_json(json!({ "id": "x", "choices": [] })),
    ])
    .await;
    let err = openai.complete(&request()).await.expect_err("no choices");
    assert_eq!(
        err.message,
        "provider `local`: the response has no `choices`"
    );

    // Slower than the timeout: each attempt times out.
    let (server, openai) = sequence(vec![ok().set_delay(Duration::from_secs(2))]).await;
    let err = openai.complete(&request()).await.expect_err("times out");
    assert!(
        err.message.contains("no answer within 500ms"),
        "{}",
        err.message
    );
    assert_eq!(requests(&server).await, 3);
}

#[test]
fn a_truncated_body_is_an_error() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(3) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\nconnection: close\r\n\r\n{\"id\":\"x\",\"choices\":[{\"message\":",
            );
        }
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let openai = OpenAi::new(
        "local",
        format!("http://127.0.0.1:{port}/v1"),
        None,
        llm_settings(),
    )
    .expect("provider");
    let err = runtime
        .block_on(openai.complete(&request()))
        .expect_err("truncated");
    assert!(err.message.contains("cut off"), "{}", err.message);
    assert!(err.retryable);
}

/// Against a real OpenAI-compatible server (llama.cpp from `../shared/tools/local-llm.sh start`), when
/// `ARCHON_E2E_OPENAI_BASE_URL` names it: a chat, a request carrying tools, usage parsed. Without the
/// variable the test checks nothing and says so.
#[tokio::test]
#[allow(clippy::print_stderr)]
async fn end_to_end_against_a_real_server_when_one_is_configured() {
    let Ok(base_url) = std::env::var("ARCHON_E2E_OPENAI_BASE_URL") else {
        eprintln!("skipped: set ARCHON_E2E_OPENAI_BASE_URL to run against a real server");
        return;
    };
    let server = OpenAi::new(
        "e2e",
        base_url,
        None,
        Settings {
            timeout: Duration::from_secs(120),
            retries: 1,
            ..Settings::default()
        },
    )
    .expect("provider");
    let mut chat = ChatRequest {
        model: std::env::var("ARCHON_E2E_OPENAI_MODEL").unwrap_or_else(|_| "local".into()),
        messages: vec![Message::user("Say hello in one word.")],
        max_tokens: Some(16),
        temperature: Some(0.0),
        ..ChatRequest::default()
    };
    let started = Instant::now();
    let answer = server.complete(&chat).await.expect("a chat answer");
    eprintln!(
        "e2e chat: {:?} in {} ms, usage {:?}, finish {:?}",
        answer.text(),
        started.elapsed().as_millis(),
        answer.usage,
        answer.finish_reason
    );
    assert!(answer.usage_reported, "the server reports usage");
    assert!(answer.usage.input_tokens > 0 && answer.usage.output_tokens > 0);

    chat.tools = request().tools;
    chat.messages = vec![Message::user(
        "What is the weather in Paris? Use the weather tool.",
    )];
    let started = Instant::now();
    let answer = server
        .complete(&chat)
        .await
        .expect("an answer to a request with tools");
    eprintln!(
        "e2e tools: {:?}, {} tool calls in {} ms, finish {:?}",
        answer.text(),
        answer.tool_calls().count(),
        started.elapsed().as_millis(),
        answer.finish_reason
    );
    assert!(answer.usage.input_tokens > 0);
}

/// Issue 13, item 12: a response body larger than archon reads (16 MiB) fails the call at once, without a
/// retry, whether its length is announced or it simply keeps coming.
#[tokio::test]
async fn an_oversized_response_fails_once_without_filling_memory() {
    let (server, openai) = sequence(vec![
        ResponseTemplate::new(200).set_body_string("x".repeat(17 * 1024 * 1024)),
    ])
    .await;
    let error = openai.complete(&request()).await.expect_err("too large");
    let announced = (
        error.message.clone(),
        error.retryable,
        server.received_requests().await.expect("recorded").len(),
    );

    // A chunked body with no length: read until it passes the limit.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let served = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut request = vec![0u8; 64 * 1024];
        let _ = socket.read(&mut request).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        socket.write_all(head.as_bytes()).await.expect("head");
        let chunk = format!("{:x}\r\n{}\r\n", 1024 * 1024, "y".repeat(1024 * 1024));
        let mut sent = 0;
        // Stops when archon hangs up; 64 MiB at most.
        while sent < 64 && socket.write_all(chunk.as_bytes()).await.is_ok() {
            sent += 1;
        }
        sent
    });
    let streaming = OpenAi::new(
        "local",
        format!("http://{address}/v1"),
        Some(ApiKey::new("sk-secret-key")),
        llm_settings(),
    )
    .expect("provider");
    let error = streaming.complete(&request()).await.expect_err("too large");
    let sent = served.await.expect("server");
    let too_large =
        "provider `local`: the response is larger than 16 MiB, which archon reads at most"
            .to_owned();
    assert_eq!(announced, (too_large.clone(), false, 1));
    assert_eq!((error.message, error.retryable), (too_large, false));
    assert!(sent < 64, "archon read all {sent} MiB");
}

/// The bodies the server received, in order.
async fn sent(server: &MockServer) -> Vec<Json> {
    server
        .received_requests()
        .await
        .expect("recorded")
        .iter()
        .map(|r| serde_json::from_slice(&r.body).expect("a JSON body"))
        .collect()
}

/// The token limit field of each request, in order: (`max_completion_tokens`, `max_tokens`).
async fn limits(server: &MockServer) -> Vec<(Json, Json)> {
    sent(server)
        .await
        .iter()
        .map(|b| {
            (
                b.get("max_completion_tokens").cloned().unwrap_or_default(),
                b.get("max_tokens").cloned().unwrap_or_default(),
            )
        })
        .collect()
}

/// The token limit goes in the field the model needs, whatever the base URL: `max_completion_tokens` for
/// OpenAI's reasoning models (which refuse `max_tokens`), `max_tokens` for the others (every compatible
/// server knows it; one that does not know a field ignores it, which would lose the limit without a word);
/// `max_tokens_param` pins one; a server that refuses the field it was sent, naming it, is sent the other
/// at once and from then on (issue 14, item 2).
#[tokio::test]
async fn the_token_limit_field_is_chosen_by_model_setting_or_refusal_not_by_url() {
    use archon_engine::spec::MaxTokensParam;
    let limited = |model: &str| ChatRequest {
        model: model.into(),
        max_tokens: Some(300),
        ..request()
    };
    let completion = (json!(300), Json::Null);
    let legacy = (Json::Null, json!(300));
    for (model, field) in [
        ("gpt-4o", &legacy),
        ("qwen2.5-7b-instruct", &legacy),
        ("o3-mini", &completion),
        ("o1", &completion),
        ("openai/gpt-5", &completion),
        ("gpt-5.1-codex", &completion),
        ("o4x", &legacy),
    ] {
        let (server, openai) = sequence(vec![ok()]).await;
        openai.complete(&limited(model)).await.expect("answer");
        assert_eq!(&limits(&server).await[0], field, "{model}");
    }
    for (param, model, field) in [
        (MaxTokensParam::MaxCompletionTokens, "gpt-4o", &completion),
        (MaxTokensParam::MaxTokens, "o3", &legacy),
    ] {
        let (server, openai) = sequence(vec![ok()]).await;
        let openai = openai.with_max_tokens_param(param);
        openai.complete(&limited(model)).await.expect("answer");
        assert_eq!(&limits(&server).await[0], field, "{param:?}");
    }

    // OpenAI's answer to `max_tokens` for a reasoning model behind a deployment name it cannot tell.
    let (server, openai) = sequence(vec![
        error(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
        ),
        ok(),
    ])
    .await;
    openai
        .complete(&limited("my-deployment"))
        .await
        .expect("answer");
    openai
        .complete(&limited("my-deployment"))
        .await
        .expect("answer");
    assert_eq!(
        limits(&server).await,
        [legacy.clone(), completion.clone(), completion.clone()]
    );

    // An older compatible server's answer to an argument it does not know.
    let (server, openai) = sequence(vec![
        error(
            400,
            "Unrecognized request argument supplied: max_completion_tokens",
        ),
        ok(),
    ])
    .await;
    openai.complete(&limited("o3")).await.expect("answer");
    assert_eq!(limits(&server).await, [completion.clone(), legacy.clone()]);

    // A limit too large for the context names both fields: not a refusal of either.
    let (server, openai) = sequence(vec![error(
        400,
        "'max_tokens' or 'max_completion_tokens' is too large: 300. This model's maximum context length is 256 tokens",
    )])
    .await;
    openai
        .complete(&limited("gpt-4o"))
        .await
        .expect_err("refused");
    assert_eq!(limits(&server).await, [legacy]);

    // A pinned field is kept: the server's refusal is the error.
    let (server, openai) = sequence(vec![error(
        400,
        "Unrecognized request argument supplied: max_completion_tokens",
    )])
    .await;
    let openai = openai.with_max_tokens_param(MaxTokensParam::MaxCompletionTokens);
    openai
        .complete(&limited("gpt-4o"))
        .await
        .expect_err("refused");
    assert_eq!(limits(&server).await, [completion]);
}

/// A refusal (`message.refusal`, with `finish_reason: stop` as the API sends it) is no answer (item 8).
#[tokio::test]
async fn a_refusal_is_a_filtered_answer_not_a_stop() {
    let server = MockServer::start().await;
    mount(
        &server,
        ResponseTemplate::new(200).set_body_json(completion(
            json!({ "role": "assistant", "content": null, "refusal": "I can't help with that." }),
            json!("stop"),
            Some(usage()),
        )),
    )
    .await;
    let response = provider(&server)
        .complete(&request())
        .await
        .expect("a response");
    assert_eq!(response.finish_reason, FinishReason::ContentFilter);
    assert_eq!(response.text(), "I can't help with that.");
}

/// A provider's 5 MB error message is kept to its first 2,000 characters and a count, in the error and so
/// in the report (issue 14, item 10).
#[tokio::test]
async fn a_huge_error_message_is_cut() {
    let huge = "x".repeat(5 * 1024 * 1024);
    let (_server, openai) = sequence(vec![error(400, &huge)]).await;
    let err = openai.complete(&request()).await.expect_err("refused");
    let expected = format!(
        "provider `local`: HTTP 400: {} [... cut: {} more characters]",
        "x".repeat(2000),
        5 * 1024 * 1024 - 2000
    );
    assert_eq!(err.message, expected);
}

/// A `Retry-After` longer than archon waits fails the call saying so; a refused connection says why.
#[tokio::test]
async fn a_wait_too_long_and_a_refused_connection_say_why() {
    let (server, openai) = sequence(vec![
        error(429, "rate limited").insert_header("retry-after", "99999"),
    ])
    .await;
    let err = openai.complete(&request()).await.expect_err("fails");
    assert_eq!(requests(&server).await, 1, "not retried");
    assert_eq!(
        err.message,
        "provider `local`: HTTP 429: rate limited (it asked to wait `1day 3h 46m 39s`, longer than the `5s` archon waits)"
    );

    let unused = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let settings = Settings {
        retries: 0,
        ..llm_settings()
    };
    let closed =
        OpenAi::new("local", format!("http://{unused}/v1"), None, settings).expect("provider");
    let err = closed.complete(&request()).await.expect_err("fails");
    assert!(
        err.message
            .starts_with("provider `local`: cannot connect: ")
            && err.message.contains("connection refused"),
        "{}",
        err.message
    );
}
