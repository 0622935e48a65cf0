#!/usr/bin/env bash
# Durable-run benchmarks of whole processes (benches/store.rs): hello-world start-up with 0 and 10,000 runs
# in the store, and a durable 10,000-wide DAG and 100-step chain of no-op steps next to a hand-coded tokio
# program of the same shape writing equivalent rows through rusqlite (time and peak RSS).
#
# usage: scripts/bench-store.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
cargo bench --quiet --bench store
