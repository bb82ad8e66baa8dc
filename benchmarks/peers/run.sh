#!/bin/bash
# xshard's training steps and PyTorch's, side by side, in one run.
#
#   benchmarks/peers/run.sh BUILD_DIR [RANKS...]      (ranks: 1 2 unless given)
#
# For each rank count, runs bench_convnet's and bench_training's data-parallel cases and
# torch_steps.py's same steps under mpirun, then prints side_by_side.py's ratio lines
# (xshard / PyTorch) after every program's own lines. PyTorch is Debian's python3-torch and
# python3-torchvision (or any Python with torch and torchvision: PYTHON=...): installed here
# when missing and run as root, else the script says what to install. The library never
# depends on them.
#
# More ranks than cores need MPIRUN_ARGS=--oversubscribe (figures then mean little); run
# where ranks are cores, with one thread per rank (OPENBLAS_NUM_THREADS=1 is set here).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run.sh BUILD_DIR [RANKS...]}
shift
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(1 2)

# The first Python that has PyTorch: $PYTHON, python3 on PATH, Debian's /usr/bin/python3.
has_torch() { "$1" -c 'import torch, torchvision' 2>/dev/null; }
python=
for candidate in ${PYTHON:-} python3 /usr/bin/python3; do
  if has_torch "$candidate"; then python=$candidate; break; fi
done
if [ -z "$python" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-torchvision
    python=/usr/bin/python3
  else
    echo "run.sh: PyTorch is missing; install Debian's python3-torch and python3-torchvision" >&2
    exit 1
  fi
fi
for b in bench_convnet bench_training; do
  if [ ! -x "$build/benchmarks/$b" ]; then
    echo "run.sh: build $b first ($build/benchmarks/$b)" >&2
    exit 1
  fi
done

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
read -r -a extra <<< "${MPIRUN_ARGS:-}"
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for p in "${ranks[@]}"; do
  launch=(mpirun -n "$p" "${extra[@]}")
  "${launch[@]}" "$build/benchmarks/bench_convnet" --filter "resnet18_step_dp${p}_f32\$" |
    tee -a "$lines"
  for type in f64 f32; do
    for model in mlp transformer; do
      # the transformer's 8 sequences split whole over the ranks
      [ "$model" = mlp ] || [ $((8 % p)) -eq 0 ] || continue
      "${launch[@]}" "$build/benchmarks/bench_training" --filter "${model}_step_dp${p}_${type}\$" |
        tee -a "$lines"
    done
  done
  "${launch[@]}" "$python" "$here/torch_steps.py" | tee -a "$lines"
done
"$python" "$here/side_by_side.py" "$lines"
