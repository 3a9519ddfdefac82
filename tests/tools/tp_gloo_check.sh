#!/bin/sh
# Tensor parallelism across processes: chunkattn-generate with TP=2 over Gloo
# (two real processes, TCP on 127.0.0.1) must give the logits and tokens of
# TP=1, on a reference model with GQA and llama3 rope scaling.
# usage: tp_gloo_check.sh GENERATE_BIN SOURCE_DIR
set -eu
BIN=$1
SRC=$2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/chunkattn-tp-XXXXXX")
RANK1=
# sh runs the EXIT trap on a signal only through an `exit` in its own trap;
# rank 1 (in its own process group under timeout) is stopped first.
trap 'rm -rf "$WORK"' EXIT
on_signal() {
  # jobs -p: rank 1 too when the signal came between its `&` and `RANK1=$!`.
  # shellcheck disable=SC2046,SC2086
  kill $RANK1 $(jobs -p) 2>/dev/null
  wait
  exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT
trap 'on_signal 129' HUP
/usr/bin/python3 "$SRC/tests/tools/make_reference.py" --out "$WORK/ref" > /dev/null
MODEL="$WORK/ref/llama3_gqa"
IDS=5,17,90,3,44,250,12,7,7,8,100,101,102,33,64,65,66,67,1,2,200,201,9,9,9,45,46,47,48,49,50,51,52,53
set -- --model "$MODEL" --prompt_ids "$IDS" --max_new_tokens 12 --chunk_size 16 --kv_chunks 64 \
  --temperature 0.8 --seed 3
"$BIN" "$@" --logits_out "$WORK/tp1.bin" > "$WORK/tp1.txt"
mkdir "$WORK/store"
timeout 120 "$BIN" "$@" --tp_size 2 --tp_rank 1 --gloo_store "$WORK/store" \
  --logits_out "$WORK/r1.bin" > /dev/null &
RANK1=$!
timeout 120 "$BIN" "$@" --tp_size 2 --tp_rank 0 --gloo_store "$WORK/store" \
  --logits_out "$WORK/r0.bin" > "$WORK/tp2.txt"
wait $RANK1
grep 'tokens:' "$WORK/tp1.txt"
grep 'tokens:' "$WORK/tp2.txt"
[ "$(grep 'tokens:' "$WORK/tp1.txt")" = "$(grep 'tokens:' "$WORK/tp2.txt")" ] || {
  echo "FAIL: TP=2 generated other tokens than TP=1"; exit 1; }
/usr/bin/python3 - "$WORK" <<'PY'
import sys
import numpy as np
work = sys.argv[1]
tp1 = np.fromfile(f"{work}/tp1.bin", dtype=np.float32)
for rank in (0, 1):
    got = np.fromfile(f"{work}/r{rank}.bin", dtype=np.float32)
    assert got.shape == tp1.shape and tp1.size > 0, (got.shape, tp1.shape)
    err = np.abs(got - tp1).max() / np.abs(tp1).max()
    print(f"rank {rank}: {tp1.size} logits, max relative error {err:.2e}")
    assert err < 1e-4, "TP=2 logits differ from TP=1"
r0 = np.fromfile(f"{work}/r0.bin", dtype=np.float32)
r1 = np.fromfile(f"{work}/r1.bin", dtype=np.float32)
assert (r0 == r1).all(), "ranks disagree bit-wise"
print("tp gloo ok")
PY
