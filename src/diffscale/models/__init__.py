"""Denoising networks, one module per architecture. Single-device code: DDP, compile and
precision are applied from outside (runtime/parallelize.py)."""

from __future__ import annotations

import torch

from .field_mlp import FieldMLP
from .unet1d import ConditionalUnet1D, build_unet1d
from .unet2d import Denoiser, build_unet


def count_parameters(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


__all__ = ["ConditionalUnet1D", "Denoiser", "FieldMLP", "build_unet", "build_unet1d", "count_parameters"]
