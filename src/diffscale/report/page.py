"""``diffscale report RUN_DIR``: one self-contained HTML page about a run.

Training curves (loss, learning rate, throughput, GPU utilisation and memory), the evaluation
scores over training (with the data's own as reference), the sample grids over time, the
resolved config, the job history (submissions, continuations and requeues, what the doctor
finds) and the system the run ran on. Images are inline PNG data
URIs and the style is inline: the page names no URL, runs no script, and can be mailed or
opened on a machine without access to the cluster.
"""

from __future__ import annotations

import datetime
import html
import json
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io import rundir
from diffscale.io.atomic import write_text
from diffscale.report.evaluations import section as evaluations
from diffscale.report.plots import curves_for, image_uri, plot, spread

MOST_GRIDS = 12
"""Sample grids shown at most, evenly spaced over the run."""

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ddd; padding: .25em .6em;
 text-align: left; vertical-align: top; font-size: .92em; }
pre { background: #f6f6f6; padding: .8em; overflow-x: auto; font-size: .85em; }
.plots img { width: 520px; margin: .3em; } .grids { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; text-align: center; } figure img { image-rendering: pixelated; width: 200px; }
.muted { color: #777; }
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(rows: list[list[Any]] | list[tuple[Any, ...]], header: tuple[str, ...] = ()) -> str:
    head = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{_e(title)}</h2>{body}</section>'


def _plots(records: list[dict[str, Any]]) -> str:
    curves = curves_for(records)
    if not curves:
        return '<p class="muted">no training records yet (metrics.jsonl)</p>'
    images = "".join(f'<img alt="{_e(c.title)}" title="{_e(c.title)}" src="{plot(c, records)}">' for c in curves)
    note = "" if any(c.title.startswith("GPU") for c in curves) else \
        '<p class="muted">no GPU utilisation recorded (a CPU run, or NVML / nvidia-ml-py missing)</p>'
    return f'<div class="plots">{images}</div>{note}'


def _grids(run_dir: Path) -> str:
    grids = rundir.sample_grids(run_dir)
    if not grids:
        return '<p class="muted">no sample grids yet (training writes one at the end, and every train.sample_every)</p>'
    figures = "".join(f'<figure><img alt="samples at step {step}" src="{image_uri(path)}">'
                      f"<figcaption>step {step}</figcaption></figure>" for step, path in spread(grids, MOST_GRIDS))
    shown = f" ({MOST_GRIDS} of {len(grids)}, evenly spaced)" if len(grids) > MOST_GRIDS else ""
    return f'<p>preview grids from the EMA weights{shown}</p><div class="grids">{figures}</div>'


def _config(run_dir: Path) -> str:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return '<p class="muted">no config.yaml in the run folder</p>'
    return f"<pre>{_e(path.read_text(errors='replace'))}</pre>"


def _jobs(run_dir: Path) -> str:
    from diffscale.cluster.jobs import records as jobs

    if not jobs.path(run_dir).is_file():
        return '<p class="muted">a local run: nothing was submitted to a scheduler (no jobs.json)</p>'
    parts = []
    submissions = jobs.load(run_dir)
    for index, sub in enumerate(submissions):
        listed = jobs.latest(run_dir) if index == len(submissions) - 1 else sub
        rows = [(j.job_id, j.shape, j.partition, f"{j.segment}/{j.segments}", j.after or "",
                 "requeue / continuation" if j.after and j not in sub.jobs else (j.role or "submitted"), j.log)
                for j in listed.jobs]
        parts.append(f"<h3>{_e(sub.submitted_at)}: {_e(sub.what)} on {_e(sub.cluster)} ({_e(sub.scheduler)})</h3>"
                     + _table(rows, ("job id", "shape", "partition", "segment", "after", "kind", "log")))
    return "".join(parts)


def _doctor(run_dir: Path) -> str:
    from diffscale.doctor import diagnose
    from diffscale.doctor.sources import gather

    try:
        findings = diagnose(gather(str(run_dir)))
    except UserError as exc:
        return f'<p class="muted">the doctor could not read this run: {_e(exc.message)}</p>'
    if not findings:
        return '<p class="muted">the doctor found no known failure signature</p>'
    return _table([(f.title, f.cause, f.fix, f"{f.origin}: {f.evidence}") for f in findings],
                  ("finding", "cause", "fix", "seen"))


def _system(run_dir: Path) -> str:
    path = run_dir / "system.json"
    try:
        facts = json.loads(path.read_text())
    except (OSError, ValueError):
        return '<p class="muted">no system.json (runs trained before diffscale recorded it)</p>'
    parts = [f"<p>recorded when training last started, {_e(facts.get('collected_at', '?'))}</p>"]
    for section in facts.get("sections", []):
        parts.append(f"<h3>{_e(section['title'])}</h3>" + _table(section["rows"]))
    if facts.get("topology"):
        parts.append(f"<h3>GPU topology</h3><pre>{_e(facts['topology'])}</pre>")
    return "".join(parts)


def render(run_dir: Path) -> str:
    """The page's HTML."""
    run_dir = Path(run_dir)
    summary = rundir.describe(rundir.progress(run_dir))
    records, events = rundir.read_records(run_dir)
    sections = [("progress", "Progress", "<ul>" + "".join(f"<li>{_e(s)}</li>" for s in summary) + "</ul>"),
                ("curves", "Training curves", _plots(records)),
                ("evaluations", "Evaluation scores", evaluations(events)),
                ("samples", "Samples over time", _grids(run_dir)),
                ("config", "Resolved config", _config(run_dir)), ("jobs", "Job history", _jobs(run_dir)),
                ("doctor", "Doctor", _doctor(run_dir)), ("system", "System", _system(run_dir))]
    made = datetime.datetime.now().isoformat(timespec="seconds")
    body = "".join(_section(*s) for s in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>diffscale run {_e(run_dir.name)}'
            f"</title><style>{_STYLE}</style></head><body><h1>diffscale run {_e(run_dir.name)}</h1>"
            f'<p class="muted">{_e(run_dir.resolve())} &middot; report made {made}</p>{body}</body></html>\n')


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) and return its path."""
    run_dir = Path(run_dir)
    page = render(run_dir)
    target = Path(out) if out else run_dir / "report.html"
    return write_text(target, page)
