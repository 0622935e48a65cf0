//! Planner steps against the scripted `mock` provider: plans pass the same validator as a hand-written
//! spec, rejected plans are corrected, failed planned steps lead to a revised plan.

use archon_engine::run::{RunEvent, StepStatus};
use serde_json::json;
use tempfile::TempDir;

use crate::agent::run_agent;
use crate::support::{archon, archon_with};

/// A workflow whose step `p` plans `goal` with the tools `tools`, answered by scripted `turns` (YAML
/// list items, indented by 8).
fn spec(turns: &str, step: &str) -> String {
    format!(
        "name: planner\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\nsteps:\n{step}\n"
    )
}

const STEP: &str = "  - id: p\n    plan: work out 20% of 50 and say it\n    tools: [calculator, echo, read_file]\n";

/// A scripted turn answering with `plan` (JSON), when the last user message contains `when`.
fn turn(when: Option<&str>, plan: &serde_json::Value) -> String {
    let text = serde_json::to_string(&plan.to_string()).expect("json");
    match when {
        Some(when) => format!("        - match: \"{when}\"\n          text: {text}\n"),
        None => format!("        - text: {text}\n"),
    }
}

fn good_plan() -> serde_json::Value {
    json!({
        "steps": [
            { "id": "percent", "tool": "calculator", "with": { "expression": "50 * 20 / 100" } },
            { "id": "say", "tool": "echo", "with": { "message": "the answer is {{ steps.percent.output }}" } }
        ],
        "outputs": { "answer": "{{ steps.say.output.message }}" }
    })
}

/// The problems of each plan the validator rejected, in order.
fn rejected_plans(events: &[RunEvent]) -> Vec<&Vec<String>> {
    events
        .iter()
        .filter_map(|e| match e {
            RunEvent::PlanRejected { problems, .. } => Some(problems),
            _ => None,
        })
        .collect()
}

fn plan_events(events: &[RunEvent]) -> Vec<&RunEvent> {
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                RunEvent::PlanProposed { .. }
                    | RunEvent::PlanRejected { .. }
                    | RunEvent::PlanAccepted { .. }
                    | RunEvent::PlanRevising { .. }
            )
        })
        .collect()
}

#[tokio::test]
async fn an_accepted_plan_runs_with_the_scheduler() {
    let dir = TempDir::new().expect("tempdir");
    let (report, events) = run_agent(dir.path(), &spec(&turn(None, &good_plan()), STEP)).await;
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    assert_eq!(p.output, json!({ "answer": "the answer is 10" }));
    let planned: Vec<&str> = p.steps.keys().map(String::as_str).collect();
    assert_eq!(planned, ["percent", "say"]);
    assert_eq!(p.steps["percent"].output, json!(10));
    assert_eq!(p.llm.as_ref().map(|l| l.calls), Some(1));
    let plan = p.plan.as_ref().expect("the plan is kept");
    assert_eq!(plan["steps"][0]["id"], "percent");
    assert!(events.iter().any(|e| matches!(
        e,
        RunEvent::PlanAccepted { step, steps, .. } if step == "p" && steps == &["percent", "say"]
    )));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, RunEvent::StepFinished { step, .. } if step == "p/say")),
        "planned steps are named under their planner"
    );
}

#[tokio::test]
async fn a_plan_with_a_cycle_is_rejected_and_the_corrected_plan_runs() {
    let dir = TempDir::new().expect("tempdir");
    let cyclic = json!({
        "steps": [
            { "id": "a", "tool": "echo", "with": { "x": "{{ steps.b.output }}" } },
            { "id": "b", "tool": "echo", "with": { "x": "{{ steps.a.output }}" } }
        ]
    });
    let turns = turn(Some("rejected"), &good_plan()) + &turn(None, &cyclic);
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    let rejected = rejected_plans(&events);
    assert_eq!(rejected.len(), 1, "{events:?}");
    assert!(
        rejected[0].iter().any(|p| p.contains("cycle")),
        "the validator's own message: {rejected:?}"
    );
    assert_eq!(p.llm.as_ref().map(|l| l.calls), Some(2));
    assert_eq!(p.output, json!({ "answer": "the answer is 10" }));
}

#[tokio::test]
async fn a_plan_whose_step_says_cache_is_rejected_and_the_corrected_plan_runs() {
    let dir = TempDir::new().expect("tempdir");
    let mut cached = good_plan();
    cached["steps"][0]["cache"] = json!(true);
    let turns = turn(Some("rejected"), &good_plan()) + &turn(None, &cached);
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    let rejected = rejected_plans(&events);
    assert_eq!(rejected.len(), 1, "{events:?}");
    insta::assert_snapshot!(rejected[0].join("\n"));
    assert_eq!(p.llm.as_ref().map(|l| l.calls), Some(2));
    assert_eq!(p.output, json!({ "answer": "the answer is 10" }));
    assert!(p.steps["percent"].cached.is_none());
}

#[tokio::test]
async fn plans_beyond_what_planned_steps_may_do_are_rejected() {
    let dir = TempDir::new().expect("tempdir");
    let bad = json!({
        "tools": { "mine": { "command": ["true"] } },
        "steps": [
            { "id": "run", "tool": "exec", "with": { "argv": ["true"] } },
            { "id": "look", "tool": "echo", "with": { "home": "{{ env.HOME }}" } },
            { "id": "nope", "tool": "no_such_tool", "with": {} }
        ]
    });
    let turns = turn(None, &bad) + &turn(None, &bad) + &turn(None, &bad);
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Failed, "{p:?}");
    let error = p.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("rejected the planner's plan 3 times"),
        "{error}"
    );
    let RunEvent::PlanRejected { problems, .. } = plan_events(&events)[1] else {
        panic!("a rejection follows the proposal: {events:?}");
    };
    let all = problems.join("\n");
    assert!(
        all.contains("only `steps` and `outputs`, not `tools`"),
        "{all}"
    );
    // The document is refused before its steps are read; a plan of steps alone shows the rest.
    let steps_only = json!({ "steps": bad["steps"] });
    let turns = turn(None, &steps_only) + &turn(None, &steps_only) + &turn(None, &steps_only);
    let (_, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let RunEvent::PlanRejected { problems, .. } = plan_events(&events)[1] else {
        panic!("a rejection follows the proposal: {events:?}");
    };
    let all = problems.join("\n");
    assert!(
        all.contains("planned step `run` may not call `exec`"),
        "{all}"
    );
    assert!(all.contains("cannot read `env`"), "{all}");
    assert!(all.contains("unknown tool `no_such_tool`"), "{all}");
    assert!(all.contains("line "), "problems say where: {all}");
}

#[tokio::test]
async fn a_failed_planned_step_leads_to_a_revised_plan_that_keeps_what_succeeded() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("fifty.txt"), "50").expect("write");
    let failing = json!({
        "steps": [
            { "id": "percent", "tool": "calculator", "with": { "expression": "50 * 20 / 100" } },
            { "id": "read", "tool": "read_file", "with": { "path": "missing.txt" } },
            { "id": "say", "tool": "echo", "with": { "message": "{{ steps.percent.output }} of {{ steps.read.output }}" } }
        ]
    });
    let revised = json!({
        "steps": [
            { "id": "percent", "tool": "calculator", "with": { "expression": "50 * 20 / 100" } },
            { "id": "read", "tool": "read_file", "with": { "path": "fifty.txt" } },
            { "id": "say", "tool": "echo", "with": { "message": "{{ steps.percent.output }} of {{ steps.read.output }}" } }
        ]
    });
    let turns = turn(Some("failed"), &revised) + &turn(None, &failing);
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    assert_eq!(p.output, json!({ "message": "10 of 50" }));
    let revising: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::PlanRevising { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(revising.len(), 1);
    assert!(
        revising[0].contains("planned step `read` failed"),
        "{revising:?}"
    );
    assert!(events.iter().any(|e| matches!(
        e,
        RunEvent::PlanAccepted { replan: 1, kept, .. } if kept == &["percent"]
    )));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, RunEvent::StepReused { step, .. } if step == "p/percent")),
        "the step that succeeded is not run again"
    );
}

#[tokio::test]
async fn without_revisions_left_the_planner_step_fails() {
    let dir = TempDir::new().expect("tempdir");
    let failing = json!({
        "steps": [ { "id": "read", "tool": "read_file", "with": { "path": "missing.txt" } } ]
    });
    let yaml = spec(&turn(None, &failing), STEP)
        .replace("steps:\n", "defaults:\n  max_replans: 0\nsteps:\n");
    let (report, events) = run_agent(dir.path(), &yaml).await;
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Failed, "{p:?}");
    assert!(
        p.error
            .as_deref()
            .unwrap_or_default()
            .starts_with("planned step `read` failed"),
        "{p:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, RunEvent::PlanRevising { .. }))
    );
    assert_eq!(p.steps["read"].status, StepStatus::Failed);
}

#[test]
fn a_saved_plan_validates_and_reruns_without_the_planner() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("fifty.txt"), "50").expect("write");
    let plan = json!({
        "steps": [
            { "id": "read", "tool": "read_file", "with": { "path": "fifty.txt" } },
            { "id": "percent", "tool": "calculator", "with": { "expression": "{{ steps.read.output }} * 20 / 100" } }
        ],
        "outputs": { "value": "{{ steps.percent.output }}" }
    });
    let yaml = spec(&turn(None, &plan), STEP)
        + "  - id: after\n    tool: echo\n    with: { got: \"{{ steps.p.output.value }}\" }\noutputs:\n  got: \"{{ steps.after.output.got }}\"\n";
    std::fs::write(dir.path().join("planned.yaml"), yaml).expect("write");
    let first = archon(
        dir.path(),
        &[
            "run",
            "planned.yaml",
            "--json",
            "--save-plan",
            "frozen.yaml",
        ],
    );
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(
        first.stderr.contains("plan saved to frozen.yaml"),
        "{}",
        first.stderr
    );
    let report: serde_json::Value = serde_json::from_str(&first.stdout).expect("report");
    assert_eq!(report["outputs"]["got"], 10);
    let shown = archon(
        dir.path(),
        &["show", report["run_id"].as_str().expect("id")],
    );
    assert!(
        shown.stdout.contains("p/percent  succeeded (planned)"),
        "planned steps are shown under their planner:\n{}",
        shown.stdout
    );
    let frozen = std::fs::read_to_string(dir.path().join("frozen.yaml")).expect("saved");
    assert!(
        !frozen.lines().any(|l| l.trim_start().starts_with("plan:")),
        "no planner step is left:\n{frozen}"
    );
    assert!(frozen.contains("p_plan"), "{frozen}");

    let check = archon(dir.path(), &["validate", "frozen.yaml"]);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    let again = archon(dir.path(), &["run", "frozen.yaml", "--json"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    let rerun: serde_json::Value = serde_json::from_str(&again.stdout).expect("report");
    assert_eq!(rerun["outputs"], report["outputs"], "the same results");
    assert_eq!(
        rerun["steps"]["p"]["output"], report["steps"]["p"]["output"],
        "the frozen step gives what the plan gave"
    );
    assert!(rerun["llm"].is_null(), "no LLM call: {}", rerun["llm"]);
    let planned: Vec<&String> = report["steps"]["p"]["steps"]
        .as_object()
        .expect("planned steps")
        .keys()
        .collect();
    let frozen_steps: Vec<&String> = rerun["steps"]["p"]["steps"]
        .as_object()
        .expect("frozen steps")
        .keys()
        .collect();
    assert_eq!(planned, frozen_steps);

    // A workflow whose planner failed has no plan to save.
    let failing = json!({ "steps": [ { "id": "read", "tool": "read_file", "with": { "path": "missing.txt" } } ] });
    let yaml = spec(&turn(None, &failing), STEP)
        .replace("steps:\n", "defaults:\n  max_replans: 0\nsteps:\n");
    std::fs::write(dir.path().join("failing.yaml"), yaml).expect("write");
    let failed = archon(
        dir.path(),
        &["run", "failing.yaml", "--save-plan", "none.yaml"],
    );
    assert_eq!(failed.code, 1);
    assert!(
        failed
            .stderr
            .contains("the plan was not saved: step `p` has no plan to save: it failed"),
        "{}",
        failed.stderr
    );
    assert!(!dir.path().join("none.yaml").exists());
}

#[tokio::test]
async fn a_goal_runs_with_no_spec() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    let plan = json!({
        "steps": [ { "id": "percent", "tool": "calculator", "with": { "expression": "50 * 20 / 100" } } ]
    });
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1_763_900_000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": plan.to_string() },
                "finish_reason": "stop"
            }],
            "usage": { "prompt_tokens": 812, "completion_tokens": 41, "total_tokens": 853 }
        })))
        .expect(1)
        .mount(&server)
        .await;
    let dir = TempDir::new().expect("tempdir");
    let base = format!("{}/v1", server.uri());
    let cwd = dir.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        archon_with(
            &cwd,
            &[
                "run",
                "--goal",
                "What is 20% of 50? Use {{ no templates }}.",
                "--json",
            ],
            &[
                ("OPENAI_BASE_URL", base.as_str()),
                ("ARCHON_OPENAI_MODEL", "gpt-4o-mini"),
            ],
        )
    })
    .await
    .expect("archon ran");
    assert_eq!(output.code, 0, "{}", output.stderr);
    let report: serde_json::Value = serde_json::from_str(&output.stdout).expect("report");
    assert_eq!(report["outputs"]["result"], 10, "{report}");
    let requests = server.received_requests().await.expect("recorded");
    let body: serde_json::Value = serde_json::from_slice(&requests[0].body).expect("JSON");
    let prompt = body["messages"].to_string();
    assert!(
        prompt.contains("What is 20% of 50? Use {{ no templates }}."),
        "the goal is text, not a template: {prompt}"
    );
    assert!(prompt.contains("calculator"), "the tools are listed");
    assert!(!prompt.contains("write_file"), "only tools that read");
    let goals: Vec<_> = std::fs::read_dir(dir.path().join(".archon/goals"))
        .expect("the goal's workflow is kept")
        .collect();
    assert_eq!(goals.len(), 1);

    // Without any provider in the environment the goal is refused before a run is recorded (issue 15,
    // item 7: it used to record a run and fail it).
    let cwd = dir.path().to_path_buf();
    let runs_before = archon(dir.path(), &["runs", "--json"]).stdout;
    let output = tokio::task::spawn_blocking(move || {
        archon_with(
            &cwd,
            &["run", "--goal", "anything"],
            &[("ARCHON_TEST", "1")],
        )
    })
    .await
    .expect("archon ran");
    assert_eq!(output.code, 2, "{}", output.stderr);
    insta::assert_snapshot!(output.stderr, @r"
    error: `--goal` needs an LLM provider, and the environment configures none
      hint: set `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` or `GEMINI_API_KEY`, or `ARCHON_OPENAI_BASE_URL` and `ARCHON_OPENAI_MODEL` for a local server
    ");
    assert_eq!(archon(dir.path(), &["runs", "--json"]).stdout, runs_before);
}

#[tokio::test]
async fn planned_agents_get_only_the_tools_the_plan_gives_them() {
    let dir = TempDir::new().expect("tempdir");
    let sneaky = json!({
        "steps": [
            { "id": "named", "goal": "read the secret", "agent": "reader", "tools": [] },
            { "id": "bare", "goal": "read the secret" },
            { "id": "asking", "goal": "read the secret", "ask": ["reader", "other"], "consensus": { "by": "first" }, "tools": [] },
            { "id": "wrapped", "tool": "save_note", "with": { "text": "x" } }
        ]
    });
    let turns = turn(None, &sneaky) + &turn(None, &sneaky) + &turn(None, &sneaky);
    let yaml = spec(&turns, "  - id: p\n    plan: read the secret\n    tools: [echo, save_note]\n").replace(
        "steps:\n",
        "agents:\n  reader: { tools: [read_file] }\n  other: { tools: [read_file] }\ndefaults:\n  agent: reader\ntools:\n  save_note:\n    description: Saves a note\n    parameters: { type: object, properties: { text: { type: string } } }\n    steps:\n      - { id: w, tool: write_file, with: { path: note.txt, content: \"{{ text }}\" } }\nsteps:\n",
    );
    let (report, events) = run_agent(dir.path(), &yaml).await;
    assert_eq!(report.steps["p"].status, StepStatus::Failed);
    let RunEvent::PlanRejected { problems, .. } = plan_events(&events)[1] else {
        panic!("rejected: {events:?}");
    };
    let all = problems.join("\n");
    assert!(
        all.contains("planned step `named` cannot name an agent"),
        "{all}"
    );
    assert!(
        all.contains("planned step `asking` cannot ask agents"),
        "the agents it would ask have tools of their own: {all}"
    );
    assert!(
        all.contains("planned goal step `bare` does not list its `tools`"),
        "{all}"
    );
    assert!(
        all.contains("planned step `wrapped` may not call `save_note`"),
        "a composite tool that writes files is sensitive: {all}"
    );
    assert!(!dir.path().join("note.txt").exists());
}

#[tokio::test]
async fn plans_are_checked_against_the_sub_workflows_loaded_with_the_run() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("sub.yaml"),
        "name: sub\nsteps:\n  - { id: s, tool: echo, with: { v: original } }\noutputs:\n  v: \"{{ steps.s.output.v }}\"\n",
    )
    .expect("write");
    let plan = json!({ "steps": [ { "id": "call", "tool": "child", "with": {} } ] });
    let yaml = spec(&turn(None, &plan), "  - id: p\n    plan: call the child\n    tools: [child]\n").replace(
        "steps:\n",
        "tools:\n  child:\n    description: The child workflow\n    parameters: { type: object, properties: {} }\n    workflow: sub.yaml\n    sensitive: false\nsteps:\n",
    );
    std::fs::write(dir.path().join("parent.yaml"), yaml).expect("write");
    let workflow = archon_engine::validate_file(&dir.path().join("parent.yaml"))
        .workflow
        .expect("valid");
    // The file changes after the run has read it: the plan is checked against, and runs, what was read.
    std::fs::write(dir.path().join("sub.yaml"), "changed: [").expect("write");
    let mut options = archon_engine::run::RunOptions::new(dir.path().to_path_buf(), "sub");
    options.journal = std::sync::Arc::new(archon_engine::store::MemoryJournal);
    let report = archon_engine::run::run(
        std::sync::Arc::new(workflow),
        serde_json::Map::new(),
        options,
    )
    .await
    .expect("runs");
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    assert_eq!(p.output, json!({ "v": "original" }));
}

/// Issue 13, item 2: a plan's templates are held to the same budget as a spec's. A planned step whose
/// template doubles a string forty times fails within the 256 MiB a render may use (it reached 23 GB
/// before), the planner is told, and its revised plan runs.
#[tokio::test]
async fn a_planned_template_that_builds_without_end_fails_its_step_within_the_budget() {
    let dir = TempDir::new().expect("tempdir");
    let bomb = json!({
        "steps": [
            { "id": "double", "tool": "echo", "with": { "text": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}" } }
        ]
    });
    let revised = json!({
        "steps": [ { "id": "double", "tool": "echo", "with": { "text": "{{ 'ab' ~ 'ab' }}" } } ]
    });
    let turns = turn(Some("failed"), &revised) + &turn(None, &bomb);
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let failed: Vec<&Option<String>> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::StepFinished {
                step,
                status: StepStatus::Failed,
                error,
                ..
            } if step == "p/double" => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        [&Some(
            "cannot render template `{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.`: it needed more than 256 MiB of memory"
                .to_owned()
        )]
    );
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    assert_eq!(p.steps["double"].output, json!({ "text": "abab" }));
}

/// A plan whose template chains 100,000 operators made minijinja overflow the stack while the plan was
/// validated, aborting the whole run; it is now rejected like any invalid plan, and the corrected plan runs.
#[tokio::test]
async fn a_plan_whose_template_chains_without_end_is_rejected_not_fatal() {
    let dir = TempDir::new().expect("tempdir");
    let deep = json!({
        "steps": [
            { "id": "say", "tool": "echo", "with": { "message": format!("{{{{ 1{} }}}}", "+1".repeat(100_000)) } }
        ]
    });
    let turns = turn(Some("rejected"), &good_plan()) + &turn(None, &deep);
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    let rejected = rejected_plans(&events);
    assert_eq!(rejected.len(), 1, "{events:?}");
    assert!(
        rejected[0]
            .iter()
            .any(|p| p.contains("template chains more than 256 operators in one tag")),
        "{rejected:?}"
    );
    let p = &report.steps["p"];
    assert_eq!(p.status, StepStatus::Succeeded, "{p:?}");
    assert_eq!(p.output, json!({ "answer": "the answer is 10" }));
}

/// Issue 14, item 13: a plan that is not a mapping was told to "start with `name:` and `steps:`", which a
/// plan must not have (`name` is refused in a plan); it is told what a plan is.
#[tokio::test]
async fn a_plan_that_is_not_a_mapping_is_told_what_a_plan_is() {
    let dir = TempDir::new().expect("tempdir");
    let turns = turn(Some("rejected"), &good_plan()) + &turn(None, &json!(["percent", "say"]));
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    assert_eq!(report.steps["p"].status, StepStatus::Succeeded);
    let rejected = rejected_plans(&events);
    assert_eq!(rejected.len(), 1, "{events:?}");
    assert_eq!(
        *rejected[0],
        [
            "line 1, column 1: a plan must be a mapping of keys, found array (hint: a plan is a mapping of `steps:` and, if it gives outputs, `outputs:`)"
        ]
    );
}

/// A plan of more than 200 steps is rejected and corrected like any invalid plan, not run (issue 14,
/// item 10: a 20,000-step plan was accepted).
#[tokio::test]
async fn a_plan_of_too_many_steps_is_rejected() {
    let dir = TempDir::new().expect("tempdir");
    let steps: Vec<serde_json::Value> = (0..201)
        .map(|i| json!({ "id": format!("s{i}"), "tool": "echo", "with": { "message": "x" } }))
        .collect();
    let turns = turn(Some("rejected"), &good_plan()) + &turn(None, &json!({ "steps": steps }));
    let (report, events) = run_agent(dir.path(), &spec(&turns, STEP)).await;
    assert_eq!(report.steps["p"].status, StepStatus::Succeeded);
    let rejected = rejected_plans(&events);
    assert_eq!(
        rejected,
        [&vec![
            "line 1, column 2: the plan has 201 steps, more than the limit of 200 (hint: plan fewer, larger steps)".to_owned()
        ]]
    );
}
