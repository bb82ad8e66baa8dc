# Sourced by the scripts: the build settings and the environment Open MPI and OpenBLAS
# need on these machines (root, 2 cores, a CPU Debian's OpenBLAS misdetects).
# The parallel jobs: the cores, counted before OMP_NUM_THREADS=1 below (nproc obeys
# OMP_NUM_THREADS and OMP_THREAD_LIMIT, and would build and test one job at a time).
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
launcher=()
# ccache is optional (install_deps.sh installs it, but env.sh is sourced before that runs):
# an if, not `&&`, so that a missing ccache is not the exit status of `source`.
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
