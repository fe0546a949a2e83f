"""The evaluation scores runs are compared by, read from the ``kind: eval`` records of
metrics.jsonl (``diffscale eval`` and ``train.eval_every`` write them), without torch.

Each score says which way is better, so ``sweep collect`` can sort by it and ``status``,
``report`` and ``sweep report`` can show it beside its reference where the record has one
(``reference_fd`` beside ``fd``: the data scored against other data). A task whose evaluation
returns a new headline number adds it to :data:`SCORES`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Better(str, Enum):
    LOWER = "lower"
    HIGHER = "higher"
    NEAR_ONE = "near 1"
    """A ratio whose ideal is 1 (spread-skill: an ensemble neither over- nor under-dispersed)."""
    NEITHER = "neither"
    """A share to read against another (a route's share against the demonstrations')."""


@dataclass(frozen=True)
class Score:
    pattern: str
    """The record field, or a regular expression of several (``mode_\\w+``: each route's share)."""
    better: Better
    meaning: str

    def matches(self, name: str) -> bool:
        return re.fullmatch(self.pattern, name) is not None


SCORES: tuple[Score, ...] = (
    Score("fd", Better.LOWER, "Frechet distance to the data in the feature network's space"),
    Score("precision", Better.HIGHER, "share of samples inside the data's k-NN manifold"),
    Score("recall", Better.HIGHER, "share of data images inside the samples' k-NN manifold"),
    Score("density", Better.NEAR_ONE, "data neighbourhoods holding each sample, over k (1: as the data; above: "
          "crowding its dense regions)"),
    Score("coverage", Better.HIGHER, "share of data images with a sample in their neighbourhood"),
    Score("class_accuracy", Better.HIGHER, "share of samples the data's classifier puts in the class asked"),
    Score("crps", Better.LOWER, "continuous ranked probability score of the ensembles, in the data's units"),
    Score("spread_skill", Better.NEAR_ONE, "ensemble spread over the ensemble mean's error (1: calibrated)"),
    Score("success", Better.HIGHER, "share of rollouts that reached the goal"),
    Score("mode_gap", Better.LOWER, "largest gap between a route's share and the demonstrations'"),
    Score(r"mode_(?!gap$)\w+", Better.NEITHER, "share of rollouts taking that route"),
)


def score_of(name: str) -> Score | None:
    return next((s for s in SCORES if s.matches(name)), None)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def headline(record: Mapping[str, Any]) -> dict[str, float]:
    """The scores of one eval record, in :data:`SCORES`' order."""
    found = {k: float(v) for k, v in record.items() if is_number(v) and score_of(k) is not None}
    order = {k: next(i for i, s in enumerate(SCORES) if s.matches(k)) for k in found}
    return dict(sorted(found.items(), key=lambda item: (order[item[0]], item[0])))


def eval_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The ``kind: eval`` records that hold a score, oldest first."""
    return [r for r in records if r.get("kind") == "eval" and headline(r)]


def latest(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each score's newest value over the eval records (a run evaluated both while training and
    by ``diffscale eval`` keeps the last of each)."""
    found: dict[str, float] = {}
    for record in eval_records(records):
        found.update(headline(record))
    return found


def summary(record: Mapping[str, Any]) -> str:
    """``fd 12.3 (data 8.31), precision 0.551 (data 0.93), recall 0.85``: one record's scores, each
    with its reference where the record has one."""
    parts = []
    for name, value in headline(record).items():
        reference = record.get(f"reference_{name}")
        parts.append(f"{name} {value:.3g}" + (f" (data {reference:.3g})" if is_number(reference) else ""))
    return ", ".join(parts)


def sort_key(name: str, value: float | None) -> tuple[int, float]:
    """Sorts rows best first by score ``name`` (missing values last)."""
    if value is None:
        return (1, 0.0)
    score = score_of(name)
    better = score.better if score is not None else Better.LOWER
    if better is Better.HIGHER:
        return (0, -value)
    if better is Better.NEAR_ONE:
        return (0, abs(value - 1.0))
    return (0, value)
