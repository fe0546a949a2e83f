"""How a training loop draws a task's data: the ``Batcher`` protocol (the indices of each global
batch and where the stream stands), the ``Feed`` a batcher of streamed data gets from the loop,
``StopWaiting``, raised by a batcher waiting for data when a stop is requested, and ``DataEnded``,
raised once the data's source has ended.

Task-independent: the loop, the spool follower (follow.py) and every task's batcher share them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from diffscale.data.device_loader import DataPosition


class Batcher(Protocol):
    """The indices of each global batch, identical on every rank, and where the stream stands
    (checkpointed, so a resumed run draws exactly the batches the uninterrupted one would)."""

    @property
    def position(self) -> DataPosition: ...

    def next_indices(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """(global batch,) rows of the task's data for the next optimizer step; written into
        ``out`` (int64, on the device) when given, which is returned."""
        ...

    def close(self) -> None:
        """Release what the batcher holds (a streamed batcher's loader workers) once the loop is done
        with it, rather than when the garbage collector reaches it."""
        ...


def _no_report(message: str, record: dict[str, Any]) -> None:
    del message, record


@dataclass(frozen=True)
class Feed:
    """What a batcher whose data arrives while training (a spool directory) needs from the
    loop: the ranks it must agree with and where it reports. A batcher over resident data
    ignores it; the defaults are one silent process (``OnlineTrainer``, bench)."""

    rank: int = 0
    world_size: int = 1
    share: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor
    """Rank 0's ``tensor`` on every rank (a broadcast: every rank passes one of the same shape
    and dtype, and every rank must call it at the same point)."""
    report: Callable[[str, dict[str, Any]], None] = _no_report
    """A line for the log and a record for metrics.jsonl (written by rank 0 only)."""
    stopping: Callable[[], bool] = lambda: False
    """Whether a stop was requested (a signal before the time limit); the same answer on every rank."""


class StopWaiting(Exception):
    """A batcher waiting for data was asked to stop: the loop checkpoints and ends as it does
    for any stop request, without an optimizer step."""


class DataEnded(Exception):
    """The source of a streamed run's data has ended (a coupled simulation wrote its end marker)
    and what it wrote has been trained on: the loop checkpoints and ends. ``status`` is the
    source's exit status; ``ok`` False (a failed source, or too little data to train on) ends
    the run with an error naming it."""

    def __init__(self, message: str, *, ok: bool) -> None:
        super().__init__(message)
        self.ok = ok
