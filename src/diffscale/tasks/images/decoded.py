"""Image data sets decoded once, in parallel, into the decoded cache (data/decoded_cache.py).

``imagefolder``, ``webdataset`` and ``parquet`` specs are listed here, cut into jobs of a few
hundred images, decoded by a process pool (one worker per CPU this process may use) and written
in listing order as uint8 (N, C, S, S); ``npz``, ``emnist`` and ``mnist`` are read by
tasks/images/sources.py once and kept the same way. Unreadable images are skipped and counted;
more than ``data.max_bad_fraction`` of them ends the run with a message naming a few.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diffscale.data.decoded_cache import Built, CachedArray, entry_of, open_or_build
from diffscale.errors import UserError
from diffscale.tasks.images.formats import table_rows, tar_samples
from diffscale.tasks.images.jobs import Job, Listing

GRAY_MODES = ("L", "1", "I", "I;16", "LA")


@dataclass
class Decoded:
    """A job's images (k, 3, S, S) uint8, in order, with what was seen on the way."""

    images: np.ndarray
    labels: list[int]
    all_gray: bool
    bad: list[str] = field(default_factory=list)
    modes: set[str] = field(default_factory=set)
    sizes: set[tuple[int, int]] = field(default_factory=set)
    total: int = 0


def _picture_to_array(picture: object, size: int) -> tuple[np.ndarray, bool]:
    """A PIL image -> (3, size, size) uint8 (gray repeated), and whether it was gray."""
    import torch

    from diffscale.tasks.images.sources import resize_square

    gray = picture.mode in GRAY_MODES  # type: ignore[attr-defined]
    arr = np.asarray(picture.convert("L" if gray else "RGB"), dtype=np.float32)  # type: ignore[attr-defined]
    tensor = torch.from_numpy(arr)
    tensor = tensor.unsqueeze(0) if tensor.ndim == 2 else tensor.permute(2, 0, 1)
    out = resize_square(tensor.unsqueeze(0), size)[0].round().clamp(0, 255).to(torch.uint8)
    return out.expand(3, -1, -1).numpy(), gray


def _raw_items(job: Job) -> Iterator[tuple[str, bytes | str, int]]:
    """(name, bytes or a path, label or -1) for each image of ``job``, in order."""
    if job.kind == "files":
        for index, path in enumerate(job.items):
            yield path, path, job.labels[index] if job.labels else -1
    elif job.kind == "tar":
        yield from tar_samples(Path(job.items[0]))
    else:
        yield from table_rows(Path(job.items[0]), job.start, job.stop, job.column, job.label_column)


def decode_job(job: Job) -> Decoded:
    """Decode one job (runs in a pool worker). Unreadable images are named in ``bad``."""
    import torch
    from PIL import Image, UnidentifiedImageError

    torch.set_num_threads(1)  # one worker per CPU already
    arrays, labels, bad, gray_all = [], [], [], True
    modes: set[str] = set()
    sizes: set[tuple[int, int]] = set()
    total = 0
    for name, raw, label in _raw_items(job):
        total += 1
        try:
            with Image.open(raw if isinstance(raw, str) else io.BytesIO(raw)) as picture:
                picture.load()
                modes.add(picture.mode)
                sizes.add(picture.size)
                array, gray = _picture_to_array(picture, job.size)
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
            bad.append(f"{name} ({type(exc).__name__})")
            continue
        arrays.append(array)
        labels.append(label)
        gray_all = gray_all and gray
    images = np.stack(arrays) if arrays else np.zeros((0, 3, job.size, job.size), np.uint8)
    return Decoded(images, labels, gray_all, bad, modes, sizes, total)


def decode_workers(jobs: int) -> int:
    """Processes to decode with: one per CPU this process may use, no more than there are jobs."""
    from diffscale.runtime.resources import cpus_for_rank

    return max(1, min(cpus_for_rank(1), jobs))


def pool_start_method() -> str:
    """``fork`` on Linux, as PyTorch's DataLoader does: the workers touch no CUDA state, and spawn or
    forkserver run the main script again in each worker, which a script without a ``__main__``
    guard turns into a second build of the same cache waiting on the first one's lock."""
    import multiprocessing

    return "fork" if sys.platform.startswith("linux") else multiprocessing.get_start_method()


def _decoded_stream(jobs: list[Job]) -> Iterator[Decoded]:
    workers = decode_workers(len(jobs))
    if workers <= 1:
        yield from map(decode_job, jobs)
        return
    import multiprocessing

    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(pool_start_method())) as pool:
        yield from pool.map(decode_job, jobs)


@dataclass
class _Tally:
    total: int = 0
    bad: list[str] = field(default_factory=list)
    modes: set[str] = field(default_factory=set)
    sizes: set[tuple[int, int]] = field(default_factory=set)
    labels: list[int] = field(default_factory=list)
    kept: int = 0
    all_gray: bool = True

    def add(self, part: Decoded) -> None:
        self.total += part.total
        self.bad += part.bad
        self.modes |= part.modes
        self.sizes |= part.sizes
        self.labels += part.labels
        self.kept += part.images.shape[0]
        self.all_gray = self.all_gray and (part.all_gray or part.images.shape[0] == 0)


def _check_bad(tally: _Tally, source: str, max_bad_fraction: float, say: Callable[[str], None]) -> None:
    if not tally.bad:
        return
    few = ", ".join(tally.bad[:3]) + (", ..." if len(tally.bad) > 3 else "")
    if tally.kept == 0 or len(tally.bad) > max_bad_fraction * tally.total:
        raise UserError(f"{len(tally.bad)} of {tally.total} images in {source} cannot be read ({few}), more than "
                        f"data.max_bad_fraction = {max_bad_fraction:g} allows",
                        "remove or replace the damaged files, or raise data.max_bad_fraction to skip them")
    say(f"warning: skipped {len(tally.bad)} of {tally.total} images in {source} that cannot be read ({few})")


def build_from_jobs(listing: Listing, source: str, size: int, max_bad_fraction: float,
                    say: Callable[[str], None]) -> Callable[[Path], Built]:
    """The build step of the cache for ``listing``: decode, write in order, check the bad ones."""
    def build(path: Path) -> Built:
        tally = _Tally()
        with open(path, "wb") as out:
            for part in _decoded_stream(listing.jobs):
                tally.add(part)
                out.write(part.images.tobytes())
        if tally.total == 0:  # an empty table or shard set: nothing to train on (and nothing to map)
            raise UserError(f"'{source}' holds no images (0 rows or samples)",
                            "point --data at a table or shards that hold images")
        _check_bad(tally, source, max_bad_fraction, say)
        if len(tally.modes) > 1 or len(tally.sizes) > 1:
            say(f"note: {source} mixes {len(tally.modes)} image modes ({', '.join(sorted(tally.modes))}) and "
                f"{len(tally.sizes)} sizes: all converted to {'L' if tally.all_gray else 'RGB'} {size}x{size} "
                "(shorter side resized, centre-cropped)")
        channels = 1 if tally.all_gray else 3
        if tally.all_gray:
            _keep_first_channel(path, tally.kept, size)
        labels = np.asarray(tally.labels, np.int64) if tally.labels and min(tally.labels) >= 0 else None
        return Built((tally.kept, channels, size, size), labels,
                     listing.class_names if labels is not None else None,
                     {"skipped": len(tally.bad), "decoded_from": tally.total})
    return build


def _keep_first_channel(path: Path, count: int, size: int) -> None:
    """Rewrite (N, 3, S, S) gray-repeated rows as (N, 1, S, S), a block of rows at a time."""
    full = np.memmap(path, dtype=np.uint8, mode="r", shape=(count, 3, size, size))
    tmp = path.with_name(path.name + ".gray")
    try:
        with open(tmp, "wb") as out:
            for start in range(0, count, 4096):
                out.write(np.ascontiguousarray(full[start:start + 4096, :1]).tobytes())
        del full
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def stderr_say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cached_decode(source: str, kind: str, size: int, listing: Listing, *, max_bad_fraction: float,
                  say: Callable[[str], None] = stderr_say) -> CachedArray:
    """The decoded images of ``listing``, from the cache, built there first when needed."""
    name, label = entry_of(kind, source, size)
    build = build_from_jobs(listing, source, size, max_bad_fraction, say)
    return open_or_build(name, label, listing.fingerprint, build, say=say)
