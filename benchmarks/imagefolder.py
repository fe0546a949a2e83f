"""A generated image folder for the data benchmarks: ``N`` images in 10 class subfolders, each a
seeded 8x8 random pattern scaled up (so they compress like photographs rather than noise),
written by a pool of processes.

``python -m benchmarks.imagefolder DIR --images 100000 --side 64 --format png --workers 16``
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from multiprocessing import get_context
from pathlib import Path

CLASSES = 10


def _write(root: Path, side: int, suffix: str, index: int) -> None:
    import numpy as np
    from PIL import Image

    folder = root / f"c{index % CLASSES}"
    base = np.random.default_rng(index).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    picture = Image.fromarray(base).resize((side, side), Image.Resampling.BILINEAR)
    if suffix == "jpg":
        picture.save(folder / f"{index:08d}.jpg", quality=90)
    else:
        picture.save(folder / f"{index:08d}.{suffix}")


def make_image_folder(root: Path, images: int, *, side: int = 64, suffix: str = "png", workers: int = 0) -> Path:
    """Write ``images`` images of ``side`` px (``png`` or ``jpg``) under ``root`` with ``workers``
    processes (0: one per CPU); an existing folder with that many images is kept as it is."""
    root = Path(root)
    if root.is_dir() and sum(1 for _ in root.rglob(f"*.{suffix}")) == images:
        return root
    for c in range(CLASSES):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
    write = partial(_write, root, side, suffix)
    procs = workers or os.cpu_count() or 1
    if procs == 1:
        for index in range(images):
            write(index)
        return root
    with get_context("fork").Pool(procs) as pool:  # a bench script: no CUDA in the parent
        for _ in pool.imap_unordered(write, range(images), chunksize=256):
            pass
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--images", type=int, required=True)
    parser.add_argument("--side", type=int, default=64)
    parser.add_argument("--format", choices=("png", "jpg"), default="png")
    parser.add_argument("--workers", type=int, default=0, help="processes writing images (0: one per CPU)")
    args = parser.parse_args(argv)
    make_image_folder(args.root, args.images, side=args.side, suffix=args.format, workers=args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
