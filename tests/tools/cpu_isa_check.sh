#!/bin/sh
# The CPU model's kernels on this CPU's best ISA (AVX-512 where it has it)
# give the AVX2 kernels' logits bit for bit, for every weight dtype the CPU
# worker loads and on batches of 1 and 11 decode rows (the kernels' 8-, 2- and
# 1-row tiles), so a sequence's tokens never depend on which CPU served it.
# On a CPU without AVX-512 both runs are AVX2 and the check is trivially met.
# One thread: the kernels' results do not depend on the split (the unit tests
# check that), and the pool's spinning threads would crowd the other tests.
# usage: cpu_isa_check.sh GENERATE_BIN MODEL_DIR
set -eu
BIN=$1
MODEL=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/chunkattn-isa-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
for wd in float32 float16 bfloat16 int8; do
  for prompts in 1 11; do
    set -- --model "$MODEL" --weight_dtype "$wd" --random_prompts "$prompts" --prompt_len 24 \
      --max_new_tokens 6 --threads 1
    "$BIN" "$@" --cpu_isa avx2 --logits_out "$WORK/avx2.bin" > "$WORK/avx2.txt"
    "$BIN" "$@" --cpu_isa best --logits_out "$WORK/best.bin" > "$WORK/best.txt"
    [ -s "$WORK/avx2.bin" ] || { echo "FAIL: no logits written ($wd, $prompts prompts)"; exit 1; }
    cmp -s "$WORK/avx2.bin" "$WORK/best.bin" || {
      echo "FAIL: $wd weights, $prompts prompts: the best ISA's logits differ from AVX2's"; exit 1; }
  done
done
echo "cpu isa ok"
