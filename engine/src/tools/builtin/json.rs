//! The `json` tool: queries or transforms JSON with a jq filter ([`super::jq`]: plain paths in place,
//! anything else in a killable helper process).

use serde_json::{Value as Json, json};

use super::{READ_ONLY, Tool, ToolContext, ToolOutput, Watcher, object};
use crate::tools::{CallFuture, SafetyRule};

pub(super) struct JsonQuery;

impl Tool for JsonQuery {
    fn name(&self) -> &'static str {
        "json"
    }

    fn description(&self) -> &'static str {
        "Query or transform JSON with a jq filter"
    }

    fn parameters(&self) -> Json {
        object(
            json!({ "input": {}, "query": { "type": "string" } }),
            &["query"],
        )
    }

    fn safety(&self) -> SafetyRule {
        READ_ONLY
    }

    fn call<'a>(&'a self, args: Json, cx: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            let mut args = args;
            let filter = args["query"].as_str().unwrap_or(".").to_owned();
            let input = args["input"].take();
            let output = super::jq::query(cx.helper.as_deref(), input, &filter).await?;
            if !super::jq::larger_than(&output, super::jq::IN_PLACE) {
                return Ok(ToolOutput::json(output));
            }
            // Writing a large result as its text, too, is done on a blocking thread.
            tokio::task::spawn_blocking(move || ToolOutput::json(output))
                .await
                .map_err(|_| crate::tools::ToolError::new("the result could not be written"))
        })
    }
}
