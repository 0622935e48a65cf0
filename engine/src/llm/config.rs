//! Providers built from the spec's `llm.providers` and the environment users already have.
//!
//! For a provider of kind `openai`, `anthropic` or `gemini` (`KIND` below, upper case):
//! - the API key comes from the variable named by `api_key_env`, else `ARCHON_KIND_API_KEY`, else the usual
//!   variable (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY` or `GOOGLE_API_KEY`);
//! - the base URL from `ARCHON_KIND_BASE_URL`, else `base_url`, else `OPENAI_BASE_URL` /
//!   `ANTHROPIC_BASE_URL` / `GEMINI_BASE_URL`, else the provider's public API;
//! - the model from `ARCHON_KIND_MODEL`, else `model`.
//!
//! An OpenAI-compatible server on another base URL may need no key (llama.cpp, Ollama); the public APIs do.
//!
//! A provider of kind `auto` becomes the kind `ARCHON_PROVIDER` names, else the first of `openai` (a key
//! or a base URL set), `anthropic` and `gemini` (a key set), with the model `ARCHON_KIND_MODEL`, else
//! `model`, else [`AUTO_MODELS`]' choice for that kind.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::client::Settings;
use super::mock::{Mock, ScriptedCall, Turn};
use super::{
    ApiKey, ChatRequest, LlmError, Message, Provider, ToolSpec, anthropic, gemini, openai,
};
use crate::spec::{ProviderDef, ProviderKind};

/// A provider with the model and sampling options its spec entry sets.
#[derive(Clone, Debug)]
pub struct Configured {
    pub name: String,
    pub kind: ProviderKind,
    pub provider: Arc<dyn Provider>,
    pub model: String,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
}

impl Configured {
    /// A request to this provider's model with its options.
    pub fn request(&self, messages: Vec<Message>, tools: Vec<ToolSpec>) -> ChatRequest {
        ChatRequest {
            model: self.model.clone(),
            messages,
            tools,
            temperature: self.temperature,
            max_tokens: self.max_tokens,
            ..ChatRequest::default()
        }
    }
}

/// The model a provider of kind `auto` asks unless `ARCHON_KIND_MODEL` or `model` says otherwise.
pub const AUTO_MODELS: [(ProviderKind, &str); 3] = [
    (ProviderKind::Openai, "gpt-4o-mini"),
    (ProviderKind::Anthropic, "claude-haiku-4-5"),
    (ProviderKind::Gemini, "gemini-2.5-flash"),
];

/// The kind a provider of kind `auto` becomes in `env`: `ARCHON_PROVIDER`, else the first kind with a key
/// (or, for `openai`, a base URL) set. `None` when the environment configures none.
pub fn auto_kind(env: &BTreeMap<String, String>) -> Result<Option<ProviderKind>, LlmError> {
    let set = |key: &str| env.get(key).is_some_and(|v| !v.trim().is_empty());
    if let Some(chosen) = env.get("ARCHON_PROVIDER").filter(|v| !v.trim().is_empty()) {
        return match chosen.trim() {
            "openai" => Ok(Some(ProviderKind::Openai)),
            "anthropic" => Ok(Some(ProviderKind::Anthropic)),
            "gemini" => Ok(Some(ProviderKind::Gemini)),
            other => Err(LlmError::fatal(format!(
                "`ARCHON_PROVIDER` is `{other}`: it must be `openai`, `anthropic` or `gemini`"
            ))),
        };
    }
    let kinds = [
        (
            ProviderKind::Openai,
            &[
                "ARCHON_OPENAI_API_KEY",
                "OPENAI_API_KEY",
                "ARCHON_OPENAI_BASE_URL",
                "OPENAI_BASE_URL",
            ][..],
        ),
        (
            ProviderKind::Anthropic,
            &["ARCHON_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY"][..],
        ),
        (
            ProviderKind::Gemini,
            &["ARCHON_GEMINI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"][..],
        ),
    ];
    Ok(kinds
        .iter()
        .find(|(_, vars)| vars.iter().any(|v| set(v)))
        .map(|(kind, _)| *kind))
}

/// The model a provider asks: `ARCHON_KIND_MODEL`, else `model`, else `mock` for the mock provider (and,
/// for kind `auto`, the default model of the kind the environment chooses, `openai` when it chooses none).
pub fn model(def: &ProviderDef, env: &BTreeMap<String, String>) -> Option<String> {
    let kind = match def.kind.value {
        ProviderKind::Auto => {
            let kind = auto_kind(env)
                .ok()
                .flatten()
                .unwrap_or(ProviderKind::Openai);
            let resolved = ProviderDef {
                kind: crate::spec::Spanned::new(kind, def.kind.span),
                model: def.model.clone().or_else(|| auto_model(kind)),
                ..def.clone()
            };
            return model(&resolved, env);
        }
        kind => kind,
    };
    let prefix = match kind {
        ProviderKind::Openai => "OPENAI",
        ProviderKind::Anthropic => "ANTHROPIC",
        ProviderKind::Gemini => "GEMINI",
        ProviderKind::Mock | ProviderKind::Auto => {
            return Some(def.model.clone().unwrap_or_else(|| "mock".to_owned()));
        }
    };
    env.get(&format!("ARCHON_{prefix}_MODEL"))
        .filter(|m| !m.is_empty())
        .cloned()
        .or_else(|| def.model.clone())
}

/// The API keys a run's providers may send, from `env`: each provider's `api_key_env` and every variable a
/// key is taken from. The run masks them like its secrets, in every form, wherever it writes: a gateway
/// that echoes the key it was sent (in an answer, an error, a model name) must not put it in a report, an
/// event, a cassette or the store.
pub fn key_values(providers: &[&ProviderDef], env: &BTreeMap<String, String>) -> Vec<String> {
    if providers.is_empty() {
        return Vec::new();
    }
    let mut names: Vec<&str> = vec![
        "ARCHON_OPENAI_API_KEY",
        "OPENAI_API_KEY",
        "ARCHON_ANTHROPIC_API_KEY",
        "ANTHROPIC_API_KEY",
        "ARCHON_GEMINI_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
    ];
    names.extend(
        providers
            .iter()
            .filter_map(|p| p.api_key_env.as_ref().map(|v| v.value.as_str())),
    );
    names
        .into_iter()
        .filter_map(|name| env.get(name))
        .map(|key| key.trim().to_owned())
        // Shorter values are placeholders (`none`, `local`), which would mask ordinary words.
        .filter(|key| key.len() >= 8)
        .collect()
}

/// Builds the provider `name` declared as `def` in a spec read from `spec_dir`, reading `env`.
pub fn build(
    name: &str,
    def: &ProviderDef,
    spec_dir: &Path,
    env: &BTreeMap<String, String>,
) -> Result<Configured, LlmError> {
    let kind = def.kind.value;
    if kind == ProviderKind::Auto {
        let Some(chosen) = auto_kind(env)? else {
            return Err(LlmError::fatal(format!(
                "provider `{name}` is `auto` and the environment configures no provider: set `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` or `GEMINI_API_KEY`, or `ARCHON_OPENAI_BASE_URL` and `ARCHON_OPENAI_MODEL` for a local server"
            )));
        };
        // A server the environment points at (not OpenAI's API: no key is set) runs a model of its own:
        // `gpt-4o-mini` would be priced, and given its context window, as if it were that one.
        let set = |key: &str| env.get(key).is_some_and(|v| !v.trim().is_empty());
        let own_server = chosen == ProviderKind::Openai
            && !["ARCHON_OPENAI_API_KEY", "OPENAI_API_KEY"]
                .iter()
                .any(|k| set(k))
            && !set("ARCHON_OPENAI_MODEL")
            && def.model.is_none();
        if own_server {
            return Err(LlmError::fatal(format!(
                "provider `{name}` is `auto` and the environment points it at a server without naming its model: set `ARCHON_OPENAI_MODEL`"
            )));
        }
        let resolved = ProviderDef {
            kind: crate::spec::Spanned::new(chosen, def.kind.span),
            model: def.model.clone().or_else(|| auto_model(chosen)),
            ..def.clone()
        };
        return build(name, &resolved, spec_dir, env);
    }
    let var = |key: &str| env.get(key).filter(|v| !v.is_empty()).cloned();
    let mut settings = Settings::default();
    if let Some(timeout) = def.timeout.as_ref().and_then(|t| t.value.get()) {
        settings.timeout = timeout;
    }
    if let Some(limit) = def.max_concurrency {
        settings.max_concurrency = limit.max(1) as usize;
    }
    settings.requests_per_minute = def.requests_per_minute;
    let endpoint = |prefix: &str, key_vars: &[&str], base_var: &str, public: &str| {
        let env_url = var(&format!("ARCHON_{prefix}_BASE_URL"));
        let spec_url = def.base_url.as_ref().map(|b| b.value.clone());
        // The user's own key variables go only where the user points (the public API or a base URL from
        // the environment), never to a base URL a spec names: that one gets the key `api_key_env` names.
        let spec_chosen = env_url.is_none()
            && spec_url
                .as_deref()
                .is_some_and(|u| u.trim_end_matches('/') != public);
        // A URL from the environment is checked here, as `validate` checks a spec's.
        for name in [format!("ARCHON_{prefix}_BASE_URL"), base_var.to_owned()] {
            if let Some(url) = var(&name)
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(LlmError::fatal(format!(
                    "`{name}` is `{url}`: it must be an http:// or https:// URL, such as `http://127.0.0.1:8080/v1`"
                )));
            }
        }
        let base_url = env_url
            .or(spec_url)
            .or_else(|| var(base_var))
            .unwrap_or_else(|| public.to_owned());
        let key = def
            .api_key_env
            .as_ref()
            .and_then(|v| var(&v.value))
            .or_else(|| {
                (!spec_chosen)
                    .then(|| {
                        var(&format!("ARCHON_{prefix}_API_KEY"))
                            .or_else(|| key_vars.iter().find_map(|v| var(v)))
                    })
                    .flatten()
            })
            .map(ApiKey::new);
        let model = var(&format!("ARCHON_{prefix}_MODEL"))
            .or_else(|| def.model.clone())
            .ok_or_else(|| {
                LlmError::fatal(format!(
                    "provider `{name}` has no model: set `model` in the spec or `ARCHON_{prefix}_MODEL`"
                ))
            })?;
        if key.is_none() && base_url.trim_end_matches('/') == public {
            let wanted = def
                .api_key_env
                .as_ref()
                .map_or_else(|| key_vars[0].to_owned(), |v| v.value.clone());
            return Err(LlmError::fatal(format!(
                "provider `{name}` has no API key: set `{wanted}`"
            )));
        }
        Ok((key, base_url, model))
    };
    let (provider, model): (Arc<dyn Provider>, String) = match kind {
        ProviderKind::Mock | ProviderKind::Auto => (
            Arc::new(Mock::new(name, mock_turns(def, spec_dir)?)),
            def.model.clone().unwrap_or_else(|| "mock".to_owned()),
        ),
        ProviderKind::Openai => {
            let (key, base, model) = endpoint(
                "OPENAI",
                &["OPENAI_API_KEY"],
                "OPENAI_BASE_URL",
                openai::DEFAULT_BASE_URL,
            )?;
            let mut openai = openai::OpenAi::new(name, base, key, settings)?;
            if let Some(param) = &def.max_tokens_param {
                openai = openai.with_max_tokens_param(param.value);
            }
            (Arc::new(openai), model)
        }
        ProviderKind::Anthropic => {
            let (key, base, model) = endpoint(
                "ANTHROPIC",
                &["ANTHROPIC_API_KEY"],
                "ANTHROPIC_BASE_URL",
                anthropic::DEFAULT_BASE_URL,
            )?;
            (
                Arc::new(anthropic::Anthropic::new(name, base, key, settings)?),
                model,
            )
        }
        ProviderKind::Gemini => {
            let (key, base, model) = endpoint(
                "GEMINI",
                &["GEMINI_API_KEY", "GOOGLE_API_KEY"],
                "GEMINI_BASE_URL",
                gemini::DEFAULT_BASE_URL,
            )?;
            (
                Arc::new(gemini::Gemini::new(name, base, key, settings)?),
                model,
            )
        }
    };
    Ok(Configured {
        name: name.to_owned(),
        kind,
        provider,
        model,
        temperature: def.temperature,
        max_tokens: def.max_tokens,
    })
}

fn auto_model(kind: ProviderKind) -> Option<String> {
    AUTO_MODELS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, m)| (*m).to_owned())
}

/// The scripted turns of a `mock` provider: `script` (relative to the spec) or `turns`.
fn mock_turns(def: &ProviderDef, spec_dir: &Path) -> Result<Vec<Turn>, LlmError> {
    if let Some(script) = &def.script {
        return Mock::read_script(&spec_dir.join(&script.value));
    }
    Ok(def
        .turns
        .iter()
        .map(|t| Turn {
            when: t.when.clone(),
            text: t.text.clone(),
            tool_calls: t
                .tool_calls
                .iter()
                .map(|c| ScriptedCall {
                    name: c.name.clone(),
                    arguments: c.arguments.as_ref().map(crate::spec::Node::to_json),
                })
                .collect(),
        })
        .collect())
}
