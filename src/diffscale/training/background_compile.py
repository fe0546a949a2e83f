"""The compiled step built by a process of its own while training steps eager
(``runtime.compile_while_training``; the switch itself: ``training/switch.py``).

A node's first rank starts ``python -m diffscale.training.background_compile``. It builds the
same run with ``build_run`` -- as rank 0 of the run's world size, in a process group of its own,
so that DDP wraps the network and splits its graph as on every rank -- runs its first step, which
compiles forward and backward into the run's kernel folder (inductor's FX graph and AOT autograd
caches, Triton's kernels and, where ``runtime.compile_cache`` is on, the traced network), and
exits. The training process then compiles from that folder, which takes seconds instead of
minutes. It starts as soon as the run's config is settled, before the training process builds its
data and network, so that its own imports and build run beside those (4 s sooner in a cold small
job on an H200); its output is held until the run has passed its checks (a refused run writes
nothing), then goes to ``RUN_DIR/background-compile.log`` (``-nodeK`` on the other nodes), with
the seconds its build and its compile took and dynamo's own account of the compile.

While it times kernel configurations on the GPU the eager steps pause (``training/tuning_pause.py``).
The process takes at most ``MEMORY_SHARE`` of the GPU's memory: a compile that needs more fails
there, not in the training process, which then compiles by itself. It leaves as many cores to the
ranks as there are ranks on the node, ignores the signals a scheduler sends before a time limit
(the training process checkpoints and ends it) and ends itself when the training process is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from diffscale.config import RunConfig, Toggle, from_dict
from diffscale.runtime import user_env
from diffscale.training import tuning_pause

if TYPE_CHECKING:
    from diffscale.runtime.device import DevicePolicy
    from diffscale.runtime.distributed import DistContext

MEMORY_SHARE = 0.5
"""The share of the GPU's memory the background process may take (the training process keeps the rest)."""
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "TORCHELASTIC_ERROR_FILE")
"""The launcher's variables, not passed on: the background process is no rank of the run."""


def compiles_while_training(cfg: RunConfig, policy: DevicePolicy) -> bool:
    """Whether this run steps eager while its compiled step is built in the background: where it
    compiles and ``runtime.compile_while_training`` is on, or ``auto`` on CUDA with data that does
    not arrive over time (a spool, which a second reader would wait for too)."""
    setting = cfg.runtime.compile_while_training
    if not policy.compile or setting == Toggle.OFF:
        return False
    return setting == Toggle.ON or (policy.device.type == "cuda" and not cfg.data.source.startswith("spool:"))


def log_name(node_rank: int) -> str:
    return "background-compile.log" if node_rank == 0 else f"background-compile-node{node_rank}.log"


@dataclass
class BackgroundCompile:
    """The background process of one node, seen from the training process that started it."""

    process: subprocess.Popen[bytes]
    output: HeldOutput
    tuning_marker: Path | None = None
    """The file that exists while it times kernel configurations on the GPU (None: the eager steps
    do not pause, ``runtime.eager_pauses_for_tuning`` off)."""
    started: float = field(default_factory=time.perf_counter)
    """``time.perf_counter()`` when it started."""
    took_s: float | None = None
    """Seconds from its start to its end, once it has ended."""
    paused_s: float = 0.0
    """Seconds the eager steps waited for its kernel timing (``wait_while_tuning``)."""

    @classmethod
    def start(cls, cfg: RunConfig, ctx: DistContext, kernels: Path) -> BackgroundCompile:
        """Start it for ``cfg`` as this node's rank ``ctx.local_rank`` device sees it, compiling into
        ``kernels``; its output is held until ``keep_log``."""
        env = environment(os.environ, ctx.info.local_world_size)
        if user_env.USER_COMPILE_CACHE is None:  # the folder is passed; set by the user, it is passed on as set
            env.pop("TORCHINDUCTOR_CACHE_DIR", None)
        marker = None
        if cfg.runtime.eager_pauses_for_tuning != Toggle.OFF:  # per process: jobs sharing a kernel folder do not wait
            marker = Path(tempfile.gettempdir()) / f"diffscale-tuning-{os.getpid()}-{ctx.local_rank}"
            tuning_pause.remove(marker)  # a file of an earlier process of this number
        process = subprocess.Popen(command(kernels, ctx.local_rank, ctx.world_size, marker), stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # it failed at once: its log says why
            process.stdin.write(json.dumps(cfg.to_dict()).encode())
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        return cls(process, HeldOutput.read(process.stdout), marker)

    def wait_while_tuning(self, drain: Callable[[], None]) -> float:
        """Before an eager step: while it times kernels on the GPU, ``drain`` the GPU (wait for the
        queued kernels) and wait (``tuning_pause``); the seconds waited."""
        if self.tuning_marker is None:
            return 0.0
        waited = tuning_pause.wait_while_tuning(self.tuning_marker, drain=drain, gone=self.ended)
        self.paused_s += waited
        return waited

    @property
    def log(self) -> Path | None:
        """Its log file, once the run keeps one."""
        return self.output.path

    def keep_log(self, run_dir: Path, node_rank: int) -> Path:
        """Write its output so far, and from now on, to ``run_dir``'s log of this node."""
        run_dir.mkdir(parents=True, exist_ok=True)
        return self.output.keep(run_dir / log_name(node_rank))

    def ended(self) -> bool:
        """Whether it has ended (successfully or not)."""
        if self.process.poll() is None:
            return False
        if self.took_s is None:
            self.took_s = time.perf_counter() - self.started
        return True

    @property
    def failed(self) -> bool:
        return self.ended() and self.process.returncode != 0

    def stop(self) -> bool:
        """End it if it still runs; True when it had to be ended before it finished."""
        if self.tuning_marker is not None:
            tuning_pause.remove(self.tuning_marker)
        if self.ended():
            return False
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return True


class HeldOutput:
    """A child's output read by a thread of its own (the pipe never fills): held in memory until
    ``keep`` names its file, then written there line by line."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._held: list[bytes] = []
        self._file: IO[bytes] | None = None
        self._ended = False
        self._lock = threading.Lock()

    @classmethod
    def read(cls, stream: IO[bytes]) -> HeldOutput:
        output = cls()
        threading.Thread(target=output._relay, args=(stream,), name="diffscale-background-output",
                         daemon=True).start()
        return output

    def keep(self, path: Path) -> Path:
        with self._lock:
            self._file = path.open("wb")
            self._file.write(b"".join(self._held))
            self._file.flush()
            self._held, self.path = [], path
            if self._ended:  # it had ended before the run kept its log
                self._file.close()
        return path

    def _relay(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                with self._lock:
                    if self._file is None:
                        self._held.append(line)
                    else:
                        self._file.write(line)
                        self._file.flush()
        with self._lock:
            self._ended = True
            if self._file is not None:
                self._file.close()


def command(kernels: Path, local_rank: int = 0, world_size: int = 1, tuning_marker: Path | None = None) -> list[str]:
    """The background process's command line (its run's config goes to its stdin as JSON)."""
    marker = ["--tuning-marker", str(tuning_marker)] if tuning_marker is not None else []
    return [sys.executable, "-m", "diffscale.training.background_compile", "--kernels", str(kernels),
            "--local-rank", str(local_rank), "--world-size", str(world_size), *marker]


def environment(base: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    """``base`` as the background process gets it: without the launcher's variables (it is no rank
    of the run), with its compile workers (``compile_threads``, unless set) and unbuffered output."""
    env = {k: v for k, v in base.items() if k not in LAUNCH_VARS}
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads(local_world_size)))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def compile_threads(local_world_size: int) -> int:
    """Inductor's compile workers in the background process: this node's cores less one per rank."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        cpus = os.cpu_count() or 1
    return max(1, cpus - local_world_size)


def main(argv: list[str] | None = None) -> int:
    from diffscale.runtime.bytecode import keep_bytecode

    keep_bytecode()  # as the command line does, before torch loads
    parser = argparse.ArgumentParser(prog="python -m diffscale.training.background_compile",
                                     description="Build a run's compiled step into its kernel folder (the run's "
                                                 "config as JSON on stdin); started by training, not by hand.")
    parser.add_argument("--kernels", type=Path, required=True, help="the kernel folder to compile into")
    parser.add_argument("--local-rank", type=int, default=0, help="whose GPU on this node")
    parser.add_argument("--world-size", type=int, default=1, help="the run's world size")
    parser.add_argument("--tuning-marker", type=Path, help="a file to keep while timing kernels on the GPU")
    args = parser.parse_args(argv)
    _end_with(os.getppid())
    for name in ("SIGINT", "SIGUSR1", "SIGUSR2"):  # a terminal's ^C, a scheduler's time-limit warning
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    cfg = from_dict(json.loads(sys.stdin.read()))
    started = time.perf_counter()
    if args.tuning_marker is not None:
        tuning_pause.mark_kernel_timing(args.tuning_marker)
    _compile_one_step(cfg, args.kernels, local_rank=args.local_rank, world_size=args.world_size)
    print(f"compiled: forward and backward built in {time.perf_counter() - started:.1f} s into {args.kernels}",
          flush=True)
    return 0


def _compile_one_step(cfg: RunConfig, kernels: Path, *, local_rank: int, world_size: int) -> None:
    """Build ``cfg``'s run as rank 0 of ``world_size`` on this node's GPU ``local_rank`` and run its first step."""
    import torch
    from rich.console import Console

    from diffscale.runtime.device import configure_backends, pick_device, resolve_policy, synchronize
    from diffscale.runtime.distributed import LaunchInfo, alone_as_rank_zero
    from diffscale.training.build import build_run
    from diffscale.training.telemetry import seconds_since_process_start

    console = Console(soft_wrap=True)

    def say(text: str) -> None:
        console.print(text, highlight=False)

    launch = LaunchInfo(launcher="single", local_rank=local_rank, world_size=world_size)
    device = pick_device(cfg.runtime.device, local_rank)
    policy = resolve_policy(cfg.runtime, device)
    configure_backends(policy)
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(MEMORY_SHARE, device)
    else:  # its one step's kernels: the cores are the training's
        torch.set_num_threads(1)
    ctx = alone_as_rank_zero(launch, device)
    try:
        with tempfile.TemporaryDirectory(prefix="diffscale-background-compile-") as scratch:
            with build_run(cfg, Path(scratch), ctx, policy, console=console, say=say, compile_cache=True,
                           kernels=kernels) as run:
                say(f"built the run in {seconds_since_process_start():.1f} s since this process started")
                compiling = time.perf_counter()
                run.runner.step()
                run.compile_cache.save_once()  # the traced network, where runtime.compile_cache keeps it
                synchronize(device)
                run.mark_step_built()
                say(f"the first step compiled and ran in {time.perf_counter() - compiling:.1f} s; dynamo's "
                    f"account of it:\n{torch._dynamo.utils.compile_times(repr='str', aggregate=True)}")
    finally:
        ctx.shutdown()


def _end_with(parent: int) -> None:
    """End this process once ``parent`` (the training process) is gone: a killed job leaves no compile behind."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=watch, name="diffscale-parent-watch", daemon=True).start()


if __name__ == "__main__":
    code = main()
    # Its kernels are on disk and it has said so: the interpreter's teardown (the compile workers'
    # pool, the CUDA context) ended it 5-6 s after that line on an H200 (2026-11-29), seconds the
    # training process waited for before it switched. The workers end themselves once it is gone.
    sys.stdout.flush()
    os._exit(code)
