//! `archon llm ping [PROVIDER]`: one tiny request to a provider, printing the model, latency and usage —
//! the first thing to run when setting a provider up.

use std::path::Path;
use std::time::Instant;

use archon_engine::llm::Message;
use archon_engine::llm::config::{self, Configured};
use archon_engine::source::{FileId, Span};
use archon_engine::spec::{ProviderDef, ProviderKind, Spanned};
use archon_engine::validate::validate_file;

use super::Status;
use crate::args::LlmPingArgs;
use crate::output;

pub fn ping(args: &LlmPingArgs) -> anyhow::Result<Status> {
    let env = std::env::vars().collect();
    let configured = match &args.spec {
        Some(spec) => from_spec(spec, args.provider.as_deref(), &env),
        None => from_environment(
            args.provider.as_deref().unwrap_or("openai"),
            args.model.as_deref(),
            &env,
        ),
    };
    let mut configured = match configured {
        Ok(configured) => configured,
        Err((message, hint)) => {
            let mut text = format!("error: {message}\n");
            if let Some(hint) = hint {
                text.push_str(&format!("  hint: {hint}\n"));
            }
            output::stderr(&text);
            return Ok(Status::Invalid);
        }
    };
    if let Some(model) = &args.model {
        configured.model.clone_from(model);
    }
    let mut request = configured.request(
        vec![Message::user("Reply with the single word: pong")],
        Vec::new(),
    );
    request.max_tokens = Some(request.max_tokens.unwrap_or(16).min(64));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = Instant::now();
    let answer = runtime.block_on(configured.provider.complete(&request));
    let latency = started.elapsed();
    match answer {
        Ok(response) => {
            // One line, whatever the model wrote: its lines are joined and what would drive the terminal
            // is escaped.
            let text = response
                .text()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let text = output::printable(&text.chars().take(80).collect::<String>());
            let usage = if response.usage_reported {
                format!(
                    "{} in, {} out",
                    response.usage.input_tokens, response.usage.output_tokens
                )
            } else {
                "not reported".to_owned()
            };
            output::stdout(&format!(
                "provider  {} ({})\nmodel     {}\nlatency   {} ms\nusage     {usage}\nanswer    {}\n",
                configured.name,
                kind_name(configured.kind),
                if response.model.is_empty() {
                    &configured.model
                } else {
                    &response.model
                },
                latency.as_millis(),
                text.trim()
            ));
            Ok(Status::Success)
        }
        Err(e) => {
            output::stderr(&format!("error: {}\n", e.message));
            Ok(Status::Failure)
        }
    }
}

type Problem = (String, Option<String>);

/// How long a ping waits for an answer, unless the spec sets the provider's `timeout`.
const PING_TIMEOUT: &str = "30s";

fn from_spec(
    path: &Path,
    wanted: Option<&str>,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<Configured, Problem> {
    let validation = validate_file(path);
    let Some(workflow) = validation.workflow else {
        return Err((
            format!("`{}` is not a valid workflow", path.display()),
            Some(format!(
                "`archon validate {}` lists its problems",
                path.display()
            )),
        ));
    };
    let llm = workflow.spec.llm.as_ref();
    let providers: Vec<&str> = llm
        .map(|l| l.providers.keys().map(|k| k.value.as_str()).collect())
        .unwrap_or_default();
    let name = wanted
        .map(str::to_owned)
        .or_else(|| {
            llm.and_then(|l| l.default.as_ref())
                .map(|d| d.value.clone())
        })
        .or_else(|| providers.first().map(|p| (*p).to_owned()))
        .ok_or_else(|| {
            (
                format!("`{}` declares no LLM provider", path.display()),
                None,
            )
        })?;
    let def = llm
        .and_then(|l| l.providers.get(name.as_str()))
        .ok_or_else(|| {
            (
                format!("`{}` has no provider `{name}`", path.display()),
                Some(format!(
                    "its providers are {}",
                    providers
                        .iter()
                        .map(|p| format!("`{p}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            )
        })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    // A ping answers quickly or not at all.
    let mut def = def.clone();
    if def.timeout.is_none() {
        def.timeout = Some(Spanned::new(
            archon_engine::spec::DurationText::new(PING_TIMEOUT),
            Span::new(FileId(0), 0, 0),
        ));
    }
    config::build(&name, &def, dir, env).map_err(|e| (e.message, None))
}

fn from_environment(
    kind: &str,
    model: Option<&str>,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<Configured, Problem> {
    let kind = match kind {
        "openai" => ProviderKind::Openai,
        "anthropic" => ProviderKind::Anthropic,
        "gemini" => ProviderKind::Gemini,
        "auto" => ProviderKind::Auto,
        other => {
            return Err((
                format!("unknown provider kind `{other}`"),
                Some(
                    "without `--spec`, name a kind: `openai`, `anthropic`, `gemini` or `auto`"
                        .to_owned(),
                ),
            ));
        }
    };
    let nowhere = Span::new(FileId(0), 0, 0);
    let def = ProviderDef {
        kind: Spanned::new(kind, nowhere),
        model: model.map(str::to_owned),
        base_url: None,
        api_key_env: None,
        temperature: None,
        max_tokens: None,
        timeout: Some(Spanned::new(
            archon_engine::spec::DurationText::new(PING_TIMEOUT),
            nowhere,
        )),
        tool_mode: None,
        max_tokens_param: None,
        max_concurrency: None,
        requests_per_minute: None,
        context_window: None,
        compact_at: None,
        pricing: None,
        turns: Vec::new(),
        script: None,
    };
    config::build(kind_name(kind), &def, Path::new("."), env).map_err(|e| (e.message, None))
}

fn kind_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai => "openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Gemini => "gemini",
        ProviderKind::Mock => "mock",
        ProviderKind::Auto => "auto",
    }
}
