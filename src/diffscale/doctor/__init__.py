"""``diffscale doctor RUN_DIR | JOB_ID | LOG_FILE``: why did a job fail, and what to change.

Reads the run's logs and metrics and the scheduler's records of its jobs
(:mod:`.sources`), matches them against the failure signatures (:mod:`.signatures`)
and prints each cause with its fix. Exit 0 when something was recognised, 1 when not.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from diffscale.doctor.rules_lightning import silent_hang
from diffscale.doctor.signatures import EVERY_RULES, Finding, match_records, match_text
from diffscale.doctor.sources import Evidence, gather

EXIT_FOUND = 0
EXIT_NOTHING = 1


def diagnose(ev: Evidence) -> list[Finding]:
    """Every cause found: one finding per signature (its first evidence), or per distinct cause
    for signatures that report each (network faults), in the order the sources show them."""
    found: list[Finding] = []
    for origin, text in ev.texts:
        found += match_text(origin, text)
        silent = _silent_s(origin)
        hang = silent_hang(origin, text, silent) if silent is not None else None
        if hang is not None and not any(f.rule == hang.rule and f.origin == origin for f in found):
            found.append(hang)
    for origin, records in ev.records:
        found += match_records(origin, records)
    first: dict[tuple[str, str], Finding] = {}
    for f in found:
        first.setdefault((f.rule, f.cause if f.rule in EVERY_RULES else ""), f)
    return _limits_after_a_hang(list(first.values()))


def _silent_s(origin: str) -> float | None:
    """How long the log file ``origin`` has not changed (None: not a file)."""
    try:
        return time.time() - Path(origin).stat().st_mtime
    except (OSError, ValueError):
        return None


HANG_RULES = frozenset({"lightning-rendezvous-hang", "nccl-timeout"})
"""Findings of a job that stopped making progress: a time limit that ended it followed from them."""
TIME_LIMIT_RULES = frozenset({"slurm-time-limit", "sge-h-rt", "sacct-limit", "qacct-limit"})


def _limits_after_a_hang(findings: list[Finding]) -> list[Finding]:
    """A time limit that ended a hung job is the hang's consequence, not a cause of its own:
    more --time or a requeue would only hang again, so its advice is replaced by the hang's,
    and the hang comes first, whichever source showed the limit first (scontrol's record of a
    job id is read before its log)."""
    hangs = [f for f in findings if f.rule in HANG_RULES]
    if not hangs:
        return findings
    out = []
    for f in findings:
        if f.rule in HANG_RULES:
            continue
        if f.rule in TIME_LIMIT_RULES and (f.rule not in ("sacct-limit", "qacct-limit") or "time limit" in f.cause):
            f = dataclasses.replace(
                f, title=f"{f.title} (a consequence of the hang)",
                cause=f"the job hung ({hangs[0].title}) and sat idle until its time limit ended it",
                fix="no more time and no requeue: they would hang the same way; fix the hang above")
        out.append(f)
    return hangs + out


def finished_note(path: Path) -> str | None:
    """For a run that trained to its end: the findings are of earlier jobs it resumed from."""
    from diffscale.errors import UserError
    from diffscale.io import rundir

    if not (path / "config.yaml").is_file():
        return None
    try:
        p = rundir.progress(path)
    except UserError:
        return None
    if p.total_steps is None or p.step < int(p.total_steps):
        return None
    return (f"the run finished: step {p.step} of {p.total_steps} (metrics.jsonl, checkpoints); what follows happened "
            "in earlier jobs it resumed from, and needs no action unless it recurs")


def cmd_doctor(args: argparse.Namespace) -> int:
    from diffscale.doctor.report import print_report

    ev = gather(args.target)
    findings = diagnose(ev)
    print_report(args.target, ev, findings, note=finished_note(Path(args.target)) if findings else None)
    return EXIT_FOUND if findings else EXIT_NOTHING


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffscale.cli_parser import verb

    p = verb(
        subparsers, "doctor", "explain why a run or job failed, and what to change",
        "diffscale doctor runs/xl\ndiffscale doctor runs/xl/logs/job-123.out",
        description="Read a run's logs, metrics and scheduler records (or one log file, or a job id) and "
        "print each recognised failure with its cause and fix. Exit 0 when something was recognised, 1 when not.")
    p.add_argument("target", metavar="RUN_DIR | JOB_ID | LOG_FILE",
                   help="a run folder, a SLURM / Grid Engine job id, or one log file")
    p.set_defaults(func=cmd_doctor)
