"""Task name -> the class implementing it, imported only when a run asks for that task."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from diffscale.config import MODEL_CONFIGS, RunConfig
from diffscale.errors import UserError, closest

if TYPE_CHECKING:
    import torch

    from diffscale.data.placement import DataSize
    from diffscale.tasks.base import Task

TASKS: dict[str, str] = {
    "images": "diffscale.tasks.images.task:ImageTask",
    "fields": "diffscale.tasks.fields.task:FieldTask",
    "policy": "diffscale.tasks.policy.task:PolicyTask",
}
"""Task name -> ``module:class`` of its implementation."""

DATA_SIZES: dict[str, str] = {
    "images": "diffscale.tasks.images.datasize:run_data_size",
}
"""Task name -> ``module:function`` that reads the decoded size of a run's data without decoding it
or importing torch (``plan`` checks whether it fits the device); a task without one is not checked."""

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
    task: Task = cls(cfg, device, load_data=load_data, signature=signature)
    return task


def data_size(cfg: RunConfig) -> DataSize | None:
    """The decoded size of ``cfg``'s data where its task can read it cheaply on this host, else None."""
    target = DATA_SIZES.get(cfg.task)
    if target is None:
        return None
    module, name = target.split(":")
    size: DataSize | None = getattr(importlib.import_module(module), name)(cfg)
    return size
