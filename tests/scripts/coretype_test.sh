#!/usr/bin/env bash
# scripts/env.sh chooses OpenBLAS's kernels from the CPU's flags: SkylakeX only where every
# AVX-512 extension those kernels use is present, OpenBLAS's own detection elsewhere, and the
# caller's value always. Checked against sample cpuinfo files of four CPUs.
set -euo pipefail
env_sh=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base="fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx lm"
printf 'processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: %s pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2\n' "$base" >"$tmp/zen3"
printf 'processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: %s pni ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl\n' "$base" >"$tmp/skylake"
printf 'processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: %s pni ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512cd\n' "$base" >"$tmp/knights"
printf 'processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n' >"$tmp/arm"

failed=0
expect() { # cpu caller-value expected
  got=$(env -u OPENBLAS_CORETYPE ${2:+OPENBLAS_CORETYPE=$2} XSHARD_CPUINFO="$tmp/$1" \
    bash -c 'set -euo pipefail; source "$1"; echo "${OPENBLAS_CORETYPE:-(detected)}"' _ "$env_sh")
  if [ "$got" = "$3" ]; then
    echo "ok: $1${2:+ with OPENBLAS_CORETYPE=$2}: $got"
  else
    echo "FAILED: $1${2:+ with OPENBLAS_CORETYPE=$2}: $got, expected $3"
    failed=1
  fi
}
expect zen3 "" "(detected)"
expect skylake "" SkylakeX
expect knights "" "(detected)"
expect arm "" "(detected)"
expect zen3 Zen Zen
expect skylake Haswell Haswell
exit $failed
