//! Which run a command is about: `RUN` (an id or a unique prefix of one) or `--last [--workflow NAME]`,
//! resolved by the session (an indexed lookup in the store, never a scan).

use archon_engine::session::{RunRef, Session};

use super::Status;
use super::run::existing_session;
use crate::args::{RunTarget, StateArgs};
use crate::output;

impl RunTarget {
    /// For a command whose RUN is followed by a STEP: with `--last`, the one word given is the step.
    pub fn with_step(&self, step: Option<&str>) -> (RunTarget, Option<String>) {
        let mut target = self.clone();
        let mut step = step.map(str::to_owned);
        if target.last && step.is_none() {
            step = target.run.take();
        }
        (target, step)
    }
}

/// Opens the state directory's store and finds the run `target` names: the session and the run's id, or
/// the status to exit with once the problem was shown (2 for a run that is not there).
pub fn open(target: &RunTarget, state: &StateArgs) -> Result<(Session, String), Status> {
    let run = match (&target.run, target.last) {
        (Some(_), true) => {
            return Err(refuse(
                "give a run id or `--last`, not both",
                "`archon runs` lists the runs, newest first",
            ));
        }
        (Some(_), false) if target.workflow.is_some() => {
            return Err(refuse(
                "`--workflow` goes with `--last`: a RUN already names one run",
                "`archon show --last --workflow NAME` is the newest run of workflow `NAME`",
            ));
        }
        (Some(id), false) => RunRef::Id(id),
        (None, _) => RunRef::Last {
            workflow: target.workflow.as_deref(),
        },
    };
    let Some(session) = existing_session(state)? else {
        let what = match run {
            RunRef::Id(id) => format!("no run `{id}`"),
            RunRef::Last { .. } => "no runs".to_owned(),
        };
        let hint = if state.at().url.is_some() {
            "point `--store` (or `ARCHON_STORE`) at the database the run was started with"
        } else {
            "run the command where the run was started, or point `--state-dir` at its state directory"
        };
        return Err(refuse(
            &format!("{what}: there is no run store in `{}`", state.shown()),
            hint,
        ));
    };
    // Run ids are lowercase: an id typed in capitals is tried as such when it names no run as written.
    let lowered = match run {
        RunRef::Id(id) if id.chars().any(char::is_uppercase) => Some(id.to_lowercase()),
        _ => None,
    };
    let found = match (session.find(run), &lowered) {
        (Err(e), Some(lower)) if e.unknown_run => match session.find(RunRef::Id(lower)) {
            Err(again) if again.unknown_run => Err(e),
            other => other,
        },
        (found, _) => found,
    };
    match found {
        Ok(id) => Ok((session, id)),
        Err(e) => {
            // The candidates of an ambiguous prefix name workflows: made printable like any stored text.
            let mut text = format!("error: {}\n", e.message);
            if let Some(hint) = &e.hint {
                text.push_str(&format!("  hint: {hint}\n"));
            }
            output::stderr(&output::printable(&text));
            Err(if e.unknown_run {
                Status::Invalid
            } else {
                Status::Failure
            })
        }
    }
}

fn refuse(message: &str, hint: &str) -> Status {
    output::stderr(&output::printable(&format!(
        "error: {message}\n  hint: {hint}\n"
    )));
    Status::Invalid
}
