# Sourced by the scripts: the build settings and the environment Open MPI and OpenBLAS
# need on these machines (root, few cores, any x86-64 CPU).
# The parallel jobs: the cores, counted before OMP_NUM_THREADS=1 below (nproc obeys
# OMP_NUM_THREADS and OMP_THREAD_LIMIT, and would build and test one job at a time).
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1
# OpenBLAS detects the CPU and picks its kernels. Debian's OpenBLAS (0.3.21) does not know
# some recent AVX-512 models and falls back to older kernels (Prescott, SSE3, on some Xeon
# guests; Haswell, AVX2, on Zen 5). Where /proc/cpuinfo shows every AVX-512 extension the
# SkylakeX kernels use, those are chosen; any other CPU keeps OpenBLAS's own choice, and a
# value set by the caller always wins. Forcing kernels a CPU cannot run kills every BLAS
# call with SIGILL.
# XSHARD_CPUINFO names another cpuinfo file (the scripts' tests use it).
cpuinfo=${XSHARD_CPUINFO:-/proc/cpuinfo}
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r "$cpuinfo" ]; then
  cpu_flags=" $(grep -m 1 '^flags' "$cpuinfo" | cut -d: -f2 || true) "
  avx512=yes
  for f in avx512f avx512cd avx512bw avx512dq avx512vl; do
    case "$cpu_flags" in *" $f "*) ;; *) avx512=no ;; esac
  done
  if [ "$avx512" = yes ]; then export OPENBLAS_CORETYPE=SkylakeX; fi
  unset cpu_flags avx512 f
fi
unset cpuinfo
# The heap on transparent huge pages: glibc 2.35 and later ask the kernel for them for the
# memory malloc takes (glibc.malloc.hugetlb=1), where the kernel gives them only to memory
# that asks ("madvise" in /sys/kernel/mm/transparent_hugepage/enabled). Steps that stream
# through memory run faster (docs/developer/performance.md, "The heap"); an older glibc
# ignores the tunable, and a hugetlb value set by the caller wins.
case ":${GLIBC_TUNABLES:-}:" in
  *:glibc.malloc.hugetlb=*) ;;
  *) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
launcher=()
# ccache is optional (install_deps.sh installs it, but env.sh is sourced before that runs):
# an if, not `&&`, so that a missing ccache is not the exit status of `source`.
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# xshard_phase NAME COMMAND...: runs COMMAND and prints the wall-clock time it took ("phase
# NAME: 812 s (13:32)"), so that a log shows where a run's time goes. With XSHARD_PHASE_LOG
# set, the line is also appended to that file (.ci/run prints them together at the end).
# Returns COMMAND's status.
xshard_phase() {
  local name=$1 start=$SECONDS status=0 took line
  shift
  "$@" || status=$?
  took=$((SECONDS - start))
  line=$(printf 'phase %s: %d s (%d:%02d)%s' "$name" "$took" $((took / 60)) $((took % 60)) \
    "$([ "$status" -eq 0 ] || echo ", failed: status $status")")
  echo "$line"
  if [ -n "${XSHARD_PHASE_LOG:-}" ]; then echo "$line" >>"$XSHARD_PHASE_LOG"; fi
  return "$status"
}
