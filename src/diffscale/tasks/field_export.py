"""Export of a field model: no diffusers pipeline samples conditional vectors, so the folder
holds what diffscale's own sampler needs, without pickle:

* ``model.safetensors`` -- the EMA network's weights (fp32)
* ``state.safetensors`` -- the normalisation statistics (and preview conditions)
* ``config.yaml`` -- the run's config; ``signature.json`` -- the network's sizes
* ``scheduler/`` -- the diffusers DDIM scheduler config (``DDIMScheduler.from_pretrained``)

``load_export(DIR)`` gives back the task and network; ``task.sample_for(network, cond, ...)``
then samples ensembles in data units (``cond``: an N x C array or tensor).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from ..config import from_dict, load_yaml, write_yaml
from ..errors import UserError
from ..export import check_export_dir

if TYPE_CHECKING:
    from .fields import FieldTask

FILES = ("model.safetensors", "state.safetensors", "config.yaml", "signature.json")


def export_fields(task: FieldTask, network: torch.nn.Module, out_dir: Path) -> str:
    """Write ``out_dir`` (new or empty); returns how to load it."""
    check_export_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().float().cpu().contiguous() for k, v in copy.deepcopy(network).state_dict().items()}
    save_file(weights, str(out_dir / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in task.state_tensors().items()}, str(out_dir / "state.safetensors"))
    write_yaml(task.cfg, out_dir / "config.yaml")
    (out_dir / "signature.json").write_text(json.dumps(task.signature(), indent=2))
    task.diffusion.ddim_scheduler().save_config(str(out_dir / "scheduler"))
    # one line that runs as written: cond stands for the caller's (N, C) conditions in data units
    return (f"import numpy as np; from diffscale.tasks.field_export import load_export; "
            f"task, net = load_export('{out_dir}'); cond = np.zeros((4, {task.cond_dim})); "
            f"task.sample_for(net, cond, members=16, steps={task.cfg.train.sample_steps}, seed=0)")


def load_export(path: str | Path, device: str | torch.device = "cpu") -> tuple[FieldTask, torch.nn.Module]:
    """The task (statistics restored, no data) and the network (eval mode) of an exported folder."""
    from .fields import FieldTask

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
