#!/usr/bin/env bash
# Gives a build folder without ctest timing history (a clean clone: CI) the
# committed one, tests/ctest-costs/NAME.txt, so ctest starts the longest
# tests first rather than in file order: on 2 cores a 50 s test started last
# is 50 s of one idle core at the end. Written from CI's configuration (the
# tests of 3 s or more; the rest start after them, shortest last is fine). A
# folder with its own history keeps it.
#
#   scripts/seed-ctest-costs.sh BUILD_DIR main|asan
set -euo pipefail
dir=$1 name=$2
src="$(dirname "$0")/../tests/ctest-costs/$name.txt"
dst="$dir/Testing/Temporary/CTestCostData.txt"
[ -f "$src" ] && [ ! -f "$dst" ] || exit 0
mkdir -p "$(dirname "$dst")"
cp "$src" "$dst"
