"""How many data-loader workers a rank may start: from the CPUs given to the task and
the host memory shared by every rank on that host. Never more than fit.

(A user's 16-GPU job was OOM-killed: 8 workers per GPU x 4 GPUs per node, each worker
holding a copy of the data, exhausted 256 GB nodes.)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
RANK_BASE_BYTES = 3 * GIB
"""Host memory of one training process besides its data (CUDA context, PyTorch, buffers)."""
WORKER_BASE_BYTES = 1 * GIB
"""Host memory of one loader worker besides its copy of the data."""
MAX_AUTO_WORKERS = 8


@dataclass(frozen=True)
class WorkerBudget:
    workers: int
    cpus: int
    """CPUs this rank may use (affinity / scheduler allocation, divided among local ranks)."""
    memory_bytes: int
    """Host memory this rank's share allows."""
    reason: str


def cpus_for_rank(local_world_size: int, env: dict | None = None) -> int:
    """CPUs this rank may use: the scheduler's allocation (cgroup/affinity, SLURM_CPUS_PER_TASK,
    NSLOTS) shared by the ranks on this host."""
    env = os.environ if env is None else env
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(env["SLURM_CPUS_PER_TASK"])  # per task = per rank
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        available = os.cpu_count() or 1
    if env.get("NSLOTS", "").isdigit():
        available = min(available, int(env["NSLOTS"]))
    return max(1, available // max(local_world_size, 1))


def host_memory_bytes() -> int:
    """The host memory this job may use: the cgroup limit when one is set, else the machine's."""
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def auto_workers(cpus: int) -> int:
    """Workers a rank with ``cpus`` CPUs starts when left to choose: one per spare CPU, at most 8."""
    return max(0, min(cpus - 1, MAX_AUTO_WORKERS))  # one CPU stays with the training process


def worker_budget(requested: int, *, cpus: int, host_memory: int, ranks_on_host: int, data_bytes: int = 0) -> WorkerBudget:
    """Workers per rank. ``requested`` -1 means automatic: one per spare CPU, at most 8.

    Every rank and each of its workers hold their own copy of an in-memory data set, so
    the memory bound is ranks x (rank + workers x worker) <= host memory.
    """
    share = host_memory // max(ranks_on_host, 1)
    per_worker = WORKER_BASE_BYTES + data_bytes
    by_memory = max(0, (share - RANK_BASE_BYTES - data_bytes) // per_worker)
    want = auto_workers(cpus) if requested < 0 else requested
    workers = int(min(want, by_memory))
    if workers < want:
        reason = (f"{want} requested, {workers} fit: {ranks_on_host} ranks share {host_memory / GIB:.0f} GiB "
                  f"(~{per_worker / GIB:.1f} GiB per worker)")
    else:
        reason = f"{workers} of {cpus} CPUs per rank"
    return WorkerBudget(workers=workers, cpus=cpus, memory_bytes=share, reason=reason)
