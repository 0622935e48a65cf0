//! Provider overhead (run with `cargo bench --bench llm`): building the request body and reading the response
//! of a 20-message conversation with tools, for each adapter, without the network. Figures are printed;
//! nothing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use archon_engine::llm::{
    ChatRequest, Message, Part, ToolCall, ToolSpec, anthropic, gemini, openai,
};
use serde_json::{Value as Json, json};

/// Ten user / assistant exchanges, half of them with a tool call and its result, and three tools.
fn conversation() -> ChatRequest {
    let mut messages = vec![Message::system(
        "You are a careful release assistant. Use the tools to look things up before answering.",
    )];
    for i in 0..10 {
        messages.push(Message::user(format!(
            "Question {i}: what changed in module {i} since the last release, and who reviewed it?"
        )));
        if i % 2 == 0 {
            messages.push(Message::assistant(vec![Part::ToolCall(ToolCall {
                id: format!("call_{i}"),
                name: "git_log".into(),
                arguments: json!({ "path": format!("src/module{i}"), "since": "v1.2.0", "limit": 20 }),
                signature: None,
            })]));
            messages.push(Message::tool_result(
                format!("call_{i}"),
                "git_log",
                "a1b2c3 fix: handle empty input (reviewed by ada)\nd4e5f6 feat: add retries (reviewed by grace)",
            ));
        } else {
            messages.push(Message::assistant(vec![Part::Text(format!(
                "Module {i} gained retries and a fix for empty input; ada and grace reviewed them."
            ))]));
        }
    }
    messages.truncate(21);
    let tool = |name: &str| ToolSpec {
        name: name.into(),
        description: format!("{name} over the repository"),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string", "description": "a path in the repository" },
                "since": { "type": "string" },
                "limit": { "type": "integer", "minimum": 1, "maximum": 100 }
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    };
    ChatRequest {
        model: "bench-model".into(),
        messages,
        tools: vec![tool("git_log"), tool("read_file"), tool("search")],
        max_tokens: Some(1024),
        ..ChatRequest::default()
    }
}

fn measure(
    label: &str,
    request: &ChatRequest,
    build: impl Fn(&ChatRequest) -> Json,
    response: &str,
    parse: impl Fn(&Json),
) {
    let iterations = 5_000;
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        for _ in 0..iterations {
            let body = build(request);
            let text = serde_json::to_vec(&body).unwrap();
            std::hint::black_box(text);
            let parsed: Json = serde_json::from_str(response).unwrap();
            parse(&parsed);
        }
        best = best.min(started.elapsed());
    }
    println!(
        "{label}: {:.1} us per call (build + serialize the request, parse + read the response)",
        best.as_secs_f64() * 1e6 / f64::from(iterations)
    );
}

fn main() {
    let request = conversation();
    let openai_response = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "bench-model",
        "choices": [{ "index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [{ "id": "call_x", "type": "function", "function": { "name": "git_log", "arguments": "{\"path\":\"src/module3\"}" } }]
        } }],
        "usage": { "prompt_tokens": 1200, "completion_tokens": 30, "total_tokens": 1230 }
    })
    .to_string();
    measure(
        "openai",
        &request,
        openai::request_body,
        &openai_response,
        |body| {
            std::hint::black_box(openai::parse_response("bench", body, None).unwrap());
        },
    );
    let anthropic_response = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "bench-model",
        "content": [
            { "type": "text", "text": "Let me look." },
            { "type": "tool_use", "id": "toolu_1", "name": "git_log", "input": { "path": "src/module3" } }
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": { "input_tokens": 1200, "output_tokens": 30 }
    })
    .to_string();
    measure(
        "anthropic",
        &request,
        anthropic::request_body,
        &anthropic_response,
        |body| {
            std::hint::black_box(anthropic::parse_response("bench", body, None).unwrap());
        },
    );
    let gemini_response = json!({
        "candidates": [{ "content": { "role": "model", "parts": [
            { "functionCall": { "name": "git_log", "args": { "path": "src/module3" } } }
        ] }, "finishReason": "STOP", "index": 0 }],
        "usageMetadata": { "promptTokenCount": 1200, "candidatesTokenCount": 30, "totalTokenCount": 1230 },
        "modelVersion": "bench-model"
    })
    .to_string();
    measure(
        "gemini",
        &request,
        gemini::request_body,
        &gemini_response,
        |body| {
            std::hint::black_box(gemini::parse_response("bench", body, None).unwrap());
        },
    );
}
