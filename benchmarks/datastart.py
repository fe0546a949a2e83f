"""Start-up on a large image folder: the time to a run's training images, each in a fresh process
(interpreter start and imports included), before and after the decoded cache.

``python -m benchmarks.datastart --images 100000 --gen-workers 16 --work DIR --json OUT``

* before: the folder listed and decoded in the process itself, one image after another, with
  no cache: what every start and every restart of every rank paid before the cache (the same
  decoder, ``decode_job``, so only the cache and the pool differ);
* first start: ``open_image_data`` with an empty cache: decoded by a pool of one process per CPU
  this process may use (``taskset`` limits it), written to the cache, then read as a tensor;
* restart: the same call again (``--restarts`` times): the folder listed (the cache's key is the
  files' names, sizes and times), the cache's memory map read as a tensor.

A fresh process that only imports what they import is timed too: the part of each figure that
does not grow with the folder.

The folder (``--images`` PNGs of ``--side`` px in 10 class folders) is written once by
``--gen-workers`` processes and kept under ``--work``; each run of this module empties the cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.imagefolder import make_image_folder

BEFORE = """
import sys
from pathlib import Path
import numpy as np
from diffscale.tasks.images.decoded import decode_job
from diffscale.tasks.images.formats import list_imagefolder
listing = list_imagefolder(Path(sys.argv[1]), int(sys.argv[2]), 0)
images = np.concatenate([decode_job(job).images for job in listing.jobs])
print(images.shape)
"""
IMPORTS = """
import sys
import diffscale.tasks.images.dataset
print(sys.argv[1:])
"""
AFTER = """
import sys
from diffscale.tasks.images.dataset import open_image_data
print(tuple(open_image_data("imagefolder:" + sys.argv[1], int(sys.argv[2])).tensor().shape))
"""


def timed(code: str, folder: Path, size: int, env: dict[str, str]) -> dict[str, Any]:
    """Seconds from launching a fresh interpreter running ``code`` to its exit, and what it printed."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, str(folder), str(size)], capture_output=True, text=True,
                          env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return {"seconds": seconds, "shape": done.stdout.strip().splitlines()[-1]}


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--side", type=int, default=32, help="side of the generated PNGs, px")
    parser.add_argument("--size", type=int, default=64, help="resolution the run decodes to, px")
    parser.add_argument("--gen-workers", type=int, default=0, help="processes writing the images (0: one per CPU)")
    parser.add_argument("--restarts", type=int, default=2)
    parser.add_argument("--skip-before", action="store_true", help="time only the cache (before takes longest)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/diffscale-datastart"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    folder = make_image_folder(args.work / f"imgs-{args.images}-{args.side}", args.images, side=args.side,
                               suffix="png", workers=args.gen_workers)
    print(f"folder: {args.images:,} PNGs of {args.side} px in {folder} (written or found in "
          f"{time.perf_counter() - started:.0f} s)", flush=True)
    cache = args.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "DIFFSCALE_CACHE_DIR": str(cache)}
    record: dict[str, Any] = {"images": args.images, "side": args.side, "size": args.size,
                              "cpus": len(os.sched_getaffinity(0)), "load_before": load_average()}
    record["imports"] = timed(IMPORTS, folder, args.size, env)
    print(f"imports alone (in every start below): {record['imports']['seconds']:.1f} s", flush=True)
    if not args.skip_before:
        record["before"] = timed(BEFORE, folder, args.size, env)
        print(f"before (decoded in one process, no cache): {record['before']['seconds']:.1f} s at every start",
              flush=True)
    record["first_start"] = timed(AFTER, folder, args.size, env)
    print(f"first start (cache build, {record['cpus']} CPUs): {record['first_start']['seconds']:.1f} s", flush=True)
    record["restarts"] = [timed(AFTER, folder, args.size, env) for _ in range(args.restarts)]
    print("restart (cache read): " + " / ".join(f"{r['seconds']:.1f} s" for r in record["restarts"]), flush=True)
    record["load_after"] = load_average()
    print(f"load average (1 min) before {record['load_before']}, after {record['load_after']}")
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
