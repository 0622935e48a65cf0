#!/usr/bin/env bash
# Execution benchmarks: scheduler overhead (wide 1 -> 10,000 -> 1 and a chain of 1,000 echo steps),
# 1,000 `exec true` against the fork+exec floor, eight parallel 200 ms sleeps, and a whole-process
# `archon run` of the hello-world workflow.
#
# usage: scripts/bench.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}

cargo bench --quiet --bench scheduler
cargo build --release --quiet
bin=target/release/archon
"$bin" run workflows/hello.yaml > /dev/null 2>&1
total=0
best=999999
for _ in $(seq "$runs"); do
  start=$(date +%s%N)
  "$bin" run workflows/hello.yaml > /dev/null 2>&1
  end=$(date +%s%N)
  us=$(( (end - start) / 1000 ))
  total=$(( total + us ))
  (( us < best )) && best=$us
done
printf 'hello-world archon run (whole process): mean %.2f ms, min %.2f ms (%d runs)\n' \
  "$(echo "$total / $runs / 1000" | bc -l)" "$(echo "$best / 1000" | bc -l)" "$runs"
