"""Reverse process: DDIM (fast, default) or ancestral DDPM, through diffusers' schedulers."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import torch

from .process import GaussianDiffusion


class SamplerKind(str, enum.Enum):
    DDIM = "ddim"
    DDPM = "ddpm"


@dataclass(frozen=True)
class Sampler:
    kind: SamplerKind = SamplerKind.DDIM
    steps: int = 50


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
    for i, t in enumerate(scheduler.timesteps):
        t_batch = torch.full((shape[0],), int(t), device=device, dtype=torch.long)
        model_out = denoise(x, t_batch).float()
        if sampler.kind == SamplerKind.DDPM:
            x = scheduler.step(model_out, t, x, generator=generator).prev_sample
        else:
            x = scheduler.step(model_out, t, x, **extra).prev_sample
        if trajectory_every and (i % trajectory_every == 0 or i == len(scheduler.timesteps) - 1):
            frames.append(_bounded(x, diffusion).cpu())
    return _bounded(x, diffusion).cpu(), frames


def _bounded(x: torch.Tensor, diffusion: GaussianDiffusion) -> torch.Tensor:
    """Samples in [-1, 1] where the data lives there (``diffusion.clip_sample``), else as they are."""
    return x.clamp(-1, 1) if diffusion.cfg.clip_sample else x
