"""Reverse process: DDIM (fast, default) or ancestral DDPM, through diffusers' schedulers.

Progress: whoever waits for the samples installs a :class:`SamplingProgress` with
:func:`reporting` (``diffscale sample`` shows a bar on a terminal, a line per stage in a log).
It travels in a context variable rather than as an argument, so sampling reports through
any task's ``generate`` without every task passing it on; with none installed, nothing is
reported.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from .process import GaussianDiffusion


class SamplerKind(str, enum.Enum):
    DDIM = "ddim"
    DDPM = "ddpm"


@dataclass(frozen=True)
class Sampler:
    kind: SamplerKind = SamplerKind.DDIM
    steps: int = 50


class SamplingProgress(Protocol):
    def start(self, kind: SamplerKind, steps: int, count: int) -> None:
        """Sampling ``count`` samples with ``steps`` denoising steps begins."""
        ...

    def advance(self, done: int) -> None:
        """``done`` of the steps are finished."""
        ...

    def finish(self) -> None:
        """Sampling ended (also after an error)."""
        ...


_PROGRESS: contextvars.ContextVar[SamplingProgress | None] = contextvars.ContextVar("sampling_progress",
                                                                                    default=None)


@contextlib.contextmanager
def reporting(progress: SamplingProgress) -> Iterator[SamplingProgress]:
    """Report the progress of every :func:`sample` call inside the block to ``progress``."""
    token = _PROGRESS.set(progress)
    try:
        yield progress
    finally:
        _PROGRESS.reset(token)


@torch.no_grad()
def sample(
    denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    diffusion: GaussianDiffusion,
    shape: tuple[int, ...],
    *,
    sampler: Sampler,
    generator: torch.Generator,
    device: torch.device,
    trajectory_every: int = 0,
    x_init: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Draw samples of ``shape`` (B, ...). ``denoise(x_t, t)`` returns the network's prediction
    (a conditional task closes over its condition).

    Returns the final samples on the CPU and, when ``trajectory_every`` is set, the
    intermediate ones every that many steps (for GIFs). ``x_init`` replaces
    the initial noise (ranks sharing one seeded draw each denoise their own rows).
    """
    scheduler = diffusion.ddim_scheduler() if sampler.kind == SamplerKind.DDIM else diffusion.ddpm_scheduler()
    steps = min(sampler.steps, diffusion.num_timesteps)
    scheduler.set_timesteps(steps)  # DDPM too: ancestral steps strided over the trained timesteps
    # Noise from a CPU generator: the same seed gives the same images on every device.
    x = (x_init if x_init is not None else torch.randn(shape, generator=generator)).to(device)
    frames: list[torch.Tensor] = []
    extra = {"eta": 0.0} if sampler.kind == SamplerKind.DDIM else {}
    progress = _PROGRESS.get()
    if progress is not None:
        progress.start(sampler.kind, len(scheduler.timesteps), shape[0])
    try:
        for i, t in enumerate(scheduler.timesteps):
            t_batch = torch.full((shape[0],), int(t), device=device, dtype=torch.long)
            model_out = denoise(x, t_batch).float()
            if sampler.kind == SamplerKind.DDPM:
                x = scheduler.step(model_out, t, x, generator=generator).prev_sample
            else:
                x = scheduler.step(model_out, t, x, **extra).prev_sample
            if trajectory_every and (i % trajectory_every == 0 or i == len(scheduler.timesteps) - 1):
                frames.append(_bounded(x, diffusion).cpu())
            if progress is not None:
                progress.advance(i + 1)
    finally:
        if progress is not None:
            progress.finish()
    return _bounded(x, diffusion).cpu(), frames


def _bounded(x: torch.Tensor, diffusion: GaussianDiffusion) -> torch.Tensor:
    """Samples in [-1, 1] where the data lives there (``diffusion.clip_sample``), else as they are."""
    return x.clamp(-1, 1) if diffusion.cfg.clip_sample else x
