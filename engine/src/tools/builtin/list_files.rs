//! The `list_files` tool. Lists files inside the workspace matching a glob (`files::list_files`). It runs on a thread of its own, so a
//! file that never answers holds that thread, not the run.

use serde_json::{Value as Json, json};

use super::{READ_ONLY, Tool, ToolContext, Watcher, files, object};
use crate::tools::{CallFuture, SafetyRule, off_thread};

pub(super) struct ListFiles;

impl Tool for ListFiles {
    fn name(&self) -> &'static str {
        "list_files"
    }

    fn description(&self) -> &'static str {
        "List files inside the workspace matching a glob"
    }

    fn parameters(&self) -> Json {
        object(
            json!({
                "path": { "type": "string" },
                "pattern": { "type": "string" },
            }),
            &[],
        )
    }

    fn safety(&self) -> SafetyRule {
        READ_ONLY
    }

    fn call<'a>(&'a self, args: Json, cx: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        let (workdir, protected, args) = (cx.workdir.clone(), cx.protected.clone(), args.clone());
        Box::pin(async move {
            off_thread(move || files::list_files(&workdir, &protected, &args)).await?
        })
    }
}
