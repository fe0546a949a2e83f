"""The feature networks the suite's image evaluations score in, built ahead of a call.

``diffscale eval`` trains one per data set, resolution and seed and keeps it in the data cache
(``DIFFSCALE_CACHE_DIR``/quality). Until fdd9d60 it trained on the CPU: at medium's 64 px 288-302 s
on a two-H200 host beside four training runs, where sampling took 6 s (2026-11-30); since then an
evaluation on a GPU trains it there (2.1 s). ``--prepare-features`` builds them on the CPU for the
same data paths, and the GPU script carries them in (scripts/gpu/suite_defaults.sh,
``FEATURES=FILE``): a call then scores in the networks a CPU machine or an earlier call built, as a
user's second evaluation does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from benchmarks.suite.launch import RunSpec
from diffscale.config import ConfigSources, resolve_config


def prepare(specs: list[RunSpec], say: Callable[[str], None]) -> int:
    """Build (or find) the feature network of each image preset and data set in ``specs``, as its
    runs' evaluations would; returns how many were looked at."""
    import torch

    from diffscale.tasks.registry import build_task

    done: set[tuple[str, str]] = set()
    for spec in specs:
        if spec.task != "images" or (spec.preset, spec.data) in done:
            continue
        done.add((spec.preset, spec.data))
        cfg = resolve_config(ConfigSources(preset=spec.preset, data=spec.data, overrides=list(spec.overrides)))
        start = time.perf_counter()
        build_task(cfg, torch.device("cpu")).prepare_quality()
        say(f"{spec.preset}/{spec.set_name}: feature network ready ({time.perf_counter() - start:.1f} s)")
    return len(done)
