"""``diffscale sample``: a trained run's samples written by its task (image grids, GIFs and MP4s
through io/media.py), and how sampling shows its progress (a bar on a terminal, a line per stage in
a log)."""

from __future__ import annotations

import os
import re
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
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
from diffscale.errors import UserError, check_seed
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


def bytes_per_sample(task: Task, network: torch.nn.Module, *, frames: int = 0, sampler: str = "ddim",
                     classes: Sequence[str] = (), guidance: float | None = None) -> int:
    """Memory one more sample takes while a batch is generated, estimated from one denoising step
    of one sample as sampling runs it (``classes`` and ``guidance`` as asked): the sample and its
    noise (each the size of the input), the trajectory's frames, the network's output and its
    three largest activations (one in flight, its input, a skip connection held for the way up).
    Classifier-free guidance calls the network on the batch twice over: the output and the
    activations measured are then those of two rows."""
    import torch

    sizes: list[int] = []
    outputs: list[int] = []

    def record(into: list[int]) -> Callable[[torch.nn.Module, object, object], None]:
        def hook(module: torch.nn.Module, args: object, output: object) -> None:
            if isinstance(output, torch.Tensor):
                into.append(output.numel() * output.element_size())
        return hook

    leaves = [m for m in network.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(record(sizes)) for m in leaves]
    hooks.append(network.register_forward_hook(record(outputs)))
    try:
        task.generate(network, count=1, steps=1, seed=0, sampler=sampler, classes=classes, guidance=guidance)
    finally:
        for hook in hooks:
            hook.remove()
    sample = task.example_inputs(1)[0].numel() * 4
    return sample * (2 + frames) + max(outputs, default=sample) + sum(sorted(sizes)[-3:])


def sample_run(run_dir: Path | str, *, n: int = 64, steps: int | None = None, seed: int = 0, sampler: str | None = None,
               gif: bool = False, out: Path | str | None = None, device: str | None = None,
               console: Console | None = None, classes: Sequence[str] = (),
               guidance: float | None = None) -> list[Path]:
    """Generate ``n`` samples from a trained run's EMA weights (``diffscale sample``, from Python).

    A class-conditional run draws ``classes`` (names or indices, each a row block of the grid; none:
    classes spread over the rows) with classifier-free guidance scale ``guidance`` (None: the run's
    ``train.sample_guidance``); other runs refuse both.
    Writes ``out`` (default ``RUN_DIR/samples/sample_step..._seed.._ddimN.png``, N the steps run),
    plus the denoising trajectory as GIF (and MP4 where imageio-ffmpeg is installed) with ``gif``;
    returns the files written. ``sampler`` and ``steps`` default to the run's own
    ``train.sample_sampler`` and ``train.sample_steps`` (DPM-Solver++ 15 since it matched DDIM-50's
    quality at a third of the cost); ``steps`` above the run's ``diffusion.num_train_timesteps`` run
    that many, as a line says. Progress goes to ``console`` (default: stderr).
    """
    from diffscale.diffusion.inference import sampling_network
    from diffscale.diffusion.sampler import reporting
    from diffscale.inference.trained import load_trained
    from diffscale.io.stages import saying
    from diffscale.tasks.base import preview

    check_seed(seed, "sample_run's seed")
    run = load_trained(Path(run_dir), device)
    sampler, steps = run.cfg.train.sampling(sampler, steps)
    status = console or Console(stderr=True, soft_wrap=True)
    trained = run.cfg.diffusion.num_train_timesteps
    if steps > trained:  # the sampler cannot take more steps than there are timesteps
        status.print(f"note: --steps {steps} is more than the {trained} timesteps this run was trained with: "
                     f"sampling {trained} steps", markup=False, highlight=False)
        steps = trained
    need = n * bytes_per_sample(run.task, run.network, frames=TRAJECTORY_FRAMES if gif else 0, sampler=sampler,
                                classes=classes, guidance=guidance)
    device_name = str(next(run.network.parameters()).device)
    fits = max(1, int(n * memory_free(device_name)[0] // max(need, 1)))
    check_fits(need, f"sampling --n {n}", f"ask for fewer at a time (--n {min(fits, n - 1)} or less) and "
               "run sample again with other --seed values", device_name)
    name = f"sample_step{run.step:08d}_seed{seed}_{sampler}{steps}{_class_suffix(classes, guidance)}.png"
    target = Path(out) if out else run.run_dir / "samples" / name
    # a compile (a job that samples longer than ONE_JOB_EAGER_S) is said (io/stages.py), as diffscale eval says it
    with reporting(progress_for(status)), saying(lambda line: status.print(line, markup=False, highlight=False)):
        network = sampling_network(run.network, run.cfg.runtime, one_job=True)
        return preview(run.task, network, target, count=n, steps=steps, seed=seed, sampler=sampler, trajectory=gif,
                       classes=classes, guidance=guidance)


def _class_suffix(classes: Sequence[str], guidance: float | None) -> str:
    """What a file name adds for the classes and the guidance asked (safe characters only)."""
    suffix = ""
    if classes:
        parts = [part for entry in classes for part in str(entry).split(",")]
        names = "-".join(re.sub(r"[^A-Za-z0-9]+", "", part) or "x" for part in parts)
        suffix += f"_class{names[:40]}"
    if guidance is not None:
        suffix += f"_w{guidance:g}"
    return suffix


def read_conditions(path: Path | str) -> np.ndarray:
    """The conditions of ``--cond FILE``: a ``.npy`` array, or the array ``cond`` of a ``.npz``
    archive (as training data stores it), (N, C) numbers without NaN or infinities."""
    path = Path(path)
    fix = "save them with numpy.save(FILE.npy, cond) or numpy.savez(FILE.npz, cond=cond), cond N x C"
    if path.suffix not in (".npy", ".npz"):
        raise UserError(f"--cond '{path}' is neither a .npy nor a .npz file", fix)
    if not path.is_file():
        raise UserError(f"--cond '{path}' does not exist", "check the path")
    try:
        with open(path, "rb") as fid:
            loaded = np.load(fid, allow_pickle=False)
            if isinstance(loaded, np.ndarray):
                cond = loaded
            else:
                with loaded:
                    if "cond" not in loaded.files:
                        held = ", ".join(loaded.files) or "nothing"
                        raise UserError(f"--cond '{path}' has no array 'cond' (it holds: {held})", fix)
                    cond = loaded["cond"]
    except UserError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"cannot read --cond '{path}' ({exc})", fix) from exc
    if cond.ndim != 2 or cond.shape[0] == 0 or cond.dtype.kind not in "iuf":
        raise UserError(f"--cond '{path}' holds an array of shape {cond.shape} ({cond.dtype})", fix)
    if not np.isfinite(cond).all():
        rows = np.flatnonzero(~np.isfinite(cond).all(axis=1))
        raise UserError(f"--cond '{path}' holds NaN or infinite values in {len(rows)} rows (first: row {rows[0]})",
                        "drop or fill those rows")
    return cond.astype(np.float32)


def sample_ensembles(run_dir: Path | str, cond: Any, *, members: int = 16, steps: int | None = None, seed: int = 0,
                     sampler: str | None = None, device: str | None = None) -> np.ndarray:
    """Ensembles of a trained run for your own conditions (``diffscale sample --cond``, from
    Python): cond (N, C) in the data's units -> (N, members, *x_shape) float32 in the data's
    units, from the run's EMA weights. The same seed gives the same ensembles. ``sampler`` and
    ``steps`` default to the run's ``train.sample_sampler`` and ``train.sample_steps``."""
    from diffscale.diffusion.inference import sampling_network
    from diffscale.inference.trained import load_trained

    run = load_trained(Path(run_dir), device)
    sampler, steps = run.cfg.train.sampling(sampler, steps)
    steps = min(steps, run.cfg.diffusion.num_train_timesteps)
    network = sampling_network(run.network, run.cfg.runtime, one_job=True)
    return run.task.sample_for(network, cond, members=members, steps=steps, seed=seed, sampler=sampler).numpy()


def write_ensembles(run_dir: Path | str, cond_file: Path | str, out: Path | str | None, *, members: int,
                    steps: int | None, seed: int, sampler: str | None, device: str | None) -> Path:
    """``diffscale sample RUN --cond FILE``: ``out`` (default ``RUN_DIR/samples/ensembles_...npz``)
    holding ``ensembles`` (N, members, *x_shape) and ``cond`` (N, C), in the data's units; written
    to a temporary file and renamed, so it is complete or absent."""
    cond = read_conditions(cond_file)
    ensembles = sample_ensembles(run_dir, cond, members=members, steps=steps, seed=seed, sampler=sampler,
                                 device=device)
    target = Path(out) if out else Path(run_dir) / "samples" / f"ensembles_{Path(cond_file).stem}_seed{seed}.npz"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        with open(partial, "wb") as fh:
            np.savez(fh, ensembles=ensembles, cond=cond)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
