"""Diffusion tasks: each supplies data, a single-device network and previews; the loop is shared."""

from __future__ import annotations

import torch

from ..config import RunConfig
from ..errors import UserError, closest
from .base import Task

TASKS = ("images",)


def build_task(cfg: RunConfig, device: torch.device, *, load_data: bool = True) -> Task:
    if cfg.task == "images":
        from .images import ImageTask

        return ImageTask(cfg, device, load_data=load_data)
    raise UserError(f"unknown task '{cfg.task}'{closest(cfg.task, TASKS)}", f"use one of: {', '.join(TASKS)}")
