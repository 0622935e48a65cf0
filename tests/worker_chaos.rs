//! Workers under chaos, on the real PostgreSQL through the real binary (issue 20): seeded random DAGs run
//! by 1, 2 and 4 workers, every step exactly once in the record and in a ledger each step appends to; a
//! worker killed with SIGKILL at a random moment (`ARCHON_WORKER_CHAOS_TRIALS` trials, 3 by default;
//! `scripts/worker-chaos.sh` runs 100), its steps taken over after its lease with nothing lost and
//! nothing repeated beyond the in-doubt rule of docs/durability.md; and workers on two "hosts" (network
//! namespaces of their own, each with its own host name), one cut off from the database mid-step: its step
//! is taken over by the other and it records nothing once its lease token was replaced.
//!
//! Every DAG comes from a seed, printed, which `ARCHON_CHAOS_SEED` sets to reproduce a failure.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use crate::postgres::{Db, attempts, db};
use crate::support::Output;
use crate::workers::{Worker, ended, signal, stop, submit, worker};

/// The seed of a test: `ARCHON_CHAOS_SEED`, or a random one; printed either way.
fn seed(test: &str) -> u64 {
    let seed = std::env::var("ARCHON_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..1_000_000_000));
    say(&format!(
        "{test}: seed {seed} (ARCHON_CHAOS_SEED={seed} runs it again)"
    ));
    seed
}

#[allow(clippy::print_stderr)]
fn say(text: &str) {
    eprintln!("{text}");
}

/// A random DAG: 2 to 5 layers of 1 to 4 steps; each step after the first layer needs one step of the
/// layer before it and up to two more of any earlier layer (fan-out and fan-in of random widths). Each
/// step sleeps a little, appends its id to `ledger`, and prints it; about half are `idempotent: true`.
struct Dag {
    yaml: String,
    steps: Vec<String>,
    idempotent: BTreeMap<String, bool>,
    /// The step the run's output `last` comes from (one of the last layer).
    last: String,
}

fn random_dag(rng: &mut fastrand::Rng) -> Dag {
    let depth = rng.usize(2..=5);
    let mut layers: Vec<Vec<String>> = Vec::new();
    let mut yaml = String::from("name: random\nsteps:\n");
    let mut idempotent = BTreeMap::new();
    for layer in 0..depth {
        let width = rng.usize(1..=4);
        let mut ids = Vec::new();
        for i in 0..width {
            let id = format!("s{layer}_{i}");
            let mut needs: Vec<String> = Vec::new();
            if let Some(before) = layers.last() {
                needs.push(before[rng.usize(..before.len())].clone());
                let earlier: Vec<&String> = layers.iter().flatten().collect();
                for _ in 0..rng.usize(0..=2) {
                    let more = earlier[rng.usize(..earlier.len())];
                    if !needs.contains(more) {
                        needs.push(more.clone());
                    }
                }
            }
            let safe = rng.bool();
            let pause = rng.u32(10..=120);
            yaml.push_str(&format!("  - id: {id}\n"));
            if !needs.is_empty() {
                yaml.push_str(&format!("    needs: [{}]\n", needs.join(", ")));
            }
            if safe {
                yaml.push_str("    idempotent: true\n");
            }
            yaml.push_str(&format!(
                "    tool: exec\n    with: {{ argv: [sh, -c, \"sleep 0.{pause:03}; echo {id} >> ledger; echo {id}\"] }}\n"
            ));
            idempotent.insert(id.clone(), safe);
            ids.push(id);
        }
        layers.push(ids);
    }
    let finals = layers.last().expect("a layer");
    let last = finals[rng.usize(..finals.len())].clone();
    yaml.push_str(&format!(
        "outputs:\n  last: \"{{{{ steps.{last}.output }}}}\"\n"
    ));
    Dag {
        yaml,
        steps: layers.into_iter().flatten().collect(),
        idempotent,
        last,
    }
}

/// How many times each step appended to the ledger.
fn ledger_counts(db: &Db) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let text = std::fs::read_to_string(db.path().join("ledger")).unwrap_or_default();
    for line in text.lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

fn statuses(run: &Json, step: &str) -> Vec<String> {
    attempts(run, step)
        .iter()
        .map(|a| a["status"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// How many `succeeded` events the run's log holds for each step (`show --events`: the time, the label,
/// the step).
fn succeeded_events(db: &Db, id: &str) -> BTreeMap<String, usize> {
    let Output { code, stdout, .. } = db.archon(&["show", id, "--events"]);
    assert_eq!(code, 0, "{stdout}");
    let mut counts = BTreeMap::new();
    for line in stdout.lines() {
        let rest = line.get(11..).unwrap_or_default();
        let (label, body) = rest.split_once(' ').unwrap_or((rest, ""));
        if label == "succeeded" {
            let step = body.trim_start().split(' ').next().unwrap_or_default();
            *counts.entry(step.to_owned()).or_default() += 1;
        }
    }
    counts
}

fn random_dag_runs_once_with(workers: usize) {
    let Some(db) = db() else { return };
    let seed = seed(&format!("random DAG on {workers} worker(s)"));
    let dag = random_dag(&mut fastrand::Rng::with_seed(seed));
    std::fs::write(db.path().join("dag.yaml"), &dag.yaml).expect("write");
    let id = submit(&db, "dag.yaml");
    // Leases long enough that a loaded machine does not lose a step (nothing is killed here).
    let children: Vec<Worker> = (0..workers).map(|n| worker(&db, n, "10s")).collect();
    let run = ended(&db, &id);
    stop(children);
    let context = format!("seed {seed}\n{}", dag.yaml);
    assert_eq!(run["status"], "succeeded", "{context}\n{run}");
    assert_eq!(run["outputs"]["last"], dag.last.as_str(), "{context}");
    let expected: BTreeMap<String, usize> = dag.steps.iter().map(|s| (s.clone(), 1)).collect();
    assert_eq!(ledger_counts(&db), expected, "{context}");
    assert_eq!(succeeded_events(&db, &id), expected, "{context}");
    for step in &dag.steps {
        assert_eq!(statuses(&run, step), ["succeeded"], "{step}: {context}");
        let result = &run["results"][step];
        assert_eq!(result["status"], "succeeded", "{step}: {context}");
        assert_eq!(result["output"], step.as_str(), "{step}: {context}");
    }
    assert_eq!(
        run["results"].as_object().map(|r| r.len()),
        Some(dag.steps.len()),
        "{context}"
    );
}

#[test]
fn random_dags_run_each_step_once_on_one_worker() {
    random_dag_runs_once_with(1);
}

#[test]
fn random_dags_run_each_step_once_on_two_workers() {
    random_dag_runs_once_with(2);
}

#[test]
fn random_dags_run_each_step_once_on_four_workers() {
    random_dag_runs_once_with(4);
}

/// What one chaos trial saw.
#[derive(Default)]
struct Trial {
    /// The run succeeded (else it stopped interrupted with a step in doubt).
    succeeded: bool,
    /// The run had ended before the kill.
    ended_first: bool,
    /// Steps whose effect happened twice (safe to repeat, cut off by the kill).
    repeated: usize,
    /// Steps the record shows cut off by the kill and run again.
    taken_over: usize,
}

/// The error of a run stopped because a step that is not safe to repeat was in doubt.
fn in_doubt_error(step: &str) -> String {
    format!(
        "step `{step}` is in doubt: its worker stopped while it ran, and repeating it is not known to be safe"
    )
}

/// One trial: a random DAG, 2 or 3 workers with a 1 s lease, one killed with SIGKILL at a random moment
/// and replaced; then the run's end, the record and the ledger are checked against the in-doubt rule.
fn chaos_trial(db: &Db, trial: usize, seed: u64) -> Trial {
    let mut rng = fastrand::Rng::with_seed(seed);
    let dag = random_dag(&mut rng);
    let context = format!("trial {trial}, seed {seed}\n{}", dag.yaml);
    std::fs::write(db.path().join("dag.yaml"), &dag.yaml).expect("write");
    let id = submit(db, "dag.yaml");
    let count = rng.usize(2..=3);
    let mut workers: Vec<Worker> = (0..count).map(|n| worker(db, n, "1s")).collect();
    // A random moment: before the workers are up, or once a random number of steps (not all) had their
    // effect, then a little later: mid-step, between steps, or after the run's end.
    if rng.u8(..5) > 0 {
        let progress = rng.usize(0..dag.steps.len());
        wait_until("the run's progress", Duration::from_secs(30), || {
            ledger_counts(db).values().sum::<usize>() >= progress
        });
    }
    std::thread::sleep(Duration::from_millis(rng.u64(0..150)));
    let ended_first = db.show(&id)["status"] != "running";
    let mut victim = workers.swap_remove(rng.usize(..count));
    victim.child.kill().expect("killed");
    victim.child.wait().expect("reaped");
    workers.push(worker(db, count, "1s"));
    let run = ended(db, &id);
    stop(workers);
    // A command the killed worker left behind ran at most 0.12 s after its attempt started, which was
    // before the kill; its step was taken over (or found in doubt) only after the 1 s lease lapsed,
    // so the ledger is complete now.
    let counts = ledger_counts(db);
    let events = succeeded_events(db, &id);
    let context = format!("{context}\n{run}\nledger: {counts:?}\nsucceeded events: {events:?}");
    let mut seen = Trial {
        ended_first,
        succeeded: run["status"] == "succeeded",
        ..Trial::default()
    };
    let mut in_doubt = None;
    if !seen.succeeded {
        assert_eq!(run["status"], "interrupted", "{context}");
        let error = run["error"].as_str().unwrap_or_default();
        let step = dag
            .steps
            .iter()
            .find(|s| error == in_doubt_error(s))
            .unwrap_or_else(|| panic!("interrupted for another reason: {context}"));
        // Only a step that is not safe to repeat, whose attempt was cut off, stops the run.
        assert!(!dag.idempotent[step], "{step}: {context}");
        assert_eq!(
            statuses(&run, step).last().map(String::as_str),
            Some("running"),
            "{step}: {context}"
        );
        assert!(run["results"][step].is_null(), "{step}: {context}");
        in_doubt = Some(step.clone());
    }
    for step in &dag.steps {
        let n = counts.get(step).copied().unwrap_or(0);
        let tried = statuses(&run, step);
        let result = &run["results"][step];
        let safe = dag.idempotent[step];
        // Attempts cut off by the kill stay `running` in the record; no step succeeds twice.
        let cut = tried.iter().filter(|s| *s == "running").count();
        let succeeded = tried.iter().filter(|s| *s == "succeeded").count();
        assert!(succeeded <= 1, "{step} succeeded twice: {context}");
        // The log says so at most once, whoever ran it (a worker cut off records nothing more). Not
        // always: the event follows the result, and nothing waits for it, so a kill between the two
        // leaves the result (which the taker reuses) without it.
        assert!(
            events.get(step).copied().unwrap_or(0) <= succeeded,
            "{step}: {context}"
        );
        if result.is_null() {
            // Never reached, or stopped with the run: its effect happened at most once unless it is
            // safe to repeat, and never without an attempt recorded first when it is not.
            assert!(!seen.succeeded, "{step} has no result: {context}");
            if safe {
                assert!(n <= 2, "{step} ran {n} times: {context}");
            } else {
                assert!(n <= 1, "{step} ran {n} times: {context}");
                assert!(n == 0 || !tried.is_empty(), "{step}: {context}");
            }
            continue;
        }
        assert_eq!(result["status"], "succeeded", "{step}: {context}");
        assert_eq!(result["output"], step.as_str(), "{step}: {context}");
        assert_eq!(succeeded, 1, "{step}: {context}");
        assert_eq!(tried.last().map(String::as_str), Some("succeeded"));
        assert!(cut <= 1, "{step} was cut off {cut} times: {context}");
        if safe {
            // Run again after the kill: its effect may have happened in the cut-off attempt too (whose
            // record it did not wait for, so the record may not show it).
            assert!((1..=2).contains(&n), "{step} ran {n} times: {context}");
        } else {
            // Not safe to repeat: never run again after a cut-off attempt, so exactly once.
            assert_eq!(
                cut, 0,
                "{step} was run again after it was in doubt: {context}"
            );
            assert_eq!(n, 1, "{step} ran {n} times: {context}");
        }
        seen.repeated += n.saturating_sub(1);
        seen.taken_over += cut;
    }
    // One worker was killed; it ran at most two steps at once.
    assert!(
        seen.repeated + usize::from(in_doubt.is_some()) <= 2,
        "{context}"
    );
    if seen.succeeded {
        assert_eq!(
            run["results"].as_object().map(|r| r.len()),
            Some(dag.steps.len()),
            "{context}"
        );
    }
    seen
}

/// The chaos harness: `ARCHON_WORKER_CHAOS_TRIALS` trials (3 by default; `scripts/worker-chaos.sh` runs
/// 100), each from the seed `ARCHON_CHAOS_SEED` plus its number.
#[test]
fn killed_workers_lose_no_step_and_repeat_only_steps_safe_to_repeat() {
    let trials: usize = std::env::var("ARCHON_WORKER_CHAOS_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3);
    let first = seed("worker chaos");
    let mut seen = Vec::new();
    for trial in 0..trials {
        let Some(db) = db() else { return };
        let seed = first.wrapping_add(trial as u64);
        seen.push(chaos_trial(&db, trial, seed));
    }
    let count = |f: fn(&Trial) -> bool| seen.iter().filter(|t| f(t)).count();
    say(&format!(
        "worker chaos: {trials} trials from seed {first}: {} succeeded, {} stopped interrupted with a step \
         in doubt that is not safe to repeat, {} ended before the kill; {} cut-off attempts taken over, {} \
         effects of steps safe to repeat happened twice; no step lost, none repeated beyond the in-doubt rule",
        count(|t| t.succeeded),
        count(|t| !t.succeeded),
        count(|t| t.ended_first),
        seen.iter().map(|t| t.taken_over).sum::<usize>(),
        seen.iter().map(|t| t.repeated).sum::<usize>(),
    ));
}

/// Runs `ip ARGS`; its error output when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("`ip` cannot run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A "host": a network namespace of its own, joined to this one by a veth pair, `outer` the address on
/// this side and `inner` the address inside. Deleted (with its link) when dropped.
struct Netns {
    name: String,
    link: String,
    outer: Ipv4Addr,
}

impl Netns {
    /// Namespace `n` of this test process, in the /30 subnet `10.a.b.(4n)`.
    fn create(n: u8, subnet: (u8, u8)) -> Result<Netns, String> {
        let tag = format!("{:05x}{:02x}{n}", std::process::id() & 0xf_ffff, subnet.1);
        let name = format!("archon-test-{tag}");
        ip(&["netns", "add", &name])?;
        let ns = Netns {
            name,
            link: format!("ax{tag}"),
            outer: Ipv4Addr::new(10, subnet.0, subnet.1, 4 * n + 1),
        };
        let inner = Ipv4Addr::new(10, subnet.0, subnet.1, 4 * n + 2);
        let peer = format!("ay{tag}");
        ip(&[
            "link", "add", &ns.link, "type", "veth", "peer", "name", &peer, "netns", &ns.name,
        ])?;
        ip(&["addr", "add", &format!("{}/30", ns.outer), "dev", &ns.link])?;
        ip(&["link", "set", &ns.link, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns.name, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", &format!("{inner}/30"), "dev", &peer])?;
        inside(&["link", "set", &peer, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Takes this side of the link down (the host is cut off) or up again.
    /// The processes in the namespace.
    fn pids(&self) -> Vec<String> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .expect("ip netns pids");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn link(&self, up: bool) {
        ip(&["link", "set", &self.link, if up { "up" } else { "down" }]).expect("link set");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.link]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Two namespaces, or `None` after saying why they cannot be made (a failure with `CI=true`).
fn hosts() -> Option<[Netns; 2]> {
    let subnet = (fastrand::u8(100..250), fastrand::u8(..));
    let made = Netns::create(0, subnet).and_then(|a| Ok([a, Netns::create(1, subnet)?]));
    match made {
        Ok(hosts) => Some(hosts),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "network namespaces are required with CI=true: {e}"
            );
            say(&format!("skipped: network namespaces cannot be made: {e}"));
            None
        }
    }
}

/// A TCP forwarder on this side of a host's link, to the PostgreSQL server (which listens on the
/// loopback address only). Stops accepting and closes its connections when dropped.
struct Forwarder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    accepting: Option<std::thread::JoinHandle<()>>,
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
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn forward(at: Ipv4Addr, server: &str) -> Forwarder {
    let listener = TcpListener::bind((at, 0)).expect("forwarder listens");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("address");
    let stop = Arc::new(AtomicBool::new(false));
    let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let server = server.to_owned();
    let accepting = {
        let (stop, open) = (stop.clone(), open.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let down = match listener.accept() {
                    Ok((down, _)) => down,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Polling: the listener cannot be woken otherwise when the test ends.
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(_) => break,
                };
                let Ok(up) = TcpStream::connect(&server) else {
                    continue;
                };
                let _ = down.set_nonblocking(false);
                let pair = (down.try_clone(), up.try_clone());
                if let (Ok(down2), Ok(up2)) = pair {
                    if let Ok(mut open) = open.lock() {
                        open.extend(down.try_clone().ok());
                        open.extend(up.try_clone().ok());
                    }
                    std::thread::spawn(move || pipe(down, up2));
                    std::thread::spawn(move || pipe(up, down2));
                }
            }
        })
    };
    Forwarder {
        addr,
        stop,
        open,
        accepting: Some(accepting),
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
        if let Ok(open) = self.open.lock() {
            for stream in open.iter() {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// `archon worker` on host `ns`, named `host` (a UTS namespace of its own), one step at a time, reaching
/// the store through `url`; its standard error in `NAME.err`.
fn host_worker(db: &Db, ns: &Netns, host: &str, url: &str) -> Worker {
    let path = db.path().join(format!("{host}.err"));
    let err = std::fs::File::create(&path).expect("err file");
    let child = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "unshare",
            "--uts",
            "sh",
            "-c",
            "echo \"$1\" > /proc/sys/kernel/hostname && exec \"$0\" worker --concurrency 1 --lease 1s",
            env!("CARGO_BIN_EXE_archon"),
            host,
        ])
        .current_dir(db.path())
        .env("NO_COLOR", "1")
        .env("ARCHON_STORE", url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("archon worker starts in its namespace");
    let worker = Worker { child, err: path };
    worker.wait_ready();
    worker
}

/// `slow` marks its start (`started.HOST`) and waits for `go`; then appends its host to the ledger and
/// prints it; `after` records which host's output it read.
const HOSTS: &str = r#"name: hosts
steps:
  - id: slow
    idempotent: true
    tool: exec
    with: { argv: [sh, -c, "h=$(cat /proc/sys/kernel/hostname); touch started.$h; while [ ! -f go ]; do sleep 0.02; done; echo $h >> ledger; echo $h"] }
  - { id: after, needs: [slow], tool: exec, with: { argv: [sh, -c, "echo after {{ steps.slow.output }} >> ledger"] } }
outputs:
  host: "{{ steps.slow.output }}"
"#;

/// Writes `go` when dropped, so that a command waiting for it ends even when the test failed first.
struct Go<'a>(&'a Db);

impl Drop for Go<'_> {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.path().join("go"), "");
    }
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_host_cut_off_mid_step_loses_it_and_records_nothing_more() {
    let Some(db) = db() else { return };
    let Some([ns_a, ns_b]) = hosts() else { return };
    let (server, _) = db.url_through(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)));
    let (fwd_a, fwd_b) = (forward(ns_a.outer, &server), forward(ns_b.outer, &server));
    let tag = format!("{}-{:04x}", std::process::id(), fastrand::u16(..));
    let (host_a, host_b) = (format!("archon-a-{tag}"), format!("archon-b-{tag}"));
    let _go = Go(&db);
    std::fs::write(db.path().join("hosts.yaml"), HOSTS).expect("write");
    let id = submit(&db, "hosts.yaml");
    let mut a = host_worker(&db, &ns_a, &host_a, &db.url_through(fwd_a.addr).1);
    let started = |host: &str| db.path().join(format!("started.{host}")).exists();
    wait_until("host a's start of `slow`", Duration::from_secs(20), || {
        started(&host_a)
    });
    wait_until(
        "the record of host a's attempt",
        Duration::from_secs(20),
        || statuses(&db.show(&id), "slow") == ["running"],
    );
    // Host a is cut off mid-step: its lease lapses, and host b takes the step over (it is safe to
    // repeat; b does not stop a's command, which runs on another host).
    ns_a.link(false);
    let b = host_worker(&db, &ns_b, &host_b, &db.url_through(fwd_b.addr).1);
    wait_until("host b's start of `slow`", Duration::from_secs(30), || {
        started(&host_b)
    });
    std::fs::write(db.path().join("go"), "").expect("go");
    let run = ended(&db, &id);
    let events = db.archon(&["show", &id, "--events"]).stdout;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["outputs"]["host"], host_b.as_str(), "{run}");
    assert_eq!(run["results"]["slow"]["output"], host_b.as_str(), "{run}");
    // Host a's attempt never ended in the record: a recorded nothing after it was cut off.
    assert_eq!(statuses(&run, "slow"), ["running", "succeeded"], "{run}");
    assert_eq!(statuses(&run, "after"), ["succeeded"], "{run}");
    // Host a could not renew its lease, so it stopped its command before the lease lapsed: only b's
    // command had its effect, and `after` read b's output.
    let deadline = Instant::now() + Duration::from_secs(20);
    while ns_a.pids().len() != 1 {
        let shown: Vec<String> = ns_a
            .pids()
            .iter()
            .map(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .unwrap_or_default()
                    .replace('\0', " ")
            })
            .collect();
        assert!(
            Instant::now() < deadline,
            "host a's command never stopped: {shown:?}\n{}",
            a.said()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let expected: BTreeMap<String, usize> = [host_b.clone(), format!("after {host_b}")]
        .into_iter()
        .map(|l| (l, 1))
        .collect();
    assert_eq!(ledger_counts(&db), expected);
    // Back on the network, host a tries to record its step's end and finds its lease token replaced:
    // it records nothing, and stops when asked.
    ns_a.link(true);
    signal(&a, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = a.child.try_wait().expect("waited") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "host a never stopped: {}",
            a.said()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let said = a.said();
    say(&format!("host a ({status}) said: {said}"));
    if status.success() {
        assert!(
            said.ends_with(
                "worker: stopped after 0 steps (0 runs ended here, 1 step taken over by others)\n"
            ),
            "{said}"
        );
    }
    assert_eq!(db.show(&id), run);
    assert_eq!(db.archon(&["show", &id, "--events"]).stdout, events);
    stop(vec![b]);
    drop((fwd_a, fwd_b));
}

/// Two steps, each appending to the ledger.
const PAIR: &str = r#"name: pair
steps:
  - { id: first, tool: exec, with: { argv: [sh, -c, "echo first >> ledger"] } }
  - { id: last, needs: [first], tool: exec, with: { argv: [sh, -c, "echo last >> ledger"] } }
"#;

#[test]
fn a_worker_killed_after_it_recorded_the_runs_end_leaves_the_run_as_it_ended() {
    let Some(db) = db() else { return };
    std::fs::write(db.path().join("pair.yaml"), PAIR).expect("write");
    let id = submit(&db, "pair.yaml");
    let w = worker(&db, 0, "1s");
    let run = ended(&db, &id);
    stop(vec![w]);
    assert_eq!(run["status"], "succeeded", "{run}");
    let events = db.archon(&["show", &id, "--events"]).stdout;
    // What a worker killed between recording the run's end and marking its last task done leaves behind:
    // the task claimed, under a lease that lapsed.
    let task = format!("run_id = '{id}' AND step = 'last'");
    db.sql(&format!(
        "UPDATE tasks SET state = 'claimed', token = 'gone:1', worker = 'gone', lease_until = 0 WHERE {task}"
    ));
    let w = worker(&db, 1, "1s");
    wait_until("the task's end", Duration::from_secs(20), || {
        db.sql(&format!("SELECT state FROM tasks WHERE {task}")) == ["done"]
    });
    stop(vec![w]);
    // The run stays as it ended: nothing ran again, nothing was recorded after its end.
    assert_eq!(db.show(&id), run);
    assert_eq!(db.archon(&["show", &id, "--events"]).stdout, events);
    let once: BTreeMap<String, usize> = [("first".to_owned(), 1), ("last".to_owned(), 1)].into();
    assert_eq!(ledger_counts(&db), once);
}
