//! Long-term memory (run with `cargo bench --bench memory`): writes to the SQLite memory file, one
//! transaction each as `remember` makes them, then BM25 recall from 100,000 memories of one namespace
//! (with 10,000 in another), five per query, as an agent's prompt and `recall` ask. Each memory is a
//! sentence of twelve words from a vocabulary of 5,000 (Zipf-like: frequent words repeat, as in text);
//! each query is three words. Figures are printed; nothing is asserted.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use archon_engine::run::memory::{Kind, MemoryStore, NewMemory, Recall};

const MEMORIES: usize = 100_000;
const OTHER: usize = 10_000;
const QUERIES: usize = 2_000;
const VOCABULARY: usize = 5_000;

/// A deterministic generator (xorshift), so that every run measures the same memories.
struct Words(u64);

impl Words {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A word, frequent ones more often (the square of a uniform draw skews towards 0).
    fn word(&mut self) -> String {
        let u = (self.next() % 10_000) as f64 / 10_000.0;
        let index = (u * u * VOCABULARY as f64) as usize;
        format!("w{index}x")
    }

    fn sentence(&mut self, words: usize) -> String {
        (0..words)
            .map(|_| self.word())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let store = MemoryStore::open(&dir.path().join("memory.db")).unwrap();
    let mut words = Words(0x9e37_79b9_7f4a_7c15);
    let mut writes = Vec::with_capacity(MEMORIES);
    for i in 0..MEMORIES + OTHER {
        let content = format!("{} {i}", words.sentence(12));
        let namespace = if i < MEMORIES { "team" } else { "other" };
        let started = Instant::now();
        store
            .write(&NewMemory {
                namespace,
                kind: Kind::Fact,
                agent: None,
                run: Some("run"),
                step: Some("step"),
                content: &content,
                supersedes: None,
                run_scoped: false,
                embedding: None,
            })
            .unwrap();
        writes.push(started.elapsed());
    }
    writes.sort();
    println!(
        "write ({} memories): p50 {:?}, p95 {:?}, mean {:?}",
        writes.len(),
        percentile(&writes, 0.5),
        percentile(&writes, 0.95),
        writes.iter().sum::<Duration>() / writes.len() as u32
    );
    let none = HashSet::new();
    let mut recalls = Vec::with_capacity(QUERIES);
    let mut found = 0;
    for _ in 0..QUERIES {
        let query = words.sentence(3);
        let started = Instant::now();
        let hits = store
            .recall(&Recall {
                namespace: "team",
                kinds: &[Kind::Fact],
                query: &query,
                limit: 5,
                exclude: &none,
                superseded: false,
                embedding: None,
            })
            .unwrap();
        recalls.push(started.elapsed());
        found += hits.len();
    }
    recalls.sort();
    println!(
        "recall from {MEMORIES} (BM25, 5 per query, {QUERIES} queries, {:.1} found on average): p50 {:?}, p95 {:?}, max {:?}",
        found as f64 / QUERIES as f64,
        percentile(&recalls, 0.5),
        percentile(&recalls, 0.95),
        recalls[recalls.len() - 1]
    );
}
