//! The `read_file` tool. Reads a text file inside the workspace (`files::read_file`). It runs on a thread of its own, so a
//! file that never answers holds that thread, not the run.

use serde_json::{Value as Json, json};

use super::{READ_ONLY, Tool, ToolContext, Watcher, files, object};
use crate::tools::{CallFuture, SafetyRule, off_thread};

pub(super) struct ReadFile;

impl Tool for ReadFile {
    fn name(&self) -> &'static str {
        "read_file"
    }

    fn description(&self) -> &'static str {
        "Read a text file inside the workspace"
    }

    fn parameters(&self) -> Json {
        object(json!({ "path": { "type": "string" } }), &["path"])
    }

    fn safety(&self) -> SafetyRule {
        READ_ONLY
    }

    fn call<'a>(&'a self, args: Json, cx: &'a ToolContext, _: Watcher<'a>) -> CallFuture<'a> {
        let (workdir, protected, args) = (cx.workdir.clone(), cx.protected.clone(), args.clone());
        Box::pin(
            async move { off_thread(move || files::read_file(&workdir, &protected, &args)).await? },
        )
    }
}
