"""``plan --partition auto``: which partition and shape finishes the run first.

For every partition of the profile and every shape that fits it (1, 2, 4, ... full nodes,
up to the partition's max_nodes), finish = the scheduler's start estimate + the run's
estimated duration on that device + the start-up of every further chain segment. Start
estimates come from the scheduler (SLURM: ``sbatch --test-only`` of the shape's script,
``squeue --start`` of the jobs pending in the partition; Grid Engine offers none:
"unknown"); durations from diffscale's estimates (measured.yaml first) or, for a user's
command, the steps/s a probe measured on that GPU type and ``--total-steps``. Pure: the
scheduler is asked through the ``ask_start`` callable. The charge per GPU-hour a profile may
state is shown beside each shape; the pick is the earliest finish (then the lower charge), and
``--race N`` races the N best.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from diffscale.cluster.planning.estimates import ASSUMED_SCALING_EFFICIENCY, STARTUP_S, gpu_key
from diffscale.cluster.planning.plan import SEGMENT_MARGIN_S, Plan
from diffscale.cluster.planning.usage import RankUsage
from diffscale.cluster.profiles.types import Partition

_TEST_ONLY = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
_SQUEUE_START = re.compile(r"^\s*(\S+)\s+(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|N/A)\s*$")


@dataclass(frozen=True)
class Start:
    at: dt.datetime | None
    source: str
    """``sbatch --test-only``, ``squeue --start``, or why it is unknown."""


def parse_test_only(text: str) -> dt.datetime | None:
    """``sbatch: Job 3 to start at 2026-05-01T16:30:00 using 8 processors on nodes g01 in partition h200``."""
    m = _TEST_ONLY.search(text)
    return dt.datetime.fromisoformat(m.group(1)) if m else None


def parse_squeue_start(text: str) -> list[tuple[str, dt.datetime | None]]:
    """``squeue --start -h -o "%i %S"`` lines -> (job id, expected start or None for N/A)."""
    out = []
    for line in text.splitlines():
        m = _SQUEUE_START.match(line)
        if m:
            out.append((m.group(1), None if m.group(2) == "N/A" else dt.datetime.fromisoformat(m.group(2))))
    return out


def device_of(part: Partition) -> str:
    """The key a rate is looked up by: the GPU's (``H200``), ``cpu``, or the raw type."""
    if not part.has_gpus:
        return "cpu"
    return gpu_key(part.gpu_type) or (part.gpu_type or "unknown GPU")


def shapes_for(part: Partition, per_node: int | None, max_nodes: int) -> list[tuple[int, int]]:
    """(nodes, ranks per node) to compare: full nodes, 1, 2, 4, ... up to the partition's max_nodes."""
    g = per_node or part.gpus_per_node or 1
    most = min(part.max_nodes or max_nodes, max_nodes)
    nodes = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= most]
    if most not in nodes:
        nodes.append(most)
    return [(n, g) for n in nodes]


@dataclass(frozen=True)
class Duration:
    seconds: int | None
    source: str


def user_run_seconds(usage: RankUsage | None, total_steps: int | None, device: str, world: int) -> Duration:
    """A user command's run: ``total_steps`` (on one rank) at the probed steps/s of one rank on
    ``device``, spread over ``world`` ranks (data-parallel efficiency assumed)."""
    rate = usage.steps_per_s(device) if usage else None
    if rate is None:
        return Duration(None, f"no probe on {device}: diffscale probe --cluster NAME --partition P -- COMMAND")
    if total_steps is None:
        return Duration(None, "--total-steps not given")
    eff = ASSUMED_SCALING_EFFICIENCY if world > 1 else 1.0
    return Duration(int(math.ceil(total_steps / (rate * world * eff))) + STARTUP_S,
                    f"probe: {rate:g} steps/s per rank on {device}")


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    start: Start
    run: Duration
    segments: int
    finish: dt.datetime | None
    gpu_hours: float | None
    charge: float | None
    problem: str = ""
    """Why this shape cannot be picked (a failed preflight check, a run longer than the limit)."""


def segments_for(run_s: int, limit_s: int | None, resumable: bool) -> int | None:
    """Jobs the run needs (a chain of segments); None when it is longer than one job and cannot resume."""
    if limit_s is None:
        return 1
    usable = limit_s - STARTUP_S - (SEGMENT_MARGIN_S if limit_s > 4 * SEGMENT_MARGIN_S else 0)
    if run_s <= limit_s:
        return 1
    if not resumable or usable <= 0:
        return None
    return math.ceil((run_s - STARTUP_S) / usable)


def candidate(plan: Plan, run: Duration, ask_start: Callable[[Plan], Start], now: dt.datetime) -> Candidate:
    part, world = plan.partition, plan.spec.world_size
    gpus = world if plan.spec.gpus_per_node else 0
    gpu_hours = gpus * run.seconds / 3600 if run.seconds is not None and gpus else None
    charge = gpu_hours * part.charge_per_gpu_hour if gpu_hours is not None and part.charge_per_gpu_hour else None
    failed = [c for c in plan.checks if c.ok is False and c.name != "wall time"]
    if failed:
        return Candidate(plan, Start(None, "not asked"), run, 0, None, gpu_hours, charge,
                         f"{failed[0].name}: {failed[0].detail}")
    if run.seconds is None:
        return Candidate(plan, Start(None, "not asked"), run, 0, None, gpu_hours, charge, run.source)
    segments = segments_for(run.seconds, part.max_time_s, plan.workload.resumable)
    if segments is None:
        return Candidate(plan, Start(None, "not asked"), run, 0, None, gpu_hours, charge,
                         "longer than the partition's time limit, and the command cannot resume")
    start = ask_start(plan)
    finish = None
    if start.at is not None:
        finish = max(start.at, now) + dt.timedelta(seconds=run.seconds + (segments - 1) * STARTUP_S)
    return Candidate(plan, start, run, segments, finish, gpu_hours, charge)


def ranked(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates that can be picked, best first: earliest finish, among equal finishes the
    lower charge; those without a start estimate (Grid Engine, a failed test) after them, the
    shortest run first. ``--race N`` takes the first N."""
    usable = [c for c in candidates if not c.problem and c.run.seconds is not None]
    timed = sorted((c for c in usable if c.finish is not None), key=lambda c: (c.finish, c.charge or 0.0))
    untimed = sorted((c for c in usable if c.finish is None), key=lambda c: (c.run.seconds or 0, c.charge or 0.0))
    return timed + untimed


def pick(candidates: list[Candidate]) -> Candidate | None:
    """Earliest finish; among equal finishes the lower charge. Without any start estimate
    (Grid Engine), the shortest run."""
    best = ranked(candidates)
    return best[0] if best else None
