#!/usr/bin/env bash
# Installs an npm package set that tests use, at the exact versions of its
# package-lock.json (`npm ci`), into a cache folder keyed by its manifests.
#
# Usage: scripts/npm-ci-cached.sh NAME SRC ROOT CHECK
#   NAME   what is installed, for messages
#   SRC    folder holding package.json and package-lock.json
#   ROOT   cache root: installs into ROOT/<key>, key = the first 16 hex digits
#          of the SHA-256 of package.json followed by package-lock.json, so a
#          changed lock installs afresh beside the old one and an unchanged one
#          returns at once
#   CHECK  shell code run in the fresh install before it is kept: it must
#          succeed (it may also trim the install); ROOT/<key>/.installed marks
#          a complete one
# The folder appears only when complete (installed in a temporary folder, then
# renamed), so an interrupted run leaves nothing half-made behind. On success
# the folder's path is the last line of stdout; npm's output goes to stderr.
# Exits non-zero with the reason on stderr when npm or the check fails: the
# tests that need the packages must fail, not skip, without them.
set -euo pipefail
NAME=$1 SRC=$2 ROOT=$3 CHECK=$4

die() { echo "$NAME: $*" >&2; exit 1; }

if [ ! -f "$SRC/package.json" ] || [ ! -f "$SRC/package-lock.json" ]; then
  die "missing $SRC/package.json or package-lock.json"
fi
command -v node >/dev/null || die "node is required (Node.js 18 or newer)"
command -v npm >/dev/null || die "npm is required"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 18 ] || die "Node.js 18 or newer is required, found $(node --version)"

key=$(cat "$SRC/package.json" "$SRC/package-lock.json" | sha256sum | cut -c1-16)
DIR=$ROOT/$key
if [ -f "$DIR/.installed" ]; then
  echo "$DIR"
  exit 0
fi

mkdir -p "$ROOT" || die "cannot create $ROOT"
work=$(mktemp -d "$ROOT/.tmp.XXXXXX") || die "cannot create a temporary folder in $ROOT"
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cp "$SRC/package.json" "$SRC/package-lock.json" "$work/"

echo "$NAME: npm ci into $DIR" >&2
if ! (cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline --loglevel=error 1>&2); then
  die "npm ci failed (is the npm registry reachable?); the tests that need it cannot run"
fi
(cd "$work" && eval "$CHECK") 1>&2 || die "the installed packages failed their check"
date -u +%Y-%m-%dT%H:%M:%SZ >"$work/.installed"
chmod 755 "$work"  # mktemp made it private

# Another run may have finished first; its folder is as good as ours.
if ! mv -T "$work" "$DIR" 2>/dev/null; then
  if [ ! -f "$DIR/.installed" ]; then
    rm -rf "$DIR"
    mv -T "$work" "$DIR" || die "cannot move the install into $DIR"
  fi
fi
echo "$DIR"
