//! The run lifecycle in the engine's session API: what the CLI calls, usable by any front end, and the CLI
//! talking to the store only through it.

use std::path::Path;

use serde_json::{Map, Value as Json};
use tempfile::TempDir;

use crate::support::{Output, archon, root};
use archon_engine::session::{
    Attachments, Continue, ContinueOptions, NewRunRequest, RunState, Session, SessionError,
};

/// `a` and `d` succeed, `b` fails until `fixed` exists, `c` is skipped because of it, and `e` runs only
/// when `b` failed.
const FAILING: &str = r#"name: failing
steps:
  - { id: a, tool: exec, with: { argv: [sh, -c, "echo a >> log.txt"] } }
  - { id: b, needs: [a], tool: exec, with: { argv: [sh, -c, "echo b >> log.txt; test -f fixed"] } }
  - { id: c, needs: [b], tool: exec, with: { argv: [sh, -c, "echo c >> log.txt"] } }
  - { id: d, tool: exec, with: { argv: [sh, -c, "echo d >> log.txt"] } }
  - { id: e, needs: [b], if: "steps.b.status == 'failed'", tool: exec, with: { argv: [sh, -c, "echo e >> log.txt"] } }
"#;

fn sorted_log(dir: &Path) -> Vec<String> {
    let log = std::fs::read_to_string(dir.join("log.txt")).expect("written");
    let mut lines: Vec<String> = log.lines().map(str::to_owned).collect();
    lines.sort_unstable();
    lines
}

#[test]
fn retry_failed_reruns_only_the_failed_steps_and_those_skipped_because_of_them() {
    let dir = TempDir::new().expect("tempdir");
    std::fs::write(dir.path().join("failing.yaml"), FAILING).expect("write");
    let Output { code, stderr, .. } = archon(dir.path(), &["run", "failing.yaml"]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(sorted_log(dir.path()), ["a", "b", "d", "e"]);
    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    let id = runs[0]["id"].as_str().expect("id").to_owned();

    std::fs::write(dir.path().join("fixed"), "").expect("write");
    std::fs::remove_file(dir.path().join("log.txt")).expect("removed");
    let Output { code, stderr, .. } = archon(dir.path(), &["retry", &id, "--failed"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        sorted_log(dir.path()),
        ["b", "c"],
        "only the failed step and the step skipped because of it run again"
    );
    let Output { stdout, .. } = archon(dir.path(), &["show", &id, "--json"]);
    let run: Json = serde_json::from_str(&stdout).expect("run");
    let statuses: Vec<(String, String)> = run["results"]
        .as_object()
        .expect("results")
        .iter()
        .map(|(k, v)| (k.clone(), v["status"].as_str().unwrap_or("").to_owned()))
        .collect();
    let mut statuses = statuses;
    statuses.sort();
    assert_eq!(
        statuses,
        [
            ("a".to_owned(), "succeeded".to_owned()),
            ("b".to_owned(), "succeeded".to_owned()),
            ("c".to_owned(), "succeeded".to_owned()),
            ("d".to_owned(), "succeeded".to_owned()),
            ("e".to_owned(), "succeeded".to_owned()),
        ],
        "`e` keeps its result from the first run (the log shows it did not run again)"
    );

    // Nothing failed any more: `--failed` says so instead of running anything.
    let Output { code, stderr, .. } = archon(dir.path(), &["retry", &id, "--failed"]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        format!(
            "error: run `{id}` has no failed step: it succeeded\n  hint: `archon retry {id} --from STEP` runs a step and everything after it again\n"
        )
    );
}

#[test]
fn retry_needs_from_or_failed_but_not_both() {
    let dir = TempDir::new().expect("tempdir");
    let Output { code, stderr, .. } = archon(dir.path(), &["retry", "r1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--from <STEP>"), "{stderr}");
    let Output { code, stderr, .. } =
        archon(dir.path(), &["retry", "r1", "--from", "a", "--failed"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// A front end other than the CLI: start, execute, then retry the failed steps, all through the session.
#[test]
fn a_front_end_runs_and_retries_through_the_session_alone() {
    let dir = TempDir::new().expect("tempdir");
    let spec = dir.path().join("failing.yaml");
    std::fs::write(&spec, FAILING).expect("write");
    let workflow = archon_engine::validate_file(&spec)
        .workflow
        .expect("valid workflow");
    let session = Session::open(&dir.path().join("state")).expect("store opens");
    let prepared = session
        .start(NewRunRequest {
            id: "r-front-end".to_owned(),
            workflow,
            inputs: Map::new(),
            spec_path: spec.clone(),
            workdir: dir.path().to_path_buf(),
            max_parallel: Some(4),
        })
        .expect("started");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let outcome = runtime
        .block_on(session.execute(prepared, Attachments::default()))
        .expect("executed");
    assert!(!outcome.resumable);
    assert_eq!(
        session.load("r-front-end").expect("stored").status,
        RunState::Failed
    );

    // Resuming an ended run is refused with what to do instead.
    match session.continue_run("r-front-end", Continue::Resume, &ContinueOptions::default()) {
        Err(SessionError::Refused { message, hint }) => {
            assert_eq!(message, "run `r-front-end` already ended: `failed`");
            assert_eq!(
                hint,
                "`archon retry r-front-end --from STEP` runs a step and everything after it again"
            );
        }
        other => panic!("not refused: {other:?}"),
    }
    std::fs::write(dir.path().join("fixed"), "").expect("write");
    let prepared = session
        .continue_run("r-front-end", Continue::Failed, &ContinueOptions::default())
        .expect("claimed");
    let outcome = runtime
        .block_on(session.execute(prepared, Attachments::default()))
        .expect("executed");
    assert_eq!(
        outcome.report.status,
        archon_engine::run::RunStatus::Succeeded
    );
    assert_eq!(
        session.load("r-front-end").expect("stored").status,
        RunState::Succeeded
    );
}

/// ARCHITECTURE.md: the CLI only parses, calls and renders. The run lifecycle and every store call live
/// in the engine's session; the CLI names neither the store trait, its implementation, nor the journal.
#[test]
fn the_cli_makes_no_store_calls() {
    let forbidden = [
        "archon_engine::store",
        "RunStore",
        "SqliteStore",
        "Journal",
        "forget_results",
        ".claim(",
        "create_run",
        "RunOptions",
        "run::run(Arc",
        ".journal(",
    ];
    let mut found = Vec::new();
    let mut files = Vec::new();
    collect_rust_files(&root().join("cli"), &mut files);
    assert!(files.len() > 5, "the CLI's sources are found: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        for (number, line) in text.lines().enumerate() {
            for word in forbidden {
                if line.contains(word) {
                    found.push(format!("{}:{}: {word}", file.display(), number + 1));
                }
            }
        }
    }
    assert_eq!(found, Vec::<String>::new());
}

fn collect_rust_files(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            collect_rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// `show` does not promise a resume that `resume` would refuse: it says what resume would say.
#[test]
fn show_says_when_resume_would_refuse() {
    use std::process::Command;

    let dir = TempDir::new().expect("tempdir");
    let spec = r#"name: doubt
steps:
  - { id: wait, tool: exec, with: { argv: [sh, -c, 'echo $$ > pid; touch started; exec sleep 30'] } }
"#;
    std::fs::write(dir.path().join("doubt.yaml"), spec).expect("write");
    let mut child = crate::support::spawn_until(dir.path(), &["run", "doubt.yaml"], "started");
    let _ = child.kill();
    let _ = child.wait();
    // The command outlived the killed archon; end it so that the refusal does not name its process group.
    let pid = std::fs::read_to_string(dir.path().join("pid")).expect("pid");
    let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();

    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    let id = runs[0]["id"].as_str().expect("id").to_owned();
    let Output { code, stdout, .. } = archon(dir.path(), &["show", &id]);
    assert_eq!(code, 0);
    let hints: Vec<&str> = stdout.lines().filter(|l| l.contains("hint:")).collect();
    assert_eq!(
        hints,
        [
            format!(
                "  hint: `archon resume {id}` would refuse: run `{id}` stopped while a step was running, and it may have had its effect: `wait`"
            ),
            format!(
                "  hint: check what it did, then `archon resolve {id} STEP --succeeded` (or `--failed`) records it; `--rerun-in-doubt` runs it again anyway (a step that is safe to repeat says so with `idempotent: true`, on the step or on its tool)"
            ),
        ]
    );
}

/// A store whose `claim` finds the run already claimed by a rival, as when two `archon resume`s race: the
/// rival claims between this one's load and its claim.
#[derive(Debug)]
struct Racing {
    inner: archon_engine::store::sqlite::SqliteStore,
    rival: archon_engine::store::sqlite::SqliteStore,
}

impl archon_engine::store::RunStore for Racing {
    fn create_run(
        &self,
        run: &archon_engine::store::NewRun,
    ) -> Result<(), archon_engine::store::StoreError> {
        self.inner.create_run(run)
    }
    fn claim(
        &self,
        id: &str,
        allowed: &[RunState],
    ) -> Result<RunState, archon_engine::store::StoreError> {
        self.rival.claim(id, allowed)?;
        self.inner.claim(id, allowed)
    }
    fn release(&self, id: &str, status: RunState) -> Result<(), archon_engine::store::StoreError> {
        self.inner.release(id, status)
    }
    fn forget_results(
        &self,
        id: &str,
        steps: &[String],
    ) -> Result<u32, archon_engine::store::StoreError> {
        self.inner.forget_results(id, steps)
    }
    fn decide(
        &self,
        id: &str,
        step: Option<&str>,
        decision: &archon_engine::report::ApprovalDecision,
    ) -> Result<Vec<archon_engine::report::ApprovalRequest>, archon_engine::store::StoreError> {
        self.inner.decide(id, step, decision)
    }
    fn cancel(&self, id: &str) -> Result<RunState, archon_engine::store::StoreError> {
        self.inner.cancel(id)
    }
    fn list(
        &self,
    ) -> Result<Vec<archon_engine::store::RunSummary>, archon_engine::store::StoreError> {
        self.inner.list()
    }
    fn load(
        &self,
        id: &str,
    ) -> Result<archon_engine::store::StoredRun, archon_engine::store::StoreError> {
        self.inner.load(id)
    }
    fn files(&self, id: &str) -> Result<Vec<(String, String)>, archon_engine::store::StoreError> {
        self.inner.files(id)
    }
    fn replace_files(
        &self,
        id: &str,
        files: &[(String, String)],
    ) -> Result<(), archon_engine::store::StoreError> {
        self.inner.replace_files(id, files)
    }
    fn events(&self, id: &str) -> Result<Vec<Json>, archon_engine::store::StoreError> {
        self.inner.events(id)
    }
    fn logs(
        &self,
        id: &str,
        after: i64,
    ) -> Result<Vec<archon_engine::store::LogChunk>, archon_engine::store::StoreError> {
        self.inner.logs(id, after)
    }
    fn check(&self) -> Result<Vec<String>, archon_engine::store::StoreError> {
        self.inner.check()
    }
    fn journal(
        &self,
        id: &str,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<std::sync::Arc<dyn archon_engine::store::Journal>, archon_engine::store::StoreError>
    {
        self.inner.journal(id, cancel)
    }
}

/// Issue 13, item 17: two `resume`s that race refuse the same way, whichever comes second by a hair (its
/// claim fails) or by a wide margin (the run is already running when it looks).
#[test]
fn racing_resumes_refuse_the_same_way() {
    use archon_engine::store::RunStore as _;
    use archon_engine::store::sqlite::SqliteStore;
    let dir = TempDir::new().expect("tempdir");
    let state = dir.path().join("state");
    let spec = dir.path().join("failing.yaml");
    std::fs::write(&spec, FAILING).expect("write");
    let store = SqliteStore::open(&state).expect("store");
    store
        .create_run(&archon_engine::store::NewRun {
            id: "r-race".to_owned(),
            workflow: "failing".to_owned(),
            spec_path: spec.display().to_string(),
            files: vec![(spec.display().to_string(), FAILING.to_owned())],
            inputs: Map::new(),
            workdir: dir.path().display().to_string(),
            max_parallel: 4,
        })
        .expect("created");
    store
        .release("r-race", RunState::Interrupted)
        .expect("interrupted");
    let racing = Session::over(Box::new(Racing {
        inner: SqliteStore::open(&state).expect("store"),
        rival: SqliteStore::open(&state).expect("store"),
    }));
    let by_a_hair = racing
        .continue_run("r-race", Continue::Resume, &ContinueOptions::default())
        .map(|_| ());
    let later = Session::open(&state)
        .expect("store")
        .continue_run("r-race", Continue::Resume, &ContinueOptions::default())
        .map(|_| ());
    let refusal = |outcome: Result<(), SessionError>| match outcome {
        Err(SessionError::Refused { message, .. }) => Some(message),
        _ => None,
    };
    let (first, second) = (refusal(by_a_hair), refusal(later));
    assert!(
        first
            .as_deref()
            .is_some_and(|m| m.starts_with("run `r-race` is being run by process")),
        "{first:?}"
    );
    assert_eq!(first, second);
}

/// Issue 13, item 16: a step that is not safe to repeat and finished is not reported in doubt because a
/// step safe to repeat was running after it at the crash: its result is durable before the run goes on.
#[test]
fn a_finished_step_is_not_in_doubt_because_a_later_safe_step_was_running() {
    use std::os::unix::fs::OpenOptionsExt as _;

    let dir = TempDir::new().expect("tempdir");
    // `later` reads a FIFO: it is safe to repeat, and it runs until a writer comes.
    nix::unistd::mkfifo(&dir.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let spec = r#"name: doubt
steps:
  - { id: effect, tool: exec, with: { argv: [sh, -c, 'echo done >> effects'] } }
  - { id: later, tool: read_file, with: { path: pipe }, needs: [effect] }
"#;
    std::fs::write(dir.path().join("doubt.yaml"), spec).expect("write");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_archon"))
        .args(["run", "doubt.yaml"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("archon starts");
    // Opening the FIFO to write without blocking succeeds once `later` has it open to read.
    let started = std::time::Instant::now();
    let writer = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(dir.path().join("pipe"))
        {
            Ok(writer) => break writer,
            Err(_) => {
                assert!(started.elapsed().as_secs() < 10, "`later` never started");
                std::thread::yield_now();
            }
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    drop(writer);

    let Output { stdout, .. } = archon(dir.path(), &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    let id = runs[0]["id"].as_str().expect("id").to_owned();
    std::fs::remove_file(dir.path().join("pipe")).expect("rm");
    std::fs::write(dir.path().join("pipe"), "now a file").expect("write");
    let resumed = archon(dir.path(), &["resume", &id]);
    assert_eq!(
        (resumed.code, resumed.stderr.lines().next()),
        (0, Some("reused    effect (succeeded earlier)"))
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects")).expect("effects"),
        "done\n"
    );
}

/// Starts `spec` (written to `doubt.yaml`), kills archon once its step `send` has written `started`, and
/// ends the command it left running; returns the run's id, with `send` in doubt.
fn crash_in_doubt(dir: &Path, spec: &str) -> String {
    std::fs::write(dir.join("doubt.yaml"), spec).expect("write");
    let mut child = crate::support::spawn_until(dir, &["run", "doubt.yaml"], "started");
    let _ = child.kill();
    let _ = child.wait();
    let pid = std::fs::read_to_string(dir.join("pid")).expect("pid");
    let _ = std::process::Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status();
    let Output { stdout, .. } = archon(dir, &["runs", "--json"]);
    let runs: Json = serde_json::from_str(&stdout).expect("runs");
    runs[0]["id"].as_str().expect("id").to_owned()
}

/// Issue 13, item 16: a person who checked what a step in doubt did records it with `archon resolve`:
/// `--succeeded --output JSON` makes it a finished step whose output the steps after it read, so `resume`
/// goes on without running it again; `--failed` makes it a failed step that `retry --failed` runs again.
/// The decision is in the run's log, with who made it.
#[test]
fn a_person_resolves_a_step_in_doubt_and_the_run_goes_on() {
    let spec = r#"name: doubt
steps:
  - { id: send, tool: exec, with: { argv: [sh, -c, 'echo sent >> effects; echo $$ > pid; touch started; exec sleep 30'] } }
  - { id: after, tool: echo, with: { id: "{{ steps.send.output.id }}" } }
"#;
    let dir = TempDir::new().expect("tempdir");
    let id = crash_in_doubt(dir.path(), spec);
    let user = [("USER", "ana")];
    let resolved = crate::support::archon_with(
        dir.path(),
        &[
            "resolve",
            &id,
            "send",
            "--succeeded",
            "--output",
            r#"{"id": 7}"#,
            "--reason",
            "the mail went out",
        ],
        &user,
    );
    assert_eq!(
        (
            resolved.code,
            resolved.stdout.as_str(),
            resolved.stderr.as_str()
        ),
        (
            0,
            format!("resolved send as succeeded\n  hint: `archon resume {id}` continues the run\n")
                .as_str(),
            ""
        )
    );
    let resumed = archon(dir.path(), &["resume", &id, "--json"]);
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    let report: Json = serde_json::from_str(&resumed.stdout).expect("report");
    assert_eq!(
        report["steps"]["after"]["output"],
        serde_json::json!({"id": 7})
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("effects")).expect("effects"),
        "sent\n",
        "`send` did not run again"
    );
    let events = archon(dir.path(), &["show", &id, "--events"]);
    assert!(
        events.stdout.lines().any(|l| l.contains("resolved")
            && l.ends_with("send as succeeded by ana: the mail went out")),
        "{}",
        events.stdout
    );

    // Resolved as failed, the step is what `retry --failed` runs again.
    let dir = TempDir::new().expect("tempdir");
    let id = crash_in_doubt(dir.path(), spec);
    let resolved = archon(dir.path(), &["resolve", &id, "send", "--failed"]);
    assert_eq!(
        (resolved.code, resolved.stdout),
        (
            0,
            format!(
                "resolved send as failed\n  hint: `archon retry {id} --failed` runs it again\n"
            )
        )
    );
    std::fs::write(dir.path().join("out.json"), r#"{"id": 8}"#).expect("write");
    std::fs::write(
        dir.path().join("doubt.yaml"),
        spec.replace("exec sleep 30'] }", "exec cat out.json'], output: json }"),
    )
    .expect("write");
    let retried = archon(
        dir.path(),
        &["retry", &id, "--failed", "--allow-changed-spec", "--json"],
    );
    assert_eq!(retried.code, 0, "{}", retried.stderr);
    let report: Json = serde_json::from_str(&retried.stdout).expect("report");
    assert_eq!(
        report["steps"]["after"]["output"],
        serde_json::json!({"id": 8})
    );
}

/// `archon resolve` refuses what it cannot record: a step that is not in doubt, a run that is not
/// interrupted, output that is not JSON, and neither `--succeeded` nor `--failed`.
#[test]
fn resolve_refuses_what_it_cannot_record() {
    let spec = r#"name: doubt
steps:
  - { id: first, tool: echo, with: { a: 1 } }
  - { id: send, tool: exec, with: { argv: [sh, -c, 'echo $$ > pid; touch started; exec sleep 30'] }, needs: [first] }
"#;
    let dir = TempDir::new().expect("tempdir");
    let id = crash_in_doubt(dir.path(), spec);
    let refused = |args: &[&str]| {
        let out = archon(dir.path(), args);
        (out.code, out.stderr)
    };
    assert_eq!(
        refused(&["resolve", &id, "first", "--succeeded"]),
        (
            2,
            format!(
                "error: step `first` of run `{id}` is not in doubt\n  hint: in doubt: `send`\n"
            )
        )
    );
    assert_eq!(
        refused(&["resolve", &id, "send", "--succeeded", "--output", "done"]),
        (2, "error: `--output` is not JSON: expected value at line 1 column 1\n  hint: write text as a JSON string, quoted for the shell: `--output '\"done\"'`\n".to_owned())
    );
    let (code, stderr) = refused(&["resolve", &id, "send"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.starts_with("error: the following required arguments were not provided:"),
        "{stderr}"
    );
    assert_eq!(refused(&["resolve", &id, "send", "--failed"]).0, 0);
    assert_eq!(refused(&["resume", &id]).0, 1, "the run ends failed");
    assert_eq!(
        refused(&["resolve", &id, "send", "--failed"]),
        (
            2,
            format!(
                "error: run `{id}` has no step in doubt: it is `failed`\n  hint: `archon show {id}` shows where the run stands\n"
            )
        )
    );
}

/// The run listing a server pages through (`Session::page`): SQLite's query gives, page after page, what
/// the plain definition over `list` gives (`RunStore::page`'s default, used by `Racing`), for filters of
/// every kind, and its total counts every run the filters select.
#[test]
fn a_page_of_runs_is_the_listing_filtered_and_cut_where_the_cursor_says() {
    use archon_engine::session::{RunQuery, RunSummary};
    use archon_engine::store::RunStore as _;
    use archon_engine::store::sqlite::SqliteStore;
    let dir = TempDir::new().expect("tempdir");
    let state = dir.path().join("state");
    let store = SqliteStore::open(&state).expect("store");
    let states = [
        RunState::Succeeded,
        RunState::Failed,
        RunState::Cancelled,
        RunState::Interrupted,
        RunState::WaitingApproval,
    ];
    for i in 0..40 {
        let id = format!("r-page-{:02}", (i * 7) % 40);
        store
            .create_run(&archon_engine::store::NewRun {
                id: id.clone(),
                workflow: ["alpha", "beta", "gamma"][i % 3].to_owned(),
                spec_path: "spec.yaml".to_owned(),
                files: Vec::new(),
                inputs: Map::new(),
                workdir: ".".to_owned(),
                max_parallel: 1,
            })
            .expect("created");
        // Some stay running: this process owns them.
        if i % 6 != 5 {
            store
                .release(&id, states[i % states.len()])
                .expect("released");
        }
    }
    let sql = Session::open(&state).expect("store");
    let plain = Session::over(Box::new(Racing {
        inner: SqliteStore::open(&state).expect("store"),
        rival: SqliteStore::open(&state).expect("store"),
    }));
    let all = sql.list().expect("listed");
    assert_eq!(all.len(), 40);
    let middle = all[20].started_at;
    let queries = [
        RunQuery::default(),
        RunQuery {
            status: vec![RunState::Failed, RunState::Running],
            ..RunQuery::default()
        },
        RunQuery {
            workflow: Some("beta".to_owned()),
            ..RunQuery::default()
        },
        RunQuery {
            status: vec![RunState::Succeeded],
            workflow: Some("alpha".to_owned()),
            ..RunQuery::default()
        },
        RunQuery {
            since: Some(middle),
            ..RunQuery::default()
        },
        RunQuery {
            until: Some(middle),
            status: vec![RunState::WaitingApproval, RunState::Interrupted],
            ..RunQuery::default()
        },
        RunQuery {
            workflow: Some("nobody".to_owned()),
            ..RunQuery::default()
        },
    ];
    for query in queries {
        let expected: Vec<RunSummary> = all.iter().filter(|r| query.selects(r)).cloned().collect();
        for limit in [1, 3, 7, 100] {
            let mut query = RunQuery {
                limit,
                ..query.clone()
            };
            let mut seen = Vec::new();
            loop {
                let page = sql.page(&query).expect("a page");
                let same = plain.page(&query).expect("a page");
                assert_eq!(page, same, "{query:?}");
                assert_eq!(page.total, expected.len(), "{query:?}");
                assert!(page.runs.len() <= limit);
                seen.extend(page.runs);
                match page.next {
                    Some(next) => query.after = Some(next),
                    None => break,
                }
            }
            assert_eq!(seen, expected, "{query:?}");
        }
    }
}

/// What a run tells as it records each event (`Attachments::recorded`, what a server streams before the
/// store commits) is its event log exactly: the same numbers, the same events.
#[test]
fn events_told_as_recorded_are_the_log_as_stored() {
    let dir = TempDir::new().expect("tempdir");
    let spec = dir.path().join("failing.yaml");
    std::fs::write(&spec, FAILING).expect("write");
    let workflow = archon_engine::validate_file(&spec)
        .workflow
        .expect("valid workflow");
    let session = Session::open(&dir.path().join("state")).expect("store opens");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (sender, mut told) = tokio::sync::mpsc::unbounded_channel();
    let prepared = session
        .start(NewRunRequest {
            id: "r-told".to_owned(),
            workflow,
            inputs: Map::new(),
            spec_path: spec.clone(),
            workdir: dir.path().to_path_buf(),
            max_parallel: Some(4),
        })
        .expect("started");
    let attachments = Attachments {
        recorded: Some(sender.clone()),
        ..Attachments::default()
    };
    runtime
        .block_on(session.execute(prepared, attachments))
        .expect("executed");
    // Retried: the numbers go on from the log's last.
    std::fs::write(dir.path().join("fixed"), "").expect("write");
    let prepared = session
        .continue_run("r-told", Continue::Failed, &ContinueOptions::default())
        .expect("claimed");
    let attachments = Attachments {
        recorded: Some(sender),
        ..Attachments::default()
    };
    runtime
        .block_on(session.execute(prepared, attachments))
        .expect("executed");
    let mut events = Vec::new();
    while let Ok(event) = told.try_recv() {
        assert_eq!(event.run_id, "r-told");
        events.push((event.seq, event.event));
    }
    let stored = session
        .events_after("r-told", 0, usize::MAX)
        .expect("the log");
    assert!(stored.len() > 10, "{stored:?}");
    assert_eq!(events, stored);
}
