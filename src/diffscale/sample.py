"""Sample grids (PNG), denoising animations (GIF, and MP4 where an ffmpeg writer is
installed) and how sampling shows its progress (a bar on a terminal, a line per stage in a log).
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
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

from .diffusion.sampler import SamplerKind, SamplingProgress

MP4_WRITER = "imageio_ffmpeg"
"""imageio's MP4 writer; its PyPI package (imageio-ffmpeg, diffscale's ``video`` extra) ships an ffmpeg binary."""
MP4_MISSING = ("no MP4 writer is installed, so only the GIF was written -- pip install imageio-ffmpeg "
               "(or diffscale[video]): it ships its own ffmpeg binary")


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [-1, 1] -> (B, H, W, C) uint8."""
    arr = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 1).cpu().numpy()


def make_grid(images: torch.Tensor, *, columns: int | None = None, pad: int = 2, scale: int = 1) -> np.ndarray:
    """Tile (B, C, H, W) images in [-1, 1] into one (rows*H, cols*W, C) uint8 array."""
    pictures = to_uint8(images)
    count, h, w, c = pictures.shape
    columns = columns or math.ceil(math.sqrt(count))
    rows = math.ceil(count / columns)
    grid = np.zeros((rows * (h + pad) + pad, columns * (w + pad) + pad, c), dtype=np.uint8)
    for i, picture in enumerate(pictures):
        r, col = divmod(i, columns)
        top, left = pad + r * (h + pad), pad + col * (w + pad)
        grid[top:top + h, left:left + w] = picture
    if scale > 1:
        grid = grid.repeat(scale, axis=0).repeat(scale, axis=1)
    return grid


def _upscale_for(images: torch.Tensor) -> int:
    side = images.shape[-1]
    return max(1, 64 // side)  # small images are hard to see: show them at least 64 px


def save_grid(images: torch.Tensor, path: Path) -> Path:
    from PIL import Image

    grid = make_grid(images, scale=_upscale_for(images))
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(path)
    return path


def save_animation(frames: list[torch.Tensor], path: Path, *, fps: int = 12) -> list[Path]:
    """Write the denoising trajectory as GIF (and MP4 when an ffmpeg writer is installed)."""
    import imageio.v2 as imageio

    scale = _upscale_for(frames[0])
    stills = [make_grid(f, scale=scale) for f in frames]
    stills = [s[..., 0] if s.shape[-1] == 1 else s for s in stills]
    stills += [stills[-1]] * fps  # hold the final grid for a second
    path.parent.mkdir(parents=True, exist_ok=True)
    # imageio's stub asks for list[ArrayLike] (invariant), which a list of arrays is not to mypy
    imageio.mimsave(path, stills, duration=1.0 / fps, loop=0)  # type: ignore[arg-type]
    written = [path]
    if not mp4_writer_installed():  # GIF only; `diffscale sample --gif` says so
        return written
    mp4 = path.with_suffix(".mp4")
    rgb = [np.repeat(s[..., None], 3, axis=2) if s.ndim == 2 else s for s in stills]
    imageio.mimsave(mp4, rgb, fps=fps, macro_block_size=1)  # type: ignore[arg-type]
    written.append(mp4)
    return written


def mp4_writer_installed() -> bool:
    return importlib.util.find_spec(MP4_WRITER) is not None


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


def sample_run(run_dir: Path | str, *, n: int = 64, steps: int = 50, seed: int = 0, sampler: str = "ddim",
               gif: bool = False, out: Path | str | None = None, device: str | None = None,
               console: Console | None = None) -> list[Path]:
    """Generate ``n`` samples from a trained run's EMA weights (``diffscale sample``, from Python).

    Writes ``out`` (default ``RUN_DIR/samples/sample_step..._seed.._ddimN.png``, N the steps run),
    plus the denoising trajectory as GIF (and MP4 where imageio-ffmpeg is installed) with ``gif``;
    returns the files written. ``steps`` above the run's ``diffusion.num_train_timesteps`` run that
    many, as a line says. Progress goes to ``console`` (default: stderr).
    """
    from .diffusion.inference import sampling_network
    from .diffusion.sampler import reporting
    from .tasks import preview
    from .trained import load_trained

    run = load_trained(Path(run_dir), device)
    status = console or Console(stderr=True, soft_wrap=True)
    trained = run.cfg.diffusion.num_train_timesteps
    if steps > trained:  # the sampler cannot take more steps than there are timesteps
        status.print(f"note: --steps {steps} is more than the {trained} timesteps this run was trained with: "
                     f"sampling {trained} steps", markup=False, highlight=False)
        steps = trained
    name = f"sample_step{run.step:08d}_seed{seed}_{sampler}{steps}.png"
    target = Path(out) if out else run.run_dir / "samples" / name
    with reporting(progress_for(status)):
        return preview(run.task, sampling_network(run.network, run.cfg.runtime), target, count=n, steps=steps,
                       seed=seed, sampler=sampler, trajectory=gif)
