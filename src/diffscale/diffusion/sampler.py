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
    """Draw samples in [-1, 1]. ``denoise(x_t, t)`` returns the network's prediction.

    Returns the final images (B, C, H, W) on the CPU and, when ``trajectory_every``
    is set, the intermediate images every that many steps (for GIFs). ``x_init`` replaces
    the initial noise (ranks sharing one seeded draw each denoise their own rows).
    """
    scheduler = diffusion.ddim_scheduler() if sampler.kind == SamplerKind.DDIM else diffusion.ddpm_scheduler()
    steps = min(sampler.steps, diffusion.num_timesteps)
    scheduler.set_timesteps(steps if sampler.kind == SamplerKind.DDIM else diffusion.num_timesteps)
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
            frames.append(x.clamp(-1, 1).cpu())
    return x.clamp(-1, 1).cpu(), frames
