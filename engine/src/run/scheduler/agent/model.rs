//! The model side of an agent (and planner) step: which provider it asks, built on first use; one call
//! within the run's LLM budget, counted and reported.

use std::sync::Arc;
use std::time::Instant;

use super::error::AgentError;
use crate::llm::ChatRequest;
use crate::llm::attempts::FailedAttempt;
use crate::llm::cassette::{Recorder, Replayer};
use crate::llm::config::{self, Configured};
use crate::llm::pricing;
use crate::report::{LlmUsage, RunEvent};
use crate::run::redact::Redacting;
use crate::run::scheduler::context::{Failure, Shared, millis};
use crate::spec::{AgentDef, Body, Spec};

/// The step's agent role (its own, or `defaults.agent`), provider name and built provider: the step's
/// `provider`, the agent's, `llm.default`, or the only (first) one declared.
pub(in crate::run::scheduler) fn chosen<'s>(
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
        .ok_or(AgentError::NoProvider)?;
    let configured = provider(shared, &provider_name)?;
    Ok((agent, provider_name, configured))
}

/// The provider `name` of the run, built on first use: replaying a cassette, or from the spec and the
/// environment (recording when asked), wrapped so that the model never reads a secret value.
fn provider(shared: &Shared, name: &str) -> Result<Arc<Configured>, Failure> {
    let spec = &shared.workflow.spec;
    if let Some(found) = shared
        .llm
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
        .ok_or_else(|| AgentError::UnknownProvider(name.to_owned()))?;
    // Replaying needs no provider at all: not even its key.
    if let Some(crate::run::options::Cassette::Replay(exchanges)) = &shared.options.cassette {
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
        if let Ok(mut providers) = shared.llm.providers.lock() {
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
    let mut configured =
        config::build(name, def, &dir, &shared.options.env).map_err(AgentError::Provider)?;
    if let Some(crate::run::options::Cassette::Record(file)) = &shared.options.cassette {
        let redactor = shared.redactor.clone();
        configured.provider = Arc::new(
            Recorder::new(configured.provider, file.clone())
                .scrubbing(Arc::new(move |exchange| redactor.json(exchange))),
        );
    }
    // The model never reads a secret value, whatever put it into the conversation.
    configured.provider = Redacting::wrap(configured.provider, shared.redactor.clone());
    let built = Arc::new(configured);
    if let Ok(mut providers) = shared.llm.providers.lock() {
        providers.insert(name.to_owned(), built.clone());
    }
    Ok(built)
}

/// One model call, within the run's budget, counted and reported: each request that fails (and is
/// retried by the provider, or ends the call) is an event as it fails, and counts as a call.
pub(in crate::run::scheduler) async fn complete(
    shared: &Shared,
    label: &str,
    configured: &Configured,
    request: &ChatRequest,
    usage: &mut LlmUsage,
) -> Result<crate::llm::ChatResponse, Failure> {
    if let Some(exceeded) = over_budget(shared) {
        return Err(Failure::from(AgentError::Budget(exceeded)).with_llm(usage.clone()));
    }
    // One of the run's `work` permits for the call's duration (not for the time queued for one).
    let permit = shared
        .work
        .acquire()
        .await
        .map_err(|_| AgentError::RunOver)?;
    let started = Instant::now();
    let started_at = crate::store::now_ms();
    let (observer, mut failed) = tokio::sync::mpsc::unbounded_channel();
    let call = crate::llm::attempts::observed(observer, configured.provider.complete(request));
    tokio::pin!(call);
    let response = loop {
        tokio::select! {
            biased;
            Some(attempt) = failed.recv() => attempt_failed(shared, label, configured, &attempt, usage),
            response = &mut call => break response,
        }
    };
    while let Ok(attempt) = failed.try_recv() {
        attempt_failed(shared, label, configured, &attempt, usage);
    }
    drop(permit);
    // What the provider's own retries could not fix, the step's `retry` may.
    let response =
        response.map_err(|e| Failure::from(AgentError::Call(e)).with_llm(usage.clone()))?;
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
    // Stamped when the request started: `duration_ms` says how long it took.
    shared.emit_at(
        RunEvent::LlmCall {
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
        },
        started_at,
    );
    Ok(response)
}

/// A request of a call failed: an event, and a call counted (for the step and the run's budget).
fn attempt_failed(
    shared: &Shared,
    label: &str,
    configured: &Configured,
    attempt: &FailedAttempt,
    usage: &mut LlmUsage,
) {
    let failed = LlmUsage::failed();
    usage.add(&failed);
    if let Ok(mut totals) = shared.llm.totals.lock() {
        totals.add(&failed);
    }
    shared.emit(RunEvent::LlmCallFailed {
        step: label.to_owned(),
        provider: configured.name.clone(),
        model: configured.model.clone(),
        attempt: attempt.number,
        error: attempt.error.clone(),
        retrying: attempt.retrying,
        duration_ms: millis(attempt.duration),
    });
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
