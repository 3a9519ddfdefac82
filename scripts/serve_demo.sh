#!/usr/bin/env bash
# The demo as a service: installs what is missing, builds, writes the demo
# model, then twice starts two compute workers and the cache coordinator on
# 127.0.0.1 (tensor parallel over the two workers) and replays the shipped
# workload against them with the `chunkattn` client: 32 requests, 8 at a
# time, each the long shared system prompt of
# data/demo/system_prompt_fewshot.txt (instructions and a few-shot scene,
# about 2,200 tokens) + one of data/demo/prompts.txt. The first run has
# prefix sharing on, the second off (--prefix_sharing=false), and the script
# ends with the two side by side: prompt tokens computed and cached, peak KV,
# time to first token, tokens/s. Extra arguments go to `chunkattn replay`
# (e.g. --requests 64 --max_new_tokens 64). Logs: build/serve-demo/. The
# servers are stopped when the script exits, however it exits.
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
PIDS=()
stop_servers() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap stop_servers EXIT
trap 'exit 130' INT TERM

# The workers trust only callers with this run's secret (SECURITY.md).
TOKEN="$LOGS/worker-token"
(umask 077 && /usr/bin/python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > "$TOKEN")

# run_demo LABEL [COORDINATOR FLAG...]: fresh servers, the workload, its
# summary in $LOGS/LABEL.json, the servers stopped.
run_demo() {
  local label=$1
  shift
  local w0 w1 port metrics http server
  w0=$(free_port); w1=$(free_port); port=$(free_port); metrics=$(free_port); http=$(free_port)
  server="127.0.0.1:$port"
  local worker_args=(--device cpu --threads 1 --worker_token_file "$TOKEN" --model_root "$BUILD/demo-model")
  "$BIN/chunkattn-worker" --listen "127.0.0.1:$w0" "${worker_args[@]}" > "$LOGS/$label-worker0.log" 2>&1 &
  PIDS+=($!)
  "$BIN/chunkattn-worker" --listen "127.0.0.1:$w1" "${worker_args[@]}" > "$LOGS/$label-worker1.log" 2>&1 &
  PIDS+=($!)
  "$BIN/chunkattn-coordinator" --listen "$server" --metrics_host 127.0.0.1 --metrics_port "$metrics" \
    --http_host 127.0.0.1 --http_port "$http" \
    --workers "127.0.0.1:$w0,127.0.0.1:$w1" --model "$BUILD/demo-model" --worker_token_file "$TOKEN" "$@" \
    > "$LOGS/$label-coordinator.log" 2>&1 &
  PIDS+=($!)
  echo "serve-demo ($label): coordinator $server (OpenAI API http://127.0.0.1:$http/v1, metrics http://127.0.0.1:$metrics/metrics), workers :$w0 :$w1, logs $LOGS/$label-*.log"
  local deadline=$((SECONDS + ${SERVE_DEMO_STARTUP_S:-180}))
  until "$BIN/chunkattn" health --server "$server" --timeout_s 2 > /dev/null 2>&1; do
    for pid in "${PIDS[@]}"; do
      if ! kill -0 "$pid" 2>/dev/null; then
        echo "serve-demo: a server exited during startup; the logs' ends:" >&2
        tail -n 20 "$LOGS/$label"-*.log >&2
        exit 1
      fi
    done
    if [ $SECONDS -ge $deadline ]; then
      echo "serve-demo: not SERVING after ${SERVE_DEMO_STARTUP_S:-180} s; the logs' ends:" >&2
      tail -n 20 "$LOGS/$label"-*.log >&2
      exit 1
    fi
    sleep 0.5
  done
  if [ "$label" = sharing-on ]; then
    "$BIN/chunkattn" info --server "$server"
    echo
  fi
  "$BIN/chunkattn" replay --server "$server" \
    --system_prompt_file data/demo/system_prompt_fewshot.txt --prompts_file data/demo/prompts.txt \
    --requests 32 --concurrency 8 --max_new_tokens 32 --temperature 0.8 --top_p 0.95 --seed 1 \
    --json "$LOGS/$label.json" "${REPLAY_ARGS[@]}"
  stop_servers
  echo
}

REPLAY_ARGS=("$@")
run_demo sharing-on
run_demo sharing-off --prefix_sharing=false
echo "The same 32 requests, with and without prefix sharing:"
echo
/usr/bin/python3 scripts/demo_table.py "$LOGS/sharing-on.json" "$LOGS/sharing-off.json"
