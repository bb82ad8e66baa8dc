#!/usr/bin/env bash
# Installs what is missing, builds the library tests, examples and benchmarks (Release
# with assertions, warnings as errors) and runs every test. Exits non-zero on failure.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$root/scripts/install_deps.sh"
build="$root/build/test"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O2" -DXSHARD_WERROR=ON "${launcher[@]}"
cmake --build "$build" -j "$jobs"
cd "$build"
ctest --output-on-failure -j "$jobs" "$@"
