#!/usr/bin/env bash
# Checks `archon serve`'s HTTP API against its own OpenAPI document with Schemathesis, a property-based
# API tester: it generates requests (valid and invalid) for every operation and fails on any server error
# (5xx), any status code, content type or body the document does not describe. The server runs on a
# temporary state directory with a few workflows and some runs (one succeeded, one failed, one waiting
# for approval), behind an operator token.
#
# Installs the pinned Schemathesis with pip when it is missing. Needs an archon binary: `$ARCHON`, else
# target/debug/archon. `SCHEMATHESIS_EXAMPLES` sets the examples per operation (default 40).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
archon="${ARCHON:-$root/target/debug/archon}"
version="4.32.5"
examples="${SCHEMATHESIS_EXAMPLES:-40}"

if ! command -v schemathesis >/dev/null || [ "$(schemathesis --version | awk '{print $NF}')" != "$version" ]; then
    python3 -m pip install --quiet "schemathesis==$version"
fi

work="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/workflows"
cat > "$work/workflows/hello.yaml" <<'EOF'
name: hello
description: Greets someone
inputs:
  who: { type: string, description: Who to greet }
  times: { type: integer, default: 1, minimum: 1, maximum: 3 }
steps:
  - id: greet
    tool: echo
    with: { message: "hello, {{ inputs.who }}" }
outputs:
  greeting: "{{ steps.greet.output.message }}"
EOF
cat > "$work/workflows/fails.yaml" <<'EOF'
name: fails
steps:
  - id: boom
    tool: exec
    with: { argv: ["sh", "-c", "echo about to fail >&2; exit 3"] }
EOF
cat > "$work/workflows/approve.yaml" <<'EOF'
name: pay
steps:
  - id: pay
    tool: echo
    approval: required
    with: { amount: 12 }
EOF
printf 'name: broken\nsteps:\n  - id: a\n    tool: nope\n' > "$work/workflows/broken.yaml"

token="schemathesis-operator-token-0123456789"
printf 'operator %s\nviewer schemathesis-viewer-token-0123456789\n' "$token" > "$work/tokens"
"$archon" serve "$work/workflows" --port 0 --token-file "$work/tokens" --state-dir "$work/state" \
    2> "$work/serve.log" &
server=$!
for _ in $(seq 1 100); do
    grep -q '^listening on ' "$work/serve.log" && break
    sleep 0.1
done
url="$(sed -n 's/^listening on //p' "$work/serve.log" | head -n1)"
[ -n "$url" ] || { echo "archon serve did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
url="${url%/}"
auth=(-H "Authorization: Bearer $token")

# Some runs for the operations on runs to find.
post() { curl -fsS "${auth[@]}" -H 'Content-Type: application/json' -X POST -d "$2" "$url$1"; }
post /api/v1/workflows/hello/runs '{"inputs": {"who": "schemathesis"}}' > /dev/null
post /api/v1/workflows/fails/runs '{}' > /dev/null
post /api/v1/workflows/pay/runs '{}' > /dev/null
for _ in $(seq 1 100); do
    curl -fsS "${auth[@]}" "$url/api/v1/approvals" | grep -q '"key"' && break
    sleep 0.1
done

# The live streams never end by themselves: they are left to the API tests (tests/serve.rs).
schemathesis run "$url/api/v1/openapi.json" \
    --url "$url" \
    "${auth[@]}" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --exclude-path-regex '/stream$' \
    --max-examples "$examples" \
    --request-timeout 10 \
    --seed 19 \
    --no-color \
    --generation-database none

# The server served every request and is still healthy.
curl -fsS "${auth[@]}" "$url/api/v1/session" > /dev/null
if grep -q 'panicked' "$work/serve.log"; then
    echo "archon serve panicked:" >&2
    cat "$work/serve.log" >&2
    exit 1
fi
echo "schemathesis: no server error and no response outside the OpenAPI document"
