"""Decoding jobs: what a listing of an image data set (tasks/images/formats.py) hands the decoders
(tasks/images/decoded.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

JOB_ITEMS = 256
"""Images per decoding job: large enough to amortise a job's overhead, small enough to balance."""


@dataclass(frozen=True)
class Job:
    """A unit of decoding: ``kind`` 'files' (items: paths), 'tar' (items: one shard) or
    'table' (items: one file; rows ``start``..``stop``)."""

    kind: str
    items: tuple[str, ...]
    labels: tuple[int, ...] = ()
    size: int = 0
    start: int = 0
    stop: int = 0
    column: str = ""
    label_column: str = ""


@dataclass(frozen=True)
class Listing:
    """What a spec holds, before decoding: the jobs, a fingerprint of the source files, class names."""

    jobs: list[Job]
    fingerprint: str
    class_names: list[str] | None = None


def fingerprint(files: list[Path]) -> str:
    """A digest of the files' names, sizes and modification times."""
    digest = hashlib.sha256()
    for path in files:
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


