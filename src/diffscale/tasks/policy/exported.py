"""A policy exported by ``diffscale export``, loaded back for planning: ``task, net = load_export(DIR)``,
then ``task.plan(net, obs_history, steps=10)``."""

from __future__ import annotations

from pathlib import Path

import torch

from diffscale.tasks.exported import ExportFiles, load_exported
from diffscale.tasks.policy.task import CONFIG_NAME, PolicyTask

EXPORT = ExportFiles(weights="unet.safetensors", state="normalizer.safetensors", config=CONFIG_NAME)


def load_export(path: str | Path, device: str | torch.device = "cpu") -> tuple[PolicyTask, torch.nn.Module]:
    """The task (normalisation restored, no data) and the network (eval mode) of an exported folder."""
    task, network = load_exported(PolicyTask, path, EXPORT, what="policy", run_kind="policy", device=device)
    return task, network
