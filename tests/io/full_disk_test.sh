#!/usr/bin/env bash
# A save that cannot write everything (a file-size limit on the last rank, set by crash_writer
# itself: the same failure as a full disk or a quota) raises io_error on every rank and leaves the previous checkpoint
# loadable, for both forms.
#
#   full_disk_test.sh CRASH_WRITER MPIEXEC RANKS DIR
set -euo pipefail
writer=$1 mpiexec=$2 ranks=$3 dir=$4
for format in integrated per_rank; do
  rm -rf "$dir"
  mkdir -p "$dir"
  "$mpiexec" -n "$ranks" --oversubscribe "$writer" once "$dir/ckpt" "$format"
  "$mpiexec" -n "$ranks" --oversubscribe "$writer" fail "$dir/ckpt" "$format"
  echo "$format: the failed save raised everywhere and step 1 still loads"
done
rm -rf "$dir"
echo "full disk test passed"
