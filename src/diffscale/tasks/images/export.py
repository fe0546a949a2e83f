"""Export of an image model: an unconditional one as a diffusers ``DDPMPipeline`` folder; a
class-conditional one as a diffusers folder sampled by the custom pipeline it carries
(``pipeline.py``, :mod:`.class_pipeline`), which diffscale reads back too
(``tasks/images/exported.load_export``):

* ``model_index.json``, ``pipeline.py`` -- ``DiffusionPipeline.from_pretrained(DIR, custom_pipeline=DIR)``
* ``unet/`` -- the EMA network as a diffusers UNet2DModel (config.json, fp32 safetensors)
* ``scheduler/`` -- the diffusers DDPM scheduler config (``DDPMScheduler.from_pretrained``)
* ``config.yaml`` -- the run's config; ``signature.json`` -- the network's sizes and class names;
  ``state.safetensors`` -- empty (images are scaled by a fixed rule)

Exports written before 2026-11-29 hold the weights as ``model.safetensors`` (the Denoiser's names)
and no pipeline; ``load_export`` reads them still.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

from diffscale.io.paths import check_export_dir
from diffscale.tasks.exported import ExportFiles, write_exported

if TYPE_CHECKING:
    from diffscale.config import RunConfig

EXPORT = ExportFiles(weights="unet/diffusion_pytorch_model.safetensors", state="state.safetensors",
                     config="config.yaml", prefix="unet.")
EXPORT_WITHOUT_PIPELINE = ExportFiles(weights="model.safetensors", state="state.safetensors", config="config.yaml")
"""The format of class-conditional exports before they carried a diffusers pipeline."""
PIPELINE_FILE = "pipeline.py"


def export_ddpm_pipeline(unet: UNet2DModel, scheduler: DDPMScheduler, out_dir: Path) -> Path:
    """Write ``out_dir`` so that ``DDPMPipeline.from_pretrained(out_dir)`` loads and samples."""
    out_dir = check_export_dir(out_dir)
    unet = copy.deepcopy(unet).to("cpu").float()
    pipeline = DDPMPipeline(unet=unet, scheduler=scheduler)
    pipeline.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def export_class_conditional(unet: UNet2DModel, out_dir: Path, *, cfg: RunConfig, signature: dict[str, Any],
                             state: dict[str, torch.Tensor], scheduler: DDPMScheduler) -> Path:
    """Write ``out_dir`` (new or empty) as the module's docstring lists: the pipeline of the
    class-conditional ``unet`` and the DDPM ``scheduler`` (the classes of ``signature`` and the
    run's guidance scale in its model_index.json), the run's config, ``signature`` and ``state``."""
    from diffscale.tasks.images import class_pipeline

    out_dir = check_export_dir(out_dir)
    pipeline = class_pipeline.ClassConditionalPipeline(
        unet=copy.deepcopy(unet).to("cpu").float(), scheduler=scheduler, class_names=signature["classes"],
        guidance_scale=cfg.train.sample_guidance)
    pipeline.save_pretrained(str(out_dir), safe_serialization=True)
    shutil.copyfile(class_pipeline.__file__, out_dir / PIPELINE_FILE)
    write_exported(EXPORT, out_dir, cfg=cfg, signature=signature, network=None, state=state)
    return out_dir
