"""diffscale: train diffusion models on any device, node or cluster with one config.

From Python (a notebook), the same calls the command line makes::

    import diffscale
    cfg = diffscale.get_preset("tiny")                         # or diffscale.resolve_config(...)
    diffscale.train_run(cfg, "runs/tiny", resume="auto")       # a reset runtime continues with the same call
    files = diffscale.sample_run("runs/tiny", n=16, steps=20)  # PNG grid from the EMA weights
    ens = diffscale.sample_ensembles("runs/fields", cond, members=16)  # a fields run: (N, 16, D) for cond (N, C)
    run = diffscale.load_trained("runs/tiny")                  # config, task and EMA network for your own code

The names load on first use, so ``import diffscale`` stays light (no torch until needed). They
are not called ``train`` and ``sample``: those are the modules ``diffscale.training.loop`` and
``diffscale.inference.sample``, which an attribute of the same name would shadow.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from diffscale.runtime import user_env as _user_env  # noqa: F401  (read before torch loads: see the module)
from diffscale.version import __version__

if sys.platform == "darwin":
    # Operations Apple's MPS backend lacks run on the CPU instead of ending a run. torch reads
    # the variable once, when it loads: it must be set before the first `import torch`.
    os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")

FAST_START = "DIFFSCALE_FAST_START"
"""Set to 1, ``import diffscale`` calls :func:`fast_start` (a job that uses the Python API)."""


def fast_start() -> None:
    """What the command line does before it imports torch, for a script or job of your own: Python's
    bytecode kept in the user's cache where torch's installation has none (``sys.pycache_prefix``,
    ``PYTHONPYCACHEPREFIX``), and the installed packages' map diffusers reads at import kept there
    (``importlib.metadata.packages_distributions`` replaced once diffusers is imported). Both change
    the whole interpreter, so ``import diffscale`` alone does neither (docs/decisions.md,
    "Interpreter-wide speed-ups at the command line, or asked for"). Call it before torch loads."""
    from diffscale.runtime.bytecode import keep_bytecode
    from diffscale.runtime.package_index import install_before_diffusers

    keep_bytecode()
    install_before_diffusers()


if os.environ.get(FAST_START) == "1":
    fast_start()

_EXPORTS = {
    "train_run": ("diffscale.training.loop", "train"),
    "sample_run": ("diffscale.inference.sample", "sample_run"),
    "sample_ensembles": ("diffscale.inference.sample", "sample_ensembles"),
    "load_trained": ("diffscale.inference.trained", "load_trained"),
    "get_preset": ("diffscale.config.presets", "get_preset"),
    "resolve_config": ("diffscale.config", "resolve_config"),
    "ConfigSources": ("diffscale.config", "ConfigSources"),
    "RunConfig": ("diffscale.config", "RunConfig"),
    "write_report": ("diffscale.report.page", "write_report"),
}
__all__ = ["__version__", "fast_start", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'diffscale' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
