"""RUN_DIR/jobs.json: what was submitted for a run, read back by status/logs/cancel.

Each ``diffscale submit`` appends one submission: the scheduler, cluster, when, and per
job its id, name, shape, segment, dependency, script and log path. Written atomically
(temporary file + rename) so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError

FILE = "jobs.json"


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    name: str
    shape: str
    partition: str
    script: str
    """Script path relative to the run directory."""
    log: str
    """Log path relative to the run directory."""
    segment: int = 1
    segments: int = 1
    after: str | None = None
    """Job id this one waits for (segment chains)."""


@dataclass(frozen=True)
class Submission:
    scheduler: str
    cluster: str
    submitted_at: str
    run_dir: str
    what: str
    jobs: tuple[JobRecord, ...]
    race: tuple[str, ...] = ()
    """Shape labels raced against each other (empty: no race)."""
    extra: dict[str, Any] = field(default_factory=dict)


def path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILE


def load(run_dir: str | Path) -> list[Submission]:
    file = path(run_dir)
    if not file.is_file():
        raise UserError(f"'{run_dir}' has no {FILE}: nothing was submitted for it",
                        "pass the RUN_DIR given to (or printed by) `diffscale submit`")
    try:
        data = json.loads(file.read_text())
        return [Submission(**{**s, "jobs": tuple(JobRecord(**j) for j in s["jobs"]), "race": tuple(s.get("race", ()))})
                for s in data["submissions"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{file} is not a diffscale jobs file ({exc})", "restore it, or submit the run again") from exc


def latest(run_dir: str | Path) -> Submission:
    return load(run_dir)[-1]


def append(run_dir: str | Path, submission: Submission) -> None:
    try:
        previous = load(run_dir)
    except UserError:
        previous = []
    data = {"submissions": [asdict(s) for s in [*previous, submission]]}
    directory = Path(run_dir)
    fd, tmp = tempfile.mkstemp(prefix=".jobs-", suffix=".json", dir=directory)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path(directory))
