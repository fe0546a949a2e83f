"""Stop requests from schedulers and users, turned into a flag the loop checks.

SLURM's ``--signal=B:USR2@LEAD`` (forwarded to the step), Grid Engine's ``-notify``
(SIGUSR2 before the h_rt kill, SIGUSR1 before suspend), SIGTERM at preemption and
Ctrl-C all mean the same: finish the current step, write a consistent checkpoint on
every rank's behalf, and exit with :data:`EXIT_REQUEUE` so the job script continues
the run in a new job.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_REQUEUE = 85
"""Exit code: checkpointed on a stop request before reaching the target step."""

STOP_SIGNALS = tuple(s for s in (getattr(signal, "SIGUSR2", None), getattr(signal, "SIGUSR1", None),
                                 signal.SIGTERM, signal.SIGINT) if s is not None)


class StopFlag:
    """Set by a signal handler; read by the training loop between steps."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}
        self._interrupts = 0

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002 - signal handler signature
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:  # a second Ctrl-C means "now"
                raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name

    def install(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
