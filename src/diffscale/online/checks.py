"""What the online trainer checks of its arguments and of the run directory it is given, each
refusal one ``UserError`` naming the argument and the fix."""

from __future__ import annotations

import math
import numbers
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io.rundir import read_config
from diffscale.runtime import checkpoint as ckpt


def check_sizes(capacity: object, ready_at: object, batch: int) -> None:
    """``capacity`` and ``ready_at`` are whole numbers of samples, at least one batch; ``ready_at``
    at most ``capacity``."""
    if not whole(capacity, batch):
        why = (f"is below one batch of {batch} samples" if whole(capacity, -math.inf)
               else "is not a whole number of samples")
        raise UserError(f"capacity={capacity!r} {why}", f"pass capacity >= {batch} (or lower train.batch_per_gpu)")
    assert isinstance(capacity, numbers.Integral)
    if ready_at is not None and not whole(ready_at, batch, int(capacity)):
        why = ("is not a whole number of samples" if not whole(ready_at, -math.inf)
               else f"is below one batch of {batch} samples" if int(ready_at) < batch  # type: ignore[call-overload]
               else f"is more than the buffer's capacity of {capacity} samples")
        raise UserError(f"ready_at={ready_at!r} {why}", f"pass ready_at from {batch} to {capacity} (samples the "
                        "buffer holds before training starts), or leave it out to start once it is full")


def whole(value: object, low: float, high: float = math.inf) -> bool:
    """Whether ``value`` is an integer (Python or numpy, not a bool) from ``low`` to ``high``."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and low <= int(value) <= high


def check_online_run(run_dir: Path, state: ckpt.TrainingState | None) -> None:
    """Refuse a run directory that ``diffscale train`` filled from other data: resuming it would
    start from an empty buffer and rewrite its config (after which it no longer evaluates)."""
    saved = read_config(run_dir) or (state.meta.config if state is not None else {})
    source = str((saved.get("data") or {}).get("source", "")) if saved else ""
    if not saved or source.startswith("online:"):
        return
    how = (f"follows a spool ({source}) with diffscale train" if source.startswith("spool:")
           else f"was trained offline from {source or 'data of its config'}")
    raise UserError(f"'{run_dir}' holds a run that {how}; OnlineTrainer continues only runs it started",
                    "start online training in a new run directory, e.g. OnlineTrainer('runs/online', cfg)")


def check_same_model(state: ckpt.TrainingState, expected: dict[str, Any], run_dir: Path) -> None:
    found = state.meta.signature or {}
    if found != expected:
        what = f"a '{found.get('task')}' run" if found.get("task") != "fields" else f"another field model ({found})"
        raise UserError(f"'{run_dir}' holds checkpoints of {what}, not of this config's {expected}",
                        "pass a new run directory, or the config that run was trained with")
