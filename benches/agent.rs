//! Agent-loop overhead (run with `cargo bench --bench agent`): an agent step against a local
//! OpenAI-compatible server (wiremock) that answers every request after a fixed delay, calling `echo` for a
//! number of turns and then answering. Per iteration, the time beyond the server's own delay is the loop's
//! overhead (render, build and parse the request, run the tool, record events, count tokens); the request
//! body sizes show how the prompt grows with observations. A second run names an OpenAI model with a small
//! context window, so that the prompt is counted exactly with its tokenizer. Figures are printed; nothing is
//! asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use archon_engine::llm::tokens::Estimator;
use archon_engine::run::{self, RunOptions, StepStatus};
use serde_json::json;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const DELAY: Duration = Duration::from_millis(20);
const TOOL_TURNS: usize = 20;

/// Calls `echo` for `TOOL_TURNS` turns, then answers; a request without tools (a summary) gets a summary.
struct Scripted(AtomicUsize);

impl Respond for Scripted {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if !String::from_utf8_lossy(&request.body).contains("\"tools\"") {
            return ResponseTemplate::new(200).set_delay(DELAY).set_body_json(json!({
                "id": "bench", "object": "chat.completion", "model": "bench",
                "choices": [{ "index": 0, "message": { "role": "assistant", "content": "Echoed some turns." }, "finish_reason": "stop" }],
                "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
            }));
        }
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

/// One agent run against the server: the run's time, the request body sizes, the same requests alone, and
/// the summary requests (compactions) made.
struct Figures {
    elapsed: Duration,
    sizes: Vec<usize>,
    baseline: Duration,
    summaries: usize,
}

fn scenario(runtime: &tokio::runtime::Runtime, provider: &str) -> Figures {
    let dir = tempfile::TempDir::new().unwrap();
    runtime.block_on(async {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(Scripted(AtomicUsize::new(0)))
            .mount(&server)
            .await;
        let spec = format!(
            "name: bench\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", {provider} }}\nsteps:\n  - {{ id: agent, goal: echo twenty times, tools: [echo], max_iterations: {} }}\n",
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
        let requests = server.received_requests().await.unwrap();
        let summaries = requests
            .iter()
            .filter(|r| !String::from_utf8_lossy(&r.body).contains("\"tools\""))
            .count();
        let sizes: Vec<usize> = requests.iter().map(|r| r.body.len()).collect();
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
        Figures { elapsed, sizes, baseline: started.elapsed(), summaries }
    })
}

fn report(name: &str, figures: &Figures) {
    let Figures {
        elapsed,
        sizes,
        baseline,
        summaries,
    } = figures;
    let calls = sizes.len() as u32;
    let overhead = elapsed.saturating_sub(*baseline) / calls;
    println!(
        "{name}: {calls} model calls ({summaries} summaries) in {:.1} ms; the same requests alone {:.1} ms ({} ms server delay each): {:.0} us agent overhead per iteration",
        elapsed.as_secs_f64() * 1e3,
        baseline.as_secs_f64() * 1e3,
        DELAY.as_millis(),
        overhead.as_secs_f64() * 1e6
    );
    let growth: Vec<usize> = sizes
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .collect();
    println!(
        "  prompt size: {} bytes at the first call, {} at the last; growth per iteration {}..{} bytes (linear when constant)",
        sizes.first().unwrap_or(&0),
        sizes.last().unwrap_or(&0),
        growth.iter().min().unwrap_or(&0),
        growth.iter().max().unwrap_or(&0)
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A model of unknown family, far from its context window: token counts are bounded by bytes alone.
    report("agent loop", &scenario(&runtime, "model: bench"));
    // gpt-4o with a window small enough that exact tiktoken counts are needed from the middle of the run on
    // (its tokenizer built beforehand, once per process, and timed on its own).
    let started = Instant::now();
    Estimator::for_model("gpt-4o").text("warm up");
    println!(
        "o200k_base tokenizer built in {:.0} ms (once per process)",
        started.elapsed().as_secs_f64() * 1e3
    );
    report(
        "agent loop, exact counts (gpt-4o, context_window 4096)",
        &scenario(&runtime, "model: gpt-4o, context_window: 4096"),
    );
}
