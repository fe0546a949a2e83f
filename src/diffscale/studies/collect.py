"""``sweep collect``: each element's final and best value of a metric (from its run directory's
metrics.jsonl) against the axes, with the mean and spread over seeds; written as CSV files and a
matplotlib plot in the sweep directory. Loads no torch."""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path

from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.studies.definition import SEED_AXES
from diffscale.studies.state import ElementRecord, read_elements

RUNS_CSV = "collect-runs.csv"
SUMMARY_CSV = "collect-summary.csv"
PLOT = "collect.png"


def metric_values(run_dir: Path, metric: str) -> list[float]:
    """Every logged value of ``metric`` in the run's metrics.jsonl, in order."""
    path = run_dir / "metrics.jsonl"
    values: list[float] = []
    if not path.is_file():
        return values
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        value = row.get(metric) if isinstance(row, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values.append(float(value))
    return values


def _csv(header: list[str], rows: list[list[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def _spread(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(rows: list[ElementRecord], metric: str) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(axes, per-run rows, per-group rows): groups are the elements that differ only in their seed."""
    axes = [k for k in rows[0].values] if rows else []
    varied = [a for a in axes if a not in SEED_AXES]
    per_run: list[list[str]] = []
    groups: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for row in rows:
        found = metric_values(Path(row.run_dir), metric)
        final, best = (found[-1], min(found)) if found else (None, None)
        per_run.append([str(row.index), *(row.values[a] for a in axes), _fmt(final), _fmt(best), str(len(found))])
        key = tuple(row.values[a] for a in varied)
        groups.setdefault(key, [])
        if final is not None and best is not None:
            groups[key].append((final, best))
    per_group = []
    for key, pairs in groups.items():
        fm, fs = _spread([p[0] for p in pairs])
        bm, bs = _spread([p[1] for p in pairs])
        per_group.append([*key, str(len(pairs)), _fmt(fm), _fmt(fs), _fmt(bm), _fmt(bs)])
    return axes, per_run, per_group


def plot(path: Path, varied: list[str], per_group: list[list[str]], metric: str) -> bool:
    """Final ``metric`` (mean +- spread over seeds) against the first varied axis, one line per value
    of the others. False when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [g for g in per_group if g[len(varied) + 1]]
    if not drawn or not varied:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    lines: dict[tuple[str, ...], list[list[str]]] = {}
    for g in drawn:
        lines.setdefault(tuple(g[1:len(varied)]), []).append(g)
    for rest, members in lines.items():
        ticks = [m[0] for m in members]
        label = ", ".join(f"{n}={v}" for n, v in zip(varied[1:], rest, strict=True)) or None
        ax.errorbar(range(len(ticks)), [float(m[len(varied) + 1]) for m in members],
                    yerr=[float(m[len(varied) + 2]) for m in members], marker="o", capsize=3, label=label)
        ax.set_xticks(range(len(ticks)), ticks)
    ax.set_xlabel(varied[0])
    ax.set_ylabel(f"final {metric} (mean ± sd over seeds)")
    if any(rest for rest in lines):
        ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return True


def collect(sweep_dir: Path, *, metric: str = "loss") -> list[str]:
    """Write the CSVs and the plot; return the lines to print (the summary table and the files)."""
    from rich.console import Console
    from rich.table import Table

    rows = read_elements(sweep_dir)
    axes, per_run, per_group = summarise(rows, metric)
    if not any(r[-1] != "0" for r in per_run):
        raise UserError(f"no element of {sweep_dir} has logged {metric} yet",
                        f"check `diffscale sweep status {sweep_dir}`, or pass --metric NAME of metrics.jsonl")
    varied = [a for a in axes if a not in SEED_AXES]
    write_text(sweep_dir / RUNS_CSV, _csv(["element", *axes, f"final_{metric}", f"best_{metric}", "records"],
                                            per_run))
    header = [*varied, "seeds", f"final_{metric}_mean", f"final_{metric}_sd", f"best_{metric}_mean",
              f"best_{metric}_sd"]
    write_text(sweep_dir / SUMMARY_CSV, _csv(header, per_group))
    table = Table(title=f"sweep {sweep_dir.name}: {metric}, mean ± sd over seeds")
    for col in header:
        table.add_column(col)
    for g in per_group:
        table.add_row(*g)
    out = io.StringIO()
    Console(file=out, width=200, highlight=False).print(table)
    drawn = plot(sweep_dir / PLOT, varied, per_group, metric)
    files = [sweep_dir / RUNS_CSV, sweep_dir / SUMMARY_CSV, *([sweep_dir / PLOT] if drawn else [])]
    return [*out.getvalue().rstrip().splitlines(), *(f"wrote {f}" for f in files)]
