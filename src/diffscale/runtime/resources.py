"""Host resources of a rank: the CPUs it may use, the host memory it may use, and the one
model of how much host memory a node's processes need.

Units: the model counts bytes and reports GiB (2**30 bytes), the unit SLURM's ``--mem=NG``,
Grid Engine's ``G`` and ``scontrol``'s RealMemory (MiB) all use, so a figure compared with a
profile's or ``--mem``'s node memory compares like with like. The runtime (the plain recipe's
loader workers, ``bench/plain.py``) and the cluster planner and preflight (``cluster/``) both
use it.

The model: every process that holds the training data in host memory holds its own copy
(an npz file is loaded whole), so a node needs

    ranks x (rank + workers x worker),  rank = RANK_BASE_BYTES + data,  worker = WORKER_BASE_BYTES + data.

``diffscale train`` keeps its data on the device and starts no loader workers (workers = 0);
the plain recipe of ``diffscale bench`` does, and a user command's DataLoader may.
(A user's 16-GPU job was OOM-killed: 8 workers per GPU x 4 GPUs per node, each worker
holding a copy of the data, exhausted 256 GB nodes.) For a user's command the two terms come
from ``diffscale probe`` (measured peaks) or the user's own statement instead of the estimates.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from diffscale.errors import UserError

GIB = 2**30
RANK_BASE_BYTES = 3 * GIB
"""Host memory of one training process besides its data: PyTorch, the CUDA context, model
copies and buffers (estimated, not measured)."""
WORKER_BASE_BYTES = 1 * GIB
"""Host memory of one loader worker besides its copy of the data: a forked process that
touches torch and the data set (estimated, not measured)."""
MAX_AUTO_WORKERS = 8


def gib(n_bytes: float) -> float:
    """Bytes -> GiB, the unit every figure of this model is shown in."""
    return n_bytes / GIB


@dataclass(frozen=True)
class HostMemory:
    """Host memory of the processes on one node (estimated)."""

    ranks: int
    """Training processes on the node."""
    workers: int
    """Loader workers per rank (0 for ``diffscale train``: its data stays on the device)."""
    data_bytes: int
    """Training data each process holds in host memory."""
    rank_bytes: int | None = None
    """A measured (probe) or stated (--mem-per-rank) figure for one training process, data
    included; None: the estimate ``RANK_BASE_BYTES + data_bytes``."""
    worker_bytes: int | None = None
    """Likewise for one loader worker (--worker-mem, or a probe's largest worker)."""

    @property
    def per_rank_bytes(self) -> int:
        return RANK_BASE_BYTES + self.data_bytes if self.rank_bytes is None else self.rank_bytes

    @property
    def per_worker_bytes(self) -> int:
        return WORKER_BASE_BYTES + self.data_bytes if self.worker_bytes is None else self.worker_bytes

    @property
    def node_bytes(self) -> int:
        return self.ranks * (self.per_rank_bytes + self.workers * self.per_worker_bytes)

    def workers_that_fit(self, limit_bytes: float) -> int:
        """Most workers per rank with ranks x (rank + workers x worker) <= limit (-1: not even none)."""
        share = limit_bytes / max(self.ranks, 1)
        return max(-1, math.floor((share - self.per_rank_bytes) / self.per_worker_bytes))

    def ranks_that_fit(self, limit_bytes: float) -> int:
        """Most ranks (each with this many workers) that fit in ``limit_bytes`` (0: not one)."""
        return int(limit_bytes // (self.per_rank_bytes + self.workers * self.per_worker_bytes))

    def describe(self) -> str:
        """``4 ranks x ~9.0 GiB = 36 GiB``, with the workers' term when there are workers. The total
        is the product of the terms as printed, so the line's arithmetic holds (``node_bytes`` is
        the exact figure the checks use)."""
        rank, worker = round(gib(self.per_rank_bytes), 1), round(gib(self.per_worker_bytes), 1)
        if self.workers:
            each = f"(1 rank ~{rank:.1f} GiB + {self.workers} loader workers x ~{worker:.1f} GiB)"
        else:
            each = f"~{rank:.1f} GiB"
        total = f"{self.ranks * (rank + self.workers * worker):.1f}".removesuffix(".0")
        return f"{self.ranks} ranks x {each} = {total} GiB"


def host_memory(ranks: int, *, workers: int = 0, data_bytes: int = 0, rank_bytes: int | None = None,
                worker_bytes: int | None = None) -> HostMemory:
    """The node's processes: ``ranks`` training processes with ``workers`` loader workers each;
    ``rank_bytes`` / ``worker_bytes`` replace the estimates where a figure was measured or stated."""
    return HostMemory(ranks=ranks, workers=workers, data_bytes=data_bytes, rank_bytes=rank_bytes,
                      worker_bytes=worker_bytes)


@dataclass(frozen=True)
class WorkerBudget:
    workers: int
    cpus: int
    """CPUs this rank may use (affinity / scheduler allocation, divided among local ranks)."""
    memory_bytes: int
    """Host memory this rank's share allows."""
    reason: str


def cpus_for_rank(local_world_size: int, env: Mapping[str, str] | None = None) -> int:
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


def free_cpu_threads(local_world_size: int, env: Mapping[str, str] | None = None) -> int:
    """Threads for a CPU rank: its CPUs (``cpus_for_rank``) less those other processes keep busy
    now (:func:`busy_elsewhere`), at least 1: on a machine of 2 cores beside 4 busy processes, 1
    thread where torch would start 2 that wait on each other."""
    mine = cpus_for_rank(local_world_size, env)
    try:
        total = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        total = os.cpu_count() or 1
    free = int(total - busy_elsewhere() + 0.5) // max(local_world_size, 1)
    return max(1, min(mine, free))


def free_threads_unless_set(local_world_size: int) -> int | None:
    """:func:`free_cpu_threads`, or None where ``OMP_NUM_THREADS`` is set: the user's choice, which
    torch already follows (CPU training and the feature network's training set their threads so)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    return free_cpu_threads(local_world_size)


def busy_elsewhere(every_s: float = 0.2) -> float:
    """Cores of this process's CPU set that other processes keep busy now: each allowed CPU's busy
    share over a short interval (/proc/stat), summed. Only the allowed CPUs count: on a shared
    cluster node, other jobs on other cores do not take this rank's cores (the load average counts
    the whole machine, and lags a minute behind processes that just started)."""
    import time

    allowed = _allowed_cpus()
    before = cpu_times(_read_proc_stat(), allowed)
    if before is None:  # no per-CPU counters (macOS): the whole machine's load
        try:
            return max(0.0, os.getloadavg()[0] - 1.0)
        except (OSError, AttributeError):
            return 0.0
    time.sleep(every_s)
    after = cpu_times(_read_proc_stat(), allowed) or before
    return busy_cores(before, after)


def _allowed_cpus() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return set(range(os.cpu_count() or 1))


def _read_proc_stat() -> str:
    try:
        return Path("/proc/stat").read_text()
    except OSError:
        return ""


def cpu_times(proc_stat: str, cpus: set[int]) -> dict[int, tuple[int, int]] | None:
    """(idle, total) clock ticks of each CPU in ``cpus``, from /proc/stat's text; None when it has
    no per-CPU lines. Idle counts iowait too (a core waiting on a disk is free to compute)."""
    times = {}
    for line in proc_stat.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
            continue
        ticks = [int(v) for v in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        times[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return times or None


def busy_cores(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> float:
    """Cores busy between two :func:`cpu_times` readings: the sum of each CPU's busy share."""
    busy = 0.0
    for cpu, (idle, total) in after.items():
        idle0, total0 = before.get(cpu, (idle, total))
        if total > total0:
            busy += 1.0 - (idle - idle0) / (total - total0)
    return max(0.0, busy)


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


def worker_budget(requested: int, *, cpus: int, host_bytes: int, ranks_on_host: int,
                  data_bytes: int = 0) -> WorkerBudget:
    """Loader workers per rank: ``requested`` (-1: one per spare CPU, at most 8), never more
    than :class:`HostMemory` says fit in ``host_bytes`` beside ``ranks_on_host`` ranks."""
    want = auto_workers(cpus) if requested < 0 else requested
    model = host_memory(ranks_on_host, workers=want, data_bytes=data_bytes)
    workers = max(0, min(want, model.workers_that_fit(host_bytes)))
    if workers < want:
        reason = (f"{want} requested, {workers} fit: {ranks_on_host} ranks share {gib(host_bytes):.0f} GiB "
                  f"(~{gib(model.per_worker_bytes):.1f} GiB per worker)")
    else:
        reason = f"{workers} of {cpus} CPUs per rank"
    return WorkerBudget(workers=workers, cpus=cpus, memory_bytes=host_bytes // max(ranks_on_host, 1), reason=reason)


def memory_free(device: str = "cpu") -> tuple[int, str]:
    """(bytes, what they are) that an allocation on ``device`` can take now: a GPU's free memory,
    else the host memory available (psutil's estimate, within the job's cgroup limit)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free), f"free on the GPU ({torch.cuda.get_device_name(torch.device(device))})"
    limit = host_memory_bytes()
    try:
        import psutil

        limit = min(limit, int(psutil.virtual_memory().available))
    except Exception:  # no psutil: the machine's (or the cgroup's) total is the bound
        pass
    return limit, "host memory available"


def check_fits(need_bytes: float, what: str, fix: str, device: str = "cpu") -> None:
    """Refuse, before allocating, what cannot fit: one error naming the size and the limit
    (an absurd size otherwise ends in an allocator's traceback, or in swapping for minutes)."""
    free, where = memory_free(device)
    if need_bytes > free:
        raise UserError(f"{what} needs about {gib(need_bytes):,.1f} GiB, more than the {gib(free):,.1f} GiB {where}",
                        fix)
