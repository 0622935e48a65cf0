//! Step-result caching (`cache:` on a step): a cached step does not run again, a changed call misses,
//! an expired entry misses, `--no-cache` and `retry --from` run the step afresh, a rule that asks keeps a
//! step out of the cache, `show` and `cache ls` mark and list what was reused, and an LLM step served from
//! the cache does not call its model. Executions are counted by the lines a command appends to a file.

use std::path::Path;

use rusqlite::Connection;
use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::{Output, archon, archon_with};

/// A declared command (not sensitive: `cache: true` is allowed) and an `exec` call (sensitive: it needs
/// an explicit key), each appending a line to `count` when it runs.
const COUNTED: &str = r#"name: counted
tools:
  count:
    description: appends its word to `count` and prints it
    command: ["sh", "-c", "echo {{ word }} >> count; echo {{ word }}"]
    parameters:
      type: object
      properties: { word: { type: string } }
      required: [word]
steps:
  - id: greet
    tool: count
    with: { word: hello }
    cache: true
  - id: stamp
    needs: [greet]
    tool: exec
    with: { argv: ["sh", "-c", "echo stamp >> count; echo stamped"] }
    cache: { key: "stamp-v1", ttl: 7d }
  - id: after
    tool: echo
    with: { text: "{{ steps.greet.output }}" }
"#;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write");
}

fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = archon(dir, args);
    assert_eq!(out.code, 0, "{args:?}: {}{}", out.stdout, out.stderr);
    out
}

/// The lines the commands appended, in order.
fn count(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("count"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The JSON report of `archon ARGS`, which must succeed.
fn report_of(dir: &Path, args: &[&str]) -> Json {
    serde_json::from_str(&ok(dir, args).stdout).expect("report")
}

/// The steps `archon cache ls` lists, newest first.
fn cached_steps(dir: &Path) -> Vec<String> {
    serde_json::from_str::<Json>(&ok(dir, &["cache", "ls", "--json"]).stdout)
        .expect("JSON")
        .as_array()
        .expect("list")
        .iter()
        .map(|e| e["step"].as_str().expect("step").to_owned())
        .collect()
}

fn newest_run(dir: &Path) -> String {
    let runs: Json = serde_json::from_str(&ok(dir, &["runs", "--json"]).stdout).expect("JSON");
    runs[0]["id"].as_str().expect("id").to_owned()
}

/// The progress lines of a run, without durations.
fn progress(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter(|l| !l.starts_with("run "))
        .map(|l| match l.find(" (") {
            Some(at) if !l.starts_with("cached") => l[..at].to_owned(),
            _ => l.to_owned(),
        })
        .collect()
}

macro_rules! scrubbed {
    ($name:expr, $text:expr) => {
        insta::with_settings!({filters => vec![
            // Run ids are `r` and hex digits, as many as the time, the process id and a random part take.
            (r"\br[0-9a-f]{12,32}\b", "[RUN]"),
            // Columns are as wide as their widest cell, which a run id's length changes.
            (r"  +", "  "),
            (r"\b[0-9a-f]{12}\b", "[KEY]"),
            (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "[TIME]"),
            (r#""(created_at|expires_at|at_ms)": \d+"#, "\"$1\": [MS]"),
            (r#""key": "[0-9a-f]{64}""#, "\"key\": \"[SHA-256]\""),
        ]}, {
            insta::assert_snapshot!($name, $text);
        });
    };
}

#[test]
fn a_cached_step_does_not_run_again_and_no_cache_runs_it() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp"]);
    let first = newest_run(dir.path());

    let again = ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp"], "nothing ran again");
    let cached: Vec<String> = progress(&again.stderr)
        .into_iter()
        .filter(|l| l.starts_with("cached"))
        .collect();
    assert_eq!(
        cached,
        [
            format!("cached    greet (result of `greet` in run {first})"),
            format!("cached    stamp (result of `stamp` in run {first})"),
        ]
    );
    // The step that reads a cached step's output sees it as the first run made it.
    let report = report_of(dir.path(), &["run", "counted.yaml", "--json"]);
    assert_eq!(
        report["steps"]["after"]["output"],
        json!({ "text": "hello" })
    );
    assert_eq!(report["steps"]["greet"]["cached"]["run"], json!(first));
    assert_eq!(report["steps"]["greet"]["attempts"], json!(0));
    assert_eq!(count(dir.path()), ["hello", "stamp"]);

    ok(dir.path(), &["run", "counted.yaml", "--no-cache"]);
    assert_eq!(count(dir.path()), ["hello", "stamp", "hello", "stamp"]);
    // The fresh results replaced the entries: the next run reuses them, from the `--no-cache` run.
    let refreshed = newest_run(dir.path());
    let report = report_of(dir.path(), &["run", "counted.yaml", "--json"]);
    assert_eq!(report["steps"]["greet"]["cached"]["run"], json!(refreshed));
    assert_eq!(count(dir.path()).len(), 4);
}

#[test]
fn a_changed_argument_or_tool_definition_misses() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp"]);

    write(
        dir.path(),
        "counted.yaml",
        &COUNTED.replace("word: hello", "word: howdy"),
    );
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp", "howdy"]);

    // The same arguments, a tool that does something else: its definition is part of the key.
    let changed = COUNTED
        .replace("word: hello", "word: howdy")
        .replace("echo {{ word }}\"]", "echo {{ word }}!\"]");
    write(dir.path(), "counted.yaml", &changed);
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp", "howdy", "howdy"]);

    // The explicit key says when `stamp` gives the same result: a new key runs it again.
    write(
        dir.path(),
        "counted.yaml",
        &changed.replace("stamp-v1", "stamp-v2"),
    );
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(
        count(dir.path()),
        ["hello", "stamp", "howdy", "howdy", "stamp"]
    );
    // Unchanged again: everything is reused.
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()).len(), 5);
}

#[test]
fn an_expired_entry_misses_and_clear_expired_removes_only_expired_ones() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    let ls: Json =
        serde_json::from_str(&ok(dir.path(), &["cache", "ls", "--json"]).stdout).expect("JSON");
    let stamp = ls
        .as_array()
        .expect("list")
        .iter()
        .find(|e| e["step"] == "stamp")
        .expect("stamp is cached");
    // `ttl: 7d`.
    assert_eq!(
        stamp["expires_at"].as_u64().expect("expires") - stamp["created_at"].as_u64().expect("at"),
        7 * 24 * 3600 * 1000
    );
    // Seven days pass: the entry's expiry is moved into the past rather than waited for.
    let db = Connection::open(dir.path().join(".archon/state.db")).expect("db");
    db.execute("UPDATE cache SET expires_at = 1 WHERE step = 'stamp'", [])
        .expect("update");
    drop(db);
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(
        count(dir.path()),
        ["hello", "stamp", "stamp"],
        "only the expired step ran"
    );

    let db = Connection::open(dir.path().join(".archon/state.db")).expect("db");
    db.execute("UPDATE cache SET expires_at = 1 WHERE step = 'stamp'", [])
        .expect("update");
    drop(db);
    let cleared = ok(dir.path(), &["cache", "clear", "--expired"]);
    assert_eq!(cleared.stdout, "removed 1 cached result\n");
    let steps: Vec<String> = cached_steps(dir.path());
    assert_eq!(steps, ["greet"]);
}

#[test]
fn cache_ls_and_clear_list_and_remove_entries() {
    let dir = TempDir::new().expect("tempdir");
    let empty = ok(dir.path(), &["cache", "ls"]);
    assert_eq!(empty.stdout, "no cached results in `.archon`\n");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    let mut ls = ok(dir.path(), &["cache", "ls"]).stdout;
    // Entries made in the same millisecond are listed by key: sorted here, so the snapshot holds.
    let mut lines: Vec<&str> = ls.lines().collect();
    lines[1..].sort_by_key(|l| l.split_whitespace().nth(2).unwrap_or_default().to_owned());
    ls = lines.join("\n") + "\n";
    scrubbed!("cache_ls", ls);
    let json: Json =
        serde_json::from_str(&ok(dir.path(), &["cache", "ls", "--json"]).stdout).expect("JSON");
    let mut entries = json.as_array().expect("list").clone();
    entries.sort_by_key(|e| e["step"].as_str().unwrap_or_default().to_owned());
    scrubbed!(
        "cache_ls_json",
        serde_json::to_string_pretty(&entries).expect("JSON")
    );

    let cleared = ok(
        dir.path(),
        &["cache", "clear", "--workflow", "counted", "--step", "greet"],
    );
    assert_eq!(cleared.stdout, "removed 1 cached result\n");
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp", "hello"]);
    let cleared = ok(dir.path(), &["cache", "clear", "--workflow", "other"]);
    assert_eq!(cleared.stdout, "removed 0 cached results\n");
    let cleared = ok(dir.path(), &["cache", "clear"]);
    assert_eq!(cleared.stdout, "removed 2 cached results\n");
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()).len(), 5);
}

#[test]
fn show_marks_cached_steps_in_text_and_json() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    ok(dir.path(), &["run", "counted.yaml"]);
    let run = newest_run(dir.path());
    let text = ok(dir.path(), &["show", &run]).stdout;
    let table: String = text
        .lines()
        .skip_while(|l| !l.starts_with("STEP"))
        .map(|l| format!("{l}\n"))
        .collect();
    scrubbed!("show_cached", table);
    let shown: Json =
        serde_json::from_str(&ok(dir.path(), &["show", &run, "--json"]).stdout).expect("JSON");
    let marks: serde_json::Map<String, Json> = shown["results"]
        .as_object()
        .expect("results")
        .iter()
        .map(|(step, r)| (step.clone(), r["cached"].clone()))
        .collect();
    scrubbed!(
        "show_cached_json",
        serde_json::to_string_pretty(&marks).expect("JSON")
    );
    let events = ok(dir.path(), &["show", &run, "--events"]).stdout;
    let cached: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("cached"))
        .map(|l| l.split_once("cached").expect("cached").1.trim())
        .collect();
    // A cached step says only that, as a step a resume reuses does.
    let greet: Vec<&str> = events
        .lines()
        .filter(|l| l.contains(" greet"))
        .map(|l| l.split_whitespace().nth(1).expect("a label"))
        .collect();
    assert_eq!(greet, ["cached"], "{events}");
    let first = run_ids_oldest_first(dir.path()).remove(0);
    assert_eq!(
        cached,
        [
            format!("greet (result of `greet` in run {first})"),
            format!("stamp (result of `stamp` in run {first})"),
        ]
    );
}

fn run_ids_oldest_first(dir: &Path) -> Vec<String> {
    let runs: Json = serde_json::from_str(&ok(dir, &["runs", "--json"]).stdout).expect("JSON");
    let mut ids: Vec<String> = runs
        .as_array()
        .expect("list")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_owned())
        .collect();
    ids.reverse();
    ids
}

#[test]
fn foreach_items_are_cached_one_by_one() {
    let dir = TempDir::new().expect("tempdir");
    let spec = |items: &str| {
        COUNTED.replace(
            "  - id: greet\n    tool: count\n    with: { word: hello }\n",
            &format!("  - id: greet\n    foreach: \"{items}\"\n    max_parallel: 1\n    tool: count\n    with: {{ word: \"{{{{ item }}}}\" }}\n"),
        )
        .replace("{{ steps.greet.output }}", "{{ steps.greet.output | length }}")
    };
    write(dir.path(), "counted.yaml", &spec("['a', 'b']"));
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["a", "b", "stamp"]);
    // A new item runs; the others, wherever they are in the list now, are reused.
    write(dir.path(), "counted.yaml", &spec("['c', 'b', 'a']"));
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["a", "b", "stamp", "c"]);
    let run = newest_run(dir.path());
    let text = ok(dir.path(), &["show", &run]).stdout;
    let greet = text
        .lines()
        .find(|l| l.starts_with("greet"))
        .expect("greet row");
    assert_eq!(
        greet.split_whitespace().collect::<Vec<_>>(),
        [
            "greet",
            "succeeded",
            "(2",
            "of",
            "3",
            "items",
            "cached)",
            "1"
        ]
    );
}

#[test]
fn retry_from_runs_the_step_afresh() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    ok(dir.path(), &["run", "counted.yaml"]);
    let run = newest_run(dir.path());
    assert_eq!(count(dir.path()), ["hello", "stamp"]);
    ok(dir.path(), &["retry", &run, "--from", "stamp"]);
    assert_eq!(count(dir.path()), ["hello", "stamp", "stamp"]);
    // `greet` is upstream of `stamp`: it kept its cached result.
    let shown: Json =
        serde_json::from_str(&ok(dir.path(), &["show", &run, "--json"]).stdout).expect("JSON");
    assert_eq!(shown["results"]["stamp"]["cached"], Json::Null);
    assert!(shown["results"]["greet"]["cached"].is_object());
    // The fresh result replaced the entry: the next run reuses the retried run's.
    let report = report_of(dir.path(), &["run", "counted.yaml", "--json"]);
    assert_eq!(report["steps"]["stamp"]["cached"]["run"], json!(run));
    assert_eq!(count(dir.path()).len(), 3);
}

#[test]
fn a_call_a_rule_asks_about_is_never_served_from_the_cache() {
    let dir = TempDir::new().expect("tempdir");
    let spec = format!(
        "{COUNTED}rules:\n  - {{ name: check, on: before_tool, match: {{ tool: count }}, action: ask }}\n"
    );
    write(dir.path(), "counted.yaml", &spec);
    ok(dir.path(), &["run", "counted.yaml", "--yes"]);
    ok(dir.path(), &["run", "counted.yaml", "--yes"]);
    // `greet` was asked about and ran both times; `stamp`, which no rule asks about, ran once.
    assert_eq!(count(dir.path()), ["hello", "stamp", "hello"]);
    let steps: Vec<String> = cached_steps(dir.path());
    assert_eq!(steps, ["stamp"]);
}

#[test]
fn a_result_holding_a_secret_is_not_cached_so_later_steps_read_the_value_every_run() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "s.yaml",
        r#"name: s
secrets: [TOK]
env: { TOK: "{{ secrets.TOK }}" }
steps:
  - id: get
    tool: exec
    with: { argv: ["sh", "-c", "echo get >> count; echo token=$TOK"], env: { TOK: "{{ env.TOK }}" } }
    cache: { key: v1 }
  - id: use
    tool: write_file
    with: { path: out.txt, content: "{{ steps.get.output }}" }
"#,
    );
    for _ in 0..2 {
        let out = archon_with(dir.path(), &["run", "s.yaml"], &[("TOK", "abc123")]);
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        let written = std::fs::read_to_string(dir.path().join("out.txt")).expect("out.txt");
        assert_eq!(written.trim_end(), "token=abc123");
    }
    assert_eq!(
        count(dir.path()),
        ["get", "get"],
        "nothing was served from the cache"
    );
    let db = Connection::open(dir.path().join(".archon/state.db")).expect("db");
    let rows: i64 = db
        .query_row("SELECT count(*) FROM cache", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, 0);
}

#[test]
fn a_secret_in_a_cached_calls_arguments_is_not_stored() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "secret.yaml",
        "name: secret\nsecrets: [TOKEN]\nsteps:\n  - id: call\n    tool: exec\n    with: { argv: [\"sh\", \"-c\", \"echo $T >> count; echo called\"], env: { T: \"{{ secrets.TOKEN }}\" } }\n    cache: { key: token-call }\n",
    );
    let token = "s3cr3t-value-42";
    for _ in 0..2 {
        let out = archon_with(
            dir.path(),
            &["run", "secret.yaml", "--json"],
            &[("TOKEN", token)],
        );
        assert_eq!(out.code, 0, "{}", out.stderr);
        let report: Json = serde_json::from_str(&out.stdout).expect("report");
        assert_eq!(report["steps"]["call"]["output"], json!("called"));
    }
    assert_eq!(
        count(dir.path()),
        [token],
        "the second run reused the first"
    );
    let db = Connection::open(dir.path().join(".archon/state.db")).expect("db");
    let rows: Vec<String> = db
        .prepare("SELECT key || workflow || step || source || result FROM cache")
        .expect("query")
        .query_map([], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].contains(token), "{}", rows[0]);
    assert!(!rows[0].contains("argv"), "{}", rows[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_llm_step_served_from_the_cache_does_not_call_its_model() {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(crate::support::chat_completion(json!({
            "role": "assistant", "content": "Paris"
        })))
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let spec = |goal: &str| {
        format!(
            "name: ask\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m }}\nsteps:\n  - {{ id: capital, goal: \"{goal}\", cache: true }}\n",
            server.uri()
        )
    };
    write(dir.path(), "ask.yaml", &spec("the capital of France?"));
    let run = |dir: std::path::PathBuf| async move {
        tokio::task::spawn_blocking(move || {
            let out = archon_with(
                &dir,
                &["run", "ask.yaml", "--json"],
                &[("OPENAI_API_KEY", "k")],
            );
            assert_eq!(out.code, 0, "{}", out.stderr);
            serde_json::from_str::<Json>(&out.stdout).expect("report")
        })
        .await
        .expect("ran")
    };
    let first = run(dir.path().to_path_buf()).await;
    assert_eq!(first["steps"]["capital"]["output"], json!("Paris"));
    assert_eq!(server.received_requests().await.expect("recorded").len(), 1);
    let second = run(dir.path().to_path_buf()).await;
    assert_eq!(second["steps"]["capital"]["output"], json!("Paris"));
    assert!(second["steps"]["capital"]["cached"].is_object());
    assert_eq!(
        server.received_requests().await.expect("recorded").len(),
        1,
        "the model was not called again"
    );
    // Another prompt is another call.
    write(dir.path(), "ask.yaml", &spec("the capital of Italy?"));
    let third = run(dir.path().to_path_buf()).await;
    assert_eq!(third["steps"]["capital"]["cached"], Json::Null);
    assert_eq!(server.received_requests().await.expect("recorded").len(), 2);
}

#[test]
fn a_cached_result_that_does_not_decode_is_reported_and_clear_removes_it() {
    let dir = TempDir::new().expect("tempdir");
    write(dir.path(), "counted.yaml", COUNTED);
    ok(dir.path(), &["run", "counted.yaml"]);
    let db = Connection::open(dir.path().join(".archon/state.db")).expect("db");
    db.execute("UPDATE cache SET result = '{' WHERE step = 'greet'", [])
        .expect("update");
    drop(db);
    let check = archon(dir.path(), &["runs", "--check"]);
    assert_eq!(check.code, 1, "{}", check.stdout);
    assert!(
        check.stderr.contains("cache row `") && check.stderr.contains("does not decode"),
        "{}",
        check.stderr
    );
    // A run does not take a damaged entry for a miss: it says so, and how to go on.
    let run = archon(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("hint: `archon cache clear` removes the cached results"),
        "{}",
        run.stderr
    );
    assert_eq!(count(dir.path()), ["hello", "stamp"], "nothing ran");
    ok(dir.path(), &["cache", "clear", "--step", "greet"]);
    ok(dir.path(), &["run", "counted.yaml"]);
    assert_eq!(count(dir.path()), ["hello", "stamp", "hello"]);
}

#[test]
fn a_sub_workflows_step_is_cached_and_a_fallbacks_result_is_not() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "sub.yaml",
        r#"name: sub
inputs:
  word: { type: string }
tools:
  count:
    command: ["sh", "-c", "echo {{ word }} >> count; echo {{ word }}"]
    parameters: { type: object, properties: { word: { type: string } } }
steps:
  - id: inner
    tool: count
    with: { word: "{{ inputs.word }}" }
    cache: true
outputs:
  said: "{{ steps.inner.output }}"
"#,
    );
    write(
        dir.path(),
        "parent.yaml",
        r#"name: parent
tools:
  maybe:
    command: ["sh", "-c", "echo {{ word }} >> count; test {{ word }} = saved"]
    parameters: { type: object, properties: { word: { type: string } } }
steps:
  - id: call
    workflow: sub.yaml
    with: { word: hi }
  - id: flaky
    needs: [call]
    tool: maybe
    with: { word: first }
    cache: true
    fallback:
      tool: maybe
      with: { word: saved }
"#,
    );
    ok(dir.path(), &["run", "parent.yaml"]);
    assert_eq!(count(dir.path()), ["hi", "first", "saved"]);
    let again = ok(dir.path(), &["run", "parent.yaml", "--json"]);
    // The sub-workflow's step is reused; the step its fallback saved runs again, body first.
    assert_eq!(
        count(dir.path()),
        ["hi", "first", "saved", "first", "saved"]
    );
    let report: Json = serde_json::from_str(&again.stdout).expect("report");
    assert!(report["steps"]["call"]["steps"]["inner"]["cached"].is_object());
    assert_eq!(report["steps"]["call"]["output"], json!({ "said": "hi" }));
    assert_eq!(report["steps"]["flaky"]["cached"], Json::Null);
    let steps: Vec<String> =
        serde_json::from_str::<Json>(&ok(dir.path(), &["cache", "ls", "--json"]).stdout)
            .expect("JSON")
            .as_array()
            .expect("list")
            .iter()
            .map(|e| {
                format!(
                    "{} {}",
                    e["workflow"].as_str().expect("w"),
                    e["source"].as_str().expect("s")
                )
            })
            .collect();
    assert_eq!(steps, ["sub call/inner"]);
}

/// A cached result kept apart (over 64 KiB) shares its blob with the run that produced it: pruning that
/// run leaves the blob to the cache entry, which the next run reuses whole.
#[test]
fn pruning_the_run_that_produced_a_cached_result_keeps_the_result() {
    let dir = TempDir::new().expect("tempdir");
    let dir = dir.path();
    write(
        dir,
        "big.yaml",
        "name: big\nsteps:\n  - id: make\n    tool: exec\n    with: { argv: [\"sh\", \"-c\", \"echo made >> count; head -c 100000 /dev/zero | tr '\\\\0' x\"] }\n    cache: { key: v1 }\noutputs:\n  size: \"{{ steps.make.output | length }}\"\n",
    );
    ok(dir, &["run", "big.yaml"]);
    ok(dir, &["prune", "--older-than", "0s"]);
    let again = ok(dir, &["run", "big.yaml", "--json"]);
    let report: Json = serde_json::from_str(&again.stdout).expect("report");
    assert_eq!(
        (
            count(dir),
            report["outputs"]["size"].clone(),
            report["steps"]["make"]["cached"].is_object()
        ),
        (vec!["made".to_owned()], json!(100000), true)
    );
}

/// `archon logs RUN STEP` of a step served from the cache names the run whose commands wrote its output.
#[test]
fn logs_of_a_cached_step_name_the_run_that_wrote_them() {
    let dir = TempDir::new().expect("tempdir");
    let dir = dir.path();
    write(dir, "counted.yaml", COUNTED);
    ok(dir, &["run", "counted.yaml"]);
    let first = newest_run(dir);
    ok(dir, &["run", "counted.yaml"]);
    let logs = ok(dir, &["logs", "--last", "greet"]);
    assert_eq!(
        (logs.stdout.as_str(), logs.stderr.replace(&first, "[FIRST]")),
        (
            "",
            "note: `greet` was served from the cache: run `[FIRST]` wrote it (`archon logs [FIRST] greet`)\n"
                .to_owned()
        )
    );
    assert_eq!(ok(dir, &["logs", &first, "greet"]).stdout, "hello\n");
}

#[test]
fn logs_of_a_run_name_the_runs_that_wrote_its_cached_steps() {
    let dir = TempDir::new().expect("tempdir");
    let dir = dir.path();
    write(dir, "counted.yaml", COUNTED);
    ok(dir, &["run", "counted.yaml"]);
    let first = newest_run(dir);
    ok(dir, &["run", "counted.yaml"]);
    let second = newest_run(dir);
    // `greet` and `stamp` were served from the cache; `after` ran, and is a built-in: no command wrote.
    let logs = ok(dir, &["logs", "--last"]);
    assert_eq!(
        (
            logs.stdout.as_str(),
            logs.stderr
                .replace(&first, "[FIRST]")
                .replace(&second, "[SECOND]")
        ),
        (
            "",
            "note: no command of any step of run `[SECOND]` wrote anything\n\
             note: `greet` was served from the cache: run `[FIRST]` wrote it (`archon logs [FIRST] greet`)\n\
             note: `stamp` was served from the cache: run `[FIRST]` wrote it (`archon logs [FIRST] stamp`)\n"
                .to_owned()
        )
    );
    // A run whose every step was served from the cache.
    write(
        dir,
        "all.yaml",
        "name: all\nsteps:\n  - id: only\n    tool: exec\n    with: { argv: [\"echo\", \"hi\"] }\n    cache: { key: only }\n",
    );
    ok(dir, &["run", "all.yaml"]);
    let first = newest_run(dir);
    assert_eq!(ok(dir, &["logs", "--last"]).stdout, "hi\n");
    ok(dir, &["run", "all.yaml"]);
    let logs = ok(dir, &["logs", "--last"]);
    assert_eq!(
        (logs.stdout.as_str(), logs.stderr.replace(&first, "[FIRST]")),
        (
            "",
            "note: `only` was served from the cache: run `[FIRST]` wrote it (`archon logs [FIRST] only`)\n"
                .to_owned()
        )
    );
}

#[test]
fn a_large_result_is_cached_apart_and_read_back_whole() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "large.yaml",
        r#"name: large
tools:
  big:
    command: ["sh", "-c", "echo run >> count; head -c 100000 /dev/zero | tr '\\0' a"]
steps:
  - id: make
    tool: big
    cache: true
  - id: size
    tool: echo
    with: { length: "{{ steps.make.output | length }}" }
"#,
    );
    let first: Json =
        serde_json::from_str(&ok(dir.path(), &["run", "large.yaml", "--json"]).stdout)
            .expect("report");
    let second: Json =
        serde_json::from_str(&ok(dir.path(), &["run", "large.yaml", "--json"]).stdout)
            .expect("report");
    assert_eq!(count(dir.path()), ["run"]);
    assert!(second["steps"]["make"]["cached"].is_object());
    assert_eq!(
        second["steps"]["make"]["output"],
        first["steps"]["make"]["output"]
    );
    assert_eq!(
        second["steps"]["size"]["output"],
        json!({ "length": 100000 })
    );
    // Kept in `blobs`, as a run's large results are.
    let db = Connection::open(dir.path().join(".archon/state.db")).expect("db");
    let apart: bool = db
        .query_row("SELECT output_blob IS NOT NULL FROM cache", [], |r| {
            r.get(0)
        })
        .expect("one entry");
    assert!(apart);
}

#[test]
fn a_fallback_cannot_say_cache() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "fallback.yaml",
        "name: fb\nsteps:\n  - id: a\n    tool: echo\n    with: { v: 1 }\n    fallback: { tool: echo, with: { v: 2 }, cache: true }\n",
    );
    let out = archon(dir.path(), &["validate", "fallback.yaml"]);
    assert_eq!(out.code, 2);
    let first = out.stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("error[archon::unknown_key]: unknown key `cache`"),
        "{}",
        out.stdout
    );
}

#[test]
fn retry_from_runs_the_cached_steps_of_the_sub_workflows_and_composite_tools_it_calls_afresh() {
    let dir = TempDir::new().expect("tempdir");
    write(
        dir.path(),
        "sub.yaml",
        r#"name: sub
inputs:
  word: { type: string }
steps:
  - id: inner
    tool: exec
    with: { argv: ["sh", "-c", "echo {{ inputs.word }} >> count; echo {{ inputs.word }}"] }
    cache: { key: "{{ inputs.word }}" }
"#,
    );
    write(
        dir.path(),
        "parent.yaml",
        r#"name: parent
tools:
  wrap:
    description: calls the sub-workflow
    parameters: { type: object, properties: { word: { type: string } } }
    steps:
      - id: w
        workflow: sub.yaml
        with: { word: "{{ args.word }}" }
    result: "{{ steps.w.output }}"
steps:
  - id: direct
    workflow: sub.yaml
    with: { word: direct }
  - id: composite
    tool: wrap
    with: { word: composite }
"#,
    );
    ok(dir.path(), &["run", "parent.yaml"]);
    let second = ok(dir.path(), &["run", "parent.yaml"]);
    // The first run's two steps run at once, so they append in either order.
    let mut first = count(dir.path());
    first.sort();
    assert_eq!(first, ["composite", "direct"], "{}", second.stderr);
    let retried = ok(dir.path(), &["retry", "--last", "--from", "direct"]);
    assert_eq!(count(dir.path())[2..], ["direct"], "{}", retried.stderr);
    let retried = ok(dir.path(), &["retry", "--last", "--from", "composite"]);
    assert_eq!(
        count(dir.path())[2..],
        ["direct", "composite"],
        "{}",
        retried.stderr
    );
}
