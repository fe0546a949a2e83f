"""The process that trains in a run folder, as the folder records it, read without torch.

A trainer writes ``RUN_DIR/trainer.json`` when it takes the run dir (its host, pid, the kernel's
start time of that pid, its command) and adds how it ended (finished, stopped by a signal, an
error) when it ends. A trainer killed outright (SIGKILL, the out-of-memory killer, a closed
terminal) writes no end: its record stays open with a pid that is gone, which ``status`` and
``doctor`` read as a stopped run instead of one still running. Its console output is in
``RUN_DIR/train.log`` (earlier invocations: ``train.log.1`` the newest, up to ``train.log.9``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from diffscale.errors import UserError
from diffscale.io.atomic import write_text
from diffscale.runtime.runlock import process_alive, process_start

TRAINER_FILE = "trainer.json"
LOG_NAME = "train.log"
KEPT_LOGS = 9
"""Earlier invocations' logs kept beside train.log (train.log.1 .. train.log.9)."""


class TrainerState(str, Enum):
    """What the record says of the trainer, seen from this host."""

    RUNNING = "running"
    ENDED = "ended"
    """It recorded its end (finished, stopped, an error)."""
    GONE = "gone"
    """Its process is gone from this host without recording an end: killed."""
    ELSEWHERE = "elsewhere"
    """It ran on another host, which cannot be asked from here."""


@dataclass(frozen=True)
class Trainer:
    host: str
    pid: int
    started: str | None
    """The kernel's start time of ``pid`` (tells a reused pid from the trainer)."""
    since: float
    """When it took the run dir (epoch seconds)."""
    command: tuple[str, ...] = ()
    ended: float | None = None
    outcome: str = ""
    """How it ended, one line: ``finished at step 400``, ``error: ...``."""

    def state(self) -> TrainerState:
        if self.ended is not None:
            return TrainerState.ENDED
        if self.host != socket.gethostname():
            return TrainerState.ELSEWHERE
        alive = process_alive(self.pid) and (self.started is None or process_start(self.pid) in (None, self.started))
        return TrainerState.RUNNING if alive else TrainerState.GONE


def start_record(command: list[str] | None = None) -> dict[str, Any]:
    """This process's record, written when it takes a run dir."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": process_start(os.getpid()),
            "since": time.time(), "command": list(sys.argv if command is None else command), "ended": None,
            "outcome": ""}


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_text(Path(run_dir) / TRAINER_FILE, json.dumps(record, indent=1) + "\n")


def read_trainer(run_dir: Path) -> Trainer | None:
    """The run's trainer record, or None (runs trained before diffscale kept it, a torn file)."""
    try:
        data = json.loads((Path(run_dir) / TRAINER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int) or not isinstance(data.get("host"), str):
        return None
    ended = data.get("ended")
    return Trainer(host=data["host"], pid=data["pid"], started=data.get("started"),
                   since=float(data.get("since") or 0.0), command=tuple(map(str, data.get("command") or ())),
                   ended=float(ended) if isinstance(ended, (int, float)) else None,
                   outcome=str(data.get("outcome") or ""))


def last_output(run_dir: Path, logged_at: float | None = None) -> float | None:
    """When the run last said something: train.log's change time, or its newest record's."""
    try:
        changed: float | None = (Path(run_dir) / LOG_NAME).stat().st_mtime
    except OSError:
        changed = None
    known = [t for t in (changed, logged_at) if t is not None]
    return max(known) if known else None


def clock(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def trainer_line(run_dir: Path, trainer: Trainer, ago: Callable[[float], str], logged_at: float | None = None) -> str:
    """The line ``status`` prints about the trainer (``ago``: ``12 s ago`` of a time; ``logged_at``:
    the run's newest record, when train.log is missing)."""
    state = trainer.state()
    who = f"pid {trainer.pid} on {trainer.host}"
    if state is TrainerState.RUNNING:
        return f"trainer running: {who}, since {clock(trainer.since)} ({ago(trainer.since)})"
    if state is TrainerState.ENDED:
        assert trainer.ended is not None
        how = trainer.outcome or "how is not recorded"
        return f"trainer ended {clock(trainer.ended)} ({ago(trainer.ended)}): {how}"
    if state is TrainerState.GONE:
        last = last_output(run_dir, logged_at)
        said = f"; its last output {clock(last)} ({ago(last)})" if last is not None else ""
        return (f"stopped: its trainer ({who}) is gone without recording an end (killed: SIGKILL, the "
                f"out-of-memory killer, a closed terminal){said} -- see `diffscale doctor {run_dir}` and "
                f"`diffscale logs {run_dir}`; continue with `diffscale train --out {run_dir} --resume auto`")
    return f"trainer: {who} (another host: whether it still runs cannot be seen from here)"


def rotate_log(run_dir: Path) -> Path:
    """Move an earlier invocation's train.log aside (train.log.1, the older ones up by one, at most
    :data:`KEPT_LOGS` kept) and return the path of the new one."""
    log = Path(run_dir) / LOG_NAME
    if log.exists():
        oldest = log.with_name(f"{LOG_NAME}.{KEPT_LOGS}")
        if oldest.exists():
            oldest.unlink()
        for n in range(KEPT_LOGS - 1, 0, -1):
            older = log.with_name(f"{LOG_NAME}.{n}")
            if older.exists():
                older.rename(log.with_name(f"{LOG_NAME}.{n + 1}"))
        log.rename(log.with_name(f"{LOG_NAME}.1"))
    return log


def local_log(run_dir: Path, job: str | None, lines: int) -> str:
    """What ``diffscale logs`` prints of a run trained here: its train.log (the last ``lines``; 0: all)."""
    if job is not None:
        raise UserError(f"{run_dir} was trained here, not submitted: it has no job {job}",
                        f"drop --job: diffscale logs {run_dir} prints its {LOG_NAME}")
    if not (run_dir / LOG_NAME).is_file():
        raise UserError(f"'{run_dir}' has no {LOG_NAME} and no jobs.json: neither a trainer here nor a job wrote "
                        "its log there (runs trained before diffscale kept one have none)",
                        "pass the --out of `diffscale train` or `diffscale submit`")
    text = (run_dir / LOG_NAME).read_text(errors="replace")
    if lines:
        text = "\n".join(text.splitlines()[-lines:]) + "\n"
    trainer = read_trainer(run_dir)
    who = f"pid {trainer.pid} on {trainer.host}" if trainer is not None else "its process not recorded"
    return f"==> {LOG_NAME} (trained here: {who}) <==\n{text}"
