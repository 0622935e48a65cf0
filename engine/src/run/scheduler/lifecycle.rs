//! One step's life: `foreach` items and `matrix` combinations, `before_step` rules and `approval: required`, attempts with retries
//! and timeouts (each attempt recorded, and durable before a side effect), the fallback, the step's
//! `outputs`, and the `after_step` / `on_error` rules.

use std::sync::Arc;
use std::time::{Duration, Instant};

use indexmap::IndexMap;
use minijinja::Value;
use serde_json::{Map, Value as Json, json};
use tokio::task::JoinSet;

use super::context::{Called, Failure, Shared, Steps, millis, unfinished_hint};
use super::durable::{Record, persist};
use super::gate::{self, Gate};
use super::{cache, call};
use crate::report::{LlmUsage, RunEvent, StepResult, StepStatus};
use crate::run::render::{StepView, json_value, to_text};
use crate::spec::{Backoff, Body, Node, Retry, RetryOn, Step, Trigger};
use crate::store::Entry;
use crate::validate::MAX_COMBINATIONS;

pub(super) async fn execute(shared: &Arc<Shared>, index: usize, steps: Steps) -> Arc<StepResult> {
    let step = &shared.steps()[index];
    // A step without `foreach` says it started once it is known not to be served from the cache
    // (`attempt_all`): a cached step says only `step_cached`.
    if step.repeats() {
        shared.emit(RunEvent::StepStarted {
            step: shared.label(&step.id.value),
        });
    }
    let started = Instant::now();
    let mut result = if step.repeats() {
        foreach(shared, index, &steps).await
    } else {
        attempt_all(shared, step, &steps, None, shared.label(&step.id.value)).await
    };
    if result.status == StepStatus::Succeeded && !step.outputs.is_empty() {
        // The outputs read the step's result as it is before they are added to it.
        let own = StepView::new(result);
        let mut steps = steps;
        steps.insert(step.id.value.clone(), own.value());
        let (outputs, failed) = {
            let ctx = shared.context(&steps, false, &[]);
            shared.renderer.outputs(&step.outputs, &ctx).await
        };
        let failed = failed.map(|(name, e)| {
            let hint = unfinished_hint(step.outputs.get(name.as_str()), &steps);
            format!("output `{name}`: {e}{hint}")
        });
        drop(steps);
        result = own.into_result();
        result.outputs = outputs;
        if let Some(error) = failed {
            result.status = StepStatus::Failed;
            result.error = Some(error);
        }
    }
    after_step(shared, step, &mut result).await;
    result.duration_ms = millis(started.elapsed());
    let result = Arc::new(result);
    shared.record_result(&step.id.value, &result);
    shared.result_durable(step).await;
    // A step served from the cache said so (`step_cached`), as a reused step does; it says how it
    // finished only when its `outputs` or an `after_step` rule failed it.
    if result.cached.is_none() || result.status != StepStatus::Succeeded {
        shared.emit(RunEvent::StepFinished {
            step: shared.label(&step.id.value),
            status: result.status,
            duration_ms: result.duration_ms,
            error: result.error.clone(),
        });
    }
    result
}

/// Runs the body once per item of the `foreach` list, or per combination of the `matrix`, at most
/// `max_parallel` at a time, results in order.
async fn foreach(shared: &Arc<Shared>, index: usize, steps: &Steps) -> StepResult {
    let step = &shared.steps()[index];
    let ctx = shared.context(steps, false, &[]);
    let items = match items(shared, step, &ctx).await {
        Ok(items) => items,
        Err(message) => return StepResult::ended(StepStatus::Failed, Some(message)),
    };
    let limit = step
        .max_parallel
        .as_ref()
        .map_or(shared.options.max_parallel, |m| m.value as usize)
        .max(1);
    let mut results: Vec<Option<Arc<StepResult>>> = vec![None; items.len()];
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
                    return (position, Arc::new(prior.clone()));
                }
                let mut result =
                    attempt_all(&shared, step, &steps, Some((item, position)), label.clone()).await;
                result.item = Some(fingerprint);
                let result = Arc::new(result);
                shared.record_result(&label, &result);
                shared.result_durable(step).await;
                (position, result)
            }));
        }
        match set.join_next().await {
            Some(Ok((position, result))) => results[position] = Some(result),
            Some(Err(_)) => {}
            None => break,
        }
    }
    // An item's result is taken back from its record, copied only if the record is not written yet.
    let results: Vec<StepResult> = results
        .into_iter()
        .map(|r| match r {
            Some(result) => Arc::try_unwrap(result).unwrap_or_else(|r| StepResult::clone(&r)),
            None => StepResult::ended(StepStatus::Failed, Some("an item's task failed".into())),
        })
        .collect();
    gathered(results).await
}

/// The items a repeating step runs once for: its `foreach` list, or its `matrix`'s combinations.
async fn items(shared: &Shared, step: &Step, ctx: &Value) -> Result<Vec<Json>, String> {
    if let Some(list) = &step.foreach {
        return list_of(shared, list, ctx, "`foreach`").await;
    }
    let mut lists = Vec::new();
    for (name, list) in step.matrix.iter().flat_map(|m| m.iter()) {
        let what = format!("`matrix.{}`", name.value);
        lists.push((name.value.clone(), list_of(shared, list, ctx, &what).await?));
    }
    combinations(lists)
}

/// A list written out (its strings rendered as templates), or an expression's value, which must be a list.
async fn list_of(
    shared: &Shared,
    list: &Node,
    ctx: &Value,
    what: &str,
) -> Result<Vec<Json>, String> {
    let value = match list.as_str() {
        Some(expr) => shared.renderer.expression(expr, ctx).await,
        None => shared.renderer.value(list, ctx).await,
    };
    match value {
        Ok(Json::Array(items)) => Ok(items),
        Ok(other) => {
            let kind = match other {
                Json::Null => "null",
                Json::Object(_) => "an object",
                Json::String(_) => "a string",
                _ => "a scalar",
            };
            Err(format!("{what} must give a list, got {kind}"))
        }
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// Every combination of one value of each list, as an object by name: the first list varies slowest,
/// the last fastest. More than [`MAX_COMBINATIONS`] is an error, found before any is built.
fn combinations(lists: Vec<(String, Vec<Json>)>) -> Result<Vec<Json>, String> {
    let count = lists
        .iter()
        .fold(1usize, |n, (_, list)| n.saturating_mul(list.len()));
    if count > MAX_COMBINATIONS {
        let sizes: Vec<String> = lists.iter().map(|(_, l)| l.len().to_string()).collect();
        return Err(format!(
            "`matrix` makes {} combinations ({}), more than {MAX_COMBINATIONS}",
            if count == usize::MAX {
                "too many".to_owned()
            } else {
                count.to_string()
            },
            sizes.join(" × ")
        ));
    }
    Ok((0..count)
        .map(|position| {
            let mut rest = position;
            let mut chosen = vec![Json::Null; lists.len()];
            for (slot, (_, list)) in lists.iter().enumerate().rev() {
                chosen[slot] = list[rest % list.len()].clone();
                rest /= list.len();
            }
            Json::Object(
                lists
                    .iter()
                    .zip(chosen)
                    .map(|((name, _), value)| (name.clone(), value))
                    .collect(),
            )
        })
        .collect())
}

/// Items whose texts add up to more than this are gathered into the step's result on a blocking thread.
const GATHERED_IN_PLACE: usize = 64 * 1024;

/// The result of a `foreach` step from its items' results: on a blocking thread when they are large, since
/// copying their outputs and writing them as one JSON text (megabytes, for items that read files) would
/// hold every other step, timeout and Ctrl-C of the run.
async fn gathered(results: Vec<StepResult>) -> StepResult {
    if results.iter().map(|r| r.text.len()).sum::<usize>() <= GATHERED_IN_PLACE {
        return gather(results);
    }
    tokio::task::spawn_blocking(move || gather(results))
        .await
        .unwrap_or_else(|_| {
            StepResult::ended(
                StepStatus::Failed,
                Some("the items' results could not be gathered".into()),
            )
        })
}

/// The items' outputs are moved into the step's, not copied, and its text is written once, into room
/// for about what the items' texts take: a step of 100 items of 1 MB holds 200 MB, not 400.
fn gather(results: Vec<StepResult>) -> StepResult {
    let failure = results
        .iter()
        .enumerate()
        .find(|(_, r)| r.status != StepStatus::Succeeded)
        .map(|(i, r)| {
            (
                r.status,
                format!("item {i}: {}", r.error.as_deref().unwrap_or("failed")),
            )
        });
    let attempts = results.iter().map(|r| r.attempts).sum();
    let fallback = results.iter().any(|r| r.fallback);
    let llm =
        results
            .iter()
            .filter_map(|r| r.llm.as_ref())
            .fold(None, |sum: Option<LlmUsage>, u| {
                let mut sum = sum.unwrap_or_default();
                sum.add(u);
                Some(sum)
            });
    let room = results.iter().map(|r| r.text.len() + 8).sum::<usize>() + 2;
    let output = Json::Array(results.into_iter().map(|r| r.output).collect());
    let mut text = Vec::with_capacity(room);
    // Writing a JSON value to memory cannot fail.
    let _ = serde_json::to_writer(&mut text, &output);
    let (status, error) = failure.map_or((StepStatus::Succeeded, None), |(s, e)| (s, Some(e)));
    StepResult {
        status,
        text: String::from_utf8(text).unwrap_or_default(),
        output,
        outputs: Map::new(),
        error,
        attempts,
        exit_code: None,
        duration_ms: 0,
        fallback,
        steps: IndexMap::new(),
        llm,
        item: None,
        plan: None,
        cached: None,
        task: None,
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
    // A step `retry --from` runs afresh runs what it calls afresh too.
    let refreshing = cache::refreshing(shared, step);
    let shared = refreshing.as_ref().unwrap_or(shared);
    let extra = match &item {
        // In a `matrix` step, the item is the combination, also read as `matrix.<name>`.
        Some((item, index)) if step.matrix.is_some() => vec![
            ("item", json_value(item)),
            ("matrix", json_value(item)),
            ("index", Value::from(*index)),
        ],
        Some((item, index)) => vec![("item", json_value(item)), ("index", Value::from(*index))],
        None => Vec::new(),
    };
    let ctx = shared.context(steps, true, &extra);
    let defaults = shared.workflow.spec.defaults.as_ref();
    let retry = step
        .retry
        .as_deref()
        .or_else(|| defaults.and_then(|d| d.retry.as_ref()));
    // A step with `cache` whose call's key has a result is done: nothing is asked and nothing runs.
    let cacheable = cache::prepare(shared, step, &ctx, item.as_ref().map(|(i, _)| i), &label).await;
    if let Some(hit) = cacheable
        .as_ref()
        .and_then(|c| cache::hit(shared, step, c, &label))
    {
        return hit;
    }
    if item.is_none() {
        shared.emit(RunEvent::StepStarted {
            step: label.clone(),
        });
    }
    if let Some(stopped) =
        before_step(shared, step, &label, &ctx, item.as_ref().map(|(i, _)| i)).await
    {
        return stopped;
    }
    let rendered = cacheable.as_ref().and_then(|c| c.args.as_ref());
    let (outcome, mut attempts) =
        with_retries(shared, &label, step.body(), None, retry, &ctx, rendered).await;
    let outcome = match (outcome, &step.fallback) {
        // A cancelled run starts nothing new, fallbacks included.
        (Err(failure), Some(fallback))
            if !matches!(
                failure.status,
                StepStatus::Cancelled | StepStatus::WaitingApproval
            ) =>
        {
            // The fallback's own `timeout`, else the step's, as a budget of its own.
            // The fallback's attempts are the step's too, as they are recorded.
            let (fallback_outcome, more) = with_retries(
                shared,
                &label,
                fallback.body(),
                Some(step.timeout.as_deref()),
                fallback.retry.as_deref(),
                &ctx,
                None,
            )
            .await;
            attempts += more;
            fallback_outcome.map(|o| (o, true))
        }
        (outcome, _) => outcome.map(|o| (o, false)),
    };
    let result = match outcome {
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
            cached: None,
            task: None,
        },
        Err(failure) => StepResult {
            exit_code: failure.exit_code,
            attempts,
            steps: failure.steps,
            llm: failure.llm.map(|u| *u),
            ..StepResult::ended(failure.status, Some(failure.message))
        },
    };
    if let Some(cacheable) = cacheable {
        cache::keep(shared, step, cacheable, &label, &result);
    }
    result
}

/// The attempts of a step's body, or of its fallback (`fallback`: the step's own `timeout`, which bounds
/// the fallback when it has none of its own). The time limit of each attempt is the body's `timeout`, else
/// (for a fallback) the step's, else `defaults.timeout`. `rendered`: the body's arguments, when they were
/// rendered already (for the step's cache key).
async fn with_retries(
    shared: &Shared,
    label: &str,
    body: Body<'_>,
    fallback: Option<Option<&crate::spec::Duration>>,
    retry: Option<&Retry>,
    ctx: &Value,
    rendered: Option<&Json>,
) -> (Result<Called, Failure>, u32) {
    let attempts = retry.map_or(1, |r| r.attempts.value.max(1));
    let timeout = body
        .timeout
        .or(fallback.flatten())
        .or_else(|| {
            shared
                .workflow
                .spec
                .defaults
                .as_ref()
                .and_then(|d| d.timeout.as_ref())
        })
        .and_then(|t| t.value.get());
    // An agent or planner step is bounded even when nothing says how long it may take: without a
    // `timeout`, the time of its model calls (retries included) is, so that a model that never answers
    // cannot hold the run for ever, while its tools, a person's approval and a plan's steps take theirs.
    let llm_step = body.tool.is_none() && body.workflow.is_none();
    let model_time = timeout.is_none().then_some(super::agent::MODEL_TIME);
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
                fallback: fallback.is_some(),
            });
            open = Some(OpenAttempt { shared, label });
            if must_persist && let Err(e) = persist(shared, Record::Attempt).await {
                let failure = Failure::from(e);
                if let Some(open) = open.take() {
                    open.end(StepStatus::Failed, Some(failure.message.clone()));
                }
                return (Err(failure), attempt);
            }
            // Stopped (Ctrl-C, `archon cancel`) while its record was made durable: a side effect starts
            // only in a run that goes on. The attempt is recorded as skipped, not cancelled, so that a
            // resume knows it had no effect.
            if must_persist && shared.options.cancel.is_cancelled() {
                let message = "the run was stopped before it started".to_owned();
                if let Some(open) = open.take() {
                    open.end(StepStatus::Skipped, Some(message.clone()));
                }
                return (
                    Err(Failure {
                        status: StepStatus::Cancelled,
                        ..Failure::fixed(message)
                    }),
                    attempt,
                );
            }
        }
        if llm_step {
            shared.llm.begin_step(label, model_time);
        }
        let call = call::body(shared, label, body, ctx, rendered);
        let outcome = match timeout {
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(outcome) => outcome,
                Err(_) => Err(Failure {
                    status: StepStatus::TimedOut,
                    message: format!("timed out after {}", humantime::format_duration(limit)),
                    exit_code: None,
                    retryable: true,
                    class: crate::tools::ErrorClass::Other,
                    steps: IndexMap::new(),
                    // What its model calls used until then, which the dropped step could not report.
                    llm: shared
                        .llm
                        .end_step(label)
                        .filter(|m| m.usage.calls > 0)
                        .map(|m| Box::new(m.usage)),
                }),
            },
            None => call.await,
        };
        if llm_step {
            shared.llm.end_step(label);
        }
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
            // Without `on`, what `error` names.
            _ => retry_on.map_or(retries(RetryOn::Error, failure.class), |on| {
                on.iter().any(|o| retries(o.value, failure.class))
            }),
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

/// Whether `retry.on` naming `on` retries a failure of `class` (a permanent one is never retried, and
/// never reaches here).
fn retries(on: RetryOn, class: crate::tools::ErrorClass) -> bool {
    use crate::tools::ErrorClass;
    match on {
        RetryOn::Error => class != ErrorClass::ClientError,
        RetryOn::Timeout => false,
        RetryOn::ServerError => class == ErrorClass::ServerError,
        RetryOn::ClientError => class == ErrorClass::ClientError,
        RetryOn::RateLimited => class == ErrorClass::RateLimited,
        RetryOn::Connect => class == ErrorClass::Connect,
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
        .and_then(|d| d.value.get())
        .unwrap_or(Duration::from_secs(1));
    let max = retry
        .max_delay
        .as_ref()
        .and_then(|d| d.value.get())
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
        match shared.renderer.value(args, ctx).await {
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
        agent: shared.agent_of(step.body()),
        chosen_by: shared.chosen_by(),
        args: &args,
        sensitive: false,
        required,
    };
    match gate::gate(shared, call).await {
        Gate::Go { .. } => None,
        Gate::Denied(reason, _) => Some(StepResult::ended(StepStatus::Failed, Some(reason))),
        Gate::Stopped(e) => Some(StepResult::ended(StepStatus::Failed, Some(e.to_string()))),
        Gate::Waiting(message) => Some(StepResult::ended(
            StepStatus::WaitingApproval,
            Some(message),
        )),
    }
}

/// The `after_step` rules (a `deny` rejects the step's result) and, for a failed step, the `on_error`
/// rules (`log`).
async fn after_step(shared: &Shared, step: &Step, result: &mut StepResult) {
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
        let event = crate::run::rules::Event {
            on,
            step: Some(&label),
            tool: step.tool.as_ref().map(|t| t.value.as_str()),
            agent: shared.agent_of(step.body()),
            chosen_by: shared.chosen_by(),
            args: &result.output,
            run: &run,
        };
        let verdict = crate::run::rules::evaluate(rules, &shared.renderer, &event).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::others_ran_during;

    /// A matrix's combinations: the first list varies slowest; an empty list makes none; more than
    /// `MAX_COMBINATIONS` is refused before any is built, even when the count overflows.
    #[test]
    fn combinations_are_the_cross_product_in_order_and_bounded() {
        let list = |name: &str, values: Json| {
            let Json::Array(values) = values else {
                unreachable!()
            };
            (name.to_owned(), values)
        };
        assert_eq!(
            combinations(vec![
                list("os", json!(["linux", "mac"])),
                list("py", json!([3.11, 3.12]))
            ])
            .expect("small"),
            vec![
                json!({"os": "linux", "py": 3.11}),
                json!({"os": "linux", "py": 3.12}),
                json!({"os": "mac", "py": 3.11}),
                json!({"os": "mac", "py": 3.12}),
            ]
        );
        assert_eq!(
            combinations(vec![list("a", json!([1, 2])), list("b", json!([]))]),
            Ok(Vec::new())
        );
        let hundred = Json::Array((0..101).map(Json::from).collect());
        assert_eq!(
            combinations(vec![list("a", hundred.clone()), list("b", hundred)])
                .expect_err("too many"),
            "`matrix` makes 10201 combinations (101 × 101), more than 10000"
        );
        let huge: Vec<(String, Vec<Json>)> = (0..70)
            .map(|i| (format!("n{i}"), vec![json!(1), json!(2)]))
            .collect();
        assert!(
            combinations(huge)
                .expect_err("too many")
                .starts_with("`matrix` makes too many combinations")
        );
    }

    /// Gathering a `foreach` step's large items into its result (their outputs copied, the whole written
    /// as one JSON text) lets the run's other tasks go on: done in place, on the run's one thread, no other
    /// task could run until it ended.
    #[tokio::test]
    async fn large_items_are_gathered_while_the_run_goes_on() {
        let item = |text: &str| {
            let mut result = StepResult::ended(StepStatus::Succeeded, None);
            result.output = Json::String(text.to_owned());
            result.text = text.to_owned();
            result
        };
        let big = "x".repeat(4 << 20);
        let (gathered, during) =
            others_ran_during(gathered(vec![item(&big), item(&big), item("small")])).await;
        assert_eq!(gathered.status, StepStatus::Succeeded);
        assert_eq!(
            gathered.text.len(),
            2 * (big.len() + 2) + "\"small\"".len() + 4
        );
        assert!(
            during > 0,
            "no other task ran while the items were gathered"
        );
    }
}
