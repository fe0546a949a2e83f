"""The one user-facing error type.

Every error a user can cause (bad config, missing data, a cluster that cannot fit
the job, a corrupt checkpoint) is raised as :class:`UserError`. The CLI prints it
as one line -- ``error: <cause> -- <fix>`` -- and exits with code 2, no traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_USER_ERROR = 2


class UserError(Exception):
    """An error the user can fix. ``cause`` says what is wrong, ``fix`` what to do."""

    def __init__(self, cause: str, fix: str = "") -> None:
        self.cause = cause
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"{self.cause} -- {self.fix}" if self.fix else self.cause


class ArgumentError(UserError, ValueError):
    """A Python API's argument out of range (``Controller.reset(seed=-1)``): a ``ValueError`` to
    its caller, whose message names the argument, and one error line to the CLI."""


def closest(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' hint, or '' when nothing is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


SEED_MAX = 2**63 - 1
"""Seeds run from 0 to this (a torch generator's and numpy's range, on every verb and the API)."""


def check_seed(seed: object, name: str = "--seed") -> int:
    """``seed`` as an int from 0 to :data:`SEED_MAX`, or one error naming the range: the same
    rule for ``sample``, ``eval`` and ``OnlineTrainer.sample``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise UserError(f"{name} {seed!r} is out of range (a seed is a whole number from 0 to 2**63 - 1)",
                        "pass a seed from 0 to 2**63 - 1 (the same seed gives the same samples), e.g. 0")
    return seed
