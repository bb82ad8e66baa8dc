#!/usr/bin/env bash
# Installs the Debian packages xshard needs that are missing (as root, via apt-get).
# Idempotent and quiet when everything is already there. With --docs, only those the
# documentation needs (scripts/docs.sh).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libxtensor-dev xtl-dev libxsimd-dev libxtensor-blas-dev libopenblas-dev
  libopenmpi-dev openmpi-bin librange-v3-dev
  nlohmann-json3-dev libcli11-dev libgtest-dev
  libscalapack-openmpi-dev
  zlib1g-dev libdeflate-dev python3-numpy libdnnl-dev
  doxygen python3-sphinx python3-breathe python3-myst-parser furo
)
# The documentation's packages: the last line of the list above.
docs_packages=(doxygen python3-sphinx python3-breathe python3-myst-parser furo)
if [ "${1:-}" = --docs ]; then
  packages=("${docs_packages[@]}")
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
