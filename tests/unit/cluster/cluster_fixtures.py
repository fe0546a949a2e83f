"""Profiles and paths shared by the cluster unit tests (imported as a module: conftest.py is not)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from diffscale.cluster.planning.partition_choice import Start, parse_test_only
from diffscale.cluster.profiles.loading import load_profile
from diffscale.cluster.profiles.types import ClusterProfile

FIXTURES = Path(__file__).parent / "fixtures"

# A run directory no script may mangle (submitit's weird_tmp_path idea): spaces, both
# quotes, $, backticks, a glob, a semicolon and a newline.
HOSTILE_NAME = "we ird's \"dir\" $HOME `touch pwned` *;x\nline"


def fixture_profile(name: str) -> ClusterProfile:
    return load_profile(str(FIXTURES / f"{name}.yaml"))


GIB = 2**30
RECORDED_AT = dt.datetime(2026, 5, 1, 10, 0)
"""When the answers in fixtures/test-only were recorded (the L40S nodes free, the H200s busy until 16:30)."""


def recorded_start(plan, *, shift_to: dt.datetime | None = None) -> Start:
    """The recorded ``sbatch --test-only`` answer for the plan's partition and shape; ``shift_to``:
    moved as if recorded then (a test of the CLI, whose clock is the real one)."""
    path = FIXTURES / "test-only" / f"{plan.partition.name}-{plan.shape.label}.txt"
    at = parse_test_only(path.read_text())
    if at is not None and shift_to is not None:
        at += shift_to - RECORDED_AT
    return Start(at, "sbatch --test-only (recorded)")


def probe_file(path: Path, *, main_gib: float, workers: int, worker_gib: float, gpu: str | None,
               steps_per_s: float) -> Path:
    """A probe.json as `diffscale probe` writes it: one rank's memory, its loader workers, its rate."""
    size = int(main_gib * GIB)
    fig = {"pid": 1, "cmdline": "python train.py", "memory_bytes": size, "rss_bytes": size, "pss_bytes": size,
           "uss_bytes": size, "threads": 12}
    worker = dict(fig, memory_bytes=int(worker_gib * GIB), pss_bytes=int(worker_gib * GIB))
    path.write_text(json.dumps({
        "version": 1, "command": ["python", "train.py"], "seconds": 60, "ran_s": 60.0, "ended": "limit",
        "exit_code": None, "measure": "PSS (/proc/PID/smaps_rollup)", "main": fig,
        "workers": [dict(worker, pid=10 + k) for k in range(workers)], "workers_at_once": workers,
        "tree_peak_bytes": 0, "threads_peak": 40, "gpu_bytes": 20_000_000_000 if gpu else None, "gpu_name": gpu,
        "gpu_note": "measured through NVML", "steps_per_s": steps_per_s, "progress_line": "x", "host": "g01",
        "cpus": 16, "notes": []}))
    return path
