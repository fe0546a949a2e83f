"""Scheduler adapters: the only code in diffscale.cluster that runs scheduler commands.

Every command is an argument list run without a shell, so no user value is ever parsed
by one. Scripts are submitted from the run directory (``cwd=``), which the job scripts'
relative log paths rely on.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from ..errors import UserError
from . import sge, slurm
from .profiles import SchedulerKind


def run(argv: Sequence[str], *, cwd: str | Path | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a scheduler command; a missing command or a refusal is a UserError with its words."""
    if shutil.which(argv[0]) is None:
        raise UserError(f"`{argv[0]}` is not on PATH", "run diffscale on the cluster's login node, where the scheduler's "
                        "commands are installed (or load the scheduler's module)")
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise UserError(f"`{' '.join(argv[:2])}` failed: {said[-1] if said else f'exit {proc.returncode}'}",
                        "see the scheduler's message; `diffscale plan` shows the job it was asked for")
    return proc


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    """Scheduler's word (PENDING, RUNNING, COMPLETED, ... / qw, r, ... / finished)."""
    detail: str = ""
    """Reason, nodes, exit code -- whatever the scheduler tells."""
    active: bool = False
    """Pending or running (cancel would act on it)."""


class Scheduler(Protocol):
    kind: SchedulerKind

    def submit(self, script: Path, run_dir: Path, *, after: str | None = None) -> str: ...

    def states(self, job_ids: Sequence[str]) -> list[JobState]: ...

    def cancel(self, job_ids: Sequence[str]) -> None: ...

    def log_path(self, job_name: str, job_id: str) -> str: ...


class Slurm:
    kind = SchedulerKind.SLURM

    def submit(self, script: Path, run_dir: Path, *, after: str | None = None) -> str:
        argv = ["sbatch", "--parsable"]
        if after:
            # afterany: the next segment runs however the previous ended (time limit,
            # checkpoint-and-exit, crash): it resumes from the newest checkpoint.
            argv.append(f"--dependency=afterany:{after}")
        out = run(argv + [str(script)], cwd=run_dir).stdout.strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise UserError(f"sbatch answered '{out}' instead of a job id", "check the scheduler's output above")
        return job_id

    def states(self, job_ids: Sequence[str]) -> list[JobState]:
        # sacct needs an accounting database many clusters (and our tests) lack; squeue
        # and scontrol know a job until MinJobAge after it ends.
        result = []
        for job_id in job_ids:
            proc = run(["scontrol", "show", "job", "-o", job_id], check=False)
            if proc.returncode != 0 or "JobId=" not in proc.stdout:
                result.append(JobState(job_id, "GONE", "no longer known to slurmctld (ended a while ago); see its log"))
                continue
            fields = parse_scontrol_line(proc.stdout.splitlines()[0])
            state = fields.get("JobState", "?")
            bits = []
            if fields.get("Reason") not in (None, "None"):
                bits.append(f"reason {fields['Reason']}")
            if fields.get("NodeList") not in (None, "(null)", ""):
                bits.append(f"nodes {fields['NodeList']}")
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED"):
                bits.append(f"exit {fields.get('ExitCode', '?')}")
            if fields.get("Restarts", "0") != "0":
                bits.append(f"restarts {fields['Restarts']}")
            result.append(JobState(job_id, state, ", ".join(bits),
                                   active=state in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED", "SUSPENDED",
                                                    "COMPLETING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")))
        return result

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            run(["scancel", *job_ids], check=False)

    def log_path(self, job_name: str, job_id: str) -> str:
        return slurm.log_path(job_name, job_id)


def parse_scontrol_line(line: str) -> dict[str, str]:
    """``Key=Value Key=Value`` (``scontrol show ... -o``); values never contain '=' + space."""
    fields: dict[str, str] = {}
    for match in re.finditer(r"(\S+?)=(.*?)(?=\s+\S+?=|$)", line.strip()):
        fields[match.group(1)] = match.group(2).strip()
    return fields


class GridEngine:
    kind = SchedulerKind.SGE

    def submit(self, script: Path, run_dir: Path, *, after: str | None = None) -> str:
        argv = ["qsub", "-terse"]
        if after:
            argv += ["-hold_jid", after]
        out = run(argv + [str(script)], cwd=run_dir).stdout.strip()
        job_id = out.split(".", 1)[0]
        if not job_id.isdigit():
            raise UserError(f"qsub answered '{out}' instead of a job id", "check the scheduler's output above")
        return job_id

    def states(self, job_ids: Sequence[str]) -> list[JobState]:
        listing = run(["qstat", "-u", "*"], check=False).stdout
        live: dict[str, tuple[str, str]] = {}
        for line in listing.splitlines()[2:]:
            cols = line.split()
            if len(cols) >= 5 and cols[0].isdigit():
                queue = cols[7] if len(cols) > 8 and "@" in cols[7] else ""
                live[cols[0]] = (cols[4], queue)
        result = []
        for job_id in job_ids:
            if job_id in live:
                state, queue = live[job_id]
                words = {"qw": "PENDING", "hqw": "HELD", "r": "RUNNING", "t": "STARTING", "Rr": "RUNNING (rescheduled)",
                         "Rq": "PENDING (rescheduled)", "dr": "DELETING", "Eqw": "ERROR"}
                result.append(JobState(job_id, words.get(state, state), f"state {state}" + (f", {queue}" if queue else ""),
                                       active=True))
                continue
            acct = run(["qacct", "-j", job_id], check=False)
            if acct.returncode != 0:
                result.append(JobState(job_id, "GONE", "not in qstat, not yet in qacct (accounting flushes late)"))
                continue
            fields = parse_qacct(acct.stdout)
            failed = fields.get("failed", "0").split()[0]
            exit_status = fields.get("exit_status", "?").split()[0]
            state = "COMPLETED" if failed == "0" and exit_status == "0" else "FAILED"
            result.append(JobState(job_id, state, f"exit {exit_status}, failed {fields.get('failed', '?')}"))
        return result

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            run(["qdel", *job_ids], check=False)

    def log_path(self, job_name: str, job_id: str) -> str:
        return sge.log_path(job_name, job_id)


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


def for_kind(kind: SchedulerKind) -> Scheduler:
    return Slurm() if kind is SchedulerKind.SLURM else GridEngine()
