"""Whether another scheduler job has ended, and how, as its scheduler says: what a process that
follows a job asks when the job may end without a word of its own (a trainer following the spool
of a simulation that was cancelled, killed at its time limit or lost with its node).

* SLURM: ``scontrol show job -o ID`` (no accounting database needed: slurmctld knows a job until
  MinJobAge after its end, then answers "Invalid job id").
* Grid Engine: ``qstat -j ID`` while qmaster knows the job, then its last ``qacct -j ID`` record.

The job is named by a ``JobRef``, which a job writes for its followers (``write_job_file``) or
finds in its own environment (``current_job``). Nothing here raises on the scheduler's behalf: a
scheduler command that is missing on this node or does not answer is :class:`NoAnswer`, never an
end. ``diffscale.cluster.jobs.scheduler`` (submit, status, cancel) reads the same records with
the parsers here.
"""

from __future__ import annotations

import datetime
import enum
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SLURM = "slurm"
SGE = "sge"
"""Scheduler names, as ``diffscale.cluster``'s SchedulerKind spells them."""

COMMAND_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class JobRef:
    """One scheduler job: ``JobRef("slurm", "123")``."""

    scheduler: str
    job_id: str

    def __str__(self) -> str:
        return f"{'SLURM' if self.scheduler == SLURM else 'Grid Engine'} job {self.job_id}"


def current_job(env: Mapping[str, str] = os.environ) -> JobRef | None:
    """The job this process runs in, from the variables its scheduler sets (None: none). Grid
    Engine's ``JOB_ID`` counts only beside its ``SGE_ROOT`` and ``QUEUE``: other tools use the name."""
    if env.get("SLURM_JOB_ID", "").isdigit():
        return JobRef(SLURM, env["SLURM_JOB_ID"])
    if env.get("JOB_ID", "").isdigit() and env.get("SGE_ROOT") and env.get("QUEUE"):
        return JobRef(SGE, env["JOB_ID"])
    return None


def write_job_file(path: Path, job: JobRef) -> None:
    """``{"scheduler": "slurm", "job_id": "123"}`` at ``path``, atomically."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"scheduler": job.scheduler, "job_id": job.job_id}) + "\n")
    os.replace(tmp, path)


def read_job_file(path: Path) -> JobRef | None:
    """The job ``write_job_file`` named at ``path``; None when there is none or it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("scheduler") not in (SLURM, SGE):
        return None
    job_id = str(data.get("job_id", ""))
    return JobRef(data["scheduler"], job_id) if job_id.isdigit() else None


class EndKind(str, enum.Enum):
    """How a job ended, in the words that decide what its follower does."""

    COMPLETED = "completed"
    """Its command exited with status 0."""
    FAILED = "failed"
    """A non-zero exit, or the scheduler's failure (its node failed, out of memory)."""
    CANCELLED = "cancelled"
    """Cancelled (scancel, qdel), preempted, or killed by a signal from outside."""
    TIME_LIMIT = "time limit"
    """Killed at its wall time."""
    VANISHED = "vanished"
    """No longer known to the scheduler, with no record of how it ended."""


@dataclass(frozen=True)
class JobEnd:
    kind: EndKind
    state: str
    """The scheduler's own word: ``CANCELLED``, ``TIMEOUT``, ``NODE_FAIL``, ``failed 37, h_rt``."""
    exit_status: int | None
    at: float | None
    """When the scheduler says the job ended (epoch seconds); None: it does not say."""


class NoAnswer(Exception):
    """The scheduler could not be asked (its command is missing here, or failed): no word on the job."""


Run = Callable[[Sequence[str]], subprocess.CompletedProcess]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise NoAnswer(f"`{argv[0]}` is not on PATH here")
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoAnswer(f"`{' '.join(argv[:2])}` did not answer ({exc})") from exc


def job_end(job: JobRef, run: Run = _run) -> JobEnd | None:
    """How ``job`` ended; None while it is pending or running. Raises NoAnswer when the scheduler
    cannot be asked. A job the scheduler no longer knows at all is VANISHED (Grid Engine may write
    its accounting record some seconds after the job left qstat: ask again before believing it)."""
    return _slurm_end(job.job_id, run) if job.scheduler == SLURM else _sge_end(job.job_id, run)


SLURM_ENDS = {"COMPLETED": EndKind.COMPLETED, "FAILED": EndKind.FAILED, "CANCELLED": EndKind.CANCELLED,
              "TIMEOUT": EndKind.TIME_LIMIT, "DEADLINE": EndKind.TIME_LIMIT, "NODE_FAIL": EndKind.FAILED,
              "PREEMPTED": EndKind.CANCELLED, "OUT_OF_MEMORY": EndKind.FAILED, "BOOT_FAIL": EndKind.FAILED}
"""SLURM's final job states; every other state (COMPLETING included) is a job still holding nodes."""


def _slurm_end(job_id: str, run: Run) -> JobEnd | None:
    proc = run(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode == 0 and "JobId=" in proc.stdout:
        return slurm_end(parse_scontrol_line(proc.stdout.splitlines()[0]))
    if "invalid job id" in (proc.stderr + proc.stdout).lower():
        return JobEnd(EndKind.VANISHED, "unknown to slurmctld", None, None)
    said = (proc.stderr or proc.stdout).strip().splitlines()
    raise NoAnswer(f"`scontrol show job {job_id}` failed: {said[-1] if said else f'exit {proc.returncode}'}")


def slurm_end(fields: Mapping[str, str]) -> JobEnd | None:
    """One ``scontrol show job -o`` record as an end; None for a job not in a final state."""
    state = (fields.get("JobState") or "?").split()[0]
    kind = SLURM_ENDS.get(state)
    if kind is None:
        return None
    code, _, signal = fields.get("ExitCode", "").partition(":")
    status = int(code) if code.isdigit() else None
    if kind is EndKind.COMPLETED and status:  # COMPLETED is exit 0; keep the scheduler's word otherwise
        kind = EndKind.FAILED
    if state == "FAILED" and status == 0 and signal.isdigit() and signal != "0":
        status = 128 + int(signal)  # the batch shell killed by a signal
    return JobEnd(kind, state, status, _epoch(fields.get("EndTime", ""), "%Y-%m-%dT%H:%M:%S"))


def _sge_end(job_id: str, run: Run) -> JobEnd | None:
    known = run(["qstat", "-j", job_id])
    if known.returncode == 0:
        return None
    if "do not exist" not in known.stderr + known.stdout:  # qmaster unreachable: no word on the job
        said = (known.stderr or known.stdout).strip().splitlines()
        raise NoAnswer(f"`qstat -j {job_id}` failed: {said[-1] if said else f'exit {known.returncode}'}")
    acct = run(["qacct", "-j", job_id])
    if acct.returncode != 0:
        return JobEnd(EndKind.VANISHED, "not in qstat, no qacct record", None, None)
    return sge_end(parse_qacct(acct.stdout))


def sge_end(fields: Mapping[str, str]) -> JobEnd:
    """A job's last ``qacct`` record as an end. ``failed 37`` is h_rt; a job qdel'd or killed by
    a signal from outside reads ``deleted_by`` where this Grid Engine records it, else ``failed
    100`` with exit status 137 (measured on SoGE 8.1.9, where a qdel and a kill -9 look alike)."""
    failed = fields.get("failed", "0").split()[0]
    exit_text = fields.get("exit_status", "").split()
    status = int(exit_text[0]) if exit_text and exit_text[0].isdigit() else None
    at = _epoch(fields.get("end_time", ""), "%a %b %d %H:%M:%S %Y")
    deleted_by = fields.get("deleted_by", "NONE")
    if deleted_by not in ("NONE", ""):
        return JobEnd(EndKind.CANCELLED, f"deleted by {deleted_by}", status, at)
    if failed == "37":
        return JobEnd(EndKind.TIME_LIMIT, "failed 37, h_rt", status, at)
    if failed == "100" and status == 137:
        return JobEnd(EndKind.CANCELLED, "failed 100 with exit_status 137, a qdel or kill -9", status, at)
    if failed == "0" and status == 0:
        return JobEnd(EndKind.COMPLETED, "exit_status 0", 0, at)
    return JobEnd(EndKind.FAILED, f"failed {fields.get('failed', '?')}, exit_status {status}", status, at)


def _epoch(text: str, form: str) -> float | None:
    """Local time ``text`` in ``form`` as epoch seconds (None when it is not one)."""
    try:
        return datetime.datetime.strptime(text.strip(), form).timestamp()
    except ValueError:
        return None


def parse_scontrol_line(line: str) -> dict[str, str]:
    """``Key=Value Key=Value`` (``scontrol show ... -o``); values never contain '=' + space."""
    fields: dict[str, str] = {}
    for match in re.finditer(r"(\S+?)=(.*?)(?=\s+\S+?=|$)", line.strip()):
        fields[match.group(1)] = match.group(2).strip()
    return fields


def parse_qacct(text: str) -> dict[str, str]:
    """The last record of ``qacct -j ID`` (a rescheduled job has one per run)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("====="):
            fields = {}
            continue
        parts = line.split(None, 1)
        if len(parts) == 2:
            fields[parts[0]] = parts[1].strip()
    return fields
