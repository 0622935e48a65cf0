//! A small MCP server (stdio) the tests and the benchmark run archon's MCP client against. Cargo builds it
//! with the tests: `target/<profile>/examples/mcp_test_server`, next to the `archon` binary's directory.
//!
//! Tools: `echo {message}`, `sum {a, b}` (structured), `slow {ticks, interval_ms, answer}` (progress each
//! tick, then an answer, or none when `answer` is false), `crash` (exits mid-call with status 3),
//! `big {mb}` (a text of that many MiB), `env {name}` (an environment variable's value), `add_tool {name}`
//! (adds a tool and sends `notifications/tools/list_changed`), and `tool_000`... with `--many N`.
//!
//! Flags: `--many N`, `--page-size N` (tools per `tools/list` page), `--crash-at-start` (writes to
//! standard error and exits with status 2 before speaking MCP), `--grandchild FILE` (starts a long-lived
//! `sleep` in its own process group and writes its pid to FILE), `--detached FILE` (the same, in a
//! session of its own, with `setsid`), `--pid-file FILE` (its own pid),
//! `--log FILE` (appends `cancelled <tool>` when a call is cancelled).
// The grandchild is left running on purpose: stopping the server's process group must end it.
#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::zombie_processes)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value as Json, json};

#[derive(Clone)]
struct Fixture {
    tools: Arc<Mutex<Vec<Tool>>>,
    page_size: usize,
    log: Option<String>,
}

fn object(schema: Json) -> Arc<serde_json::Map<String, Json>> {
    match schema {
        Json::Object(map) => Arc::new(map),
        _ => unreachable!("schemas are objects"),
    }
}

fn tools(many: usize) -> Vec<Tool> {
    let mut tools = vec![
        Tool::new(
            "echo",
            "Returns its message",
            object(json!({
                "type": "object",
                "properties": { "message": { "type": "string" } },
                "required": ["message"],
            })),
        ),
        Tool::new(
            "sum",
            "Adds two numbers",
            object(json!({
                "type": "object",
                "properties": { "a": { "type": "number" }, "b": { "type": "number" } },
                "required": ["a", "b"],
            })),
        ),
        Tool::new(
            "slow",
            "Reports progress each tick, then answers (or never does)",
            object(json!({
                "type": "object",
                "properties": {
                    "ticks": { "type": "integer", "minimum": 0 },
                    "interval_ms": { "type": "integer", "minimum": 0 },
                    "answer": { "type": "boolean" },
                },
            })),
        ),
        Tool::new(
            "crash",
            "Exits mid-call",
            object(json!({ "type": "object" })),
        ),
        Tool::new(
            "big",
            "Returns a text of `mb` MiB",
            object(json!({
                "type": "object",
                "properties": { "mb": { "type": "integer", "minimum": 0 } },
                "required": ["mb"],
            })),
        ),
        Tool::new(
            "env",
            "Returns an environment variable's value",
            object(json!({
                "type": "object",
                "properties": { "name": { "type": "string" } },
                "required": ["name"],
            })),
        ),
        Tool::new(
            "add_tool",
            "Adds a tool and says the list changed",
            object(json!({
                "type": "object",
                "properties": { "name": { "type": "string" } },
                "required": ["name"],
            })),
        ),
    ];
    for n in 0..many {
        tools.push(Tool::new(
            format!("tool_{n:03}"),
            "One of many",
            object(json!({ "type": "object" })),
        ));
    }
    tools
}

fn text(text: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(text.into())]).into()
}

impl Fixture {
    fn note(&self, line: &str) {
        if let Some(path) = &self.log {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap();
            writeln!(file, "{line}").unwrap();
        }
    }

    async fn slow(
        &self,
        args: &serde_json::Map<String, Json>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let ticks = args.get("ticks").and_then(Json::as_u64).unwrap_or(0);
        let interval = Duration::from_millis(
            args.get("interval_ms")
                .and_then(Json::as_u64)
                .unwrap_or(100),
        );
        let answer = args.get("answer").and_then(Json::as_bool).unwrap_or(true);
        let token = context.meta.get_progress_token();
        self.note("started slow");
        let work = async {
            for tick in 0..ticks {
                tokio::time::sleep(interval).await;
                if let Some(token) = &token {
                    let _ = context
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), (tick + 1) as f64)
                                .with_total(ticks as f64),
                        )
                        .await;
                }
            }
            if !answer {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = work => Ok(text(format!("done after {ticks} ticks"))),
            () = context.ct.cancelled() => {
                self.note("cancelled slow");
                Err(ErrorData::internal_error("cancelled", None))
            }
        }
    }
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.tools.lock().unwrap().clone();
        let start: usize = request
            .and_then(|r| r.cursor)
            .map_or(0, |cursor| cursor.parse().unwrap_or(0));
        let end = (start + self.page_size).min(tools.len());
        let mut result = ListToolsResult::with_all_items(tools[start.min(end)..end].to_vec());
        if end < tools.len() {
            result.next_cursor = Some(end.to_string());
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let string = |key: &str| {
            args.get(key)
                .and_then(Json::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        self.note(&format!("call {}", request.name));
        match request.name.as_ref() {
            "echo" => Ok(text(string("message"))),
            "sum" => {
                let a = args.get("a").and_then(Json::as_f64).unwrap_or(0.0);
                let b = args.get("b").and_then(Json::as_f64).unwrap_or(0.0);
                Ok(CallToolResult::structured(json!({ "sum": a + b })).into())
            }
            "slow" => self.slow(&args, context).await,
            "crash" => {
                eprintln!("crash: exiting mid-call as asked");
                std::process::exit(3)
            }
            "big" => {
                let mb = args.get("mb").and_then(Json::as_u64).unwrap_or(1) as usize;
                Ok(text("x".repeat(mb * 1024 * 1024)))
            }
            "env" => Ok(text(std::env::var(string("name")).unwrap_or_default())),
            "add_tool" => {
                let name = string("name");
                self.tools.lock().unwrap().push(Tool::new(
                    name.clone(),
                    "Added at run time",
                    object(json!({ "type": "object" })),
                ));
                let _ = context.peer.notify_tool_list_changed().await;
                Ok(text(format!("added {name}")))
            }
            other if other.starts_with("tool_") => Ok(text(other.to_owned())),
            other => Err(ErrorData::invalid_params(
                format!("no tool `{other}`"),
                None,
            )),
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut many = 0;
    let mut page_size = usize::MAX;
    let mut log = None;
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--many" => many = args.next().unwrap().parse().unwrap(),
            "--page-size" => page_size = args.next().unwrap().parse().unwrap(),
            "--log" => log = args.next(),
            "--pid-file" => {
                std::fs::write(args.next().unwrap(), std::process::id().to_string()).unwrap()
            }
            "--grandchild" => {
                let path = args.next().unwrap();
                // Same process group as this server: stopping the group must reach it.
                let child = std::process::Command::new("sleep")
                    .arg("1000")
                    .spawn()
                    .unwrap();
                std::fs::write(path, child.id().to_string()).unwrap();
            }
            "--detached" => {
                let path = args.next().unwrap();
                // A session of its own: outside the server's process group, which stopping the group
                // does not reach; archon finds it by the tag it inherits.
                let child = std::process::Command::new("setsid")
                    .args(["sleep", "1000"])
                    .spawn()
                    .unwrap();
                std::fs::write(path, child.id().to_string()).unwrap();
            }
            "--crash-at-start" => {
                eprintln!("boom: this server cannot start");
                std::process::exit(2);
            }
            other => {
                eprintln!("unknown flag `{other}`");
                std::process::exit(64);
            }
        }
    }
    let fixture = Fixture {
        tools: Arc::new(Mutex::new(tools(many))),
        page_size: page_size.max(1),
        log,
    };
    let service = fixture
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await
        .unwrap();
    let _ = service.waiting().await;
}
