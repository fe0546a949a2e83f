"""What the doctor reads: a run directory, a log file, or a job id, turned into evidence.

Evidence is text (logs, scheduler records) or records (metrics.jsonl, benchmark JSON).
Scheduler records come from the commands that exist where the doctor runs:
``scontrol show job`` (and the jobcomp file it names, and ``sacct`` where accounting
is on) for SLURM, ``qacct -j`` for Grid Engine. A missing command is skipped, never an
error: the doctor also works on a laptop with a copied run directory.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io.trainer import LOG_NAME, TRAINER_FILE, clock, last_output, read_trainer

MAX_LOG_BYTES = 4 << 20
"""Read at most the last 4 MiB of a log: failures are at the end, logs of long runs are huge."""


@dataclass
class Evidence:
    texts: list[tuple[str, str]] = field(default_factory=list)
    """(origin, text) pairs."""
    records: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    """(origin, records) pairs."""
    skipped: list[str] = field(default_factory=list)
    """What could not be read, and why."""

    @property
    def origins(self) -> list[str]:
        return [o for o, _ in self.texts] + [o for o, _ in self.records]


def read_tail(path: Path) -> str:
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - MAX_LOG_BYTES))
        return fh.read().decode("utf-8", "replace")


def _command(argv: list[str], timeout: float = 30) -> str | None:
    """stdout of a scheduler command, or None when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 and proc.stdout.strip() else None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in read_tail(path).splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill, or the first partial line of the tail
        if isinstance(value, dict):
            records.append(value)
    return records


def _json_records(path: Path) -> list[dict[str, Any]]:
    try:
        value = json.loads(path.read_text())
    except (ValueError, OSError, UnicodeDecodeError):
        return []
    if isinstance(value, dict):
        value = value.get("records", [value])
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


# ----------------------------------------------------------------------------- scheduler records

def slurm_job(job_id: str, ev: Evidence) -> bool:
    """scontrol's record (and the job's StdOut), the jobcomp line, sacct; True when SLURM knew the job."""
    known = False
    shown = _command(["scontrol", "show", "job", "-o", job_id])
    if shown and "JobId=" in shown:
        known = True
        ev.texts.append((f"scontrol show job {job_id}", shown))
        out = re.search(r"\bStdOut=(\S+)", shown)
        if out and Path(out.group(1)).is_file() and not _already_read(Path(out.group(1)), ev):
            ev.texts.append((out.group(1), read_tail(Path(out.group(1)))))
    config = _command(["scontrol", "show", "config"])
    loc = re.search(r"^JobCompLoc\s*=\s*(\S+)", config or "", re.M)
    if config and "jobcomp/filetxt" in config and loc and Path(loc.group(1)).is_file():
        lines = [ln for ln in read_tail(Path(loc.group(1))).splitlines() if re.match(rf"JobId={job_id}\s", ln)]
        if lines:
            known = True
            ev.texts.append((f"{loc.group(1)} (job {job_id})", "\n".join(lines)))
    acct = _command(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,ExitCode,MaxRSS,ReqMem,Elapsed,Timelimit"])
    if acct:
        known = True
        ev.texts.append((f"sacct -j {job_id}", "\n".join("|" + ln + "|" for ln in acct.splitlines())))
    return known


def _already_read(path: Path, ev: Evidence) -> bool:
    """Whether ``path`` is a file ``ev`` holds already (a run's log that scontrol names again)."""
    def same(origin: str) -> bool:
        try:
            return Path(origin).is_file() and Path(origin).samefile(path)
        except OSError:
            return False

    return any(same(origin) for origin, _ in ev.texts)


def sge_job(job_id: str, ev: Evidence) -> bool:
    """One evidence text per qacct record: a rescheduled job has one per run, and h_rt's
    failed/exit_status pair must come from the same run."""
    text = _command(["qacct", "-j", job_id])
    if not text:
        return False
    runs = [r for r in re.split(r"^=+\s*$", text, flags=re.M) if r.strip()]
    for k, record in enumerate(runs, 1):
        ev.texts.append((f"qacct -j {job_id}" + (f" (record {k} of {len(runs)})" if len(runs) > 1 else ""), record))
    return True


# ----------------------------------------------------------------------------- targets

def from_log(path: Path, ev: Evidence) -> None:
    if path.suffix == ".jsonl":
        ev.records.append((str(path), _jsonl(path)))
    elif path.suffix == ".json":
        ev.records.append((str(path), _json_records(path)))
    else:
        ev.texts.append((str(path), read_tail(path)))


def _readable(path: Path, ev: Evidence, read: Callable[[Path, Evidence], None]) -> None:
    """Read one file of a run directory; one the user may not read is skipped with the reason
    (the rest of the run still tells what happened)."""
    try:
        read(path, ev)
    except OSError as exc:
        ev.skipped.append(f"{path}: not readable ({exc.strerror})")


def _metrics(path: Path, ev: Evidence) -> None:
    ev.records.append((str(path), _jsonl(path)))


def _scheduler_records(run_dir: Path, ev: Evidence) -> None:
    from diffscale.cluster.jobs import records as jobs

    try:
        submissions = jobs.load(run_dir)
    except UserError as exc:
        ev.skipped.append(exc.cause)
        return
    for sub in submissions:
        reader = slurm_job if sub.scheduler == "slurm" else sge_job
        for job in sub.jobs:
            if not reader(job.job_id, ev):
                ev.skipped.append(f"{sub.scheduler} job {job.job_id}: no scheduler record here")


def from_run_dir(run_dir: Path, ev: Evidence) -> None:
    logs = run_dir / "logs"
    for path in sorted(logs.rglob("*")) if logs.is_dir() else []:
        if path.is_file():
            _readable(path, ev, from_log)
    trained_here = not (run_dir / "jobs.json").is_file()  # a submitted run's jobs have their own logs and records
    if trained_here and (run_dir / LOG_NAME).is_file():  # its console output
        _readable(run_dir / LOG_NAME, ev, from_log)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        _readable(metrics, ev, _metrics)
    if trained_here:
        _trainer(run_dir, ev)
    for path in sorted(run_dir.glob("*.json")):
        if path.name not in ("jobs.json", "system.json", TRAINER_FILE) and not path.name.startswith("."):
            records = _json_records(path)
            if records:
                ev.records.append((str(path), records))
    if (run_dir / "jobs.json").is_file():
        _scheduler_records(run_dir, ev)


def _trainer(run_dir: Path, ev: Evidence) -> None:
    """The trainer's record with its state seen from here (``gone``: killed without recording an end)."""
    trainer = read_trainer(run_dir)
    if trainer is None:
        return
    last = last_output(run_dir)
    ev.records.append((str(run_dir / TRAINER_FILE), [{
        "kind": "trainer", "state": trainer.state().value, "pid": trainer.pid, "host": trainer.host,
        "since": clock(trainer.since), "last_output": clock(last) if last is not None else "?",
        "outcome": trainer.outcome, "run_dir": str(run_dir)}]))


def from_job_id(job_id: str, ev: Evidence) -> None:
    # both asked: where SLURM and Grid Engine run side by side, an id may name a job in each
    known_to_slurm, known_to_sge = slurm_job(job_id, ev), sge_job(job_id, ev)
    if not (known_to_slurm or known_to_sge):
        raise UserError(f"no scheduler here knows job {job_id} (scontrol, sacct and qacct found nothing)",
                        "run the doctor on the cluster's login node, or pass the job's RUN_DIR or log file")


def gather(target: str) -> Evidence:
    ev = Evidence()
    path = Path(target)
    if path.is_dir():
        from_run_dir(path, ev)
    elif path.is_file():
        try:
            from_log(path, ev)
        except OSError as exc:
            raise UserError(f"cannot read the log '{target}' ({exc.strerror})",
                            "check its permissions (ls -l), or run the doctor as a user who may read it") from exc
    elif target.isdigit():
        from_job_id(target, ev)
    else:
        raise UserError(f"'{target}' is neither a run directory, a log file nor a job id",
                        "pass RUN_DIR (the --out of diffscale train/submit), a log file, "
                        "or a SLURM / Grid Engine job id")
    return ev
