//! The stored runs: `archon runs`, `archon show`, `archon cancel`, `archon approve`, `archon resolve`,
//! `archon resume` and `archon retry`.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use archon_engine::resume;
use archon_engine::run::StepStatus;
use archon_engine::session::{
    self, Cancelled, Continue, ContinueOptions, Firing, FiringKind, FiringOutcome, Resolution,
    Resolved, RunFilter, RunState, Session, SessionError, StoredRun,
};

use super::run::{execute, existing_session, outputs_text, session_error, store_error};
use super::{Status, target};
use crate::args::{
    ApproveArgs, CancelArgs, ColorChoice, ContinueArgs, ResolveArgs, ResumeArgs, RetryArgs,
    RunStatusArg, RunTarget, RunsArgs, ShowArgs,
};
use crate::color::Paint;
use crate::output;

pub fn runs(args: &RunsArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let session = match existing_session(&args.state) {
        Ok(session) => session,
        Err(status) => return Ok(status),
    };
    if args.check {
        return Ok(check(session.as_ref(), &args.state));
    }
    let filter = filter(args);
    let runs = match session.as_ref().map(|s| s.list_where(&filter)) {
        Some(Ok(runs)) => runs,
        Some(Err(e)) => return Ok(store_error(&e)),
        None => Vec::new(),
    };
    let queued = session
        .as_ref()
        .map(|s| unstarted_runs(s, &filter))
        .unwrap_or_default();
    if args.json {
        /// A run as `runs --json` lists it: queued, or stored.
        #[derive(serde::Serialize)]
        #[serde(untagged)]
        enum Listed<'a> {
            Queued(QueuedShown<'a>),
            Stored(&'a session::RunSummary),
        }
        let all: Vec<Listed<'_>> = queued
            .iter()
            .map(|f| Listed::Queued(queued_shown(f)))
            .chain(runs.iter().map(Listed::Stored))
            .collect();
        let mut text = serde_json::to_string_pretty(&all)?;
        text.push('\n');
        output::stdout(&text);
        return Ok(Status::Success);
    }
    if runs.is_empty() && queued.is_empty() {
        let matching = if filter == RunFilter::default() {
            ""
        } else {
            " match"
        };
        output::stdout(&format!("no runs in `{}`{matching}\n", args.state.shown()));
        return Ok(Status::Success);
    }
    let paint = Paint::new(output::use_color(color));
    let mut rows: Vec<[String; 5]> = queued
        .iter()
        .map(|f| {
            [
                output::printable(f.run_id.as_deref().unwrap_or_default()),
                output::printable(&f.workflow),
                paint.status("queued", "queued"),
                "-".to_owned(),
                "-".to_owned(),
            ]
        })
        .collect();
    rows.extend(runs.iter().map(|r| {
        [
            output::printable(&r.id),
            output::printable(&r.workflow),
            paint.status(r.status.as_str(), r.status.as_str()),
            timestamp(r.started_at),
            r.duration_ms.map_or_else(|| "-".to_owned(), duration),
        ]
    }));
    output::stdout(&table(
        &["RUN", "WORKFLOW", "STATUS", "STARTED", "DURATION"],
        &rows,
    ));
    Ok(Status::Success)
}

/// The runs `archon runs --status S --workflow W --since T --limit N` lists.
fn filter(args: &RunsArgs) -> RunFilter {
    RunFilter {
        status: args
            .status
            .iter()
            .map(|s| match s {
                RunStatusArg::Running => RunState::Running,
                RunStatusArg::WaitingApproval => RunState::WaitingApproval,
                RunStatusArg::Interrupted => RunState::Interrupted,
                RunStatusArg::Succeeded => RunState::Succeeded,
                RunStatusArg::Failed => RunState::Failed,
                RunStatusArg::Cancelled => RunState::Cancelled,
            })
            .collect(),
        workflow: args.workflow.clone(),
        since: args.since,
        limit: args.limit,
    }
}

/// `archon runs --check`: every damaged page and row, and a failure when there is one.
fn check(session: Option<&Session>, state: &crate::args::StateArgs) -> Status {
    let at = state.at();
    let (what, name) = match &at.url {
        Some(_) => ("run store", at.shown()),
        None => (
            "state database",
            session::database_path(&state.dir()).display().to_string(),
        ),
    };
    let problems = match session.map(Session::check) {
        Some(Ok(problems)) => problems,
        Some(Err(e)) => return store_error(&e),
        None => Vec::new(),
    };
    if problems.is_empty() {
        output::stdout(&format!("`{name}`: no damage found\n"));
        return Status::Success;
    }
    let mut text = format!(
        "error: {what} `{name}` has {} problem{}:\n",
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

pub fn show(args: &ShowArgs, color: ColorChoice) -> anyhow::Result<Status> {
    if let Some((_, firing)) = unstarted(&args.run, &args.state) {
        let shown = queued_shown(&firing);
        if args.json {
            output::stdout_json(&shown);
        } else {
            let from = match firing.kind {
                FiringKind::Cron => format!("trigger {} (slot {})", shown.trigger, shown.slot),
                FiringKind::Webhook => {
                    format!("trigger {} (delivery {})", shown.trigger, shown.slot)
                }
                FiringKind::Api => "the API of `archon serve`".to_owned(),
            };
            output::stdout(&output::printable(&format!(
                "run {}  {}  queued (not started)\n  started from: {from}\n  queued at: {}\n  why: {}\n  hint: `archon cancel {}` drops it before it starts\n",
                shown.id,
                shown.workflow,
                timestamp(shown.queued_at),
                shown.reason,
                shown.id
            )));
        }
        return Ok(Status::Success);
    }
    let (session, id) = match target::open(&args.run, &args.state) {
        Ok(found) => found,
        Err(status) => return Ok(status),
    };
    // The summary shows no step's output: large ones, kept apart, are left where they are.
    let loaded = if args.json {
        session.load(&id)
    } else {
        session.load_brief(&id)
    };
    let run = match loaded {
        Ok(run) => run,
        Err(e) => return Ok(store_error(&e)),
    };
    let events = if args.events {
        match session.events(&id) {
            Ok(events) => Some(events),
            Err(e) => return Ok(store_error(&e)),
        }
    } else {
        None
    };
    if args.json {
        /// The run as `show --json` writes it: the stored run, its events when asked for, and the
        /// steps of a submitted run that wait for a worker, with why.
        #[derive(serde::Serialize)]
        struct Shown<'a> {
            #[serde(flatten)]
            run: &'a StoredRun,
            #[serde(skip_serializing_if = "Option::is_none")]
            events: Option<Vec<serde_json::Value>>,
            #[serde(skip_serializing_if = "Vec::is_empty")]
            waiting: Vec<session::Waiting>,
        }
        let waiting = match waiting(&session, &run) {
            Ok(waiting) => waiting,
            Err(status) => return Ok(status),
        };
        // Written as it is serialized, not built as one text first: a run with large outputs is shown
        // without holding them twice more.
        output::stdout_json(&Shown {
            run: &run,
            events,
            waiting,
        });
        return Ok(Status::Success);
    }
    if let Some(events) = events {
        output::stdout(&crate::trail::render(&events));
        return Ok(Status::Success);
    }
    output::stdout(&describe(
        &session,
        &run,
        Paint::new(output::use_color(color)),
    ));
    Ok(Status::Success)
}

/// The ready steps of a running submitted run that no worker has taken, with why.
fn waiting(session: &Session, run: &StoredRun) -> Result<Vec<session::Waiting>, Status> {
    if run.status != RunState::Running {
        return Ok(Vec::new());
    }
    session.waiting(&run.id).map_err(|e| store_error(&e))
}

/// How often `archon run --submit --wait` looks for the run's new events.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Follows a run others run (`archon run --submit --wait`): its events on standard error as the store
/// records them, until it ends; then the run as `show` writes it, and the status `archon run` exits with.
pub(super) fn follow(session: &Session, id: &str, color: ColorChoice) -> Status {
    let mut after = 0;
    let mut start = None;
    loop {
        // Read before the events: whatever the run recorded before it ended is read after.
        let ended = match session.load_brief(id) {
            Ok(run) => run.status != RunState::Running,
            Err(e) => return store_error(&e),
        };
        let events = match session.events_after(id, after, 1000) {
            Ok(events) => events,
            Err(e) => return store_error(&e),
        };
        let mut text = String::new();
        for (seq, raw) in &events {
            after = *seq;
            let at = raw
                .get("at_ms")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0);
            let since = at.saturating_sub(*start.get_or_insert(at));
            if let Ok(event) = serde_json::from_value::<archon_engine::run::RunEvent>(raw.clone()) {
                let (label, body) = crate::trail::describe(&event);
                let _ = writeln!(
                    text,
                    "{:>9}  {label:<9} {}",
                    crate::trail::clock(since),
                    body.lines().next().unwrap_or_default()
                );
            }
        }
        output::stderr(&output::printable(&text));
        if ended && events.len() < 1000 {
            break;
        }
        if events.is_empty() {
            std::thread::sleep(FOLLOW_EVERY);
        }
    }
    let run = match session.load(id) {
        Ok(run) => run,
        Err(e) => return store_error(&e),
    };
    output::stdout(&describe(
        session,
        &run,
        Paint::new(output::use_color(color)),
    ));
    match run.status {
        RunState::Succeeded => Status::Success,
        RunState::Failed => Status::Failure,
        RunState::WaitingApproval => Status::WaitingApproval,
        RunState::Cancelled | RunState::Interrupted | RunState::Running => Status::Interrupted,
    }
}

/// The run as `show` writes it, safe to show: what the run produced is made printable before statuses
/// are painted.
fn describe(session: &Session, run: &StoredRun, paint: Paint) -> String {
    let shown = |text: &str| output::printable(text);
    let mut text = String::new();
    let _ = writeln!(text, "run       {}", shown(&run.id));
    let _ = writeln!(
        text,
        "workflow  {} ({})",
        shown(&run.workflow),
        shown(&run.spec_path)
    );
    let _ = writeln!(
        text,
        "status    {}",
        paint.status(run.status.as_str(), run.status.as_str())
    );
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
        let _ = writeln!(
            text,
            "owner     process {} on `{}`",
            owner.pid,
            shown(&owner.host)
        );
    }
    if let Some(error) = &run.error {
        let _ = writeln!(text, "error     {}", shown(error));
    }
    let mut attempts: HashMap<&str, usize> = HashMap::new();
    for attempt in &run.attempts {
        *attempts.entry(resume::step_of(&attempt.step)).or_default() += 1;
    }
    // The items of each `foreach` step, by step.
    let mut items: HashMap<&str, Vec<(&str, &archon_engine::run::StepResult)>> = HashMap::new();
    for (name, result) in &run.results {
        if name.contains('[') {
            items
                .entry(resume::step_of(name))
                .or_default()
                .push((name, result));
        }
    }
    // In the order of their index, not of their end.
    let index = |name: &str| {
        name.rsplit_once('[')
            .and_then(|(_, i)| i.trim_end_matches(']').parse::<usize>().ok())
    };
    for list in items.values_mut() {
        list.sort_by_key(|(name, _)| index(name));
    }
    let error_cell = |step: &str, error: Option<&str>| {
        error.map_or_else(String::new, |error| {
            shown(
                &archon_engine::text::error_line(error, &run.id, step)
                    .unwrap_or_else(|| error.to_owned()),
            )
        })
    };
    let status_cell = |status: &str, note: &str| format!("{}{note}", paint.status(status, status));
    let waiting_steps = waiting(session, run).unwrap_or_default();
    let mut rows = Vec::new();
    let mut seen = HashSet::new();
    for (name, result) in &run.results {
        if name.contains('[') {
            continue;
        }
        seen.insert(name.as_str());
        // The attempts of the step's last run, as `show --json` gives them in its result.
        rows.push([
            shown(name),
            status_cell(result.status.as_str(), &cached_note(name, result, run)),
            result.attempts.to_string(),
            error_cell(name, result.error.as_deref()),
        ]);
        nested_rows(name, result, &mut rows, paint);
        // The items that failed, or that their fallback saved (with the error the fallback answered).
        for (item, result) in items.get(name.as_str()).into_iter().flatten() {
            if result.status == StepStatus::Succeeded && !result.fallback {
                continue;
            }
            let error = result.error.as_deref().or_else(|| {
                run.attempts
                    .iter()
                    .rev()
                    .find(|a| a.step == *item && !a.fallback)
                    .and_then(|a| a.error.as_deref())
            });
            rows.push([
                shown(item),
                status_cell(
                    result.status.as_str(),
                    if result.fallback { " (fallback)" } else { "" },
                ),
                result.attempts.to_string(),
                error_cell(item, error),
            ]);
        }
    }
    for attempt in &run.attempts {
        let step = resume::step_of(&attempt.step);
        if seen.insert(step) {
            rows.push([
                shown(step),
                if attempt.status == "running" {
                    paint.status("in doubt", "in doubt")
                } else {
                    format!("no result ({})", shown(&attempt.status))
                },
                attempts.get(step).copied().unwrap_or(0).to_string(),
                String::new(),
            ]);
        }
    }
    // The steps of a submitted run that are ready but that no worker has taken, and why.
    for waiting in &waiting_steps {
        if seen.insert(waiting.step.as_str()) {
            rows.push([
                shown(&waiting.step),
                format!(
                    "{}: {}",
                    paint.status("waiting", "waiting"),
                    shown(&waiting.reason)
                ),
                "0".to_owned(),
                String::new(),
            ]);
        }
    }
    if !rows.is_empty() {
        text.push('\n');
        text.push_str(&table(&["STEP", "STATUS", "ATTEMPTS", "ERROR"], &rows));
    }
    text.push_str(&delegations(run, paint));
    // What each agent step's model could read, and how close it came.
    let working: Vec<[String; 5]> = run
        .results
        .iter()
        .filter_map(|(name, result)| {
            let llm = result.llm.as_ref()?;
            let context = llm.context?;
            Some([
                shown(name),
                llm.largest_prompt.to_string(),
                context.compact_at.to_string(),
                context.window.to_string(),
                context.compactions.to_string(),
            ])
        })
        .collect();
    if !working.is_empty() {
        text.push_str("\nworking memory of agent steps, in tokens:\n");
        text.push_str(&table(
            &[
                "STEP",
                "LARGEST PROMPT",
                "COMPACTS AT",
                "WINDOW",
                "COMPACTIONS",
            ],
            &working,
        ));
    }
    if !run.outputs.is_empty() {
        text.push('\n');
        text.push_str(&shown(&outputs_text(&run.outputs)));
    }
    // The calls nobody decided yet: what the run (or, submitted to workers, some of its steps) waits for.
    let undecided: Vec<_> = run
        .approvals
        .iter()
        .filter(|a| a.decision.is_none())
        .collect();
    if !undecided.is_empty() && matches!(run.status, RunState::WaitingApproval | RunState::Running)
    {
        text.push_str("\nwaiting for approval:\n");
        for a in &undecided {
            let _ = writeln!(
                text,
                "  {}{}",
                shown(&a.request.step),
                a.request
                    .tool
                    .as_deref()
                    .map_or_else(String::new, |t| shown(&format!(
                        ": `{t}` {}",
                        a.request.arguments
                    )))
            );
            // Its rule's timeout: then the rule's default decides, by itself on workers, else on resume.
            if let Some(limit) = a.request.timeout_ms {
                let _ = writeln!(
                    text,
                    "    its rule's `default` (`{}`) decides it if nobody has by `{}`",
                    if a.request.approve_on_timeout {
                        "allow"
                    } else {
                        "deny"
                    },
                    timestamp(a.requested_at.saturating_add(limit))
                );
            }
        }
        let _ = writeln!(
            text,
            "  hint: `archon approve {}` (or `--deny`) decides; then a run submitted to workers goes on by itself, any other with `archon resume {}`",
            shown(&run.id),
            shown(&run.id)
        );
    }
    if run.status == RunState::Interrupted {
        text.push('\n');
        text.push_str(&shown(&resume_hint(session, &run.id)));
    }
    text
}

/// What resuming an interrupted run would do: continue it, or refuse, and why.
fn resume_hint(session: &Session, id: &str) -> String {
    match session.check_continue(id, Continue::Resume, &ContinueOptions::default()) {
        Ok(()) => {
            format!("  hint: `archon resume {id}` continues it; finished steps are not run again\n")
        }
        Err(SessionError::Refused { message, hint }) => {
            format!("  hint: `archon resume {id}` would refuse: {message}\n  hint: {hint}\n")
        }
        Err(SessionError::Invalid { path, .. }) => format!(
            "  hint: `archon resume {id}` would refuse: the spec no longer validates\n  hint: `archon validate {}` shows why\n",
            path.display()
        ),
        Err(e) => format!("  hint: `archon resume {id}` would refuse: {e}\n"),
    }
}

/// Rows for the steps a step ran inside it (a composite tool's, a sub-workflow's, or those its planner
/// planned), named `outer/inner`; their attempts belong to the calling step.
fn nested_rows(
    name: &str,
    result: &archon_engine::run::StepResult,
    rows: &mut Vec<[String; 4]>,
    paint: Paint,
) {
    for (inner, nested) in &result.steps {
        let label = format!("{name}/{inner}");
        let status = nested.status.as_str();
        let status = if result.plan.is_some() {
            format!("{} (planned)", paint.status(status, status))
        } else {
            paint.status(status, status)
        };
        rows.push([
            output::printable(&label),
            status,
            "-".to_owned(),
            output::printable(nested.error.as_deref().unwrap_or_default()),
        ]);
        nested_rows(&label, nested, rows, paint);
    }
}

/// Most characters of a task, answer or error the delegation tree shows (of its first line).
const DELEGATION_CHARS: usize = 100;

/// The delegation tree of each agent step that delegated: under the step, each delegation its agent made
/// (named `<agent>#<iteration>.<call>`), with its status, what it cost (its own delegations included),
/// its task, and its answer or error; the delegations a delegate made below it.
fn delegations(run: &StoredRun, paint: Paint) -> String {
    let mut text = String::new();
    for (name, result) in &run.results {
        delegation_roots(name, result, &mut text, paint);
    }
    if text.is_empty() {
        return text;
    }
    format!("\ndelegations:\n{text}")
}

/// Whether a nested result is a delegation's: its name is `<agent>#<iteration>.<call>` (a step id has
/// no `#`).
fn is_delegation(name: &str) -> bool {
    name.contains('#')
}

/// The tree of `label`'s delegations, if it made any, and of the agent steps nested in it that did.
fn delegation_roots(
    label: &str,
    result: &archon_engine::run::StepResult,
    text: &mut String,
    paint: Paint,
) {
    if result.steps.keys().any(|name| is_delegation(name)) {
        let usage = result.llm.as_ref().map(usage).unwrap_or_default();
        let line = format!("{}  {usage}", output::printable(label));
        let _ = writeln!(text, "{}", line.trim_end());
        delegation_branch(result, "", text, paint);
    }
    for (inner, nested) in &result.steps {
        if !is_delegation(inner) {
            delegation_roots(&format!("{label}/{inner}"), nested, text, paint);
        }
    }
}

/// The delegations `result`'s agent made, one node each, `prefix` before every line.
fn delegation_branch(
    result: &archon_engine::run::StepResult,
    prefix: &str,
    text: &mut String,
    paint: Paint,
) {
    let made: Vec<_> = result
        .steps
        .iter()
        .filter(|(name, _)| is_delegation(name))
        .collect();
    for (index, (name, delegated)) in made.iter().enumerate() {
        let last = index + 1 == made.len();
        let status = delegated.status.as_str();
        let mut line = format!(
            "{prefix}{}{}  {}",
            if last { "└─ " } else { "├─ " },
            output::printable(name),
            paint.status(status, status)
        );
        if let Some(llm) = &delegated.llm {
            let _ = write!(line, "  {}", usage(llm));
        }
        let _ = write!(line, ", {}", duration(delegated.duration_ms));
        let _ = writeln!(text, "{line}");
        let inner = format!("{prefix}{}", if last { "   " } else { "│  " });
        if let Some(task) = &delegated.task {
            let _ = writeln!(text, "{inner}task    {}", first_line(task));
        }
        match &delegated.error {
            Some(error) => {
                let _ = writeln!(text, "{inner}error   {}", first_line(error));
            }
            None => {
                let _ = writeln!(text, "{inner}answer  {}", first_line(&delegated.text));
            }
        }
        delegation_branch(delegated, &inner, text, paint);
    }
}

/// What model calls used: `3 calls, 313 tokens in, 14 out`, with the calls that failed and the cost
/// when their models have a price.
pub(super) fn usage(llm: &archon_engine::run::LlmUsage) -> String {
    // Failed requests have no price either way: only answered calls say whether the model has one.
    let cost = if llm.unpriced_calls >= llm.calls.saturating_sub(llm.failed_calls) {
        String::new()
    } else {
        format!(", ${:.4}", llm.cost_usd)
    };
    let failed = if llm.failed_calls > 0 {
        format!(" ({} failed)", llm.failed_calls)
    } else {
        String::new()
    };
    format!(
        "{} call{}{failed}, {} tokens in, {} out{cost}",
        llm.calls,
        if llm.calls == 1 { "" } else { "s" },
        llm.input_tokens,
        llm.output_tokens
    )
}

/// The first line of `text`, at most [`DELEGATION_CHARS`] characters of it, with `…` when there is
/// more; printable.
fn first_line(text: &str) -> String {
    let text = text.trim();
    let (line, more_lines) = match text.split_once('\n') {
        Some((line, _)) => (line.trim_end(), true),
        None => (text, false),
    };
    let shown = match archon_engine::text::split_at_chars(line, DELEGATION_CHARS) {
        Some((head, _)) => format!("{head} …"),
        None if more_lines => format!("{line} …"),
        None => line.to_owned(),
    };
    output::printable(&shown)
}

/// `archon approve RUN [--step S] [--deny] [--reason TEXT] [--as NAME]`.
pub fn approve(args: &ApproveArgs) -> anyhow::Result<Status> {
    if let Some(status) = refuse_name(args.by.as_deref()) {
        return Ok(status);
    }
    let (session, id) = match target::open(&args.run, &args.state) {
        Ok(found) => found,
        Err(status) => return Ok(status),
    };
    let decision = archon_engine::run::ApprovalDecision {
        approved: !args.deny,
        by: session::person(args.by.as_deref()),
        reason: args.reason.clone(),
    };
    let decided = match session.decide(&id, args.step.as_deref(), &decision) {
        Ok(decided) => decided,
        Err(e) => return Ok(session_error(&e, ColorChoice::Never)),
    };
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
    // A step of a run submitted to workers goes on as soon as every call it asked for is decided.
    let on_workers = session.load_brief(&id).is_ok_and(|run| {
        run.status == RunState::Running
            && run
                .owner
                .as_ref()
                .is_some_and(|o| o.host == session::WORKERS)
    });
    if on_workers {
        let _ = writeln!(
            text,
            "  hint: the workers continue the run: `archon show {id}` shows where it stands"
        );
    } else {
        let _ = writeln!(text, "  hint: `archon resume {id}` continues the run");
    }
    output::stdout(&output::printable(&text));
    Ok(Status::Success)
}

pub fn resolve(args: &ResolveArgs) -> anyhow::Result<Status> {
    if let Some(status) = refuse_name(args.by.as_deref()) {
        return Ok(status);
    }
    let outcome = match &args.output {
        _ if args.failed => Resolved::Failed,
        None => Resolved::Succeeded(serde_json::Value::Null),
        Some(text) => match serde_json::from_str(text) {
            Ok(output) => Resolved::Succeeded(output),
            Err(e) => {
                return Ok(refuse(
                    &format!("`--output` is not JSON: {e}"),
                    "write text as a JSON string, quoted for the shell: `--output '\"done\"'`",
                ));
            }
        },
    };
    let (target, step) = args.run.with_step(args.step.as_deref());
    let Some(step) = step else {
        return Ok(refuse(
            "`archon resolve` needs the step in doubt",
            "`archon resolve RUN STEP --succeeded` (or `--failed`); `archon show RUN` names the steps in doubt",
        ));
    };
    let (session, id) = match target::open(&target, &args.state) {
        Ok(found) => found,
        Err(status) => return Ok(status),
    };
    let resolution = Resolution {
        outcome,
        by: session::person(args.by.as_deref()),
        reason: args.reason.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Err(e) = runtime.block_on(session.resolve(&id, &step, &resolution)) {
        return Ok(session_error(&e, ColorChoice::Never));
    }
    let status = if args.failed { "failed" } else { "succeeded" };
    let next = if args.failed {
        format!("`archon retry {id} --failed` runs it again")
    } else {
        format!("`archon resume {id}` continues the run")
    };
    output::stdout(&output::printable(&format!(
        "resolved {step} as {status}\n  hint: {next}\n"
    )));
    Ok(Status::Success)
}

pub fn cancel(args: &CancelArgs) -> anyhow::Result<Status> {
    if let Some((session, firing)) = unstarted(&args.run, &args.state) {
        let id = firing.run_id.unwrap_or_default();
        return Ok(
            match session.skip_unstarted_firing(&id, "cancelled before its run started") {
                Ok(true) => {
                    output::stdout(&format!(
                        "run {id} is cancelled: it was queued and never starts\n"
                    ));
                    Status::Success
                }
                // Its run was created meanwhile: cancelled as any run is.
                Ok(false) => cancel_run(&session, &id),
                Err(e) => store_error(&e),
            },
        );
    }
    let (session, id) = match target::open(&args.run, &args.state) {
        Ok(found) => found,
        Err(status) => return Ok(status),
    };
    Ok(cancel_run(&session, &id))
}

fn cancel_run(session: &Session, id: &str) -> Status {
    match session.cancel(id) {
        Ok(Cancelled::Now) => {
            output::stdout(&format!("run {id} is cancelled\n"));
            Status::Success
        }
        Ok(Cancelled::Asked) => {
            output::stdout(&format!(
                "asked the process running {id} to stop; it will record the run as cancelled\n"
            ));
            Status::Success
        }
        Err(e) => session_error(&e, ColorChoice::Never),
    }
}

/// The firing of a trigger whose run `target` names exactly (not `--last`) when that run was not
/// created yet: it waits in a server's queue, or behind the trigger's run before it, or for the next
/// `archon serve` (a server stopped in between).
fn unstarted(target: &RunTarget, state: &crate::args::StateArgs) -> Option<(Session, Firing)> {
    let id = target.run.as_deref().filter(|_| !target.last)?;
    let lowered = id.to_lowercase();
    let session = Session::open_existing_at(&state.at()).ok().flatten()?;
    let firing = session.unstarted_firings().ok()?.into_iter().find(|f| {
        f.run_id
            .as_deref()
            .is_some_and(|run| run == id || run == lowered)
    })?;
    Some((session, firing))
}

/// The runs of the triggers' firings not created yet, newest first, as `archon runs` lists them.
fn unstarted_runs(session: &Session, filter: &RunFilter) -> Vec<Firing> {
    if !filter.status.is_empty() {
        return Vec::new();
    }
    let mut firings: Vec<Firing> = session
        .unstarted_firings()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| {
            filter.workflow.as_ref().is_none_or(|w| *w == f.workflow)
                && filter.since.is_none_or(|since| f.fired_at >= since)
        })
        .collect();
    firings.reverse();
    firings
}

/// Why a firing's run waits.
fn waits(firing: &Firing) -> String {
    match firing.outcome {
        FiringOutcome::Queued => format!(
            "queued behind the run before it of trigger `{}`",
            firing.trigger
        ),
        _ => "waiting for a free slot on the server".to_owned(),
    }
}

/// A queued run as `archon runs --json` and `archon show --json` write it.
#[derive(serde::Serialize)]
struct QueuedShown<'a> {
    id: &'a str,
    workflow: &'a str,
    status: &'static str,
    /// Milliseconds since the epoch: when its trigger fired.
    queued_at: u64,
    trigger: &'a str,
    /// `cron` or `webhook`.
    kind: &'static str,
    /// The cron slot or the delivery id.
    slot: &'a str,
    reason: String,
}

fn queued_shown(firing: &Firing) -> QueuedShown<'_> {
    QueuedShown {
        id: firing.run_id.as_deref().unwrap_or_default(),
        workflow: &firing.workflow,
        status: "queued",
        queued_at: firing.fired_at,
        trigger: &firing.trigger,
        kind: firing.kind.as_str(),
        slot: &firing.slot,
        reason: waits(firing),
    }
}

pub fn resume(args: &ResumeArgs, color: ColorChoice) -> anyhow::Result<Status> {
    continue_run(&args.run, Continue::Resume, &args.options, color)
}

pub fn retry(args: &RetryArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let how = match &args.from {
        Some(step) => Continue::From(step),
        None => Continue::Failed,
    };
    continue_run(&args.run, how, &args.options, color)
}

/// Resumes a run, or runs some of its steps again.
fn continue_run(
    target: &RunTarget,
    how: Continue<'_>,
    options: &ContinueArgs,
    color: ColorChoice,
) -> anyhow::Result<Status> {
    let (session, id) = match target::open(target, &options.state) {
        Ok(found) => found,
        Err(status) => return Ok(status),
    };
    let asked = ContinueOptions {
        rerun_in_doubt: options.rerun_in_doubt,
        allow_changed_spec: options.allow_changed_spec,
        max_parallel: options.max_parallel.map(|m| m as usize),
    };
    // A submitted run that waits for approval goes on where it ran: on the workers.
    if how == Continue::Resume {
        match session.hand_back(&id) {
            Ok(true) => {
                output::stdout(&format!(
                    "run `{id}` goes on on the workers\n  hint: `archon show {id}` shows where it stands\n"
                ));
                return Ok(Status::Success);
            }
            Ok(false) => {}
            Err(e) => return Ok(session_error(&e, color)),
        }
    }
    match session.continue_run(&id, how, &asked) {
        Ok(prepared) => execute(&session, prepared, None, &options.output, None, color),
        Err(e) => Ok(session_error(&e, color)),
    }
}

/// Refuses a name given with `--as` that names nobody: empty, or holding control characters (a line break
/// would forge the trail's next line).
fn refuse_name(name: Option<&str>) -> Option<Status> {
    let name = name?;
    (name.trim().is_empty() || name.chars().any(char::is_control)).then(|| {
        refuse(
            &format!("`--as` needs a name, not `{}`", name.escape_debug()),
            "give the name the decision is recorded under, such as `--as ana`",
        )
    })
}

fn refuse(message: &str, hint: &str) -> Status {
    output::stderr(&output::printable(&format!(
        "error: {message}\n  hint: {hint}\n"
    )));
    Status::Invalid
}

/// A step's status, marked when its result (or some of its `foreach` items') came from the cache.
/// ` (cached from RUN)` after the status of a step served from the cache, ` (cached)` or ` (N of M items
/// cached)` after a `foreach` step's, else nothing.
fn cached_note(name: &str, result: &archon_engine::run::StepResult, run: &StoredRun) -> String {
    if let Some(from) = &result.cached {
        return format!(" (cached from {})", from.run);
    }
    let prefix = format!("{name}[");
    let (items, cached) = run
        .results
        .iter()
        .filter(|(item, _)| item.starts_with(&prefix))
        .fold((0, 0), |(items, cached), (_, r)| {
            (items + 1, cached + usize::from(r.cached.is_some()))
        });
    match cached {
        0 => String::new(),
        _ if cached == items => " (cached)".to_owned(),
        _ => format!(" ({cached} of {items} items cached)"),
    }
}

/// A time as RFC 3339 (UTC, seconds).
pub(super) fn timestamp(ms: u64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(time).to_string()
}

pub(super) fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Columns padded to their widest cell (colour codes take no room).
pub(super) fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(crate::color::width(cell));
        }
    }
    let mut text = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                let pad = width.saturating_sub(crate::color::width(cell)) + 2;
                out.extend(std::iter::repeat_n(' ', pad));
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
