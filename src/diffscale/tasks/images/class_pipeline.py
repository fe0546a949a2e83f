"""A diffusers pipeline that samples a class-conditional UNet2DModel by class, with
classifier-free guidance. ``diffscale export`` copies this file into a class-conditional export as
``pipeline.py``, so diffusers alone loads and samples the folder::

    from diffusers import DiffusionPipeline
    pipe = DiffusionPipeline.from_pretrained(folder, custom_pipeline=folder)
    images = pipe(class_labels=["A", "B"], generator=torch.Generator().manual_seed(0)).images

It imports nothing of diffscale (only torch and diffusers): the folder is read where diffscale is
not installed. The UNet's class embedding has one entry more than there are classes, "no class",
whose prediction is the unconditional one guidance needs (eps_u + w (eps_c - eps_u)).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from diffusers import DiffusionPipeline, ImagePipelineOutput


class ClassConditionalPipeline(DiffusionPipeline):
    """``unet``: a UNet2DModel with ``num_class_embeds`` = classes + 1; ``scheduler``: the run's
    DDPM scheduler (any diffusers scheduler with ``set_timesteps`` and ``step`` samples it);
    ``class_names``: the classes in the order of their indices; ``guidance_scale``: the default w."""

    model_cpu_offload_seq = "unet"

    def __init__(self, unet, scheduler, class_names: Sequence[str] | None = None,  # type: ignore[no-untyped-def]
                 guidance_scale: float = 2.0) -> None:
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)
        self.register_to_config(class_names=list(class_names or []), guidance_scale=float(guidance_scale))

    def class_index(self, label: int | str) -> int:
        """A class name (matched first) or index -> the index the network was trained with."""
        names = list(self.config.class_names)
        if str(label) in names:
            return names.index(str(label))
        if isinstance(label, int) or str(label).lstrip("-").isdigit():
            index = int(label)
            if 0 <= index < len(names):
                return index
        raise ValueError(f"class {label!r} is not one of this model's {len(names)} classes: {names[:40]}")

    @torch.no_grad()
    def __call__(self, class_labels: Sequence[int | str], guidance_scale: float | None = None,
                 num_inference_steps: int = 50, generator: torch.Generator | None = None,
                 latents: torch.Tensor | None = None, output_type: str = "pil",
                 return_dict: bool = True) -> ImagePipelineOutput | tuple:
        """One image per entry of ``class_labels`` (names or indices), drawn with guidance scale
        ``guidance_scale`` (None: the export's; 1: the conditional prediction alone) in
        ``num_inference_steps`` steps from ``latents`` (default: noise from ``generator``, on the CPU,
        so a seed draws the same images on any device). ``output_type``: ``pil``, ``np`` (B, H, W, C)
        in [0, 1], or ``pt`` (B, C, H, W) in [-1, 1]."""
        scale = self.config.guidance_scale if guidance_scale is None else float(guidance_scale)
        device = self.unet.device
        labels = torch.tensor([self.class_index(c) for c in class_labels], device=device, dtype=torch.long)
        unet_config = self.unet.config
        shape = (len(labels), unet_config.in_channels, unet_config.sample_size, unet_config.sample_size)
        x = latents if latents is not None else torch.randn(shape, generator=generator)
        x = x.to(device=device, dtype=self.unet.dtype)
        no_class = torch.full_like(labels, len(self.config.class_names))
        self.scheduler.set_timesteps(num_inference_steps)
        for t in self.progress_bar(self.scheduler.timesteps):
            step = torch.full((len(labels),), int(t), device=device, dtype=torch.long)
            if scale == 1.0:
                eps = self.unet(x, step, class_labels=labels).sample
            else:
                both = self.unet(torch.cat([x, x]), torch.cat([step, step]),
                                 class_labels=torch.cat([labels, no_class])).sample
                conditional, unconditional = both.chunk(2)
                eps = unconditional + scale * (conditional - unconditional)
            x = self.scheduler.step(eps, t, x, generator=generator).prev_sample
        if output_type == "pt":
            images = x.clamp(-1, 1).cpu()
            return ImagePipelineOutput(images=images) if return_dict else (images,)
        pixels = (x / 2 + 0.5).clamp(0, 1).cpu().permute(0, 2, 3, 1).float().numpy()
        out = self.numpy_to_pil(pixels) if output_type == "pil" else pixels
        return ImagePipelineOutput(images=out) if return_dict else (out,)
