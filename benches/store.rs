//! Whole-process figures of durable runs (run with `scripts/bench-store.sh`): `archon run` of the hello
//! workflow with an empty store and with 10,000 runs in it, and a durable 10,000-wide DAG and 100-step
//! chain of no-op steps, each side by side with a hand-coded tokio program of the same shape that writes
//! equivalent rows through rusqlite. Figures are printed; nothing is asserted.
//!
//! `store handcoded wide|chain DIR` is the hand-coded program itself: a current-thread tokio runtime, the
//! steps as tasks (at most 16 at once, as `archon run` by default), and a writer thread committing their
//! rows in batches to SQLite (WAL, `synchronous=FULL`). Its steps are safe to repeat, as Archon's `echo`
//! steps are, so like Archon it does not wait for their rows, only for everything to be durable at the end.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, params};
use serde_json::json;
use tokio::sync::{Semaphore, oneshot};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("handcoded") {
        handcoded(&args[1], Path::new(&args[2]));
        return;
    }
    harness();
}

// ---- the hand-coded program -------------------------------------------------------------------

enum Message {
    Row(Row),
    Flush(oneshot::Sender<()>),
}

enum Row {
    Started {
        step: String,
        at: i64,
    },
    Finished {
        step: String,
        output: String,
        at: i64,
    },
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The writer thread: applies rows in order, one transaction per batch, acknowledging flushes once
/// what came before them is committed.
fn writer(conn: Connection, receiver: &mpsc::Receiver<Message>) {
    let mut conn = conn;
    let mut seq = 0i64;
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while let Ok(more) = receiver.try_recv() {
            batch.push(more);
            if batch.len() >= 8192 {
                break;
            }
        }
        let tx = conn.transaction().unwrap();
        let mut acks = Vec::new();
        for message in batch {
            match message {
                Message::Row(Row::Started { step, at }) => {
                    seq += 1;
                    tx.prepare_cached("INSERT INTO attempts (run_id, step, attempt, status, started_at) VALUES ('r', ?1, 1, 'running', ?2)")
                        .unwrap()
                        .execute(params![step, at])
                        .unwrap();
                    tx.prepare_cached(
                        "INSERT INTO events (run_id, seq, at, event) VALUES ('r', ?1, ?2, ?3)",
                    )
                    .unwrap()
                    .execute(params![
                        seq,
                        at,
                        json!({ "event": "step_started", "step": step }).to_string()
                    ])
                    .unwrap();
                }
                Message::Row(Row::Finished { step, output, at }) => {
                    seq += 1;
                    tx.prepare_cached("UPDATE attempts SET status = 'succeeded', ended_at = ?2 WHERE run_id = 'r' AND step = ?1 AND attempt = 1")
                        .unwrap()
                        .execute(params![step, at])
                        .unwrap();
                    tx.prepare_cached("INSERT INTO results (run_id, step, status, result, finished_at) VALUES ('r', ?1, 'succeeded', ?2, ?3)")
                        .unwrap()
                        .execute(params![step, output, at])
                        .unwrap();
                    tx.prepare_cached(
                        "INSERT INTO events (run_id, seq, at, event) VALUES ('r', ?1, ?2, ?3)",
                    )
                    .unwrap()
                    .execute(params![
                        seq,
                        at,
                        json!({ "event": "step_finished", "step": step, "status": "succeeded" })
                            .to_string()
                    ])
                    .unwrap();
                }
                Message::Flush(ack) => acks.push(ack),
            }
        }
        tx.commit().unwrap();
        for ack in acks {
            let _ = ack.send(());
        }
    }
}

#[derive(Clone)]
struct Journal(mpsc::Sender<Message>);

impl Journal {
    fn row(&self, row: Row) {
        self.0.send(Message::Row(row)).unwrap();
    }

    async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        self.0.send(Message::Flush(ack)).unwrap();
        done.await.unwrap();
    }
}

/// A no-op step: its attempt, its result (the echoed value) and its two events.
fn step(journal: &Journal, name: &str, value: usize) -> serde_json::Value {
    journal.row(Row::Started {
        step: name.to_owned(),
        at: now(),
    });
    let output = json!({ "v": value });
    let result = json!({ "status": "succeeded", "output": output, "text": output.to_string(), "attempts": 1 });
    journal.row(Row::Finished {
        step: name.to_owned(),
        output: result.to_string(),
        at: now(),
    });
    output
}

fn handcoded(shape: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let conn = Connection::open(dir.join("handcoded.db")).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;
         CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, status TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS attempts (run_id TEXT, step TEXT, attempt INTEGER, status TEXT,
             started_at INTEGER, ended_at INTEGER, PRIMARY KEY (run_id, step, attempt));
         CREATE TABLE IF NOT EXISTS results (run_id TEXT, step TEXT, status TEXT, result TEXT,
             finished_at INTEGER, PRIMARY KEY (run_id, step));
         CREATE TABLE IF NOT EXISTS events (run_id TEXT, seq INTEGER, at INTEGER, event TEXT,
             PRIMARY KEY (run_id, seq));
         DELETE FROM runs; DELETE FROM attempts; DELETE FROM results; DELETE FROM events;
         INSERT INTO runs VALUES ('r', 'running');",
    )
    .unwrap();
    let (sender, receiver) = mpsc::channel();
    let thread = std::thread::spawn(move || writer(conn, &receiver));
    let journal = Journal(sender);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match shape {
            "wide" => {
                step(&journal, "first", 0);
                let limit = Arc::new(Semaphore::new(16));
                let mut tasks = tokio::task::JoinSet::new();
                for i in 0..10_000 {
                    let permit = limit.clone().acquire_owned().await.unwrap();
                    let journal = journal.clone();
                    tasks.spawn(async move {
                        let output = step(&journal, &format!("w{i}"), i);
                        drop(permit);
                        output
                    });
                }
                while tasks.join_next().await.is_some() {}
                step(&journal, "last", 1);
            }
            "chain" => {
                let mut value = 0;
                for i in 0..100 {
                    // Each step reads the one before, as in the chain spec.
                    value = step(&journal, &format!("s{i}"), value)["v"]
                        .as_u64()
                        .unwrap() as usize;
                    tokio::task::yield_now().await;
                }
            }
            other => panic!("unknown shape `{other}`"),
        }
        journal.flush().await;
    });
    drop(journal);
    thread.join().unwrap();
}

// ---- the harness ------------------------------------------------------------------------------

/// Wall time and peak RSS (KB) of one whole process, from `/usr/bin/time`.
fn measure(program: &Path, args: &[&str], dir: &Path) -> (Duration, u64) {
    let started = Instant::now();
    let output = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg(program)
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "{} {args:?}: {}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    let rss = stderr
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    (elapsed, rss)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Fills the store in `dir` with `runs` copies of the hello run it holds, inserting rows directly.
fn fill(dir: &Path, runs: usize) {
    let conn = Connection::open(dir.join(".archon/state.db")).unwrap();
    let id: String = conn
        .query_row("SELECT id FROM runs LIMIT 1", [], |r| r.get(0))
        .unwrap();
    let tx = conn.unchecked_transaction().unwrap();
    for i in 0..runs {
        let copy = format!("fill{i:06}");
        for (table, key) in [
            ("runs", "id"),
            ("files", "run_id"),
            ("attempts", "run_id"),
            ("results", "run_id"),
            ("events", "run_id"),
        ] {
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
            tx.execute(
                &format!(
                    "INSERT INTO {table} ({}) SELECT {} FROM {table} WHERE {key} = ?2",
                    columns.join(", "),
                    select.join(", ")
                ),
                params![copy, id],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
}

fn harness() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let archon = root.join("target/release/archon");
    assert!(
        archon.exists(),
        "build it first: cargo build --release ({})",
        archon.display()
    );
    let me = std::env::current_exe().unwrap();
    let hello = root.join("workflows/hello.yaml");
    let hello = hello.to_str().unwrap();
    let runs = 31;

    for stored in [0, 10_000] {
        let dir = tempfile::TempDir::new().unwrap();
        measure(&archon, &["run", hello], dir.path());
        if stored > 0 {
            fill(dir.path(), stored - 1);
            measure(&archon, &["run", hello], dir.path());
        }
        let times: Vec<Duration> = (0..runs)
            .map(|_| measure(&archon, &["run", hello], dir.path()).0)
            .collect();
        println!(
            "hello-world `archon run` (whole process), {stored} runs in the store: median {:.2} ms, min {:.2} ms ({runs} runs)",
            ms(median(times.clone())),
            ms(*times.iter().min().unwrap())
        );
    }

    let dir = tempfile::TempDir::new().unwrap();
    let mut wide =
        String::from("name: wide\nsteps:\n  - { id: first, tool: echo, with: { v: 0 } }\n");
    for i in 0..10_000 {
        wide.push_str(&format!(
            "  - {{ id: w{i}, tool: echo, needs: [first], with: {{ v: {i} }} }}\n"
        ));
    }
    let ids: Vec<String> = (0..10_000).map(|i| format!("w{i}")).collect();
    wide.push_str(&format!(
        "  - {{ id: last, tool: echo, needs: [{}], with: {{ v: 1 }} }}\n",
        ids.join(", ")
    ));
    std::fs::write(dir.path().join("wide.yaml"), wide).unwrap();
    let mut chain =
        String::from("name: chain\nsteps:\n  - { id: s0, tool: echo, with: { v: 0 } }\n");
    for i in 1..100 {
        chain.push_str(&format!(
            "  - {{ id: s{i}, tool: echo, with: {{ v: \"{{{{ steps.s{}.output.v }}}}\" }} }}\n",
            i - 1
        ));
    }
    std::fs::write(dir.path().join("chain.yaml"), chain).unwrap();
    let hello_time = median(
        (0..runs)
            .map(|_| measure(&archon, &["run", hello], dir.path()).0)
            .collect(),
    );

    // 100 MB of step output: a `foreach` step of 100 commands printing 1 MB each. Its items' results and
    // the step's own (100 MB of output and 100 MB of text) are kept in the store as blobs; the figures are
    // the peak memory of the run, of `show` (a summary) and of `show --json` (everything), next to the
    // output's size.
    std::fs::write(
        dir.path().join("outputs.yaml"),
        "name: outputs\nsteps:\n  - id: many\n    foreach: \"range(100)\"\n    tool: exec\n    with:\n      argv: [sh, -c, \"head -c 1000000 /dev/zero | tr '\\\\0' x\"]\n",
    )
    .unwrap();
    let outputs = tempfile::TempDir::new().unwrap();
    let spec = dir.path().join("outputs.yaml");
    let (_, run_rss) = measure(&archon, &["run", spec.to_str().unwrap()], outputs.path());
    let listed = Command::new(&archon)
        .args(["runs", "--json"])
        .current_dir(outputs.path())
        .output()
        .unwrap();
    let runs: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_owned();
    let (_, show_rss) = measure(&archon, &["show", &id], outputs.path());
    let (_, json_rss) = measure(&archon, &["show", &id, "--json"], outputs.path());
    println!(
        "100 MB of step output (100 items of 1 MB): peak RSS of run {} MB, show {} MB, show --json {} MB",
        run_rss / 1024,
        show_rss / 1024,
        json_rss / 1024
    );

    for (shape, steps) in [("wide", 10_002.0), ("chain", 100.0)] {
        let spec = format!("{shape}.yaml");
        let state = dir.path().join(format!("handcoded-{shape}"));
        let state = state.to_str().unwrap();
        let best = |program: &Path, args: &[&str]| {
            (0..3)
                .map(|_| measure(program, args, dir.path()))
                .min_by_key(|(t, _)| *t)
                .unwrap()
        };
        let (archon_time, archon_rss) = best(&archon, &["run", &spec]);
        let (hand_time, hand_rss) = best(&me, &["handcoded", shape, state]);
        println!(
            "durable {shape} ({steps} no-op steps, whole process): archon {:.1} ms, {:.1} us/step beyond hello-world start-up, peak RSS {} MB; hand-coded tokio + rusqlite {:.1} ms, peak RSS {} MB; ratio {:.2}",
            ms(archon_time),
            (archon_time.saturating_sub(hello_time)).as_secs_f64() * 1e6 / steps,
            archon_rss / 1024,
            ms(hand_time),
            hand_rss / 1024,
            archon_time.as_secs_f64() / hand_time.as_secs_f64()
        );
    }
}
