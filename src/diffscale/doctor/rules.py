"""The doctor's rule types: a pattern, a cause and a fix, and the finding a match makes.

A :class:`TextRule` matches log and scheduler-record text (regular expressions, searched
line by line; named groups fill the cause's and fix's ``{placeholders}``, and an optional
``derive`` adds values computed from them, e.g. what an Xid number means). A
:class:`RecordRule` looks at numeric records (metrics.jsonl lines, benchmark JSON). The fix
names the config change or flag that removes the cause -- the words a user acts on.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Launchers prefix each line of a rank: torchrun "[rank3]:" / "[default0]:", srun --label "3: ".
RANK_PREFIX = re.compile(r"^(?:\[(?:default|rank)?\d+\]: ?|\d+: )")

DIFFSCALE_RUN = re.compile(r"^(?:\S+: ?)?diffscale \| |/diffscale/(?:tasks|training|runtime)/|-m diffscale train\b",
                           re.M)
"""Lines only a diffscale run's log has (its banner, its source files in a traceback, its command):
without them the log is of a user's own trainer, whose fix cannot name diffscale's flags."""

Derive = Callable[[Mapping[str, str], Sequence[str], int], Mapping[str, str] | None]
"""(named groups, the text's lines, index of the matching line) -> more template values, or
None when the whole text shows the match is not the signature (all ranks joined after all)."""


@dataclass(frozen=True)
class Finding:
    """One recognised signature: why the job failed and what to change."""

    rule: str
    title: str
    cause: str
    fix: str
    origin: str
    """Where the evidence was read (a file path, ``scontrol show job 12``, ...)."""
    evidence: str
    """The matching line (or a short summary for record rules)."""
    line: int = 0
    """Index of the evidence line in its text: findings of one text are reported in log order,
    so the first failure (usually the cause of the others) comes first."""


def fill(template: str, values: Mapping[str, Any]) -> str:
    """Fill ``{name}`` from the match; a value the matching pattern lacks reads "?"."""
    return template.format_map(defaultdict(lambda: "?", {k: v for k, v in values.items() if v is not None}))


def strip_rank_prefix(line: str) -> str:
    return RANK_PREFIX.sub("", line, count=1)


@dataclass(frozen=True)
class TextRule:
    name: str
    title: str
    patterns: tuple[str, ...]
    """Any of these (regex, searched line by line) marks the signature."""
    cause: str
    fix: str
    requires: tuple[str, ...] = ()
    """Every one of these must also occur somewhere in the same text (e.g. qacct's exit_status next to failed)."""
    flags: int = 0
    derive: Derive | None = None
    every: bool = False
    """Report every distinct cause this rule finds in a text (several network faults of one
    job), not only the first line that matches."""
    by_pattern: bool = False
    """The patterns go from most to least telling: the first pattern that matches anywhere in the
    text wins over a less telling one on an earlier line."""
    user_fix: str | None = None
    """The fix for a user's own trainer (no diffscale run in the text), where ``fix`` names
    diffscale's settings; None: ``fix`` applies to both."""
    _compiled: tuple[re.Pattern, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", tuple(re.compile(p, self.flags) for p in self.patterns))

    def match(self, origin: str, text: str) -> list[Finding]:
        if any(not re.search(r, text, self.flags | re.M) for r in self.requires):
            return []
        lines = text.splitlines()
        fix = self.fix if self.user_fix is None or DIFFSCALE_RUN.search(text) else self.user_fix
        found: dict[str, Finding] = {}
        for index, m in self._matches([strip_rank_prefix(line) for line in lines]):
            raw = lines[index]
            values = dict(m.groupdict())
            if self.derive is not None:
                more = self.derive(values, lines, index)
                if more is None:
                    continue
                values.update(more)
            finding = Finding(self.name, self.title, fill(self.cause, values), fill(fix, values), origin,
                              raw.strip()[:300], index)
            found.setdefault(finding.cause, finding)
            if not self.every:
                break
        return list(found.values())

    def _matches(self, lines: Sequence[str]) -> Iterator[tuple[int, re.Match]]:
        """(line index, match) in the order the rule reports them."""
        if self.by_pattern:
            for pattern in self._compiled:
                for index, line in enumerate(lines):
                    if m := pattern.search(line):
                        yield index, m
            return
        for index, line in enumerate(lines):
            m = next((m for pattern in self._compiled if (m := pattern.search(line))), None)
            if m is not None:
                yield index, m


@dataclass(frozen=True)
class RecordRule:
    name: str
    title: str
    test: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, Any] | None]
    """Records of one file -> values for the templates when the signature is present, else None."""
    cause: str
    fix: str
    evidence: str

    def match(self, origin: str, records: Sequence[Mapping[str, Any]]) -> Finding | None:
        values = self.test(records)
        if values is None:
            return None
        return Finding(self.name, self.title, fill(self.cause, values), fill(self.fix, values), origin,
                       fill(self.evidence, values))


def next_lines(lines: Sequence[str], index: int, count: int = 3) -> list[str]:
    """The lines after ``index`` without rank prefixes (messages that continue on the next line)."""
    return [strip_rank_prefix(line).strip() for line in lines[index + 1:index + 1 + count]]
