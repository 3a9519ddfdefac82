#!/usr/bin/env bash
# Installs the official OpenAI SDK for Node.js (npm package `openai`) at the
# exact version of tests/services/openai_sdk/package-lock.json, for the HTTP
# front's tests (tests/services/test_openai.py): a client no one here wrote.
#
# Usage: scripts/install-openai-sdk.sh [DEST]
#   DEST  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/openai-sdk)
# The install's folder is the last line of stdout (scripts/npm-ci-cached.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
exec scripts/npm-ci-cached.sh install-openai-sdk "$PWD/tests/services/openai_sdk" \
  "${1:-${XDG_CACHE_HOME:-$HOME/.cache}/chunkattn/openai-sdk}" \
  'node -e "const OpenAI = require(\"openai\"); if (typeof OpenAI !== \"function\") throw new Error(\"no OpenAI export\")"'
