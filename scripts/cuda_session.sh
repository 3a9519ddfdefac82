#!/usr/bin/env bash
# The GPU session, shaped by the device tool's limits: 15 minutes of device
# time in all (machine starts, idle waits and closes included; a machine stays
# warm 30 s after a call), 10 minutes a command, at most 64 MiB carried and
# 8 files back from $OUT. bench/README.md ("The GPU session") explains it.
#
# Here (the build machine, no GPU):
#   scripts/cuda_session.sh bundle
#       builds the seven binaries the session runs (in $BUILD_DIR, default
#       build/: sm_80 and sm_90a kernels by default, CI's build sm_90a alone;
#       a folder without sm_90a gets it added) and packs them, stripped, with
#       the libraries a bare GPU host lacks into gpu-bundle.tar.xz (at most
#       60 MiB) and their commit into gpu-bundle.commit. Carry both.
#   scripts/cuda_session.sh collect DIR...
#       unpacks the archives that came back (each call's files_at folder) into
#       bench/results/ (JSON) and tests/fixtures/transformers/, and prints each
#       call's step table.
#
# On the GPU host: three device calls, back to back on one warm machine,
# ordered by value (what ran first came back whatever is cut). Their step
# limits add to at most 11 minutes; paste these (run's carry is
# ["gpu-bundle.tar.xz", "gpu-bundle.commit"] for each):
#   1. command "scripts/cuda_session.sh tests $OUT"    timeout_s 320
#      the CUDA kernel and model tests against the CPU oracle and fresh
#      transformers fixtures, memcheck on a short filter        (limits 290 s)
#   2. command "scripts/cuda_session.sh kernels $OUT"  timeout_s 190
#      the kernel table: the paper's fp16 grid, GQA, torch's SDPA (limits 160 s)
#   3. command "scripts/cuda_session.sh e2e $OUT"      timeout_s 235
#      end to end, prefix sharing on then off, two rows each     (limits 201 s)
# Before each call read the device tool's status: when budget_left_s is
# under that call's timeout_s + 60, skip it and every later one (give_back);
# but before call 3 with 275-294 s left, run it shorter instead, timeout_s 215:
# "CHUNKATTN_E2E_REQUESTS=3 scripts/cuda_session.sh e2e $OUT" (limits 183 s).
#
# A call unpacks the bundle into ${TMPDIR:-/tmp} (removed, with the call's work
# folder, when the call exits), then runs its steps one after another, each
# under `timeout` with the limit below. After every step it rewrites
# $OUT/<call>.tar.gz (summary.txt, every step's log, the results so far) and
# $OUT/<call>-summary.txt: two files whatever the steps, and a call cut off
# still returns what it finished. A step that fails or times out is recorded
# and the next one runs; the call exits 1 if any step did not pass.
# LD_LIBRARY_PATH is set for the bundle's binaries alone, never for python3 or
# torch; the model tests find the source tree and the host's python3 through
# CHUNKATTN_SOURCE_DIR and CHUNKATTN_PYTHON (workers/tests/model_test_util.h).
#
# CHUNKATTN_SESSION_NO_GPU=1 is the mode where no GPU is expected (CI checks
# this plumbing with it): no nvidia-smi is needed and every step but the
# bundle's unpacking is cut to CHUNKATTN_SESSION_STEP_CAP_S (default 10)
# seconds; the table still shows each step's own limit.
# CHUNKATTN_BUNDLE (default ./gpu-bundle.tar.xz), CHUNKATTN_E2E_REQUESTS
# (default 6 per row), CHUNKATTN_PYTHON (default: python3 on PATH) and
# CHUNKATTN_E2E_PORT (the coordinator's, default 50151; the worker's is the
# next) override the defaults.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}

usage() {
  echo "usage: cuda_session.sh bundle | collect DIR... | tests|kernels|e2e OUTDIR" >&2
  exit 2
}

# The binaries the device calls run.
BINS="chunkattn_kernels_cuda_test chunkattn-kernel-bench chunkattn_model_cuda_test chunkattn-worker
  chunkattn-coordinator chunkattn-loadgen chunkattn"

case "$mode" in
  bundle)
    build=${BUILD_DIR:-$root/build}
    out=${CHUNKATTN_BUNDLE:-$root/gpu-bundle.tar.xz}
    out=${out%.tar.xz}
    if [ ! -f "$build/build.ninja" ]; then
      cmake -S "$root" -B "$build" -G Ninja -DCHUNKATTN_CUDA=ON >/dev/null
    fi
    # The GPU hosts are Hopper (H100, H200): the kernels must include sm_90a,
    # whatever the folder was configured for (CI's build has sm_90a alone).
    archs=$(sed -n 's/^CHUNKATTN_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")
    case ";$archs;" in
      *";90a;"*) ;;
      *)
        echo "cuda_session: $build builds CUDA for \"$archs\": adding 90a" >&2
        cmake -S "$root" -B "$build" "-DCHUNKATTN_CUDA_ARCHITECTURES=${archs:+$archs;}90a" >/dev/null
        ;;
    esac
    # A build without CUDA has no chunkattn_kernels_cuda_test target: this fails.
    # shellcheck disable=SC2086
    cmake --build "$build" --target $BINS
    # shellcheck disable=SC2046
    "$root/scripts/device-bundle" "$out" $(for b in $BINS; do echo "$build/bin/$b"; done)
    commit=$(git -C "$root" rev-parse HEAD)
    [ -z "$(git -C "$root" status --porcelain --untracked-files=no)" ] || commit="$commit-dirty"
    echo "$commit" > "$out.commit"
    echo "carry: $(basename "$out").tar.xz $(basename "$out").commit (commit $commit)"
    exit 0
    ;;
  collect)
    shift
    [ $# -ge 1 ] || usage
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    found=0
    for dir in "$@"; do
      for a in "$dir"/*.tar.gz; do
        [ -f "$a" ] || continue
        found=1
        call=$(basename "$a" .tar.gz)
        mkdir -p "$tmp/$call"
        tar -xzf "$a" -C "$tmp/$call"
        cat "$tmp/$call/summary.txt"
        echo
        for j in "$tmp/$call"/results/*.json; do
          [ -f "$j" ] && cp "$j" "$root/bench/results/" && echo "  -> bench/results/$(basename "$j")"
        done
        if [ -d "$tmp/$call/fixtures/transformers" ]; then
          mkdir -p "$root/tests/fixtures/transformers"
          cp -r "$tmp/$call/fixtures/transformers/." "$root/tests/fixtures/transformers/"
          echo "  -> tests/fixtures/transformers/"
        fi
      done
    done
    [ "$found" = 1 ] || { echo "cuda_session: no <call>.tar.gz under $*" >&2; exit 1; }
    exit 0
    ;;
  tests | kernels | e2e) ;;
  *) usage ;;
esac

# --- A device call. ----------------------------------------------------------
call=$mode
OUT=${2:?usage: cuda_session.sh $call OUTDIR}
mkdir -p "$OUT"
no_gpu=${CHUNKATTN_SESSION_NO_GPU:-0}
cap=${CHUNKATTN_SESSION_STEP_CAP_S:-10}
work=${TMPDIR:-/tmp}/chunkattn-session/$call
bundle_tar=${CHUNKATTN_BUNDLE:-$root/gpu-bundle.tar.xz}
bundle_dir=${TMPDIR:-/tmp}/chunkattn-bundle/$(basename "$bundle_tar" .tar.xz)
coordinator=
worker=
# Everything the call made outside $OUT goes when it exits, however it exits
# (the e2e servers first: they write into the work folder).
cleanup() {
  if [ -n "$coordinator$worker" ]; then
    # shellcheck disable=SC2086
    kill $coordinator $worker 2>/dev/null || true
    wait 2>/dev/null || true
  fi
  rm -rf "$work" "$bundle_dir"
  rmdir "$(dirname "$work")" "$(dirname "$bundle_dir")" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP
rm -rf "$work"
mkdir -p "$work/logs" "$work/results"
summary=$work/summary.txt
failed=0
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# Rewrites the two files of $OUT from the work folder (atomically: a call cut
# off mid-pack keeps the previous archive). The archive first: a summary in
# $OUT never lists a step its archive lacks.
pack() {
  tar -C "$work" -czf "$OUT/.$call.tar.gz" . && mv "$OUT/.$call.tar.gz" "$OUT/$call.tar.gz"
  cp "$summary" "$OUT/.$call-summary.txt" && mv "$OUT/.$call-summary.txt" "$OUT/$call-summary.txt"
}

# Appends a row to the step table and packs.
record() {  # record NAME STATUS RC SECONDS LIMIT
  printf '| %-22s | %-8s | %3s | %7s | %7s |\n' "$1" "$2" "$3" "$4" "$5" >> "$summary"
  pack
}

# step NAME LIMIT_S CMD...: runs CMD under timeout with its output in
# logs/NAME.log, records how it ended, and never stops the call.
step() {
  local name=$1 limit=$2 run_limit=$2
  shift 2
  # Not the bundle's unpacking: the same work with or without a GPU, and on a
  # busy machine (CI's tests, four at a time on 2 cores) it can take longer
  # than the cap.
  if [ "$no_gpu" = 1 ] && [ "$limit" -gt "$cap" ] && [ "$name" != bundle ]; then run_limit=$cap; fi
  local t0 rc=0 status
  t0=$(date +%s)
  timeout -k 5 "$run_limit" "$@" > "$work/logs/$name.log" 2>&1 || rc=$?
  case "$rc" in
    0) status=ok ;;
    124 | 137) status=timeout ;;
    *) status=failed ;;
  esac
  [ "$rc" = 0 ] || failed=$((failed + 1))
  record "$name" "$status" "$rc" "$(($(date +%s) - t0))" "$limit"
  return 0
}

# The bundle (unpacked by the first step into $bundle_dir) and its commit.
if [ "$no_gpu" = 1 ]; then
  gpu=nogpu
else
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/[^a-z0-9-]//g')
fi
export CHUNKATTN_COMMIT
CHUNKATTN_COMMIT=$(cat "${bundle_tar%.tar.xz}.commit" 2>/dev/null || echo unknown)
{
  echo "# chunkattn GPU session: call $call on ${gpu}, commit $CHUNKATTN_COMMIT, started $started"
  [ "$no_gpu" = 1 ] && echo "# no GPU expected: every step but the bundle cut to ${cap} s"
  echo
  printf '| %-22s | %-8s | %3s | %7s | %7s |\n' step status rc seconds limit_s
  echo "|------------------------|----------|-----|---------|---------|"
} > "$summary"

# Unpacks the bundle and writes $bundle_dir/run: `run BINARY ARGS...` execs a
# bundle binary with the search path env.sh computes (which also names any
# binary whose libraries do not resolve), so only the bundle's own binaries
# ever see the bundle's libraries.
step bundle 15 bash -c 'set -e; rm -rf "$(dirname "$2")"; mkdir -p "$(dirname "$2")"
  tar -xJf "$1" -C "$(dirname "$2")"
  ld=$(source "$2/env.sh" && printf %s "${LD_LIBRARY_PATH%:}")
  printf "#!/bin/sh\nb=\$1\nshift\nLD_LIBRARY_PATH=\"%s\" exec \"%s/bin/\$b\" \"\$@\"\n" "$ld" "$2" > "$2/run"
  chmod +x "$2/run"' _ "$bundle_tar" "$bundle_dir"
run=$bundle_dir/run

results=$work/results
case "$call" in
  tests)
    # Hugging Face's own logits for the model tests' tiny models (the model
    # test reads them from here), the CUDA kernel tests against the float64
    # oracle, the CUDA model against the CPU model and those logits, then
    # memcheck on one decode, one prefill and the KV writes (the tools slow
    # kernels 10-100x). No racecheck: it costs minutes and the kernels share
    # no memory between blocks outside __syncthreads.
    python=${CHUNKATTN_PYTHON:-$(command -v python3 || echo /usr/bin/python3)}
    step gpu-info 5 nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
    step fixtures 45 "$python" "$root/tests/tools/make_reference.py" --backend transformers \
      --out "$work/fixtures/transformers"
    step kernels-cuda-test 90 "$run" chunkattn_kernels_cuda_test --gtest_output="xml:$results/kernels-cuda-test.xml"
    step model-cuda-test 90 env CHUNKATTN_SOURCE_DIR="$root" CHUNKATTN_PYTHON="$python" \
      CHUNKATTN_TRANSFORMERS_FIXTURES="$work/fixtures/transformers" \
      "$run" chunkattn_model_cuda_test --gtest_output="xml:$results/model-cuda-test.xml"
    filter='Shapes/CudaDecodeParity.TppAndSeqMatchTheOracle/fp16_d128_g4_c64:Shapes/CudaPrefillParity.MatchesTheOracle/bf16_d64_g4_c16:CudaKvWrites.*'
    sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # The tool follows `run` into the binary it execs.
    step memcheck 45 "$sanitizer" --tool memcheck --target-processes all \
      --error-exitcode 3 "$run" chunkattn_kernels_cuda_test --gtest_filter="$filter"
    ;;
  kernels)
    # Each configuration fills up to 2.2 GB of KV on the host's cores and
    # checks against the CPU kernel; the timed launches take milliseconds.
    kb=("$run" chunkattn-kernel-bench --device cuda --repeat 50 --warmup 5)
    step paper-fp16 85 "${kb[@]}" --grid paper --json "$results/cuda-$gpu-paper-fp16.json"
    step gqa 20 "${kb[@]}" --np 4096 --ns 4096 --kv-heads 8 --json "$results/cuda-$gpu-gqa.json"
    step torch-baseline 40 python3 "$root/bench/torch_baseline.py" --grid paper --json "$results/cuda-$gpu-torch.json"
    ;;
  e2e)
    # The paper's Table 4 rows with the whole prefix shared, through a GPU
    # worker and a coordinator with prefix sharing on, then on fresh
    # processes off: a Llama-2-7B-shaped model with dummy fp16 weights (made
    # on the host's cores at each Join), then per row `requests` Poisson
    # arrivals at the row's rate, each asking for 256 tokens; a row's limit is
    # its arrival window plus 15 s for the last requests to finish.
    requests=${CHUNKATTN_E2E_REQUESTS:-6}
    model=$root/bench/models/llama2-7b-shape
    api=127.0.0.1:${CHUNKATTN_E2E_PORT:-50151}
    wport=127.0.0.1:$((${CHUNKATTN_E2E_PORT:-50151} + 1))
    seed=1
    for sharing in on off; do
      flag=true
      [ "$sharing" = off ] && flag=false
      "$run" chunkattn-worker --listen "$wport" --device cuda:0 --gpu_memory_fraction 0.9 \
        > "$work/logs/worker-$sharing.log" 2>&1 &
      worker=$!
      "$run" chunkattn-coordinator --listen "$api" --workers "$wport" --model "$model" \
        --load_format dummy --kv_dtype float16 --prefix_sharing="$flag" --max_batch_size 256 \
        --max_tokens_per_step 4096 --metrics_port 0 --http_port 0 --join_timeout_s 300 \
        > "$work/logs/coordinator-$sharing.log" 2>&1 &
      coordinator=$!
      ready=45
      [ "$sharing" = off ] && ready=40
      step "ready-$sharing" "$ready" bash -c 'until "$1" chunkattn health --server "$4" >/dev/null 2>&1; do
        kill -0 "$2" 2>/dev/null && kill -0 "$3" 2>/dev/null || exit 1; sleep 1; done' _ "$run" "$coordinator" "$worker" "$api"
      [ "$sharing" = on ] && step info 5 "$run" chunkattn info --server "$api"
      for row in 2048,2048,1.0 4096,4096,0.5; do
        IFS=, read -r np ns rps <<< "$row"
        limit=$(awk -v r="$requests" -v q="$rps" 'BEGIN { printf "%d", r / q + 15.5 }')
        step "$sharing-np$np-ns$ns" "$limit" "$run" chunkattn-loadgen --server "$api" --rate "$rps" \
          --requests "$requests" --np "$np" --ns "$ns" --nc 256 --seed "$seed" --timeout_s 120 \
          --json "$results/e2e-$gpu-sharing-$sharing-np$np-ns$ns.json"
        seed=$((seed + 1))
      done
      kill "$coordinator" "$worker" 2>/dev/null || true
      wait 2>/dev/null || true
      coordinator= worker=
    done
    ;;
esac
echo >> "$summary"
echo "$failed step(s) did not pass; finished $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$summary"
pack
cat "$summary"
[ "$failed" = 0 ]
