"""A sweep's state, in files of the sweep directory (each written to a temporary file and renamed):

* ``sweep.yaml``    the definition (``sweep submit|run|status DIR`` read it back);
* ``elements.json`` the table of elements: index, values, run directory (relative to the sweep
  directory, so a copied or moved sweep reads its own runs), array label;
* ``state.json``    per element: pending / running / done / failed / stopped, and why.

Every path stored is relative to the sweep directory. Writers of state.json (``sweep run``'s
workers, ``sweep status``, ``sweep submit``) take ``.state.lock`` around their read and write, so
one never writes back what another changed meanwhile. An element's state is judged from its run
directory in ``studies/standing.py``; state.json is what was last seen, never the only word.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from diffscale.errors import UserError
from diffscale.io.atomic import write_text

DEFINITION = "sweep.yaml"
ELEMENTS = "elements.json"
STATE = "state.json"
LOCK = ".state.lock"
DAMAGED = "state.json.damaged"
RUNS = "runs"
"""The sweep directory's folder of element run directories."""
STATES = ("pending", "running", "done", "failed", "stopped", "missing")
"""stopped: ``sweep run`` was stopped (SIGTERM, SIGINT) while the element ran; missing: its run
directory is gone."""


@dataclass(frozen=True)
class ElementRecord:
    """One row of elements.json (``run_dir`` absolute once read: the sweep directory's own run)."""

    index: int
    values: dict[str, str]
    run_dir: str
    array: str = ""
    """The array (job shape) label it is submitted in; empty for a sweep run here."""


@dataclass(frozen=True)
class ElementState:
    index: int
    state: str
    """One of STATES."""
    reason: str = ""
    """Why it failed (the failing rank's exit, signal or first error), or what it is doing."""
    exit_code: int | None = None
    pid: int | None = None
    """The ``sweep run`` process running it here (a running element whose runner is gone stopped)."""


def is_sweep_dir(path: Path) -> bool:
    return (path / DEFINITION).is_file() and (path / ELEMENTS).is_file()


def read_definition(sweep_dir: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load((sweep_dir / DEFINITION).read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise UserError(f"{sweep_dir / DEFINITION} cannot be read ({str(exc).splitlines()[0]})",
                        "restore it from the sweep file it was planned from") from exc
    if not isinstance(raw, dict):
        raise UserError(f"{sweep_dir / DEFINITION} does not hold a sweep", "restore it, or plan the sweep again")
    return {**raw, "out": str(sweep_dir)}


def write_definition(sweep_dir: Path, raw: dict[str, Any]) -> None:
    """The definition without its ``out``: the directory holding it is the sweep directory."""
    write_text(sweep_dir / DEFINITION, yaml.safe_dump({k: v for k, v in raw.items() if k != "out"}, sort_keys=False))


def stored_run_dir(sweep_dir: Path, run_dir: str | Path) -> str:
    """A run directory as elements.json keeps it: relative to the sweep directory."""
    return os.path.relpath(Path(run_dir).absolute(), sweep_dir.absolute())


def _located(sweep_dir: Path, stored: str) -> str:
    """The run directory a stored path names in this sweep directory. An absolute path (written
    before paths were stored relative) names the run of the same name in this directory's runs/."""
    path = Path(stored)
    if path.is_absolute() or ".." in path.parts:
        path = Path(RUNS) / path.name
    return str(sweep_dir.absolute() / path)


def read_elements(sweep_dir: Path) -> list[ElementRecord]:
    path = sweep_dir / ELEMENTS
    if not path.is_file():
        raise UserError(f"'{sweep_dir}' is not a sweep directory (it has no {ELEMENTS})",
                        "pass the out: folder of a sweep that `diffscale sweep run` or `sweep submit` started")
    try:
        rows = [ElementRecord(**row) for row in json.loads(path.read_text())]
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path} is damaged ({str(exc)[:120]})",
                        "plan the sweep again from its sweep file into a new out: (the runs are kept)") from exc
    return [ElementRecord(r.index, r.values, _located(sweep_dir, r.run_dir), r.array) for r in rows]


def write_elements(sweep_dir: Path, rows: list[ElementRecord]) -> None:
    stored = [asdict(ElementRecord(r.index, r.values, stored_run_dir(sweep_dir, r.run_dir), r.array)) for r in rows]
    write_text(sweep_dir / ELEMENTS, json.dumps(stored, indent=1) + "\n")


def _parse_states(text: str) -> dict[int, ElementState]:
    rows = json.loads(text)
    if not isinstance(rows, dict):
        raise ValueError("not a mapping of element to state")
    states = {int(k): ElementState(**v) for k, v in rows.items()}
    wrong = [s.state for s in states.values() if s.state not in STATES]
    if wrong:
        raise ValueError(f"unknown state {wrong[0]!r}")
    return states


def read_states(sweep_dir: Path, *, repair: bool = False) -> dict[int, ElementState]:
    """What state.json recorded. A damaged file is never taken for "all pending": it is named on
    stderr, its states are judged again from the run directories (nothing is returned for them),
    and with ``repair`` (a writer) it is kept aside as state.json.damaged."""
    path = sweep_dir / STATE
    try:
        return _parse_states(path.read_text())
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        kept = ""
        if repair:
            os.replace(path, sweep_dir / DAMAGED)
            kept = f"; kept as {DAMAGED}"
        print(f"warning: {path} is damaged ({str(exc)[:80]}){kept}: each element's state is rebuilt from its run "
              "directory (trained to its end, or the exit its log ends with)", file=sys.stderr)
        return {}


def write_states(sweep_dir: Path, states: dict[int, ElementState]) -> None:
    write_text(sweep_dir / STATE, json.dumps({str(k): asdict(v) for k, v in sorted(states.items())}, indent=1) + "\n")


@contextlib.contextmanager
def locked(sweep_dir: Path) -> Iterator[None]:
    """The sweep directory's state lock, held while state.json is read and written back."""
    with open(sweep_dir / LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record(sweep_dir: Path, *states: ElementState) -> None:
    """Elements' new states into state.json, under the lock."""
    with locked(sweep_dir):
        current = read_states(sweep_dir, repair=True)
        current.update({s.index: s for s in states})
        write_states(sweep_dir, current)


def record_judged(sweep_dir: Path, before: dict[int, ElementState], judged: dict[int, ElementState]) -> None:
    """States judged from ``before`` written back, except where another writer changed an element
    since ``before`` was read (its newer record stays)."""
    with locked(sweep_dir):
        current = read_states(sweep_dir, repair=True)
        for index, state in judged.items():
            if current.get(index) == before.get(index):
                current[index] = state
        write_states(sweep_dir, current)
