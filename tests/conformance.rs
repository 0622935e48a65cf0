//! Issue 14, item 3: the request bodies Archon sends, for every feature, are valid against a JSON Schema
//! extracted from each provider's official description (`tests/conformance/`, where `README.md` says where
//! each schema came from and how to refresh it). The bodies are captured on the wire, as each adapter sends
//! them to a local server.

use archon_engine::llm::anthropic::Anthropic;
use archon_engine::llm::gemini::Gemini;
use archon_engine::llm::openai::OpenAi;
use archon_engine::llm::{
    ApiKey, ChatRequest, Message, Part, Provider, Role, ToolCall, ToolChoice, ToolResult, ToolSpec,
    answer_schema,
};
use serde_json::{Value as Json, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::llm_settings;

/// One request per feature, as the agent, the planner and compaction build them.
fn features() -> Vec<(&'static str, ChatRequest)> {
    let calculator = ToolSpec {
        name: "calculator".into(),
        description: "Evaluate an arithmetic expression".into(),
        parameters: json!({
            "type": "object",
            "properties": { "expression": { "type": "string", "description": "such as 2 * (3 + 4)" } },
            "required": ["expression"],
            "additionalProperties": false
        }),
    };
    // A tool declared without a description.
    let read = ToolSpec {
        name: "read_file".into(),
        description: String::new(),
        parameters: json!({
            "type": "object",
            "properties": {
                "path": { "type": "string" },
                "lines": { "type": ["integer", "null"], "minimum": 1 }
            },
            "required": ["path"]
        }),
    };
    let start = vec![
        Message::system("You are an agent completing one step of a workflow."),
        Message::user("What is 20% of 50? Then read notes.txt."),
    ];
    let call = |id: &str, name: &str, arguments: Json, signature: Option<&str>| {
        Part::ToolCall(ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
            signature: signature.map(str::to_owned),
        })
    };
    let result = |id: &str, name: &str, content: &str, is_error: bool| {
        Part::ToolResult(ToolResult {
            id: id.into(),
            name: name.into(),
            content: content.into(),
            is_error,
        })
    };
    // Two calls in one answer, and their results.
    let parallel = [
        start.clone(),
        vec![
            Message::assistant(vec![
                Part::Text("I will compute and read at once.".into()),
                call(
                    "call_1",
                    "calculator",
                    json!({ "expression": "50 * 20 / 100" }),
                    None,
                ),
                call("call_2", "read_file", json!({ "path": "notes.txt" }), None),
            ]),
            Message {
                role: Role::Tool,
                parts: vec![
                    result("call_1", "calculator", "10", false),
                    result("call_2", "read_file", "no such file: notes.txt", true),
                ],
            },
        ],
    ]
    .concat();
    // Reasoning with its signature, and a call with a thought signature, sent back unchanged.
    let thinking = [
        start.clone(),
        vec![
            Message::assistant(vec![
                Part::Reasoning {
                    text: "The user wants 20% of 50.".into(),
                    signature: Some("EqQBCkYIBxgCKkD2c2lnbmF0dXJl".into()),
                },
                call(
                    "toolu_01",
                    "calculator",
                    json!({ "expression": "50 * 0.2" }),
                    Some("CiQB0e2Kb3RzaWduYXR1cmU="),
                ),
            ]),
            Message {
                role: Role::Tool,
                parts: vec![result("toolu_01", "calculator", "10", false)],
            },
        ],
    ]
    .concat();
    let request = |messages: Vec<Message>, tools: Vec<ToolSpec>| ChatRequest {
        model: "model-under-test".into(),
        messages,
        tools,
        max_tokens: Some(1024),
        ..ChatRequest::default()
    };
    let kinds = json!({ "type": "string", "enum": ["feature", "fix", "chore"] });
    vec![
        ("tools", request(start.clone(), vec![calculator.clone(), read.clone()])),
        (
            "parallel calls and tool results",
            request(parallel.clone(), vec![calculator.clone(), read.clone()]),
        ),
        (
            "thinking round-trip",
            request(thinking, vec![calculator.clone()]),
        ),
        (
            "text mode",
            ChatRequest {
                stop: vec!["Observation:".into()],
                ..request(
                    vec![
                        Message::system("Answer with Thought:, then Action: {json} or Final Answer:."),
                        Message::user("What is 20% of 50?"),
                        Message::assistant(vec![Part::Text(
                            "Thought: compute.\nAction: {\"tool\": \"calculator\", \"arguments\": {\"expression\": \"50 * 20 / 100\"}}".into(),
                        )]),
                        Message::user("Observation: <tool_output>\n10\n</tool_output>"),
                    ],
                    Vec::new(),
                )
            },
        ),
        (
            "output_schema with tools",
            ChatRequest {
                output_schema: Some(answer_schema(&kinds)),
                ..request(parallel, vec![calculator.clone(), read])
            },
        ),
        (
            "output_schema without tools",
            ChatRequest {
                output_schema: Some(answer_schema(&json!({
                    "type": "object",
                    "properties": { "city": { "type": "string" }, "celsius": { "type": ["number", "null"] } },
                    "required": ["city", "celsius"]
                }))),
                ..request(start.clone(), Vec::new())
            },
        ),
        (
            "a named tool, then no tools",
            ChatRequest {
                tool_choice: ToolChoice::Tool("calculator".into()),
                ..request(start.clone(), vec![calculator.clone()])
            },
        ),
        (
            "required tool choice",
            ChatRequest {
                tool_choice: ToolChoice::Required,
                ..request(start.clone(), vec![calculator.clone()])
            },
        ),
        (
            "the best answer at the iteration limit",
            ChatRequest {
                tool_choice: ToolChoice::None,
                ..request(
                    [start.clone(), vec![Message::user("You have reached the iteration limit.")]]
                        .concat(),
                    vec![calculator],
                )
            },
        ),
        (
            "compaction",
            request(
                vec![
                    Message::system("Summarise the conversation so far for the agent that continues it."),
                    Message::user("Assistant called `calculator` with {\"expression\":\"1+1\"}\n\n`calculator` returned: 2"),
                ],
                Vec::new(),
            ),
        ),
        (
            "planner",
            request(
                vec![
                    Message::system("You write plans: YAML with `steps:`, each step a tool call."),
                    Message::user("Goal: summarise the open issues."),
                    Message::assistant(vec![Part::Text("steps: [{ id: a, tool: nope }]".into())]),
                    Message::user("The plan was rejected: unknown tool `nope`. Write it again."),
                ],
                Vec::new(),
            ),
        ),
    ]
}

/// The schema in `tests/conformance/FILE`, compiled.
fn schema(file: &str) -> jsonschema::Validator {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/conformance")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("the schema is checked in");
    let schema: Json = serde_json::from_str(&text).expect("the schema is JSON");
    jsonschema::draft202012::new(&schema).expect("the schema compiles")
}

/// Sends every feature's request through `provider` to `server` and checks each body against `schema`.
async fn conforms(
    server: &MockServer,
    provider: &dyn Provider,
    schema: &jsonschema::Validator,
    adjust: impl Fn(&mut ChatRequest),
) {
    assert!(
        !schema.is_valid(&json!({ "messages": "none" })),
        "the schema refuses what no provider accepts"
    );
    let features = features();
    for (_, request) in &features {
        let mut request = request.clone();
        adjust(&mut request);
        provider.complete(&request).await.expect("an answer");
    }
    let sent = server.received_requests().await.expect("recorded");
    assert_eq!(sent.len(), features.len());
    let mut problems = Vec::new();
    for ((feature, _), received) in features.iter().zip(&sent) {
        let body: Json = received.body_json().expect("a JSON body");
        for error in schema.iter_errors(&body) {
            problems.push(format!(
                "{feature}: at `{}`: {error}",
                error.instance_path()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

async fn answering(body: Json) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(body))
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn openai_bodies_match_the_openapi_document() {
    let server = answering(json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_764_000_000,
        "model": "model-under-test",
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "ok" }, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11 }
    }))
    .await;
    let openai = OpenAi::new(
        "openai",
        format!("{}/v1", server.uri()),
        Some(ApiKey::new("sk-test")),
        llm_settings(),
    )
    .expect("provider");
    conforms(&server, &openai, &schema("openai.chat.schema.json"), |r| {
        r.temperature = Some(0.2)
    })
    .await;
}

#[tokio::test]
async fn anthropic_bodies_match_the_sdk_types() {
    let server = answering(json!({
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "model-under-test",
        "content": [{ "type": "text", "text": "ok" }],
        "stop_reason": "end_turn",
        "stop_sequence": null,
        "usage": { "input_tokens": 10, "output_tokens": 1 }
    }))
    .await;
    let anthropic = Anthropic::new(
        "anthropic",
        server.uri(),
        Some(ApiKey::new("sk-ant-test")),
        llm_settings(),
    )
    .expect("provider");
    // No `temperature`: the SDK types these schemas come from no longer declare it (see the note in
    // tests/conformance/README.md); Archon sends it only when a spec sets one.
    conforms(
        &server,
        &anthropic,
        &schema("anthropic.messages.schema.json"),
        |_| {},
    )
    .await;
}

#[tokio::test]
async fn gemini_bodies_match_the_protos() {
    let server = answering(json!({
        "candidates": [{
            "content": { "parts": [{ "text": "ok" }], "role": "model" },
            "finishReason": "STOP",
            "index": 0
        }],
        "usageMetadata": { "promptTokenCount": 10, "candidatesTokenCount": 1, "totalTokenCount": 11 },
        "modelVersion": "model-under-test"
    }))
    .await;
    let gemini = Gemini::new(
        "gemini",
        server.uri(),
        Some(ApiKey::new("gm-test")),
        llm_settings(),
    )
    .expect("provider");
    conforms(
        &server,
        &gemini,
        &schema("gemini.generate_content.schema.json"),
        |r| r.temperature = Some(0.2),
    )
    .await;
}
