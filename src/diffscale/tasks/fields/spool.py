"""The spool: how a simulation hands samples to a trainer in another job or on another node.

Format (one directory, written by the simulation, only read by the trainer):

* one file per output step, ``NNNNNNNNNN.npz`` (a 10-digit sequence number, counting up from
  0000000000), holding ``cond`` (n x C, float32), ``x`` (n x D or n x D x K, float32) and
  ``sim_time`` (a float64 scalar: the simulation time of the step);
* written atomically: the writer saves a temporary file (a name starting with ``.``) in the
  same directory, flushes it to disk and then gives it its final name, so a reader sees a
  complete file or none. Readers ignore every other name (temporary files, notes, a ``.lock``).
* several writers may share one directory (the ranks of a simulation, on one node or across
  the nodes of a shared file system such as Lustre or GPFS): each writes its own temporary
  file (process id and a random part in its name) and claims the next free number with a
  hard link (``os.link``), which fails rather than replace a file another writer claimed
  first; the writer then tries the number after. A number is claimed only after the one
  before it exists, so files appear in sequence order and a reader never finds a gap it has
  already passed. The file system must support hard links (local disks, Lustre, GPFS and
  NFS do).

``SpoolWriter`` writes it (any language can: it is plain ``numpy.savez``); ``SpoolReader``
returns the files that appeared since its last poll, in sequence order. A file that does not
fit the task is skipped, counted and reported once: the trainer keeps going. A file that
cannot be read as an archive is read again at the next poll while it is the newest one and
younger than ``UNREADABLE_GRACE_S`` (a writer that does not rename may still be writing it),
and skipped like a misfit once a later file exists or it has stayed unreadable that long.

* the end: once the simulation is done, ``ended.json`` (``{"exit_status": N}``) appears in the
  directory, written after its last spool file (a coupled simulation's job script writes it when
  the command ends by itself, with the command's exit status; ``SpoolWriter.end`` writes it too).
  A reader that finds it before listing the directory has then seen every file the simulation wrote.
* who writes: ``job.json`` (``{"scheduler": "slurm", "job_id": "123"}``) names the scheduler job
  that runs the simulation (``diffscale submit --couple`` writes it at submission, a
  ``SpoolWriter`` inside a SLURM or Grid Engine job writes its own), so a follower can ask the
  scheduler how the job ended when it was cancelled or killed before it could write the marker;
  a ``SpoolWriter`` outside a scheduler instead rewrites ``heartbeat.json`` (``{"time": T,
  "every_s": S, "stale_after_s": L}``) every S seconds while its process lives, and a follower
  that sees it unchanged for L seconds takes the simulation as ended (``source.py``).

``diffscale train --data spool:DIR[:N]`` follows a spool into a FIFO buffer of the newest N
samples (``SpoolSpec``; the trainer is ``follow.py``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from diffscale.data.locations import SPOOL_END_NAME, SPOOL_JOB_NAME
from diffscale.errors import UserError
from diffscale.runtime.job_end import current_job, read_job_file, write_job_file
from diffscale.tasks.fields.buffer import MisfitArrays, as_chunk

NAME = re.compile(r"^(\d{10})\.npz$")
ZIP_MAGIC = b"PK\x03\x04"
"""How every .npz archive (a zip file) begins."""
END_NAME = SPOOL_END_NAME
UNREADABLE_GRACE_S = 60.0
"""How long the newest file may stay unreadable (still being written) before it is skipped."""
HEARTBEAT_NAME = "heartbeat.json"
HEARTBEAT_S = 10.0
"""How often a writer outside a scheduler rewrites its heartbeat."""
STALE_BEATS = 12
"""Heartbeats a follower waits for in vain before it takes the writer as gone: long enough for a
simulation that holds Python's lock through a long computation (the heartbeat is a thread)."""


def _sequence(path: Path) -> int:
    match = NAME.match(path.name)
    assert match is not None
    return int(match.group(1))


class SpoolWriter:
    """Writes one file per output step into ``directory`` (created if missing), continuing the
    numbering after the files already there (a restarted simulation appends). Several writers
    (processes, nodes) may share the directory: each file takes the next number no other writer
    has taken (see the module docstring)."""

    def __init__(self, directory: str | Path, *, heartbeat_s: float | None = HEARTBEAT_S) -> None:
        """``heartbeat_s``: how often a writer outside a scheduler job says it lives (None: never)."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.next = self._after_newest()
        self._token = secrets.token_hex(6)  # with the pid: a temporary name no other writer uses
        self._stop = threading.Event()
        job = current_job()
        if job is not None:  # the scheduler tells a follower how this job ends
            if read_job_file(self.directory / SPOOL_JOB_NAME) != job:
                write_job_file(self.directory / SPOOL_JOB_NAME, job)
        elif heartbeat_s:
            self._beat(heartbeat_s)
            threading.Thread(target=self._beating, args=(heartbeat_s,), name="spool-heartbeat", daemon=True).start()

    def _beating(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                self._beat(every_s)
            except OSError:  # a full or vanished disk: the writes will say so; a follower waits
                pass

    def _beat(self, every_s: float) -> None:
        beat = {"time": time.time(), "every_s": every_s, "stale_after_s": STALE_BEATS * every_s,
                "host": socket.gethostname(), "pid": os.getpid()}
        tmp = self.directory / f".{HEARTBEAT_NAME}.{os.getpid()}-{self._token}.tmp"
        tmp.write_text(json.dumps(beat) + "\n")
        os.replace(tmp, self.directory / HEARTBEAT_NAME)

    def _after_newest(self) -> int:
        existing = [_sequence(p) for p in self.directory.iterdir() if NAME.match(p.name)]
        return max(existing, default=-1) + 1

    def write(self, cond: np.ndarray, x: np.ndarray, sim_time: float) -> Path:
        """Save one step's samples (cond n x C, x n x D [x K]) atomically; returns the file."""
        tmp = self.directory / f".{os.getpid()}-{self._token}.npz.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, cond=np.asarray(cond, dtype=np.float32), x=np.asarray(x, dtype=np.float32),
                     sim_time=np.float64(sim_time))
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the name appears: a reader never sees half a file
        try:
            final = self._claim(tmp)
        finally:
            tmp.unlink()
        return final

    def _claim(self, tmp: Path) -> Path:
        """Give ``tmp`` the first free sequence number from ``next`` on. A link, unlike a rename,
        fails when another writer took the name first, and the new name appears atomically."""
        while True:
            final = self.directory / f"{self.next:010d}.npz"
            try:
                os.link(tmp, final)
            except FileExistsError:
                if os.stat(tmp).st_nlink < 2:  # else NFS made the link and lost its reply (see open(2))
                    # Another writer was first: jump past its files rather than try them one by one.
                    self.next = max(self.next + 1, self._after_newest())
                    continue
            except OSError as exc:
                raise UserError(f"cannot link spool file {final} into place ({exc})",
                                "put the spool directory on a file system with hard links (local disk, Lustre, "
                                "GPFS, NFS): several writers claim file numbers with them") from exc
            self.next += 1
            return final


    def end(self, exit_status: int = 0) -> Path:
        """Mark the spool as complete: the trainer following it stops once it has read every
        file written before this (the job script of a coupled simulation does it for you)."""
        self._stop.set()
        return write_end(self.directory, exit_status)


def write_end(directory: str | Path, exit_status: int) -> Path:
    """``ended.json`` in ``directory``, atomically (a reader never sees half of it)."""
    final = Path(directory) / END_NAME
    tmp = final.with_name(f".{END_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"exit_status": int(exit_status)}) + "\n")
    os.replace(tmp, final)
    return final


def read_end(directory: Path) -> int | None:
    """The exit status in ``directory``'s end marker; None while the simulation runs. A marker
    that cannot be read as one counts as a failed end (status -1): nothing follows it either."""
    try:
        text = (directory / END_NAME).read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return -1
    try:
        status = json.loads(text)["exit_status"]
    except (ValueError, KeyError, TypeError):
        return -1
    return status if isinstance(status, int) and not isinstance(status, bool) else -1


@dataclass
class SpoolChunk:
    """The samples of one spool file, ready for ``ReplayBuffer.add``."""

    sequence: int
    cond: torch.Tensor
    x: torch.Tensor
    sim_time: torch.Tensor
    dropped_rows: int


@dataclass
class SpoolReader:
    """Polls ``directory`` for files with a sequence number at or past ``next``."""

    directory: Path
    cond_dim: int
    x_shape: tuple[int, ...]
    next: int = 0
    """The first sequence number not read yet (checkpointed with the buffer)."""
    skipped: list[str] = field(default_factory=list)
    """Files skipped as unreadable or misshapen, each with the reason."""
    given_by: str = "--data spool:DIR"
    """Where the user named ``directory`` (what an error about it points to)."""

    def poll(self) -> list[SpoolChunk]:
        """The complete files that appeared since the last poll, oldest first (never blocks)."""
        if not self.directory.is_dir():
            raise UserError(f"spool directory '{self.directory}' does not exist",
                            f"start the simulation's writer first, or check the path given to {self.given_by}")
        found = sorted((p for p in self.directory.iterdir() if NAME.match(p.name) and _sequence(p) >= self.next),
                       key=_sequence)
        chunks = []
        for i, path in enumerate(found):
            try:
                chunk = self._read(path)
            except _Unreadable as exc:
                if i == len(found) - 1 and not _old(path):
                    break  # perhaps still being written: read it again at the next poll
                self.skipped.append(f"{path.name}: {exc}")
                chunk = None
            if chunk is not None:
                chunks.append(chunk)
            self.next = _sequence(path) + 1
        return chunks

    def _read(self, path: Path) -> SpoolChunk | None:
        try:  # opened here: np.load leaves a file it opened itself open when the archive is cut short
            fid = open(path, "rb")
        except OSError as exc:
            raise _Unreadable(f"not a complete .npz archive ({exc})") from exc
        with fid:
            start = fid.read(len(ZIP_MAGIC))
            if not ZIP_MAGIC.startswith(start):
                # numpy would try it as a pickle and suggest allow_pickle=, which is no fix for a spool
                raise _Unreadable("not a spool .npz archive (not a zip file: write spool files with SpoolWriter "
                                  "or numpy.savez)")
            if len(start) < len(ZIP_MAGIC):
                raise _Unreadable(f"not a complete .npz archive ({len(start)} bytes)")
            fid.seek(0)
            try:
                archive = np.load(fid, allow_pickle=False)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise _Unreadable(f"not a complete .npz archive ({exc})") from exc
            try:
                with archive:
                    cond, x, sim_time = archive["cond"], archive["x"], float(archive["sim_time"])
                c, v, times, dropped = as_chunk(cond, x, sim_time, self.cond_dim, self.x_shape)
            except (OSError, EOFError, zipfile.BadZipFile) as exc:  # a member cut short
                raise _Unreadable(f"not a complete .npz archive ({exc})") from exc
            except MisfitArrays as exc:
                self.skipped.append(f"{path.name}: {exc.misfit} -- the simulation must pass arrays of those shapes "
                                    "to SpoolWriter.write")
                return None
            except (ValueError, TypeError, KeyError, UserError) as exc:
                self.skipped.append(f"{path.name}: {exc}")
                return None
        return SpoolChunk(_sequence(path), c, v, times, dropped)


class _Unreadable(Exception):
    """A spool file that is not (yet) a complete archive."""


def _old(path: Path) -> bool:
    try:
        return time.time() - path.stat().st_mtime > UNREADABLE_GRACE_S
    except OSError:  # gone meanwhile: nothing left to wait for
        return True
