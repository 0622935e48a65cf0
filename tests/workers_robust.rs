//! Workers that lose their database, or are asked to stop, on the real PostgreSQL through the real
//! binary: a worker cut off from the database (through a TCP proxy the test cuts and restores) stops its
//! step before its lease lapses, another worker takes the step over, the cut-off worker records nothing
//! more and takes work again once the database is back; a worker whose connections the server ends
//! (`pg_terminate_backend`) goes on; SIGTERM lets running steps finish up to `--drain`, then hands them
//! back, and a second signal does so at once; `archon run --submit --wait` reads like a local run.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::postgres::{Db, admin_count, attempts, base_url, db};
use crate::support::Output;
use crate::workers::{
    SLOW, Worker, ended, ledger, signal, sorted, starts, stop, submit, wait_pgid, wait_starts,
    worker, worker_with,
};

/// A TCP proxy between a worker and PostgreSQL. Cut, it closes every connection through it and closes
/// new ones at once, as a lost network does to a worker; restored, it passes connections again.
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy listens");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (cut_flag, streams) = (cut.clone(), live.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if cut_flag.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let (Ok(client_out), Ok(server_out)) = (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                if let Ok(mut streams) = streams.lock() {
                    streams.extend(client.try_clone());
                    streams.extend(server.try_clone());
                }
                std::thread::spawn(move || pipe(client, server_out));
                std::thread::spawn(move || pipe(server, client_out));
            }
        });
        Proxy { addr, cut, live }
    }

    /// Closes every connection through the proxy; new ones are closed at once until restored.
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        if let Ok(mut streams) = self.live.lock() {
            for stream in streams.drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }

    fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    /// `url` with its host and port the proxy's.
    fn url(&self, url: &str) -> String {
        let start = url.find("://").expect("a URL") + 3;
        let end = url[start..]
            .find(['/', '?'])
            .map_or(url.len(), |i| start + i);
        let host_at = url[start..end].rfind('@').map_or(start, |i| start + i + 1);
        format!("{}{}{}", &url[..host_at], self.addr, &url[end..])
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// The server the test database is on.
fn server() -> SocketAddr {
    let url = base_url();
    let start = url.find("://").expect("a URL") + 3;
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    let host = url[start..end]
        .rsplit_once('@')
        .map_or(&url[start..end], |(_, h)| h);
    let host = if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    };
    host.to_socket_addrs()
        .expect("the server's address")
        .next()
        .expect("an address")
}

/// `url` with a password in it (the server trusts local connections, so it is never asked for): no
/// message may show it.
fn with_password(url: &str) -> String {
    url.replacen("postgres@", "postgres:hunter2-secret@", 1)
}

/// The process ids of the attempts of `slow` that started (their marks).
fn slow_pids(db: &Db) -> Vec<i32> {
    std::fs::read_dir(db.path())
        .expect("dir")
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_string_lossy()
                .strip_prefix("started.")
                .and_then(|pid| pid.parse().ok())
        })
        .collect()
}

/// Whether process `pid` still runs (a zombie does not).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
            Some(state != 'Z' && state != 'X')
        })
        .unwrap_or(false)
}

fn wait_said(worker: &Worker, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !worker.said().contains(text) {
        assert!(
            Instant::now() < deadline,
            "the worker never said {text:?}: {}",
            worker.said()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Lines of what the worker said, each cut after `: ` where a message from the network follows (its
/// wording is the operating system's).
fn said_lines(worker: &Worker) -> Vec<String> {
    worker
        .said()
        .lines()
        .map(|line| match line.find(": cannot reach the run store") {
            Some(at) => format!("{}: cannot reach the run store ...", &line[..at]),
            None => line.to_owned(),
        })
        .collect()
}

const QUICK: &str = r#"name: quick
steps:
  - { id: one, tool: exec, with: { argv: [sh, -c, "echo one >> quick-ledger"] } }
"#;

#[test]
fn a_worker_cut_off_from_the_database_stops_its_step_before_another_takes_it_over() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    std::fs::write(db.path().join("quick.yaml"), QUICK).expect("write");
    let proxy = Proxy::start(server());
    let through = proxy.url(&with_password(&db.url()));
    let id = submit(&db, "slow.yaml");
    let first = worker_with(&db, 0, &through, &["--lease", "2s"]);
    wait_starts(&db, 1);
    wait_pgid(&db, &id);
    let pid = slow_pids(&db)[0];
    assert!(running(pid));
    proxy.cut();
    // Its lease cannot be renewed: the worker stops the step (its command) before the lease lapses.
    let second = worker(&db, 1, "2s");
    wait_starts(&db, 2);
    assert!(
        !running(pid),
        "the cut-off worker's command still ran when another worker took its step over"
    );
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    stop(vec![second]);
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(ledger(&db), sorted(&["first", "slow", "after"]));
    let events = db.archon(&["show", &id, "--events"]).stdout;
    wait_said(&first, "the step was stopped before the lease lapsed");
    // Restored, it records nothing about the step it lost, and takes new work: no other worker runs.
    proxy.restore();
    let quick = submit(&db, "quick.yaml");
    let quick_run = ended(&db, &quick);
    assert_eq!(quick_run["status"], "succeeded", "{quick_run}");
    assert_eq!(db.show(&id), run);
    assert_eq!(db.archon(&["show", &id, "--events"]).stdout, events);
    wait_said(&first, "worker: the run store is back: taking steps again");
    let said = first.said();
    let mut lines = said_lines(&first);
    stop(vec![first]);
    assert!(!said.contains("hunter2-secret"), "{said}");
    // Whether it noticed first that it cannot claim, or that its lease cannot be renewed, is timing.
    lines[1..].sort();
    let shown = proxy
        .url(&with_password(&db.url()))
        .replace("hunter2-secret", "***");
    assert_eq!(
        lines,
        vec![
            format!("worker: taking steps from `{shown}` (2 at once)"),
            format!(
                "worker: could not renew the lease on step `slow` of run `{id}`: the step was stopped before the lease lapsed"
            ),
            "worker: lost the run store: taking no steps until it is back: cannot reach the run store ..."
                .to_owned(),
            "worker: the run store is back: taking steps again".to_owned(),
        ],
        "{said}"
    );
}

#[test]
fn a_worker_goes_on_when_the_server_ends_its_connections() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    std::fs::write(db.path().join("quick.yaml"), QUICK).expect("write");
    let name = format!("archon_robust_{}", std::process::id());
    let url = format!("{}&application_name={name}", db.url());
    let id = submit(&db, "slow.yaml");
    let w = worker_with(&db, 0, &url, &["--lease", "2s"]);
    wait_starts(&db, 1);
    wait_pgid(&db, &id);
    let connected = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{name}' AND backend_start > to_timestamp($1)"
    );
    // Twice: every connection it has (the pool's, the listeners'), and then the ones it made again.
    for _ in 0..2 {
        let at = admin_count("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .expect("the server's clock");
        let ended_now = admin_count(&format!(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = '{name}') AS t"
        ))
        .expect("terminated");
        assert!(ended_now > 0, "the worker had no connection");
        // It connects again: its work listener at once.
        let since = connected.replace("$1", &format!("{}", at as f64 / 1000.0));
        let deadline = Instant::now() + Duration::from_secs(20);
        while admin_count(&since).expect("connections") == 0 {
            assert!(
                Instant::now() < deadline,
                "the worker never connected again"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    assert_eq!(run["status"], "succeeded", "{run}");
    // The step went on where it was: one attempt.
    assert_eq!(attempts(&run, "slow").len(), 1, "{run}");
    assert_eq!(starts(&db), 1);
    let quick = submit(&db, "quick.yaml");
    assert_eq!(ended(&db, &quick)["status"], "succeeded");
    let err = db.path().join("worker-0.err");
    stop(vec![w]);
    let said = std::fs::read_to_string(&err).expect("stderr");
    assert!(
        said.ends_with(
            "worker: stopped after 4 steps (2 runs ended here, 0 steps taken over by others)\n"
        ),
        "{said}"
    );
}

#[test]
fn sigterm_lets_running_steps_go_on_for_the_drain_then_hands_them_back() {
    let Some(db) = db() else { return };
    // Not safe to repeat: the step handed back is not in doubt (its attempt ended, cancelled).
    std::fs::write(
        db.path().join("slow.yaml"),
        SLOW.replace("    idempotent: true\n", ""),
    )
    .expect("write");
    let id = submit(&db, "slow.yaml");
    // Leases far longer than the test waits: the step comes back because it is handed back.
    let mut first = worker_with(&db, 0, &db.url(), &["--lease", "60s", "--drain", "500ms"]);
    wait_starts(&db, 1);
    wait_pgid(&db, &id);
    let pid = slow_pids(&db)[0];
    signal(&first, rustix::process::Signal::TERM);
    let status = first.child.wait().expect("exits");
    assert_eq!(status.code(), Some(0), "{}", first.said());
    assert!(!running(pid));
    assert_eq!(
        first.said().lines().skip(1).collect::<Vec<_>>(),
        vec![
            "worker: stopping: letting 1 running steps finish (at most 500ms)",
            "worker: handed 1 step back to the other workers",
            "worker: stopped after 1 step (0 runs ended here, 0 steps taken over by others)",
        ]
    );
    let second = worker(&db, 1, "60s");
    wait_starts(&db, 2);
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    stop(vec![second]);
    assert_eq!(run["status"], "succeeded", "{run}");
    let tried: Vec<Json> = attempts(&run, "slow")
        .iter()
        .map(|a| a["status"].clone())
        .collect();
    assert_eq!(
        tried,
        vec![Json::from("cancelled"), Json::from("succeeded")]
    );
    assert_eq!(ledger(&db), sorted(&["first", "slow", "after"]));
}

#[test]
fn sigterm_lets_a_step_that_ends_within_the_drain_finish() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let id = submit(&db, "slow.yaml");
    let mut w = worker_with(&db, 0, &db.url(), &["--lease", "60s", "--drain", "60s"]);
    wait_starts(&db, 1);
    signal(&w, rustix::process::Signal::TERM);
    wait_said(
        &w,
        "worker: stopping: letting 1 running steps finish (at most 1m)",
    );
    std::fs::write(db.path().join("go"), "").expect("go");
    let status = w.child.wait().expect("exits");
    assert_eq!(status.code(), Some(0), "{}", w.said());
    assert!(
        w.said().ends_with(
            "worker: stopped after 2 steps (0 runs ended here, 0 steps taken over by others)\n"
        ),
        "{}",
        w.said()
    );
    // It took nothing more: `after` waits for another worker.
    let run = db.show(&id);
    assert_eq!(run["status"], "running", "{run}");
    assert_eq!(attempts(&run, "slow")[0]["status"], "succeeded");
    assert!(attempts(&run, "after").is_empty());
}

#[test]
fn a_second_sigterm_stops_the_running_steps_at_once_and_hands_them_back() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("slow.yaml"), SLOW).expect("write");
    let id = submit(&db, "slow.yaml");
    let mut w = worker_with(&db, 0, &db.url(), &["--lease", "60s"]);
    wait_starts(&db, 1);
    wait_pgid(&db, &id);
    signal(&w, rustix::process::Signal::TERM);
    wait_said(
        &w,
        "worker: stopping: letting 1 running steps finish (at most 30s)",
    );
    signal(&w, rustix::process::Signal::TERM);
    let status = w.child.wait().expect("exits");
    assert_eq!(status.code(), Some(0), "{}", w.said());
    assert!(
        w.said().ends_with(
            "worker: handed 1 step back to the other workers\nworker: stopped after 1 step (0 runs ended here, 0 steps taken over by others)\n"
        ),
        "{}",
        w.said()
    );
    let tried: Vec<Json> = attempts(&db.show(&id), "slow")
        .iter()
        .map(|a| a["status"].clone())
        .collect();
    assert_eq!(tried, vec![Json::from("cancelled")]);
    // Ready again at once: another worker takes it without waiting for the lease.
    let second = worker(&db, 1, "60s");
    wait_starts(&db, 2);
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    stop(vec![second]);
    assert_eq!(run["status"], "succeeded", "{run}");
}

const TWO: &str = r#"name: two
steps:
  - { id: first, tool: exec, with: { argv: [sh, -c, "echo one"] } }
  - { id: second, needs: [first], tool: exec, with: { argv: [sh, -c, "echo two"] } }
outputs:
  said: "{{ steps.second.output }}"
"#;

/// What `archon run --submit --wait` printed, the run id, clock times and durations made fixed.
fn normalized(text: &str, id: &str) -> String {
    let text = text.replace(id, "RUN");
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        // The events' time column.
        if let Some(rest) = line.strip_prefix(' ').map(str::trim_start)
            && let Some((time, rest)) = rest.split_once("s  ")
            && time.parse::<f64>().is_ok()
        {
            line = format!("T  {rest}");
        }
        // Durations, `(12 ms)` or `(1.5 s)`, and the dates of `started`/`finished`.
        if (line.ends_with(" ms)") || line.ends_with(" s)"))
            && let Some(open) = line.rfind('(')
        {
            line.replace_range(open.., "(D)");
        }
        for label in ["started   ", "finished  "] {
            if let Some(rest) = line.strip_prefix(label) {
                let rest = rest.split_once(' ').map_or("", |(_, r)| r);
                line = format!("{label}DATE {rest}").trim_end().to_owned();
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn run_submit_wait_reads_like_a_local_run() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("two.yaml"), TWO).expect("write");
    let w = worker(&db, 0, "2s");
    w.wait_ready();
    let Output {
        code,
        stdout,
        stderr,
    } = db.archon(&["run", "--submit", "--wait", "two.yaml"]);
    stop(vec![w]);
    assert_eq!(code, 0, "{stderr}");
    let id = stdout.lines().next().expect("the run id").to_owned();
    let spec = db.path().join("two.yaml");
    let spec = std::fs::canonicalize(spec).expect("spec");
    let stdout = normalized(&stdout, &id).replace(&spec.display().to_string(), "SPEC");
    insta::assert_snapshot!(normalized(&stderr, &id), @r"
    T  started   first
    T  succeeded first (D)
    T  started   second
    T  succeeded second (D)
    ");
    insta::assert_snapshot!(stdout, @r"
    RUN
    run       RUN
    workflow  two (SPEC)
    status    succeeded
    started   DATE
    finished  DATE (D)

    STEP    STATUS     ATTEMPTS  ERROR
    first   succeeded  1
    second  succeeded  1

    outputs:
      said: two
    ");
}
