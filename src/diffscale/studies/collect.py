"""``sweep collect``: each element's final and best value of a metric (from its run directory's
metrics.jsonl: one JSON object a line, the metric a number in it; a user command writes it too)
against the axes, with the mean and spread over seeds; written as CSV files and a matplotlib plot
in the sweep directory. Loads no torch."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.studies.definition import SEED_AXES
from diffscale.studies.scores import newest_scores, score_names, sort_by
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
    scores: dict[str, float] = field(default_factory=dict)
    """The newest value of each evaluation score (FD, CRPS, success, ...; :mod:`diffscale.io.scores`)."""

    @property
    def final(self) -> float | None:
        return self.found[-1] if self.found else None

    @property
    def best(self) -> float | None:
        return min(self.found) if self.found else None


Column = tuple[str, Callable[[RunFacts], str]]


def run_columns(axes: list[str], metric: str, scores: Sequence[str] = ()) -> list[Column]:
    """The per-run table's columns, the one place that decides them (collect-runs.csv, the
    report's table of runs): a new column is one more (header, value of a run) pair here; one
    column per evaluation score any run has."""
    return [("element", lambda f: str(f.record.index)),
            *[(a, lambda f, a=a: f.record.values.get(a, "")) for a in axes],
            (f"final_{metric}", lambda f: _fmt(f.final)), (f"best_{metric}", lambda f: _fmt(f.best)),
            ("records", lambda f: str(len(f.found))),
            *[(n, lambda f, n=n: _fmt(f.scores.get(n))) for n in scores], ("state", lambda f: f.state.state)]


def group_columns(varied: list[str], metric: str,
                  scores: Sequence[str] = ()) -> list[tuple[str, Callable[[list[RunFacts]], str]]]:
    """The summary's columns: the varied axes, then each figure's mean and spread over seeds (the
    metric's final and best value, each evaluation score's newest)."""
    def stat(pick: Callable[[RunFacts], float | None], which: int) -> Callable[[list[RunFacts]], str]:
        return lambda runs: _fmt(_spread([v for f in runs if (v := pick(f)) is not None])[which])

    figures: list[tuple[str, Callable[[RunFacts], float | None]]] = [
        (f"final_{metric}", lambda f: f.final), (f"best_{metric}", lambda f: f.best),
        *[(n, lambda f, n=n: f.scores.get(n)) for n in scores]]
    return [*[(a, lambda runs, a=a: runs[0].record.values.get(a, "")) for a in varied],
            ("seeds", lambda runs: str(sum(f.final is not None for f in runs))),
            *[(f"{name}_{part}", stat(pick, which)) for name, pick in figures
              for which, part in enumerate(("mean", "sd"))]]


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
    scores: list[str] = field(default_factory=list)
    """The evaluation scores any run has, one column each."""


def summarise(sweep_dir: Path, metric: str) -> Summary:
    """Every element as ``local_states`` judges it, with its values of ``metric``, as the tables'
    rows: one per run, one per group of seeds."""
    standing = local_states(sweep_dir)
    runs = [RunFacts(row, state, metric_values(Path(row.run_dir), metric), newest_scores(Path(row.run_dir)))
            for row, state in standing]
    axes = list(runs[0].record.values) if runs else []
    varied = [a for a in axes if a not in SEED_AXES]
    scores = score_names(f.scores for f in runs)
    columns = run_columns(axes, metric, scores)
    groups: dict[tuple[str, ...], list[RunFacts]] = {}
    for f in runs:
        groups.setdefault(tuple(f.record.values.get(a, "") for a in varied), []).append(f)
    summary = group_columns(varied, metric, scores)
    return Summary(axes, varied, runs, [c[0] for c in columns], [[c[1](f) for c in columns] for f in runs],
                   [c[0] for c in summary], [[c[1](members) for c in summary] for members in groups.values()],
                   scores)


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


def collect(sweep_dir: Path, *, metric: str = "loss", sort: str | None = None, as_json: bool = False) -> list[str]:
    """Write the CSVs and the plot; return the lines to print (the summary table, a column per
    evaluation score, sorted best first by ``sort`` where given, and the files; ``as_json``: one
    JSON line of the summary rows instead)."""
    summary = summarise(sweep_dir, metric)
    if not any(f.found for f in summary.runs):
        missing = [f for f in summary.runs if f.state.state == "missing"]
        command = any(f.record.values and not (Path(f.record.run_dir) / "config.yaml").is_file() for f in summary.runs)
        hint = (" (a command sweep: the command writes metrics.jsonl in its run directory, one JSON object a line "
                "such as {\"step\": 10, \"loss\": 0.5}; docs/studies.md)" if command else "")
        raise UserError(f"no element of {sweep_dir} has logged {metric} yet"
                        f"{f' ({len(missing)} run directories are gone)' if missing else ''}",
                        f"check `diffscale sweep status {sweep_dir}`, or pass --metric NAME of metrics.jsonl{hint}")
    per_group = summary.per_group
    if sort:
        header = summary.group_header
        per_group = sort_by(header, per_group, f"{sort}_mean" if f"{sort}_mean" in header else sort)
    write_text(sweep_dir / RUNS_CSV, _csv(summary.run_header, summary.per_run))
    write_text(sweep_dir / SUMMARY_CSV, _csv(summary.group_header, per_group))
    drawn = plot(sweep_dir / PLOT, summary.varied, per_group, metric)
    if as_json:
        return [json.dumps([{h: _value(h, v, summary.varied) for h, v in zip(summary.group_header, g, strict=True)}
                            for g in per_group])]
    files = [sweep_dir / RUNS_CSV, sweep_dir / SUMMARY_CSV, *([sweep_dir / PLOT] if drawn else [])]
    gone = [str(f.record.index) for f in summary.runs if f.state.state == "missing"]
    note = [f"missing: the run directories of element(s) {', '.join(gone)} are gone"] if gone else []
    return [*_table_lines(sweep_dir, summary, per_group, metric, sort), *note, *(f"wrote {f}" for f in files)]


def _table_lines(sweep_dir: Path, summary: Summary, per_group: list[list[str]], metric: str,
                 sort: str | None) -> list[str]:
    """The summary as a table at the terminal's width: mean ± sd per figure, the row's axes never cut."""
    from rich.console import Console
    from rich.markup import escape

    from diffscale.io.tables import Column as TableColumn
    from diffscale.io.tables import print_table, terminal_width

    n = len(summary.varied)
    columns = [*(TableColumn(a, 0, wrap=False) for a in summary.varied),
               TableColumn("seeds", 4, wrap=False, justify="right"),
               TableColumn(f"final {metric}", 1, justify="right"), TableColumn(f"best {metric}", 3, justify="right"),
               *(TableColumn(s, 0 if s == sort else 2, justify="right") for s in summary.scores)]
    shown = []
    for g in per_group:
        pairs = g[n + 1:]
        shown.append([*g[:n + 1], *(_pm(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2))])
    title = escape(f"sweep {sweep_dir.name}: mean ± sd over seeds" + (f", best {sort} first" if sort else ""))
    out = io.StringIO()
    print_table(title, columns, shown, Console(file=out, width=terminal_width(), highlight=False))
    return out.getvalue().rstrip().splitlines()


def _value(column: str, text: str, varied: list[str]) -> str | float | None:
    """A summary cell for JSON: a number where it is one (an axis keeps its text)."""
    if column in varied:
        return text
    if not text:
        return None
    return int(text) if column == "seeds" else float(text)


def _pm(mean: str, spread: str) -> str:
    """``0.512 ± 0.03``; the mean alone where there is no spread (one seed)."""
    if not mean:
        return ""
    return mean if spread in ("", "0") else f"{mean} ± {spread}"
