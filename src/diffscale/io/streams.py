"""The process's output streams when their reader may leave (a pipe to ``head``)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO


class ReaderGoneSafe:
    """An output stream that outlives its reader: once the pipe's reader is gone (``train ... | head
    -1``, ``sample ... 2>&1 | head -1``), the rest is discarded instead of raising BrokenPipeError
    out of the next progress line -- which ended a run without its last checkpoint and a sample
    without its image. The verb's own files (metrics.jsonl, TensorBoard, checkpoints, outputs)
    still get everything."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError):  # the interpreter's own flush at exit then succeeds
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def outlive_readers() -> None:
    """Progress and results to a reader that may leave (a pipe to ``head``) without stopping the
    verb: its work and files matter more than the lines nobody reads."""
    if not isinstance(sys.stdout, ReaderGoneSafe):
        sys.stdout = ReaderGoneSafe(sys.stdout)
    if not isinstance(sys.stderr, ReaderGoneSafe):
        sys.stderr = ReaderGoneSafe(sys.stderr)
