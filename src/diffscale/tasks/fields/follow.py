"""Following a spool directory while training (``diffscale train --data spool:DIR[:N]``).

``SpoolBatcher`` is the batch stream of such a run: before drawing a batch from the replay
buffer it moves the spool's new files into it, and while the buffer holds fewer samples than
it needs (its capacity) it waits, saying so in the log and in metrics.jsonl, instead of
leaving the device idle without a word. The normalisation statistics are fitted once, when
the buffer is first full, as ``OnlineTrainer`` does.

* Rate: the directory is listed at most every ``POLL_S`` seconds (a cluster file system's
  metadata server serves everyone), not at every step.
* Several ranks: only rank 0 reads the spool; what it read (the samples, not the file names)
  is broadcast, so every rank adds exactly the same rows at exactly the same step even when
  a shared file system shows a new file to one node before another. The ranks agree every
  ``SHARE_EVERY`` batches (one small broadcast, a host synchronisation) and at every poll
  while waiting.
* The end: rank 0 learns that the simulation ended from its end marker, the scheduler's word on
  its job or its stopped heartbeat (``source.py``) before each listing, so the listing then holds
  every file the simulation wrote. A failed simulation (a non-zero status, a job that failed), or
  one that ended before the buffer filled, ends the run with an error naming it; after any other
  end (its command's exit 0, a cancel, its time limit, a heartbeat that stopped) the run trains
  one more pass over the final buffer (its size in samples, drawn as batches) and ends,
  checkpointed, however far its ``train.steps`` target is -- no requeue waits for data that will
  never come. The end is kept in the checkpoint, so a requeued or chained job of the run trains
  no more.
* Resume: the buffer's contents, counters and the spool cursor are task state and the batch
  position is checkpointed, so a resumed run reads on from the first file it had not read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from diffscale.data.device_loader import DataPosition
from diffscale.data.feed import DataEnded, Feed, StopWaiting
from diffscale.tasks.fields.buffer import BufferBatcher, ReplayBuffer
from diffscale.tasks.fields.source import EndHow, SourceEnd, SourceWatch
from diffscale.tasks.fields.spool import SpoolChunk, SpoolReader

POLL_S = 1.0
"""Least time between two listings of the spool directory."""
SHARE_EVERY = 100
"""With several ranks: batches between two agreements on new data."""
REPORT_EVERY_S = 60.0
"""While waiting, the log says so again after this long even when nothing arrived."""
_RUNNING = -1
"""The ``EndHow`` rank 0 shares while the simulation has not ended."""
Chunk = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""One spool file's (cond, x, sim_time) rows."""


class SpoolBatcher(BufferBatcher):
    """``BufferBatcher`` over a buffer that ``reader`` fills; see the module docstring."""

    def __init__(self, buffer: ReplayBuffer, reader: SpoolReader, global_batch: int, seed: int,
                 device: torch.device, position: DataPosition, feed: Feed, *,
                 on_ready: Callable[[], None]) -> None:
        super().__init__(buffer, global_batch, seed, device, position)
        self.reader = reader
        self.feed = feed
        self.ready_at = buffer.spec.capacity
        self.on_ready = on_ready
        """Called whenever the buffer holds ``ready_at`` samples after new data (fits the
        statistics the first time; later calls do nothing)."""
        self._next_poll = 0.0
        self._said_ready = False
        self.dropped_rows = 0
        self.watch = SourceWatch(reader.directory) if feed.rank == 0 else None
        self.source_end: SourceEnd | None = None
        """How the simulation ended, once it has; None while it runs."""
        self._end_at: int | None = None
        """The batch count at which the run ends, once the simulation has ended."""
        self._ended_before = buffer.source_end is not None
        if buffer.source_end is not None:  # a resumed run whose simulation had ended: it ends where it did
            how, status, self._end_at = buffer.source_end
            self.source_end = SourceEnd(EndHow(how), status if status >= 0 else None)

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()

    def next_indices(self, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.feed.world_size == 1 or self.position.offset % SHARE_EVERY == 0:
            self.ingest()
        if self._end_at is not None and self.position.offset >= self._end_at:
            where = f"the simulation writing {self.reader.directory}"
            if self._ended_before:
                raise DataEnded(f"{where} had already ended ({self._words()}) and its final buffer was trained on: "
                                "nothing is left to train", ok=True)
            raise DataEnded(f"{where} has ended ({self._words()}) and its last spool file was trained on "
                            f"({self.buffer.pushes} files)", ok=True)
        if self.buffer.size < self.ready_at:
            self._wait()
        return super().next_indices(out)

    def _words(self) -> str:
        return self.source_end.words() if self.source_end is not None else "?"

    def ingest(self) -> None:
        """Add what rank 0 found in the spool (if its poll is due) to the buffer of every rank."""
        mine: list[SpoolChunk] = []
        ended: SourceEnd | None = None
        if self.watch is not None and time.monotonic() >= self._next_poll and self.source_end is None:
            self._next_poll = time.monotonic() + POLL_S
            ended = self.watch.check()  # before listing: then the listing holds every file
            for note in self.watch.news():
                self.feed.report(note, {"kind": "spool", "note": note, "time": time.time()})
            mine = self._poll()
        chunks, ended = self._shared(mine, ended)
        for cond, x, times in chunks:
            self.buffer.add(cond, x, times)
        if ended is not None:
            self._source_ended(ended)
        if self.buffer.size >= self.ready_at:
            if not self._said_ready:
                self._said_ready = True
                self.feed.report(f"buffer full: {self.buffer.size} samples from {self.buffer.pushes} spool files "
                                 f"of {self.reader.directory}; training",
                                 {"kind": "ready", "buffer": self.buffer.size, "files": self.buffer.pushes,
                                  "time": time.time()})
            self.on_ready()

    def _source_ended(self, end: SourceEnd) -> None:
        """The simulation ended, and every file it wrote was read: end the run now (a failure, or
        a buffer it never filled), or after one more pass over the buffer."""
        self.source_end = end
        where = f"the simulation writing {self.reader.directory}"
        said = f"{end.words()}; {end.detail}" if end.detail else end.words()
        record = {"kind": "source_ended", "ended": end.how.name.lower(), "words": end.words(),
                  "exit_status": end.exit_status, "ok": end.ok, "at": end.at, "files": self.buffer.pushes,
                  "samples": self.buffer.size, "time": time.time()}
        failure = ""
        if not end.ok:
            failure = f"{where} failed ({said}) after {self.buffer.pushes} spool files"
        elif self.buffer.size < self.ready_at:
            failure = (f"{where} ended ({said}) after {self.buffer.size} samples in {self.buffer.pushes} "
                       f"spool files, fewer than the {self.ready_at} the buffer waits for")
        if failure:
            self.feed.report(f"{where} ended ({said})", {**record, "ok": False, "error": failure})
            raise DataEnded(failure, ok=False)
        passes = math.ceil(self.buffer.size / self.global_batch)
        self._end_at = self.position.offset + passes
        self.buffer.source_end = (int(end.how), _status(end), self._end_at)
        self.feed.report(f"{where} ended ({said}) after {self.buffer.pushes} spool files: training "
                         f"{passes} more steps (one pass over the final buffer of {self.buffer.size} samples), then "
                         "ending", {**record, "end_after_steps": passes})

    def _poll(self) -> list[SpoolChunk]:
        skipped = len(self.reader.skipped)
        chunks = self.reader.poll()
        for count, reason in enumerate(self.reader.skipped[skipped:], start=skipped + 1):
            self.feed.report(f"warning: skipped spool file {reason} ({count} skipped so far)",
                             {"kind": "spool", "skipped_files": count, "time": time.time()})
        dropped = sum(c.dropped_rows for c in chunks)
        if dropped:
            self.dropped_rows += dropped
            self.feed.report(f"warning: dropped {dropped} spooled rows holding NaN or inf ({self.dropped_rows} so far)",
                             {"kind": "spool", "dropped_rows": self.dropped_rows, "time": time.time()})
        return [c for c in chunks if len(c.cond)]  # a file of only NaN rows adds nothing

    def _shared(self, chunks: list[SpoolChunk], ended: SourceEnd | None) -> tuple[list[Chunk], SourceEnd | None]:
        """Rank 0's chunks and the simulation's end on every rank, and its spool cursor in the buffer (checkpointed)."""
        if self.feed.world_size == 1:
            self.buffer.cursor = self.reader.next
            return [(c.cond, c.x, c.sim_time) for c in chunks], ended
        share = self.feed.share
        how, status = (_RUNNING, -1) if ended is None else (int(ended.how), _status(ended))
        header = share(torch.tensor([len(chunks), self.reader.next, how, status], dtype=torch.int64))
        count, self.buffer.cursor, how, status = (int(v) for v in header.tolist())
        self.reader.next = self.buffer.cursor
        if ended is None and how != _RUNNING:  # another rank's view of rank 0's end: without its details
            ended = SourceEnd(EndHow(how), status if status >= 0 else None)
        if count == 0:
            return [], ended
        lengths = share(torch.tensor([len(c.cond) for c in chunks] or [0] * count, dtype=torch.int64))
        rows, x_shape = int(lengths.sum()), tuple(self.buffer.x.shape[1:])
        if chunks:
            cond, x = torch.cat([c.cond for c in chunks]), torch.cat([c.x for c in chunks])
            times = torch.cat([c.sim_time for c in chunks])
        else:
            cond, x = torch.empty((rows, self.buffer.cond.shape[1])), torch.empty((rows, *x_shape))
            times = torch.empty(rows, dtype=torch.float64)
        cond, x, times = share(cond), share(x), share(times)
        splits = lengths.tolist()
        return list(zip(cond.split(splits), x.split(splits), times.split(splits), strict=True)), ended

    def _wait(self) -> None:
        """Poll until the buffer holds ``ready_at`` samples; say so, and stop when asked."""
        said, said_at = -1, 0.0
        while self.buffer.size < self.ready_at:
            if self.buffer.size != said or time.monotonic() - said_at >= REPORT_EVERY_S:
                said, said_at = self.buffer.size, time.monotonic()
                self.feed.report(f"waiting for data: buffer {self.buffer.size}/{self.ready_at} samples "
                                 f"({self.buffer.pushes} spool files) from {self.reader.directory}",
                                 {"kind": "waiting", "buffer": self.buffer.size, "ready_at": self.ready_at,
                                  "files": self.buffer.pushes, "time": time.time()})
            if self.feed.stopping():
                raise StopWaiting(f"while waiting for data (buffer {self.buffer.size}/{self.ready_at} samples)")
            time.sleep(max(0.0, self._next_poll - time.monotonic()))
            self.ingest()


def _status(end: SourceEnd) -> int:
    """The exit status as the ranks share it and a checkpoint keeps it: -1 where none is known."""
    return -1 if end.exit_status is None else end.exit_status
