//! Agent-loop and delegation overhead (run with `cargo bench --bench agent`): an agent step against a local
//! OpenAI-compatible server (wiremock) that answers every request after a fixed delay, calling `echo` for a
//! number of turns and then answering. Per iteration, the time beyond the server's own delay is the loop's
//! overhead (render, build and parse the request, run the tool, record events, count tokens); the request
//! body sizes show how the prompt grows with observations. A second run names an OpenAI model with a small
//! context window, so that the prompt is counted exactly with its tokenizer. Figures are printed; nothing is
//! asserted.
//!
//! The overhead averaged over a run's calls includes what a run pays once (validation, building the
//! provider's HTTP client with its root certificates, the first connection). The loop's own cost per
//! iteration is the slope between a short and a long run of the same agent: the extra overhead divided by
//! the extra iterations, the best of a few runs each, since the server's delays jitter by a timer tick.
//! Wall-clock figures on a busy machine are dominated by its load; the CPU time of the thread that runs the
//! agent (and its HTTP client; the server has its own thread), beyond what the same plain requests take,
//! is not, and its slope is the loop's own work per iteration.
//!
//! Delegation (issue 18): a lead agent delegates twice to a helper that answers at once, then answers. The
//! server notes when each request arrives; a response leaves `DELAY` after it. "To the delegate" is the time
//! from the lead's answer leaving the server to the helper's first request arriving (reading the answer, the
//! turn's checkpoint, starting the child agent, building its prompt); "back to the caller" from the helper's
//! answer leaving to the lead's next request arriving; both for the second delegation (the first also
//! builds the helper's provider, once per run, shown apart). The same lead calling `echo` instead gives
//! the plain tool turnaround for comparison. Medians and 90th percentiles of 30 runs each.
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

/// Tool turns of the short run, for the slope.
const SHORT_TURNS: usize = 5;
/// Runs of each length; the best is kept.
const REPEATS: usize = 3;

/// Calls `echo` for `.1` turns, then answers; a request without tools (a summary) gets a summary.
struct Scripted(AtomicUsize, usize);

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
        let tool_turns = self.1;
        let message = if turn < tool_turns {
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
                "choices": [{ "index": 0, "message": message, "finish_reason": if turn < tool_turns { "tool_calls" } else { "stop" } }],
                "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
            }))
    }
}

/// One agent run against the server: the run's time, the request body sizes, the same requests alone, and
/// the summary requests (compactions) made.
struct Figures {
    elapsed: Duration,
    /// CPU time of the agent's thread during the run, and during the same plain requests.
    cpu: Duration,
    baseline_cpu: Duration,
    sizes: Vec<usize>,
    baseline: Duration,
    summaries: usize,
}

fn scenario(runtime: &tokio::runtime::Runtime, provider: &str, tool_turns: usize) -> Figures {
    let dir = tempfile::TempDir::new().unwrap();
    runtime.block_on(async {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(Scripted(AtomicUsize::new(0), tool_turns))
            .mount(&server)
            .await;
        let spec = format!(
            "name: bench\nllm:\n  providers:\n    local: {{ kind: openai, base_url: \"{}/v1\", {provider} }}\nsteps:\n  - {{ id: agent, goal: echo twenty times, tools: [echo], max_iterations: {} }}\n",
            server.uri(),
            tool_turns + 1
        );
        std::fs::write(dir.path().join("bench.yaml"), spec).unwrap();
        let workflow = archon_engine::validate_file(&dir.path().join("bench.yaml"))
            .workflow
            .unwrap();
        let options = RunOptions::new(dir.path().to_path_buf(), "bench");
        let started = Instant::now();
        let cpu_started = thread_cpu();
        let report = run::run(Arc::new(workflow), Default::default(), options)
            .await
            .unwrap();
        let cpu = thread_cpu().saturating_sub(cpu_started);
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
        let cpu_started = thread_cpu();
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
        let baseline_cpu = thread_cpu().saturating_sub(cpu_started);
        Figures { elapsed, cpu, baseline_cpu, sizes, baseline: started.elapsed(), summaries }
    })
}

/// CPU time this thread has run, from the scheduler's statistics (nanoseconds on the CPU).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(stat.split_whitespace().next().unwrap().parse().unwrap())
}

/// The agent thread's CPU time beyond what the same plain requests take.
fn net_cpu(figures: &Figures) -> Duration {
    figures.cpu.saturating_sub(figures.baseline_cpu)
}

/// The time beyond the server's, for the whole run.
fn net(figures: &Figures) -> Duration {
    figures.elapsed.saturating_sub(figures.baseline)
}

/// The loop's own overhead per iteration, in wall-clock time and in CPU time: the slopes between the best
/// short and the best long runs; and what a run pays once, in each.
struct Slope {
    wall: Duration,
    wall_fixed: Duration,
    cpu: Duration,
    cpu_fixed: Duration,
}

fn per_iteration(runtime: &tokio::runtime::Runtime, provider: &str) -> Slope {
    let runs = |turns: usize| -> Vec<Figures> {
        (0..REPEATS)
            .map(|_| scenario(runtime, provider, turns))
            .collect()
    };
    let (short, long) = (runs(SHORT_TURNS), runs(TOOL_TURNS));
    let calls = |f: &[Figures]| f[0].sizes.len() as u32;
    let extra_calls = calls(&long) - calls(&short);
    let slope = |measure: fn(&Figures) -> Duration| {
        let best = |f: &[Figures]| f.iter().map(measure).min().unwrap();
        let per = best(&long).saturating_sub(best(&short)) / extra_calls;
        (per, best(&short).saturating_sub(per * calls(&short)))
    };
    let (wall, wall_fixed) = slope(net);
    let (cpu, cpu_fixed) = slope(net_cpu);
    Slope {
        wall,
        wall_fixed,
        cpu,
        cpu_fixed,
    }
}

fn report_slope(name: &str, slope: &Slope) {
    println!(
        "{name}, per iteration (slope between {SHORT_TURNS} and {TOOL_TURNS} tool turns, best of {REPEATS}): {:.0} us agent overhead, {:.0} us of it CPU; once per run: {:.1} ms, {:.1} ms of it CPU",
        slope.wall.as_secs_f64() * 1e6,
        slope.cpu.as_secs_f64() * 1e6,
        slope.wall_fixed.as_secs_f64() * 1e3,
        slope.cpu_fixed.as_secs_f64() * 1e3
    );
}

fn report(name: &str, figures: &Figures) {
    let Figures {
        elapsed,
        sizes,
        baseline,
        summaries,
        ..
    } = figures;
    let calls = sizes.len() as u32;
    let overhead = elapsed.saturating_sub(*baseline) / calls;
    println!(
        "{name}: {calls} model calls ({summaries} summaries) in {:.1} ms; the same requests alone {:.1} ms ({} ms server delay each): {:.0} us agent overhead per call, the run's fixed costs included",
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

/// Answers a lead (model `lead`) that calls `tool` once and then answers, and a helper (model `helper`) that
/// answers at once; notes when each request arrived.
struct Timed {
    tool: &'static str,
    arrivals: Arc<std::sync::Mutex<Vec<Instant>>>,
}

impl Respond for Timed {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.arrivals.lock().unwrap().push(Instant::now());
        let body = String::from_utf8_lossy(&request.body);
        let message = if body.contains(r#""model":"helper""#) {
            json!({ "role": "assistant", "content": "hi" })
        } else if body.matches(r#""role":"tool""#).count() >= 2 {
            json!({ "role": "assistant", "content": "done" })
        } else {
            json!({ "role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": { "name": self.tool, "arguments": json!({ "task": "say hi" }).to_string() }
            }] })
        };
        ResponseTemplate::new(200)
            .set_delay(DELAY)
            .set_body_json(json!({
                "id": "bench", "object": "chat.completion", "model": "bench",
                "choices": [{ "index": 0, "message": message, "finish_reason": "stop" }],
                "usage": { "prompt_tokens": 100, "completion_tokens": 10 }
            }))
    }
}

/// The gaps between one request's response leaving the server and the next request arriving, in one run
/// of a lead that calls `tool`.
fn gaps(runtime: &tokio::runtime::Runtime, tool: &'static str) -> Vec<Duration> {
    let dir = tempfile::TempDir::new().unwrap();
    runtime.block_on(async {
        let server = MockServer::start().await;
        let arrivals = Arc::new(std::sync::Mutex::new(Vec::new()));
        Mock::given(method("POST"))
            .respond_with(Timed {
                tool,
                arrivals: arrivals.clone(),
            })
            .mount(&server)
            .await;
        let spec = format!(
            "name: bench\nllm:\n  providers:\n    lead: {{ kind: openai, base_url: \"{0}/v1\", model: lead }}\n    helper: {{ kind: openai, base_url: \"{0}/v1\", model: helper }}\nagents:\n  lead: {{ provider: lead, tools: [echo], delegates: [helper] }}\n  helper: {{ provider: helper, description: says hi }}\nsteps:\n  - {{ id: agent, goal: get a greeting, agent: lead }}\n",
            server.uri()
        );
        std::fs::write(dir.path().join("bench.yaml"), spec).unwrap();
        let workflow = archon_engine::validate_file(&dir.path().join("bench.yaml"))
            .workflow
            .unwrap();
        let options = RunOptions::new(dir.path().to_path_buf(), "bench");
        let report = run::run(Arc::new(workflow), Default::default(), options)
            .await
            .unwrap();
        assert_eq!(report.steps["agent"].status, StepStatus::Succeeded, "{:?}", report.steps["agent"].error);
        let arrivals = arrivals.lock().unwrap().clone();
        arrivals
            .windows(2)
            .map(|w| w[1].saturating_duration_since(w[0] + DELAY))
            .collect()
    })
}

fn delegation(runtime: &tokio::runtime::Runtime) {
    const RUNS: usize = 30;
    let quantiles = |mut d: Vec<Duration>| {
        d.sort_unstable();
        let at = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
        format!("median {:.0} us, p90 {:.0} us", at(0.5), at(0.9))
    };
    // The lead delegates twice (or calls `echo` twice): requests lead, helper, lead, helper, lead.
    let (mut first, mut to_child, mut back, mut tool) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let delegated = gaps(runtime, "delegate__helper");
        first.push(delegated[0]);
        to_child.push(delegated[2]);
        back.push(delegated[3]);
        tool.push(gaps(runtime, "echo")[1]);
    }
    println!(
        "delegation, {RUNS} runs each (the model's {} ms excluded):",
        DELAY.as_millis()
    );
    println!(
        "  to the delegate, its provider's first use in the run (building its HTTP client): {}",
        quantiles(first)
    );
    println!(
        "  to the delegate (caller's answer out to the delegate's first request): {}",
        quantiles(to_child)
    );
    println!(
        "  back to the caller (delegate's answer out to the caller's next request): {}",
        quantiles(back)
    );
    println!(
        "  for comparison, a plain tool turn (`echo`: answer out to next request): {}",
        quantiles(tool)
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    delegation(&runtime);
    // A model of unknown family, far from its context window: token counts are bounded by bytes alone.
    report(
        "agent loop",
        &scenario(&runtime, "model: bench", TOOL_TURNS),
    );
    report_slope("agent loop", &per_iteration(&runtime, "model: bench"));
    // gpt-4o with a window small enough that exact tiktoken counts are needed from the middle of the run on
    // (its tokenizer built beforehand, once per process, and timed on its own).
    let started = Instant::now();
    Estimator::for_model("gpt-4o").text("warm up");
    println!(
        "o200k_base tokenizer built in {:.0} ms (once per process)",
        started.elapsed().as_secs_f64() * 1e3
    );
    let exact = "model: gpt-4o, context_window: 4096";
    report(
        "agent loop, exact counts (gpt-4o, context_window 4096)",
        &scenario(&runtime, exact, TOOL_TURNS),
    );
    report_slope("agent loop, exact counts", &per_iteration(&runtime, exact));
}
