"""The installed packages' import names and distributions, kept on disk between processes.

diffusers calls ``importlib.metadata.packages_distributions()`` when it is imported, and so does
transformers, which diffusers imports wherever it is installed. The call lists every installed
distribution's files and checks that each exists: on an H100 host's environment (150
distributions, 53,000 files) the two calls took 5 s of a resumed job's 31 s under cProfile
(docs/measurements/2026-11-28.md, "The traced network cached too"), and on a cluster's shared
file system every rank of a job makes those stats at once. Its answer changes only when a distribution is installed or
removed, which adds, renames or rewrites its metadata folder: :func:`install` replaces the function
with one that keeps the answer in the user's cache (``DIFFSCALE_CACHE_DIR``/packages), keyed by
the metadata folders on every import path and their modification times, and computes it as
before on a miss or any error.

The command line (and ``diffscale.fast_start()``, for a script of one's own) puts
:class:`BeforeDiffusers` first in ``sys.meta_path``, which installs it the first time anything
imports diffusers: code that never imports diffusers never sees it, and ``import diffscale``
alone changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from diffscale.io.atomic import write_text
from diffscale.io.paths import cache_dir

FORMAT = 2
"""Bump when the kept file's layout or key changes."""
KEEP = 8
"""Answers kept (the newest): one per environment and state of its installed packages."""


def _key() -> list[object]:
    """What the answer depends on: for every import path, its distributions' metadata folders
    (``*.dist-info``, ``*.egg-info``) with their modification times -- an install, upgrade or
    removal adds, renames or rewrites one -- read from one listing per path, not from the files'
    records. A path that is a file (a zip) counts by its own time."""
    key: list[object] = [sys.version, FORMAT]
    for entry in sys.path:
        where = entry or "."
        try:
            with os.scandir(where) as listing:
                found = sorted([item.name, item.stat().st_mtime_ns] for item in listing
                               if item.name.endswith((".dist-info", ".egg-info")))
            key.append([entry, found])
        except NotADirectoryError:
            key.append([entry, os.stat(where).st_mtime_ns])
        except OSError:
            key.append([entry, None])
    return key


def cached(compute: Callable[[], Mapping[str, list[str]]], folder: Path) -> dict[str, list[str]]:
    """``compute()``'s answer for this process's import paths, read from ``folder`` when an earlier
    process kept it for the same paths and times, else computed and kept. A cache that cannot be
    read or written is only slower: the answer is computed."""
    key = _key()
    text = json.dumps(key, sort_keys=True)
    path = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    try:
        kept = json.loads(path.read_text())
        if kept.get("key") == key and isinstance(kept.get("packages"), dict):
            return {str(name): list(dists) for name, dists in kept["packages"].items()}
    except (OSError, ValueError, AttributeError):
        pass
    answer = {name: list(dists) for name, dists in compute().items()}
    try:
        write_text(path, json.dumps({"key": key, "packages": answer}))
        older = sorted(folder.glob("*.json"), key=lambda kept: kept.stat().st_mtime_ns)[:-KEEP]
        for stale in older:  # environments changed or gone: a few answers are plenty
            stale.unlink(missing_ok=True)
    except OSError:
        pass
    return answer


def install() -> None:
    """Replace ``importlib.metadata.packages_distributions`` with the cached one (once; a no-op
    where it is replaced already)."""
    import importlib.metadata as metadata

    original = metadata.packages_distributions
    if getattr(original, "__wrapped__", None) is not None:
        return

    def packages_distributions() -> Mapping[str, list[str]]:
        return cached(original, cache_dir() / "packages")

    packages_distributions.__wrapped__ = original  # type: ignore[attr-defined]
    packages_distributions.__doc__ = original.__doc__
    metadata.packages_distributions = packages_distributions


class BeforeDiffusers:
    """A finder that finds nothing: the first import of diffusers (from anywhere) installs the kept
    map of installed packages that diffusers and transformers read at import, then the usual
    finders load it. It stays in ``sys.meta_path`` (the import system is iterating that list when
    it asks), idle after that."""

    done = False

    @classmethod
    def find_spec(cls, name: str, path: object = None, target: object = None) -> None:
        if name == "diffusers" and not cls.done:
            cls.done = True
            install()


def install_before_diffusers() -> None:
    """Install the kept map now if diffusers is loaded, else at its first import."""
    if "diffusers" in sys.modules:
        install()
    elif BeforeDiffusers not in sys.meta_path:
        sys.meta_path.insert(0, BeforeDiffusers)
