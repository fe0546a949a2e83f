"""Diffusion tasks: each supplies data, a single-device network, its state, generation and
previews through the ``Task`` protocol (base.py); the loop is shared."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ..config import MODEL_CONFIGS, RunConfig
from ..errors import UserError, closest
from .base import Batcher, Feed, Generated, ReferenceData, StopWaiting, Task, preview

TASKS: dict[str, str] = {
    "images": "diffscale.tasks.images:ImageTask",
    "fields": "diffscale.tasks.fields:FieldTask",
    "policy": "diffscale.tasks.policy:PolicyTask",
}
"""Task name -> the class implementing it (imported when a run asks for it)."""

assert set(TASKS) == set(MODEL_CONFIGS), "every task needs a model config section and a class"


def build_task(cfg: RunConfig, device: torch.device, *, load_data: bool = True,
               signature: dict[str, Any] | None = None) -> Task:
    """The task ``cfg.task`` names. Without data (sampling, export), sizes that follow the data
    come from a checkpoint's ``signature``."""
    target = TASKS.get(cfg.task)
    if target is None:
        raise UserError(f"unknown task '{cfg.task}'{closest(cfg.task, TASKS)}", f"use one of: {', '.join(TASKS)}")
    module, name = target.split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(cfg, device, load_data=load_data, signature=signature)


__all__ = ["TASKS", "Batcher", "Feed", "Generated", "ReferenceData", "StopWaiting", "Task", "build_task", "preview"]
