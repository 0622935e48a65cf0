//! Trigger throughput (run with `cargo bench --bench triggers`): webhook deliveries checked (size, HMAC
//! signature, delivery id, body against the input's schema) and recorded durably in the SQLite run store,
//! as fast as they come and paced at 100 a second for 10 seconds, every one counted back from the store;
//! and the cron side's costs (the next instant of a schedule in a DST zone, a due scan of 100 triggers).
//! Figures are printed; the run fails only if a delivery is not recorded.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use archon_engine::session::{FiringFilter, Session};
use archon_engine::trigger::{
    CronSchedule, Delivery, Received, Scheduler, Timestamp, Webhook, sign,
};

const SECRET: &str = "bench-secret";

const SPEC: &str = r#"name: hooked
inputs:
  payload:
    type: object
    required: [action, repository]
    properties:
      action: { type: string }
      repository: { type: object, required: [full_name] }
secrets: [HOOK_SECRET]
triggers:
  - webhook: { secret: HOOK_SECRET, input: payload }
steps:
  - id: a
    tool: echo
    with: { action: "{{ inputs.payload.action }}" }
"#;

/// A GitHub-like delivery body of about 1 KiB.
fn body(n: usize) -> String {
    let padding = "x".repeat(800);
    format!(
        r#"{{"action":"opened","number":{n},"repository":{{"full_name":"owner/repo","private":false}},"sender":{{"login":"octocat"}},"body":"{padding}"}}"#
    )
}

fn delivery((body, signature, id): &(String, String, String)) -> Delivery<'_> {
    Delivery {
        body: body.as_bytes(),
        signature: Some(signature.as_str()),
        authorization: None,
        id: Some(id.as_str()),
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("hooked.yaml");
    std::fs::write(&spec, SPEC).unwrap();
    let workflow = archon_engine::validate::validate_file(&spec)
        .workflow
        .unwrap();
    let env: BTreeMap<String, String> = [("HOOK_SECRET".to_owned(), SECRET.to_owned())].into();
    let hook = Webhook::of(&workflow, &env).unwrap().unwrap();
    let session = Session::open(&dir.path().join("state")).unwrap();

    let count = 2_500;
    let deliveries: Vec<(String, String, String)> = (0..count)
        .map(|n| {
            let body = body(n);
            let signature = sign(SECRET.as_bytes(), body.as_bytes());
            (body, signature, format!("delivery-{n}"))
        })
        .collect();
    // Checking alone.
    let start = Instant::now();
    for d in &deliveries {
        hook.verify(&delivery(d)).unwrap();
    }
    let verify = start.elapsed() / count as u32;
    println!("webhook: a delivery of {} bytes", deliveries[0].0.len());
    println!("  verify (signature, id, body against the schema)  {verify:>10.1?} each");

    // Checked and recorded, as fast as they come, from one thread (each waits for its own sync).
    let sequential = 1_000;
    let start = Instant::now();
    for d in &deliveries[..sequential] {
        let received = session
            .receive_delivery(&hook, &delivery(d), Timestamp::now())
            .unwrap();
        assert!(matches!(received, Received::Fired(_)));
    }
    let elapsed = start.elapsed();
    println!(
        "  verify + durable record, back to back          {:>10.1?} each, {:.0} deliveries/s",
        elapsed / sequential as u32,
        sequential as f64 / elapsed.as_secs_f64()
    );

    // As fast as they come from 8 threads: the syncs are shared (group commit).
    let burst = &deliveries[sequential + 1_000..];
    let start = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..8 {
            let (session, hook) = (&session, &hook);
            scope.spawn(move || {
                for d in burst.iter().skip(worker).step_by(8) {
                    let received = session
                        .receive_delivery(hook, &delivery(d), Timestamp::now())
                        .unwrap();
                    assert!(matches!(received, Received::Fired(_)));
                }
            });
        }
    });
    let elapsed = start.elapsed();
    println!(
        "  verify + durable record, 8 threads at once     {:>10.1?} each, {:.0} deliveries/s",
        elapsed / burst.len() as u32,
        burst.len() as f64 / elapsed.as_secs_f64()
    );

    // Paced at 100 a second for 10 seconds, each delivery handled on one of 8 threads as a server's
    // handlers would: the latency of each from when it came, and whether the pace held.
    let rate = 100;
    let seconds = 10;
    let workers = 8;
    let paced = &deliveries[sequential..sequential + rate * seconds];
    let latencies = std::sync::Mutex::new(Vec::with_capacity(paced.len()));
    let start = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let (session, hook, latencies) = (&session, &hook, &latencies);
            scope.spawn(move || {
                for (i, d) in paced.iter().enumerate().skip(worker).step_by(workers) {
                    let came = start + Duration::from_secs_f64(i as f64 / rate as f64);
                    if let Some(wait) = came.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let received = session
                        .receive_delivery(hook, &delivery(d), Timestamp::now())
                        .unwrap();
                    assert!(matches!(received, Received::Fired(_)));
                    latencies.lock().unwrap().push(came.elapsed());
                }
            });
        }
    });
    let total = start.elapsed();
    let mut latencies = latencies.into_inner().unwrap();
    latencies.sort();
    println!(
        "  paced at {rate}/s for {seconds}s on {workers} threads: {} deliveries in {total:.2?}; latency p50 {:.1?}, p99 {:.1?}, max {:.1?}",
        paced.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1],
    );

    // Replays of all of them: nothing fires.
    let start = Instant::now();
    for d in paced {
        let received = session
            .receive_delivery(&hook, &delivery(d), Timestamp::now())
            .unwrap();
        assert!(matches!(received, Received::Replayed { .. }));
    }
    println!(
        "  a replay (checked, found recorded)              {:>10.1?} each",
        start.elapsed() / paced.len() as u32
    );
    let recorded = session.firings(&FiringFilter::default()).unwrap().len();
    println!("  recorded: {recorded} firings for {count} deliveries");
    assert_eq!(recorded, count, "every delivery is recorded once");

    // Cron: the next instant of a schedule in a DST zone, and a due scan of 100 triggers.
    let schedule = CronSchedule::parse("*/5 9-17 * * MON-FRI", "Europe/Paris").unwrap();
    let from: Timestamp = "2025-03-28T12:00:00Z".parse().unwrap();
    let n = 10_000;
    let start = Instant::now();
    let mut at = from;
    for _ in 0..n {
        at = schedule.next_after(at).unwrap();
    }
    println!(
        "cron: next instant of `*/5 9-17 * * MON-FRI` in Europe/Paris  {:>8.1?} each",
        start.elapsed() / n
    );
    let mut text = String::from("name: many\ntriggers:\n");
    for i in 0..100 {
        text.push_str(&format!(
            "  - {{ name: t{i}, cron: \"{} * * * *\" }}\n",
            i % 60
        ));
    }
    text.push_str("steps:\n  - id: a\n    tool: echo\n    with: { m: 1 }\n");
    let many = dir.path().join("many.yaml");
    std::fs::write(&many, text).unwrap();
    let many = archon_engine::validate::validate_file(&many)
        .workflow
        .unwrap();
    let mut scheduler = Scheduler::new();
    scheduler.add(&many).unwrap();
    let idle = |_: &str| false;
    let now: Timestamp = "2025-06-02T09:00:30Z".parse().unwrap();
    session.due_firings(&mut scheduler, now, &idle).unwrap();
    let start = Instant::now();
    let scans = 1_000;
    for i in 0..scans {
        // Within the same minute as the first scan: nothing is due, every trigger is looked at.
        let at = Timestamp::from_millisecond(now.as_millisecond() + i).unwrap();
        session.due_firings(&mut scheduler, at, &idle).unwrap();
    }
    println!(
        "cron: a due scan of 100 triggers with nothing due            {:>8.1?} each",
        start.elapsed() / scans as u32
    );
}
