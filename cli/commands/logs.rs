//! `archon logs RUN [STEP] [--attempt N] [--follow]`: what a run's commands wrote, as they wrote it. A
//! command's stdout goes to standard output and its stderr to standard error; with more than one step (or
//! call) shown, each line starts with the name of the call that wrote it.

use std::fmt::Write as _;
use std::time::Duration;

use archon_engine::session::{LogChunk, RunState, Session};
use archon_engine::tools::Stream;

use super::Status;
use super::run::store_error;
use super::target;
use crate::args::{ColorChoice, LogsArgs};
use crate::color::Paint;
use crate::output;

/// How often `--follow` looks for more output while the run goes on.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

pub fn logs(args: &LogsArgs, color: ColorChoice) -> anyhow::Result<Status> {
    let (target, step) = args.run.with_step(args.step.as_deref());
    let (session, id) = match target::open(&target, &args.state) {
        Ok(found) => found,
        Err(status) => return Ok(status),
    };
    let run = match session.load_brief(&id) {
        Ok(run) => run,
        Err(e) => return Ok(store_error(&e)),
    };
    let wanted = |name: &str| {
        step.as_deref().is_none_or(|step| {
            name == step || name.strip_prefix(step).is_some_and(|r| r.starts_with('['))
        })
    };
    // A step (or item) served from the cache ran no command in this run: its logs are the run's that
    // produced it. A note names that run for each one, after what the other steps wrote.
    let cached: Vec<String> = run
        .results
        .iter()
        .filter(|(name, _)| wanted(name))
        .filter_map(|(name, result)| {
            result.cached.as_ref().map(|from| {
                format!(
                    "note: `{name}` was served from the cache: run `{}` wrote it (`archon logs {} {}`)\n",
                    from.run, from.run, from.step
                )
            })
        })
        .collect();
    if !cached.is_empty() && !run.attempts.iter().any(|a| wanted(&a.step)) {
        output::stderr(&output::printable(&cached.concat()));
        return Ok(Status::Success);
    }
    if let Some(step) = &step
        && !run.attempts.iter().any(|a| wanted(&a.step))
    {
        // Each step once (a retried step has several attempts), sorted.
        let known: std::collections::BTreeSet<&str> =
            run.attempts.iter().map(|a| a.step.as_str()).collect();
        output::stderr(&output::printable(&format!(
            "error: run `{}` has no attempt of a step `{step}`\n  hint: its steps with attempts: {}\n",
            id,
            if known.is_empty() {
                "none".to_owned()
            } else {
                known
                    .iter()
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )));
        return Ok(Status::Invalid);
    }
    // Each step's last attempt, unless one is asked for.
    let last = |name: &str| {
        run.attempts
            .iter()
            .filter(|a| a.step == name)
            .map(|a| a.attempt)
            .max()
            .unwrap_or(0)
    };
    let shown = |chunk: &LogChunk| {
        wanted(&chunk.step)
            && match args.attempt {
                Some(n) => chunk.attempt == n,
                // Following, later attempts are shown as they come.
                None if args.follow => chunk.attempt >= last(&chunk.step),
                None => chunk.attempt == last(&chunk.step),
            }
    };
    let mut after = 0;
    let mut printed = 0_usize;
    let mut printer = Printer::default();
    loop {
        let chunks = match session.logs(&id, after) {
            Ok(chunks) => chunks,
            Err(e) => return Ok(store_error(&e)),
        };
        after = chunks.last().map_or(after, |c| c.seq);
        // Without `--follow`, everything is known at once: when more than one call wrote, every line is
        // named, the first call's too.
        if !args.follow {
            let mut sources = chunks.iter().filter(|c| shown(c)).map(|c| &c.source);
            if let Some(first) = sources.next() {
                printer.several = sources.any(|s| s != first);
            }
        }
        for chunk in chunks.iter().filter(|c| shown(c)) {
            printer.print(chunk);
            printed += 1;
        }
        if !args.follow || !still_running(&session, &id) {
            // One last look: what was written between the read and the run's end.
            if args.follow
                && let Ok(chunks) = session.logs(&id, after)
            {
                for chunk in chunks.iter().filter(|c| shown(c)) {
                    printer.print(chunk);
                    printed += 1;
                }
            }
            break;
        }
        std::thread::sleep(FOLLOW_EVERY);
    }
    // The whole error of each attempt shown: progress and events show only its first line.
    let run = if args.follow {
        session.load_brief(&id).unwrap_or(run)
    } else {
        run
    };
    let paint = Paint::new(output::use_color_stderr(color));
    let mut errors = String::new();
    for attempt in &run.attempts {
        let last = run
            .attempts
            .iter()
            .filter(|a| a.step == attempt.step)
            .map(|a| a.attempt)
            .max()
            .unwrap_or(0);
        let chosen = args
            .attempt
            .map_or(attempt.attempt == last, |n| attempt.attempt == n);
        if let Some(error) = &attempt.error
            && wanted(&attempt.step)
            && chosen
        {
            let status = attempt.status.replace('_', " ");
            let _ = writeln!(
                errors,
                "archon: attempt {} of `{}` {}: {}",
                attempt.attempt,
                output::printable(&attempt.step),
                paint.status(&status, &status),
                output::printable(error)
            );
        }
    }
    if printed == 0 {
        let what = match (&step, args.attempt) {
            (Some(step), Some(n)) => format!("attempt {n} of step `{step}`"),
            (Some(step), None) => format!("step `{step}`"),
            (None, Some(n)) => format!("attempt {n} of any step"),
            (None, None) => "any step".to_owned(),
        };
        output::stderr(&output::printable(&format!(
            "note: no command of {what} of run `{}` wrote anything\n",
            id
        )));
    }
    if !cached.is_empty() {
        output::stderr(&output::printable(&cached.concat()));
    }
    output::stderr(&errors);
    Ok(Status::Success)
}

fn still_running(session: &Session, id: &str) -> bool {
    session
        .load_brief(id)
        .is_ok_and(|run| run.status == RunState::Running)
}

/// Writes chunks out, naming the call that wrote each line once more than one call has written (from the
/// start, when all that is shown is known before it is printed).
#[derive(Default)]
struct Printer {
    /// The first call seen, and whether another one has been since.
    first: Option<String>,
    several: bool,
}

impl Printer {
    fn print(&mut self, chunk: &LogChunk) {
        match &self.first {
            None => self.first = Some(chunk.source.clone()),
            Some(first) if *first != chunk.source => self.several = true,
            Some(_) => {}
        }
        let text = if self.several {
            let mut text = String::with_capacity(chunk.text.len() + 32);
            for line in chunk.text.split_inclusive('\n') {
                let _ = write!(text, "{} | {line}", chunk.source);
            }
            text
        } else {
            chunk.text.clone()
        };
        let text = output::printable(&text);
        match chunk.stream {
            Stream::Stdout => output::stdout(&text),
            Stream::Stderr => output::stderr(&text),
        }
    }
}
