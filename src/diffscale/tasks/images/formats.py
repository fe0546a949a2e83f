"""Listing image data sets before decoding: image folders, WebDataset tar shards, Parquet / Arrow tables.

* ``imagefolder:PATH``: every image below PATH, sorted by path; when every image lies in a
  subfolder of PATH, the first-level subfolder is its class (torchvision's ImageFolder layout).
* ``webdataset:DIR_OR_GLOB``: ``*.tar`` shards (a folder's, or a glob's), read with tarfile;
  a sample is the files sharing a key (the name up to the first dot of its base name): the image
  in ``.png``/``.jpg``/``.jpeg``, an optional integer label in ``.cls``.
* ``parquet:PATH[:COLUMN]``: a ``.parquet`` file, or a folder of them or of the ``.arrow`` files
  Hugging Face ``datasets.save_to_disk`` writes; COLUMN (default ``image``) holds image bytes or
  ``{bytes: ...}`` structs; a ``label`` (or ``labels``) column, when there is one, gives labels.
"""

from __future__ import annotations

import glob
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffscale.data.locations import emnist_path_split, path_option_split
from diffscale.errors import UserError, closest
from diffscale.tasks.images.jobs import JOB_ITEMS, Job, Listing, fingerprint

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
TAR_IMAGE_SUFFIXES = ("png", "jpg", "jpeg")
LABEL_COLUMNS = ("label", "labels")
KINDS = ("builtin", "imagefolder", "npz", "emnist", "mnist", "webdataset", "parquet")


@dataclass(frozen=True)
class DataSpec:
    kind: str
    path: str = ""
    option: str = ""


def parse_spec(spec: str) -> DataSpec:
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise UserError(f"unknown data source '{spec}'{closest(kind, KINDS)}",
                        "use builtin, imagefolder:PATH, npz:PATH, emnist:ROOT[:split], mnist:ROOT, "
                        "webdataset:DIR_OR_GLOB or parquet:PATH[:COLUMN]")
    if kind == "builtin":
        return DataSpec("builtin", option=rest)
    if not rest:
        raise UserError(f"data source '{spec}' has no path", f"write {kind}:PATH")
    if kind == "emnist":
        root, split = emnist_path_split(rest)
        return DataSpec("emnist", root, split or "balanced")
    if kind == "parquet":
        path, column = path_option_split(rest)
        return DataSpec("parquet", path, column)
    return DataSpec(kind, rest)


def image_files(root: Path, max_items: int) -> list[Path]:
    """The image files under ``root`` (recursive, sorted), the first ``max_items`` (0: all)."""
    if not root.exists():
        raise UserError(f"image folder '{root}' does not exist", "check the path given to --data imagefolder:PATH")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise UserError(f"image folder '{root}' holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})",
                        "add images or point --data at the right folder")
    return files[:max_items] if max_items else files


def list_imagefolder(root: Path, size: int, max_items: int) -> Listing:
    files = image_files(root, max_items)
    parts = [p.relative_to(root).parts for p in files]
    class_names = sorted({part[0] for part in parts}) if all(len(part) > 1 for part in parts) else None
    labels = [class_names.index(part[0]) for part in parts] if class_names else []
    jobs = [Job("files", tuple(str(p) for p in files[i:i + JOB_ITEMS]),
                tuple(labels[i:i + JOB_ITEMS]), size) for i in range(0, len(files), JOB_ITEMS)]
    return Listing(jobs, fingerprint(files), class_names)


def shards(spec_path: str) -> list[Path]:
    path = Path(spec_path)
    if path.is_dir():
        found = sorted(path.glob("*.tar"))
    elif path.is_file():
        found = [path]
    else:
        found = sorted(Path(p) for p in glob.glob(spec_path) if p.endswith(".tar"))
    if not found:
        raise UserError(f"no .tar shards at '{spec_path}'",
                        "point --data webdataset:DIR_OR_GLOB at a folder of .tar shards or a glob "
                        "such as 'data/train-*.tar'")
    return found


def list_webdataset(spec_path: str, size: int) -> Listing:
    found = shards(spec_path)
    return Listing([Job("tar", (str(s),), size=size) for s in found], fingerprint(found))


def tar_samples(shard: Path) -> Iterator[tuple[str, bytes | str, int]]:
    """(shard/key, image bytes, label or -1) of each sample of a WebDataset shard, in stored order."""
    try:
        samples: dict[str, dict[str, bytes]] = {}
        with tarfile.open(shard) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                base = member.name.rsplit("/", 1)[-1]
                if base.startswith("."):
                    continue
                key = member.name[:len(member.name) - len(base)] + base.split(".", 1)[0]
                ext = base.split(".", 1)[1].lower() if "." in base else ""
                handle = tar.extractfile(member)
                if handle is not None:
                    samples.setdefault(key, {})[ext] = handle.read()
    except (tarfile.TarError, OSError) as exc:
        raise UserError(f"cannot read shard '{shard}' ({exc})", "write the shard again, or remove it") from exc
    images = [(key, files) for key, files in samples.items() if any(e in files for e in TAR_IMAGE_SUFFIXES)]
    if not images:
        raise UserError(f"shard '{shard}' holds no samples with an image (.png, .jpg or .jpeg)",
                        "remove the empty shard, or write it again")
    for key, files in images:
        raw = next(files[e] for e in TAR_IMAGE_SUFFIXES if e in files)
        yield f"{shard.name}/{key}", raw, _tar_label(files.get("cls"), shard, key)


def _tar_label(raw: bytes | None, shard: Path, key: str) -> int:
    if raw is None:
        return -1
    try:
        return int(raw.decode().strip())
    except ValueError as exc:
        raise UserError(f"label of sample '{key}' in '{shard}' is not an integer ({raw[:20]!r})",
                        "write .cls files holding one integer class index") from exc


def tables(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted([*path.glob("*.parquet"), *path.glob("*.arrow")])
    raise UserError(f"table '{path}' does not exist", "check the path given to --data parquet:PATH[:COLUMN]")


def read_table(path: Path, columns: list[str] | None = None) -> Any:
    """A pyarrow Table from a .parquet file or an Arrow stream / file (datasets.save_to_disk)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".arrow":
            with pa.memory_map(str(path)) as source:
                try:
                    table = pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    table = pa.ipc.open_file(source).read_all()
            return table.select(columns) if columns else table
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"cannot read table '{path}' ({exc})",
                        "write it with pyarrow / datasets (to_parquet or save_to_disk)") from exc


def list_table(spec_path: str, option: str, size: int) -> Listing:
    files = tables(Path(spec_path))
    if not files:
        raise UserError(f"'{spec_path}' holds no .parquet or .arrow files",
                        "point --data parquet:PATH at a .parquet file or a datasets.save_to_disk folder")
    column = option or "image"
    jobs: list[Job] = []
    class_names = None
    for path in files:
        schema = read_table(path).schema  # the rows are read again in the workers, a job's slice at a time
        if column not in schema.names:
            raise UserError(f"table '{path}' has no column '{column}' (columns: {', '.join(schema.names)})",
                            "name the image column: --data parquet:PATH:COLUMN")
        label = next((c for c in LABEL_COLUMNS if c in schema.names), "")
        class_names = class_names or _hf_class_names(schema, label, Path(spec_path))
        rows = read_table(path, [column]).num_rows
        jobs += [Job("table", (str(path),), size=size, start=i, stop=min(i + JOB_ITEMS, rows), column=column,
                     label_column=label) for i in range(0, rows, JOB_ITEMS)]
    return Listing(jobs, fingerprint(files), class_names)


def _hf_class_names(schema: Any, label: str, root: Path) -> list[str] | None:
    """Class names of a Hugging Face ClassLabel column, from the schema's metadata or dataset_info.json."""
    texts = []
    if schema.metadata and b"huggingface" in schema.metadata:
        texts.append(schema.metadata[b"huggingface"].decode())
    info = (root if root.is_dir() else root.parent) / "dataset_info.json"
    if info.is_file():
        texts.append(info.read_text())
    for text in texts:
        try:
            meta = json.loads(text)
            features = meta.get("info", meta).get("features", {})
            names = features.get(label, {}).get("names")
        except (ValueError, AttributeError):
            continue
        if isinstance(names, list):
            return [str(n) for n in names]
    return None


def table_rows(path: Path, start: int, stop: int, column: str, label_column: str
               ) -> Iterator[tuple[str, bytes | str, int]]:
    """(file#row, image bytes, label or -1) for rows ``start``..``stop`` of a table."""
    table = read_table(path, [column, label_column] if label_column else [column]).slice(start, stop - start)
    images = table.column(column).to_pylist()
    labels = table.column(label_column).to_pylist() if label_column else [-1] * len(images)
    for offset, (value, label) in enumerate(zip(images, labels, strict=True)):
        raw = value.get("bytes") if isinstance(value, dict) else value
        if raw is None and isinstance(value, dict) and value.get("path"):
            raw = str(value["path"])
        yield f"{path.name}#{start + offset}", raw if isinstance(raw, (bytes, str)) else b"", \
            int(label) if label is not None else -1
