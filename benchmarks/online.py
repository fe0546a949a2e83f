"""Online field training as a coupled simulation runs it: one training round, ensemble
sampling, and ``push`` while training runs in the background thread.

``python -m benchmarks.online --preset field-icon --json OUT`` fills the replay buffer
with the preset's round (48 output steps x 80 cells = 3,840 samples), then times
``train_for(steps=2400)`` (10 epochs at batch 16, after a compiling warm-up round),
``sample`` of 80 cells x 16 members x 50 steps with seeds 1, 2, 3, ... (a simulation numbering
its output steps: each call's start noise was drawn ahead during the one before; how each came
is in ``start_noise``) and again with seeds nothing foresees (``unforeseen_seeds``: drawn in
the call), and every ``push`` of 80 samples while ``start()`` trains in the background. Prints
and writes one JSON record.

``--profile-sampling N`` adds where a sampling call's time goes (``sampling_profile``): the
host's parts of each timed call (``EnsembleSampler.last_split``: preparing the inputs,
launching, waiting for the GPU, copying the result out), the GPU's kernel time per call from
``torch.profiler`` over N more calls (busy, and the span from a call's first kernel to the
next call's), and the host functions with the most time of their own (cProfile, N calls).
Wall time well above the GPU's busy time with little ``wait`` is the host; ``wait`` close to
the wall time is the GPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from diffscale import config as C
from diffscale.errors import UserError
from diffscale.online import OnlineTrainer
from diffscale.online.trainer import BACKGROUND_SWITCH_INTERVAL_S
from diffscale.runtime.device import synchronize


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.array(seconds) * 1e3
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max())}


def measure(args: argparse.Namespace) -> dict:
    cfg = C.resolve_config(C.ConfigSources(preset=args.preset, device=args.device, overrides=args.set or []))
    rng = np.random.default_rng(0)
    if not isinstance(cfg.model, C.FieldModelConfig):
        raise UserError(f"preset '{args.preset}' is a {cfg.task} run; online training is measured on fields",
                        "use a field preset, e.g. --preset field-icon")
    cells, fine = 80, cfg.model.x_dim or 256
    coarse = cfg.model.cond_dim or 7
    with tempfile.TemporaryDirectory() as tmp:
        trainer = OnlineTrainer(Path(tmp) / "run", cfg, capacity=args.outputs * cells)
        device = trainer.run_state.device
        for step in range(args.outputs):
            trainer.push(rng.normal(size=(cells, coarse)), rng.normal(size=(cells, fine)), sim_time=600.0 * step)
        assert trainer.ready()
        trainer.train_for(steps=args.warmup)  # compiles; CUDA graphs recorded
        synchronize(device)
        start = time.perf_counter()
        trainer.train_for(steps=args.round_steps)
        synchronize(device)
        round_s = time.perf_counter() - start
        round_host = _round_host_profile(trainer, args.host_profile, device) if args.host_profile else None
        cond = rng.normal(size=(cells, coarse))
        trainer.sample(cond, n_members=args.members, steps=args.sample_steps)  # compiles the sampling path
        sampling, splits, noise = [], [], []
        for seed in range(1, args.repeats + 1):  # numbered output steps after the warm-up call's seed 0: drawn ahead
            start = time.perf_counter()
            trainer.sample(cond, n_members=args.members, steps=args.sample_steps, seed=seed)
            sampling.append(time.perf_counter() - start)  # sample() returns numpy: synchronised
            splits.append(dict(trainer.sampler.last_split) if trainer.sampler is not None else {})
            noise.append(trainer.sampler.last_noise if trainer.sampler is not None else "")
        unforeseen = []
        for seed in range(10_000, 10_000 + 7 * args.repeats, 7):  # seeds nothing foresees: drawn in the call
            start = time.perf_counter()
            trainer.sample(cond, n_members=args.members, steps=args.sample_steps, seed=seed)
            unforeseen.append(time.perf_counter() - start)
        profile = None
        if args.profile_sampling:
            profile = _sampling_profile(trainer, cond, args, splits, device)
        pushes, first = [], trainer.run_state.step
        trainer.start(switch_interval_s=args.switch_interval_ms / 1e3)
        for step in range(args.pushes):
            c, x = rng.normal(size=(cells, coarse)), rng.normal(size=(cells, fine))
            start = time.perf_counter()
            trainer.push(c, x, sim_time=600.0 * (args.outputs + step))
            pushes.append(time.perf_counter() - start)
            time.sleep(args.push_gap_ms / 1e3)  # the simulation computing its next output step
        trainer.stop()
        trained_meanwhile = trainer.run_state.step - first
    return {"preset": args.preset, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
            "threads": torch.get_num_threads(), "round_steps": args.round_steps, "batch": cfg.train.batch_per_gpu,
            "round_s": round_s, "steps_per_s": args.round_steps / round_s,
            **({"round_host_profile": round_host} if round_host is not None else {}),
            "sampling": {"cells": cells, "members": args.members, "steps": args.sample_steps, **_percentiles(sampling),
                         "start_noise": {how: noise.count(how) for how in sorted(set(noise))},
                         "unforeseen_seeds": _percentiles(unforeseen)},
            **({"sampling_profile": profile} if profile is not None else {}),
            "push": {"rows": cells, "count": args.pushes, "gap_ms": args.push_gap_ms,
                     "switch_interval_ms": args.switch_interval_ms, **_percentiles(pushes),
                     "steps_trained_meanwhile": trained_meanwhile},
            "torch": torch.__version__}


def _round_host_profile(trainer: OnlineTrainer, steps: int, device: torch.device) -> list[dict]:
    """cProfile of one ``train_for(steps)``: the host functions with the most time of their
    own, per training step (compare ``bench.worker --host-profile``, the same steps bare)."""
    from diffscale.bench.worker import host_profile

    rows = host_profile(lambda: trainer.train_for(steps=steps), 1, device, top=15)
    return [{**row, "own_ms": row["own_ms"] / steps, "cum_ms": row["cum_ms"] / steps, "calls": row["calls"] / steps}
            for row in rows]


def _sampling_profile(trainer: OnlineTrainer, cond: np.ndarray, args: argparse.Namespace,
                      splits: list[dict[str, float]], device: torch.device) -> dict:
    """Where a sampling call's time goes (see the module docstring)."""
    from diffscale.bench.profile import profile_steps
    from diffscale.bench.worker import host_profile

    def call() -> None:
        trainer.sample(cond, n_members=args.members, steps=args.sample_steps, seed=1)

    parts = {key: float(np.median([s[key] for s in splits if key in s])) for key in (splits[0] if splits else {})}
    kernels = profile_steps(call, args.profile_sampling, device, top=8)
    return {"host_split_p50_ms": parts, "profiler": kernels,
            "host_functions": host_profile(call, args.profile_sampling, device, top=12),
            "sampling_network": {"records_calls": bool(trainer.sampler and trainer.sampler.records),
                                 "interop_threads": torch.get_num_interop_threads()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.online")
    parser.add_argument("--preset", default="field-icon")
    parser.add_argument("--outputs", type=int, default=48, help="output steps of 80 cells that fill the buffer")
    parser.add_argument("--round-steps", type=int, default=2400, help="steps of the timed training round")
    parser.add_argument("--warmup", type=int, default=100, help="untimed steps first (compilation)")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--sample-steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=20, help="timed sampling calls")
    parser.add_argument("--profile-sampling", type=int, default=0, metavar="N",
                        help="also profile N sampling calls: host split, GPU kernel time, host functions "
                             "(record field sampling_profile)")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="also cProfile a train_for of N steps after the timed round (record field "
                             "round_host_profile, per step)")
    parser.add_argument("--pushes", type=int, default=200, help="timed pushes while training runs")
    parser.add_argument("--push-gap-ms", type=float, default=5.0)
    parser.add_argument("--switch-interval-ms", type=float, default=BACKGROUND_SWITCH_INTERVAL_S * 1e3,
                        help="the interpreter's thread switch interval while training runs in the background "
                             "(Python's default is 5)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--set", action="append", metavar="KEY=VALUE")
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args(argv)
    record = measure(args)
    print(json.dumps(record))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
