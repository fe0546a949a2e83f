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
CONTINUATIONS = "continuations.tsv"
"""Jobs a Grid Engine job script submitted to continue its run: ``id<TAB>after<TAB>log`` lines."""


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
    """The newest submission, with the continuation jobs its scripts submitted since."""
    sub = load(run_dir)[-1]
    file = Path(run_dir) / CONTINUATIONS
    if not file.is_file():
        return sub
    records = list(sub.jobs)
    by_id = {r.job_id: r for r in records}
    for line in file.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[0] in by_id or fields[1] not in by_id:
            continue  # malformed, known, or continuing another submission's job
        parent = by_id[fields[1]]
        record = JobRecord(job_id=fields[0], name=parent.name, shape=parent.shape, partition=parent.partition,
                           script=parent.script, log=fields[2], segment=parent.segment, segments=parent.segments,
                           after=parent.job_id)
        records.append(record)
        by_id[record.job_id] = record
    return Submission(**{**asdict(sub), "jobs": tuple(records), "race": sub.race})


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
