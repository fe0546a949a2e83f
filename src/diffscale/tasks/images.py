"""Unconditional image diffusion (DDPM/DDIM on a diffusers UNet2DModel)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig
from ..data.device_loader import shift_augment
from ..data.sources import describe, load_images
from ..diffusion import GaussianDiffusion, Sampler, SamplerKind, sample
from ..models import Denoiser, build_unet
from ..sample import save_animation, save_grid


class ImageTask:
    name = "images"

    def __init__(self, cfg: RunConfig, device: torch.device, *, load_data: bool = True) -> None:
        self.cfg = cfg
        self.device = device
        self.diffusion = GaussianDiffusion(cfg.diffusion)
        self.images: torch.Tensor | None = None
        channels = cfg.model.channels
        if load_data:
            images = load_images(cfg.data.source, cfg.model.sample_size, max_items=cfg.data.max_items)
            channels = channels or images.shape[1]
            if images.shape[1] != channels:
                images = images[:, :1] if channels == 1 else images.expand(-1, channels, -1, -1)
            # uint8 on the device: an EMNIST-size set is ~90 MB and needs no loader workers.
            self.images = images.to(device)
        self.channels = channels or 1

    def num_items(self) -> int:
        assert self.images is not None
        return int(self.images.shape[0])

    def describe_data(self) -> str:
        assert self.images is not None
        return f"{self.cfg.data.source} ({describe(self.images)})"

    def build_network(self) -> torch.nn.Module:
        return Denoiser(build_unet(self.cfg.model, self.channels))

    def signature(self) -> dict[str, Any]:
        m = self.cfg.model
        return {
            "task": self.name,
            "channels": self.channels,
            "sample_size": m.sample_size,
            "block_out_channels": list(m.block_out_channels),
            "attention": list(m.attention),
            "layers_per_block": m.layers_per_block,
            "norm_num_groups": m.norm_num_groups,
        }

    def draw(self, indices: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        n = indices.shape[0]
        size = self.cfg.model.sample_size
        shift = self.cfg.data.shift_px
        batch = {
            "indices": indices,
            "noise": torch.randn((n, self.channels, size, size), generator=generator, device=self.device),
            "t": torch.randint(0, self.diffusion.num_timesteps, (n,), generator=generator, device=self.device),
            "shifts": torch.randint(-shift, shift + 1, (n, 2), generator=generator, device=self.device),
            "flips": torch.rand((n,), generator=generator, device=self.device) < 0.5,
        }
        return batch

    def clean_images(self, batch: dict[str, torch.Tensor], rows: slice) -> torch.Tensor:
        assert self.images is not None
        x0 = self.images[batch["indices"][rows]].float() / 127.5 - 1.0
        x0 = shift_augment(x0, batch["shifts"][rows], self.cfg.data.shift_px)
        if self.cfg.data.hflip:
            x0 = torch.where(batch["flips"][rows].view(-1, 1, 1, 1), x0.flip(-1), x0)
        return x0

    def loss(self, network: torch.nn.Module, batch: dict[str, torch.Tensor], rows: slice,
             *, channels_last: bool) -> torch.Tensor:
        x0 = self.clean_images(batch, rows)
        noise, t = batch["noise"][rows], batch["t"][rows]
        xt = self.diffusion.q_sample(x0, noise, t)
        if channels_last:
            xt = xt.contiguous(memory_format=torch.channels_last)
        return self.diffusion.loss(network(xt, t), x0, noise, t)

    @torch.no_grad()
    def generate(self, network: torch.nn.Module, *, count: int, steps: int, seed: int, sampler: str = "ddim",
                 trajectory: bool = False, autocast=None,
                 rows: slice | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``count`` images from ``seed``; with ``rows``, only those rows of that same draw (so
        ranks sharing the work together produce exactly the single-process images)."""
        size = self.cfg.model.sample_size
        kind = SamplerKind(sampler)
        generator = torch.Generator().manual_seed(seed)
        start = torch.randn((count, self.channels, size, size), generator=generator)
        if rows is not None:
            start = start[rows]
        if start.shape[0] == 0:
            return start, []
        was_training = network.training
        network.eval()

        def denoise(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            if autocast is None:
                return network(x, t)
            with autocast():
                return network(x, t)

        total = steps if kind == SamplerKind.DDIM else self.diffusion.num_timesteps
        images, frames = sample(
            denoise, self.diffusion, tuple(start.shape),
            sampler=Sampler(kind, steps), generator=generator, device=self.device,
            trajectory_every=max(1, total // 25) if trajectory else 0, x_init=start,
        )
        network.train(was_training)
        return images, frames

    def preview(self, network: torch.nn.Module, path: Path, *, count: int, steps: int, seed: int,
                sampler: str = "ddim", gif: bool = False, autocast=None) -> list[Path]:
        images, frames = self.generate(network, count=count, steps=steps, seed=seed, sampler=sampler,
                                       trajectory=gif, autocast=autocast)
        written = [save_grid(images, path)]
        if gif:
            written += save_animation(frames, path.with_suffix(".gif"))
        return written
