#!/usr/bin/env bash
# The crash harness at scale: runs the ledger workflow, kills archon with SIGKILL at random moments,
# resumes until the run ends, and checks the store and the ledger, TRIALS times (default 1,000).
# The test suite runs the same harness with 50 trials.
#
# usage: scripts/crash-harness.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
ARCHON_CRASH_TRIALS=${1:-1000} exec cargo test --locked --release --test main -- \
  --exact durable::crash_harness_loses_nothing_and_repeats_no_side_effect_unasked --nocapture
