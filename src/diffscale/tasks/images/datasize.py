"""How many items an image data spec holds and how large they are once decoded, read cheaply on the
host that plans a job: from the decoded cache's header when this host built the entry, else from
the format's own listing (file names, tar headers, table metadata, array and IDX headers). No
image is decoded and torch is not loaded (``plan`` is a light verb).
"""

from __future__ import annotations

import gzip
import tarfile
import zipfile
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from diffscale.data.decoded_cache import CACHE_FORMAT, entry_of, read_header
from diffscale.data.placement import DataSize
from diffscale.errors import UserError
from diffscale.tasks.images import formats

if TYPE_CHECKING:
    from diffscale.config import RunConfig

ARRAY_NAMES = ("images", "x", "arr_0")
"""The array an npz file's images are read from (as tasks/images/sources.py reads them)."""


def run_data_size(cfg: RunConfig) -> DataSize | None:
    """The decoded size of ``cfg``'s data (the task registry's ``data_size`` for image runs)."""
    from diffscale.config import ModelConfig

    if not isinstance(cfg.model, ModelConfig):
        return None
    return data_size(cfg.data.source, cfg.model.sample_size, cfg.data.max_items)


def data_size(spec: str, side: int, max_items: int = 0) -> DataSize | None:
    """The size of ``spec`` decoded at ``side`` px, or None where it cannot be read here (data on
    the cluster's file system only, generated data, a file this reader does not know)."""
    try:
        parsed = formats.parse_spec(spec)
    except UserError:
        return None
    if parsed.kind == "builtin":
        return None
    source = spec if not max_items else f"{spec} (first {max_items})"
    cached = _from_cache(parsed.kind, source, side)
    if cached is not None:
        return cached
    try:
        listed = _listed(parsed, max_items)
    except (UserError, OSError, ValueError, tarfile.TarError, zipfile.BadZipFile, EOFError):
        return None
    if listed is None:
        return None
    items, channels, how = listed
    return DataSize(min(items, max_items) if max_items else items, channels, side, how)


def _from_cache(kind: str, source: str, side: int) -> DataSize | None:
    name, label = entry_of(kind, source, side)
    header = read_header(name)
    if header is None or header.get("format") != CACHE_FORMAT or header.get("source") != label:
        return None
    try:
        items, channels = int(header["shape"][0]), int(header["shape"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return DataSize(items, channels, side, "the decoded cache's header on this host")


def _listed(parsed: formats.DataSpec, max_items: int) -> tuple[int, int, str] | None:
    """(items, channels, how) from the format's listing."""
    if parsed.kind == "imagefolder":
        files = formats.image_files(Path(parsed.path), max_items)
        return len(files), 3, "listed: image files; 3 channels assumed until decoded"
    if parsed.kind == "webdataset":
        return _tar_items(parsed.path), 3, "listed: tar headers; 3 channels assumed until decoded"
    if parsed.kind == "parquet":
        return _table_rows(parsed.path), 3, "listed: table metadata; 3 channels assumed until decoded"
    if parsed.kind == "npz":
        shape = _npz_shape(Path(parsed.path))
        return (shape[0], _array_channels(shape), "the array's header") if shape else None
    if parsed.kind in ("emnist", "mnist"):
        return _idx_items(Path(parsed.path), parsed.option if parsed.kind == "emnist" else ""), 1, "the IDX header"
    return None


def _tar_items(spec_path: str) -> int:
    """Samples with an image in the shards (keys of png/jpg/jpeg members), from the tar headers."""
    count = 0
    for shard in formats.shards(spec_path):
        keys = set()
        with tarfile.open(shard) as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                stem, _, ext = base.partition(".")
                if member.isfile() and not base.startswith(".") and ext.lower() in formats.TAR_IMAGE_SUFFIXES:
                    keys.add(member.name[:len(member.name) - len(base)] + stem)
        count += len(keys)
    return count


def _table_rows(spec_path: str) -> int:
    import pyarrow.parquet as pq

    total = 0
    for path in formats.tables(Path(spec_path)):
        total += pq.ParquetFile(path).metadata.num_rows if path.suffix == ".parquet" else \
            formats.read_table(path).num_rows  # an Arrow file is memory-mapped: no rows are copied
    return total


def _npz_shape(path: Path) -> tuple[int, ...] | None:
    """The image array's shape from its .npy header (inside the zip for an npz), its data unread."""
    if path.suffix == ".npy":
        with open(path, "rb") as fid:
            return _npy_shape(fid)
    with zipfile.ZipFile(path) as archive:
        names = [n.removesuffix(".npy") for n in archive.namelist()]
        if not names:
            return None
        key = next((k for k in ARRAY_NAMES if k in names), names[0])
        with archive.open(f"{key}.npy") as fid:
            return _npy_shape(fid)


def _npy_shape(fid: IO[bytes]) -> tuple[int, ...]:
    version = np.lib.format.read_magic(fid)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, _ = read(fid)
    return tuple(int(s) for s in shape)


def _array_channels(shape: tuple[int, ...]) -> int:
    """Channels as tasks/images/sources.py reads an array: N x H x W is gray, 4 channels lose alpha."""
    if len(shape) != 4:
        return 1
    channels = shape[3] if shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4) else shape[1]
    return 3 if channels in (3, 4) else 1


def _idx_items(root: Path, split: str) -> int:
    stem = f"emnist-{split}-train-images-idx3-ubyte" if split else "train-images-idx3-ubyte"
    name = "EMNIST" if split else "MNIST"
    for candidate in (root / name / "raw" / stem, root / name / "raw" / f"{stem}.gz", root / stem, root / f"{stem}.gz"):
        if candidate.is_file():
            with (gzip.open if candidate.suffix == ".gz" else open)(candidate, "rb") as fh:
                head = fh.read(16)
            if len(head) == 16 and int.from_bytes(head[0:4], "big") == 2051:
                return int.from_bytes(head[4:8], "big")
    raise ValueError(f"no {name} images under {root}")
