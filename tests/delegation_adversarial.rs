//! Issue 18, probed as a hostile user and a hostile model: ways a step's delegation tree could take more
//! model turns than its one budget (`max_iterations`).

use archon_engine::run::StepStatus;
use serde_json::json;
use tempfile::TempDir;

use crate::delegation::{answer, asked, kill_when_started, last_run, run, script, show};

/// A delegate that runs out of its own `max_iterations` is asked once more for its best answer: that
/// request is a model turn of the tree too, so three such delegates cannot take the step past its budget.
#[tokio::test]
async fn a_delegates_last_best_answer_turn_counts_against_the_steps_budget() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: extra
llm:
  providers:
    lead_model:
      kind: mock
      turns:
        - tool_calls:
            - { name: delegate__w, arguments: { task: t1 } }
            - { name: delegate__w, arguments: { task: t2 } }
            - { name: delegate__w, arguments: { task: t3 } }
        - text: done
    w_model:
      kind: mock
      turns:
        - tool_calls: [{ name: calculator, arguments: { expression: "1 + 1" } }]
        - text: best
        - tool_calls: [{ name: calculator, arguments: { expression: "1 + 1" } }]
        - text: best
        - tool_calls: [{ name: calculator, arguments: { expression: "1 + 1" } }]
        - text: best
agents:
  lead: { provider: lead_model, delegates: [w] }
  w: { provider: w_model, tools: [calculator], max_iterations: 1 }
steps:
  - { id: s, goal: go, agent: lead, max_iterations: 4 }
"#;
    let (report, _) = run(dir.path(), yaml).await;
    let s = &report.steps["s"];
    assert_eq!(s.status, StepStatus::Incomplete, "{s:?}");
    // The lead's turn, then two delegates' turns and best answers: the budget of 4 is spent there.
    assert_eq!(s.llm.as_ref().map(|l| l.calls), Some(4));
    assert_eq!(report.llm.as_ref().map(|l| l.calls), Some(4));
}

const KILLED_MIDDLE: &str = r#"name: middle
llm:
  providers:
    lead: { kind: openai, model: lead-model }
    manager: { kind: openai, model: manager-model }
    scout: { kind: openai, model: scout-model }
tools:
  note_a:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo marker-alpha"]
  note_b:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo marker-beta"]
  wait:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "touch started; if test -f slow; then sleep 30; fi; echo manager-waited"]
agents:
  lead: { provider: lead, delegates: [manager] }
  manager: { provider: manager, tools: [wait], delegates: [scout], description: manages }
  scout: { provider: scout, tools: [note_a, note_b], description: scouts }
steps:
  - { id: job, goal: get the job done, agent: lead, max_iterations: 7 }
"#;

/// A delegate in the middle of the tree checkpoints the turns its own delegates took: killed after its
/// delegate finished, the resumed run still counts them, and the step cannot take more turns than its
/// budget by being killed and resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_middle_delegate_still_counts_the_turns_its_finished_delegates_took() {
    let server = wiremock::MockServer::start().await;
    script(
        &server,
        "lead-model",
        vec![
            ("manager-finished", answer(Some("all done"), None)),
            (
                "",
                answer(
                    None,
                    Some(("delegate__manager", json!({ "task": "manage it" }))),
                ),
            ),
        ],
    )
    .await;
    script(
        &server,
        "manager-model",
        vec![
            ("manager-waited", answer(Some("manager-finished"), None)),
            ("scout-report", answer(None, Some(("wait", json!({}))))),
            (
                "",
                answer(
                    None,
                    Some(("delegate__scout", json!({ "task": "scout it" }))),
                ),
            ),
        ],
    )
    .await;
    script(
        &server,
        "scout-model",
        vec![
            ("marker-beta", answer(Some("scout-report"), None)),
            ("marker-alpha", answer(None, Some(("note_b", json!({}))))),
            ("", answer(None, Some(("note_a", json!({}))))),
        ],
    )
    .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("middle.yaml"), KILLED_MIDDLE).expect("write");
    std::fs::write(dir.path().join("slow"), "").expect("write");
    let base = format!("{}/v1", server.uri());
    let env = [
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_KEY", "sk-test"),
    ];
    // `wait` starts after the manager's first iteration (the scout's three turns) is on disk.
    kill_when_started(dir.path(), "middle.yaml", &env);
    // Before the kill: lead 1, manager 2, scout 3 (6 of the 7 turns).
    assert_eq!(
        (
            asked(&server, "lead-model").await,
            asked(&server, "manager-model").await,
            asked(&server, "scout-model").await
        ),
        (1, 2, 3)
    );
    let id = last_run(dir.path());
    let out = crate::support::archon_with(dir.path(), &["resume", &id, "--rerun-in-doubt"], &env);
    assert_eq!(out.code, 1, "{}", out.stderr);
    // The manager's interrupted turn is taken again (the 6th), its answer is the 7th: the lead has none
    // left for its own answer.
    let run = show(dir.path(), &id);
    let job = &run["results"]["job"];
    assert_eq!(job["status"], "incomplete");
    assert_eq!(
        job["error"],
        "the step's budget of 7 model turns ran out in `lead` (chain `lead`; turns: lead 1, manager 3, delegates 3)\n  hint: raise the step's `max_iterations`: its delegates spend the same budget"
    );
    assert_eq!(job["steps"]["manager#1.1"]["output"], "manager-finished");
    assert_eq!(
        job["steps"]["manager#1.1"]["steps"]["scout#1.1"]["output"],
        "scout-report"
    );
    assert_eq!(
        (
            asked(&server, "lead-model").await,
            asked(&server, "manager-model").await,
            asked(&server, "scout-model").await
        ),
        (1, 4, 3)
    );
}

const RECOUNTED: &str = r#"name: recounted
llm:
  providers:
    lead: { kind: openai, model: lead-model }
    helper: { kind: openai, model: helper-model }
tools:
  publish:
    parameters: { type: object, properties: {} }
    command: ["sh", "-c", "echo published"]
agents:
  lead: { provider: lead, tools: [publish], delegates: [helper] }
  helper: { provider: helper, description: helps }
defaults: { max_delegations: 1 }
rules:
  - { name: publishing, on: before_tool, match: { tool: publish }, action: ask, reason: publishing is public }
steps:
  - { id: job, goal: get help then publish, agent: lead }
"#;

/// `defaults.max_delegations` counts the delegations made before a pause too: approving and resuming
/// does not give the step a fresh allowance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_step_counts_the_delegations_it_made_before_the_pause() {
    let server = wiremock::MockServer::start().await;
    script(
        &server,
        "lead-model",
        vec![
            ("was not made", answer(Some("finished alone"), None)),
            ("second-report", answer(Some("finished with help"), None)),
            (
                "published",
                answer(
                    None,
                    Some(("delegate__helper", json!({ "task": "the second task" }))),
                ),
            ),
            ("first-report", answer(None, Some(("publish", json!({}))))),
            (
                "",
                answer(
                    None,
                    Some(("delegate__helper", json!({ "task": "the first task" }))),
                ),
            ),
        ],
    )
    .await;
    script(
        &server,
        "helper-model",
        vec![
            ("the second task", answer(Some("second-report"), None)),
            ("", answer(Some("first-report"), None)),
        ],
    )
    .await;
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("recounted.yaml"), RECOUNTED).expect("write");
    let base = format!("{}/v1", server.uri());
    let env = [
        ("OPENAI_BASE_URL", base.as_str()),
        ("OPENAI_API_KEY", "sk-test"),
    ];
    let out = crate::support::archon_with(dir.path(), &["run", "recounted.yaml"], &env);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let id = last_run(dir.path());
    let out = crate::support::archon_with(dir.path(), &["approve", &id], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = crate::support::archon_with(dir.path(), &["resume", &id], &env);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let run = show(dir.path(), &id);
    let job = &run["results"]["job"];
    assert_eq!(job["output"], "finished alone");
    let delegations: Vec<&str> = job["steps"]
        .as_object()
        .expect("nested results")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(delegations, ["helper#1.1"]);
    assert_eq!(asked(&server, "helper-model").await, 1);
}
