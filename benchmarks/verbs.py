"""Wall time of the verbs a user runs on a login node (``--version``, ``--help``, presets, plan,
status, ...), each in a fresh interpreter as a shell starts it, and whether it loaded torch.

    python -m benchmarks.verbs [--repeats 5] [--json FILE]

Run it twice with ``PYTHONPATH`` naming two source trees to compare them on one machine
(docs/benchmarks.md, "Start-up and compile time" records the figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAN = ["plan", "--cluster", "purdue-gilbreth", "--nodes", "1", "--gpus-per-node", "4", "--account", "lab"]
VERBS: list[list[str]] = [
    ["--version"], ["--help"], ["train", "--help"], ["plan", "--help"], ["status", "--help"], ["doctor", "--help"],
    ["probe", "--help"], ["cluster", "discover", "--help"], ["presets"], ["env"],
    [*PLAN, "--preset", "small"], [*PLAN, "--preset", "policy"], ["status", "{empty}"], ["logs", "{empty}"],
]
"""What is timed; ``{empty}`` is an empty folder (status and logs of a run that has nothing yet)."""

_PROBE = ("import runpy, sys\nsys.argv = ['diffscale', *sys.argv[1:]]\ntry:\n    runpy.run_module('diffscale', "
          "run_name='__main__')\nexcept SystemExit:\n    pass\nprint('torch loaded' if 'torch' in sys.modules else "
          "'no torch', file=sys.stderr)")


def time_verb(argv: list[str], repeats: int) -> dict[str, object]:
    """Median wall seconds of ``diffscale ARGV`` over ``repeats`` fresh interpreters."""
    walls, loaded = [], False
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True)
        walls.append(time.perf_counter() - started)
        loaded = loaded or done.stderr.rstrip().endswith("torch loaded")
    return {"verb": " ".join(argv), "median_s": round(statistics.median(walls), 3),
            "max_s": round(max(walls), 3), "torch": loaded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.verbs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per verb (the median is kept)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as empty:
        for verb in VERBS:
            row = time_verb([empty if word == "{empty}" else word for word in verb], max(1, args.repeats))
            row["verb"] = " ".join(verb)
            rows.append(row)
            print(f"{row['median_s']:6.2f} s (max {row['max_s']:5.2f})  {'torch' if row['torch'] else '     '}  "
                  f"diffscale {row['verb']}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
