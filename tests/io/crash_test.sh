#!/usr/bin/env bash
# Crash safety: checkpoint saves killed with SIGKILL at random moments must leave the previous
# checkpoint loadable, checksummed, and holding one complete step.
#
#   crash_test.sh CRASH_WRITER MPIEXEC RANKS DIR [ROUNDS]
set -euo pipefail
writer=$1 mpiexec=$2 ranks=$3 dir=$4 rounds=${5:-6}
run() { "$mpiexec" -n "$ranks" --oversubscribe "$writer" "$@"; }

for format in integrated per_rank; do
  rm -rf "$dir"
  mkdir -p "$dir"
  run once "$dir/ckpt" "$format"
  for round in $(seq "$rounds"); do
    run loop "$dir/ckpt" "$format" &
    launcher=$!
    sleep "0.$((RANDOM % 9 + 1))$((RANDOM % 10))"
    pkill -KILL -f "$writer loop $dir/ckpt" || true
    wait "$launcher" 2>/dev/null || true
    left=$(cd "$dir" && ls -d ckpt.* 2>/dev/null | tr '\n' ' ' || true)
    echo "$format round $round: killed (left behind: ${left:-nothing})"
    run verify "$dir/ckpt" "$format"
  done
done
rm -rf "$dir"
echo "crash test passed"
