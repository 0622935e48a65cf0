//! Agent memory through the CLI: an agent with `memory: true` remembers in one run and recalls in the next
//! (mock provider scripts), records are superseded, forgotten and deduplicated, secrets are stored masked,
//! namespaces separate teams, no memory is shown twice in one conversation, `remember` goes through the
//! rules, and `archon memory` reads and changes what is kept.

use std::path::Path;

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon_with};

/// A workflow `keeper` whose agent `keeper` has memory and whose mock provider answers `turns` (YAML flow
/// list items, one per line), with extra top-level `rest`.
fn spec(turns: &[&str], rest: &str) -> String {
    let turns: Vec<String> = turns.iter().map(|t| format!("        - {t}\n")).collect();
    format!(
        "name: keeper\nsecrets: [DEPLOY_TOKEN]\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{}agents:\n  keeper: {{ provider: scripted, memory: true }}\n{rest}steps:\n  - {{ id: work, goal: \"when does the team deploy?\", agent: keeper }}\n",
        turns.concat()
    )
}

fn archon(dir: &Path, args: &[&str]) -> Output {
    archon_with(dir, args, &[("DEPLOY_TOKEN", "tok-5ecret-deploy")])
}

fn run(dir: &Path, file: &str, text: &str) -> Json {
    std::fs::write(dir.join(file), text).expect("write");
    let out = archon(
        dir,
        &[
            "run",
            file,
            "--json",
            "--events",
            "events.jsonl",
            "--no-input",
        ],
    );
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", out.stdout, out.stderr))
}

/// What the agent's tools answered in the last run, in order: (tool, text).
fn observations(dir: &Path) -> Vec<(String, String)> {
    let events = std::fs::read_to_string(dir.join("events.jsonl")).expect("events");
    events
        .lines()
        .filter_map(|line| serde_json::from_str::<Json>(line).ok())
        .filter(|e| e["event"] == "agent_observation")
        .map(|e| {
            (
                e["tool"].as_str().unwrap_or("").to_owned(),
                e["text"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The memories `archon memory ls --all --json` lists: (id, kind, content, live).
fn kept(dir: &Path, namespace: &str) -> Vec<(i64, String, String, bool)> {
    let out = archon(
        dir,
        &["memory", "ls", "--namespace", namespace, "--all", "--json"],
    );
    let list: Json =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    list.as_array()
        .expect("a list")
        .iter()
        .map(|m| {
            (
                m["id"].as_i64().unwrap_or(0),
                m["kind"].as_str().unwrap_or("").to_owned(),
                m["content"].as_str().unwrap_or("").to_owned(),
                m.get("superseded_by").is_none() && m.get("forgotten_ms").is_none(),
            )
        })
        .collect()
}

#[test]
fn a_decision_remembered_in_one_run_is_recalled_into_the_next_runs_prompt() {
    let dir = TempDir::new().expect("tempdir");
    let first = spec(
        &[
            "{ tool_calls: [{ name: remember, arguments: { content: \"The team deploys on Thursdays with token tok-5ecret-deploy\" } }] }",
            "{ text: noted }",
        ],
        "",
    );
    let report = run(dir.path(), "first.yaml", &first);
    assert_eq!(report["steps"]["work"]["output"], "noted", "{report}");
    assert_eq!(
        observations(dir.path()),
        [("remember".to_owned(), "remembered as memory 1".to_owned())]
    );
    // The second run's model answers only when its prompt holds the memory (the mock's `match` reads the
    // goal message), and the episode of the first run's step comes with it.
    let second = spec(&["{ match: \"deploys on Thursdays\", text: Thursday }"], "");
    let report = run(dir.path(), "second.yaml", &second);
    assert_eq!(report["steps"]["work"]["output"], "Thursday", "{report}");
    let memories = kept(dir.path(), "keeper");
    assert_eq!(
        memories
            .iter()
            .map(|(id, kind, content, _)| (
                *id,
                kind.as_str(),
                content.lines().next().unwrap_or("")
            ))
            .collect::<Vec<_>>(),
        [
            (1, "fact", "The team deploys on Thursdays with token ***"),
            (2, "episode", "Goal: when does the team deploy?"),
            (3, "episode", "Goal: when does the team deploy?"),
        ]
    );
}

#[test]
fn memories_are_deduplicated_superseded_forgotten_and_never_shown_twice() {
    let dir = TempDir::new().expect("tempdir");
    let text = spec(
        &[
            "{ tool_calls: [{ name: remember, arguments: { content: \"deploys happen on Tuesdays\" } }] }",
            "{ tool_calls: [{ name: remember, arguments: { content: \"deploys  happen on Tuesdays\" } }] }",
            "{ tool_calls: [{ name: remember, arguments: { content: \"deploys happen on Thursdays\", replaces: 1 } }] }",
            "{ tool_calls: [{ name: recall, arguments: { query: deploys } }] }",
            "{ tool_calls: [{ name: recall, arguments: { query: deploys } }] }",
            "{ tool_calls: [{ name: forget, arguments: { id: 2, reason: cancelled } }] }",
            "{ tool_calls: [{ name: recall, arguments: { query: deploys, include_replaced: true } }] }",
            "{ tool_calls: [{ name: note, arguments: { text: \"half done\" } }] }",
            "{ tool_calls: [{ name: notes, arguments: {} }] }",
            "{ text: done }",
        ],
        "memory: { recall: 0 }\n",
    );
    let report = run(dir.path(), "m.yaml", &text);
    assert_eq!(report["steps"]["work"]["output"], "done", "{report}");
    let today = &humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10];
    let observed: Vec<(String, String)> = observations(dir.path())
        .into_iter()
        .map(|(tool, text)| (tool, text.replace(today, "DAY")))
        .collect();
    let pairs: Vec<(&str, &str)> = observed
        .iter()
        .map(|(t, x)| (t.as_str(), x.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("remember", "remembered as memory 1"),
            ("remember", "already remembered as memory 1"),
            ("remember", "remembered as memory 2, replacing memory 1"),
            ("recall", "[memory 2 · DAY] deploys happen on Thursdays"),
            (
                "recall",
                "nothing found for `deploys` that this conversation has not shown already"
            ),
            ("forget", "forgot memory 2"),
            (
                "recall",
                "[memory 1 · DAY · replaced by 2] deploys happen on Tuesdays"
            ),
            ("note", "noted (note 3)"),
            ("notes", "[note 3 · DAY] half done"),
        ]
    );
    let out = archon(dir.path(), &["memory", "show", "1"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        (lines[0], &lines[2..]),
        (
            "memory 1 · fact · namespace `keeper`",
            &["replaced by memory 2", "", "deploys happen on Tuesdays"][..]
        ),
        "{}",
        out.stdout
    );
}

#[test]
fn a_namespace_template_separates_teams() {
    let dir = TempDir::new().expect("tempdir");
    let rest =
        "inputs:\n  team: { type: string }\nmemory: { namespace: \"team-{{ inputs.team }}\" }\n";
    let remember = spec(
        &[
            "{ tool_calls: [{ name: remember, arguments: { content: \"standup is at nine\" } }] }",
            "{ text: ok }",
        ],
        rest,
    );
    std::fs::write(dir.path().join("r.yaml"), &remember).expect("write");
    let out = archon(
        dir.path(),
        &["run", "r.yaml", "--input", "team=red", "--no-input"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let recall = spec(
        &[
            "{ tool_calls: [{ name: recall, arguments: { query: standup } }] }",
            "{ text: ok }",
        ],
        rest,
    );
    std::fs::write(dir.path().join("q.yaml"), &recall).expect("write");
    let out = archon(
        dir.path(),
        &[
            "run",
            "q.yaml",
            "--input",
            "team=blue",
            "--no-input",
            "--events",
            "events.jsonl",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        observations(dir.path()),
        [(
            "recall".to_owned(),
            "nothing found for `standup` that this conversation has not shown already".to_owned()
        )]
    );
    let out = archon(dir.path(), &["memory", "ls"]);
    assert_eq!(
        out.stdout,
        "NAMESPACE  LIVE  TOTAL\nteam-blue  1     1\nteam-red   2     2\n"
    );
}

#[test]
fn remember_goes_through_the_rules_and_is_written_once_after_approval() {
    let dir = TempDir::new().expect("tempdir");
    let text = spec(
        &[
            "{ tool_calls: [{ name: remember, arguments: { content: \"the vendor is Acme\" } }] }",
            "{ text: done }",
        ],
        "rules:\n  - { on: before_tool, match: { tool: remember }, action: ask, reason: memory is shared }\n",
    );
    std::fs::write(dir.path().join("m.yaml"), &text).expect("write");
    let out = archon(dir.path(), &["run", "m.yaml", "--no-input"]);
    assert_eq!(out.code, 3, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(kept(dir.path(), "keeper"), []);
    let out = archon(dir.path(), &["approve", "--last"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = archon(dir.path(), &["resume", "--last", "--no-input"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert_eq!(
        kept(dir.path(), "keeper")
            .into_iter()
            .map(|(id, kind, content, live)| (
                id,
                kind,
                content.lines().next().unwrap_or("").to_owned(),
                live
            ))
            .collect::<Vec<_>>(),
        [
            (1, "fact".to_owned(), "the vendor is Acme".to_owned(), true),
            (
                2,
                "episode".to_owned(),
                "Goal: when does the team deploy?".to_owned(),
                true
            ),
        ]
    );
}

/// Kills `archon` (SIGKILL) while its agent's turn is half done: `remember` has written its fact, and `hold`,
/// called in the same turn, waits for a `go` file. No checkpoint holds that turn, so the resumed step asks
/// the model again, which calls `remember` again: the fact is not written a second time.
#[test]
fn an_agent_killed_after_remember_does_not_remember_twice_when_resumed() {
    let dir = TempDir::new().expect("tempdir");
    let text = spec(
        &[
            "{ tool_calls: [{ name: remember, arguments: { content: \"the release train leaves on Fridays\" } }, { name: hold }] }",
            "{ text: done }",
        ],
        "tools:\n  hold:\n    description: Waits until it may go on\n    parameters: { type: object, properties: {} }\n    idempotent: true\n    command: [sh, -c, 'touch held; while [ ! -f go ]; do sleep 0.02; done; echo released']\n",
    );
    let text = text.replace(
        "{ provider: scripted, memory: true }",
        "{ provider: scripted, memory: true, tools: [hold] }",
    );
    std::fs::write(dir.path().join("m.yaml"), &text).expect("write");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "m.yaml", "--no-input"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .env("DEPLOY_TOKEN", "tok-5ecret-deploy")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("archon starts");
    // Both calls of the turn have started, and the fact is in the memory file.
    let started = std::time::Instant::now();
    let remembered = || {
        let out = archon(
            dir.path(),
            &["memory", "ls", "--namespace", "keeper", "--json"],
        );
        serde_json::from_str::<Json>(&out.stdout)
            .ok()
            .and_then(|list| list.as_array().map(|l| !l.is_empty()))
            .unwrap_or(false)
    };
    while !(dir.path().join("held").exists() && remembered()) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the agent never remembered and held"
        );
        assert_eq!(child.try_wait().expect("running"), None, "archon ended");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("killed");
    child.wait().expect("reaped");
    let fact = (
        1,
        "fact".to_owned(),
        "the release train leaves on Fridays".to_owned(),
        true,
    );
    assert_eq!(kept(dir.path(), "keeper"), std::slice::from_ref(&fact));
    std::fs::write(dir.path().join("go"), "").expect("write");
    let out = archon(
        dir.path(),
        &[
            "resume",
            "--last",
            "--no-input",
            "--json",
            "--events",
            "events.jsonl",
        ],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let report: Json = serde_json::from_str(&out.stdout).expect("a report");
    assert_eq!(
        (&report["status"], &report["steps"]["work"]["output"]),
        (&Json::from("succeeded"), &Json::from("done")),
        "{report}"
    );
    let mut observed = observations(dir.path());
    observed.sort();
    assert_eq!(
        observed,
        [
            ("hold".to_owned(), "released\n".to_owned()),
            (
                "remember".to_owned(),
                "already remembered as memory 1".to_owned()
            ),
        ]
    );
    let memories: Vec<(i64, String, String, bool)> = kept(dir.path(), "keeper")
        .into_iter()
        .map(|(id, kind, content, live)| {
            (
                id,
                kind,
                content.lines().next().unwrap_or("").to_owned(),
                live,
            )
        })
        .collect();
    assert_eq!(
        memories,
        [
            fact,
            (
                2,
                "episode".to_owned(),
                "Goal: when does the team deploy?".to_owned(),
                true
            ),
        ]
    );
}

#[test]
fn memory_export_and_import_round_trip_and_search_reads_bm25() {
    let dir = TempDir::new().expect("tempdir");
    let text = spec(
        &[
            "{ tool_calls: [{ name: remember, arguments: { content: \"the database is postgres 16\" } }] }",
            "{ tool_calls: [{ name: remember, arguments: { content: \"lunch is at noon\" } }] }",
            "{ text: ok }",
        ],
        "memory: { recall: 0 }\n",
    );
    run(dir.path(), "m.yaml", &text);
    let out = archon(
        dir.path(),
        &["memory", "search", "postgres?", "--namespace", "keeper"],
    );
    let today = &humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10];
    assert_eq!(
        out.stdout.replace(today, "DAY"),
        "ID  CREATED     TEXT\n1   DAY  the database is postgres 16\n"
    );
    let out = archon(dir.path(), &["memory", "export", "--namespace", "keeper"]);
    std::fs::write(dir.path().join("export.jsonl"), &out.stdout).expect("write");
    let out = archon(
        dir.path(),
        &[
            "memory",
            "import",
            "export.jsonl",
            "--namespace",
            "copy",
            "--file",
            "other.db",
        ],
    );
    assert_eq!(
        out.stdout, "imported 3 memories (0 already known)\n",
        "{}",
        out.stderr
    );
    let out = archon(
        dir.path(),
        &[
            "memory",
            "import",
            "export.jsonl",
            "--namespace",
            "copy",
            "--file",
            "other.db",
        ],
    );
    assert_eq!(out.stdout, "imported 0 memories (3 already known)\n");
    let out = archon(dir.path(), &["memory", "forget", "1", "--file", "other.db"]);
    assert_eq!(out.stdout, "forgot memory 1\n");
    let out = archon(dir.path(), &["memory", "forget", "1", "--file", "other.db"]);
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (1, "error: memory `1` was forgotten\n")
    );
}

/// A small `/v1/embeddings` server: each input's vector counts its words' character trigrams in 256
/// buckets, so that a misspelt word lands near the right one (which BM25 cannot see).
struct Trigrams(std::sync::atomic::AtomicUsize);

fn trigram_vector(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0f32; 256];
    for word in text.to_lowercase().split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let padded: Vec<char> = format!("  {word} ").chars().collect();
        for gram in padded.windows(3) {
            let mut hash: u32 = 2_166_136_261;
            for c in gram {
                hash = (hash ^ u32::from(*c)).wrapping_mul(16_777_619);
            }
            vector[(hash % 256) as usize] += 1.0;
        }
    }
    vector
}

impl wiremock::Respond for Trigrams {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let body: Json = serde_json::from_slice(&request.body).unwrap_or(Json::Null);
        let inputs: Vec<String> = match &body["input"] {
            Json::String(one) => vec![one.clone()],
            Json::Array(many) => many
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let data: Vec<Json> = inputs
            .iter()
            .enumerate()
            .map(|(index, text)| serde_json::json!({ "object": "embedding", "index": index, "embedding": trigram_vector(text) }))
            .collect();
        wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": { "prompt_tokens": 8, "total_tokens": 8 }
        }))
    }
}

/// A chat model that answers with these assistant messages in order.
struct Script(Vec<Json>, std::sync::atomic::AtomicUsize);

impl wiremock::Respond for Script {
    fn respond(&self, _: &wiremock::Request) -> wiremock::ResponseTemplate {
        let n = self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let message = self.0[n.min(self.0.len() - 1)].clone();
        let finish = if message.get("tool_calls").is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        wiremock::ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "id": format!("chatcmpl-{n}"),
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "chat-small",
            "choices": [{ "index": 0, "message": message, "finish_reason": finish }],
            "usage": { "prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60 }
        }))
    }
}

fn call(name: &str, arguments: &Json) -> Json {
    serde_json::json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{ "id": format!("call_{name}"), "type": "function",
                         "function": { "name": name, "arguments": arguments.to_string() } }]
    })
}

fn said(text: &str) -> Json {
    serde_json::json!({ "role": "assistant", "content": text })
}

/// Without `memory.embeddings` no embedding request is made, though the chat provider's server has the
/// endpoint; with it, a misspelt query finds by embeddings what BM25 cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_asked_only_when_named_and_fused_with_bm25() {
    let server = wiremock::MockServer::start().await;
    let embedded = std::sync::Arc::new(Trigrams(std::sync::atomic::AtomicUsize::new(0)));
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/embeddings"))
        .respond_with(TrigramsRef(embedded.clone()))
        .mount(&server)
        .await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path("/v1/chat/completions"))
        .respond_with(Script(
            vec![
                call("remember", &serde_json::json!({ "content": "the deploy cluster runs kubernetes" })),
                call("recall", &serde_json::json!({ "query": "kubrnetes" })),
                said("first done"),
                call("remember", &serde_json::json!({ "content": "staging uses the kubernetes cluster named blue" })),
                call("recall", &serde_json::json!({ "query": "kubrnetes" })),
                said("second done"),
            ],
            std::sync::atomic::AtomicUsize::new(0),
        ))
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let spec = |embeddings: &str| {
        format!(
            "name: kube\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: chat-small }}\nagents:\n  ops: {{ provider: local, memory: true }}\nmemory: {{ recall: 0{embeddings} }}\nsteps:\n  - {{ id: work, goal: note the cluster, agent: ops }}\n",
            server.uri()
        )
    };
    let path = dir.path().to_owned();
    let plain = spec("");
    let first = tokio::task::spawn_blocking(move || run(&path, "plain.yaml", &plain))
        .await
        .expect("ran");
    assert_eq!(first["steps"]["work"]["output"], "first done", "{first}");
    let recalled: Vec<(String, String)> = observations(dir.path());
    assert_eq!(
        recalled[1],
        (
            "recall".to_owned(),
            "nothing found for `kubrnetes` that this conversation has not shown already".to_owned()
        )
    );
    assert_eq!(embedded.0.load(std::sync::atomic::Ordering::SeqCst), 0);

    let path = dir.path().to_owned();
    let semantic = spec(", embeddings: { provider: local, model: trigram-256 }");
    let second = tokio::task::spawn_blocking(move || run(&path, "semantic.yaml", &semantic))
        .await
        .expect("ran");
    assert_eq!(second["steps"]["work"]["output"], "second done", "{second}");
    let today = &humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10];
    // The events file holds both runs' events: the second run's come after the first's two.
    let recalled: Vec<(String, String)> = observations(dir.path())
        .into_iter()
        .skip(2)
        .map(|(tool, text)| (tool, text.replace(today, "DAY")))
        .collect();
    assert_eq!(
        recalled,
        [
            ("remember".to_owned(), "remembered as memory 3".to_owned()),
            (
                "recall".to_owned(),
                "[memory 3 · DAY] staging uses the kubernetes cluster named blue".to_owned()
            ),
        ]
    );
    // One request for the memory written, one for the query.
    assert_eq!(embedded.0.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Shares a [`Trigrams`] server's count with the test.
struct TrigramsRef(std::sync::Arc<Trigrams>);

impl wiremock::Respond for TrigramsRef {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        self.0.respond(request)
    }
}

/// Hybrid recall end to end against llama.cpp's `llama-server` started with `--embeddings`
/// (`scripts/llama-embeddings.sh start`), when `ARCHON_E2E_EMBEDDINGS_BASE_URL` names it: an agent remembers
/// four facts, each embedded by the server, and a query sharing no word with any of them (so BM25 finds
/// nothing, as `archon memory search` shows) recalls the one it is about. Without the variable the test
/// checks nothing and says so.
#[test]
#[allow(clippy::print_stderr)]
fn hybrid_recall_against_llama_cpp_finds_a_fact_worded_differently() {
    let Ok(base_url) = std::env::var("ARCHON_E2E_EMBEDDINGS_BASE_URL") else {
        eprintln!(
            "skipped: set ARCHON_E2E_EMBEDDINGS_BASE_URL (from scripts/llama-embeddings.sh start) to run against llama.cpp"
        );
        return;
    };
    let facts = [
        "The production cluster runs on Kubernetes in Frankfurt",
        "Lunch is served at noon in the cafeteria",
        "Invoices are paid within thirty days",
        "The office dog is called Biscuit",
    ];
    let query = "where do our containers get orchestrated?";
    let mut turns: Vec<String> = facts
        .iter()
        .map(|fact| {
            format!(
                "{{ tool_calls: [{{ name: remember, arguments: {{ content: \"{fact}\" }} }}] }}"
            )
        })
        .collect();
    turns.push(format!(
        "{{ tool_calls: [{{ name: recall, arguments: {{ query: \"{query}\", limit: 1 }} }}] }}"
    ));
    turns.push("{ text: done }".to_owned());
    let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
    let text = spec(
        &turns,
        "memory: { recall: 0, embeddings: { provider: llama, model: gemma-3-270m } }\n",
    )
    .replace(
        "llm:\n  providers:\n",
        &format!("llm:\n  providers:\n    llama: {{ kind: openai, base_url: \"{base_url}\", model: gemma-3-270m }}\n"),
    );
    let dir = TempDir::new().expect("tempdir");
    let report = run(dir.path(), "e2e.yaml", &text);
    assert_eq!(report["steps"]["work"]["output"], "done", "{report}");
    let today = &humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()[..10];
    let observed: Vec<(String, String)> = observations(dir.path())
        .into_iter()
        .map(|(tool, text)| (tool, text.replace(today, "DAY")))
        .collect();
    let expected: Vec<(String, String)> = (1..=4)
        .map(|id| ("remember".to_owned(), format!("remembered as memory {id}")))
        .chain([(
            "recall".to_owned(),
            format!("[memory 1 · DAY] {}", facts[0]),
        )])
        .collect();
    assert_eq!(observed, expected);
    // BM25 alone finds nothing: the query shares no word with the facts.
    let out = archon(
        dir.path(),
        &["memory", "search", query, "--namespace", "keeper", "--json"],
    );
    assert_eq!((out.code, out.stdout.trim()), (0, "[]"), "{}", out.stderr);
}

/// With a PostgreSQL run store, memory lives in its database: an agent step run by one worker process
/// remembers a fact, and a later run's step, taken by another worker in another directory (another state
/// directory: another host, as far as files go), is given it in its prompt. No memory file is written, and
/// `archon memory --store` reads what the agents kept.
#[test]
fn workers_on_a_postgres_store_share_one_memory() {
    use crate::workers::{ended, submit, worker};
    let Some(db) = crate::postgres::db() else {
        return;
    };
    let spec = |turns: &[&str]| {
        let turns: Vec<String> = turns.iter().map(|t| format!("        - {t}\n")).collect();
        format!(
            "name: keeper\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{}agents:\n  keeper: {{ provider: scripted, memory: true }}\nsteps:\n  - {{ id: work, goal: \"when does the team deploy?\", agent: keeper }}\noutputs:\n  answer: \"{{{{ steps.work.output }}}}\"\n",
            turns.concat()
        )
    };
    std::fs::write(
        db.path().join("first.yaml"),
        spec(&[
            "{ tool_calls: [{ name: remember, arguments: { content: \"The team deploys on Thursdays\" } }] }",
            "{ text: noted }",
        ]),
    )
    .expect("write");
    // The second run's model answers only when its prompt holds the memory.
    std::fs::write(
        db.path().join("second.yaml"),
        spec(&["{ match: \"deploys on Thursdays\", text: Thursday }"]),
    )
    .expect("write");

    let first = submit(&db, "first.yaml");
    let one = worker(&db, 1, "5s");
    let run = ended(&db, &first);
    assert_eq!(
        (&run["status"], &run["outputs"]["answer"]),
        (&Json::from("succeeded"), &Json::from("noted")),
        "{run}\n{}",
        one.said()
    );
    crate::workers::stop(vec![one]);

    let elsewhere = TempDir::new().expect("tempdir");
    let err = elsewhere.path().join("worker-2.err");
    let two = crate::workers::Worker {
        child: std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
            .args(["worker", "--concurrency", "1", "--lease", "5s"])
            .current_dir(elsewhere.path())
            .env("NO_COLOR", "1")
            .env("ARCHON_STORE", db.url())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&err).expect("err file"))
            .spawn()
            .expect("archon worker starts"),
        err,
    };
    let second = submit(&db, "second.yaml");
    let run = ended(&db, &second);
    assert_eq!(
        (&run["status"], &run["outputs"]["answer"]),
        (&Json::from("succeeded"), &Json::from("Thursday")),
        "{run}\n{}",
        two.said()
    );
    crate::workers::stop(vec![two]);

    assert!(!db.path().join(".archon/memory.db").exists());
    assert!(!elsewhere.path().join(".archon/memory.db").exists());
    let out = db.archon(&["memory", "ls", "--namespace", "keeper", "--all", "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let kept: Json = serde_json::from_str(&out.stdout).expect("json");
    let kept: Vec<(&str, &str)> = kept
        .as_array()
        .expect("a list")
        .iter()
        .map(|m| {
            (
                m["kind"].as_str().unwrap_or(""),
                m["content"]
                    .as_str()
                    .unwrap_or("")
                    .lines()
                    .next()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kept,
        [
            ("fact", "The team deploys on Thursdays"),
            ("episode", "Goal: when does the team deploy?"),
            ("episode", "Goal: when does the team deploy?"),
        ]
    );
    // The memory of another file is another memory.
    let out = db.archon(&["memory", "ls", "--file", "other.db", "--json"]);
    assert_eq!((out.code, out.stdout.trim()), (0, "[]"), "{}", out.stderr);
    let out = db.archon(&["memory", "export"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    std::fs::write(db.path().join("export.jsonl"), &out.stdout).expect("write");
    let out = db.archon(&["memory", "import", "export.jsonl", "--file", "other.db"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "imported 3 memories (0 already known)\n"),
        "{}",
        out.stderr
    );
    let found = db.archon(&[
        "memory",
        "search",
        "deploy",
        "--namespace",
        "keeper",
        "--json",
    ]);
    let found: Json = serde_json::from_str(&found.stdout).expect("json");
    let id = found[0]["id"].as_i64().expect("an id").to_string();
    assert_eq!(found[0]["content"], "The team deploys on Thursdays");
    let out = db.archon(&["memory", "forget", &id, "--reason", "moved"]);
    assert_eq!(
        (out.code, out.stdout),
        (0, format!("forgot memory {id}\n")),
        "{}",
        out.stderr
    );
    let out = db.archon(&[
        "memory",
        "search",
        "deploy",
        "--namespace",
        "keeper",
        "--json",
    ]);
    assert_eq!(out.stdout.trim(), "[]");
    // The copy in the other file is not forgotten.
    let out = db.archon(&[
        "memory",
        "search",
        "deploy",
        "--namespace",
        "keeper",
        "--file",
        "other.db",
        "--json",
    ]);
    let found: Json = serde_json::from_str(&out.stdout).expect("json");
    assert_eq!(found[0]["content"], "The team deploys on Thursdays");
}
