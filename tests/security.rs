//! Security: secrets never reach what a run writes or what a model reads, in any encoding; tool output is
//! data to the model; commands cannot be turned into shells; a flood of output or a hostile template cannot
//! exhaust memory or hang a run.

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use serde_json::{Value as Json, json};
use tempfile::TempDir;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::support::archon_with;

/// A secret with characters that every encoding changes: `/`, `+`, `=`, a space and `~`; 26 bytes, so
/// that its base64 needs padding.
const SECRET: &str = "Tok3n/with+plus=and space~";

/// `text` percent-encoded: every byte, or (`form`) only what form encoding changes, a space as `+`.
fn percent(text: &str, upper: bool, form: bool) -> String {
    text.bytes()
        .map(|b| match b {
            b' ' if form => "+".to_owned(),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' if form => {
                (b as char).to_string()
            }
            _ if upper => format!("%{b:02X}"),
            _ => format!("%{b:02x}"),
        })
        .collect()
}

/// Every form of the secret that must not appear anywhere.
fn forms() -> Vec<String> {
    vec![
        SECRET.to_owned(),
        STANDARD.encode(SECRET),
        STANDARD_NO_PAD.encode(SECRET),
        URL_SAFE.encode(SECRET),
        URL_SAFE_NO_PAD.encode(SECRET),
        STANDARD.encode(format!("user:{SECRET}")),
        percent(SECRET, true, false),
        percent(SECRET, false, false),
        percent(SECRET, true, true),
        percent(SECRET, false, true),
    ]
}

/// Fails naming the artifact and the form when any form of the secret is in `text`.
fn assert_clean(artifact: &str, text: &str) {
    for form in forms() {
        assert!(
            !text.contains(&form),
            "{artifact} holds the secret as `{form}`"
        );
    }
}

/// Every value of every table of the run store, as text.
fn store_dump(db: &Path) -> String {
    let connection = rusqlite::Connection::open(db).expect("the store opens");
    let tables: Vec<String> = connection
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut s| {
            s.query_map([], |r| r.get(0))
                .and_then(|rows| rows.collect::<Result<Vec<String>, _>>())
        })
        .expect("tables");
    let mut dump = String::new();
    for table in tables {
        let mut statement = connection
            .prepare(&format!("SELECT * FROM \"{table}\""))
            .expect("select");
        let columns = statement.column_count();
        let mut rows = statement.query([]).expect("rows");
        while let Some(row) = rows.next().expect("row") {
            for i in 0..columns {
                match row.get_ref(i).expect("value") {
                    rusqlite::types::ValueRef::Text(t) | rusqlite::types::ValueRef::Blob(t) => {
                        dump.push_str(&String::from_utf8_lossy(t));
                    }
                    other => dump.push_str(&format!("{other:?}")),
                }
                dump.push('\n');
            }
        }
    }
    dump
}

/// A chat completion answering with `message`.
fn completion(message: Json) -> ResponseTemplate {
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "local-model",
        "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
        "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
    }))
}

/// A tool call of `name` with `arguments`, as call `id`.
fn tool_call(id: &str, name: &str, arguments: Json) -> Json {
    json!({ "role": "assistant", "content": null, "tool_calls": [{
        "id": id, "type": "function",
        "function": { "name": name, "arguments": arguments.to_string() }
    }] })
}

/// The JSON bodies of the chat requests a server received.
async fn chat_bodies(server: &MockServer) -> Vec<Json> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .filter(|r| r.method.as_str() == "POST")
        .map(|r| serde_json::from_slice(&r.body).unwrap_or_default())
        .collect()
}

/// Whether a chat request already holds a tool result.
fn has_tool_result(request: &Request) -> bool {
    let body: Json = serde_json::from_slice(&request.body).unwrap_or_default();
    body["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
}

/// Prints the secret (from `$T`) as written, in base64 (standard, URL-safe unpadded, and inside
/// `user:secret`), percent-encoded every byte (lower and upper case hex) and form-encoded.
const LEAKY: &str = r#"printf '%s\n' "$T"
printf '%s' "$T" | base64 -w0; echo
printf '%s' "$T" | base64 -w0 | tr '+/' '-_' | tr -d '='; echo
printf 'user:%s' "$T" | base64 -w0; echo
printf '%s' "$T" | od -An -tx1 -v | tr -d ' \n' | sed 's/../%&/g'; echo
printf '%s' "$T" | od -An -tx1 -v | tr -d ' \n' | sed 's/../%&/g' | tr a-f A-F; echo
printf '%s' "$T" | sed 's/%/%25/g; s/\//%2F/g; s/+/%2B/g; s/=/%3D/g; s/~/%7E/g; s/ /+/g'; echo
"#;

/// The spec of the leak test: the secret comes from `.env`; a tool prints it in every form (as a step and
/// for an agent), a failing command prints it to stderr, and an HTTP request carries it in
/// its query to a server that answers 404 quoting the URL.
fn leak_spec(server: &MockServer) -> String {
    let script: String = LEAKY.lines().map(|l| format!("        {l}\n")).collect();
    format!(
        r#"name: leak
secrets: [API_TOKEN]
network: {{ allow: ["127.0.0.1"] }}
llm:
  providers:
    local: {{ kind: openai, base_url: "{uri}/v1", model: local-model }}
tools:
  leaky:
    description: Prints the token in several encodings.
    env: {{ T: "{{{{ secrets.API_TOKEN }}}}" }}
    command:
      - sh
      - -c
      - |
{script}steps:
  - id: leak
    tool: leaky
  - id: fail
    tool: exec
    with: {{ argv: [sh, -c, "printf '%s\n' \"$T\" >&2; exit 3"], env: {{ T: "{{{{ secrets.API_TOKEN }}}}" }} }}
    on_error: continue
  - id: fetch
    tool: http
    with: {{ url: "{uri}/check?token={{{{ secrets.API_TOKEN }}}}" }}
    on_error: continue
  - id: agent
    goal: Run the leaky tool and say what it printed.
    tools: [leaky]
    needs: [leak]
outputs:
  leak: "{{{{ steps.leak.output }}}}"
"#,
        uri = server.uri()
    )
}

#[tokio::test]
async fn a_secret_echoed_by_tools_in_any_encoding_leaves_no_trace_in_any_artifact() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(|request: &Request| {
            completion(if has_tool_result(request) {
                // A model cannot know the secret, but a provider may echo anything: its answers are
                // masked as well, in the cassette too.
                json!({ "role": "assistant", "content": format!("it printed {}", STANDARD.encode(SECRET)) })
            } else {
                tool_call("call_1", "leaky", json!({}))
            })
        })
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .respond_with(|request: &Request| {
            ResponseTemplate::new(404).set_body_string(format!("no such page: {}", request.url))
        })
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("leak.yaml"), leak_spec(&server)).expect("write");
    std::fs::write(
        dir.path().join(".env"),
        format!("# the token\nexport API_TOKEN=\"{SECRET}\"\nOTHER=1\n"),
    )
    .expect("write");
    let args = [
        "run",
        "leak.yaml",
        "--json",
        "--events",
        "events.jsonl",
        "--record",
        "llm.cassette",
        "--state-dir",
        "state",
    ];
    let out = archon_with(dir.path(), &args, &[("NO_COLOR", "1")]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report: Json = serde_json::from_str(&out.stdout).expect("a JSON report");

    // The tool did print every form: each line is masked.
    let printed: Vec<&str> = report["outputs"]["leak"]
        .as_str()
        .expect("text output")
        .lines()
        .collect();
    let basic = STANDARD.encode(format!("user:{SECRET}"));
    assert_eq!(printed.len(), 7, "{printed:?}");
    for (i, line) in printed.iter().enumerate() {
        if i == 3 {
            // Inside `user:secret` only the characters that encode the secret's bits are masked.
            assert!(
                line.starts_with(&basic[..7]) && line.contains("***") && line.len() < 16,
                "{line}"
            );
        } else {
            assert_eq!(*line, "***", "line {i} of {printed:?}");
        }
    }
    let fail = report["steps"]["fail"]["error"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(fail, "`sh` exited with code 3: ***");
    let fetch = report["steps"]["fetch"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        fetch.starts_with("HTTP 404 from GET ") && fetch.matches("***").count() == 2,
        "{fetch}"
    );
    assert_eq!(report["steps"]["agent"]["status"], "succeeded");
    assert_eq!(report["steps"]["agent"]["output"], "it printed ***");

    // The model read the tool's output as data, with the secret masked.
    let bodies = chat_bodies(&server).await;
    assert_eq!(bodies.len(), 2);
    let tool_message = bodies[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .expect("a tool result")
        .to_owned();
    assert!(
        tool_message.starts_with("<tool_output>\n***\n***\n***\n")
            && tool_message.ends_with("</tool_output>"),
        "{tool_message}"
    );

    let artifacts = [
        ("the report", out.stdout.clone()),
        ("the terminal", out.stderr.clone()),
        (
            "the events",
            std::fs::read_to_string(dir.path().join("events.jsonl")).expect("events"),
        ),
        (
            "the cassette",
            std::fs::read_to_string(dir.path().join("llm.cassette")).expect("cassette"),
        ),
        (
            "the store",
            store_dump(&dir.path().join("state").join("state.db")),
        ),
        (
            "the model's requests",
            bodies
                .iter()
                .map(Json::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    ];
    for (artifact, text) in &artifacts {
        // `--json` leaves the terminal quiet; everything else holds something to search.
        assert!(
            !text.is_empty() || *artifact == "the terminal",
            "{artifact} is empty"
        );
        assert_clean(artifact, text);
    }
    // The store's files as bytes too (a value the dump missed, in a page not yet checkpointed).
    for entry in std::fs::read_dir(dir.path().join("state")).expect("state dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path).expect("read");
            assert_clean(
                &path.display().to_string(),
                &String::from_utf8_lossy(&bytes),
            );
        }
    }
    // The cassette holds what the model read: the masked output.
    assert!(
        artifacts[3].1.contains("<tool_output>\\n***\\n"),
        "{}",
        artifacts[3].1
    );
}
