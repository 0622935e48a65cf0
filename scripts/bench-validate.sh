#!/usr/bin/env bash
# Benchmark `archon validate` as a whole process: a generated 1,000-step spec (target: <= 50 ms wall),
# the 30-level YAML alias bomb (target: rejected in < 100 ms and < 50 MB peak RSS), and files at each
# limit of docs/spec.md, YAML and TOML (target: < 100 MB peak RSS each, and time linear in the file: a
# mapping of many keys, one key repeated many times; scripts/limits.py writes them).
#
# usage: scripts/bench-validate.sh [RUNS]     (needs python3; uses hyperfine and /usr/bin/time when present)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}

cargo build --release --quiet
bin=target/release/archon
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 scripts/gen-spec.py 1000 > "$work/spec-1000.yaml"
"$bin" validate "$work/spec-1000.yaml" > /dev/null   # must be valid

{
  echo "name: laughs"
  echo "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"
  for i in $(seq 1 29); do
    refs=$(printf "*l%d, " $((i - 1)) $((i - 1)) $((i - 1)) $((i - 1)) $((i - 1)) $((i - 1)) $((i - 1)) $((i - 1)) $((i - 1)))
    echo "l$i: &l$i [${refs}*l$((i - 1))]"
  done
  echo "steps: []"
} > "$work/bomb.yaml"
if "$bin" validate "$work/bomb.yaml" > /dev/null; then echo "alias bomb was accepted" >&2; exit 1; fi

# Wall time of one run in milliseconds (no hyperfine needed).
measure() {
  local best=999999 total=0 start end ms
  for _ in $(seq "$runs"); do
    start=$(date +%s%N)
    "$bin" validate "$1" > /dev/null || true
    end=$(date +%s%N)
    ms=$(( (end - start) / 1000 ))
    total=$(( total + ms ))
    (( ms < best )) && best=$ms
  done
  printf '%-28s mean %6.2f ms   min %6.2f ms   (%d runs)\n' "$2" "$(echo "$total / $runs / 1000" | bc -l)" "$(echo "$best / 1000" | bc -l)" "$runs"
}

echo "spec: $(wc -c < "$work/spec-1000.yaml") bytes, $(grep -c '  - id:' "$work/spec-1000.yaml") steps"
if command -v hyperfine > /dev/null; then
  hyperfine --warmup 3 --runs "$runs" -N "$bin validate $work/spec-1000.yaml" "$bin validate $work/bomb.yaml" --ignore-failure
else
  measure "$work/spec-1000.yaml" "validate 1,000 steps"
  measure "$work/bomb.yaml" "reject alias bomb"
fi
if [ -x /usr/bin/time ]; then
  for f in spec-1000.yaml bomb.yaml; do
    /usr/bin/time -f "$f: peak RSS %M KB" "$bin" validate "$work/$f" > /dev/null || true
  done
  python3 scripts/limits.py "$work"
  for f in "$work"/yaml-*.yaml "$work"/toml-*.toml; do
    /usr/bin/time -q -f "$(basename "$f") ($(wc -c < "$f") bytes): %e s, peak RSS %M KB" "$bin" validate "$f" > /dev/null || true
  done
  /usr/bin/time -q -f "yaml-unknown-keys.yaml as JSON: peak RSS %M KB" "$bin" validate --format json "$work/yaml-unknown-keys.yaml" > /dev/null || true
fi
