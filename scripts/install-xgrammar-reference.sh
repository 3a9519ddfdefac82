#!/usr/bin/env bash
# Installs the reference side of the differential grammar test
# (tests/text/test_xgrammar_differential.py): XGrammar, the structured-output
# engine of vLLM and SGLang, as its WebAssembly build @mlc-ai/web-xgrammar, at
# the exact version of tests/text/xgrammar_reference/package-lock.json
# (scripts/npm-ci-cached.sh).
#
# Usage: scripts/install-xgrammar-reference.sh [DEST]
#   DEST  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/xgrammar-reference)
# The install's folder is the last line of stdout (ref.mjs computes the same
# key to find the default install: keep in step with npm-ci-cached.sh).
#
# The check compiles a JSON Schema through ref.mjs: the package's CommonJS
# bundle and inlined wasm must load in this Node.js.
set -euo pipefail
cd "$(dirname "$0")/.."
REF_MJS=$PWD/tests/text/xgrammar_reference/ref.mjs
CHECK='out=$(echo "{\"kind\":\"json_schema\",\"grammar\":{\"type\":\"integer\"},\"strings\":[\"12\",\"x\"]}" |
  node "'"$REF_MJS"'" --reference "$PWD")
case "$out" in
  *"\"results\":[{\"prefix\":true,\"complete\":true"*"{\"prefix\":false"*) ;;
  *) echo "ref.mjs answered: ${out:-nothing}"; exit 1 ;;
esac'
exec scripts/npm-ci-cached.sh install-xgrammar-reference "$PWD/tests/text/xgrammar_reference" \
  "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/xgrammar-reference}" "$CHECK"
