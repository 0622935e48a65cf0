//! `archon mcp serve` driven by a real MCP client: the rmcp client, over stdio (the server as a child
//! process) and streamable HTTP, and the MCP Inspector's command-line mode (`scripts/mcp-inspector-check.sh`).

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, ProgressNotificationParam, Request,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt as _};
use serde_json::{Value as Json, json};
use tempfile::TempDir;
use tokio::sync::mpsc;

use crate::support::{Output, archon, root};

const HELLO: &str = r#"name: hello
description: Greets someone
inputs:
  who: { type: string, description: Who to greet }
  times: { type: integer, default: 1, minimum: 1, description: How many greetings }
steps:
  - id: greet
    tool: echo
    with: { message: "hello, {{ inputs.who }}" }
outputs:
  greeting: "{{ steps.greet.output.message }}"
  times: "{{ inputs.times }}"
"#;

const FAILS: &str = r#"name: fails
description: Always fails
steps:
  - id: boom
    tool: exec
    with: { argv: ["sh", "-c", "exit 3"] }
"#;

const APPROVE: &str = r#"name: pay-invoice
description: Pays after a person approves
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: ["sh", "-c", "echo paid >> effects.txt"] }
outputs:
  paid: "{{ steps.pay.exit_code == 0 }}"
"#;

const STEPS: &str = r#"name: three-steps
steps:
  - id: one
    tool: echo
    with: { n: 1 }
  - id: two
    tool: echo
    needs: [one]
    with: { n: 2 }
  - id: three
    tool: echo
    needs: [two]
    with: { n: 3 }
outputs:
  last: "{{ steps.three.output.n }}"
"#;

const SLOW: &str = r#"name: slow
steps:
  - id: wait
    tool: exec
    with: { argv: ["sh", "-c", "touch started && sleep 60"] }
"#;

/// A directory of the test workflows, and one that does not validate.
fn workflows() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    for (name, text) in [
        ("hello.yaml", HELLO),
        ("fails.yaml", FAILS),
        ("approve.yaml", APPROVE),
        ("steps.yaml", STEPS),
        ("slow.yaml", SLOW),
        (
            "broken.yaml",
            "name: broken\nsteps:\n  - id: a\n    tool: nope\n",
        ),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    dir
}

/// reqwest (under the rmcp client too) needs a TLS provider even for plain HTTP.
fn tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client that passes on the progress notifications it receives.
struct Client {
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }
}

type Session = RunningService<RoleClient, Client>;

/// `archon mcp serve .` in `dir` as a child process, with its state in `dir/.archon`, and a client
/// connected to it over stdio.
async fn stdio(dir: &Path) -> (Session, mpsc::UnboundedReceiver<ProgressNotificationParam>) {
    stdio_with(dir, &[], &[]).await
}

/// [`stdio`], with more arguments and `env` set for the server.
async fn stdio_with(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Session, mpsc::UnboundedReceiver<ProgressNotificationParam>) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_archon"));
    command
        .args(["mcp", "serve", "."])
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env_remove("ARCHON_STATE_DIR")
        .envs(env.iter().copied());
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .expect("archon starts");
    let (sender, progress) = mpsc::unbounded_channel();
    let client = Client { progress: sender }
        .serve(transport)
        .await
        .expect("the client connects");
    (client, progress)
}

async fn call(client: &Session, tool: &str, arguments: Json) -> CallToolResult {
    let Json::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
        .expect("the call is answered")
}

/// The run id a result names in its `_meta`.
fn run_of(result: &CallToolResult) -> String {
    let meta = result.meta.as_ref().expect("the result has _meta");
    meta.0["archon/run"]["id"]
        .as_str()
        .expect("a run id")
        .to_owned()
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The stored run, as `archon show RUN --json` prints it.
fn stored(dir: &Path, id: &str) -> Json {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir, &["show", id, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("json")
}

/// The text with its run ids and durations made stable for a snapshot.
fn stable(text: &str, id: &str) -> String {
    let text = text.replace(id, "RUN");
    let mut out = String::new();
    for word in text.split_inclusive(' ') {
        if word.trim_end().chars().all(|c| c.is_ascii_digit()) && !word.trim().is_empty() {
            out.push_str(if word.ends_with(' ') { "N " } else { "N" });
        } else {
            out.push_str(word);
        }
    }
    out
}

#[tokio::test]
async fn tools_list_shows_each_valid_workflow_with_its_inputs_as_a_schema() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    insta::assert_snapshot!(
        "mcp_serve_tools",
        serde_json::to_string_pretty(&tools).expect("json")
    );
    client.cancel().await.expect("closed");
}

#[tokio::test]
async fn a_call_is_a_durable_run_whose_outputs_are_the_structured_result() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let result = call(&client, "hello", json!({ "who": "ada" })).await;
    let id = run_of(&result);
    assert_eq!(result.is_error, Some(false));
    assert_eq!(
        result.structured_content,
        Some(json!({ "greeting": "hello, ada", "times": 1 }))
    );
    assert_eq!(
        stable(&text_of(&result), &id),
        "run RUN of `hello` succeeded in N ms\noutputs: {\n  \"greeting\": \"hello, ada\",\n  \"times\": 1\n}"
    );
    client.cancel().await.expect("closed");
    let run = stored(dir.path(), &id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["workflow"], "hello");
    assert_eq!(run["inputs"], json!({ "who": "ada", "times": 1 }));
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("json");
    assert_eq!(runs[0]["id"], id.as_str(), "`archon runs` lists it");
}

#[tokio::test]
async fn invalid_arguments_are_a_tool_error_naming_each_problem() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let result = call(&client, "hello", json!({ "times": 0, "whom": "x" })).await;
    assert_eq!(result.is_error, Some(true));
    assert_eq!(result.structured_content, None);
    insta::assert_snapshot!("mcp_serve_invalid_arguments", text_of(&result));
    // Nothing ran: no run was recorded.
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    assert_eq!(stdout.trim(), "[]");
    client.cancel().await.expect("closed");
}

/// `archon mcp serve --labels`: the run of every call has the server's labels, as `archon run --labels`
/// gives a local run its own; without them, a run whose steps need labels is a tool error before any step
/// starts.
#[tokio::test]
async fn the_runs_of_calls_have_the_labels_of_the_server() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("routed.yaml"),
        "name: routed\nsteps:\n  - { id: fit, runs_on: [gpu], tool: echo, with: { n: 1 } }\noutputs:\n  n: \"{{ steps.fit.output.n }}\"\n",
    )
    .expect("write");
    let (client, _) = stdio(dir.path()).await;
    let refused = call(&client, "routed", json!({})).await;
    client.cancel().await.expect("closed");
    assert_eq!(
        (refused.is_error, stable(&text_of(&refused), &run_of(&refused))),
        (
            Some(true),
            "run RUN did not run: step `fit` needs a label this process does not have: `gpu`\nhint: pass `--labels gpu` to run it here, or submit the run to workers that have them (`archon run --submit`)".to_owned()
        )
    );
    let (client, _) = stdio_with(dir.path(), &["--labels", "gpu,eu"], &[]).await;
    let ran = call(&client, "routed", json!({})).await;
    client.cancel().await.expect("closed");
    assert_eq!(
        (ran.is_error, ran.structured_content.clone()),
        (Some(false), Some(json!({ "n": 1 })))
    );
    assert_eq!(stored(dir.path(), &run_of(&ran))["status"], "succeeded");
}

#[tokio::test]
async fn a_failing_workflow_is_a_tool_error_with_the_step_error_and_run_id() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let result = call(&client, "fails", json!({})).await;
    let id = run_of(&result);
    assert_eq!(result.is_error, Some(true));
    insta::assert_snapshot!("mcp_serve_failed", stable(&text_of(&result), &id));
    client.cancel().await.expect("closed");
    assert_eq!(stored(dir.path(), &id)["status"], "failed");
}

#[tokio::test]
async fn a_failure_never_shows_a_secret() {
    let dir = workflows();
    std::fs::write(
        dir.path().join("leaks.yaml"),
        r#"name: leaks
secrets: [API_TOKEN]
steps:
  - id: leak
    tool: exec
    with:
      argv: ["sh", "-c", "echo token=$API_TOKEN >&2; exit 1"]
      env: { API_TOKEN: "{{ secrets.API_TOKEN }}" }
"#,
    )
    .expect("write");
    let (client, _) = stdio_with(dir.path(), &[], &[("API_TOKEN", "hunter2-very-secret")]).await;
    let result = call(&client, "leaks", json!({})).await;
    let id = run_of(&result);
    assert_eq!(result.is_error, Some(true));
    assert_eq!(
        stable(&text_of(&result), &id),
        "run RUN of `leaks` failed\nstep `leak` failed: `sh` exited with code 1: token=***\n`archon show RUN` shows the run; `archon retry RUN --failed` runs the failed steps again"
    );
    client.cancel().await.expect("closed");
}

#[tokio::test]
async fn a_run_that_pauses_for_approval_says_how_to_continue_it() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let result = call(&client, "pay-invoice", json!({})).await;
    let id = run_of(&result);
    assert_eq!(result.is_error, Some(false));
    assert_eq!(
        text_of(&result),
        format!(
            "run {id} of `pay-invoice` is waiting for approval (steps `pay`)\nto continue it: `archon approve {id}` (or `archon approve {id} --deny`), then `archon resume {id}`"
        )
    );
    assert!(!dir.path().join("effects.txt").exists(), "nothing ran");
    client.cancel().await.expect("closed");

    let Output { code, stderr, .. } = archon(dir.path(), &["approve", &id]);
    assert_eq!(code, 0, "{stderr}");
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id, "--no-input"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("paid"),
        "paid\n"
    );
    let run = stored(dir.path(), &id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["outputs"], json!({ "paid": true }));
}

#[tokio::test]
async fn each_finished_step_is_a_progress_notification() {
    let dir = workflows();
    let (client, mut progress) = stdio(dir.path()).await;
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("three-steps"))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    let token = handle.progress_token.clone();
    let response = tokio::time::timeout(Duration::from_secs(30), handle.await_response())
        .await
        .expect("the call is answered within 30 s")
        .expect("answered");
    let rmcp::model::ServerResult::CallToolResult(result) = response else {
        panic!("a tool result: {response:?}")
    };
    assert_eq!(result.structured_content, Some(json!({ "last": 3 })));
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let note = tokio::time::timeout(Duration::from_secs(10), progress.recv())
            .await
            .expect("progress arrives")
            .expect("open");
        assert_eq!(note.progress_token, token);
        seen.push((note.progress, note.total, note.message.unwrap_or_default()));
    }
    assert_eq!(
        seen,
        vec![
            (1.0, Some(3.0), "step `one` succeeded".to_owned()),
            (2.0, Some(3.0), "step `two` succeeded".to_owned()),
            (3.0, Some(3.0), "step `three` succeeded".to_owned()),
        ]
    );
    client.cancel().await.expect("closed");
}

#[tokio::test]
async fn a_call_the_client_cancels_ends_its_run_cancelled_while_others_run() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("slow"))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    wait_for(&dir.path().join("started")).await;
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("json");
    let id = runs[0]["id"]
        .as_str()
        .expect("the run is recorded")
        .to_owned();
    assert_eq!(runs[0]["status"], "running");
    // Other calls run meanwhile.
    let result = call(&client, "hello", json!({ "who": "ada" })).await;
    assert_eq!(result.is_error, Some(false));
    assert_eq!(stored(dir.path(), &id)["status"], "running");
    handle
        .cancel(Some("changed my mind".to_owned()))
        .await
        .expect("cancelled");
    // Closing the session waits for the server to exit, which it does once its runs are recorded.
    client.cancel().await.expect("closed");
    assert_eq!(stored(dir.path(), &id)["status"], "cancelled");
}

#[tokio::test]
async fn beyond_max_runs_a_call_waits_for_a_run_to_end() {
    let dir = workflows();
    let (client, _) = stdio_with(dir.path(), &["--max-runs", "1"], &[]).await;
    let slow = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("slow"))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    wait_for(&dir.path().join("started")).await;
    let Json::Object(arguments) = json!({ "who": "ada" }) else {
        unreachable!()
    };
    let hello = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(
                CallToolRequestParams::new("hello").with_arguments(arguments),
            )),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    slow.cancel(None).await.expect("cancelled");
    let response = tokio::time::timeout(Duration::from_secs(30), hello.await_response())
        .await
        .expect("the call is answered within 30 s")
        .expect("answered");
    let rmcp::model::ServerResult::CallToolResult(result) = response else {
        panic!("a tool result: {response:?}")
    };
    let second = stored(dir.path(), &run_of(&result));
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json", "--workflow", "slow"]);
    let runs: Json = serde_json::from_str(&stdout).expect("json");
    let first = stored(dir.path(), runs[0]["id"].as_str().expect("the slow run"));
    assert_eq!(first["status"], "cancelled");
    let started = second["started_at"].as_u64().expect("a start time");
    let ended = first["finished_at"].as_u64().expect("an end time");
    assert!(
        started >= ended,
        "the second run started after the first ended: {started} < {ended}"
    );
    client.cancel().await.expect("closed");
}

#[tokio::test]
async fn sigterm_interrupts_the_runs_going_on_and_leaves_them_resumable() {
    let dir = workflows();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_archon"));
    command
        .args(["mcp", "serve", "."])
        .current_dir(dir.path())
        .env_remove("ARCHON_STATE_DIR");
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .expect("archon starts");
    let pid = transport.id().expect("a pid");
    let (sender, _progress) = mpsc::unbounded_channel();
    let client = Client { progress: sender }
        .serve(transport)
        .await
        .expect("connects");
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("slow"))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    wait_for(&dir.path().join("started")).await;
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    // The server answers the call as its run ends, then exits.
    let response = tokio::time::timeout(Duration::from_secs(30), handle.await_response())
        .await
        .expect("the call is answered within 30 s")
        .expect("answered");
    let rmcp::model::ServerResult::CallToolResult(result) = response else {
        panic!("a tool result: {response:?}")
    };
    let id = run_of(&result);
    assert_eq!(result.is_error, Some(true));
    assert_eq!(
        text_of(&result),
        format!(
            "run {id} of `slow` was interrupted: the server stopped\n`archon resume {id}` continues it"
        )
    );
    assert_eq!(stored(dir.path(), &id)["status"], "interrupted");
    drop(client);
}

#[tokio::test]
async fn archon_cancel_stops_only_that_served_run_and_the_server_goes_on() {
    let dir = workflows();
    let (client, _) = stdio(dir.path()).await;
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("slow"))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    wait_for(&dir.path().join("started")).await;
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("json");
    let id = runs[0]["id"]
        .as_str()
        .expect("the run is recorded")
        .to_owned();
    let Output { code, stderr, .. } = archon(dir.path(), &["cancel", &id]);
    assert_eq!(code, 0, "{stderr}");
    let response = tokio::time::timeout(Duration::from_secs(30), handle.await_response())
        .await
        .expect("the call is answered within 30 s")
        .expect("answered");
    let rmcp::model::ServerResult::CallToolResult(result) = response else {
        panic!("a tool result: {response:?}")
    };
    assert_eq!(result.is_error, Some(true), "{}", text_of(&result));
    assert_eq!(stored(dir.path(), &id)["status"], "cancelled");
    // The server still serves.
    let result = call(&client, "hello", json!({ "who": "ada" })).await;
    assert_eq!(result.is_error, Some(false), "{}", text_of(&result));
    client.cancel().await.expect("closed");
}

/// Waits for a file a step writes (10 s at most), letting the client's tasks run meanwhile.
async fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "`{}` never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `archon mcp serve . --http ADDR` in `dir`, and the URL it says it listens on.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_server(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> HttpServer {
    http_server_on(dir, "127.0.0.1:0", args, env)
}

/// [`http_server`] on `address`.
fn http_server_on(dir: &Path, address: &str, args: &[&str], env: &[(&str, &str)]) -> HttpServer {
    tls();
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["mcp", "serve", ".", "--http", address])
        .args(args)
        .current_dir(dir)
        .env_remove("ARCHON_STATE_DIR")
        .env_remove("ARCHON_MCP_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("archon starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = std::io::BufReader::new(stderr).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("archon says where it listens")
            .expect("a line");
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.to_owned();
        }
    };
    // Whatever else it says goes nowhere, without blocking it.
    std::thread::spawn(move || for _ in lines {});
    HttpServer { child, url }
}

#[tokio::test]
async fn over_http_a_call_returns_the_outputs() {
    let dir = workflows();
    let server = http_server(dir.path(), &[], &[]);
    let transport = StreamableHttpClientTransport::from_uri(server.url.clone());
    let (sender, _progress) = mpsc::unbounded_channel();
    let client = Client { progress: sender }
        .serve(transport)
        .await
        .expect("connects");
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .expect("tools/list")
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    assert_eq!(
        names,
        ["fails", "hello", "pay-invoice", "slow", "three-steps"]
    );
    let result = call(&client, "hello", json!({ "who": "grace", "times": 2 })).await;
    assert_eq!(
        result.structured_content,
        Some(json!({ "greeting": "hello, grace", "times": 2 }))
    );
    let id = run_of(&result);
    client.cancel().await.expect("closed");
    assert_eq!(stored(dir.path(), &id)["status"], "succeeded");
}

#[tokio::test]
async fn over_http_a_token_is_required_and_checked() {
    let dir = workflows();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").expect("write");
    let file = token_file.to_str().expect("utf-8");
    let server = http_server(dir.path(), &["--token-file", file], &[]);
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": { "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": { "name": "test", "version": "1" } }
    });
    let http = reqwest::Client::new();
    let post = |auth: Option<&str>| {
        let mut request = http
            .post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(initialize.to_string());
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        request.send()
    };
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer s3cret-toke"),
        Some("s3cret-token"),
    ] {
        let response = post(auth).await.expect("answered");
        assert_eq!(response.status(), 401, "{auth:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
    }
    let response = post(Some("Bearer s3cret-token")).await.expect("answered");
    assert_eq!(response.status(), 200);
    // The token may come from the environment instead.
    let from_env = http_server(dir.path(), &[], &[("ARCHON_MCP_TOKEN", "another-token")]);
    for (auth, status) in [("Bearer s3cret-token", 401), ("Bearer another-token", 200)] {
        let response = http
            .post(&from_env.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("authorization", auth)
            .body(initialize.to_string())
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), status, "{auth}");
    }

    // The rmcp client with the token lists and calls.
    let transport = StreamableHttpClientTransport::from_config(
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            server.url.clone(),
        )
        .auth_header("s3cret-token"),
    );
    let (sender, _progress) = mpsc::unbounded_channel();
    let client = Client { progress: sender }
        .serve(transport)
        .await
        .expect("connects");
    let result = call(&client, "hello", json!({ "who": "linus" })).await;
    assert_eq!(result.is_error, Some(false));
    client.cancel().await.expect("closed");
}

#[tokio::test]
async fn over_http_without_a_token_pages_from_other_origins_are_refused() {
    let dir = workflows();
    let server = http_server(dir.path(), &[], &[]);
    let http = reqwest::Client::new();
    let post = |origin: &str| {
        http.post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("origin", origin)
            .body(
                json!({
                    "jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": { "protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": { "name": "test", "version": "1" } }
                })
                .to_string(),
            )
            .send()
    };
    let response = post("http://evil.example").await.expect("answered");
    assert_eq!(response.status(), 403);
    let response = post("http://localhost:6274").await.expect("answered");
    assert_eq!(response.status(), 200);
    // A name that resolves to this machine (DNS rebinding) is not a loopback host.
    let response = http
        .post(&server.url)
        .header("host", "evil.example")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body("{}")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 403);
}

#[tokio::test]
async fn over_http_sessions_open_at_once_are_bounded_and_a_closed_one_frees_its_place() {
    let dir = workflows();
    let server = http_server(dir.path(), &[], &[]);
    let http = reqwest::Client::new();
    let initialize = || {
        http.post(&server.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(
                json!({
                    "jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": { "protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": { "name": "test", "version": "1" } }
                })
                .to_string(),
            )
            .send()
    };
    let mut sessions = Vec::new();
    for _ in 0..256 {
        let response = initialize().await.expect("answered");
        assert_eq!(response.status(), 200);
        sessions.push(response.headers()["mcp-session-id"].clone());
    }
    let refused = initialize().await.expect("answered");
    assert_eq!(refused.status(), 500);
    assert_eq!(
        refused.text().await.expect("a body"),
        "Encounter an error when get service: 256 MCP sessions are open, the most served at once: close one (HTTP `DELETE` with its `mcp-session-id`) or wait for one to go idle"
    );
    let closed = http
        .delete(&server.url)
        .header("mcp-session-id", sessions[0].clone())
        .send()
        .await
        .expect("answered");
    assert!(closed.status().is_success(), "{}", closed.status());
    // The session's place is freed as its handler ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let response = initialize().await.expect("answered");
        if response.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no session was accepted after one closed: {}",
            response.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_token_lets_the_server_listen_beyond_loopback() {
    let dir = workflows();
    let server = http_server_on(
        dir.path(),
        "0.0.0.0:0",
        &[],
        &[("ARCHON_MCP_TOKEN", "s3cret-token")],
    );
    let port = server
        .url
        .strip_prefix("http://0.0.0.0:")
        .and_then(|rest| rest.strip_suffix("/mcp"))
        .expect("the URL names the address");
    // Reached under whatever name the client uses: the token guards it.
    let transport = StreamableHttpClientTransport::from_config(
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            format!("http://127.0.0.1:{port}/mcp"),
        )
        .auth_header("s3cret-token"),
    );
    let (sender, _progress) = mpsc::unbounded_channel();
    let client = Client { progress: sender }
        .serve(transport)
        .await
        .expect("connects");
    let result = call(&client, "hello", json!({ "who": "remote" })).await;
    assert_eq!(
        result.structured_content,
        Some(json!({ "greeting": "hello, remote", "times": 1 }))
    );
    client.cancel().await.expect("closed");
}

#[tokio::test]
async fn over_http_sigterm_answers_the_calls_going_on_and_exits() {
    let dir = workflows();
    let mut server = http_server(dir.path(), &[], &[]);
    let transport = StreamableHttpClientTransport::from_uri(server.url.clone());
    let (sender, _progress) = mpsc::unbounded_channel();
    let client = Client { progress: sender }
        .serve(transport)
        .await
        .expect("connects");
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(CallToolRequestParams::new("slow"))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    wait_for(&dir.path().join("started")).await;
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let response = tokio::time::timeout(Duration::from_secs(30), handle.await_response())
        .await
        .expect("the call is answered within 30 s")
        .expect("answered");
    let rmcp::model::ServerResult::CallToolResult(result) = response else {
        panic!("a tool result: {response:?}")
    };
    let id = run_of(&result);
    assert_eq!(
        result.meta.as_ref().expect("_meta").0["archon/run"]["status"],
        "interrupted"
    );
    let status = server.child.wait().expect("it exits");
    assert_eq!(status.code(), Some(0));
    assert_eq!(stored(dir.path(), &id)["status"], "interrupted");
    drop(client);
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused() {
    let dir = workflows();
    let output = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["mcp", "serve", ".", "--http", "0.0.0.0:0"])
        .current_dir(dir.path())
        .env_remove("ARCHON_MCP_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("archon runs");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(output.stdout, b"");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: serving on `0.0.0.0:0` needs a bearer token: it is not a loopback address\n  hint: set `ARCHON_MCP_TOKEN` or pass `--token-file FILE`; clients send `Authorization: Bearer TOKEN`\n"
    );
}

#[test]
fn invalid_specs_are_reported_and_left_out_and_a_name_clash_is_refused() {
    let dir = workflows();
    // Only the loading is checked here: stdin is closed at once, which ends the server.
    let output = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["mcp", "serve", "."])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("archon runs");
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(
        output.stdout, b"",
        "stdout carries nothing but the protocol"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    insta::assert_snapshot!("mcp_serve_left_out", stderr);

    // Two workflows of one name would be one tool.
    std::fs::write(
        dir.path().join("again.yaml"),
        HELLO.replace("Greets someone", "Greets someone again"),
    )
    .expect("write");
    let Output { code, stderr, .. } =
        archon(dir.path(), &["mcp", "serve", "hello.yaml", "again.yaml"]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        "error: workflows `hello` (in `hello.yaml`) and `hello` (in `again.yaml`) would both be served as tool `hello`\n  hint: rename one of them (`name:`), or serve them from separate `archon mcp serve` commands\n"
    );
}

#[test]
#[allow(clippy::print_stderr)]
fn the_mcp_inspector_lists_and_calls_a_bundled_workflow() {
    let inspector = root().join("tests/npm/node_modules/.bin/mcp-inspector");
    if !inspector.exists() {
        let reason = "tests/npm/node_modules is missing: run `bash scripts/install-test-deps.sh`";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{reason}");
        eprintln!("skipped: {reason}");
        return;
    }
    let output = Command::new("bash")
        .arg(root().join("scripts/mcp-inspector-check.sh"))
        .env("ARCHON", env!("CARGO_BIN_EXE_archon"))
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "tools/list: hello\ntools/call hello who=inspector: hello, inspector\nthe run is recorded: succeeded\n"
    );
}
