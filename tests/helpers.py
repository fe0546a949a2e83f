"""Shared test helpers: a micro model config that trains in seconds on a CPU, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A 2-level UNet on 8 px glyphs: a training step takes milliseconds.
MICRO = [
    "model.sample_size=8",
    "model.block_out_channels=[8,16]",
    "model.attention=[false,true]",
    "model.layers_per_block=1",
    "model.norm_num_groups=8",
    "train.batch_per_gpu=8",
    "train.log_every=2",
    "train.checkpoint_every=4",
    "train.sample_count=4",
    "train.sample_steps=3",
    "optim.warmup_steps=2",
]


def micro_args(*extra: str, steps: int = 8) -> list[str]:
    args: list[str] = []
    for item in [*MICRO, f"train.steps={steps}", *extra]:
        args += ["--set", item]
    return args


def run_cli(*args: str, env: dict | None = None, timeout: float = 300,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m diffscale ARGS`` as a user would; returns the completed process."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
    full_env.pop("RANK", None)
    full_env.pop("WORLD_SIZE", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "diffscale", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=cwd)
