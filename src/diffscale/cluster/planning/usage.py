"""What one rank of a user's command uses: measured by ``diffscale probe`` or stated by the user.

``plan`` and ``submit`` take it from ``--probe FILE`` (or RUN_DIR/probe.json) and from
``--mem-per-rank`` / ``--workers-per-rank`` / ``--worker-mem``; a stated figure wins over
the measured one (probe with 2 workers, then plan the job with 8). The host-memory check
puts these figures into the one model of runtime/resources.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from diffscale.cluster.probe.result import PROBE_FILE, ProbeResult, load
from diffscale.errors import UserError
from diffscale.runtime import resources

MEASURED_SHARE = 0.9
"""Share of a node's memory a job's processes may fill: the OS, the scheduler's daemons and the
page cache keep the rest, and a peak measured in a short probe still grows."""


@dataclass(frozen=True)
class RankUsage:
    rank_bytes: int | None
    """The rank's own process (its main process), data included."""
    workers: int
    """Loader workers per rank (0: none)."""
    worker_bytes: int | None
    """One loader worker (None: unknown; only allowed with no workers)."""
    gpu_bytes: int | None = None
    rates: tuple[tuple[str, float], ...] = ()
    """Steps/s of one rank per device it was probed on (``estimates.gpu_key``, or ``cpu``)."""
    source: str = ""
    """Where the figures come from, for the plan (``probe runs/x/probe.json, PSS``, ``stated``)."""
    notes: tuple[str, ...] = ()
    """What the plan should say about the figures: a probe of another command, or of no training step."""

    def host_memory(self, ranks: int) -> resources.HostMemory | None:
        if self.rank_bytes is None:
            return None
        return resources.host_memory(ranks, workers=self.workers, rank_bytes=self.rank_bytes,
                                     worker_bytes=self.worker_bytes or 0)

    def steps_per_s(self, device: str) -> float | None:
        return dict(self.rates).get(device)


def _gib_flag(value: float | None, flag: str) -> int | None:
    if value is None:
        return None
    if not (value > 0 and math.isfinite(value)):
        raise UserError(f"{flag} {value:g} is out of range: a process's host memory is a positive number of GB",
                        f"pass e.g. {flag} 6")
    return int(value * resources.GIB)


def probes_for(probes: list[str] | None, run_dir: Path | None) -> list[tuple[ProbeResult, str]]:
    """The probes named by --probe (each on its own GPU type), else RUN_DIR/probe.json if any."""
    if probes:
        return [(load(path), path) for path in probes]
    if run_dir is not None and (run_dir / PROBE_FILE).is_file():
        return [(load(run_dir), str(run_dir / PROBE_FILE))]
    return []


def device_key(probe: ProbeResult) -> str:
    """What a probe's steps/s were measured on: the GPU's key, else ``cpu``."""
    return probe.gpu_key or ("cpu" if not probe.gpu_name else probe.gpu_name)


def rank_usage(probes: list[tuple[ProbeResult, str]], *, mem_per_rank_gb: float | None = None,
               workers: int | None = None, worker_mem_gb: float | None = None,
               planned: tuple[str, ...] | None = None) -> RankUsage | None:
    """The figures plan checks a user command with: the (first) probe's, each replaced by a stated
    one; steps/s of every probe, by the device it ran on."""
    probe, probe_path = probes[0] if probes else (None, "")
    rank_bytes = _gib_flag(mem_per_rank_gb, "--mem-per-rank")
    worker_bytes = _gib_flag(worker_mem_gb, "--worker-mem")
    if workers is not None and workers < 0:
        raise UserError(f"--workers-per-rank {workers} is out of range: 0 or more loader workers",
                        "pass your DataLoader's num_workers, e.g. --workers-per-rank 4")
    if probe is None and rank_bytes is None and workers is None and worker_bytes is None:
        return None
    stated = [f for f, v in (("--mem-per-rank", rank_bytes), ("--workers-per-rank", workers),
                             ("--worker-mem", worker_bytes)) if v is not None]
    if probe is not None:
        rank_bytes = probe.main.memory_bytes if rank_bytes is None else rank_bytes
        workers = probe.workers_at_once if workers is None else workers
        worker_bytes = (probe.worker_bytes or None) if worker_bytes is None else worker_bytes
    workers = workers or 0
    if workers and worker_bytes is None:
        raise UserError(f"{workers} loader workers per rank, but no figure for one worker's memory",
                        "pass --worker-mem GB (one worker's peak), or probe a run that starts its workers")
    if rank_bytes is None:
        raise UserError("loader workers stated, but not the rank's own memory",
                        "pass --mem-per-rank GB too, or measure it: diffscale probe --out RUN_DIR -- COMMAND")
    source = _source(probe, probe_path, stated)
    return RankUsage(rank_bytes=rank_bytes, workers=workers, worker_bytes=worker_bytes,
                     gpu_bytes=probe.gpu_bytes if probe else None, source=source,
                     rates=tuple((device_key(pr), pr.steps_per_s) for pr, _ in probes if pr.steps_per_s),
                     notes=_probe_notes(probes, planned))


def _probe_notes(probes: list[tuple[ProbeResult, str]], planned: tuple[str, ...] | None) -> tuple[str, ...]:
    """What a plan says about its probes: one of another command than the planned one (another
    --num-workers measures other workers), one that saw no training step (start-up, not training)."""
    import shlex

    notes = []
    for probe, path in probes:
        if planned is not None and tuple(probe.command) != tuple(planned):
            notes.append(f"the probe {path} measured `{shlex.join(probe.command)}`, not the planned "
                         f"`{shlex.join(planned)}`: its figures hold only as far as the two run alike (loader "
                         "workers, batch size); probe the planned command to be sure")
        if probe.steps_per_s is None:
            notes.append(f"the probe {path} saw no training step (no progress line): its memory figures may be "
                         "start-up's (imports, data loading, compiling), not training's steady state; probe for "
                         "longer (--seconds) with progress printed")
    return tuple(notes)


def _source(probe: ProbeResult | None, path: str, stated: list[str]) -> str:
    parts = []
    if probe is not None:
        measure = "PSS" if probe.measure.startswith("PSS") else "RSS"
        parts.append(f"measured by the probe {path} ({measure})")
    if stated:
        parts.append("stated with " + ", ".join(stated))
    return "; ".join(parts)
