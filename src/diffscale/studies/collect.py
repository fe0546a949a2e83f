"""``sweep collect``: each element's final and best value of a metric (from its run directory's
metrics.jsonl: one JSON object a line, the metric a number in it; a user command writes it too)
against the axes, with the mean and spread over seeds; written as CSV files and a matplotlib plot
in the sweep directory. Loads no torch."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.studies.definition import SEED_AXES
from diffscale.studies.standing import local_states
from diffscale.studies.state import ElementRecord, ElementState

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
    """Mean and standard deviation; one value has no spread (None, shown empty), not a spread of 0."""
    if not values:
        return None, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


@dataclass(frozen=True)
class RunFacts:
    """What collect knows of one element: where it stands and what it logged."""

    record: ElementRecord
    state: ElementState
    found: list[float]
    """Every logged value of the metric, in order."""

    @property
    def final(self) -> float | None:
        return self.found[-1] if self.found else None

    @property
    def best(self) -> float | None:
        return min(self.found) if self.found else None


Column = tuple[str, Callable[[RunFacts], str]]


def run_columns(axes: list[str], metric: str) -> list[Column]:
    """The per-run table's columns, the one place that decides them (collect-runs.csv, the
    report's table of runs): a new column is one more (header, value of a run) pair here."""
    return [("element", lambda f: str(f.record.index)),
            *[(a, lambda f, a=a: f.record.values.get(a, "")) for a in axes],
            (f"final_{metric}", lambda f: _fmt(f.final)), (f"best_{metric}", lambda f: _fmt(f.best)),
            ("records", lambda f: str(len(f.found))), ("state", lambda f: f.state.state)]


def group_columns(varied: list[str], metric: str) -> list[tuple[str, Callable[[list[RunFacts]], str]]]:
    """The summary's columns: the varied axes, then each figure's mean and spread over seeds."""
    def stat(pick: Callable[[RunFacts], float | None], which: int) -> Callable[[list[RunFacts]], str]:
        return lambda runs: _fmt(_spread([v for f in runs if (v := pick(f)) is not None])[which])

    return [*[(a, lambda runs, a=a: runs[0].record.values.get(a, "")) for a in varied],
            ("seeds", lambda runs: str(sum(f.final is not None for f in runs))),
            (f"final_{metric}_mean", stat(lambda f: f.final, 0)), (f"final_{metric}_sd", stat(lambda f: f.final, 1)),
            (f"best_{metric}_mean", stat(lambda f: f.best, 0)), (f"best_{metric}_sd", stat(lambda f: f.best, 1))]


@dataclass(frozen=True)
class Summary:
    axes: list[str]
    varied: list[str]
    """The axes less the seed: the elements that differ only in their seed form one group."""
    runs: list[RunFacts]
    run_header: list[str]
    per_run: list[list[str]]
    group_header: list[str]
    per_group: list[list[str]]


def summarise(sweep_dir: Path, metric: str) -> Summary:
    """Every element as ``local_states`` judges it, with its values of ``metric``, as the tables'
    rows: one per run, one per group of seeds."""
    standing = local_states(sweep_dir)
    runs = [RunFacts(row, state, metric_values(Path(row.run_dir), metric)) for row, state in standing]
    axes = list(runs[0].record.values) if runs else []
    varied = [a for a in axes if a not in SEED_AXES]
    columns = run_columns(axes, metric)
    groups: dict[tuple[str, ...], list[RunFacts]] = {}
    for f in runs:
        groups.setdefault(tuple(f.record.values.get(a, "") for a in varied), []).append(f)
    summary = group_columns(varied, metric)
    return Summary(axes, varied, runs, [c[0] for c in columns], [[c[1](f) for c in columns] for f in runs],
                   [c[0] for c in summary], [[c[1](members) for c in summary] for members in groups.values()])


def plain_text(text: str) -> str:
    """Text matplotlib shows as it is: ``$`` would start mathtext (and fail on an odd count)."""
    return text.replace("$", r"\$")


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
                    yerr=[float(m[len(varied) + 2] or 0) for m in members], marker="o", capsize=3,
                    label=plain_text(label) if label else None)
        ax.set_xticks(range(len(ticks)), [plain_text(t) for t in ticks])
    ax.set_xlabel(plain_text(varied[0]))
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
    from rich.text import Text

    summary = summarise(sweep_dir, metric)
    if not any(f.found for f in summary.runs):
        missing = [f for f in summary.runs if f.state.state == "missing"]
        command = any(f.record.values and not (Path(f.record.run_dir) / "config.yaml").is_file() for f in summary.runs)
        hint = (" (a command sweep: the command writes metrics.jsonl in its run directory, one JSON object a line "
                "such as {\"step\": 10, \"loss\": 0.5}; docs/studies.md)" if command else "")
        raise UserError(f"no element of {sweep_dir} has logged {metric} yet"
                        f"{f' ({len(missing)} run directories are gone)' if missing else ''}",
                        f"check `diffscale sweep status {sweep_dir}`, or pass --metric NAME of metrics.jsonl{hint}")
    write_text(sweep_dir / RUNS_CSV, _csv(summary.run_header, summary.per_run))
    write_text(sweep_dir / SUMMARY_CSV, _csv(summary.group_header, summary.per_group))
    table = Table(title=Text(f"sweep {sweep_dir.name}: {metric}, mean ± sd over seeds"))
    for col in summary.group_header:
        table.add_column(Text(col))
    for g in summary.per_group:
        table.add_row(*(Text(c) for c in g))
    out = io.StringIO()
    Console(file=out, width=200, highlight=False).print(table)
    drawn = plot(sweep_dir / PLOT, summary.varied, summary.per_group, metric)
    files = [sweep_dir / RUNS_CSV, sweep_dir / SUMMARY_CSV, *([sweep_dir / PLOT] if drawn else [])]
    gone = [str(f.record.index) for f in summary.runs if f.state.state == "missing"]
    note = [f"missing: the run directories of element(s) {', '.join(gone)} are gone"] if gone else []
    return [*out.getvalue().rstrip().splitlines(), *note, *(f"wrote {f}" for f in files)]
