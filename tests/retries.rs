//! Issue 15, item 4: failures are classified, so that `retry` does not repeat what cannot help (an address
//! the network policy refuses, an HTTP 4xx) and `retry.on` can name what it retries: `timeout`, `5xx`,
//! `4xx`, `429`, `connect`, `error`; `http` takes `ok_status`.

use serde_json::{Value as Json, json};
use tempfile::TempDir;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{Output, archon};

/// Runs a one-step workflow calling `http` with `with` and `retry`, against a server answering `status`;
/// returns the step's result and how many requests the server received.
async fn step(status: u16, with: &str, retry: &str) -> (Json, usize) {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(status).set_body_string("nope"))
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("r.yaml"),
        format!(
            "name: r\nnetwork: {{ allow: [\"127.0.0.1\"] }}\nsteps:\n  - id: a\n    tool: http\n    with: {{ url: \"{}/x\"{with} }}\n    retry: {{ attempts: 3, delay: 1ms{retry} }}\n",
            server.uri()
        ),
    )
    .expect("write");
    let path = dir.path().to_path_buf();
    let Output { stdout, .. } =
        tokio::task::spawn_blocking(move || archon(&path, &["run", "r.yaml", "--json"]))
            .await
            .expect("archon ran");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let received = server.received_requests().await.expect("recorded").len();
    (report["steps"]["a"].clone(), received)
}

#[tokio::test]
async fn retry_on_names_what_it_retries() {
    // By default: a 5xx is retried, a 4xx is not (it would answer the same).
    assert_eq!(step(503, "", "").await.1, 3);
    assert_eq!(step(404, "", "").await.1, 1);
    // Named classes.
    assert_eq!(step(404, "", ", on: [4xx]").await.1, 3);
    assert_eq!(step(503, "", ", on: [429]").await.1, 1);
    assert_eq!(
        step(429, "", ", on: [timeout, 5xx, 429, connect]").await.1,
        3
    );
    assert_eq!(
        step(503, "", ", on: [timeout, 5xx, 429, connect]").await.1,
        3
    );
    // `ok_status`: a 404 that is an answer.
    let (result, received) = step(404, ", ok_status: [200, 404]", "").await;
    assert_eq!(
        (result["status"].as_str(), received),
        (Some("succeeded"), 1)
    );
    assert_eq!(result["output"]["status"], json!(404));
    let (result, _) = step(204, ", ok_status: [\"2xx\"]", "").await;
    assert_eq!(result["status"], "succeeded");
}

#[test]
fn an_address_the_network_policy_refuses_is_not_retried() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("r.yaml"),
        "name: r\nsteps:\n  - id: a\n    tool: http\n    with: { url: \"http://127.0.0.1:9/x\" }\n    retry: { attempts: 3, delay: 1ms }\n",
    )
    .expect("write");
    let Output { stdout, .. } = archon(dir.path(), &["run", "r.yaml", "--json"]);
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert_eq!(report["steps"]["a"]["attempts"], 1);
    assert_eq!(
        report["steps"]["a"]["error"],
        "`127.0.0.1` is an internal address (loopback), which `http` refuses unless `network.allow` lists it"
    );
}

#[test]
fn a_bad_ok_status_is_refused_by_validate() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("r.yaml"),
        "name: r\nsteps:\n  - id: a\n    tool: http\n    with: { url: \"https://example.com\", ok_status: [\"6xx\"] }\n",
    )
    .expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["validate", "r.yaml"]);
    assert_eq!(code, 2, "{stdout}{stderr}");
}

/// Runs a one-step agent workflow against a provider answering `status` every time (with `Retry-After: 0`,
/// so that the provider's own retries take no time); returns the step's result and how many requests the
/// provider received.
async fn agent_step(status: u16, retry: &str) -> (Json, usize) {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(status)
                .insert_header("retry-after", "0")
                .set_body_json(json!({ "error": { "message": "not now" } })),
        )
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("r.yaml"),
        format!(
            "name: r\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m }}\nsteps:\n  - id: a\n    goal: say pong\n    retry: {{ attempts: 2, delay: 1ms{retry} }}\n",
            server.uri()
        ),
    )
    .expect("write");
    let path = dir.path().to_path_buf();
    let Output { stdout, .. } =
        tokio::task::spawn_blocking(move || archon(&path, &["run", "r.yaml", "--json"]))
            .await
            .expect("archon ran");
    let report: Json = serde_json::from_str(&stdout).expect("report");
    let received = server.received_requests().await.expect("recorded").len();
    (report["steps"]["a"].clone(), received)
}

/// `retry.on` names an agent step's failures too: a model call that failed is classed by the provider's
/// last HTTP status (each step attempt is the provider's first request and its 4 retries).
#[tokio::test]
async fn retry_on_names_the_failures_of_an_agent_steps_model_calls() {
    assert_eq!(agent_step(503, ", on: [5xx]").await.1, 10);
    assert_eq!(agent_step(503, ", on: [429]").await.1, 5);
    assert_eq!(agent_step(429, ", on: [429]").await.1, 10);
    // A client error the provider does not repeat: once by default, again when `4xx` is named.
    assert_eq!(agent_step(400, "").await.1, 1);
    let (result, received) = agent_step(400, ", on: [4xx]").await;
    assert_eq!((result["attempts"].as_u64(), received), (Some(2), 2));
}

/// Runs `r.yaml` holding `spec` with `archon run --json` and returns step `a`'s result.
fn run_step(spec: &str) -> Json {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("r.yaml"), spec).expect("write");
    let Output { stdout, stderr, .. } = archon(dir.path(), &["run", "r.yaml", "--json"]);
    let report: Json = serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("{stdout}{stderr}"));
    report["steps"]["a"].clone()
}

/// A refused connection is retried with `on: [connect]` and not with `on: [5xx]` (review item 4).
#[test]
fn retry_on_connect_retries_a_refused_connection() {
    // A port nothing listens on: bound, then freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let attempts = |on: &str| {
        let a = run_step(&format!(
            "name: r\nnetwork: {{ allow: [\"127.0.0.1\"] }}\nsteps:\n  - id: a\n    tool: http\n    with: {{ url: \"http://127.0.0.1:{port}/x\" }}\n    retry: {{ attempts: 3, delay: 1ms, on: [{on}] }}\n"
        ));
        assert_eq!(a["status"], "failed", "{a}");
        a["attempts"].clone()
    };
    assert_eq!(attempts("connect"), 3);
    assert_eq!(attempts("5xx"), 1);
}

/// A step that times out is retried with `on: [timeout]` and not with `on: [5xx]` (review item 4).
#[test]
fn retry_on_timeout_retries_a_step_that_timed_out() {
    let attempts = |on: &str| {
        let a = run_step(&format!(
            "name: r\nsteps:\n  - id: a\n    tool: exec\n    with: {{ argv: [sleep, \"30\"] }}\n    timeout: 100ms\n    retry: {{ attempts: 3, delay: 1ms, on: [{on}] }}\n"
        ));
        assert_eq!(a["status"], "timed_out", "{a}");
        a["attempts"].clone()
    };
    assert_eq!(attempts("timeout"), 3);
    assert_eq!(attempts("5xx"), 1);
}
