//! The DAG loop: a step starts as soon as its dependencies have finished and fewer than `max_parallel`
//! steps are running; a `JoinSet` holds the running steps and a `CancellationToken` stops them all.
//!
//! The layers below it, each importing only the ones after it: `lifecycle` (one step: `if`, `foreach`,
//! retries, timeouts, fallback, rules), `call` (what an attempt calls: a tool, a declared tool, a composite
//! tool, a sub-workflow, an agent or a planner), `planner`, `agent`, `gate`, `checkpoint`, `durable`, and
//! `context`, which all of them share. What reaches back up (scheduling steps one level down, a declared
//! tool an agent calls, a nested run) goes through the `Nested` hooks this module implements.

mod agent;
mod cache;
mod call;
mod checkpoint;
mod context;
mod durable;
mod gate;
mod lifecycle;
mod mcp;
mod planner;
mod prompt;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value as Json, json};
use tokio::task::JoinSet;

use super::redact::Redactor;
use super::render::{Renderer, StepView, context_value, json_value};
use crate::report::{REPORT_VERSION, RunEvent, RunReport, RunStatus, StepResult, StepStatus};
use crate::run::options::RunOptions;
use crate::spec::{ChosenBy, Step, Trigger};
use crate::store::{Entry, RunState};
use crate::tools::ToolContext;
use crate::workflow::Workflow;
use context::{
    Boxed, Called, Failure, Halt, LlmContext, Nested, Shared, Steps, first_failure, millis, named,
    results, spec_dir, waits,
};
use gate::Gate;

pub use agent::delegation_tool;
pub use context::RunError;

/// The scheduler as its children see it (`context::Nested`).
struct Scheduler;

impl Nested for Scheduler {
    fn schedule<'a>(&'a self, shared: &'a Arc<Shared>) -> Boxed<'a, Vec<Arc<StepView>>> {
        Box::pin(schedule(shared))
    }

    fn tool<'a>(
        &'a self,
        shared: &'a Shared,
        label: &'a str,
        name: &'a str,
        args: Json,
        llm_chosen: bool,
    ) -> Boxed<'a, Result<Called, Failure>> {
        Box::pin(call::call_tool(shared, label, name, args, llm_chosen))
    }

    fn workflow(
        &self,
        workflow: Arc<Workflow>,
        inputs: Map<String, Json>,
        parent: &Shared,
        depth: u32,
        prefix: String,
    ) -> Boxed<'static, Result<RunReport, RunError>> {
        // A sub-workflow's `defaults.max_parallel` limits its steps within the run's limit (the run's
        // `work` semaphore still bounds every command of the run).
        let mut options = parent.options.clone();
        if let Some(n) = (workflow.spec.defaults.as_ref()).and_then(|d| d.max_parallel.as_ref()) {
            options.max_parallel = options.max_parallel.min(n.value as usize);
        }
        run_workflow(
            workflow,
            inputs,
            options,
            (depth, prefix),
            Inherited {
                redactor: parent.redactor.clone(),
                llm: Arc::new(parent.llm.nested()),
                halt: Some(parent.halt.clone()),
                work: Some(parent.work.clone()),
                mcp: Some(parent.mcp.clone()),
            },
        )
    }
}

/// Runs a validated workflow with resolved inputs. Errors only for problems found before any step starts.
pub async fn run(
    workflow: Arc<Workflow>,
    inputs: Map<String, Json>,
    options: RunOptions,
) -> Result<RunReport, RunError> {
    run_workflow(
        workflow,
        inputs,
        options,
        (0, String::new()),
        Inherited::none(),
    )
    .await
}

/// Runs one step of a run, as the scheduler runs it once its dependencies have ended: their results
/// come from `options.prior` (an error names the first that has none). The step's attempts and result
/// go through `options.journal`, which its caller flushes (a worker applies them with the task's end,
/// in one transaction). This is how a step runs when steps are handed out one at a time (a worker's
/// task): the run's end — its outputs and its final status — is left to [`run`] with every step's
/// result in `prior`, which reuses them all. The run's `before_run` rules and its `timeout` are its
/// caller's: they are about the run, not one step.
pub async fn run_step(
    workflow: Arc<Workflow>,
    inputs: Map<String, Json>,
    options: RunOptions,
    step: &str,
) -> Result<Arc<StepResult>, RunError> {
    let steps = &workflow.spec.steps;
    let Some(index) = workflow.step_index(step) else {
        return Err(RunError(format!(
            "the workflow `{}` has no step `{step}`",
            workflow.name
        )));
    };
    let mut views: Vec<Option<Arc<StepView>>> = vec![None; steps.len()];
    for &d in &workflow.dependencies[index] {
        let id = &steps[d].id.value;
        let Some(result) = options.prior.get(id) else {
            return Err(RunError(format!(
                "step `{step}` cannot run yet: `{id}`, which it needs, has not ended"
            )));
        };
        views[d] = Some(StepView::new(result.clone()));
    }
    let Prepared { shared, .. } = prepare(
        workflow.clone(),
        &inputs,
        options,
        0,
        String::new(),
        Inherited::none(),
    )
    .await?;
    let deps = || -> Steps {
        workflow.dependencies[index]
            .iter()
            .filter_map(|d| Some((steps[*d].id.value.clone(), views[*d].as_ref()?.value())))
            .collect()
    };
    let result = match readiness(&shared, index, &views, false, deps).await {
        Ready::Ended(result) => result,
        Ready::Run => lifecycle::execute(&shared, index, deps()).await,
    };
    shared.mcp.servers.shutdown().await;
    let halted = shared.halt.reason.get().cloned();
    // Not flushed here: the worker applies the step's last records with the task's end.
    if let Some(e) = shared.options.journal.failure() {
        return Err(RunError(unsaved(&e)));
    }
    match halted {
        Some(reason) => Err(RunError(reason)),
        None => Ok(result),
    }
}

/// What a sub-workflow's run takes from the run that calls it: the secret values to mask, the LLM usage
/// that counts against the budget, and the run's halt; fresh ones for the run itself.
struct Inherited {
    redactor: Arc<Redactor>,
    llm: Arc<LlmContext>,
    halt: Option<Arc<Halt>>,
    /// The run's limit on commands and LLM calls running at once (`Shared::work`), for a nested run.
    work: Option<Arc<tokio::sync::Semaphore>>,
    /// The run's MCP servers, for a nested run.
    mcp: Option<Arc<mcp::McpRun>>,
}

impl Inherited {
    /// What the run itself starts with: nothing from a caller.
    fn none() -> Self {
        Inherited {
            redactor: Arc::new(Redactor::default()),
            llm: Arc::new(LlmContext::default()),
            halt: None,
            work: None,
            mcp: None,
        }
    }
}

/// Runs a workflow at a nesting depth: the run itself, or a sub-workflow called by step `prefix`.
fn run_workflow(
    workflow: Arc<Workflow>,
    inputs: Map<String, Json>,
    options: RunOptions,
    (depth, prefix): (u32, String),
    inherited: Inherited,
) -> Boxed<'static, Result<RunReport, RunError>> {
    Box::pin(async move {
        let started = Instant::now();
        let Prepared { shared, own } =
            prepare(workflow.clone(), &inputs, options, depth, prefix, inherited).await?;
        let spec = workflow.spec.clone();
        // `before_run` rules decide whether anything runs at all; the run's `timeout` bounds it all (a
        // sub-workflow's bounds its call instead: `call.rs`).
        let mut error = None;
        let limit = spec
            .timeout
            .as_ref()
            .and_then(|t| t.value.get())
            .filter(|_| depth == 0);
        let views = within(limit, &shared.halt, async {
            match before_run(&shared).await {
                None => schedule(&shared).await,
                Some(stopped) => {
                    let status = match &stopped {
                        Gate::Waiting(_) => StepStatus::WaitingApproval,
                        _ => StepStatus::Cancelled,
                    };
                    if let Gate::Denied(reason, _) = &stopped {
                        error = Some(reason.clone());
                    }
                    spec.steps
                        .iter()
                        .map(|_| StepView::new(StepResult::ended(status, None)))
                        .collect()
                }
            }
        })
        .await;
        // The run's steps are over: its MCP servers stop (a sub-workflow's steps use the run's).
        if depth == 0 {
            shared.mcp.servers.shutdown().await;
        }

        let failed = first_failure(&spec.steps, |i| views[i].result().status).is_some();
        let waiting = waits(&views);
        // A run stopped from inside failed, with the reason; one cancelled by its caller was interrupted.
        // A journal that could not write stopped the run too, and the run failed with that.
        let halted = shared.halt.reason.get().cloned().or_else(|| {
            (shared.depth == 0)
                .then(|| shared.options.journal.failure())
                .flatten()
                .map(|e| unsaved(&e))
        });
        let cancelled = shared.options.cancel.is_cancelled();
        let mut outputs = Map::new();
        // A run that waits for a person has not ended: its outputs are rendered when it does.
        if !cancelled && !waiting {
            let steps = named(&spec.steps, &views);
            let ctx = shared.context(&steps, false, &[]);
            let (rendered, problem) = shared.renderer.outputs(&spec.outputs, &ctx).await;
            outputs = rendered;
            if let Some((name, e)) = problem
                && !failed
            {
                let hint = context::unfinished_hint(spec.outputs.get(name.as_str()), &steps);
                error = Some(format!("output `{name}`: {e}{hint}"));
            }
        }
        if halted.is_some() {
            error.clone_from(&halted);
        }
        let mut status = if halted.is_some() {
            RunStatus::Failed
        } else if cancelled {
            RunStatus::Cancelled
        } else if waiting {
            RunStatus::WaitingApproval
        } else if failed || error.is_some() {
            RunStatus::Failed
        } else {
            RunStatus::Succeeded
        };
        if shared.depth == 0 {
            // The run's end is on disk before it is reported.
            let journal = &shared.options.journal;
            journal.record(Entry::RunEnded {
                status: match status {
                    RunStatus::Succeeded => RunState::Succeeded,
                    RunStatus::Failed => RunState::Failed,
                    RunStatus::Cancelled => RunState::Interrupted,
                    RunStatus::WaitingApproval => RunState::WaitingApproval,
                },
                outputs: {
                    let mut outputs = outputs.clone();
                    shared.redactor.map(&mut outputs);
                    outputs
                },
                error: error
                    .as_deref()
                    .map(|e| shared.redactor.text(e).into_owned()),
            });
            // A run whose end could not be saved failed, however it ended: its record (an approval it
            // waits for, the outputs) is not what it reports.
            if let Err(e) = journal.flush().wait().await
                && halted.is_none()
            {
                error = Some(unsaved(&e));
                status = RunStatus::Failed;
            }
        }
        // Taken from the views once the journal has let go of the results it shared with them (its
        // records are applied), so that none is copied: a step of 15 MB was copied here, on the run's
        // thread, for as long as a second.
        let steps = results(&spec.steps, views);
        let (mut steps, mut outputs, mut error) = (steps, outputs, error);
        // What leaves the run carries no secret value. A nested report is still data flowing to its
        // caller, which may use its own secrets; but a sub-workflow's own secrets stay inside it.
        let leaving = if shared.depth == 0 {
            &shared.redactor
        } else {
            &own
        };
        steps.values_mut().for_each(|r| leaving.result(r));
        leaving.map(&mut outputs);
        leaving.option(&mut error);
        Ok(RunReport {
            version: REPORT_VERSION,
            run_id: shared.options.run_id.clone(),
            workflow: workflow.name.clone(),
            status,
            inputs,
            steps,
            outputs,
            error,
            duration_ms: millis(started.elapsed()),
            llm: (shared.depth == 0)
                .then(|| shared.llm.totals.lock().ok().map(|t| t.clone()))
                .flatten()
                .filter(|t| t.calls > 0),
        })
    })
}

/// What a run (or a step of it, [`run_step`]) works with once it is set up.
struct Prepared {
    shared: Arc<Shared>,
    /// The secret values of this workflow alone (a sub-workflow's stay inside it).
    own: Redactor,
}

/// Sets a run up: its secrets, its `env`, what its templates see, its MCP servers. Errors are problems
/// found before any step starts.
async fn prepare(
    workflow: Arc<Workflow>,
    inputs: &Map<String, Json>,
    options: RunOptions,
    depth: u32,
    prefix: String,
    inherited: Inherited,
) -> Result<Prepared, RunError> {
    let Inherited {
        redactor: outer,
        llm,
        halt,
        work,
        mcp,
    } = inherited;
    let work =
        work.unwrap_or_else(|| Arc::new(tokio::sync::Semaphore::new(options.max_parallel.max(1))));
    let mut options = options;
    // The run stops itself through a token of its own, so that stopping (a record that could not be
    // made durable) does not look like the caller's cancel.
    let halt = halt.unwrap_or_else(|| Arc::new(Halt::under(&options.cancel)));
    options.cancel = halt.token.clone();
    let spec = &workflow.spec;
    let secrets = super::secrets::values(
        spec.secrets.iter().map(|s| s.value.as_str()),
        &options.env,
        spec_dir(&workflow),
    )
    .map_err(RunError)?;
    let providers: Vec<&crate::spec::ProviderDef> = spec
        .llm
        .as_ref()
        .map(|l| l.providers.values().collect())
        .unwrap_or_default();
    let own = Redactor::new(
        secrets
            .values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .chain(crate::llm::config::key_values(&providers, &options.env))
            .chain(crate::run::mcp::imported_secrets(&workflow, &options.env))
            .filter(|v| !outer.masks(v)),
    );
    let redactor = Arc::new(outer.with(&own));
    let run = json!({
        "id": options.run_id,
        "workflow": workflow.name,
        "workdir": options.workdir.display().to_string(),
        "started_at": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    });
    let mut env: Map<String, Json> = options
        .env
        .iter()
        .map(|(k, v)| (k.clone(), Json::String(v.clone())))
        .collect();
    let renderer = Arc::new(Renderer::new(options.helper.clone()));
    let mut tool_env = Vec::new();
    {
        let mut ctx = Map::new();
        ctx.insert("inputs".into(), Json::Object(inputs.clone()));
        ctx.insert("env".into(), Json::Object(env.clone()));
        ctx.insert("run".into(), run.clone());
        ctx.insert("secrets".into(), Json::Object(secrets.clone()));
        let ctx = context_value(ctx);
        for (name, template) in &spec.env {
            let value = renderer.text(&template.value, &ctx).await.map_err(|e| {
                RunError(format!(
                    "env `{}`: {}",
                    name.value,
                    redactor.text(&e.message)
                ))
            })?;
            tool_env.push((name.value.clone(), value.clone()));
            env.insert(name.value.clone(), Json::String(value));
        }
    }
    let secrets = json_value(&Json::Object(secrets));
    let withheld: Vec<String> = spec.secrets.iter().map(|s| s.value.clone()).collect();
    let mcp = mcp.unwrap_or_else(|| {
        Arc::new(mcp::McpRun::new(crate::tools::mcp::ServersOptions {
            withheld: withheld.clone(),
            network: workflow.network.clone(),
            redactor: redactor.clone(),
            on_spawn: {
                let journal = options.journal.clone();
                Arc::new(move |pgid| mcp::spawned(&journal, pgid))
            },
        }))
    });
    let shared = Arc::new(Shared {
        tool_context: ToolContext {
            workdir: options.workdir.clone(),
            protected: options.protected.clone(),
            env: tool_env,
            withheld,
            network: workflow.network.clone(),
            redactor: redactor.clone(),
            helper: options.helper.clone(),
        },
        workflow: workflow.clone(),
        composite: None,
        options,
        renderer,
        base: context::Base::new(
            vec![
                (
                    "inputs".to_owned(),
                    json_value(&Json::Object(inputs.clone())),
                ),
                ("env".to_owned(), json_value(&Json::Object(env))),
                ("run".to_owned(), json_value(&run)),
            ],
            &secrets,
        ),
        llm,
        redactor,
        secrets,
        depth,
        prefix,
        planned: false,
        llm_chosen: false,
        kept: Arc::default(),
        halt,
        work,
        nested: &Scheduler,
        mcp,
    });
    Ok(Prepared { shared, own })
}

/// Runs `work`; when `limit` passes first, stops the run (its steps are cancelled, their commands killed,
/// as by Ctrl-C, and the run fails with the reason) and lets `work` finish what stopping leaves.
async fn within<T>(
    limit: Option<std::time::Duration>,
    halt: &Halt,
    work: impl Future<Output = T>,
) -> T {
    let Some(limit) = limit else {
        return work.await;
    };
    tokio::pin!(work);
    let timer = tokio::time::sleep(limit);
    tokio::pin!(timer);
    tokio::select! {
        done = &mut work => return done,
        () = &mut timer => halt.stop(format!(
            "run timed out after {}",
            humantime::format_duration(limit)
        )),
    }
    work.await
}

/// Why a run whose journal failed ended: its state could not be saved, or another process took it over.
fn unsaved(error: &crate::store::StoreError) -> String {
    if error.taken_over {
        error.message.clone()
    } else {
        format!("the run's state could not be saved: {error}")
    }
}

/// Starts every step whose dependencies have finished, until all have ended or the run is cancelled.
/// Returns each step's view, in step order.
///
/// A step's task is spawned only when it may run (fewer than `max_parallel` running): a task waiting for
/// its turn would hold its whole future, a few kilobytes, and a wide graph has thousands ready at once.
async fn schedule(shared: &Arc<Shared>) -> Vec<Arc<StepView>> {
    let all_steps = shared.steps();
    let dependencies = shared.dependencies();
    let n = all_steps.len();
    let mut dependents = vec![Vec::new(); n];
    for (step, deps) in dependencies.iter().enumerate() {
        for &dep in deps {
            dependents[dep].push(step);
        }
    }
    let mut waiting: Vec<usize> = dependencies.iter().map(Vec::len).collect();
    let mut views: Vec<Option<Arc<StepView>>> = vec![None; n];
    let mut ready: VecDeque<usize> = (0..n).filter(|i| waiting[*i] == 0).collect();
    // Steps that will run, in the order they became ready, waiting for a free slot.
    let mut startable: VecDeque<usize> = VecDeque::new();
    let limit = shared.options.max_parallel.max(1);
    let mut running = JoinSet::new();
    let mut task_step = HashMap::new();
    let mut cancelled = false;

    let finish = |i: usize,
                  result: Arc<StepResult>,
                  views: &mut Vec<Option<Arc<StepView>>>,
                  waiting: &mut Vec<usize>,
                  ready: &mut VecDeque<usize>| {
        views[i] = Some(StepView::shared(result));
        for &d in &dependents[i] {
            waiting[d] -= 1;
            if waiting[d] == 0 {
                ready.push_back(d);
            }
        }
    };
    // The results of a step's dependencies, as its templates see them.
    let deps_of = |i: usize, views: &[Option<Arc<StepView>>]| -> Steps {
        dependencies[i]
            .iter()
            .filter_map(|d| Some((all_steps[*d].id.value.clone(), views[*d].as_ref()?.value())))
            .collect()
    };

    loop {
        while let Some(i) = ready.pop_front() {
            let stopped = cancelled || shared.options.cancel.is_cancelled();
            match readiness(shared, i, &views, stopped, || deps_of(i, &views)).await {
                Ready::Run => startable.push_back(i),
                Ready::Ended(result) => finish(i, result, &mut views, &mut waiting, &mut ready),
            }
        }
        while running.len() < limit
            && let Some(i) = startable.pop_front()
        {
            let steps = deps_of(i, &views);
            let shared = shared.clone();
            // Boxed, so that tokio's task cell (cache-line aligned) stays small and the step's future,
            // a few kilobytes, is an ordinary allocation: aligned blocks of that size, freed between the
            // results that outlive them, fragmented glibc's heap by about 1.6 KB per step.
            let handle = running.spawn(Box::pin(async move {
                lifecycle::execute(&shared, i, steps).await
            }));
            task_step.insert(handle.id(), i);
        }
        if running.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            () = shared.options.cancel.cancelled(), if !cancelled => {
                cancelled = true;
                // Dropping the step futures kills their process groups.
                running.abort_all();
                // Steps still waiting for a slot never start.
                for i in std::mem::take(&mut startable) {
                    let result = Arc::new(StepResult::ended(StepStatus::Cancelled, None));
                    finish(i, result, &mut views, &mut waiting, &mut ready);
                }
            }
            Some(joined) = running.join_next_with_id() => {
                let (i, result) = match joined {
                    Ok((id, result)) => (task_step[&id], result),
                    Err(err) => {
                        let i = task_step[&err.id()];
                        let status = if err.is_cancelled() { StepStatus::Cancelled } else { StepStatus::Failed };
                        (i, Arc::new(StepResult::ended(status, (!err.is_cancelled()).then(|| "the step's task failed".to_owned()))))
                    }
                };
                finish(i, result, &mut views, &mut waiting, &mut ready);
            }
        }
    }
    views
        .into_iter()
        .map(|v| v.unwrap_or_else(|| StepView::new(StepResult::ended(StepStatus::Cancelled, None))))
        .collect()
}

/// What becomes of a step whose dependencies have ended.
enum Ready {
    /// It runs.
    Run,
    /// It ended without running (reused from `prior`, skipped, failed by its `if`, cancelled, or
    /// waiting with a dependency for approval), with this result.
    Ended(Arc<StepResult>),
}

/// Decides whether step `i`, whose dependencies have ended (`views`), runs; records and reports a step
/// that ends without running. `stopped`: the run is being cancelled.
async fn readiness(
    shared: &Shared,
    i: usize,
    views: &[Option<Arc<StepView>>],
    stopped: bool,
    deps: impl FnOnce() -> Steps,
) -> Ready {
    let all_steps = shared.steps();
    let dependencies = shared.dependencies();
    let step = &all_steps[i];
    let upstream = |status: StepStatus| {
        dependencies[i].iter().find(|d| {
            views[**d]
                .as_ref()
                .is_some_and(|v| v.result().status == status)
        })
    };
    // A step whose dependency waits for approval waits too (nothing about it is recorded).
    if let Some(&d) = upstream(StepStatus::WaitingApproval) {
        return Ready::Ended(Arc::new(StepResult::ended(
            StepStatus::WaitingApproval,
            Some(format!("waiting for `{}`", all_steps[d].id.value)),
        )));
    }
    // The token, not only the flag: a step may finish (cancelled) before the loop sees the cancel.
    if stopped || shared.options.cancel.is_cancelled() || upstream(StepStatus::Cancelled).is_some()
    {
        return Ready::Ended(Arc::new(StepResult::ended(StepStatus::Cancelled, None)));
    }
    if let Some(prior) = shared.prior(&step.id.value) {
        shared.emit(RunEvent::StepReused {
            step: shared.label(&step.id.value),
            status: prior.status,
        });
        return Ready::Ended(Arc::new(prior.clone()));
    }
    match decide(shared, step, i, views, deps).await {
        Decision::Run => Ready::Run,
        Decision::Cancelled => {
            Ready::Ended(Arc::new(StepResult::ended(StepStatus::Cancelled, None)))
        }
        Decision::Skip(reason) => {
            shared.emit(RunEvent::StepSkipped {
                step: shared.label(&step.id.value),
                reason,
            });
            let result = Arc::new(StepResult::ended(StepStatus::Skipped, None));
            shared.record_result(&step.id.value, &result);
            Ready::Ended(result)
        }
        Decision::Fail(error) => {
            shared.emit(RunEvent::StepFinished {
                step: shared.label(&step.id.value),
                status: StepStatus::Failed,
                duration_ms: 0,
                error: Some(error.clone()),
            });
            let result = Arc::new(StepResult::ended(StepStatus::Failed, Some(error)));
            shared.record_result(&step.id.value, &result);
            Ready::Ended(result)
        }
    }
}

enum Decision {
    Run,
    Skip(String),
    Fail(String),
    /// The run was cancelled while the condition was being decided.
    Cancelled,
}

/// `if` decides when given (over the dependencies' results, `deps`); otherwise a step runs when all its
/// dependencies succeeded.
async fn decide(
    shared: &Shared,
    step: &Step,
    index: usize,
    views: &[Option<Arc<StepView>>],
    deps: impl FnOnce() -> Steps,
) -> Decision {
    if let Some(condition) = &step.condition {
        let ctx = shared.context(&deps(), false, &[]);
        // A condition that renders in the helper process waits for it; Ctrl-C does not.
        let decided = tokio::select! {
            decided = shared.renderer.condition(&condition.value, &ctx) => decided,
            () = shared.options.cancel.cancelled() => return Decision::Cancelled,
        };
        return match decided {
            Ok(true) => Decision::Run,
            Ok(false) => Decision::Skip("its `if` condition is false".to_owned()),
            Err(e) => Decision::Fail(format!("`if`: {e}")),
        };
    }
    let blocked = shared.dependencies()[index].iter().find(|d| {
        views[**d]
            .as_ref()
            .is_none_or(|v| v.result().status != StepStatus::Succeeded)
    });
    match blocked {
        None => Decision::Run,
        Some(&d) => {
            let status = views[d]
                .as_ref()
                .map_or("did not run", |v| v.result().status.as_str());
            Decision::Skip(format!("`{}` {status}", shared.steps()[d].id.value))
        }
    }
}

/// The `before_run` rules: `None` when the run may start.
async fn before_run(shared: &Shared) -> Option<Gate> {
    if shared.depth != 0 || shared.workflow.spec.rules.is_empty() {
        return None;
    }
    let call = gate::Call {
        on: Trigger::BeforeRun,
        label: "",
        tool: None,
        agent: None,
        chosen_by: ChosenBy::Spec,
        args: &Json::Null,
        sensitive: false,
        required: false,
    };
    match gate::gate(shared, call).await {
        Gate::Go { .. } => None,
        stopped => Some(stopped),
    }
}
