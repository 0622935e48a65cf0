//! The `shell` tool: the explicit opt-in to a shell. The command line goes to `sh -c` as one argument and
//! runs as `exec` runs its programs.

use serde_json::{Value as Json, json};

use super::{SENSITIVE, Tool, ToolContext, Watcher};
use crate::tools::{CallFuture, SafetyRule};

pub(super) struct Shell;

impl Tool for Shell {
    fn name(&self) -> &'static str {
        "shell"
    }

    fn description(&self) -> &'static str {
        "Run a command line through `sh -c` (explicit opt-in to a shell)"
    }

    fn parameters(&self) -> Json {
        super::exec::command_parameters("command", json!({ "type": "string" }))
    }

    fn safety(&self) -> SafetyRule {
        SENSITIVE
    }

    fn runs_commands(&self) -> bool {
        true
    }

    fn durations(&self) -> &'static [&'static str] {
        &["timeout"]
    }

    fn call<'a>(
        &'a self,
        args: Json,
        cx: &'a ToolContext,
        on_spawn: Watcher<'a>,
    ) -> CallFuture<'a> {
        Box::pin(async move {
            let mut exec_args = args;
            if let Some(object) = exec_args.as_object_mut() {
                let command = object.remove("command").unwrap_or(Json::Null);
                object.insert("argv".into(), json!(["sh", "-c", command]));
            }
            super::exec::exec(&exec_args, cx, on_spawn).await
        })
    }
}
