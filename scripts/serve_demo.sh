#!/usr/bin/env bash
# The demo as a service: installs what is missing, builds, writes the demo
# model, starts two compute workers and the cache coordinator on 127.0.0.1
# (tensor parallel over the two workers), and replays the shipped workload
# against it with the `chunkattn` client: 32 requests, 8 at a time, each the
# system prompt of data/demo/system_prompt.txt + one of data/demo/prompts.txt.
# Prints the prefix hit rate, the throughput and the KV memory at the peak
# with and without sharing. Extra arguments go to `chunkattn replay` (e.g.
# --requests 64 --max_new_tokens 64). Logs: build/serve-demo/. The servers
# are stopped when the script exits, however it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
CHUNKATTN_DEPS=demo scripts/install-deps.sh
scripts/build.sh
BUILD=${BUILD_DIR:-build}
BIN="$BUILD/bin"
if [ ! -f "$BUILD/demo-model/config.json" ]; then
  "$BIN/chunkattn-make-demo-model" "$BUILD/demo-model"
fi
LOGS="$BUILD/serve-demo"
mkdir -p "$LOGS"

# Ports the kernel hands out for port 0: free a moment ago (a later bind may
# still lose the race; the startup check below then says so).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
W0=$(free_port); W1=$(free_port); PORT=$(free_port); METRICS=$(free_port); HTTP=$(free_port)
SERVER="127.0.0.1:$PORT"

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The workers trust only callers with this run's secret (SECURITY.md).
TOKEN="$LOGS/worker-token"
(umask 077 && /usr/bin/python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > "$TOKEN")
WORKER_ARGS=(--device cpu --threads 1 --worker_token_file "$TOKEN" --model_root "$BUILD/demo-model")
"$BIN/chunkattn-worker" --listen "127.0.0.1:$W0" "${WORKER_ARGS[@]}" > "$LOGS/worker0.log" 2>&1 &
PIDS+=($!)
"$BIN/chunkattn-worker" --listen "127.0.0.1:$W1" "${WORKER_ARGS[@]}" > "$LOGS/worker1.log" 2>&1 &
PIDS+=($!)
"$BIN/chunkattn-coordinator" --listen "$SERVER" --metrics_host 127.0.0.1 --metrics_port "$METRICS" \
  --http_host 127.0.0.1 --http_port "$HTTP" \
  --workers "127.0.0.1:$W0,127.0.0.1:$W1" --model "$BUILD/demo-model" --worker_token_file "$TOKEN" \
  > "$LOGS/coordinator.log" 2>&1 &
PIDS+=($!)

echo "serve-demo: coordinator $SERVER (OpenAI API http://127.0.0.1:$HTTP/v1, metrics http://127.0.0.1:$METRICS/metrics), workers :$W0 :$W1, logs $LOGS/"
deadline=$((SECONDS + ${SERVE_DEMO_STARTUP_S:-180}))
until "$BIN/chunkattn" health --server "$SERVER" --timeout_s 2 > /dev/null 2>&1; do
  for pid in "${PIDS[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "serve-demo: a server exited during startup; the logs' ends:" >&2
      tail -n 20 "$LOGS"/*.log >&2
      exit 1
    fi
  done
  if [ $SECONDS -ge $deadline ]; then
    echo "serve-demo: not SERVING after ${SERVE_DEMO_STARTUP_S:-180} s; the logs' ends:" >&2
    tail -n 20 "$LOGS"/*.log >&2
    exit 1
  fi
  sleep 0.5
done
"$BIN/chunkattn" info --server "$SERVER"
echo
"$BIN/chunkattn" replay --server "$SERVER" \
  --system_prompt_file data/demo/system_prompt.txt --prompts_file data/demo/prompts.txt \
  --requests 32 --concurrency 8 --max_new_tokens 32 --temperature 0.8 --top_p 0.95 --seed 1 "$@"
