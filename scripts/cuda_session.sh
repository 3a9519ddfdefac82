#!/usr/bin/env bash
# One GPU session for the CUDA kernels, in two halves.
#
# Here (the build machine, no GPU):
#   scripts/cuda_session.sh bundle
# builds the CUDA test and benchmark for sm_80 and sm_90a and bundles them,
# with the libraries a bare GPU host lacks, into gpu-bundle/ (git-ignored:
# carry it to the device).
#
# On the GPU host (device tool, with carry ["gpu-bundle"]):
#   scripts/cuda_session.sh run "$OUT"
# 1. the CUDA tests against the CPU oracle (gtest XML in $OUT);
# 2. compute-sanitizer memcheck and racecheck over a decode, a graph replay
#    and a prefill test;
# 3. chunkattn-kernel-bench --device cuda: the paper's Table 3 grid (fp16,
#    b=32, h=32, d=128, c=64), GQA 32/8, bf16, d=64 and chunk sizes 32/128;
# 4. bench/torch_baseline.py on the same grid (FlashAttention and naive).
# 5. the CUDA model against the CPU model (chunkattn_model_cuda_test);
# 6. chunkattn-generate --device cuda:0 on the Llama-2-7B shape (dummy fp16
#    weights), greedy and sampled on the GPU (generate-cuda-*.txt).
# Results land in $OUT as bench/results/cuda-<gpu>-*.json files.
#
# And the end-to-end run (issue 8), one call per sharing setting (each stays
# under the device tool's 10 minutes):
#   scripts/cuda_session.sh e2e "$OUT" on|off [REQUESTS]
# starts a GPU worker and a coordinator with --prefix_sharing on or off on a
# Llama-2-7B-shaped model with dummy fp16 weights
# (bench/models/llama2-7b-shape) and runs chunkattn-loadgen over the paper's
# Table 4 rows, writing e2e-<gpu>-sharing-<on|off>.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}

case "$mode" in
  bundle)
    cmake -S "$root" -B "$root/build" -G Ninja -DCHUNKATTN_CUDA=ON >/dev/null
    bins="chunkattn_kernels_cuda_test chunkattn-kernel-bench chunkattn_model_cuda_test chunkattn-worker
      chunkattn-coordinator chunkattn-loadgen chunkattn chunkattn-generate"
    # shellcheck disable=SC2086
    cmake --build "$root/build" --target $bins -j2
    rm -rf "$root/gpu-bundle"
    # shellcheck disable=SC2046
    "$root/../shared/tools/device-bundle" "$root/gpu-bundle" $(for b in $bins; do echo "$root/build/bin/$b"; done)
    git -C "$root" rev-parse HEAD > "$root/gpu-bundle/COMMIT"
    ;;
  run)
    out=${2:?usage: cuda_session.sh run OUTDIR}
    b="$root/gpu-bundle"
    # shellcheck disable=SC1091
    source "$b/env.sh"
    export CHUNKATTN_COMMIT
    CHUNKATTN_COMMIT=$(cat "$b/COMMIT")
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$out/gpu.txt"
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/[^a-z0-9-]//g')
    status=0
    "$b/bin/chunkattn_kernels_cuda_test" --gtest_output="xml:$out/cuda-test.xml" 2>&1 | tail -40 || status=1
    san=/usr/local/cuda/bin/compute-sanitizer
    filter='Shapes/CudaDecodeParity.TppAndSeqMatchTheOracle/fp16_d128_g4_c64:CudaDecodeGraph.*:Shapes/CudaPrefillParity.MatchesTheOracle/bf16_d64_g4_c16:CudaKvWrites.*'
    for tool in memcheck racecheck; do
      "$san" --tool "$tool" --error-exitcode 3 "$b/bin/chunkattn_kernels_cuda_test" --gtest_filter="$filter" \
        > "$out/sanitizer-$tool.txt" 2>&1 || status=1
      tail -3 "$out/sanitizer-$tool.txt"
    done
    kb="$b/bin/chunkattn-kernel-bench --device cuda --repeat 50 --warmup 5"
    $kb --grid paper --json "$out/cuda-$gpu-paper-fp16.json" || status=1
    $kb --np 4096 --ns 4096 --kv-heads 8 --json "$out/cuda-$gpu-gqa.json" || status=1
    $kb --np 4096 --ns 2048 --dtype bf16 --json "$out/cuda-$gpu-bf16.json" || status=1
    $kb --np 4096 --ns 4096 --head_dim 64 --heads 64 --json "$out/cuda-$gpu-d64.json" || status=1
    for c in 32 128; do
      $kb --np 4096 --ns 4096 --chunk "$c" --impl tpp,seq --json "$out/cuda-$gpu-c$c.json" || status=1
    done
    python3 "$root/bench/torch_baseline.py" --grid paper --json "$out/cuda-$gpu-torch.json" || status=1
    "$b/bin/chunkattn_model_cuda_test" --gtest_output="xml:$out/model-cuda-test.xml" 2>&1 | tail -30 || status=1
    gen="$b/bin/chunkattn-generate --model $root/bench/models/llama2-7b-shape --load_format dummy --device cuda:0
      --random_prompts 32 --prompt_len 1024 --shared_len 768 --max_new_tokens 64 --ignore_eos"
    $gen --temperature 0 > "$out/generate-cuda-greedy.txt" 2>&1 || status=1
    $gen --temperature 0.8 --top_p 0.95 --top_k 50 --repetition_penalty 1.1 > "$out/generate-cuda-sampled.txt" 2>&1 ||
      status=1
    tail -2 "$out/generate-cuda-greedy.txt" "$out/generate-cuda-sampled.txt"
    exit $status
    ;;
  e2e)
    out=${2:?usage: cuda_session.sh e2e OUTDIR on|off [REQUESTS]}
    sharing=${3:?on or off}
    requests=${4:-32}
    b="$root/gpu-bundle"
    # shellcheck disable=SC1091
    source "$b/env.sh"
    export CHUNKATTN_COMMIT
    CHUNKATTN_COMMIT=$(cat "$b/COMMIT")
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/[^a-z0-9-]//g')
    model="$root/bench/models/llama2-7b-shape"
    flag=true
    [ "$sharing" = off ] && flag=false
    "$b/bin/chunkattn-worker" --listen 127.0.0.1:50161 --device cuda:0 --gpu_memory_fraction 0.9 \
      > "$out/worker-$sharing.log" 2>&1 &
    worker=$!
    "$b/bin/chunkattn-coordinator" --listen 127.0.0.1:50151 --workers 127.0.0.1:50161 --model "$model" \
      --load_format dummy --kv_dtype float16 --prefix_sharing="$flag" --max_batch_size 256 \
      --max_tokens_per_step 4096 --metrics_port 0 --join_timeout_s 300 \
      > "$out/coordinator-$sharing.log" 2>&1 &
    coordinator=$!
    trap 'kill $coordinator $worker 2>/dev/null || true' EXIT
    # Ready once the workers joined (7B dummy weights: about a minute).
    for _ in $(seq 300); do
      "$b/bin/chunkattn" health --server 127.0.0.1:50151 >/dev/null 2>&1 && break
      kill -0 $coordinator 2>/dev/null || { tail -20 "$out/coordinator-$sharing.log"; exit 1; }
      sleep 1
    done
    "$b/bin/chunkattn" info --server 127.0.0.1:50151 | tee "$out/info-$sharing.txt"
    status=0
    rows="1024,0,512,1.0 1024,1024,512,1.0 2048,0,512,0.6 2048,2048,512,0.6 4096,0,512,0.4 4096,4096,512,0.4"
    seed=1
    for row in $rows; do
      IFS=, read -r np ns nc rps <<< "$row"
      "$b/bin/chunkattn-loadgen" --server 127.0.0.1:50151 --rate "$rps" --requests "$requests" --np "$np" \
        --ns "$ns" --nc "$nc" --seed "$seed" --timeout_s 600 \
        --json "$out/e2e-$gpu-sharing-$sharing-np$np-ns$ns.json" 2>&1 | tail -4 || status=1
      seed=$((seed + 1))
    done
    exit $status
    ;;
  *)
    echo "usage: cuda_session.sh bundle | run OUTDIR | e2e OUTDIR on|off [REQUESTS]" >&2
    exit 2
    ;;
esac
