"""Where each element of a sweep stands, judged from its run directory first: trained to its end
(a diffscale run's records and checkpoints), the exit its newest log ends with, its job's
scheduler state, and only then what state.json recorded. ``sweep status``, ``collect``,
``report`` and ``run`` all judge through :func:`element_state`, so they agree.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from diffscale.errors import UserError
from diffscale.studies.state import ElementRecord, ElementState, read_elements, read_states

EXIT_LINE = re.compile(r"diffscale: command exited with (-?\d+)")
RANK_RULES = ("rank-killed",)
"""The doctor's findings that name the rank that ended first: the others' errors follow from it."""


def finished_training(run_dir: Path) -> bool | None:
    """True once a diffscale run reached its step target, False before; None: not a diffscale run
    (no config.yaml) or nothing trained yet."""
    from diffscale.io import rundir

    if not (run_dir / "config.yaml").is_file():
        return None
    try:
        p = rundir.progress(run_dir)
    except UserError:
        return None
    return p.total_steps is not None and p.step >= int(p.total_steps)


def _logs(run_dir: Path) -> list[Path]:
    """The run's log files, oldest first."""
    folder = run_dir / "logs"
    found = []
    for path in folder.glob("*") if folder.is_dir() else []:
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            continue
    return [p for _, p in sorted(found)]


def logged_exit(run_dir: Path) -> int | None:
    """The exit code a job script (or ``sweep run``) wrote last into the run's newest log that
    holds one (``diffscale: command exited with N``)."""
    for path in reversed(_logs(run_dir)):
        try:
            found = EXIT_LINE.findall(path.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            return int(found[-1])
    return None


def failure_reason(run_dir: Path) -> str:
    """Why the newest job of a run failed, as the doctor reads its newest log: the rank that ended
    first (its exit code or signal) before what the other ranks then reported, else the doctor's
    first finding, else the log's last error line or last line."""
    from diffscale.doctor import diagnose
    from diffscale.doctor.sources import Evidence, from_log, read_tail
    from diffscale.doctor.tracebacks import last_error_line

    logs = _logs(run_dir)
    if not logs:
        return "no log to say why"
    newest = logs[-1]
    evidence = Evidence()
    try:
        from_log(newest, evidence)
        text = read_tail(newest)
    except OSError as exc:
        return f"its log {newest.name} cannot be read ({exc.strerror})"
    findings = diagnose(evidence)
    first = next((f for f in findings if f.rule in RANK_RULES), findings[0] if findings else None)
    if first is not None:
        return first.cause
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not EXIT_LINE.search(ln)]
    return (last_error_line(text) or (lines[-1] if lines else "its log is empty"))[:200]


def _runner_alive(pid: int | None) -> bool:
    if pid is None:
        return True  # recorded before runners were named: nothing says it ended
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _from_records(rec: ElementRecord, recorded: ElementState | None, run_dir: Path, trained: bool | None,
                  ) -> ElementState:
    """An element no scheduler knows: what ``sweep run`` recorded, checked against its run directory;
    without a record (or with a damaged state.json) the exit its log ends with."""
    code = logged_exit(run_dir)
    if recorded is not None and recorded.state == "missing":
        recorded = None  # its run directory is back (made again): judged from what it holds now
    if recorded is not None and recorded.state == "running" and not _runner_alive(recorded.pid):
        return ElementState(rec.index, "stopped", "the sweep run that ran it ended before it did")
    if recorded is not None and recorded.state == "done":
        if trained is False:
            return ElementState(rec.index, "failed", "recorded done, but it did not reach its step target")
        if trained is None and code != 0:
            return ElementState(rec.index, "failed", "recorded done, but its run directory holds no record of "
                                "finishing (no exit line in logs/)")
        return recorded
    if recorded is not None:
        return recorded
    if code == 0 and trained is None:
        return ElementState(rec.index, "done", exit_code=0)
    if code is not None and code != 0:
        return ElementState(rec.index, "failed", failure_reason(run_dir), exit_code=code)
    return ElementState(rec.index, "pending")


def element_state(rec: ElementRecord, recorded: ElementState | None, job_state: str | None,
                  job_active: bool) -> ElementState:
    """Where one element stands (``job_state``: its latest job's scheduler state, None when never
    submitted or not asked)."""
    run_dir = Path(rec.run_dir)
    if not run_dir.is_dir():
        return ElementState(rec.index, "missing", f"its run directory {Path(rec.run_dir).name} is gone")
    trained = finished_training(run_dir)
    if trained:
        return ElementState(rec.index, "done")
    if job_state is not None and job_active:
        running = job_state.upper().startswith(("RUNNING", "STARTING", "COMPLETING"))
        state = "running" if running else "pending"
        return ElementState(rec.index, state, "" if job_state.lower() == state else job_state.lower())
    if job_state is None:
        return _from_records(rec, recorded, run_dir, trained)
    code = logged_exit(run_dir)
    if code == 0 and trained is None:
        return ElementState(rec.index, "done", exit_code=0)
    return ElementState(rec.index, "failed", failure_reason(run_dir), exit_code=code)


def local_states(sweep_dir: Path) -> list[tuple[ElementRecord, ElementState]]:
    """Every element judged from its run directory and state.json, asking no scheduler (collect and
    report: what ``sweep status`` last learned from the scheduler is in state.json)."""
    rows = read_elements(sweep_dir)
    recorded = read_states(sweep_dir)
    return [(row, element_state(row, recorded.get(row.index), None, False)) for row in rows]
