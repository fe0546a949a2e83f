"""The Task protocol: what the training loop needs from a kind of diffusion problem.

The loop, checkpointing and distributed code are the same for every task. A task
owns its data (resident on the device), its network (single-device code) and its
preview. All randomness of an optimizer step is drawn for the *global* batch from a
generator seeded by (seed, step), identically on every rank; each rank then computes
the loss of its own rows. So results depend on the effective batch, not on how it is
split over processes and accumulation steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch


class Task(Protocol):
    name: str

    def num_items(self) -> int:
        """Examples in the data set (one epoch)."""

    def describe_data(self) -> str:
        """One line for the banner."""

    def build_network(self) -> torch.nn.Module:
        """The denoiser ``f(x_t, t)``, on the CPU, in fp32."""

    def signature(self) -> dict[str, Any]:
        """What must match for a checkpoint to load into this task's network."""

    def draw(self, indices: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """All random inputs of one global batch (same on every rank)."""

    def loss(self, network: torch.nn.Module, batch: dict[str, torch.Tensor], rows: slice,
             *, channels_last: bool) -> torch.Tensor:
        """Scalar loss of ``rows`` of the global batch."""

    def generate(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                 trajectory: bool = False, autocast=None,
                 rows: slice | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Samples (and optionally the denoising trajectory); ``rows`` selects a share of the
        seeded draw for one rank."""

    def preview(self, network: torch.nn.Module, path: Path, *, count: int, steps: int, seed: int,
                sampler: str = "ddim", gif: bool = False) -> list[Path]:
        """Write sample images produced by ``network`` (EMA weights) to ``path``."""
