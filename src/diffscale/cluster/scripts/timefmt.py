"""Wall-time strings as SLURM and Grid Engine write them, to and from seconds.

Accepted: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS`` (SLURM's
``--time`` forms) and ``48h`` / ``90m`` / ``2d`` shorthands. ``infinite`` / ``UNLIMITED``
mean no limit (``None``) where a profile or scheduler says so; a job's own ``--time`` must
be a limit (:func:`parse_time_limit`).

Every field after the first is range-checked: SLURM reads ``99:99:99`` as 100:40:39 and
``00:00:00`` as *no limit at all*, so a typo would silently change what the job asks for.
"""

from __future__ import annotations

import re

from diffscale.errors import UserError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FORMS = "write HH:MM:SS, D-HH:MM:SS or e.g. 48h (minutes and seconds 0-59, hours after 'D-' 0-23)"


def _bad(what: str, text: object, why: str = "is not a duration") -> UserError:
    return UserError(f"{what} '{text}' {why}", _FORMS)


def _fields(value: str, what: str, text: object, *, after_days: bool) -> list[int]:
    """``[h, m, s]`` of the part after an optional ``D-``; each field range-checked."""
    parts = value.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise _bad(what, text)
    nums = [int(p) for p in parts]
    if after_days:  # D-HH, D-HH:MM, D-HH:MM:SS
        nums += [0] * (3 - len(nums))
        names = ("hours", "minutes", "seconds")
        limits = (24, 60, 60)
    elif len(nums) == 1:  # SLURM: a bare number is minutes, any number of them
        return [0, nums[0], 0]
    elif len(nums) == 2:  # MM:SS
        nums = [0, *nums]
        names, limits = ("", "", "seconds"), (0, 0, 60)
    else:  # HH:MM:SS, any number of hours
        names, limits = ("", "minutes", "seconds"), (0, 60, 60)
    for value_, name, limit in zip(nums, names, limits, strict=True):
        if limit and value_ >= limit:
            raise _bad(what, text, f"has {value_} {name} (at most {limit - 1})")
    return nums


def parse_duration(text: str | int | None, *, what: str = "time") -> int | None:
    """Seconds, or ``None`` for no limit. Raises UserError naming ``what`` on bad input,
    a field out of range, or a zero/negative duration."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise _bad(what, text)
    if isinstance(text, int):
        # YAML reads a bare 48:00:00 as the sexagesimal integer 172800 -- already seconds.
        seconds = text
    else:
        value = str(text).strip()
        if value.lower() in ("infinite", "infinity", "unlimited", "none", ""):
            return None
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", value.lower())
        if match:
            seconds = int(float(match.group(1)) * _UNITS[match.group(2)])
        elif "-" in value:
            day_part, rest = value.split("-", 1)
            if not day_part.isdigit():
                raise _bad(what, text)
            h, m, s = _fields(rest, what, text, after_days=True)
            seconds = int(day_part) * 86400 + h * 3600 + m * 60 + s
        else:
            h, m, s = _fields(value, what, text, after_days=False)
            seconds = h * 3600 + m * 60 + s
    if seconds <= 0:
        raise _bad(what, text, "is not a positive duration (SLURM reads a zero limit as no limit at all)")
    return seconds


def parse_time_limit(text: str, *, what: str = "--time") -> int:
    """A job's wall time as asked on the command line: a positive duration, never 'unlimited'."""
    seconds = parse_duration(text, what=what)
    if seconds is None:
        raise UserError(f"{what} '{text}' asks for no time limit",
                        "give the job a limit, e.g. --time 04:00:00 (leave --time out for the estimated one)")
    return seconds


def hms(seconds: int) -> str:
    """``HH:MM:SS`` with hours past 24 (accepted by both sbatch --time and qsub h_rt)."""
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def human(seconds: int | None) -> str:
    if seconds is None:
        return "unlimited"
    if seconds % 86400 == 0 and seconds >= 86400:
        return f"{seconds // 86400} d"
    if seconds % 3600 == 0 and seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds} s"
