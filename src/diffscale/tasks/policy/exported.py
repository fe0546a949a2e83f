"""A policy exported by ``diffscale export``, loaded back for planning: ``task, net = load_export(DIR)``,
then ``task.plan(net, obs_history, steps=10)``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from diffscale.config import from_dict, load_yaml
from diffscale.errors import UserError
from diffscale.tasks.policy.task import CONFIG_NAME, PolicyTask

FILES = ("unet.safetensors", "normalizer.safetensors", CONFIG_NAME, "signature.json")


def load_export(path: str | Path, device: str | torch.device = "cpu") -> tuple[PolicyTask, torch.nn.Module]:
    """The task (normalisation restored, no data) and the network (eval mode) of an exported folder."""
    path = Path(path)
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing:
        raise UserError(f"'{path}' is not an exported policy (missing {', '.join(missing)})",
                        "export one with `diffscale export RUN_DIR` from a policy run")
    cfg = from_dict(load_yaml(path / CONFIG_NAME))
    task = PolicyTask(cfg, torch.device(device), load_data=False,
                      signature=json.loads((path / "signature.json").read_text()))
    task.load_state_tensors(load_file(str(path / "normalizer.safetensors")))
    network = task.build_network()
    network.load_state_dict(load_file(str(path / "unet.safetensors")))
    return task, network.to(task.device).eval()
