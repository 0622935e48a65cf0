//! Agent steps (`goal:`, and description-only steps when `defaults.unspecified` is `agent`): a ReAct loop.
//!
//! Each turn the model sees the goal, the context, the allowed tools with their JSON Schemas and the trail
//! so far, and either calls tools (native tool calling) or gives its final answer. Tool calls go through the
//! same executor as the spec's own steps; every call, thought, action and observation is an event. The loop
//! is bounded by `max_iterations` (default 10), the run's LLM budget, and a guard against repeating the same
//! call; a final answer must match `output_schema` when the step has one. What the model reads is kept within
//! its context window (`context`).

mod calls;
mod consensus;
mod context;
mod delegate;
mod error;
mod memory;
mod model;
pub(crate) mod skills;
mod text;

pub(super) use calls::{mcp_tools, offered_tools};
pub(super) use context::as_data;
pub use delegate::tool as delegation_tool;
pub(super) use model::{MODEL_TIME, chosen, complete};
pub(super) use text::parse_json;

use std::collections::HashMap;

use minijinja::Value;
use serde_json::Value as Json;

use super::checkpoint::{self, AgentState, AgentStateRef};
use super::context::{Called, Failure, Shared};
use super::durable::{Record, durable};
use super::gate::{self, Gate, canonical};
use super::prompt;
use crate::llm::tokens::Estimator;
use crate::llm::{FinishReason, Message, Part, ToolChoice, ToolResult};
use crate::report::{LlmUsage, RunEvent};
use crate::run::render::to_text;
use crate::spec::{Body, ChosenBy, Spec, ToolMode, Trigger};
use crate::tools::ToolOutput;
use calls::observe;
pub(super) use error::{AgentError, limit_of, said};
use text::{TextTurn, read_text_action, text_mode_instructions, written_action};

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
/// Most tool calls one answer of the model may make; the ones past it are answered without running.
pub const MAX_CALLS_PER_TURN: usize = 16;
/// Turns in a row whose every call was invalid (an unknown tool, arguments that do not fit, calls past the
/// limit) after which the step fails instead of spending its remaining iterations.
pub const INVALID_TURNS_LIMIT: usize = 3;
/// Largest arguments (as JSON text) a tool call may carry; larger ones are refused and not recorded.
pub const MAX_ARGUMENT_BYTES: usize = 64 * 1024;
/// Longest tool name a model's call may carry; a longer one is an unknown tool's, named by its size.
pub const MAX_TOOL_NAME_BYTES: usize = 128;
/// Most bytes of one text of the model's own answer carried on in the conversation; the rest is cut with
/// a note.
pub const MAX_TURN_TEXT_BYTES: usize = 32 * 1024;

/// Runs an agent step's body: `goal` is the rendered goal. An agent with memory keeps an episode of how
/// the step ended.
pub(super) async fn run(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    goal: String,
    ctx: &Value,
) -> Result<Called, Failure> {
    // Several agents asked the same question (`ask`): their answers resolved (`consensus`).
    if body.ask.is_some() {
        return consensus::run(shared, label, body, goal, ctx).await;
    }
    run_as(shared, label, body, goal, ctx, None).await
}

/// [`run`] for the step's own agent (`chain` none) or a delegate at work for it; the results of the
/// delegations it made are nested in its own.
fn run_as<'a>(
    shared: &'a Shared,
    label: &'a str,
    body: Body<'a>,
    goal: String,
    ctx: &'a Value,
    chain: Option<&'a delegate::Chain<'a>>,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Called, Failure>> + Send + 'a>> {
    Box::pin(async move {
        let spec: &Spec = &shared.workflow.spec;
        let memory =
            memory::open(shared, label, spec.agent_name(body), spec.agent_of(body)).await?;
        let delegations = std::sync::Mutex::new(indexmap::IndexMap::new());
        let outcome = converse(
            shared,
            label,
            body,
            goal.clone(),
            ctx,
            memory.as_ref(),
            chain,
            &delegations,
        )
        .await;
        let delegations = delegations.into_inner().unwrap_or_default();
        let outcome = match outcome {
            Ok(mut called) => {
                called.steps.extend(delegations);
                Ok(called)
            }
            Err(mut failure) => {
                failure.steps.extend(delegations);
                Err(failure)
            }
        };
        ended(shared, memory.as_ref(), &goal, outcome).await
    })
}

/// Keeps an episode of how the step (or delegation) ended, for an agent with memory.
async fn ended(
    shared: &Shared,
    memory: Option<&memory::AgentMemory>,
    goal: &str,
    outcome: Result<Called, Failure>,
) -> Result<Called, Failure> {
    if let Some(memory) = memory {
        let ended = match &outcome {
            Ok(called) => Ok(called.output.text.clone()),
            Err(failure) => Err((failure.status, failure.message.clone())),
        };
        memory.episode(shared, goal, &ended).await;
    }
    outcome
}

/// The ReAct loop of an agent step (or of a delegate at work for one, on `chain`); the results of the
/// delegations it makes go to `delegations`.
#[allow(clippy::too_many_arguments)]
async fn converse(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    goal: String,
    ctx: &Value,
    memory: Option<&memory::AgentMemory>,
    chain: Option<&delegate::Chain<'_>>,
    delegations: &std::sync::Mutex<indexmap::IndexMap<String, crate::report::StepResult>>,
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
    // The step's own agent starts the delegation tree, whose budget is its iterations.
    let own_tree;
    let own_chain;
    let chain = match chain {
        Some(chain) => chain,
        None => {
            own_tree = delegate::Tree::new(shared, label, max_iterations);
            own_chain = delegate::Chain::root(&own_tree, agent_name.unwrap_or("the step"));
            &own_chain
        }
    };
    let root = chain.depth() == 0;
    // A planned agent has only the tools its plan gave it.
    let patterns: Vec<&crate::spec::Pattern> = if shared.planned && body.tools.is_none() {
        Vec::new()
    } else {
        spec.tool_patterns(body)
    };
    // The registry's tools and the MCP servers' (each server the globs reach starts here), under the
    // names models accept; `real` maps a changed name back.
    let mut tools = offered_tools(&shared.workflow.tools, &patterns);
    tools.extend(mcp_tools(shared, label, &patterns).await?);
    if let Some(memory) = memory {
        tools.extend(memory.tools());
    }
    tools.extend(chain.tools(shared, agent));
    // Its skills: their tools, and the declared tools an active skill may extend it to.
    let skills = skills::Session::new(shared, agent_name, &configured.model, &tools);
    tools.extend(skills.tools(shared));
    let (tools, real) = calls::as_offered(tools).map_err(Failure::fixed)?;
    let real_name =
        |name: &str| -> String { real.get(name).cloned().unwrap_or_else(|| name.to_owned()) };
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
    // What providers are sent: an object at the root, the step's schema wrapped when it is not one.
    let wire_schema = schema.as_ref().map(crate::llm::answer_schema);

    let mut system = String::from(
        "You are an agent completing one step of a workflow. Use the tools when they help; when you are done, \
         answer with the final result only.",
    );
    if !tools.is_empty() {
        system.push_str(context::DATA_RULE);
    }
    let mut system = prompt::with_instructions(shared, agent, ctx, system).await?;
    system.push_str(skills.prompt());
    if let Some(text) = prompt::expected_output(shared, body, ctx).await? {
        system.push_str(&format!("\n\nExpected output: {text}"));
    }
    if let Some(schema) = &schema {
        system.push_str(&format!(
            "\n\nThe final answer must be JSON matching this schema: {schema}"
        ));
    }
    let mut user = goal;
    if let Some(memory) = memory
        && let Some(recalled) = memory.prompt_section(&user).await?
    {
        user.push_str(&recalled);
    }
    user.push_str(&prompt::context_section(shared, body, ctx).await?);
    let start = |text_mode: bool| {
        let mut system = system.clone();
        if text_mode && !tools.is_empty() {
            // The tools it may call now: one a skill unlocks is described when the skill activates.
            system.push_str(&text_mode_instructions(&skills.offered(&tools, &real_name)));
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
    // One turn's request. The answer format constrains the final answer only: in text mode, where the
    // model writes its actions as text, a format sent with every request would forbid actions from the
    // first turn (and Anthropic's format is a tool, which a provider in text mode is not sent), so the
    // schema is in the prompt and the final answer is checked (and corrected) here.
    let ask = |messages: Vec<Message>, offered: Vec<crate::llm::ToolSpec>, text_mode: bool| {
        let mut request = configured.request(messages, offered);
        if !text_mode {
            request.output_schema.clone_from(&wire_schema);
        }
        if let Some(t) = agent.and_then(|a| a.temperature) {
            request.temperature = Some(t);
        }
        request
    };
    let estimator = Estimator::for_model(&configured.model);
    let repeatable = crate::resume::body_is_idempotent(&shared.workflow, body);
    let mut tool_calls = 0;
    // Turns in a row whose every call was invalid (not kept in checkpoints: a resume starts it afresh).
    let mut invalid_turns = 0;
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
    let window = conversation.window;
    let context_use = crate::report::ContextUse {
        window: window.size as u64,
        compact_at: window.threshold as u64,
        compactions: 0,
    };
    let mut usage = LlmUsage {
        context: Some(context_use),
        ..LlmUsage::default()
    };
    let mut seen_calls: HashMap<String, usize> = HashMap::new();
    let mut schema_retries = 0;
    let validator = match &schema {
        Some(s) => Some(jsonschema::validator_for(s).map_err(|e| AgentError::Schema(Box::new(e)))?),
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
    checkpoint::refuse_unreadable::<AgentState>(shared, label)?;
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
        if let Some(memory) = memory {
            memory.saw(conversation.messages());
        }
        skills.restore(conversation.messages());
        skills.activate_all(&state.skills);
        chain.restore(
            state.iteration,
            &delegate::Spent::new(state.delegated_turns, state.delegations_made),
        );
        if let Ok(mut made) = delegations.lock() {
            made.extend(state.delegations);
        }
        tool_calls = state.tool_calls;
        usage = state.usage;
        usage.context.get_or_insert(context_use);
        seen_calls = state.seen_calls;
        schema_retries = state.schema_retries;
        pending = state.pending;
    }

    for iteration in first..=max_iterations {
        chain.turn().map_err(|f| f.with_llm(usage.clone()))?;
        // What the delegates had spent before this turn: a turn taken up again on resume spends its own
        // delegations' anew (a finished one counts again what it recorded).
        let delegated_before = chain.delegated(iteration);
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
        let request = ask(
            conversation.request(Some(&note)),
            skills.offered(&offered, &real_name),
            text_mode,
        );
        let reply = match pending.take() {
            // The turn that waited for approval, taken up again as it was.
            Some(response) => Ok(response),
            None => complete(shared, label, &configured, &request, &mut usage).await,
        };
        let mut response = match reply {
            // A server without native tool calling: the step starts again in text mode, before any tool
            // ran, and later steps asking the same provider start there.
            Err(failure)
                if auto
                    && !text_mode
                    && iteration == 1
                    && crate::llm::refuses_tools(&failure.message) =>
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
                let request = ask(
                    conversation.request(Some(&note)),
                    skills.offered(&offered, &real_name),
                    true,
                );
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
        // A final answer written the text-mode way (`Thought: … Final Answer: 4`), which models offered
        // native tools write too: the answer is what follows the marker, the thought goes to the trail.
        let written_final = auto
            && !text_mode
            && response.tool_calls().next().is_none()
            && response.text().contains(FINAL_ANSWER);
        if written_final
            && let TextTurn::Final(answer) = read_text_action(&response.text(), iteration)
        {
            emit_written_thought(shared, label, iteration, &response.text());
            response.message.parts = vec![Part::Text(answer)];
        }
        if text_mode && !tools.is_empty() {
            match read_text_action(&response.text(), iteration) {
                TextTurn::Final(answer) => {
                    emit_written_thought(shared, label, iteration, &response.text());
                    response.message.parts = vec![Part::Text(answer)];
                }
                // A turn taken up again after an approval holds the call read from it then.
                TextTurn::Action(call) => {
                    if response.tool_calls().next().is_none() {
                        response.message.parts.push(Part::ToolCall(call));
                    }
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
                    conversation.push(as_kept(&Message::assistant(vec![Part::Text(
                        response.text(),
                    )])));
                    conversation.push(Message::user(format!("Observation: {problem}")));
                    continue;
                }
            }
        }
        // A tool name longer than any tool's is kept out of events and the conversation: the call is an
        // unknown tool's.
        for part in &mut response.message.parts {
            if let Part::ToolCall(call) = part
                && call.name.len() > MAX_TOOL_NAME_BYTES
            {
                call.name = format!("[archon: a tool name of {} bytes]", call.name.len());
            }
        }
        // A refusal is no answer, and the calls that came with it are not made.
        if response.finish_reason == FinishReason::ContentFilter {
            return Err(Failure::from(AgentError::Filtered(response.text())).with_llm(usage));
        }
        let calls: Vec<_> = response.tool_calls().cloned().collect();
        let text = response.text();
        if calls.is_empty() {
            // A final answer, unless the model was cut off or stopped for another reason.
            match &response.finish_reason {
                FinishReason::Stop | FinishReason::ToolCalls => {}
                FinishReason::Length => {
                    // What it wrote before the cut is in the trail.
                    if !text.trim().is_empty() {
                        shared.emit(RunEvent::AgentThought {
                            step: label.to_owned(),
                            iteration,
                            text: truncate(&text, THOUGHT_CHARS),
                        });
                    }
                    let cut = AgentError::CutOff(configured.name.clone(), configured.max_tokens);
                    return Err(Failure::from(cut).with_llm(usage));
                }
                FinishReason::ContentFilter => {
                    return Err(Failure::from(AgentError::Filtered(text)).with_llm(usage));
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
            let parsed = parse_json(&text);
            let schema = schema.as_ref().unwrap_or(&Json::Null);
            let accepts = |value: &Json| validator.is_valid(value);
            match crate::llm::answer_value(schema, accepts, &text, parsed.clone()) {
                Some(value) => {
                    emit_answer(shared, label, iteration, &text);
                    return Ok(answer(value, usage));
                }
                None => {
                    if schema_retries >= SCHEMA_RETRIES {
                        return Err(
                            Failure::from(AgentError::Mismatch(SCHEMA_RETRIES)).with_llm(usage)
                        );
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
                    let correction = format!(
                        "Your answer does not match the required JSON Schema ({problem}). Answer again with JSON only."
                    );
                    shared.emit(RunEvent::AgentAnswerRejected {
                        step: label.to_owned(),
                        iteration,
                        text: truncate(&text, THOUGHT_CHARS),
                        correction: correction.clone(),
                    });
                    conversation.push(as_kept(&response.message));
                    conversation.push(Message::user(correction));
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
        // The calls this turn counted: taken back out of `seen_calls` if the turn waits.
        let mut counted: Vec<String> = Vec::with_capacity(calls.len());
        // The model's answer as the conversation keeps it: arguments too large to carry are left out.
        conversation.push(as_kept(&response.message));
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
            pending: Some(crate::llm::ChatResponse {
                message: as_kept(&response.message),
                ..response.clone()
            }),
            delegated_turns: delegated_before.turns(),
            delegations_made: delegated_before.delegations(),
            delegations: delegations.lock().map(|d| d.clone()).unwrap_or_default(),
            skills: skills.active(),
        };
        // Guard against loops first, in order, and ask the rules (and, for sensitive tools, a person);
        // then run the turn's calls together, a few at a time.
        let mut planned = Vec::with_capacity(calls.len());
        let mut actions = Vec::with_capacity(calls.len());
        for (index, call) in calls.iter().enumerate() {
            // Too many calls, or arguments too large to keep: answered without running or counting.
            let size = call.arguments.to_string().len();
            let refused = if index >= MAX_CALLS_PER_TURN {
                Some(format!(
                    "this call was not made: an answer may make at most {MAX_CALLS_PER_TURN} tool calls, and this one made {}",
                    calls.len()
                ))
            } else if size > MAX_ARGUMENT_BYTES {
                Some(format!(
                    "this call was not made: its arguments are {size} bytes, more than the {} KiB a tool call may carry",
                    MAX_ARGUMENT_BYTES / 1024
                ))
            } else {
                None
            };
            if let Some(reason) = refused {
                let arguments = if size > MAX_ARGUMENT_BYTES {
                    Json::String(format!("[archon: {size} bytes of arguments, not recorded]"))
                } else {
                    call.arguments.clone()
                };
                actions.push(RunEvent::AgentAction {
                    step: label.to_owned(),
                    iteration,
                    tool: call.name.clone(),
                    arguments,
                });
                planned.push((call, Turn::Refused(reason)));
                continue;
            }
            let key = format!("{}:{}", call.name, canonical(&call.arguments));
            counted.push(key.clone());
            let repeats = {
                let n = seen_calls.entry(key).or_default();
                *n += 1;
                *n
            };
            if repeats > REPEAT_LIMIT {
                let repeating = AgentError::Repeating {
                    tool: call.name.clone(),
                    times: repeats,
                };
                return Err(Failure::from(repeating).with_llm(usage));
            }
            let mut arguments = call.arguments.clone();
            let mut turn = if repeats == REPEAT_LIMIT {
                Turn::Warn
            } else {
                Turn::Run
            };
            let tool_name = real_name(&call.name);
            let sensitive = shared.llm_call_asks(&tool_name, &call.arguments);
            let known = tools.iter().any(|t| t.name == call.name);
            // A handoff ends the agent's turn: it cannot share the turn with other calls.
            if known
                && calls.len() > 1
                && delegate::entry(agent, &tool_name).is_some_and(|d| d.value.hands_off())
            {
                turn = Turn::Refused(format!(
                    "this call was not made: handing the task over to `{}` ends your turn, so it must be the only call of its turn",
                    tool_name.trim_start_matches(delegate::PREFIX)
                ));
            }
            // A tool an active skill does not allow (or one only a skill could allow) is not run.
            if known && turn == Turn::Run && !skills.permits(&tool_name) {
                turn = Turn::Refused(skills.refusal(&tool_name));
            }
            let skill_rules = skills.rules();
            if known
                && turn == Turn::Run
                && (sensitive || !spec.rules.is_empty() || !skill_rules.is_empty())
            {
                let asked = gate::Call {
                    on: Trigger::BeforeTool,
                    label,
                    tool: Some(&tool_name),
                    agent: agent_name,
                    chosen_by: ChosenBy::Llm,
                    args: &call.arguments,
                    sensitive,
                    required: false,
                };
                match gate::gate_with(shared, asked, &skill_rules).await {
                    Gate::Go { redact } => {
                        arguments = crate::run::rules::redacted_args(&arguments, &redact);
                    }
                    Gate::Denied(reason, redact) => {
                        arguments = crate::run::rules::redacted_args(&arguments, &redact);
                        turn = Turn::Denied(reason);
                    }
                    Gate::Waiting(message) => {
                        let state =
                            paused(before_turn(&seen_calls, &counted), conversation.messages());
                        return Err(pause(shared, label, state, message).await);
                    }
                    Gate::Stopped(e) => return Err(Failure::from(e).with_llm(usage)),
                }
            }
            actions.push(RunEvent::AgentAction {
                step: label.to_owned(),
                iteration,
                tool: tool_name,
                arguments,
            });
            planned.push((call, turn));
        }
        // Recorded once every call of the turn may go ahead: a turn that waits shows no action yet.
        actions.into_iter().for_each(|a| shared.emit(a));
        // The delegate a call of the turn asks, when it is a delegation offered to this agent.
        let delegation_of = |call: &crate::llm::ToolCall| {
            tools
                .iter()
                .any(|t| t.name == call.name)
                .then(|| delegate::entry(agent, &real_name(&call.name)))
                .flatten()
        };
        if planned
            .iter()
            .any(|(call, turn)| *turn == Turn::Run && delegation_of(call).is_some())
        {
            // The turn is on disk before its delegates start: a resumed run takes this same turn up again
            // (its other calls may run again), and each delegate continues where it was.
            let state = paused(before_turn(&seen_calls, &counted), conversation.messages());
            let saved = checkpoint::save(shared, label, &state);
            if let Err(e) = durable(shared, saved, Record::AgentCheckpoint).await {
                return Err(Failure::from(e).with_llm(usage));
            }
        }
        let mut results = Vec::with_capacity(planned.len());
        let allowed = &tools;
        let compiled = &validators;
        let skills = &skills;
        let shown = conversation.window.observation_tokens();
        // What the turn's delegates used, and the answer of the one the task was handed to.
        let finished: std::sync::Mutex<Vec<(usize, (String, crate::report::StepResult))>> =
            std::sync::Mutex::default();
        let handed: std::sync::Mutex<Option<Json>> = std::sync::Mutex::default();
        let (finished_ref, handed_ref, delegation_of) = (&finished, &handed, &delegation_of);
        // Whether every call of the turn was invalid, and the first problem, for the breaker below.
        let mut all_invalid = !planned.is_empty();
        let mut problem: Option<String> = None;
        let numbered: Vec<_> = planned.iter().enumerate().collect();
        let mut turn_spent = Vec::new();
        for chunk in numbered.chunks(PARALLEL_CALLS) {
            let observations = futures_util::future::join_all(chunk.iter().map(|&(index, (call, turn))| async move {
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
                    Turn::Refused(reason) => Ok((reason.clone(), true, false)),
                    Turn::Run if skills.handles(&call.name) => {
                        let before: Vec<String> = allowed.iter().filter(|t| skills.permits(&real_name(&t.name))).map(|t| t.name.clone()).collect();
                        let (mut text, error, data) = skills.call(&call.name, &call.arguments);
                        // In text mode the tools are in the prompt: those the skill unlocked are told here.
                        let unlocked: Vec<crate::llm::ToolSpec> = allowed
                            .iter()
                            .filter(|t| !before.contains(&t.name) && skills.permits(&real_name(&t.name)))
                            .cloned()
                            .collect();
                        if text_mode && !error && !unlocked.is_empty() {
                            text.push_str("\nTools you may call now besides the others:");
                            text.push_str(&prompt::tool_lines(&unlocked, "Arguments"));
                        }
                        Ok((text, error, data))
                    }
                    Turn::Run if let Some(entry) = delegation_of(call) => {
                        if let Some(problem) = calls::invalid(compiled, &call.name, &call.arguments) {
                            return Ok((problem, true, false));
                        }
                        let request = delegate::Request {
                            label,
                            iteration,
                            index,
                            delegate: entry,
                            arguments: &call.arguments,
                            step_schema: body.output_schema,
                        };
                        let delegated = delegate::call(shared, chain, ctx, request).await.map_err(|f| {
                            if f.status == crate::report::StepStatus::WaitingApproval {
                                Stop::Waiting(f.message)
                            } else {
                                Stop::Failed(f)
                            }
                        })?;
                        if let Some(record) = delegated.record
                            && let Ok(mut finished) = finished_ref.lock()
                        {
                            finished.push((index, record));
                        }
                        if entry.value.hands_off()
                            && !delegated.is_error
                            && let Ok(mut handed) = handed_ref.lock()
                        {
                            *handed = Some(delegated.output);
                        }
                        Ok((delegated.text, delegated.is_error, true))
                    }
                    // Memory's tools keep their names: no provider changes them.
                    Turn::Run if let Some(memory) = memory.filter(|m| m.handles(&call.name)) => {
                        Ok(match calls::invalid(compiled, &call.name, &call.arguments) {
                            Some(problem) => (problem, true, false),
                            None => {
                                let (text, error) = memory.call(shared, &call.name, &call.arguments).await;
                                (text, error, true)
                            }
                        })
                    }
                    Turn::Run => {
                        let tool = real_name(&call.name);
                        observe(shared, label, allowed, compiled, (&call.name, &tool), &call.arguments).await.map_err(Stop::Waiting)
                    }
                }
            }))
            .await;
            // The chunk's delegations, recorded in the order they were asked for.
            let mut spent_now = Vec::new();
            let mut done = finished
                .lock()
                .map(|mut f| std::mem::take(&mut *f))
                .unwrap_or_default();
            done.sort_by_key(|(index, _)| *index);
            if let Ok(mut made) = delegations.lock() {
                for (_, (name, result)) in done {
                    spent_now.extend(result.llm.clone());
                    made.insert(name, result);
                }
            }
            let mut stop: Option<Stop> = None;
            let observations: Vec<(String, bool, bool)> = observations
                .into_iter()
                .filter_map(|o| match o {
                    Ok(o) => Some(o),
                    Err(e) => {
                        // A delegate that ended the step wins over one that waits.
                        if !matches!(stop, Some(Stop::Failed(_))) {
                            stop = Some(e);
                        }
                        None
                    }
                })
                .collect();
            match stop {
                None => {}
                Some(Stop::Waiting(message)) => {
                    // A tool (or a delegate's) waits for approval: the turn is taken up again on resume
                    // (its other calls may run again).
                    let state = paused(before_turn(&seen_calls, &counted), conversation.messages());
                    return Err(pause(shared, label, state, message).await);
                }
                Some(Stop::Failed(mut failure)) => {
                    if let Ok(mut made) = delegations.lock() {
                        made.extend(std::mem::take(&mut failure.steps));
                    }
                    for llm in turn_spent
                        .iter()
                        .chain(&spent_now)
                        .chain(failure.llm.as_deref())
                    {
                        delegate::add_usage(&mut usage, Some(llm));
                    }
                    return Err(failure.with_llm(usage));
                }
            }
            turn_spent.extend(spent_now);
            for ((_, (call, turn)), (output, is_error, from_tool)) in chunk.iter().zip(observations)
            {
                let invalid = matches!(turn, Turn::Refused(_))
                    || (matches!(turn, Turn::Run) && is_error && !from_tool);
                all_invalid &= invalid;
                if invalid && problem.is_none() {
                    problem = Some(output.clone());
                }
                let (content, full_text) = context::cut_off_thread(estimator, output, shown).await;
                shared.emit(RunEvent::AgentObservation {
                    step: label.to_owned(),
                    iteration,
                    tool: real_name(&call.name),
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
        for llm in &turn_spent {
            delegate::add_usage(&mut usage, Some(llm));
        }
        // The task was handed over: the delegate's answer is the step's.
        if let Some(output) = handed.into_inner().ok().flatten() {
            emit_answer(shared, label, iteration, &to_text(&output));
            return Ok(answer(output, usage));
        }
        invalid_turns = if all_invalid { invalid_turns + 1 } else { 0 };
        if invalid_turns >= INVALID_TURNS_LIMIT {
            let invalid = AgentError::InvalidTurns {
                turns: INVALID_TURNS_LIMIT,
                problem: problem.unwrap_or_default(),
            };
            return Err(Failure::from(invalid).with_llm(usage));
        }
        if text_mode {
            // The model wrote its action as text: it reads the observation as text too.
            conversation.pop();
            conversation.push(as_kept(&Message::assistant(vec![Part::Text(
                response.text(),
            )])));
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
        let delegated = chain.delegated(iteration);
        let saved = checkpoint::save(
            shared,
            label,
            &AgentStateRef {
                fingerprint: &fingerprint,
                text_mode,
                iteration,
                messages: conversation.messages(),
                tool_calls,
                usage: &usage,
                seen_calls: &seen_calls,
                schema_retries,
                pending: None,
                delegated_turns: delegated.turns(),
                delegations_made: delegated.delegations(),
                delegations: &delegations.lock().map(|d| d.clone()).unwrap_or_default(),
                skills: &skills.active(),
            },
        );
        // Before tools that are not safe to repeat run again, this iteration's record is on disk: a crash
        // repeats at most the calls of the iteration in flight. Without it, no further call starts.
        if !repeatable && let Err(e) = durable(shared, saved, Record::AgentCheckpoint).await {
            return Err(Failure::from(e).with_llm(usage));
        }
    }
    // Out of iterations: one last turn without tools for the best answer so far. A delegate's is a turn of
    // the step's budget as any other.
    if !root {
        chain.turn().map_err(|f| f.with_llm(usage.clone()))?;
    }
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
    let mut request = ask(conversation.request(None), offered, text_mode);
    request.tool_choice = ToolChoice::None;
    let response = complete(shared, label, &configured, &request, &mut usage).await?;
    let best: String = response.text().chars().take(500).collect();
    let incomplete = AgentError::NoAnswer {
        iterations: max_iterations,
        best,
    };
    Err(Failure::from(incomplete).with_llm(usage))
}

/// The marker of a final answer written as text.
const FINAL_ANSWER: &str = "Final Answer:";

/// The thought written before a text-mode `Final Answer:` (without its `Thought:` marker), to the trail.
fn emit_written_thought(shared: &Shared, label: &str, iteration: u32, text: &str) {
    let Some(at) = text.find(FINAL_ANSWER) else {
        return;
    };
    let thought = text[..at].trim();
    let thought = thought.strip_prefix("Thought:").unwrap_or(thought).trim();
    if !thought.is_empty() {
        shared.emit(RunEvent::AgentThought {
            step: label.to_owned(),
            iteration,
            text: truncate(thought, THOUGHT_CHARS),
        });
    }
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

/// Pauses the step for a person's decision: its state before the turn is on disk before it says so.
async fn pause(shared: &Shared, label: &str, state: AgentState, message: String) -> Failure {
    let usage = state.usage.clone();
    let saved = checkpoint::save(shared, label, &state);
    match durable(shared, saved, Record::AgentCheckpoint).await {
        Ok(()) => Failure::waiting(message).with_llm(usage),
        Err(e) => Failure::from(e).with_llm(usage),
    }
}

/// The repeated-call counts as they were before a turn that counted the calls `counted`.
fn before_turn(seen_calls: &HashMap<String, usize>, counted: &[String]) -> HashMap<String, usize> {
    let mut before = seen_calls.clone();
    for key in counted {
        if let Some(n) = before.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                before.remove(key);
            }
        }
    }
    before
}

/// Why a turn's calls stopped the agent: a call waits for a person, or a delegate ended the step.
enum Stop {
    Waiting(String),
    Failed(Failure),
}

/// What becomes of one tool call of a turn.
#[derive(Debug, PartialEq)]
enum Turn {
    Run,
    /// The same call for the third time: a warning instead.
    Warn,
    /// A rule or a person said no.
    Denied(String),
    /// Past the calls an answer may make, or arguments too large: invalid, not run.
    Refused(String),
}

/// `message`, the model's own answer, as the conversation carries it on: the arguments of each tool call
/// larger than [`MAX_ARGUMENT_BYTES`] replaced by a note of their size (such a call is refused), each text
/// longer than [`MAX_TURN_TEXT_BYTES`] cut with a note, as tool results are, so that one oversized answer
/// cannot make every later prompt too large, and unsigned reasoning left out. (Signed reasoning goes back
/// unchanged: the provider checks its signature.)
fn as_kept(message: &Message) -> Message {
    let mut message = message.clone();
    // Reasoning without a signature goes back to no provider: it is in the trail, not the conversation
    // (where it would be counted against the context window, and checkpointed, for nothing).
    message.parts.retain(|p| {
        !matches!(
            p,
            Part::Reasoning {
                signature: None,
                ..
            }
        )
    });
    for part in &mut message.parts {
        match part {
            Part::ToolCall(call) => {
                let size = call.arguments.to_string().len();
                if size > MAX_ARGUMENT_BYTES {
                    call.arguments =
                        Json::String(format!("[archon: {size} bytes of arguments, not recorded]"));
                }
            }
            Part::Text(text) => cut_own(text),
            _ => {}
        }
    }
    message
}

/// Cuts `text` to [`MAX_TURN_TEXT_BYTES`] (at a character boundary), noting how much was left out.
pub(super) fn cut_own(text: &mut String) {
    if text.len() <= MAX_TURN_TEXT_BYTES {
        return;
    }
    let end = crate::text::floor_boundary(text, MAX_TURN_TEXT_BYTES);
    let left_out = text.len() - end;
    text.truncate(end);
    text.push_str(&format!(
        "\n[archon: {left_out} more bytes of this answer were cut]"
    ));
}

pub(super) fn truncate(text: &str, limit: usize) -> String {
    match crate::text::split_at_chars(text, limit) {
        None => text.to_owned(),
        Some((kept, more)) => format!("{kept}\n[... cut: {more} more characters]"),
    }
}
