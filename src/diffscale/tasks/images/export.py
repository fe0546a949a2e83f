"""Export of an image model: an unconditional one as a diffusers ``DDPMPipeline`` folder; a
class-conditional one (no diffusers pipeline samples a UNet2DModel by class) in diffscale's own
format, read back by ``tasks/images/exported.load_export``:

* ``model.safetensors`` -- the EMA network's weights (fp32); ``state.safetensors`` -- empty
* ``config.yaml`` -- the run's config; ``signature.json`` -- the network's sizes and class names
* ``scheduler/`` -- the diffusers DDPM scheduler config (``DDPMScheduler.from_pretrained``)
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

from diffscale.io.paths import check_export_dir
from diffscale.tasks.exported import ExportFiles, write_exported

if TYPE_CHECKING:
    from diffscale.config import RunConfig

EXPORT = ExportFiles(weights="model.safetensors", state="state.safetensors", config="config.yaml")


def export_ddpm_pipeline(unet: UNet2DModel, scheduler: DDPMScheduler, out_dir: Path) -> Path:
    """Write ``out_dir`` so that ``DDPMPipeline.from_pretrained(out_dir)`` loads and samples."""
    out_dir = check_export_dir(out_dir)
    unet = copy.deepcopy(unet).to("cpu").float()
    pipeline = DDPMPipeline(unet=unet, scheduler=scheduler)
    pipeline.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def export_class_conditional(network: torch.nn.Module, out_dir: Path, *, cfg: RunConfig, signature: dict[str, Any],
                             state: dict[str, torch.Tensor], scheduler: DDPMScheduler) -> Path:
    """Write ``out_dir`` (new or empty) in diffscale's format (the module's docstring): the run's
    config, its network's ``signature``, the task ``state`` and the DDPM ``scheduler``."""
    out_dir = check_export_dir(out_dir)
    write_exported(EXPORT, out_dir, cfg=cfg, signature=signature, network=copy.deepcopy(network), state=state)
    scheduler.save_config(str(out_dir / "scheduler"))
    return out_dir
