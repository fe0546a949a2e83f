"""Wall-time strings as SLURM and Grid Engine write them, to and from seconds.

Accepted: ``MM``, ``HH:MM:SS``, ``MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``
(SLURM's ``--time`` forms) and ``48h`` / ``90m`` / ``2d`` shorthands. ``infinite`` /
``UNLIMITED`` mean no limit (``None``).
"""

from __future__ import annotations

import re

from ..errors import UserError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str | int | None, *, what: str = "time") -> int | None:
    """Seconds, or ``None`` for no limit. Raises UserError naming ``what`` on bad input."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise UserError(f"{what} {text!r} is not a duration", "write HH:MM:SS, D-HH:MM:SS or e.g. 48h")
    if isinstance(text, int):
        # YAML reads a bare 48:00:00 as the sexagesimal integer 172800 -- already seconds.
        return text
    value = str(text).strip()
    if value.lower() in ("infinite", "unlimited", "none", ""):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", value.lower())
    if match:
        return int(float(match.group(1)) * _UNITS[match.group(2)])
    days = 0
    if "-" in value:
        day_part, value = value.split("-", 1)
        if not day_part.isdigit():
            raise UserError(f"{what} '{text}' is not a duration", "write HH:MM:SS, D-HH:MM:SS or e.g. 48h")
        days = int(day_part)
        parts = value.split(":")
        if not all(p.isdigit() for p in parts) or len(parts) > 3:
            raise UserError(f"{what} '{text}' is not a duration", "write HH:MM:SS, D-HH:MM:SS or e.g. 48h")
        nums = [int(p) for p in parts] + [0] * (3 - len(parts))
        return days * 86400 + nums[0] * 3600 + nums[1] * 60 + nums[2]
    parts = value.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3:
        raise UserError(f"{what} '{text}' is not a duration", "write HH:MM:SS, D-HH:MM:SS or e.g. 48h")
    nums = [int(p) for p in parts]
    if len(nums) == 1:  # SLURM: a bare number is minutes
        return nums[0] * 60
    if len(nums) == 2:  # MM:SS
        return nums[0] * 60 + nums[1]
    return nums[0] * 3600 + nums[1] * 60 + nums[2]


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
