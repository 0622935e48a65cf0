#!/usr/bin/env bash
# Drives `archon mcp serve` with the MCP Inspector's command-line mode (a real MCP client, from npm): lists
# the tools of the bundled `hello` workflow, calls it, and checks that the call was recorded as a run.
# Needs tests/npm/node_modules (scripts/install-test-deps.sh) and an archon binary: `$ARCHON`, else
# target/debug/archon.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
archon="${ARCHON:-$root/target/debug/archon}"
inspector="$root/tests/npm/node_modules/.bin/mcp-inspector"
state="$(mktemp -d)"
trap 'rm -rf "$state"' EXIT
serve=("$archon" mcp serve "$root/workflows/hello.yaml" --state-dir "$state")

# Prints the value the JavaScript expression `$2` computes from the JSON document `$1` (as `it`).
field() {
    node -e 'const it = JSON.parse(process.argv[1]); console.log(eval(process.argv[2]))' "$1" "$2"
}

listed="$("$inspector" --cli "${serve[@]}" --method tools/list)"
names="$(field "$listed" 'it.tools.map(t => t.name).join(",")')"
[ "$names" = "hello" ] || { echo "tools/list gave \`$names\`, not \`hello\`: $listed" >&2; exit 1; }
echo "tools/list: $names"

called="$("$inspector" --cli "${serve[@]}" --method tools/call --tool-name hello --tool-arg who=inspector)"
greeting="$(field "$called" 'it.isError ? "error: " + JSON.stringify(it) : it.structuredContent.greeting')"
[ "$greeting" = "hello, inspector" ] || { echo "tools/call gave \`$greeting\`: $called" >&2; exit 1; }
echo "tools/call hello who=inspector: $greeting"

run="$(field "$called" 'it._meta["archon/run"].id')"
status="$(field "$("$archon" show "$run" --json --state-dir "$state")" 'it.status')"
[ "$status" = "succeeded" ] || { echo "run \`$run\` is \`$status\`" >&2; exit 1; }
echo "the run is recorded: $status"
