"""The report's evaluation section: each score over training (the ``kind: eval`` records of
metrics.jsonl, written by ``train.eval_every`` and ``diffscale eval``), with its reference (the
data scored against other data) as a dashed line where the records have one, and a table of
every evaluation."""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

from diffscale.io.scores import eval_records, headline, is_number, score_of
from diffscale.report.plots import png_data_uri


def _e(value: object) -> str:
    return html.escape(str(value))


def _plot(name: str, evals: Sequence[Mapping[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 3.2), dpi=100, layout="constrained")
    axes = figure.subplots()
    for field, label, style in ((name, "samples", "-o"), (f"reference_{name}", "data vs data", "--x")):
        points = sorted((r["step"], r[field]) for r in evals if is_number(r.get(field)) and is_number(r.get("step")))
        if points:
            steps, values = zip(*points, strict=True)
            axes.plot(steps, values, style, label=label, linewidth=1.2, markersize=3)
    score = score_of(name)
    axes.set_title(f"{name} ({score.better.value} is better)" if score is not None else name)
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    if any(is_number(r.get(f"reference_{name}")) for r in evals):
        axes.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return f'<img alt="{_e(name)} over training" title="{_e(name)}" src="{png_data_uri(buffer.getvalue())}">'


def section(events: Sequence[Mapping[str, Any]]) -> str:
    """The section's HTML from a run's event records."""
    evals = eval_records(events)
    if not evals:
        return ('<p class="muted">no evaluations yet: <code>diffscale eval RUN_DIR</code>, or '
                '<code>train.eval_every</code> while training</p>')
    names = list(dict.fromkeys(name for record in evals for name in headline(record)))
    plots = "".join(_plot(name, evals) for name in names)
    head = "<tr><th>step</th>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>"
    rows = []
    for record in evals:
        cells = []
        for name in names:
            value, reference = record.get(name), record.get(f"reference_{name}")
            text = f"{value:.4g}" if is_number(value) else ""
            cells.append(text + (f" (data {reference:.4g})" if is_number(reference) and text else ""))
        rows.append(f"<tr><td>{_e(record.get('step', '?'))}</td>" + "".join(f"<td>{_e(c)}</td>" for c in cells)
                    + "</tr>")
    return f'<div class="plots">{plots}</div><table>{head}{"".join(rows)}</table>'
