"""The one way config validation fails: a message naming the field, the problem and the fix."""

from __future__ import annotations

from typing import NoReturn

from diffscale.errors import UserError


def fail(name: str, problem: str, fix: str) -> NoReturn:
    raise UserError(f"config {name}: {problem}", fix)
