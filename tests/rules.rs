//! Interception rules and approvals, end to end through the CLI: a run pauses for approval (exit 3), the
//! decision is recorded with `archon approve`, and `archon resume` continues it with exactly one execution.

use serde_json::Value as Json;
use tempfile::TempDir;

use crate::support::{Output, archon};

const APPROVE: &str = r#"name: approve
steps:
  - id: pay
    tool: exec
    approval: required
    with: { argv: ["sh", "-c", "echo paid >> effects.txt"] }
  - id: after
    tool: echo
    with: { done: "{{ steps.pay.exit_code }}" }
"#;

fn run_id(stdout: &str) -> String {
    let report: Json = serde_json::from_str(stdout).expect("report");
    report["run_id"].as_str().expect("id").to_owned()
}

#[test]
fn a_run_pauses_for_approval_and_resumes_with_exactly_one_execution() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("approve.yaml"), APPROVE).expect("write");
    let Output {
        code,
        stdout,
        stderr,
    } = archon(dir.path(), &["run", "approve.yaml", "--no-input", "--json"]);
    assert_eq!(code, 3, "{stderr}");
    let id = run_id(&stdout);
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert_eq!(report["status"], "waiting_approval");
    assert_eq!(report["steps"]["pay"]["status"], "waiting_approval");
    assert_eq!(report["steps"]["after"]["status"], "waiting_approval");
    assert!(!dir.path().join("effects.txt").exists(), "nothing ran");

    // Resuming before a decision pauses again, still without running anything.
    let Output { code, .. } = archon(dir.path(), &["resume", &id, "--no-input"]);
    assert_eq!(code, 3);
    assert!(!dir.path().join("effects.txt").exists());

    let Output {
        code,
        stdout,
        stderr,
    } = archon(
        dir.path(),
        &[
            "approve",
            &id,
            "--step",
            "pay",
            "--reason",
            "invoice checked",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("approved pay: `exec`"), "{stdout}");
    let Output { code, stderr, .. } = archon(dir.path(), &["approve", &id]);
    assert_eq!(code, 2, "nothing is left to approve: {stderr}");

    let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id, "--no-input"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("ran"),
        "paid\n",
        "exactly one execution"
    );
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json"]);
    let run: Json = serde_json::from_str(&stdout).expect("run");
    assert_eq!(run["status"], "succeeded");
    let approval = &run["approvals"][0];
    assert_eq!(approval["decision"]["approved"], true);
    assert_eq!(approval["decision"]["reason"], "invoice checked");
}

#[test]
fn a_denied_call_fails_its_step_and_yes_approves_and_says_so() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("approve.yaml"), APPROVE).expect("write");
    let Output { stdout, .. } =
        archon(dir.path(), &["run", "approve.yaml", "--no-input", "--json"]);
    let id = run_id(&stdout);
    let Output { code, .. } = archon(
        dir.path(),
        &["approve", &id, "--deny", "--reason", "not today"],
    );
    assert_eq!(code, 0);
    let Output { code, stdout, .. } = archon(dir.path(), &["resume", &id, "--json"]);
    assert_eq!(code, 1);
    let report: Json = serde_json::from_str(&stdout).expect("report");
    assert!(
        report["steps"]["pay"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("denied by") && e.ends_with("not today")),
        "{report}"
    );
    assert!(!dir.path().join("effects.txt").exists());

    let Output { code, stderr, .. } = archon(dir.path(), &["run", "approve.yaml", "--yes"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("approved  pay exec by --yes"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects.txt")).expect("ran"),
        "paid\n"
    );
}

#[test]
fn an_approval_holds_only_for_the_arguments_it_was_given_for() {
    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: bound
steps:
  - id: pay
    tool: exec
    with: { argv: ["sh", "-c", "echo paid 5 >> effects.txt"] }
rules:
  - { name: payments, on: before_tool, match: { tool: exec }, action: ask }
"#;
    std::fs::write(dir.path().join("bound.yaml"), spec).expect("write");
    let Output { code, stdout, .. } =
        archon(dir.path(), &["run", "bound.yaml", "--no-input", "--json"]);
    assert_eq!(code, 3);
    let id = run_id(&stdout);
    let Output { code, .. } = archon(dir.path(), &["approve", &id]);
    assert_eq!(code, 0);
    // The spec now pays another amount: the approval was for the old arguments.
    std::fs::write(
        dir.path().join("bound.yaml"),
        spec.replace("paid 5", "paid 500"),
    )
    .expect("write");
    let Output { code, stderr, .. } = archon(
        dir.path(),
        &["resume", &id, "--no-input", "--allow-changed-spec"],
    );
    assert_eq!(code, 3, "asked again: {stderr}");
    assert!(!dir.path().join("effects.txt").exists());
}
