"""``diffscale sample``: a trained run's samples written by its task (image grids, GIFs and MP4s
through io/media.py), and how sampling shows its progress (a bar on a terminal, a line per stage in
a log)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from diffscale.diffusion.sampler import SamplerKind, SamplingProgress
from diffscale.errors import check_seed
from diffscale.runtime.resources import check_fits, memory_free

if TYPE_CHECKING:
    import torch

    from diffscale.tasks.base import Task


class LogProgress:
    """Sampling progress for a log or a pipe: a line when it starts, one per quarter of the
    steps (a DDPM run of 1,000 steps on a CPU takes minutes), and one if it stops early."""

    STAGES = 4

    def __init__(self, write: Callable[[str], None]) -> None:
        self._write = write
        self._steps = 0
        self._done = 0
        self._stage = 0
        self._t0 = 0.0

    def start(self, kind: SamplerKind, steps: int, count: int) -> None:
        self._steps, self._done, self._stage, self._t0 = steps, 0, 0, time.perf_counter()
        self._write(f"sampling: {count} samples, {kind.value}, {steps} steps")

    def advance(self, done: int) -> None:
        self._done = done
        reached = done * self.STAGES // max(self._steps, 1)
        if reached > self._stage:
            self._stage = reached
            elapsed = time.perf_counter() - self._t0
            self._write(f"sampling: step {done}/{self._steps} ({done / max(self._steps, 1):.0%}), {elapsed:.1f} s")

    def finish(self) -> None:
        if self._done < self._steps:
            self._write(f"sampling: stopped at step {self._done}/{self._steps}")


class TerminalProgress:
    """Sampling progress on a terminal: a bar with steps done, elapsed and remaining time."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TimeRemainingColumn(), console=console)
        self._task: TaskID | None = None

    def start(self, kind: SamplerKind, steps: int, count: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task(f"sampling {count} ({kind.value})", total=steps)

    def advance(self, done: int) -> None:
        if self._task is not None:
            self._progress.update(self._task, completed=done)

    def finish(self) -> None:
        self._progress.stop()


def progress_for(console: Console) -> SamplingProgress:
    """A bar where a person watches a terminal, lines where the output goes to a log."""
    if console.is_terminal:
        return TerminalProgress(console)
    return LogProgress(lambda line: console.print(line, markup=False, highlight=False))


TRAJECTORY_FRAMES = 26
"""Frames a denoising animation holds (``trajectory_every = steps // 25``, and the last)."""


def bytes_per_sample(task: Task, network: torch.nn.Module, *, frames: int = 0) -> int:
    """Memory one more sample takes while a batch is generated, estimated from one forward pass on
    one example: the sample, its noise and the network's output (each the size of the input), the
    trajectory's frames, and the network's three largest activations (one in flight, its input,
    a skip connection held for the way up)."""
    import torch

    from diffscale.diffusion.sampler import evaluating

    inputs = task.example_inputs(1)
    sizes: list[int] = []

    def record(module: torch.nn.Module, args: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            sizes.append(output.numel() * output.element_size())

    leaves = [m for m in network.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(record) for m in leaves]
    try:
        with torch.no_grad(), evaluating(network):
            network(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    sample = inputs[0].numel() * 4
    return sample * (3 + frames) + sum(sorted(sizes)[-3:])


def sample_run(run_dir: Path | str, *, n: int = 64, steps: int = 50, seed: int = 0, sampler: str = "ddim",
               gif: bool = False, out: Path | str | None = None, device: str | None = None,
               console: Console | None = None) -> list[Path]:
    """Generate ``n`` samples from a trained run's EMA weights (``diffscale sample``, from Python).

    Writes ``out`` (default ``RUN_DIR/samples/sample_step..._seed.._ddimN.png``, N the steps run),
    plus the denoising trajectory as GIF (and MP4 where imageio-ffmpeg is installed) with ``gif``;
    returns the files written. ``steps`` above the run's ``diffusion.num_train_timesteps`` run that
    many, as a line says. Progress goes to ``console`` (default: stderr).
    """
    from diffscale.diffusion.inference import sampling_network
    from diffscale.diffusion.sampler import reporting
    from diffscale.inference.trained import load_trained
    from diffscale.tasks.base import preview

    check_seed(seed, "sample_run's seed")
    run = load_trained(Path(run_dir), device)
    status = console or Console(stderr=True, soft_wrap=True)
    trained = run.cfg.diffusion.num_train_timesteps
    if steps > trained:  # the sampler cannot take more steps than there are timesteps
        status.print(f"note: --steps {steps} is more than the {trained} timesteps this run was trained with: "
                     f"sampling {trained} steps", markup=False, highlight=False)
        steps = trained
    need = n * bytes_per_sample(run.task, run.network, frames=TRAJECTORY_FRAMES if gif else 0)
    device_name = str(next(run.network.parameters()).device)
    fits = max(1, int(n * memory_free(device_name)[0] // max(need, 1)))
    check_fits(need, f"sampling --n {n}", f"ask for fewer at a time (--n {min(fits, n - 1)} or less) and "
               "run sample again with other --seed values", device_name)
    name = f"sample_step{run.step:08d}_seed{seed}_{sampler}{steps}.png"
    target = Path(out) if out else run.run_dir / "samples" / name
    with reporting(progress_for(status)):
        return preview(run.task, sampling_network(run.network, run.cfg.runtime), target, count=n, steps=steps,
                       seed=seed, sampler=sampler, trajectory=gif)
