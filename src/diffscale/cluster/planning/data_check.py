"""Preflight of a run's data: resident on the device beside the model, or streamed.

The data's size comes from the decoded cache's header or the format's listing (read once, on the
host that plans, by ``workload.diffscale_run``); the choice is the run's own rule
(``data/placement.py``) applied to the partition's GPU; the model's memory is the GPU-memory
estimate (measured where ``measured.yaml`` has the preset); a streamed run's loader workers are
budgeted with ``runtime.resources.worker_budget``, the one host-memory model, as the run budgets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffscale.cluster.profiles.types import Partition
from diffscale.data.placement import DataSize, resident_rule
from diffscale.runtime import resources

GPU_SHARE = 0.9
"""Share of a GPU's memory the model and resident data may fill (as the GPU-memory check allows)."""
NO_LIMIT_BYTES = 1 << 62
"""Host memory assumed by the worker budget where the profile does not say (CPUs decide alone)."""


@dataclass(frozen=True)
class DataPlacement:
    size: DataSize
    resident: bool
    why: str
    """The run's banner reason (``resident on the device (0.57 GiB fits 25% of 80 GiB device memory)``)."""
    workers: int = 0
    """Loader workers per rank on the streaming path (0 when resident)."""
    wanted: int = 0
    """Workers the CPUs alone would give (or ``data.workers``), before the host-memory budget."""
    workers_why: str = ""

    def host_data_bytes(self, file_bytes: int) -> int:
        """Data a rank holds in host memory: resident data is read into memory on its way to the
        device; streamed data stays in the page cache (``file_bytes``: an array file loaded whole
        once, to build the cache)."""
        return max(file_bytes, self.size.nbytes) if self.resident else file_bytes


def placement(size: DataSize, setting: str, workers: int, part: Partition, *, ranks_per_node: int,
              cpus_per_rank: int, use_gpus: bool, mem_limit_gib: float | None) -> DataPlacement | None:
    """Where a run puts data of ``size`` on ``part``'s nodes (``setting``: data.resident, ``workers``:
    data.workers); None when the device's memory is not known."""
    if use_gpus:
        known = part.gpu_memory_gb * 1e9 if part.gpu_memory_gb is not None else None
        where = f"{part.gpu_type or 'GPU'} memory"
    else:
        known, where = (mem_limit_gib * resources.GIB if mem_limit_gib is not None else None), "host memory of the node"
    if known is None and setting == "auto":
        return None  # the rule needs the device's memory; on and off do not
    placed = _placed(size, setting, known or 0.0, where)
    if placed.resident:
        return placed
    host = mem_limit_gib * resources.GIB if mem_limit_gib is not None else NO_LIMIT_BYTES
    budget = resources.worker_budget(workers or -1, cpus=cpus_per_rank, host_bytes=int(host),
                                     ranks_on_host=ranks_per_node)
    wanted = workers or resources.auto_workers(cpus_per_rank)
    return DataPlacement(size, False, placed.why, budget.workers, wanted, budget.reason)


def _placed(size: DataSize, setting: str, total_bytes: float, where: str) -> DataPlacement:
    resident, why = resident_rule(setting, size.nbytes, total_bytes, where)
    return DataPlacement(size, resident, why)
