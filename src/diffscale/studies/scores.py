"""The evaluation scores of a sweep's runs beside its loss: one column per score (FD, precision,
recall, CRPS, spread-skill, success, route shares, ...: :mod:`diffscale.io.scores`), each run's
newest evaluation, the mean and spread over seeds per group, and the rows sorted best first by
one of them. ``sweep collect`` and ``sweep report`` add them through :func:`with_scores`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io.scores import latest, sort_key
from diffscale.studies.state import ElementRecord


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    found = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if isinstance(row, dict) and row.get("kind") == "eval":
            found.append(row)
    return found


def run_scores(rows: list[ElementRecord]) -> tuple[list[str], dict[int, dict[str, float]]]:
    """(the score names any run has, in :data:`~diffscale.io.scores.SCORES` order; each element's newest values)."""
    from diffscale.io.scores import headline

    values = {row.index: latest(_events(Path(row.run_dir))) for row in rows}
    names = list(dict.fromkeys(name for found in values.values() for name in headline(found)))
    return names, values


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def with_scores(rows: list[ElementRecord], varied: list[str], per_run: list[list[str]],
                per_group: list[list[str]]) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """(score names, per-run rows with a column per score, per-group rows with a mean and an sd
    column per score); the group of a run is its values of the ``varied`` axes."""
    names, values = run_scores(rows)
    if not names:
        return [], per_run, per_group
    runs = [[*r, *(_fmt(values[int(r[0])].get(n)) for n in names)] for r in per_run]
    groups: dict[tuple[str, ...], list[dict[str, float]]] = {}
    for row in rows:
        groups.setdefault(tuple(row.values[a] for a in varied), []).append(values[row.index])
    out = []
    for g in per_group:
        members = groups.get(tuple(g[:len(varied)]), [])
        extra = []
        for name in names:
            found = [m[name] for m in members if name in m]
            mean = statistics.fmean(found) if found else None
            spread = (statistics.stdev(found) if len(found) > 1 else 0.0) if found else None
            extra += [_fmt(mean), _fmt(spread)]
        out.append([*g, *extra])
    return names, runs, out


def sort_by(header: list[str], rows: list[list[str]], column: str) -> list[list[str]]:
    """``rows`` best first by ``column`` (a score: by which way it is better; other columns:
    ascending); rows without a value last."""
    if column not in header:
        raise UserError(f"--sort {column} is not a column of this table",
                        f"sort by one of: {', '.join(h for h in header if h)}")
    at = header.index(column)
    name = column[:-len("_mean")] if column.endswith("_mean") else column

    def key(row: list[str]) -> tuple[int, float]:
        try:
            return sort_key(name, float(row[at]))
        except ValueError:
            return sort_key(name, None)

    return sorted(rows, key=key)
