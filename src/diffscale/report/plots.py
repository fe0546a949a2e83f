"""The plots of ``diffscale report``: training curves from metrics.jsonl as PNG data URIs
(matplotlib, Agg), so the page carries them inline and needs nothing beside it."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Curve:
    """One plot: a title, the y-axis label, and the record fields drawn (several GPUs: one line each)."""

    title: str
    ylabel: str
    fields: tuple[str, ...]
    log_y: bool = False


def curves_for(records: Sequence[dict[str, Any]]) -> list[Curve]:
    """The plots the records have data for: loss, learning rate, throughput, then GPU
    utilisation and memory where NVML recorded them."""
    present = {k for r in records for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    gpus = sorted({int(m.group(1)) for k in present if (m := re.match(r"gpu(\d+)_util_pct$", k))})
    candidates = [
        Curve("Loss", "loss", ("loss",), log_y=True),
        Curve("Learning rate", "learning rate", ("lr",)),
        Curve("Throughput", "samples/s", ("samples_per_s",)),
        Curve("GPU utilisation", "% of time a kernel ran", tuple(f"gpu{i}_util_pct" for i in gpus)),
        Curve("GPU memory used", "MiB", tuple(f"gpu{i}_mem_mb" for i in gpus)),
    ]
    return [c for c in candidates if any(f in present for f in c.fields)]


def png_data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def plot(curve: Curve, records: Sequence[dict[str, Any]]) -> str:
    """The curve against the step, as a PNG data URI."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 3.2), dpi=100, layout="constrained")
    axes = figure.subplots()
    for field in curve.fields:
        points = [(r["step"], r[field]) for r in records
                  if isinstance(r.get(field), (int, float)) and r[field] == r[field]]  # NaN != NaN: left out
        if points:
            steps, values = zip(*points, strict=True)
            axes.plot(steps, values, label=field.split("_")[0] if len(curve.fields) > 1 else None, linewidth=1.2)
    if curve.log_y and all(v > 0 for r in records for f in curve.fields
                           if isinstance(v := r.get(f), (int, float))):
        axes.set_yscale("log")
    axes.set_title(curve.title)
    axes.set_xlabel("step")
    axes.set_ylabel(curve.ylabel)
    axes.grid(alpha=0.3)
    if len(curve.fields) > 1:
        axes.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return png_data_uri(buffer.getvalue())


def image_uri(path: Path) -> str:
    """A PNG file as a data URI."""
    return png_data_uri(Path(path).read_bytes())


def spread(items: Sequence[Any], most: int) -> list[Any]:
    """At most ``most`` items, evenly spaced from first to last (sample grids over a long run)."""
    if len(items) <= most:
        return list(items)
    picks = sorted({round(i * (len(items) - 1) / (most - 1)) for i in range(most)})
    return [items[i] for i in picks]
