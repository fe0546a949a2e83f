"""Resolve a data spec to an in-memory ``uint8`` tensor (N, C, S, S) at the run's resolution.

Specs read whole here: ``builtin[:glyphs|digits|mix]``, ``npz:PATH``, ``emnist:ROOT[:split]``,
``mnist:ROOT``. Image folders, WebDataset shards and tables are decoded image by image into the
decoded cache instead (tasks/images/decoded.py; ``open_image_data`` opens every spec). Loading
never downloads: torchvision sets are read from files already on disk, and a missing file ends
in a message saying how to get it.
"""

from __future__ import annotations

import gzip
import string
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from diffscale.data.locations import EMNIST_SPLITS
from diffscale.errors import UserError, closest
from diffscale.tasks.images import builtin
from diffscale.tasks.images.formats import parse_spec


def load_images(spec: str, size: int, *, max_items: int = 0) -> torch.Tensor:
    """Load a data spec -> uint8 (N, C, size, size), C in {1, 3}.

    ``max_items`` (0: all) is applied before any image is converted to float or resized, so
    the host memory a load needs follows the images kept (a file is still read whole)."""
    parsed = parse_spec(spec)
    if parsed.kind in ("imagefolder", "webdataset", "parquet"):
        raise UserError(f"data source '{spec}' is decoded into the cache, not loaded whole",
                        "open it with diffscale.tasks.images.dataset.open_image_data")
    if parsed.kind == "builtin":
        images = builtin.load_builtin(parsed.option, size)
    elif parsed.kind == "npz":
        images = _npz(Path(parsed.path), size, max_items)
    elif parsed.kind == "emnist":
        images = _idx_dataset(Path(parsed.path), size, emnist_split=parsed.option, max_items=max_items)
    else:
        images = _idx_dataset(Path(parsed.path), size, emnist_split=None, max_items=max_items)
    if max_items:
        images = images[:max_items]
    if images.shape[0] == 0:
        raise UserError(f"data source '{spec}' holds no images", "point --data at a folder or file with images")
    return images.contiguous()


def load_labels(spec: str, count: int, *, required: bool = False) -> tuple[torch.Tensor, list[str]] | None:
    """The class of each of the ``count`` images ``load_images(spec, ...)`` returns ((count,) int64
    indices) and the class names, or None where the source carries no labels (image folders are
    labelled by the decoded cache instead). ``required``: an EMNIST/MNIST root without its labels
    file ends in a message naming the file, rather than None."""
    parsed = parse_spec(spec)
    if parsed.kind == "builtin":
        return builtin.builtin_labels(parsed.option, count)
    if parsed.kind in ("emnist", "mnist"):
        return idx_labels(Path(parsed.path), parsed.option if parsed.kind == "emnist" else None, count,
                          required=required)
    if parsed.kind == "npz":
        with open(parsed.path, "rb") as fid:
            archive = np.load(fid, allow_pickle=False)
            if isinstance(archive, np.ndarray) or "labels" not in archive:
                return None
            with archive:
                raw = np.asarray(archive["labels"])[:count]
        values, indices = np.unique(raw, return_inverse=True)
        return torch.from_numpy(indices.reshape(-1)).long(), [str(v) for v in values]
    return None


def resize_square(images: torch.Tensor, size: int) -> torch.Tensor:
    """Resize the shorter side to ``size`` and centre-crop -> float (N, C, size, size) in 0..255."""
    _, _, h, w = images.shape
    if (h, w) != (size, size):
        scale = size / min(h, w)
        nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
        mode = "area" if scale < 1 else "bilinear"
        images = F.interpolate(images, size=(nh, nw), mode=mode, **({} if mode == "area" else {"align_corners": False}))
        top, left = (nh - size) // 2, (nw - size) // 2
        images = images[:, :, top:top + size, left:left + size]
    return images


def _npz(path: Path, size: int, max_items: int = 0) -> torch.Tensor:
    if not path.is_file():
        raise UserError(f"array file '{path}' does not exist", "check the path given to --data npz:PATH")
    try:  # opened here: np.load leaves a file it opened itself open when an archive is cut short
        with open(path, "rb") as fid:
            archive = np.load(fid, allow_pickle=False)
            if isinstance(archive, np.ndarray):
                array = archive
            else:
                with archive:
                    keys = list(archive.keys())
                    if not keys:
                        raise UserError(f"array file '{path}' is empty", "save it with numpy.savez(path, images=array)")
                    key = next((k for k in ("images", "x", "arr_0") if k in keys), keys[0])
                    array = archive[key]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:  # a truncated archive is a bad zip
        raise UserError(f"cannot read array file '{path}' ({exc})",
                        "save it with numpy.savez(path, images=array)") from exc
    if 0 in array.shape:
        empty = "images" if array.shape[0] == 0 else "pixels"
        raise UserError(f"array in '{path}' has shape {array.shape}: no {empty}",
                        "store images as N x H x W or N x H x W x C, each side at least 1")
    if array.ndim == 3:
        array = array[:, None]
    elif array.ndim == 4 and array.shape[-1] in (1, 3, 4) and array.shape[1] not in (1, 3, 4):
        array = array.transpose(0, 3, 1, 2)
    elif array.ndim != 4:
        raise UserError(f"array in '{path}' has shape {array.shape}", "store images as N x H x W or N x H x W x C")
    if array.shape[1] == 4:
        array = array[:, :3]
    floating = np.issubdtype(array.dtype, np.floating)
    if floating:
        # Checked on the whole array, so that max_items keeps the full set's scaling.
        if not np.isfinite(array).all():
            raise UserError(f"array in '{path}' holds NaN or infinite values", "clean the array before training")
        lo, hi = float(array.min()), float(array.max())
        if hi > 1.0 + 1e-6 and lo >= 0:
            raise UserError(f"float array in '{path}' has values up to {hi:g}",
                            "scale floats to [0, 1] or [-1, 1], or store uint8")
    elif array.dtype != np.uint8:
        raise UserError(f"array in '{path}' has dtype {array.dtype}",
                        "store uint8 (0..255) or float in [0, 1] / [-1, 1]")
    if max_items:
        array = array[:max_items]  # before the float copy, which takes 4 bytes a value
    data = torch.from_numpy(np.ascontiguousarray(array)).float()
    if floating:
        # Floats are taken as [-1, 1] when negative values occur, else [0, 1].
        data = (data + 1) * 127.5 if lo < 0 else data * 255.0
    return resize_square(data, size).round().clamp(0, 255).to(torch.uint8)


def _idx_dataset(root: Path, size: int, *, emnist_split: str | None, max_items: int = 0) -> torch.Tensor:
    """MNIST/EMNIST from files already on disk (torchvision's folder layout)."""
    name = _check_split(emnist_split)
    images = _torchvision_images(root, emnist_split)
    if images is None:
        stem = f"emnist-{emnist_split}-train-images-idx3-ubyte" if emnist_split else "train-images-idx3-ubyte"
        candidates = [root / name / "raw" / stem, root / name / "raw" / f"{stem}.gz", root / stem, root / f"{stem}.gz"]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            how = (f"torchvision.datasets.EMNIST('{root}', split='{emnist_split}', download=True)" if emnist_split
                   else f"torchvision.datasets.MNIST('{root}', download=True)")
            raise UserError(
                f"{name} files not found under '{root}' (looked for {name}/raw/{stem}[.gz])",
                f"on a machine with internet run: python -c \"import torchvision; {how}\" and copy '{root}' here "
                "(diffscale never downloads at run time)",
            )
        images = read_idx_images(found)
        if emnist_split:
            images = images.transpose(1, 2)  # EMNIST is stored transposed
    if max_items:
        images = images[:max_items]  # before the float copy
    data = images.unsqueeze(1).float()
    return resize_square(data, size).round().clamp(0, 255).to(torch.uint8)


def _check_split(emnist_split: str | None) -> str:
    """The data set's name ("EMNIST" or "MNIST"), once the split is known to be one of EMNIST's."""
    if emnist_split and emnist_split not in EMNIST_SPLITS:
        raise UserError(f"unknown EMNIST split '{emnist_split}'{closest(emnist_split, EMNIST_SPLITS)}",
                        f"use one of: {', '.join(EMNIST_SPLITS)}")
    return "EMNIST" if emnist_split else "MNIST"


def _torchvision_images(root: Path, emnist_split: str | None) -> torch.Tensor | None:
    """Use torchvision's loader when it is installed (download=False: never hangs)."""
    try:
        from torchvision import datasets  # noqa: F401
    except Exception:  # torchvision absent or built for another torch: read the files ourselves
        return None
    try:
        if emnist_split:
            ds = datasets.EMNIST(str(root), split=emnist_split, train=True, download=False)
            return ds.data.transpose(1, 2).contiguous()
        return datasets.MNIST(str(root), train=True, download=False).data
    except RuntimeError:
        return None  # files not found: fall through to the message with instructions


def idx_labels(root: Path, emnist_split: str | None, count: int, *,
               required: bool = False) -> tuple[torch.Tensor, list[str]] | None:
    """The training labels of an MNIST/EMNIST root -> ((count,) int64 class indices, class names),
    in the images' order; None when the labels file is missing (``required``: a message naming it)."""
    name = _check_split(emnist_split)
    stem = f"emnist-{emnist_split}-train-labels-idx1-ubyte" if emnist_split else "train-labels-idx1-ubyte"
    candidates = [root / name / "raw" / stem, root / name / "raw" / f"{stem}.gz", root / stem, root / f"{stem}.gz"]
    found = next((c for c in candidates if c.is_file()), None)
    raw = read_idx_labels(found) if found is not None else _torchvision_targets(root, emnist_split)
    if raw is None:
        if not required:
            return None
        how = (f"torchvision.datasets.EMNIST('{root}', split='{emnist_split}', download=True)" if emnist_split
               else f"torchvision.datasets.MNIST('{root}', download=True)")
        raise UserError(f"model.class_conditional is on, but the {name} labels file is missing under '{root}' "
                        f"(looked for {name}/raw/{stem}[.gz] beside the images)",
                        f"copy {stem} beside the images file (python -c \"import torchvision; {how}\" fetches "
                        "both), or set model.class_conditional to off")
    names = emnist_classes(emnist_split) if emnist_split else list(string.digits)
    # EMNIST letters number their classes 1-26 (0 is unused): renumbered 0-25, so 'a' is class 0.
    labels = raw[:count].long() - (1 if emnist_split == "letters" else 0)
    where = found or root
    if raw.shape[0] < count:
        raise UserError(f"'{where}' holds {raw.shape[0]} labels for {count} images",
                        "use the labels file of the same download as the images file")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= len(names)):
        bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        raise UserError(f"'{where}' holds label {bad + (emnist_split == 'letters')}, outside the "
                        f"{len(names)} classes of {name}{f' {emnist_split}' if emnist_split else ''}",
                        "use the labels file of the same split as the images file")
    return labels, names


def emnist_classes(split: str) -> list[str]:
    """The class names of an EMNIST split, in label order (letters: 'a'..'z', renumbered from 0)."""
    try:
        from torchvision import datasets

        table = list(datasets.EMNIST.classes_split_dict[split])
    except Exception:  # torchvision absent or built for another torch: the EMNIST paper's tables
        merged = set("cijklmopsuvwxyz")  # lower-case letters folded into their upper case in bymerge/balanced
        every = sorted(string.digits + string.ascii_letters)  # 0-9, A-Z, a-z
        table = {"byclass": every, "bymerge": [c for c in every if c not in merged],
                 "balanced": [c for c in every if c not in merged], "letters": list(string.ascii_lowercase),
                 "digits": list(string.digits), "mnist": list(string.digits)}[split]
    return [c for c in table if c != "N/A"]  # torchvision names letters' unused class 0 'N/A'


def _torchvision_targets(root: Path, emnist_split: str | None) -> torch.Tensor | None:
    """The labels torchvision's loader reads (it knows older layouts too); None where it cannot."""
    try:
        from torchvision import datasets
    except Exception:
        return None
    try:
        if emnist_split:
            return datasets.EMNIST(str(root), split=emnist_split, train=True, download=False).targets
        return datasets.MNIST(str(root), train=True, download=False).targets
    except RuntimeError:
        return None


def read_idx_labels(path: Path) -> torch.Tensor:
    """Read an IDX1 label file (optionally gzipped) -> uint8 (N,)."""
    raw = _read_file(path)
    if len(raw) < 8 or int.from_bytes(raw[0:4], "big") != 2049:
        raise UserError(f"'{path}' is not an IDX label file", "download the file again")
    n = int.from_bytes(raw[4:8], "big")
    if len(raw) < 8 + n:
        raise UserError(f"'{path}' is truncated ({len(raw)} bytes for {n} labels)", "download the file again")
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, count=n, offset=8).copy())


def _read_file(path: Path) -> bytes:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            return bytes(fh.read())
    except (OSError, EOFError) as exc:
        raise UserError(f"cannot read '{path}' ({exc})", "download the file again") from exc


def read_idx_images(path: Path) -> torch.Tensor:
    """Read an IDX3 image file (optionally gzipped) -> uint8 (N, H, W)."""
    raw = _read_file(path)
    if len(raw) < 16 or int.from_bytes(raw[0:4], "big") != 2051:
        raise UserError(f"'{path}' is not an IDX image file", "download the file again")
    n, h, w = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    if len(raw) < 16 + n * h * w:
        raise UserError(f"'{path}' is truncated ({len(raw)} bytes for {n} images)", "download the file again")
    array = np.frombuffer(raw, dtype=np.uint8, count=n * h * w, offset=16).reshape(n, h, w)
    return torch.from_numpy(array.copy())


def describe(shape: tuple[int, ...]) -> str:
    """``(N, C, H, W)`` -> ``N images, C channels, HxW``."""
    n, c, h, w = shape
    return f"{n} images, {c} channel{'s' if c > 1 else ''}, {h}x{w}"

