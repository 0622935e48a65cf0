#!/usr/bin/env bash
# Webhook deliveries to `archon serve` over real HTTP: signed deliveries are sent at a fixed rate
# (`RATE` per second, default 100) for `SECONDS_` seconds (default 10) by a few keep-alive connections,
# each one a new delivery id, and the bench reports the rate reached, the latency of the answers
# (p50, p99, max) and then counts, through the API, the firings recorded and the runs that ended: every
# delivery answered `202` must be one `started` firing and one run. With `RATE=0` it sends as fast as
# `CONNECTIONS` connections (default 8) allow, which measures the most the server takes: deliveries
# beyond what its queue holds are refused (`503`) without being recorded.
#
# Needs python3 (standard library only) and an archon binary: `$ARCHON` (a release build measures what
# users get: `ARCHON=target/release/archon` after `cargo build --release`), else target/debug/archon.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
archon="$(realpath "${ARCHON:-$root/target/debug/archon}")"
rate="${RATE:-100}"
seconds="${SECONDS_:-10}"
connections="${CONNECTIONS:-8}"

work="$(mktemp -d)"
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$work/workflows"
cat > "$work/workflows/hooked.yaml" <<'EOF'
name: hooked
secrets: [HOOK_SECRET]
inputs:
  event: { type: object, properties: { n: { type: integer } }, required: [n] }
triggers:
  - webhook: { secret: HOOK_SECRET, input: event }
steps:
  - id: take
    tool: echo
    with: { n: "{{ inputs.event.n }}" }
EOF
token="bench-operator-token-0123456789"
echo "operator $token" > "$work/tokens"
secret="bench-hook-secret-0123456789"

(cd "$work/workflows" && HOOK_SECRET="$secret" exec "$archon" serve . --port 0 --token-file "$work/tokens" \
    --state-dir "$work/state" --max-runs 8 2> "$work/stderr") &
server=$!
for _ in $(seq 1 200); do
    if grep -q "^listening on " "$work/stderr" 2>/dev/null; then break; fi
    sleep 0.05
done
url="$(sed -n 's/^listening on \(http:[^ ]*\)\/$/\1/p' "$work/stderr" | head -n 1)"
[ -n "$url" ] || { echo "the server did not start:"; cat "$work/stderr"; exit 1; }

URL="$url" TOKEN="$token" SECRET="$secret" RATE="$rate" SECONDS_="$seconds" CONNECTIONS="$connections" python3 - <<'EOF'
import hashlib, hmac, http.client, json, os, threading, time, urllib.parse

url = urllib.parse.urlparse(os.environ["URL"])
token, secret = os.environ["TOKEN"], os.environ["SECRET"].encode()
rate, seconds, connections = float(os.environ["RATE"]), float(os.environ["SECONDS_"]), int(os.environ["CONNECTIONS"])
total = int(rate * seconds) if rate > 0 else None
lock = threading.Lock()
sent = [0]
answers = {}
latencies = []
start = time.monotonic()

def next_index():
    with lock:
        i = sent[0]
        if total is not None and i >= total:
            return None
        if total is None and time.monotonic() - start >= seconds:
            return None
        sent[0] += 1
        return i

def worker():
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    while True:
        i = next_index()
        if i is None:
            break
        if rate > 0:
            due = start + i / rate
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        body = json.dumps({"n": i}).encode()
        signature = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        began = time.monotonic()
        conn.request("POST", "/hooks/hooked", body, {
            "Content-Type": "application/json", "X-Archon-Signature": signature,
            "X-Archon-Delivery": f"bench-{i}"})
        response = conn.getresponse()
        response.read()
        took = time.monotonic() - began
        with lock:
            answers[response.status] = answers.get(response.status, 0) + 1
            latencies.append(took)
    conn.close()

threads = [threading.Thread(target=worker) for _ in range(connections)]
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.monotonic() - start
latencies.sort()
def pct(p): return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000
accepted = answers.get(202, 0)
print(f"deliveries: {sent[0]} in {elapsed:.2f} s = {sent[0] / elapsed:.1f}/s over {connections} connections "
      f"(target {'max' if rate <= 0 else f'{rate:g}/s'})")
print(f"answers: {dict(sorted(answers.items()))}; latency p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, max {latencies[-1]*1000:.1f} ms")

def get(path):
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    return data

# Every firing recorded: count them through the API, page by page.
started, offset = 0, 0
while True:
    page = get(f"/api/v1/firings?workflow=hooked&limit=200&offset={offset}")
    started += sum(1 for f in page["firings"] if f["outcome"] == "started")
    if "next_offset" not in page or page["next_offset"] > 10000:
        break
    offset = page["next_offset"]
# And every run ended.
deadline = time.monotonic() + 300
while True:
    done = get("/api/v1/runs?workflow=hooked&status=succeeded&limit=1")["total"]
    if done >= accepted or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(f"recorded: {started} started firings for {accepted} accepted deliveries; {done} runs succeeded "
      f"({time.monotonic() - start - elapsed:.1f} s after the last delivery)")
# Paced, every delivery must be taken; flat out, the server may refuse some (`503`, the queue full),
# and those must not be recorded: a sender delivers them again.
refused = answers.get(503, 0)
ok = started == accepted and done == accepted and (accepted == sent[0] if rate > 0 else accepted + refused == sent[0])
if ok:
    print("every delivery recorded and run" if accepted == sent[0]
          else f"every accepted delivery recorded and run; {refused} refused unrecorded (queue full)")
else:
    print("MISMATCH")
raise SystemExit(0 if ok else 1)
EOF
