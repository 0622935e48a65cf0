//! MCP call overhead (run with `cargo bench --bench mcp`): `echo` on the test server
//! (`examples/mcp_test_server.rs`, over stdio) called through Archon's `Servers::call` (argument check
//! against the tool's schema, timeouts with progress, cancellation, result mapping, masking) and the same
//! call made directly with an rmcp client against another process of the same server. Calls run one after
//! another, in alternating rounds so that both sides meet the same machine load; the figure per side is
//! the median of its rounds' mean time per call, and the overhead is the difference. Server start-up
//! (spawn, `initialize`, `tools/list`) is reported apart. Figures are printed; nothing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use archon_engine::tools::mcp::{Limits, ServerConfig, Servers, ServersOptions, Transport};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 10;
const CALLS_PER_ROUND: usize = 500;
const WARMUP_CALLS: usize = 200;
const STARTS: usize = 10;

/// The test server of this build profile, built first (`target/<profile>/examples/mcp_test_server`).
fn fixture() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let mut build = vec!["build", "-q", "--example", "mcp_test_server"];
    if profile_dir.ends_with("release") {
        build.push("--release");
    }
    let status = std::process::Command::new(env!("CARGO"))
        .args(build)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(status.success());
    profile_dir.join("examples/mcp_test_server")
}

fn config(path: &std::path::Path) -> ServerConfig {
    ServerConfig {
        name: "bench".to_owned(),
        transport: Transport::Stdio {
            argv: vec![path.display().to_string()],
            env: Vec::new(),
            cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        },
        tools: None,
        limits: Limits::default(),
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let path = fixture();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(path));
}

async fn bench(path: PathBuf) {
    let config = config(&path);
    let args = json!({ "message": "hello" });
    let never = CancellationToken::new();

    // Start-up: spawn, `initialize`, `tools/list`; then stop.
    let mut archon_starts = Vec::new();
    let mut direct_starts = Vec::new();
    for _ in 0..STARTS {
        let started = Instant::now();
        let servers = Servers::new(ServersOptions::default());
        servers
            .tools(&config, &CancellationToken::new())
            .await
            .unwrap();
        archon_starts.push(started.elapsed());
        servers.shutdown().await;

        let started = Instant::now();
        let client =
            ().serve(TokioChildProcess::new(tokio::process::Command::new(&path)).unwrap())
                .await
                .unwrap();
        client.list_all_tools().await.unwrap();
        direct_starts.push(started.elapsed());
        client.cancel().await.unwrap();
    }

    // Calls.
    let servers = Servers::new(ServersOptions::default());
    let client =
        ().serve(TokioChildProcess::new(tokio::process::Command::new(&path)).unwrap())
            .await
            .unwrap();
    let direct_args = args.as_object().unwrap().clone();
    let direct = || {
        let params = CallToolRequestParams::new("echo").with_arguments(direct_args.clone());
        client.call_tool(params)
    };
    for _ in 0..WARMUP_CALLS {
        let out = servers
            .call(&config, "echo", args.clone(), None, &never)
            .await
            .unwrap();
        assert_eq!(out.text, "hello");
        direct().await.unwrap();
    }
    let mut archon = Vec::new();
    let mut plain = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        for _ in 0..CALLS_PER_ROUND {
            servers
                .call(&config, "echo", args.clone(), None, &never)
                .await
                .unwrap();
        }
        archon.push(started.elapsed() / CALLS_PER_ROUND as u32);
        let started = Instant::now();
        for _ in 0..CALLS_PER_ROUND {
            direct().await.unwrap();
        }
        plain.push(started.elapsed() / CALLS_PER_ROUND as u32);
    }
    servers.shutdown().await;
    client.cancel().await.unwrap();

    let (archon, plain) = (median(archon), median(plain));
    println!("mcp: echo over stdio, {ROUNDS} rounds of {CALLS_PER_ROUND} calls each side");
    println!("  through Servers::call   {}", micros(archon));
    println!("  direct rmcp client      {}", micros(plain));
    println!(
        "  overhead per call       {}",
        micros(archon.saturating_sub(plain))
    );
    println!("mcp: server start-up (spawn, initialize, tools/list), median of {STARTS}");
    println!(
        "  through Servers::tools  {}",
        millis(median(archon_starts))
    );
    println!(
        "  direct rmcp client      {}",
        millis(median(direct_starts))
    );
}
