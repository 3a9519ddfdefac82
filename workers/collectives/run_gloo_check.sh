#!/bin/sh
# Runs WORLD ranks of chunkattn-gloo-check as separate processes on 127.0.0.1
# with a fresh FileStore directory; fails if any rank fails or all have not
# finished within 60 s.
#   run_gloo_check.sh BINARY WORLD
set -u
bin=$1
world=$2
store=$(mktemp -d "${TMPDIR:-/tmp}/chunkattn-gloo.XXXXXX") || exit 1
pids=""
# sh runs the EXIT trap on a signal only through an `exit` in its own trap;
# the ranks (each in its own process group under timeout) are stopped first.
trap 'rm -rf "$store"' EXIT
on_signal() {
  # A signal between a rank's `&` and the `pids=` after it leaves that rank
  # out of $pids: jobs -p lists every rank started so far.
  # shellcheck disable=SC2046,SC2086
  kill $pids $(jobs -p) 2>/dev/null
  wait
  exit "$1"
}
trap 'on_signal 143' TERM
trap 'on_signal 130' INT
trap 'on_signal 129' HUP
r=0
while [ "$r" -lt "$world" ]; do
  timeout -k 5 60 "$bin" --rank "$r" --world "$world" --store "$store" --timeout_s 20 &
  pids="$pids $!"
  r=$((r + 1))
done
rc=0
for p in $pids; do
  wait "$p" || rc=1
done
exit $rc
