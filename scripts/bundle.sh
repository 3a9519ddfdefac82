#!/usr/bin/env bash
# Installs what the container images run into PREFIX (default /opt/chunkattn):
#   bin/    chunkattn-coordinator, chunkattn-worker, chunkattn (client), chunkattn-generate
#   lib/    the SentencePiece module and every shared library the binaries load, except
#           the C/C++ runtime (the runtime image has it) and the GPU driver (injected by
#           the NVIDIA container runtime)
#   models/demo  the built-in demo model
# The images set LD_LIBRARY_PATH=PREFIX/lib, so the runtime stage needs no -dev or
# library packages: only a base image of the same distribution as the build stage.
#   BUILD_DIR  the build to take the binaries from (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
PREFIX=${1:-/opt/chunkattn}
BINARIES=(chunkattn-coordinator chunkattn-worker chunkattn chunkattn-generate)
mkdir -p "$PREFIX/bin" "$PREFIX/lib" "$PREFIX/models"
for b in "${BINARIES[@]}"; do
  install -m 0755 "$BUILD/bin/$b" "$PREFIX/bin/$b"
done
install -m 0644 "$BUILD/lib/libchunkattn_spm.so" "$PREFIX/lib/libchunkattn_spm.so"

# Provided by the runtime image (glibc, libstdc++, libgcc) or by the host (the driver).
is_runtime_lib() {
  case "$1" in
    ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*|libresolv.so*) return 0 ;;
    libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libnvidia-*) return 0 ;;
  esac
  return 1
}

for f in "${BINARIES[@]/#/$PREFIX/bin/}" "$PREFIX/lib/libchunkattn_spm.so"; do
  # ldd lines: "libfoo.so.1 => /usr/lib/.../libfoo.so.1 (0x...)"
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    is_runtime_lib "$name" && continue
    [ -e "$PREFIX/lib/$name" ] || cp -L "$path" "$PREFIX/lib/$name"
  done
done

if [ ! -f "$PREFIX/models/demo/config.json" ]; then
  "$BUILD/bin/chunkattn-make-demo-model" "$PREFIX/models/demo" >/dev/null
fi
echo "bundle: $(ls "$PREFIX/bin" | wc -l) binaries, $(ls "$PREFIX/lib" | wc -l) libraries, demo model in $PREFIX"
