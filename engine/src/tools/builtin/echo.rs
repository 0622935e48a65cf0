//! The `echo` tool: returns its arguments unchanged.

use serde_json::{Value as Json, json};

use super::{OnSpawn, READ_ONLY, Tool, ToolContext, ToolOutput};
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

    fn call<'a>(&'a self, args: &'a Json, _: &'a ToolContext, _: OnSpawn<'a>) -> CallFuture<'a> {
        Box::pin(async move { Ok(ToolOutput::json(args.clone())) })
    }
}
