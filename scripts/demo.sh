#!/usr/bin/env bash
# Installs what is missing, builds, and runs the flagship example on 4 ranks: train_mlp, an
# MLP classifier trained on a 2 x 2 mesh (data x tensor parallel). Arguments go to it.
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$root/scripts/install_deps.sh"
build="$root/build/demo"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DXSHARD_BUILD_TESTS=OFF -DXSHARD_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target train_mlp
mpirun -n 4 --oversubscribe "$build/examples/train_mlp" "$@"
