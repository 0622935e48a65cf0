//! The `mock` provider: scripted assistant turns, from the spec (`turns:`) or a file (`script:`), so that
//! workflows with LLM steps can be tested offline.
//!
//! For each request, the first turn whose `match` text the last user message contains answers (such turns
//! may answer any number of times; an agent step's status note is not read); otherwise the next turn without `match` answers, each once, in order.
//! When none is left the call fails, naming the last user message. Usage is estimated at four characters a
//! token, so budgets can be tested too.

use std::sync::Mutex;

use serde::Deserialize;
use serde_json::{Map, Value as Json};

use super::{
    BoxFuture, ChatRequest, ChatResponse, FinishReason, LlmError, Message, Part, Provider, Role,
    ToolCall, Usage,
};

/// One scripted answer.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// Answer only when the last user message contains this text.
    #[serde(rename = "match", default)]
    pub when: Option<String>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Json>,
}

/// A provider answering from a script.
#[derive(Debug)]
pub struct Mock {
    name: String,
    turns: Vec<Turn>,
    /// How many unmatched turns have answered, and how many calls were made.
    state: Mutex<(usize, usize)>,
}

impl Mock {
    pub fn new(name: impl Into<String>, turns: Vec<Turn>) -> Self {
        Mock {
            name: name.into(),
            turns,
            state: Mutex::new((0, 0)),
        }
    }

    /// Reads turns from a YAML or JSON file: a list of turns, or `{ turns: [...] }`.
    pub fn read_script(path: &std::path::Path) -> Result<Vec<Turn>, LlmError> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Script {
            List(Vec<Turn>),
            Map { turns: Vec<Turn> },
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            LlmError::fatal(format!(
                "cannot read mock script `{}`: {}",
                path.display(),
                e.to_string().to_lowercase()
            ))
        })?;
        let script: Script = serde_saphyr::from_str(&text).map_err(|e| {
            LlmError::fatal(format!(
                "mock script `{}` is not a list of turns: {}",
                path.display(),
                e.to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_lowercase()
            ))
        })?;
        Ok(match script {
            Script::List(turns) | Script::Map { turns } => turns,
        })
    }

    fn answer(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let last_user = request
            .messages
            .iter()
            .rev()
            .map(|m| (m.role, m.text()))
            .find(|(role, text)| *role == Role::User && !text.starts_with(super::STATUS_NOTE))
            .map(|(_, text)| text)
            .unwrap_or_default();
        let mut state = self
            .state
            .lock()
            .map_err(|_| LlmError::fatal(format!("provider `{}` failed earlier", self.name)))?;
        let matched = self.turns.iter().find(|t| {
            t.when
                .as_ref()
                .is_some_and(|w| last_user.contains(w.as_str()))
        });
        let turn = match matched {
            Some(turn) => turn,
            None => {
                let next = self
                    .turns
                    .iter()
                    .filter(|t| t.when.is_none())
                    .nth(state.0)
                    .ok_or_else(|| {
                        let shown: String = last_user.chars().take(80).collect();
                        LlmError::fatal(format!(
                            "provider `{}`: no scripted turn left for the request (last user message: `{shown}`)",
                            self.name
                        ))
                    })?;
                state.0 += 1;
                next
            }
        };
        let call_base = state.1;
        state.1 += 1;
        let mut parts = Vec::new();
        if let Some(text) = &turn.text {
            parts.push(Part::Text(text.clone()));
        }
        for (index, call) in turn.tool_calls.iter().enumerate() {
            parts.push(Part::ToolCall(ToolCall {
                id: format!("mock_{call_base}_{index}"),
                name: call.name.clone(),
                arguments: call
                    .arguments
                    .clone()
                    .unwrap_or_else(|| Json::Object(Map::new())),
                signature: None,
            }));
        }
        let input_chars: usize = request.messages.iter().map(|m| m.text().len()).sum();
        let output_chars = turn.text.as_ref().map_or(0, String::len)
            + turn
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.as_ref().map_or(2, |a| a.to_string().len()))
                .sum::<usize>();
        Ok(ChatResponse {
            finish_reason: if turn.tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            },
            message: Message::assistant(parts),
            usage: Usage {
                input_tokens: input_chars.div_ceil(4) as u64,
                output_tokens: output_chars.div_ceil(4) as u64,
                cached_input_tokens: 0,
            },
            usage_reported: true,
            model: if request.model.is_empty() {
                "mock".to_owned()
            } else {
                request.model.clone()
            },
            request_id: Some(format!("mock-{call_base}")),
        })
    }
}

impl Provider for Mock {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete<'a>(
        &'a self,
        request: &'a ChatRequest,
    ) -> BoxFuture<'a, Result<ChatResponse, LlmError>> {
        Box::pin(async move { self.answer(request) })
    }
}
