"""A field model exported by ``diffscale export`` (tasks/fields/export.py), loaded back for
sampling: ``task, net = load_export(DIR)``, then ``task.sample_for(net, cond, ...)``."""

from __future__ import annotations

from pathlib import Path

import torch

from diffscale.tasks.exported import ExportFiles, load_exported
from diffscale.tasks.fields.task import FieldTask

EXPORT = ExportFiles(weights="model.safetensors", state="state.safetensors", config="config.yaml")


def load_export(path: str | Path, device: str | torch.device = "cpu") -> tuple[FieldTask, torch.nn.Module]:
    """The task (statistics restored, no data) and the network (eval mode) of an exported folder."""
    task, network = load_exported(FieldTask, path, EXPORT, what="field model", run_kind="fields", device=device)
    return task, network
