//! The `echo` tool: returns its arguments unchanged.

use serde_json::{Value as Json, json};

use super::{READ_ONLY, Tool, ToolContext, ToolOutput, Watcher};
use crate::tools::{CallFuture, SafetyRule};

pub(super) struct Echo;

impl Tool for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn description(&self) -> &'static str {
        "Return its arguments unchanged"
    }

    fn parameters(&self) -> Json {
        json!({ "type": "object" })
    }

    fn safety(&self) -> SafetyRule {
        READ_ONLY
    }

    fn call<'a>(&'a self, args: Json, _: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        // Writing a large value as its text is done on a blocking thread, off the run's.
        Box::pin(async move {
            if !super::jq::larger_than(&args, super::jq::IN_PLACE) {
                return Ok(ToolOutput::json(args));
            }
            tokio::task::spawn_blocking(move || ToolOutput::json(args))
                .await
                .map_err(|_| crate::tools::ToolError::new("the value could not be written"))
        })
    }
}
