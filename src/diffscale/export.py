"""Export a run's EMA weights as a diffusers pipeline folder."""

from __future__ import annotations

import copy
from pathlib import Path

from diffusers import DDPMPipeline

from .errors import UserError


def export_diffusers(task, network, out_dir: Path) -> Path:
    """Write ``out_dir`` so that ``DDPMPipeline.from_pretrained(out_dir)`` loads and samples."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"export folder '{out_dir}' is not empty", "pass a new or empty folder to --diffusers")
    unet = copy.deepcopy(network.unet).to("cpu").float()
    pipeline = DDPMPipeline(unet=unet, scheduler=task.diffusion.ddpm_scheduler())
    pipeline.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir
