"""Export of an image model as a diffusers ``DDPMPipeline`` folder."""

from __future__ import annotations

import copy
from pathlib import Path

from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

from diffscale.io.paths import check_export_dir


def export_ddpm_pipeline(unet: UNet2DModel, scheduler: DDPMScheduler, out_dir: Path) -> Path:
    """Write ``out_dir`` so that ``DDPMPipeline.from_pretrained(out_dir)`` loads and samples."""
    out_dir = check_export_dir(out_dir)
    unet = copy.deepcopy(unet).to("cpu").float()
    pipeline = DDPMPipeline(unet=unet, scheduler=scheduler)
    pipeline.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir
