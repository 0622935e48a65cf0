//! Agent steps (`goal:`, and description-only steps when `defaults.unspecified` is `agent`): a ReAct loop.
//!
//! Each turn the model sees the goal, the context, the allowed tools with their JSON Schemas and the trail
//! so far, and either calls tools (native tool calling) or gives its final answer. Tool calls go through the
//! same executor as the spec's own steps; every call, thought, action and observation is an event. The loop
//! is bounded by `max_iterations` (default 10), the run's LLM budget, and a guard against repeating the same
//! call; a final answer must match `output_schema` when the step has one. What the model reads is kept within
//! its context window (`context`).

mod context;

pub(super) use context::as_data;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use minijinja::Value;
use serde_json::Value as Json;

use super::checkpoint::{self, AgentState};
use super::gate::{self, Gate};
use super::{Called, Failure, Shared, call_declared, millis, tool_failure};
use crate::llm::cassette::{Recorder, Replayer};
use crate::llm::config::{self, Configured};
use crate::llm::pricing;
use crate::llm::tokens::Estimator;
use crate::llm::{ChatRequest, FinishReason, Message, Part, ToolChoice, ToolResult, ToolSpec};
use crate::run::redact::Redacting;
use crate::run::render::to_text;
use crate::run::tools::{self, ToolOutput};
use crate::run::{LlmUsage, RunEvent, StepStatus};
use crate::spec::{AgentDef, Body, ChosenBy, Spec, ToolMode, Trigger};
use crate::tools::builtin;

/// Iterations of an agent step unless `max_iterations` says otherwise.
pub const DEFAULT_MAX_ITERATIONS: u32 = 10;
/// Most characters of a thought shown in its event.
const THOUGHT_CHARS: usize = 4000;
/// The same call (tool and arguments) this many times draws a warning; once more stops the step.
const REPEAT_LIMIT: usize = 3;
/// Most tool calls of one turn running at once.
const PARALLEL_CALLS: usize = 4;
/// Final answers that do not match `output_schema` are sent back this many times.
const SCHEMA_RETRIES: usize = 2;

/// The providers of a run, built when first used, and what its LLM calls used in total.
#[derive(Debug, Default)]
pub(crate) struct LlmContext {
    providers: Mutex<HashMap<String, Arc<Configured>>>,
    pub totals: Arc<Mutex<LlmUsage>>,
    /// Plan revisions made in the run so far (limited by `defaults.max_replans`).
    pub replans: Arc<std::sync::atomic::AtomicU32>,
    /// Providers that refused native tool calling: agents in `auto` mode use text mode with them.
    text_only: Mutex<std::collections::HashSet<String>>,
}

impl LlmContext {
    /// Whether provider `name` refused native tool calling earlier in the run.
    fn refuses_tools(&self, name: &str) -> bool {
        self.text_only.lock().is_ok_and(|t| t.contains(name))
    }

    fn mark_refuses_tools(&self, name: &str) {
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
        }
    }

    fn provider(&self, shared: &Shared, name: &str) -> Result<Arc<Configured>, Failure> {
        let spec = &shared.workflow.spec;
        if let Some(found) = self
            .providers
            .lock()
            .ok()
            .and_then(|p| p.get(name).cloned())
        {
            return Ok(found);
        }
        let def = spec
            .llm
            .as_ref()
            .and_then(|l| l.providers.get(name))
            .ok_or_else(|| Failure::fixed(format!("no LLM provider `{name}`")))?;
        // Replaying needs no provider at all: not even its key.
        if let Some(crate::run::Cassette::Replay(exchanges)) = &shared.options.cassette {
            let built = Arc::new(Configured {
                name: name.to_owned(),
                kind: def.kind.value,
                provider: Redacting::wrap(
                    Arc::new(if def.kind.value == crate::spec::ProviderKind::Auto {
                        Replayer::new(name, exchanges).any_model()
                    } else {
                        Replayer::new(name, exchanges)
                    }),
                    shared.redactor.clone(),
                ),
                model: config::model(def, &shared.options.env).unwrap_or_default(),
                temperature: def.temperature,
                max_tokens: def.max_tokens,
            });
            if let Ok(mut providers) = self.providers.lock() {
                providers.insert(name.to_owned(), built.clone());
            }
            return Ok(built);
        }
        let dir = shared
            .workflow
            .path
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default();
        let mut configured = config::build(name, def, &dir, &shared.options.env)
            .map_err(|e| Failure::fixed(e.message))?;
        if let Some(crate::run::Cassette::Record(file)) = &shared.options.cassette {
            let redactor = shared.redactor.clone();
            configured.provider = Arc::new(
                Recorder::new(configured.provider, file.clone())
                    .scrubbing(Arc::new(move |exchange| redactor.json(exchange))),
            );
        }
        // The model never reads a secret value, whatever put it into the conversation.
        configured.provider = Redacting::wrap(configured.provider, shared.redactor.clone());
        let built = Arc::new(configured);
        if let Ok(mut providers) = self.providers.lock() {
            providers.insert(name.to_owned(), built.clone());
        }
        Ok(built)
    }
}

/// Runs an agent step's body: `goal` is the rendered goal.
pub(super) async fn run(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    goal: String,
    ctx: &Value,
) -> Result<Called, Failure> {
    let spec: &Spec = &shared.workflow.spec;
    let (agent, provider_name, configured) = chosen(shared, body)?;
    let agent_name = spec.agent_name(body);
    let max_iterations = body
        .max_iterations
        .map(|m| m.value)
        .or_else(|| {
            agent
                .and_then(|a| a.max_iterations.as_ref())
                .map(|m| m.value)
        })
        .or_else(|| {
            spec.defaults
                .as_ref()
                .and_then(|d| d.max_iterations.as_ref())
                .map(|m| m.value)
        })
        .unwrap_or(DEFAULT_MAX_ITERATIONS)
        .max(1);
    // A planned agent has only the tools its plan gave it.
    let patterns: Vec<&str> = if shared.planned && body.tools.is_none() {
        Vec::new()
    } else {
        spec.tool_patterns(body)
    };
    let tools = offered_tools(spec, &patterns);
    // Text mode, for models without native tool calling: the tools are described in the prompt and the
    // model writes `Action: {json}` lines, which are read (and repaired) here. `auto` (the default) starts
    // native and changes to text for the rest of the run when the provider refuses tools.
    let mode = agent
        .and_then(|a| a.tool_mode.as_ref())
        .or_else(|| {
            spec.llm
                .as_ref()
                .and_then(|l| l.providers.get(provider_name.as_str()))
                .and_then(|p| p.tool_mode.as_ref())
        })
        .map_or(ToolMode::Auto, |m| m.value);
    let auto = mode == ToolMode::Auto && !tools.is_empty();
    let mut text_mode =
        mode == ToolMode::Text || (auto && shared.llm.refuses_tools(&provider_name));
    let schema = body.output_schema.map(crate::spec::Node::to_json);

    let mut system = String::from(
        "You are an agent completing one step of a workflow. Use the tools when they help; when you are done, \
         answer with the final result only.",
    );
    if !tools.is_empty() {
        system.push_str(context::DATA_RULE);
    }
    if let Some(instructions) = agent.and_then(|a| a.instructions.as_ref()) {
        let text = shared
            .renderer
            .text(&instructions.value, ctx)
            .map_err(|e| Failure::fixed(format!("agent instructions: {e}")))?;
        system = format!("{text}\n\n{system}");
    }
    if let Some(expected) = body.expected_output {
        let text = shared
            .renderer
            .text(&expected.value, ctx)
            .map_err(|e| Failure::fixed(format!("`expected_output`: {e}")))?;
        system.push_str(&format!("\n\nExpected output: {text}"));
    }
    if let Some(schema) = &schema {
        system.push_str(&format!(
            "\n\nThe final answer must be JSON matching this schema: {schema}"
        ));
    }
    let mut user = goal;
    if let Some(context) = body.context {
        let value = shared
            .renderer
            .value(context, ctx)
            .map_err(|e| Failure::fixed(format!("`context`: {e}")))?;
        user.push_str(&format!("\n\nContext:\n{}", to_text(&value)));
    }
    let start = |text_mode: bool| {
        let mut system = system.clone();
        if text_mode && !tools.is_empty() {
            system.push_str(&text_mode_instructions(&tools));
        }
        let offered = if text_mode { Vec::new() } else { tools.clone() };
        let conversation = context::Conversation::new(
            Estimator::for_model(&configured.model),
            context::Window::of(spec, &configured),
            system,
            user.clone(),
            &offered,
        );
        (offered, conversation)
    };
    let (mut offered, mut conversation) = start(text_mode);
    let estimator = Estimator::for_model(&configured.model);
    let repeatable = crate::resume::body_is_idempotent(&shared.workflow, body);
    let mut tool_calls = 0;
    // Each tool's argument schema, compiled once for the step.
    let validators: HashMap<String, jsonschema::Validator> = tools
        .iter()
        .filter_map(|t| {
            Some((
                t.name.clone(),
                jsonschema::validator_for(&t.parameters).ok()?,
            ))
        })
        .collect();
    let mut usage = LlmUsage::default();
    let mut seen_calls: HashMap<String, usize> = HashMap::new();
    let mut schema_retries = 0;
    let validator = match &schema {
        Some(s) => Some(jsonschema::validator_for(s).map_err(|e| {
            Failure::fixed(format!("`output_schema` is not a valid JSON Schema: {e}"))
        })?),
        None => None,
    };
    // A resumed run continues after the last iteration an earlier process completed.
    let mut first = 1;
    let mut pending = None;
    let tool_names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    let fingerprint = checkpoint::fingerprint(&[
        &provider_name,
        &configured.model,
        &tool_names.join(","),
        &format!("{mode:?}"),
        &max_iterations.to_string(),
        &schema.as_ref().map(Json::to_string).unwrap_or_default(),
    ]);
    let mut restored =
        checkpoint::restore::<AgentState>(shared, label, &fingerprint, conversation.messages());
    if restored.is_none() && auto && !text_mode {
        // The earlier process may have changed to text mode: its conversation starts that way.
        let (text_offered, text_conversation) = start(true);
        restored = checkpoint::restore::<AgentState>(
            shared,
            label,
            &fingerprint,
            text_conversation.messages(),
        )
        .filter(|state| state.text_mode);
        if restored.is_some() {
            text_mode = true;
            shared.llm.mark_refuses_tools(&provider_name);
            (offered, conversation) = (text_offered, text_conversation);
        }
    }
    if let Some(state) = restored {
        checkpoint::count_restored(shared, &state.usage);
        shared.emit(RunEvent::Resumed {
            step: label.to_owned(),
            from: format!("after iteration {}", state.iteration),
        });
        first = state.iteration + 1;
        conversation.replace(state.messages);
        tool_calls = state.tool_calls;
        usage = state.usage;
        seen_calls = state.seen_calls;
        schema_retries = state.schema_retries;
        pending = state.pending;
    }

    for iteration in first..=max_iterations {
        let note = context::status_note(shared, iteration, max_iterations, tool_calls);
        context::fit(
            shared,
            label,
            &configured,
            &mut conversation,
            iteration,
            Some(&note),
            &mut usage,
        )
        .await?;
        let mut request = configured.request(conversation.request(Some(&note)), offered.clone());
        request.output_schema.clone_from(&schema);
        if let Some(t) = agent.and_then(|a| a.temperature) {
            request.temperature = Some(t);
        }
        let reply = match pending.take() {
            // The turn that waited for approval, taken up again as it was.
            Some(response) => Ok(response),
            None => complete(shared, label, &configured, &request, &mut usage).await,
        };
        let mut response = match reply {
            // A server without native tool calling: the step starts again in text mode, before any tool
            // ran, and later steps asking the same provider start there.
            Err(failure)
                if auto && !text_mode && iteration == 1 && refuses_tools(&failure.message) =>
            {
                shared.llm.mark_refuses_tools(&provider_name);
                shared.emit(RunEvent::AgentObservation {
                    step: label.to_owned(),
                    iteration,
                    tool: String::new(),
                    text: format!(
                        "provider `{provider_name}` refused native tool calling ({}); continuing in text mode",
                        failure.message
                    ),
                    error: true,
                    full_text: None,
                });
                text_mode = true;
                (offered, conversation) = start(true);
                let mut request =
                    configured.request(conversation.request(Some(&note)), offered.clone());
                request.output_schema.clone_from(&schema);
                if let Some(t) = agent.and_then(|a| a.temperature) {
                    request.temperature = Some(t);
                }
                complete(shared, label, &configured, &request, &mut usage).await?
            }
            other => other?,
        };
        // A model offered native tools that writes its action as text anyway (small local models do):
        // in `auto` mode the action is read from the text.
        if auto
            && !text_mode
            && response.tool_calls().next().is_none()
            && let Some(call) = written_action(&response.text(), iteration, &tools)
        {
            response.message.parts = vec![Part::ToolCall(call)];
        }
        if text_mode && !tools.is_empty() {
            match read_text_action(&response.text(), iteration) {
                TextTurn::Final(answer) => {
                    response.message.parts = vec![Part::Text(answer)];
                }
                TextTurn::Action(call) => {
                    response.message.parts.push(Part::ToolCall(call));
                }
                TextTurn::Unreadable(problem) => {
                    shared.emit(RunEvent::AgentObservation {
                        step: label.to_owned(),
                        iteration,
                        tool: String::new(),
                        text: problem.clone(),
                        error: true,
                        full_text: None,
                    });
                    conversation.push(Message::assistant(vec![Part::Text(response.text())]));
                    conversation.push(Message::user(format!("Observation: {problem}")));
                    continue;
                }
            }
        }
        let calls: Vec<_> = response.tool_calls().cloned().collect();
        let text = response.text();
        if calls.is_empty() {
            // A final answer, unless the model was cut off or stopped for another reason.
            match &response.finish_reason {
                FinishReason::Stop | FinishReason::ToolCalls => {}
                FinishReason::Length => {
                    return Err(Failure::fixed(
                        "the answer was cut off at the token limit: raise `max_tokens`".to_owned(),
                    )
                    .with_llm(usage));
                }
                FinishReason::ContentFilter => {
                    return Err(
                        Failure::fixed("the provider filtered the answer".to_owned())
                            .with_llm(usage),
                    );
                }
                FinishReason::Other(reason) if text.trim().is_empty() => {
                    return Err(Failure::fixed(format!(
                        "the model stopped without an answer (`{reason}`)"
                    ))
                    .with_llm(usage));
                }
                FinishReason::Other(_) => {}
            }
            let Some(validator) = &validator else {
                emit_answer(shared, label, iteration, &text);
                return Ok(answer(Json::String(text), usage));
            };
            match parse_json(&text) {
                Some(value) if validator.is_valid(&value) => {
                    emit_answer(shared, label, iteration, &text);
                    return Ok(answer(value, usage));
                }
                parsed => {
                    if schema_retries >= SCHEMA_RETRIES {
                        return Err(Failure::fixed(format!(
                            "the final answer does not match `output_schema` after {SCHEMA_RETRIES} corrections"
                        ))
                        .with_llm(usage));
                    }
                    schema_retries += 1;
                    let problem = match &parsed {
                        None => "it is not JSON".to_owned(),
                        Some(value) => validator
                            .iter_errors(value)
                            .next()
                            .map(|e| format!("at `{}`: {e}", e.instance_path()))
                            .unwrap_or_else(|| "it does not match".to_owned()),
                    };
                    conversation.push(response.message.clone());
                    conversation.push(Message::user(format!(
                        "Your answer does not match the required JSON Schema ({problem}). Answer again with JSON only."
                    )));
                    continue;
                }
            }
        }
        for part in &response.message.parts {
            let thought = match part {
                Part::Reasoning { text, .. } | Part::Text(text) if !text.trim().is_empty() => text,
                _ => continue,
            };
            shared.emit(RunEvent::AgentThought {
                step: label.to_owned(),
                iteration,
                text: truncate(thought, THOUGHT_CHARS),
            });
        }
        let seen_before = seen_calls.clone();
        conversation.push(response.message.clone());
        tool_calls += calls.len();
        // Where the step stands if this turn must wait for a person: before the turn (the conversation
        // without the answer just added), with the model's answer kept, so that a resume takes this same
        // turn up again once decided. Built only then.
        let paused = |seen_calls: HashMap<String, usize>, messages: &[Message]| AgentState {
            fingerprint: fingerprint.clone(),
            text_mode,
            iteration: iteration - 1,
            messages: messages[..messages.len() - 1].to_vec(),
            tool_calls: tool_calls - calls.len(),
            usage: usage.clone(),
            seen_calls,
            schema_retries,
            pending: Some(response.clone()),
        };
        // Guard against loops first, in order, and ask the rules (and, for sensitive tools, a person);
        // then run the turn's calls together, a few at a time.
        let mut planned = Vec::with_capacity(calls.len());
        let mut actions = Vec::with_capacity(calls.len());
        for call in &calls {
            let key = format!("{}:{}", call.name, canonical(&call.arguments));
            let repeats = {
                let n = seen_calls.entry(key).or_default();
                *n += 1;
                *n
            };
            if repeats > REPEAT_LIMIT {
                return Err(Failure {
                    status: StepStatus::Stuck,
                    ..Failure::fixed(format!(
                        "the agent called `{}` with the same arguments {repeats} times",
                        call.name
                    ))
                }
                .with_llm(usage));
            }
            let mut arguments = call.arguments.clone();
            let mut turn = if repeats == REPEAT_LIMIT {
                Turn::Warn
            } else {
                Turn::Run
            };
            let sensitive = crate::tools::sensitive(spec, &call.name, &call.arguments);
            let known = tools.iter().any(|t| t.name == call.name);
            if known && turn == Turn::Run && (sensitive || !spec.rules.is_empty()) {
                let asked = gate::Call {
                    on: Trigger::BeforeTool,
                    label,
                    tool: Some(&call.name),
                    agent: agent_name,
                    chosen_by: ChosenBy::Llm,
                    args: &call.arguments,
                    sensitive,
                    required: false,
                };
                match gate::gate(shared, asked).await {
                    Gate::Go { redact } => {
                        arguments = crate::run::rules::redacted_args(&arguments, &redact);
                    }
                    Gate::Denied(reason, redact) => {
                        arguments = crate::run::rules::redacted_args(&arguments, &redact);
                        turn = Turn::Denied(reason);
                    }
                    Gate::Waiting(message) => {
                        let state = paused(seen_before, conversation.messages());
                        return Err(pause(shared, label, state, message).await);
                    }
                }
            }
            actions.push(RunEvent::AgentAction {
                step: label.to_owned(),
                iteration,
                tool: call.name.clone(),
                arguments,
            });
            planned.push((call, turn));
        }
        // Recorded once every call of the turn may go ahead: a turn that waits shows no action yet.
        actions.into_iter().for_each(|a| shared.emit(a));
        let mut results = Vec::with_capacity(planned.len());
        let allowed = &tools;
        let compiled = &validators;
        let shown = conversation.window.observation_tokens();
        for chunk in planned.chunks(PARALLEL_CALLS) {
            let observations = futures_util::future::join_all(chunk.iter().map(|(call, turn)| async move {
                match turn {
                    Turn::Warn => Ok((
                        format!(
                            "You already made this exact call {REPEAT_LIMIT} times. Do not repeat it: change your approach or give your final answer."
                        ),
                        true,
                        false,
                    )),
                    Turn::Denied(reason) => {
                        Ok((format!("this call was not made: {reason}"), true, false))
                    }
                    Turn::Run => {
                        observe(shared, label, allowed, compiled, &call.name, &call.arguments).await
                    }
                }
            }))
            .await;
            if let Some(message) = observations.iter().find_map(|o| o.as_ref().err()) {
                // A tool waits for approval: the turn is taken up again on resume (its other calls may
                // run again).
                let state = paused(seen_before, conversation.messages());
                return Err(pause(shared, label, state, message.clone()).await);
            }
            for ((call, _), (output, is_error, from_tool)) in
                chunk.iter().zip(observations.into_iter().flatten())
            {
                let (content, full_text) = context::cut(estimator, output, shown);
                shared.emit(RunEvent::AgentObservation {
                    step: label.to_owned(),
                    iteration,
                    tool: call.name.clone(),
                    text: content.clone(),
                    error: is_error,
                    full_text,
                });
                results.push(Part::ToolResult(ToolResult {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    content: if from_tool {
                        as_data(&content)
                    } else {
                        content
                    },
                    is_error,
                }));
            }
        }
        if text_mode {
            // The model wrote its action as text: it reads the observation as text too.
            conversation.pop();
            conversation.push(Message::assistant(vec![Part::Text(response.text())]));
            let observations: Vec<String> = results
                .iter()
                .filter_map(|p| match p {
                    Part::ToolResult(r) => Some(format!("Observation: {}", r.content)),
                    _ => None,
                })
                .collect();
            conversation.push(Message::user(observations.join("\n")));
        } else {
            conversation.push(Message {
                role: crate::llm::Role::Tool,
                parts: results,
            });
        }
        let saved = checkpoint::save(
            shared,
            label,
            &AgentState {
                fingerprint: fingerprint.clone(),
                text_mode,
                iteration,
                messages: conversation.messages().to_vec(),
                tool_calls,
                usage: usage.clone(),
                seen_calls: seen_calls.clone(),
                schema_retries,
                pending: None,
            },
        );
        // Before tools that are not safe to repeat run again, this iteration's record is on disk: a crash
        // repeats at most the calls of the iteration in flight.
        if !repeatable {
            let _ = saved.wait().await;
        }
    }
    // Out of iterations: one last turn without tools for the best answer so far.
    conversation.push(Message::user(
        "You have reached the iteration limit. Give your best final answer now, without calling tools.".to_owned(),
    ));
    context::fit(
        shared,
        label,
        &configured,
        &mut conversation,
        max_iterations + 1,
        None,
        &mut usage,
    )
    .await?;
    let mut request = configured.request(conversation.request(None), offered);
    request.tool_choice = ToolChoice::None;
    let response = complete(shared, label, &configured, &request, &mut usage).await?;
    let best: String = response.text().chars().take(500).collect();
    Err(Failure {
        status: StepStatus::Incomplete,
        ..Failure::fixed(format!(
            "no final answer within {max_iterations} iterations; best answer: {best}"
        ))
    }
    .with_llm(usage))
}

/// The step's agent role (its own, or `defaults.agent`), provider name and built provider: the step's
/// `provider`, the agent's, `llm.default`, or the only (first) one declared.
pub(super) fn chosen<'s>(
    shared: &'s Shared,
    body: Body<'s>,
) -> Result<(Option<&'s AgentDef>, String, Arc<Configured>), Failure> {
    let spec: &Spec = &shared.workflow.spec;
    let agent = spec.agent_of(body);
    let provider_name = body
        .provider
        .map(|p| p.value.clone())
        .or_else(|| {
            agent
                .and_then(|a| a.provider.as_ref())
                .map(|p| p.value.clone())
        })
        .or_else(|| {
            spec.llm
                .as_ref()
                .and_then(|l| l.default.as_ref())
                .map(|d| d.value.clone())
        })
        .or_else(|| {
            spec.llm
                .as_ref()
                .and_then(|l| l.providers.keys().next())
                .map(|k| k.value.clone())
        })
        .ok_or_else(|| {
            Failure::fixed(
                "no LLM provider is configured: add one under `llm.providers`".to_owned(),
            )
        })?;
    let configured = shared.llm.provider(shared, &provider_name)?;
    Ok((agent, provider_name, configured))
}

/// One model call, within the run's budget, counted and reported.
pub(super) async fn complete(
    shared: &Shared,
    label: &str,
    configured: &Configured,
    request: &ChatRequest,
    usage: &mut LlmUsage,
) -> Result<crate::llm::ChatResponse, Failure> {
    if let Some(exceeded) = over_budget(shared) {
        return Err(
            Failure::fixed(format!("LLM budget exceeded: {exceeded}")).with_llm(usage.clone())
        );
    }
    let started = Instant::now();
    let response = configured.provider.complete(request).await.map_err(|e| {
        // What the provider's own retries could not fix, the step's `retry` may.
        Failure {
            retryable: e.retryable,
            ..Failure::fixed(e.message)
        }
        .with_llm(usage.clone())
    })?;
    let pricing_config = shared
        .workflow
        .spec
        .llm
        .as_ref()
        .and_then(|l| l.providers.get(configured.name.as_str()))
        .and_then(|p| p.pricing.as_ref());
    let cost = pricing::price_of(&configured.model, pricing_config)
        .map(|p| pricing::cost(&response.usage, &p));
    let call = LlmUsage::one(&response.usage, cost);
    usage.add(&call);
    if let Ok(mut totals) = shared.llm.totals.lock() {
        totals.add(&call);
    }
    shared.emit(RunEvent::LlmCall {
        step: label.to_owned(),
        provider: configured.name.clone(),
        model: if response.model.is_empty() {
            configured.model.clone()
        } else {
            response.model.clone()
        },
        input_tokens: response.usage.input_tokens,
        output_tokens: response.usage.output_tokens,
        cost_usd: cost,
        duration_ms: millis(started.elapsed()),
    });
    Ok(response)
}

/// Which of `llm.budget` the run has used up, if any.
fn over_budget(shared: &Shared) -> Option<String> {
    let budget = shared.workflow.spec.llm.as_ref()?.budget.as_ref()?;
    let totals = shared.llm.totals.lock().ok()?.clone();
    if let Some(max) = budget.max_llm_calls
        && totals.calls >= max
    {
        return Some(format!("`max_llm_calls` is `{max}`"));
    }
    if let Some(max) = budget.max_tokens
        && totals.input_tokens + totals.output_tokens >= max
    {
        return Some(format!(
            "`max_tokens` is `{max}` and the run used `{}`",
            totals.input_tokens + totals.output_tokens
        ));
    }
    if let Some(max) = budget.max_cost_usd
        && totals.cost_usd >= max
    {
        return Some(format!(
            "`max_cost_usd` is `{max}` and the run spent `{:.4}`",
            totals.cost_usd
        ));
    }
    None
}

/// Runs one tool call the model asked for; returns the observation, whether it is an error, and whether the
/// tool wrote it (its output or failure, shown to the model as data) rather than archon.
async fn observe(
    shared: &Shared,
    label: &str,
    tools: &[ToolSpec],
    validators: &HashMap<String, jsonschema::Validator>,
    name: &str,
    arguments: &Json,
) -> Result<(String, bool, bool), String> {
    if !tools.iter().any(|t| t.name == name) {
        let names: Vec<String> = tools.iter().map(|t| format!("`{}`", t.name)).collect();
        return Ok((
            format!(
                "unknown tool `{name}`; the tools are {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
            true,
            false,
        ));
    }
    if let Some(validator) = validators.get(name)
        && let Some(error) = validator.iter_errors(arguments).next()
    {
        let path = error.instance_path().to_string();
        let at = if path.is_empty() {
            "the arguments".to_owned()
        } else {
            format!("`{path}`")
        };
        return Ok((
            format!("invalid arguments for `{name}` at {at}: {error}"),
            true,
            false,
        ));
    }
    let call_label = format!("{label}/{name}");
    let outcome = match shared.workflow.spec.tools.get(name) {
        Some(def) => call_declared(shared, &call_label, name, def, arguments.clone(), true).await,
        None => tools::call(name, arguments, &shared.tool_context, None)
            .await
            .map(Called::from)
            .map_err(tool_failure),
    };
    match outcome {
        Ok(called) => {
            let ToolOutput { output, text, .. } = called.output;
            let shown = if text.is_empty() {
                to_text(&output)
            } else {
                text
            };
            let redacted = match shared.redactor.text(&shown) {
                std::borrow::Cow::Owned(redacted) => Some(redacted),
                std::borrow::Cow::Borrowed(_) => None,
            };
            Ok((redacted.unwrap_or(shown), false, true))
        }
        // A composite tool or sub-workflow one of whose steps waits for approval: the agent waits too.
        Err(failure) if failure.status == StepStatus::WaitingApproval => Err(failure.message),
        Err(failure) => Ok((
            format!("error: {}", shared.redactor.text(&failure.message)),
            true,
            true,
        )),
    }
}

/// The tools an agent may call: built-ins and declared tools whose names match `patterns` (globs).
/// Sensitive ones are offered too: each call of one asks for a person's approval unless a rule allows it.
pub(super) fn offered_tools(spec: &Spec, patterns: &[&str]) -> Vec<ToolSpec> {
    let globs: Vec<globset::GlobMatcher> = patterns
        .iter()
        .filter_map(|p| globset::Glob::new(p).ok().map(|g| g.compile_matcher()))
        .collect();
    let wanted = |name: &str| globs.iter().any(|g| g.is_match(name));
    let mut offered = Vec::new();
    for b in builtin::all() {
        if wanted(b.name) {
            offered.push(ToolSpec {
                name: b.name.to_owned(),
                description: b.description.to_owned(),
                parameters: b.parameters.clone(),
            });
        }
    }
    for (name, def) in &spec.tools {
        if wanted(&name.value) && def.mcp.is_none() {
            offered.push(ToolSpec {
                name: name.value.clone(),
                description: def.description.clone().unwrap_or_default(),
                parameters: def.parameters.as_ref().map_or_else(
                    || serde_json::json!({ "type": "object" }),
                    crate::spec::Node::to_json,
                ),
            });
        }
    }
    offered
}

fn emit_answer(shared: &Shared, label: &str, iteration: u32, text: &str) {
    shared.emit(RunEvent::AgentAnswer {
        step: label.to_owned(),
        iteration,
        text: truncate(text, THOUGHT_CHARS),
    });
}

fn answer(output: Json, usage: LlmUsage) -> Called {
    Called {
        output: ToolOutput {
            text: to_text(&output),
            output,
            exit_code: None,
        },
        steps: indexmap::IndexMap::new(),
        llm: Some(usage),
        plan: None,
    }
}

/// JSON in an answer: the whole text, or inside a fenced block, or the outermost object or list in prose.
pub(super) fn parse_json(text: &str) -> Option<Json> {
    let trimmed = text.trim();
    if let Ok(value) = serde_json::from_str(trimmed) {
        return Some(value);
    }
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|t| t.strip_suffix("```"))
        .map(str::trim);
    if let Some(value) = unfenced.and_then(|t| serde_json::from_str(t).ok()) {
        return Some(value);
    }
    for (open, close) in [('{', '}'), ('[', ']')] {
        if let (Some(start), Some(end)) = (trimmed.find(open), trimmed.rfind(close))
            && start < end
            && let Ok(value) = serde_json::from_str(&trimmed[start..=end])
        {
            return Some(value);
        }
    }
    None
}

/// Whether a provider's error says it does not take tools: servers without native tool calling answer the
/// `tools` field with a 400 naming tools. A 400 about a tool's schema or the context length is not that.
fn refuses_tools(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    message.contains("http 400")
        && (message.contains("tool") || message.contains("function call"))
        && !["schema", "parameters", "context", "token", "length"]
            .iter()
            .any(|w| message.contains(w))
}

/// An action a model offered native tools wrote as text instead: only when the answer is nothing but
/// (optional `Thought:` lines and) an `Action:` or `<tool_call>` line, naming one of the offered tools.
fn written_action(text: &str, iteration: u32, tools: &[ToolSpec]) -> Option<crate::llm::ToolCall> {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("Thought:"))?;
    if !(first.starts_with("Action:") || first.starts_with("<tool_call>"))
        || text.contains("Final Answer:")
    {
        return None;
    }
    match read_text_action(text, iteration) {
        TextTurn::Action(call) if tools.iter().any(|t| t.name == call.name) => Some(call),
        _ => None,
    }
}

/// How to call tools in text mode, appended to the system prompt.
fn text_mode_instructions(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "\n\nYou can use these tools. To call one, write a line `Action:` followed by one JSON object \
         {\"tool\": name, \"arguments\": {...}} and stop; the result comes back as `Observation:`. You may \
         think first on a line starting `Thought:`. When you are done, write `Final Answer:` followed by the \
         answer.\n\nTools:",
    );
    for tool in tools {
        text.push_str(&format!(
            "\n- {}: {} Arguments (JSON Schema): {}",
            tool.name, tool.description, tool.parameters
        ));
    }
    text
}

/// Pauses the step for a person's decision: its state before the turn is on disk before it says so.
async fn pause(shared: &Shared, label: &str, state: AgentState, message: String) -> Failure {
    let usage = state.usage.clone();
    let _ = checkpoint::save(shared, label, &state).wait().await;
    Failure::waiting(message).with_llm(usage)
}

/// What becomes of one tool call of a turn.
#[derive(Debug, PartialEq)]
enum Turn {
    Run,
    /// The same call for the third time: a warning instead.
    Warn,
    /// A rule or a person said no.
    Denied(String),
}

/// What a text-mode turn says.
enum TextTurn {
    Final(String),
    Action(crate::llm::ToolCall),
    /// Neither a readable action nor a final answer: what to tell the model.
    Unreadable(String),
}

/// Reads a text-mode turn: `Final Answer: ...`, or `Action: {json}` (also a `<tool_call>` block), with the
/// JSON repaired where weak models break it (code fences, trailing commas, single quotes).
fn read_text_action(text: &str, iteration: u32) -> TextTurn {
    let action_at = text
        .find("Action:")
        .map(|i| i + "Action:".len())
        .or_else(|| text.find("<tool_call>").map(|i| i + "<tool_call>".len()));
    let final_at = text.find("Final Answer:");
    match (action_at, final_at) {
        (Some(a), Some(f)) if f < a => {
            TextTurn::Final(text[f + "Final Answer:".len()..].trim().to_owned())
        }
        (None, Some(f)) => TextTurn::Final(text[f + "Final Answer:".len()..].trim().to_owned()),
        (Some(a), _) => {
            let rest = text[a..].replace("</tool_call>", "");
            let Some(value) = repair_json(&rest) else {
                return TextTurn::Unreadable(
                    "your action is not a JSON object; write `Action: {\"tool\": \"name\", \"arguments\": {...}}`"
                        .to_owned(),
                );
            };
            let name = ["tool", "name", "action"]
                .iter()
                .find_map(|k| value.get(*k).and_then(Json::as_str));
            let Some(name) = name else {
                return TextTurn::Unreadable(
                    "your action names no tool; write `Action: {\"tool\": \"name\", \"arguments\": {...}}`".to_owned(),
                );
            };
            let arguments = ["arguments", "args", "input", "parameters"]
                .iter()
                .find_map(|k| value.get(*k).cloned())
                .unwrap_or_else(|| Json::Object(serde_json::Map::new()));
            TextTurn::Action(crate::llm::ToolCall {
                id: format!("text_{iteration}"),
                name: name.to_owned(),
                arguments,
                signature: None,
            })
        }
        // No marker at all: the whole text is the answer.
        (None, None) => TextTurn::Final(text.trim().to_owned()),
    }
}

/// The first JSON object in `text`, repaired if needed: code fences dropped, the outermost braces taken,
/// trailing commas removed, single quotes turned into double quotes.
fn repair_json(text: &str) -> Option<Json> {
    let start = text.find('{')?;
    let mut depth = 0usize;
    let mut end = None;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text[start..].char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    end = Some(start + i);
                    break;
                }
            }
            _ => {}
        }
    }
    let candidate = &text[start..=end?];
    if let Ok(value) = serde_json::from_str::<Json>(candidate) {
        return value.is_object().then_some(value);
    }
    let mut fixed = String::with_capacity(candidate.len());
    let mut in_double = false;
    let mut chars = candidate.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_double = !in_double;
                fixed.push(c);
            }
            '\'' if !in_double => fixed.push('"'),
            ',' if !in_double => {
                // A trailing comma before a closing bracket.
                let mut lookahead = chars.clone();
                while lookahead.peek().is_some_and(|c| c.is_whitespace()) {
                    lookahead.next();
                }
                if !matches!(lookahead.peek(), Some('}' | ']')) {
                    fixed.push(c);
                }
            }
            _ => fixed.push(c),
        }
    }
    serde_json::from_str::<Json>(&fixed)
        .ok()
        .filter(Json::is_object)
}

/// JSON text with object keys sorted, so that the same arguments in another order compare equal.
pub(super) fn canonical(value: &Json) -> String {
    match value {
        Json::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Json::String(k.clone()), canonical(&map[k])))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Json::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

pub(super) fn truncate(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let kept: String = text.chars().take(limit).collect();
    format!(
        "{kept}\n[... cut: {} more characters]",
        text.chars().count() - limit
    )
}

impl Failure {
    /// The same failure, carrying what the step's LLM calls used.
    pub(super) fn with_llm(mut self, usage: LlmUsage) -> Self {
        self.llm = Some(Box::new(usage));
        self
    }
}
