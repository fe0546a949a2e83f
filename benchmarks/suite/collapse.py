"""Whether a finished run collapsed, decided offline from the loss curve in its metrics.jsonl.

A run **collapsed** when any of these holds:

1. it failed: ``diffscale train`` exited with an error (not 0, and not 85, the exit of a run
   stopped on request -- here by the benchmark's seconds budget -- after writing its checkpoint);
2. a logged loss is NaN or infinite;
3. the loss jumped far above its own level and stayed there: smooth the logged losses with a
   trailing median over ``window`` records (each record is already the mean of ``train.log_every``
   steps), and keep the running minimum of that smoothed curve. The run collapsed at the first
   record after the warm-up (``optim.warmup_steps``) whose smoothed loss exceeds ``jump`` times the
   running minimum, provided every smoothed loss from there to the end of the run stays above
   ``stay`` times that minimum and the excursion spans at least ``min_records`` records (one at
   the very end cannot be told from a spike).

Defaults: ``jump`` 1.5, ``stay`` 1.4, ``window`` 5, ``min_records`` 3. Chosen on 72 CPU runs
of tiny, field-icon and policy-tiny on the suite's sets (2026-11-29; the defaults and learning rates
up to 20x tiny's): from a point after the warm-up to the end of the run, every healthy run's
smoothed loss stayed within 1.24x of its running minimum before that point (rain's heavy tail
peaks at 1.79x and falls back), every collapsed one (each also caught by the divergence guard's
replay) above 1.52x. A collapse that comes before the loss has settled is shallow: tiny at lr 8e-3
on ``flat`` went from 0.31 to 0.57 at the end of its warm-up and stayed near 0.5 (1.5-1.7x), which
the first criterion (``jump`` 2, ``stay`` 1.5, set on 2.8-2.9x collapses: 0.15 -> 0.43 on 64 px
images with medium) passed as healthy. A spike that falls back, or a loss that creeps up by less
than 1.4x, is not a collapse. A collapse during the warm-up is caught at its first record after
it, if it stays.

Restores are the records of ``"kind": "divergence"`` in metrics.jsonl (what a divergence guard
writes when it restores the last good state); ``nonfinite_skipped`` is the loop's own count of
steps skipped for a non-finite loss, which it rolls back from.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EXIT_STOPPED = 85
"""diffscale train's exit after a stop request (here: the seconds budget) with its checkpoint written."""


@dataclass(frozen=True)
class Criterion:
    jump: float = 1.5
    """The smoothed loss rises above this many times its running minimum ..."""
    stay: float = 1.4
    """... and stays above this many times that minimum to the end of the run."""
    window: int = 5
    """Records in the trailing median that smooths the logged losses."""
    min_records: int = 3
    """An excursion spans at least this many records to count."""


@dataclass
class Verdict:
    collapsed: bool
    reason: str = ""
    """Why it collapsed, in words; empty when it did not."""
    step: int | None = None
    """The step at which the collapse was found."""
    min_loss: float | None = None
    """The lowest smoothed loss of the run."""
    final_loss: float | None = None
    """The median of the last ``window`` logged losses."""
    peak_ratio: float | None = None
    """The highest smoothed loss after the warm-up over the running minimum before it."""


def smoothed(losses: np.ndarray, window: int) -> np.ndarray:
    """Trailing median of ``losses`` over ``window`` records (fewer at the start)."""
    return np.array([np.median(losses[max(0, i - window + 1):i + 1]) for i in range(len(losses))])


def judge(steps: list[int], losses: list[float], *, warmup_steps: int, exit_code: int | None = 0,
          criterion: Criterion = Criterion()) -> Verdict:
    """The verdict on one run's logged curve (``steps`` rising, ``losses`` the logged values) and
    its exit code (None: not run to an end; counted as failed)."""
    values = np.asarray(losses, dtype=np.float64)
    final = float(np.median(values[-criterion.window:])) if len(values) else None
    if exit_code not in (0, EXIT_STOPPED):
        return Verdict(True, f"the run failed (exit {exit_code})", final_loss=final)
    if not np.isfinite(values).all():
        first = int(np.flatnonzero(~np.isfinite(values))[0])
        return Verdict(True, f"non-finite loss ({values[first]}) at step {steps[first]}", step=steps[first])
    if len(values) == 0:
        return Verdict(False, "", final_loss=None)
    curve = smoothed(values, criterion.window)
    running_min = np.minimum.accumulate(curve)
    ratio = curve / np.maximum(running_min, 1e-12)
    after = [i for i, s in enumerate(steps) if s > warmup_steps]
    peak = float(ratio[after].max()) if after else None
    verdict = Verdict(False, "", min_loss=float(curve.min()), final_loss=final, peak_ratio=peak)
    for i in after:
        if ratio[i] <= criterion.jump or len(curve) - i < criterion.min_records:
            continue
        if (curve[i:] > criterion.stay * running_min[i]).all():
            verdict.collapsed, verdict.step = True, steps[i]
            verdict.reason = (f"loss rose to {ratio[i]:.1f}x its running minimum ({running_min[i]:.4g} -> "
                              f"{curve[i]:.4g}) at step {steps[i]} and stayed above {criterion.stay:g}x "
                              f"(final {curve[-1]:.4g})")
            break
    return verdict


@dataclass
class Metrics:
    """What one run's metrics.jsonl says: the training curve, restores, skipped steps, evaluations."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    restores: int = 0
    nonfinite_skipped: int = 0
    evals: list[dict] = field(default_factory=list)


def read_metrics(path: Path) -> Metrics:
    """Parse ``metrics.jsonl`` (missing: empty). Training records are those without ``kind``; a
    step logged twice keeps its last record (a rollback trains those steps again)."""
    out = Metrics()
    if not Path(path).is_file():
        return out
    curve: dict[int, float] = {}
    for line in Path(path).read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        kind = record.get("kind")
        if kind == "divergence":
            out.restores += 1
        elif kind == "eval":
            out.evals.append(record)
        elif kind is None and "loss" in record and "step" in record:
            loss = record["loss"]
            curve[int(record["step"])] = float(loss) if loss is not None else math.nan
            out.nonfinite_skipped = int(record.get("nonfinite_skipped", out.nonfinite_skipped))
    out.steps = sorted(curve)
    out.losses = [curve[s] for s in out.steps]
    return out
