"""A decoded data set kept on disk once: a raw ``uint8`` array file, memory-mapped, and a small
JSON header beside it.

Decoding an image folder takes minutes at every start and on every rank; reading a memory map
takes milliseconds, and the operating system's page cache shares it between the ranks of a node.
One cache entry is a pair under ``DIFFSCALE_CACHE_DIR`` (default ``~/.cache/diffscale``)/decoded:

* ``NAME.u8``: the items, C-ordered ``uint8`` of the header's ``shape``;
* ``NAME.json``: format version, diffscale version, source spec, shape, the fingerprint of the
  source files (names, sizes, mtimes) and, where the data has them, labels and class names
  (``NAME.labels.npy``, int64 (N,)).

Both are written to temporary names and renamed, the header last: a header on disk means a
complete entry. When several processes of a node start together one builds (it holds
``NAME.lock``, filelock's ``flock`` lock, freed by the kernel if it dies) and the others wait for its
header. A raw file rather than ``.npy`` because the
item count is known only after decoding (unreadable items are skipped).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from filelock import BaseFileLock, FileLock, SoftFileLock, Timeout

from diffscale.errors import UserError
from diffscale.io.atomic import atomic_path, write_text
from diffscale.io.paths import cache_dir

CACHE_FORMAT = 2
"""Bump when the layout or the decoding changes: entries of another format are rebuilt (2: EMNIST and
MNIST entries carry their labels)."""
WAIT_S = 3600.0
"""How long a process waits for another one building the same entry."""


def _diffscale_version() -> str:
    from diffscale.version import __version__

    return str(__version__)


@dataclass
class Built:
    """What a build wrote into ``array_path``: its shape, and labels where the data has them."""

    shape: tuple[int, ...]
    labels: np.ndarray | None = None
    class_names: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CachedArray:
    """An opened entry: ``array`` is a read-only memory map, ``labels`` int64 (N,) or None."""

    array: np.ndarray
    labels: np.ndarray | None
    header: dict[str, Any]
    path: Path
    built_here: bool

    @property
    def class_names(self) -> list[str] | None:
        names = self.header.get("class_names")
        return list(names) if names is not None else None


def entry_paths(name: str) -> tuple[Path, Path, Path, Path]:
    """(array, header, labels, lock) of entry ``name``."""
    base = cache_dir() / "decoded" / name
    return (base.with_suffix(".u8"), base.with_suffix(".json"), Path(f"{base}.labels.npy"),
            base.with_suffix(".lock"))


def entry_of(kind: str, source: str, size: int) -> tuple[str, str]:
    """(entry name, the source as its header records it) of ``source`` decoded at ``size`` px."""
    key = hashlib.sha256(repr((source, size)).encode()).hexdigest()[:16]
    return f"{kind}-{size}px-{key}", f"{source} @ {size}px"


def read_header(name: str) -> dict[str, Any] | None:
    """The entry's header, or None when there is none (or it cannot be read)."""
    try:
        header = json.loads(entry_paths(name)[1].read_text())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) else None


def _stale_reason(header: dict[str, Any], source: str, fingerprint: str) -> str:
    if header.get("format") != CACHE_FORMAT:
        return (f"it was written by cache format {header.get('format')} (diffscale {header.get('diffscale', '?')}); "
                f"this diffscale ({_diffscale_version()}) writes format {CACHE_FORMAT}")
    if header.get("source") != source:
        return f"it holds '{header.get('source')}'"
    if header.get("fingerprint") != fingerprint:
        return "the source files changed since it was written (names, sizes or times)"
    return ""


def _open(name: str, header: dict[str, Any], built_here: bool) -> CachedArray:
    array_path, _, labels_path, _ = entry_paths(name)
    shape = tuple(int(s) for s in header["shape"])
    expected = int(np.prod(shape))
    if not array_path.is_file() or array_path.stat().st_size != expected:
        raise OSError(f"{array_path} is missing or not {expected} bytes")
    array = np.memmap(array_path, dtype=np.uint8, mode="r", shape=shape)
    labels = np.load(labels_path, allow_pickle=False) if header.get("has_labels") else None
    if labels is not None and labels.shape != (shape[0],):
        raise OSError(f"{labels_path} does not hold one label per item")
    return CachedArray(array, labels, header, array_path, built_here)


def _usable(name: str, source: str, fingerprint: str) -> CachedArray | str:
    """The entry opened, or why it cannot be used ('' when there is none)."""
    header = read_header(name)
    if header is None:
        return ""
    reason = _stale_reason(header, source, fingerprint)
    if reason:
        return reason
    try:
        return _open(name, header, built_here=False)
    except (OSError, ValueError) as exc:
        return f"it cannot be read ({exc})"


def open_or_build(name: str, source: str, fingerprint: str, build: Callable[[Path], Built], *,
                  say: Callable[[str], None], wait_s: float = WAIT_S) -> CachedArray:
    """Open entry ``name`` when its header matches ``source`` and ``fingerprint``; else build it
    with ``build(path)`` (which writes the raw array to ``path``), one process at a time."""
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        found = _usable(name, source, fingerprint)
        if isinstance(found, CachedArray):
            return found
        if found and not announced:
            say(f"note: rebuilding the decoded cache of {source} in {entry_paths(name)[1].parent}: {found}")
            announced = True
        lock = _try_lock(entry_paths(name)[3])
        if lock is not None:
            try:
                found = _usable(name, source, fingerprint)  # built while this process waited for the lock
                return found if isinstance(found, CachedArray) else _build(name, source, fingerprint, build)
            finally:
                _holder_path(entry_paths(name)[3]).unlink(missing_ok=True)
                lock.release()
        if time.monotonic() > deadline:
            holder = _lock_holder(entry_paths(name)[3])
            raise UserError(f"waited {wait_s:.0f} s for another process ({holder}) building the decoded cache of "
                            f"{source} ({entry_paths(name)[3]})",
                            "if no other diffscale run is decoding this data, delete the .lock file and start again "
                            "(a lock of a process that died is freed by itself, except on file systems without "
                            "flock)")
        time.sleep(0.2)


def _try_lock(lock: Path) -> BaseFileLock | None:
    """Take ``lock`` without waiting (None: another process holds it), and note who holds it for
    the message of a process that waits too long. filelock's ``flock`` lock is released by the
    kernel when its holder dies, a killed builder's included, on any host that shares the file
    system's locks; where the file system has no ``flock``, its lock file created exclusively."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    held: BaseFileLock = FileLock(str(lock), thread_local=False)
    try:
        held.acquire(timeout=0)
    except Timeout:
        return None
    except NotImplementedError:  # no flock on this file system (some network mounts)
        held = SoftFileLock(str(lock.with_suffix(".softlock")), thread_local=False)
        try:
            held.acquire(timeout=0)
        except Timeout:
            return None
    with contextlib.suppress(OSError):
        _holder_path(lock).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    return held


def _holder_path(lock: Path) -> Path:
    return lock.with_suffix(".holder")


def _lock_holder(lock: Path) -> str:
    try:
        holder = json.loads(_holder_path(lock).read_text())
        return f"pid {holder['pid']} on {holder['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown"


def _build(name: str, source: str, fingerprint: str, build: Callable[[Path], Built]) -> CachedArray:
    array_path, header_path, labels_path, _ = entry_paths(name)
    header_path.unlink(missing_ok=True)  # the old entry is gone from here on: no reader pairs it with the new array
    handle, tmp_name = tempfile.mkstemp(dir=array_path.parent, suffix=".u8.tmp")
    os.close(handle)
    tmp = Path(tmp_name)
    try:
        built = build(tmp)
        os.replace(tmp, array_path)
        labels = built.labels
        if labels is not None:
            with atomic_path(labels_path) as labels_tmp:
                np.save(labels_tmp, labels.astype(np.int64), allow_pickle=False)
        header = {"format": CACHE_FORMAT, "diffscale": _diffscale_version(), "source": source,
                  "fingerprint": fingerprint, "shape": list(built.shape), "count": built.shape[0],
                  "has_labels": built.labels is not None, "class_names": built.class_names, **built.extra}
        write_text(header_path, json.dumps(header, indent=1))
    finally:
        tmp.unlink(missing_ok=True)
    return _open(name, header, built_here=True)
