//! The scheduler: a step starts as soon as its dependencies have finished and fewer than `max_parallel`
//! steps are running; a `JoinSet` holds the running steps and a `CancellationToken` stops them all.

mod agent;
mod checkpoint;
mod gate;
mod planner;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use minijinja::Value;
use serde_json::{Map, Value as Json, json};
use tokio::task::JoinSet;

use super::LlmUsage;
use super::http::NetworkPolicy;
use super::redact::Redactor;
use super::render::{Renderer, StepView, context_value, json_value, to_text};
use super::tools::{self, ToolContext, ToolError, ToolOutput};
use super::{
    MAX_DEPTH, REPORT_VERSION, RunEvent, RunOptions, RunReport, RunStatus, StepResult, StepStatus,
};
use crate::spec::{Backoff, Body, ChosenBy, OnError, Retry, RetryOn, Step, ToolDef, Trigger};
use crate::store::{Entry, RunState};
use crate::workflow::Workflow;
use gate::Gate;

/// A problem that stops a run before any step starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RunError(pub String);

/// Everything the step tasks of one step list share.
struct Shared {
    /// The workflow whose tools, defaults and network policy apply.
    workflow: Arc<Workflow>,
    /// The composite tool whose steps run here, or `None` for the workflow's own steps.
    composite: Option<String>,
    options: RunOptions,
    renderer: Arc<Renderer>,
    /// `inputs`, `env` (the process environment overlaid with the spec's rendered `env`), `run` and, in a
    /// composite tool, `args` and each argument by name, converted once; every template context shares them.
    base: Vec<(String, Value)>,
    secrets: Value,
    tool_context: ToolContext,
    /// How many composite tools and sub-workflows this step list runs inside.
    depth: u32,
    /// Put before step ids in events: empty at the top, `outer/` inside a call made by step `outer`.
    prefix: String,
    /// Secret values to keep out of events, the journal and the report.
    redactor: Arc<Redactor>,
    /// The workflow's LLM providers and the run's LLM usage.
    llm: Arc<agent::LlmContext>,
    /// The steps were written by the LLM planner: their templates see neither `env` nor `secrets`.
    planned: bool,
    /// The steps run inside a call an LLM chose (a composite tool an agent called): rules see their calls
    /// as `chosen_by: llm`, though their templates are the spec's.
    llm_chosen: bool,
    /// Results of planned steps that a revised plan keeps, by step id.
    kept: Arc<HashMap<String, StepResult>>,
}

/// Results of finished steps as templates see them, by step id.
type Steps = BTreeMap<String, Value>;

impl Shared {
    fn emit(&self, mut event: RunEvent) {
        self.redactor.event(&mut event);
        if let Some(events) = &self.options.events {
            let _ = events.send(event.clone());
        }
        self.options.journal.record(Entry::Event(event));
    }

    /// Records the final result of a step or `foreach` item of the run's own steps (nested steps are
    /// part of their caller's attempt). Cancelled steps have no final result: a resume runs them.
    fn record_result(&self, name: &str, result: &StepResult) {
        if self.depth == 0
            && !matches!(
                result.status,
                StepStatus::Cancelled | StepStatus::WaitingApproval
            )
        {
            let mut result = Box::new(result.clone());
            self.redactor.result(&mut result);
            self.options.journal.record(Entry::StepFinished {
                step: name.to_owned(),
                result,
            });
        }
    }

    /// The result an earlier process recorded for the `foreach` item of step `id` whose fingerprint is
    /// `fingerprint`: at the same position, or, when the list changed order, at another.
    fn prior_item(&self, id: &str, position: usize, fingerprint: &str) -> Option<&StepResult> {
        let same = |r: &&StepResult| r.item.as_deref() == Some(fingerprint);
        self.prior(&format!("{id}[{position}]"))
            .filter(same)
            .or_else(|| {
                let prefix = format!("{id}[");
                (self.depth == 0)
                    .then(|| {
                        self.options
                            .prior
                            .iter()
                            .filter(|(name, _)| name.starts_with(&prefix))
                            .map(|(_, r)| r)
                            .find(same)
                    })
                    .flatten()
            })
    }

    /// The result an earlier process recorded for a step or item of the run's own steps, or, in a
    /// revised plan, the result of a step it keeps.
    fn prior(&self, name: &str) -> Option<&StepResult> {
        if self.depth == 0 {
            self.options.prior.get(name)
        } else {
            self.kept.get(name)
        }
    }

    /// The steps this scheduler runs.
    fn steps(&self) -> &[Step] {
        match &self.composite {
            None => &self.workflow.spec.steps,
            Some(tool) => self.workflow.spec.tools[tool.as_str()]
                .steps
                .as_ref()
                .map_or(&[], |s| &s.value),
        }
    }

    /// For each step, the steps it depends on.
    fn dependencies(&self) -> &[Vec<usize>] {
        match &self.composite {
            None => &self.workflow.dependencies,
            Some(tool) => self
                .workflow
                .composites
                .get(tool)
                .map_or(&[], |g| &g.dependencies),
        }
    }

    /// A step's name in events.
    fn label(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }
    /// The template context of a step: inputs, env, run, the results of the steps it depends on, secrets
    /// where allowed, and `extra` names (`item`, `index`, a tool's arguments).
    ///
    /// Planned steps were written by a model: their templates see neither `env` nor `secrets`.
    fn context(&self, steps: &Steps, with_secrets: bool, extra: &[(&str, Value)]) -> Value {
        self.context_of(steps, with_secrets && !self.planned, !self.planned, extra)
    }

    /// The context of a declared tool's own templates, which the spec's author wrote.
    fn tool_definition_context(&self, extra: &[(&str, Value)]) -> Value {
        self.context_of(&Steps::new(), true, true, extra)
    }

    fn context_of(
        &self,
        steps: &Steps,
        with_secrets: bool,
        with_env: bool,
        extra: &[(&str, Value)],
    ) -> Value {
        let mut ctx: BTreeMap<&str, Value> = self
            .base
            .iter()
            .filter(|(k, _)| with_env || k != "env")
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        ctx.insert("steps", Value::from(steps.clone()));
        if with_secrets {
            ctx.insert("secrets", self.secrets.clone());
        }
        for (name, value) in extra {
            ctx.insert(name, value.clone());
        }
        Value::from(ctx)
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
        0,
        String::new(),
        Arc::new(Redactor::default()),
        Arc::new(agent::LlmContext::default()),
    )
    .await
}

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs a workflow at a nesting depth: the run itself, or a sub-workflow called by step `prefix`.
fn run_workflow(
    workflow: Arc<Workflow>,
    inputs: Map<String, Json>,
    options: RunOptions,
    depth: u32,
    prefix: String,
    outer: Arc<Redactor>,
    llm: Arc<agent::LlmContext>,
) -> Boxed<'static, Result<RunReport, RunError>> {
    Box::pin(async move {
        let started = Instant::now();
        let spec = workflow.spec.clone();
        let secrets = super::secrets::values(
            spec.secrets.iter().map(|s| s.value.as_str()),
            &options.env,
            spec_dir(&workflow),
        )
        .map_err(RunError)?;
        let own = Redactor::new(
            secrets
                .values()
                .filter_map(|v| v.as_str().map(str::to_owned))
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
        let renderer = Arc::new(Renderer::default());
        let mut tool_env = Vec::new();
        {
            let mut ctx = Map::new();
            ctx.insert("inputs".into(), Json::Object(inputs.clone()));
            ctx.insert("env".into(), Json::Object(env.clone()));
            ctx.insert("run".into(), run.clone());
            ctx.insert("secrets".into(), Json::Object(secrets.clone()));
            let ctx = context_value(ctx);
            for (name, template) in &spec.env {
                let value = renderer.text(&template.value, &ctx).map_err(|e| {
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
        let shared = Arc::new(Shared {
            tool_context: ToolContext {
                workdir: options.workdir.clone(),
                env: tool_env,
                network: Arc::new(NetworkPolicy::new(
                    &spec
                        .network
                        .iter()
                        .flat_map(|n| n.allow.iter().map(|a| a.value.clone()))
                        .collect::<Vec<_>>(),
                )),
                redactor: redactor.clone(),
                helper: options.helper.clone(),
            },
            workflow: workflow.clone(),
            composite: None,
            options,
            renderer,
            base: vec![
                (
                    "inputs".to_owned(),
                    json_value(&Json::Object(inputs.clone())),
                ),
                ("env".to_owned(), json_value(&Json::Object(env))),
                ("run".to_owned(), json_value(&run)),
            ],
            llm,
            redactor,
            secrets: json_value(&Json::Object(secrets)),
            depth,
            prefix,
            planned: false,
            llm_chosen: false,
            kept: Arc::default(),
        });
        // `before_run` rules decide whether anything runs at all.
        let mut error = None;
        let views = match before_run(&shared).await {
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
        };

        let failed = first_failure(&spec.steps, |i| views[i].result().status).is_some();
        let waiting = waits(&views);
        let cancelled = shared.options.cancel.is_cancelled();
        let mut outputs = Map::new();
        if !cancelled {
            let ctx = shared.context(&named(&spec.steps, &views), false, &[]);
            for (name, template) in &spec.outputs {
                match shared.renderer.value(template, &ctx) {
                    Ok(value) => {
                        outputs.insert(name.value.clone(), value);
                    }
                    Err(e) if !failed => error = Some(format!("output `{}`: {e}", name.value)),
                    Err(_) => {}
                }
            }
        }
        let steps = results(&spec.steps, views);
        let mut status = if cancelled {
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
            if let Err(e) = journal.flush().wait().await {
                error = Some(format!("the run's state could not be saved: {e}"));
                if status == RunStatus::Succeeded {
                    status = RunStatus::Failed;
                }
            }
        }
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

/// The folder of a workflow's spec, where its `.env` file is (empty for the current directory).
fn spec_dir(workflow: &Workflow) -> &std::path::Path {
    workflow.path.parent().unwrap_or(std::path::Path::new(""))
}

/// The first step (by index, in written order) whose failure fails its list: failed or timed out
/// without `on_error: continue`. `status` gives the status of the step at an index.
fn first_failure(steps: &[Step], status: impl Fn(usize) -> StepStatus) -> Option<usize> {
    steps.iter().enumerate().position(|(i, step)| {
        let continues = step
            .on_error
            .as_ref()
            .is_some_and(|o| o.value == OnError::Continue);
        status(i).is_failure() && !continues
    })
}

/// The steps' views by id: `steps` in templates.
fn named(steps: &[Step], views: &[Arc<StepView>]) -> Steps {
    steps
        .iter()
        .zip(views)
        .map(|(step, view)| (step.id.value.clone(), view.value()))
        .collect()
}

/// The steps' results by id, in step order, for the report. Call it once no template context holds the
/// views, or the results are copied.
fn results(steps: &[Step], views: Vec<Arc<StepView>>) -> IndexMap<String, StepResult> {
    steps
        .iter()
        .zip(views)
        .map(|(step, view)| (step.id.value.clone(), view.into_result()))
        .collect()
}

/// Whether a step of the list waits for a person's approval.
fn waits(views: &[Arc<StepView>]) -> bool {
    views
        .iter()
        .any(|v| v.result().status == StepStatus::WaitingApproval)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
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
                  result: StepResult,
                  views: &mut Vec<Option<Arc<StepView>>>,
                  waiting: &mut Vec<usize>,
                  ready: &mut VecDeque<usize>| {
        views[i] = Some(StepView::new(result));
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
            let step = &all_steps[i];
            // The token, not only the flag: a step may finish (cancelled) before this loop sees the cancel.
            let upstream = |status: StepStatus| {
                dependencies[i].iter().find(|d| {
                    views[**d]
                        .as_ref()
                        .is_some_and(|v| v.result().status == status)
                })
            };
            // A step whose dependency waits for approval waits too (nothing about it is recorded).
            if let Some(&d) = upstream(StepStatus::WaitingApproval) {
                let result = StepResult::ended(
                    StepStatus::WaitingApproval,
                    Some(format!("waiting for `{}`", all_steps[d].id.value)),
                );
                finish(i, result, &mut views, &mut waiting, &mut ready);
                continue;
            }
            let upstream_cancelled = upstream(StepStatus::Cancelled).is_some();
            if cancelled || shared.options.cancel.is_cancelled() || upstream_cancelled {
                let result = StepResult::ended(StepStatus::Cancelled, None);
                finish(i, result, &mut views, &mut waiting, &mut ready);
                continue;
            }
            if let Some(prior) = shared.prior(&step.id.value) {
                shared.emit(RunEvent::StepReused {
                    step: shared.label(&step.id.value),
                    status: prior.status,
                });
                finish(i, prior.clone(), &mut views, &mut waiting, &mut ready);
                continue;
            }
            match decide(shared, step, i, &views, || deps_of(i, &views)) {
                Decision::Run => startable.push_back(i),
                Decision::Skip(reason) => {
                    shared.emit(RunEvent::StepSkipped {
                        step: shared.label(&step.id.value),
                        reason,
                    });
                    let result = StepResult::ended(StepStatus::Skipped, None);
                    shared.record_result(&step.id.value, &result);
                    finish(i, result, &mut views, &mut waiting, &mut ready);
                }
                Decision::Fail(error) => {
                    shared.emit(RunEvent::StepFinished {
                        step: shared.label(&step.id.value),
                        status: StepStatus::Failed,
                        duration_ms: 0,
                        error: Some(error.clone()),
                    });
                    let result = StepResult::ended(StepStatus::Failed, Some(error));
                    shared.record_result(&step.id.value, &result);
                    finish(i, result, &mut views, &mut waiting, &mut ready);
                }
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
            let handle = running.spawn(Box::pin(async move { execute(&shared, i, steps).await }));
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
                    let result = StepResult::ended(StepStatus::Cancelled, None);
                    finish(i, result, &mut views, &mut waiting, &mut ready);
                }
            }
            Some(joined) = running.join_next_with_id() => {
                let (i, result) = match joined {
                    Ok((id, result)) => (task_step[&id], result),
                    Err(err) => {
                        let i = task_step[&err.id()];
                        let status = if err.is_cancelled() { StepStatus::Cancelled } else { StepStatus::Failed };
                        (i, StepResult::ended(status, (!err.is_cancelled()).then(|| "the step's task failed".to_owned())))
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

enum Decision {
    Run,
    Skip(String),
    Fail(String),
}

/// `if` decides when given (over the dependencies' results, `deps`); otherwise a step runs when all its
/// dependencies succeeded.
fn decide(
    shared: &Shared,
    step: &Step,
    index: usize,
    views: &[Option<Arc<StepView>>],
    deps: impl FnOnce() -> Steps,
) -> Decision {
    if let Some(condition) = &step.condition {
        let ctx = shared.context(&deps(), false, &[]);
        return match shared.renderer.condition(&condition.value, &ctx) {
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

/// Runs one step: its body (per item for `foreach`) with retries and fallback, then its `outputs`.
async fn execute(shared: &Arc<Shared>, index: usize, steps: Steps) -> StepResult {
    let step = &shared.steps()[index];
    shared.emit(RunEvent::StepStarted {
        step: shared.label(&step.id.value),
    });
    let started = Instant::now();
    let mut result = match &step.foreach {
        Some(expr) => foreach(shared, index, &expr.value, &steps).await,
        None => attempt_all(shared, step, &steps, None, shared.label(&step.id.value)).await,
    };
    if result.status == StepStatus::Succeeded && !step.outputs.is_empty() {
        // The outputs read the step's result as it is before they are added to it.
        let own = StepView::new(result);
        let mut outputs = Map::new();
        let mut failed = None;
        {
            let mut steps = steps;
            steps.insert(step.id.value.clone(), own.value());
            let ctx = shared.context(&steps, false, &[]);
            for (name, template) in &step.outputs {
                match shared.renderer.value(template, &ctx) {
                    Ok(value) => {
                        outputs.insert(name.value.clone(), value);
                    }
                    Err(e) => {
                        failed = Some(format!("output `{}`: {e}", name.value));
                        break;
                    }
                }
            }
        }
        result = own.into_result();
        result.outputs = outputs;
        if let Some(error) = failed {
            result.status = StepStatus::Failed;
            result.error = Some(error);
        }
    }
    after_step(shared, step, &mut result);
    result.duration_ms = millis(started.elapsed());
    shared.record_result(&step.id.value, &result);
    shared.emit(RunEvent::StepFinished {
        step: shared.label(&step.id.value),
        status: result.status,
        duration_ms: result.duration_ms,
        error: result.error.clone(),
    });
    result
}

/// Runs the body once per item of the `foreach` list, at most `max_parallel` at a time, results in order.
async fn foreach(shared: &Arc<Shared>, index: usize, expr: &str, steps: &Steps) -> StepResult {
    let step = &shared.steps()[index];
    let ctx = shared.context(steps, false, &[]);
    let items = match shared.renderer.expression(expr, &ctx) {
        Ok(Json::Array(items)) => items,
        Ok(other) => {
            let kind = match other {
                Json::Null => "null",
                Json::Object(_) => "an object",
                Json::String(_) => "a string",
                _ => "a scalar",
            };
            return StepResult::ended(
                StepStatus::Failed,
                Some(format!("`foreach` must give a list, got {kind}")),
            );
        }
        Err(e) => return StepResult::ended(StepStatus::Failed, Some(format!("`foreach`: {e}"))),
    };
    let limit = step
        .max_parallel
        .as_ref()
        .map_or(shared.options.max_parallel, |m| m.value as usize)
        .max(1);
    let mut results: Vec<Option<StepResult>> = vec![None; items.len()];
    let mut items = items.into_iter().enumerate();
    // As for steps, an item's task is spawned only when it may run.
    let mut set = JoinSet::new();
    loop {
        while set.len() < limit
            && let Some((position, item)) = items.next()
        {
            let shared = shared.clone();
            let steps = steps.clone();
            set.spawn(Box::pin(async move {
                let step = &shared.steps()[index];
                let label = format!("{}[{position}]", shared.label(&step.id.value));
                // An item's recorded result is reused only for the same item: the list may have changed.
                let fingerprint = crate::store::spec_hash(&[(String::new(), item.to_string())]);
                if let Some(prior) = shared.prior_item(&step.id.value, position, &fingerprint) {
                    return (position, prior.clone());
                }
                let mut result =
                    attempt_all(&shared, step, &steps, Some((item, position)), label.clone()).await;
                result.item = Some(fingerprint);
                shared.record_result(&label, &result);
                (position, result)
            }));
        }
        match set.join_next().await {
            Some(Ok((position, result))) => results[position] = Some(result),
            Some(Err(_)) => {}
            None => break,
        }
    }
    let results: Vec<StepResult> = results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                StepResult::ended(StepStatus::Failed, Some("an item's task failed".into()))
            })
        })
        .collect();
    let failure = results
        .iter()
        .enumerate()
        .find(|(_, r)| r.status != StepStatus::Succeeded);
    let output = Json::Array(results.iter().map(|r| r.output.clone()).collect());
    StepResult {
        status: failure.map_or(StepStatus::Succeeded, |(_, r)| r.status),
        text: output.to_string(),
        output,
        outputs: Map::new(),
        error: failure
            .map(|(i, r)| format!("item {i}: {}", r.error.as_deref().unwrap_or("failed"))),
        attempts: results.iter().map(|r| r.attempts).sum(),
        exit_code: None,
        duration_ms: 0,
        fallback: results.iter().any(|r| r.fallback),
        steps: IndexMap::new(),
        llm: results.iter().filter_map(|r| r.llm.as_ref()).fold(
            None,
            |sum: Option<LlmUsage>, u| {
                let mut sum = sum.unwrap_or_default();
                sum.add(u);
                Some(sum)
            },
        ),
        item: None,
        plan: None,
    }
}

/// How one body attempt failed.
struct Failure {
    status: StepStatus,
    message: String,
    exit_code: Option<i32>,
    /// Deterministic failures (a template that does not render) are not retried.
    retryable: bool,
    /// The results of a composite tool's or sub-workflow's steps.
    steps: IndexMap<String, StepResult>,
    /// What an agent step's LLM calls used before it failed (boxed: failures travel in `Result`s).
    llm: Option<Box<LlmUsage>>,
}

impl Failure {
    /// A call that waits for a person's approval: the step pauses.
    fn waiting(message: String) -> Self {
        Failure {
            status: StepStatus::WaitingApproval,
            ..Failure::fixed(message)
        }
    }

    /// A deterministic failure: retrying cannot help.
    fn fixed(message: String) -> Self {
        Failure {
            status: StepStatus::Failed,
            message,
            exit_code: None,
            retryable: false,
            steps: IndexMap::new(),
            llm: None,
        }
    }
}

/// What a successful call gave: the tool's output and, for a composite tool or sub-workflow, its steps'
/// results.
struct Called {
    output: ToolOutput,
    steps: IndexMap<String, StepResult>,
    /// What an agent step's LLM calls used.
    llm: Option<LlmUsage>,
    /// For a planner step, the plan whose steps ran.
    plan: Option<Box<Json>>,
}

impl From<ToolOutput> for Called {
    fn from(output: ToolOutput) -> Self {
        Called {
            output,
            steps: IndexMap::new(),
            llm: None,
            plan: None,
        }
    }
}

/// Every attempt of the body, then the fallback if the last one failed. `label` names the step (or
/// `foreach` item) in events.
async fn attempt_all(
    shared: &Shared,
    step: &Step,
    steps: &Steps,
    item: Option<(Json, usize)>,
    label: String,
) -> StepResult {
    let extra = match &item {
        Some((item, index)) => vec![("item", json_value(item)), ("index", Value::from(*index))],
        None => Vec::new(),
    };
    let ctx = shared.context(steps, true, &extra);
    let defaults = shared.workflow.spec.defaults.as_ref();
    let retry = step
        .retry
        .as_deref()
        .or_else(|| defaults.and_then(|d| d.retry.as_ref()));
    if let Some(stopped) =
        before_step(shared, step, &label, &ctx, item.as_ref().map(|(i, _)| i)).await
    {
        return stopped;
    }
    let (outcome, attempts) = with_retries(shared, &label, step.body(), false, retry, &ctx).await;
    let outcome = match (outcome, &step.fallback) {
        // A cancelled run starts nothing new, fallbacks included.
        (Err(failure), Some(fallback))
            if !matches!(
                failure.status,
                StepStatus::Cancelled | StepStatus::WaitingApproval
            ) =>
        {
            let (fallback_outcome, _) =
                with_retries(shared, &label, fallback.body(), true, None, &ctx).await;
            fallback_outcome.map(|o| (o, true))
        }
        (outcome, _) => outcome.map(|o| (o, false)),
    };
    match outcome {
        Ok((
            Called {
                output,
                steps,
                llm,
                plan,
            },
            fallback,
        )) => StepResult {
            status: StepStatus::Succeeded,
            text: if output.text.is_empty() {
                to_text(&output.output)
            } else {
                output.text
            },
            output: output.output,
            outputs: Map::new(),
            error: None,
            attempts,
            exit_code: output.exit_code,
            duration_ms: 0,
            fallback,
            steps,
            llm,
            item: None,
            plan,
        },
        Err(failure) => StepResult {
            exit_code: failure.exit_code,
            attempts,
            steps: failure.steps,
            llm: failure.llm.map(|u| *u),
            ..StepResult::ended(failure.status, Some(failure.message))
        },
    }
}

async fn with_retries(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    fallback: bool,
    retry: Option<&Retry>,
    ctx: &Value,
) -> (Result<Called, Failure>, u32) {
    let attempts = retry.map_or(1, |r| r.attempts.value.max(1));
    let timeout = body
        .timeout
        .or_else(|| {
            shared
                .workflow
                .spec
                .defaults
                .as_ref()
                .and_then(|d| d.timeout.as_ref())
        })
        .and_then(|t| tools::duration(&t.value));
    // Before an attempt with side effects starts, its `running` record (and everything recorded before
    // it) is on disk; an attempt that is safe to repeat does not wait, since a resume may repeat it.
    let journaled = shared.depth == 0;
    let must_persist = journaled && !crate::resume::body_is_idempotent(&shared.workflow, body);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut open = None;
        if journaled {
            shared.options.journal.record(Entry::AttemptStarted {
                step: label.to_owned(),
                fallback,
            });
            open = Some(OpenAttempt { shared, label });
            if must_persist && let Err(e) = shared.options.journal.flush().wait().await {
                // Without its record, a crash could repeat the side effect unnoticed: stop the run.
                shared.options.cancel.cancel();
                let failure = Failure::fixed(format!(
                    "the attempt did not start because it could not be recorded: {e}"
                ));
                if let Some(open) = open.take() {
                    open.end(StepStatus::Failed, Some(failure.message.clone()));
                }
                return (Err(failure), attempt);
            }
        }
        let call = call_body(shared, label, body, ctx);
        let outcome = match timeout {
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(outcome) => outcome,
                Err(_) => Err(Failure {
                    status: StepStatus::TimedOut,
                    message: format!("timed out after {}", humantime::format_duration(limit)),
                    exit_code: None,
                    retryable: true,
                    steps: IndexMap::new(),
                    llm: None,
                }),
            },
            None => call.await,
        };
        if let Some(open) = open.take() {
            match &outcome {
                Ok(_) => open.end(StepStatus::Succeeded, None),
                Err(f) => open.end(f.status, Some(f.message.clone())),
            }
        }
        let failure = match outcome {
            Ok(output) => return (Ok(output), attempt),
            Err(failure) => failure,
        };
        let retry_on = retry.and_then(|r| r.on.as_ref());
        let wanted = match failure.status {
            StepStatus::TimedOut => {
                retry_on.is_none_or(|on| on.iter().any(|o| o.value == RetryOn::Timeout))
            }
            StepStatus::Cancelled => false,
            _ => retry_on.is_none_or(|on| on.iter().any(|o| o.value == RetryOn::Error)),
        };
        if attempt >= attempts || !failure.retryable || !wanted {
            return (Err(failure), attempt);
        }
        let delay = retry.map_or(Duration::ZERO, |r| backoff(r, attempt));
        shared.emit(RunEvent::StepRetried {
            step: label.to_owned(),
            attempt: attempt + 1,
            error: failure.message.clone(),
            delay_ms: millis(delay),
        });
        tokio::time::sleep(delay).await;
    }
}

/// An attempt recorded as started: it records how it ended, or, dropped before that (the run was
/// interrupted), that it was cancelled while running.
struct OpenAttempt<'a> {
    shared: &'a Shared,
    label: &'a str,
}

impl OpenAttempt<'_> {
    fn end(self, status: StepStatus, mut error: Option<String>) {
        self.shared.redactor.option(&mut error);
        self.shared.options.journal.record(Entry::AttemptEnded {
            step: self.label.to_owned(),
            status,
            error,
        });
        std::mem::forget(self);
    }
}

impl Drop for OpenAttempt<'_> {
    fn drop(&mut self) {
        self.shared.options.journal.record(Entry::AttemptEnded {
            step: self.label.to_owned(),
            status: StepStatus::Cancelled,
            error: Some("cancelled while running".to_owned()),
        });
    }
}

/// The delay before attempt `failed + 1`: fixed, or doubling from `delay` up to `max_delay`, with full
/// jitter unless `jitter: false`.
fn backoff(retry: &Retry, failed: u32) -> Duration {
    let base = retry
        .delay
        .as_ref()
        .and_then(|d| tools::duration(&d.value))
        .unwrap_or(Duration::from_secs(1));
    let max = retry
        .max_delay
        .as_ref()
        .and_then(|d| tools::duration(&d.value))
        .unwrap_or(Duration::from_secs(60));
    let delay = match retry
        .backoff
        .as_ref()
        .map_or(Backoff::Exponential, |b| b.value)
    {
        Backoff::Fixed => base,
        Backoff::Exponential => base
            .saturating_mul(2u32.saturating_pow(failed.saturating_sub(1)))
            .min(max),
    };
    if retry.jitter.unwrap_or(true) {
        delay.mul_f64(fastrand::f64())
    } else {
        delay
    }
}

/// Renders the body's arguments once and calls its tool or sub-workflow.
async fn call_body(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    ctx: &Value,
) -> Result<Called, Failure> {
    let args = match body.args {
        Some(args) => shared
            .renderer
            .value(args, ctx)
            .map_err(|e| Failure::fixed(e.to_string()))?,
        None => Json::Object(Map::new()),
    };
    if let Some(path) = body.workflow {
        return call_workflow(shared, label, &path.value, args).await;
    }
    let Some(tool) = body.tool else {
        // An agent: the goal, or the description of a step left unspecified.
        let (goal, plans) = match (body.goal, body.plan, body.description) {
            (Some(goal), _, _) => (goal, false),
            (None, Some(plan), _) => (plan, true),
            (None, None, Some(description)) => (description, unspecified_plans(shared)),
            (None, None, None) => {
                return Err(Failure::fixed("the step says nothing to do".to_owned()));
            }
        };
        let goal = shared.renderer.text(&goal.value, ctx).map_err(|e| {
            Failure::fixed(format!("`{}`: {e}", if plans { "plan" } else { "goal" }))
        })?;
        return if plans {
            planner::run(shared, label, body, goal, ctx).await
        } else {
            agent::run(shared, label, body, goal, ctx).await
        };
    };
    // A planned step is a call an LLM wrote: a sensitive one asks. The steps of a composite tool an LLM
    // called are the spec's: the tool asked as a whole (it is sensitive when they are), and rules see them
    // as chosen by the LLM.
    let sensitive =
        shared.planned && crate::tools::sensitive(&shared.workflow.spec, &tool.value, &args);
    let chosen_by = if shared.planned || shared.llm_chosen {
        ChosenBy::Llm
    } else {
        ChosenBy::Spec
    };
    if !shared.workflow.spec.rules.is_empty() || sensitive {
        let call = gate::Call {
            on: Trigger::BeforeTool,
            label,
            tool: Some(&tool.value),
            agent: None,
            chosen_by,
            args: &args,
            sensitive,
            required: false,
        };
        match gate::gate(shared, call).await {
            Gate::Go { .. } => {}
            Gate::Denied(reason, _) => return Err(Failure::fixed(reason)),
            Gate::Waiting(message) => return Err(Failure::waiting(message)),
        }
    }
    match shared.workflow.spec.tools.get(tool.value.as_str()) {
        None => tools::call(
            &tool.value,
            &args,
            &shared.tool_context,
            spawn_watch(shared, label).as_ref().map(|w| w as _),
        )
        .await
        .map(Called::from)
        .map_err(tool_failure),
        Some(def) => {
            let llm_chosen = shared.planned || shared.llm_chosen;
            call_declared(shared, label, &tool.value, def, args, llm_chosen).await
        }
    }
}

/// Whether steps left unspecified go to the planner rather than to an agent.
fn unspecified_plans(shared: &Shared) -> bool {
    shared
        .workflow
        .spec
        .defaults
        .as_ref()
        .and_then(|d| d.unspecified.as_ref())
        .is_some_and(|u| u.value == crate::spec::Unspecified::Plan)
}

fn tool_failure(e: ToolError) -> Failure {
    Failure {
        status: StepStatus::Failed,
        message: e.message,
        exit_code: e.exit_code,
        retryable: true,
        steps: IndexMap::new(),
        llm: None,
    }
}

/// Calls a tool the spec declares: a command, an HTTP request, a composite tool or a sub-workflow.
async fn call_declared(
    shared: &Shared,
    label: &str,
    name: &str,
    def: &ToolDef,
    args: Json,
    llm_chosen: bool,
) -> Result<Called, Failure> {
    if def.steps.is_some() {
        return call_composite(shared, label, name, args, llm_chosen).await;
    }
    if let Some(path) = &def.workflow {
        return call_workflow(shared, label, &path.value, args).await;
    }
    // A declared tool reads its arguments by name and as `args`.
    let mut extra: Vec<(&str, Value)> = match &args {
        Json::Object(values) => values
            .iter()
            .map(|(k, v)| (k.as_str(), json_value(v)))
            .collect(),
        _ => Vec::new(),
    };
    extra.push(("args", json_value(&args)));
    let tool_ctx = shared.tool_definition_context(&extra);
    let text = |t: &crate::spec::Template| {
        shared
            .renderer
            .text(&t.value, &tool_ctx)
            .map_err(|e| Failure::fixed(e.to_string()))
    };
    let (builtin, call_args) = if let Some(command) = &def.command {
        let argv = command
            .value
            .iter()
            .map(text)
            .collect::<Result<Vec<_>, _>>()?;
        let mut exec = json!({ "argv": argv });
        if let Some(cwd) = &def.cwd {
            exec["cwd"] = Json::String(text(cwd)?);
        }
        if let Some(stdin) = &def.stdin {
            exec["stdin"] = Json::String(text(stdin)?);
        }
        if !def.env.is_empty() {
            let env: Map<String, Json> = def
                .env
                .iter()
                .map(|(k, v)| Ok((k.value.clone(), Json::String(text(v)?))))
                .collect::<Result<_, Failure>>()?;
            exec["env"] = Json::Object(env);
        }
        if let Some(output) = &def.output {
            exec["output"] = serde_json::to_value(output.value).unwrap_or(Json::Null);
        }
        if let Some(codes) = &def.ok_exit_codes {
            exec["ok_exit_codes"] = json!(codes);
        }
        ("exec", exec)
    } else if let Some(http) = &def.http {
        let mut request = json!({ "url": text(&http.url)? });
        if let Some(method) = &http.method {
            request["method"] = serde_json::to_value(method.value).unwrap_or(Json::Null);
        }
        if !http.headers.is_empty() {
            let headers: Map<String, Json> = http
                .headers
                .iter()
                .map(|(k, v)| Ok((k.value.clone(), Json::String(text(v)?))))
                .collect::<Result<_, Failure>>()?;
            request["headers"] = Json::Object(headers);
        }
        if let Some(body) = &http.json {
            request["json"] = shared
                .renderer
                .value(body, &tool_ctx)
                .map_err(|e| Failure::fixed(e.to_string()))?;
        }
        if let Some(body) = &http.body {
            request["body"] = Json::String(text(body)?);
        }
        if let Some(timeout) = &def.timeout {
            request["timeout"] = Json::String(timeout.value.clone());
        }
        ("http", request)
    } else {
        return Err(Failure::fixed(format!("tool `{name}` cannot run yet")));
    };
    tools::call(
        builtin,
        &call_args,
        &shared.tool_context,
        spawn_watch(shared, label).as_ref().map(|w| w as _),
    )
    .await
    .map(Called::from)
    .map_err(tool_failure)
}

/// Records the process group of each command an attempt starts, so that a resume can find a command that
/// outlived a crashed archon. Commands inside composite tools and sub-workflows count for the run's own
/// step that called them (`outer` of `outer/inner`).
fn spawn_watch<'a>(shared: &'a Shared, label: &'a str) -> Option<impl Fn(u32) + Sync + 'a> {
    let step = label.split('/').next().unwrap_or(label);
    Some(move |pgid: u32| {
        shared.options.journal.record(Entry::ProcessStarted {
            step: step.to_owned(),
            pgid,
            started: crate::process::process_start_time(pgid),
        });
        // Committed at once, without waiting for it: the command is already running.
        drop(shared.options.journal.flush());
    })
}

/// One level deeper, or the failure that stops a runaway nesting.
fn deeper(shared: &Shared) -> Result<u32, Failure> {
    let depth = shared.depth + 1;
    if depth > MAX_DEPTH {
        return Err(Failure::fixed(format!(
            "composite tools and sub-workflows are nested more than {MAX_DEPTH} levels deep"
        )));
    }
    Ok(depth)
}

/// Runs a composite tool's steps with the same scheduler, then renders its `result` (the last step's
/// output when it has none).
fn call_composite<'a>(
    shared: &'a Shared,
    label: &'a str,
    name: &'a str,
    args: Json,
    llm_chosen: bool,
) -> Boxed<'a, Result<Called, Failure>> {
    Box::pin(async move {
        let depth = deeper(shared)?;
        let mut base = shared.base.clone();
        if let Json::Object(values) = &args {
            base.extend(values.iter().map(|(k, v)| (k.clone(), json_value(v))));
        }
        base.push(("args".to_owned(), json_value(&args)));
        let inner = Arc::new(Shared {
            workflow: shared.workflow.clone(),
            composite: Some(name.to_owned()),
            options: shared.options.clone(),
            renderer: shared.renderer.clone(),
            base,
            secrets: shared.secrets.clone(),
            tool_context: shared.tool_context.clone(),
            depth,
            prefix: format!("{label}/"),
            redactor: shared.redactor.clone(),
            llm: shared.llm.clone(),
            planned: false,
            llm_chosen,
            kept: Arc::default(),
        });
        let views = schedule(&inner).await;
        let steps = inner.steps();
        let cancelled = shared.options.cancel.is_cancelled();
        let failed = first_failure(steps, |i| views[i].result().status);
        let def = &shared.workflow.spec.tools[name];
        // Rendered while the views are at hand; the results are taken out of them below.
        let rendered = match &def.result {
            Some(template) if !cancelled && failed.is_none() => {
                // The result becomes output that prompts and reports can see: no secrets in it.
                let ctx = inner.context(&named(steps, &views), false, &[]);
                Some(inner.renderer.value(template, &ctx))
            }
            _ => None,
        };
        let waits = waits(&views);
        let results = results(steps, views);
        if waits && !cancelled {
            return Err(Failure {
                steps: results,
                ..Failure::waiting(format!("tool `{name}` waits for approval"))
            });
        }
        if cancelled {
            return Err(Failure {
                status: StepStatus::Cancelled,
                message: "cancelled".to_owned(),
                exit_code: None,
                retryable: false,
                steps: results,
                llm: None,
            });
        }
        if let Some(failed) = failed {
            let (id, result) = results.get_index(failed).expect("a step of the list");
            return Err(Failure {
                status: StepStatus::Failed,
                message: format!(
                    "tool `{name}`: step `{id}` {}: {}",
                    result.status.as_str(),
                    result.error.as_deref().unwrap_or("failed")
                ),
                exit_code: result.exit_code,
                retryable: true,
                steps: results,
                llm: None,
            });
        }
        let output = match rendered {
            Some(Ok(value)) => value,
            Some(Err(e)) => {
                return Err(Failure {
                    steps: results,
                    ..Failure::fixed(format!("tool `{name}`: `result`: {e}"))
                });
            }
            None => results.last().map_or(Json::Null, |(_, r)| r.output.clone()),
        };
        Ok(Called {
            output: ToolOutput {
                text: to_text(&output),
                output,
                exit_code: None,
            },
            steps: results,
            llm: None,
            plan: None,
        })
    })
}

/// Runs a sub-workflow with `args` as its inputs; its output is the sub-workflow's `outputs`.
fn call_workflow<'a>(
    shared: &'a Shared,
    label: &'a str,
    path: &'a str,
    args: Json,
) -> Boxed<'a, Result<Called, Failure>> {
    Box::pin(async move {
        let depth = deeper(shared)?;
        let Some(workflow) = shared.workflow.subworkflows.get(path) else {
            return Err(Failure::fixed(format!(
                "sub-workflow `{path}` was not loaded"
            )));
        };
        let given = match args {
            Json::Object(values) => values,
            Json::Null => Map::new(),
            _ => {
                return Err(Failure::fixed(format!(
                    "sub-workflow `{path}` takes an object of inputs"
                )));
            }
        };
        let inputs = crate::inputs::resolve(&workflow.spec, given, &[]).map_err(|problems| {
            let list: Vec<String> = problems.iter().map(|p| p.message.clone()).collect();
            Failure::fixed(format!("sub-workflow `{path}`: {}", list.join("; ")))
        })?;
        let report = run_workflow(
            workflow.clone(),
            inputs,
            shared.options.clone(),
            depth,
            format!("{label}/"),
            shared.redactor.clone(),
            Arc::new(shared.llm.nested()),
        )
        .await
        .map_err(|e| Failure::fixed(format!("sub-workflow `{path}`: {e}")))?;
        match report.status {
            RunStatus::Succeeded => {
                let output = Json::Object(report.outputs);
                Ok(Called {
                    output: ToolOutput {
                        text: to_text(&output),
                        output,
                        exit_code: None,
                    },
                    steps: report.steps,
                    llm: None,
                    plan: None,
                })
            }
            RunStatus::Cancelled => Err(Failure {
                status: StepStatus::Cancelled,
                message: "cancelled".to_owned(),
                exit_code: None,
                retryable: false,
                steps: report.steps,
                llm: None,
            }),
            RunStatus::WaitingApproval => Err(Failure {
                status: StepStatus::WaitingApproval,
                message: format!("sub-workflow `{path}` waits for approval"),
                exit_code: None,
                retryable: false,
                steps: report.steps,
                llm: None,
            }),
            RunStatus::Failed => {
                let reason = match first_failure(&workflow.spec.steps, |i| report.steps[i].status) {
                    Some(i) => {
                        let (id, result) = report.steps.get_index(i).expect("a step of the list");
                        format!(
                            "step `{id}` {}: {}",
                            result.status.as_str(),
                            result.error.as_deref().unwrap_or("failed")
                        )
                    }
                    None => report.error.clone().unwrap_or_else(|| "failed".to_owned()),
                };
                Err(Failure {
                    status: StepStatus::Failed,
                    message: format!("sub-workflow `{path}`: {reason}"),
                    exit_code: None,
                    retryable: true,
                    steps: report.steps,
                    llm: None,
                })
            }
        }
    })
}

/// The agent role an LLM step plays, as rules match it: its own `agent`, else `defaults.agent`; none for
/// other steps.
fn agent_of<'a>(shared: &'a Shared, body: Body<'a>) -> Option<&'a str> {
    if body.tool.is_some() || body.workflow.is_some() {
        return None;
    }
    shared.workflow.spec.agent_name(body)
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

/// The `before_step` rules and `approval: required`: the result that stops the step, if any. What is asked
/// about is the step's call as it will be made: its rendered arguments and its `foreach` item.
async fn before_step(
    shared: &Shared,
    step: &Step,
    label: &str,
    ctx: &Value,
    item: Option<&Json>,
) -> Option<StepResult> {
    let required = step
        .approval
        .as_ref()
        .is_some_and(|a| a.value == crate::spec::Approval::Required);
    if !required && shared.workflow.spec.rules.is_empty() {
        return None;
    }
    let body = step.body();
    let mut call = Map::new();
    if let Some(args) = body.args {
        match shared.renderer.value(args, ctx) {
            Ok(args) => {
                call.insert("with".to_owned(), args);
            }
            Err(e) => return Some(StepResult::ended(StepStatus::Failed, Some(e.to_string()))),
        }
    }
    if let Some(goal) = body.goal.or(body.plan).or(body.description) {
        call.insert("goal".to_owned(), Json::String(goal.value.clone()));
    }
    if let Some(item) = item {
        call.insert("item".to_owned(), item.clone());
    }
    let args = Json::Object(call);
    let call = gate::Call {
        on: Trigger::BeforeStep,
        label,
        tool: step.tool.as_ref().map(|t| t.value.as_str()),
        agent: agent_of(shared, step.body()),
        chosen_by: if shared.planned || shared.llm_chosen {
            ChosenBy::Llm
        } else {
            ChosenBy::Spec
        },
        args: &args,
        sensitive: false,
        required,
    };
    match gate::gate(shared, call).await {
        Gate::Go { .. } => None,
        Gate::Denied(reason, _) => Some(StepResult::ended(StepStatus::Failed, Some(reason))),
        Gate::Waiting(message) => Some(StepResult::ended(
            StepStatus::WaitingApproval,
            Some(message),
        )),
    }
}

/// The `after_step` rules (a `deny` rejects the step's result) and, for a failed step, the `on_error`
/// rules (`log`).
fn after_step(shared: &Shared, step: &Step, result: &mut StepResult) {
    let rules = &shared.workflow.spec.rules;
    if rules.is_empty() || result.status == StepStatus::WaitingApproval {
        return;
    }
    let label = shared.label(&step.id.value);
    let run = json!({ "id": shared.options.run_id, "workflow": shared.workflow.name });
    for on in [Trigger::AfterStep, Trigger::OnError] {
        // `on_error` sees the step as `after_step` left it.
        if on == Trigger::OnError && !result.status.is_failure() {
            continue;
        }
        let event = super::rules::Event {
            on,
            step: Some(&label),
            tool: step.tool.as_ref().map(|t| t.value.as_str()),
            agent: agent_of(shared, step.body()),
            chosen_by: if shared.planned || shared.llm_chosen {
                ChosenBy::Llm
            } else {
                ChosenBy::Spec
            },
            args: &result.output,
            run: &run,
        };
        let verdict = super::rules::evaluate(rules, &shared.renderer, &event);
        for rule in &verdict.logged {
            shared.emit(RunEvent::RuleMatched {
                step: Some(label.clone()),
                tool: event.tool.map(str::to_owned),
                on,
                rule: rule.clone(),
                action: crate::spec::Action::Log,
            });
        }
        if on == Trigger::AfterStep
            && verdict.decision == Some(crate::spec::Action::Deny)
            && result.status == StepStatus::Succeeded
        {
            let rule = verdict.rule.unwrap_or_default();
            shared.emit(RunEvent::RuleMatched {
                step: Some(label.clone()),
                tool: event.tool.map(str::to_owned),
                on,
                rule: rule.clone(),
                action: crate::spec::Action::Deny,
            });
            result.status = StepStatus::Failed;
            result.error = Some(match verdict.reason {
                Some(reason) => format!("its result was rejected by rule `{rule}`: {reason}"),
                None => format!("its result was rejected by rule `{rule}`"),
            });
        }
    }
}
