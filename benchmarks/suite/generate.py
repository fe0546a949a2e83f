"""Write the suite's data sets: ``python -m benchmarks.suite.generate --out DIR [--sets NAME ...]
[--count N] [--seed S]``.

Each set becomes one ``.npz`` under DIR (fields also a held-out file), named by task, set, count and
seed, ready for ``diffscale train --data npz:FILE``; a file already there is kept. ``--count``
sets the images, pairs or episodes of every chosen set (default: each set's own, a few thousand
images; up to 100,000 and more, as memory for one chunk and the disk allow).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.suite.sets import SETS, chosen
from diffscale.errors import UserError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.suite.generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for the .npz files")
    parser.add_argument("--sets", nargs="+", metavar="NAME", help=f"sets to write (default all): {', '.join(SETS)}")
    parser.add_argument("--count", type=int, help="images / pairs / episodes per set (default: each set's own)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every set (default 0)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        for entry in chosen(args.sets):
            start = time.perf_counter()
            path = entry.ensure(args.out, args.count, args.seed)
            print(f"{entry.name:9s} {entry.task:7s} npz:{path}  ({time.perf_counter() - start:.1f} s)  {entry.summary}",
                  flush=True)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
