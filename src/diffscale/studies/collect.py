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
from diffscale.io.scores import sort_key
from diffscale.io.tables import Column, print_table, terminal_width
from diffscale.studies.definition import SEED_AXES
from diffscale.studies.scores import sort_by, with_scores
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
        final, best = (found[-1], min(found, key=lambda v: sort_key(metric, v))) if found else (None, None)
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


def collect(sweep_dir: Path, *, metric: str = "loss", sort: str | None = None, as_json: bool = False) -> list[str]:
    """Write the CSVs and the plot; return the lines to print (the summary table, a column per
    evaluation score, sorted by ``sort`` where given, and the files; ``as_json``: one JSON line of
    the summary rows instead)."""
    from rich.console import Console

    rows = read_elements(sweep_dir)
    axes, per_run, per_group = summarise(rows, metric)
    varied = [a for a in axes if a not in SEED_AXES]
    scores, per_run, per_group = with_scores(rows, varied, per_run, per_group)
    if not any(r[len(axes) + 3] != "0" for r in per_run):
        raise UserError(f"no element of {sweep_dir} has logged {metric} yet",
                        f"check `diffscale sweep status {sweep_dir}`, or pass --metric NAME of metrics.jsonl")
    write_text(sweep_dir / RUNS_CSV, _csv(["element", *axes, f"final_{metric}", f"best_{metric}", "records", *scores],
                                            per_run))
    header = [*varied, "seeds", f"final_{metric}_mean", f"final_{metric}_sd", f"best_{metric}_mean",
              f"best_{metric}_sd", *(f"{n}_{part}" for n in scores for part in ("mean", "sd"))]
    if sort:
        per_group = sort_by(header, per_group, f"{sort}_mean" if f"{sort}_mean" in header else sort)
    write_text(sweep_dir / SUMMARY_CSV, _csv(header, per_group))
    drawn = plot(sweep_dir / PLOT, varied, per_group, metric)
    if as_json:
        return [json.dumps([{h: _value(h, v, varied) for h, v in zip(header, g, strict=True)} for g in per_group])]
    title = f"sweep {sweep_dir.name}: mean ± sd over seeds" + (f", best {sort} first" if sort else "")
    columns = [*(Column(a, 0, wrap=False) for a in varied), Column("seeds", 4, wrap=False, justify="right"),
               Column(f"final {metric}", 1, justify="right"), Column(f"best {metric}", 3, justify="right"),
               *(Column(n, 0 if n == sort else 2, justify="right") for n in scores)]
    shown = []
    for g in per_group:
        pairs = g[len(varied) + 1:]
        shown.append([*g[:len(varied) + 1], *(_pm(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2))])
    out = io.StringIO()
    print_table(title, columns, shown, Console(file=out, width=terminal_width(), highlight=False))
    files = [sweep_dir / RUNS_CSV, sweep_dir / SUMMARY_CSV, *([sweep_dir / PLOT] if drawn else [])]
    return [*out.getvalue().rstrip().splitlines(), *(f"wrote {f}" for f in files)]


def _value(column: str, text: str, varied: list[str]) -> str | float | None:
    """A summary cell for JSON: a number where it is one (an axis keeps its text)."""
    if column in varied:
        return text
    if not text:
        return None
    return int(text) if column == "seeds" else float(text)


def _pm(mean: str, spread: str) -> str:
    """``0.512 ± 0.03``; the mean alone where the spread is 0 (one seed)."""
    if not mean:
        return ""
    return mean if spread in ("", "0") else f"{mean} ± {spread}"
