//! The `sleep` tool: waits for a duration.

use serde_json::{Value as Json, json};

use super::{READ_ONLY, Tool, ToolContext, ToolError, ToolOutput, Watcher, object};
use crate::tools::{CallFuture, SafetyRule};

pub(super) struct Sleep;

impl Tool for Sleep {
    fn name(&self) -> &'static str {
        "sleep"
    }

    fn description(&self) -> &'static str {
        "Wait for a duration"
    }

    fn parameters(&self) -> Json {
        object(json!({ "duration": { "type": "string" } }), &["duration"])
    }

    fn safety(&self) -> SafetyRule {
        READ_ONLY
    }

    fn durations(&self) -> &'static [&'static str] {
        &["duration"]
    }

    fn call<'a>(&'a self, args: Json, _: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            // The argument may be rendered from a template, so it is read here, not by validation.
            let text = args["duration"].as_str().unwrap_or_default();
            let duration = humantime::parse_duration(text.trim())
                .map_err(|_| ToolError::new(format!("invalid duration `{text}` for `sleep`")))?;
            tokio::time::sleep(duration).await;
            Ok(ToolOutput {
                output: json!({ "slept_ms": duration.as_millis() as u64 }),
                text: String::new(),
                exit_code: None,
            })
        })
    }
}
