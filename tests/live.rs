//! Issue 14's live check, against real llama.cpp servers from `../shared/tools/local-llm.sh`:
//! `ARCHON_E2E_OPENAI_BASE_URL` names one started with `--jinja` (native tool calling), and
//! `ARCHON_E2E_OPENAI_NOJINJA_BASE_URL` one started without it (`ARCHON_LLM_JINJA=0 local-llm.sh start
//! 8090`), which refuses requests carrying tools with an HTTP 500. Without a variable its case checks
//! nothing and says so.
//!
//! Requests go through a small timing proxy, so that the agent's own time between two model calls (reading
//! the answer, running the tool, recording, building the next request) is measured exactly, outside the
//! model's time and the proxy's.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use archon_engine::run::{self, RunEvent, RunOptions, StepStatus};
use serde_json::Map;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// When each request arrived whole at the proxy, and when its response had been written back.
type Timings = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// A proxy on 127.0.0.1 forwarding every request to `upstream` (a base URL such as
/// `http://127.0.0.1:8089/v1`); returns its base URL and its timings.
async fn timing_proxy(upstream: String) -> (String, Timings) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let upstream = upstream
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("a host and port")
        .to_owned();
    let timings: Timings = Arc::default();
    let recorded = timings.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, upstream.clone(), recorded.clone()));
        }
    });
    (format!("http://{address}/v1"), timings)
}

/// Serves one connection's requests, one after another (HTTP/1.1 keep-alive), each forwarded on a
/// connection of its own to `upstream` (`host:port`).
async fn serve(mut stream: TcpStream, upstream: String, timings: Timings) {
    let mut buffer = Vec::new();
    loop {
        let Some((path, body)) = read_request(&mut stream, &mut buffer).await else {
            return;
        };
        let arrived = Instant::now();
        let Ok(mut server) = TcpStream::connect(&upstream).await else {
            return;
        };
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {upstream}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let mut response = Vec::new();
        if server.write_all(head.as_bytes()).await.is_err()
            || server.write_all(&body).await.is_err()
            || server.read_to_end(&mut response).await.is_err()
        {
            return;
        }
        // The answer as the server gave it, but kept alive for the next request.
        let text = String::from_utf8_lossy(&response);
        let response = text.replacen("Connection: close", "Connection: keep-alive", 1);
        if stream.write_all(response.as_bytes()).await.is_err() {
            return;
        }
        let _ = stream.flush().await;
        timings
            .lock()
            .expect("timings")
            .push((arrived, Instant::now()));
    }
}

/// The next request on the connection: its path and body.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    let mut chunk = [0_u8; 64 * 1024];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let path = head.split_whitespace().nth(1)?.to_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < end + length {
        let n = stream.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[end..end + length].to_vec();
    buffer.drain(..end + length);
    Some((path, body))
}

/// Runs an agent step with a calculator against `base_url` through the proxy; returns the step's events
/// and the gaps between one response and the next request.
async fn agent_against(base_url: String) -> (run::RunReport, Vec<RunEvent>, Vec<Duration>) {
    let (proxy, timings) = timing_proxy(base_url).await;
    let dir = TempDir::new().expect("tempdir");
    let yaml = format!(
        "name: live\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{proxy}\", model: local, max_tokens: 1024, timeout: 120s }}\n  budget: {{ max_llm_calls: 8 }}\nsteps:\n  - id: agent\n    goal: What is 20% of 50? Use the calculator tool, then answer with the number.\n    tools: [calculator]\n    max_iterations: 4\n    timeout: 5m\n"
    );
    std::fs::write(dir.path().join("live.yaml"), yaml).expect("write");
    let workflow = archon_engine::validate_file(&dir.path().join("live.yaml"))
        .workflow
        .expect("valid");
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
    let mut options = RunOptions::new(dir.path().to_path_buf(), "live");
    options.events = Some(sender);
    let report = run::run(Arc::new(workflow), Map::new(), options)
        .await
        .expect("run starts");
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    let timings = timings.lock().expect("timings").clone();
    let gaps = timings
        .windows(2)
        .map(|pair| pair[1].0.saturating_duration_since(pair[0].1))
        .collect();
    (report, events, gaps)
}

#[allow(clippy::print_stderr)]
fn print(kind: &str, report: &run::RunReport, gaps: &[Duration]) {
    let step = &report.steps["agent"];
    let mut sorted = gaps.to_vec();
    sorted.sort();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    eprintln!(
        "live {kind}: {} in {} ms, {} LLM calls ({} failed), output {}, error {:?}; agent time between model calls: {:?} (median {median:?})",
        step.status.as_str(),
        step.duration_ms,
        step.llm.as_ref().map_or(0, |l| l.calls),
        step.llm.as_ref().map_or(0, |l| l.failed_calls),
        step.output,
        step.error,
        gaps
    );
}

/// The step ends within its budget, with a clear status.
fn ends_within_bounds(report: &run::RunReport) {
    let step = &report.steps["agent"];
    assert!(
        matches!(
            step.status,
            StepStatus::Succeeded | StepStatus::Failed | StepStatus::Stuck | StepStatus::Incomplete
        ),
        "ended {:?}",
        step.status
    );
    if step.status != StepStatus::Succeeded {
        assert!(step.error.as_deref().is_some_and(|e| !e.is_empty()));
    }
    let calls = report.llm.as_ref().map_or(0, |l| l.calls);
    assert!(calls <= 8, "the budget holds: {calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)]
async fn an_agent_with_native_tools_against_llama_cpp() {
    let Ok(base_url) = std::env::var("ARCHON_E2E_OPENAI_BASE_URL") else {
        eprintln!("skipped: set ARCHON_E2E_OPENAI_BASE_URL to run against a real server");
        return;
    };
    let (report, events, gaps) = agent_against(base_url).await;
    print("--jinja", &report, &gaps);
    ends_within_bounds(&report);
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, RunEvent::LlmCallFailed { .. })),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stderr)]
async fn an_agent_falls_back_to_text_mode_against_llama_cpp_without_jinja() {
    let Ok(base_url) = std::env::var("ARCHON_E2E_OPENAI_NOJINJA_BASE_URL") else {
        eprintln!("skipped: set ARCHON_E2E_OPENAI_NOJINJA_BASE_URL to run against a real server");
        return;
    };
    let (report, events, gaps) = agent_against(base_url).await;
    print("--no-jinja", &report, &gaps);
    ends_within_bounds(&report);
    let failed: Vec<(u32, bool)> = events
        .iter()
        .filter_map(|e| match e {
            RunEvent::LlmCallFailed {
                attempt, retrying, ..
            } => Some((*attempt, *retrying)),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [(1, false)], "one refused request, not retried");
    assert!(
        events.iter().any(|e| matches!(
            e,
            RunEvent::AgentObservation { text, .. } if text.contains("continuing in text mode")
        )),
        "{events:?}"
    );
}
