//! Runs submitted to workers: `archon run --submit` records a run and its first ready steps in the store's
//! task table ([`Session::submit`]); `archon worker` claims ready steps and runs each with
//! [`run::run_step`] ([`Session::work`]). There is no central scheduler: whoever finishes a step makes its
//! dependents ready in the same transaction, and whoever finishes the last one ends the run with
//! [`run::run`] over every step's result.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{NewRunRequest, Session, SessionError, spec_files};
use crate::report::StepStatus;
use crate::resume;
use crate::run::{self, RunOptions};
use crate::store::{
    Finished, NewRun, Routing, RunState, StoreError, StoredRun, Task, Tasks, Waiting, WorkerInfo,
};
use crate::validate::validate_source;
use crate::workflow::Workflow;

/// How long a worker's lease on a step lasts unless renewed (`archon worker --lease`).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);
/// How long a stopping worker lets its running steps go on (`archon worker --drain`).
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
/// The longest a worker with nothing to do waits before it looks for work again.
const MOST_IDLE: Duration = Duration::from_secs(1);
/// The first wait of an idle worker; it doubles up to [`MOST_IDLE`] while there is no work.
const LEAST_IDLE: Duration = Duration::from_millis(25);

/// The longest between two looks for leases that lapsed (shorter with a lease under three times this).
const REAP_EVERY: Duration = Duration::from_secs(1);

/// How many runs' validated workflows a worker keeps at most.
const KEPT_WORKFLOWS: usize = 64;
/// A worker with fewer than half of its places free (rounded down), and some, waits at most this long
/// for more of its steps to end before it claims for them: one claim then fills several places. A claim
/// costs the server about as much for one step as for ten, and takes turns with every other worker's.
/// With 4 workers of 8 places taking no-op steps, a claim took 2.3 steps at 2 ms and about 3 at 10 ms
/// (docs/scale-out.md, Measuring). A place waits 10 ms at most for its next step: a step of a second
/// loses 1% of its place's time at worst.
const GATHER_PLACES: Duration = Duration::from_millis(10);

/// Whether a worker claims for its free places now, or waits a moment ([`GATHER_PLACES`]) for more of
/// its steps to end.
#[derive(Debug, Default)]
struct Gathering {
    /// Since when fewer than half of the places (rounded down) are free, and some are.
    since: Option<tokio::time::Instant>,
}

impl Gathering {
    /// Until when the worker waits before it claims, now that `free` of its `places` are free; `None`:
    /// it claims now (it has nothing to claim for when no place is free).
    fn until(
        &mut self,
        free: usize,
        places: usize,
        now: tokio::time::Instant,
    ) -> Option<tokio::time::Instant> {
        if free == 0 || free >= (places / 2).max(1) {
            self.since = None;
            return None;
        }
        let until = *self.since.get_or_insert(now) + GATHER_PLACES;
        if now < until {
            return Some(until);
        }
        // Waited enough: the claim now, and a new wait from the next place that frees.
        self.since = None;
        None
    }
}

/// How a worker works.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Most steps running at once.
    pub concurrency: usize,
    /// How long a claimed step's lease lasts; renewed every third of it while the step runs.
    pub lease: Duration,
    /// The executable that evaluates jq filters and renders templates in a process of its own.
    pub helper: Option<PathBuf>,
    /// Cancelled to stop (the first SIGTERM): no more steps are claimed; the running ones go on for up
    /// to `drain`.
    pub stop: CancellationToken,
    /// How long running steps may go on once the worker stops claiming.
    pub drain: Duration,
    /// Cancelled to stop at once (a second signal; `drain` after `stop` otherwise): the running steps are
    /// stopped (their attempts end cancelled, their commands stopped) and their tasks handed back, ready
    /// for another worker at once.
    pub halt: CancellationToken,
    /// Where the worker says, a line at a time, what befell its connection and its steps.
    pub say: Say,
    /// The labels this worker has: it takes only steps whose labels are all among them.
    pub labels: Vec<String>,
    /// Most steps running at once on all workers together (`--global-limit`), as this worker counts.
    pub global_limit: Option<u32>,
}

/// Says a line (standard error for `archon worker`). Lines carry no secret: store errors show the URL
/// with its password masked.
#[derive(Clone)]
pub struct Say(pub Arc<dyn Fn(&str) + Send + Sync>);

impl Say {
    fn line(&self, text: &str) {
        (self.0)(text);
    }
}

impl Default for Say {
    fn default() -> Self {
        Say(Arc::new(|_| {}))
    }
}

impl std::fmt::Debug for Say {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Say")
    }
}

/// What a worker did before it stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Worked {
    /// Steps run to their end and marked done.
    pub steps: usize,
    /// Runs this worker ended.
    pub runs: usize,
    /// Steps whose lease lapsed and were taken over before this worker finished them.
    pub lost: usize,
    /// Steps stopped when the worker stopped, their tasks handed back to the other workers.
    pub released: usize,
}

impl Worked {
    /// Counts what became of a step's task. A step that panicked is lost to this worker: its lease
    /// lapses and another worker takes it.
    fn count(&mut self, joined: Result<Outcome, tokio::task::JoinError>, say: &Say) {
        let outcome = joined.unwrap_or_else(|e| {
            say.line(&format!("worker: a step stopped unexpectedly: {e}"));
            Outcome::Lost
        });
        match outcome {
            Outcome::Done => self.steps += 1,
            Outcome::EndedRun => {
                self.steps += 1;
                self.runs += 1;
            }
            Outcome::Lost => self.lost += 1,
            Outcome::Ended | Outcome::Waiting => {}
            Outcome::Released => self.released += 1,
        }
    }
}

/// The records of a run that the steps claimed with one claim need ([`Tasks::load_steps`]), read once
/// for all of them: each of the steps awaits the one read.
type Records = Shared<BoxFuture<'static, Result<Arc<StoredRun>, StoreError>>>;

/// The steps whose records running step `step` of `workflow` needs: the step's own and its
/// dependencies' (their results), not the whole run's.
fn needs(workflow: &Workflow, step: &str) -> Vec<String> {
    let mut names = vec![step.to_owned()];
    if let Some(index) = workflow.step_index(step) {
        names.extend(
            workflow.dependencies[index]
                .iter()
                .map(|&d| workflow.spec.steps[d].id.value.clone()),
        );
    }
    names
}

/// What became of one task.
enum Outcome {
    Done,
    EndedRun,
    Lost,
    /// The task was left claimed by a worker that ended its run: nothing to do.
    Ended,
    Released,
    /// The step waits for a person to decide on a call it asked for.
    Waiting,
}

/// The first wait of a worker that cannot reach its store before it tries again; it doubles up to
/// [`MOST_DOWN`].
const LEAST_DOWN: Duration = Duration::from_millis(100);
const MOST_DOWN: Duration = Duration::from_secs(2);

/// The journal of a run's end, on the worker that finished its last step: the run's end is the run over
/// every step's result, each reused, which is no news to whoever follows the run, so those events are
/// left out; everything else (the run's end, its outputs) is recorded.
#[derive(Debug)]
struct Ending(Arc<dyn crate::store::Journal>);

impl crate::store::Journal for Ending {
    fn record(&self, entry: crate::store::Entry) {
        if let crate::store::Entry::Event {
            event: crate::report::RunEvent::StepReused { .. },
            ..
        } = &entry
        {
            return;
        }
        self.0.record(entry);
    }

    fn flush(&self) -> crate::store::Ack {
        self.0.flush()
    }

    fn close(&self) {
        self.0.close();
    }

    fn failure(&self) -> Option<StoreError> {
        self.0.failure()
    }
}

impl Session {
    fn task_table(&self) -> Result<&dyn Tasks, SessionError> {
        self.store.tasks().ok_or_else(|| {
            StoreError::new("runs can be submitted to workers only on a PostgreSQL run store")
                .with_hint("pass `--store postgres://...` (or set `ARCHON_STORE`)")
                .into()
        })
    }

    /// Records a run for workers to run (`archon run --submit`): its spec files and inputs, and its steps
    /// that need nothing as ready tasks. Returns at once; nobody owns the run.
    pub fn submit(&self, request: NewRunRequest) -> Result<String, SessionError> {
        let tasks = self.task_table()?;
        let (spec_path, max_parallel) = request.settled()?;
        let workflow = &request.workflow;
        let ready: Vec<String> = workflow
            .spec
            .steps
            .iter()
            .enumerate()
            .filter(|(i, _)| workflow.dependencies[*i].is_empty())
            .map(|(_, s)| s.id.value.clone())
            .collect();
        // Each step's labels (a step runs whole on one worker) and the workflow's limit.
        let routing = Routing {
            labels: workflow
                .spec
                .steps
                .iter()
                .map(|s| (s.id.value.clone(), workflow.labels_of(s)))
                .filter(|(_, labels)| !labels.is_empty())
                .map(|(step, labels)| (step, labels.into_iter().collect()))
                .collect(),
            workflow_limit: workflow.spec.concurrency.as_ref().map(|c| c.value.max(1)),
        };
        tasks.submit(
            &NewRun {
                id: request.id.clone(),
                workflow: workflow.name.clone(),
                spec_path: spec_path.display().to_string(),
                files: spec_files(workflow, &spec_path),
                inputs: request.inputs,
                workdir: request.workdir.display().to_string(),
                max_parallel,
            },
            &routing,
            &ready,
        )?;
        Ok(request.id)
    }

    /// Hands a submitted run that rests `waiting_approval` back to the workers (`archon resume`): its
    /// waiting steps are ready again, reusing every decision recorded (and the default of requests past
    /// their timeout). False when the run was not submitted to workers or does not wait.
    pub fn hand_back(&self, id: &str) -> Result<bool, SessionError> {
        match self.store.tasks() {
            Some(tasks) => Ok(tasks.hand_back(id)?),
            None => Ok(false),
        }
    }

    /// Works on submitted runs until `options.stop` is cancelled: claims ready steps (at most
    /// `options.concurrency` at once), runs each as a task of its own (so that its store calls do not hold
    /// up the loop that claims), and returns leases that lapsed elsewhere to ready every
    /// [`REAP_EVERY`] at most. An idle worker looks again when the store announces work
    /// (`Tasks::work_signal`), else with backoff.
    ///
    /// A store it cannot reach stops it claiming, not working: it says so, tries again with backoff, and
    /// takes steps again once the store is back. The steps it runs meanwhile go on while their journals
    /// can renew their leases, and are stopped before their leases lapse when they cannot.
    pub async fn work(self: Arc<Self>, options: &WorkerOptions) -> Result<Worked, SessionError> {
        let tasks = self.task_table()?;
        let me = WorkerInfo {
            name: worker_name(),
            host: crate::store::sqlite::host(),
            pid: std::process::id(),
            labels: options.labels.clone(),
            concurrency: options.concurrency.max(1),
            global_limit: options.global_limit,
        };
        // Registered while it works: claims read its labels and limit there, and `show` tells a step no
        // live worker can take.
        let beating = CancellationToken::new();
        tasks.register_worker(&me, options.lease, beating.clone())?;
        let worked = self.clone().work_as(&me.name, options).await;
        beating.cancel();
        let gone = tasks.deregister_worker(&me.name);
        let worked = worked?;
        gone?;
        Ok(worked)
    }

    /// The runtime to run [`Session::work`] on: the store's own, when it has one (PostgreSQL's). A step's
    /// store calls then pass within one runtime instead of between the worker's and the store's: about
    /// half the thread switches per step (docs/scale-out.md, Measuring). Steps there share threads with
    /// the store's connections, journals and lease renewals, and keep none from them: their blocking work
    /// runs off the runtime's threads (`spawn_blocking`, `tools::off_thread`, helper processes), and a
    /// store call they wait for hands the thread's other tasks on first (`block_in_place`).
    pub fn store_runtime(&self) -> Option<tokio::runtime::Handle> {
        self.store.tasks().and_then(|tasks| tasks.runtime())
    }

    /// The ready steps of a submitted run that no worker has taken, each with why it waits (none for a
    /// run not submitted to workers, or on a store without them).
    pub fn waiting(&self, id: &str) -> Result<Vec<Waiting>, StoreError> {
        match self.store.tasks() {
            Some(tasks) => tasks.waiting(id),
            None => Ok(Vec::new()),
        }
    }

    async fn work_as(
        self: Arc<Self>,
        name: &str,
        options: &WorkerOptions,
    ) -> Result<Worked, SessionError> {
        let tasks = self.task_table()?;
        let concurrency = options.concurrency.max(1);
        let mut running: JoinSet<Outcome> = JoinSet::new();
        // Lapsed leases are returned at most this often, not before every claim.
        let reap_every = REAP_EVERY.min(options.lease / 3);
        let mut reaped: Option<tokio::time::Instant> = None;
        let mut worked = Worked::default();
        let mut idle = LEAST_IDLE;
        let mut workflows: HashMap<String, Arc<Workflow>> = HashMap::new();
        let signal = tasks.work_signal();
        // The store's failure while it cannot be reached.
        let mut down: Option<StoreError> = None;
        let mut halt_at: Option<tokio::time::Instant> = None;
        let mut gathering = Gathering::default();
        loop {
            // Read once: a stop that comes later in this turn wakes the wait below.
            let stopping = options.stop.is_cancelled();
            if stopping && halt_at.is_none() {
                halt_at = Some(tokio::time::Instant::now() + options.drain);
                if !running.is_empty() && !options.halt.is_cancelled() {
                    options.say.line(&format!(
                        "worker: stopping: letting {} running steps finish (at most {})",
                        running.len(),
                        humantime::format_duration(options.drain)
                    ));
                }
            }
            let free = concurrency.saturating_sub(running.len());
            let gather_until = gathering.until(free, concurrency, tokio::time::Instant::now());
            if !stopping && free > 0 && gather_until.is_none() {
                let due = reaped.is_none_or(|at| at.elapsed() >= reap_every);
                let claimed = async {
                    if due {
                        tasks.reap()?;
                        reaped = Some(tokio::time::Instant::now());
                    }
                    tasks
                        .claim_tasks(name, concurrency - running.len(), options.lease)
                        .await
                }
                .await;
                match claimed {
                    Ok(claimed) => {
                        if down.take().is_some() {
                            options
                                .say
                                .line("worker: the run store is back: taking steps again");
                            idle = LEAST_IDLE;
                        }
                        if !claimed.is_empty() {
                            idle = LEAST_IDLE;
                        }
                        // The claimed steps of each run, with its workflow.
                        let mut runs: Vec<(Arc<Workflow>, Vec<Task>)> = Vec::new();
                        for task in claimed {
                            if let Some((_, group)) = runs
                                .iter_mut()
                                .find(|(_, group)| group[0].run_id == task.run_id)
                            {
                                group.push(task);
                                continue;
                            }
                            let workflow = match workflows.get(&task.run_id) {
                                Some(w) => Ok(w.clone()),
                                None => self.stored_workflow(&task.run_id).map(Arc::new),
                            };
                            match workflow {
                                Ok(workflow) => {
                                    // Kept for the run's next steps; a long-lived worker forgets old runs.
                                    if workflows.len() >= KEPT_WORKFLOWS {
                                        workflows.clear();
                                    }
                                    workflows.insert(task.run_id.clone(), workflow.clone());
                                    runs.push((workflow, vec![task]));
                                }
                                Err(SessionError::Store(e)) => {
                                    // Its lease lapses, or it comes back at once when the store is up.
                                    options.say.line(&format!(
                                        "worker: cannot start step `{}` of run `{}`: {}",
                                        task.step, task.run_id, e.message
                                    ));
                                    let _ = tasks.release_task(&task);
                                }
                                Err(e) => {
                                    if let Err(e) = tasks.interrupt(&task, &e.to_string()) {
                                        options.say.line(&format!(
                                            "worker: cannot stop run `{}`: {}",
                                            task.run_id, e.message
                                        ));
                                    }
                                }
                            }
                        }
                        for (workflow, claimed) in runs {
                            // What the run's claimed steps need of its records, read once for all of
                            // them (a read costs the server about as much for one step as for ten).
                            let mut names: Vec<String> = Vec::new();
                            for task in &claimed {
                                names.extend(needs(&workflow, &task.step));
                            }
                            names.sort_unstable();
                            names.dedup();
                            let records: Records = tasks
                                .load_steps(&claimed[0].run_id, &names)
                                .map(|read| read.map(Arc::new))
                                .boxed()
                                .shared();
                            for task in claimed {
                                let (session, options) = (self.clone(), options.clone());
                                let (workflow, records) = (workflow.clone(), records.clone());
                                running.spawn(async move {
                                    session.work_on(task, workflow, records, &options).await
                                });
                            }
                        }
                    }
                    Err(e) => {
                        if down.is_none() {
                            options.say.line(&format!(
                                "worker: lost the run store: taking no steps until it is back: {}",
                                e.message
                            ));
                            idle = idle.max(LEAST_DOWN);
                        }
                        down = Some(e);
                    }
                }
            }
            if running.is_empty() && stopping {
                return Ok(worked);
            }
            let full = running.len() >= concurrency || stopping;
            let most = if down.is_some() { MOST_DOWN } else { MOST_IDLE };
            tokio::select! {
                Some(joined) = running.join_next(), if !running.is_empty() => {
                    worked.count(joined, &options.say);
                    // The other steps that ended meanwhile too, so that one claim fills their places.
                    while let Some(joined) = running.try_join_next() {
                        worked.count(joined, &options.say);
                    }
                    if down.is_none() {
                        idle = LEAST_IDLE;
                    }
                }
                () = tokio::time::sleep_until(gather_until.unwrap_or_else(tokio::time::Instant::now)),
                    if gather_until.is_some() && !stopping => {}
                () = tokio::time::sleep(idle), if !full => {
                    idle = (idle * 2).min(most);
                }
                // Work announced: look at once (a stray notification costs one look).
                () = signal.notified(), if !full && down.is_none() => {
                    idle = LEAST_IDLE;
                }
                () = options.stop.cancelled(), if !stopping => {}
                () = tokio::time::sleep_until(halt_at.unwrap_or_else(tokio::time::Instant::now)),
                    if halt_at.is_some() && !options.halt.is_cancelled() => {
                    options.halt.cancel();
                }
            }
        }
    }

    /// The workflow of a submitted run, validated from the spec text the run recorded (its
    /// sub-workflows, if any, are read where they were).
    fn stored_workflow(&self, id: &str) -> Result<Workflow, SessionError> {
        let stored = self.store.load_brief(id)?;
        let files = self.store.files(id)?;
        let Some((_, text)) = files.first() else {
            return Err(StoreError::new(format!("run `{id}` recorded no spec")).into());
        };
        let path = PathBuf::from(&stored.spec_path);
        let mut validation = validate_source(path.clone(), text.clone());
        match validation.workflow.take() {
            Some(workflow) if !validation.has_errors() => Ok(workflow),
            _ => Err(SessionError::Invalid {
                path,
                validation: Box::new(validation),
            }),
        }
    }

    /// Runs one claimed step (see [`Session::step_task`]); a store that fails it is said, and the task
    /// handed back when the store allows (else its lease lapses), for another worker to take.
    async fn work_on(
        &self,
        task: Task,
        workflow: Arc<Workflow>,
        records: Records,
        options: &WorkerOptions,
    ) -> Outcome {
        let tasks = match self.task_table() {
            Ok(tasks) => tasks,
            Err(_) => return Outcome::Lost,
        };
        match self
            .step_task(tasks, &task, workflow, records, options)
            .await
        {
            Ok(outcome) => outcome,
            Err(e) => {
                let message = match &e {
                    SessionError::Store(e) => e.message.clone(),
                    e => e.to_string(),
                };
                options.say.line(&format!(
                    "worker: step `{}` of run `{}` stopped: {message}",
                    task.step, task.run_id
                ));
                let _ = tasks.release_task(&task);
                Outcome::Lost
            }
        }
    }

    /// Runs one claimed step, then marks it done (making its dependents ready) or, when it was the
    /// run's last, ends the run. Halted (`WorkerOptions::halt`), the step is stopped and its task
    /// handed back.
    async fn step_task(
        &self,
        tasks: &dyn Tasks,
        task: &Task,
        workflow: Arc<Workflow>,
        records: Records,
        options: &WorkerOptions,
    ) -> Result<Outcome, SessionError> {
        // What running the step needs, of the records read for the steps of its run claimed with it.
        let names = needs(&workflow, &task.step);
        let stored = match records.await {
            // The last step to take its part takes the read itself.
            Ok(read) => match Arc::try_unwrap(read) {
                Ok(mut read) => {
                    read.keep_steps(&names);
                    read
                }
                Err(read) => read.of_steps(&names),
            },
            // A read that failed over another step's records (a damaged row) does not stop this one:
            // it reads its own.
            Err(_) => tasks.load_steps(&task.run_id, &names).await?,
        };
        // The run has ended: the worker that recorded its end stopped before it marked its last task done
        // (killed, or cut off). Nothing is left to run, and nothing is recorded after the run's end.
        if stored.status != RunState::Running {
            tasks.complete(task)?;
            return Ok(Outcome::Ended);
        }
        // A step whose earlier attempt was cut off is in doubt, as on resume: it runs again only when
        // that is safe; otherwise the run stops interrupted for a person to resume or resolve it.
        let doubtful: Vec<resume::InDoubt> = resume::in_doubt(&workflow, &stored)
            .into_iter()
            .filter(|d| d.step == task.step)
            .collect();
        if let Some(d) = doubtful.iter().find(|d| !d.idempotent) {
            tasks.interrupt(
                task,
                &format!(
                    "step `{}` is in doubt: its worker stopped while it ran, and repeating it is not known to be safe",
                    d.name
                ),
            )?;
            return Ok(Outcome::Lost);
        }
        // A command the stopped worker left behind on this host would race the step's new attempt.
        for d in &doubtful {
            if let Some(pgid) = d.leftover {
                crate::process::kill_group(pgid);
            }
        }
        // Cancelled by the journal: `archon cancel`, the task taken over, or its lease about to lapse
        // unrenewed.
        let cancel = CancellationToken::new();
        let journal = tasks
            .task_journal(task, &stored, options.lease, cancel.clone())
            .await?;
        let run_options = self.task_options(
            &stored,
            (&workflow, Some(&task.step)),
            journal.clone(),
            cancel.clone(),
            options,
        );
        // The step's records are applied when the journal ends, or with the task's end (`finish`).
        // `archon cancel` stops the step as it stops a local run's: its attempt ends cancelled, its
        // commands are stopped, nothing after it is made ready, and the run ends cancelled once no
        // worker runs a step of it (`Tasks::reap`).
        let mut step = Box::pin(run::run_step(
            workflow.clone(),
            stored.inputs.clone(),
            run_options,
            &task.step,
        ));
        let stepped = tokio::select! {
            stepped = &mut step => stepped,
            () = cancel.cancelled() => {
                drop(step);
                journal.end().await;
                // The journal stops the step too when the task was taken over, or when its lease
                // could not be renewed: nothing more is recorded.
                if failed(&*journal, &options.say) {
                    return Ok(Outcome::Lost);
                }
                tasks.complete(task)?;
                return Ok(Outcome::Done);
            }
            // Stopped as a local run's steps are by a signal: the step's future is dropped, which
            // kills its commands and records its attempt as ended, cancelled (no result); the task is
            // handed back, and whoever takes it runs the step anew.
            () = options.halt.cancelled() => {
                drop(step);
                journal.end().await;
                if journal.failure().is_some() {
                    return Ok(Outcome::Lost);
                }
                tasks.release_task(task)?;
                return Ok(Outcome::Released);
            }
        };
        if journal.failure().is_some() {
            journal.end().await;
            failed(&*journal, &options.say);
            return Ok(Outcome::Lost);
        }
        let result = match stepped {
            Ok(result) => result,
            Err(e) => {
                journal.end().await;
                if failed(&*journal, &options.say) {
                    return Ok(Outcome::Lost);
                }
                tasks.interrupt(task, &e.to_string())?;
                return Ok(Outcome::Lost);
            }
        };
        // The step waits for a person: it recorded its requests and no result, and waits (its dependents
        // with it) until `archon approve` decides them; the run rests `waiting_approval` once nothing
        // else of it can run.
        if result.status == StepStatus::WaitingApproval {
            journal.end().await;
            if failed(&*journal, &options.say) {
                return Ok(Outcome::Lost);
            }
            tasks.wait_approval(task)?;
            return Ok(Outcome::Waiting);
        }
        let steps = &workflow.spec.steps;
        let dependents: Vec<(String, Vec<String>)> = (workflow.step_index(&task.step))
            .map_or(&[][..], |me| &workflow.dependents[me])
            .iter()
            .map(|&i| {
                let needs = workflow.dependencies[i]
                    .iter()
                    .map(|&d| steps[d].id.value.clone())
                    .collect();
                (steps[i].id.value.clone(), needs)
            })
            .collect();
        // The step's last records and the task's end, in one transaction.
        let finished = match journal.finish(&dependents, steps.len()).await {
            Ok(finished) => finished,
            Err(e) => {
                journal.end().await;
                if failed(&*journal, &options.say) {
                    return Ok(Outcome::Lost);
                }
                return Err(e.into());
            }
        };
        match finished {
            Finished::Done(_) => {
                journal.end().await;
                Ok(Outcome::Done)
            }
            Finished::Lost => {
                journal.end().await;
                Ok(Outcome::Lost)
            }
            Finished::Last => {
                // Every step has its result: the run's end is the run over all of them, reused.
                let stored = self.store.load(&task.run_id)?;
                let cancel = CancellationToken::new();
                let ending: Arc<dyn crate::store::Journal> = Arc::new(Ending(journal.clone()));
                let run_options =
                    self.task_options(&stored, (&workflow, None), ending, cancel, options);
                let ended = run::run(workflow, stored.inputs.clone(), run_options).await;
                journal.end().await;
                if failed(&*journal, &options.say) {
                    return Ok(Outcome::Lost);
                }
                if let Err(e) = ended {
                    tasks.interrupt(task, &e.to_string())?;
                    return Ok(Outcome::Lost);
                }
                tasks.complete(task)?;
                Ok(Outcome::EndedRun)
            }
        }
    }

    /// How a stored run runs on this worker: every result the run has recorded is reused. Running
    /// its step `step`, the cached results it may reuse are its workflow's entries for that step and
    /// every entry of the workflow's sub-workflows (not every entry of the run's workflow, which a
    /// large cached run would read for each of its steps); ending the run (`None`), none: every step
    /// has its result by then. A cache that cannot be read is said, and the step runs without it.
    fn task_options(
        &self,
        stored: &StoredRun,
        (workflow, step): (&Workflow, Option<&str>),
        journal: Arc<dyn crate::store::Journal>,
        cancel: CancellationToken,
        options: &WorkerOptions,
    ) -> RunOptions {
        let entries = match step {
            Some(step) if !workflow.cached.is_empty() => self
                .store
                .step_cache_entries(
                    &workflow.name,
                    step,
                    &workflow.cached_below,
                    crate::store::now_ms(),
                )
                .unwrap_or_else(|e| {
                    options.say.line(&format!(
                        "worker: run `{}`: step `{step}` runs without the cached results: {e}",
                        stored.id
                    ));
                    Vec::new()
                }),
            _ => Vec::new(),
        };
        RunOptions {
            max_parallel: stored.max_parallel,
            workdir: PathBuf::from(&stored.workdir),
            protected: self.store.location().into_iter().collect(),
            run_id: stored.id.clone(),
            cancel,
            events: None,
            env: std::env::vars().collect(),
            journal,
            prior: Arc::new(
                stored
                    .results
                    .iter()
                    .map(|(name, result)| (name.clone(), result.clone()))
                    .collect(),
            ),
            cassette: None,
            checkpoints: Arc::new(std::sync::Mutex::new(stored.checkpoints.clone())),
            approvals: run::Approvals {
                decided: Arc::new(super::decisions(stored)),
                yes: false,
                approver: None,
            },
            helper: options.helper.clone(),
            cache: run::StepCache::of(entries, run::Refresh::None),
            memory_dir: self.store.location(),
            memory: run::MemoryFiles::new(run::memory::MemoryDatabase::of(&*self.store)),
        }
    }
}

/// Whether the step's journal failed (its records were not all kept): says why, unless the task was
/// taken over by another worker.
fn failed(journal: &dyn crate::store::Journal, say: &Say) -> bool {
    let Some(failure) = journal.failure() else {
        return false;
    };
    if !failure.taken_over {
        say.line(&format!("worker: {}", failure.message));
    }
    true
}

/// This worker's name in the task table: its host, process and start, unique among workers.
fn worker_name() -> String {
    format!(
        "{}-{}-{}-{:08x}",
        crate::store::sqlite::host(),
        std::process::id(),
        crate::store::now_ms(),
        fastrand::u32(..)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With fewer than half of its places free (rounded down), a worker waits for more of them to free,
    /// for [`GATHER_PLACES`] at most from the first; with half or more free, or none, it does not wait.
    #[test]
    fn a_worker_with_few_places_free_waits_a_moment_before_it_claims() {
        let start = tokio::time::Instant::now();
        let ms = |n: u64| start + Duration::from_millis(n);
        let mut gathering = Gathering::default();
        let mut seen = Vec::new();
        // (milliseconds since the start, free places of 8)
        for (at, free) in [
            (0, 0),
            (1, 1),
            (4, 3),
            (9, 2),
            (11, 3),
            (12, 2),
            (13, 4),
            (14, 1),
            (30, 8),
        ] {
            let until = gathering.until(free, 8, ms(at));
            seen.push((at, free, until.map(|u| (u - start).as_millis())));
        }
        assert_eq!(
            seen,
            [
                (0, 0, None),
                // The first place freed: wait until 10 ms after it.
                (1, 1, Some(11)),
                (4, 3, Some(11)),
                (9, 2, Some(11)),
                // Waited enough: claim; the next wait starts afresh.
                (11, 3, None),
                (12, 2, Some(22)),
                // Half free: claim at once.
                (13, 4, None),
                (14, 1, Some(24)),
                (30, 8, None),
            ]
        );
        // A worker of up to three places never waits: one free is half of them (rounded down).
        assert_eq!(Gathering::default().until(1, 1, start), None);
        assert_eq!(Gathering::default().until(1, 2, start), None);
        assert_eq!(Gathering::default().until(1, 3, start), None);
        assert_eq!(Gathering::default().until(1, 4, start), Some(ms(10)));
    }
}
