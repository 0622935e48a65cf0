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

mod behaviours {
    //! One workflow per rule behaviour, run in process with a scripted model where an LLM is involved.

    use archon_engine::run::{RunEvent, RunStatus, StepStatus};
    use archon_engine::spec::Action;
    use serde_json::json;
    use tempfile::TempDir;

    use crate::agent::run_agent;

    fn rule_events(events: &[RunEvent]) -> Vec<(String, Action)> {
        events
            .iter()
            .filter_map(|e| match e {
                RunEvent::RuleMatched { rule, action, .. } => Some((rule.clone(), *action)),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_condition_over_the_arguments_decides_whether_a_rule_fits() {
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: r\nsteps:\n  - { id: small, tool: echo, with: { amount: 5 } }\n  - { id: large, tool: echo, with: { amount: 500 } }\nrules:\n  - { name: limit, on: before_tool, match: { tool: echo, if: \"args.amount > 100\" }, action: deny, reason: too much }\n";
        let (report, _) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.steps["small"].status, StepStatus::Succeeded);
        assert_eq!(report.steps["large"].status, StepStatus::Failed);
        assert_eq!(
            report.steps["large"].error.as_deref(),
            Some("denied by rule `limit`: too much")
        );
    }

    #[tokio::test]
    async fn deny_beats_ask_beats_allow_and_log_goes_along() {
        let dir = TempDir::new().expect("tempdir");
        let rules = "rules:\n  - { name: yes, on: before_tool, action: allow }\n  - { name: maybe, on: before_tool, action: ask }\n  - { name: no, on: before_tool, match: { step: b }, action: deny }\n  - { name: seen, on: before_tool, action: log }\n";
        let yaml = format!(
            "name: r\nsteps:\n  - {{ id: a, tool: echo, with: {{ v: 1 }} }}\n  - {{ id: b, tool: echo, with: {{ v: 2 }} }}\n{rules}"
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        assert_eq!(
            report.steps["a"].status,
            StepStatus::WaitingApproval,
            "ask beats allow"
        );
        assert_eq!(
            report.steps["b"].status,
            StepStatus::Failed,
            "deny beats ask"
        );
        assert_eq!(report.status, RunStatus::WaitingApproval);
        let matched = rule_events(&events);
        assert!(
            matched.contains(&("seen".to_owned(), Action::Log)),
            "{matched:?}"
        );
        assert!(
            matched.contains(&("no".to_owned(), Action::Deny)),
            "{matched:?}"
        );
    }

    #[tokio::test]
    async fn before_run_and_after_step_rules() {
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: r\nsteps:\n  - { id: a, tool: echo, with: { v: 1 } }\nrules:\n  - { name: closed, on: before_run, match: { if: \"run.workflow == 'r'\" }, action: deny, reason: maintenance }\n";
        let (report, _) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.status, RunStatus::Failed);
        assert_eq!(
            report.error.as_deref(),
            Some("denied by rule `closed`: maintenance")
        );
        assert_ne!(
            report.steps["a"].status,
            StepStatus::Succeeded,
            "nothing ran"
        );

        let yaml = "name: r\nsteps:\n  - { id: report, tool: echo, with: {} }\n  - { id: after, tool: echo, with: { r: \"{{ steps.report.output }}\" } }\nrules:\n  - { name: empty, on: after_step, match: { step: report, if: \"args | length == 0\" }, action: deny, reason: the report is empty }\n  - { name: failures, on: on_error, action: log }\n";
        let (report, events) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.steps["report"].status, StepStatus::Failed);
        assert_eq!(report.steps["after"].status, StepStatus::Skipped);
        assert!(rule_events(&events).contains(&("failures".to_owned(), Action::Log)));
    }

    #[tokio::test]
    async fn an_agents_call_is_denied_as_an_observation_and_redacted_where_recorded() {
        let dir = TempDir::new().expect("tempdir");
        let turns = "        - tool_calls: [{ name: http, arguments: { url: \"http://127.0.0.1:9/\", headers: { authorization: \"Bearer s3cr3t-token\" } } }]\n        - tool_calls: [{ name: calculator, arguments: { expression: \"1 + 1\" } }]\n        - text: done";
        let yaml = format!(
            "name: r\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\nsteps:\n  - {{ id: agent, goal: do it, tools: [http, calculator] }}\nrules:\n  - {{ name: hide, on: before_tool, match: {{ tool: http }}, action: redact, redact: [headers.authorization] }}\n  - {{ name: no-net, on: before_tool, match: {{ tool: http, chosen_by: llm }}, action: deny, reason: offline }}\n"
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        assert_eq!(report.steps["agent"].status, StepStatus::Succeeded);
        assert!(events.iter().any(|e| matches!(
            e,
            RunEvent::AgentObservation { tool, text, error: true, .. }
                if tool == "http" && text.contains("denied by rule `no-net`: offline")
        )));
        let action = events
            .iter()
            .find_map(|e| match e {
                RunEvent::AgentAction {
                    tool, arguments, ..
                } if tool == "http" => Some(arguments),
                _ => None,
            })
            .expect("the action is recorded");
        assert_eq!(action["headers"]["authorization"], json!("***"));
    }

    #[tokio::test]
    async fn on_plan_rules_see_the_plan_before_it_runs() {
        let dir = TempDir::new().expect("tempdir");
        let plan =
            json!({ "steps": [ { "id": "x", "tool": "echo", "with": { "v": 1 } } ] }).to_string();
        let yaml = format!(
            "name: r\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - text: {}\nsteps:\n  - {{ id: p, plan: do it, tools: [echo] }}\nrules:\n  - {{ name: review, on: on_plan, action: ask }}\n",
            serde_json::to_string(&plan).expect("json")
        );
        let (report, events) = run_agent(dir.path(), &yaml).await;
        assert_eq!(report.steps["p"].status, StepStatus::WaitingApproval);
        assert!(report.steps["p"].steps.is_empty(), "no planned step ran");
        assert!(events.iter().any(|e| matches!(
            e,
            RunEvent::ApprovalRequested { arguments, .. } if arguments["steps"][0]["id"] == "x"
        )));
    }
}

mod approver {
    //! A person asked while the run goes on (the CLI asks at the terminal): the answer, or the rule's
    //! default when none comes in time.

    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use archon_engine::run::{
        self, ApprovalDecision, ApprovalRequest, Approver, RunOptions, StepStatus,
    };
    use tempfile::TempDir;

    /// Answers with `answer` (or never), remembering what it was shown.
    struct Person {
        answer: Option<bool>,
        shown: Mutex<Vec<ApprovalRequest>>,
    }

    impl Approver for Person {
        fn ask<'a>(
            &'a self,
            request: &'a ApprovalRequest,
        ) -> std::pin::Pin<Box<dyn Future<Output = Option<ApprovalDecision>> + Send + 'a>> {
            Box::pin(async move {
                self.shown.lock().expect("lock").push(request.clone());
                match self.answer {
                    Some(approved) => Some(ApprovalDecision {
                        approved,
                        by: "tester".to_owned(),
                        reason: None,
                    }),
                    None => std::future::pending().await,
                }
            })
        }
    }

    async fn run_with(answer: Option<bool>, yaml: &str) -> (run::RunReport, Arc<Person>) {
        let dir = TempDir::new().expect("tempdir");
        std::fs::write(dir.path().join("a.yaml"), yaml).expect("write");
        let workflow = archon_engine::validate_file(&dir.path().join("a.yaml"))
            .workflow
            .expect("valid");
        let person = Arc::new(Person {
            answer,
            shown: Mutex::new(Vec::new()),
        });
        let mut options = RunOptions::new(dir.path().to_path_buf(), "asked");
        options.env = BTreeMap::from([("TOKEN".to_owned(), "hunter2-secret".to_owned())]);
        options.approvals.approver = Some(person.clone());
        let report = run::run(Arc::new(workflow), serde_json::Map::new(), options)
            .await
            .expect("runs");
        (report, person)
    }

    const SPEC: &str = "name: a\nsecrets: [TOKEN]\nsteps:\n  - { id: s, tool: echo, with: { auth: \"{{ secrets.TOKEN }}\", v: 1 } }\nrules:\n  - { name: check, on: before_tool, action: ask, timeout: 200ms }\n";

    #[tokio::test]
    async fn a_person_sees_the_exact_call_with_secrets_hidden_and_decides() {
        let (report, person) = run_with(Some(true), SPEC).await;
        assert_eq!(report.steps["s"].status, StepStatus::Succeeded);
        let shown = person.shown.lock().expect("lock")[0].clone();
        assert_eq!(shown.arguments["v"], 1);
        assert_eq!(shown.arguments["auth"], "***", "{shown:?}");
        let (report, _) = run_with(Some(false), SPEC).await;
        assert_eq!(report.steps["s"].status, StepStatus::Failed);
        assert_eq!(report.steps["s"].error.as_deref(), Some("denied by tester"));
    }

    #[tokio::test]
    async fn without_an_answer_in_time_the_rules_default_decides() {
        let (report, _) = run_with(None, SPEC).await;
        assert_eq!(report.steps["s"].status, StepStatus::Failed);
        assert!(
            report.steps["s"]
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("denied by timeout")),
            "{:?}",
            report.steps["s"].error
        );
        let (report, _) = run_with(
            None,
            &SPEC.replace("timeout: 200ms", "timeout: 200ms, default: allow"),
        )
        .await;
        assert_eq!(report.steps["s"].status, StepStatus::Succeeded);
    }
}

mod review {
    //! What a review of the rules found, each now held by a test.

    use archon_engine::run::{RunEvent, RunStatus, StepStatus};
    use serde_json::json;
    use tempfile::TempDir;

    use crate::agent::run_agent;
    use crate::support::{Output, archon};

    #[tokio::test]
    async fn a_plans_steps_follow_the_workflows_rules() {
        let dir = TempDir::new().expect("tempdir");
        let plan =
            json!({ "steps": [ { "id": "say", "tool": "echo", "with": { "v": 1 } } ] }).to_string();
        let yaml = format!(
            "name: r\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - text: {}\nsteps:\n  - {{ id: p, plan: say it, tools: [echo] }}\nrules:\n  - {{ name: quiet, on: before_tool, match: {{ tool: echo, chosen_by: llm }}, action: deny }}\ndefaults:\n  max_replans: 0\n",
            serde_json::to_string(&plan).expect("json")
        );
        let (report, _) = run_agent(dir.path(), &yaml).await;
        let p = &report.steps["p"];
        assert_eq!(p.status, StepStatus::Failed, "{p:?}");
        assert_eq!(
            p.steps["say"].error.as_deref(),
            Some("denied by rule `quiet`")
        );
    }

    #[tokio::test]
    async fn a_rule_naming_a_foreach_step_applies_to_each_item() {
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: r\nsteps:\n  - { id: pay, tool: echo, foreach: \"[1, 2]\", with: { v: \"{{ item }}\" } }\nrules:\n  - { name: no-pay, on: before_tool, match: { step: pay }, action: deny }\n";
        let (report, _) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.steps["pay"].status, StepStatus::Failed);
        assert!(
            report.steps["pay"]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("denied by rule `no-pay`"))
        );
    }

    #[tokio::test]
    async fn approval_required_shows_and_binds_the_call_and_no_fallback_runs_instead() {
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: r\nsteps:\n  - id: pay\n    tool: echo\n    approval: required\n    foreach: \"['alice 5']\"\n    with: { to: \"{{ item }}\" }\n    fallback: { tool: echo, with: { v: fallback } }\n";
        let (report, events) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.status, RunStatus::WaitingApproval);
        assert_eq!(
            report.steps["pay"].status,
            StepStatus::WaitingApproval,
            "the fallback did not run"
        );
        let asked = events
            .iter()
            .find_map(|e| match e {
                RunEvent::ApprovalRequested { arguments, .. } => Some(arguments.clone()),
                _ => None,
            })
            .expect("asked");
        assert_eq!(asked["with"]["to"], "alice 5");
        assert_eq!(asked["item"], "alice 5");
    }

    #[test]
    fn a_composite_that_waited_after_doing_something_is_in_doubt_on_resume() {
        let dir = TempDir::new().expect("tempdir");
        let spec = "name: r\ntools:\n  payout:\n    parameters: { type: object, properties: {} }\n    steps:\n      - { id: charge, tool: exec, with: { argv: [sh, -c, \"echo charged >> effects.txt\"] } }\n      - { id: send, tool: echo, approval: required, needs: [charge], with: { v: 1 } }\nsteps:\n  - { id: p, tool: payout }\n";
        std::fs::write(dir.path().join("r.yaml"), spec).expect("write");
        let Output { code, stdout, .. } =
            archon(dir.path(), &["run", "r.yaml", "--no-input", "--json"]);
        assert_eq!(code, 3);
        let id = serde_json::from_str::<serde_json::Value>(&stdout).expect("report")["run_id"]
            .as_str()
            .expect("id")
            .to_owned();
        let Output { code, .. } = archon(dir.path(), &["approve", &id, "--step", "p"]);
        assert_eq!(code, 0);
        let Output { code, stderr, .. } = archon(dir.path(), &["resume", &id, "--no-input"]);
        assert_eq!(
            code, 2,
            "the charge may run again: the user is asked first: {stderr}"
        );
        assert!(stderr.contains("--rerun-in-doubt"), "{stderr}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("effects.txt")).expect("charged"),
            "charged\n"
        );
    }

    #[tokio::test]
    async fn the_steps_of_a_composite_tool_an_agent_called_count_as_chosen_by_the_llm() {
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: r\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - tool_calls: [{ name: lister, arguments: {} }]\n        - text: done\ntools:\n  lister:\n    description: Lists\n    sensitive: false\n    parameters: { type: object, properties: {} }\n    steps:\n      - { id: ls, tool: exec, with: { argv: [sh, -c, \"echo ran >> effects.txt\"] } }\nsteps:\n  - { id: agent, goal: list, tools: [lister] }\n  - { id: direct, tool: lister }\nrules:\n  - { name: no-llm-exec, on: before_tool, match: { tool: exec, chosen_by: llm }, action: deny }\n";
        let (report, events) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.steps["agent"].status, StepStatus::Succeeded);
        assert!(
            events.iter().any(|e| matches!(
                e,
                RunEvent::AgentObservation { tool, text, error: true, .. }
                    if tool == "lister" && text.contains("denied by rule `no-llm-exec`")
            )),
            "{events:?}"
        );
        assert_eq!(
            report.steps["direct"].status,
            StepStatus::Succeeded,
            "the spec's own call runs"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("effects.txt")).expect("ran once"),
            "ran\n"
        );
    }

    #[tokio::test]
    async fn an_agent_whose_tool_waits_for_approval_waits_too() {
        let dir = TempDir::new().expect("tempdir");
        let yaml = "name: r\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - tool_calls: [{ name: payer, arguments: {} }]\n        - text: done\ntools:\n  payer:\n    description: Pays\n    sensitive: false\n    parameters: { type: object, properties: {} }\n    steps:\n      - { id: send, tool: echo, approval: required, with: { v: 1 } }\nsteps:\n  - { id: agent, goal: pay, tools: [payer] }\n";
        let (report, _) = run_agent(dir.path(), yaml).await;
        assert_eq!(report.steps["agent"].status, StepStatus::WaitingApproval);
        assert_eq!(report.status, RunStatus::WaitingApproval);
    }
}

/// `archon approve` records who decided (the user running it, or the name given with `--as`) and puts
/// the decision in the run's trail, not only in the approvals table (issue 14, item 12).
#[test]
fn an_approval_decision_is_in_the_trail_with_who_made_it() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("approve.yaml"), APPROVE).expect("write");
    let Output { stdout, .. } =
        archon(dir.path(), &["run", "approve.yaml", "--no-input", "--json"]);
    let id = run_id(&stdout);
    let Output { code, stderr, .. } = archon(
        dir.path(),
        &[
            "approve",
            &id,
            "--deny",
            "--reason",
            "not today",
            "--as",
            "alice",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json", "--events"]);
    let shown: Json = serde_json::from_str(&stdout).expect("json");
    let decided: Vec<&Json> = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["event"] == "approval_decided")
        .collect();
    assert_eq!(decided.len(), 1, "{shown}");
    assert_eq!(
        (
            &decided[0]["step"],
            &decided[0]["approved"],
            &decided[0]["by"],
            &decided[0]["reason"]
        ),
        (
            &serde_json::json!("pay"),
            &serde_json::json!(false),
            &serde_json::json!("alice"),
            &serde_json::json!("not today")
        )
    );
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--events"]);
    let line: Vec<&str> = stdout.lines().filter(|l| l.contains("alice")).collect();
    assert_eq!(line.len(), 1, "{stdout}");
    assert!(
        line[0].ends_with("denied    pay exec by alice: not today"),
        "{stdout}"
    );

    // Without `--as`, the user running the command.
    let Output { stdout, .. } =
        archon(dir.path(), &["run", "approve.yaml", "--no-input", "--json"]);
    let id = run_id(&stdout);
    assert_eq!(archon(dir.path(), &["approve", &id]).code, 0);
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json", "--events"]);
    let shown: Json = serde_json::from_str(&stdout).expect("json");
    let by = shown["events"]
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["event"] == "approval_decided")
        .map(|e| e["by"].clone())
        .expect("decided");
    assert_eq!(by, archon_engine::session::person(None));
    assert_ne!(by, "someone");
}

/// `--as` must name someone: an empty name or one with a line break is refused.
#[test]
fn approve_as_nobody_is_refused() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("approve.yaml"), APPROVE).expect("write");
    let Output { stdout, .. } =
        archon(dir.path(), &["run", "approve.yaml", "--no-input", "--json"]);
    let id = run_id(&stdout);
    let Output { code, stderr, .. } = archon(dir.path(), &["approve", &id, "--as", " "]);
    assert_eq!(code, 2);
    insta::assert_snapshot!(stderr, @r"
    error: `--as` needs a name, not ` `
      hint: give the name the decision is recorded under, such as `--as ana`
    ");
    let Output { code, .. } = archon(dir.path(), &["approve", &id, "--as", "a\nb"]);
    assert_eq!(code, 2);
}

/// A paused run's summary says what waits and shows no outputs: they are rendered when the run ends (issue
/// 15, item 7).
#[test]
fn a_paused_run_shows_no_outputs_yet() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(
        dir.path().join("approve.yaml"),
        format!("{APPROVE}outputs:\n  marker: \"{{{{ steps.after.output.done }}}}\"\n"),
    )
    .expect("write");
    let Output { code, stdout, .. } = archon(dir.path(), &["run", "approve.yaml", "--no-input"]);
    assert_eq!(code, 3);
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("run ") && first.ends_with(" ms"),
        "no dangling `: `: {stdout}"
    );
    assert!(!stdout.contains("outputs:"), "{stdout}");
    assert!(!stdout.contains("undefined"), "{stdout}");
}
