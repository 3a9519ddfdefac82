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
# Results land in $OUT as bench/results/cuda-<gpu>-*.json files.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}

case "$mode" in
  bundle)
    cmake -S "$root" -B "$root/build" -G Ninja -DCHUNKATTN_CUDA=ON >/dev/null
    cmake --build "$root/build" --target chunkattn_kernels_cuda_test chunkattn-kernel-bench -j2
    rm -rf "$root/gpu-bundle"
    "$root/../shared/tools/device-bundle" "$root/gpu-bundle" \
      "$root/build/bin/chunkattn_kernels_cuda_test" "$root/build/bin/chunkattn-kernel-bench"
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
    exit $status
    ;;
  *)
    echo "usage: cuda_session.sh bundle | run OUTDIR" >&2
    exit 2
    ;;
esac
