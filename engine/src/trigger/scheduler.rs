//! The cron triggers of the workflows a server holds: which slots are due at `now`, recorded before they
//! are returned, and when the next one comes. Synchronous and clock-free: the server calls [`Scheduler::due`]
//! with the time, starts what it returns and sleeps until [`Scheduler::next_wake`].

use std::collections::VecDeque;
use std::time::Duration;

use serde_json::{Map, Value as Json};

use super::{
    CronSchedule, Decision, Firing, FiringKind, FiringOutcome, Timestamp, TriggerError, decide,
    millis,
};
use crate::spec::Overlap;
use crate::store::{RunStore, StoreError};
use crate::workflow::Workflow;

/// How late a running server may reach a slot and still fire it when the trigger has no longer
/// `catch_up`: a slot reached later than that (the machine slept) counts as missed.
pub const GRACE: Duration = Duration::from_secs(60);
/// Most runs one trigger with `overlap: queue` keeps waiting; a firing past them is skipped.
pub const MAX_QUEUED: usize = 16;

/// A firing that is due, recorded, and what the server does about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Due {
    pub firing: Firing,
    pub decision: Decision,
    /// For [`Decision::Queue`]: the run it waits for (the last one the trigger started or queued).
    pub after: Option<String>,
    /// For [`Decision::CancelPrevious`]: the runs to cancel before starting the new one.
    pub cancel: Vec<String>,
}

/// One cron trigger.
#[derive(Debug)]
struct Entry {
    workflow: String,
    trigger: String,
    schedule: CronSchedule,
    overlap: Overlap,
    catch_up: Option<Duration>,
    inputs: Map<String, Json>,
    /// Slots up to this instant are dealt with; `None` until the first [`Scheduler::due`] that sees
    /// the trigger, which catches up from what the store remembers.
    seen: Option<Timestamp>,
    /// The runs it started or queued that may still be active, oldest first.
    pending: VecDeque<String>,
}

/// The cron triggers of the loaded workflows.
#[derive(Debug, Default)]
pub struct Scheduler {
    entries: Vec<Entry>,
}

impl Scheduler {
    pub fn new() -> Self {
        Scheduler::default()
    }

    /// Adds (or replaces) the cron triggers of `workflow`; returns how many it has. A trigger it held
    /// already under the same name keeps what it knew (the slots seen, the runs pending).
    pub fn add(&mut self, workflow: &Workflow) -> Result<usize, TriggerError> {
        let mut added = Vec::new();
        for def in &workflow.spec.triggers {
            let Some(cron) = def.cron.as_ref().and_then(|c| c.value.get()) else {
                continue;
            };
            let trigger = def.name();
            let given: Map<String, Json> = def
                .inputs
                .iter()
                .map(|(k, v)| (k.value.clone(), v.to_json()))
                .collect();
            let inputs =
                crate::inputs::resolve(&workflow.spec, given, &[]).map_err(|problems| {
                    TriggerError::Inputs {
                        workflow: workflow.name.clone(),
                        trigger: trigger.clone(),
                        message: problems
                            .iter()
                            .map(|p| p.message.clone())
                            .collect::<Vec<_>>()
                            .join("; "),
                    }
                })?;
            let known = self
                .entries
                .iter()
                .position(|e| e.workflow == workflow.name && e.trigger == trigger)
                .map(|i| self.entries.swap_remove(i));
            added.push(Entry {
                workflow: workflow.name.clone(),
                trigger,
                schedule: CronSchedule::new(*cron, def.time_zone()),
                overlap: def.overlap(),
                catch_up: def.catch_up.as_ref().and_then(|c| c.value.get()),
                inputs,
                seen: known.as_ref().and_then(|k| k.seen),
                pending: known.map(|k| k.pending).unwrap_or_default(),
            });
        }
        self.remove(&workflow.name);
        let count = added.len();
        self.entries.extend(added);
        Ok(count)
    }

    /// Forgets the triggers of the workflow named `workflow`.
    pub fn remove(&mut self, workflow: &str) {
        self.entries.retain(|e| e.workflow != workflow);
    }

    /// Counts `run` as the newest run of the trigger `trigger` of `workflow` that may still be active
    /// (a run the server took up from its last stop, or one of a firing recorded before it stopped), so
    /// that the next firing's overlap decision sees it and a queued one waits for it. Does nothing for a
    /// trigger it does not hold; forgotten, as every run it counts, once `active` says it ended.
    pub fn follow(&mut self, workflow: &str, trigger: &str, run: &str) {
        if let Some(entry) = self
            .entries
            .iter_mut()
            .find(|e| e.workflow == workflow && e.trigger == trigger)
            && !entry.pending.iter().any(|r| r == run)
        {
            entry.pending.push_back(run.to_owned());
        }
    }

    /// The workflow and trigger names it holds, in order.
    pub fn triggers(&self) -> Vec<(&str, &str)> {
        self.entries
            .iter()
            .map(|e| (e.workflow.as_str(), e.trigger.as_str()))
            .collect()
    }

    /// The firings due at `now`, each recorded in `store` before it is returned; `active` says whether
    /// a run the scheduler returned earlier is still running or waiting in the server's queue.
    ///
    /// The first call that sees a trigger catches up: the slots after the last one the store recorded
    /// for it (or after the time a server first watched it) and within its `catch_up` window before
    /// `now` fire, each once, oldest first, and their runs one after another (the first follows the
    /// overlap policy, each other one queues behind the one before); without `catch_up` none does. Later calls fire the slots
    /// since the previous call that are at most `catch_up` (at least [`GRACE`]) old. A slot the store
    /// already holds (another server fired it) is not returned.
    pub fn due(
        &mut self,
        store: &dyn RunStore,
        now: Timestamp,
        active: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<Due>, StoreError> {
        let mut due = Vec::new();
        for entry in &mut self.entries {
            entry.pending.retain(|run| active(run));
            let (from, window) = match entry.seen {
                Some(seen) => (seen, entry.catch_up.unwrap_or(Duration::ZERO).max(GRACE)),
                None => {
                    let mark = store.arm_trigger(&entry.workflow, &entry.trigger, millis(now))?;
                    // Slots after the last one recorded, and from the moment a server first watched
                    // the trigger (that one included).
                    let armed = mark.armed_at.saturating_sub(1);
                    let from = mark.last_slot_at.map_or(armed, |last| last.max(armed));
                    (
                        Timestamp::from_millisecond(i64::try_from(from).unwrap_or(i64::MAX))
                            .unwrap_or(Timestamp::UNIX_EPOCH),
                        entry.catch_up.unwrap_or(Duration::ZERO),
                    )
                }
            };
            // Older slots would not fire: the search starts at the window.
            let earliest = now
                .checked_sub(jiff::SignedDuration::try_from(window).unwrap_or_default())
                .unwrap_or(Timestamp::MIN);
            let one = jiff::SignedDuration::from_nanos(1);
            let start = from.max(earliest.checked_sub(one).unwrap_or(earliest));
            let catching_up = entry.seen.is_none();
            let slots: Vec<Timestamp> = entry.schedule.slots(start, now).collect();
            let mut first = true;
            for slot in slots {
                // Missed slots caught up together run one after another, whatever the overlap
                // policy: the first follows it, the others queue behind the one before.
                if let Some(fired) = fire(store, entry, slot, now, catching_up && !first)? {
                    due.push(fired);
                    first = false;
                }
            }
            entry.seen = Some(entry.seen.map_or(now, |seen| seen.max(now)));
        }
        Ok(due)
    }

    /// When the next slot of any trigger comes, after `now`.
    pub fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        self.entries
            .iter()
            .filter_map(|e| e.schedule.next_after(e.seen.map_or(now, |s| s.max(now))))
            .min()
    }
}

/// Records the firing of `slot` and decides what it does; `None` when the store already had it.
fn fire(
    store: &dyn RunStore,
    entry: &mut Entry,
    slot: Timestamp,
    now: Timestamp,
    queue: bool,
) -> Result<Option<Due>, StoreError> {
    let previous = entry.pending.back().cloned();
    let policy = if queue { Overlap::Queue } else { entry.overlap };
    let mut decision = decide(policy, previous.is_some());
    let mut reason = None;
    if decision == Decision::Queue && entry.pending.len() >= MAX_QUEUED {
        decision = Decision::Skip;
        reason = Some(format!("{MAX_QUEUED} runs are queued already"));
    }
    let run_id = (decision != Decision::Skip).then(crate::store::new_run_id);
    let outcome = match decision {
        Decision::Start | Decision::CancelPrevious => FiringOutcome::Started,
        Decision::Queue => FiringOutcome::Queued,
        Decision::Skip => FiringOutcome::Skipped,
    };
    match (decision, &previous) {
        (Decision::Skip, Some(previous)) if reason.is_none() => {
            reason = Some(format!("run `{previous}` was still running"));
        }
        (Decision::CancelPrevious, _) => {
            let runs: Vec<String> = entry.pending.iter().map(|r| format!("`{r}`")).collect();
            reason = Some(format!("cancelled run {}", runs.join(", ")));
        }
        _ => {}
    }
    let firing = Firing {
        workflow: entry.workflow.clone(),
        trigger: entry.trigger.clone(),
        kind: FiringKind::Cron,
        slot: slot.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        slot_at: millis(slot),
        fired_at: millis(now),
        run_id: run_id.clone(),
        outcome,
        reason,
        inputs: if run_id.is_some() {
            entry.inputs.clone()
        } else {
            Map::new()
        },
    };
    if !store.record_firing(&firing)? {
        return Ok(None);
    }
    let mut cancel = Vec::new();
    let mut after = None;
    match decision {
        Decision::Start => {}
        Decision::Queue => after = previous,
        Decision::CancelPrevious => cancel = entry.pending.drain(..).collect(),
        Decision::Skip => {}
    }
    if let Some(run) = run_id {
        entry.pending.push_back(run);
    }
    Ok(Some(Due {
        firing,
        decision,
        after,
        cancel,
    }))
}
