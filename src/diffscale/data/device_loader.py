"""Data resident on the training device, served as seeded global batches.

Each epoch is a seeded permutation of the whole data set. A *global* batch of
``effective_batch`` indices is drawn per optimizer step and every rank takes its own
disjoint slice of it (``micro_slice``). Because the global batch does not depend on
how it is split, a run with 1 process x accumulation 4 sees exactly the samples of a
run with 4 processes, and a run can resume on another world size at the same
effective batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffscale.errors import UserError


@dataclass
class DataPosition:
    """Where the next global batch starts: checkpointed for exact resume."""

    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}


def micro_slice(micro_step: int, rank: int, world_size: int, batch_per_gpu: int) -> slice:
    """Rows of the global batch that ``rank`` uses in accumulation step ``micro_step``."""
    start = (micro_step * world_size + rank) * batch_per_gpu
    return slice(start, start + batch_per_gpu)


class DeviceBatcher:
    """Seeded, shardable index stream over ``num_items`` examples (drop-last per epoch)."""

    def __init__(self, num_items: int, global_batch: int, seed: int, device: torch.device,
                 position: DataPosition | None = None) -> None:
        if num_items < global_batch:
            raise UserError(
                f"the data set has {num_items} training examples, fewer than one effective batch of {global_batch}",
                "add data, or lower train.batch_per_gpu / train.grad_accum",
            )
        self.num_items = num_items
        self.global_batch = global_batch
        self.seed = seed
        self.device = device
        self.position = position or DataPosition()
        self._perm: torch.Tensor | None = None
        self._perm_epoch = -1
        self._subset: torch.Tensor | None = None

    def restrict(self, fraction: float, subset_seed: int) -> None:
        """Draw from ``fraction`` of the examples only (``data.fraction``): the first of a permutation
        seeded by ``subset_seed`` alone, so the subset is the same on every rank, at every resume and
        for every training seed, and a smaller fraction's subset lies inside a larger one's. Drawn
        once, on the CPU (the same numbers on every device type)."""
        if fraction >= 1:
            return
        keep = max(1, round(self.num_items * fraction))
        if keep < self.global_batch:
            raise UserError(f"data.fraction {fraction} keeps {keep} of {self.num_items} training examples, fewer "
                            f"than one effective batch of {self.global_batch}",
                            "raise data.fraction, or lower train.batch_per_gpu / train.grad_accum")
        order = torch.randperm(self.num_items, generator=torch.Generator().manual_seed(subset_seed))
        self._subset = order[:keep].sort().values.to(self.device)
        self.num_items = keep
        self._perm_epoch = -1

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm_epoch != epoch:
            # Drawn on the device: a host-to-device copy here would stall the CPU until the GPU
            # drained its queue, once per epoch (every step when an epoch is one global batch).
            gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.num_items, generator=gen, device=self.device)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    def close(self) -> None:
        """Nothing to release: the indices are drawn on the device."""

    def next_indices(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """Indices of the next global batch (identical on every rank), copied into ``out`` if given."""
        if self.position.offset + self.global_batch > self.num_items:
            self.position = DataPosition(self.position.epoch + 1, 0)
        perm = self._permutation(self.position.epoch)
        start = self.position.offset
        self.position = DataPosition(self.position.epoch, start + self.global_batch)
        indices = perm[start:start + self.global_batch]
        if self._subset is not None:
            indices = self._subset[indices]
        return indices if out is None else out.copy_(indices)


def shift_augment(images: torch.Tensor, shifts: torch.Tensor, max_shift: int) -> torch.Tensor:
    """Translate each image by its own (dy, dx) in [-max_shift, max_shift], edge-replicated.

    images: (N, C, H, W); shifts: (N, 2) integer tensor. Vectorised on the device.
    """
    if max_shift == 0:
        return images
    n, c, h, w = images.shape
    padded = torch.nn.functional.pad(images, (max_shift,) * 4, mode="replicate")
    rows = torch.arange(h, device=images.device)[None, :] + (shifts[:, 0:1] + max_shift)
    cols = torch.arange(w, device=images.device)[None, :] + (shifts[:, 1:2] + max_shift)
    batch = torch.arange(n, device=images.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # (N, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()
