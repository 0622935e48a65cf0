#!/usr/bin/env bash
# The worker chaos harness at scale: random DAGs submitted to 2 or 3 `archon worker` processes on the
# PostgreSQL store, one killed with SIGKILL at a random moment and replaced, then the run, its record and a
# side-effect ledger checked against the in-doubt rule (docs/durability.md), TRIALS times (default 100),
# and a summary printed. The test suite runs the same harness with 3 trials. ARCHON_CHAOS_SEED repeats a
# sequence of trials (each failure prints its seed); ARCHON_TEST_POSTGRES names the server.
#
# usage: scripts/worker-chaos.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHON_WORKER_CHAOS_TRIALS=${1:-100} exec cargo test --locked --test main -- \
  --exact worker_chaos::killed_workers_lose_no_step_and_repeat_only_steps_safe_to_repeat --nocapture
