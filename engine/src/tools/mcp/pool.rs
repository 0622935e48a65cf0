//! [`Servers`]: a run's MCP servers, by configuration. A server starts on first use and is shared by every
//! step and agent of the run; one that dies is started again on its next use, after a backoff, at most
//! `restarts` times in the run; all stop, process groups included, with [`Servers::shutdown`] (and, as a
//! last resort, when the pool is dropped).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::BackoffBuilder;
use serde_json::Value as Json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::client::{CallLimits, Connection, Failure};
use super::{McpTool, ServerConfig, ServersOptions};
use crate::tools::{ErrorClass, ToolError, ToolOutput};

/// Most schema errors quoted when arguments are refused, and most bytes of the message.
const MAX_ARGUMENT_ERRORS: usize = 3;
const MAX_ARGUMENT_MESSAGE_BYTES: usize = 2048;
/// Most known tools named when a tool is unknown.
const MAX_NAMED_TOOLS: usize = 20;

/// The MCP servers of one run.
pub struct Servers {
    options: ServersOptions,
    slots: Mutex<HashMap<ServerConfig, Arc<Slot>>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Servers")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// One server of the run, started or not.
#[derive(Default)]
struct Slot {
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    live: Option<Arc<Live>>,
    /// Times it was started (or tried to be) in this run.
    starts: u32,
}

/// A started server and what it listed.
struct Live {
    connection: Connection,
    listing: tokio::sync::Mutex<Option<Arc<Listing>>>,
}

/// The tools a server listed, after its filter.
struct Listing {
    tools: Arc<[McpTool]>,
    /// Argument validators, compiled on a tool's first call (`None`: its schema does not compile, and
    /// the server checks its arguments itself).
    validators: Mutex<HashMap<String, Option<Arc<jsonschema::Validator>>>>,
}

impl Servers {
    pub fn new(options: ServersOptions) -> Servers {
        Servers {
            options,
            slots: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// The server's tools (after its `tools` filter), starting it on first use; listed again after
    /// `notifications/tools/list_changed`. Given up when `cancel` fires (a server half started is
    /// stopped with the others by [`Servers::shutdown`]).
    pub async fn tools(
        &self,
        config: &ServerConfig,
        cancel: &CancellationToken,
    ) -> Result<Arc<[McpTool]>, ToolError> {
        tokio::select! {
            listed = async {
                let (slot, live) = self.live(config).await?;
                let listing = self.listing(config, &slot, &live).await?;
                Ok(listing.tools.clone())
            } => listed,
            () = cancel.cancelled() => Err(ToolError::new("cancelled")),
        }
    }

    /// One call of `tool` (its name on the server). The arguments are checked against the tool's
    /// `inputSchema` first; the call may go `call_timeout` without news (progress extends it), takes at
    /// most `max_call_timeout` and `limit` in all, and is cancelled (`notifications/cancelled`) when it
    /// times out or `cancel` fires.
    pub async fn call(
        &self,
        config: &ServerConfig,
        tool: &str,
        args: Json,
        limit: Option<Duration>,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let started = Instant::now();
        let total = limit.map_or(config.limits.max_call_timeout, |limit| {
            limit.min(config.limits.max_call_timeout)
        });
        let step_limit = limit.is_some_and(|limit| limit < config.limits.max_call_timeout);
        let name = &config.name;
        let timed_out = || {
            let what = if step_limit {
                "the step's time"
            } else {
                "`max_call_timeout`"
            };
            ToolError::new(format!(
                "`{name}.{tool}` timed out after {} ({what})",
                humantime::format_duration(total)
            ))
        };
        // Starting and listing count against the call's time, and end when it is cancelled.
        let prepared = tokio::select! {
            prepared = async {
                let (slot, live) = self.live(config).await?;
                let listing = self.listing(config, &slot, &live).await?;
                Ok::<_, ToolError>((slot, live, listing))
            } => prepared?,
            () = cancel.cancelled() => return Err(ToolError::new("cancelled")),
            () = tokio::time::sleep_until(started + total) => return Err(timed_out()),
        };
        let (slot, live, listing) = prepared;
        let args = listing.check(name, tool, args)?;
        let Some(left) = total.checked_sub(started.elapsed()) else {
            return Err(timed_out());
        };
        let limits = CallLimits {
            quiet: config.limits.call_timeout,
            total: left,
            named: total,
            step_limit,
        };
        match live.connection.call(tool, args, limits, cancel).await {
            Ok(result) => {
                super::result::output(&format!("{name}.{tool}"), result, &self.options.redactor)
            }
            Err(Failure::Call(error)) => Err(error),
            Err(Failure::Gone(message)) => Err(self.gone(config, &slot, message).await),
        }
    }

    /// Stops every server: MCP close, then the whole process group (SIGTERM, then SIGKILL). Later uses
    /// fail.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let slots: Vec<Arc<Slot>> = match self.slots.lock() {
            Ok(mut slots) => slots.drain().map(|(_, slot)| slot).collect(),
            Err(_) => return,
        };
        futures_util::future::join_all(slots.iter().map(|slot| async move {
            let live = slot.state.lock().await.live.take();
            if let Some(live) = live {
                live.connection.shutdown().await;
            }
        }))
        .await;
    }

    fn slot(&self, config: &ServerConfig) -> Result<Arc<Slot>, ToolError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(shut_down(&config.name));
        }
        let mut slots = self
            .slots
            .lock()
            .map_err(|_| ToolError::new("the MCP servers' table is poisoned"))?;
        Ok(slots.entry(config.clone()).or_default().clone())
    }

    /// The server, running: started now when it is not, or no longer is.
    async fn live(&self, config: &ServerConfig) -> Result<(Arc<Slot>, Arc<Live>), ToolError> {
        let slot = self.slot(config)?;
        let mut state = slot.state.lock().await;
        if let Some(live) = &state.live {
            if live.connection.alive() {
                return Ok((slot.clone(), live.clone()));
            }
            if let Some(dead) = state.live.take() {
                dead.connection.shutdown().await;
            }
        }
        let name = &config.name;
        let restarts = config.limits.restarts;
        if state.starts > restarts {
            return Err(ToolError::new(format!(
                "MCP server `{name}` is not started again: it was started {} times in this run\nthe limit is `restarts: {restarts}`",
                state.starts
            ))
            .of(ErrorClass::Connect));
        }
        if state.starts > 0 {
            tokio::time::sleep(backoff(state.starts - 1)).await;
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(shut_down(name));
        }
        state.starts += 1;
        let connection = Connection::start(config, &self.options).await?;
        let live = Arc::new(Live {
            connection,
            listing: tokio::sync::Mutex::new(None),
        });
        state.live = Some(live.clone());
        Ok((slot.clone(), live))
    }

    /// What the server lists, listed again when it said its list changed.
    async fn listing(
        &self,
        config: &ServerConfig,
        slot: &Arc<Slot>,
        live: &Arc<Live>,
    ) -> Result<Arc<Listing>, ToolError> {
        let mut listing = live.listing.lock().await;
        let stale = live.connection.stale.swap(false, Ordering::SeqCst);
        if let Some(current) = listing.as_ref()
            && !stale
        {
            return Ok(current.clone());
        }
        let filter = filter(config)?;
        let listed = match live.connection.list(config.limits.call_timeout).await {
            Ok(listed) => listed,
            Err(Failure::Call(error)) => return Err(error),
            Err(Failure::Gone(message)) => return Err(self.gone(config, slot, message).await),
        };
        let tools: Vec<McpTool> = listed
            .into_iter()
            .filter(|tool| {
                filter
                    .as_ref()
                    .is_none_or(|f| f.is_match(tool.name.as_ref()))
            })
            .map(|tool| McpTool {
                name: tool.name.into_owned(),
                description: tool.description.map(|d| d.into_owned()).unwrap_or_default(),
                input_schema: Json::Object((*tool.input_schema).clone()),
                output_schema: tool.output_schema.map(|s| Json::Object((*s).clone())),
                annotations: tool.annotations.and_then(|a| serde_json::to_value(a).ok()),
            })
            .collect();
        let current = Arc::new(Listing {
            tools: tools.into(),
            validators: Mutex::new(HashMap::new()),
        });
        *listing = Some(current.clone());
        Ok(current)
    }

    /// The error of a call that met the server gone, saying whether it will be started again.
    async fn gone(&self, config: &ServerConfig, slot: &Slot, message: String) -> ToolError {
        let starts = slot.state.lock().await.starts;
        let restarts = config.limits.restarts;
        let hint = if starts > restarts {
            format!(
                "it is not started again: it was started {starts} times in this run (`restarts: {restarts}`)"
            )
        } else {
            format!(
                "it is restarted on its next use ({} of {restarts} restarts left)",
                restarts + 1 - starts
            )
        };
        ToolError::new(format!("{message}\n{hint}")).of(ErrorClass::Connect)
    }
}

impl Listing {
    /// The arguments of a call of `tool`, checked against its `inputSchema`.
    fn check(
        &self,
        server: &str,
        tool: &str,
        args: Json,
    ) -> Result<serde_json::Map<String, Json>, ToolError> {
        let Some(found) = self.tools.iter().find(|t| t.name == tool) else {
            return Err(unknown(server, tool, &self.tools));
        };
        let args = match args {
            Json::Null => serde_json::Map::new(),
            Json::Object(map) => map,
            other => {
                return Err(ToolError::permanent(format!(
                    "invalid arguments for `{server}.{tool}`: an object is expected, not {}",
                    json_kind(&other)
                )));
            }
        };
        let validator = match self.validators.lock() {
            Ok(mut validators) => validators
                .entry(tool.to_owned())
                .or_insert_with(|| {
                    jsonschema::validator_for(&found.input_schema)
                        .ok()
                        .map(Arc::new)
                })
                .clone(),
            Err(_) => None,
        };
        if let Some(validator) = validator {
            let instance = Json::Object(args);
            let problems: Vec<String> = validator
                .iter_errors(&instance)
                .take(MAX_ARGUMENT_ERRORS)
                .map(|e| {
                    let path = e.instance_path().to_string();
                    let at = if path.is_empty() {
                        "the arguments".to_owned()
                    } else {
                        format!("`{path}`")
                    };
                    format!("at {at}: {}", e.masked())
                })
                .collect();
            if !problems.is_empty() {
                let message = format!(
                    "invalid arguments for `{server}.{tool}`: {}",
                    problems.join("; ")
                );
                return Err(ToolError::permanent(cut(
                    message,
                    MAX_ARGUMENT_MESSAGE_BYTES,
                )));
            }
            let Json::Object(args) = instance else {
                unreachable!("built as an object above")
            };
            return Ok(args);
        }
        Ok(args)
    }
}

/// The error of a call of a tool the server does not list (or its filter leaves out).
fn unknown(server: &str, tool: &str, tools: &[McpTool]) -> ToolError {
    let mut message = format!("MCP server `{server}` has no tool `{tool}`");
    let closest = tools
        .iter()
        .map(|t| (strsim::jaro_winkler(&t.name, tool), &t.name))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((_, name)) = closest {
        message.push_str(&format!("\ndid you mean `{name}`?"));
    }
    if tools.is_empty() {
        message.push_str("\nit lists no tools");
    } else {
        let names: Vec<String> = tools
            .iter()
            .take(MAX_NAMED_TOOLS)
            .map(|t| format!("`{}`", t.name))
            .collect();
        let more = tools.len().saturating_sub(MAX_NAMED_TOOLS);
        message.push_str(&format!("\nknown tools: {}", names.join(", ")));
        if more > 0 {
            message.push_str(&format!(" and {more} more"));
        }
    }
    ToolError::permanent(message)
}

fn json_kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
        text.push('…');
    }
    text
}

fn shut_down(name: &str) -> ToolError {
    ToolError::new(format!(
        "MCP server `{name}` is not available: the run's MCP servers are shut down"
    ))
}

/// The server's `tools` filter, compiled (`None`: every tool).
fn filter(config: &ServerConfig) -> Result<Option<globset::GlobSet>, ToolError> {
    let Some(patterns) = &config.tools else {
        return Ok(None);
    };
    let mut set = globset::GlobSetBuilder::new();
    for pattern in patterns {
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(false)
            .build()
            .map_err(|e| {
                ToolError::permanent(format!(
                    "invalid tool pattern `{pattern}` for MCP server `{}`: {e}",
                    config.name
                ))
            })?;
        set.add(glob);
    }
    set.build().map(Some).map_err(|e| {
        ToolError::permanent(format!(
            "invalid tool patterns for MCP server `{}`: {e}",
            config.name
        ))
    })
}

/// How long to wait before the `n`-th restart (from 0): 250 ms, doubling, at most 10 s.
fn backoff(n: u32) -> Duration {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(Duration::from_secs(10))
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(n as usize)
        .unwrap_or(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(10), Duration::from_secs(10));
    }

    #[test]
    fn an_unknown_tool_names_the_known_ones() {
        let tool = |name: &str| McpTool {
            name: name.to_owned(),
            description: String::new(),
            input_schema: serde_json::json!({ "type": "object" }),
            output_schema: None,
            annotations: None,
        };
        let error = unknown("fs", "read_fil", &[tool("read_file"), tool("write_file")]);
        assert_eq!(
            error.message,
            "MCP server `fs` has no tool `read_fil`\ndid you mean `read_file`?\nknown tools: `read_file`, `write_file`"
        );
        assert_eq!(error.class, ErrorClass::Permanent);
    }
}
