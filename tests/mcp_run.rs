//! MCP tools in runs, through the CLI: `tool:` steps and agents call the tools of a declared server (the
//! test server, `examples/mcp_test_server.rs`), which starts on first use and stops with the run; an
//! agent's call asks for approval, models see names they accept, secrets in results are masked, and rules
//! match `<server>.<tool>` globs.

use std::path::Path;

use serde_json::{Value as Json, json};
use tempfile::TempDir;

use crate::support::{Output, archon, mcp_fixture};

/// A workflow whose server `fx` is the test server, started with `flags`, followed by `rest`.
fn spec(flags: &[&str], rest: &str) -> String {
    let mut argv = vec![format!("{:?}", mcp_fixture().display().to_string())];
    argv.extend(flags.iter().map(|f| format!("{f:?}")));
    format!(
        "name: m\ntools:\n  fx:\n    mcp:\n      command: [{}]\n{rest}",
        argv.join(", ")
    )
}

fn write(dir: &Path, text: &str) {
    std::fs::write(dir.join("m.yaml"), text).expect("write");
}

/// `archon run m.yaml --no-input --json` in `dir`.
fn run(dir: &Path) -> Output {
    archon(dir, &["run", "m.yaml", "--no-input", "--json"])
}

fn report(stdout: &str) -> Json {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("a report: {e}\n{stdout}"))
}

/// A line of `show --events` without its time (`0.611s`), trimmed.
fn without_time(line: &str) -> &str {
    let line = line.trim();
    match line.split_once(' ') {
        Some((time, rest))
            if time
                .strip_suffix('s')
                .is_some_and(|t| t.parse::<f64>().is_ok()) =>
        {
            rest.trim()
        }
        _ => line,
    }
}

/// Whether process `pid` still exists (a zombie counts as gone).
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim()
            .starts_with('Z')
    })
}

#[test]
fn steps_call_mcp_tools_and_the_server_and_its_children_stop_with_the_run() {
    let dir = TempDir::new().expect("tempdir");
    let steps = "steps:\n  - { id: echo, tool: fx.echo, with: { message: hello } }\n  - { id: sum, tool: fx.sum, with: { a: 19, b: 23 } }\noutputs:\n  echo: \"{{ steps.echo.output }}\"\n  sum: \"{{ steps.sum.output }}\"\n";
    write(
        dir.path(),
        &spec(
            &[
                "--pid-file",
                "server.pid",
                "--grandchild",
                "child.pid",
                "--detached",
                "detached.pid",
            ],
            steps,
        ),
    );
    let Output {
        code,
        stdout,
        stderr,
    } = run(dir.path());
    assert_eq!(code, 0, "{stderr}");
    let report = report(&stdout);
    assert_eq!(report["outputs"]["echo"], "hello");
    assert_eq!(report["steps"]["sum"]["output"], json!({ "sum": 42.0 }));
    for file in ["server.pid", "child.pid", "detached.pid"] {
        let pid = std::fs::read_to_string(dir.path().join(file)).expect("the server wrote its pid");
        if alive(pid.trim()) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid.trim()])
                .status();
            panic!("{file}: process {pid} outlived the run");
        }
    }
}

#[test]
fn an_agent_chooses_an_mcp_tool_under_a_name_models_accept_and_waits_for_approval() {
    let dir = TempDir::new().expect("tempdir");
    let rest = "llm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - tool_calls: [{ name: fx__echo, arguments: { message: from the agent } }]\n        - text: done\nsteps:\n  - { id: ask, goal: say something, tools: [\"fx.*\"] }\n";
    write(dir.path(), &spec(&[], rest));
    let Output {
        code,
        stdout,
        stderr,
    } = run(dir.path());
    assert_eq!(code, 3, "an MCP tool is sensitive: {stderr}");
    let id = report(&stdout)["run_id"].as_str().expect("id").to_owned();
    let Output { code, stderr, .. } = archon(dir.path(), &["approve", &id, "--step", "ask"]);
    assert_eq!(code, 0, "{stderr}");
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id, "--no-input"]);
    assert_eq!(code, 0, "{stderr}");
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json"]);
    let run = report(&stdout);
    assert_eq!(run["status"], "succeeded");
    assert_eq!(run["approvals"][0]["request"]["tool"], "fx.echo");
    assert_eq!(run["approvals"][0]["decision"]["approved"], true);
    // Events, rules and approvals name the tool `fx.echo`; the model called it `fx__echo`.
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--events"]);
    let lines: Vec<&str> = stdout.lines().map(without_time).collect();
    let observed = lines
        .iter()
        .position(|l| *l == "observed  ask #1: fx.echo ->")
        .unwrap_or_else(|| panic!("an observation of `fx.echo`:\n{stdout}"));
    assert_eq!(lines[observed + 1], "from the agent", "{stdout}");
}

#[test]
fn a_secret_in_a_result_is_masked_and_reaches_the_server_only_through_its_env() {
    let dir = TempDir::new().expect("tempdir");
    let mut text = spec(
        &[],
        "secrets: [MCP_TOKEN]\nsteps:\n  - { id: own, tool: fx.env, with: { name: MCP_TOKEN } }\n  - { id: passed, tool: fx.env, with: { name: PASSED } }\noutputs:\n  own: \"{{ steps.own.output }}\"\n  passed: \"{{ steps.passed.output }}\"\n",
    );
    text = text.replace(
        "      command:",
        "      env: { PASSED: \"{{ secrets.MCP_TOKEN }}\" }\n      command:",
    );
    write(dir.path(), &text);
    let Output {
        code,
        stdout,
        stderr,
    } = crate::support::archon_with(
        dir.path(),
        &["run", "m.yaml", "--no-input", "--json"],
        &[("MCP_TOKEN", "hunter2-secret-value")],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("hunter2"), "{stdout}");
    let report = report(&stdout);
    assert_eq!(
        report["outputs"],
        json!({ "own": "", "passed": "***" }),
        "the server does not inherit the secret; it gets what its env passes, masked in results"
    );
    let Output { stdout, .. } = archon(dir.path(), &["show", "--last", "--json"]);
    assert!(!stdout.contains("hunter2"), "{stdout}");
}

#[test]
fn variables_an_mcp_servers_file_passes_to_env_or_url_are_masked_like_secrets() {
    let dir = TempDir::new().expect("tempdir");
    let fixture = mcp_fixture().display().to_string();
    std::fs::write(
        dir.path().join(".mcp.json"),
        json!({ "mcpServers": {
            "fx": { "command": fixture, "env": { "GH_TOKEN": "${IMPORTED_TOKEN}" } },
            "down": { "url": "http://127.0.0.1:1/mcp?key=${IMPORTED_KEY}" },
        }})
        .to_string(),
    )
    .expect("write");
    write(
        dir.path(),
        "name: m\nnetwork:\n  allow: [\"127.0.0.1\"]\ntools:\n  fx:\n    mcp: { from: .mcp.json }\n  down:\n    mcp: { from: .mcp.json }\nsteps:\n  - { id: token, tool: fx.env, with: { name: GH_TOKEN } }\n  - { id: key, tool: down.any, with: {}, on_error: continue }\noutputs:\n  token: \"{{ steps.token.output }}\"\n",
    );
    let env = [
        ("IMPORTED_TOKEN", "ghp-imported-token-value"),
        ("IMPORTED_KEY", "imported-api-key-value"),
    ];
    let Output {
        code,
        stdout,
        stderr,
    } = crate::support::archon_with(dir.path(), &["run", "m.yaml", "--no-input", "--json"], &env);
    assert_eq!(code, 0, "{stderr}");
    let report = report(&stdout);
    assert_eq!(report["outputs"], json!({ "token": "***" }), "{stdout}");
    let error = report["steps"]["key"]["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("cannot reach MCP server `down` at `http://127.0.0.1:1/mcp?key=***`"),
        "{error}"
    );
    for args in [
        &["show", "--last", "--json"][..],
        &["mcp", "list", "m.yaml"],
    ] {
        let Output { stdout, .. } = crate::support::archon_with(dir.path(), args, &env);
        assert!(!stdout.contains("imported-"), "{args:?}: {stdout}");
        assert!(stdout.contains("***"), "{args:?}: {stdout}");
    }
    assert!(!stderr.contains("imported-"), "{stderr}");
}

#[test]
fn two_tools_under_one_model_name_fail_the_step_naming_both() {
    let dir = TempDir::new().expect("tempdir");
    let rest = "  fx__echo:\n    command: [echo, hi]\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - text: done\nsteps:\n  - { id: ask, goal: say something, tools: [fx__echo, \"fx.*\"] }\n";
    write(dir.path(), &spec(&[], rest));
    let Output {
        code,
        stdout,
        stderr,
    } = run(dir.path());
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(
        report(&stdout)["steps"]["ask"]["error"],
        "tools `fx__echo` and `fx.echo` would both reach the model as `fx__echo`"
    );
}

#[test]
fn rules_match_mcp_tools_by_glob() {
    let dir = TempDir::new().expect("tempdir");
    let rest = "steps:\n  - { id: echo, tool: fx.echo, with: { message: hello } }\nrules:\n  - { name: no-fx, on: before_tool, match: { tool: \"fx.ec*\" }, action: deny, reason: not today }\n";
    write(dir.path(), &spec(&[], rest));
    let Output {
        code,
        stdout,
        stderr,
    } = run(dir.path());
    assert_eq!(code, 1, "{stderr}");
    let error = report(&stdout)["steps"]["echo"]["error"].clone();
    assert!(
        error.as_str().is_some_and(|e| e.contains("not today")),
        "{error}"
    );
}

#[test]
fn the_bundled_example_runs_against_the_reference_server() {
    // The example starts the pinned server with npx; Node must be there (and the package reachable).
    if crate::support::npm_bin("mcp-server-everything").is_none() {
        return;
    }
    let dir = TempDir::new().expect("tempdir");
    let example = crate::support::root().join("workflows/mcp-everything.yaml");
    let example = example.to_str().expect("a UTF-8 path");
    let state = dir.path().join("state");
    let state = state.to_str().expect("a UTF-8 path");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(
        dir.path(),
        &["run", example, "--no-input", "--json", "--state-dir", state],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        report(&stdout)["outputs"],
        json!({
            "echo": "Echo: hello from archon",
            "sum": "The sum of 19 and 23 is 42.",
            "weather": { "conditions": "Cloudy", "humidity": 82, "temperature": 33 },
            "progress": "Long running operation completed. Duration: 2 seconds, Steps: 4.",
        })
    );
}

#[test]
fn after_a_crash_an_mcp_call_is_in_doubt_unless_its_server_is_idempotent() {
    let dir = TempDir::new().expect("tempdir");
    let fixture = format!("{:?}", mcp_fixture().display().to_string());
    let text = format!(
        "name: m\ntools:\n  fx:\n    mcp: {{ command: [{fixture}, --grandchild, child.pid] }}\n  fy:\n    mcp: {{ command: [{fixture}] }}\n    idempotent: true\nsteps:\n  - {{ id: effect, tool: fx.slow, with: {{ ticks: 0, interval_ms: 0, answer: false }} }}\n  - {{ id: lookup, tool: fy.slow, with: {{ ticks: 0, interval_ms: 0, answer: false }} }}\n"
    );
    write(dir.path(), &text);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "m.yaml", "--no-input"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("archon starts");
    // Both calls are under way once both attempts are recorded (an attempt is durable before its call),
    // and `effect`'s server is running once its process group is recorded for it.
    let started = std::time::Instant::now();
    let id = loop {
        let Output { stdout, .. } = archon(dir.path(), &["show", "--last", "--json"]);
        if let Ok(run) = serde_json::from_str::<Json>(&stdout)
            && let Some(attempts) = run["attempts"].as_array()
            && attempts.len() == 2
            && attempts
                .iter()
                .any(|a| a["step"] == "effect" && !a["pgid"].is_null())
        {
            break run["id"].as_str().expect("id").to_owned();
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the calls never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id, "--no-input"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`effect`") && !stderr.contains("`lookup`"),
        "only the call of the server that is not idempotent is in doubt: {stderr}"
    );
    // The server's process group is recorded for the step whose call started it: what outlived the
    // crash (the server's child) is known, and a resume that reruns the step stops it first.
    let child = std::fs::read_to_string(dir.path().join("child.pid")).expect("a child");
    assert!(
        stderr.contains("`effect` (its command is still running: process group `"),
        "{stderr}"
    );
    let _ = std::process::Command::new("kill")
        .args(["-KILL", child.trim()])
        .status();
}

#[test]
fn a_steps_timeout_cancels_its_mcp_call_on_the_server() {
    let dir = TempDir::new().expect("tempdir");
    let steps = "steps:\n  - { id: wait, tool: fx.slow, with: { ticks: 0, interval_ms: 0, answer: false }, timeout: 1s, on_error: continue }\n  - { id: after, needs: [wait], if: \"true\", tool: fx.echo, with: { message: next } }\n";
    write(dir.path(), &spec(&["--log", "calls.log"], steps));
    let Output {
        code,
        stdout,
        stderr,
    } = run(dir.path());
    assert_eq!(code, 0, "{stderr}");
    let report = report(&stdout);
    assert_eq!(report["steps"]["wait"]["status"], "timed_out");
    assert_eq!(report["steps"]["after"]["output"], "next");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("calls.log")).expect("the server logged"),
        "call slow\nstarted slow\ncancelled slow\ncall echo\n",
        "the server hears of the cancellation as soon as the step times out"
    );
}

/// A `timeout` on the server's tool definition bounds each call of its tools, as a step's does.
#[test]
fn the_servers_timeout_bounds_each_call_and_cancels_it_on_the_server() {
    let dir = TempDir::new().expect("tempdir");
    let steps = "    timeout: 1s\nsteps:\n  - { id: wait, tool: fx.slow, with: { ticks: 0, interval_ms: 0, answer: false }, on_error: continue }\n  - { id: after, needs: [wait], if: \"true\", tool: fx.echo, with: { message: next } }\n";
    write(dir.path(), &spec(&["--log", "calls.log"], steps));
    let Output {
        code,
        stdout,
        stderr,
    } = run(dir.path());
    assert_eq!(code, 0, "{stderr}");
    let report = report(&stdout);
    assert_eq!(
        (
            &report["steps"]["wait"]["status"],
            &report["steps"]["wait"]["error"]
        ),
        (
            &json!("timed_out"),
            &json!("tool `fx.slow` timed out after 1s")
        )
    );
    assert_eq!(report["steps"]["after"]["output"], "next");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("calls.log")).expect("the server logged"),
        "call slow\nstarted slow\ncancelled slow\ncall echo\n"
    );
}
