#!/bin/sh
# run_fuzzer.sh FUZZER SEEDS ARTIFACTS SECONDS [SEED]: runs FUZZER from the
# SEEDS folder for SECONDS into a temporary corpus (removed afterwards); a
# crash's input lands in ARTIFACTS. SEED fixes libFuzzer's random choices (CI
# passes one, so a run explores the same inputs every time; bench/fuzz.sh
# does not). Exit status: the fuzzer's (0 when nothing found).
set -eu
fuzzer=$1 seeds=$2 artifacts=$3 seconds=$4 seed=${5:-0}
work=$(mktemp -d "${TMPDIR:-/tmp}/chunkattn-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM HUP
mkdir -p "$artifacts" "$work/corpus" "$work/tmp"
export TMPDIR="$work/tmp"  # what the harnesses write goes too
status=0
"$fuzzer" "$work/corpus" "$seeds" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" -seed="$seed" || status=$?
exit $status
