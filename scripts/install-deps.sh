#!/usr/bin/env bash
# Installs every build and test dependency from Debian 12 packages. Idempotent:
# does nothing when all packages are already present. Nothing is downloaded at
# build time; CMake only uses what this script installs.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev nlohmann-json3-dev libsentencepiece-dev sentencepiece libgloo-dev python3-numpy
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libcivetweb-dev
  prometheus python3-grpcio python3-grpc-tools python3-prometheus-client
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
