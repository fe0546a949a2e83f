"""Scheduler adapters: the only code in diffscale.cluster that runs scheduler commands.

Every command is an argument list run without a shell, so no user value is ever parsed
by one. Scripts are submitted from the run directory (``cwd=``), which the job scripts'
relative log paths rely on. The records of ``scontrol show job`` and ``qacct`` are parsed by
``runtime/job_end.py``, which a coupled trainer also uses to learn how its simulation's job ended.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from diffscale.cluster.jobs.records import JobState
from diffscale.cluster.profiles.types import SchedulerKind
from diffscale.cluster.scripts import sge, slurm
from diffscale.errors import UserError
from diffscale.runtime.job_end import parse_qacct, parse_scontrol_line


def run(argv: Sequence[str], *, cwd: str | Path | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a scheduler command; a missing command or a refusal is a UserError with its words."""
    if shutil.which(argv[0]) is None:
        raise UserError(f"`{argv[0]}` is not on PATH",
                        "run diffscale on the cluster's login node, where the scheduler's "
                        "commands are installed (or load the scheduler's module)")
    proc = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise UserError(f"`{' '.join(argv[:2])}` failed: {said[-1] if said else f'exit {proc.returncode}'}",
                        "see the scheduler's message; `diffscale plan` shows the job it was asked for")
    return proc


SLURM_FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                         "BOOT_FAIL", "DEADLINE"})
"""SLURM job states after which a job never runs again by itself. Every other state -- PENDING,
RUNNING, and also SIGNALING, STOPPED, SPECIAL_EXIT, STAGE_OUT, RESIZING, REVOKED or one a
later SLURM adds -- is active: the job may still hold nodes, and cancel must act on it."""


class Scheduler(Protocol):
    kind: SchedulerKind
    starts_after_start: bool
    """Whether a job can be held until another one *starts* (not ends)."""

    def submit(self, script: Path, run_dir: Path, *, after: str | None = None, started: bool = False) -> str:
        """Submit ``script``; with ``after``, once that job ended (``started``: once it started)."""
        ...

    def verify(self, script: Path, run_dir: Path) -> None:
        """Ask the scheduler whether it would take ``script`` (nothing is submitted); a refusal
        is a UserError with the scheduler's words."""
        ...

    def states(self, job_ids: Sequence[str]) -> list[JobState]: ...

    def cancel(self, job_ids: Sequence[str]) -> None: ...

    def log_path(self, job_name: str, job_id: str) -> str: ...


class Slurm:
    kind = SchedulerKind.SLURM
    starts_after_start = True

    def submit(self, script: Path, run_dir: Path, *, after: str | None = None, started: bool = False) -> str:
        argv = ["sbatch", "--parsable"]
        if after and started:
            # after: a coupled trainer starts once the simulation it follows has started.
            argv.append(f"--dependency=after:{after}")
        elif after:
            # afterany: the next segment runs however the previous ended (time limit,
            # checkpoint-and-exit, crash): it resumes from the newest checkpoint.
            argv.append(f"--dependency=afterany:{after}")
        out = run(argv + [str(script)], cwd=run_dir).stdout.strip()
        job_id = out.split(";", 1)[0]
        if not job_id.isdigit():
            raise UserError(f"sbatch answered '{out}' instead of a job id", "check the scheduler's output above")
        return job_id

    def verify(self, script: Path, run_dir: Path) -> None:
        run(["sbatch", "--test-only", str(script)], cwd=run_dir)

    def states(self, job_ids: Sequence[str]) -> list[JobState]:
        # sacct needs an accounting database many clusters (and our tests) lack; squeue
        # and scontrol know a job until MinJobAge after it ends.
        result = []
        for job_id in job_ids:
            proc = run(["scontrol", "show", "job", "-o", job_id], check=False)
            if proc.returncode == 0 and "JobId=" in proc.stdout:
                result.append(slurm_state(job_id, parse_scontrol_line(proc.stdout.splitlines()[0])))
            elif "invalid job id" in proc.stderr.lower() or proc.returncode == 0:
                result.append(JobState(job_id, "GONE", "no longer known to slurmctld (ended a while ago); see its log"))
            else:  # slurmctld down or unreachable: not a fact about the job
                said = proc.stderr.strip().splitlines()
                raise UserError(f"`scontrol show job {job_id}` failed: {said[-1] if said else proc.returncode}",
                                "check that slurmctld answers (scontrol ping), then ask again")
        return result

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            run(["scancel", *job_ids], check=False)

    def log_path(self, job_name: str, job_id: str) -> str:
        return slurm.log_path(job_name, job_id)

    def test_only(self, script: Path, cwd: Path) -> str:
        """What ``sbatch --test-only`` says of a script (it submits nothing): "... to start at ..."."""
        proc = run(["sbatch", "--test-only", str(script)], cwd=cwd, check=False)
        return proc.stderr + proc.stdout

    def pending_starts(self, partition: str | None) -> str:
        """``squeue --start`` of the jobs pending in a partition: "ID START" lines."""
        argv = ["squeue", "--start", "-h", "-t", "PD", "-o", "%i %S"] + (["-p", partition] if partition else [])
        return run(argv, check=False).stdout


def slurm_state(job_id: str, fields: dict[str, str]) -> JobState:
    """One ``scontrol show job -o`` record as a JobState: final only in :data:`SLURM_FINAL`."""
    state = (fields.get("JobState") or "?").split()[0]
    final = state in SLURM_FINAL
    bits = []
    if fields.get("Reason") not in (None, "None"):
        bits.append(f"reason {fields['Reason']}")
    if fields.get("NodeList") not in (None, "(null)", ""):
        bits.append(f"nodes {fields['NodeList']}")
    if final:  # an exit code is only a result once the job has one
        bits.append(f"exit {fields.get('ExitCode', '?')}")
    if fields.get("Restarts", "0") != "0":
        bits.append(f"restarts {fields['Restarts']}")
    user = fields.get("UserId", "").split("(", 1)[0] or None  # UserId=alice(1000)
    return JobState(job_id, state, ", ".join(bits), active=not final, name=fields.get("JobName"), user=user)


_SGE_PRIMARY = (("E", "ERROR"), ("d", "DELETING"), ("s", "SUSPENDED"), ("S", "SUSPENDED"), ("T", "SUSPENDED"),
                ("r", "RUNNING"), ("t", "STARTING"), ("w", "PENDING"), ("q", "PENDING"), ("z", "FINISHED"))
_SGE_NOTES = {"h": "held", "R": "restarted", "S": "its queue is suspended", "T": "its queue passed a load threshold",
              "E": "stuck in error state: see qstat -j ID, then qmod -cj ID or qdel ID", "r": "was running",
              "t": "being transferred to its host"}
_SGE_ALWAYS_NOTED = "EST"
"""Letters whose note says more than their word (which error, which suspension)."""


def sge_state_words(code: str) -> str:
    """Grid Engine's letter code in words: ``qw`` -> PENDING, ``hqw`` -> PENDING (held),
    ``Rr`` -> RUNNING (restarted), ``Eqw`` -> ERROR (stuck in error state: ...)."""
    first = next((letter for letter, _ in _SGE_PRIMARY if letter in code), "")
    primary = dict(_SGE_PRIMARY).get(first, "UNKNOWN")
    notes = [_SGE_NOTES[c] for c in dict.fromkeys(code)
             if c in _SGE_NOTES and (c != first or c in _SGE_ALWAYS_NOTED)]
    unknown = [c for c in code if c not in "EdsSTrtwqzhR"]
    if unknown:
        notes.append(f"code letters {''.join(unknown)} unknown to diffscale: see man qstat")
    return primary + (f" ({', '.join(notes)})" if notes else "")


def parse_qstat_xml(text: str) -> dict[str, dict[str, str]]:
    """``qstat -xml -u '*'`` -> job id -> {state, name, owner, queue} (names are not cut
    to 10 characters as in the plain listing)."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise UserError(f"qstat -xml answered something that is not XML ({exc})",
                        "check that `qstat -xml` works here, then ask again") from exc
    jobs: dict[str, dict[str, str]] = {}
    for item in root.iter("job_list"):
        values = {child.tag: (child.text or "").strip() for child in item}
        if values.get("JB_job_number"):
            job = {"state": values.get("state", "?"), "name": values.get("JB_name", ""),
                   "owner": values.get("JB_owner", ""), "queue": values.get("queue_name", "")}
            jobs[values["JB_job_number"]] = job
            for task in array_tasks(values.get("tasks", "")):  # an array's tasks also by their own ids
                jobs[f"{values['JB_job_number']}.{task}"] = job
    return jobs


def array_tasks(text: str) -> list[int]:
    """qstat's ``tasks`` of an array job: ``3``, ``1-8:1`` (pending ones), ``1,3``; [] for none."""
    found: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+)(?::(\d+))?)?\s*", part)
        if match:
            first, last, step = int(match.group(1)), int(match.group(2) or match.group(1)), int(match.group(3) or 1)
            found += range(first, last + 1, max(step, 1))
    return found


class GridEngine:
    kind = SchedulerKind.SGE
    starts_after_start = False  # -hold_jid waits for the end of a job

    def submit(self, script: Path, run_dir: Path, *, after: str | None = None, started: bool = False) -> str:
        assert not started, "Grid Engine cannot hold a job until another starts"
        argv = ["qsub", "-terse"]
        if after:
            argv += ["-hold_jid", after]
        out = run(argv + [str(script)], cwd=run_dir).stdout.strip()
        job_id = out.split(".", 1)[0]
        if not job_id.isdigit():
            raise UserError(f"qsub answered '{out}' instead of a job id", "check the scheduler's output above")
        return job_id

    def verify(self, script: Path, run_dir: Path) -> None:
        # -w v: would the job run on an empty cluster? (qsub says so in its output, exit 0 either way
        # on some versions: the words decide)
        proc = run(["qsub", "-w", "v", str(script)], cwd=run_dir, check=False)
        said = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0 or "no suitable queue" in said.lower():
            lines = [ln.strip() for ln in said.splitlines() if ln.strip() and ln.strip() != "Exiting."]
            why = next((ln for ln in lines if ln.startswith("Unable to run job")), lines[-1] if lines else "")
            raise UserError(f"`qsub -w v` refused it: {why or f'exit {proc.returncode}'}",
                            "see the scheduler's message; `diffscale sweep plan` shows the job it was asked for")

    def states(self, job_ids: Sequence[str]) -> list[JobState]:
        live = parse_qstat_xml(run(["qstat", "-xml", "-u", "*"]).stdout)
        result = []
        for job_id in job_ids:
            if job_id in live:
                job = live[job_id]
                where = f", {job['queue']}" if job["queue"] else ""
                result.append(JobState(job_id, sge_state_words(job["state"]), f"state {job['state']}{where}",
                                       active=True, name=job["name"] or None, user=job["owner"] or None))
                continue
            number, _, task = job_id.partition(".")  # an array task: qacct -j JOB -t TASK
            acct = run(["qacct", "-j", number, *(["-t", task] if task else [])], check=False)
            if acct.returncode != 0:
                result.append(JobState(job_id, "GONE", "not in qstat, not in qacct (a job deleted while pending "
                                                       "leaves no record; accounting may also flush late)"))
                continue
            result.append(sge_finished_state(job_id, parse_qacct(acct.stdout)))
        return result

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            run(["qdel", *job_ids], check=False)

    def log_path(self, job_name: str, job_id: str) -> str:
        return sge.log_path(job_name, job_id)


def sge_finished_state(job_id: str, fields: dict[str, str]) -> JobState:
    """A job's last ``qacct`` record as a JobState: COMPLETED, CANCELLED (qdel) or FAILED."""
    failed = fields.get("failed", "0").split()[0]
    exit_status = fields.get("exit_status", "?").split()[0]
    deleted_by = fields.get("deleted_by", "NONE")
    detail = f"exit {exit_status}, failed {fields.get('failed', '?')}"
    if deleted_by not in ("NONE", ""):
        state, detail = "CANCELLED", f"deleted by {deleted_by}; {detail}"
    else:
        state = "COMPLETED" if failed == "0" and exit_status == "0" else "FAILED"
    return JobState(job_id, state, detail, name=fields.get("jobname"), user=fields.get("owner"))


def for_kind(kind: SchedulerKind) -> Scheduler:
    return Slurm() if kind is SchedulerKind.SLURM else GridEngine()
