//! `archon mcp list` and `archon tools --refresh` against the MCP test server
//! (`examples/mcp_test_server.rs`): the servers are started and listed, their lists kept in the state
//! directory, and `archon validate` then checks MCP calls against them without starting anything.

use std::path::Path;

use crate::support::{Output, archon_with};

/// A workspace holding `spec.yaml`, whose state directory is `state` in it.
fn workspace(spec: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("spec.yaml"), spec).expect("written");
    dir
}

/// `archon ARGS` in `dir`, with the test server's path in `MCP_TEST_SERVER` and the state in `state`.
fn archon(dir: &Path, args: &[&str]) -> Output {
    let server = crate::support::mcp_fixture();
    archon_in(dir, args, server.to_str().expect("UTF-8 path"))
}

fn archon_in(dir: &Path, args: &[&str], server: &str) -> Output {
    archon_with(
        dir,
        args,
        &[("MCP_TEST_SERVER", server), ("ARCHON_STATE_DIR", "state")],
    )
}

/// The names of the lists kept in `dir/state/mcp`.
fn kept(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("state/mcp"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Snapshots with the listing times (`on 2026-11-26 at 18:30 UTC`) as `on [DATE]`.
macro_rules! snapshot {
    ($name:expr, $text:expr) => {
        insta::with_settings!({ filters => vec![
            (r"on \d{4}-\d{2}-\d{2} at \d{2}:\d{2} UTC", "on [DATE]"),
        ]}, {
            insta::assert_snapshot!($name, $text);
        })
    };
}

const SPEC: &str = r#"name: listed
tools:
  fixture:
    description: The test server
    mcp:
      command: ["{{ env.MCP_TEST_SERVER }}"]
      tools: ["e*", "s*"]
steps:
  - id: hello
    tool: fixture.echo
    with: { message: hi }
  - id: add
    tool: fixture.sum
    with: { a: 1, b: two }
  - id: typo
    tool: fixture.ecko
    with: { message: hi }
"#;

#[test]
fn mcp_list_keeps_the_tool_lists_that_validate_then_checks_calls_against() {
    let dir = workspace(SPEC);

    // Before any listing: one warning per server, and the calls are not checked.
    let before = archon(dir.path(), &["validate", "spec.yaml"]);
    assert_eq!(before.code, 0, "{}", before.stdout);
    snapshot!("validate_before_listing", before.stdout);

    let listed = archon(dir.path(), &["mcp", "list", "spec.yaml"]);
    assert_eq!(listed.code, 0, "{}{}", listed.stdout, listed.stderr);
    snapshot!("mcp_list", listed.stdout);
    let files = kept(dir.path());
    assert_eq!(files.len(), 1, "{files:?}");
    let list: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("state/mcp").join(&files[0])).expect("kept"),
    )
    .expect("JSON");
    assert_eq!(list["server"], "fixture");
    let names: Vec<&str> = list["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["echo", "sum", "slow", "env"],
        "the tools the `tools` globs allow, in the server's order"
    );

    // After: the calls are checked against the list, and nothing is started (the server is gone).
    let after = archon_in(dir.path(), &["validate", "spec.yaml"], "/nonexistent");
    assert_eq!(after.code, 2, "{}", after.stdout);
    snapshot!("validate_after_listing", after.stdout);

    // The same, as JSON.
    let json = archon(dir.path(), &["mcp", "list", "spec.yaml", "--json"]);
    assert_eq!(json.code, 0, "{}", json.stderr);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(report["servers"][0]["server"], "fixture");
    assert_eq!(
        report["servers"][0]["key"],
        files[0].trim_end_matches(".json")
    );
    assert_eq!(report["servers"][0]["tools"], list["tools"]);
}

#[test]
fn a_server_that_cannot_start_is_reported_and_the_others_are_still_listed() {
    let dir = workspace(
        r#"name: half
tools:
  broken:
    mcp:
      command: ["{{ env.MCP_TEST_SERVER }}", --crash-at-start]
  fixture:
    mcp:
      command: ["{{ env.MCP_TEST_SERVER }}"]
      tools: [echo]
steps:
  - id: hello
    tool: fixture.echo
    with: { message: hi }
"#,
    );
    let listed = archon(dir.path(), &["mcp", "list", "spec.yaml"]);
    assert_eq!(listed.code, 1, "{}{}", listed.stdout, listed.stderr);
    snapshot!("mcp_list_with_a_server_that_cannot_start", listed.stdout);
    assert_eq!(kept(dir.path()).len(), 1, "only the server that started");

    let json = archon(dir.path(), &["mcp", "list", "spec.yaml", "--json"]);
    assert_eq!(json.code, 1);
    let report: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(report["servers"][0]["server"], "broken");
    assert_eq!(
        report["servers"][0]["error"],
        "MCP server `broken` exited with status 2 during `initialize`: boom: this server cannot start"
    );
    assert_eq!(report["servers"][0].get("tools"), None);
    assert_eq!(report["servers"][1]["tools"][0]["name"], "echo");
}

#[test]
fn tools_refresh_lists_and_keeps_the_tools_that_tools_then_shows() {
    let dir = workspace(SPEC);
    let declared = |output: &Output| -> String {
        let at = output
            .stdout
            .find("tools `spec.yaml` declares")
            .unwrap_or_else(|| panic!("no declared tools in {}", output.stdout));
        output.stdout[at..].to_owned()
    };

    let before = archon(dir.path(), &["tools", "spec.yaml"]);
    assert_eq!(before.code, 0, "{}", before.stderr);
    snapshot!("tools_before_listing", declared(&before));

    let refreshed = archon(dir.path(), &["tools", "spec.yaml", "--refresh"]);
    assert_eq!(refreshed.code, 0, "{}", refreshed.stderr);
    snapshot!("tools_refresh", declared(&refreshed));
    assert_eq!(kept(dir.path()).len(), 1);

    let after = archon_in(dir.path(), &["tools", "spec.yaml"], "/nonexistent");
    assert_eq!(after.code, 0, "{}", after.stderr);
    snapshot!("tools_after_listing", declared(&after));

    let json = archon_in(
        dir.path(),
        &["tools", "spec.yaml", "--json"],
        "/nonexistent",
    );
    let tools: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    let server = tools
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "fixture")
        .expect("the server");
    assert_eq!(server["tools"][1]["name"], "sum");
    assert!(server["listed_at"].as_u64().is_some(), "{server}");
    assert_eq!(server["error"], serde_json::Value::Null);
}

/// Ctrl-C while a server is starting stops it (it is in a process group of its own, which the terminal's
/// SIGINT does not reach) and keeps no list.
#[test]
fn ctrl_c_during_mcp_list_stops_the_server_being_started() {
    let dir = workspace(
        "name: m\ntools:\n  mute:\n    mcp: { command: [sh, -c, \"echo $$ > pid; exec sleep 600\"] }\nsteps:\n  - { id: a, tool: echo, with: { message: hi } }\n",
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["mcp", "list", "spec.yaml"])
        .current_dir(dir.path())
        .env("NO_COLOR", "1")
        .env("ARCHON_STATE_DIR", "state")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("archon starts");
    let pid_file = dir.path().join("pid");
    let started = crate::support::wait_until(std::time::Duration::from_secs(20), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'))
    });
    assert!(started, "the server never started");
    let server = std::fs::read_to_string(&pid_file).expect("pid");
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let exited = crate::support::wait_until(std::time::Duration::from_secs(10), || {
        child.try_wait().expect("try_wait").is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("output");
    let gone = crate::support::wait_until(std::time::Duration::from_secs(5), || {
        std::fs::read_to_string(format!("/proc/{}/stat", server.trim()))
            .map_or(true, |stat| stat.contains(") Z "))
    });
    if !gone {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", server.trim()])
            .status();
    }
    assert_eq!(
        (
            exited,
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
            gone
        ),
        (
            true,
            Some(1),
            "error: interrupted: the MCP servers started were stopped and no tool list was kept\n"
                .to_owned(),
            true
        )
    );
    assert_eq!(kept(dir.path()), Vec::<String>::new());
}
