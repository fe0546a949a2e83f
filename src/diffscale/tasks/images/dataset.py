"""An image data spec opened for training: uint8 (N, C, S, S) items, memory-mapped from the decoded
cache where the spec reads files, with labels and class names where the data has them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from diffscale.data.decoded_cache import Built, CachedArray, entry_of, open_or_build
from diffscale.tasks.images import formats
from diffscale.tasks.images.decoded import cached_decode, stderr_say
from diffscale.tasks.images.formats import parse_spec
from diffscale.tasks.images.jobs import Listing, fingerprint
from diffscale.tasks.images.sources import load_images, load_labels

DECODED_KINDS = ("imagefolder", "webdataset", "parquet")
"""Kinds decoded image by image, in parallel."""
ARRAY_KINDS = ("npz", "emnist", "mnist")
"""Kinds read as whole arrays (tasks/images/sources.py), then kept in the same cache."""


@dataclass(frozen=True)
class ImageData:
    """``images``: uint8 (N, C, S, S), a read-only memory map or a tensor; ``labels``: int64 (N,) or None."""

    images: np.ndarray | torch.Tensor
    labels: np.ndarray | None = None
    class_names: list[str] | None = None
    cache: Path | None = None
    """The cache entry's array file; None for data generated in memory (builtin)."""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape))

    def tensor(self) -> torch.Tensor:
        """All items in memory (a copy of a memory map)."""
        if isinstance(self.images, np.ndarray):
            return torch.from_numpy(np.array(self.images))
        return self.images


def fit_channels(images: torch.Tensor, channels: int) -> torch.Tensor:
    """(N, C, S, S) -> (N, channels, S, S): the first channel kept, or a gray one repeated."""
    if not channels or images.shape[1] == channels:
        return images
    return images[:, :1] if channels == 1 else images.expand(-1, channels, -1, -1)


def open_image_data(spec: str, size: int, *, max_items: int = 0, max_bad_fraction: float = 0.01,
                    say: Callable[[str], None] = stderr_say) -> ImageData:
    """Open ``spec`` at ``size`` px: decoded once into the cache, memory-mapped after that."""
    parsed = parse_spec(spec)
    source = spec if not max_items else f"{spec} (first {max_items})"
    if parsed.kind in DECODED_KINDS:
        cached = cached_decode(source, parsed.kind, size, _listing(parsed.kind, parsed.path, parsed.option,
                                                                   size, max_items),
                               max_bad_fraction=max_bad_fraction, say=say)
    elif parsed.kind in ARRAY_KINDS:
        cached = _cached_array(spec, source, parsed.kind, parsed.path, size, max_items, say)
    else:
        return ImageData(load_images(spec, size, max_items=max_items))
    images = cached.array[:max_items] if max_items else cached.array
    labels = cached.labels[:max_items] if cached.labels is not None and max_items else cached.labels
    return ImageData(images, labels, cached.class_names, cached.path)


def _listing(kind: str, path: str, option: str, size: int, max_items: int) -> Listing:
    if kind == "imagefolder":
        return formats.list_imagefolder(Path(path), size, max_items)
    if kind == "webdataset":
        return formats.list_webdataset(path, size)
    return formats.list_table(path, option, size)


def _array_files(kind: str, path: str) -> list[Path]:
    root = Path(path)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def _cached_array(spec: str, source: str, kind: str, path: str, size: int, max_items: int,
                  say: Callable[[str], None]) -> CachedArray:
    files = _array_files(kind, path)
    if not files:
        load_images(spec, size, max_items=max_items)  # the reader's own message for a missing path

    def build(out: Path) -> Built:
        images = load_images(spec, size, max_items=max_items).numpy()
        out.write_bytes(np.ascontiguousarray(images).tobytes())
        labels, names = _array_labels(spec, kind, Path(path), images.shape[0])
        return Built(tuple(images.shape), labels, names)

    name, label = entry_of(kind, source, size)
    return open_or_build(name, label, fingerprint(files), build, say=say)


def _array_labels(spec: str, kind: str, path: Path, count: int) -> tuple[np.ndarray | None, list[str] | None]:
    """(labels (count,) int64, class names) of an array source: an npz file's ``labels`` (or ``y``)
    array when it has one label per image (no names), EMNIST/MNIST's labels file with the split's
    class names; (None, None) where there are none."""
    if kind in ("emnist", "mnist"):
        found = load_labels(spec, count)
        return (found[0].numpy(), found[1]) if found is not None else (None, None)
    if kind != "npz" or path.suffix != ".npz":
        return None, None
    with np.load(path, allow_pickle=False) as archive:
        key = next((k for k in ("labels", "y") if k in archive.files), None)
        if key is None:
            return None, None
        labels = np.asarray(archive[key]).reshape(-1)
    if labels.shape[0] < count or not np.issubdtype(labels.dtype, np.integer):
        return None, None
    return labels[:count].astype(np.int64), None

