//! What an attempt calls: renders the body's arguments once, asks the gate, and calls a built-in tool, a
//! declared tool (command, HTTP request, composite tool, sub-workflow, a tool of an MCP server), an agent
//! or a planner.

use std::sync::Arc;

use futures_util::FutureExt;
use minijinja::Value;
use serde_json::{Map, Value as Json, json};

use super::agent;
use super::context::{
    Boxed, Called, Failure, Shared, first_failure, named, results, tool_failure, waits,
};
use super::gate::{self, Gate};
use super::planner;
use crate::report::{RunStatus, StepStatus};
use crate::run::render::{RenderError, json_value, to_text};
use crate::spec::{Body, ToolDef, Trigger};
use crate::store::Entry;
use crate::tools::builtin::{self, Builtin};
use crate::tools::{ToolOutput, ToolRef};

/// Renders the body's arguments once (unless `rendered` has them) and calls its tool or sub-workflow.
pub(super) async fn body(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    ctx: &Value,
    rendered: Option<&Json>,
) -> Result<Called, Failure> {
    let args = match (rendered, body.args) {
        (Some(rendered), _) => rendered.clone(),
        (None, Some(args)) => shared
            .renderer
            .value(args, ctx)
            .await
            .map_err(CallError::render(None))?,
        (None, None) => Json::Object(Map::new()),
    };
    if let Some(path) = body.workflow {
        return workflow(shared, label, &path.value, args).await;
    }
    let Some(tool) = body.tool else {
        // An agent: the goal, or the description of a step left unspecified.
        let (goal, plans) = match (body.goal, body.plan, body.description) {
            (Some(goal), _, _) => (goal, false),
            (None, Some(plan), _) => (plan, true),
            (None, None, Some(description)) => (description, unspecified_plans(shared)),
            (None, None, None) => {
                return Err(CallError::NothingToDo.into());
            }
        };
        let goal = shared
            .renderer
            .text(&goal.value, ctx)
            .await
            .map_err(CallError::render(Some(if plans { "plan" } else { "goal" })))?;
        return if plans {
            planner::run(shared, label, body, goal, ctx).await
        } else {
            agent::run(shared, label, body, goal, ctx).await
        };
    };
    // A planned step is a call an LLM wrote: a sensitive one asks. The steps of a composite tool an LLM
    // called are the spec's: the tool asked as a whole (it is sensitive when they are), and rules see them
    // as chosen by the LLM.
    let sensitive = shared.planned && shared.llm_call_asks(&tool.value, &args);
    let chosen_by = shared.chosen_by();
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
            Gate::Stopped(e) => return Err(Failure::from(e)),
        }
    }
    let llm_chosen = shared.planned || shared.llm_chosen;
    call_tool(shared, label, &tool.value, args, llm_chosen).await
}

/// Calls what `name` resolves to in the workflow's tool registry: a built-in, or a tool the spec declares
/// (`llm_chosen`: an LLM chose the call, as rules see the steps of a composite tool).
pub(super) async fn call_tool(
    shared: &Shared,
    label: &str,
    name: &str,
    args: Json,
    llm_chosen: bool,
) -> Result<Called, Failure> {
    // A declared tool's `timeout` bounds each call of it (an MCP server's, each call of its tools):
    // when it passes, the call is dropped, its commands killed and an MCP call cancelled.
    let (def, call) = if let Some((server, tool)) = shared.workflow.tools.mcp_server_of(name) {
        let call = super::mcp::call(shared, label, &server.name, tool, args);
        (
            shared.workflow.spec.tools.get(server.name.as_str()),
            call.boxed(),
        )
    } else {
        let Some(entry) = shared.workflow.tools.get(name) else {
            return Err(CallError::UnknownTool(name.to_owned()).into());
        };
        let def = shared.workflow.spec.tools.get(name);
        let call = async move {
            match (entry.kind, def) {
                (ToolRef::Builtin(builtin), _) => builtin_call(shared, label, builtin, args).await,
                (ToolRef::Composite, _) => composite(shared, label, name, args, llm_chosen).await,
                (ToolRef::Workflow, Some(def)) if def.workflow.is_some() => {
                    let path = def.workflow.as_ref().map_or("", |p| p.value.as_str());
                    workflow(shared, label, path, args).await
                }
                (ToolRef::Command | ToolRef::Http, Some(def)) => {
                    declared(shared, label, name, def, args).await
                }
                _ => Err(CallError::CannotRun(name.to_owned()).into()),
            }
        };
        (def, call.boxed())
    };
    match def
        .and_then(|d| d.timeout.as_ref())
        .and_then(|t| t.value.get())
    {
        Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
            Err(Failure {
                status: StepStatus::TimedOut,
                message: format!(
                    "tool `{name}` timed out after {}",
                    humantime::format_duration(limit)
                ),
                exit_code: None,
                retryable: true,
                class: crate::tools::ErrorClass::Other,
                steps: indexmap::IndexMap::new(),
                llm: None,
            })
        }),
        None => call.await,
    }
}

/// Calls a built-in tool with rendered arguments, watching the commands it starts (each holding one of
/// the run's `work` permits while it runs).
async fn builtin_call(
    shared: &Shared,
    label: &str,
    builtin: &Builtin,
    args: Json,
) -> Result<Called, Failure> {
    let _permit = if builtin.runs_commands {
        Some(
            shared
                .work
                .acquire()
                .await
                .map_err(|_| CallError::RunOver)?,
        )
    } else {
        None
    };
    builtin
        .call(
            args,
            &shared.tool_context,
            spawn_watch(shared, label).as_ref().map(|w| w as _),
        )
        .await
        .map(Called::from)
        .map_err(tool_failure)
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

/// Calls a command or an HTTP request the spec declares, as the built-in `exec` or `http` with the
/// declaration's templates rendered over the call's arguments.
async fn declared(
    shared: &Shared,
    label: &str,
    name: &str,
    def: &ToolDef,
    args: Json,
) -> Result<Called, Failure> {
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
    let text = async |t: &crate::spec::Template| {
        shared
            .renderer
            .text(&t.value, &tool_ctx)
            .await
            .map_err(|e| Failure::from(CallError::render(None)(e)))
    };
    let (builtin, call_args) = if let Some(command) = &def.command {
        let mut argv = Vec::with_capacity(command.value.len());
        for arg in &command.value {
            argv.push(text(arg).await?);
        }
        let mut exec = json!({ "argv": argv });
        if let Some(cwd) = &def.cwd {
            exec["cwd"] = Json::String(text(cwd).await?);
        }
        if let Some(stdin) = &def.stdin {
            exec["stdin"] = Json::String(text(stdin).await?);
        }
        if !def.env.is_empty() {
            let mut env = Map::new();
            for (k, v) in &def.env {
                env.insert(k.value.clone(), Json::String(text(v).await?));
            }
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
        let mut request = json!({ "url": text(&http.url).await? });
        if let Some(method) = &http.method {
            request["method"] = serde_json::to_value(method.value).unwrap_or(Json::Null);
        }
        if !http.headers.is_empty() {
            let mut headers = Map::new();
            for (k, v) in &http.headers {
                headers.insert(k.value.clone(), Json::String(text(v).await?));
            }
            request["headers"] = Json::Object(headers);
        }
        if let Some(body) = &http.json {
            request["json"] = shared
                .renderer
                .value(body, &tool_ctx)
                .await
                .map_err(CallError::render(None))?;
        }
        if let Some(body) = &http.body {
            request["body"] = Json::String(text(body).await?);
        }
        ("http", request)
    } else {
        return Err(CallError::CannotRun(name.to_owned()).into());
    };
    let Some(builtin) = builtin::get(builtin) else {
        return Err(CallError::CannotRun(name.to_owned()).into());
    };
    builtin_call(shared, label, builtin, call_args).await
}

/// Records, for the attempt of the run's own step that makes a call (`outer` of `outer/inner`: commands
/// inside composite tools and sub-workflows count for it), the process group of each command it starts,
/// so that a resume can find a command that outlived a crashed archon, and what its commands write, for
/// `archon logs`.
struct StepWatch<'a> {
    shared: &'a Shared,
    /// The step as the journal knows it.
    step: &'a str,
    /// The call's own label (`outer/inner`).
    label: &'a str,
}

fn spawn_watch<'a>(shared: &'a Shared, label: &'a str) -> Option<StepWatch<'a>> {
    let step = label.split('/').next().unwrap_or(label);
    Some(StepWatch {
        shared,
        step,
        label,
    })
}

impl crate::tools::Watch for StepWatch<'_> {
    fn spawned(&self, pgid: u32) {
        self.shared.options.journal.record(Entry::ProcessStarted {
            step: self.step.to_owned(),
            pgid,
            started: crate::process::process_start_time(pgid),
        });
        // Committed at once, without waiting for it: the command is already running.
        drop(self.shared.options.journal.flush());
    }

    fn output(&self, stream: crate::tools::Stream, text: &str) {
        self.shared.options.journal.record(Entry::Output {
            step: self.step.to_owned(),
            source: self.label.to_owned(),
            stream,
            text: text.to_owned(),
            at_ms: crate::store::now_ms(),
        });
    }
}

/// Runs a composite tool's steps with the same scheduler, then renders its `result` (the last step's
/// output when it has none).
fn composite<'a>(
    shared: &'a Shared,
    label: &'a str,
    name: &'a str,
    args: Json,
    llm_chosen: bool,
) -> Boxed<'a, Result<Called, Failure>> {
    Box::pin(async move {
        let depth = shared.deeper()?;
        let mut names = shared.base.names().to_vec();
        if let Json::Object(values) = &args {
            names.extend(values.iter().map(|(k, v)| (k.clone(), json_value(v))));
        }
        names.push(("args".to_owned(), json_value(&args)));
        let inner = Arc::new(Shared {
            composite: Some(name.to_owned()),
            base: super::context::Base::new(names, &shared.secrets),
            planned: false,
            llm_chosen,
            ..shared.child(depth, label)
        });
        let views = shared.nested.schedule(&inner).await;
        let steps = inner.steps();
        let cancelled = shared.options.cancel.is_cancelled();
        let failed = first_failure(steps, |i| views[i].result().status);
        let def = &shared.workflow.spec.tools[name];
        // Rendered while the views are at hand; the results are taken out of them below.
        let rendered = match &def.result {
            Some(template) if !cancelled && failed.is_none() => {
                // The result becomes output that prompts and reports can see: no secrets in it.
                let ctx = inner.context(&named(steps, &views), false, &[]);
                Some(inner.renderer.value(template, &ctx).await)
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
                class: crate::tools::ErrorClass::Other,
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
                class: crate::tools::ErrorClass::Other,
                steps: results,
                llm: None,
            });
        }
        let output = match rendered {
            Some(Ok(value)) => value,
            Some(Err(e)) => {
                return Err(Failure {
                    steps: results,
                    ..Failure::from(CallError::Result {
                        tool: name.to_owned(),
                        source: e,
                    })
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
fn workflow<'a>(
    shared: &'a Shared,
    label: &'a str,
    path: &'a str,
    args: Json,
) -> Boxed<'a, Result<Called, Failure>> {
    Box::pin(async move {
        let depth = shared.deeper()?;
        let Some(workflow) = shared.workflow.subworkflows.get(path) else {
            return Err(CallError::NotLoaded(path.to_owned()).into());
        };
        let given = match args {
            Json::Object(values) => values,
            Json::Null => Map::new(),
            _ => {
                return Err(CallError::NotAnObject(path.to_owned()).into());
            }
        };
        let inputs = crate::inputs::resolve(&workflow.spec, given, &[]).map_err(|problems| {
            CallError::Inputs {
                path: path.to_owned(),
                problems: problems.iter().map(|p| p.message.clone()).collect(),
            }
        })?;
        let nested =
            shared
                .nested
                .workflow(workflow.clone(), inputs, shared, depth, format!("{label}/"));
        // The sub-workflow's own `timeout` bounds its call: when it passes, its steps are dropped (their
        // commands killed) and the calling step times out.
        let limit = workflow.spec.timeout.as_ref().and_then(|t| t.value.get());
        let report = match limit {
            Some(limit) => match tokio::time::timeout(limit, nested).await {
                Ok(report) => report,
                Err(_) => {
                    return Err(Failure {
                        status: StepStatus::TimedOut,
                        message: format!(
                            "sub-workflow `{path}` timed out after {}",
                            humantime::format_duration(limit)
                        ),
                        exit_code: None,
                        retryable: true,
                        class: crate::tools::ErrorClass::Other,
                        steps: indexmap::IndexMap::new(),
                        llm: None,
                    });
                }
            },
            None => nested.await,
        }
        .map_err(|source| CallError::Start {
            path: path.to_owned(),
            source,
        })?;
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
                class: crate::tools::ErrorClass::Other,
                steps: report.steps,
                llm: None,
            }),
            RunStatus::WaitingApproval => Err(Failure {
                status: StepStatus::WaitingApproval,
                message: format!("sub-workflow `{path}` waits for approval"),
                exit_code: None,
                retryable: false,
                class: crate::tools::ErrorClass::Other,
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
                    class: crate::tools::ErrorClass::Other,
                    steps: report.steps,
                    llm: None,
                })
            }
        }
    })
}

/// Why a call could not be made, or its result not used: a tool that does not resolve, arguments or a
/// result template that do not render, a sub-workflow that cannot start.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("the step says nothing to do")]
    NothingToDo,
    /// An argument, goal or plan template that does not render (`what` names it when it is not the
    /// arguments).
    #[error("{}{source}", .what.map_or_else(String::new, |w| format!("`{w}`: ")))]
    Render {
        what: Option<&'static str>,
        #[source]
        source: RenderError,
    },
    #[error("unknown tool `{0}`")]
    UnknownTool(String),
    #[error("tool `{0}` cannot run yet")]
    CannotRun(String),
    #[error("the run is over")]
    RunOver,
    #[error("tool `{tool}`: `result`: {source}")]
    Result {
        tool: String,
        #[source]
        source: RenderError,
    },
    #[error("sub-workflow `{0}` was not loaded")]
    NotLoaded(String),
    #[error("sub-workflow `{0}` takes an object of inputs")]
    NotAnObject(String),
    #[error("sub-workflow `{path}`: {}", .problems.join("; "))]
    Inputs { path: String, problems: Vec<String> },
    #[error("sub-workflow `{path}`: {source}")]
    Start {
        path: String,
        #[source]
        source: crate::run::RunError,
    },
}

impl From<CallError> for Failure {
    fn from(error: CallError) -> Self {
        Failure::fixed(error.to_string())
    }
}

impl CallError {
    fn render(what: Option<&'static str>) -> impl FnOnce(RenderError) -> CallError {
        move |source| CallError::Render { what, source }
    }
}
