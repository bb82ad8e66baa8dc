#!/usr/bin/env bash
# A save that cannot write everything raises io_error on every rank and leaves the previous
# checkpoint loadable, for both forms, whether the system reports the failure (`fail`: a
# file-size limit on two ranks, set by crash_writer itself: the same failure as a full disk
# or a quota) or not (`lie`: a write on the last rank returns success and writes nothing,
# which only reading the file back finds).
#
#   full_disk_test.sh CRASH_WRITER MPIEXEC RANKS DIR
set -euo pipefail
writer=$1 mpiexec=$2 ranks=$3 dir=$4
for failure in fail lie; do
  for format in integrated per_rank; do
    rm -rf "$dir"
    mkdir -p "$dir"
    "$mpiexec" -n "$ranks" --oversubscribe "$writer" once "$dir/ckpt" "$format"
    "$mpiexec" -n "$ranks" --oversubscribe "$writer" "$failure" "$dir/ckpt" "$format"
    echo "$failure, $format: the failed save raised everywhere and step 1 still loads"
  done
done
rm -rf "$dir"
echo "full disk test passed"
