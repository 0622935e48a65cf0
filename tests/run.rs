//! Running workflows: the scheduler (with paused time where timing matters), data flow, control flow,
//! commands and their process groups, and `archon run` end to end.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use archon_engine::run::{self, RunOptions, RunReport, RunStatus, StepStatus};
use archon_engine::validate_source;
use serde_json::{Map, Value as Json, json};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::support::{Output, archon};

fn options(workdir: &Path, max_parallel: usize) -> RunOptions {
    RunOptions {
        max_parallel,
        protected: Vec::new(),
        workdir: workdir.to_path_buf(),
        run_id: "test".to_owned(),
        cancel: CancellationToken::new(),
        events: None,
        env: BTreeMap::from([
            ("HOME_TEST".to_owned(), "/home/test".to_owned()),
            ("API_TOKEN".to_owned(), "s3cr3t".to_owned()),
        ]),
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

async fn run_yaml(yaml: &str, inputs: Map<String, Json>, options: RunOptions) -> RunReport {
    let validation = validate_source("test.yaml", yaml);
    assert!(
        validation.diagnostics.is_empty(),
        "{:?}",
        validation.diagnostics
    );
    let workflow = validation.workflow.expect("valid");
    let inputs =
        archon_engine::inputs::resolve(&workflow.spec, inputs, &[]).expect("inputs resolve");
    run::run(Arc::new(workflow), inputs, options)
        .await
        .expect("run starts")
}

fn status(report: &RunReport, step: &str) -> StepStatus {
    report.steps[step].status
}

#[tokio::test(start_paused = true)]
async fn independent_steps_overlap_and_dependents_wait() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = "name: t\nsteps:\n  - { id: a, tool: sleep, with: { duration: 1s } }\n  - { id: b, tool: sleep, with: { duration: 1s } }\n  - { id: c, tool: sleep, with: { duration: 1s }, needs: [a, b] }\n";
    let started = tokio::time::Instant::now();
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 8)).await;
    assert_eq!(report.status, RunStatus::Succeeded);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "a and b overlap, c waits for both"
    );
}

#[tokio::test(start_paused = true)]
async fn the_concurrency_cap_is_honoured() {
    let dir = TempDir::new().expect("tempdir");
    let mut yaml = String::from("name: t\nsteps:\n");
    for i in 0..6 {
        yaml.push_str(&format!(
            "  - {{ id: s{i}, tool: sleep, with: {{ duration: 1s }} }}\n"
        ));
    }
    let started = tokio::time::Instant::now();
    let report = run_yaml(&yaml, Map::new(), options(dir.path(), 2)).await;
    assert_eq!(report.status, RunStatus::Succeeded);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(3),
        "6 one-second steps, 2 at a time"
    );
}

#[tokio::test(start_paused = true)]
async fn foreach_keeps_input_order_and_its_own_limit() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - id: each
    foreach: "['3s', '1s', '2s']"
    max_parallel: 3
    tool: sleep
    with: { duration: "{{ item }}" }
  - id: shout
    foreach: "['a', 'b', 'c']"
    max_parallel: 1
    tool: echo
    with: { value: "{{ item | upper }}", position: "{{ index }}" }
"#;
    let started = tokio::time::Instant::now();
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 8)).await;
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert_eq!(
        report.steps["each"].output,
        json!([{ "slept_ms": 3000 }, { "slept_ms": 1000 }, { "slept_ms": 2000 }])
    );
    assert_eq!(
        report.steps["shout"].output,
        json!([{ "value": "A", "position": 0 }, { "value": "B", "position": 1 }, { "value": "C", "position": 2 }])
    );
}

#[tokio::test]
async fn data_flows_with_types_and_tool_output_is_never_rendered_again() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
inputs:
  n: { type: integer, default: 3 }
secrets: [API_TOKEN]
steps:
  - id: produce
    tool: echo
    with: { list: [1, 2, "{{ inputs.n }}"], trap: "{{ '{{ secrets.API_TOKEN }}' }} {{ '{% for x in y %}' }}" }
  - id: consume
    tool: echo
    with: { list: "{{ steps.produce.output.list }}", trap: "{{ steps.produce.output.trap }}", home: "{{ env.HOME_TEST }}", run: "{{ run.id }}" }
    outputs:
      total: "{{ steps.consume.output.list | sum }}"
outputs:
  total: "{{ steps.consume.outputs.total }}"
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    let out = &report.steps["consume"].output;
    assert_eq!(
        out["list"],
        json!([1, 2, 3]),
        "a sole expression keeps its JSON type"
    );
    assert_eq!(
        out["trap"], "{{ secrets.API_TOKEN }} {% for x in y %}",
        "tool output arrives literally"
    );
    assert_eq!(out["home"], "/home/test");
    assert_eq!(out["run"], "test");
    assert_eq!(report.outputs["total"], json!(6));
}

#[tokio::test]
async fn if_skips_propagate_and_on_error_continue_lets_dependents_decide() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - { id: off, if: "1 > 2", tool: echo, with: { x: 1 } }
  - { id: after_off, tool: echo, with: { x: "{{ steps.off.status }}" } }
  - { id: broken, tool: exec, with: { argv: ["false"] }, on_error: continue }
  - { id: after_broken, tool: echo, needs: [broken], with: { x: 1 } }
  - { id: handler, if: "steps.broken.status == 'failed'", tool: echo, with: { error: "{{ steps.broken.exit_code }}" } }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(status(&report, "off"), StepStatus::Skipped);
    assert_eq!(
        status(&report, "after_off"),
        StepStatus::Skipped,
        "a skipped dependency skips by default"
    );
    assert_eq!(status(&report, "broken"), StepStatus::Failed);
    assert_eq!(report.steps["broken"].exit_code, Some(1));
    assert_eq!(status(&report, "after_broken"), StepStatus::Skipped);
    assert_eq!(status(&report, "handler"), StepStatus::Succeeded);
    assert_eq!(report.steps["handler"].output["error"], json!(1));
    assert_eq!(
        report.status,
        RunStatus::Succeeded,
        "on_error: continue does not fail the run"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_count_every_attempt_then_the_fallback_runs() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - id: flaky
    tool: sleep
    with: { duration: 10s }
    timeout: 1s
    retry: { attempts: 3, backoff: fixed, delay: 2s, jitter: false }
  - id: rescued
    tool: sleep
    with: { duration: 10s }
    timeout: 1s
    retry: { attempts: 2, delay: 1s, jitter: false, on: [error] }
    fallback: { tool: echo, with: { rescued: true } }
"#;
    let started = tokio::time::Instant::now();
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(status(&report, "flaky"), StepStatus::TimedOut);
    assert_eq!(report.steps["flaky"].attempts, 3);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(7),
        "3 timeouts of 1s and 2 fixed delays of 2s"
    );
    assert_eq!(status(&report, "rescued"), StepStatus::Succeeded);
    assert_eq!(
        report.steps["rescued"].attempts, 2,
        "timeouts are not retried when `on` is only `error`: one attempt, then the fallback's"
    );
    assert!(report.steps["rescued"].fallback);
    assert_eq!(report.steps["rescued"].output, json!({ "rescued": true }));
    assert_eq!(
        report.status,
        RunStatus::Failed,
        "`flaky` failed without on_error: continue"
    );
}

#[tokio::test]
async fn commands_run_as_argv_with_stdin_env_and_output_modes() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
env:
  GREETING: "hi {{ inputs.who }}"
inputs:
  who: { type: string, default: "a; touch injected" }
tools:
  say:
    parameters: { type: object, properties: { text: { type: string } } }
    command: [sh, -c, 'printf "%s|%s" "$GREETING" "$1"', say, "{{ text }}"]
steps:
  - { id: lines, tool: exec, with: { argv: [printf, "a\nb\n"], output: lines } }
  - { id: parsed, tool: exec, with: { argv: [cat], stdin: '{"k": [1, 2]}', output: json } }
  - { id: literal, tool: exec, with: { argv: [echo, "{{ inputs.who }}"] } }
  - { id: declared, tool: say, with: { text: "$(touch injected2)" } }
  - { id: allowed, tool: exec, with: { argv: [sh, -c, "exit 3"], ok_exit_codes: [0, 3] } }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(report.status, RunStatus::Succeeded, "{report:?}");
    assert_eq!(report.steps["lines"].output, json!(["a", "b"]));
    assert_eq!(report.steps["parsed"].output, json!({ "k": [1, 2] }));
    assert_eq!(report.steps["literal"].output, "a; touch injected");
    assert_eq!(
        report.steps["declared"].output,
        "hi a; touch injected|$(touch injected2)"
    );
    assert_eq!(report.steps["allowed"].exit_code, Some(3));
    assert!(
        !dir.path().join("injected").exists() && !dir.path().join("injected2").exists(),
        "arguments are never a shell"
    );
}

#[tokio::test]
async fn undefined_values_are_errors_not_nulls() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = "name: t\nsteps:\n  - { id: a, tool: echo, with: { v: 1 } }\n  - { id: b, tool: echo, with: { v: \"{{ steps.a.output.missing }}\" } }\n";
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(status(&report, "b"), StepStatus::Failed);
    let error = report.steps["b"].error.clone().unwrap_or_default();
    assert!(error.contains("is undefined"), "{error}");
}

#[tokio::test]
async fn invalid_arguments_fail_the_step_naming_the_argument() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = "name: t\ninputs:\n  n: { type: integer, default: 3 }\nsteps:\n  - { id: bad, tool: exec, with: { argv: \"{{ inputs.n }}\" } }\n";
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(status(&report, "bad"), StepStatus::Failed);
    let error = report.steps["bad"].error.clone().unwrap_or_default();
    assert!(error.contains("argument `argv`"), "{error}");
}

/// A timed-out command's background grandchild does not survive: the whole process group is killed.
#[tokio::test]
async fn a_timed_out_commands_grandchild_is_killed() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - id: slow
    tool: exec
    with: { argv: [sh, -c, "sleep 30 & echo $! > grandchild.pid; wait"] }
    timeout: 500ms
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(status(&report, "slow"), StepStatus::TimedOut);
    let pid =
        std::fs::read_to_string(dir.path().join("grandchild.pid")).expect("the grandchild started");
    assert!(
        ends(pid.trim()).await,
        "grandchild {} is still running",
        pid.trim()
    );
}

/// Whether process `pid` ends (or is a zombie) within a second.
async fn ends(pid: &str) -> bool {
    let stat = format!("/proc/{pid}/stat");
    for _ in 0..50 {
        let alive = std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z "));
        if !alive {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The `timeout` argument of `exec`, `shell` and `http` (documented in docs/tools.md) bounds the call, and a
/// value that is not a duration fails the call rather than being ignored.
#[tokio::test]
async fn a_commands_own_timeout_argument_ends_it() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
inputs:
  limit: { type: string, default: "soon" }
steps:
  - id: slow
    tool: exec
    with: { argv: [sleep, "30"], timeout: 200ms }
  - id: shell
    tool: shell
    with: { command: "sleep 30", timeout: 200ms }
  - id: unreadable
    tool: exec
    with: { argv: ["true"], timeout: "{{ inputs.limit }}" }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    let errors: Vec<(StepStatus, Option<&str>)> = ["slow", "shell", "unreadable"]
        .iter()
        .map(|id| (report.steps[*id].status, report.steps[*id].error.as_deref()))
        .collect();
    assert_eq!(
        errors,
        [
            (StepStatus::Failed, Some("`sleep` timed out after 200ms")),
            (StepStatus::Failed, Some("`sh` timed out after 200ms")),
            (
                StepStatus::Failed,
                Some("invalid duration `soon` for `true`")
            ),
        ]
    );
}

/// A declared tool's `timeout` bounds each call of it, whatever the tool runs (it was read only by `http`
/// tools): the call times out and its command is killed.
#[tokio::test]
async fn a_declared_tools_timeout_bounds_each_call() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
tools:
  slow:
    command: [sh, -c, "echo $$ > pid; exec sleep 30"]
    timeout: 200ms
  wrapped:
    steps:
      - { id: inner, tool: sleep, with: { duration: 1h } }
    timeout: 200ms
  quick:
    command: ["true"]
    timeout: 10s
steps:
  - { id: command, tool: slow }
  - { id: composite, tool: wrapped }
  - { id: quick, tool: quick }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    let ended: Vec<(StepStatus, Option<&str>)> = ["command", "composite", "quick"]
        .iter()
        .map(|id| (report.steps[*id].status, report.steps[*id].error.as_deref()))
        .collect();
    assert_eq!(
        ended,
        [
            (
                StepStatus::TimedOut,
                Some("tool `slow` timed out after 200ms")
            ),
            (
                StepStatus::TimedOut,
                Some("tool `wrapped` timed out after 200ms")
            ),
            (StepStatus::Succeeded, None),
        ]
    );
    let pid = std::fs::read_to_string(dir.path().join("pid")).expect("the command started");
    assert!(
        ends(pid.trim()).await,
        "the command {} is still running",
        pid.trim()
    );
}

/// Issue 13, item 13: a step's `timeout` bounds its fallback too (as a budget of its own), unless the
/// fallback has a `timeout` of its own; `defaults.timeout` applies only when neither says.
#[tokio::test]
async fn a_steps_timeout_bounds_its_fallback() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
defaults: { timeout: 1h }
steps:
  - id: inherits
    tool: sleep
    with: { duration: 1h }
    timeout: 200ms
    fallback: { tool: sleep, with: { duration: 3s } }
  - id: own
    tool: sleep
    with: { duration: 1h }
    timeout: 200ms
    fallback: { tool: sleep, with: { duration: 20ms }, timeout: 1s }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    let ended: Vec<(StepStatus, Option<&str>, bool)> = ["inherits", "own"]
        .iter()
        .map(|id| {
            let r = &report.steps[*id];
            (r.status, r.error.as_deref(), r.fallback)
        })
        .collect();
    assert_eq!(
        ended,
        [
            (StepStatus::TimedOut, Some("timed out after 200ms"), false),
            (StepStatus::Succeeded, None, true),
        ]
    );
}

/// A fallback's own `retry` retries the fallback (it was accepted and ignored).
#[tokio::test]
async fn a_fallback_retries_as_its_retry_says() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - id: flaky
    tool: exec
    with: { argv: ["false"] }
    fallback:
      tool: shell
      with: { command: "n=$(cat n 2>/dev/null || echo 0); n=$((n+1)); echo $n > n; [ $n -ge 3 ]" }
      retry: { attempts: 3, delay: 1ms }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    let flaky = &report.steps["flaky"];
    assert_eq!(
        (flaky.status, flaky.fallback),
        (StepStatus::Succeeded, true)
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("n")).expect("counted"),
        "3\n"
    );
}

/// Issue 13, item 12: `max_parallel` bounds the commands running at once across the whole run, not only
/// the steps: 8 `foreach` steps of 8 items each, at 4, never run more than 4 commands together (each
/// command counts the commands running as it starts; without the run-wide limit, up to 32 did).
#[tokio::test]
async fn max_parallel_bounds_every_command_of_the_run() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::create_dir(dir.path().join("slots")).expect("mkdir");
    let mut yaml = String::from("name: t\nsteps:\n");
    for step in 0..8 {
        yaml.push_str(&format!(
            "  - id: s{step}\n    foreach: \"[1, 2, 3, 4, 5, 6, 7, 8]\"\n    max_parallel: 8\n    tool: shell\n    with: {{ command: \"touch slots/$$; ls slots | wc -l >> counts; sleep 0.2; rm slots/$$\" }}\n"
        ));
    }
    let report = run_yaml(&yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(report.status, RunStatus::Succeeded);
    let counts: Vec<usize> = std::fs::read_to_string(dir.path().join("counts"))
        .expect("counted")
        .lines()
        .map(|l| l.trim().parse().expect("a count"))
        .collect();
    assert_eq!(counts.len(), 64);
    let most = counts.iter().copied().max().unwrap_or(0);
    assert!((1..=4).contains(&most), "{most} commands ran at once");
}

/// `defaults.max_parallel` is the run's limit when `--max-parallel` is not given (it was accepted and
/// ignored); the flag still wins.
#[test]
fn defaults_max_parallel_limits_the_run_unless_the_flag_says_otherwise() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::create_dir(dir.path().join("slots")).expect("mkdir");
    let command = "touch slots/$$; ls slots | wc -l >> counts; sleep 0.2; rm slots/$$";
    let steps: String = (0..4)
        .map(|i| format!("  - {{ id: s{i}, tool: shell, with: {{ command: \"{command}\" }} }}\n"))
        .collect();
    std::fs::write(
        dir.path().join("wf.yaml"),
        format!("name: t\ndefaults: {{ max_parallel: 1 }}\nsteps:\n{steps}"),
    )
    .expect("spec");
    let most = |args: &[&str]| {
        let _ = std::fs::remove_file(dir.path().join("counts"));
        let output = archon(dir.path(), args);
        assert_eq!(output.code, 0, "{}", output.stderr);
        std::fs::read_to_string(dir.path().join("counts"))
            .expect("counted")
            .lines()
            .map(|l| l.trim().parse::<usize>().expect("a count"))
            .max()
    };
    assert_eq!(most(&["run", "wf.yaml"]), Some(1));
    assert!(most(&["run", "wf.yaml", "--max-parallel", "4"]) > Some(1));
}

#[test]
fn archon_run_prints_outputs_and_exits_by_status() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("ok.yaml"), "name: ok\nsteps:\n  - { id: a, tool: echo, with: { v: 1 } }\noutputs:\n  v: \"{{ steps.a.output.v }}\"\n").expect("write");
    std::fs::write(
        dir.path().join("fails.yaml"),
        "name: fails\nsteps:\n  - { id: a, tool: exec, with: { argv: [\"false\"] } }\n",
    )
    .expect("write");

    let Output { code, stdout, .. } =
        archon(dir.path(), &["run", "ok.yaml", "--events", "events.jsonl"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("of `ok` succeeded") && stdout.contains("  v: 1"),
        "{stdout}"
    );
    let events = std::fs::read_to_string(dir.path().join("events.jsonl")).expect("events written");
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<Json>(l).expect("JSON line")["event"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(kinds, ["step_started", "step_finished"]);

    let Output { code, stdout, .. } = archon(dir.path(), &["run", "fails.yaml", "--json"]);
    assert_eq!(code, 1);
    let report: Json = serde_json::from_str(&stdout).expect("report is JSON");
    assert_eq!(
        (report["version"].as_u64(), report["status"].as_str()),
        (Some(1), Some("failed"))
    );
    assert_eq!(report["steps"]["a"]["status"], "failed");

    // An agent step with no provider to ask fails, saying what to configure.
    std::fs::write(
        dir.path().join("agent.yaml"),
        "name: agent\nsteps:\n  - { id: a, goal: Say hi }\n",
    )
    .expect("write");
    let Output { code, stdout, .. } = archon(dir.path(), &["run", "agent.yaml", "--json"]);
    assert_eq!(code, 1);
    let report: Json = serde_json::from_str(&stdout).expect("report is JSON");
    assert_eq!(
        report["steps"]["a"]["error"],
        "no LLM provider is configured: add one under `llm.providers`"
    );

    let Output { code, stderr, .. } = archon(dir.path(), &["run", "ok.yaml", "--input", "nope=1"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown input `nope`"), "{stderr}");
}

/// Ctrl-C (SIGINT) cancels the running steps, kills their process groups and exits 130.
#[test]
fn interrupting_a_run_exits_130_and_kills_commands() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("slow.yaml"),
        "name: slow\nsteps:\n  - { id: a, tool: exec, with: { argv: [sh, -c, \"sleep 30 & echo $! > grandchild.pid; wait\"] } }\n  - { id: b, tool: echo, needs: [a], with: { v: 1 } }\n",
    )
    .expect("write");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "slow.yaml", "--json"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("archon starts");
    let pid_file = dir.path().join("grandchild.pid");
    for _ in 0..200 {
        if std::fs::read_to_string(&pid_file).is_ok_and(|p| !p.trim().is_empty()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let output = child.wait_with_output().expect("archon ends");
    assert_eq!(output.status.code(), Some(130));
    let report: Json = serde_json::from_slice(&output.stdout).expect("report");
    assert_eq!(report["status"], "cancelled");
    assert_eq!(report["steps"]["a"]["status"], "cancelled");
    assert_eq!(report["steps"]["b"]["status"], "cancelled");
    let pid = std::fs::read_to_string(&pid_file).expect("pid written");
    let gone = (0..50).any(|_| {
        let alive = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
            .is_ok_and(|s| !s.contains(") Z "));
        if alive {
            std::thread::sleep(Duration::from_millis(20));
        }
        !alive
    });
    assert!(gone, "grandchild {} survived the interrupt", pid.trim());
}

#[tokio::test]
async fn file_tools_work_inside_the_workspace_and_refuse_to_leave_it() {
    let dir = TempDir::new().expect("tempdir");
    let outside = TempDir::new().expect("tempdir");
    std::fs::write(outside.path().join("secret.txt"), "do not read").expect("write");
    std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).expect("symlink");
    // A dangling link: writing through it would create its target, outside.
    std::os::unix::fs::symlink(
        outside.path().join("created.txt"),
        dir.path().join("dangling"),
    )
    .expect("symlink");
    let yaml = r##"name: t
steps:
  - { id: write, tool: write_file, with: { path: notes/a.md, content: "# A" } }
  - { id: more, tool: write_file, needs: [write], with: { path: notes/deep/b.md, content: "# B" } }
  - { id: append, tool: write_file, needs: [more], with: { path: notes/a.md, content: "!", append: true } }
  - { id: list, tool: list_files, needs: [append], with: { path: notes, pattern: "**/*.md" } }
  - { id: top, tool: list_files, needs: [append], with: { path: notes, pattern: "*.md" } }
  - { id: read, tool: read_file, with: { path: "{{ steps.top.output[0] }}" } }
  - { id: total, tool: calculator, with: { expression: "50 * 20 / 100" } }
  - { id: dotdot, tool: read_file, with: { path: ../x }, on_error: continue }
  - { id: absolute, tool: read_file, with: { path: /etc/passwd }, on_error: continue }
  - { id: symlink, tool: read_file, with: { path: link/secret.txt }, on_error: continue }
  - { id: symlink_write, tool: write_file, with: { path: link/new.txt, content: x }, on_error: continue }
  - { id: dangling_write, tool: write_file, with: { path: dangling, content: x }, on_error: continue }
  - { id: symlink_list, tool: list_files, with: { path: link }, on_error: continue }
"##;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(
        report.steps["list"].output,
        json!(["notes/a.md", "notes/deep/b.md"])
    );
    assert_eq!(report.steps["top"].output, json!(["notes/a.md"]));
    assert_eq!(report.steps["read"].output, "# A!");
    assert_eq!(report.steps["total"].output, json!(10));
    for step in [
        "dotdot",
        "absolute",
        "symlink",
        "symlink_write",
        "dangling_write",
        "symlink_list",
    ] {
        assert_eq!(status(&report, step), StepStatus::Failed, "{step}");
        let error = report.steps[step].error.clone().unwrap_or_default();
        assert!(error.contains("outside the workspace"), "{step}: {error}");
    }
    assert!(!outside.path().join("new.txt").exists());
    assert!(!outside.path().join("created.txt").exists());
    assert_eq!(report.status, RunStatus::Succeeded);
}

#[tokio::test]
async fn json_and_shell_tools() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - { id: data, tool: echo, with: { items: [{ n: 1, tag: a }, { n: 2, tag: b }, { n: 3, tag: a }] } }
  - { id: sum, tool: json, with: { input: "{{ steps.data.output }}", query: "[.items[] | select(.tag == \"a\") | .n] | add" } }
  - { id: each, tool: json, with: { input: "{{ steps.data.output }}", query: ".items[].tag" } }
  - { id: broken, tool: json, with: { input: 1, query: ".[" }, on_error: continue }
  - { id: piped, tool: shell, with: { command: "printf 'b\na\n' | sort | head -1" } }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(report.steps["sum"].output, json!(4));
    assert_eq!(report.steps["each"].output, json!(["a", "b", "a"]));
    assert_eq!(status(&report, "broken"), StepStatus::Failed);
    assert!(
        report.steps["broken"]
            .error
            .clone()
            .unwrap_or_default()
            .contains("invalid jq filter")
    );
    assert_eq!(report.steps["piped"].output, "a");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("readable") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Every bundled workflow this version can run does run, offline, in a copy of `workflows/`.
#[test]
fn runnable_bundled_workflows_succeed() {
    let dir = TempDir::new().expect("tempdir");
    copy_dir(&crate::support::root().join("workflows"), dir.path());
    let mut ran = Vec::new();
    for path in crate::support::spec_files(dir.path()) {
        let workflow = archon_engine::validate_file(&path)
            .workflow
            .expect("bundled workflows are valid");
        // Workflows that call HTTP services need those services: `health_check_runs_against_a_local_server`.
        let calls_http = |steps: &[archon_engine::spec::Step]| {
            steps
                .iter()
                .any(|s| s.tool.as_ref().is_some_and(|t| t.value == "http"))
        };
        let uses_http = calls_http(&workflow.spec.steps)
            || workflow.spec.tools.values().any(|t| {
                t.http.is_some() || t.steps.as_ref().is_some_and(|s| calls_http(&s.value))
            });
        // Workflows that read secrets need credentials, and required inputs values, this test does not have.
        let needs_inputs = workflow
            .spec
            .inputs
            .values()
            .any(|schema| schema.get("default").is_none());
        // Workflows whose models need an API key run offline only from a cassette.
        let needs_key = workflow
            .spec
            .llm
            .as_ref()
            .is_some_and(|l| l.providers.values().any(|p| p.api_key_env.is_some()))
            && !path.with_extension("cassette").exists();
        if uses_http || needs_inputs || needs_key || !workflow.spec.secrets.is_empty() {
            continue;
        }
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let Output {
            code,
            stdout,
            stderr,
        } = {
            // A workflow with a recorded cassette next to it replays its LLM calls, offline.
            let cassette = path.with_extension("cassette");
            if cassette.exists() {
                let cassette = cassette.to_string_lossy().into_owned();
                archon(dir.path(), &["run", &name, "--replay", &cassette, "--yes"])
            } else {
                // A step that asks for approval is approved, as a person at the terminal would.
                archon(dir.path(), &["run", &name, "--yes"])
            }
        };
        assert_eq!(code, 0, "{name}:\n{stdout}\n{stderr}");
        ran.push(name);
    }
    for expected in [
        "hello.yaml",
        "file-pipeline.yaml",
        "file-pipeline.toml",
        "triage.yaml",
        "greet-team.yaml",
        "word-stats.yaml",
        "retry-fallback.yaml",
        "fan-out.yaml",
        "agent-calculator.yaml",
        "agent-notes.yaml",
        "team-review.yaml",
        "word-report.yaml",
    ] {
        assert!(
            ran.iter().any(|r| r == expected),
            "{expected} did not run; these did: {ran:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/REPORT.txt")).expect("written"),
        "3 notes/one.md\n2 notes/two.md"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/RANKING.txt")).expect("written"),
        "3 notes/one.md\n2 notes/two.md\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("mirror/.attempts")).expect("written"),
        "3\n",
        "the flaky step succeeded on its third attempt"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/SUMMARY.txt")).expect("written"),
        "5 words in 2 files"
    );
    let triage = std::fs::read_to_string(dir.path().join("inbox/TRIAGE.txt")).expect("written");
    assert!(
        triage.contains("inbox/big.txt: large") && triage.contains("inbox/note.txt: small"),
        "{triage}"
    );
}

/// A tiny HTTP server on 127.0.0.1 for the tests: `/health` and `/version.json` answer JSON, `/away` redirects to a private
/// address, anything else is 404. It serves `requests` connections, then stops.
fn serve(requests: usize) -> u16 {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(requests) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut request_line = String::new();
            let _ = reader.read_line(&mut request_line);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request_line
                .split_whitespace()
                .nth(1)
                .unwrap_or("/")
                .to_owned();
            let response = match path.as_str() {
                "/health" => {
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\nconnection: close\r\n\r\n{\"ok\":true}"
                }
                "/version.json" => {
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 20\r\nconnection: close\r\n\r\n{\"version\": \"1.4.2\"}"
                }
                "/away" => {
                    "HTTP/1.1 302 Found\r\nlocation: http://10.0.0.1/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                }
                _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 4\r\nconnection: close\r\n\r\nnope",
            };
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

#[tokio::test]
async fn http_refuses_internal_addresses_unless_allowed() {
    let dir = TempDir::new().expect("tempdir");
    let port = serve(3);
    let refused = format!(
        r#"name: t
steps:
  - {{ id: loopback, tool: http, with: {{ url: "http://127.0.0.1:{port}/health" }}, on_error: continue }}
  - {{ id: metadata, tool: http, with: {{ url: "http://169.254.169.254/latest/meta-data/" }}, on_error: continue }}
  - {{ id: private, tool: http, with: {{ url: "http://10.0.0.1/" }}, on_error: continue }}
  - {{ id: decimal, tool: http, with: {{ url: "http://2130706433:{port}/health" }}, on_error: continue }}
  - {{ id: mapped, tool: http, with: {{ url: "http://[::ffff:127.0.0.1]:{port}/health" }}, on_error: continue }}
  - {{ id: named, tool: http, with: {{ url: "http://localhost:{port}/health" }}, on_error: continue }}
  - {{ id: unspecified, tool: http, with: {{ url: "http://0.0.0.0:{port}/health" }}, on_error: continue }}
  - {{ id: hex, tool: http, with: {{ url: "http://0x7f.1:{port}/health" }}, on_error: continue }}
  - {{ id: compatible, tool: http, with: {{ url: "http://[::127.0.0.1]:{port}/health" }}, on_error: continue }}
  - {{ id: nat64, tool: http, with: {{ url: "http://[64:ff9b::169.254.169.254]/latest/meta-data/" }}, on_error: continue }}
  - {{ id: unique_local, tool: http, with: {{ url: "http://[fd00::1]/" }}, on_error: continue }}
"#
    );
    let report = run_yaml(&refused, Map::new(), options(dir.path(), 4)).await;
    for step in [
        "loopback",
        "metadata",
        "private",
        "decimal",
        "mapped",
        "named",
        "unspecified",
        "hex",
        "compatible",
        "nat64",
        "unique_local",
    ] {
        assert_eq!(status(&report, step), StepStatus::Failed, "{step}");
        let error = report.steps[step].error.clone().unwrap_or_default();
        assert!(error.contains("internal address"), "{step}: {error}");
    }
    let allowed = format!(
        r#"name: t
network: {{ allow: ["127.0.0.1"] }}
steps:
  - {{ id: health, tool: http, with: {{ url: "http://127.0.0.1:{port}/health" }} }}
  - {{ id: away, tool: http, with: {{ url: "http://127.0.0.1:{port}/away" }}, on_error: continue }}
  - {{ id: missing, tool: http, with: {{ url: "http://127.0.0.1:{port}/missing" }}, on_error: continue }}
"#
    );
    let report = run_yaml(&allowed, Map::new(), options(dir.path(), 1)).await;
    assert_eq!(report.steps["health"].output["status"], 200, "{report:?}");
    assert_eq!(report.steps["health"].output["json"], json!({ "ok": true }));
    let away = report.steps["away"].error.clone().unwrap_or_default();
    assert!(
        away.contains("redirect refused") && away.contains("10.0.0.1"),
        "{away}"
    );
    let missing = report.steps["missing"].error.clone().unwrap_or_default();
    assert!(missing.contains("HTTP 404"), "{missing}");
}

/// The bundled health check runs against a server the test starts.
#[test]
fn health_check_runs_against_a_local_server() {
    let dir = TempDir::new().expect("tempdir");
    copy_dir(&crate::support::root().join("workflows"), dir.path());
    for spec in ["health-check.yaml", "health-check.toml"] {
        let port = serve(1);
        let url = format!("base_url=http://127.0.0.1:{port}");
        let Output {
            code,
            stdout,
            stderr,
        } = archon(dir.path(), &["run", spec, "--input", &url, "--json"]);
        assert_eq!(code, 0, "{spec}: {stderr}");
        let report: Json = serde_json::from_str(&stdout).expect("report");
        assert_eq!(report["steps"]["healthy"]["status"], "succeeded", "{spec}");
        assert_eq!(report["steps"]["unhealthy"]["status"], "skipped", "{spec}");
        assert_eq!(report["outputs"]["status"], 200, "{spec}");
    }
}

/// The bundled composite tool example fetches two documents from a server the test starts.
#[test]
fn composite_tool_example_runs_against_a_local_server() {
    let dir = TempDir::new().expect("tempdir");
    copy_dir(&crate::support::root().join("workflows"), dir.path());
    for spec in ["composite-tool.yaml", "composite-tool.toml"] {
        let port = serve(2);
        let url = format!("http://127.0.0.1:{port}/version.json");
        let (ours, theirs) = (format!("ours={url}"), format!("theirs={url}"));
        let Output {
            code,
            stdout,
            stderr,
        } = archon(
            dir.path(),
            &["run", spec, "--input", &ours, "--input", &theirs, "--json"],
        );
        assert_eq!(code, 0, "{spec}: {stdout}\n{stderr}");
        let report: Json = serde_json::from_str(&stdout).expect("report");
        assert_eq!(
            report["outputs"],
            json!({ "ours": "1.4.2", "same": true }),
            "{spec}"
        );
        assert_eq!(
            report["steps"]["ours"]["steps"]["get"]["output"]["status"], 200,
            "{spec}: the composite tool's own steps are in the report"
        );
    }
}

/// Regressions: rules and approvals are not enforced yet, so a run refuses rather than ignoring them; and
/// `run.started_at`, which validation accepts, exists at run time.
#[test]
fn rules_deny_and_runs_know_when_they_started() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("ruled.yaml"),
        "name: ruled\nsteps:\n  - { id: a, tool: write_file, with: { path: x.txt, content: x } }\nrules:\n  - { name: no-writes, on: before_tool, match: { tool: write_file }, action: deny, reason: read-only run }\n",
    )
    .expect("write");
    std::fs::write(
        dir.path().join("when.yaml"),
        "name: when\nsteps:\n  - { id: a, tool: echo, with: { at: \"{{ run.started_at }}\" } }\n",
    )
    .expect("write");
    let Output { code, stdout, .. } = archon(dir.path(), &["run", "ruled.yaml", "--json"]);
    assert_eq!(code, 1);
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert_eq!(
        report["steps"]["a"]["error"],
        "denied by rule `no-writes`: read-only run"
    );
    assert!(
        !dir.path().join("x.txt").exists(),
        "the denied write must not happen"
    );
    let Output { code, stdout, .. } = archon(dir.path(), &["run", "when.yaml", "--json"]);
    assert_eq!(code, 0);
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert!(
        report["steps"]["a"]["output"]["at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{report}"
    );
}

/// `steps.<id>` is read lazily from the step's result (it used to be a converted copy): every field is
/// there with its JSON type, the whole value is a map of exactly those fields, and a field that does not
/// exist is still an error.
#[tokio::test]
async fn templates_see_every_field_of_a_step_result() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
steps:
  - id: a
    tool: echo
    with: { v: 1, s: "x" }
    outputs:
      own: "{{ steps.a.outputs }}"
      doubled: "{{ steps.a.output.v * 2 }}"
  - id: b
    tool: echo
    with:
      all: "{{ steps.a }}"
      keys: "{{ steps.a | list }}"
      status: "{{ steps.a.status }}"
      text: "{{ steps.a.text }}"
      attempts: "{{ steps.a.attempts }}"
      error: "{{ steps.a.error }}"
      exit_code: "{{ steps.a.exit_code }}"
      doubled: "{{ steps.a.outputs.doubled }}"
      line: "{{ steps.a.status }}: {{ steps.a.output.s }} {{ steps.a.outputs.doubled }}"
  - { id: c, tool: echo, with: { v: "{{ steps.a['no' ~ 'pe'] }}" } }
"#;
    let report = run_yaml(yaml, Map::new(), options(dir.path(), 4)).await;
    assert_eq!(
        report.steps["a"].outputs,
        *json!({ "own": {}, "doubled": 2 })
            .as_object()
            .expect("an object"),
        "a step's outputs read its result before they are added"
    );
    assert_eq!(
        report.steps["b"].output,
        json!({
            "all": {
                "attempts": 1,
                "error": null,
                "exit_code": null,
                "output": { "s": "x", "v": 1 },
                "outputs": { "doubled": 2, "own": {} },
                "status": "succeeded",
                "text": "{\"v\":1,\"s\":\"x\"}",
            },
            "keys": ["attempts", "error", "exit_code", "output", "outputs", "status", "text"],
            "status": "succeeded",
            "text": "{\"v\":1,\"s\":\"x\"}",
            "attempts": 1,
            "error": null,
            "exit_code": null,
            "doubled": 2,
            "line": "succeeded: x 2",
        })
    );
    assert_eq!(status(&report, "c"), StepStatus::Failed);
    let error = report.steps["c"].error.clone().unwrap_or_default();
    assert!(error.contains("is undefined"), "{error}");
}

/// Steps start only when a slot is free; cancelling the run cancels those still waiting for one, and
/// their dependents, without starting them.
#[tokio::test(start_paused = true)]
async fn cancelling_a_run_cancels_the_steps_waiting_for_a_slot() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = "name: t\nsteps:\n  - { id: a, tool: sleep, with: { duration: 10s } }\n  - { id: b, tool: sleep, with: { duration: 10s } }\n  - { id: c, tool: sleep, with: { duration: 10s } }\n  - { id: d, tool: echo, needs: [c], with: { v: 1 } }\n";
    let options = options(dir.path(), 1);
    let cancel = options.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        cancel.cancel();
    });
    let started = tokio::time::Instant::now();
    let report = run_yaml(yaml, Map::new(), options).await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(report.status, RunStatus::Cancelled);
    for step in ["a", "b", "c", "d"] {
        assert_eq!(status(&report, step), StepStatus::Cancelled, "{step}");
        assert_eq!(report.steps[step].error, None, "{step}");
    }
}

/// Records what a run records, as `kind step` lines.
#[derive(Debug, Default)]
struct Recorded(std::sync::Mutex<Vec<String>>);

impl archon_engine::store::Journal for Recorded {
    fn record(&self, entry: archon_engine::store::Entry) {
        use archon_engine::store::Entry;
        let line = match &entry {
            Entry::AttemptStarted { step, .. } => format!("attempt {step}"),
            Entry::AttemptEnded { step, status, .. } => format!("ended {step} {}", status.as_str()),
            Entry::StepFinished { step, result } => {
                format!("finished {step} {}", result.status.as_str())
            }
            Entry::RunEnded { status, .. } => format!("run ended {}", status.as_str()),
            _ => return,
        };
        self.0.lock().expect("lines").push(line);
    }

    fn flush(&self) -> archon_engine::store::Ack {
        archon_engine::store::Ack::done()
    }
}

/// Steps handed out one at a time (`run::run_step`, as workers take them), each with the results of
/// the steps before it, then the run ended by `run::run` over all their results: the same statuses,
/// outputs and items as one run of the whole workflow, each step recorded once and the run's end only
/// by the last call.
#[tokio::test]
async fn steps_run_one_at_a_time_end_as_the_whole_run_does() {
    let dir = TempDir::new().expect("tempdir");
    let yaml = r#"name: t
inputs:
  names: { type: array, default: [ada, grace] }
steps:
  - { id: first, tool: echo, with: { n: 2 } }
  - id: each
    foreach: inputs.names
    tool: echo
    with: { hello: "{{ item }}", n: "{{ steps.first.output.n }}" }
  - { id: off, if: "1 > 2", tool: echo, with: { x: 1 } }
  - { id: broken, tool: exec, with: { argv: ["false"] }, on_error: continue }
  - { id: after_broken, tool: echo, needs: [broken], with: { x: 1 } }
  - id: last
    tool: echo
    needs: [off]
    if: "steps.off.status == 'skipped'"
    with: { greeted: "{{ steps.each.output | map(attribute='hello') | join(',') }}" }
outputs:
  greeted: "{{ steps.last.output.greeted }}"
  broken: "{{ steps.broken.status }}"
"#;
    let validation = validate_source("test.yaml", yaml);
    assert!(
        validation.diagnostics.is_empty(),
        "{:?}",
        validation.diagnostics
    );
    let workflow = Arc::new(validation.workflow.expect("valid"));
    let inputs =
        archon_engine::inputs::resolve(&workflow.spec, Map::new(), &[]).expect("inputs resolve");
    let whole = run::run(workflow.clone(), inputs.clone(), options(dir.path(), 4))
        .await
        .expect("runs");

    let journal = Arc::new(Recorded::default());
    let mut prior = std::collections::HashMap::new();
    for &i in &workflow.order {
        let id = workflow.spec.steps[i].id.value.clone();
        let mut options = options(dir.path(), 4);
        options.prior = Arc::new(prior.clone());
        options.journal = journal.clone();
        let result = run::run_step(workflow.clone(), inputs.clone(), options, &id)
            .await
            .expect("the step runs");
        prior.insert(id, Arc::unwrap_or_clone(result));
    }
    let mut options = options(dir.path(), 4);
    options.prior = Arc::new(prior);
    options.journal = journal.clone();
    let stepwise = run::run(workflow.clone(), inputs, options)
        .await
        .expect("ends");

    assert_eq!(stepwise.status, whole.status);
    assert_eq!(stepwise.outputs, whole.outputs);
    assert_eq!(
        stepwise.outputs,
        json!({"greeted": "ada,grace", "broken": "failed"})
            .as_object()
            .cloned()
            .expect("map")
    );
    for (id, result) in &whole.steps {
        let other = &stepwise.steps[id];
        assert_eq!(
            (other.status, &other.output),
            (result.status, &result.output),
            "{id}"
        );
    }
    let mut lines = journal.0.lock().expect("lines").clone();
    // Items run in parallel: their lines keep their own order only.
    lines.sort();
    assert_eq!(
        lines,
        [
            "attempt broken",
            "attempt each[0]",
            "attempt each[1]",
            "attempt first",
            "attempt last",
            "ended broken failed",
            "ended each[0] succeeded",
            "ended each[1] succeeded",
            "ended first succeeded",
            "ended last succeeded",
            "finished after_broken skipped",
            "finished broken failed",
            "finished each succeeded",
            "finished each[0] succeeded",
            "finished each[1] succeeded",
            "finished first succeeded",
            "finished last succeeded",
            "finished off skipped",
            "run ended succeeded",
        ]
    );
}

/// A step handed out before a step it needs has ended is refused, naming that step.
#[tokio::test]
async fn a_step_whose_dependency_has_not_ended_is_refused() {
    let dir = TempDir::new().expect("tempdir");
    let validation = validate_source(
        "test.yaml",
        "name: t\nsteps:\n  - { id: a, tool: echo, with: { x: 1 } }\n  - { id: b, tool: echo, needs: [a], with: { x: 2 } }\n",
    );
    let workflow = Arc::new(validation.workflow.expect("valid"));
    let error = run::run_step(workflow.clone(), Map::new(), options(dir.path(), 1), "b")
        .await
        .expect_err("refused");
    assert_eq!(
        error.to_string(),
        "step `b` cannot run yet: `a`, which it needs, has not ended"
    );
    let error = run::run_step(workflow, Map::new(), options(dir.path(), 1), "c")
        .await
        .expect_err("refused");
    assert_eq!(error.to_string(), "the workflow `t` has no step `c`");
}
