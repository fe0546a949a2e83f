"""A class-conditional image model exported by ``diffscale export`` (tasks/images/export.py),
loaded back for sampling with diffscale (diffusers alone loads it too, through the folder's
pipeline.py): ``task, net = load_export(DIR)``, then
``task.generate(net, count=8, steps=50, seed=0, classes=["A"]).samples`` ((8, C, S, S) in [-1, 1]);
``task.class_names`` lists the classes."""

from __future__ import annotations

from pathlib import Path

import torch

from diffscale.tasks.exported import load_exported
from diffscale.tasks.images.export import EXPORT, EXPORT_WITHOUT_PIPELINE
from diffscale.tasks.images.task import ImageTask


def load_export(path: str | Path, device: str | torch.device = "cpu") -> tuple[ImageTask, torch.nn.Module]:
    """The task (class names restored, no data) and the network (eval mode) of an exported folder."""
    files = EXPORT_WITHOUT_PIPELINE if (Path(path) / EXPORT_WITHOUT_PIPELINE.weights).is_file() else EXPORT
    task, network = load_exported(ImageTask, path, files, what="class-conditional image model",
                                  run_kind="class-conditional images", device=device)
    return task, network
