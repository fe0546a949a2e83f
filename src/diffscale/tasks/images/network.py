"""The image denoiser: a diffusers ``UNet2DModel`` called as a plain tensor function."""

from __future__ import annotations

import torch

from diffscale.config import ModelConfig
from diffscale.tasks.images.lean_diffusers import UNet2DModel


def build_unet(cfg: ModelConfig, channels: int, classes: int = 0) -> UNet2DModel:
    """A diffusers UNet2DModel with one down/up block per entry of ``block_out_channels``; with
    ``classes``, a class embedding of ``classes + 1`` entries (the last: "no class")."""
    down = tuple("AttnDownBlock2D" if a else "DownBlock2D" for a in cfg.attention)
    up = tuple("AttnUpBlock2D" if a else "UpBlock2D" for a in reversed(cfg.attention))
    return UNet2DModel(
        sample_size=cfg.sample_size,
        in_channels=channels,
        out_channels=channels,
        layers_per_block=cfg.layers_per_block,
        block_out_channels=cfg.block_out_channels,
        down_block_types=down,
        up_block_types=up,
        norm_num_groups=cfg.norm_num_groups,
        dropout=cfg.dropout,
        num_class_embeds=classes + 1 if classes else None,
    )


class Denoiser(torch.nn.Module):
    """``eps_theta(x_t, t[, labels])`` as a plain tensor function (what DDP and torch.compile wrap).

    x: (B, C, H, W) noised images; t: (B,) integer timesteps; labels: (B,) class indices of a
    class-conditional network (``classes`` for "no class", also what None stands for there)
    -> (B, C, H, W).
    """

    def __init__(self, unet: UNet2DModel, classes: int = 0) -> None:
        super().__init__()
        self.unet = unet
        self.classes = classes

    def forward(self, x: torch.Tensor, t: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.classes and labels is None:  # the common loop of bench's plain recipe draws no labels
            labels = torch.full((x.shape[0],), self.classes, device=x.device, dtype=torch.long)
        return self.unet(x, t, labels, return_dict=False)[0]
