"""How a spool's follower learns that the simulation writing it has ended, however it ends.

1. Its end marker (``ended.json``): the command ended by itself, with its exit status.
2. Else, when the spool names the simulation's scheduler job (``job.json``), the scheduler's word
   on that job (``runtime/job_end.py``): cancelled (scancel, qdel), killed at its time limit,
   failed (its node failed, out of memory), or gone from the scheduler without a record. The
   scheduler is asked in a thread every ``WATCH_S`` seconds, so a slow scheduler never holds up
   training; the first time at once, so a resumed run knows before its first step.
3. Else its heartbeat (``heartbeat.json``, written by a ``SpoolWriter`` outside a scheduler)
   unchanged for as long as the writer said it may be: a killed process writes no marker. Only
   changes count, timed by this host's clock, so two hosts' clocks need not agree.

A job's end is final only once the job holds no processes (SLURM's COMPLETING is not an end), so
every file it wrote is in the directory when the follower lists it after the end -- as after a
marker, which is written after the last file.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from diffscale.data.locations import SPOOL_END_NAME, SPOOL_JOB_NAME
from diffscale.runtime.job_end import EndKind, JobEnd, JobRef, NoAnswer, job_end, read_job_file
from diffscale.tasks.fields.spool import HEARTBEAT_NAME, read_end

WATCH_S = 10.0
"""How often the scheduler is asked about the simulation's job."""
VANISHED_GRACE_S = 30.0
"""How long a job must stay unknown to the scheduler before it counts as gone (Grid Engine writes
its accounting record some seconds after the job left qstat)."""


class EndHow(enum.IntEnum):
    """How the simulation ended; an integer so the ranks can share it."""

    EXITED = 0
    """Its end marker: the command's own exit status."""
    CANCELLED = 1
    TIME_LIMIT = 2
    FAILED = 3
    """The scheduler says its job failed without a marker (its node failed, out of memory, ...)."""
    VANISHED = 4
    SILENT = 5
    """Its heartbeat stopped."""


_FROM_JOB = {EndKind.COMPLETED: EndHow.EXITED, EndKind.FAILED: EndHow.FAILED, EndKind.CANCELLED: EndHow.CANCELLED,
             EndKind.TIME_LIMIT: EndHow.TIME_LIMIT, EndKind.VANISHED: EndHow.VANISHED}
_WORDS = {EndHow.CANCELLED: "cancelled", EndHow.TIME_LIMIT: "killed at its time limit", EndHow.FAILED: "its job failed",
          EndHow.VANISHED: "gone from the scheduler without a record", EndHow.SILENT: "its heartbeat stopped"}


@dataclass(frozen=True)
class SourceEnd:
    how: EndHow
    exit_status: int | None = None
    at: float | None = None
    """When it ended (epoch seconds), where that is known."""
    detail: str = ""
    """What told (``SLURM job 12: CANCELLED``); known on the rank that read the spool."""

    @property
    def ok(self) -> bool:
        """Whether the run finishes normally: anything but a failure. A cancel, the time limit or a
        stopped heartbeat leaves what was written as good as it is: the trainer trains on it."""
        if self.how is EndHow.EXITED:
            return self.exit_status == 0
        return self.how is not EndHow.FAILED

    def words(self) -> str:
        """``exit status 3``, ``cancelled``, ``its job failed, exit status 1``."""
        if self.how is EndHow.EXITED:
            return f"exit status {self.exit_status}"
        status = f", exit status {self.exit_status}" if self.how is EndHow.FAILED and self.exit_status else ""
        return _WORDS[self.how] + status


Ask = Callable[[JobRef], JobEnd | None]


class SourceWatch:
    """Rank 0's view of whether the simulation writing ``directory`` has ended (see the module
    docstring); ``check`` costs two small file reads, the scheduler is asked by a thread."""

    def __init__(self, directory: Path, *, ask: Ask = job_end, clock: Callable[[], float] = time.monotonic,
                 watch_s: float = WATCH_S) -> None:
        self.directory = directory
        self.ask = ask
        self.clock = clock
        self.watch_s = watch_s
        self._notes: list[str] = []
        """What the follower should say once (a scheduler that cannot be asked): ``news``."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._answer: tuple[JobRef, JobEnd | None] | None = None
        """The newest answer about the job of ``job.json``; None while there is none."""
        self._no_answer = ""
        self._gone_since: float | None = None
        self._beat: tuple[str, float] | None = None
        """The heartbeat's text and when this host first saw it."""

    def check(self) -> SourceEnd | None:
        """The simulation's end, or None while it runs (or nothing tells)."""
        status = read_end(self.directory)
        if status is not None:
            return SourceEnd(EndHow.EXITED, status, _mtime(self.directory / SPOOL_END_NAME))
        job = read_job_file(self.directory / SPOOL_JOB_NAME)
        if job is not None:
            if self._thread is None:
                self._ask()  # at once: a resumed run learns of an ended simulation before its first step
                self._thread = threading.Thread(target=self._watching, name="spool-source-watch", daemon=True)
                self._thread.start()
            with self._lock:
                answer, no_answer = self._answer, self._no_answer
            if answer is not None and answer[0] == job:
                ended = answer[1]
                if ended is not None:
                    return SourceEnd(_FROM_JOB[ended.kind], ended.exit_status, ended.at, f"{job}: {ended.state}")
                return None  # the scheduler says it runs: its word outranks a heartbeat
            if not no_answer:
                return None  # not asked about this job yet
        return self._heartbeat()

    def news(self) -> list[str]:
        """What the follower should say, once each (the watching thread adds to it)."""
        with self._lock:
            notes, self._notes = self._notes, []
        return notes

    def close(self) -> None:
        self._stop.set()

    def _watching(self) -> None:
        while not self._stop.wait(self.watch_s):
            self._ask()

    def _ask(self) -> None:
        job = read_job_file(self.directory / SPOOL_JOB_NAME)
        if job is None:
            return
        try:
            ended = self._believed(self.ask(job))
        except NoAnswer as exc:
            with self._lock:
                if not self._no_answer:
                    self._notes.append(f"warning: cannot ask the scheduler about the simulation's {job} ({exc}): its "
                                      "end marker and heartbeat tell when it ends")
                self._no_answer = str(exc)
            return
        with self._lock:
            self._answer, self._no_answer = (job, ended), ""

    def _believed(self, ended: JobEnd | None) -> JobEnd | None:
        """``ended``, once a job gone without a record has stayed gone for ``VANISHED_GRACE_S``."""
        if ended is None or ended.kind is not EndKind.VANISHED:
            self._gone_since = None
            return ended
        now = self.clock()
        if self._gone_since is None:
            self._gone_since = now
        return ended if now - self._gone_since >= VANISHED_GRACE_S else None

    def _heartbeat(self) -> SourceEnd | None:
        try:
            text = (self.directory / HEARTBEAT_NAME).read_text()
            beat = json.loads(text)
            stale_after = float(beat["stale_after_s"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # no heartbeat (a writer inside a scheduler, or of another language), or half of one
        now = self.clock()
        if self._beat is None or self._beat[0] != text:
            self._beat = (text, now)
            return None
        if now - self._beat[1] < stale_after:
            return None
        at = beat.get("time")
        return SourceEnd(EndHow.SILENT, None, at if isinstance(at, (int, float)) else None,
                         f"none for {now - self._beat[1]:.0f} s, the writer's limit {stale_after:g} s")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
