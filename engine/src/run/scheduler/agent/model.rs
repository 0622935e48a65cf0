//! The model side of an agent (and planner) step: which provider it asks, built on first use; one call
//! within the run's LLM budget, counted and reported.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::AgentError;
use crate::llm::ChatRequest;
use crate::llm::attempts::{Attempt, Report};
use crate::llm::cassette::{Recorder, Replayer};
use crate::llm::config::{self, Configured};
use crate::llm::pricing;
use crate::report::{LlmUsage, RunEvent};
use crate::run::redact::Redacting;
use crate::run::scheduler::context::{Failure, Shared, millis};
use crate::spec::{AgentDef, Body, Spec};
use crate::store::epoch_ms;

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
pub(super) fn provider(shared: &Shared, name: &str) -> Result<Arc<Configured>, Failure> {
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

/// The time the model calls of one attempt of an agent or planner step may take, in all, when neither the
/// step nor `defaults` sets a `timeout` (which then bounds the whole attempt instead).
pub const MODEL_TIME: Duration = Duration::from_secs(15 * 60);

/// One model call, within the run's budget and the step's model time, counted and reported: each request
/// that fails (and is retried by the provider, or ends the call) is an `llm_call_failed` event as it fails,
/// and counts as a call; the call's `llm_call` event has the time of the request that answered.
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
    let (limit, spent) = shared.llm.model_time(label);
    let remaining = limit.map(|l| l.saturating_sub(spent));
    if let (Some(limit), Some(Duration::ZERO)) = (limit, remaining) {
        return Err(Failure::from(AgentError::ModelTime(limit)).with_llm(usage.clone()));
    }
    // One of the run's `work` permits for the call's duration (not for the time queued for one).
    let permit = shared
        .work
        .acquire()
        .await
        .map_err(|_| AgentError::RunOver)?;
    let mut flight = InFlight {
        shared,
        label,
        configured,
        started: Instant::now(),
        request_started: Instant::now(),
        waiting: false,
        failed: 0,
        done: false,
    };
    let (observer, mut attempts) = tokio::sync::mpsc::unbounded_channel();
    let call = crate::llm::attempts::observed(observer, configured.provider.complete(request));
    tokio::pin!(call);
    let mut answered: Option<Attempt> = None;
    let waited = {
        let flight = &mut flight;
        let answered = &mut answered;
        let usage = &mut *usage;
        let watched = async move {
            let response = loop {
                tokio::select! {
                    biased;
                    Some(report) = attempts.recv() => flight.told(report, usage, answered),
                    response = &mut call => break response,
                }
            };
            while let Ok(report) = attempts.try_recv() {
                flight.told(report, usage, answered);
            }
            response
        };
        match remaining {
            Some(remaining) => tokio::time::timeout(remaining, watched).await.ok(),
            None => Some(watched.await),
        }
    };
    let took = flight.started.elapsed();
    shared.llm.spend(label, took, usage);
    let Some(response) = waited else {
        // The step's model time ran out with a request in flight: it is reported as stopped.
        let limit = limit.unwrap_or(MODEL_TIME);
        if flight.waiting {
            flight.stopped(
                &format!(
                    "stopped: the step's model calls reached their time limit of {}",
                    humantime::format_duration(limit)
                ),
                Some(usage),
            );
        }
        flight.done = true;
        return Err(Failure::from(AgentError::ModelTime(limit)).with_llm(usage.clone()));
    };
    flight.done = true;
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
    shared.llm.spend(label, Duration::ZERO, usage);
    // Stamped when the request that answered started, with its own duration (a provider that reports no
    // requests, such as `mock`, is timed as a whole).
    let (at_ms, duration) = match &answered {
        Some(attempt) => (epoch_ms(attempt.started), attempt.duration),
        None => (crate::store::now_ms().saturating_sub(millis(took)), took),
    };
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
            duration_ms: millis(duration),
        },
        at_ms,
    );
    Ok(response)
}

/// A model call in flight: reports each request as it ends, and, dropped before the call ended (the
/// step timed out, the run was stopped), the request that was still waiting, so that no request the
/// provider may have worked on goes uncounted.
struct InFlight<'a> {
    shared: &'a Shared,
    label: &'a str,
    configured: &'a Configured,
    started: Instant,
    /// When the request now in flight started.
    request_started: Instant,
    /// Whether a request is in flight (not a wait between retries).
    waiting: bool,
    failed: u32,
    done: bool,
}

impl InFlight<'_> {
    /// A request started or ended: a failed one is an event and a call counted; an answered one is kept
    /// for the call's own event.
    fn told(&mut self, report: Report, usage: &mut LlmUsage, answered: &mut Option<Attempt>) {
        let attempt = match report {
            Report::Started => {
                self.waiting = true;
                self.request_started = Instant::now();
                return;
            }
            Report::Ended(attempt) => attempt,
        };
        self.waiting = false;
        let Some(error) = &attempt.error else {
            *answered = Some(attempt);
            return;
        };
        let at = epoch_ms(attempt.started);
        self.report_failed(Some(usage), error, attempt.retrying, attempt.duration, at);
    }

    /// A failed request: counted, and an event stamped `at` (when it started).
    fn report_failed(
        &mut self,
        usage: Option<&mut LlmUsage>,
        error: &str,
        retrying: bool,
        duration: Duration,
        at: u64,
    ) {
        self.failed += 1;
        self.count_failed(usage);
        self.shared.emit_at(
            RunEvent::LlmCallFailed {
                step: self.label.to_owned(),
                provider: self.configured.name.clone(),
                model: self.configured.model.clone(),
                attempt: self.failed,
                error: error.to_owned(),
                retrying,
                duration_ms: millis(duration),
            },
            at,
        );
    }

    /// The request in flight will not end: reported as failed with `why`.
    fn stopped(&mut self, why: &str, usage: Option<&mut LlmUsage>) {
        self.done = true;
        let duration = self.request_started.elapsed();
        let at = crate::store::now_ms().saturating_sub(millis(duration));
        self.report_failed(usage, why, false, duration, at);
    }

    /// A failed request counts as a call: for the step (`usage`, when the step still has it, and the
    /// usage a timed-out attempt reports) and for the run's budget.
    fn count_failed(&self, usage: Option<&mut LlmUsage>) {
        let failed = LlmUsage::failed();
        if let Ok(mut totals) = self.shared.llm.totals.lock() {
            totals.add(&failed);
        }
        match usage {
            Some(usage) => {
                usage.add(&failed);
                self.shared.llm.spend(self.label, Duration::ZERO, usage);
            }
            None => self.shared.llm.add_to_step(self.label, &failed),
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done && self.waiting {
            self.stopped(
                "stopped while waiting for the model: the step timed out or the run was stopped",
                None,
            );
        }
    }
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
