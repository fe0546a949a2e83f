"""Research benchmarks of diffscale, run from the repository root as ``python -m benchmarks.NAME``
(each module's docstring gives its command; docs/benchmarks.md the figures they measured).

They build on the package and are not part of it: nothing under src/diffscale imports them. The
``diffscale bench`` verb (throughput, scaling, profiles, the plain recipe) is in diffscale.bench.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository root, the folder that holds this package."""


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the repository root first on PYTHONPATH, so that a child process started as
    ``python -m benchmarks.NAME`` imports this package from whatever folder it runs in."""
    rest = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), *([rest] if rest else [])])}
