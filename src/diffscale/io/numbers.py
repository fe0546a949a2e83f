"""Numbers as a reader sees them: floats rounded to a few significant digits in printed JSON and
tables (``0.04``, not ``0.03999999999999998``). Files keep the full value."""

from __future__ import annotations

from typing import Any

DIGITS = 6


def cell(value: Any, spec: str) -> str:
    """A table cell: ``value`` formatted by ``spec``, ``-`` where there is none."""
    return "-" if value is None else format(value, spec)


def rounded(value: Any, digits: int = DIGITS) -> Any:
    """``value`` with every float in it (in dicts, lists and tuples too) rounded to ``digits``
    significant digits, or to 3 decimals from 10**digits up (a time stamp keeps its seconds); NaN
    and infinities as they are."""
    if isinstance(value, float):
        if value != value or abs(value) == float("inf"):
            return value
        return float(f"{value:.{digits}g}") if abs(value) < 10**digits else round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value
