"""Where a run's decoded data lives: on the training device, or streamed from the decoded cache.

One rule, used by the run as it starts (data/streaming.py, with the device's own memory) and by
``plan``'s preflight (cluster/planning/data_check.py, with the partition's GPU memory), so that a
plan says which path the job will take. No torch here: ``plan`` is a light verb.
"""

from __future__ import annotations

from dataclasses import dataclass

RESIDENT_SHARE = 0.25
"""Share of the device's memory (on the CPU: of host memory) resident data may take under
``data.resident: auto``; the rest stays with the model, its optimizer state and activations."""


def size_text(n_bytes: float) -> str:
    """``0.57 GiB``, or ``3.2 MiB`` below a tenth of a GiB (where two decimals of GiB say 0.00)."""
    return f"{n_bytes / 2**20:.1f} MiB" if n_bytes < 2**30 / 10 else f"{n_bytes / 2**30:.2f} GiB"


@dataclass(frozen=True)
class DataSize:
    """A data set decoded at the run's resolution: ``items`` of uint8 (channels, side, side)."""

    items: int
    channels: int
    side: int
    how: str
    """Where the figures come from (the cache's header, or the listing and what it assumes)."""

    @property
    def nbytes(self) -> int:
        return self.items * self.channels * self.side * self.side

    def describe(self) -> str:
        """``50,000 items x 3x64x64 = 0.57 GiB (how)``."""
        return f"{self.items:,} items x {self.channels}x{self.side}x{self.side} = {size_text(self.nbytes)} ({self.how})"


def resident_rule(setting: str, data_bytes: int, total_bytes: float, where: str) -> tuple[bool, str]:
    """Whether ``data_bytes`` of uint8 data live on a device of ``total_bytes`` (``where``:
    ``device memory`` or ``host memory``) under ``data.resident`` ``setting``, and why."""
    size = size_text(data_bytes)
    if setting == "on":
        return True, f"resident on the device ({size}; data.resident on)"
    if setting == "off":
        return False, f"streamed from disk ({size}; data.resident off)"
    budget = RESIDENT_SHARE * total_bytes
    total = f"{RESIDENT_SHARE:.0%} of {total_bytes / 2**30:.0f} GiB {where}"
    if data_bytes <= budget:
        return True, f"resident on the device ({size} fits {total})"
    return False, f"streamed from disk ({size} exceeds {total})"
