"""RUN_DIR/jobs.json: what was submitted for a run, read back by status/logs/cancel.

Each ``diffscale submit`` appends one submission: the scheduler, cluster, when, who, and per
job its id, name, shape, segment, dependency, script and log path. Written atomically
(temporary file + rename) so a reader never sees half a file.

A job id alone is not trusted: a reinstalled scheduler restarts its ids and a copied run
directory points at someone else's jobs, so :func:`check_ours` compares the name (and user)
the scheduler reports with the record before status reports or cancel acts on a job.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from diffscale.errors import UserError

FILE = "jobs.json"
CONTINUATIONS = "continuations.tsv"
"""Jobs a Grid Engine job script submitted to continue its run: ``id<TAB>after<TAB>log`` lines."""
CANCELLED = "cancelled.txt"
"""Job ids ``diffscale cancel`` cancelled, one a line (Grid Engine keeps no record of a job
deleted while pending, and reports one deleted while running as failed)."""


JOB_ID_FORMATS = {
    "slurm": (re.compile(r"[0-9]+(?:[_+][0-9]+)?"), "digits, optionally _N (array task) or +N (het component)"),
    "sge": (re.compile(r"[0-9]+(?:\.[0-9]+)?"), "digits, optionally .N (array task)"),
}
"""A job id as each scheduler writes it: anything else (``--user=root``) would reach
scancel/qdel as an option."""


def is_job_id(scheduler: str, job_id: object) -> bool:
    pattern = JOB_ID_FORMATS.get(scheduler)
    return pattern is not None and isinstance(job_id, str) and pattern[0].fullmatch(job_id) is not None


def check_job_ids(sub: Submission, file: Path) -> None:
    """Every id of ``sub`` in its scheduler's format, before status, logs or cancel act on one."""
    if sub.scheduler not in JOB_ID_FORMATS:
        raise UserError(f"{file} names scheduler {sub.scheduler!r}, not one of: {', '.join(JOB_ID_FORMATS)}",
                        "the file was edited or damaged: fix it, or submit the run again")
    for job_id in [j.job_id for j in sub.jobs] + [j.after for j in sub.jobs if j.after is not None]:
        if not is_job_id(sub.scheduler, job_id):
            raise UserError(f"{file} holds job id {job_id!r}, which is not a {sub.scheduler} job id "
                            f"({JOB_ID_FORMATS[sub.scheduler][1]})",
                            "the file was edited or damaged: fix the id, or submit the run again")


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers): the uid is what schedulers show then
        return str(os.geteuid())


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    """In words: the scheduler's (PENDING, RUNNING, COMPLETED, ...) or, for Grid Engine's
    letter codes, their meaning (``hqw`` -> PENDING (held)); GONE when no longer known."""
    detail: str = ""
    """Reason, nodes, exit code -- whatever the scheduler tells."""
    active: bool = False
    """Not in a final state (cancel would act on it)."""
    name: str | None = None
    """Job name as the scheduler knows it (None: not known any more)."""
    user: str | None = None
    """Owner as the scheduler knows it (None: not known any more)."""


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
    """Job id this one waits for (segment chains: its end; a coupled trainer: its start)."""
    role: str = ""
    """Its part in a coupled layout (``simulation``, ``trainer``); empty otherwise."""
    race_key: str = ""
    """What it claims a race with: its shape (``1x4``), or ``<partition>-<shape>`` in a race
    across partitions (``--partition auto --race N``); empty: no race (or an older file)."""

    @property
    def key(self) -> str:
        """The race key, the shape in files written before keys were recorded."""
        return self.race_key or self.shape


@dataclass(frozen=True)
class Submission:
    scheduler: str
    cluster: str
    submitted_at: str
    run_dir: str
    what: str
    jobs: tuple[JobRecord, ...]
    race: tuple[str, ...] = ()
    """Race keys (shape labels; ``<partition>-<shape>`` across partitions) raced against each
    other (empty: no race)."""
    extra: dict[str, Any] = field(default_factory=dict)
    user: str = field(default_factory=current_user)
    """Who submitted ("" in files written before this was recorded: not checked then)."""


def path(run_dir: str | Path) -> Path:
    return Path(run_dir) / FILE


def load(run_dir: str | Path) -> list[Submission]:
    file = path(run_dir)
    if not file.is_file():
        raise UserError(f"'{run_dir}' has no {FILE}: nothing was submitted for it",
                        "pass the RUN_DIR given to (or printed by) `diffscale submit`")
    try:
        data = json.loads(file.read_text())
        subs = [Submission(**{"user": "", **s, "jobs": tuple(JobRecord(**j) for j in s["jobs"]),
                              "race": tuple(s.get("race", ()))})
                for s in data["submissions"]]
    except OSError as exc:
        raise UserError(f"cannot read {file} ({exc.strerror})",
                        "check its permissions (ls -l); status, logs and cancel need to read it") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{file} is not a diffscale jobs file ({exc})", "restore it, or submit the run again") from exc
    for sub in subs:
        check_job_ids(sub, file)
    return subs


def log_file(run_dir: str | Path, log: str) -> Path:
    """A job's log as jobs.json (or continuations.tsv) names it: a path inside the run directory,
    where the job scripts send the scheduler's output (``logs/NAME-ID.out``). A path leading out
    of it (``../../etc/passwd``, ``/etc/hostname``) is refused, never read."""
    base = os.path.normpath(os.path.abspath(run_dir))
    target = os.path.normpath(os.path.join(base, log))
    if os.path.commonpath([base, target]) != base or target == base:
        raise UserError(f"the records of {run_dir} name the log '{log}', outside the run directory",
                        "diffscale reads only logs inside the run directory (its job scripts write logs/NAME-ID.out); "
                        f"restore {FILE}, or read that file yourself")
    return Path(target)


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
        if len(fields) != 3 or fields[0] in by_id or fields[1] not in by_id or not is_job_id(sub.scheduler, fields[0]):
            continue  # malformed, known, or continuing another submission's job
        parent = by_id[fields[1]]
        record = JobRecord(job_id=fields[0], name=parent.name, shape=parent.shape, partition=parent.partition,
                           script=parent.script, log=fields[2], segment=parent.segment, segments=parent.segments,
                           after=parent.job_id, role=parent.role, race_key=parent.race_key)
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


def check_ours(sub: Submission, states: Sequence[JobState], run_dir: str | Path) -> None:
    """Refuse when a job id of ``sub`` now names another job (another name or user)."""
    records = {r.job_id: r for r in sub.jobs}
    for state in states:
        record = records.get(state.job_id)
        if record is None:
            continue
        wrong = []
        if state.name is not None and state.name != record.name:
            wrong.append(f"is named '{state.name}'")
        if sub.user and state.user is not None and state.user != sub.user:
            wrong.append(f"belongs to user '{state.user}'")
        if wrong:
            raise UserError(
                f"job {state.job_id} of {path(run_dir)} {' and '.join(wrong)}, but diffscale submitted "
                f"'{record.name}' as '{sub.user or '?'}' under that id: the scheduler was reinstalled (ids start "
                "again) or the run directory was copied, so diffscale will not report on or cancel it",
                "look for your jobs with squeue -u $USER / qstat -u $USER; submit the run again to record new ids")


def cancelled_ids(run_dir: str | Path) -> set[str]:
    file = Path(run_dir) / CANCELLED
    return set(file.read_text().split()) if file.is_file() else set()


def record_cancelled(run_dir: str | Path, job_ids: Sequence[str]) -> None:
    with open(Path(run_dir) / CANCELLED, "a") as handle:
        handle.writelines(f"{job_id}\n" for job_id in job_ids)


def owner_words(sub: Submission, key: str) -> str:
    """A race's winner in words: ``shape 1x4``, or ``h200-1x8 (partition h200, shape 1x8)`` in a
    race across partitions."""
    record = next((r for r in sub.jobs if r.key == key), None)
    if record is None or key == record.shape:
        return f"shape {key}"
    return f"{key} (partition {record.partition}, shape {record.shape})"


def with_cancellations(sub: Submission, states: Sequence[JobState], run_dir: str | Path,
                       race_owner: str | None) -> list[JobState]:
    """Ended jobs diffscale cancelled shown as CANCELLED: by ``diffscale cancel``, or a race's
    losing shapes (cancelled by the winner's script), which schedulers report as failed or forget."""
    cancelled = cancelled_ids(run_dir)
    keys = {r.job_id: r.key for r in sub.jobs}
    winner = owner_words(sub, race_owner) if race_owner is not None else ""
    out = []
    for state in states:
        lost = race_owner is not None and keys.get(state.job_id) not in (None, race_owner)
        if state.active or state.state in ("CANCELLED", "COMPLETED"):
            out.append(state)
        elif state.job_id in cancelled:
            out.append(replace(state, state="CANCELLED", detail=f"by diffscale cancel; {state.detail}"))
        elif lost:
            out.append(replace(state, state="CANCELLED", detail=f"lost the race to {winner}; {state.detail}"))
        else:
            out.append(state)
    return out
