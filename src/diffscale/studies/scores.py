"""The evaluation scores of a sweep's runs beside its loss: one column per score (FD, precision,
recall, CRPS, spread-skill, success, route shares, ...: :mod:`diffscale.io.scores`), each run's
newest evaluation, and rows sorted best first by one of them (``sweep collect --sort``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from diffscale.errors import UserError
from diffscale.io.rundir import read_records
from diffscale.io.scores import headline, latest, sort_key


def newest_scores(run_dir: Path) -> dict[str, float]:
    """Each evaluation score's newest value in the run's metrics.jsonl (empty: never evaluated)."""
    return latest(read_records(run_dir)[1])


def score_names(found: Iterable[Mapping[str, float]]) -> list[str]:
    """The score names any run has, in :data:`~diffscale.io.scores.SCORES` order."""
    return list(dict.fromkeys(name for scores in found for name in headline(scores)))


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
