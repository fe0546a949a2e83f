"""Failure signatures: the table the doctor matches evidence against.

The rules live by concern -- the job around the training (:mod:`.rules_jobs`), the GPUs and
the network between them (:mod:`.rules_gpu`), the training itself (:mod:`.rules_training`)
-- and are of two kinds (:mod:`.rules`): text rules over logs and scheduler records, record
rules over metrics. When no text rule explains a log, the program's own last Python
traceback is the finding (:mod:`.tracebacks`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from diffscale.doctor import rules_accounting, rules_gpu, rules_jobs, rules_lightning, rules_training
from diffscale.doctor.rules import Finding, RecordRule, TextRule
from diffscale.doctor.tracebacks import PYTHON_TRACEBACK, traceback_finding

__all__ = ["Finding", "RecordRule", "TextRule", "TEXT_RULES", "RECORD_RULES", "RULE_NAMES", "EVERY_RULES",
           "match_text", "match_records"]

TEXT_RULES: tuple[TextRule, ...] = (rules_jobs.TEXT_RULES + rules_lightning.TEXT_RULES + rules_accounting.TEXT_RULES
                                    + rules_gpu.TEXT_RULES + rules_training.TEXT_RULES)
RECORD_RULES: tuple[RecordRule, ...] = rules_training.RECORD_RULES
RULE_NAMES: frozenset[str] = frozenset({r.name for r in TEXT_RULES} | {r.name for r in RECORD_RULES}
                                       | {PYTHON_TRACEBACK})
EVERY_RULES: frozenset[str] = frozenset(r.name for r in TEXT_RULES if r.every)
"""Rules that report each distinct cause they find, not only their first."""


def match_text(origin: str, text: str) -> list[Finding]:
    """Every signature in one text, in the order the log shows them (the first failure is
    usually the cause of the later ones); the program's own traceback when none matches."""
    found = [f for rule in TEXT_RULES for f in rule.match(origin, text)]
    if not found:
        fallback = traceback_finding(origin, text)
        found = [fallback] if fallback is not None else []
    return sorted(found, key=lambda f: f.line)


def match_records(origin: str, records: Sequence[Mapping[str, Any]]) -> list[Finding]:
    return [f for rule in RECORD_RULES if (f := rule.match(origin, records))]
