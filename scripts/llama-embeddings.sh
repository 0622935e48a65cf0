#!/usr/bin/env bash
# A real local `/v1/embeddings` server for the end-to-end check of memory's hybrid retrieval.
#
# It starts the `llama-server` and the Gemma 3 270M model that `local-llm.sh start` built and assembled (in the
# same cache directory; run that first, once), with `--embeddings` (mean pooling), on a port of its own:
# a server started with `--embeddings` serves embeddings only, so the chat server cannot serve both.
# The model is a tiny text-generation model, not an embedding model: its vectors prove the protocol and a
# rough closeness of texts about the same thing, not retrieval quality.
#
#   llama-embeddings.sh start [PORT]   start (default port 8091) and print the base URL
#   llama-embeddings.sh stop [PORT]    stop the server this script started on PORT
#   llama-embeddings.sh url [PORT]     print the base URL if the server is up
# The test reads it from ARCHON_E2E_EMBEDDINGS_BASE_URL:
#   ARCHON_E2E_EMBEDDINGS_BASE_URL="$(scripts/llama-embeddings.sh start)" cargo test --test main llama_cpp
#
# Cache: ${ARCHON_LLM_HOME:-$HOME/.cache/archon-llm}. Nothing is written inside the repository.
set -euo pipefail

home="${ARCHON_LLM_HOME:-$HOME/.cache/archon-llm}"
port="${2:-${ARCHON_EMBEDDINGS_PORT:-8091}}"
server="$home/llama-server/bin/llama-server"
model="$home/gemma-3-270m-q4_k_m.gguf"

up() { curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if [ ! -x "$server" ] || [ ! -f "$model" ]; then
      echo "no llama-server or model in $home: run local-llm.sh start first" >&2
      exit 1
    fi
    if ! up; then
      nohup "$server" -m "$model" --host 127.0.0.1 --port "$port" -c 2048 --embeddings --pooling mean \
        -t "$(nproc)" >"$home/embeddings-$port.log" 2>&1 &
      echo $! >"$home/embeddings-$port.pid"
      for _ in $(seq 1 120); do up && break; sleep 0.5; done
      up || { echo "llama-server did not come up; see $home/embeddings-$port.log" >&2; exit 1; }
    fi
    echo "http://127.0.0.1:$port/v1"
    ;;
  stop)
    if [ -f "$home/embeddings-$port.pid" ]; then
      kill "$(cat "$home/embeddings-$port.pid")" 2>/dev/null || true
      rm -f "$home/embeddings-$port.pid"
    fi
    ;;
  url)
    up && echo "http://127.0.0.1:$port/v1"
    ;;
  *)
    sed -n '2,16p' "$0"; exit 2
    ;;
esac
