"""Python's compiled bytecode kept in the user's cache where the installation keeps none.

An installation whose torch has no ``__pycache__`` -- a container image built with
``PYTHONDONTWRITEBYTECODE=1`` (a common line in Dockerfiles), a read-only shared environment
installed without bytecode -- makes every process compile the source of each module it imports:
torch, dynamo, inductor and diffusers, thousands of modules, at every job. On an H200 host whose
torch shipped none, a resumed job spent 10.2 s of 33.8 s in ``compile`` (3,492 modules, cProfile);
on the 2-core CI machine importing torch, dynamo, inductor and diffusers' UNet took 13.0-13.1 s
without bytecode against 4.7 s with it (docs/measurements/2026-11-28.md, "Bytecode kept where the installation
has none").

:func:`keep_bytecode` (the command line's first step, before torch loads) points Python's bytecode
at ``DIFFSCALE_CACHE_DIR/bytecode`` (``sys.pycache_prefix``, and ``PYTHONPYCACHEPREFIX`` for the
processes a job starts) when torch's own bytecode is missing and the user set no prefix: the
first job writes it there, later jobs read it. It writes there even under
``PYTHONDONTWRITEBYTECODE``, which such images set so that nothing is written into the image, not
to slow every start; a user who wants the bytecode elsewhere sets ``PYTHONPYCACHEPREFIX``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from diffscale.io.paths import cache_dir


def installed_without_bytecode(package: str = "torch") -> bool:
    """Whether ``package`` is installed with no compiled bytecode beside its ``__init__``
    (found without importing it)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    cached = importlib.util.cache_from_source(spec.origin)
    return not os.path.exists(cached)


def keep_bytecode(environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """Keep bytecode in ``DIFFSCALE_CACHE_DIR/bytecode`` where torch's installation has none and the
    user chose no prefix; returns the folder, or None where nothing changed."""
    if environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix or not installed_without_bytecode():
        return None
    folder = cache_dir() / "bytecode"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a cache that cannot be written: start as before
        return None
    sys.pycache_prefix = str(folder)
    sys.dont_write_bytecode = False
    environ["PYTHONPYCACHEPREFIX"] = str(folder)  # the job's own processes: ranks, loader and compile workers
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return folder
