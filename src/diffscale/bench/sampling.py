"""DDIM sampling speed: diffscale's sampler vs diffusers' DDIMPipeline, same UNet and batch.

``python -m diffscale.bench.sampling --preset small --batch 256 --steps 50 --json OUT``
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from diffscale.runtime.device import synchronize


def _timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (and compilation)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    from diffusers import DDIMPipeline

    from diffscale import config as C
    from diffscale.diffusion import Conditioned, GaussianDiffusion, Sampler, SamplerKind, sample
    from diffscale.diffusion.inference import sampling_network
    from diffscale.errors import UserError
    from diffscale.tasks.images.network import Denoiser, build_unet

    parser = argparse.ArgumentParser(prog="python -m diffscale.bench.sampling")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="config override, e.g. runtime.channels_last=off")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)

    cfg = C.resolve_config(C.ConfigSources(preset=args.preset, overrides=args.set or []))
    if not isinstance(cfg.model, C.ModelConfig):
        raise UserError(f"preset {args.preset} is a {cfg.task} run: this benchmark compares image sampling "
                        "with diffusers' DDIMPipeline", "pick an image preset (tiny, small, medium, large, xl)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    unet = build_unet(cfg.model, 1).to(device).eval()
    diffusion = GaussianDiffusion(cfg.diffusion)
    shape = (args.batch, 1, cfg.model.sample_size, cfg.model.sample_size)

    pipe = DDIMPipeline(unet=unet, scheduler=diffusion.ddim_scheduler())
    pipe.set_progress_bar_config(disable=True)

    def reference():
        pipe(batch_size=args.batch, num_inference_steps=args.steps, generator=torch.Generator().manual_seed(0),
             output_type="np")

    # The network exactly as `diffscale sample` runs it (bf16, channels_last, compiled on CUDA).
    denoise = sampling_network(Denoiser(copy.deepcopy(unet)), cfg.runtime)  # the reference keeps its own
    policy = denoise.policy

    def ours():
        sample(Conditioned(denoise), diffusion, shape, sampler=Sampler(SamplerKind.DDIM, args.steps),
               generator=torch.Generator().manual_seed(0), device=device)

    with torch.no_grad():
        ref_s = _timed(reference, device, args.repeats)
        ours_s = _timed(ours, device, args.repeats)
    record = {"preset": args.preset, "batch": args.batch, "ddim_steps": args.steps,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
              "ddimpipeline_s": ref_s, "diffscale_s": ours_s, "speedup": ref_s / ours_s,
              "images_per_s": args.batch / ours_s, "precision": policy.precision.value, "compiled": policy.compile,
              "channels_last": policy.channels_last, "overrides": args.set or []}
    Path(args.json).write_text(json.dumps(record, indent=1))
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
