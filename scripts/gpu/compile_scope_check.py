"""Compile scope, measured: an image preset's UNet compiled whole, as training compiles it, against
each of its ``ResnetBlock2D`` and ``Attention`` layers compiled on its own (regional compilation:
layers of one shape share one traced graph, the rest of the network runs eagerly). Each scope runs
in a fresh process with empty kernel caches, so both compile cold; each prints one JSON line: the
seconds to the end of the first training step (tracing and compiling included), the graphs dynamo
compiled, inductor's FX-graph cache misses, and the median time of a step after warm-up.

    PYTHONPATH=src python scripts/gpu/compile_scope_check.py [--preset small] [--batch N] [--backend B]

On a GPU the steps are training's: bf16 autocast, fused AdamW, the compile options of training's
CUDA graphs (``reduce-overhead``) with the forced channels-last layout, FlexAttention. On the CPU
(a dry run, or the CPU figure of docs/benchmarks.md) float32 and inductor's default mode.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

SCOPES = ("whole", "blocks")


def compiled(scope: str, net: Any, backend: str, cuda: bool) -> Any:
    """``net`` compiled whole, or each of its ResnetBlock2D and Attention layers (``scope`` blocks)."""
    import torch
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D

    from diffscale.runtime.parallelize import compile_options

    options = compile_options("reduce-overhead" if cuda else "default", layout_opt=cuda)
    compile_args = {"options": options} if backend == "inductor" else {"backend": backend}
    torch._dynamo.config.recompile_limit = 64  # one compiled graph per layer shape in the blocks scope
    if scope == "whole":
        return torch.compile(net, **compile_args)
    for module in net.modules():
        if isinstance(module, (ResnetBlock2D, Attention)):
            module.compile(dynamic=False, **compile_args)
    return net


def child(scope: str, preset: str, batch: int | None, backend: str) -> dict:
    import torch

    from diffscale.config.presets import PRESETS
    from diffscale.runtime.flex_attention import use_flex_attention
    from diffscale.tasks.images.network import Denoiser, build_unet

    cfg = PRESETS[preset].build()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    batch = batch or cfg.train.batch_per_gpu
    torch.manual_seed(0)
    net = Denoiser(build_unet(cfg.model, 1)).to(device)
    if cuda:
        use_flex_attention(net, 8192)
        net = net.to(memory_format=torch.channels_last)
    model = compiled(scope, net, backend, cuda)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=cuda)
    size = cfg.model.sample_size
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        noise = torch.randn(batch, 1, size, size, device=device)
        t = torch.randint(0, 1000, (batch,), device=device)
        xt = (0.5 * torch.randn_like(noise) + 0.8 * noise).contiguous(
            memory_format=torch.channels_last if cuda else torch.contiguous_format)
        with autocast:
            eps = model(xt, t)
        torch.nn.functional.mse_loss(eps.float(), noise).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def synced() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    start = synced()
    step()
    first = synced() - start
    for _ in range(5):  # CUDA graphs record on the second and third calls
        step()
    times = []
    for _ in range(30 if cuda else 3):
        begin = synced()
        step()
        times.append(synced() - begin)
    from torch._dynamo.utils import counters
    return {"scope": scope, "preset": preset, "batch": batch, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "backend": backend, "first_step_s": round(first, 2), "graphs": counters["stats"]["unique_graphs"],
            "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
            "step_ms": round(1000 * statistics.median(times), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch", type=int, help="per step (default: the preset's batch per GPU)")
    parser.add_argument("--backend", default="inductor", help="inductor, or aot_eager for a quick dry run")
    parser.add_argument("--child", choices=SCOPES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.preset, args.batch, args.backend)), flush=True)
        return 0
    for scope in SCOPES:
        with tempfile.TemporaryDirectory(prefix="compile-scope-") as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
            command = [sys.executable, __file__, "--child", scope, "--preset", args.preset, "--backend", args.backend,
                       *(["--batch", str(args.batch)] if args.batch else [])]
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True)
            sys.stdout.write(done.stdout)
            if done.returncode:
                print(f"{scope}: exit code {done.returncode}", file=sys.stderr)
                return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
