#!/usr/bin/env bash
# Installs what is missing, builds, writes the built-in demo model (a small
# Llama with a SentencePiece tokenizer, in the Hugging Face layout) and runs
# the shipped prompts through it: eight questions behind one system prompt,
# whose KV chunks they share. Arguments go to chunkattn-generate (--help).
set -euo pipefail
cd "$(dirname "$0")/.."
CHUNKATTN_DEPS=demo scripts/install-deps.sh
scripts/build.sh
BUILD=${BUILD_DIR:-build}
if [ ! -f "$BUILD/demo-model/config.json" ]; then
  "$BUILD/bin/chunkattn-make-demo-model" "$BUILD/demo-model"
fi
exec "$BUILD/bin/chunkattn-generate" --model "$BUILD/demo-model" \
  --system_prompt "$(cat data/demo/system_prompt.txt)" --prompts_file data/demo/prompts.txt \
  --max_new_tokens 32 --temperature 0.8 --top_p 0.95 --seed 1 "$@"
