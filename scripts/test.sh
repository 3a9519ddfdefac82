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
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
failed=()
if [ "${CHUNKATTN_SANITIZERS:-1}" != 0 ]; then
  scripts/sanitize.sh asan || failed+=("sanitize asan")
  scripts/sanitize.sh tsan || failed+=("sanitize tsan")
fi
scripts/build.sh
status=0
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure --parallel "$(nproc)" --timeout 900) || status=$?
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: FAILED: ${failed[*]} (see above)" >&2
  exit 1
fi
exit $status
