"""The eager steps pause while the background compile times kernels on the GPU
(``runtime.eager_pauses_for_tuning``; the background process: ``training/background_compile.py``).

Triton times each kernel's candidate configurations when the kernel first runs, in bursts: the
forward's kernels, then, after the backward's compile, the backward's. With the GPU busy beside it
that timing took 21.6 s instead of 9.7 s and the whole compile 118 s instead of 95 s (small, cold, an
H200, 2026-11-30: a GPU kept busy with the host idle; one spinning core changed nothing). Pausing
before each eager step alone did not give the GPU back: an eager step of small queues ~0.2 s of
GPU work, longer than most single timings, so the step in flight overlapped them (timing 19.7 s
against 22.4 s without the pause).

So the two processes hand the GPU over through two files, per burst, not per kernel: the
background process creates ``marker`` as a burst starts and waits (at most ``DRAIN_WAIT_S``) for
``marker.drained``, which the training process creates once its queued kernels have run
(``torch.cuda.synchronize``) and keeps while it waits; the background process removes
``marker`` ``LINGER_S`` after the burst's last timing, and the eager steps go on.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

DRAIN_WAIT_S = 2.0
"""The longest the background process waits for the eager steps' queued kernels before it times."""
LINGER_S = 0.5
"""The marker stays this long after a timing: the next kernel's timing of the same burst follows in milliseconds."""
TUNING_WAIT_S = 30.0
"""The longest one eager step waits for a burst (a burst took seconds on an idle GPU)."""
POLL_S = 0.001
"""How often a waiting side looks at the other's file."""


def drained_path(marker: Path) -> Path:
    """The file the training process keeps while its queued kernels have run and it waits."""
    return marker.with_name(marker.name + ".drained")


class TimingBursts:
    """The background process's side: ``marker`` exists from a burst's first timing until
    ``LINGER_S`` after its last, and a burst starts once the eager steps have drained the GPU."""

    def __init__(self, marker: Path, *, linger_s: float = LINGER_S, drain_wait_s: float = DRAIN_WAIT_S) -> None:
        self.marker, self.drained = marker, drained_path(marker)
        self.linger_s, self.drain_wait_s = linger_s, drain_wait_s
        self._lock = threading.Lock()
        self._timing = 0
        """Timings under way (one at a time in practice; a removal waits for none)."""
        self._ends = 0
        """Timings ended: a removal scheduled at an earlier end than the last does nothing."""

    def begin(self) -> None:
        """Before a timing: open a burst if none is open, and wait for the GPU to be drained."""
        with self._lock:
            self._timing += 1
            if self.marker.exists():
                return
            self.drained.unlink(missing_ok=True)  # the last burst's
            self.marker.touch()
        began = time.perf_counter()
        while not self.drained.exists() and time.perf_counter() - began < self.drain_wait_s:
            time.sleep(POLL_S)

    def end(self) -> None:
        """After a timing: the burst ends ``linger_s`` from now unless another timing begins."""
        with self._lock:
            self._timing -= 1
            self._ends += 1
            removal = threading.Timer(self.linger_s, self._close, args=(self._ends,))
        removal.daemon = True
        removal.start()

    def _close(self, at_end: int) -> None:
        with self._lock:
            if self._timing == 0 and self._ends == at_end:  # no timing began since that end
                self.marker.unlink(missing_ok=True)

    def wrap(self, timing: Callable[..., object]) -> Callable[..., object]:
        """``timing`` (Triton's timing of one kernel's configurations) inside a burst."""
        @functools.wraps(timing)
        def timed_alone(*args: object, **kwargs: object) -> object:
            self.begin()
            try:
                return timing(*args, **kwargs)
            finally:
                self.end()

        return timed_alone


def mark_kernel_timing(marker: Path) -> TimingBursts | None:
    """Wrap Triton's timing of a kernel's configurations (inductor's autotuning at a kernel's first
    run) in bursts marked by ``marker``; None where this torch has no such hook (nothing is marked,
    the eager steps do not pause)."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return None
    timing = getattr(CachingAutotuner, "benchmark_all_configs", None)
    if timing is None:
        return None
    bursts = TimingBursts(marker)
    CachingAutotuner.benchmark_all_configs = bursts.wrap(timing)  # type: ignore[method-assign]
    return bursts


def wait_while_tuning(marker: Path, *, drain: Callable[[], None], gone: Callable[[], bool]) -> float:
    """The training process's side, before an eager step: while a burst is open, drain the GPU
    (``drain``: wait for the queued kernels), say so, and wait for the burst's end (at most
    ``TUNING_WAIT_S``; ``gone``: the background process ended, leaving its files); the seconds waited."""
    if not marker.exists():
        return 0.0
    began = time.perf_counter()
    drain()
    drained = drained_path(marker)
    while marker.exists() and time.perf_counter() - began < TUNING_WAIT_S:
        if gone():
            marker.unlink(missing_ok=True)
            break
        if not drained.exists():  # a new burst removed the last one's: still drained, say so again
            drained.touch()
        time.sleep(POLL_S)
    return time.perf_counter() - began


def remove(marker: Path) -> None:
    """Both files, where a background process is stopped or gone."""
    marker.unlink(missing_ok=True)
    drained_path(marker).unlink(missing_ok=True)
