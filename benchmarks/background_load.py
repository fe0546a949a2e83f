"""What slows the background compile beside the eager steps: the compile by itself on empty caches
(as ``compile_while_training --background-alone`` runs it), once per load started beside it.

Loads: ``none``; ``cpu``, one Python process spinning on one core of the job's cores (the eager
steps' host thread); ``gpu``, the GPU kept busy by replayed CUDA graphs of matrix products with the
host waiting on a blocking event (the eager steps' kernels without their host work); ``both``.
Beside the eager steps the compile took ~1.4 x its time alone (small, H200, 2026-11-29 and -30).

``python -m benchmarks.background_load --preset small --load none --load cpu --work DIR --out DIR``

Writes ``OUT/background_load.json`` (each load's seconds to the process's exit and dynamo's
account of the phases in ``PHASES``) and each load's log ``OUT/PRESET-LOAD.log``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.compile_while_training import background_alone

LOADS = ("none", "cpu", "gpu", "both")
PHASES = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler", "CachingAutotuner.benchmark_all_configs")
"""Lines of dynamo's account reported per load: forward, backward, Triton's timing of kernel configurations."""

SPIN = "while True:\n    pass\n"
GPU_BUSY = """
import torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    for _ in range(3):
        x @ x
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            x @ x
done = torch.cuda.Event(blocking=True)
while True:
    graph.replay()
    graph.replay()
    done.record()
    done.synchronize()
"""


def start_load(load: str) -> list[subprocess.Popen[bytes]]:
    """The processes of ``load``, started (a second for the GPU's to be replaying)."""
    codes = {"none": [], "cpu": [SPIN], "gpu": [GPU_BUSY], "both": [SPIN, GPU_BUSY]}[load]
    started = [subprocess.Popen([sys.executable, "-c", code]) for code in codes]
    if GPU_BUSY in codes:
        time.sleep(15.0)  # its CUDA context and graph are up before the compile starts
    return started


def account(log: Path) -> dict[str, float]:
    """The seconds of ``PHASES`` in the compile's log (dynamo's account)."""
    found: dict[str, float] = {}
    for line in log.read_text().splitlines():
        parts = line.replace(",", " ").split()  # a table, or comma-separated (newer torch)
        if len(parts) == 2 and parts[0] in PHASES:
            found[parts[0]] = float(parts[1])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.background_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--load", action="append", choices=LOADS, required=True, help="repeatable: each in turn")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config overrides")
    parser.add_argument("--limit", type=float, default=300.0, metavar="S", help="a compile's time limit (default 300)")
    parser.add_argument("--work", type=Path, required=True, help="caches, each load's emptied first")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for load in args.load:
        processes = start_load(load)
        try:
            record = background_alone(args.preset, args.set, work=args.work / load, out=args.out, limit_s=args.limit)
        finally:
            for process in processes:
                process.kill()
                process.wait()
        log = args.out / f"{args.preset}-{load}.log"
        (args.out / f"{args.preset}-background-alone.log").replace(log)
        results[load] = {**record, "phases": account(log)}
        print(f"{args.preset} beside load {load}: {record['took_s']:.1f} s; {results[load]['phases']}", flush=True)
        (args.out / "background_load.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
