"""Generation latency of any task: ``Task.generate`` on the network as ``diffscale sample``
runs it (compiled with CUDA graphs on CUDA), timed call by call.

``python -m benchmarks.latency --preset policy --count 1 --steps 10 --repeats 200 --json OUT``
prints and writes p50 / p99 / mean milliseconds per call (a policy's action chunk at batch 1,
a field ensemble of ``count`` samples, an image grid). Weights are freshly initialised:
latency does not depend on their values.

``--controller`` times a policy's ``Controller.select_action`` instead, step by step for a
batch of ``count`` environments: the steps that re-plan (one in ``action_horizon``: the
denoising loop, replayed as one CUDA graph on CUDA) and the steps that only pop the queue,
each as p50 / p99 / mean milliseconds (``--repeats`` re-plans).
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
from diffscale.diffusion.inference import InferenceNetwork, sampling_network
from diffscale.runtime.device import pick_device, synchronize
from diffscale.tasks.base import Task
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
    return _percentiles(times)


def _task_and_network(args: argparse.Namespace, many_calls: bool = False
                      ) -> tuple[C.RunConfig, torch.device, Task, torch.nn.Module, InferenceNetwork]:
    """The preset's task and a seeded network, eager and as ``diffscale sample`` runs it
    (``many_calls``: as ``Controller.load`` runs it)."""
    cfg = C.resolve_config(C.ConfigSources(preset=args.preset, device=args.device, overrides=args.set or []))
    device = pick_device(cfg.runtime.device)
    task = build_task(cfg, device)
    torch.manual_seed(cfg.train.seed)
    net = task.build_network().to(device)
    return cfg, device, task, net, sampling_network(net, cfg.runtime, many_calls=many_calls)


def measure(args: argparse.Namespace) -> dict:
    """The task's generation as ``diffscale sample`` runs it; with ``--compare-loop`` also with
    ``runtime.sampling_graph off`` (a graph per network call) side by side, and how far apart
    the two outputs of one seed are."""
    cfg, device, task, net, network = _task_and_network(args)

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


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def measure_controller(args: argparse.Namespace) -> dict:
    """``select_action`` of a policy ``Controller`` on the network as ``diffscale sample`` runs it,
    fed the same observations (B, O) every step: re-planning steps and pop-only steps apart."""
    from diffscale.tasks.policy.controller import Controller

    cfg, device, task, net, network = _task_and_network(args, many_calls=True)
    controller = Controller(task, network, sampler=args.sampler, steps=args.steps)
    preview = getattr(task, "preview_obs", None)
    assert preview is not None  # Controller refused anything but a policy
    obs = preview[torch.arange(args.count) % len(preview), -1].numpy()
    controller.reset(0)
    replan: list[float] = []
    pop: list[float] = []
    replan_cpu: list[float] = []
    first = time.perf_counter()
    controller.select_action(obs)  # the first call compiles where the network is compiled
    first_call_s = time.perf_counter() - first
    controller.reset(0)
    for i in range((args.warmup + args.repeats) * controller.action_horizon):
        start, cpu = time.perf_counter(), time.process_time()
        controller.select_action(obs)
        synchronize(device)
        elapsed = time.perf_counter() - start
        if i >= args.warmup * controller.action_horizon:  # compilation and graph recording are in the warm-up
            (replan if controller.queued == 1 else pop).append(elapsed)
            if controller.queued == 1:
                replan_cpu.append(time.process_time() - cpu)
    return {"preset": args.preset, "task": cfg.task, "mode": "controller", "batch": args.count, "steps": args.steps,
            "sampler": args.sampler, "action_horizon": controller.action_horizon,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "threads": torch.get_num_threads(), "compiled": network.policy.compile,
            "loop_graph": network.loops is not None, "first_call_s": first_call_s,
            "replans": len(replan), "replan": _percentiles(replan),
            # this process's CPU time per re-plan: the host's work, apart from waiting for a busy machine's cores
            "replan_process_cpu": _percentiles(replan_cpu),
            "pop": _percentiles(pop), "torch": torch.__version__, **_compare_loop(args, cfg, task, net, controller)}


def _compare_loop(args: argparse.Namespace, cfg: C.RunConfig, task: object, net: torch.nn.Module,
                  controller: object) -> dict:
    """With ``--compare-loop``: how far one seeded plan of the controller is from the same plan
    with ``runtime.sampling_graph off`` (the loop in Python, a graph per network call)."""
    if not args.compare_loop:
        return {}
    from diffscale.tasks.policy.controller import Controller

    assert isinstance(controller, Controller)
    per_call = sampling_network(copy.deepcopy(net), dataclasses.replace(cfg.runtime, sampling_graph=C.Toggle.OFF))
    other = Controller(task, per_call, sampler=args.sampler, steps=args.steps)
    history = controller.task.preview_obs[: args.count]
    plans = []
    for each in (controller, other):
        each.reset(1)
        plans.append(each.plan(history))
    return {"max_abs_diff": float((plans[0] - plans[1]).abs().max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.latency")
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
    parser.add_argument("--controller", action="store_true",
                        help="time a policy Controller's select_action: re-planning and pop-only steps apart")
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args(argv)
    for name in ("count", "steps", "repeats", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    record = measure_controller(args) if args.controller else measure(args)
    print(json.dumps(record))
    if args.profile:
        from diffscale.bench.profile import render_profile

        print(render_profile({**record, "recipe": "generate", "world_size": 1, "step_s": record["p50_ms"] / 1e3}))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
