//! The stored runs: `archon runs`, `archon show`, `archon cancel`, `archon resume` and `archon retry`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use archon_engine::Workflow;
use archon_engine::resume;
use archon_engine::store::{RunState, RunStore, StoredRun, spec_hash};
use archon_engine::validate::{validate_file, validate_source};

use super::Status;
use super::run::{
    Execution, execute, existing_store, outputs_text, refuse_unsupported, spec_files, store_error,
};
use crate::args::{
    ApproveArgs, CancelArgs, ColorChoice, ContinueArgs, ResumeArgs, RetryArgs, RunsArgs, ShowArgs,
};
use crate::output;
use crate::render::{self, Report};

pub fn runs(args: &RunsArgs) -> anyhow::Result<Status> {
    let store = match existing_store(&args.state) {
        Ok(store) => store,
        Err(status) => return Ok(status),
    };
    if args.check {
        return Ok(check(store.as_deref(), &args.state));
    }
    let runs = match store.as_ref().map(|s| s.list()) {
        Some(Ok(runs)) => runs,
        Some(Err(e)) => return Ok(store_error(&e)),
        None => Vec::new(),
    };
    if args.json {
        let mut text = serde_json::to_string_pretty(&runs)?;
        text.push('\n');
        output::stdout(&text);
        return Ok(Status::Success);
    }
    if runs.is_empty() {
        output::stdout(&format!("no runs in `{}`\n", args.state.dir().display()));
        return Ok(Status::Success);
    }
    let rows: Vec<[String; 5]> = runs
        .iter()
        .map(|r| {
            [
                r.id.clone(),
                r.workflow.clone(),
                r.status.as_str().to_owned(),
                timestamp(r.started_at),
                r.duration_ms.map_or_else(|| "-".to_owned(), duration),
            ]
        })
        .collect();
    output::stdout(&table(
        &["RUN", "WORKFLOW", "STATUS", "STARTED", "DURATION"],
        &rows,
    ));
    Ok(Status::Success)
}

/// `archon runs --check`: every damaged page and row, and a failure when there is one.
fn check(store: Option<&dyn RunStore>, state: &crate::args::StateArgs) -> Status {
    let path = state.dir().join(archon_engine::store::sqlite::DATABASE);
    let problems = match store.map(RunStore::check) {
        Some(Ok(problems)) => problems,
        Some(Err(e)) => return store_error(&e),
        None => Vec::new(),
    };
    if problems.is_empty() {
        output::stdout(&format!("`{}`: no damage found\n", path.display()));
        return Status::Success;
    }
    let mut text = format!(
        "error: state database `{}` has {} problem{}:\n",
        path.display(),
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for problem in &problems {
        let _ = writeln!(text, "  {}", problem.replace('\n', "\n  "));
    }
    text.push_str("  hint: nothing was changed; what these problems touch cannot be shown or resumed until the file is restored from a backup\n");
    output::stderr(&text);
    Status::Failure
}

pub fn show(args: &ShowArgs) -> anyhow::Result<Status> {
    let store = match existing_store(&args.state) {
        Ok(Some(store)) => store,
        Ok(None) => return Ok(no_store(&args.run, &args.state)),
        Err(status) => return Ok(status),
    };
    let run = match store.load(&args.run) {
        Ok(run) => run,
        Err(e) => return Ok(store_error(&e)),
    };
    let events = if args.events {
        match store.events(&args.run) {
            Ok(events) => Some(events),
            Err(e) => return Ok(store_error(&e)),
        }
    } else {
        None
    };
    if args.json {
        let mut value = serde_json::to_value(&run)?;
        if let (Some(events), serde_json::Value::Object(map)) = (events, &mut value) {
            map.insert("events".to_owned(), serde_json::Value::Array(events));
        }
        let mut text = serde_json::to_string_pretty(&value)?;
        text.push('\n');
        output::stdout(&text);
        return Ok(Status::Success);
    }
    if let Some(events) = events {
        output::stdout(&crate::trail::render(&events));
        return Ok(Status::Success);
    }
    output::stdout(&describe(&run));
    Ok(Status::Success)
}

fn describe(run: &StoredRun) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "run       {}", run.id);
    let _ = writeln!(text, "workflow  {} ({})", run.workflow, run.spec_path);
    let _ = writeln!(text, "status    {}", run.status.as_str());
    let _ = writeln!(text, "started   {}", timestamp(run.started_at));
    if let Some(finished) = run.finished_at {
        let _ = writeln!(
            text,
            "finished  {} ({})",
            timestamp(finished),
            duration(finished.saturating_sub(run.started_at))
        );
    }
    if let Some(owner) = &run.owner {
        let _ = writeln!(text, "owner     process {} on `{}`", owner.pid, owner.host);
    }
    if let Some(error) = &run.error {
        let _ = writeln!(text, "error     {error}");
    }
    let mut attempts: HashMap<&str, usize> = HashMap::new();
    for attempt in &run.attempts {
        *attempts.entry(resume::step_of(&attempt.step)).or_default() += 1;
    }
    let mut rows = Vec::new();
    let mut seen = HashSet::new();
    for (name, result) in &run.results {
        if name.contains('[') {
            continue;
        }
        seen.insert(name.as_str());
        rows.push([
            name.clone(),
            result.status.as_str().to_owned(),
            attempts
                .get(name.as_str())
                .copied()
                .unwrap_or(0)
                .to_string(),
            result.error.clone().unwrap_or_default(),
        ]);
        nested_rows(name, result, &mut rows);
    }
    for attempt in &run.attempts {
        let step = resume::step_of(&attempt.step);
        if seen.insert(step) {
            rows.push([
                step.to_owned(),
                if attempt.status == "running" {
                    "in doubt".to_owned()
                } else {
                    format!("no result ({})", attempt.status)
                },
                attempts.get(step).copied().unwrap_or(0).to_string(),
                String::new(),
            ]);
        }
    }
    if !rows.is_empty() {
        text.push('\n');
        text.push_str(&table(&["STEP", "STATUS", "ATTEMPTS", "ERROR"], &rows));
    }
    if !run.outputs.is_empty() {
        text.push('\n');
        text.push_str(&outputs_text(&run.outputs));
    }
    if run.status == RunState::Interrupted {
        let _ = writeln!(
            text,
            "\n  hint: `archon resume {}` continues it; finished steps are not run again",
            run.id
        );
    }
    text
}

/// Rows for the steps a step ran inside it (a composite tool's, a sub-workflow's, or those its planner
/// planned), named `outer/inner`; their attempts belong to the calling step.
fn nested_rows(name: &str, result: &archon_engine::run::StepResult, rows: &mut Vec<[String; 4]>) {
    for (inner, nested) in &result.steps {
        let label = format!("{name}/{inner}");
        let status = if result.plan.is_some() {
            format!("{} (planned)", nested.status.as_str())
        } else {
            nested.status.as_str().to_owned()
        };
        rows.push([
            label.clone(),
            status,
            "-".to_owned(),
            nested.error.clone().unwrap_or_default(),
        ]);
        nested_rows(&label, nested, rows);
    }
}

/// The decisions on a run's calls that asked: recorded ones, and the rule's default for requests whose
/// timeout passed while nobody decided.
fn decisions(run: &StoredRun) -> HashMap<String, archon_engine::run::ApprovalDecision> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    run.approvals
        .iter()
        .filter_map(|a| {
            let decision = a.decision.clone().or_else(|| {
                let limit = a.request.timeout_ms?;
                (now.saturating_sub(a.requested_at) >= limit).then(|| {
                    archon_engine::run::ApprovalDecision {
                        approved: a.request.approve_on_timeout,
                        by: "timeout".to_owned(),
                        reason: Some("nobody decided in time".to_owned()),
                    }
                })
            })?;
            Some((a.request.key.clone(), decision))
        })
        .collect()
}

/// `archon approve RUN [--step S] [--deny] [--reason TEXT]`.
pub fn approve(args: &ApproveArgs) -> anyhow::Result<Status> {
    let store = match existing_store(&args.state) {
        Ok(Some(store)) => store,
        Ok(None) => return Ok(no_store(&args.run, &args.state)),
        Err(status) => return Ok(status),
    };
    let decision = archon_engine::run::ApprovalDecision {
        approved: !args.deny,
        by: std::env::var("USER").unwrap_or_else(|_| "someone".to_owned()),
        reason: args.reason.clone(),
    };
    let decided = match store.decide(&args.run, args.step.as_deref(), &decision) {
        Ok(decided) => decided,
        Err(e) => return Ok(store_error(&e)),
    };
    if decided.is_empty() {
        output::stderr(&format!(
            "error: run `{}` has no call waiting for approval{}\n",
            args.run,
            args.step
                .as_deref()
                .map_or_else(String::new, |s| format!(" in step `{s}`"))
        ));
        return Ok(Status::Invalid);
    }
    let mut text = String::new();
    for request in &decided {
        let _ = writeln!(
            text,
            "{} {}{}",
            if args.deny { "denied" } else { "approved" },
            request.step,
            request
                .tool
                .as_deref()
                .map_or_else(String::new, |t| format!(": `{t}` {}", request.arguments))
        );
    }
    let _ = writeln!(
        text,
        "  hint: `archon resume {}` continues the run",
        args.run
    );
    output::stdout(&text);
    Ok(Status::Success)
}

pub fn cancel(args: &CancelArgs) -> anyhow::Result<Status> {
    let store = match existing_store(&args.state) {
        Ok(Some(store)) => store,
        Ok(None) => return Ok(no_store(&args.run, &args.state)),
        Err(status) => return Ok(status),
    };
    match store.cancel(&args.run) {
        Ok(RunState::Cancelled) => {
            output::stdout(&format!("run {} is cancelled\n", args.run));
            Ok(Status::Success)
        }
        Ok(RunState::Running) => {
            output::stdout(&format!(
                "asked the process running {} to stop; it will record the run as cancelled\n",
                args.run
            ));
            Ok(Status::Success)
        }
        Ok(state) => {
            output::stderr(&format!(
                "error: run `{}` already ended: `{}`\n",
                args.run,
                state.as_str()
            ));
            Ok(Status::Invalid)
        }
        Err(e) => Ok(store_error(&e)),
    }
}

pub fn resume(args: &ResumeArgs, color: ColorChoice) -> anyhow::Result<Status> {
    continue_run(&args.run, None, &args.options, color)
}

pub fn retry(args: &RetryArgs, color: ColorChoice) -> anyhow::Result<Status> {
    continue_run(&args.run, Some(&args.from), &args.options, color)
}

/// Resumes a run (`from: None`) or runs it again from a step.
fn continue_run(
    id: &str,
    from: Option<&str>,
    options: &ContinueArgs,
    color: ColorChoice,
) -> anyhow::Result<Status> {
    let store = match existing_store(&options.state) {
        Ok(Some(store)) => store,
        Ok(None) => return Ok(no_store(id, &options.state)),
        Err(status) => return Ok(status),
    };
    let stored = match store.load(id) {
        Ok(run) => run,
        Err(e) => return Ok(store_error(&e)),
    };
    match (stored.status, from) {
        (RunState::Running, _) => {
            let owner = stored.owner.as_ref().map_or_else(String::new, |o| {
                format!(" by process `{}` on `{}`", o.pid, o.host)
            });
            return Ok(refuse(
                &format!("run `{id}` is being run{owner}"),
                "wait for it to finish, or stop it with `archon cancel`",
            ));
        }
        (RunState::Cancelled, _) => {
            return Ok(refuse(
                &format!("run `{id}` was cancelled"),
                "start a new run with `archon run`",
            ));
        }
        (RunState::Succeeded | RunState::Failed, None) => {
            return Ok(refuse(
                &format!("run `{id}` already ended: `{}`", stored.status.as_str()),
                &format!(
                    "`archon retry {id} --from STEP` runs a step and everything after it again"
                ),
            ));
        }
        _ => {}
    }
    // Claim the run, then decide from what the store holds now: nothing can change it in between.
    let allowed: &[RunState] = if from.is_some() {
        &[RunState::Interrupted, RunState::Succeeded, RunState::Failed]
    } else {
        &[RunState::Interrupted, RunState::WaitingApproval]
    };
    let previous = match store.claim(id, allowed) {
        Ok(state) => state,
        Err(e) => return Ok(store_error(&e)),
    };
    let outcome = prepare(&*store, id, from, options, color);
    let Prepared {
        workflow,
        stored,
        prior,
        rerun,
        in_doubt,
    } = match outcome {
        Ok(prepared) => prepared,
        Err(status) => {
            if let Err(e) = store.release(id, previous) {
                return Ok(store_error(&e));
            }
            return Ok(status);
        }
    };
    let files = spec_files(&workflow, Path::new(&stored.spec_path));
    if (!rerun.is_empty() || from.is_some())
        && let Err(e) = store.forget_results(id, &rerun)
    {
        return Ok(store_error(&e));
    }
    if spec_hash(&files) != stored.spec_hash
        && let Err(e) = store.replace_files(id, &files)
    {
        return Ok(store_error(&e));
    }
    // A command that outlived the crashed process would race its own rerun: stop it first.
    for d in in_doubt {
        if let Some(pgid) = d.leftover {
            archon_engine::store::kill_group(pgid);
            output::stderr(&format!(
                "stopped process group `{pgid}`, left running by `{}` when the run stopped\n",
                d.name
            ));
        }
    }
    let workdir = PathBuf::from(&stored.workdir);
    // A retried step asks again: decisions were for the attempts they were given for.
    let decided = if from.is_some() {
        HashMap::new()
    } else {
        decisions(&stored)
    };
    execute(Execution {
        workflow,
        inputs: stored.inputs,
        store,
        run_id: id.to_owned(),
        prior,
        decided,
        // A retried step starts afresh; a resumed one continues where it stood.
        checkpoints: if from.is_some() {
            HashMap::new()
        } else {
            // A step that runs again because its definition changed starts afresh.
            stored
                .checkpoints
                .into_iter()
                .filter(|(name, _)| !rerun.iter().any(|r| r == resume::step_of(name)))
                .collect()
        },
        cassette: None,
        max_parallel: options
            .max_parallel
            .map_or(stored.max_parallel, |m| m as usize),
        workdir,
        output: &options.output,
        save_plan: None,
    })
}

/// What a claimed run continues with.
struct Prepared {
    workflow: Workflow,
    stored: StoredRun,
    /// Results to reuse, by step or `step[i]`.
    prior: HashMap<String, archon_engine::run::StepResult>,
    /// Steps to run again whatever they recorded.
    rerun: Vec<String>,
    in_doubt: Vec<resume::InDoubt>,
}

/// Everything a claimed run needs to continue, or the refusal (already shown).
fn prepare(
    store: &dyn RunStore,
    id: &str,
    from: Option<&str>,
    options: &ContinueArgs,
    color: ColorChoice,
) -> Result<Prepared, Status> {
    let stored = store.load(id).map_err(|e| store_error(&e))?;
    let spec_path = PathBuf::from(&stored.spec_path);
    let workflow = current_workflow(&spec_path, color)?;
    refuse_unsupported(&workflow)?;
    let files = spec_files(&workflow, &spec_path);
    let mut rerun: Vec<String> = Vec::new();
    if spec_hash(&files) != stored.spec_hash {
        let old = store.files(id).map_err(|e| store_error(&e))?;
        let changed = changed_steps(&spec_path, &old, &workflow);
        if !options.allow_changed_spec {
            return Err(refuse(
                &format!(
                    "the spec changed since run `{id}` started: {}",
                    if changed.is_empty() {
                        "a sub-workflow or the formatting changed".to_owned()
                    } else {
                        format!("changed: {}", quoted(&changed))
                    }
                ),
                "`--allow-changed-spec` continues with the spec as it is now; changed steps run again",
            ));
        }
        // A change outside the steps (tools, inputs, a sub-workflow) may affect any step: all run again.
        let steps: Vec<&str> = workflow
            .spec
            .steps
            .iter()
            .map(|s| s.id.value.as_str())
            .collect();
        if changed.is_empty() || changed.iter().any(|c| !steps.contains(&c.as_str())) {
            rerun.extend(steps.iter().map(|s| (*s).to_owned()));
        } else {
            for step in &changed {
                rerun.extend(resume::downstream(&workflow, step));
            }
        }
    }
    if let Some(step) = from {
        if !workflow.spec.steps.iter().any(|s| s.id.value == step) {
            let ids: Vec<&str> = workflow
                .spec
                .steps
                .iter()
                .map(|s| s.id.value.as_str())
                .collect();
            return Err(refuse(
                &format!("workflow `{}` has no step `{step}`", workflow.name),
                &format!("its steps are {}", quoted(&ids)),
            ));
        }
        rerun.extend(resume::downstream(&workflow, step));
    }
    let in_doubt = resume::in_doubt(&workflow, &stored);
    let doubtful: Vec<&resume::InDoubt> = in_doubt
        .iter()
        .filter(|d| !d.idempotent && !rerun.contains(&d.step))
        .collect();
    if !doubtful.is_empty() && !options.rerun_in_doubt {
        let names: Vec<String> = doubtful
            .iter()
            .map(|d| match d.leftover {
                Some(pgid) => format!(
                    "`{}` (its command is still running: process group `{pgid}`)",
                    d.name
                ),
                None => format!("`{}`", d.name),
            })
            .collect();
        return Err(refuse(
            &format!(
                "run `{id}` stopped while {} running, and {} may have had {} effect: {}",
                if names.len() == 1 {
                    "a step was"
                } else {
                    "steps were"
                },
                if names.len() == 1 { "it" } else { "they" },
                if names.len() == 1 { "its" } else { "their" },
                names.join(", ")
            ),
            "check what it did; `--rerun-in-doubt` runs it again anyway (steps that are safe to repeat are \
             marked `idempotent: true` on their tool)",
        ));
    }
    let prior = stored
        .results
        .iter()
        .filter(|(name, _)| !rerun.iter().any(|r| r == resume::step_of(name)))
        .map(|(name, result)| (name.clone(), result.clone()))
        .collect();
    Ok(Prepared {
        workflow,
        stored,
        prior,
        rerun,
        in_doubt,
    })
}

/// The spec as it is now on disk, validated.
fn current_workflow(path: &Path, color: ColorChoice) -> Result<Workflow, Status> {
    let validation = validate_file(path);
    if validation.has_errors() {
        let mut report = Report::default();
        report.add(path, &validation, &mut HashSet::new());
        output::stderr(&render::text(&report, output::use_color_stderr(color)));
        return Err(Status::Invalid);
    }
    validation.workflow.ok_or(Status::Invalid)
}

/// The steps that differ between the spec a run started with (its stored main file) and `now`.
fn changed_steps(path: &Path, old: &[(String, String)], now: &Workflow) -> Vec<String> {
    let Some((_, text)) = old.first() else {
        return Vec::new();
    };
    match validate_source(path, text.clone()).workflow {
        Some(before) => resume::changed_steps(&before.spec, &now.spec),
        None => vec!["(workflow)".to_owned()],
    }
}

/// Asked about a run where there is no store at all.
fn no_store(id: &str, state: &crate::args::StateArgs) -> Status {
    refuse(
        &format!(
            "no run `{id}`: there is no run store in `{}`",
            state.dir().display()
        ),
        "run the command where the run was started, or point `--state-dir` at its state directory",
    )
}

fn refuse(message: &str, hint: &str) -> Status {
    output::stderr(&format!("error: {message}\n  hint: {hint}\n"));
    Status::Invalid
}

fn quoted(names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A time as RFC 3339 (UTC, seconds).
fn timestamp(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string()
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Columns padded to their widest cell.
fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                let _ = write!(out, "{cell:<width$}  ");
            }
        }
        text.push_str(out.trim_end());
        text.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    text
}
