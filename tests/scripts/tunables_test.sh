#!/usr/bin/env bash
# scripts/env.sh puts glibc's heap on transparent huge pages (glibc.malloc.hugetlb=1), keeps
# the caller's other tunables, and leaves a hugetlb value the caller set.
set -euo pipefail
env_sh=$1
failed=0
expect() { # caller's GLIBC_TUNABLES (- for unset), expected
  local got show='set -euo pipefail; source "$1"; echo "$GLIBC_TUNABLES"'
  if [ "$1" = - ]; then
    got=$(env -u GLIBC_TUNABLES bash -c "$show" _ "$env_sh")
  else
    got=$(GLIBC_TUNABLES=$1 bash -c "$show" _ "$env_sh")
  fi
  if [ "$got" = "$2" ]; then
    echo "ok: GLIBC_TUNABLES=$1: $got"
  else
    echo "FAILED: GLIBC_TUNABLES=$1: $got, expected $2"
    failed=1
  fi
}
expect - glibc.malloc.hugetlb=1
expect "" glibc.malloc.hugetlb=1
expect glibc.malloc.tcache_count=0 glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1
expect glibc.malloc.hugetlb=0 glibc.malloc.hugetlb=0
expect glibc.malloc.check=1:glibc.malloc.hugetlb=2 glibc.malloc.check=1:glibc.malloc.hugetlb=2
expect glibc.malloc.hugetlbx=1 glibc.malloc.hugetlbx=1:glibc.malloc.hugetlb=1
exit $failed
