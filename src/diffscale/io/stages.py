"""What a long evaluation is doing, said by the code doing it without a console of its own: a task's
evaluation calls :func:`stage` ("training the deterministic baseline", "rollouts: 25 of 50 ended"),
and whoever shows progress (``diffscale eval``: stderr) decides where it goes with :func:`saying`.
Outside such a block :func:`stage` says nothing, so library code and tests stay quiet."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_SAY: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("stage_say", default=None)


@contextlib.contextmanager
def saying(say: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, :func:`stage` lines go to ``say``."""
    token = _SAY.set(say)
    try:
        yield
    finally:
        _SAY.reset(token)


def stage(text: str) -> None:
    """One line of progress, where a caller asked for them."""
    say = _SAY.get()
    if say is not None:
        say(text)
