#!/usr/bin/env bash
# The dashboard's figures (benches/serve.rs): the runs page's server time with 10,000 runs in the store,
# the delay from a run's event to its arrival over server-sent events (a Rust client, and a page in
# headless Chromium when scripts/install-chromium.sh and scripts/install-test-deps.sh have run), and the
# resident memory of an idle `archon serve`.
#
# usage: scripts/bench-serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
cargo bench --quiet --bench serve
