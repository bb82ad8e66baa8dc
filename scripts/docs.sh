#!/usr/bin/env bash
# Builds the documentation site into build/docs/html (open build/docs/html/index.html):
# Doxygen reads the headers' /// comments into XML, Sphinx renders the pages of docs/ and,
# through Breathe, the API reference. A warning of either fails the build (a broken
# reference, an unknown name, a malformed comment); every page is read again each time (-E),
# so that a reference broken by a change elsewhere fails too.
#
#   scripts/docs.sh                      # installs what is missing, then builds
#   scripts/docs.sh --no-install [DIR]   # builds into DIR (ctest's docs.build does this)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
install=yes
if [ "${1:-}" = --no-install ]; then
  install=no
  shift
fi
out=${1:-$root/build/docs}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ "$install" = yes ]; then "$root/scripts/install_deps.sh" --docs; fi
# Debian's Python: its sphinx, breathe, myst-parser and furo (a python3 earlier on PATH may
# be another one).
python=/usr/bin/python3
[ -x "$python" ] || python=python3

start=$(date +%s)
rm -rf "$out/xml"
XSHARD_SOURCE_DIR=$root XSHARD_DOXYGEN_OUTPUT=$out doxygen "$root/docs/Doxyfile"
echo "doxygen: $(( $(date +%s) - start )) s"
XSHARD_DOXYGEN_XML=$out/xml "$python" -m sphinx -E -W --keep-going -q -b html \
  -d "$out/doctrees" "$root/docs" "$out/html"
echo "documentation: $out/html/index.html ($(( $(date +%s) - start )) s)"
