#!/usr/bin/env bash
# Installs the peer of bench/peer/peer_bench.py: llama.cpp's prebuilt CPU
# library through the npm package node-llama-cpp, at the exact versions of
# bench/peer/package-lock.json (node-llama-cpp 3.21.1 and its prebuilt
# @node-llama-cpp/linux-x64 binary; scripts/npm-ci-cached.sh).
#
# Usage: scripts/install-llama-cpp-peer.sh [DEST]
#   DEST  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/llama-cpp-peer)
# The install's folder is the last line of stdout (llama_cpp_run.mjs is run
# with --peer that folder).
#
# Nothing is downloaded or compiled after npm: install scripts are off
# (npm-ci-cached.sh), the other prebuilt variants (CUDA, Vulkan, other
# platforms: optional dependencies) are left out, and the check loads the
# CPU binary with builds and downloads forbidden. It fails, loudly, unless
# that binary loads in this Node.js on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_MJS=$PWD/bench/peer/llama_cpp_run.mjs
export npm_config_omit=optional
export NODE_LLAMA_CPP_SKIP_DOWNLOAD=true
CHECK='out=$(node "'"$RUN_MJS"'" --peer "$PWD" --check) || { echo "the prebuilt llama.cpp binary did not load"; exit 1; }
echo "$out"
case "$out" in
  *"\"loaded\":true"*) ;;
  *) echo "llama_cpp_run.mjs --check answered: ${out:-nothing}"; exit 1 ;;
esac'
exec scripts/npm-ci-cached.sh install-llama-cpp-peer "$PWD/bench/peer" \
  "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/llama-cpp-peer}" "$CHECK"
