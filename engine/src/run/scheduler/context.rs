//! What the step tasks of one step list share (`Shared`), how an attempt fails or succeeds (`Failure`,
//! `Called`), and the hooks (`Nested`) through which the children of the scheduler reach back into it
//! without importing it: every module under `scheduler/` imports this one, and this one imports none of
//! them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use indexmap::IndexMap;
use minijinja::Value;
use serde_json::{Map, Value as Json};
use tokio_util::sync::CancellationToken;

use crate::llm::config::Configured;
use crate::report::{LlmUsage, RunEvent, RunReport, StepResult, StepStatus};
use crate::run::options::{MAX_DEPTH, RunOptions};
use crate::run::redact::Redactor;
use crate::run::render::{Renderer, StepView};
use crate::spec::{Body, OnError, Step};
use crate::store::Entry;
use crate::tools::{ErrorClass, ToolContext, ToolError, ToolOutput};
use crate::workflow::Workflow;

/// The parts of the scheduler its children call back into: a composite tool's or planner's steps are
/// scheduled one level down, an agent's tool call may be a declared tool, a sub-workflow is a nested run.
/// Implemented once, by the DAG loop (`scheduler/mod.rs`); passed down so that no child imports it.
pub(super) trait Nested: Send + Sync {
    /// Schedules the steps of `shared` and returns each step's view, in step order.
    fn schedule<'a>(&'a self, shared: &'a Arc<Shared>) -> Boxed<'a, Vec<Arc<StepView>>>;
    /// Calls a tool of the workflow's registry (`llm_chosen`: an agent chose it).
    fn tool<'a>(
        &'a self,
        shared: &'a Shared,
        label: &'a str,
        name: &'a str,
        args: Json,
        llm_chosen: bool,
    ) -> Boxed<'a, Result<Called, Failure>>;
    /// Runs a sub-workflow as a nested run at `depth`, its steps named after `prefix`.
    fn workflow(
        &self,
        workflow: Arc<Workflow>,
        inputs: Map<String, Json>,
        parent: &Shared,
        depth: u32,
        prefix: String,
    ) -> Boxed<'static, Result<RunReport, RunError>>;
}

/// The providers of a run, built when first used, and what its LLM calls used in total.
#[derive(Debug, Default)]
pub(crate) struct LlmContext {
    pub providers: Mutex<HashMap<String, Arc<Configured>>>,
    pub totals: Arc<Mutex<LlmUsage>>,
    /// Plan revisions made in the run so far (limited by `defaults.max_replans`).
    pub replans: Arc<AtomicU32>,
    /// Providers that refused native tool calling: agents in `auto` mode use text mode with them.
    text_only: Mutex<HashSet<String>>,
    /// What the model calls of each LLM step's attempt under way spent, by step label.
    meters: Arc<Mutex<HashMap<String, Meter>>>,
    /// The delegates at work, by label: the step whose model time their calls spend.
    delegated: Arc<Mutex<HashMap<String, String>>>,
}

/// What the model calls of one attempt of an LLM step spent: their time, against `limit` (the step's
/// model time when nothing else bounds the attempt), and the step's usage, which a timed-out attempt
/// reports.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meter {
    pub limit: Option<Duration>,
    pub spent: Duration,
    pub usage: LlmUsage,
}

impl LlmContext {
    /// Whether provider `name` refused native tool calling earlier in the run.
    pub fn refuses_tools(&self, name: &str) -> bool {
        self.text_only.lock().is_ok_and(|t| t.contains(name))
    }

    pub fn mark_refuses_tools(&self, name: &str) {
        if let Ok(mut text_only) = self.text_only.lock() {
            text_only.insert(name.to_owned());
        }
    }

    /// A context for a sub-workflow: its own providers, the run's totals.
    pub fn nested(&self) -> LlmContext {
        LlmContext {
            providers: Mutex::new(HashMap::new()),
            totals: self.totals.clone(),
            replans: self.replans.clone(),
            text_only: Mutex::default(),
            meters: self.meters.clone(),
            delegated: self.delegated.clone(),
        }
    }

    /// The model calls of delegate `child` spend the model time of step `step` until [`Self::undelegate`].
    pub fn delegate(&self, child: &str, step: &str) {
        if let Ok(mut delegated) = self.delegated.lock() {
            delegated.insert(child.to_owned(), step.to_owned());
        }
    }

    pub fn undelegate(&self, child: &str) {
        if let Ok(mut delegated) = self.delegated.lock() {
            delegated.remove(child);
        }
    }

    /// The step whose meter `label`'s model calls use, and whether `label` is a delegate's.
    fn metered(&self, label: &str) -> (String, bool) {
        match self
            .delegated
            .lock()
            .ok()
            .and_then(|d| d.get(label).cloned())
        {
            Some(step) => (step, true),
            None => (label.to_owned(), false),
        }
    }

    /// An attempt of LLM step `label` starts, its model calls limited to `limit` in all.
    pub fn begin_step(&self, label: &str, limit: Option<Duration>) {
        if let Ok(mut meters) = self.meters.lock() {
            meters.insert(
                label.to_owned(),
                Meter {
                    limit,
                    ..Meter::default()
                },
            );
        }
    }

    /// The attempt of step `label` ended: what it spent.
    pub fn end_step(&self, label: &str) -> Option<Meter> {
        self.meters.lock().ok()?.remove(label)
    }

    /// The model-time limit of step `label`'s attempt and the time its calls took so far.
    pub fn model_time(&self, label: &str) -> (Option<Duration>, Duration) {
        let (label, _) = self.metered(label);
        self.meters
            .lock()
            .ok()
            .and_then(|m| m.get(&label).map(|m| (m.limit, m.spent)))
            .unwrap_or_default()
    }

    /// Step `label`'s calls took `took` more, and its usage is now `usage` (a delegate's time counts for
    /// its step; its usage joins the step's when it returns).
    pub fn spend(&self, label: &str, took: Duration, usage: &LlmUsage) {
        let (label, delegate) = self.metered(label);
        if let Ok(mut meters) = self.meters.lock()
            && let Some(meter) = meters.get_mut(&label)
        {
            meter.spent += took;
            if !delegate {
                meter.usage.clone_from(usage);
            }
        }
    }

    /// Adds `more` to step `label`'s usage (a request counted after the step lost its own).
    pub fn add_to_step(&self, label: &str, more: &LlmUsage) {
        if let Ok(mut meters) = self.meters.lock()
            && let Some(meter) = meters.get_mut(label)
        {
            meter.usage.add(more);
        }
    }
}

/// Why the run was stopped from inside (a record that had to be durable before a side effect was not):
/// the first reason wins, and cancelling `token` stops every step of the run, nested ones included.
#[derive(Debug, Default)]
pub(super) struct Halt {
    pub token: CancellationToken,
    pub reason: OnceLock<String>,
}

impl Halt {
    /// A halt whose token is cancelled with the caller's, but whose own cancellation does not reach the
    /// caller.
    pub fn under(outer: &CancellationToken) -> Self {
        Halt {
            token: outer.child_token(),
            reason: OnceLock::new(),
        }
    }

    /// Stops the run for `reason` (kept only when no reason came first).
    pub fn stop(&self, reason: String) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }
}

/// A problem that stops a run before any step starts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RunError(pub String);

/// Everything the step tasks of one step list share.
#[derive(Clone)]
pub(super) struct Shared {
    /// The workflow whose tools, defaults and network policy apply.
    pub workflow: Arc<Workflow>,
    /// The composite tool whose steps run here, or `None` for the workflow's own steps.
    pub composite: Option<String>,
    pub options: RunOptions,
    pub renderer: Arc<Renderer>,
    /// `inputs`, `env` (the process environment overlaid with the spec's rendered `env`), `run` and, in a
    /// composite tool, `args` and each argument by name, converted once; every template context shares them.
    pub base: Base,
    pub secrets: Value,
    pub tool_context: ToolContext,
    /// How many composite tools and sub-workflows this step list runs inside.
    pub depth: u32,
    /// Put before step ids in events: empty at the top, `outer/` inside a call made by step `outer`.
    pub prefix: String,
    /// Secret values to keep out of events, the journal and the report.
    pub redactor: Arc<Redactor>,
    /// The workflow's LLM providers and the run's LLM usage.
    pub llm: Arc<LlmContext>,
    /// The steps were written by the LLM planner: their templates see neither `env` nor `secrets`.
    pub planned: bool,
    /// The steps run inside a call an LLM chose (a composite tool an agent called): rules see their calls
    /// as `chosen_by: llm`, though their templates are the spec's.
    pub llm_chosen: bool,
    /// Results of planned steps that a revised plan keeps, by step id.
    pub kept: Arc<HashMap<String, StepResult>>,
    /// Stops the run from inside, with a reason.
    pub halt: Arc<Halt>,
    /// One limit for the whole run, nested steps, composite tools, sub-workflows and plans included: at
    /// most `max_parallel` commands and LLM calls run at once. Held only around those calls, never while
    /// a step waits for steps one level down, so it cannot deadlock.
    pub work: Arc<tokio::sync::Semaphore>,
    /// The scheduler, for calls that schedule steps one level down.
    pub nested: &'static dyn Nested,
    /// The run's MCP servers, shared with its sub-workflows.
    pub mcp: Arc<super::mcp::McpRun>,
}

/// The names every template context of a step list shares, and about how much data they and the secrets
/// hold (`render::weight`), worked out once for every context made from them.
#[derive(Clone)]
pub(super) struct Base {
    names: Vec<(String, Value)>,
    weight: usize,
}

impl Base {
    pub(super) fn new(names: Vec<(String, Value)>, secrets: &Value) -> Base {
        let weight = (names.iter().map(|(_, value)| value))
            .chain([secrets])
            .map(crate::run::render::weight)
            .fold(0, usize::saturating_add);
        Base { names, weight }
    }

    pub(super) fn names(&self) -> &[(String, Value)] {
        &self.names
    }
}

/// Results of finished steps as templates see them, by step id.
pub(super) type Steps = BTreeMap<String, Value>;

impl Shared {
    pub(super) fn emit(&self, event: RunEvent) {
        self.emit_at(event, crate::store::now_ms());
    }

    /// Emits `event` as having happened at `at_ms` (milliseconds since the epoch): a model call is
    /// stamped when its request started, and recorded when it ended.
    pub(super) fn emit_at(&self, mut event: RunEvent, at_ms: u64) {
        self.redactor.event(&mut event);
        self.one_line_error(&mut event);
        if let Some(events) = &self.options.events {
            let _ = events.send(event.clone());
        }
        self.options.journal.record(Entry::Event { event, at_ms });
    }

    /// A step's error of several lines (a command's last lines of stderr, say) is cut to its first in the
    /// events that progress displays and the event log show, with a note of where the whole text is: the
    /// attempt's record and the step's result keep it, and `archon logs RUN STEP` prints it.
    fn one_line_error(&self, event: &mut RunEvent) {
        let (step, error) = match event {
            RunEvent::StepFinished {
                step,
                error: Some(error),
                ..
            }
            | RunEvent::StepRetried { step, error, .. } => (step, error),
            _ => return,
        };
        if let Some(line) = crate::text::error_line(error, &self.options.run_id, step) {
            *error = line;
        }
    }

    /// The context of a step list one level down (a composite tool's or a plan's steps), named after
    /// `label`: the same run, workflow and template values until the caller changes them.
    pub(super) fn child(&self, depth: u32, label: &str) -> Shared {
        Shared {
            workflow: self.workflow.clone(),
            composite: None,
            options: self.options.clone(),
            renderer: self.renderer.clone(),
            base: self.base.clone(),
            secrets: self.secrets.clone(),
            tool_context: self.tool_context.clone(),
            depth,
            prefix: format!("{label}/"),
            redactor: self.redactor.clone(),
            llm: self.llm.clone(),
            planned: self.planned,
            llm_chosen: self.llm_chosen,
            kept: Arc::default(),
            halt: self.halt.clone(),
            work: self.work.clone(),
            nested: self.nested,
            mcp: self.mcp.clone(),
        }
    }

    /// Whether a call an LLM chose asks a person unless a rule allows it: its tool is sensitive, or it is a
    /// request (a tool that reaches hosts) to a host the spec does not name, whose URL could carry data
    /// out.
    pub(super) fn llm_call_asks(&self, tool: &str, args: &Json) -> bool {
        self.workflow.tools.sensitive(tool, Some(args)) || self.unnamed_host(tool, args).is_some()
    }

    /// The host of a request to a host the spec does not name, for a tool that reaches hosts.
    pub(super) fn unnamed_host(&self, tool: &str, args: &Json) -> Option<String> {
        let entry = self.workflow.tools.get(tool)?;
        if entry.safety != crate::tools::SafetyRule::ByMethod {
            return None;
        }
        self.workflow.unnamed_host(args)
    }

    /// One level deeper, or the failure that stops a runaway nesting.
    pub(super) fn deeper(&self) -> Result<u32, Failure> {
        let depth = self.depth + 1;
        if depth > MAX_DEPTH {
            return Err(Failure::fixed(format!(
                "composite tools and sub-workflows are nested more than {MAX_DEPTH} levels deep"
            )));
        }
        Ok(depth)
    }

    /// The agent role an LLM step plays, as rules match it: its own `agent`, else `defaults.agent`; none
    /// for other steps.
    pub(super) fn agent_of<'a>(&'a self, body: Body<'a>) -> Option<&'a str> {
        if body.tool.is_some() || body.workflow.is_some() {
            return None;
        }
        self.workflow.spec.agent_name(body)
    }

    /// Records the final result of a step or `foreach` item of the run's own steps (nested steps are
    /// part of their caller's attempt). Cancelled steps have no final result: a resume runs them.
    pub(super) fn record_result(&self, name: &str, result: &Arc<StepResult>) {
        if self.depth == 0
            && !matches!(
                result.status,
                StepStatus::Cancelled | StepStatus::WaitingApproval
            )
        {
            // The run and its record share the result, unless secrets must be masked in the record.
            let result = if self.redactor.is_empty() {
                result.clone()
            } else {
                let mut masked = StepResult::clone(result);
                self.redactor.result(&mut masked);
                Arc::new(masked)
            };
            self.options.journal.record(Entry::StepFinished {
                step: name.to_owned(),
                result,
            });
        }
    }

    /// Waits until the result just recorded for `step` (or one of its items) is durable, when the step is
    /// not safe to repeat: a crash while later steps run must not leave a finished step in doubt.
    pub(super) async fn result_durable(&self, step: &Step) {
        let repeatable = || {
            crate::resume::body_is_idempotent(&self.workflow, step.body())
                && step
                    .fallback
                    .as_ref()
                    .is_none_or(|f| crate::resume::body_is_idempotent(&self.workflow, f.body()))
        };
        if self.depth == 0 && !repeatable() {
            // A store that fails here fails the next step's own write before its effect.
            let _ = self.options.journal.flush().wait().await;
        }
    }

    /// The result an earlier process recorded for the `foreach` item of step `id` whose fingerprint is
    /// `fingerprint`: at the same position, or, when the list changed order, at another.
    pub(super) fn prior_item(
        &self,
        id: &str,
        position: usize,
        fingerprint: &str,
    ) -> Option<&StepResult> {
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
    pub(super) fn prior(&self, name: &str) -> Option<&StepResult> {
        if self.depth == 0 {
            self.options.prior.get(name)
        } else {
            self.kept.get(name)
        }
    }

    /// The steps this scheduler runs.
    pub(super) fn steps(&self) -> &[Step] {
        match &self.composite {
            None => &self.workflow.spec.steps,
            Some(tool) => self.workflow.spec.tools[tool.as_str()]
                .steps
                .as_ref()
                .map_or(&[], |s| &s.value),
        }
    }

    /// For each step, the steps it depends on.
    pub(super) fn dependencies(&self) -> &[Vec<usize>] {
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
    pub(super) fn label(&self, id: &str) -> String {
        format!("{}{id}", self.prefix)
    }

    /// Who chose the calls of these steps, as rules see it: the LLM for planned steps and for the steps
    /// of a composite tool an agent called, the spec otherwise.
    pub(super) fn chosen_by(&self) -> crate::spec::ChosenBy {
        if self.planned || self.llm_chosen {
            crate::spec::ChosenBy::Llm
        } else {
            crate::spec::ChosenBy::Spec
        }
    }
    /// The template context of a step: inputs, env, run, the results of the steps it depends on, secrets
    /// where allowed, and `extra` names (`item`, `index`, a tool's arguments).
    ///
    /// Planned steps were written by a model: their templates see neither `env` nor `secrets`.
    pub(super) fn context(
        &self,
        steps: &Steps,
        with_secrets: bool,
        extra: &[(&str, Value)],
    ) -> Value {
        self.context_of(steps, with_secrets && !self.planned, !self.planned, extra)
    }

    /// The context of a declared tool's own templates, which the spec's author wrote.
    /// What the memory `namespace` template reads: `inputs`, `env` and `run`, no secrets.
    pub(super) fn memory_context(&self) -> Value {
        self.context_of(&Steps::new(), false, true, &[])
    }

    pub(super) fn tool_definition_context(&self, extra: &[(&str, Value)]) -> Value {
        self.context_of(&Steps::new(), true, true, extra)
    }

    fn context_of(
        &self,
        steps: &Steps,
        with_secrets: bool,
        with_env: bool,
        extra: &[(&str, Value)],
    ) -> Value {
        let mut ctx: BTreeMap<&str, Value> = (self.base.names.iter())
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
        // What the base and the secrets hold was weighed once; the steps' views keep their own weights.
        let weight = (steps.values().chain(extra.iter().map(|(_, value)| value)))
            .map(crate::run::render::weight)
            .fold(self.base.weight, usize::saturating_add);
        crate::run::render::Root::value(ctx, weight)
    }
}

pub(super) type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The folder of a workflow's spec, where its `.env` file is (empty for the current directory).
pub(super) fn spec_dir(workflow: &Workflow) -> &std::path::Path {
    workflow.path.parent().unwrap_or(std::path::Path::new(""))
}

/// The first step (by index, in written order) whose failure fails its list: failed or timed out
/// without `on_error: continue`. `status` gives the status of the step at an index.
pub(super) fn first_failure(steps: &[Step], status: impl Fn(usize) -> StepStatus) -> Option<usize> {
    steps.iter().enumerate().position(|(i, step)| {
        let continues = step
            .on_error
            .as_ref()
            .is_some_and(|o| o.value == OnError::Continue);
        status(i).is_failure() && !continues
    })
}

/// The steps' views by id: `steps` in templates.
pub(super) fn named(steps: &[Step], views: &[Arc<StepView>]) -> Steps {
    steps
        .iter()
        .zip(views)
        .map(|(step, view)| (step.id.value.clone(), view.value()))
        .collect()
}

/// What an output that did not render is told about the steps it reads that did not succeed: a skipped
/// step's `output` is null, so `steps.a.output.x` is undefined. Empty when it reads none.
pub(super) fn unfinished_hint(template: Option<&crate::spec::Node>, steps: &Steps) -> String {
    let mut unfinished: Vec<(&str, String)> = Vec::new();
    if let Some(template) = template {
        template.for_each_str(&mut |text, _| {
            for (id, view) in steps {
                let status = view
                    .get_attr("status")
                    .ok()
                    .and_then(|s| s.as_str().map(str::to_owned))
                    .unwrap_or_default();
                if status != "succeeded"
                    && !unfinished.iter().any(|(seen, _)| *seen == id.as_str())
                    && crate::validate::templates::mentions(text, &format!("steps.{id}"))
                {
                    unfinished.push((id, status));
                }
            }
        });
    }
    let Some((id, status)) = unfinished.first() else {
        return String::new();
    };
    format!(
        "\n  hint: step `{id}` ended `{status}`, so its `output` is null; give a value for that case with \
         `| default(...)` (`steps.{id}.output.x | default('')`), or test `steps.{id}.status`"
    )
}

/// The steps' results by id, in step order, for the report. Call it once no template context holds the
/// views, or the results are copied.
pub(super) fn results(steps: &[Step], views: Vec<Arc<StepView>>) -> IndexMap<String, StepResult> {
    steps
        .iter()
        .zip(views)
        .map(|(step, view)| (step.id.value.clone(), view.into_result()))
        .collect()
}

/// Whether a step of the list waits for a person's approval.
pub(super) fn waits(views: &[Arc<StepView>]) -> bool {
    views
        .iter()
        .any(|v| v.result().status == StepStatus::WaitingApproval)
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How one body attempt failed.
pub(super) struct Failure {
    pub status: StepStatus,
    pub message: String,
    pub exit_code: Option<i32>,
    /// Deterministic failures (a template that does not render) are not retried.
    pub retryable: bool,
    /// What kind of failure a tool met, for `retry.on`.
    pub class: ErrorClass,
    /// The results of a composite tool's or sub-workflow's steps.
    pub steps: IndexMap<String, StepResult>,
    /// What an agent step's LLM calls used before it failed (boxed: failures travel in `Result`s).
    pub llm: Option<Box<LlmUsage>>,
}

impl Failure {
    /// A call that waits for a person's approval: the step pauses.
    pub(super) fn waiting(message: String) -> Self {
        Failure {
            status: StepStatus::WaitingApproval,
            ..Failure::fixed(message)
        }
    }

    /// A deterministic failure: retrying cannot help.
    pub(super) fn fixed(message: String) -> Self {
        Failure {
            status: StepStatus::Failed,
            message,
            exit_code: None,
            retryable: false,
            class: ErrorClass::Other,
            steps: IndexMap::new(),
            llm: None,
        }
    }
}

/// What a successful call gave: the tool's output and, for a composite tool or sub-workflow, its steps'
/// results.
pub(super) struct Called {
    pub output: ToolOutput,
    pub steps: IndexMap<String, StepResult>,
    /// What an agent step's LLM calls used.
    pub llm: Option<LlmUsage>,
    /// For a planner step, the plan whose steps ran.
    pub plan: Option<Box<Json>>,
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

/// A built-in tool's failure: worth retrying.
pub(super) fn tool_failure(e: ToolError) -> Failure {
    Failure {
        status: StepStatus::Failed,
        message: e.message,
        exit_code: e.exit_code,
        retryable: e.class != ErrorClass::Permanent,
        class: e.class,
        steps: IndexMap::new(),
        llm: None,
    }
}

impl Failure {
    /// The same failure, carrying what the step's LLM calls used.
    pub(super) fn with_llm(mut self, usage: LlmUsage) -> Self {
        self.llm = Some(Box::new(usage));
        self
    }
}
