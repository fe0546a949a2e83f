"""Data that stays on disk: the same seeded global batches as data/device_loader.py, each rank's
rows read from a memory-mapped uint8 array by DataLoader workers, pinned and moved to the device.

The index stream is the resident one (:class:`DeviceBatcher`: its permutations are drawn where
the resident path draws them, then copied to the host once per epoch), so streaming and resident
runs train on the same batches for a seed, and the checkpointed position resumes either exactly.
Workers read only this rank's rows (its micro slices, in accumulation order) and open the memory
map themselves: the page cache, not a copy per process, holds the data.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from diffscale.data.device_loader import DataPosition, DeviceBatcher, micro_slice

PREFETCH_STEPS = 4
"""Steps each worker reads ahead."""


class _Rows(torch.utils.data.Dataset):
    """One item = the rows of one step for this rank, uint8 (k, C, S, S); the map opened per process."""

    def __init__(self, path: Path, shape: tuple[int, ...]) -> None:
        self.path = path
        self.shape = shape
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: list[int]) -> torch.Tensor:
        if self._array is None:
            self._array = np.memmap(self.path, dtype=np.uint8, mode="r", shape=self.shape)
        order = np.asarray(rows, dtype=np.int64)
        return torch.from_numpy(self._array[order])  # fancy indexing copies: no view into the map escapes


class _StepRows(torch.utils.data.Sampler[list[int]]):
    """This rank's rows of each global batch from ``position`` on, drawn as the batcher draws them."""

    def __init__(self, batcher: StreamingBatcher, position: DataPosition) -> None:
        self.batcher = batcher
        self.position = position

    def __iter__(self) -> Iterator[list[int]]:
        b = self.batcher
        position = self.position
        host_epoch, host_perm = -1, torch.empty(0, dtype=torch.long)
        while True:
            if position.offset + b.global_batch > b.num_items:
                position = DataPosition(position.epoch + 1, 0)
            if host_epoch != position.epoch:  # one device-to-host copy an epoch
                host_perm = b.host_permutation(position.epoch)
                host_epoch = position.epoch
            chosen = host_perm[position.offset:position.offset + b.global_batch]
            position = DataPosition(position.epoch, position.offset + b.global_batch)
            yield chosen[b.local_rows].tolist()


class StreamingBatcher(DeviceBatcher):
    """:class:`DeviceBatcher`'s index stream, with this rank's rows of each batch read from ``path``
    (uint8 of ``shape``) by ``workers`` loader processes and placed on the device (``rows_of``)."""

    def __init__(self, path: Path, shape: tuple[int, ...], global_batch: int, seed: int, device: torch.device,
                 position: DataPosition | None, *, rank: int, world_size: int, batch_per_gpu: int,
                 workers: int) -> None:
        super().__init__(shape[0], global_batch, seed, device, position)
        self.path, self.shape, self.workers = path, shape, workers
        self.rank, self.world_size, self.batch_per_gpu = rank, world_size, batch_per_gpu
        accum = global_batch // (world_size * batch_per_gpu)
        self.local_rows = torch.cat([torch.arange(global_batch)[micro_slice(m, rank, world_size, batch_per_gpu)]
                                     for m in range(accum)])
        self._rows: Iterator[torch.Tensor] | None = None
        self.current: torch.Tensor | None = None
        """This rank's rows of the latest batch on the device, uint8 (accum x batch_per_gpu, C, S, S)."""

    def host_permutation(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s order of the data rows (the subset's rows when restricted), on the host."""
        perm = self._permutation(epoch)
        rows = self._subset[perm] if self._subset is not None else perm
        return rows.cpu()

    def _start(self) -> Iterator[torch.Tensor]:
        loader = torch.utils.data.DataLoader(
            _Rows(self.path, self.shape), sampler=_StepRows(self, self.position), batch_size=None,
            num_workers=self.workers, pin_memory=self.device.type == "cuda",
            prefetch_factor=PREFETCH_STEPS if self.workers else None, persistent_workers=False)
        return iter(loader)

    def next_indices(self, out: torch.Tensor | None = None) -> torch.Tensor:
        if self._rows is None:
            self._rows = self._start()  # here, not in __init__: restrict() may change the rows first
        indices = super().next_indices(out)
        self.current = next(self._rows).to(self.device, non_blocking=True)
        return indices

    def close(self) -> None:
        """Stop the loader workers now (a later ``next_indices`` starts them again at ``position``).
        Left to the garbage collector, the loader's queues can be finalized before it tells its
        workers to stop, and it then waits out a timeout for each worker."""
        self._rows = None

    def rows_of(self, rows: slice) -> torch.Tensor:
        """The images of global rows ``rows`` (one of this rank's micro slices), on the device."""
        assert self.current is not None, "next_indices comes first"
        micro = rows.start // (self.world_size * self.batch_per_gpu)
        start = micro * self.batch_per_gpu
        return self.current[start:start + (rows.stop - rows.start)]


def resident_choice(setting: str, data_bytes: int, device: torch.device) -> tuple[bool, str]:
    """Whether data of ``data_bytes`` (uint8) lives on ``device``, and why (for the banner)."""
    from diffscale.data.placement import resident_rule
    from diffscale.runtime.resources import host_memory_bytes

    if device.type == "cuda":
        return resident_rule(setting, data_bytes, torch.cuda.get_device_properties(device).total_memory,
                             "device memory")
    return resident_rule(setting, data_bytes, host_memory_bytes(), "host memory")


def stream_workers(requested: int) -> tuple[int, str]:
    """Loader workers per rank: ``data.workers`` (0: one per spare CPU), never more than the host
    memory model lets the node's ranks start; with the reason."""
    import os

    from diffscale.runtime.resources import cpus_for_rank, host_memory_bytes, worker_budget

    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    # The workers read a memory map: the page cache holds the data once, not a copy per worker.
    budget = worker_budget(requested or -1, cpus=cpus_for_rank(ranks), host_bytes=host_memory_bytes(),
                           ranks_on_host=ranks)
    return budget.workers, budget.reason
