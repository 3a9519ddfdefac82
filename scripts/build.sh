#!/usr/bin/env bash
# Configures and builds everything into build/ (ninja + ccache). Extra
# arguments go to CMake, e.g. -DCHUNKATTN_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Cache objects without the build folder's path in their key (ccache's
# hash_dir, which -g otherwise turns on): the kernels_build_alone test then
# finds this build's kernel objects for its own folder (tests/CMakeLists.txt).
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@"
fi
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
