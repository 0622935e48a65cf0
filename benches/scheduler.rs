//! Scheduler benchmarks (run with `cargo bench --bench scheduler`): per-step overhead of wide and long DAGs
//! of `echo` steps in memory, 1,000 `exec true` steps against the fork+exec floor, and the makespan of eight
//! parallel 200 ms sleeps; the wide DAG and the `exec` steps again with durable state in SQLite; and what
//! step-result caching costs a fully cached re-run of 1,000 steps. Figures are printed; nothing is
//! asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use archon_engine::Workflow;
use archon_engine::run::{self, RunOptions, RunStatus};
use archon_engine::store::RunStore;
use tokio_util::sync::CancellationToken;

fn workflow(yaml: &str) -> Workflow {
    let validation = archon_engine::validate_source("bench.yaml", yaml);
    assert!(
        validation.diagnostics.is_empty(),
        "{:?}",
        validation.diagnostics.first()
    );
    validation.workflow.unwrap()
}

fn options(max_parallel: usize) -> RunOptions {
    RunOptions {
        max_parallel,
        protected: Vec::new(),
        workdir: std::env::temp_dir(),
        run_id: "bench".into(),
        cancel: CancellationToken::new(),
        events: None,
        env: BTreeMap::new(),
        journal: Arc::new(archon_engine::store::MemoryJournal),
        prior: Default::default(),
        cassette: None,
        checkpoints: Default::default(),
        approvals: Default::default(),
        helper: None,
        cache: Default::default(),
        memory_dir: None,
        memory: Default::default(),
    }
}

fn time_run(
    runtime: &tokio::runtime::Runtime,
    workflow: &Arc<Workflow>,
    max_parallel: usize,
) -> Duration {
    let started = Instant::now();
    let report = runtime
        .block_on(run::run(
            workflow.clone(),
            Default::default(),
            options(max_parallel),
        ))
        .unwrap();
    assert_eq!(report.status, RunStatus::Succeeded, "{:?}", report.error);
    started.elapsed()
}

fn best_of(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..runs).map(|_| f()).min().unwrap()
}

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    // The same runtime as `archon run`: one thread (see cli/commands/run.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // `cargo bench --bench scheduler -- cached`: only the cached re-run.
    if std::env::args().any(|a| a == "cached") {
        cached_rerun(&runtime);
        return;
    }

    // Wide: 1 -> 10,000 -> 1.
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
    let started = Instant::now();
    let wide = Arc::new(workflow(&wide));
    let validate_wide = started.elapsed();
    let rss_before = peak_rss_kb();
    let elapsed = best_of(5, || time_run(&runtime, &wide, 64));
    println!(
        "wide 1 -> 10,000 -> 1 echo: {:.1} us/step (run {:.1} ms; validation {:.0} ms); peak RSS {} MB (after validation {} MB)",
        elapsed.as_secs_f64() * 1e6 / 10_002.0,
        elapsed.as_secs_f64() * 1e3,
        validate_wide.as_secs_f64() * 1e3,
        peak_rss_kb() / 1024,
        rss_before / 1024
    );

    // The same wide DAG with durable state: every attempt, result and event recorded in SQLite.
    let state = tempfile::TempDir::new().unwrap();
    let store = archon_engine::store::sqlite::SqliteStore::open(state.path()).unwrap();
    let mut durable_runs = 0;
    let mut durable_run = |workflow: &Arc<Workflow>, max_parallel: usize| {
        durable_runs += 1;
        let id = format!("bench{durable_runs}");
        store
            .create_run(&archon_engine::store::NewRun {
                id: id.clone(),
                workflow: workflow.name.clone(),
                spec_path: "bench.yaml".into(),
                files: Vec::new(),
                inputs: Default::default(),
                workdir: std::env::temp_dir().display().to_string(),
                max_parallel,
            })
            .unwrap();
        let started = Instant::now();
        let cancel = CancellationToken::new();
        let journal = store.journal(&id, cancel.clone()).unwrap();
        let report = runtime
            .block_on(run::run(
                workflow.clone(),
                Default::default(),
                RunOptions {
                    cancel,
                    journal: journal.clone(),
                    ..options(max_parallel)
                },
            ))
            .unwrap();
        journal.close();
        assert_eq!(report.status, RunStatus::Succeeded, "{:?}", report.error);
        started.elapsed()
    };
    let elapsed = best_of(3, || durable_run(&wide, 64));
    println!(
        "wide 1 -> 10,000 -> 1 echo, durable (SQLite): {:.1} us/step (run {:.1} ms)",
        elapsed.as_secs_f64() * 1e6 / 10_002.0,
        elapsed.as_secs_f64() * 1e3,
    );

    // Chain of 1,000, each step reading the previous one's output.
    let mut chain =
        String::from("name: chain\nsteps:\n  - { id: s0, tool: echo, with: { v: 0 } }\n");
    for i in 1..1000 {
        chain.push_str(&format!(
            "  - {{ id: s{i}, tool: echo, with: {{ v: \"{{{{ steps.s{}.output.v }}}}\" }} }}\n",
            i - 1
        ));
    }
    let chain = Arc::new(workflow(&chain));
    let elapsed = best_of(5, || time_run(&runtime, &chain, 64));
    println!(
        "chain of 1,000 echo: {:.1} us/step",
        elapsed.as_secs_f64() * 1e6 / 1000.0
    );

    // 1,000 `exec true` against the floor: spawning `true` 1,000 times with the same concurrency.
    let concurrency = 16;
    let mut execs = String::from("name: execs\nsteps:\n");
    for i in 0..1000 {
        execs.push_str(&format!(
            "  - {{ id: e{i}, tool: exec, with: {{ argv: [\"true\"] }} }}\n"
        ));
    }
    let execs = Arc::new(workflow(&execs));
    let archon_exec = best_of(3, || time_run(&runtime, &execs, concurrency));
    let floor = best_of(3, || {
        let started = Instant::now();
        runtime.block_on(async {
            let semaphore = Arc::new(tokio::sync::Semaphore::new(concurrency));
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..1000 {
                let permit = semaphore.clone().acquire_owned().await.unwrap();
                set.spawn(async move {
                    let status = tokio::process::Command::new("true").status().await.unwrap();
                    drop(permit);
                    status
                });
            }
            while set.join_next().await.is_some() {}
        });
        started.elapsed()
    });
    println!(
        "1,000 exec `true` at {concurrency} in parallel: {:.0} us/step, floor {:.0} us/spawn, ratio {:.2}",
        archon_exec.as_secs_f64() * 1e6 / 1000.0,
        floor.as_secs_f64() * 1e6 / 1000.0,
        archon_exec.as_secs_f64() / floor.as_secs_f64()
    );
    // Each `exec` has a side effect, so its `running` record is synced before it starts; steps starting
    // together share the commit.
    let durable_exec = best_of(3, || durable_run(&execs, concurrency));
    println!(
        "1,000 exec `true` at {concurrency} in parallel, durable (SQLite): {:.0} us/step",
        durable_exec.as_secs_f64() * 1e6 / 1000.0,
    );

    cached_rerun(&runtime);

    // Eight independent 200 ms sleeps.
    let mut sleeps = String::from("name: sleeps\nsteps:\n");
    for i in 0..8 {
        sleeps.push_str(&format!(
            "  - {{ id: z{i}, tool: sleep, with: {{ duration: 200ms }} }}\n"
        ));
    }
    let sleeps = Arc::new(workflow(&sleeps));
    let makespan = best_of(3, || time_run(&runtime, &sleeps, 16));
    println!(
        "8 parallel 200 ms sleeps: makespan {:.1} ms",
        makespan.as_secs_f64() * 1e3
    );
}

/// A fully cached re-run of 1,000 `cache: true` steps, durable, against the same steps reused another
/// way: as the results an earlier process recorded (`resume`). The difference, per step, is what caching
/// costs: reading the workflow's entries, rendering each step's arguments and hashing its key, the
/// lookup, and recording the step as cached (its events and result), the journal's writes included.
fn cached_rerun(runtime: &tokio::runtime::Runtime) {
    // Literal arguments, as the other benchmarks' steps have; then arguments with a template, which a
    // cached step renders for its key (as any step renders them before its call).
    cached_rerun_of(runtime, "{ v: I }", "literal arguments");
    cached_rerun_of(
        runtime,
        "{ v: I, text: \"item {{ run.workflow }} I\" }",
        "templated arguments",
    );
}

fn cached_rerun_of(runtime: &tokio::runtime::Runtime, args: &str, what: &str) {
    use archon_engine::run::{Refresh, StepCache};
    const STEPS: usize = 1000;
    let mut spec = String::from("name: cached\nsteps:\n");
    for i in 0..STEPS {
        let args = args.replace('I', &i.to_string());
        spec.push_str(&format!(
            "  - {{ id: s{i}, tool: echo, with: {args}, cache: true }}\n"
        ));
    }
    let workflow = Arc::new(workflow(&spec));
    let state = tempfile::TempDir::new().unwrap();
    let store = archon_engine::store::sqlite::SqliteStore::open(state.path()).unwrap();
    let mut runs = 0;
    // One durable run with `cache` and `prior`; returns its report and how long it took, journal
    // included, from reading the cache (when `read` says so) to the last write.
    let mut run = |read: bool, prior: std::collections::HashMap<String, run::StepResult>| {
        runs += 1;
        let id = format!("cached{runs}");
        store
            .create_run(&archon_engine::store::NewRun {
                id: id.clone(),
                workflow: workflow.name.clone(),
                spec_path: "bench.yaml".into(),
                files: Vec::new(),
                inputs: Default::default(),
                workdir: std::env::temp_dir().display().to_string(),
                max_parallel: 64,
            })
            .unwrap();
        let started = Instant::now();
        let cpu_started = thread_cpu();
        let cache = if read {
            let entries = store
                .cache_entries(
                    std::slice::from_ref(&workflow.name),
                    archon_engine::store::now_ms(),
                )
                .unwrap();
            StepCache::of(entries, Refresh::None)
        } else {
            StepCache::default()
        };
        let cancel = CancellationToken::new();
        let journal = store.journal(&id, cancel.clone()).unwrap();
        let report = runtime
            .block_on(run::run(
                workflow.clone(),
                Default::default(),
                RunOptions {
                    cancel,
                    journal: journal.clone(),
                    prior: Arc::new(prior),
                    cache,
                    ..options(64)
                },
            ))
            .unwrap();
        let cpu = thread_cpu().saturating_sub(cpu_started);
        journal.close();
        let elapsed = started.elapsed();
        assert_eq!(report.status, RunStatus::Succeeded, "{:?}", report.error);
        (report, elapsed, cpu)
    };
    // The first run fills the cache.
    let (first, _, _) = run(false, Default::default());
    assert!(first.steps.values().all(|r| r.cached.is_none()));
    let done: std::collections::HashMap<String, run::StepResult> =
        first.steps.into_iter().collect();
    let (mut cached, mut reused) = (Duration::MAX, Duration::MAX);
    let (mut cached_cpu, mut reused_cpu) = (Duration::MAX, Duration::MAX);
    for _ in 0..7 {
        let (report, elapsed, cpu) = run(true, Default::default());
        assert!(
            report.steps.values().all(|r| r.cached.is_some()),
            "every step is a hit"
        );
        cached = cached.min(elapsed);
        cached_cpu = cached_cpu.min(cpu);
        let (_, elapsed, cpu) = run(false, done.clone());
        reused = reused.min(elapsed);
        reused_cpu = reused_cpu.min(cpu);
    }
    let per_step = |d: Duration| d.as_secs_f64() * 1e6 / STEPS as f64;
    // The run's own thread, in CPU time (which a busy machine does not blur): reading the entries,
    // rendering and hashing the keys, the lookups and the records handed to the journal.
    println!(
        "fully cached re-run of 1,000 steps ({what}), the run's thread in CPU time: {:.1} us/step; reused as recorded results: {:.1} us/step; caching costs {:.1} us/step",
        per_step(cached_cpu),
        per_step(reused_cpu),
        per_step(cached_cpu.saturating_sub(reused_cpu)),
    );
    // Wall-clock until the journal has written everything (its writer thread's SQLite work included).
    println!(
        "fully cached re-run of 1,000 steps ({what}), durable: {:.1} us/step; the same steps reused as recorded results: {:.1} us/step; caching costs {:.1} us/step (lookups and recording)",
        per_step(cached),
        per_step(reused),
        per_step(cached.saturating_sub(reused)),
    );
}

/// CPU time this thread has run, from the scheduler's statistics (nanoseconds on the CPU).
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(stat.split_whitespace().next().unwrap().parse().unwrap())
}
