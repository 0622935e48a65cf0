//! `archon run FILE`: run a workflow, showing each step as it starts and ends, then the outputs (or the
//! whole report with `--json`). Ctrl-C cancels the running steps and exits 130.

use std::fmt::Write as _;
use std::future::Future;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use archon_engine::run::{self, RunEvent, RunReport, RunStatus, StepStatus};
use archon_engine::session::{
    self, Attachments, NewRunRequest, Outcome, Prepared, Session, SessionError, StoreError,
};
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use super::{Status, load};
use crate::args::{ColorChoice, RunArgs, RunOutputArgs, StateArgs, WorkflowArgs};
use crate::color::Paint;
use crate::output;
use crate::render::{self, Report};

pub fn run(args: &RunArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let id = session::new_run_id();
    let file = match (&args.file, &args.goal) {
        (Some(file), _) => file.clone(),
        (None, Some(_))
            if args.replay.is_none()
                && matches!(
                    archon_engine::llm::config::auto_kind(&std::env::vars().collect()),
                    Ok(None)
                ) =>
        {
            // Refused before a run is recorded that could only fail.
            output::stderr(
                "error: `--goal` needs an LLM provider, and the environment configures none\n  hint: set `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` or `GEMINI_API_KEY`, or `ARCHON_OPENAI_BASE_URL` and `ARCHON_OPENAI_MODEL` for a local server\n",
            );
            return Ok(Status::Invalid);
        }
        (None, Some(goal)) => match session::write_goal_workflow(&args.state.dir(), goal, &id) {
            Ok(file) => file,
            Err(e) => return Ok(session_error(&e, color)),
        },
        (None, None) => anyhow::bail!("a workflow file or `--goal` is required"),
    };
    let loading = WorkflowArgs {
        file: file.clone(),
        inputs: args.inputs.clone(),
        inputs_file: args.inputs_file.clone(),
    };
    let (workflow, inputs) = match load::workflow_and_inputs(&loading, color) {
        Ok(loaded) => loaded,
        Err(status) => return Ok(status),
    };
    let workdir = match (&args.workdir, &args.goal) {
        (Some(dir), _) => dir.clone(),
        // A goal works on the directory it was given in.
        (None, Some(_)) => ".".into(),
        (None, None) => file
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| ".".into()),
    };
    let workdir = std::fs::canonicalize(&workdir)
        .map_err(|e| anyhow::anyhow!("workspace `{}`: {e}", workdir.display()))?;
    if args.dry_run {
        return super::dry_run::show(&workflow, inputs, &workdir, args.output.json, color);
    }
    let cassette = match (&args.record, &args.replay) {
        (Some(path), _) => match archon_engine::llm::cassette::Recorder::open(path) {
            Ok(file) => Some(run::Cassette::Record(file)),
            Err(e) => return Ok(refuse_cassette(&e.message)),
        },
        (None, Some(path)) => match archon_engine::llm::cassette::Replayer::read(path) {
            Ok(exchanges) => Some(run::Cassette::Replay(Arc::new(exchanges))),
            Err(e) => return Ok(refuse_cassette(&e.message)),
        },
        (None, None) => None,
    };
    let session = match Session::open_at(&args.state.at()) {
        Ok(session) => session,
        Err(e) => return Ok(store_error(&e)),
    };
    let request = NewRunRequest {
        id,
        workflow,
        inputs,
        spec_path: file,
        workdir,
        max_parallel: args.max_parallel.map(|m| m as usize),
    };
    if args.submit {
        return match session.submit(request) {
            Ok(id) => {
                output::stdout(&format!("{id}\n"));
                if args.wait {
                    return Ok(super::runs::follow(&session, &id, color));
                }
                Ok(Status::Success)
            }
            Err(e) => Ok(session_error(&e, color)),
        };
    }
    let prepared = session.start(request);
    match prepared {
        Ok(prepared) => execute(
            &session,
            prepared,
            cassette,
            &args.output,
            args.save_plan.as_deref(),
            color,
        ),
        Err(e) => Ok(session_error(&e, color)),
    }
}

/// A cassette that cannot be read or written: a usage problem.
fn refuse_cassette(message: &str) -> Status {
    output::stderr(&format!("error: {message}\n"));
    Status::Invalid
}

/// Opens the run store for a command that only reads or changes existing runs: a missing store is not
/// created. `Ok(None)` when there is none.
pub fn existing_session(state: &StateArgs) -> Result<Option<Session>, Status> {
    Session::open_existing_at(&state.at()).map_err(|e| store_error(&e))
}

/// Shows a store problem; the command fails with status 1 (2 for a run that does not exist).
pub fn store_error(error: &StoreError) -> Status {
    let mut text = format!("error: {}\n", error.message);
    if let Some(hint) = &error.hint {
        let _ = writeln!(text, "  hint: {hint}");
    }
    output::stderr(&text);
    if error.unknown_run {
        Status::Invalid
    } else {
        Status::Failure
    }
}

/// Shows why a session refused or failed a request, and the status to exit with.
pub fn session_error(error: &SessionError, color: ColorChoice) -> Status {
    match error {
        SessionError::Store(e) => return store_error(e),
        SessionError::Refused { message, hint } => {
            output::stderr(&output::printable(&format!(
                "error: {message}\n  hint: {hint}\n"
            )));
        }
        SessionError::Invalid { path, validation } => {
            let mut report = Report::default();
            report.add(path, validation.diagnostics.clone(), &validation.sources);
            output::stderr_with(|err| {
                render::write_text(&report, output::use_color_stderr(color), err)
            });
        }
        SessionError::Write { path, source } => output::stderr(&format!(
            "error: cannot write `{}`: {}\n",
            path.display(),
            source.to_string().to_lowercase()
        )),
        SessionError::Run(_) | SessionError::Goal(_) => {
            output::stderr(&output::printable(&format!("error: {error}\n")));
        }
    }
    if error.is_usage() {
        Status::Invalid
    } else {
        Status::Failure
    }
}

/// Runs a prepared run to its end (or until interrupted), showing its progress, and prints the result.
pub fn execute(
    session: &Session,
    prepared: Prepared,
    cassette: Option<run::Cassette>,
    args: &RunOutputArgs,
    save_plan: Option<&Path>,
    color: ColorChoice,
) -> anyhow::Result<Status> {
    let mut events_file = match &args.events {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "cannot open events file `{}`: {}",
                        path.display(),
                        e.to_string().to_lowercase()
                    )
                })?,
        ),
        None => None,
    };
    // Steps wait on processes and the network; one thread runs the scheduler and every step, because
    // handing a finished step to another thread cost more (about 60 us per dependency, measured with
    // `cargo bench --bench scheduler`) than a second thread saves.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let cancel = CancellationToken::new();
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let paint = Paint::new(output::use_color_stderr(color));
    let mut display = if args.json {
        Display::Quiet
    } else if output::stderr_is_capable_terminal() {
        Display::Live(Live::default(), paint)
    } else {
        Display::Lines(paint)
    };
    // Progress and the approval prompt share standard error: while a prompt is open, progress waits.
    let screen = Arc::new(std::sync::Mutex::new(Screen {
        live: matches!(display, Display::Live(..)),
        ..Screen::default()
    }));
    // A person at a terminal is asked there; otherwise the run pauses for `archon approve`.
    let approver = (!args.yes
        && !args.no_input
        && std::io::IsTerminal::is_terminal(&std::io::stdin())
        && terminal)
        .then(|| Arc::new(TerminalApprover::new(screen.clone())) as Arc<dyn run::Approver>);
    let printing = screen.clone();
    for (name, pgid) in &prepared.stopped {
        output::stderr(&format!(
            "stopped process group `{pgid}`, left running by `{name}` when the run stopped\n"
        ));
    }
    let planned = save_plan.map(|_| prepared.workflow.clone());
    let attachments = Attachments {
        events: Some(sender),
        cancel: cancel.clone(),
        yes: args.yes,
        approver,
        cassette,
        helper: std::env::current_exe().ok(),
        no_cache: args.no_cache,
        recorded: None,
        labels: args.labels.iter().cloned().collect(),
    };
    // Registered before any step starts, so an early Ctrl-C or SIGTERM is never missed. Closing the
    // terminal (SIGHUP) stops the run like Ctrl-C: its commands are killed and the run is left
    // resumable, rather than archon dying at once with its children still running. The signals are
    // watched on a thread of their own, so that the run is stopped at once even while its own thread is
    // busy: no step or command starts after Ctrl-C.
    let signal_handle = cancel_on_signals(cancel.clone())?;
    let outcome = runtime.block_on(async move {
        // Events that arrived together are written together: one write to standard error (and to the
        // events file) for all of them, rather than one per line, which cost a wide run of 10,000 steps
        // 20,000 system calls; an event that arrives alone is written at once.
        let printer = tokio::spawn(async move {
            let (mut text, mut saved) = (String::new(), Vec::new());
            let screen = printing;
            while let Some(event) = receiver.recv().await {
                let mut next = Some(event);
                let mut taken = 0;
                while let Some(event) = next {
                    if events_file.is_some() {
                        let _ = serde_json::to_writer(&mut saved, &event);
                        saved.push(b'\n');
                    }
                    display.show(&event, &mut text);
                    taken += 1;
                    next = if taken < PRINTED_TOGETHER {
                        receiver.try_recv().ok()
                    } else {
                        None
                    };
                }
                let status = display.status_line();
                if let Some(file) = events_file.as_mut() {
                    let _ = file.write_all(&saved);
                }
                if let Ok(mut screen) = screen.lock() {
                    screen.write(&text, status);
                }
                text.clear();
                saved.clear();
            }
            display
        });
        let outcome = session.execute(prepared, attachments).await;
        let _ = printer.await;
        if let Ok(mut screen) = screen.lock() {
            screen.finish();
        }
        Ok::<_, std::io::Error>(outcome)
    })?;
    // The run is over and recorded: work a stopped step left on a blocking thread (a render over a large
    // output, say) is abandoned rather than waited for.
    runtime.shutdown_background();
    signal_handle.close();
    let Outcome {
        mut report,
        resumable,
        unsaved,
    } = match outcome {
        Ok(outcome) => outcome,
        Err(SessionError::Run(err)) => {
            output::stderr(&output::printable(&format!("error: {err}\n")));
            return Ok(Status::Invalid);
        }
        Err(e) => return Ok(session_error(&e, ColorChoice::Never)),
    };
    if args.json {
        let mut text = serde_json::to_string_pretty(&report)?;
        text.push('\n');
        output::stdout(&text);
    } else if let Some(error) = &unsaved {
        // Archon's own failure, not the workflow's: said on standard error, with what to do.
        report.error = None;
        output::stdout(&summary(
            &report,
            resumable,
            Paint::new(output::use_color(color)),
        ));
        let text = if error.taken_over {
            format!(
                "error: {error}\n  hint: `archon show {}` shows where it stands\n",
                report.run_id
            )
        } else {
            let mut text = format!("error: the run's state could not be saved: {error}\n");
            if let Some(hint) = &error.hint {
                let _ = writeln!(text, "  hint: {hint}");
            }
            let _ = writeln!(
                text,
                "  hint: the store keeps the run as it was last saved; once the state directory can be written again, `archon resume {}` continues it",
                report.run_id
            );
            text
        };
        output::stderr(&output::printable(&text));
    } else {
        output::stdout(&summary(
            &report,
            resumable,
            Paint::new(output::use_color(color)),
        ));
    }
    let status = match report.status {
        RunStatus::Succeeded => Status::Success,
        RunStatus::Failed => Status::Failure,
        RunStatus::Cancelled => Status::Interrupted,
        RunStatus::WaitingApproval => Status::WaitingApproval,
    };
    if let (Some(path), Some(planned)) = (save_plan, planned) {
        match session::save_plan(&planned, &report, path) {
            Ok(()) => output::stderr(&format!(
                "plan saved to {}: it runs without the planner\n",
                path.display()
            )),
            Err(message) => {
                output::stderr(&format!("error: the plan was not saved: {message}\n"));
                return Ok(if status == Status::Success {
                    Status::Failure
                } else {
                    status
                });
            }
        }
    }
    Ok(status)
}

/// Most events written to standard error in one write.
const PRINTED_TOGETHER: usize = 1024;

/// How progress is shown on standard error.
enum Display {
    /// `--json`: nothing but the report.
    Quiet,
    /// Not a terminal: one plain line per event.
    Lines(Paint),
    /// A terminal: one status line redrawn in place, with failures and retries printed above it.
    Live(Live, Paint),
}

#[derive(Default)]
struct Live {
    running: Vec<String>,
    succeeded: usize,
    failed: usize,
    skipped: usize,
    /// Something changed since the status line was last drawn.
    changed: bool,
}

impl Display {
    /// Adds the progress lines `event` shows to `out`; the live status line is [`Display::status_line`].
    fn show(&mut self, event: &RunEvent, out: &mut String) {
        match self {
            Display::Quiet => {}
            Display::Lines(paint) => out.push_str(&event_line(event, *paint)),
            Display::Live(live, paint) => {
                live.changed = true;
                let line = || event_line(event, *paint);
                match event {
                    RunEvent::StepStarted { step } => live.running.push(step.clone()),
                    RunEvent::StepFinished { step, status, .. } => {
                        live.running.retain(|s| s != step);
                        match status {
                            StepStatus::Succeeded => live.succeeded += 1,
                            StepStatus::Skipped => live.skipped += 1,
                            _ => {
                                live.failed += 1;
                                out.push_str(&line());
                            }
                        }
                    }
                    RunEvent::StepSkipped { .. } => live.skipped += 1,
                    RunEvent::AgentAction { .. }
                    | RunEvent::AgentCompacted { .. }
                    | RunEvent::PlanAccepted { .. }
                    | RunEvent::PlanRejected { .. }
                    | RunEvent::PlanRevising { .. }
                    | RunEvent::Consensus { .. }
                    | RunEvent::Resumed { .. }
                    | RunEvent::RuleMatched { .. }
                    | RunEvent::ApprovalRequested { .. }
                    | RunEvent::ApprovalDecided { .. }
                    | RunEvent::StepResolved { .. }
                    | RunEvent::LlmCallFailed { .. }
                    | RunEvent::StepRetried { .. } => out.push_str(&line()),
                    RunEvent::StepCached { .. } => live.succeeded += 1,
                    RunEvent::PlanProposed { .. }
                    | RunEvent::LlmCall { .. }
                    | RunEvent::AgentAnswerRejected { .. }
                    | RunEvent::AgentThought { .. }
                    | RunEvent::AgentObservation { .. }
                    | RunEvent::AgentAnswer { .. } => {}
                    RunEvent::StepReused { status, .. } => match status {
                        StepStatus::Succeeded => live.succeeded += 1,
                        StepStatus::Skipped => live.skipped += 1,
                        _ => live.failed += 1,
                    },
                }
            }
        }
    }

    /// The live status line, when it changed since it was last asked for.
    fn status_line(&mut self) -> Option<String> {
        let Display::Live(live, paint) = self else {
            return None;
        };
        if !std::mem::take(&mut live.changed) {
            return None;
        }
        let count = |n: usize, what: &str, status: &str| {
            let text = format!("{what} {n}");
            if n > 0 {
                paint.status(status, &text)
            } else {
                text
            }
        };
        let mut status = format!(
            "running {} | {} | {} | {}",
            live.running.len(),
            count(live.succeeded, "done", "succeeded"),
            count(live.failed, "failed", "failed"),
            count(live.skipped, "skipped", "skipped"),
        );
        let room = terminal_width()
            .saturating_sub(1)
            .saturating_sub(crate::color::width(&status));
        if !live.running.is_empty() {
            let shown: Vec<&str> = live.running.iter().take(4).map(String::as_str).collect();
            let more = live.running.len().saturating_sub(shown.len());
            let names = format!(
                " | {}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
            status.extend(output::printable(&names).chars().take(room));
        }
        Some(status)
    }
}

/// What progress and the terminal's approval prompt share on standard error. While a prompt is open,
/// progress lines are held and the status line is neither drawn nor redrawn, so that the prompt and the
/// answer typed to it are never interleaved with progress; once it is answered, what was held is printed
/// and the status line drawn again.
#[derive(Default)]
struct Screen {
    /// Progress has a status line redrawn in place.
    live: bool,
    /// A prompt is open.
    prompting: bool,
    /// Progress lines that came while a prompt was open.
    held: String,
    /// The status line as it stands.
    status: String,
}

impl Screen {
    /// Shows progress `lines`, and on a live display the status line below them (`status`, when it
    /// changed); both wait while a prompt is open.
    fn write(&mut self, lines: &str, status: Option<String>) {
        let changed = status.is_some();
        if let Some(status) = status {
            self.status = status;
        }
        if self.prompting {
            self.held.push_str(lines);
        } else if self.live && (changed || !lines.is_empty()) {
            output::stderr(&format!("\r\x1b[2K{lines}{}", self.status));
        } else if !lines.is_empty() {
            output::stderr(lines);
        }
    }

    /// Clears the status line and shows `prompt`; progress waits until [`Screen::close_prompt`].
    fn open_prompt(&mut self, prompt: &str) {
        self.prompting = true;
        let clear = if self.live { "\r\x1b[2K" } else { "" };
        output::stderr(&format!("{clear}{prompt}"));
    }

    /// Shows what progress came while the prompt was open, and the status line again.
    fn close_prompt(&mut self) {
        self.prompting = false;
        let held = std::mem::take(&mut self.held);
        if self.live {
            output::stderr(&format!("\r\x1b[2K{held}{}", self.status));
        } else if !held.is_empty() {
            output::stderr(&held);
        }
    }

    /// Clears the status line before the summary is printed.
    fn finish(&mut self) {
        if self.prompting {
            self.close_prompt();
        }
        if self.live {
            output::stderr("\r\x1b[2K");
        }
    }
}

/// The terminal's width: `COLUMNS` when it is set, else what the terminal on standard error says (a shell
/// does not export `COLUMNS`), else 100. Read at each redraw, so a resized window is followed.
fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .or_else(|| {
            rustix::termios::tcgetwinsize(std::io::stderr())
                .ok()
                .map(|size| usize::from(size.ws_col))
                .filter(|&columns| columns > 0)
        })
        .unwrap_or(100)
}

/// One progress line, safe to show (see [`output::printable`]), its first word painted by what it says.
fn event_line(event: &RunEvent, paint: Paint) -> String {
    let line = output::printable(&raw_event_line(event));
    match line.split_once(' ') {
        Some((word, rest)) => format!("{} {rest}", paint.status(word.trim_end_matches('!'), word)),
        None => line,
    }
}

fn raw_event_line(event: &RunEvent) -> String {
    match event {
        RunEvent::StepStarted { step } => format!("started   {step}\n"),
        RunEvent::StepRetried {
            step,
            attempt,
            error,
            delay_ms,
        } => {
            format!("retrying  {step} (attempt {attempt} in {delay_ms} ms): {error}\n")
        }
        RunEvent::StepFinished {
            step,
            status,
            duration_ms,
            error,
        } => match error {
            Some(error) => format!(
                "{:<9} {step} ({duration_ms} ms): {error}\n",
                status.as_str()
            ),
            None => format!("{:<9} {step} ({duration_ms} ms)\n", status.as_str()),
        },
        RunEvent::StepSkipped { step, reason } => format!("skipped   {step}: {reason}\n"),
        RunEvent::LlmCall { .. } => format!("llm       {}\n", crate::trail::describe(event).1),
        RunEvent::LlmCallFailed { .. } => {
            format!("llm!      {}\n", one_line(&crate::trail::describe(event).1))
        }
        RunEvent::AgentAnswerRejected { step, text, .. } => {
            format!("rejected  {step}: {}\n", one_line(text))
        }
        RunEvent::AgentThought { step, text, .. } => {
            format!("thought   {step}: {}\n", one_line(text))
        }
        RunEvent::AgentAnswer { step, text, .. } => {
            format!("answer    {step}: {}\n", one_line(text))
        }
        RunEvent::AgentAction {
            step,
            tool,
            arguments,
            ..
        } => format!(
            "action    {step}: {tool} {}\n",
            one_line(&arguments.to_string())
        ),
        RunEvent::AgentObservation {
            step, tool, text, ..
        } => format!("observed  {step}: {tool} -> {}\n", one_line(text)),
        RunEvent::AgentCompacted {
            step,
            turns,
            tokens_before,
            tokens_after,
            ..
        } => format!(
            "compacted {step}: {turns} earlier turns summarised, about {tokens_before} -> {tokens_after} tokens\n"
        ),
        RunEvent::StepReused { step, status } => {
            format!("reused    {step} ({} earlier)\n", status.as_str())
        }
        RunEvent::StepResolved { .. } => format!("resolved  {}\n", crate::trail::describe(event).1),
        RunEvent::StepCached { .. } => format!("cached    {}\n", crate::trail::describe(event).1),
        RunEvent::PlanProposed { step, text, .. } => {
            format!("proposed  {step}: {}\n", one_line(text))
        }
        RunEvent::PlanRejected { step, problems, .. } => {
            format!("rejected  {step}: {}\n", one_line(&problems.join("; ")))
        }
        RunEvent::PlanAccepted {
            step, steps, kept, ..
        } => {
            let kept = if kept.is_empty() {
                String::new()
            } else {
                format!(" (kept {})", kept.join(", "))
            };
            format!("planned   {step}: {}{kept}\n", steps.join(", "))
        }
        RunEvent::Resumed { step, from } => format!("resumed   {step} {from}\n"),
        RunEvent::RuleMatched {
            step,
            tool,
            rule,
            action,
            ..
        } => format!(
            "rule      {}{}: `{rule}` {}\n",
            step.as_deref().unwrap_or("run"),
            tool.as_deref()
                .map_or_else(String::new, |t| format!(" {t}")),
            serde_json::to_value(action)
                .ok()
                .and_then(|a| a.as_str().map(str::to_owned))
                .unwrap_or_default()
        ),
        RunEvent::ApprovalRequested {
            step,
            tool,
            arguments,
            reason,
            ..
        } => format!(
            "asking    {step}{}: {reason}: {}\n",
            tool.as_deref()
                .map_or_else(String::new, |t| format!(" {t}")),
            one_line(&arguments.to_string())
        ),
        RunEvent::ApprovalDecided {
            step,
            tool,
            approved,
            by,
            ..
        } => format!(
            "{}  {step}{} by {by}\n",
            if *approved { "approved" } else { "denied  " },
            tool.as_deref()
                .map_or_else(String::new, |t| format!(" {t}"))
        ),
        RunEvent::PlanRevising { step, reason, .. } => {
            format!("replan    {step}: {}\n", one_line(reason))
        }
        RunEvent::Consensus { step, summary, .. } => {
            format!("consensus {step}: {}\n", one_line(summary))
        }
    }
}

/// Text on one line, cut at 160 characters.
fn one_line(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 160 {
        format!("{}...", flat.chars().take(160).collect::<String>())
    } else {
        flat
    }
}

/// The run's summary, safe to show: what the run produced is made printable here, before statuses are
/// painted.
fn summary(report: &RunReport, resumable: bool, paint: Paint) -> String {
    let count = |status: StepStatus| report.steps.values().filter(|s| s.status == status).count();
    let mut parts = Vec::new();
    for status in [
        StepStatus::Succeeded,
        StepStatus::Failed,
        StepStatus::TimedOut,
        StepStatus::Stuck,
        StepStatus::Incomplete,
        StepStatus::Skipped,
        StepStatus::Cancelled,
    ] {
        let n = count(status);
        if n > 0 {
            let text = format!("{n} {}", status.as_str().replace('_', " "));
            parts.push(paint.status(status.as_str(), &text));
        }
    }
    let status = match report.status {
        RunStatus::Succeeded => paint.status("succeeded", "succeeded"),
        RunStatus::Failed => paint.status("failed", "failed"),
        RunStatus::Cancelled if resumable => {
            format!("was {}", paint.status("interrupted", "interrupted"))
        }
        RunStatus::Cancelled => format!("was {}", paint.status("cancelled", "cancelled")),
        RunStatus::WaitingApproval => format!(
            "is {}",
            paint.status("waiting approval", "waiting for approval")
        ),
    };
    let mut text = format!(
        "run {} of `{}` {status} in {} ms{}\n",
        output::printable(&report.run_id),
        output::printable(&report.workflow),
        report.duration_ms,
        if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join(", "))
        }
    );
    if let Some(error) = &report.error {
        let _ = writeln!(
            text,
            "{}: {}",
            paint.status("failed", "error"),
            output::printable(error)
        );
    }
    if let Some(llm) = &report.llm {
        let _ = writeln!(text, "llm: {}", super::runs::usage(llm));
    }
    if resumable {
        let _ = writeln!(
            text,
            "  hint: `archon resume {}` continues it; finished steps are not run again",
            report.run_id
        );
    }
    if report.status == RunStatus::WaitingApproval {
        let _ = writeln!(
            text,
            "  hint: `archon approve {id}` (or `archon approve {id} --deny`), then `archon resume {id}`",
            id = report.run_id
        );
    }
    // A step whose command failed (an agent's or a request's failure says it all).
    if let Some((step, _)) = report.steps.iter().find(|(_, s)| {
        matches!(s.status, StepStatus::Failed | StepStatus::TimedOut) && s.exit_code.is_some()
    }) {
        let _ = writeln!(
            text,
            "  hint: `archon logs {} {}` prints everything its commands wrote",
            report.run_id,
            output::printable(step)
        );
    }
    // A run that has not ended has no outputs yet: they are rendered when it ends.
    if !matches!(report.status, RunStatus::WaitingApproval) && !resumable {
        text.push_str(&output::printable(&outputs_text(&report.outputs)));
    }
    text
}

/// `outputs:` and one `  name: value` line per output (strings as they are), or nothing.
pub fn outputs_text(outputs: &Map<String, Json>) -> String {
    let mut text = String::new();
    if !outputs.is_empty() {
        text.push_str("outputs:\n");
        for (name, value) in outputs {
            let shown = match value {
                Json::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = writeln!(text, "  {name}: {shown}");
        }
    }
    text
}

/// Asks the person at the terminal about a call, showing it exactly as it would run (secrets redacted).
///
/// One prompt at a time, answered from one reader thread (a timed-out prompt leaves nothing blocking the
/// exit). To approve, the person types a code shown only on the screen: input a command of the workflow
/// pushed into the terminal, or typed ahead, cannot approve a call.
struct TerminalApprover {
    lines: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
    /// Standard error, shared with the run's progress.
    screen: Arc<std::sync::Mutex<Screen>>,
}

/// An open prompt: progress shows again when it is answered, or given up (its timeout, Ctrl-C).
struct OpenPrompt<'a>(&'a std::sync::Mutex<Screen>);

impl Drop for OpenPrompt<'_> {
    fn drop(&mut self) {
        if let Ok(mut screen) = self.0.lock() {
            screen.close_prompt();
        }
    }
}

impl TerminalApprover {
    fn new(screen: Arc<std::sync::Mutex<Screen>>) -> Self {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        // Detached: it ends with the process, whatever it is waiting for.
        let _ = std::thread::Builder::new()
            .name("approvals".to_owned())
            .spawn(move || {
                let stdin = std::io::stdin();
                loop {
                    let mut line = String::new();
                    match stdin.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            if sender.send(line).is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        TerminalApprover {
            lines: tokio::sync::Mutex::new(receiver),
            screen,
        }
    }
}

impl run::Approver for TerminalApprover {
    fn ask<'a>(
        &'a self,
        request: &'a run::ApprovalRequest,
    ) -> std::pin::Pin<Box<dyn Future<Output = Option<run::ApprovalDecision>> + Send + 'a>> {
        Box::pin(async move {
            let mut lines = self.lines.lock().await;
            // Whatever was typed (or pushed) before the prompt does not answer it.
            let _ =
                rustix::termios::tcflush(std::io::stdin(), rustix::termios::QueueSelector::IFlush);
            while lines.try_recv().is_ok() {}
            let code = format!("{:04}", fastrand::u32(..10_000));
            let arguments = serde_json::to_string_pretty(&request.arguments).unwrap_or_default();
            let prompt = output::printable(&format!(
                "\napproval needed: step `{}`{}\n  why: {}\n  arguments:\n{}\ntype {code} to approve, anything else denies: ",
                request.step,
                request
                    .tool
                    .as_deref()
                    .map_or_else(String::new, |t| format!(" calls `{t}`")),
                request.reason,
                arguments
                    .lines()
                    .map(|l| format!("    {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
            let _open = match self.screen.lock() {
                Ok(mut screen) => {
                    screen.open_prompt(&prompt);
                    OpenPrompt(&self.screen)
                }
                Err(_) => return None,
            };
            let line = lines.recv().await?;
            Some(run::ApprovalDecision {
                approved: line.trim() == code,
                by: session::person(None),
                reason: None,
            })
        })
    }
}

/// Cancels `token` on Ctrl-C, SIGTERM or SIGHUP, watched on a thread of its own so that it happens at once
/// even while the caller's thread is busy; closing the returned handle stops watching.
pub(super) fn cancel_on_signals(
    token: CancellationToken,
) -> std::io::Result<signal_hook::iterator::Handle> {
    on_signals(move || token.cancel())
}

/// Calls `heard` on each Ctrl-C, SIGTERM or SIGHUP, on a thread of its own; closing the returned handle
/// stops watching.
pub(super) fn on_signals(
    heard: impl Fn() + Send + 'static,
) -> std::io::Result<signal_hook::iterator::Handle> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ])?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("archon-signals".to_owned())
        .spawn(move || {
            for _ in signals.forever() {
                heard();
            }
        })?;
    Ok(handle)
}
