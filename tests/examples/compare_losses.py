"""Runs a training example on several meshes and checks that they print the same losses.

Usage: compare_losses.py MPIEXEC PROGRAM "RANKS ARGS..." "RANKS ARGS..." ... [-- EXTRA ARGS]

Every line containing "loss <number>" is a loss; the first configuration is the reference,
and every other one must print as many losses, each within 1e-9 relative of it.
"""

import re
import subprocess
import sys


def losses(mpiexec, program, config, extra):
    ranks, *args = config.split()
    command = [mpiexec, "-n", ranks, "--oversubscribe", program, *args, *extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    sys.stdout.write(f"$ {' '.join(command)}\n{out}")
    return [float(m.group(1)) for m in re.finditer(r"loss ([-+0-9.eE]+|nan|inf)", out)]


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    mpiexec, program, *configs = argv
    reference = losses(mpiexec, program, configs[0], extra)
    assert reference, "no losses printed"
    for config in configs[1:]:
        got = losses(mpiexec, program, config, extra)
        assert len(got) == len(reference), f"{config}: {len(got)} losses, expected {len(reference)}"
        for i, (a, b) in enumerate(zip(reference, got)):
            assert abs(a - b) <= 1e-9 * max(abs(a), 1e-300), f"{config}: loss {i}: {b} vs {a} on one rank"
    print(f"losses agree to 1e-9 on {len(configs)} meshes ({len(reference)} losses each)")


if __name__ == "__main__":
    main()
