//! Composite tools and sub-workflows: run by the same scheduler, their steps' results kept in the report,
//! failures named by the inner step, timeouts reaching inner processes, and a depth limit at run time.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use archon_engine::run::{self, RunEvent, RunOptions, RunReport, RunStatus, StepStatus};
use serde_json::{Map, json};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

fn options(workdir: &Path) -> RunOptions {
    RunOptions {
        max_parallel: 4,
        protected: Vec::new(),
        workdir: workdir.to_path_buf(),
        run_id: "nested".to_owned(),
        cancel: CancellationToken::new(),
        events: None,
        env: BTreeMap::from([("API_TOKEN".to_owned(), "s3cr3t".to_owned())]),
        journal: Arc::new(archon_engine::store::MemoryJournal),
        prior: Default::default(),
        cassette: None,
        checkpoints: Default::default(),
        approvals: Default::default(),
        helper: Some(env!("CARGO_BIN_EXE_archon").into()),
        cache: Default::default(),
        memory_dir: None,
        memory: Default::default(),
    }
}

/// Writes `files` into `dir`, validates the first one and runs it.
async fn run_files(dir: &Path, files: &[(&str, &str)], options: RunOptions) -> RunReport {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write");
    }
    let validation = archon_engine::validate_file(&dir.join(files[0].0));
    assert!(!validation.has_errors(), "{:?}", validation.diagnostics);
    let workflow = validation.workflow.expect("valid");
    let inputs =
        archon_engine::inputs::resolve(&workflow.spec, Map::new(), &[]).expect("inputs resolve");
    run::run(Arc::new(workflow), inputs, options)
        .await
        .expect("run starts")
}

const COMPOSITE: &str = r#"name: composite
tools:
  shout:
    parameters:
      type: object
      properties:
        text: { type: string }
        times: { type: integer }
      required: [text]
    steps:
      - id: upper
        tool: echo
        with: { loud: "{{ text | upper }}", token_seen: "{{ secrets.API_TOKEN | length }}" }
      - id: repeat
        tool: json
        with: { input: "{{ steps.upper.output.loud }}", query: "[range({{ args.times }})] | length" }
    result: { loud: "{{ steps.upper.output.loud }}", times: "{{ steps.repeat.output }}", of: "{{ inputs.who }}" }
  broken:
    parameters: { type: object, properties: { code: { type: integer } } }
    steps:
      - id: ok
        tool: echo
        with: { fine: true }
      - id: fails
        needs: [ok]
        tool: exec
        with: { argv: [sh, -c, "exit {{ code }}"] }
inputs:
  who: { type: string, default: ada }
secrets: [API_TOKEN]
steps:
  - id: a
    tool: shout
    with: { text: "hi {{ inputs.who }}", times: 3 }
  - id: b
    tool: broken
    with: { code: 3 }
    on_error: continue
  - id: after
    tool: echo
    with: { loud: "{{ steps.a.output.loud }}" }
"#;

#[tokio::test]
async fn composite_tools_run_their_steps_and_shape_a_result() {
    let dir = TempDir::new().expect("tempdir");
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let report = run_files(
        dir.path(),
        &[("composite.yaml", COMPOSITE)],
        RunOptions {
            events: Some(events),
            ..options(dir.path())
        },
    )
    .await;
    let a = &report.steps["a"];
    assert_eq!(a.status, StepStatus::Succeeded, "{a:?}");
    assert_eq!(
        a.output,
        json!({ "loud": "HI ADA", "times": 3, "of": "ada" }),
        "arguments read by name and as `args`, inputs readable"
    );
    assert_eq!(
        a.steps["upper"].output["token_seen"], 6,
        "composite steps may read secrets in their arguments"
    );
    assert_eq!(a.steps.len(), 2, "the inner results are kept");
    assert_eq!(report.steps["after"].output, json!({ "loud": "HI ADA" }));

    let b = &report.steps["b"];
    assert_eq!(b.status, StepStatus::Failed);
    let error = b.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("tool `broken`") && error.contains("step `fails` failed"),
        "{error}"
    );
    assert_eq!(b.exit_code, Some(3));
    assert_eq!(b.steps["ok"].status, StepStatus::Succeeded);
    assert_eq!(
        report.status,
        RunStatus::Succeeded,
        "`b` continues on error"
    );

    let mut names = Vec::new();
    while let Ok(event) = received.try_recv() {
        if let RunEvent::StepFinished { step, .. } = event {
            names.push(step);
        }
    }
    for name in ["a/upper", "a/repeat", "a", "b/ok", "b/fails", "b", "after"] {
        assert!(names.contains(&name.to_owned()), "{name} in {names:?}");
    }
}

#[tokio::test]
async fn sub_workflows_run_as_steps_and_tools_with_their_own_inputs() {
    let dir = TempDir::new().expect("tempdir");
    let parent = r#"name: parent
tools:
  greet:
    description: Greets through the child workflow
    parameters: { type: object, properties: { who: { type: string } }, required: [who] }
    workflow: child.yaml
steps:
  - id: defaults
    workflow: child.yaml
  - id: each
    foreach: "['grace', 'linus']"
    workflow: child.yaml
    with: { who: "{{ item }}", punctuation: "?" }
  - id: tool
    tool: greet
    with: { who: tool }
  - id: failing
    workflow: child.yaml
    with: { who: fail }
    on_error: continue
outputs:
  all: "{{ [steps.defaults.output.greeting] + (steps.each.output | map(attribute='greeting') | list) + [steps.tool.output.greeting] }}"
"#;
    let child = r#"name: child
inputs:
  who: { type: string, default: world }
  punctuation: { type: string, default: "!" }
steps:
  - id: check
    tool: exec
    with: { argv: [test, "{{ inputs.who }}", "!=", fail] }
  - id: greet
    needs: [check]
    tool: echo
    with: { message: "hello, {{ inputs.who }}{{ inputs.punctuation }} ({{ run.workflow }})" }
outputs:
  greeting: "{{ steps.greet.output.message }}"
"#;
    let report = run_files(
        dir.path(),
        &[("parent.yaml", parent), ("child.yaml", child)],
        options(dir.path()),
    )
    .await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_eq!(
        report.outputs["all"],
        json!([
            "hello, world! (child)",
            "hello, grace? (child)",
            "hello, linus? (child)",
            "hello, tool! (child)"
        ])
    );
    assert_eq!(
        report.steps["defaults"].steps["greet"].status,
        StepStatus::Succeeded
    );
    let failing = &report.steps["failing"];
    assert_eq!(failing.status, StepStatus::Failed);
    let error = failing.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("sub-workflow `child.yaml`") && error.contains("step `check` failed"),
        "{error}"
    );
    assert_eq!(failing.steps["greet"].status, StepStatus::Skipped);
}

/// A sub-workflow's `defaults.max_parallel` limits its own steps, within the run's limit (review item 3):
/// each step holds a lock directory while it runs, and notes an overlap if another holds it.
#[tokio::test]
async fn a_sub_workflow_runs_its_steps_within_its_own_max_parallel() {
    let dir = TempDir::new().expect("tempdir");
    let main = "name: main\nsteps:\n  - { id: sub, workflow: sub.yaml }\n";
    let step = |id: &str| {
        format!(
            "  - id: {id}\n    tool: shell\n    with: {{ command: \"if mkdir lock; then sleep 0.5; rmdir lock; else echo {id} >> overlaps; fi\" }}\n"
        )
    };
    let sub = format!(
        "name: sub\ndefaults: {{ max_parallel: 1 }}\nsteps:\n{}{}{}",
        step("a"),
        step("b"),
        step("c")
    );
    let report = run_files(
        dir.path(),
        &[("main.yaml", main), ("sub.yaml", &sub)],
        options(dir.path()),
    )
    .await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    let overlaps = std::fs::read_to_string(dir.path().join("overlaps")).unwrap_or_default();
    assert_eq!(overlaps, "", "steps that found another running");
    for id in ["a", "b", "c"] {
        assert_eq!(report.steps["sub"].steps[id].status, StepStatus::Succeeded);
    }
}

#[tokio::test]
async fn a_timeout_reaches_the_processes_inside_a_composite_tool() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
tools:
  slow:
    parameters: { type: object, properties: {} }
    steps:
      - id: wait
        tool: exec
        with: { argv: [sh, -c, "echo $$ > inner.pid; sleep 30; touch survived"] }
steps:
  - id: outer
    tool: slow
    timeout: 300ms
"#;
    let report = run_files(dir.path(), &[("t.yaml", yaml)], options(dir.path())).await;
    assert_eq!(report.steps["outer"].status, StepStatus::TimedOut);
    let pid = std::fs::read_to_string(dir.path().join("inner.pid")).expect("the command started");
    let stat = format!("/proc/{}/stat", pid.trim());
    for _ in 0..50 {
        if std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z ")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else {
            assert!(!dir.path().join("survived").exists());
            return;
        }
    }
    panic!("the inner command {} still runs", pid.trim());
}

/// Validation rejects recursion, but a deep enough chain of distinct sub-workflows is stopped at run time.
#[tokio::test]
async fn nesting_deeper_than_the_limit_fails_the_step() {
    let dir = TempDir::new().expect("tempdir");
    let depth = run::MAX_DEPTH as usize + 1;
    let mut files = Vec::new();
    for level in 0..depth {
        files.push((
            format!("level{level}.yaml"),
            format!(
                "name: level{level}\nsteps:\n  - {{ id: down, workflow: level{}.yaml }}\n",
                level + 1
            ),
        ));
    }
    files.push((
        format!("level{depth}.yaml"),
        "name: bottom\nsteps:\n  - { id: end, tool: echo, with: { done: true } }\n".to_owned(),
    ));
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    let report = run_files(dir.path(), &files, options(dir.path())).await;
    assert_eq!(report.status, RunStatus::Failed);
    let mut step = &report.steps["down"];
    let mut levels = 1;
    while let Some(inner) = step.steps.get("down") {
        step = inner;
        levels += 1;
    }
    assert_eq!(
        levels,
        run::MAX_DEPTH as usize + 1,
        "the top step, then one per nested workflow"
    );
    let error = step.error.as_deref().unwrap_or_default();
    assert!(error.contains("nested more than 16 levels"), "{error}");

    // One level less runs to the bottom.
    std::fs::remove_file(dir.path().join("level0.yaml")).expect("remove");
    let report = run_files(dir.path(), &files[1..], options(dir.path())).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{:?}", report.error);
}
