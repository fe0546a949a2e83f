"""``sweep report``: one self-contained HTML page comparing a sweep's runs: their curves overlaid
(loss, throughput, and each evaluation score where evaluation logged them, titled with which way
is better), one colour (and, past ten, line style) per combination of the varied axes and one line
style per seed, so no two groups' curves look alike; and the tables of collect
(``studies/collect.py`` decides their columns). Plots are inline PNGs (matplotlib, Agg); the page
asks the network for nothing."""

from __future__ import annotations

import datetime
import html
import io
import json
from pathlib import Path
from typing import Any

from diffscale.io.atomic import write_text
from diffscale.io.scores import headline, score_of
from diffscale.report.plots import png_data_uri
from diffscale.studies.collect import plain_text, summarise
from diffscale.studies.definition import SEED_AXES
from diffscale.studies.state import ElementRecord

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ddd; padding: .25em .6em; font-size: .92em; }
.plots img { width: 520px; margin: .3em; } .muted { color: #777; }
"""
CURVES = (("loss", "Loss", True), ("samples_per_s", "Throughput (samples/s)", False))
"""(field, title, log scale) drawn for every sweep; numeric fields of evaluation records are added."""


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"
    return "<table>" + head + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows) + \
        "</table>"


def _records(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
            rows.append(row)
    return rows


def _fields(records: dict[int, list[dict[str, Any]]]) -> list[tuple[str, str, bool]]:
    present = {k for rows in records.values() for r in rows for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    quality = list(headline({k: 0.0 for k in present}))  # the evaluation scores, in their table's order
    return [c for c in CURVES if c[0] in present] + [(k, _titled(k), False) for k in quality]


def _titled(name: str) -> str:
    score = score_of(name)
    return f"{name} ({score.better.value} is better)" if score is not None else name


LINE_STYLES = ("-", "--", ":", "-.")


def _styles(rows: list[ElementRecord], varied: list[str]) -> dict[int, tuple[str, str, str]]:
    """(colour, line style, legend label) of each element: a colour per combination of the varied
    axes (a line style more per ten combinations), a line style per seed."""
    def key(row: ElementRecord) -> tuple[str, ...]:
        return tuple(row.values.get(a, "") for a in varied)

    combos = list(dict.fromkeys(key(r) for r in rows))
    seeds = list(dict.fromkeys(next((v for k, v in r.values.items() if k in SEED_AXES), "") for r in rows))
    styles = {}
    for row in rows:
        k = combos.index(key(row))
        seed = next((v for n, v in row.values.items() if n in SEED_AXES), "")
        dash = LINE_STYLES[(k // 10 + (seeds.index(seed) if len(seeds) > 1 else 0)) % len(LINE_STYLES)]
        label = ", ".join(f"{a}={v}" for a, v in zip(varied, key(row), strict=True))
        styles[row.index] = (f"C{k % 10}", dash, plain_text(label))
    return styles


def _overlay(field: str, title: str, log_y: bool, rows: list[ElementRecord], varied: list[str],
             records: dict[int, list[dict[str, Any]]]) -> str:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.0, 3.4), dpi=100, layout="constrained")
    ax = figure.subplots()
    styles = _styles(rows, varied)
    labelled: set[str] = set()
    for row in rows:
        points = [(r["step"], r[field]) for r in records[row.index] if isinstance(r.get(field), (int, float))]
        if not points:
            continue
        colour, dash, label = styles[row.index]
        steps, ys = zip(*points, strict=True)
        ax.plot(steps, ys, color=colour, linestyle=dash, alpha=0.8, linewidth=1.1,
                label=label if label and label not in labelled else None)
        labelled.add(label)
    if log_y and all(y > 0 for rs in records.values() for r in rs if isinstance(y := r.get(field), (int, float))):
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if any(labelled):
        ax.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return f'<img alt="{_e(title)}" title="{_e(title)}" src="{png_data_uri(buffer.getvalue())}">'


def render(sweep_dir: Path, metric: str = "loss") -> str:
    summary = summarise(sweep_dir, metric)
    rows = [f.record for f in summary.runs]
    records = {r.index: _records(Path(r.run_dir)) for r in rows}
    varied = [a for a in summary.varied if len({r.values.get(a) for r in rows}) > 1]
    plots = "".join(_overlay(f, t, log, rows, varied, records) for f, t, log in _fields(records))
    made = datetime.datetime.now().isoformat(timespec="seconds")
    body = (f'<section id="curves"><h2>Curves</h2><div class="plots">{plots or "<p class=muted>no records yet</p>"}'
            f'</div></section><section id="summary"><h2>Final numbers, mean and spread over seeds</h2>'
            f'{_table(summary.group_header, summary.per_group)}</section>'
            f'<section id="runs"><h2>Runs</h2>{_table(summary.run_header, summary.per_run)}</section>')
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>diffscale sweep '
            f'{_e(sweep_dir.name)}</title><style>{STYLE}</style></head><body><h1>diffscale sweep {_e(sweep_dir.name)}'
            f'</h1><p class="muted">{_e(sweep_dir.resolve())} &middot; {len(rows)} run(s) &middot; report made {made}'
            f"</p>{body}</body></html>\n")


def write_sweep_report(sweep_dir: Path, out: Path | None = None, metric: str = "loss") -> Path:
    target = Path(out) if out else sweep_dir / "report.html"
    write_text(target, render(sweep_dir, metric))
    return target
