"""Pictures of sampled action chunks: a PNG of the chunks, a GIF of their denoising."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from diffscale.io.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_DIMS = 6
"""Action dimensions drawn against time (the rest are left out of the picture)."""


def _figure(chunks: torch.Tensor, title: str = "") -> Figure:
    """One panel of dimension 0 against dimension 1 (the path, for position actions; when A >= 2)
    and one per dimension against time, every chunk (B, T, A) a line in its own colour."""
    import matplotlib

    matplotlib.use("Agg")  # no display on clusters; must precede pyplot
    import matplotlib.pyplot as plt

    values = chunks.float().numpy()
    count, horizon, dims = values.shape
    plane = dims >= 2
    panels = int(plane) + min(dims, MAX_DIMS)
    fig, axes = plt.subplots(1, panels, figsize=(3.2 * panels, 3.2), squeeze=False)
    colours = plt.get_cmap("viridis")(np.linspace(0, 1, max(count, 2)))
    if plane:
        ax = axes[0, 0]
        for chunk, colour in zip(values, colours, strict=False):  # at least 2 colours, even for 1 chunk
            ax.plot(chunk[:, 0], chunk[:, 1], color=colour, lw=1)
            ax.plot(chunk[0, 0], chunk[0, 1], "o", color=colour, ms=3)
        ax.set(xlabel="action 0", ylabel="action 1", title="chunks (dot: first step)")
        ax.set_aspect("equal", adjustable="datalim")
    for d in range(min(dims, MAX_DIMS)):
        ax = axes[0, int(plane) + d]
        for chunk, colour in zip(values, colours, strict=False):  # at least 2 colours, even for 1 chunk
            ax.plot(np.arange(horizon), chunk[:, d], color=colour, lw=1)
        ax.set(xlabel="step", title=f"action {d}")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_chunks(chunks: torch.Tensor, path: Path) -> Path:
    """Draw ``count`` sampled action chunks (count, T, A) to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = _figure(chunks, f"{chunks.shape[0]} sampled action chunks")
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return path


def save_chunk_animation(frames: list[torch.Tensor], path: Path, *, fps: int = 8) -> Path:
    """The denoising of the chunks, one picture per trajectory frame (each (count, T, A)), as a GIF."""
    import imageio.v2 as imageio
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    stills: list[npt.ArrayLike] = []
    for i, frame in enumerate(frames):
        fig = _figure(frame, f"denoising {i + 1}/{len(frames)}")
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        stills.append(np.asarray(canvas.buffer_rgba())[..., :3].copy())
        plt.close(fig)
    with atomic_path(path) as tmp:
        imageio.mimsave(tmp, [*stills, *[stills[-1]] * fps], duration=1.0 / fps, loop=0)  # hold the end a second
    return path
