"""A trainer's console output kept in its run folder (``RUN_DIR/train.log``) and its process
recorded (``RUN_DIR/trainer.json``, :mod:`diffscale.io.trainer`), so a local run's traceback
outlives the terminal that showed it and a killed trainer reads as stopped.

Rank 0 writes both once it holds the run dir's lock and the run passed its checks (a second
trainer refused there, or a refused resume, must not rotate the run's log); what was printed
before that is kept in memory and written first.
The log gets what the console prints as plain text (no colours, no progress bar redraws: a
training report line instead), Python's writes to stderr (warnings, a library's messages) and
how the invocation ended (a traceback, an ``error:`` line, an interruption).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
import traceback
from pathlib import Path
from typing import IO, Any, cast

from rich.console import Console

from diffscale.errors import UserError
from diffscale.io.trainer import rotate_log, start_record, write_record

MAX_BUFFERED = 1 << 20
"""Characters kept in memory before the log opens (other ranks never open one)."""


class RunLog:
    """Where a trainer's console output and process record go; :meth:`attach` opens them."""

    def __init__(self) -> None:
        self._file: IO[str] | None = None
        self._pending: list[str] = []
        self._pending_size = 0
        self._run_dir: Path | None = None
        self._record: dict[str, Any] | None = None
        self._plain = Console(file=cast(IO[str], _Sink(self)), width=120, color_system=None, force_terminal=False,
                              soft_wrap=True, highlight=False, emoji=False)

    # a file-like sink for the plain console and the stderr tee
    def write(self, text: str) -> int:
        """Into the log (a log the disk refuses is given up: the run goes on, its terminal shows all)."""
        if self._file is not None:
            try:
                self._file.write(text)
            except OSError:
                self._give_up()
        elif self._run_dir is None and self._pending_size < MAX_BUFFERED:
            self._pending.append(text)
            self._pending_size += len(text)
        return len(text)

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError:
                self._give_up()

    def _give_up(self) -> None:
        handle, self._file = self._file, None
        with contextlib.suppress(OSError):
            if handle is not None:
                handle.close()

    def isatty(self) -> bool:
        return False

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """What a console printed, rendered as plain text into the log."""
        kwargs.pop("style", None)
        self._plain.print(*objects, **kwargs)

    def attach(self, run_dir: Path) -> None:
        """Open RUN_DIR/train.log (an earlier one rotated) and write trainer.json: called once this
        process holds the run dir and starts writing there."""
        if self._file is not None:
            return
        self._run_dir = Path(run_dir)
        pending, self._pending = "".join(self._pending), []
        try:
            self._file = open(rotate_log(self._run_dir), "w", buffering=1, encoding="utf-8", errors="replace")
        except OSError:  # no log where the disk refuses one; the run's own files say why it stops
            return
        self.write(pending)
        self._record = start_record()
        self.end("")

    def end(self, outcome: str) -> None:
        """Write trainer.json: the process, and how this invocation ended (one line; "" while it runs)."""
        if self._record is None or self._run_dir is None:
            return
        if outcome:
            self._record.update(ended=time.time(), outcome=outcome)
        with contextlib.suppress(OSError):
            write_record(self._run_dir, self._record)

    def failed(self, exc: BaseException) -> None:
        """The error that ends the invocation, into the log as the terminal shows it (the CLI prints
        it after the trainer has returned, when the log is closed), and into trainer.json."""
        if isinstance(exc, UserError):
            said = outcome = f"error: {exc.message}"
        elif isinstance(exc, KeyboardInterrupt):
            said = outcome = "interrupted"
        else:
            said = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
            outcome = f"error: {traceback.format_exception_only(type(exc), exc)[-1].strip()}"
        self.write(said + "\n")
        self.end(outcome)

    def close(self) -> None:
        self._give_up()


class _Sink(io.TextIOBase):
    """The plain console's file: what it renders goes to the log."""

    def __init__(self, log: RunLog) -> None:
        super().__init__()
        self._log = log

    def write(self, text: str) -> int:
        return self._log.write(text)


class LoggedConsole(Console):
    """A console whose prints are also rendered as plain text into a :class:`RunLog`."""

    def __init__(self, log: RunLog, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_log = log

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*objects, **kwargs)
        self.run_log.print(*objects, **kwargs)


class _StderrTee:
    """sys.stderr written to the log too (warnings, libraries' messages)."""

    def __init__(self, stream: IO[str], log: RunLog) -> None:
        self._stream, self._log = stream, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def logged_console(console: Console | None) -> LoggedConsole:
    """``console`` (default: a soft-wrapping one on stdout) also printing into a new :class:`RunLog`.
    Its stream is taken now: the stderr tee installed later must not log its prints twice."""
    if isinstance(console, LoggedConsole):
        return console
    console = console or Console(soft_wrap=True)
    return LoggedConsole(RunLog(), file=console.file, soft_wrap=console.soft_wrap, quiet=console.quiet,
                         width=None if console.is_terminal else console.width, force_terminal=console.is_terminal,
                         color_system=console.color_system if console.is_terminal else None,
                         no_color=console.no_color)


class stderr_into:
    """While active, Python's writes to sys.stderr also go into ``log``."""

    def __init__(self, log: RunLog) -> None:
        self._log = log
        self._saved: Any = None

    def __enter__(self) -> stderr_into:
        self._saved = sys.stderr
        if sys.stderr is not None:  # None: an interpreter started without one (pythonw)
            sys.stderr = cast(IO[str], _StderrTee(sys.stderr, self._log))
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr = self._saved
