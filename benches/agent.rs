//! Agent-loop overhead (run with `cargo bench --bench agent`): an agent step against a local
//! OpenAI-compatible server (wiremock) that answers every request after a fixed delay, calling `echo` for a
//! number of turns and then answering. Per iteration, the time beyond the server's own delay is the loop's
//! overhead (render, build and parse the request, run the tool, record events); the request body sizes
//! show how the prompt grows with observations. Figures are printed; nothing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use archon_engine::run::{self, RunOptions, StepStatus};
use serde_json::json;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const DELAY: Duration = Duration::from_millis(20);
const TOOL_TURNS: usize = 20;

/// Calls `echo` for `TOOL_TURNS` turns, then answers.
struct Scripted(AtomicUsize);

impl Respond for Scripted {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let turn = self.0.fetch_add(1, Ordering::SeqCst);
        let message = if turn < TOOL_TURNS {
            json!({ "role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{turn}"), "type": "function",
                "function": { "name": "echo", "arguments": json!({ "turn": turn, "note": "x".repeat(200) }).to_string() }
            }] })
        } else {
            json!({ "role": "assistant", "content": "done" })
        };
        ResponseTemplate::new(200)
            .set_delay(DELAY)
            .set_body_json(json!({
                "id": "bench", "object": "chat.completion", "model": "bench",
                "choices": [{ "index": 0, "message": message, "finish_reason": if turn < TOOL_TURNS { "tool_calls" } else { "stop" } }],
                "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
            }))
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::TempDir::new().unwrap();
    let (elapsed, sizes, baseline) = runtime.block_on(async {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(Scripted(AtomicUsize::new(0)))
            .mount(&server)
            .await;
        let spec = format!(
            "name: bench\nllm:\n  providers:\n    local: {{ kind: openai, model: bench, base_url: \"{}/v1\" }}\nsteps:\n  - {{ id: agent, goal: echo twenty times, tools: [echo], max_iterations: {} }}\n",
            server.uri(),
            TOOL_TURNS + 1
        );
        std::fs::write(dir.path().join("bench.yaml"), spec).unwrap();
        let workflow = archon_engine::validate_file(&dir.path().join("bench.yaml"))
            .workflow
            .unwrap();
        let options = RunOptions::new(dir.path().to_path_buf(), "bench");
        let started = Instant::now();
        let report = run::run(Arc::new(workflow), Default::default(), options)
            .await
            .unwrap();
        let elapsed = started.elapsed();
        assert_eq!(report.steps["agent"].status, StepStatus::Succeeded, "{:?}", report.steps["agent"].error);
        let sizes: Vec<usize> = server
            .received_requests()
            .await
            .unwrap()
            .iter()
            .map(|r| r.body.len())
            .collect();
        // The model's own latency as a client sees it: the same number of plain requests to the same server
        // (its delay, HTTP, the server's own work), without the agent.
        let client = reqwest::Client::new();
        let url = format!("{}/v1/chat/completions", server.uri());
        let started = Instant::now();
        for _ in 0..sizes.len() {
            client
                .post(&url)
                .json(&json!({ "model": "bench", "messages": [] }))
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
        }
        (elapsed, sizes, started.elapsed())
    });
    let calls = sizes.len() as u32;
    let overhead = elapsed.saturating_sub(baseline) / calls;
    println!(
        "agent loop: {calls} model calls in {:.1} ms; the same requests alone {:.1} ms ({} ms server delay each): {:.0} us agent overhead per iteration",
        elapsed.as_secs_f64() * 1e3,
        baseline.as_secs_f64() * 1e3,
        DELAY.as_millis(),
        overhead.as_secs_f64() * 1e6
    );
    let growth: Vec<usize> = sizes.windows(2).map(|w| w[1] - w[0]).collect();
    println!(
        "prompt size: {} bytes at the first call, {} at the last; growth per iteration {}..{} bytes (linear when constant)",
        sizes.first().unwrap_or(&0),
        sizes.last().unwrap_or(&0),
        growth.iter().min().unwrap_or(&0),
        growth.iter().max().unwrap_or(&0)
    );
}
