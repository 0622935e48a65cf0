//! Step-result caching (`cache:` on a step): the key of a step's call, whether the call may be served
//! from the cache at all, the hit, and the entry a success leaves for later runs.
//!
//! The key is a SHA-256 over a canonical encoding (each field length-prefixed, JSON objects with sorted
//! keys) of the workflow's name, the step's id, the `foreach` item and either the rendered `cache.key` or
//! the step's content: the workspace and the spec's rendered `env`, then for a tool step the tool's name,
//! its definition and the rendered arguments, for a sub-workflow step its files and inputs, and for an
//! LLM step the provider (name, definition, kind, model, base URLs from the environment), the agent role, its delegates and its skills (with the files a model may read),
//! the step as written, the rendered goal, instructions, context and expected output, and the tools it
//! is offered with their definitions. Secret values are masked before anything is hashed.

use std::time::Duration;

use minijinja::Value;
use serde_json::{Map, Value as Json, json};
use sha2::{Digest, Sha256};

use super::context::Shared;
use super::{agent, prompt};
use crate::report::{CachedFrom, RunEvent, StepResult, StepStatus};
use crate::run::options::Refresh;
use crate::run::rules::{self, Event};
use crate::spec::{Action, Approval, Body, Step, Trigger};
use crate::store::Entry;
use crate::tools::ToolRef;
use crate::workflow::Workflow;

/// What caching one call of a step needs.
pub(super) struct Cacheable {
    pub key: String,
    pub ttl: Option<Duration>,
    /// The arguments, rendered for the key: the call uses them as they are, not rendered again.
    pub args: Option<Json>,
}

/// The key of the call the step (or its `foreach` item) is about to make, or `None` when the step is
/// not cached in this run: no `cache`, a composite tool's or a plan's step, a rule that would ask about
/// or deny the call, or a key that cannot be worked out (the call then fails as it would have).
pub(super) async fn prepare(
    shared: &Shared,
    step: &Step,
    ctx: &Value,
    item: Option<&Json>,
    label: &str,
) -> Option<Cacheable> {
    let cache = &step.cache.as_deref()?.value;
    if !cache.enabled()
        || shared.composite.is_some()
        || shared.planned
        || step
            .approval
            .as_ref()
            .is_some_and(|a| a.value == Approval::Required)
    {
        return None;
    }
    let body = step.body();
    let calls = body.tool.is_some() || body.workflow.is_some();
    let args = match body.args {
        Some(args) if calls => Some(shared.renderer.value(args, ctx).await.ok()?),
        _ if calls => Some(Json::Object(Map::new())),
        _ => None,
    };
    if rules_stop(shared, step, label, args.as_ref(), item).await {
        return None;
    }
    let mut hash = Hasher::new();
    hash.str("archon-cache/1");
    hash.str(&shared.workflow.name);
    hash.str(&step.id.value);
    match item {
        Some(item) => hash.json(shared, item),
        None => hash.str(""),
    }
    match cache.key() {
        Some(key) => {
            let text = shared.renderer.text(&key.value, ctx).await.ok()?;
            hash.str("key");
            hash.str(&shared.redactor.text(&text));
        }
        None => content(shared, &mut hash, body, ctx, args.as_ref()).await?,
    }
    Some(Cacheable {
        key: hash.finish(),
        ttl: cache.ttl().and_then(|t| t.value.get()),
        args,
    })
}

/// For a step `retry --from` runs afresh (`Refresh::Steps`), the context its call runs in: one where
/// every step refreshes, so that the cached steps of the sub-workflows and composite tools it calls run
/// afresh too. `None` for any other step.
pub(super) fn refreshing(shared: &Shared, step: &Step) -> Option<Shared> {
    match &shared.options.cache.refresh {
        Refresh::Steps(steps) if shared.depth == 0 && steps.contains(&step.id.value) => {
            let mut refreshing = shared.clone();
            refreshing.options.cache.refresh = Refresh::All;
            Some(refreshing)
        }
        _ => None,
    }
}

/// The cached result for `cacheable`, marked as reused and announced, unless the step runs regardless.
pub(super) fn hit(
    shared: &Shared,
    step: &Step,
    cacheable: &Cacheable,
    label: &str,
) -> Option<StepResult> {
    let cache = &shared.options.cache;
    match &cache.refresh {
        Refresh::All => return None,
        Refresh::Steps(steps) if shared.depth == 0 && steps.contains(&step.id.value) => {
            return None;
        }
        _ => {}
    }
    let entry = cache.entries.get(&cacheable.key)?;
    let mut result = entry.result.clone();
    result.attempts = 0;
    result.fallback = false;
    result.item = None;
    result.cached = Some(CachedFrom {
        run: entry.summary.run_id.clone(),
        step: entry.summary.source.clone(),
        at_ms: entry.summary.created_at,
    });
    shared.emit(RunEvent::StepCached {
        step: label.to_owned(),
        run: entry.summary.run_id.clone(),
        from: entry.summary.source.clone(),
    });
    Some(result)
}

/// Keeps a successful result of the step's own body (not its fallback's: the key describes the body)
/// for later runs. A result holding a secret is not kept: the store keeps it masked, and a hit would
/// give later steps `***` where this run gave them the value.
pub(super) fn keep(
    shared: &Shared,
    step: &Step,
    cacheable: Cacheable,
    label: &str,
    result: &StepResult,
) {
    if result.status != StepStatus::Succeeded || result.fallback || result.cached.is_some() {
        return;
    }
    if shared.redactor.finds_in_result(result) {
        return;
    }
    let kept = result.clone();
    let ttl_ms = cacheable
        .ttl
        .map(|ttl| u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
    shared.options.journal.record(Entry::Cached {
        key: cacheable.key,
        workflow: shared.workflow.name.clone(),
        step: step.id.value.clone(),
        source: label.to_owned(),
        result: std::sync::Arc::new(kept),
        ttl_ms,
    });
}

/// Whether a rule would ask about or deny the step's call: such a call is never served from the cache
/// (and its result is not kept), so that the person or the rule decides every time. For an LLM step,
/// whose calls are not known before it runs, any `before_tool` rule that asks or denies counts.
async fn rules_stop(
    shared: &Shared,
    step: &Step,
    label: &str,
    args: Option<&Json>,
    item: Option<&Json>,
) -> bool {
    let rules = &shared.workflow.spec.rules;
    if rules.is_empty() {
        return false;
    }
    let body = step.body();
    let tool = body.tool.map(|t| t.value.as_str());
    if tool.is_none()
        && body.workflow.is_none()
        && rules.iter().any(|r| {
            r.on.value == Trigger::BeforeTool
                && matches!(r.action.value, Action::Ask | Action::Deny)
        })
    {
        return true;
    }
    let run = json!({ "id": shared.options.run_id, "workflow": shared.workflow.name });
    // What `before_step` rules see (as `lifecycle::before_step` builds it).
    let mut call = Map::new();
    if let Some(args) = args {
        call.insert("with".to_owned(), args.clone());
    }
    if let Some(goal) = body.goal.or(body.plan).or(body.description) {
        call.insert("goal".to_owned(), Json::String(goal.value.clone()));
    }
    if let Some(item) = item {
        call.insert("item".to_owned(), item.clone());
    }
    let step_args = Json::Object(call);
    let empty = Json::Object(Map::new());
    let mut events = vec![(Trigger::BeforeStep, &step_args)];
    if tool.is_some() {
        events.push((Trigger::BeforeTool, args.unwrap_or(&empty)));
    }
    for (on, args) in events {
        let event = Event {
            on,
            step: Some(label),
            tool,
            agent: shared.agent_of(body),
            chosen_by: shared.chosen_by(),
            args,
            run: &run,
        };
        let verdict = rules::evaluate(rules, &shared.renderer, &event).await;
        if matches!(verdict.decision, Some(Action::Ask | Action::Deny)) {
            return true;
        }
    }
    false
}

/// Hashes what the result of the step's body depends on; `None` when some of it cannot be worked out.
async fn content(
    shared: &Shared,
    hash: &mut Hasher,
    body: Body<'_>,
    ctx: &Value,
    args: Option<&Json>,
) -> Option<()> {
    hash.str("workdir");
    hash.str(&shared.options.workdir.to_string_lossy());
    hash.str("env");
    for (name, value) in &shared.tool_context.env {
        hash.str(name);
        hash.str(&shared.redactor.text(value));
    }
    if let Some(tool) = body.tool {
        hash.str("tool");
        hash.str(&tool.value);
        if builtin(shared, &tool.value) {
            // What `builtin_digest` holds, without hashing it apart.
            hash.str("builtin");
            hash.str(env!("CARGO_PKG_VERSION"));
        } else {
            hash.bytes(&tool_digest(shared, &tool.value));
        }
        hash.json(shared, args.unwrap_or(&Json::Null));
        return Some(());
    }
    if let Some(path) = body.workflow {
        hash.str("workflow");
        hash.str(&path.value);
        hash.bytes(&workflow_digest(shared, &path.value));
        hash.json(shared, args.unwrap_or(&Json::Null));
        return Some(());
    }
    // An LLM step: an agent, or the planner.
    hash.str("llm");
    let (agent, provider, configured) = agent::chosen(shared, body).ok()?;
    hash.str(&provider);
    let spec = &shared.workflow.spec;
    let def = spec
        .llm
        .as_ref()
        .and_then(|l| l.providers.get(provider.as_str()));
    hash.value(&serde_json::to_value(def).ok()?);
    hash.str(&format!("{:?}", configured.kind));
    hash.str(&configured.model);
    for name in [
        "ARCHON_PROVIDER",
        "ARCHON_OPENAI_BASE_URL",
        "OPENAI_BASE_URL",
        "ARCHON_ANTHROPIC_BASE_URL",
        "ANTHROPIC_BASE_URL",
        "ARCHON_GEMINI_BASE_URL",
        "GEMINI_BASE_URL",
    ] {
        hash.str(shared.options.env.get(name).map_or("", String::as_str));
    }
    hash.value(&serde_json::to_value(agent).ok()?);
    hash.value(&serde_json::to_value(&spec.defaults).ok()?);
    // The agents it may delegate to, at every depth, as written, with their providers and tools.
    let mut delegates: Vec<&str> = agent
        .map(|a| a.delegates.iter().map(|d| d.name()).collect())
        .unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = delegates.pop() {
        let Some(delegate) = spec.agents.get(name).filter(|_| seen.insert(name)) else {
            continue;
        };
        hash.str(name);
        hash.value(&serde_json::to_value(delegate).ok()?);
        let provider = delegate.provider.as_ref().map(|p| p.value.as_str());
        let provider = provider.and_then(|p| spec.llm.as_ref()?.providers.get(p));
        hash.value(&serde_json::to_value(provider).ok()?);
        for tool in shared.workflow.tools.iter() {
            if !matches!(tool.kind, ToolRef::Mcp)
                && delegate.tools.iter().any(|p| p.value.matches(&tool.name))
            {
                hash.str(&tool.name);
                hash.bytes(&tool_digest(shared, &tool.name));
            }
        }
        delegates.extend(delegate.delegates.iter().map(|d| d.name()));
    }
    // The agent's skills as read: a changed `SKILL.md`, `rules.yaml` or file the model may read (in
    // `references/`, `assets/` or `scripts/`) is another call.
    for skill in shared.workflow.skills.of(spec.agent_name(body)).iter() {
        hash.str(&skill.name);
        hash.str(&skill.description);
        hash.str(&skill.body);
        hash.value(&serde_json::to_value(&skill.allowed_tools).ok()?);
        hash.value(&serde_json::to_value(&skill.rules).ok()?);
        for (path, read) in agent::skills::resources(skill) {
            hash.str(&path);
            match read {
                Ok(text) => hash.str(&text),
                Err(error) => hash.str(&error),
            }
        }
    }
    let goal = body.goal.or(body.plan).or(body.description)?;
    hash.str(
        &shared
            .redactor
            .text(&shared.renderer.text(&goal.value, ctx).await.ok()?),
    );
    let instructions = prompt::with_instructions(shared, agent, ctx, String::new())
        .await
        .ok()?;
    hash.str(&shared.redactor.text(&instructions));
    let expected = prompt::expected_output(shared, body, ctx).await.ok()?;
    hash.str(expected.as_deref().unwrap_or(""));
    hash.str(&prompt::context_section(shared, body, ctx).await.ok()?);
    // The rest of the step as written (`output_schema`, `tools`, `max_iterations`, `provider`, ...).
    let written = json!({
        "output_schema": body.output_schema.map(crate::spec::Node::to_json),
        "tools": body.tools.map(|t| t.iter().map(|p| p.value.as_str()).collect::<Vec<_>>()),
        "max_iterations": body.max_iterations.map(|m| m.value),
        "agent": body.agent.map(|a| a.value.as_str()),
        "provider": body.provider.map(|p| p.value.as_str()),
    });
    hash.value(&written);
    for tool in shared.workflow.tools.iter() {
        if !matches!(tool.kind, ToolRef::Mcp)
            && spec
                .tool_patterns(body)
                .iter()
                .any(|p| p.matches(&tool.name))
        {
            hash.str(&tool.name);
            hash.bytes(&tool_digest(shared, &tool.name));
        }
    }
    Some(())
}

/// The digest of tool `name`'s definition: a built-in's name and archon's version; a declared tool's
/// definition as written (a composite tool's with every declared tool, which its steps may call; a
/// sub-workflow tool's with the sub-workflow). Worked out once per run.
fn tool_digest(shared: &Shared, name: &str) -> [u8; 32] {
    if builtin(shared, name) {
        return builtin_digest(name);
    }
    let memo = format!("tool\0{}\0{name}", shared.workflow.name);
    memoized(shared, memo, || {
        let mut hash = Hasher::new();
        let spec = &shared.workflow.spec;
        match (
            shared.workflow.tools.get(name).map(|t| t.kind),
            spec.tools.get(name),
        ) {
            (Some(ToolRef::Builtin(_)), _) | (_, None) => return builtin_digest(name),
            (Some(ToolRef::Composite), Some(_)) => {
                hash.str("composite");
                hash.value(&serde_json::to_value(&spec.tools).unwrap_or(Json::Null));
            }
            (_, Some(def)) => {
                hash.str("declared");
                hash.value(&serde_json::to_value(def).unwrap_or(Json::Null));
                if let Some(path) = &def.workflow {
                    hash.bytes(&workflow_digest(shared, &path.value));
                }
            }
        }
        hash.digest()
    })
}

/// Whether `name` is a built-in tool (a declared tool of the same name does not replace it, and is
/// refused by validation).
fn builtin(shared: &Shared, name: &str) -> bool {
    matches!(
        shared.workflow.tools.get(name).map(|t| t.kind),
        Some(ToolRef::Builtin(_))
    )
}

/// A built-in's digest: its name and archon's version.
fn builtin_digest(name: &str) -> [u8; 32] {
    let mut hash = Hasher::new();
    hash.str("builtin");
    hash.str(name);
    hash.str(env!("CARGO_PKG_VERSION"));
    hash.digest()
}

/// The digest of sub-workflow `path` as validated with the run: its spec, and its own sub-workflows'.
fn workflow_digest(shared: &Shared, path: &str) -> [u8; 32] {
    let memo = format!("workflow\0{}\0{path}", shared.workflow.name);
    memoized(shared, memo, || {
        fn feed(hash: &mut Hasher, workflow: &Workflow) {
            hash.str(&workflow.name);
            hash.value(&serde_json::to_value(&*workflow.spec).unwrap_or(Json::Null));
            for (path, inner) in &workflow.subworkflows {
                hash.str(path);
                feed(hash, inner);
            }
        }
        let mut hash = Hasher::new();
        match shared.workflow.subworkflows.get(path) {
            Some(workflow) => feed(&mut hash, workflow),
            None => hash.str(path),
        }
        hash.digest()
    })
}

fn memoized(shared: &Shared, name: String, make: impl FnOnce() -> [u8; 32]) -> [u8; 32] {
    let digests = &shared.options.cache.digests;
    if let Some(found) = digests.lock().ok().and_then(|d| d.get(&name).copied()) {
        return found;
    }
    let digest = make();
    if let Ok(mut digests) = digests.lock() {
        digests.insert(name, digest);
    }
    digest
}

/// A SHA-256 over length-prefixed fields.
struct Hasher(Sha256);

impl Hasher {
    fn new() -> Self {
        Hasher(Sha256::new())
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    fn str(&mut self, text: &str) {
        self.bytes(text.as_bytes());
    }

    /// A value the spec wrote (no secret values in it).
    fn value(&mut self, value: &Json) {
        self.canonical(value);
    }

    /// A rendered value, with secret values masked first.
    fn json(&mut self, shared: &Shared, value: &Json) {
        if shared.redactor.is_empty() {
            self.canonical(value);
        } else {
            let mut masked = value.clone();
            shared.redactor.json(&mut masked);
            self.canonical(&masked);
        }
    }

    /// JSON with object keys sorted, each scalar and key length-prefixed, each container tagged.
    fn canonical(&mut self, value: &Json) {
        match value {
            Json::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_unstable();
                self.0.update(b"{");
                self.0.update((keys.len() as u64).to_le_bytes());
                for key in keys {
                    self.str(key);
                    self.canonical(&map[key]);
                }
            }
            Json::Array(items) => {
                self.0.update(b"[");
                self.0.update((items.len() as u64).to_le_bytes());
                for item in items {
                    self.canonical(item);
                }
            }
            Json::String(text) => {
                self.0.update(b"s");
                self.str(text);
            }
            other => {
                self.0.update(b"v");
                self.str(&other.to_string());
            }
        }
    }

    fn digest(self) -> [u8; 32] {
        self.0.finalize().into()
    }

    fn finish(self) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let digest = self.digest();
        let mut text = String::with_capacity(64);
        for b in digest {
            text.push(HEX[usize::from(b >> 4)] as char);
            text.push(HEX[usize::from(b & 15)] as char);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &Json) -> String {
        let mut hash = Hasher::new();
        hash.value(value);
        hash.finish()
    }

    #[test]
    fn the_key_of_a_value_does_not_depend_on_its_key_order_but_on_every_value_and_type() {
        let a = serde_json::from_str::<Json>(r#"{"b": [1, {"y": 2, "x": "1"}], "a": null}"#)
            .expect("JSON");
        let b = serde_json::from_str::<Json>(r#"{"a": null, "b": [1, {"x": "1", "y": 2}]}"#)
            .expect("JSON");
        assert_eq!(key(&a), key(&b));
        assert_eq!(key(&a).len(), 64);
        for other in [
            r#"{"a": null, "b": [1, {"x": 1, "y": 2}]}"#,
            r#"{"a": null, "b": [{"x": "1", "y": 2}, 1]}"#,
            r#"{"a": null, "b": [1, {"x": "1", "y": 2}], "c": null}"#,
            r#"{"a": "null", "b": [1, {"x": "1", "y": 2}]}"#,
            r#"{"ab": null, "b": [1, {"x": "1", "y": 2}]}"#,
        ] {
            let other = serde_json::from_str::<Json>(other).expect("JSON");
            assert_ne!(key(&a), key(&other), "{other}");
        }
        // Fields are length-prefixed: moving a boundary changes the key.
        let mut one = Hasher::new();
        one.str("ab");
        one.str("c");
        let mut two = Hasher::new();
        two.str("a");
        two.str("bc");
        assert_ne!(one.finish(), two.finish());
    }
}
