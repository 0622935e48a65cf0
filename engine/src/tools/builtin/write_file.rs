//! The `write_file` tool. Writes a text file inside the workspace (`files::write_file`). It runs on a thread of its own, so a
//! file that never answers holds that thread, not the run.

use serde_json::{Value as Json, json};

use super::{SENSITIVE, Tool, ToolContext, Watcher, files, object};
use crate::tools::{CallFuture, SafetyRule, off_thread};

pub(super) struct WriteFile;

impl Tool for WriteFile {
    fn name(&self) -> &'static str {
        "write_file"
    }

    fn description(&self) -> &'static str {
        "Write a text file inside the workspace"
    }

    fn parameters(&self) -> Json {
        object(
            json!({
                "path": { "type": "string" },
                "content": { "type": "string" },
                "append": { "type": "boolean" },
            }),
            &["path", "content"],
        )
    }

    fn safety(&self) -> SafetyRule {
        SENSITIVE
    }

    fn call<'a>(&'a self, args: Json, cx: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        let (workdir, protected, args) = (cx.workdir.clone(), cx.protected.clone(), args.clone());
        Box::pin(async move {
            off_thread(move || files::write_file(&workdir, &protected, &args)).await?
        })
    }
}
