//! `archon serve` over real HTTP: the binary on a free port, driven with reqwest: runs started, followed
//! live, approved and denied by the hash of their arguments, cancelled, retried and resumed; roles,
//! CSRF and cross-site refusals; no secret in any response; SIGTERM then a restart that resumes; the
//! OpenAPI document as checked in.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::serve::Server;
use crate::support::{Output, archon, root};

const HELLO: &str = r#"name: hello
description: Greets someone
inputs:
  who: { type: string, description: Who to greet }
steps:
  - id: greet
    tool: exec
    with: { argv: ["sh", "-c", "echo hello, {{ inputs.who }}"] }
  - id: shout
    tool: echo
    needs: [greet]
    with: { text: "{{ steps.greet.output }}" }
outputs:
  greeting: "{{ steps.greet.output | trim }}"
"#;

const PAY: &str = r#"name: pay
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: ["sh", "-c", "echo paid {{ inputs.amount }} >> effects.txt"] }
inputs:
  amount: { type: integer, default: 12 }
"#;

/// Fails until the file `ok` exists beside it.
const FLAKY: &str = r#"name: flaky
steps:
  - id: check
    tool: exec
    with: { argv: ["sh", "-c", "test -f ok || { echo not yet >&2; exit 3; }"] }
  - id: after
    tool: echo
    needs: [check]
    with: { done: true }
"#;

/// Runs until stopped; safe to repeat.
const SLOW: &str = r#"name: slow
steps:
  - id: wait
    tool: exec
    idempotent: true
    with: { argv: ["sh", "-c", "touch started-$$ && sleep {{ inputs.seconds }}"] }
inputs:
  seconds: { type: integer, default: 60 }
"#;

/// Prints and fails with its secret (which the run masks).
const LEAKY: &str = r#"name: leaky
secrets: [SERVE_TEST_SECRET]
steps:
  - id: say
    tool: exec
    with: { argv: ["sh", "-c", "echo token={{ secrets.SERVE_TEST_SECRET }}"] }
  - id: ask
    tool: exec
    approval: required
    needs: [say]
    with: { argv: ["sh", "-c", "echo {{ secrets.SERVE_TEST_SECRET }} >&2; exit 1"] }
"#;

const SECRET: &str = "s3cr3t-value-that-must-never-show";
const OPERATOR: &str = "operator-token-0123456789abcdef";
const VIEWER: &str = "viewer-token-0123456789abcdef";

/// A directory of the test workflows, and one that does not validate.
fn workflows() -> TempDir {
    let dir = TempDir::new().expect("tempdir");
    for (name, text) in [
        ("hello.yaml", HELLO),
        ("pay.yaml", PAY),
        ("flaky.yaml", FLAKY),
        ("slow.yaml", SLOW),
        ("leaky.yaml", LEAKY),
        (
            "broken.yaml",
            "name: broken\nsteps:\n  - id: a\n    tool: nope\n",
        ),
    ] {
        std::fs::write(dir.path().join(name), text).expect("write");
    }
    std::fs::write(
        dir.path().join("tokens"),
        format!("operator {OPERATOR} ana\nviewer {VIEWER}\n"),
    )
    .expect("write");
    dir
}

/// `archon serve . --port 0 ARGS` in `dir` (tests/support/serve.rs), with the secret of `leaky`.
pub(crate) fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut env = env.to_vec();
    env.push(("SERVE_TEST_SECRET", SECRET));
    crate::support::serve::serve(dir, args, &env)
}

/// A server with the test token file, whose requests carry the operator's token.
fn serve_operator(dir: &Path) -> Server {
    let mut server = serve(dir, &["--token-file", "tokens"], &[]);
    server.token = Some(OPERATOR.to_owned());
    server
}

impl Server {
    /// Starts a run of `workflow`; returns its id.
    pub(crate) async fn start(&self, workflow: &str, inputs: Json) -> String {
        let (status, body) = self
            .post(
                &format!("/api/v1/workflows/{workflow}/runs"),
                json!({ "inputs": inputs }),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        body["run_id"].as_str().expect("an id").to_owned()
    }

    /// Opens a live stream.
    pub(crate) async fn stream(&self, path: &str) -> Stream {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{path}"
        );
        Stream {
            response,
            buffer: String::new(),
        }
    }

    /// Follows the run's live stream until its status is one of `statuses`; returns the events seen
    /// (kind and data) on the way.
    pub(crate) async fn wait_for(&self, run: &str, statuses: &[&str]) -> Vec<(String, Json)> {
        let mut stream = self.stream(&format!("/api/v1/runs/{run}/stream")).await;
        let mut seen = Vec::new();
        loop {
            let (kind, data) = stream.next(Duration::from_secs(30)).await;
            let done = kind == "run" && statuses.contains(&data["status"].as_str().unwrap_or(""));
            seen.push((kind, data));
            if done {
                return seen;
            }
        }
    }
}

/// A server-sent event stream.
pub(crate) struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    /// The next event (kind and JSON data), within `limit`; comments are skipped.
    pub(crate) async fn next(&mut self, limit: Duration) -> (String, Json) {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut kind = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(k) = line.strip_prefix("event:") {
                        kind = k.trim().to_owned();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return (kind, serde_json::from_str(&data).expect("JSON data"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk())
                .await
                .expect("an event in time")
                .expect("the stream reads")
                .expect("the stream is open");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// The run as the CLI shows it (`archon show --json`), from the same state directory.
fn shown(dir: &Path, id: &str) -> Json {
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir, &["show", id, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("json")
}

/// Waits (10 s at most) for a file whose name starts with `prefix` in `dir`.
async fn wait_for_file(dir: &Path, prefix: &str) {
    let started = Instant::now();
    loop {
        let found = std::fs::read_dir(dir)
            .expect("reads")
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with(prefix));
        if found {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no `{prefix}*` appeared"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn the_openapi_document_is_checked_in() {
    let Output { code, stdout, .. } = archon(root(), &["serve", "--openapi"]);
    assert_eq!(code, 0);
    let checked_in =
        std::fs::read_to_string(root().join("schemas/openapi.json")).expect("checked in");
    assert!(
        stdout == checked_in,
        "schemas/openapi.json is not what the code generates: `cargo build && ./target/debug/archon serve --openapi > schemas/openapi.json` updates it"
    );
    let document: Json = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(document["openapi"], "3.1.0");
}

#[tokio::test]
async fn a_run_started_over_http_is_followed_live_to_its_end_and_shown_whole() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let (status, listed) = server.get("/api/v1/workflows").await;
    assert_eq!(status, 200);
    let names: Vec<(&str, bool)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|w| (w["id"].as_str().unwrap_or(""), w["valid"] == true))
        .collect();
    assert_eq!(
        names,
        [
            ("broken", false),
            ("flaky", true),
            ("hello", true),
            ("leaky", true),
            ("pay", true),
            ("slow", true)
        ]
    );
    let (status, hello) = server.get("/api/v1/workflows/hello").await;
    assert_eq!(status, 200);
    assert_eq!(
        hello["input_schema"],
        json!({
            "type": "object",
            "properties": { "who": { "type": "string", "description": "Who to greet" } },
            "additionalProperties": false,
            "required": ["who"]
        })
    );
    assert_eq!(
        hello["steps"],
        json!([{ "id": "greet", "needs": [] }, { "id": "shout", "needs": ["greet"] }])
    );
    let (status, broken) = server.get("/api/v1/workflows/broken").await;
    assert_eq!(status, 200);
    assert!(
        broken["diagnostics"]
            .as_str()
            .expect("text")
            .contains("error[archon::unknown_tool]"),
        "{broken}"
    );

    let run = server.start("hello", json!({ "who": "ada" })).await;
    let seen = server.wait_for(&run, &["succeeded", "failed"]).await;
    let kinds: Vec<String> = seen
        .iter()
        .filter(|(kind, _)| kind == "event")
        .map(|(_, data)| {
            format!(
                "{} {}",
                data["event"]["event"].as_str().unwrap_or(""),
                data["event"]["step"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "step_started greet",
            "step_finished greet",
            "step_started shout",
            "step_finished shout"
        ]
    );
    let seqs: Vec<i64> = seen
        .iter()
        .filter(|(kind, _)| kind == "event")
        .map(|(_, data)| data["seq"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    assert_eq!(seen.last().expect("the end").1["status"], "succeeded");

    let (status, detail) = server.get(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(status, 200);
    assert_eq!(detail["status"], "succeeded");
    assert_eq!(detail["outputs"], json!({ "greeting": "hello, ada" }));
    assert_eq!(detail["results"]["greet"]["status"], "succeeded");
    assert_eq!(detail["attempts"].as_array().map(Vec::len), Some(2));
    // The same run the CLI shows.
    let cli = shown(dir.path(), &run);
    assert_eq!(detail["results"], cli["results"]);
    assert_eq!(detail["inputs"], cli["inputs"]);

    // The events and logs as pages, by cursor.
    let (status, events) = server
        .get(&format!("/api/v1/runs/{run}/events?after=2&limit=1"))
        .await;
    assert_eq!(status, 200);
    assert_eq!(events["after"], 3);
    assert_eq!(events["events"][0]["seq"], 3);
    assert_eq!(events["events"][0]["event"]["event"], "step_started");
    let (status, logs) = server.get(&format!("/api/v1/runs/{run}/logs")).await;
    assert_eq!(status, 200);
    assert_eq!(logs["logs"][0]["text"], "hello, ada\n");
    assert_eq!(logs["logs"][0]["stream"], "stdout");
    assert_eq!(logs["logs"][0]["step"], "greet");

    // The listing, filtered.
    let (status, page) = server
        .get("/api/v1/runs?workflow=hello&status=succeeded")
        .await;
    assert_eq!(status, 200);
    assert_eq!(page["total"], 1);
    assert_eq!(page["runs"][0]["id"], run.as_str());
    let (status, page) = server.get("/api/v1/runs?status=failed").await;
    assert_eq!(status, 200);
    assert_eq!(page["total"], 0);
    let (status, refused) = server.get("/api/v1/runs?status=finished").await;
    assert_eq!(status, 400);
    assert_eq!(refused["error"], "`finished` is not a run status");

    // Inputs are checked against the workflow's declarations.
    let (status, refused) = server
        .post("/api/v1/workflows/hello/runs", json!({ "inputs": {} }))
        .await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"], "missing required input `who`");
    let (status, refused) = server
        .post("/api/v1/workflows/broken/runs", json!({}))
        .await;
    assert_eq!(status, 422);
    assert_eq!(refused["error"], "the workflow `broken` does not validate");
    let (status, _) = server.get("/api/v1/runs/r-no-such-run").await;
    assert_eq!(status, 404);
    let (status, refused) = server.get("/api/v1/nothing-here").await;
    assert_eq!(status, 404);
    assert_eq!(refused["error"], "no such API endpoint");
    // Bodies are bounded.
    let (status, refused) = server
        .post(
            "/api/v1/workflows/hello/runs",
            json!({ "inputs": { "who": "x".repeat(300 * 1024) } }),
        )
        .await;
    assert_eq!(status, 413, "{refused}");
    let response = server
        .request(reqwest::Method::POST, "/api/v1/workflows/hello/runs")
        .header("content-type", "text/plain")
        .body("who=ada")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 415);
}

#[tokio::test]
async fn the_run_list_pages_by_cursor_with_its_total() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let mut runs = Vec::new();
    for who in ["a", "b", "c", "d", "e"] {
        let run = server.start("hello", json!({ "who": who })).await;
        server.wait_for(&run, &["succeeded"]).await;
        runs.push(run);
    }
    runs.reverse();
    let mut seen = Vec::new();
    let mut path = "/api/v1/runs?limit=2".to_owned();
    loop {
        let (status, page) = server.get(&path).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["total"], 5);
        for run in page["runs"].as_array().expect("runs") {
            seen.push(run["id"].as_str().expect("id").to_owned());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/api/v1/runs?limit=2&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(seen, runs, "newest first, each once");
    let (status, refused) = server.get("/api/v1/runs?limit=0").await;
    assert_eq!(status, 400);
    assert_eq!(refused["error"], "`limit` is between 1 and 200, not 0");
}

#[tokio::test]
async fn an_approval_binds_to_the_hash_of_its_arguments_and_resumes_the_run() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let run = server.start("pay", json!({ "amount": 40 })).await;
    server.wait_for(&run, &["waiting_approval"]).await;
    let (status, waiting) = server.get("/api/v1/approvals").await;
    assert_eq!(status, 200);
    let waiting = waiting.as_array().expect("a list");
    assert_eq!(waiting.len(), 1);
    let call = &waiting[0];
    assert_eq!(call["run_id"], run.as_str());
    assert_eq!(call["step"], "pay");
    assert_eq!(call["tool"], "exec");
    assert_eq!(
        call["arguments"],
        json!({ "with": { "argv": ["sh", "-c", "echo paid 40 >> effects.txt"] } })
    );
    assert_eq!(call["reason"], "the step says `approval: required`");
    let key = call["key"].as_str().expect("a key");
    assert_eq!(key.len(), 64, "a SHA-256");

    // A decision on other arguments decides nothing.
    let other = "0".repeat(64);
    let (status, refused) = server
        .post(
            &format!("/api/v1/runs/{run}/approvals/{other}/approve"),
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        refused["error"],
        format!("run `{run}` has no call waiting for approval with key `{other}`")
    );
    assert!(!dir.path().join("effects.txt").exists());

    let (status, decided) = server
        .post(
            &format!("/api/v1/runs/{run}/approvals/{key}/approve"),
            json!({ "reason": "invoice checked" }),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["key"], key);
    assert_eq!(decided["still_waiting"], 0);
    assert_eq!(decided["resumed"]["run_id"], run.as_str());
    server.wait_for(&run, &["succeeded"]).await;
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("paid"),
        "paid 40\n"
    );
    let cli = shown(dir.path(), &run);
    assert_eq!(
        cli["approvals"][0]["decision"],
        json!({ "approved": true, "by": "ana", "reason": "invoice checked" })
    );
    // Decided already: a second decision is refused.
    let (status, _) = server
        .post(
            &format!("/api/v1/runs/{run}/approvals/{key}/deny"),
            json!({}),
        )
        .await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn a_denied_call_fails_its_step() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let run = server.start("pay", json!({})).await;
    server.wait_for(&run, &["waiting_approval"]).await;
    let (_, detail) = server.get(&format!("/api/v1/runs/{run}")).await;
    let key = detail["approvals"][0]["key"]
        .as_str()
        .expect("key")
        .to_owned();
    let (status, decided) = server
        .post(
            &format!("/api/v1/runs/{run}/approvals/{key}/deny"),
            Json::Null,
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    server.wait_for(&run, &["failed"]).await;
    assert!(!dir.path().join("effects.txt").exists());
}

#[tokio::test]
async fn cancel_stops_a_run_for_good_and_retry_runs_failed_steps_again() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let run = server.start("slow", json!({})).await;
    wait_for_file(dir.path(), "started-").await;
    let (status, cancelled) = server
        .post(&format!("/api/v1/runs/{run}/cancel"), Json::Null)
        .await;
    assert_eq!(status, 200, "{cancelled}");
    server.wait_for(&run, &["cancelled"]).await;
    let (status, refused) = server
        .post(&format!("/api/v1/runs/{run}/resume"), Json::Null)
        .await;
    assert_eq!(status, 409);
    assert_eq!(refused["error"], format!("run `{run}` was cancelled"));
    // Cancelled as soon as it is accepted, before or after its thread records it: cancelled all the same.
    let run = server.start("slow", json!({})).await;
    let (status, cancelled) = server
        .post(&format!("/api/v1/runs/{run}/cancel"), Json::Null)
        .await;
    assert_eq!(status, 200, "{cancelled}");
    server.wait_for(&run, &["cancelled"]).await;

    let run = server.start("flaky", json!({})).await;
    server.wait_for(&run, &["failed"]).await;
    let (_, logs) = server.get(&format!("/api/v1/runs/{run}/logs")).await;
    assert_eq!(logs["logs"][0]["text"], "not yet\n");
    assert_eq!(logs["logs"][0]["stream"], "stderr");
    std::fs::write(dir.path().join("ok"), "").expect("write");
    let (status, started) = server
        .post(&format!("/api/v1/runs/{run}/retry"), json!({}))
        .await;
    assert_eq!(status, 202, "{started}");
    assert_eq!(started, json!({ "run_id": run, "queued": false }));
    server.wait_for(&run, &["succeeded"]).await;
    let (_, detail) = server.get(&format!("/api/v1/runs/{run}")).await;
    let attempts: Vec<(&str, u64, &str)> = detail["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|a| {
            (
                a["step"].as_str().unwrap_or(""),
                a["attempt"].as_u64().unwrap_or(0),
                a["status"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        attempts,
        [
            ("check", 1, "failed"),
            ("check", 2, "succeeded"),
            ("after", 1, "succeeded")
        ]
    );

    // From a step: it and what follows run again, in a new generation (the retry of the failed steps
    // made the first).
    let (status, _) = server
        .post(
            &format!("/api/v1/runs/{run}/retry"),
            json!({ "from": "after" }),
        )
        .await;
    assert_eq!(status, 202);
    // The run had succeeded already: its status says nothing until the new generation has ended.
    let detail = server
        .poll(&format!("/api/v1/runs/{run}"), |d| {
            d["generation"] == 2 && d["status"] == "succeeded"
        })
        .await;
    let last = detail["attempts"]
        .as_array()
        .and_then(|a| a.last())
        .expect("attempts");
    assert_eq!(
        (&last["step"], &last["attempt"], &last["generation"]),
        (&json!("after"), &json!(2), &json!(2))
    );
    let (status, refused) = server
        .post(
            &format!("/api/v1/runs/{run}/retry"),
            json!({ "from": "nope" }),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(refused["error"], "workflow `flaky` has no step `nope`");
}

#[tokio::test]
async fn beyond_max_runs_a_run_waits_in_the_queue_visibly() {
    let dir = workflows();
    let mut server = serve(dir.path(), &["--max-runs", "1"], &[]);
    server.token = None;
    let csrf = csrf_of(&server).await;
    let post = |path: String, body: Json| {
        server
            .request(reqwest::Method::POST, &path)
            .header("x-csrf-token", csrf.clone())
            .json(&body)
            .send()
    };
    let slow: Json = post("/api/v1/workflows/slow/runs".into(), json!({}))
        .await
        .expect("answered")
        .json()
        .await
        .expect("json");
    assert_eq!(slow["queued"], false);
    let hello: Json = post(
        "/api/v1/workflows/hello/runs".into(),
        json!({ "inputs": { "who": "queued" } }),
    )
    .await
    .expect("answered")
    .json()
    .await
    .expect("json");
    assert_eq!(hello["queued"], true);
    let waiting = hello["run_id"].as_str().expect("id");
    let (status, queue) = server.get("/api/v1/queue").await;
    assert_eq!(status, 200);
    assert_eq!(queue[0]["run_id"], waiting);
    assert_eq!(queue[0]["action"], "start");
    assert_eq!(queue[0]["position"], 1);
    assert_eq!(queue[0]["reason"], "waiting for a free slot");
    let (status, detail) = server.get(&format!("/api/v1/runs/{waiting}")).await;
    assert_eq!(status, 200);
    assert_eq!(detail["status"], "queued");
    // `archon runs` and `archon show` on the state directory see it; `archon cancel` drops another.
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["show", waiting, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let shown: Json = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        (
            &shown["id"],
            &shown["status"],
            &shown["kind"],
            &shown["reason"]
        ),
        (
            &json!(waiting),
            &json!("queued"),
            &json!("api"),
            &json!("waiting for a free slot on the server")
        )
    );
    let dropped: Json = post(
        "/api/v1/workflows/hello/runs".into(),
        json!({ "inputs": { "who": "dropped" } }),
    )
    .await
    .expect("answered")
    .json()
    .await
    .expect("json");
    let dropped = dropped["run_id"].as_str().expect("id");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["runs", "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let listed: Json = serde_json::from_str(&stdout).expect("json");
    let queued: Vec<&Json> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter(|r| r["status"] == "queued")
        .map(|r| &r["id"])
        .collect();
    assert_eq!(queued, [&json!(dropped), &json!(waiting)]);
    let Output { code, stderr, .. } = archon(dir.path(), &["cancel", dropped]);
    assert_eq!(code, 0, "{stderr}");
    // The slow run ends: the queued one starts and finishes; the dropped one never starts.
    let running = slow["run_id"].as_str().expect("id");
    let response = post(format!("/api/v1/runs/{running}/cancel"), Json::Null)
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
    server.wait_for(waiting, &["succeeded"]).await;
    server
        .wait_said(&format!(
            "run `{dropped}` does not start: it was cancelled before it started"
        ))
        .await;
    // Once its thread has let it go, it is nowhere.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.get(&format!("/api/v1/runs/{dropped}")).await.0 != 404 {
        assert!(Instant::now() < deadline, "run `{dropped}` is still shown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, queue) = server.get("/api/v1/queue").await;
    assert_eq!(queue, json!([]));
}

/// The CSRF token of a server without tokens.
async fn csrf_of(server: &Server) -> String {
    let (status, session) = server.get("/api/v1/session").await;
    assert_eq!(status, 200);
    assert_eq!(session["role"], "operator");
    assert_eq!(session["via"], "open");
    session["csrf"].as_str().expect("a token").to_owned()
}

#[tokio::test]
async fn a_viewer_reads_and_cannot_post_and_a_token_is_required() {
    let dir = workflows();
    let mut server = serve(dir.path(), &["--token-file", "tokens"], &[]);
    server.token = None;
    let (status, refused) = server.get("/api/v1/runs").await;
    assert_eq!(status, 401);
    assert_eq!(refused["error"], "authentication is required");
    server.token = Some("not-a-token-of-this-server".to_owned());
    let (status, refused) = server.get("/api/v1/runs").await;
    assert_eq!(status, 401);
    assert_eq!(refused["error"], "the bearer token is not valid");
    // A page without credentials is sent to the login form.
    server.token = None;
    let response = server
        .request(reqwest::Method::GET, "/runs?status=failed")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 303);
    assert_eq!(
        response.headers()["location"],
        "/login?next=%2Fruns%3Fstatus%3Dfailed"
    );

    server.token = Some(VIEWER.to_owned());
    let (status, session) = server.get("/api/v1/session").await;
    assert_eq!(status, 200);
    assert_eq!(
        session,
        json!({ "role": "viewer", "via": "bearer", "by": "viewer" })
    );
    let (status, _) = server.get("/api/v1/runs").await;
    assert_eq!(status, 200);
    for path in [
        "/api/v1/workflows/hello/runs",
        "/api/v1/runs/r1/cancel",
        "/api/v1/runs/r1/resume",
        "/api/v1/runs/r1/retry",
        "/api/v1/runs/r1/approvals/k/approve",
        "/api/v1/runs/r1/approvals/k/deny",
    ] {
        let (status, refused) = server.post(path, json!({})).await;
        assert_eq!(status, 403, "{path}");
        assert_eq!(
            refused["error"], "a viewer cannot change anything",
            "{path}"
        );
    }
    let (_, page) = server.get("/api/v1/runs").await;
    assert_eq!(page["total"], 0, "nothing was started");

    server.token = Some(OPERATOR.to_owned());
    let (status, session) = server.get("/api/v1/session").await;
    assert_eq!(status, 200);
    assert_eq!(
        session,
        json!({ "role": "operator", "via": "bearer", "by": "ana" })
    );
}

#[tokio::test]
async fn a_browser_session_needs_its_csrf_token_and_cross_site_posts_are_refused() {
    let dir = workflows();
    let mut server = serve(dir.path(), &["--token-file", "tokens"], &[]);
    server.token = None;
    let login = |token: &str| {
        server
            .http
            .post(format!("{}/login", server.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}&next=%2Fruns"))
            .send()
    };
    let refused = login("wrong-token-0123456789").await.expect("answered");
    assert_eq!(refused.status(), 401);
    assert!(refused.headers().get("set-cookie").is_none());
    let response = login(OPERATOR).await.expect("answered");
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()["location"], "/runs");
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(
        cookie.ends_with("; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200"),
        "{cookie}"
    );
    let session_cookie = cookie.split(';').next().expect("name=value").to_owned();
    let with_cookie = |method: reqwest::Method, path: &str| {
        server
            .http
            .request(method, format!("{}{path}", server.url))
            .header("cookie", session_cookie.clone())
    };
    let session: Json = with_cookie(reqwest::Method::GET, "/api/v1/session")
        .send()
        .await
        .expect("answered")
        .json()
        .await
        .expect("json");
    assert_eq!(session["via"], "cookie");
    assert_eq!(session["role"], "operator");
    let csrf = session["csrf"].as_str().expect("a CSRF token").to_owned();
    let start = |extra: &[(&str, &str)]| {
        let mut request = with_cookie(reqwest::Method::POST, "/api/v1/workflows/hello/runs")
            .json(&json!({ "inputs": { "who": "web" } }));
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        request.send()
    };
    let host = server.url.trim_start_matches("http://").to_owned();
    let own_origin = server.url.clone();
    for (extra, why) in [
        (vec![], "no CSRF token"),
        (vec![("x-csrf-token", "0123")], "a wrong CSRF token"),
        (
            vec![
                ("x-csrf-token", csrf.as_str()),
                ("origin", "http://evil.example"),
            ],
            "another origin",
        ),
        (
            vec![
                ("x-csrf-token", csrf.as_str()),
                ("sec-fetch-site", "cross-site"),
            ],
            "another site",
        ),
        (
            vec![
                ("x-csrf-token", csrf.as_str()),
                ("sec-fetch-site", "same-site"),
            ],
            "a sibling site",
        ),
    ] {
        let response = start(&extra).await.expect("answered");
        assert_eq!(response.status(), 403, "{why}");
    }
    let response = start(&[
        ("x-csrf-token", csrf.as_str()),
        ("origin", own_origin.as_str()),
        ("sec-fetch-site", "same-origin"),
        ("host", host.as_str()),
    ])
    .await
    .expect("answered");
    assert_eq!(response.status(), 202);
    // A form carries the token as its `csrf` field.
    let response = with_cookie(reqwest::Method::POST, "/api/v1/runs/r-none/cancel")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}"))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 404, "past the CSRF check");
    let response = with_cookie(reqwest::Method::POST, "/api/v1/runs/r-none/cancel")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("csrf=wrong")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 403);
    // Logging out ends the session.
    let response = with_cookie(reqwest::Method::POST, "/logout")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 303);
    let response = with_cookie(reqwest::Method::GET, "/api/v1/session")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn without_tokens_only_loopback_host_names_are_served() {
    let dir = workflows();
    let server = serve(dir.path(), &[], &[]);
    let response = server
        .request(reqwest::Method::GET, "/api/v1/session")
        .header("host", "attacker.example")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 403, "DNS rebinding");
    let csrf = csrf_of(&server).await;
    // Without tokens every caller is an operator, but POSTs still need the CSRF token.
    let response = server
        .request(reqwest::Method::POST, "/api/v1/workflows/hello/runs")
        .json(&json!({ "inputs": { "who": "x" } }))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 403);
    let response = server
        .request(reqwest::Method::POST, "/api/v1/workflows/hello/runs")
        .header("x-csrf-token", csrf)
        .json(&json!({ "inputs": { "who": "x" } }))
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 202);
}

#[test]
fn a_non_loopback_bind_without_a_token_is_refused() {
    let dir = workflows();
    let output = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["serve", ".", "--bind", "0.0.0.0", "--port", "0"])
        .current_dir(dir.path())
        .env_remove("ARCHON_SERVE_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("archon runs");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: serving on `0.0.0.0:0` needs a token: it is not a loopback address\n  hint: set `ARCHON_SERVE_TOKEN` or pass `--token-file FILE`; docs/serve.md says how tokens work\n"
    );
    let Output { code, stderr, .. } = archon(dir.path(), &["serve", ".", "--token-file", "nope"]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        "error: cannot read token file `nope`: no such file or directory\n  hint: each line is `operator TOKEN` or `viewer TOKEN`\n"
    );
    // A token a guess finds is no token.
    let output = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["serve", ".", "--bind", "0.0.0.0", "--port", "0"])
        .current_dir(dir.path())
        .env("ARCHON_SERVE_TOKEN", "a")
        .stdin(Stdio::null())
        .output()
        .expect("archon runs");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: `ARCHON_SERVE_TOKEN` needs at least 16 characters\n  hint: use a long random value, such as the output of `openssl rand -hex 32`\n"
    );
}

#[tokio::test]
async fn with_a_token_the_server_listens_beyond_loopback() {
    let dir = workflows();
    let mut server = serve(
        dir.path(),
        &["--bind", "0.0.0.0"],
        &[("ARCHON_SERVE_TOKEN", OPERATOR)],
    );
    let port = server
        .url
        .strip_prefix("http://0.0.0.0:")
        .expect("on every address")
        .to_owned();
    server.url = format!("http://127.0.0.1:{port}");
    server.token = Some(OPERATOR.to_owned());
    let (status, session) = server.get("/api/v1/session").await;
    assert_eq!(status, 200);
    assert_eq!(session["by"], "operator");
}

#[tokio::test]
async fn no_response_of_a_scripted_session_holds_a_secret() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let run = server.start("leaky", json!({})).await;
    let mut bodies: Vec<String> = Vec::new();
    // The live stream, from the start to the pause.
    for (kind, data) in server.wait_for(&run, &["waiting_approval"]).await {
        bodies.push(format!("{kind} {data}"));
    }
    let (_, detail) = server.get(&format!("/api/v1/runs/{run}")).await;
    let key = detail["approvals"][0]["key"]
        .as_str()
        .expect("key")
        .to_owned();
    let (_, decided) = server
        .post(
            &format!("/api/v1/runs/{run}/approvals/{key}/approve"),
            json!({}),
        )
        .await;
    bodies.push(decided.to_string());
    for (kind, data) in server.wait_for(&run, &["failed"]).await {
        bodies.push(format!("{kind} {data}"));
    }
    let paths = [
        "/".to_owned(),
        "/login".to_owned(),
        "/api/v1/openapi.json".to_owned(),
        "/api/v1/session".to_owned(),
        "/api/v1/workflows".to_owned(),
        "/api/v1/workflows/leaky".to_owned(),
        "/api/v1/runs".to_owned(),
        "/api/v1/approvals".to_owned(),
        "/api/v1/queue".to_owned(),
        format!("/api/v1/runs/{run}"),
        format!("/api/v1/runs/{run}/events"),
        format!("/api/v1/runs/{run}/logs"),
        format!("/api/v1/runs/{run}/approvals"),
        "/api/v1/firings".to_owned(),
        "/runs".to_owned(),
        format!("/runs/{run}"),
        format!("/runs/{run}/trail"),
        "/approvals".to_owned(),
        "/workflows".to_owned(),
        "/workflows/leaky".to_owned(),
    ];
    for path in &paths {
        let response = server
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("answered");
        assert!(
            response.status().is_success() || response.status().is_redirection(),
            "{path}"
        );
        bodies.push(response.text().await.expect("a body"));
    }
    let all = bodies.join("\n");
    // What the run printed is there, masked.
    assert!(all.contains("token=***"), "{all}");
    assert!(!all.contains(SECRET), "a response shows the secret");
    assert!(
        !all.contains(&SECRET.replace('-', "\\u002d")),
        "a response shows the secret escaped"
    );
}

#[tokio::test]
async fn sigterm_interrupts_the_runs_and_the_next_start_resumes_them() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let run = server.start("slow", json!({ "seconds": 1 })).await;
    wait_for_file(dir.path(), "started-").await;
    let mut stream = server.stream("/api/v1/runs/stream").await;
    server.terminate();
    let mut server = server;
    let status = server.child.wait().expect("it exits");
    assert_eq!(status.code(), Some(0), "{}", server.said());
    // The live stream ended with the server (after the events it had sent already).
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.response.chunk().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await;
    assert!(matches!(ended, Ok(Ok(None))), "{ended:?}");
    assert_eq!(shown(dir.path(), &run)["status"], "interrupted");
    assert_eq!(
        server.said().lines().last(),
        Some("stopped: 1 run to resume and 0 queued, taken up by the next `archon serve`")
    );
    drop(server);

    let server = serve_operator(dir.path());
    server.wait_for(&run, &["succeeded"]).await;
    let attempts = shown(dir.path(), &run)["attempts"].as_array().map(Vec::len);
    assert_eq!(attempts, Some(2), "the step ran again");
    assert!(!dir.path().join(".archon/serve/restart.json").exists());
}

#[tokio::test]
async fn runs_of_another_process_on_the_same_state_directory_stream_live_and_cli_cancel_works() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let mut list = server.stream("/api/v1/runs/stream").await;
    // A run of `archon run`, not of the server: the store tells of it.
    let Output {
        code,
        stdout,
        stderr,
    } = archon(
        dir.path(),
        &["run", "hello.yaml", "--input", "who=cli", "--json"],
    );
    assert_eq!(code, 0, "{stderr}");
    let report: Json = serde_json::from_str(&stdout).expect("json");
    let id = report["run_id"].as_str().expect("id").to_owned();
    loop {
        let (kind, data) = list.next(Duration::from_secs(10)).await;
        if kind == "run" && data["id"] == id.as_str() && data["status"] == "succeeded" {
            break;
        }
    }
    let seen = server.wait_for(&id, &["succeeded"]).await;
    assert_eq!(
        seen.iter().filter(|(kind, _)| kind == "event").count(),
        4,
        "{seen:?}"
    );

    // `archon cancel` on a run the server runs stops only that run.
    let run = server.start("slow", json!({})).await;
    wait_for_file(dir.path(), "started-").await;
    let Output { code, stderr, .. } = archon(dir.path(), &["cancel", &run]);
    assert_eq!(code, 0, "{stderr}");
    server.wait_for(&run, &["cancelled"]).await;
    let (status, _) = server.get("/api/v1/session").await;
    assert_eq!(status, 200, "the server goes on");
}

/// Declares two secrets with short, common values (`true`, `runs` in the tests below).
const SHORTS: &str = r#"name: shorts
secrets: [SHORT_FLAG, SHORT_WORD]
steps:
  - id: quiet
    tool: echo
    with: { done: true }
"#;

/// Prints the values of those secrets without declaring them, and asks to run a command holding them:
/// only the server masks them. Its first step is named like one of them.
const PLAIN: &str = r#"name: plain
steps:
  - id: runs
    tool: exec
    with: { argv: ["sh", "-c", "printf 'all runs are true'"] }
  - id: ask
    tool: exec
    approval: required
    needs: [runs]
    with: { argv: ["sh", "-c", "echo runs are true"] }
"#;

#[tokio::test]
async fn short_secret_values_are_masked_in_run_data_and_leave_json_and_links_whole() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("shorts.yaml"), SHORTS).expect("write");
    std::fs::write(dir.path().join("plain.yaml"), PLAIN).expect("write");
    std::fs::write(dir.path().join("tokens"), format!("operator {OPERATOR}\n")).expect("write");
    let mut server = crate::support::serve::serve(
        dir.path(),
        &["--token-file", "tokens"],
        &[("SHORT_FLAG", "true"), ("SHORT_WORD", "runs")],
    );
    server.token = Some(OPERATOR.to_owned());
    let run = server.start("plain", json!({})).await;
    // Every live event is JSON (`Stream::next` parses each), the log masked.
    let seen = server.wait_for(&run, &["waiting_approval"]).await;
    let logged: Vec<&Json> = seen
        .iter()
        .filter(|(kind, _)| kind == "log")
        .map(|(_, data)| &data["text"])
        .collect();
    assert_eq!(logged, [&json!("all *** are ***")], "{seen:?}");
    let mut all = seen
        .iter()
        .map(|(kind, data)| format!("{kind} {data}"))
        .collect::<Vec<_>>();
    for path in [
        "/api/v1/session".to_owned(),
        "/api/v1/workflows".to_owned(),
        "/api/v1/workflows/plain".to_owned(),
        "/api/v1/workflows/plain/triggers".to_owned(),
        "/api/v1/runs".to_owned(),
        "/api/v1/approvals".to_owned(),
        "/api/v1/queue".to_owned(),
        "/api/v1/firings".to_owned(),
        "/api/v1/openapi.json".to_owned(),
        format!("/api/v1/runs/{run}"),
        format!("/api/v1/runs/{run}/events"),
        format!("/api/v1/runs/{run}/logs"),
        format!("/api/v1/runs/{run}/approvals"),
        "/api/v1/runs?limit=abc".to_owned(),
        "/api/v1/runs/r-no-such-run".to_owned(),
    ] {
        let response = server
            .request(reqwest::Method::GET, &path)
            .send()
            .await
            .expect("answered");
        let text = response.text().await.expect("a body");
        let parsed: Result<Json, _> = serde_json::from_str(&text);
        assert!(parsed.is_ok(), "{path} answers JSON: {text}");
        all.push(text);
    }
    // The framing is whole: keys, literals, the server's own words.
    let (_, workflows) = server.get("/api/v1/workflows").await;
    let valid: Vec<&Json> = workflows
        .as_array()
        .expect("a list")
        .iter()
        .map(|w| &w["valid"])
        .collect();
    assert_eq!(valid, [&json!(true), &json!(true)]);
    let (_, page) = server.get("/api/v1/runs").await;
    assert_eq!(page["runs"][0]["id"], run.as_str());
    // The run's data is masked; the step's id, equal to a secret's value, is not (it comes from the spec).
    let (_, detail) = server.get(&format!("/api/v1/runs/{run}")).await;
    assert_eq!(detail["results"]["runs"]["output"], "all *** are ***");
    assert_eq!(detail["results"]["runs"]["status"], "succeeded");
    assert_eq!(detail["status"], "waiting_approval");
    assert_eq!(
        detail["approvals"][0]["arguments"]["with"]["argv"],
        json!(["sh", "-c", "echo *** are ***"]),
        "{detail}"
    );
    let (_, waiting) = server.get("/api/v1/approvals").await;
    assert_eq!(waiting[0]["arguments"], detail["approvals"][0]["arguments"]);
    assert_eq!(waiting[0]["step"], "ask");
    let (_, events) = server.get(&format!("/api/v1/runs/{run}/events")).await;
    let asked: Vec<&Json> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| &e["event"])
        .filter(|e| e["event"] == "approval_requested")
        .collect();
    assert_eq!(asked.len(), 1, "{events}");
    assert_eq!(
        (&asked[0]["step"], &asked[0]["arguments"]["with"]["argv"][2]),
        (&json!("ask"), &json!("echo *** are ***"))
    );
    // The dashboard's links work, and its pages show the output masked.
    let list = server
        .request(reqwest::Method::GET, "/runs")
        .send()
        .await
        .expect("answered");
    assert_eq!(list.status(), 200);
    let list = list.text().await.expect("a page");
    assert!(
        list.contains(&format!(r#"<a href="/runs/{run}">"#)),
        "{list}"
    );
    assert!(
        list.contains(r#"<a href="/runs?workflow=plain">"#),
        "{list}"
    );
    let page = server
        .request(reqwest::Method::GET, &format!("/runs/{run}"))
        .send()
        .await
        .expect("answered");
    assert_eq!(page.status(), 200);
    let page = page.text().await.expect("a page");
    assert!(page.contains("all *** are ***"), "{page}");
    all.push(list);
    all.push(page);
    for path in ["/approvals", "/workflows", "/workflows/plain"] {
        let response = server
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("answered");
        assert_eq!(response.status(), 200, "{path}");
        all.push(response.text().await.expect("a page"));
    }
    assert!(
        all.iter()
            .all(|body| !body.contains("all runs are true") && !body.contains("echo runs are true")),
        "a response shows the run's data unmasked"
    );
}

#[tokio::test]
async fn every_api_error_is_json_in_the_api_style() {
    let dir = workflows();
    let server = serve_operator(dir.path());
    let error = |status: u16, body: Json| format!("{status} {body:#}");
    let (status, body) = server.get("/api/v1/runs?limit=abc").await;
    insta::assert_snapshot!(error(status, body), @r#"
    400 {
      "error": "the query parameter `limit` does not read: invalid digit found in string",
      "hint": "`GET /api/v1/openapi.json` describes the parameters each request takes"
    }
    "#);
    let (status, body) = server.get("/api/v1/runs?status=bogus").await;
    insta::assert_snapshot!(error(status, body), @r#"
    400 {
      "error": "`bogus` is not a run status",
      "hint": "`running`, `waiting_approval`, `interrupted`, `succeeded`, `failed` or `cancelled`"
    }
    "#);
    let (status, body) = server.get("/api/v1/firings?limit=1000").await;
    insta::assert_snapshot!(error(status, body), @r#"
    400 {
      "error": "`limit` is between 1 and 200, not 1000"
    }
    "#);
    let (status, body) = server.get("/api/v1/firings?limit=0").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.post("/api/v1/workflows/hello/runs", json!([])).await;
    insta::assert_snapshot!(error(status, body), @r#"
    400 {
      "error": "the body is an array, not a JSON object",
      "hint": "`GET /api/v1/openapi.json` describes what each request takes"
    }
    "#);
    let (status, body) = server
        .post("/api/v1/workflows/hello/runs", json!({"inputs": ["ada"]}))
        .await;
    insta::assert_snapshot!(error(status, body), @r#"
    400 {
      "error": "the body does not read: `inputs` is a JSON object of the inputs by name, not an array",
      "hint": "`GET /api/v1/openapi.json` describes what each request takes"
    }
    "#);
    let (status, body) = server
        .post("/api/v1/workflows/hello/runs", json!({"inputs": null}))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .post(
            "/api/v1/workflows/hello/runs",
            json!({ "inputs": { "who": "x".repeat(300 * 1024) } }),
        )
        .await;
    insta::assert_snapshot!(error(status, body), @r#"
    413 {
      "error": "the request body is larger than 256 KiB",
      "hint": "send less: inputs, decisions and forms are small"
    }
    "#);
    let response = server
        .request(reqwest::Method::DELETE, "/api/v1/runs")
        .send()
        .await
        .expect("answered");
    let status = response.status().as_u16();
    let body: Json = serde_json::from_str(&response.text().await.expect("a body")).expect("JSON");
    insta::assert_snapshot!(error(status, body), @r#"
    405 {
      "error": "this endpoint does not take `DELETE`",
      "hint": "`GET /api/v1/openapi.json` describes the API"
    }
    "#);
    let response = server
        .request(reqwest::Method::POST, "/api/v1/workflows/hello/runs")
        .header("origin", "http://evil.example")
        .json(&json!({}))
        .send()
        .await
        .expect("answered");
    let status = response.status().as_u16();
    let body: Json = serde_json::from_str(&response.text().await.expect("a body")).expect("JSON");
    insta::assert_snapshot!(error(status, body), @r#"
    403 {
      "error": "cross-site requests are refused",
      "hint": "change things from the dashboard's own pages, or from a script (not a page of another site) with `Authorization: Bearer TOKEN`"
    }
    "#);
}

#[test]
fn a_directory_that_does_not_exist_is_refused() {
    let dir = TempDir::new().expect("tempdir");
    let missing = dir.path().join("missing");
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["serve", &missing.display().to_string(), "--port", "0"])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("archon runs");
    // It stops at once; a server that started instead is stopped and the test fails.
    let deadline = Instant::now() + crate::support::serve::PATIENCE;
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`archon serve` of a missing directory started serving");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("it ends");
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: cannot read `{}`: no such file or directory\n",
            missing.display()
        )
    );
}
