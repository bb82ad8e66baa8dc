#!/usr/bin/env bash
# Installs what is missing, builds, and runs the flagship example on 4 ranks.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$root/scripts/install_deps.sh"
build="$root/build/demo"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DXSHARD_BUILD_TESTS=OFF -DXSHARD_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target visualize_sharding
mpirun -n 4 --oversubscribe "$build/examples/visualize_sharding"
