"""``diffscale doctor RUN_DIR | JOB_ID | LOG_FILE``: why did a job fail, and what to change.

Reads the run's logs and metrics and the scheduler's records of its jobs
(:mod:`.sources`), matches them against the failure signatures (:mod:`.signatures`)
and prints each cause with its fix. Exit 0 when something was recognised, 1 when not.
"""

from __future__ import annotations

import argparse

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
    for origin, records in ev.records:
        found += match_records(origin, records)
    first: dict[tuple[str, str], Finding] = {}
    for f in found:
        first.setdefault((f.rule, f.cause if f.rule in EVERY_RULES else ""), f)
    return list(first.values())


def cmd_doctor(args: argparse.Namespace) -> int:
    from diffscale.doctor.report import print_report

    ev = gather(args.target)
    findings = diagnose(ev)
    print_report(args.target, ev, findings)
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
