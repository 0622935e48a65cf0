//! Issue 18: agents that delegate to agents, against a scripted provider per agent: the delegation tree,
//! its guards (the chain, depth, count) and its one budget, parallel delegations, handoff, output
//! contracts and rules; and, through the real binary, approvals inside a delegate and a kill during one.

use std::path::Path;

use archon_engine::run::{RunEvent, RunReport, StepResult, StepStatus};
use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::agent::run_agent;

/// The agent events of a run as `(step label, what)`, in order.
pub(crate) fn trail(events: &[RunEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentAction {
                step,
                tool,
                arguments,
                ..
            } => Some((step.clone(), format!("action {tool} {arguments}"))),
            RunEvent::AgentObservation {
                step,
                tool,
                text,
                error,
                ..
            } => Some((
                step.clone(),
                format!(
                    "observed {tool}{}: {text}",
                    if *error { " (error)" } else { "" }
                ),
            )),
            RunEvent::AgentAnswer { step, text, .. } => {
                Some((step.clone(), format!("answer {text}")))
            }
            _ => None,
        })
        .collect()
}

pub(crate) fn pairs(trail: &[(String, String)]) -> Vec<(&str, &str)> {
    trail
        .iter()
        .map(|(s, t)| (s.as_str(), t.as_str()))
        .collect()
}

/// The nested results of `result`, as `name: status` lines, depth first, indented by depth.
pub(crate) fn tree(result: &StepResult) -> Vec<String> {
    fn walk(result: &StepResult, depth: usize, lines: &mut Vec<String>) {
        for (name, nested) in &result.steps {
            lines.push(format!(
                "{}{name}: {} {}",
                "  ".repeat(depth),
                nested.status.as_str(),
                nested.error.as_deref().unwrap_or(&nested.text)
            ));
            walk(nested, depth + 1, lines);
        }
    }
    let mut lines = Vec::new();
    walk(result, 0, &mut lines);
    lines
}

pub(crate) async fn run(dir: &Path, yaml: &str) -> (RunReport, Vec<RunEvent>) {
    run_agent(dir, yaml).await
}

#[tokio::test]
async fn a_two_level_delegation_answers_through_its_delegates() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: quiz
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__researcher, arguments: { task: find the capital of France, context: for a quiz } }]
        - text: The answer is Paris
    researcher_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__checker, arguments: { task: check that Paris is the capital of France } }]
        - text: Paris
    checker_model:
      kind: mock
      turns:
        - text: confirmed
agents:
  lead: { provider: lead_model, delegates: [researcher] }
  researcher: { provider: researcher_model, description: finds facts, delegates: [checker] }
  checker: { provider: checker_model, description: checks facts }
steps:
  - { id: quiz, goal: answer the quiz, agent: lead }
"#;
    let (report, events) = run(dir.path(), yaml).await;
    let quiz = &report.steps["quiz"];
    assert_eq!(quiz.status, StepStatus::Succeeded, "{quiz:?}");
    assert_eq!(quiz.output, json!("The answer is Paris"));
    assert_eq!(
        tree(quiz),
        [
            "researcher#1.1: succeeded Paris",
            "  checker#1.1: succeeded confirmed"
        ]
    );
    assert_eq!(
        pairs(&trail(&events)),
        [
            (
                "quiz",
                r#"action delegate.researcher {"task":"find the capital of France","context":"for a quiz"}"#
            ),
            (
                "quiz/researcher#1.1",
                r#"action delegate.checker {"task":"check that Paris is the capital of France"}"#
            ),
            ("quiz/researcher#1.1/checker#1.1", "answer confirmed"),
            (
                "quiz/researcher#1.1",
                "observed delegate.checker: confirmed"
            ),
            ("quiz/researcher#1.1", "answer Paris"),
            ("quiz", "observed delegate.researcher: Paris"),
            ("quiz", "answer The answer is Paris"),
        ]
    );
    // The step's usage counts its delegates' calls: 2 of its own, 2 of the researcher, 1 of the checker.
    let calls = |r: &StepResult| r.llm.as_ref().map(|l| l.calls);
    let researcher = &quiz.steps["researcher#1.1"];
    assert_eq!(
        (
            calls(quiz),
            calls(researcher),
            calls(&researcher.steps["checker#1.1"])
        ),
        (Some(5), Some(3), Some(1))
    );
    assert_eq!(report.llm.as_ref().map(|l| l.calls), Some(5));
}

#[tokio::test]
async fn a_delegation_back_to_an_agent_on_the_chain_is_refused_at_the_first_reentry() {
    let dir = TempDir::new().expect("tempdir");
    // The bounce of crewAI#6414: a asks b, and b asks a the same thing back.
    let yaml = r#"name: bounce
llm:
  providers:
    a_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__b, arguments: { task: write the summary } }]
        - text: I wrote it myself
    b_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__a, arguments: { task: write the summary } }]
        - text: b could not hand it back
agents:
  a: { provider: a_model, delegates: [b] }
  b: { provider: b_model, delegates: [a] }
steps:
  - { id: summary, goal: write the summary, agent: a }
"#;
    let (report, events) = run(dir.path(), yaml).await;
    let summary = &report.steps["summary"];
    assert_eq!(summary.status, StepStatus::Succeeded, "{summary:?}");
    assert_eq!(summary.output, json!("I wrote it myself"));
    assert_eq!(
        pairs(&trail(&events)),
        [
            (
                "summary",
                r#"action delegate.b {"task":"write the summary"}"#
            ),
            (
                "summary/b#1.1",
                r#"action delegate.a {"task":"write the summary"}"#
            ),
            (
                "summary/b#1.1",
                "observed delegate.a (error): this delegation was not made: `a` is already working on this task (chain `a → b → a`); do the work yourself or ask another agent"
            ),
            ("summary/b#1.1", "answer b could not hand it back"),
            ("summary", "observed delegate.b: b could not hand it back"),
            ("summary", "answer I wrote it myself"),
        ]
    );
    assert_eq!(tree(summary), ["b#1.1: succeeded b could not hand it back"]);
}

#[tokio::test]
async fn a_delegate_that_spends_the_steps_budget_ends_the_step() {
    let dir = TempDir::new().expect("tempdir");
    // The step has 4 model turns in all: the lead takes one, and its delegate would take more.
    let yaml = r#"name: budget
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__worker, arguments: { task: count to ten } }]
    worker_model:
      kind: mock
      turns:
        - tool_calls: [{ name: calculator, arguments: { expression: "1 + 1" } }]
        - tool_calls: [{ name: calculator, arguments: { expression: "2 + 1" } }]
        - tool_calls: [{ name: calculator, arguments: { expression: "3 + 1" } }]
        - tool_calls: [{ name: calculator, arguments: { expression: "4 + 1" } }]
agents:
  lead: { provider: lead_model, delegates: [worker] }
  worker: { provider: worker_model, tools: [calculator], max_iterations: 10 }
steps:
  - { id: count, goal: count to ten, agent: lead, max_iterations: 4 }
"#;
    let (report, _) = run(dir.path(), yaml).await;
    let count = &report.steps["count"];
    assert_eq!(count.status, StepStatus::Incomplete, "{count:?}");
    assert_eq!(
        count.error.as_deref(),
        Some(
            "the step's budget of 4 model turns ran out in `worker` (chain `lead → worker`; turns: lead 1, worker 3)\n  hint: raise the step's `max_iterations`: its delegates spend the same budget"
        )
    );
    assert_eq!(
        tree(count),
        [
            "worker#1.1: incomplete the step's budget of 4 model turns ran out in `worker` (chain `lead → worker`; turns: lead 1, worker 3)\n  hint: raise the step's `max_iterations`: its delegates spend the same budget"
        ]
    );
    assert_eq!(count.llm.as_ref().map(|l| l.calls), Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegations_of_one_turn_run_at_the_same_time() {
    let dir = TempDir::new().expect("tempdir");
    // Each delegate's tool arrives at a meeting point and waits there for the other one (10 s at most):
    // both answer `met` only when the two delegations run at the same time.
    let meet = |me: &str, other: &str| {
        format!(
            r#"["sh", "-c", "touch {me}.here; for i in $(seq 500); do test -e {other}.here && echo met && exit 0; sleep 0.02; done; echo alone; exit 1"]"#
        )
    };
    let yaml = format!(
        r#"name: parallel
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls:
            - {{ name: delegate__left, arguments: {{ task: go to the meeting point }} }}
            - {{ name: delegate__right, arguments: {{ task: go to the meeting point }} }}
        - text: both met
    left_model:
      kind: mock
      turns:
        - tool_calls: [{{ name: meet_left }}]
        - text: left met
    right_model:
      kind: mock
      turns:
        - tool_calls: [{{ name: meet_right }}]
        - text: right met
tools:
  meet_left: {{ command: {left}, parameters: {{ type: object, properties: {{}} }} }}
  meet_right: {{ command: {right}, parameters: {{ type: object, properties: {{}} }} }}
agents:
  lead: {{ provider: lead_model, delegates: [left, right] }}
  left: {{ provider: left_model, tools: [meet_left] }}
  right: {{ provider: right_model, tools: [meet_right] }}
steps:
  - {{ id: meeting, goal: meet, agent: lead }}
"#,
        left = meet("left", "right"),
        right = meet("right", "left"),
    );
    let (report, events) = run(dir.path(), &yaml).await;
    let meeting = &report.steps["meeting"];
    assert_eq!(meeting.status, StepStatus::Succeeded, "{meeting:?}");
    assert_eq!(
        tree(meeting),
        [
            "left#1.1: succeeded left met",
            "right#1.2: succeeded right met"
        ]
    );
    let trail = trail(&events);
    let mut met: Vec<(&str, &str)> = pairs(&trail)
        .into_iter()
        .filter(|(_, what)| what.starts_with("observed meet"))
        .collect();
    met.sort_unstable();
    assert_eq!(
        met,
        [
            ("meeting/left#1.1", "observed meet_left: met\n"),
            ("meeting/right#1.2", "observed meet_right: met\n")
        ]
    );
}

#[tokio::test]
async fn a_handoff_makes_the_delegates_answer_the_steps() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: handoff
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__writer, arguments: { task: write the release title } }]
        - text: the lead is never asked again
    writer_model:
      kind: mock
      turns:
        - text: "not JSON"
        - text: '{"title": "Archon 2.0"}'
agents:
  lead: { provider: lead_model, delegates: [{ agent: writer, handoff: true }] }
  writer: { provider: writer_model, description: writes titles }
steps:
  - id: title
    goal: write the release title
    agent: lead
    output_schema: { type: object, properties: { title: { type: string } }, required: [title] }
"#;
    let (report, events) = run(dir.path(), yaml).await;
    let title = &report.steps["title"];
    assert_eq!(title.status, StepStatus::Succeeded, "{title:?}");
    assert_eq!(title.output, json!({ "title": "Archon 2.0" }));
    // The writer's first answer did not match the step's schema: it answered again.
    let rejected: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::AgentAnswerRejected { step, .. } => Some(step.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(rejected, ["title/writer#1.1"]);
    assert_eq!(
        pairs(&trail(&events))
            .into_iter()
            .filter(|(step, _)| *step == "title")
            .collect::<Vec<_>>(),
        [
            (
                "title",
                r#"action delegate.writer {"task":"write the release title"}"#
            ),
            (
                "title",
                r#"observed delegate.writer: {"title":"Archon 2.0"}"#
            ),
            ("title", r#"answer {"title":"Archon 2.0"}"#),
        ]
    );
    assert_eq!(title.llm.as_ref().map(|l| l.calls), Some(3));
}

#[tokio::test]
async fn a_delegates_answer_must_match_its_output_schema_before_it_returns() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: contract
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__counter, arguments: { task: count the open issues } }]
        - text: there are 3
    counter_model:
      kind: mock
      turns:
        - text: quite a few
        - text: "3"
agents:
  lead: { provider: lead_model, delegates: [{ agent: counter, output_schema: { type: integer, minimum: 0 } }] }
  counter: { provider: counter_model }
steps:
  - { id: issues, goal: how many issues are open, agent: lead }
"#;
    let (report, events) = run(dir.path(), yaml).await;
    let issues = &report.steps["issues"];
    assert_eq!(issues.status, StepStatus::Succeeded, "{issues:?}");
    assert_eq!(issues.steps["counter#1.1"].output, json!(3));
    assert_eq!(
        pairs(&trail(&events))
            .into_iter()
            .filter(|(step, _)| *step == "issues")
            .collect::<Vec<_>>(),
        [
            (
                "issues",
                r#"action delegate.counter {"task":"count the open issues"}"#
            ),
            ("issues", "observed delegate.counter: 3"),
            ("issues", "answer there are 3"),
        ]
    );
}

#[tokio::test]
async fn rules_limits_and_depth_bound_what_an_agent_may_delegate() {
    let dir = TempDir::new().expect("tempdir");
    // The lead may delegate once in all; a rule keeps it from asking `auditor`; and the researcher, one
    // level down, is on the last level: it is not offered its own delegate.
    let yaml = r#"name: bounded
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__auditor, arguments: { task: audit the books } }]
        - tool_calls: [{ name: delegate__researcher, arguments: { task: find the books } }]
        - tool_calls: [{ name: delegate__researcher, arguments: { task: find more books } }]
        - text: done with what I have
    researcher_model:
      kind: mock
      turns:
        - tool_calls: [{ name: delegate__auditor, arguments: { task: audit them } }]
        - text: found two books
    auditor_model: { kind: mock, turns: [{ text: audited }] }
agents:
  lead: { provider: lead_model, delegates: [researcher, auditor] }
  researcher: { provider: researcher_model, delegates: [auditor] }
  auditor: { provider: auditor_model }
defaults: { max_delegation_depth: 1, max_delegations: 1 }
rules:
  - { name: no-audits, on: before_tool, match: { tool: delegate.auditor, agent: lead }, action: deny, reason: audits need a person }
steps:
  - { id: books, goal: find the books, agent: lead }
"#;
    let (report, events) = run(dir.path(), yaml).await;
    let books = &report.steps["books"];
    assert_eq!(books.status, StepStatus::Succeeded, "{books:?}");
    assert_eq!(books.output, json!("done with what I have"));
    let trail = trail(&events);
    let observed: Vec<(&str, &str)> = pairs(&trail)
        .into_iter()
        .filter(|(_, what)| what.starts_with("observed"))
        .collect();
    assert_eq!(
        observed,
        [
            (
                "books",
                "observed delegate.auditor (error): this call was not made: denied by rule `no-audits`: audits need a person"
            ),
            (
                "books/researcher#2.1",
                "observed delegate__auditor (error): unknown tool `delegate__auditor`; you have no tools: give your final answer"
            ),
            ("books", "observed delegate.researcher: found two books"),
            (
                "books",
                "observed delegate.researcher (error): this delegation was not made: the step has made the 1 delegations `defaults.max_delegations` allows; finish the task with what you have"
            ),
        ]
    );
    assert_eq!(tree(books), ["researcher#2.1: succeeded found two books"]);
}

/// An OpenAI-compatible answer: `text`, or a call of `tool` with `arguments`.
pub(crate) fn answer(text: Option<&str>, tool: Option<(&str, Json)>) -> Json {
    let message = match &tool {
        Some((name, arguments)) => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": format!("call_{name}"),
                "type": "function",
                "function": { "name": name, "arguments": arguments.to_string() }
            }]
        }),
        None => json!({ "role": "assistant", "content": text }),
    };
    json!({
        "id": "chatcmpl-delegation",
        "object": "chat.completion",
        "created": 1_763_900_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": if tool.is_some() { "tool_calls" } else { "stop" }
        }],
        "usage": { "prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132 }
    })
}

/// Mounts the answers of model `model`: the first whose text the request holds answers (`""` always does).
pub(crate) async fn script(server: &wiremock::MockServer, model: &str, answers: Vec<(&str, Json)>) {
    use wiremock::matchers::{body_string_contains, method};
    use wiremock::{Mock, ResponseTemplate};
    for (priority, (seen, body)) in (1u8..).zip(answers) {
        Mock::given(method("POST"))
            .and(body_string_contains(format!(r#""model":"{model}""#)))
            .and(body_string_contains(seen))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .with_priority(priority)
            .mount(server)
            .await;
    }
}

/// How many requests model `model` was sent.
pub(crate) async fn asked(server: &wiremock::MockServer, model: &str) -> usize {
    let marker = format!(r#""model":"{model}""#);
    server
        .received_requests()
        .await
        .expect("recorded")
        .iter()
        .filter(|r| String::from_utf8_lossy(&r.body).contains(&marker))
        .count()
}

pub(crate) fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_default()
}

pub(crate) fn show(dir: &Path, id: &str) -> Json {
    let out = crate::support::archon(dir, &["show", id, "--json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).expect("JSON")
}

pub(crate) fn last_run(dir: &Path) -> String {
    let out = crate::support::archon(dir, &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&out.stdout).expect("JSON");
    runs[0]["id"].as_str().expect("a run").to_owned()
}

const APPROVAL: &str = r#"name: notes
llm:
  providers:
    lead: { kind: openai, model: lead-model }
    publisher: { kind: openai, model: publisher-model }
tools:
  count:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo visit >> visits.txt; echo counted"]
  publish:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo once >> published.txt; echo published"]
agents:
  lead: { provider: lead, tools: [count], delegates: [publisher] }
  publisher: { provider: publisher, tools: [publish], description: publishes notes }
rules:
  - { name: publishing, on: before_tool, match: { tool: publish }, action: ask, reason: publishing is public }
steps:
  - { id: notes, goal: count a visit then have the notes published, agent: lead }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegate_waiting_for_approval_pauses_the_run_and_resumes_without_repeating_the_callers_calls()
 {
    let server = wiremock::MockServer::start().await;
    script(
        &server,
        "lead-model",
        vec![
            ("published the notes", answer(Some("all done"), None)),
            (
                "counted",
                answer(
                    None,
                    Some((
                        "delegate__publisher",
                        json!({ "task": "publish the notes" }),
                    )),
                ),
            ),
            ("", answer(None, Some(("count", json!({}))))),
        ],
    )
    .await;
    script(
        &server,
        "publisher-model",
        vec![
            ("published", answer(Some("published the notes"), None)),
            ("", answer(None, Some(("publish", json!({}))))),
        ],
    )
    .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("notes.yaml"), APPROVAL).expect("write");
    let base = format!("{}/v1", server.uri());
    let env = [
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_KEY", "sk-test"),
    ];
    let out = crate::support::archon_with(dir.path(), &["run", "notes.yaml"], &env);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let id = last_run(dir.path());
    assert_eq!(show(dir.path(), &id)["status"], "waiting_approval");
    assert_eq!(read(dir.path(), "published.txt"), "");

    let out = crate::support::archon_with(dir.path(), &["approve", &id], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = crate::support::archon_with(dir.path(), &["resume", &id], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "succeeded");
    let notes = &run["results"]["notes"];
    assert_eq!(notes["output"], "all done");
    assert_eq!(
        (
            notes["steps"]["publisher#2.1"]["status"].as_str(),
            notes["steps"]["publisher#2.1"]["output"].as_str()
        ),
        (Some("succeeded"), Some("published the notes"))
    );
    // The lead's `count` ran once and its turn that delegated was not asked again; the publisher's call
    // ran once, after the approval.
    assert_eq!(read(dir.path(), "visits.txt"), "visit\n");
    assert_eq!(read(dir.path(), "published.txt"), "once\n");
    assert_eq!(asked(&server, "lead-model").await, 3);
    assert_eq!(asked(&server, "publisher-model").await, 2);
}

const KILLED: &str = r#"name: killed
llm:
  providers:
    lead: { kind: openai, model: lead-model }
    worker: { kind: openai, model: worker-model }
tools:
  count:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo visit >> visits.txt; echo counted"]
  note:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo work >> work.txt; echo noted"]
  wait:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "touch started; if test -f slow; then sleep 30; fi; echo waited"]
agents:
  lead: { provider: lead, tools: [count], delegates: [worker] }
  worker: { provider: worker, tools: [note, wait], description: does slow work }
steps:
  - { id: job, goal: count a visit then have the slow work done, agent: lead }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_inside_a_delegate_resumes_without_repeating_finished_work_at_any_depth() {
    let server = wiremock::MockServer::start().await;
    script(
        &server,
        "lead-model",
        vec![
            ("worker finished", answer(Some("all done"), None)),
            (
                "counted",
                answer(
                    None,
                    Some(("delegate__worker", json!({ "task": "do the slow work" }))),
                ),
            ),
            ("", answer(None, Some(("count", json!({}))))),
        ],
    )
    .await;
    script(
        &server,
        "worker-model",
        vec![
            ("waited", answer(Some("worker finished"), None)),
            ("noted", answer(None, Some(("wait", json!({}))))),
            ("", answer(None, Some(("note", json!({}))))),
        ],
    )
    .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("killed.yaml"), KILLED).expect("write");
    std::fs::write(dir.path().join("slow"), "").expect("write");
    let base = format!("{}/v1", server.uri());
    let env = [
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_KEY", "sk-test"),
    ];
    // `wait` starts after the worker's first iteration is on disk (its tools are not safe to repeat),
    // and the lead's turn that delegated was on disk before the worker started.
    kill_when_started(dir.path(), "killed.yaml", &env);
    let id = last_run(dir.path());

    let out = crate::support::archon_with(dir.path(), &["resume", &id, "--rerun-in-doubt"], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let resumed: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("resumed"))
        .collect();
    assert_eq!(
        resumed,
        [
            "resumed   job after iteration 1",
            "resumed   job/worker#2.1 after iteration 1"
        ]
    );
    let run = show(dir.path(), &id);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["results"]["job"]["output"], "all done");
    assert_eq!(
        run["results"]["job"]["steps"]["worker#2.1"]["output"],
        "worker finished"
    );
    assert_eq!(read(dir.path(), "visits.txt"), "visit\n");
    assert_eq!(read(dir.path(), "work.txt"), "work\n");
    // Asked before the kill: the lead twice, the worker twice; after: the worker twice more (its
    // interrupted iteration, then its answer), the lead once (its final answer: the turn that delegated
    // is taken up again as it was).
    assert_eq!(asked(&server, "lead-model").await, 3);
    assert_eq!(asked(&server, "worker-model").await, 4);
}

/// A cached agent step is served again only while what its delegates are stays the same: their
/// instructions are part of the call.
#[test]
fn a_cached_agent_step_is_asked_again_when_a_delegate_changes() {
    let dir = TempDir::new().expect("tempdir");
    let spec = |instructions: &str| {
        format!(
            r#"name: cached
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls: [{{ name: delegate__helper, arguments: {{ task: say hello }} }}]
        - text: the helper said hello
    helper_model: {{ kind: mock, turns: [{{ text: hello }}] }}
agents:
  lead: {{ provider: lead_model, delegates: [helper] }}
  helper: {{ provider: helper_model, instructions: "{instructions}" }}
steps:
  - {{ id: greet, goal: get a greeting, agent: lead, cache: true }}
"#
        )
    };
    let cached = |instructions: &str| -> bool {
        std::fs::write(dir.path().join("cached.yaml"), spec(instructions)).expect("write");
        let out = crate::support::archon(dir.path(), &["run", "cached.yaml"]);
        assert_eq!(out.code, 0, "{}", out.stderr);
        let run = show(dir.path(), &last_run(dir.path()));
        assert_eq!(run["results"]["greet"]["output"], "the helper said hello");
        !run["results"]["greet"]["cached"].is_null()
    };
    assert_eq!(
        [cached("Be brief."), cached("Be brief."), cached("Be warm.")],
        [false, true, false]
    );
}

/// Runs `archon run FILE` in `dir` until its `wait` tool has started (it writes `started`, then waits while
/// `slow` exists), kills it, and makes `wait` fast for the resume.
pub(crate) fn kill_when_started(dir: &Path, file: &str, env: &[(&str, &str)]) {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", file])
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("archon starts");
    let started = std::time::Instant::now();
    while !dir.join("started").exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "`wait` never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    std::fs::remove_file(dir.join("slow")).expect("remove");
}
