"""DDIM sampling speed: diffscale's sampler vs diffusers' DDIMPipeline, same UNet and batch.

``python -m diffscale.bench.sampling --preset small --batch 256 --steps 50 --json OUT``

The pipeline runs as shipped (fp32 weights, eager). ``--strong-reference`` times it also in the
strongest setup a user could build from diffusers' own advice: fp16 weights, channels_last and
``torch.compile(pipe.unet, mode=..., fullgraph=True)`` (``--pipeline-compile-mode``, default
``reduce-overhead``: CUDA graphs), each ratio printed. ``--preset`` repeats (one process, so the
imports are paid once); ``--batch 0`` takes each preset's batch of docs/benchmarks.md. One preset
writes one JSON record, several a list (rewritten as each preset finishes).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _pipeline(unet: torch.nn.Module, scheduler: Any, *, batch: int, steps: int, strong: str | None,
              fullgraph: bool = True) -> Callable[[], None]:
    """A call of diffusers' DDIMPipeline on ``unet`` as shipped (``strong`` None), or with fp16
    weights, channels_last and the UNet compiled in mode ``strong``."""
    from diffusers import DDIMPipeline

    if strong is not None:
        # Module.to(memory_format=...) is supported; torch's overloads of `to` leave it out
        unet = copy.deepcopy(unet).half().to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    pipe = DDIMPipeline(unet=unet, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    if strong is not None and next(unet.parameters()).device.type == "cuda":
        pipe.unet = torch.compile(pipe.unet, mode=strong, fullgraph=fullgraph)

    def call() -> None:
        pipe(batch_size=batch, num_inference_steps=steps, generator=torch.Generator().manual_seed(0),
             output_type="np")

    return call


def _strong_timed(unet: torch.nn.Module, scheduler: Any, *, batch: int, steps: int, mode: str,
                  device: torch.device, repeats: int) -> tuple[float, bool]:
    """The strong pipeline's seconds per call, and whether its UNet compiled as one graph
    (``fullgraph=True``, as diffusers advises); where dynamo cannot, timed with graph breaks."""
    try:
        call = _pipeline(unet, scheduler, batch=batch, steps=steps, strong=mode)
        return _timed(call, device, repeats), True
    except Exception as exc:  # dynamo's refusal to trace one graph: the pipeline still runs compiled
        print(f"note: the pipeline's UNet does not compile as one graph ({type(exc).__name__}: {exc}); "
              "timed with graph breaks", file=sys.stderr, flush=True)
        torch._dynamo.reset()
        call = _pipeline(unet, scheduler, batch=batch, steps=steps, strong=mode, fullgraph=False)
        return _timed(call, device, repeats), False


def _as_diffusers_unet(task: Any, network: torch.nn.Module) -> torch.nn.Module:
    """The task's network as diffusers' ``UNet2DModel``, the same weights, read back from the task's
    own export (a ``DDPMPipeline`` folder), as a user of the exported model loads it."""
    import tempfile

    from diffusers import UNet2DModel

    with tempfile.TemporaryDirectory() as tmp:
        task.export(copy.deepcopy(network), Path(tmp) / "export")
        unet: torch.nn.Module = UNet2DModel.from_pretrained(str(Path(tmp) / "export" / "unet"),
                                                            low_cpu_mem_usage=False)
    return unet


def measure(preset: str, *, batch: int, steps: int, repeats: int, overrides: list[str],
            strong: str | None) -> dict:
    """One preset: the pipeline (as shipped, and in the strong setup when ``strong`` names a
    compile mode) against diffscale's sampler on the same UNet, batch and steps."""
    from diffscale import config as C
    from diffscale.diffusion import Conditioned, GaussianDiffusion, Sampler, SamplerKind, sample
    from diffscale.diffusion.inference import sampling_network
    from diffscale.errors import UserError
    from diffscale.tasks.registry import build_task

    cfg = C.resolve_config(C.ConfigSources(preset=preset, overrides=overrides))
    if not isinstance(cfg.model, C.ModelConfig):
        raise UserError(f"preset {preset} is a {cfg.task} run: this benchmark compares image sampling "
                        "with diffusers' DDIMPipeline", "pick an image preset (tiny, small, medium, large, xl)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    task = build_task(cfg, device, load_data=False)  # one channel: the sizes of the config alone
    network = task.build_network()
    unet = _as_diffusers_unet(task, network).to(device).eval()
    diffusion = GaussianDiffusion(cfg.diffusion)
    shape = (batch, 1, cfg.model.sample_size, cfg.model.sample_size)
    # The network exactly as `diffscale sample` runs it (bf16, channels_last, compiled on CUDA).
    denoise = sampling_network(network.to(device), cfg.runtime)  # the references keep their own copy
    policy = denoise.policy

    def ours():
        sample(Conditioned(denoise), diffusion, shape, sampler=Sampler(SamplerKind.DDIM, steps),
               generator=torch.Generator().manual_seed(0), device=device)

    with torch.no_grad():
        ref_s = _timed(_pipeline(unet, diffusion.ddim_scheduler(), batch=batch, steps=steps, strong=None),
                       device, repeats)
        ours_s = _timed(ours, device, repeats)
        strong_s, fullgraph = None, True
        if strong is not None:
            strong_s, fullgraph = _strong_timed(unet, diffusion.ddim_scheduler(), batch=batch, steps=steps,
                                                mode=strong, device=device, repeats=repeats)
    return {"preset": preset, "batch": batch, "ddim_steps": steps,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "ddimpipeline_s": ref_s, "diffscale_s": ours_s, "speedup": ref_s / ours_s,
            "images_per_s": batch / ours_s, "precision": policy.precision.value, "compiled": policy.compile,
            "channels_last": policy.channels_last, "overrides": overrides,
            **({} if strong is None else {
                "pipeline_strong_s": strong_s, "speedup_vs_strong": strong_s / ours_s if strong_s else None,
                "pipeline_strong_setup": f"fp16 weights, channels_last, torch.compile(mode={strong!r}, "
                                         f"fullgraph={fullgraph})"
                                         f"{'' if device.type == 'cuda' else ' (not compiled: CPU)'}"})}


def main(argv: list[str] | None = None) -> int:
    from diffscale.bench.runs import SAMPLING_BATCH

    parser = argparse.ArgumentParser(prog="python -m diffscale.bench.sampling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", action="append", help="repeatable (default small)")
    parser.add_argument("--batch", type=int, default=256, help="0: each preset's batch (small 256, medium 64, xl 16)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="config override, e.g. runtime.channels_last=off")
    parser.add_argument("--strong-reference", action="store_true",
                        help="also time the pipeline with fp16 weights, channels_last and a compiled UNet")
    parser.add_argument("--pipeline-compile-mode", default="reduce-overhead",
                        choices=["default", "reduce-overhead", "max-autotune"],
                        help="torch.compile mode of the strong reference's UNet (default reduce-overhead)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    records = []
    for preset in args.preset or ["small"]:
        batch = args.batch or SAMPLING_BATCH.get(preset, 16)
        record = measure(preset, batch=batch, steps=args.steps, repeats=args.repeats, overrides=args.set or [],
                         strong=args.pipeline_compile_mode if args.strong_reference else None)
        print(json.dumps(record), flush=True)
        if record.get("speedup_vs_strong") is not None:
            print(f"{preset} batch {batch}: diffscale {record['diffscale_s']:.4f} s, pipeline as shipped "
                  f"{record['ddimpipeline_s']:.4f} s ({record['speedup']:.2f} x), strongest pipeline "
                  f"{record['pipeline_strong_s']:.4f} s ({record['speedup_vs_strong']:.2f} x)", flush=True)
        records.append(record)
        # written after each preset, so a call cut short keeps the presets it finished
        Path(args.json).write_text(json.dumps(records[0] if len(records) == 1 else records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
