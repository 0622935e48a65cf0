#!/usr/bin/env bash
# Steps run by `archon worker` processes through PostgreSQL, with real processes and the real server:
#
# 1. throughput: one submitted run of `STEPS` independent no-op steps (default 2000) taken by 1, 2 and 4
#    workers (`--concurrency CONCURRENCY` each, default 8); steps per second from submission to the run's
#    end, and each step's latency from ready (its task row's `ready_at`) to started (its attempt's
#    `started_at`), p50 and p99; and the CPU time a step cost meanwhile, the whole machine's (the server's
#    above all) and the workers' own (less noisy than steps per second when the machine's speed varies). The run is submitted with `--max-parallel` the places of all the workers
#    together, so that what is measured is the store and the workers, not the run's own limit (16 steps
#    at once unless the spec says otherwise: 4 workers taking 8 each would take turns on 16 places);
# 2. latency: a chain of `CHAIN` no-op steps (default 100), each needing the one before, over 4 idle
#    workers: each step's wait from ready to started when nothing else queues, p50 and p99;
# 3. sleep-bound scaling: 8 steps of `sleep 0.2` spread over 4 workers taking one step at a time, against
#    the 1.6 s they take one after another.
# 4. many runs: as many no-op steps in `RUNS` runs (default 8) submitted one after another, over 4 workers:
#    the steps of different runs do not take turns on one run's row.
# 5. cached steps: a run of `STEPS` no-op steps with `cache`, twice, over 1 worker (`CONCURRENCY` places):
#    the first run keeps an entry for each step, the second reuses them all; a step reads the entries it
#    may reuse, not all of its run's.
#
# Each measurement uses a schema of its own in `$ARCHON_BENCH_DB` (default
# postgres://postgres@127.0.0.1:5432/test), dropped afterwards. Needs psql and an archon binary: `$ARCHON`
# (a release build measures what users get: `ARCHON=target/release/archon` after `cargo build --release`),
# else target/debug/archon.
set -euo pipefail
export PGOPTIONS="${PGOPTIONS:---client-min-messages=warning}"
root="$(cd "$(dirname "$0")/.." && pwd)"
archon="$(realpath "${ARCHON:-$root/target/debug/archon}")"
base="${ARCHON_BENCH_DB:-postgres://postgres@127.0.0.1:5432/test}"
steps="${STEPS:-2000}"
concurrency="${CONCURRENCY:-8}"
chain="${CHAIN:-100}"
runs="${RUNS:-8}"

work="$(mktemp -d)"
workers=()
stop_workers() {
    for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null || true; done
    workers=()
}
cleanup() {
    stop_workers
    # Listed in a file: `fresh_store` runs in a subshell (`$(...)`), whose variables its caller never sees.
    if [ -f "$work/schemas" ]; then
        while read -r schema; do
            psql -q "$base" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
        done < "$work/schemas"
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# A schema of its own; prints the store URL that uses it.
fresh_store() {
    local schema="bench_workers_$$_$1"
    psql -q "$base" -c "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema" >/dev/null
    echo "$schema" >> "$work/schemas"
    case "$base" in *\?*) glue='&' ;; *) glue='?' ;; esac
    echo "${base}${glue}options=-c%20search_path%3D${schema}"
}

sql() { psql -qAtX "$1" -c "$2"; }

# CPU time in clock ticks: the whole machine's (user, system and interrupts), and the workers'.
machine_ticks() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
worker_ticks() {
    local pid total=0
    for pid in "${workers[@]}"; do total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
    echo "$total"
}

# Waits until `$2` holds in store `$1`: one session looks every 5 ms, on the server. (A psql started
# every 10 ms to look would take a large share of the CPU the measurement is about.) Each look is a
# transaction of its own: one that lasted the whole run would hold back the server's horizon, so that
# the versions the workers leave behind could not be pruned, nor their index entries skipped, and every
# claim would step over all of them.
wait_until() {
    psql -qAtX "$1" -c "DO \$\$ BEGIN WHILE NOT ($2) LOOP PERFORM pg_sleep(0.005); COMMIT; END LOOP; END \$\$"
}

# Starts `$2` workers on store `$1`, each taking `$3` steps at once, and waits until each says it works.
start_workers() {
    local store="$1" n="$2" each="$3" i
    for i in $(seq 1 "$n"); do
        ARCHON_STORE="$store" NO_COLOR=1 "$archon" worker --concurrency "$each" \
            2> "$work/worker-$i.err" > /dev/null &
        workers+=("$!")
    done
    for i in $(seq 1 "$n"); do
        for _ in $(seq 1 400); do
            if grep -q "worker: taking steps" "$work/worker-$i.err" 2>/dev/null; then break; fi
            sleep 0.025
        done
    done
}

# Submits `$2` (with the options that follow) and waits for its end; prints the seconds from
# submission to the end.
run_through() {
    local store="$1" spec="$2" id start end status
    shift 2
    start=$(date +%s.%N)
    id=$(cd "$work" && ARCHON_STORE="$store" "$archon" run --submit "$spec" "$@")
    wait_until "$store" "NOT EXISTS (SELECT 1 FROM runs WHERE id = '$id' AND status = 'running')"
    end=$(date +%s.%N)
    status=$(sql "$store" "SELECT status FROM runs WHERE id = '$id'")
    [ "$status" = succeeded ] || { echo "run $id ended $status" >&2; cat "$work"/worker-*.err >&2; exit 1; }
    echo "$id $(echo "$end - $start" | bc -l)"
}

{
    echo "name: noop"
    echo "steps:"
    for i in $(seq 1 "$steps"); do echo "  - { id: s$i, tool: echo, with: { n: $i } }"; done
} > "$work/noop.yaml"
{
    echo "name: chain"
    echo "steps:"
    echo "  - { id: s1, tool: echo, with: { n: 1 } }"
    for i in $(seq 2 "$chain"); do echo "  - { id: s$i, needs: [s$((i - 1))], tool: echo, with: { n: $i } }"; done
} > "$work/chain.yaml"
{
    echo "name: sleepy"
    echo "steps:"
    for i in $(seq 1 8); do echo "  - { id: s$i, tool: exec, with: { argv: [sleep, '0.2'] } }"; done
} > "$work/sleepy.yaml"

echo "archon: $archon"
echo "no-op steps: $steps in one run, --concurrency $concurrency per worker, the run's --max-parallel all their places"
printf '%-8s %12s %14s %14s %16s %16s\n' workers steps/s "ready→start p50" "p99 (ms)" \
    "CPU ms/step" "of it workers"
ticks=$(getconf CLK_TCK)
for n in 1 2 4; do
    store=$(fresh_store "noop$n")
    # The first use applies the migrations; not part of the measurement.
    ARCHON_STORE="$store" "$archon" runs > /dev/null
    start_workers "$store" "$n" "$concurrency"
    machine_before=$(machine_ticks) workers_before=$(worker_ticks)
    read -r id seconds < <(run_through "$store" "$work/noop.yaml" --max-parallel "$((n * concurrency))")
    machine_cpu=$(echo "($(machine_ticks) - $machine_before) * 1000 / $ticks / $steps" | bc -l)
    workers_cpu=$(echo "($(worker_ticks) - $workers_before) * 1000 / $ticks / $steps" | bc -l)
    stop_workers
    latency=$(sql "$store" "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY a.started_at - t.ready_at)::numeric, 1),
            round(percentile_cont(0.99) WITHIN GROUP (ORDER BY a.started_at - t.ready_at)::numeric, 1)
        FROM tasks t JOIN attempts a ON a.run_id = t.run_id AND a.step = t.step AND a.attempt = 1
        WHERE t.run_id = '$id'")
    printf '%-8s %12.0f %14s %14s %16.2f %16.2f\n' "$n" "$(echo "$steps / $seconds" | bc -l)" \
        "${latency%%|*}" "${latency##*|}" "$machine_cpu" "$workers_cpu"
done

store=$(fresh_store chain)
ARCHON_STORE="$store" "$archon" runs > /dev/null
start_workers "$store" 4 "$concurrency"
read -r id seconds < <(run_through "$store" "$work/chain.yaml")
stop_workers
latency=$(sql "$store" "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY a.started_at - t.ready_at)::numeric, 1),
        round(percentile_cont(0.99) WITHIN GROUP (ORDER BY a.started_at - t.ready_at)::numeric, 1)
    FROM tasks t JOIN attempts a ON a.run_id = t.run_id AND a.step = t.step AND a.attempt = 1
    WHERE t.run_id = '$id' AND t.step <> 's1'")
printf 'a chain of %s steps over 4 idle workers: %.1f ms a step; ready→start p50 %s ms, p99 %s ms\n' \
    "$chain" "$(echo "$seconds * 1000 / $chain" | bc -l)" "${latency%%|*}" "${latency##*|}"

store=$(fresh_store sleepy)
ARCHON_STORE="$store" "$archon" runs > /dev/null
start_workers "$store" 4 1
read -r _ seconds < <(run_through "$store" "$work/sleepy.yaml")
stop_workers
printf '8 × 200 ms sleep steps over 4 workers (1 step each at once): %.2f s (1.60 s one after another, 0.40 s ideal)\n' "$seconds"

{
    echo "name: part"
    echo "steps:"
    for i in $(seq 1 $((steps / runs))); do echo "  - { id: s$i, tool: echo, with: { n: $i } }"; done
} > "$work/part.yaml"
store=$(fresh_store runs)
ARCHON_STORE="$store" "$archon" runs > /dev/null
start_workers "$store" 4 "$concurrency"
start=$(date +%s.%N)
for _ in $(seq 1 "$runs"); do
    (cd "$work" && ARCHON_STORE="$store" "$archon" run --submit part.yaml) > /dev/null
done
wait_until "$store" "(SELECT count(*) FROM runs WHERE status <> 'running') = $runs"
end=$(date +%s.%N)
stop_workers
ended=$(sql "$store" "SELECT count(*) FROM runs WHERE status = 'succeeded'")
[ "$ended" = "$runs" ] || { echo "only $ended of $runs runs succeeded" >&2; exit 1; }
printf '%s no-op steps in %s runs submitted one after another, over 4 workers: %.0f steps/s\n' \
    "$(( (steps / runs) * runs ))" "$runs" "$(echo "$(( (steps / runs) * runs )) / ($end - $start)" | bc -l)"

{
    echo "name: cachey"
    echo "steps:"
    for i in $(seq 1 "$steps"); do echo "  - { id: s$i, tool: echo, with: { n: $i }, cache: true }"; done
} > "$work/cached.yaml"
store=$(fresh_store cached)
ARCHON_STORE="$store" "$archon" runs > /dev/null
start_workers "$store" 1 "$concurrency"
read -r _ first < <(run_through "$store" "$work/cached.yaml" --max-parallel "$concurrency")
read -r _ second < <(run_through "$store" "$work/cached.yaml" --max-parallel "$concurrency")
stop_workers
printf '%s cached no-op steps over 1 worker: %.0f steps/s keeping their results, %.0f reusing them\n' \
    "$steps" "$(echo "$steps / $first" | bc -l)" "$(echo "$steps / $second" | bc -l)"
