#!/usr/bin/env bash
# Installs what is missing, builds the library tests, examples and benchmarks (Release
# with assertions, warnings as errors) and runs every test. Exits non-zero on failure.
#
#   scripts/test.sh [ctest arguments...]              the suite, in build/test
#   scripts/test.sh --sanitize [ctest arguments...]   the suite under AddressSanitizer and
#                                                     UndefinedBehaviorSanitizer, in
#                                                     build/sanitize (no benchmarks, no
#                                                     header-by-header compilation)
#   scripts/test.sh --sanitize --targets "T..." [ctest arguments...]
#                                                     the same, building only targets T (pass
#                                                     ctest a -R or -L that selects their tests)
#
# XSHARD_JOBS=N sets the parallel compilations and tests (default: the number of cores). The
# whole suite under the sanitizers wants XSHARD_JOBS=1 on a machine of less than 16 GiB: an
# object compiles in up to 4.5 GiB there, and io.large (run serially) needs 5 GiB.
set -euo pipefail
source "$(dirname "$0")/env.sh"
jobs=${XSHARD_JOBS:-$jobs}
# The host, for whoever reads a failure: the CPU, its vector extensions, the kernels chosen.
cpu_model=$(grep -m 1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//' || true)
cpu_vector=$(grep -m 1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' |
  grep -E '^(sse4_2|avx|avx2|fma|avx512[a-z]*)$' | paste -sd ' ' || true)
# The kernel's transparent huge pages (always, madvise or never) and what glibc is told.
thp=$(sed -n 's/.*\[\(.*\)\].*/\1/p' /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || true)
echo "test.sh: ${cpu_model:-unknown CPU}, $jobs jobs; vector extensions: ${cpu_vector:-none listed};" \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(OpenBLAS detects)};" \
  "transparent huge pages: ${thp:-unknown}, GLIBC_TUNABLES=${GLIBC_TUNABLES:-(unset)}"
sanitize=false
targets=()
if [ "${1:-}" = --sanitize ]; then
  sanitize=true
  shift
  if [ "${1:-}" = --targets ]; then
    read -r -a targets <<<"${2:?--targets needs a list of targets}"
    shift 2
  fi
fi
xshard_phase "install dependencies" "$root/scripts/install_deps.sh"
if ! $sanitize; then
  build="$root/build/test"
  xshard_phase configure cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="-O2" -DXSHARD_WERROR=ON "${launcher[@]}"
  xshard_phase build cmake --build "$build" -j "$jobs"
  cd "$build"
  xshard_phase test ctest --output-on-failure -j "$jobs" "$@"
  exit
fi

# Sanitizers: assertions on (no NDEBUG), every undefined behaviour fatal, tests given three
# times their usual time. Leak detection is off: Open MPI leaks its own allocations at exit
# from components it has unloaded by then, so no suppression list can name them.
# GCC 12 cannot evaluate `&x != nullptr` in a constant expression under the null and
# nonnull-attribute checks (xshard's static layouts are compared so); AddressSanitizer
# reports null dereferences anyway. Under the sanitizers GCC also warns falsely that
# std::regex and std::function members may be used uninitialized.
build="$root/build/sanitize"
san="-fsanitize=address,undefined -fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute"
san="$san -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
xshard_phase "sanitize configure" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize \
  -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g $san -Wno-maybe-uninitialized" \
  -DCMAKE_EXE_LINKER_FLAGS_SANITIZE="$san" \
  -DXSHARD_WERROR=ON -DXSHARD_BUILD_BENCHMARKS=OFF -DXSHARD_HEADER_CHECK=OFF -DXSHARD_TEST_TIMEOUT_SCALE=3 \
  "${launcher[@]}"
xshard_phase "sanitize build" cmake --build "$build" -j "$jobs" ${targets[@]+--target "${targets[@]}"}
export ASAN_OPTIONS="detect_leaks=0:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cd "$build"
# The package consumers and compile-fail checks build other programs, not xshard's code
# under the sanitizers: the normal run covers them.
xshard_phase "sanitize test" ctest --output-on-failure -j "$jobs" -LE 'package|compile_fail' "$@"
