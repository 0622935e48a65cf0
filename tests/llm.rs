//! Provider plumbing that needs no server: the `mock` provider, record and replay, and configuration from
//! the spec and the environment.

use std::sync::Arc;

use archon_engine::llm::cassette::{Recorder, Replayer};
use archon_engine::llm::mock::{Mock, ScriptedCall, Turn};
use archon_engine::llm::{ApiKey, ChatRequest, FinishReason, Message, Provider};
use serde_json::json;
use tempfile::TempDir;

fn ask(text: &str) -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![Message::system("be brief"), Message::user(text)],
        ..ChatRequest::default()
    }
}

fn turn(when: Option<&str>, text: &str) -> Turn {
    Turn {
        when: when.map(str::to_owned),
        text: Some(text.to_owned()),
        tool_calls: Vec::new(),
    }
}

#[tokio::test]
async fn mock_turns_answer_by_match_then_in_order() {
    let mock = Mock::new(
        "scripted",
        vec![
            turn(None, "first"),
            turn(Some("weather"), "sunny"),
            Turn {
                when: None,
                text: None,
                tool_calls: vec![ScriptedCall {
                    name: "search".into(),
                    arguments: Some(json!({ "q": "rust" })),
                }],
            },
        ],
    );
    let a = mock.complete(&ask("hello")).await.expect("answer");
    assert_eq!(a.text(), "first");
    let b = mock
        .complete(&ask("the weather today?"))
        .await
        .expect("answer");
    assert_eq!(b.text(), "sunny");
    let again = mock.complete(&ask("weather again")).await.expect("answer");
    assert_eq!(again.text(), "sunny", "matched turns answer every time");
    let c = mock.complete(&ask("next")).await.expect("answer");
    assert_eq!(c.finish_reason, FinishReason::ToolCalls);
    let call = c.tool_calls().next().expect("a call");
    assert_eq!(
        (call.name.as_str(), call.arguments.clone()),
        ("search", json!({ "q": "rust" }))
    );
    assert!(c.usage.input_tokens > 0 && c.usage_reported);
    let err = mock
        .complete(&ask("anything else"))
        .await
        .expect_err("script exhausted");
    assert_eq!(
        err.message,
        "provider `scripted`: no scripted turn left for the request (last user message: `anything else`)"
    );
}

#[tokio::test]
async fn a_recorded_run_replays_and_a_new_request_fails_loudly() {
    let dir = TempDir::new().expect("tempdir");
    let cassette = dir.path().join("run.cassette");
    let file = Recorder::open(&cassette).expect("cassette");
    let live: Arc<dyn Provider> = Arc::new(Mock::new(
        "main",
        vec![turn(None, "one"), turn(None, "two")],
    ));
    let recorder = Recorder::new(live, file);
    assert_eq!(recorder.complete(&ask("a")).await.expect("a").text(), "one");
    assert_eq!(recorder.complete(&ask("b")).await.expect("b").text(), "two");
    recorder
        .complete(&ask("c"))
        .await
        .expect_err("the script ends: recorded as an error");

    let exchanges = Replayer::read(&cassette).expect("readable");
    assert_eq!(exchanges.len(), 3);
    let replay = Replayer::new("main", &exchanges);
    assert_eq!(replay.complete(&ask("a")).await.expect("a").text(), "one");
    assert_eq!(replay.complete(&ask("b")).await.expect("b").text(), "two");
    let recorded_error = replay
        .complete(&ask("c"))
        .await
        .expect_err("replayed error");
    assert!(
        recorded_error.message.contains("no scripted turn left"),
        "{}",
        recorded_error.message
    );
    let err = replay.complete(&ask("a")).await.expect_err("used up");
    assert!(
        err.message
            .contains("was not recorded: every recorded exchange was used"),
        "{}",
        err.message
    );

    let replay = Replayer::new("main", &exchanges);
    let err = replay.complete(&ask("changed")).await.expect_err("differs");
    assert_eq!(
        err.message,
        "provider `main`: replay: this request was not recorded: the next recorded request differs at `request.messages[1].parts[0].value`"
    );

    std::fs::write(dir.path().join("bad.cassette"), "{}\n").expect("write");
    let err = Replayer::read(&dir.path().join("bad.cassette")).expect_err("not a cassette");
    assert!(
        err.message.contains("is not an archon cassette"),
        "{}",
        err.message
    );
}

#[test]
fn api_keys_never_print() {
    let key = ApiKey::new("sk-live-123");
    assert_eq!(format!("{key:?} {key}"), "*** ***");
    assert_eq!(key.expose(), "sk-live-123");
}

/// Review finding: the user's usual key variable never travels to a base URL a spec chose.
#[tokio::test]
async fn a_spec_base_url_does_not_get_the_users_key() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{ "message": { "role": "assistant", "content": "pong" }, "finish_reason": "stop" }]
        })))
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let spec = format!(
        "name: t\nllm:\n  providers:\n    elsewhere: {{ kind: openai, model: m, base_url: \"{}/v1\" }}\n    named: {{ kind: openai, model: m, base_url: \"{}/v1\", api_key_env: ELSEWHERE_KEY }}\nsteps:\n  - {{ id: a, goal: hi }}\n",
        server.uri(),
        server.uri()
    );
    std::fs::write(dir.path().join("t.yaml"), spec).expect("write");
    let workflow = archon_engine::validate_file(&dir.path().join("t.yaml"))
        .workflow
        .expect("valid");
    let env = std::collections::BTreeMap::from([
        ("OPENAI_API_KEY".to_owned(), "sk-users-own".to_owned()),
        ("ELSEWHERE_KEY".to_owned(), "sk-for-elsewhere".to_owned()),
    ]);
    let providers = &workflow.spec.llm.as_ref().expect("llm").providers;
    for (name, expected) in [
        ("elsewhere", None),
        ("named", Some("Bearer sk-for-elsewhere")),
    ] {
        let configured =
            archon_engine::llm::config::build(name, &providers[name], dir.path(), &env)
                .expect("builds");
        configured
            .provider
            .complete(&ask("ping"))
            .await
            .expect("answer");
        let requests = server.received_requests().await.expect("recorded");
        let sent = requests.last().expect("a request");
        assert_eq!(
            sent.headers
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
            expected,
            "{name}"
        );
    }
}
