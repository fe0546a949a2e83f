"""Generation latency of any task: ``Task.generate`` on the network as ``diffscale sample``
runs it (compiled with CUDA graphs on CUDA), timed call by call.

``python -m diffscale.bench.latency --preset policy --count 1 --steps 10 --repeats 200 --json OUT``
prints and writes p50 / p99 / mean milliseconds per call (a policy's action chunk at batch 1,
a field ensemble of ``count`` samples, an image grid). Weights are freshly initialised:
latency does not depend on their values.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from diffscale import config as C
from diffscale.diffusion.inference import sampling_network
from diffscale.runtime.device import pick_device, synchronize
from diffscale.tasks.registry import build_task


def _timed(call: Callable[[int], object], device: torch.device, warmup: int, repeats: int) -> dict[str, float]:
    for seed in range(warmup):  # compilation and CUDA-graph recording happen here
        call(seed)
    synchronize(device)
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        call(seed)
        synchronize(device)
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def measure(args: argparse.Namespace) -> dict:
    """The task's generation as ``diffscale sample`` runs it; with ``--compare-loop`` also with
    ``runtime.sampling_graph off`` (a graph per network call) side by side, and how far apart
    the two outputs of one seed are."""
    cfg = C.resolve_config(C.ConfigSources(preset=args.preset, device=args.device, overrides=args.set or []))
    device = pick_device(cfg.runtime.device)
    task = build_task(cfg, device)
    torch.manual_seed(cfg.train.seed)
    net = task.build_network().to(device)
    network = sampling_network(net, cfg.runtime)

    def caller(on: torch.nn.Module) -> Callable[[int], torch.Tensor]:
        return lambda seed: task.generate(on, count=args.count, steps=args.steps, seed=seed,
                                          sampler=args.sampler).samples

    record = {"preset": args.preset, "task": cfg.task, "count": args.count, "steps": args.steps,
              "sampler": args.sampler, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
              "threads": torch.get_num_threads(), "compiled": network.policy.compile, "repeats": args.repeats,
              "loop_graph": network.loops is not None, **_timed(caller(network), device, args.warmup, args.repeats),
              "torch": torch.__version__}
    if args.profile:
        from diffscale.bench.profile import profile_steps

        call = caller(network)
        record["profile"] = profile_steps(lambda: call(0), args.profile, device, top=args.top)
    if args.compare_loop:
        per_call = sampling_network(copy.deepcopy(net), dataclasses.replace(cfg.runtime, sampling_graph=C.Toggle.OFF))
        record["per_call_graphs"] = _timed(caller(per_call), device, args.warmup, args.repeats)
        record["max_abs_diff"] = float((caller(network)(0) - caller(per_call)(0)).abs().max())
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diffscale.bench.latency")
    parser.add_argument("--preset", required=True)
    parser.add_argument("--count", type=int, default=1, help="samples per call (a policy's batch, a field ensemble)")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps per call")
    parser.add_argument("--sampler", choices=["ddim", "ddpm"], default="ddim")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--set", action="append", metavar="KEY=VALUE")
    parser.add_argument("--compare-loop", action="store_true",
                        help="also time runtime.sampling_graph off (one graph per network call) side by side")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile N calls: GPU kernel time per call by kind, the top kernels")
    parser.add_argument("--top", type=int, default=15, help="with --profile: how many kernels to list")
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args(argv)
    for name in ("count", "steps", "repeats", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    record = measure(args)
    print(json.dumps(record))
    if args.profile:
        from diffscale.bench.profile import render_profile

        print(render_profile({**record, "recipe": "generate", "world_size": 1, "step_s": record["p50_ms"] / 1e3}))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
