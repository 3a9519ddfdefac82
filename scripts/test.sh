#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (ctest prints the
# summary). The README's second command; .ci/run runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --parallel "$(nproc)" --timeout 900
