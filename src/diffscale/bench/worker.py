"""One benchmark measurement, run by every rank of a (torchrun) process group.

``python -m diffscale.bench.worker --preset small --recipe fast --steps 50 --json OUT``.
Rank 0 writes one JSON record: samples/s, step time, peak memory, FLOPs and achieved
TFLOP/s, the data-wait share, GPU utilisation and start-up time (compilation included).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.console import Console

from diffscale import config as C
from diffscale.bench.profile import profile_steps
from diffscale.runtime.device import DevicePolicy, synchronize
from diffscale.runtime.distributed import DistContext

if TYPE_CHECKING:  # annotations only; the functions import these where they run
    from diffscale.bench.plain import PlainRunner
    from diffscale.training.state import RunState
    from diffscale.training.step import StepRunner

_T0 = float(os.environ.get("DIFFSCALE_BENCH_T0", time.time()))


def _progress(ctx, what: str) -> None:
    """A time-stamped stage on stderr (rank 0), so a log shows where a slow worker is."""
    if ctx.is_main:
        print(f"[bench {time.time() - _T0:7.1f} s] {what}", file=sys.stderr, flush=True)


def matmul_peak_tflops(device: torch.device) -> float | None:
    """The card's measured bf16 matmul rate (8192^3, 10 products after 3 warm-ups)."""
    if device.type != "cuda":
        return None
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    synchronize(device)
    return 2 * n**3 * 10 / (time.perf_counter() - start) / 1e12


def count_step_flops(run_state) -> float:
    """FLOPs of one forward + backward of the per-GPU micro-batch (torch.utils.flop_counter).

    Counted eagerly on a slice of the batch and scaled (every counted op is linear in the
    batch), so the count needs a fraction of a full eager step's memory."""
    from torch.utils.flop_counter import FlopCounterMode

    from diffscale.runtime.flex_attention import sdpa_attention

    cfg = run_state.cfg
    b = cfg.train.batch_per_gpu
    sub = max(1, b // 16)
    inputs = run_state.task.example_inputs(sub)
    counter = FlopCounterMode(display=False)
    with counter, sdpa_attention(run_state.net):
        with run_state.policy.autocast():
            out = run_state.net(*inputs)
        out.float().pow(2).mean().backward()
    run_state.net.zero_grad(set_to_none=True)
    if run_state.device.type == "cuda":
        torch.cuda.empty_cache()
    return float(counter.get_total_flops()) * b / sub * cfg.train.grad_accum


class UtilSampler:
    """GPU utilisation, SM clock and board power (NVML), sampled every 100 ms over the timed
    window. The clock and power tell a host-level slowdown (cards of one host throttling
    when all run at once) from one caused by the code."""

    def __init__(self, device: torch.device) -> None:
        self.samples: dict[str, list[float]] = {"util": [], "sm_mhz": [], "watts": []}
        self._stop = threading.Event()
        self._handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
            self._nvml = pynvml
        except Exception:  # NVML missing or restricted: reported as unknown
            self._handle = None

    def __enter__(self):
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        nvml, handle = self._nvml, self._handle
        while not self._stop.wait(0.1):
            try:
                self.samples["util"].append(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                self.samples["sm_mhz"].append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
                self.samples["watts"].append(nvml.nvmlDeviceGetPowerUsage(handle) / 1000)
            except Exception:  # a query this driver refuses: keep what was read
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def mean(self, key: str = "util") -> float | None:
        values = self.samples[key]
        return sum(values) / len(values) if values else None


@contextlib.contextmanager
def gpu_turn(spec: str | None, ctx):
    """``DIR:N``: wait until N workers sharing DIR have compiled and warmed up, then hold
    DIR/lock for the timed window, so workers compile side by side but time one at a time.

    Every rank waits on the host (files), never in a collective: a rank parked in an NCCL
    barrier runs a spinning kernel that time-slices the GPU with the job being timed."""
    if not spec:
        yield
        return
    folder, count = spec.rsplit(":", 1)
    folder_path = Path(folder)
    go = folder_path / f"go-{os.environ.get('MASTER_ADDR', '')}-{os.environ.get('MASTER_PORT', os.getpid())}"
    lock = None
    deadline = time.monotonic() + 600  # a worker that died must not stall the others
    if ctx.is_main:
        folder_path.mkdir(parents=True, exist_ok=True)
        (folder_path / f"ready-{os.getpid()}").touch()
        while len(list(folder_path.glob("ready-*"))) < int(count) and time.monotonic() < deadline:
            time.sleep(0.5)
        lock = open(folder_path / "lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX)
        go.touch()
    else:
        while not go.exists() and time.monotonic() < deadline + 600:
            time.sleep(0.2)
    ctx.barrier()
    try:
        yield
    finally:
        ctx.barrier()
        if lock is not None:
            go.unlink(missing_ok=True)
            lock.close()


def _config(args: argparse.Namespace) -> C.RunConfig:
    train: dict = {"steps": 10**9}  # the schedule never ends inside a measurement
    if args.batch:
        train["batch_per_gpu"] = args.batch
    return C.resolve_config(C.ConfigSources(preset=args.preset, recipe=args.recipe, overrides=args.set or [],
                                            fixed={"train": train}))


def _timed_window(runner, device: torch.device, ctx, args: argparse.Namespace) -> dict:
    """The measured part, alone on the GPU when ``--turns`` is given: matmul peak, the timed
    steps with GPU utilisation, the data-wait share, peak memory and the optional profile."""
    with gpu_turn(args.turns, ctx):
        window_start = time.time()
        peak = matmul_peak_tflops(device) if ctx.is_main and args.peak else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the steps below set the peak again
        for _ in range(2):  # steps right after the wait, untimed (clocks, caches)
            runner.step()
        synchronize(device)
        if hasattr(runner, "data_wait_s"):
            runner.data_wait_s = 0.0
        with UtilSampler(device) as util:
            start = time.perf_counter()
            for _ in range(args.steps):
                runner.step()
            synchronize(device)
            elapsed = time.perf_counter() - start
        trace = Path(args.trace) / f"rank{ctx.rank}.json" if args.trace else None
        profile = profile_steps(runner.step, args.profile, device, trace=trace) if args.profile else None
        if profile is not None and ctx.distributed:
            profile["per_rank"] = _per_rank_kernel_time(ctx, profile, device)
        host = host_profile(runner.step, args.host_profile, device) if args.host_profile else None
        return {
            "elapsed": elapsed, "matmul_peak_tflops": peak, "gpu_util": util.mean(),
            "sm_clock_mhz": util.mean("sm_mhz"), "power_w": util.mean("watts"),
            "data_wait_share": _data_share(runner, device, args.steps, elapsed),
            "profile": profile, "host_profile": host, "window": [window_start, time.time()],
            "peak_mem": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
            # CUDA-graph replays allocate nothing: their pools show only in the reserved memory
            "reserved": torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0,
        }


def host_profile(step, steps: int, device: torch.device, top: int = 25) -> list[dict]:
    """Where the host's time goes in ``steps`` steps (cProfile): the functions with the most
    time of their own, in ms per step. A step that the GPU waits for is bound by these."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    synchronize(device)
    profiler.enable()
    for _ in range(steps):
        step()
    synchronize(device)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(((tottime, cumtime, calls, f"{Path(file).name}:{line}({name})")
                   for (file, line, name), (_, calls, tottime, cumtime, _) in stats.items()), reverse=True)
    return [{"function": where, "own_ms": own * 1e3 / steps, "cum_ms": cum * 1e3 / steps, "calls": calls / steps}
            for own, cum, calls, where in rows[:top]]


def _per_rank_kernel_time(ctx, profile: dict, device: torch.device) -> list[dict]:
    """Every rank's communication, other kernel and idle time per step. The all-reduce kernels
    of the rank that finishes its backward last are the transfer alone; the other ranks' also
    hold the wait for it, so the spread tells waiting from moving data. Idle: no kernel on
    the GPU (a rank whose host falls behind makes the others wait in their all-reduce)."""
    comm = profile["kinds"].get("communication", {}).get("ms", 0.0)
    idle = [profile.get(key, float("nan")) for key in ("idle_ms_per_step", "host_gap_ms_per_step")]
    mine = torch.tensor([[comm, profile["total_ms_per_step"] - comm, *idle]], dtype=torch.float64, device=device)
    rows = ctx.gather_rows(mine, 1).tolist()
    return [{"rank": rank, "communication_ms": c, "other_ms": other, "idle_ms": gap, "host_gap_ms": host}
            for rank, (c, other, gap, host) in enumerate(rows)]


def build_recipe(cfg: C.RunConfig, run_dir: Path, ctx: DistContext, policy: DevicePolicy, recipe: str, *,
                 plain_workers: int = 4, prepare=None) -> tuple[RunState, PlainRunner | StepRunner]:
    """The run of ``cfg`` as the recipe trains it: diffscale's (``build_run``, as ``diffscale train``
    builds it) or the plain recipe's loop on the same run state. ``prepare``: called on the new
    state before anything is compiled (FLOP counting)."""
    from diffscale.bench.plain import PlainRunner
    from diffscale.training.build import build_run, new_run_state

    console = Console(quiet=True)
    if recipe == "plain":
        state = new_run_state(cfg, run_dir, ctx, policy, console=console, prepare=prepare)
        return state, PlainRunner(state, workers=plain_workers)
    run = build_run(cfg, run_dir, ctx, policy, console=console, prepare=prepare)
    return run.state, run.runner


def join(cfg: C.RunConfig) -> tuple[DistContext, DevicePolicy]:
    """This process's place in the run (torchrun's ranks, or one process) and its device policy,
    as ``diffscale train`` joins."""
    from diffscale.training import build

    return build.join(cfg, Console(quiet=True))


def measure(args: argparse.Namespace) -> dict | None:
    from diffscale.runtime.parallelize import training_compile_mode

    cfg = _config(args)
    ctx, policy = join(cfg)
    device = ctx.device
    counted: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run_state, runner = build_recipe(cfg, Path(tmp), ctx, policy, args.recipe, plain_workers=args.plain_workers,
                                             prepare=lambda state: counted.append(count_step_flops(state)))
            flops = counted[0]
            _progress(ctx, f"{args.preset} {args.recipe} {args.label}: first step (compiles)")
            runner.step()
            synchronize(device)
            startup = time.time() - _T0  # first step done: imports, data, compilation
            _progress(ctx, "first step done; warm-up")
            for _ in range(max(args.warmup - 1, 0)):
                runner.step()
            synchronize(device)
            ctx.barrier()
            _progress(ctx, "warmed up; waiting for a turn" if args.turns else "warmed up; timing")
            window = _timed_window(runner, device, ctx, args)
            window["step_graph"] = getattr(runner, "whole", None) is not None
            _progress(ctx, "timed")
    finally:
        ctx.shutdown()
    if not ctx.is_main:
        return None
    step_s = window["elapsed"] / args.steps
    samples_s = cfg.effective_batch(ctx.world_size) / step_s
    tflops = flops / step_s / 1e12
    peak = window["matmul_peak_tflops"]
    return {
        "preset": args.preset, "recipe": args.recipe, "world_size": ctx.world_size,
        "nodes": int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("DIFFSCALE_BENCH_NODES", 1))),
        "device": policy.name, "precision": policy.precision.value, "compiled": policy.compile,
        "batch_per_gpu": cfg.train.batch_per_gpu, "effective_batch": cfg.effective_batch(ctx.world_size),
        "steps": args.steps, "warmup": args.warmup, "step_s": step_s, "samples_per_s": samples_s,
        "samples_per_s_per_gpu": samples_s / ctx.world_size, "peak_mem_gib": window["peak_mem"] / 2**30,
        "reserved_gib": window["reserved"] / 2**30,
        "flops_per_step_per_gpu": flops, "tflops_per_gpu": tflops, "matmul_peak_tflops": peak,
        "mfu": (tflops / peak) if peak else None, "data_wait_share": window["data_wait_share"],
        "gpu_util": window["gpu_util"], "sm_clock_mhz": window["sm_clock_mhz"], "power_w": window["power_w"],
        "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "startup_s": startup, "torch": torch.__version__,
        "compile_mode": (None if not policy.compile or args.recipe != "fast" else
                         "default" if window["step_graph"] else training_compile_mode(cfg, policy).value),
        "step_graph": window["step_graph"],  # each step replayed as one recorded CUDA graph
        "channels_last": policy.channels_last, "attention": cfg.runtime.attention.value,
        "flex_min_rows": policy.flex_min_rows if args.recipe == "fast" else None,
        "label": args.label or None, "profile": window["profile"], "graph_breaks": _graph_breaks(),
        "host_profile": window["host_profile"],
        "measured_window": window["window"],  # wall-clock start and end of the measured part
    }


def _graph_breaks() -> int:
    """Graph breaks torch.compile met (each one splits the compiled step)."""
    from torch._dynamo.utils import counters

    return int(sum(counters["graph_break"].values()))


def _data_share(runner, device: torch.device, steps: int, elapsed: float) -> float:
    """Fraction of step time spent waiting for data."""
    if hasattr(runner, "data_wait_s"):  # plain: host time blocked on the DataLoader
        return runner.data_wait_s / max(elapsed, 1e-9)
    # fast: time a few steps' batch draw (indices, noise, gather, augmentation) on its own.
    tr = runner.run_state
    synchronize(device)
    start = time.perf_counter()
    for _ in range(5):
        batch = tr.task.draw(runner.batcher.next_indices(), runner.generator)
        tr.task.examples(batch, slice(0, tr.cfg.train.batch_per_gpu))
    synchronize(device)
    per_step = (time.perf_counter() - start) / 5
    return per_step / (elapsed / steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diffscale.bench.worker")
    parser.add_argument("--preset", required=True)
    parser.add_argument("--recipe", choices=["fast", "plain"], default="fast")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch", type=int, default=0, help="override batch per GPU")
    parser.add_argument("--plain-workers", type=int, default=4)
    parser.add_argument("--peak", action="store_true", help="also measure the bf16 matmul peak")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile N steps after timing")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="cProfile N steps after timing: host functions by own time per step")
    parser.add_argument("--trace", metavar="DIR", help="with --profile: each rank's Chrome trace as DIR/rankR.json")
    parser.add_argument("--turns", help="DIR:N -- compile beside N-1 other workers, time alone")
    parser.add_argument("--label", default="", help="name of this variant in the record")
    parser.add_argument("--set", action="append")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    record = measure(args)
    if record is not None:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
