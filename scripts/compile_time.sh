#!/usr/bin/env bash
# Measures the CPU time (user + system seconds) the compiler spends on each translation unit
# of a configured build tree, one at a time, without ccache: CPU time, unlike wall time, does
# not grow when other work shares the machine.
#
#   scripts/compile_time.sh <build-dir> [regex]
#
# <build-dir> is configured with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON; regex selects source
# files (all of them by default). Prints "seconds source" lines and their sum.
set -euo pipefail
build=${1:?usage: compile_time.sh <build-dir> [regex]}
pattern=${2:-.}
export CCACHE_DISABLE=1
python3 - "$build" "$pattern" <<'PY'
import json, os, re, shlex, subprocess, sys, tempfile
build, pattern = sys.argv[1], sys.argv[2]
total = 0.0
for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
    source = entry["file"]
    if not re.search(pattern, source):
        continue
    args = entry.get("arguments") or shlex.split(entry["command"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    # The object goes to a scratch file: the build tree's stays as it is.
    with tempfile.TemporaryDirectory() as scratch:
        out = args.index("-o")
        args = args[:out + 1] + [os.path.join(scratch, "unit.o")] + args[out + 2:]
        with tempfile.NamedTemporaryFile("r") as times:
            done = subprocess.run(["/usr/bin/time", "-o", times.name, "-f", "%U %S %e"] + args,
                                  cwd=entry["directory"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            user, system, wall = (float(x) for x in times.read().split()[-3:])
    if done.returncode != 0:
        print(f"  failed {os.path.relpath(source)}", flush=True)
        continue
    total += user + system
    print(f"{user + system:8.2f} {os.path.relpath(source)}", flush=True)
print(f"{total:8.2f} total (user + system seconds)")
PY
