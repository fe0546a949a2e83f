"""A sweep's state, in files of the sweep directory (each written to a temporary file and renamed):

* ``sweep.yaml``    the definition (``sweep submit|run|status DIR`` read it back);
* ``elements.json`` the table of elements: index, values, run directory, array label;
* ``state.json``    per element: pending / running / done / failed, and why a failed one failed.

An element's state comes from its run directory (its training records and checkpoints, the exit
line its job log ends with, the jobs of its jobs.json) and from what ``sweep run`` recorded; nothing
needs to stay running to keep it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from diffscale.errors import UserError
from diffscale.io.atomic import write_text

DEFINITION = "sweep.yaml"
ELEMENTS = "elements.json"
STATE = "state.json"
STATES = ("pending", "running", "done", "failed")
EXIT_LINE = re.compile(r"diffscale: command exited with (\d+)")


@dataclass(frozen=True)
class ElementRecord:
    """One row of elements.json."""

    index: int
    values: dict[str, str]
    run_dir: str
    array: str = ""
    """The array (job shape) label it is submitted in; empty for a sweep run here."""


@dataclass(frozen=True)
class ElementState:
    index: int
    state: str
    """pending, running, done or failed."""
    reason: str = ""
    """Why it failed (the doctor's finding, else the last words of its log), or what it is doing."""
    exit_code: int | None = None


def is_sweep_dir(path: Path) -> bool:
    return (path / DEFINITION).is_file() and (path / ELEMENTS).is_file()


def read_definition(sweep_dir: Path) -> dict[str, Any]:
    raw = yaml.safe_load((sweep_dir / DEFINITION).read_text())
    if not isinstance(raw, dict):
        raise UserError(f"{sweep_dir / DEFINITION} does not hold a sweep", "restore it, or plan the sweep again")
    return {**raw, "out": str(sweep_dir)}


def write_definition(sweep_dir: Path, raw: dict[str, Any]) -> None:
    write_text(sweep_dir / DEFINITION, yaml.safe_dump({**raw, "out": str(sweep_dir)}, sort_keys=False))


def read_elements(sweep_dir: Path) -> list[ElementRecord]:
    path = sweep_dir / ELEMENTS
    if not path.is_file():
        raise UserError(f"'{sweep_dir}' is not a sweep directory (it has no {ELEMENTS})",
                        "pass the out: folder of a sweep that `diffscale sweep run` or `sweep submit` started")
    try:
        rows = json.loads(path.read_text())
        return [ElementRecord(**row) for row in rows]
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path} is damaged ({exc})", "plan the sweep again from its sweep.yaml") from exc


def write_elements(sweep_dir: Path, rows: list[ElementRecord]) -> None:
    write_text(sweep_dir / ELEMENTS, json.dumps([asdict(r) for r in rows], indent=1) + "\n")


def read_states(sweep_dir: Path) -> dict[int, ElementState]:
    path = sweep_dir / STATE
    if not path.is_file():
        return {}
    try:
        return {int(k): ElementState(**v) for k, v in json.loads(path.read_text()).items()}
    except (ValueError, TypeError):
        return {}  # a damaged record is rebuilt from the run directories


def write_states(sweep_dir: Path, states: dict[int, ElementState]) -> None:
    write_text(sweep_dir / STATE, json.dumps({str(k): asdict(v) for k, v in sorted(states.items())}, indent=1) + "\n")


def record(sweep_dir: Path, state: ElementState) -> None:
    """One element's new state into state.json (the caller serialises writers)."""
    states = read_states(sweep_dir)
    states[state.index] = state
    write_states(sweep_dir, states)


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


def logged_exit(run_dir: Path) -> int | None:
    """The exit code a job script wrote last into the run's logs (``command exited with N``)."""
    logs = run_dir / "logs"
    newest: tuple[float, int] | None = None
    for path in logs.glob("*") if logs.is_dir() else []:
        try:
            found = EXIT_LINE.findall(path.read_text(errors="replace"))
        except OSError:
            continue
        if found and (newest is None or path.stat().st_mtime >= newest[0]):
            newest = (path.stat().st_mtime, int(found[-1]))
    return newest[1] if newest else None


def failure_reason(run_dir: Path) -> str:
    """The doctor's one-line cause of a failed run, else the last line of its newest log."""
    from diffscale.doctor import diagnose
    from diffscale.doctor.sources import gather

    if run_dir.is_dir():
        try:
            findings = diagnose(gather(str(run_dir)))
        except UserError:
            findings = []
        if findings:
            return findings[0].cause
        folder = run_dir / "logs"
        logs = sorted(folder.glob("*"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
        for path in reversed(logs):
            lines = [ln for ln in path.read_text(errors="replace").splitlines()
                     if ln.strip() and not EXIT_LINE.search(ln)]
            if lines:
                return lines[-1].strip()[:200]
    return "no log to say why"


def element_state(rec: ElementRecord, recorded: ElementState | None, job_state: str | None,
                  job_active: bool) -> ElementState:
    """Where one element stands: its run directory first (trained to the end, the exit its log
    ends with), then its job's scheduler state (``job_state``, None when never submitted), then
    what ``sweep run`` recorded."""
    run_dir = Path(rec.run_dir)
    if finished_training(run_dir):
        return ElementState(rec.index, "done")
    if job_state is not None and job_active:
        running = job_state.upper().startswith(("RUNNING", "STARTING", "COMPLETING"))
        return ElementState(rec.index, "running" if running else "pending", job_state.lower())
    code = logged_exit(run_dir) if job_state is not None else None
    if code == 0 and finished_training(run_dir) is None:
        return ElementState(rec.index, "done", exit_code=0)
    if code is not None and code != 0 or job_state is not None:
        return ElementState(rec.index, "failed", failure_reason(run_dir), exit_code=code)
    if recorded is not None:
        if recorded.state == "done" and finished_training(run_dir) is False:
            return ElementState(rec.index, "failed", "recorded done, but it did not reach its step target")
        return recorded
    return ElementState(rec.index, "pending")
