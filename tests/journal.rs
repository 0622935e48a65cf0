//! Persistence before effects, at every kind of caller: with a journal whose flushes fail from a chosen
//! record on, no side effect starts after the failed flush, and the run fails with the flush's error.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use archon_engine::run::{self, Approvals, RunEvent, RunOptions, RunReport, RunStatus, StepStatus};
use archon_engine::store::{Ack, Entry, Journal, StoreError};
use serde_json::{Map, json};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

/// Keeps what it is told (as entry kinds), and fails every flush once an entry `fails_from` accepts has
/// been recorded: the store went away at that point.
#[derive(Debug)]
struct FailingJournal {
    fails_from: fn(&Entry) -> bool,
    failing: AtomicBool,
    flushes: Mutex<Vec<bool>>,
    /// Instead of failing, the flush stops the run (the run's token, as Ctrl-C does) and succeeds.
    stops_instead: bool,
    cancel: CancellationToken,
    /// The status and error of every attempt that ended, by step.
    ended: Mutex<Vec<(String, StepStatus, Option<String>)>>,
}

impl FailingJournal {
    fn new(fails_from: fn(&Entry) -> bool) -> Arc<Self> {
        Arc::new(FailingJournal {
            fails_from,
            failing: AtomicBool::new(false),
            flushes: Mutex::new(Vec::new()),
            stops_instead: false,
            cancel: CancellationToken::new(),
            ended: Mutex::new(Vec::new()),
        })
    }

    /// A journal whose flush, once `from` has been recorded, is where Ctrl-C arrives: the run is stopped
    /// while the record is made durable, and the record is.
    fn stopping(from: fn(&Entry) -> bool) -> Arc<Self> {
        let mut journal = Arc::into_inner(Self::new(from)).expect("one");
        journal.stops_instead = true;
        Arc::new(journal)
    }

    /// Whether a flush failed: the test's trigger was reached.
    fn failed(&self) -> bool {
        self.flushes.lock().expect("flushes").iter().any(|ok| !ok)
    }
}

impl Journal for FailingJournal {
    fn record(&self, entry: Entry) {
        if (self.fails_from)(&entry) {
            self.failing.store(true, Ordering::SeqCst);
        }
        if let Entry::AttemptEnded {
            step,
            status,
            error,
        } = entry
        {
            self.ended
                .lock()
                .expect("ended")
                .push((step, status, error));
        }
    }

    fn flush(&self) -> Ack {
        let failing = self.failing.load(Ordering::SeqCst);
        if self.stops_instead {
            if failing {
                self.cancel.cancel();
            }
            return Ack::done();
        }
        self.flushes.lock().expect("flushes").push(!failing);
        if failing {
            Ack::failed(StoreError::new("disk full"))
        } else {
            Ack::done()
        }
    }
}

async fn run_with(dir: &Path, yaml: &str, journal: Arc<FailingJournal>, yes: bool) -> RunReport {
    run_with_events(dir, yaml, journal, yes).await.0
}

async fn run_with_events(
    dir: &Path,
    yaml: &str,
    journal: Arc<FailingJournal>,
    yes: bool,
) -> (RunReport, Vec<RunEvent>) {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    std::fs::write(dir.join("spec.yaml"), yaml).expect("write");
    let validation = archon_engine::validate_file(&dir.join("spec.yaml"));
    assert!(!validation.has_errors(), "{:?}", validation.diagnostics);
    let options = RunOptions {
        max_parallel: 4,
        protected: Vec::new(),
        workdir: dir.to_path_buf(),
        run_id: "journal".into(),
        cancel: journal.cancel.clone(),
        events: Some(sender),
        env: BTreeMap::new(),
        journal,
        prior: Default::default(),
        cassette: None,
        checkpoints: Default::default(),
        approvals: Approvals {
            yes,
            ..Approvals::default()
        },
        helper: None,
        cache: Default::default(),
        memory_dir: None,
        memory: Default::default(),
    };
    let report = run::run(
        Arc::new(validation.workflow.expect("valid")),
        Map::new(),
        options,
    )
    .await
    .expect("run starts");
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    (report, events)
}

fn attempt_of_write(entry: &Entry) -> bool {
    matches!(entry, Entry::AttemptStarted { step, .. } if step == "write")
}

#[tokio::test]
async fn a_command_does_not_start_when_its_attempt_cannot_be_recorded() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(attempt_of_write);
    let yaml = "name: j\nsteps:\n  - { id: write, tool: exec, with: { argv: [touch, effect.txt] } }\n  - { id: later, needs: [write], tool: exec, with: { argv: [touch, later.txt] } }\n";
    let report = run_with(dir.path(), yaml, journal.clone(), false).await;
    assert!(journal.failed());
    assert!(!dir.path().join("effect.txt").exists(), "the command ran");
    assert!(!dir.path().join("later.txt").exists(), "a later step ran");
    let expected = "the attempt did not start because it could not be recorded: disk full";
    assert_eq!(report.steps["write"].status, StepStatus::Failed);
    assert_eq!(report.steps["write"].error.as_deref(), Some(expected));
    assert_eq!(report.steps["later"].status, StepStatus::Cancelled);
    assert_eq!(report.status, RunStatus::Failed);
    assert_eq!(report.error.as_deref(), Some(expected));
}

/// Ctrl-C while a command's attempt is being made durable: the command does not start, and its attempt
/// says it was skipped, not cancelled, so that `resume` does not take it for one that may have had its
/// effect (a cancelled attempt may have: its command was killed while it ran).
#[tokio::test]
async fn a_command_stopped_while_its_attempt_is_recorded_does_not_start_and_is_not_in_doubt() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::stopping(attempt_of_write);
    let yaml =
        "name: j\nsteps:\n  - { id: write, tool: exec, with: { argv: [touch, effect.txt] } }\n";
    let report = run_with(dir.path(), yaml, journal.clone(), false).await;
    assert!(!dir.path().join("effect.txt").exists(), "the command ran");
    assert_eq!(
        (report.status, report.steps["write"].status),
        (RunStatus::Cancelled, StepStatus::Cancelled)
    );
    assert_eq!(
        *journal.ended.lock().expect("ended"),
        [(
            "write".to_owned(),
            StepStatus::Skipped,
            Some("the run was stopped before it started".to_owned())
        )]
    );
}

#[tokio::test]
async fn no_step_starts_after_the_run_stopped_even_one_that_tolerates_the_failure() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(attempt_of_write);
    // `other` waits for `write`'s failure through a dependency that tolerates it: it would run if the
    // run went on.
    let yaml = "name: j\nsteps:\n  - { id: write, tool: exec, with: { argv: [touch, effect.txt] }, on_error: continue }\n  - { id: other, needs: [write], if: \"true\", tool: exec, with: { argv: [touch, other.txt] } }\n";
    let report = run_with(dir.path(), yaml, journal, false).await;
    assert!(!dir.path().join("effect.txt").exists());
    assert!(
        !dir.path().join("other.txt").exists(),
        "a step started after the run stopped"
    );
    assert_eq!(report.steps["other"].status, StepStatus::Cancelled);
    assert_eq!(report.status, RunStatus::Failed);
}

/// An agent that touches `first.txt`, then `second.txt`, then answers.
fn agent_spec() -> String {
    let turns = "        - tool_calls: [{ name: exec, arguments: { argv: [touch, first.txt] } }]\n        - tool_calls: [{ name: exec, arguments: { argv: [touch, second.txt] } }]\n        - text: done";
    format!(
        "name: j\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n{turns}\nsteps:\n  - {{ id: agent, goal: touch two files, tools: [exec] }}\n"
    )
}

#[tokio::test]
async fn an_agent_calls_no_more_tools_when_its_checkpoint_cannot_be_recorded() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(|entry| matches!(entry, Entry::Checkpoint { .. }));
    let report = run_with(dir.path(), &agent_spec(), journal.clone(), true).await;
    assert!(journal.failed());
    assert!(dir.path().join("first.txt").exists(), "the first call ran");
    assert!(
        !dir.path().join("second.txt").exists(),
        "a tool call started after the failed flush"
    );
    let expected = "the agent's next tool calls did not start because its checkpoint could not be recorded: disk full";
    assert_eq!(report.steps["agent"].status, StepStatus::Failed);
    assert_eq!(report.steps["agent"].error.as_deref(), Some(expected));
    assert_eq!(report.status, RunStatus::Failed);
    assert_eq!(report.error.as_deref(), Some(expected));
}

#[tokio::test]
async fn an_agents_sensitive_call_does_not_run_when_its_approval_cannot_be_recorded() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(|entry| matches!(entry, Entry::ApprovalDecided { .. }));
    let report = run_with(dir.path(), &agent_spec(), journal.clone(), true).await;
    assert!(journal.failed());
    assert!(!dir.path().join("first.txt").exists(), "the call ran");
    let expected = "the call did not start because its approval could not be recorded: disk full";
    assert_eq!(report.steps["agent"].status, StepStatus::Failed);
    assert_eq!(report.steps["agent"].error.as_deref(), Some(expected));
    assert_eq!(report.status, RunStatus::Failed);
    assert_eq!(report.error.as_deref(), Some(expected));
}

const ASKS: &str = "name: j\nsteps:\n  - { id: write, tool: exec, with: { argv: [touch, effect.txt] } }\nrules:\n  - { name: careful, on: before_tool, match: { tool: exec }, action: ask }\n";

#[tokio::test]
async fn an_approved_call_does_not_run_when_the_approval_cannot_be_recorded() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(|entry| matches!(entry, Entry::ApprovalDecided { .. }));
    let report = run_with(dir.path(), ASKS, journal.clone(), true).await;
    assert!(journal.failed());
    assert!(!dir.path().join("effect.txt").exists(), "the call ran");
    let expected = "the call did not start because its approval could not be recorded: disk full";
    assert_eq!(report.steps["write"].status, StepStatus::Failed);
    assert_eq!(report.steps["write"].error.as_deref(), Some(expected));
    assert_eq!(report.status, RunStatus::Failed);
    assert_eq!(report.error.as_deref(), Some(expected));
}

#[tokio::test]
async fn a_run_does_not_say_it_waits_when_the_approval_request_cannot_be_recorded() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(|entry| matches!(entry, Entry::ApprovalRequested(_)));
    let report = run_with(dir.path(), ASKS, journal.clone(), false).await;
    assert!(journal.failed());
    assert!(!dir.path().join("effect.txt").exists(), "the call ran");
    let expected = "the approval request could not be recorded: disk full";
    assert_eq!(report.steps["write"].status, StepStatus::Failed);
    assert_eq!(report.steps["write"].error.as_deref(), Some(expected));
    assert_eq!(report.status, RunStatus::Failed);
    assert_eq!(report.error.as_deref(), Some(expected));
}

#[tokio::test]
async fn flushes_that_succeed_change_nothing() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(|_| false);
    let report = run_with(dir.path(), &agent_spec(), journal.clone(), true).await;
    assert!(!journal.failed());
    assert!(dir.path().join("first.txt").exists());
    assert!(dir.path().join("second.txt").exists());
    assert_eq!(report.status, RunStatus::Succeeded, "{:?}", report.error);
}

#[tokio::test]
async fn a_plan_runs_no_step_when_it_cannot_be_recorded() {
    let dir = TempDir::new().expect("tempdir");
    let journal = FailingJournal::new(|entry| matches!(entry, Entry::Checkpoint { .. }));
    let plan = json!({
        "steps": [{ "id": "say", "tool": "echo", "with": { "message": "hello" } }]
    });
    let text = serde_json::to_string(&plan.to_string()).expect("json");
    let yaml = format!(
        "name: j\nllm:\n  providers:\n    scripted:\n      kind: mock\n      turns:\n        - text: {text}\nsteps:\n  - {{ id: p, plan: say hello, tools: [echo] }}\n"
    );
    let (report, events) = run_with_events(dir.path(), &yaml, journal.clone(), false).await;
    assert!(journal.failed());
    let started: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::StepStarted { step } => Some(step.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(started, ["p"], "a planned step started");
    let expected = "the plan did not run because it could not be recorded: disk full";
    assert_eq!(report.steps["p"].status, StepStatus::Failed);
    assert_eq!(report.steps["p"].error.as_deref(), Some(expected));
    assert_eq!(report.status, RunStatus::Failed);
    assert_eq!(report.error.as_deref(), Some(expected));
}
