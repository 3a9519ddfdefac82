#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on its built-in
# default: a shared-system-prompt workload replayed through the prefix-aware KV
# cache. Arguments go to chunkattn-cache-replay (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec "${BUILD_DIR:-build}/bin/chunkattn-cache-replay" "$@"
