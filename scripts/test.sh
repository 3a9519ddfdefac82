#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest prints the
# summary). The README's second command; .ci/run runs exactly this.
#
# First the sanitizer builds (scripts/sanitize.sh: ASan + UBSan on the unit
# tests and the fuzzers for a bounded time, TSan on the threaded unit
# tests), each in its own clang build folder, then
# the main build and every test; the main ctest's summary comes last. Any
# failure fails the run, after the rest has run. CHUNKATTN_SANITIZERS=0
# skips the sanitizer builds (a quick local run).
#
# Each phase is timed, and a table of the phases' seconds is printed at the
# end, also when one failed (then the ctest summary line is repeated under
# it). A main build folder this script configures itself (a clean clone, as
# in CI) gets clang 14 for C++ (it compiles our heaviest files 35% faster
# than gcc 12; nvcc keeps gcc as its host compiler, and gcc stays the
# default of scripts/build.sh: the quickstart's and a developer's build),
# one CUDA architecture, sm_90a (the GPU sessions' Hopper; the default
# builds sm_80 too), line tables for debug information
# (CHUNKATTN_DEBUG_INFO), unity batches (CHUNKATTN_UNITY), -O0 but for the
# libraries the tests run hot (CHUNKATTN_OPTIMIZE=hot; all three in
# cmake/Common.cmake), and, when the sanitizer builds ran the unit tests, of
# those only the CUDA ones (CHUNKATTN_SANITIZED_UNIT_TESTS, same file): what
# a CI run needs, in less time. The sanitizer folders it creates get unity
# batches too. An existing folder keeps its settings.
set -euo pipefail
cd "$(dirname "$0")/.."
export BUILD_DIR=${BUILD_DIR:-build}
phases=()   # "name seconds result"
summary=""  # the main ctest's summary line

# phase NAME COMMAND...: runs COMMAND, records its seconds and result.
phase() {
  local name=$1 start=$SECONDS status=0
  shift
  echo "test.sh: --- $name" >&2
  "$@" || status=$?
  phases+=("$name $((SECONDS - start)) $([ $status = 0 ] && echo ok || echo "failed($status)")")
  return $status
}

report() {
  local total=0 row name seconds result
  echo
  echo "test.sh: phase times"
  printf '  %-12s %8s  %s\n' phase seconds result
  for row in "${phases[@]}"; do
    read -r name seconds result <<<"$row"
    printf '  %-12s %8d  %s\n' "${name/_/ }" "$seconds" "$result"
    total=$((total + seconds))
  done
  printf '  %-12s %8d  (%d min %02d s)\n' total "$total" $((total / 60)) $((total % 60))
  [ -z "$summary" ] || echo "$summary"
}
trap report EXIT

phase deps scripts/install-deps.sh
failed=()
if [ "${CHUNKATTN_SANITIZERS:-1}" != 0 ]; then
  export CHUNKATTN_UNITY=${CHUNKATTN_UNITY:-ON}  # for the folders sanitize.sh creates
  for mode in asan tsan; do
    if phase "${mode}_build" scripts/sanitize.sh "$mode" --build-only; then
      phase "${mode}_tests" scripts/sanitize.sh "$mode" --test-only || failed+=("sanitize $mode")
    else
      failed+=("sanitize $mode (build)")
    fi
  done
fi
configure=()
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  configure=(-DCHUNKATTN_CUDA_ARCHITECTURES=90a -DCHUNKATTN_DEBUG_INFO=lines -DCHUNKATTN_UNITY=ON
    -DCHUNKATTN_OPTIMIZE=hot -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14)
  # The unit tests ran under the sanitizers: here only the CUDA ones.
  [ "${CHUNKATTN_SANITIZERS:-1}" = 0 ] || configure+=(-DCHUNKATTN_SANITIZED_UNIT_TESTS=OFF)
fi
phase main_build scripts/build.sh "${configure[@]}"
status=0
log=$(mktemp "${TMPDIR:-/tmp}/chunkattn-ctest-XXXXXX")
# Two tests per core: the end-to-end tests spend much of their time waiting
# (a cluster's start, a drain's grace, a probe's period), and at one per core
# the 2-core CI run used 1.5 of its cores here. The load-driving tests still
# run one at a time (RESOURCE_LOCK load, tests/services/CMakeLists.txt).
run_main_tests() {
  scripts/seed-ctest-costs.sh "$BUILD_DIR" main
  (cd "$BUILD_DIR" && ctest --output-on-failure --parallel "$((2 * $(nproc)))" --timeout 900) 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}
phase main_tests run_main_tests || status=$?
summary=$(grep -E '^[0-9]+% tests passed' "$log" | tail -n 1 || true)
rm -f "$log"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: FAILED: ${failed[*]} (see above)" >&2
  exit 1
fi
exit $status
