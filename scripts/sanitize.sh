#!/usr/bin/env bash
# Builds with clang under a sanitizer (CUDA off, its own build folder) and
# runs the tests that mode covers. Any sanitizer report fails the run. Each
# mode builds only what its tests need (the unit_tests and tsan_tests targets
# of CMakeLists.txt, the fuzzers), with line tables for debug information
# (CHUNKATTN_DEBUG_INFO, cmake/Common.cmake). A folder it creates gets unity
# batches when the environment says CHUNKATTN_UNITY=ON (scripts/test.sh does).
#
#   scripts/sanitize.sh asan   ASan + UBSan: every GoogleTest binary (label
#                              "unit"), then each libFuzzer harness in tests/fuzz/
#                              for CHUNKATTN_FUZZ_SECONDS (a CMake setting,
#                              default 3) from its seed corpus (label
#                              "fuzz"). bench/fuzz.sh fuzzes longer.
#   scripts/sanitize.sh tsan   TSan: the GoogleTest binaries with threads
#                              (label "unit_tsan": the CPU thread pool and
#                              kernels, collectives, the metrics HTTP
#                              server, the text pool, the coordinator's
#                              engine on in-process workers). Not the gRPC
#                              layer: Debian's gRPC is not instrumented
#                              and its completion-queue handoffs read as
#                              races (docs/testing.md).
#
#   scripts/sanitize.sh MODE [--build-only | --test-only] [ctest arguments]
# --build-only stops after the build, --test-only runs the tests of a folder
# built before (scripts/test.sh times the two apart). Other arguments go to
# ctest (e.g. -R fuzz_plan). Here each GoogleTest binary is one ctest test
# (cmake/Common.cmake): -R chunkattn_http_test, or run the binary itself with
# --gtest_filter for one TEST.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
steps=all
case "${1:-}" in
  --build-only) steps=build; shift ;;
  --test-only) steps=test; shift ;;
esac
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
case "$mode" in
  asan)
    dir=build-asan
    cmake_flags=(-DCHUNKATTN_SANITIZE=address,undefined -DCHUNKATTN_FUZZ=ON)
    targets=(unit_tests fuzzers)
    labels="unit|fuzz"
    # LeakSanitizer is on: a test that leaks fails.
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    ;;
  tsan)
    dir=build-tsan
    cmake_flags=(-DCHUNKATTN_SANITIZE=thread)
    targets=(tsan_tests)
    labels="unit_tsan"
    export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp}
    ;;
  *)
    echo "usage: scripts/sanitize.sh asan|tsan [--build-only|--test-only] [ctest arguments]" >&2
    exit 2
    ;;
esac
if [ "$steps" != test ]; then
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
      -DCHUNKATTN_CUDA=OFF -DCHUNKATTN_UNITY="${CHUNKATTN_UNITY:-OFF}" "${cmake_flags[@]}"
  fi
  cmake --build "$dir" --parallel "$(nproc)" --target "${targets[@]}"
fi
[ "$steps" != build ] || exit 0
if [ "$mode" = tsan ]; then
  # Makes our absl::Mutex calls visible to TSan (base/tsan_absl.cc).
  export LD_PRELOAD="$PWD/$dir/lib/libchunkattn_tsan_absl.so"
fi
scripts/seed-ctest-costs.sh "$dir" "$mode"
cd "$dir"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900 -L "$labels" "$@"
