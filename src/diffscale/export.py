"""Writing trained networks in the formats the field's tools load (each task picks its own
through ``Task.export``)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

from .errors import UserError


def check_export_dir(out_dir: Path) -> Path:
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"export folder '{out_dir}' is not empty", "pass a new or empty folder to --diffusers")
    return out_dir


def export_ddpm_pipeline(unet: UNet2DModel, scheduler: DDPMScheduler, out_dir: Path) -> Path:
    """Write ``out_dir`` so that ``DDPMPipeline.from_pretrained(out_dir)`` loads and samples."""
    out_dir = check_export_dir(out_dir)
    unet = copy.deepcopy(unet).to("cpu").float()
    pipeline = DDPMPipeline(unet=unet, scheduler=scheduler)
    pipeline.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def export_network(task, network: torch.nn.Module, out_dir: Path) -> str:
    """The task's own export of ``network`` into an empty ``out_dir``; returns how to load it."""
    check_export_dir(out_dir)
    return task.export(network, Path(out_dir))
