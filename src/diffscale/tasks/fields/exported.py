"""A field model exported by ``diffscale export`` (tasks/fields/export.py), loaded back for
sampling: ``task, net = load_export(DIR)``, then ``task.sample_for(net, cond, ...)``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from diffscale.config import from_dict, load_yaml
from diffscale.errors import UserError
from diffscale.tasks.fields.export import FILES
from diffscale.tasks.fields.task import FieldTask


def load_export(path: str | Path, device: str | torch.device = "cpu") -> tuple[FieldTask, torch.nn.Module]:
    """The task (statistics restored, no data) and the network (eval mode) of an exported folder."""
    path = Path(path)
    missing = [name for name in FILES if not (path / name).is_file()]
    if missing:
        raise UserError(f"'{path}' is not an exported field model (missing {', '.join(missing)})",
                        "export one with `diffscale export RUN_DIR` from a fields run")
    cfg = from_dict(load_yaml(path / "config.yaml"))
    task = FieldTask(cfg, torch.device(device), load_data=False,
                     signature=json.loads((path / "signature.json").read_text()))
    task.load_state_tensors(load_file(str(path / "state.safetensors")))
    network = task.build_network()
    network.load_state_dict(load_file(str(path / "model.safetensors")))
    return task, network.to(task.device).eval()
