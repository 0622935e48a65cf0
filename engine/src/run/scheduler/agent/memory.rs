//! An agent's memory: with `memory: true`, the `remember`, `recall` and `forget` tools over the long-term
//! store (`run::memory`), the memories most relevant to its goal recalled into its prompt, and an episode
//! (goal, outcome, answer) kept when its step ends; with `memory: true` or `notes: true`, the `note` and
//! `notes` tools (notes kept for the run, or across runs with `memory`).
//!
//! Everything written is masked first (secret values become `***`); what is read back reaches the model as
//! data. No memory is shown twice in one conversation: the ids shown are kept, and found again in a
//! conversation an earlier process left.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::{Value as Json, json};

use super::context::as_data;
use crate::llm::config::Configured;
use crate::llm::{Message, Part, ToolSpec};
use crate::report::StepStatus;
use crate::run::memory::{Kind, Memory, MemoryStore, NewMemory, Recall, Written};
use crate::run::scheduler::context::{Failure, Shared};
use crate::spec::AgentDef;

/// Memories recalled into the prompt unless `memory.recall` says otherwise.
const DEFAULT_RECALL: usize = 5;
/// Most memories one `recall` call returns.
const MAX_RECALL_CALL: u64 = 20;
/// Most notes `notes` returns (the latest).
const MAX_NOTES: usize = 50;
/// Most bytes of a step's answer kept in its episode.
const EPISODE_ANSWER_BYTES: usize = 2048;
/// Longest namespace.
const MAX_NAMESPACE_BYTES: usize = 200;
/// The memory file unless `memory.path` says otherwise.
const DEFAULT_FILE: &str = "memory.db";

/// The memory of one agent step.
pub(super) struct AgentMemory {
    store: Arc<MemoryStore>,
    namespace: String,
    /// Whose notes: the agent's name, else the step's.
    owner: String,
    run: String,
    step: String,
    /// `memory: true`: remember, recall and forget, and notes across runs.
    long_term: bool,
    recall: usize,
    embeddings: Option<(Arc<Configured>, String)>,
    /// The memories this conversation has shown.
    shown: Mutex<HashSet<i64>>,
}

/// The memory of an agent step, when its agent has `memory` or `notes`.
pub(super) async fn open(
    shared: &Shared,
    label: &str,
    agent_name: Option<&str>,
    agent: Option<&AgentDef>,
) -> Result<Option<AgentMemory>, Failure> {
    let Some(agent) = agent else {
        return Ok(None);
    };
    let long_term = agent.memory == Some(true);
    if !long_term && agent.notes != Some(true) {
        return Ok(None);
    }
    let name = agent_name.unwrap_or(label);
    let spec = &shared.workflow.spec;
    let config = spec.memory.clone().unwrap_or_default();
    let file = config
        .path
        .as_ref()
        .map_or(DEFAULT_FILE, |p| p.value.as_str());
    let files = shared.options.memory.clone();
    // Memory in the run store's database is kept apart by file, as memory files are by path.
    let key = match (&files.database, &shared.options.memory_dir) {
        (Some(_), _) => PathBuf::from(
            crate::run::memory::file_key(file).map_err(|e| Failure::fixed(e.to_string()))?,
        ),
        (None, Some(dir)) => dir.join(file),
        (None, None) => {
            return Err(Failure::fixed(format!(
                "agent `{name}` keeps memory, and this run has no state directory to keep it in"
            )));
        }
    };
    let file = file.to_owned();
    let store = tokio::task::spawn_blocking(move || {
        let mut opened = files
            .opened
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(store) = opened.get(&key) {
            return Ok(store.clone());
        }
        let store = match &files.database {
            Some(database) => Arc::new(database.open(&file)?),
            None => Arc::new(MemoryStore::open(&key)?),
        };
        opened.insert(key, store.clone());
        Ok(store)
    })
    .await
    .map_err(|e| Failure::fixed(format!("memory: {e}")))?
    .map_err(|e: crate::run::memory::MemoryError| Failure::fixed(e.to_string()))?;
    let namespace = match &config.namespace {
        Some(template) => {
            let ctx = shared.memory_context();
            let text = shared.renderer.text(&template.value, &ctx).await;
            text.map_err(|e| Failure::fixed(format!("memory `namespace`: {}", e.message)))?
        }
        None => shared.workflow.name.clone(),
    };
    let namespace = namespace.trim().to_owned();
    if namespace.is_empty() || namespace.len() > MAX_NAMESPACE_BYTES {
        return Err(Failure::fixed(format!(
            "memory `namespace` must be 1 to {MAX_NAMESPACE_BYTES} bytes, and it renders to {}",
            namespace.len()
        )));
    }
    let embeddings = match config.embeddings.as_ref().filter(|_| long_term) {
        Some(e) => {
            let configured = super::model::provider(shared, &e.value.provider.value)?;
            Some((configured, e.value.model.clone()))
        }
        None => None,
    };
    Ok(Some(AgentMemory {
        store,
        namespace,
        owner: name.to_owned(),
        run: shared.options.run_id.clone(),
        step: label.to_owned(),
        long_term,
        recall: config
            .recall
            .as_ref()
            .map_or(DEFAULT_RECALL, |r| r.value as usize),
        embeddings,
        shown: Mutex::default(),
    }))
}

impl AgentMemory {
    /// Whether `tool` is one of the tools memory gives this agent.
    pub fn handles(&self, tool: &str) -> bool {
        if self.long_term {
            crate::tools::MEMORY_TOOLS.contains(&tool)
        } else {
            crate::tools::NOTE_TOOLS.contains(&tool)
        }
    }

    /// The tools it gives the agent, as models see them.
    pub fn tools(&self) -> Vec<ToolSpec> {
        let mut tools = Vec::new();
        if self.long_term {
            tools.push(ToolSpec {
                name: "remember".to_owned(),
                description: "Remember a fact for later steps and later runs: one self-contained statement. \
                              To correct a memory, pass its id as `replaces`."
                    .to_owned(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "content": { "type": "string", "description": "the fact, in one or a few sentences" },
                        "replaces": { "type": "integer", "description": "the id of a memory this one corrects" }
                    },
                    "required": ["content"],
                    "additionalProperties": false
                }),
            });
            tools.push(ToolSpec {
                name: "recall".to_owned(),
                description: "Search what you remember (or, with `episodes`, what earlier runs of this \
                              workflow did). Memories already shown in this conversation are not repeated."
                    .to_owned(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "query": { "type": "string", "description": "words to look for" },
                        "limit": { "type": "integer", "minimum": 1, "maximum": MAX_RECALL_CALL },
                        "episodes": { "type": "boolean", "description": "search earlier steps' goals and outcomes instead of facts" },
                        "include_replaced": { "type": "boolean", "description": "also memories a later one replaced" }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
            });
            tools.push(ToolSpec {
                name: "forget".to_owned(),
                description: "Forget a memory that is wrong or no longer useful, by its id."
                    .to_owned(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "id": { "type": "integer" },
                        "reason": { "type": "string" }
                    },
                    "required": ["id"],
                    "additionalProperties": false
                }),
            });
        }
        let across = if self.long_term {
            "across the steps of this run and later runs"
        } else {
            "across the steps of this run"
        };
        tools.push(ToolSpec {
            name: "note".to_owned(),
            description: format!(
                "Write a note to yourself (progress, what is left to do), kept {across}."
            ),
            parameters: json!({
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"],
                "additionalProperties": false
            }),
        });
        tools.push(ToolSpec {
            name: "notes".to_owned(),
            description: format!("Read the notes you wrote {across}, oldest first."),
            parameters: json!({ "type": "object", "properties": {}, "additionalProperties": false }),
        });
        tools
    }

    /// Runs one call of a memory tool: the observation, and whether it is an error.
    pub async fn call(&self, shared: &Shared, tool: &str, args: &Json) -> (String, bool) {
        let outcome = match tool {
            "remember" => self.remember(shared, args).await,
            "recall" => self.recall_call(args).await,
            "forget" => self.forget(args).await,
            "note" => self.note(shared, args).await,
            "notes" => self.notes().await,
            other => Err(format!("unknown memory tool `{other}`")),
        };
        match outcome {
            Ok(text) => (text, false),
            Err(error) => (format!("error: {error}"), true),
        }
    }

    async fn remember(&self, shared: &Shared, args: &Json) -> Result<String, String> {
        let content = shared
            .redactor
            .text(args["content"].as_str().unwrap_or(""))
            .into_owned();
        let replaces = args["replaces"].as_i64();
        let mut unembedded = None;
        let embedding = match &self.embeddings {
            Some((provider, model)) if !content.trim().is_empty() => {
                match provider
                    .provider
                    .embed(model, std::slice::from_ref(&content))
                    .await
                {
                    Ok(mut vectors) => vectors.pop().map(|v| (model.clone(), v)),
                    Err(e) => {
                        unembedded = Some(e.message);
                        None
                    }
                }
            }
            _ => None,
        };
        let written = self
            .blocking({
                let (namespace, run, step) =
                    (self.namespace.clone(), self.run.clone(), self.step.clone());
                move |store| {
                    store.write(&NewMemory {
                        namespace: &namespace,
                        kind: Kind::Fact,
                        agent: None,
                        run: Some(&run),
                        step: Some(&step),
                        content: &content,
                        supersedes: replaces,
                        run_scoped: false,
                        embedding: embedding.as_ref().map(|(m, v)| (m.as_str(), v.clone())),
                    })
                }
            })
            .await?;
        let mut text = match (written, replaces) {
            (Written::New(id), Some(old)) => {
                format!("remembered as memory {id}, replacing memory {old}")
            }
            (Written::New(id), None) => format!("remembered as memory {id}"),
            (Written::Duplicate(id), _) => format!("already remembered as memory {id}"),
        };
        if let Some(why) = unembedded {
            text.push_str(&format!(" (without an embedding: {why})"));
        }
        Ok(text)
    }

    async fn recall_call(&self, args: &Json) -> Result<String, String> {
        let query = args["query"].as_str().unwrap_or("").to_owned();
        let limit = args["limit"]
            .as_u64()
            .unwrap_or(5)
            .clamp(1, MAX_RECALL_CALL) as usize;
        let kinds = if args["episodes"].as_bool() == Some(true) {
            vec![Kind::Episode]
        } else {
            vec![Kind::Fact]
        };
        let superseded = args["include_replaced"].as_bool() == Some(true);
        let found = self.search(&query, &kinds, limit, superseded, None).await?;
        if found.is_empty() {
            return Ok(format!(
                "nothing found for `{query}` that this conversation has not shown already"
            ));
        }
        Ok(found.iter().map(line).collect::<Vec<_>>().join("\n"))
    }

    async fn forget(&self, args: &Json) -> Result<String, String> {
        let Some(id) = args["id"].as_i64() else {
            return Err("`id` must be a memory's id".to_owned());
        };
        let reason = args["reason"].as_str().map(str::to_owned);
        let namespace = self.namespace.clone();
        self.blocking(move |store| store.forget(Some(&namespace), id, reason.as_deref()))
            .await?;
        Ok(format!("forgot memory {id}"))
    }

    async fn note(&self, shared: &Shared, args: &Json) -> Result<String, String> {
        let text = shared
            .redactor
            .text(args["text"].as_str().unwrap_or(""))
            .into_owned();
        let (namespace, owner, run, step) = (
            self.namespace.clone(),
            self.owner.clone(),
            self.run.clone(),
            self.step.clone(),
        );
        let run_scoped = !self.long_term;
        let written = self
            .blocking(move |store| {
                store.write(&NewMemory {
                    namespace: &namespace,
                    kind: Kind::Note,
                    agent: Some(&owner),
                    run: Some(&run),
                    step: Some(&step),
                    content: &text,
                    supersedes: None,
                    run_scoped,
                    embedding: None,
                })
            })
            .await?;
        Ok(match written {
            Written::New(id) => format!("noted (note {id})"),
            Written::Duplicate(id) => format!("already noted (note {id})"),
        })
    }

    async fn notes(&self) -> Result<String, String> {
        let (namespace, owner) = (self.namespace.clone(), self.owner.clone());
        let run = (!self.long_term).then(|| self.run.clone());
        let notes = self
            .blocking(move |store| store.notes(&namespace, &owner, run.as_deref(), MAX_NOTES))
            .await?;
        if notes.is_empty() {
            return Ok("no notes yet".to_owned());
        }
        Ok(notes.iter().map(line).collect::<Vec<_>>().join("\n"))
    }

    /// The memories most relevant to the goal, for the prompt: facts and episodes of earlier runs (this
    /// run's own records are left to `recall`, so that a resumed step's prompt is the one it started
    /// with).
    pub async fn prompt_section(&self, goal: &str) -> Result<Option<String>, Failure> {
        if !self.long_term || self.recall == 0 {
            return Ok(None);
        }
        let run = self.run.clone();
        let found = self
            .search(
                goal,
                &[Kind::Fact, Kind::Episode],
                self.recall,
                false,
                Some(&run),
            )
            .await
            .map_err(Failure::fixed)?;
        if found.is_empty() {
            return Ok(None);
        }
        let lines: Vec<String> = found.iter().map(line).collect();
        Ok(Some(format!(
            "\n\nWhat you remember from earlier runs that may bear on this goal (use `recall` for more):\n{}",
            as_data(&lines.join("\n"))
        )))
    }

    /// Keeps what the step did as an episode, for later runs' `recall` (nothing for a step that waits or
    /// was stopped: it has not ended).
    pub async fn episode(
        &self,
        shared: &Shared,
        goal: &str,
        outcome: &Result<String, (StepStatus, String)>,
    ) {
        if !self.long_term {
            return;
        }
        let text = match outcome {
            Ok(answer) => format!(
                "Goal: {goal}\nOutcome: succeeded\nAnswer: {}",
                cut(answer, EPISODE_ANSWER_BYTES)
            ),
            Err((StepStatus::WaitingApproval | StepStatus::Cancelled, _)) => return,
            Err((status, error)) => format!(
                "Goal: {goal}\nOutcome: {}\nError: {}",
                status.as_str(),
                cut(error, EPISODE_ANSWER_BYTES)
            ),
        };
        let content = cut(
            &shared.redactor.text(&text),
            crate::run::memory::MAX_MEMORY_BYTES,
        );
        let (namespace, owner, run, step) = (
            self.namespace.clone(),
            self.owner.clone(),
            self.run.clone(),
            self.step.clone(),
        );
        // Best effort: a step's outcome does not depend on its episode being kept.
        let _ = self
            .blocking(move |store| {
                store.write(&NewMemory {
                    namespace: &namespace,
                    kind: Kind::Episode,
                    agent: Some(&owner),
                    run: Some(&run),
                    step: Some(&step),
                    content: &content,
                    supersedes: None,
                    run_scoped: false,
                    embedding: None,
                })
            })
            .await;
    }

    /// Marks the memories `messages` show (a conversation an earlier process left) as shown.
    pub fn saw(&self, messages: &[Message]) {
        let mut shown = self
            .shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for message in messages {
            for part in &message.parts {
                let text = match part {
                    Part::Text(text) => text,
                    Part::ToolResult(result) => &result.content,
                    _ => continue,
                };
                for (at, _) in text.match_indices("[memory ") {
                    let digits: String = text[at + 8..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    if let Ok(id) = digits.parse() {
                        shown.insert(id);
                    }
                }
            }
        }
    }

    async fn search(
        &self,
        query: &str,
        kinds: &[Kind],
        limit: usize,
        superseded: bool,
        not_run: Option<&str>,
    ) -> Result<Vec<Memory>, String> {
        let embedding = match &self.embeddings {
            Some((provider, model)) if !query.trim().is_empty() => {
                let vectors = provider.provider.embed(model, &[query.to_owned()]).await;
                let mut vectors =
                    vectors.map_err(|e| format!("embedding the query: {}", e.message))?;
                vectors.pop().map(|v| (model.clone(), v))
            }
            _ => None,
        };
        let exclude = self
            .shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let (namespace, query, kinds) = (self.namespace.clone(), query.to_owned(), kinds.to_vec());
        let not_run = not_run.map(str::to_owned);
        let found = self
            .blocking(move |store| {
                // This run's records are looked past: a few more are asked for.
                let found = store.recall(&Recall {
                    namespace: &namespace,
                    kinds: &kinds,
                    query: &query,
                    limit: if not_run.is_some() { limit * 4 } else { limit },
                    exclude: &exclude,
                    superseded,
                    embedding: embedding.as_ref().map(|(m, v)| (m.as_str(), v.as_slice())),
                })?;
                Ok(found
                    .into_iter()
                    .filter(|m| not_run.is_none() || m.run != not_run)
                    .take(limit)
                    .collect::<Vec<_>>())
            })
            .await?;
        self.shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(found.iter().map(|m| m.id));
        Ok(found)
    }

    /// Runs `work` on the store off the scheduler's threads.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&MemoryStore) -> Result<T, crate::run::memory::MemoryError> + Send + 'static,
    ) -> Result<T, String> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|e| format!("memory: {e}"))?
            .map_err(|e| e.to_string())
    }
}

/// One record as the model reads it: `[memory 12 · 2026-11-26] text`.
fn line(memory: &Memory) -> String {
    let when = std::time::UNIX_EPOCH
        + std::time::Duration::from_millis(u64::try_from(memory.created_ms).unwrap_or(0));
    let day: String = humantime::format_rfc3339_seconds(when)
        .to_string()
        .chars()
        .take(10)
        .collect();
    let what = match memory.kind {
        Kind::Note => "note",
        Kind::Fact | Kind::Episode => "memory",
    };
    let replaced = memory
        .superseded_by
        .map(|by| format!(" · replaced by {by}"))
        .unwrap_or_default();
    format!(
        "[{what} {} · {day}{replaced}] {}",
        memory.id, memory.content
    )
}

/// `text` cut to at most `max` bytes, with a note of how much was left out.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let end = crate::text::floor_boundary(text, max.saturating_sub(40));
    format!("{}… [{} bytes left out]", &text[..end], text.len() - end)
}
