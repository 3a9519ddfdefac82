#!/usr/bin/env bash
# The differential text tests on their full corpora: every tokenizer.json
# tokenizer on 20,000 seeded strings (about 3 MB of prose each), 2,000 with
# add_special_tokens where the template adds nothing, and every chat template
# on 2,500 conversations plus the probe template (tests/text/). CI runs a
# slice of the same corpora (tests/CMakeLists.txt); this is the whole run, to
# repeat after changing text/ (100-200 s for the tokenizers and about 25 s
# for the templates on 2 cores). Needs build/bin/chunkattn-hf-encode and
# chunkattn-chat-render, and the reference (scripts/install-hf-reference.sh).
#
#   bench/text_differential.sh [--build DIR] [--seed N]
# Exit status: 1 when either differs from the reference.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build seed=22
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "bench/text_differential.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
status=0
for t in test_hf_tokenizers test_chat_templates; do
  start=$SECONDS
  /usr/bin/python3 -B "tests/text/$t.py" --build "$build" --source . --seed "$seed" || status=1
  echo "bench/text_differential.sh: $t took $((SECONDS - start)) s" >&2
done
exit $status
