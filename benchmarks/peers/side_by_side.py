#!/usr/bin/env python3
"""Joins xshard's benchmark lines with PyTorch's (torch_steps.py) into ratio lines.

  side_by_side.py FILE...    (or the lines on stdin)

Reads JSON lines, anything else skipped. A line with "peer": "pytorch" is PyTorch's figure
for the xshard case of the same name and rank count; every xshard line that has one gives a
line in the benchmarks' format: xshard's seconds, PyTorch's as the baseline, and the ratio
xshard / PyTorch (below 1: xshard is faster). xshard's lines keep their own baseline as
"xshard_baseline" and "xshard_baseline_seconds".
"""

import fileinput
import json


def main():
    ours, peers = [], {}
    for line in fileinput.input():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            case = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "name" not in case or "seconds" not in case:
            continue
        key = (case["name"], case.get("ranks"))
        if case.get("peer") == "pytorch":
            peers[key] = case
        else:
            ours.append((key, case))
    for key, case in ours:
        peer = peers.get(key)
        if peer is None:
            continue
        print(json.dumps({
            "name": case["name"], "ranks": case.get("ranks"), "seconds": case["seconds"],
            "baseline": "pytorch " + peer.get("version", ""),
            "baseline_seconds": peer["seconds"],
            "ratio": round(case["seconds"] / peer["seconds"], 4),
            "xshard_baseline": case.get("baseline"),
            "xshard_baseline_seconds": case.get("baseline_seconds")}), flush=True)


if __name__ == "__main__":
    main()
