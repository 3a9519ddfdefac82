#!/usr/bin/env bash
# Runs every libFuzzer harness in tests/fuzz/ for SECONDS each (default 300) from
# its committed seeds, in the ASan + UBSan build (scripts/sanitize.sh asan
# builds it), and reports per harness: executions, executions per second,
# edges covered (libFuzzer's "cov") out of the binary's instrumented ones,
# features, the corpus it grew, and any crash (its input is kept under
# build-asan/fuzz-artifacts/NAME/). Prints a table; --json PATH writes the
# figures with the machine, the commit and the command.
#
#   bench/fuzz.sh [--seconds N] [--json PATH] [NAME ...]
# Exit status: 1 when any harness crashed.
set -euo pipefail
cd "$(dirname "$0")/.."
command_line="bench/fuzz.sh $*"
seconds=300 json="" names=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -*) echo "bench/fuzz.sh: unknown flag $1" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
case "$seconds" in ''|*[!0-9]*) echo "bench/fuzz.sh: --seconds must be a whole number" >&2; exit 2 ;; esac
dir=build-asan
if [ ! -f "$dir/build.ninja" ]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCHUNKATTN_CUDA=OFF -DCHUNKATTN_SANITIZE=address,undefined -DCHUNKATTN_FUZZ=ON >/dev/null
fi
cmake --build "$dir" --target fuzzers >/dev/null
if [ ${#names[@]} -eq 0 ]; then
  for f in "$dir"/bin/chunkattn-fuzz-*; do
    n=${f##*/chunkattn-fuzz-}
    [ "$n" = seeds ] || names+=("$n")
  done
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/chunkattn-fuzzbench-XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM HUP
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
for n in "${names[@]}"; do
  echo "fuzzing $n for ${seconds}s ..." >&2
  status=0
  sh tests/fuzz/run_fuzzer.sh "$dir/bin/chunkattn-fuzz-$n" "tests/fuzz/corpus/$n" "$dir/fuzz-artifacts/$n" "$seconds" \
    >"$work/$n.log" 2>&1 || status=$?
  echo "$status" >"$work/$n.status"
done
/usr/bin/python3 - "$work" "$seconds" "$json" "$command_line" "${names[@]}" <<'PY'
import json, os, re, sys
sys.path.insert(0, 'bench')
from run_info import machine_info
work, seconds, out, command, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
rows = []
for n in names:
    log = open(os.path.join(work, n + '.log'), errors='replace').read()
    status = int(open(os.path.join(work, n + '.status')).read())
    def stat(key):
        m = re.search(r'^stat::%s:\s+(\d+)' % key, log, re.M)
        return int(m.group(1)) if m else 0
    pcs = re.search(r'Loaded \d+ PC tables \((\d+) PCs\)', log)
    last = re.findall(r'cov: (\d+) ft: (\d+) corp: (\d+)/', log)
    cov, ft, corp = (int(x) for x in last[-1]) if last else (0, 0, 0)
    crash = re.search(r'^(SUMMARY: .*|.*_fuzz: .*)$', log, re.M)
    rows.append(dict(harness=n, seconds=seconds, executions=stat('number_of_executed_units'),
                     execs_per_s=stat('average_exec_per_sec'), edges_covered=cov,
                     edges_instrumented=int(pcs.group(1)) if pcs else 0, features=ft, corpus=corp,
                     new_units=stat('new_units_added'), peak_rss_mb=stat('peak_rss_mb'),
                     crashed=status != 0, crash=crash.group(1) if crash and status != 0 else ''))
print('%-18s %12s %9s %15s %9s %7s  %s' % ('harness', 'executions', 'exec/s', 'edges (of)', 'features', 'corpus', 'result'))
for r in rows:
    share = '%d (%d)' % (r['edges_covered'], r['edges_instrumented'])
    print('%-18s %12d %9d %15s %9d %7d  %s' % (r['harness'], r['executions'], r['execs_per_s'], share, r['features'],
                                              r['corpus'], 'CRASH: ' + r['crash'] if r['crashed'] else 'ok'))
if out:
    doc = dict(machine_info('.', command), benchmark='fuzz', build='clang-14, ASan + UBSan, libFuzzer',
               harnesses=rows)
    with open(out, 'w') as f:
        json.dump(doc, f, indent=1)
    print('wrote', out)
sys.exit(1 if any(r['crashed'] for r in rows) else 0)
PY
