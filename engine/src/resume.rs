//! What resuming or retrying a stored run needs to know: which steps are in doubt (an attempt started
//! and its result was never recorded), which steps are safe to repeat, what lies downstream of a step,
//! and which steps a changed spec changed.

use std::collections::BTreeSet;

use serde_json::Value as Json;

pub use crate::idempotence::{body_is_idempotent, step_idempotent};
use crate::spec::Spec;
use crate::store::StoredRun;
use crate::workflow::Workflow;

/// A step (or `foreach` item) whose last attempt may have had its effect without its result being
/// recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InDoubt {
    /// As recorded: `step` or `step[i]`.
    pub name: String,
    /// The step id.
    pub step: String,
    /// Repeating it is safe: every tool it can call is read-only or declared `idempotent: true`.
    pub idempotent: bool,
    /// The process group of a command it started that is still running (it outlived the archon process
    /// that started it).
    pub leftover: Option<u32>,
}

/// The step id of a recorded name: `fetch[3]` is an item of `fetch`.
pub fn step_of(name: &str) -> &str {
    name.split_once('[').map_or(name, |(step, _)| step)
}

/// The steps and items of `run` that are in doubt: their last attempt is recorded as started and neither
/// as failed nor as stopped by archon itself (it was running when the process died, or succeeded without
/// its result being recorded, or its command outlived the stop), and no final result is.
pub fn in_doubt(workflow: &Workflow, run: &StoredRun) -> Vec<InDoubt> {
    // The last attempt of each name in the run's current generation (`retry --from` starts a new one, and
    // the steps it reruns have no result yet without being in doubt).
    let mut last: Vec<(&str, &str)> = Vec::new();
    for attempt in run
        .attempts
        .iter()
        .filter(|a| a.generation == run.generation)
    {
        match last.iter_mut().find(|(name, _)| *name == attempt.step) {
            Some(entry) => entry.1 = &attempt.status,
            None => last.push((&attempt.step, &attempt.status)),
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for (name, status) in last {
        let finished = run.results.contains_key(name) || run.results.contains_key(step_of(name));
        // A failed attempt is what retries are for. One archon stopped itself (Ctrl-C, SIGTERM, `cancel`,
        // its timeout), killing what it had started and recording so, runs again: only one left `running`
        // by a crash, a `succeeded` one whose result was not recorded, or a stopped one whose command
        // outlived the stop may have had an effect nobody saw.
        let outlived = matches!(status, "cancelled" | "timed_out")
            && run
                .attempts
                .iter()
                .filter(|a| a.step == name)
                .filter_map(|a| Some((a.pgid?, a.pgid_started)))
                .any(|(pgid, started)| crate::process::leftover_group(pgid, started));
        let effect_possible = matches!(status, "running" | "succeeded")
            || outlived
            // A step that waited for approval inside a composite tool, sub-workflow or plan may have
            // run the steps before the one that asked; a plain call waited before anything ran, and an
            // agent's checkpoint holds what its earlier calls did.
            || (status == "waiting_approval" && runs_steps(workflow, step_of(name)));
        if !finished && effect_possible {
            names.push(name);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let step = step_of(name).to_owned();
            let leftover = run
                .attempts
                .iter()
                .filter(|a| a.step == name)
                .filter_map(|a| Some((a.pgid?, a.pgid_started)))
                .filter(|(pgid, started)| crate::process::leftover_group(*pgid, *started))
                .map(|(pgid, _)| pgid)
                .next_back();
            InDoubt {
                name: name.to_owned(),
                idempotent: step_idempotent(workflow, &step),
                step,
                leftover,
            }
        })
        .collect()
}

/// Whether a step runs steps of its own: a composite tool, a sub-workflow or a plan.
fn runs_steps(workflow: &Workflow, id: &str) -> bool {
    let Some(step) = workflow.spec.steps.iter().find(|s| s.id.value == id) else {
        return false;
    };
    let body = step.body();
    let plans = body.plan.is_some()
        || (body.tool.is_none()
            && body.goal.is_none()
            && body.workflow.is_none()
            && workflow
                .spec
                .defaults
                .as_ref()
                .and_then(|d| d.unspecified.as_ref())
                .is_some_and(|u| u.value == crate::spec::Unspecified::Plan));
    plans
        || body.workflow.is_some()
        || body.tool.is_some_and(|t| {
            workflow
                .spec
                .tools
                .get(t.value.as_str())
                .is_some_and(|d| d.steps.is_some() || d.workflow.is_some())
        })
}

/// The steps `retry --failed` runs again: those whose result is a failure, and those skipped because a
/// step they depend on, directly or not, failed or was skipped for that reason.
pub fn failed_steps(workflow: &Workflow, run: &StoredRun) -> Vec<String> {
    let status = |index: usize| {
        run.results
            .get(workflow.spec.steps[index].id.value.as_str())
            .map(|r| r.status)
    };
    let mut again = vec![false; workflow.spec.steps.len()];
    for &index in &workflow.order {
        again[index] = match status(index) {
            Some(s) if s.is_failure() => true,
            Some(crate::report::StepStatus::Skipped) => {
                workflow.dependencies[index].iter().any(|&d| again[d])
            }
            _ => false,
        };
    }
    workflow
        .spec
        .steps
        .iter()
        .zip(again)
        .filter(|(_, again)| *again)
        .map(|(step, _)| step.id.value.clone())
        .collect()
}

/// `from` and every step that depends on it, directly or not, in the workflow's order.
pub fn downstream(workflow: &Workflow, from: &str) -> Vec<String> {
    let Some(start) = workflow.spec.steps.iter().position(|s| s.id.value == from) else {
        return Vec::new();
    };
    let mut reached = BTreeSet::from([start]);
    for &index in &workflow.order {
        if workflow.dependencies[index]
            .iter()
            .any(|d| reached.contains(d))
        {
            reached.insert(index);
        }
    }
    reached
        .into_iter()
        .map(|i| workflow.spec.steps[i].id.value.clone())
        .collect()
}

/// The ids of steps added, removed or changed between two versions of a spec, and `(workflow)` when
/// something outside the steps changed (inputs, tools, env...).
pub fn changed_steps(before: &Spec, after: &Spec) -> Vec<String> {
    let shape = |spec: &Spec| -> Vec<(String, Json)> {
        spec.steps
            .iter()
            .map(|s| {
                (
                    s.id.value.clone(),
                    serde_json::to_value(s).unwrap_or(Json::Null),
                )
            })
            .collect()
    };
    let (old, new) = (shape(before), shape(after));
    let mut changed = Vec::new();
    for (id, value) in &new {
        if old
            .iter()
            .find(|(o, _)| o == id)
            .is_none_or(|(_, v)| v != value)
        {
            changed.push(id.clone());
        }
    }
    for (id, _) in &old {
        if !new.iter().any(|(n, _)| n == id) {
            changed.push(id.clone());
        }
    }
    let rest = |spec: &Spec| {
        let mut value = serde_json::to_value(spec).unwrap_or(Json::Null);
        if let Json::Object(map) = &mut value {
            map.remove("steps");
        }
        value
    };
    if rest(before) != rest(after) {
        changed.push("(workflow)".to_owned());
    }
    changed
}
