"""One trainer per run directory: ``RUN_DIR/train.lock`` names the process that trains there.

Two trainers in one run dir write the same checkpoints, metrics and TensorBoard files over each
other. The lock file is created atomically (a hard link to a written record, which fails when the
lock exists, also on network file systems) and holds the holder's host, pid, process start and
scheduler job; it is removed when the trainer ends, also on an error or a stop signal. A lock
whose process is gone from this host (a kill) is taken over; one held on another host cannot be
checked from here and is only taken with ``force``, unless the scheduler here says the holder's
job has ended (the previous job of a chain, killed). A job that the scheduler requeued (the same
job id) takes over its own lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffscale.errors import UserError

LOCK_NAME = "train.lock"
JOB_VARIABLES = ("SLURM_JOB_ID", "JOB_ID")
"""SLURM's and Grid Engine's job id: a requeued job keeps its id and may take over its own lock."""


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux), which tells a reused pid from its first owner."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _alive(pid: int, started: str | None) -> bool:
    if not process_alive(pid):
        return False
    now = process_start(pid)
    return started is None or now is None or now == started


def _job() -> str | None:
    return next((os.environ[v] for v in JOB_VARIABLES if os.environ.get(v)), None)


def job_ended(job: str) -> bool:
    """Whether the scheduler here says job ``job`` no longer runs (a job of a chain that was
    killed before it could free its lock); False when no scheduler answers."""
    if not job.replace("_", "").replace(".", "").isdigit():
        return False
    for command, gone in ((["squeue", "-h", "-j", job, "-o", "%T"], "Invalid job id"),
                          (["qstat", "-j", job], "do not exist")):
        if shutil.which(command[0]) is None:
            continue
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        said = done.stdout.strip()
        if command[0] == "squeue" and done.returncode == 0:
            return said in ("", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                            "PREEMPTED", "BOOT_FAIL", "DEADLINE")
        return gone in done.stdout + done.stderr
    return False


def _describe(holder: dict[str, Any]) -> str:
    job = f", job {holder['job']}" if holder.get("job") else ""
    at = holder.get("since")
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if isinstance(at, (int, float)) else "?"
    return f"pid {holder.get('pid')} on host {holder.get('host')}{job}, since {since}"


class RunLock:
    """The lock on one run directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, run_dir: Path, *, who: str = "diffscale train") -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self.who = who
        self.held = False
        self.record = {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(os.getpid()),
                       "since": time.time(), "job": _job(), "by": who,
                       "token": secrets.token_hex(8)}

    def acquire(self, *, force: bool = False, say: Callable[[str], None] = print) -> RunLock:
        """Take the lock, taking over a stale one (said); a live holder raises ``UserError``."""
        for _ in range(3):  # a holder that ends between our tries frees the file
            if self._create():
                return self
            holder = self._read()
            if holder is None:
                continue  # its holder removed it meanwhile
            why = self._stale(holder, force)
            if why is None:
                raise UserError(
                    f"run dir '{self.path.parent}' is in use by another trainer ({_describe(holder)}; "
                    f"{self.path})",
                    self._fix(holder),
                )
            self._take_over(holder)
            say(f"warning: took over the lock of {_describe(holder)}: {why}")
        raise UserError(f"could not take the lock {self.path}: other processes keep creating it",
                        "make sure only one trainer runs in this run dir, then try again")

    def _fix(self, holder: dict[str, Any]) -> str:
        if holder.get("host") == self.record["host"] and holder.get("pid") == self.record["pid"]:
            return "this process trains there already: close() that trainer first, or train in another --out"
        if holder.get("host") == self.record["host"]:
            return (f"wait for it to end or stop it (kill {holder.get('pid')}: it checkpoints first), "
                    "or train in another --out")
        return ("it runs on another host, which cannot be checked from here: if that trainer has ended "
                "(a killed job), pass --force (force=True) to take the lock; else train in another --out")

    def _stale(self, holder: dict[str, Any], force: bool) -> str | None:
        """Why ``holder`` no longer trains (None: it may)."""
        if isinstance(holder.get("raw"), str):
            return "its record cannot be read (a damaged lock file), so nothing holds it"
        if holder.get("host") == self.record["host"]:
            pid = holder.get("pid")
            if not isinstance(pid, int) or not _alive(pid, holder.get("started")):
                return "that process is gone"
            return None
        job = self.record["job"]
        if job is not None and holder.get("job") == job:
            return f"job {job} was requeued, and this is its new run"
        if isinstance(holder.get("job"), str) and job_ended(holder["job"]):
            return f"the scheduler no longer runs job {holder['job']}"
        return "--force was passed" if force else None

    def _create(self) -> bool:
        """Write the record beside the lock, then link it into place: the link fails if the lock
        exists, and a lock that exists is always whole (no reader sees a half-written one)."""
        tmp = self.path.with_name(f".{LOCK_NAME}.{self.record['token']}")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(self.record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        self.held = True
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            text = self.path.read_bytes().decode("utf-8", "replace")  # garbage bytes: a damaged lock
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except ValueError:
            holder = None
        if not isinstance(holder, dict):  # a writer killed mid-write: nobody to ask, treat as gone
            return {"host": self.record["host"], "pid": None, "raw": text[:80]}
        return holder

    def _take_over(self, holder: dict[str, Any]) -> None:
        """Remove the stale lock only if it is still the one judged stale: a rename to a name of our
        own is atomic, so of two processes taking over the same lock one gets it, and a fresh lock
        created meanwhile by a third is put back."""
        aside = self.path.with_name(f".{LOCK_NAME}.stale-{self.record['host']}-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            moved = json.loads(aside.read_bytes().decode("utf-8", "replace"))
        except (ValueError, OSError):
            moved = None
        if isinstance(moved, dict) and moved != holder and not isinstance(holder.get("raw"), str):
            with contextlib.suppress(OSError):  # not the lock judged stale: give it back
                os.link(aside, self.path)
        with contextlib.suppress(OSError):
            aside.unlink()

    def release(self) -> None:
        """Remove the lock if this process holds it (idempotent)."""
        if not self.held:
            return
        self.held = False
        holder = self._read()
        if holder is not None and holder.get("token") == self.record["token"]:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
