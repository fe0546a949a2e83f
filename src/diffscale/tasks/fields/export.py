"""Export of a field model: no diffusers pipeline samples conditional vectors, so the folder
holds what diffscale's own sampler needs, without pickle:

* ``model.safetensors`` -- the EMA network's weights (fp32)
* ``state.safetensors`` -- the normalisation statistics (and preview conditions)
* ``config.yaml`` -- the run's config; ``signature.json`` -- the network's sizes
* ``scheduler/`` -- the diffusers DDIM scheduler config (``DDIMScheduler.from_pretrained``)

``exported.load_export(DIR)`` gives back the task and network; ``task.sample_for(network, cond, ...)``
then samples ensembles in data units (``cond``: an N x C array or tensor).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from diffscale.config import RunConfig, write_yaml
from diffscale.diffusion import GaussianDiffusion
from diffscale.io.paths import check_export_dir


class ExportedTask(Protocol):
    """What the export reads of a ``FieldTask`` (a protocol: task.py imports this module)."""

    cfg: RunConfig
    cond_dim: int
    diffusion: GaussianDiffusion

    def signature(self) -> dict[str, Any]: ...

    def state_tensors(self) -> dict[str, torch.Tensor]: ...


def export_fields(task: ExportedTask, network: torch.nn.Module, out_dir: Path) -> str:
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
    return (f"import numpy as np; from diffscale.tasks.fields.exported import load_export; "
            f"task, net = load_export('{out_dir}'); cond = np.zeros((4, {task.cond_dim})); "
            f"task.sample_for(net, cond, members=16, steps={task.cfg.train.sample_steps}, seed=0)")
