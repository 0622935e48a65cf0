//! Figures of `archon serve`'s dashboard (run with `scripts/bench-serve.sh`): the runs page's server time
//! with 10,000 runs in the store (its `Server-Timing`, and the whole request on loopback), unfiltered,
//! filtered and deep in the listing; the delay from a run's event being recorded to its arrival, over
//! server-sent events, in a Rust client and in a page open in headless Chromium (when Chromium, Node.js
//! and tests/npm's playwright-core are there); the server's resident memory once started and after the
//! page loads. Figures are printed; nothing is asserted.
//!
//! The 10,000 runs are copies of one recorded run, made directly in the store's tables (as
//! `benches/store.rs` fills its store), with their workflows, statuses and start times spread out.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, params};
use serde_json::Value as Json;

const RUNS: usize = 10_000;
const REQUESTS: usize = 200;

const HELLO: &str =
    "name: hello\nsteps:\n  - id: greet\n    tool: echo\n    with: { message: hello }\n";

/// Waits at `gate` for the file `go`, then 30 steps one after another, each a little apart.
fn ticks() -> String {
    let mut spec = String::from(
        "name: ticks\nsteps:\n  - id: gate\n    tool: exec\n    with: { argv: [sh, -c, \"while [ ! -f go ]; do sleep 0.02; done\"] }\n",
    );
    let mut before = "gate".to_owned();
    for i in 0..30 {
        spec.push_str(&format!(
            "  - id: tick{i}\n    tool: exec\n    needs: [{before}]\n    with: {{ argv: [sh, -c, \"sleep 0.03; echo tick {i}\"] }}\n"
        ));
        before = format!("tick{i}");
    }
    spec
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let archon = root.join("target/release/archon");
    assert!(
        archon.exists(),
        "build it first: cargo build --release ({})",
        archon.display()
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::TempDir::new().unwrap();
    std::fs::write(dir.path().join("hello.yaml"), HELLO).unwrap();
    std::fs::write(dir.path().join("ticks.yaml"), ticks()).unwrap();
    let ran = Command::new(&archon)
        .args(["run", "hello.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(ran.status.success());
    fill(dir.path(), RUNS - 1);

    let mut server = start(&archon, dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    println!(
        "idle RSS of `archon serve` once started, {RUNS} runs in the store: {} KB",
        rss(&server)
    );
    runtime.block_on(async {
        let http = reqwest::Client::new();
        // A cursor deep in the listing: the start of page 100.
        let mut cursor = String::new();
        for _ in 0..99 {
            let after = if cursor.is_empty() {
                String::new()
            } else {
                format!("&cursor={cursor}")
            };
            let page: Json = http
                .get(format!("{}/api/v1/runs?limit=50{after}", server.url))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            cursor = page["next"].as_str().unwrap().to_owned();
        }
        for (what, path) in [
            ("first page", "/runs".to_owned()),
            ("status=failed", "/runs?status=failed".to_owned()),
            (
                "workflow=deploy&status=succeeded",
                "/runs?workflow=deploy&status=succeeded".to_owned(),
            ),
            ("since=(a day ago)", format!("/runs?since={}", now_ms() - 86_400_000)),
            ("page 100", format!("/runs?cursor={cursor}&page=100")),
        ] {
            let (server_ms, round_trip) = page_times(&http, &server.url, &path).await;
            println!(
                "runs page with {RUNS} runs, {what}: server time median {:.2} ms, p95 {:.2} ms, max {:.2} ms; whole request median {:.2} ms ({REQUESTS} requests)",
                percentile(&server_ms, 50),
                percentile(&server_ms, 95),
                percentile(&server_ms, 100),
                percentile(&round_trip, 50),
            );
        }
    });
    println!(
        "RSS of `archon serve` after {} page loads: {} KB",
        REQUESTS * 5,
        rss(&server)
    );
    let client = runtime.block_on(client_latency(&server.url, dir.path()));
    println!(
        "event to client over SSE (Rust client, {} events): median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        client.len(),
        percentile(&client, 50),
        percentile(&client, 95),
        percentile(&client, 100)
    );
    match browser_latency(&root, &server.url, dir.path()) {
        Ok(browser) => println!(
            "event to browser over SSE (a run's page in headless Chromium, {} events): median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
            browser.len(),
            percentile(&browser, 50),
            percentile(&browser, 95),
            percentile(&browser, 100)
        ),
        Err(reason) => println!("event to browser over SSE: not measured ({reason})"),
    }
    server.stop();
}

/// Fills the store in `dir` with `runs` copies of the run it holds, spread over workflows, statuses and
/// start times (one a minute, backwards from the copied run).
fn fill(dir: &Path, runs: usize) {
    let conn = Connection::open(dir.join(".archon/state.db")).unwrap();
    let id: String = conn
        .query_row("SELECT id FROM runs LIMIT 1", [], |r| r.get(0))
        .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    for table in ["runs", "files", "attempts", "results", "events"] {
        let key = if table == "runs" { "id" } else { "run_id" };
        let columns: Vec<String> = tx
            .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let select: Vec<String> = columns
            .iter()
            .map(|c| if c == key { "?1".to_owned() } else { c.clone() })
            .collect();
        let mut insert = tx
            .prepare(&format!(
                "INSERT INTO {table} ({}) SELECT {} FROM {table} WHERE {key} = ?2",
                columns.join(", "),
                select.join(", ")
            ))
            .unwrap();
        for i in 0..runs {
            insert
                .execute(params![format!("r{i:016x}fill"), id])
                .unwrap();
        }
    }
    tx.execute(
        "UPDATE runs SET
            started_at = started_at - (rowid * 60000),
            finished_at = started_at - (rowid * 60000) + 500,
            status = CASE rowid % 10 WHEN 0 THEN 'failed' WHEN 1 THEN 'cancelled' ELSE 'succeeded' END,
            workflow = CASE rowid % 3 WHEN 0 THEN 'deploy' ELSE workflow END
         WHERE id LIKE '%fill'",
        [],
    )
    .unwrap();
    tx.commit().unwrap();
}

/// How the tests start `archon serve` (free port, `listening on`, standard error kept, SIGTERM to stop),
/// here with the release binary.
#[path = "../tests/support/serve.rs"]
#[allow(dead_code)]
mod serve;

use serve::Server;

/// `archon serve .` from the binary `archon` in `dir`, on a free port, without a token.
fn start(archon: &Path, dir: &Path) -> Server {
    let mut command = Command::new(archon);
    command
        .args(["serve", ".", "--port", "0"])
        .current_dir(dir)
        .env_remove("ARCHON_SERVE_TOKEN")
        .env_remove("ARCHON_STATE_DIR");
    serve::start(command)
}

/// The server's resident memory, in KB.
fn rss(server: &Server) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The page's own time (`Server-Timing`) and the whole request's, in ms, of `REQUESTS` loads.
async fn page_times(http: &reqwest::Client, url: &str, path: &str) -> (Vec<f64>, Vec<f64>) {
    let mut server = Vec::new();
    let mut round_trip = Vec::new();
    for _ in 0..REQUESTS {
        let started = Instant::now();
        let response = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let timing = response
            .headers()
            .get("server-timing")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("page;dur="))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap();
        let body = response.text().await.unwrap();
        assert!(body.contains("newest first"), "{path}");
        round_trip.push(started.elapsed().as_secs_f64() * 1e3);
        server.push(timing);
    }
    (server, round_trip)
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Starts `ticks` through the API, follows its stream, lets it through its gate and measures each event's
/// delay from its `at_ms` to its arrival.
async fn client_latency(url: &str, dir: &Path) -> Vec<f64> {
    let _ = std::fs::remove_file(dir.join("go"));
    let http = reqwest::Client::new();
    let session: Json = http
        .get(format!("{url}/api/v1/session"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let started: Json = http
        .post(format!("{url}/api/v1/workflows/ticks/runs"))
        .header("x-csrf-token", session["csrf"].as_str().unwrap())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run = started["run_id"].as_str().unwrap().to_owned();
    let mut response = http
        .get(format!("{url}/api/v1/runs/{run}/stream"))
        .send()
        .await
        .unwrap();
    let mut buffer = String::new();
    let mut delays = Vec::new();
    let mut released = false;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let arrived = now_ms();
            let kind = block.lines().find_map(|l| l.strip_prefix("event:"));
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue;
            };
            let data: Json = serde_json::from_str(data.trim()).unwrap();
            match kind.map(str::trim) {
                Some("event") => {
                    let event = &data["event"];
                    if event["event"] == "step_started" && event["step"] == "gate" && !released {
                        std::fs::write(dir.join("go"), "").unwrap();
                        released = true;
                    } else if released {
                        let at = event["at_ms"].as_u64().unwrap();
                        delays.push(arrived.saturating_sub(at) as f64);
                    }
                }
                Some("run") if data["status"] == "succeeded" => return delays,
                _ => {}
            }
        }
        assert!(Instant::now() < deadline, "the run never ended");
        let chunk = response.chunk().await.unwrap().unwrap();
        buffer.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// The `latency` scenario of tests/browser/dashboard.mjs: the delays its page measured.
fn browser_latency(root: &Path, url: &str, dir: &Path) -> Result<Vec<f64>, String> {
    let chromium = Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        return Err("no Chromium at /usr/bin/chromium".to_owned());
    }
    if !root
        .join("tests/npm/node_modules/playwright-core/package.json")
        .exists()
    {
        return Err("playwright-core is not installed (scripts/install-test-deps.sh)".to_owned());
    }
    let _ = std::fs::remove_file(dir.join("go"));
    let shots = root.join("target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let output = Command::new("node")
        .arg(root.join("tests/browser/dashboard.mjs"))
        .arg("latency")
        .env("ARCHON_URL", url)
        .env("WORKDIR", dir)
        .env("SCREENSHOTS", &shots)
        .env("CHROMIUM", chromium)
        .output()
        .map_err(|e| format!("node: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let observed: Json = serde_json::from_str(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(observed["latencies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_f64)
        .collect())
}

fn percentile(values: &[f64], p: usize) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) * p / 100).min(sorted.len() - 1)]
}
