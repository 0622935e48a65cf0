//! The MCP client (`archon_engine::tools::mcp::Servers`) against the test server
//! (`examples/mcp_test_server.rs`) and against the reference server `@modelcontextprotocol/server-everything`
//! over stdio and streamable HTTP.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archon_engine::network::NetworkPolicy;
use archon_engine::redact::Redactor;
use archon_engine::tools::ErrorClass;
use archon_engine::tools::mcp::{Limits, ServerConfig, Servers, ServersOptions, Transport};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{mcp_fixture as fixture, npm_bin, root};

/// One call of `tool` with no limit of the caller's and nothing cancelling it.
async fn call(
    servers: &Servers,
    config: &ServerConfig,
    tool: &str,
    args: serde_json::Value,
) -> Result<archon_engine::tools::ToolOutput, archon_engine::tools::ToolError> {
    servers.call(config, tool, args, None, &never()).await
}

fn limits() -> Limits {
    Limits {
        startup_timeout: Duration::from_secs(20),
        call_timeout: Duration::from_secs(20),
        max_call_timeout: Duration::from_secs(60),
        restarts: 3,
    }
}

fn stdio(argv: Vec<String>, limits: Limits) -> ServerConfig {
    ServerConfig {
        name: "fx".to_owned(),
        transport: Transport::Stdio {
            argv,
            env: Vec::new(),
            cwd: root().to_path_buf(),
        },
        tools: None,
        limits,
    }
}

/// The test server with `flags`.
fn server(flags: &[&str]) -> ServerConfig {
    let mut argv = vec![fixture().display().to_string()];
    argv.extend(flags.iter().map(|f| (*f).to_owned()));
    stdio(argv, limits())
}

/// A pool that counts the process groups it is told of.
fn pool() -> (Servers, Arc<AtomicUsize>) {
    pool_with(ServersOptions::default())
}

fn pool_with(mut options: ServersOptions) -> (Servers, Arc<AtomicUsize>) {
    let spawned = Arc::new(AtomicUsize::new(0));
    let count = spawned.clone();
    options.on_spawn = Arc::new(move |_| {
        count.fetch_add(1, Ordering::SeqCst);
    });
    (Servers::new(options), spawned)
}

fn names(tools: &[archon_engine::tools::mcp::McpTool]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

fn never() -> CancellationToken {
    CancellationToken::new()
}

/// Waits until `done` holds, for at most 10 s.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what} never happened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Whether a process is gone (or only a zombie left for its new parent to reap).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn mcp_client_lists_tools_through_the_filter() {
    let (servers, spawned) = pool();
    let mut config = server(&[]);
    let all = servers.tools(&config, &never()).await.expect("tools");
    assert_eq!(
        names(&all),
        ["echo", "sum", "slow", "crash", "big", "env", "add_tool"]
    );
    assert_eq!(all[0].description, "Returns its message");
    assert_eq!(all[0].input_schema["required"], json!(["message"]));
    config.tools = Some(vec!["e*".to_owned(), "sum".to_owned()]);
    let filtered = servers.tools(&config, &never()).await.expect("tools");
    assert_eq!(names(&filtered), ["echo", "sum", "env"]);
    // One process per configuration, started once however often it is asked.
    servers.tools(&config, &never()).await.expect("tools");
    assert_eq!(spawned.load(Ordering::SeqCst), 2);
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_calls_tools() {
    let (servers, _) = pool();
    let config = server(&[]);
    let echo = call(&servers, &config, "echo", json!({ "message": "hi" }))
        .await
        .expect("echo");
    assert_eq!(echo.output, json!("hi"));
    assert_eq!(echo.text, "hi");
    let sum = call(&servers, &config, "sum", json!({ "a": 2, "b": 3 }))
        .await
        .expect("sum");
    assert_eq!(sum.output, json!({ "sum": 5.0 }));
    assert_eq!(sum.text, r#"{"sum":5.0}"#);
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_lists_every_page() {
    let (servers, _) = pool();
    let config = server(&["--many", "25", "--page-size", "4"]);
    let tools = servers.tools(&config, &never()).await.expect("tools");
    assert_eq!(tools.len(), 32);
    assert_eq!(tools[7].name, "tool_000");
    assert_eq!(tools[31].name, "tool_024");
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_lists_again_after_list_changed() {
    let (servers, _) = pool();
    let config = server(&[]);
    assert_eq!(
        servers.tools(&config, &never()).await.expect("tools").len(),
        7
    );
    let added = call(&servers, &config, "add_tool", json!({ "name": "fresh" }))
        .await
        .expect("add_tool");
    assert_eq!(added.text, "added fresh");
    // The notification is handled as it arrives, perhaps just after the call's answer.
    let started = Instant::now();
    loop {
        let tools = servers.tools(&config, &never()).await.expect("tools");
        if tools.len() == 8 {
            assert_eq!(tools[7].name, "fresh");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never relisted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fresh = call(&servers, &config, "fresh", json!({})).await;
    assert_eq!(
        fresh.expect_err("the fixture has no body for it").message,
        "MCP server `fx` refused `tools/call`: no tool `fresh`"
    );
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_reports_a_crash_mid_call_and_restarts_the_server() {
    let (servers, spawned) = pool();
    let config = server(&[]);
    let error = call(&servers, &config, "crash", json!({}))
        .await
        .expect_err("it crashes");
    assert_eq!(
        error.message,
        "MCP server `fx` exited with status 3 during `tools/call`: crash: exiting mid-call as asked\nit is restarted on its next use (3 of 3 restarts left)"
    );
    assert_eq!(error.class, ErrorClass::Connect);
    let echo = call(&servers, &config, "echo", json!({ "message": "back" }))
        .await
        .expect("restarted");
    assert_eq!(echo.text, "back");
    assert_eq!(spawned.load(Ordering::SeqCst), 2);
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_reports_a_crash_while_a_grandchild_holds_its_pipes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let grandchild = dir.path().join("grandchild");
    let (servers, _) = pool();
    let config = server(&["--grandchild", &grandchild.display().to_string()]);
    let error = call(&servers, &config, "crash", json!({}))
        .await
        .expect_err("it crashes");
    assert_eq!(
        error.message,
        "MCP server `fx` exited with status 3 during `tools/call`: crash: exiting mid-call as asked\nit is restarted on its next use (3 of 3 restarts left)"
    );
    until("the grandchild's end", || gone(&read(&grandchild))).await;
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_stops_restarting_after_the_limit() {
    let (servers, spawned) = pool();
    let mut config = server(&[]);
    config.limits.restarts = 1;
    call(&servers, &config, "crash", json!({}))
        .await
        .expect_err("first crash");
    let error = call(&servers, &config, "crash", json!({}))
        .await
        .expect_err("second crash");
    assert_eq!(
        error.message,
        "MCP server `fx` exited with status 3 during `tools/call`: crash: exiting mid-call as asked\nit is not started again: it was started 2 times in this run (`restarts: 1`)"
    );
    let started = Instant::now();
    let error = call(&servers, &config, "echo", json!({ "message": "x" }))
        .await
        .expect_err("no more restarts");
    assert_eq!(
        error.message,
        "MCP server `fx` is not started again: it was started 2 times in this run\nthe limit is `restarts: 1`"
    );
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "not at once"
    );
    assert_eq!(spawned.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn mcp_client_quotes_the_stderr_of_a_server_that_fails_at_start() {
    let (servers, _) = pool();
    let error = servers
        .tools(&server(&["--crash-at-start"]), &never())
        .await
        .expect_err("it cannot start");
    assert_eq!(
        error.message,
        "MCP server `fx` exited with status 2 during `initialize`: boom: this server cannot start"
    );
    assert_eq!(error.class, ErrorClass::Connect);
}

#[tokio::test]
async fn mcp_client_reports_a_program_that_does_not_exist() {
    let (servers, _) = pool();
    let error = servers
        .tools(
            &stdio(vec!["/nonexistent/mcp-server".to_owned()], limits()),
            &never(),
        )
        .await
        .expect_err("no such program");
    assert_eq!(
        error.message,
        "cannot start MCP server `fx`: `/nonexistent/mcp-server` does not exist"
    );
    let error = servers
        .tools(
            &stdio(vec!["archon-no-such-mcp-server".to_owned()], limits()),
            &never(),
        )
        .await
        .expect_err("no such program");
    assert_eq!(
        error.message,
        "cannot start MCP server `fx`: `archon-no-such-mcp-server` is not found on `PATH`\ninstall it, or give its path in `command`"
    );
}

#[tokio::test]
async fn mcp_client_times_out_a_silent_call_and_cancels_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let (servers, _) = pool();
    let mut config = server(&["--log", &log.display().to_string()]);
    config.limits.call_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let error = call(&servers, &config, "slow", json!({ "answer": false }))
        .await
        .expect_err("it never answers");
    assert_eq!(
        error.message,
        "`fx.slow` timed out after 300ms without progress (`call_timeout`)"
    );
    assert_eq!(error.class, ErrorClass::Other);
    assert!(started.elapsed() < Duration::from_secs(5));
    until("the server seeing the cancellation", || {
        read(&log).contains("cancelled slow")
    })
    .await;
    // The server is still usable.
    let echo = call(&servers, &config, "echo", json!({ "message": "still" }))
        .await
        .expect("echo");
    assert_eq!(echo.text, "still");
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_lets_progress_extend_the_timeout() {
    let (servers, _) = pool();
    let mut config = server(&[]);
    config.limits.call_timeout = Duration::from_millis(400);
    let started = Instant::now();
    let done = call(
        &servers,
        &config,
        "slow",
        json!({ "ticks": 8, "interval_ms": 100 }),
    )
    .await
    .expect("progress keeps it alive");
    assert_eq!(done.text, "done after 8 ticks");
    assert!(started.elapsed() >= Duration::from_millis(800));
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_ends_a_call_at_max_call_timeout_despite_progress() {
    let (servers, _) = pool();
    let mut config = server(&[]);
    config.limits.call_timeout = Duration::from_millis(300);
    config.limits.max_call_timeout = Duration::from_millis(700);
    let error = call(
        &servers,
        &config,
        "slow",
        json!({ "ticks": 1000, "interval_ms": 50 }),
    )
    .await
    .expect_err("too long in all");
    assert_eq!(
        error.message,
        "`fx.slow` timed out after 700ms (`max_call_timeout`)"
    );
    // The step's remaining time, when shorter, is the limit.
    let error = servers
        .call(
            &config,
            "slow",
            json!({ "ticks": 1000, "interval_ms": 50 }),
            Some(Duration::from_millis(500)),
            &never(),
        )
        .await
        .expect_err("the step's time is up");
    assert_eq!(
        error.message,
        "`fx.slow` timed out after 500ms (the step's time)"
    );
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_cancels_a_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let (servers, _) = pool();
    let config = server(&["--log", &log.display().to_string()]);
    let cancel = CancellationToken::new();
    let call = servers.call(&config, "slow", json!({ "answer": false }), None, &cancel);
    let trigger = async {
        until("the call starting", || read(&log).contains("started slow")).await;
        cancel.cancel();
        std::future::pending::<()>().await;
    };
    let error = tokio::select! {
        result = call => result.expect_err("cancelled"),
        () = trigger => unreachable!(),
    };
    assert_eq!(error.message, "cancelled");
    until("the server seeing the cancellation", || {
        read(&log).contains("cancelled slow")
    })
    .await;
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_caps_a_50_mb_result() {
    let (servers, _) = pool();
    let config = server(&[]);
    let big = call(&servers, &config, "big", json!({ "mb": 50 }))
        .await
        .expect("big");
    let cap = archon_engine::tools::builtin::MAX_CAPTURE_BYTES;
    let note = format!(
        "\n[archon: output truncated, {} more bytes]",
        50 * 1024 * 1024 - cap
    );
    assert_eq!(big.text.len(), cap + note.len());
    assert!(big.text.ends_with(&note), "{}", &big.text[cap - 10..]);
    assert_eq!(big.output, json!(big.text));
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_refuses_a_message_over_the_bound_and_restarts() {
    let (servers, spawned) = pool();
    let config = server(&[]);
    let error = call(&servers, &config, "big", json!({ "mb": 65 }))
        .await
        .expect_err("too large");
    assert_eq!(
        error.message,
        "MCP server `fx` sent a message larger than 64 MiB during `tools/call`\nit is restarted on its next use (3 of 3 restarts left)"
    );
    let echo = call(&servers, &config, "echo", json!({ "message": "ok" }))
        .await
        .expect("restarted");
    assert_eq!(echo.text, "ok");
    assert_eq!(spawned.load(Ordering::SeqCst), 2);
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_refuses_invalid_arguments_before_sending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let (servers, _) = pool();
    let config = server(&["--log", &log.display().to_string()]);
    let error = call(&servers, &config, "sum", json!({ "a": "two" }))
        .await
        .expect_err("invalid");
    assert_eq!(
        error.message,
        r#"invalid arguments for `fx.sum`: at the arguments: "b" is a required property; at `/a`: value is not of type "number""#
    );
    assert_eq!(error.class, ErrorClass::Permanent);
    let error = call(&servers, &config, "sum", json!([1, 2]))
        .await
        .expect_err("not an object");
    assert_eq!(
        error.message,
        "invalid arguments for `fx.sum`: an object is expected, not an array"
    );
    let error = call(&servers, &config, "ecko", json!({}))
        .await
        .expect_err("unknown");
    assert_eq!(
        error.message,
        "MCP server `fx` has no tool `ecko`\ndid you mean `echo`?\nknown tools: `echo`, `sum`, `slow`, `crash`, `big`, `env`, `add_tool`"
    );
    assert_eq!(error.class, ErrorClass::Permanent);
    // Nothing reached the server.
    call(&servers, &config, "echo", json!({ "message": "x" }))
        .await
        .expect("echo");
    assert_eq!(read(&log), "call echo\n");
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_withholds_secrets_and_masks_them() {
    let redactor = Arc::new(Redactor::new(["s3cret-value-1234".to_owned()]));
    let (servers, _) = pool_with(ServersOptions {
        withheld: vec!["HOME".to_owned()],
        redactor,
        ..ServersOptions::default()
    });
    let mut config = server(&[]);
    if let Transport::Stdio { env, .. } = &mut config.transport {
        env.push(("TOKEN".to_owned(), "s3cret-value-1234".to_owned()));
    }
    let token = call(&servers, &config, "env", json!({ "name": "TOKEN" }))
        .await
        .expect("env");
    assert_eq!(token.text, "***");
    assert_eq!(token.output, json!("***"));
    let home = call(&servers, &config, "env", json!({ "name": "HOME" }))
        .await
        .expect("env");
    assert_eq!(home.text, "");
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_shutdown_leaves_no_process_of_the_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (grandchild, pid) = (dir.path().join("grandchild"), dir.path().join("pid"));
    let pgids = Arc::new(Mutex::new(Vec::new()));
    let told = pgids.clone();
    let servers = Servers::new(ServersOptions {
        on_spawn: Arc::new(move |pgid| told.lock().expect("lock").push(pgid)),
        ..ServersOptions::default()
    });
    let config = server(&[
        "--grandchild",
        &grandchild.display().to_string(),
        "--pid-file",
        &pid.display().to_string(),
    ]);
    servers.tools(&config, &never()).await.expect("tools");
    let (grandchild, pid) = (read(&grandchild), read(&pid));
    assert_eq!(
        *pgids.lock().expect("lock"),
        [pid.parse::<u32>().expect("pid")]
    );
    assert!(!gone(&grandchild) && !gone(&pid));
    servers.shutdown().await;
    assert!(gone(&pid), "the server survived");
    until("the grandchild's end", || gone(&grandchild)).await;
    let error = servers
        .tools(&config, &never())
        .await
        .expect_err("shut down");
    assert_eq!(
        error.message,
        "MCP server `fx` is not available: the run's MCP servers are shut down"
    );
}

#[tokio::test]
async fn mcp_client_kills_the_group_when_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let grandchild = dir.path().join("grandchild");
    let (servers, _) = pool();
    let config = server(&["--grandchild", &grandchild.display().to_string()]);
    servers.tools(&config, &never()).await.expect("tools");
    let grandchild = read(&grandchild);
    assert!(!gone(&grandchild));
    drop(servers);
    until("the grandchild's end", || gone(&grandchild)).await;
}

// The reference server, `@modelcontextprotocol/server-everything`.

/// The reference server over stdio, or `None` (after saying why) when it is not installed.
fn everything_stdio() -> Option<ServerConfig> {
    let bin = npm_bin("mcp-server-everything")?;
    let mut config = stdio(
        vec![bin.display().to_string(), "stdio".to_owned()],
        limits(),
    );
    config.name = "everything".to_owned();
    Some(config)
}

/// The reference server over streamable HTTP on a free port: the process (stopped when dropped) and the
/// configuration reaching it.
fn everything_http() -> Option<(std::process::Child, ServerConfig)> {
    use std::io::BufRead;
    let bin = npm_bin("mcp-server-everything")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = std::process::Command::new(bin)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the server starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = std::io::BufReader::new(stderr).lines();
    loop {
        let line = lines
            .next()
            .expect("the server says it listens")
            .expect("a line");
        if line.contains("listening on port") {
            break;
        }
    }
    // Keep draining what it writes, so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let config = ServerConfig {
        name: "everything".to_owned(),
        transport: Transport::Http {
            url: format!("http://127.0.0.1:{port}/mcp"),
            headers: vec![("X-Test".to_owned(), "1".to_owned())],
        },
        tools: None,
        limits: limits(),
    };
    Some((child, config))
}

/// The pool the reference server over HTTP needs: loopback allowed.
fn loopback_pool() -> Servers {
    Servers::new(ServersOptions {
        network: Arc::new(NetworkPolicy::new(&["127.0.0.1".to_owned()])),
        ..ServersOptions::default()
    })
}

/// What the reference server's tools are called in this version: its echo, sum and long-running tools.
async fn reference_tools(servers: &Servers, config: &ServerConfig) -> (String, String, String) {
    let tools = servers.tools(config, &never()).await.expect("tools");
    let find = |part: &str| {
        tools
            .iter()
            .find(|t| t.name.contains(part))
            .unwrap_or_else(|| panic!("no tool like `{part}` in {:?}", names(&tools)))
            .name
            .clone()
    };
    (find("echo"), find("sum"), find("long"))
}

async fn exercise_reference(servers: &Servers, config: &ServerConfig) {
    let (echo, sum, long) = reference_tools(servers, config).await;
    let echoed = servers
        .call(config, &echo, json!({ "message": "hi" }), None, &never())
        .await
        .expect("echo");
    assert_eq!(echoed.text, "Echo: hi");
    let summed = servers
        .call(config, &sum, json!({ "a": 2, "b": 3 }), None, &never())
        .await
        .expect("sum");
    assert_eq!(summed.text, "The sum of 2 and 3 is 5.");
    // Progress every 200 ms keeps a call alive past a 500 ms `call_timeout`.
    let mut patient = config.clone();
    patient.limits.call_timeout = Duration::from_millis(500);
    let done = servers
        .call(
            &patient,
            &long,
            json!({ "duration": 1.2, "steps": 6 }),
            None,
            &never(),
        )
        .await
        .expect("long-running");
    assert_eq!(
        done.text,
        "Long running operation completed. Duration: 1.2 seconds, Steps: 6."
    );
    let error = servers
        .call(
            &patient,
            &long,
            json!({ "duration": 3, "steps": 1 }),
            None,
            &never(),
        )
        .await
        .expect_err("no progress for 3 s");
    assert_eq!(
        error.message,
        format!("`everything.{long}` timed out after 500ms without progress (`call_timeout`)")
    );
    let cancel = CancellationToken::new();
    let started = Instant::now();
    let call = servers.call(
        config,
        &long,
        json!({ "duration": 20, "steps": 20 }),
        None,
        &cancel,
    );
    let trigger = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cancel.cancel();
        std::future::pending::<()>().await;
    };
    let error = tokio::select! {
        result = call => result.expect_err("cancelled"),
        () = trigger => unreachable!(),
    };
    assert_eq!(error.message, "cancelled");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Still usable after a cancellation.
    servers
        .call(config, &echo, json!({ "message": "again" }), None, &never())
        .await
        .expect("echo");
}

#[tokio::test]
async fn mcp_client_drives_the_reference_server_over_stdio() {
    let Some(config) = everything_stdio() else {
        return;
    };
    let servers = Servers::new(ServersOptions::default());
    exercise_reference(&servers, &config).await;
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_drives_the_reference_server_over_http() {
    let Some((child, config)) = everything_http() else {
        return;
    };
    let _child = Reaped(child);
    let servers = loopback_pool();
    exercise_reference(&servers, &config).await;
    servers.shutdown().await;
}

#[tokio::test]
async fn mcp_client_refuses_loopback_unless_the_network_policy_allows_it() {
    let Some((child, config)) = everything_http() else {
        return;
    };
    let _child = Reaped(child);
    let servers = Servers::new(ServersOptions::default());
    let error = servers.tools(&config, &never()).await.expect_err("refused");
    assert_eq!(
        error.message,
        "`127.0.0.1` is an internal address (loopback), which MCP refuses unless `network.allow` lists it"
    );
    assert_eq!(error.class, ErrorClass::Permanent);
}

#[tokio::test]
async fn mcp_client_says_plainly_why_a_url_server_is_unreachable() {
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let config = ServerConfig {
        name: "down".to_owned(),
        transport: Transport::Http {
            url: url.clone(),
            headers: Vec::new(),
        },
        tools: None,
        limits: limits(),
    };
    let servers = loopback_pool();
    let error = servers.tools(&config, &never()).await.expect_err("down");
    assert_eq!(
        error.message,
        format!("cannot reach MCP server `down` at `{url}`: connection refused (os error 111)")
    );
    assert_eq!(error.class, ErrorClass::Connect);
    servers.shutdown().await;
}

/// A child process killed and reaped when dropped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
