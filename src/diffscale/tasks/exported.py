"""An exported task folder loaded back: its config, the network's sizes, the task's state tensors
and the network's weights, each a file the export wrote (no pickle)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import load_file, save_file

from diffscale.config import RunConfig, from_dict, load_yaml, write_yaml
from diffscale.errors import UserError

TaskType = TypeVar("TaskType")


@dataclass(frozen=True)
class ExportFiles:
    """The names of an export's files."""

    weights: str
    state: str
    config: str
    signature: str = "signature.json"
    prefix: str = ""
    """What the network's own names start with and the weights file leaves out (``unet.``: the
    file is a diffusers UNet2DModel's, read by diffusers too)."""

    def all(self) -> tuple[str, ...]:
        return self.weights, self.state, self.config, self.signature


def load_exported(task_class: Any, path: str | Path, files: ExportFiles, *, what: str, run_kind: str,
                  device: str | torch.device = "cpu") -> tuple[Any, torch.nn.Module]:
    """``task_class`` built from the export in ``path`` (state restored, no data) and its network
    (eval mode, on ``device``). ``what`` names the export in messages, ``run_kind`` the runs that
    make one."""
    path = Path(path)
    missing = [name for name in files.all() if not (path / name).is_file()]
    if missing:
        raise UserError(f"'{path}' is not an exported {what} (missing {', '.join(missing)})",
                        f"export one with `diffscale export RUN_DIR` from a {run_kind} run")
    cfg = from_dict(load_yaml(path / files.config))
    task = task_class(cfg, torch.device(device), load_data=False,
                      signature=json.loads((path / files.signature).read_text()))
    task.load_state_tensors(load_file(str(path / files.state)))
    network = task.build_network()
    network.load_state_dict({files.prefix + k: v for k, v in load_file(str(path / files.weights)).items()})
    return task, network.to(task.device).eval()


def write_exported(files: ExportFiles, out_dir: Path, *, cfg: RunConfig, signature: dict[str, Any],
                   network: torch.nn.Module | None, state: dict[str, torch.Tensor]) -> None:
    """The files ``load_exported`` reads back: the network's weights (fp32, on the CPU; None: an
    export that writes them its own way), the task's state tensors, the run's config and the
    network's signature (JSON)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if network is not None:
        weights = {k: v.detach().float().cpu().contiguous() for k, v in network.state_dict().items()}
        save_file(weights, str(out_dir / files.weights))
    save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / files.state))
    write_yaml(cfg, out_dir / files.config)
    (out_dir / files.signature).write_text(json.dumps(signature, indent=2))
