"""Sample grids (PNG) and denoising animations (GIF, and MP4 where an ffmpeg writer is installed),
written from image tensors in [-1, 1]."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import torch

from diffscale.io.atomic import atomic_path

MP4_WRITER = "imageio_ffmpeg"
"""imageio's MP4 writer; its PyPI package (imageio-ffmpeg, diffscale's ``video`` extra) ships an ffmpeg binary."""
MP4_MISSING = ("no MP4 writer is installed, so only the GIF was written -- pip install imageio-ffmpeg "
               "(or diffscale[video]): it ships its own ffmpeg binary")


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """(B, C, H, W) in [-1, 1] -> (B, H, W, C) uint8."""
    arr = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return arr.permute(0, 2, 3, 1).cpu().numpy()


def grid_shape(count: int) -> tuple[int, int]:
    """(rows, columns) of the grid ``make_grid`` tiles ``count`` images into by default."""
    columns = max(1, math.ceil(math.sqrt(count)))
    return math.ceil(count / columns), columns


def make_grid(images: torch.Tensor, *, columns: int | None = None, pad: int = 2, scale: int = 1) -> np.ndarray:
    """Tile (B, C, H, W) images in [-1, 1] into one (rows*H, cols*W, C) uint8 array."""
    pictures = to_uint8(images)
    count, h, w, c = pictures.shape
    columns = columns or grid_shape(count)[1]
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
    with atomic_path(path) as tmp:
        Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(tmp)
    return path


def save_animation(frames: list[torch.Tensor], path: Path, *, fps: int = 12) -> list[Path]:
    """Write the denoising trajectory as GIF (and MP4 when an ffmpeg writer is installed)."""
    import imageio.v2 as imageio

    scale = _upscale_for(frames[0])
    stills = [make_grid(f, scale=scale) for f in frames]
    stills = [s[..., 0] if s.shape[-1] == 1 else s for s in stills]
    stills += [stills[-1]] * fps  # hold the final grid for a second
    # imageio's stub asks for list[ArrayLike] (invariant), which a list of arrays is not to mypy
    with atomic_path(path) as tmp:
        imageio.mimsave(tmp, stills, duration=1.0 / fps, loop=0)  # type: ignore[arg-type]
    written = [path]
    if not mp4_writer_installed():  # GIF only; `diffscale sample --gif` says so
        return written
    mp4 = path.with_suffix(".mp4")
    rgb = [np.repeat(s[..., None], 3, axis=2) if s.ndim == 2 else s for s in stills]
    with atomic_path(mp4) as tmp:
        imageio.mimsave(tmp, rgb, fps=fps, macro_block_size=1)  # type: ignore[arg-type]
    written.append(mp4)
    return written


def mp4_writer_installed() -> bool:
    return importlib.util.find_spec(MP4_WRITER) is not None
